//! Issue 17 §1 through the real binary: `backend = "openai"` with a failing primary and a
//! streaming fallback (crates/testkit llmfake.rs), driven by the official `openai` Python SDK
//! (scripts/setup-python). The SDK's stream arrives token by token with the usage chunk; the
//! failover shows in `status --json`, `/metrics`, the ledger, and the usage in the journal.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use std::process::{Command, Stdio};
use std::time::Duration;
use work_common::*;

/// `Some(reason)` when the SDK cannot run here (and we are not under CI).
fn unavailable() -> Option<String> {
    let py = python();
    let probe = Command::new(&py).args(["-c", "import openai"]).stdin(Stdio::null()).output();
    let reason = match probe {
        Err(e) => format!("{py} not runnable: {e}"),
        Ok(o) if !o.status.success() => format!(
            "the `openai` package is missing for {py} (run scripts/setup-python): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(_) => return None,
    };
    gatewarden_testkit::unavailable::<()>("the openai SDK", &reason);
    Some(reason)
}

/// Runs a Python snippet with `ADDR` (and `DB`) in its environment, bounded; returns stdout.
fn py(script: &str, env: &[(&str, String)]) -> Value {
    let mut c = Command::new(python());
    c.args(["-c", script]).env("NO_PROXY", "*").env_remove("OPENAI_BASE_URL").env_remove("OPENAI_API_KEY");
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn python");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("python output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("python did not finish within 60 s");
        }
    };
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

const CLIENT: &str = r#"
import json, os
from openai import OpenAI
c = OpenAI(base_url="http://%s/v1" % os.environ["ADDR"], api_key="x", timeout=30, max_retries=0)
out = {"deltas": [], "usage": None}
stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                   stream_options={"include_usage": True})
for chunk in stream:
    for ch in chunk.choices:
        if ch.delta.content:
            out["deltas"].append(ch.delta.content)
    if chunk.usage:
        out["usage"] = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
out["plain"] = r.choices[0].message.content
out["plain_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
print(json.dumps(out))
"#;

const JOURNAL_USAGE: &str = r#"
import json, os, sqlite3
db = sqlite3.connect("file:%s?mode=ro" % os.environ["DB"], uri=True)
row = db.execute("SELECT prompt_tokens, completion_tokens FROM messages WHERE id = ?", (os.environ["ID"],)).fetchone()
print(json.dumps(row))
"#;

#[test]
fn failover_streaming_and_usage_through_the_gateway() {
    if unavailable().is_some() {
        return;
    }
    let primary = FakeLlm::start(Reply::status(502)).unwrap();
    let fallback =
        FakeLlm::start(Reply::Text { text: "streamed through the gateway".into(), usage: Some((11, 4)) }).unwrap();
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config = format!(
        "[agent]\nbackend = \"openai\"\nretries = 1\nbackoff_ms = 10\ncooldown_s = 3600\ntimeout_s = 30\n\n\
         [[agent.provider]]\nname = \"primary\"\nbase_url = \"{}\"\nmodel = \"p\"\n\n\
         [[agent.provider]]\nname = \"fallback\"\nbase_url = \"{}\"\nmodel = \"f\"\n",
        primary.base_url(),
        fallback.base_url()
    );
    let g = gateway(&home, &sw, &config);

    // Streaming and plain through the SDK: the fallback's answer, nothing about the failover.
    let v = py(CLIENT, &[("ADDR", g.listen().to_string())]);
    let deltas: Vec<&str> = v["deltas"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(deltas.len() >= 3, "the upstream's stream should pass through in pieces: {v}");
    assert_eq!(deltas.concat(), "streamed through the gateway", "{v}");
    assert_eq!(v["usage"], json!([11, 4]), "{v}");
    assert_eq!(v["plain"], json!("streamed through the gateway"), "{v}");
    assert_eq!(v["plain_usage"], json!([11, 4]), "{v}");
    assert!(fallback.seen()[0].body["stream"] == json!(true), "the gateway streamed from the upstream");

    // A third call (async, journaled) trips the primary's breaker; its usage is in the journal.
    let api = Api::new(g.listen());
    let id = api.submit("c1", "third");
    let m = wait_final(&api, &id, Duration::from_secs(30));
    assert_eq!((m["state"].as_str(), m["reply"].as_str()), (Some("done"), Some("streamed through the gateway")), "{m}");
    let db = home.path().join("journal.sqlite3").to_string_lossy().into_owned();
    assert_eq!(py(JOURNAL_USAGE, &[("DB", db), ("ID", id)]), json!([11, 4]));
    assert_eq!(primary.requests(), 6, "three calls, two attempts each");

    // Cooling down: the primary is not asked again.
    assert_eq!(api.send("c1", "c1", "fourth").unwrap().status, 200);
    assert_eq!(primary.requests(), 6, "the primary was called during its cool-down");

    let out = run_cli(&home, &["status", "--json"]);
    let st: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let ps = &st["providers"];
    assert_eq!((ps[0]["name"].as_str(), ps[0]["state"].as_str()), (Some("primary"), Some("cooling_down")), "{st}");
    assert!(ps[0]["until"].as_u64().is_some() && ps[0]["reason"].as_str().is_some_and(|r| r.contains("502")), "{st}");
    assert_eq!((ps[1]["state"].as_str(), ps[1]["attempts"].as_u64()), (Some("healthy"), Some(4)), "{st}");

    let metrics = api.get("/metrics").unwrap().text();
    for line in [
        "gatewarden_provider_state{provider=\"primary\",state=\"cooling_down\"} 1",
        "gatewarden_provider_state{provider=\"fallback\",state=\"healthy\"} 1",
        "gatewarden_provider_attempts_total{provider=\"primary\"} 6",
        "gatewarden_provider_failures_total{provider=\"primary\"} 6",
        "gatewarden_tokens_total{kind=\"prompt\"} 44",
        "gatewarden_tokens_total{kind=\"completion\"} 16",
    ] {
        assert!(metrics.lines().any(|l| l == line), "/metrics lacks {line:?}:\n{metrics}");
    }

    let evs = wait_events(&home, "provider_state", 2, Duration::from_secs(10));
    let changes: Vec<(String, String)> =
        evs.iter().map(|e| (e["from"].as_str().unwrap_or("").into(), e["to"].as_str().unwrap_or("").into())).collect();
    assert_eq!(
        changes,
        vec![("healthy".into(), "failing".into()), ("failing".into(), "cooling_down".into())],
        "{evs:?}"
    );
    assert!(evs.iter().all(|e| e["provider"] == "primary"), "{evs:?}");
}

/// `[agent]` with a `primary` and a `fallback` provider (one retry, fast backoff).
fn two_providers(primary: &FakeLlm, fallback: &FakeLlm, extra: &str) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\nretries = 1\nbackoff_ms = 10\ncooldown_s = 3600\ntimeout_s = 30\n{extra}\n\
         [[agent.provider]]\nname = \"primary\"\nbase_url = \"{}\"\nmodel = \"p\"\n\n\
         [[agent.provider]]\nname = \"fallback\"\nbase_url = \"{}\"\nmodel = \"f\"\n",
        primary.base_url(),
        fallback.base_url()
    )
}

/// A streaming `/v1/chat/completions` call: the content deltas, and the error event's message
/// if the stream ended with one.
fn sse_call(api: &Api) -> (String, Option<String>) {
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = api.post_json("/v1/chat/completions", &body).expect("chat completions");
    assert_eq!(r.status, 200, "{r:?}");
    let (mut text, mut error) = (String::new(), None);
    for data in r.text().lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
        if let Some(e) = v["error"]["message"].as_str() {
            error = Some(e.to_owned());
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
    }
    (text, error)
}

/// `gatewarden_provider_failures_total` of `provider` in `/metrics`.
fn failures_metric(api: &Api, provider: &str) -> u64 {
    let metrics = api.get("/metrics").unwrap().text();
    let key = format!("gatewarden_provider_failures_total{{provider=\"{provider}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Issue 27 §6 through the real binary: a primary that drops the connection mid-stream, before
/// any of its reply reached the caller, is retried and failed over like a refused connection:
/// a journaled (async) caller gets the fallback's whole answer; a streaming caller too when the
/// drop comes before its first piece was passed on (here: before any content). Once a piece
/// has reached a streaming caller, the run ends as before, told with the failure text. Every
/// drop counts in `status --json` `failures` and `gatewarden_provider_failures_total`.
#[test]
fn a_provider_dropping_mid_stream_is_failed_over_until_the_reply_reached_the_caller() {
    let primary = FakeLlm::start(Reply::broken("half an ans")).unwrap();
    let fallback = FakeLlm::start(Reply::text("the whole answer")).unwrap();
    // Pieces 200 ms apart: a streaming caller has the first long before the drop.
    primary.set_latency(Duration::ZERO, Duration::from_millis(200));
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, &two_providers(&primary, &fallback, "failure_text = \"no answer this time\""));
    let api = Api::new(g.listen());

    // Async: nothing reaches the caller before the end.
    let id = api.submit("c1", "async");
    let m = wait_final(&api, &id, Duration::from_secs(30));
    assert_eq!((m["state"].as_str(), m["reply"].as_str()), (Some("done"), Some("the whole answer")), "{m}");
    assert_eq!(primary.requests(), 2, "retried once, then failed over");
    let out = run_cli(&home, &["status", "--json"]);
    let st: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(st["providers"][0]["failures"], json!(2), "mid-stream drops are failures: {st}");
    assert_eq!(failures_metric(&api, "primary"), 2);

    // Streaming, the first content piece reaches the caller at once: too late to fail over.
    let (text, error) = sse_call(&api);
    assert!(text.starts_with("half"), "{text:?}");
    assert_eq!(error.as_deref().map(|e| e.starts_with("no answer this time (ref ")), Some(true), "{error:?}");
    assert!(!error.unwrap_or_default().contains("DONE"), "the reason is the operator's");
    assert_eq!(fallback.requests(), 1, "no failover after the first piece");
    assert_eq!(failures_metric(&api, "primary"), 3);

    // Streaming, dropped before any content: the caller sees only the fallback's answer.
    let early = FakeLlm::start(Reply::broken("")).unwrap();
    let config = two_providers(&early, &fallback, "");
    let home2 = TempHome::new();
    let g2 = gateway(&home2, &sw, &config);
    let api2 = Api::new(g2.listen());
    let (text, error) = sse_call(&api2);
    assert_eq!((text.as_str(), error), ("the whole answer", None));
    assert_eq!(failures_metric(&api2, "primary"), 2);
    drop((g, g2));
    let _ = sw.sweep();
}
