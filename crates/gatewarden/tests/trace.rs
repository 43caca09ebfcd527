//! Issue 21, "Traces of every message", through the real binary: a message's path recorded in
//! the journal and shown by `gatewarden trace` (every step, in order), the same path for a
//! failed message, and the OTLP/HTTP export of its spans and of the `/metrics` numbers to a
//! receiver that decodes and checks the payloads (crates/testkit/src/otlp.rs). The upstream is
//! the openai backend against testkit's fake provider, so "provider tried" has providers.
#![cfg(unix)]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::otlp::OtlpReceiver;
use std::collections::BTreeMap;
use std::time::Duration;
use work_common::*;

const FINAL: Duration = Duration::from_secs(30);

fn config(providers: &[(&str, &FakeLlm)], telemetry: Option<&OtlpReceiver>) -> String {
    let mut c =
        String::from("[agent]\nbackend = \"openai\"\nretries = 0\nbackoff_ms = 10\ncooldown_s = 1\ntimeout_s = 30\n\n");
    for (name, fake) in providers {
        c.push_str(&format!(
            "[[agent.provider]]\nname = \"{name}\"\nbase_url = \"{}\"\nmodel = \"m\"\n\n",
            fake.base_url()
        ));
    }
    if let Some(r) = telemetry {
        c.push_str(&format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval_s = 1\ntimeout_s = 5\nservice_name = \"gw-test\"\n",
            r.endpoint()
        ));
    }
    c
}

/// `gatewarden trace ID --json`.
#[track_caller]
fn trace_json(home: &TempHome, id: &str) -> Value {
    let out = run_cli(home, &["trace", id, "--json"]);
    assert_eq!(out.code, Some(0), "trace --json: {}\n{}", out.stdout, out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn steps(t: &Value) -> Vec<&str> {
    t["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect()
}

/// Each word appears in `text`, in this order.
#[track_caller]
fn in_order(text: &str, words: &[&str]) {
    let mut from = 0;
    for w in words {
        match text[from..].find(w) {
            Some(i) => from += i + w.len(),
            None => panic!("{w:?} missing (or out of order) after byte {from} of:\n{text}"),
        }
    }
}

#[test]
fn a_message_trace_shows_every_step_in_order_and_goes_out_as_otlp_spans_and_metrics() {
    let primary = FakeLlm::start(Reply::status(502)).unwrap();
    let fallback = FakeLlm::start(Reply::text("traced all the way")).unwrap();
    let otlp = OtlpReceiver::start().unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let g = gateway(&home, &sw, &config(&[("primary", &primary), ("fallback", &fallback)], Some(&otlp)));
    let api = Api::new(g.listen());

    let id = api.submit("c1", "trace me");
    let m = wait_final(&api, &id, FINAL);
    assert_eq!(m["state"], "done", "{m}");

    // The journal's trace, through the CLI.
    let t = trace_json(&home, &id);
    assert_eq!((t["id"].as_str(), t["state"].as_str()), (Some(id.as_str()), Some("done")), "{t}");
    assert_eq!(
        steps(&t),
        [
            "received",
            "journaled",
            "claimed",
            "backend_called",
            "provider_tried",
            "provider_tried",
            "first_token",
            "done"
        ],
        "{t}"
    );
    let s = &t["steps"];
    assert_eq!(s[0]["subject"], "http", "{t}");
    assert_eq!(s[3]["subject"], "openai", "{t}");
    assert_eq!(s[4]["subject"], "primary", "{t}");
    assert!(s[4]["outcome"].as_str().is_some_and(|o| o.contains("502")), "the primary's failure is named: {t}");
    assert!(s[4]["elapsed_ms"].as_u64().is_some(), "{t}");
    assert_eq!((s[5]["subject"].as_str(), s[5]["outcome"].as_str()), (Some("fallback"), Some("ok")), "{t}");
    let times: Vec<&str> = s.as_array().unwrap().iter().map(|e| e["at"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted, "the steps are in time order: {t}");

    let human = run_cli(&home, &["trace", &id]);
    assert_eq!(human.code, Some(0), "{}", human.stderr);
    in_order(
        &human.stdout,
        &[
            &id,
            "done",
            "received",
            "journaled",
            "claimed",
            "backend_called",
            "provider_tried",
            "primary",
            "502",
            "provider_tried",
            "fallback: ok",
            "first_token",
            "done",
        ],
    );

    // The same steps as OTLP spans: one trace, the run under the message, the providers under
    // the run.
    let mine = |otlp: &OtlpReceiver| -> Vec<gatewarden_testkit::otlp::Span> {
        otlp.spans().into_iter().filter(|s| s.attributes.get("gatewarden.message_id") == Some(&id)).collect()
    };
    must_wait_until(FINAL, "the message's spans at the OTLP receiver", || {
        mine(&otlp).iter().any(|s| s.name == "gatewarden.message")
    });
    assert_eq!(otlp.refused(), Vec::<String>::new(), "every payload decodes");
    let spans = mine(&otlp);
    let by_name = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    let root = by_name("gatewarden.message")[0];
    assert_eq!(root.parent, None);
    assert_eq!(root.service, "gw-test");
    assert_eq!(root.attributes.get("gatewarden.platform").map(String::as_str), Some("http"));
    assert_eq!(root.attributes.get("gatewarden.state").map(String::as_str), Some("done"));
    assert!(spans.iter().all(|s| s.trace_id == root.trace_id), "one trace per message: {spans:#?}");
    let run = by_name("gatewarden.run")[0];
    assert_eq!(run.parent.as_ref(), Some(&root.span_id));
    assert_eq!(run.attributes.get("gatewarden.backend").map(String::as_str), Some("openai"));
    for n in ["gatewarden.journal", "gatewarden.queue"] {
        assert_eq!(by_name(n).len(), 1, "{n}: {spans:#?}");
        assert_eq!(by_name(n)[0].parent.as_ref(), Some(&root.span_id), "{n}");
    }
    let providers = by_name("gatewarden.provider");
    let names: Vec<&str> =
        providers.iter().map(|p| p.attributes.get("gatewarden.provider").map_or("", String::as_str)).collect();
    assert_eq!(names, ["primary", "fallback"], "{spans:#?}");
    assert!(providers.iter().all(|p| p.parent.as_ref() == Some(&run.span_id)), "providers are the run's children");
    assert_eq!((providers[0].status, providers[1].status), (2, 0), "the failed try is an error span");
    assert_eq!(by_name("gatewarden.first_token")[0].parent.as_ref(), Some(&run.span_id));
    assert!(root.start_ns <= run.start_ns && run.end_ns <= root.end_ns, "the run lies within the message");

    // The metrics behind /metrics, as OTLP metrics.
    let point = |otlp: &OtlpReceiver, metric: &str, label: Option<(&str, &str)>| {
        otlp.points().into_iter().rev().find(|p| {
            p.metric == metric && label.is_none_or(|(k, v)| p.attributes.get(k).map(String::as_str) == Some(v))
        })
    };
    must_wait_until(FINAL, "gatewarden_runs_total{outcome=ok} >= 1 as an OTLP sum", || {
        point(&otlp, "gatewarden_runs_total", Some(("outcome", "ok"))).is_some_and(|p| p.value >= 1.0)
    });
    let runs = point(&otlp, "gatewarden_runs_total", Some(("outcome", "ok"))).unwrap();
    assert_eq!((runs.kind, runs.service.as_str()), ("sum", "gw-test"));
    let up = point(&otlp, "gatewarden_up", None).expect("gatewarden_up exported");
    assert_eq!((up.kind, up.value), ("gauge", 1.0));
    let done: BTreeMap<String, String> = [("state".to_owned(), "done".to_owned())].into();
    assert!(
        otlp.points()
            .iter()
            .any(|p| p.metric == "gatewarden_journal_messages" && p.attributes == done && p.value >= 1.0),
        "the journal gauge counts the message"
    );
    assert_eq!(otlp.refused(), Vec::<String>::new(), "every payload decodes");
    let metrics = api.get("/metrics").unwrap().text();
    assert!(metrics.contains("gatewarden_otlp_batches_total{outcome=\"dropped\"} 0"), "{metrics}");
}

#[test]
fn a_failed_message_trace_ends_in_failed_with_the_reason() {
    let primary = FakeLlm::start(Reply::status(502)).unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    write_config(home.path(), &config(&[("primary", &primary)], None));
    let mut g = builder(&home).env(TAG_VAR, sw.tag()).arg("--log-format").arg("json").spawn();
    g.wait_ready(READY);
    let api = Api::new(g.listen());

    let id = api.submit("c1", "this will fail");
    let m = wait_final(&api, &id, FINAL);
    assert_eq!(m["state"], "failed", "{m}");

    // The JSON log keeps its keys and gains the message span's fields.
    let logged = |g: &Gateway| {
        g.stderr().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|v| {
            v["msg"].as_str().is_some_and(|m| m.starts_with("message failed")) && v["message_id"] == json!(id)
        })
    };
    must_wait_until(FINAL, "the failure's log line with its span fields", || logged(&g).is_some());
    let line = logged(&g).unwrap();
    assert_eq!((line["level"].as_str(), line["platform"].as_str()), (Some("warn"), Some("http")), "{line}");
    assert!(line["ts"].as_str().is_some_and(|t| t.ends_with("+00:00")), "{line}");

    let t = trace_json(&home, &id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(steps(&t), ["received", "journaled", "claimed", "backend_called", "provider_tried", "failed"], "{t}");
    let s = &t["steps"];
    assert_eq!(s[4]["subject"], "primary", "{t}");
    assert!(s[4]["outcome"].as_str().is_some_and(|o| o.contains("502")), "{t}");
    assert!(
        s[5]["outcome"].as_str().is_some_and(|o| o.contains("no provider answered") && o.contains("502")),
        "the failed step carries the run's reason: {t}"
    );
    assert_eq!(t["reason"], s[5]["outcome"], "{t}");

    let human = run_cli(&home, &["trace", &id]);
    assert_eq!(human.code, Some(0), "{}", human.stderr);
    in_order(&human.stdout, &[&id, "failed", "received", "claimed", "provider_tried", "primary", "failed", "502"]);

    // An id the journal does not have is an error, said as such.
    let none = run_cli(&home, &["trace", "0123456789abcdef01234567"]);
    assert_ne!(none.code, Some(0), "{}", none.stdout);
    assert!(none.stderr.contains("no message 0123456789abcdef01234567"), "{}", none.stderr);
}

/// A chat platform message (the in-repo fake Telegram Bot API): its trace names the platform
/// and ends with the reply leaving through the outbox.
#[cfg(target_os = "linux")]
#[test]
fn a_platform_message_trace_ends_with_the_outbox_sent() {
    use gatewarden_telegram_fake::{FakeTelegram, Options};
    const TOKEN_ENV: &str = "GW_TEST_TRACE_TELEGRAM_TOKEN";
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).unwrap();
    let token = format!("{}77:trace-{}", std::process::id(), std::process::id());
    let creds = std::env::temp_dir().join(format!("gw-creds-trace-{}", std::process::id()));
    let (home, sw, otlp) = (TempHome::new(), Sweeper::new(), OtlpReceiver::start().unwrap());
    write_config(
        home.path(),
        &format!(
            "[agent]\nbackend = \"echo\"\n[[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\n\
             api_base = \"{}\"\npoll_timeout_s = 2\n[telemetry]\notlp_endpoint = \"{}\"\n",
            fake.base_url(),
            otlp.endpoint()
        ),
    );
    let mut g = builder(&home)
        .env(TAG_VAR, sw.tag())
        .env(TOKEN_ENV, &token)
        .env("GATEWARDEN_CREDS_DIR", creds.to_string_lossy().as_ref())
        .spawn();
    g.wait_ready(READY);
    fake.inject(&token, 7, 42, "trace me on telegram");
    let sent = fake.wait_sent(&token, FINAL, |s| s.iter().any(|m| m.text == "trace me on telegram"));
    assert!(sent.is_ok(), "no reply: {sent:?}");

    // The message id, from the journal (read-only) as an operator would from the dashboard.
    let db = home.path().join("journal.sqlite3");
    let out = std::process::Command::new(python())
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect('file:%s?mode=ro' % sys.argv[1], uri=True); \
                      print(c.execute(\"SELECT id FROM messages WHERE platform IS NOT NULL AND is_command = 0 \
                      ORDER BY rowid DESC LIMIT 1\").fetchone()[0])",
        ])
        .arg(&db)
        .output()
        .expect("python3 (scripts/setup-python)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();

    // Sent is recorded just after the platform answers: wait for the last step.
    let mut t = Value::Null;
    must_wait_until(FINAL, "outbox_sent in the trace", || {
        t = trace_json(&home, &id);
        steps(&t).last() == Some(&"outbox_sent")
    });
    assert_eq!(
        steps(&t),
        ["received", "journaled", "claimed", "backend_called", "first_token", "done", "outbox_sent"],
        "{t}"
    );
    let s = &t["steps"];
    let platform = s[0]["subject"].as_str().unwrap_or_default().to_owned();
    assert!(!platform.is_empty() && platform != "http", "received names the adapter: {t}");
    assert_eq!(t["platform"].as_str(), Some(platform.as_str()), "{t}");
    assert_eq!((s[3]["subject"].as_str(), s[6]["subject"].as_str()), (Some("echo"), Some(platform.as_str())), "{t}");
    assert_eq!(s[6]["outcome"], "ok", "{t}");

    // The reply's send goes out as the message's outbox span, under its message span.
    let mine = || -> Vec<gatewarden_testkit::otlp::Span> {
        otlp.spans().into_iter().filter(|s| s.attributes.get("gatewarden.message_id") == Some(&id)).collect()
    };
    must_wait_until(FINAL, "the outbox span at the OTLP receiver", || {
        let spans = mine();
        ["gatewarden.message", "gatewarden.outbox"].iter().all(|n| spans.iter().any(|s| s.name == *n))
    });
    let spans = mine();
    let root = spans.iter().find(|s| s.name == "gatewarden.message").unwrap();
    let outbox = spans.iter().find(|s| s.name == "gatewarden.outbox").unwrap();
    assert_eq!((outbox.trace_id.as_str(), outbox.parent.as_ref()), (root.trace_id.as_str(), Some(&root.span_id)));
    assert_eq!(outbox.attributes.get("gatewarden.platform"), Some(&platform));
    assert_eq!(root.attributes.get("gatewarden.platform"), Some(&platform));
    assert_eq!(spans.iter().filter(|s| s.name == "gatewarden.outbox").count(), 1, "exported once: {spans:#?}");
    assert_eq!(otlp.refused(), Vec::<String>::new());
}

/// An https collector goes through crates/net like every client: with its private CA as
/// `[telemetry] ca_file` the spans arrive over TLS; without it the certificate does not verify,
/// nothing arrives, and the failed batches are counted (the message itself is unaffected).
#[cfg(feature = "tls")]
#[test]
fn an_https_collector_is_verified_with_the_configured_ca() {
    use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};
    let ca = TestCa::new("gatewarden otel test CA");
    for pinned in [true, false] {
        let otlp = OtlpReceiver::start().unwrap();
        let front = TlsFront::start(otlp.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
        let (home, sw) = (TempHome::new(), Sweeper::new());
        let ca_line = if pinned {
            format!("ca_file = \"{}\"\n", ca.write_pem(home.path(), "otel-ca.pem").display())
        } else {
            String::new()
        };
        let config = format!(
            "[telemetry]\notlp_endpoint = \"https://localhost:{}\"\n{ca_line}metrics_interval_s = 3600\n",
            front.addr().port()
        );
        let g = gateway(&home, &sw, &config);
        let api = Api::new(g.listen());
        let id = api.submit("c1", "over tls");
        assert_eq!(wait_final(&api, &id, FINAL)["state"], "done");
        if pinned {
            must_wait_until(FINAL, "the spans through the TLS front", || {
                otlp.spans().iter().any(|s| s.attributes.get("gatewarden.message_id") == Some(&id))
            });
            assert!(front.handshakes() >= 1);
        } else {
            must_wait_until(FINAL, "the refused export counted in /metrics", || {
                api.get("/metrics").is_ok_and(|r| {
                    r.text().lines().any(|l| {
                        l.starts_with("gatewarden_otlp_batches_total{outcome=\"failed\"}") && !l.ends_with(" 0")
                    })
                })
            });
            assert_eq!(otlp.requests(), 0, "nothing reached the collector past an unverified certificate");
        }
    }
}
