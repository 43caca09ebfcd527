//! Issue 33 §2: `doctor` and `status` see what users see. Each test makes the condition with
//! real gateways and the fakes, then reads `doctor --json` (each finding with its fix) and the
//! plain `status` (the agent's and the platforms' health, the last failure). The full disk is
//! tests/overlap.rs's (`disk-full`).
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

/// `doctor --json`'s findings: `(id, severity)`, each checked to carry a fix.
#[track_caller]
fn findings(home: &TempHome) -> (Value, Vec<(String, String)>) {
    let out = run_cli(home, &["doctor", "--json"]);
    assert!(!out.panicked(), "{out:#?}");
    let doc = out.json();
    let list = doc["findings"].as_array().cloned().unwrap_or_default();
    let ids = list
        .iter()
        .map(|f| {
            (f["id"].as_str().unwrap_or_default().to_owned(), f["severity"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    (doc, ids)
}

/// Waits until `doctor` reports `id` (with `severity`); returns that finding.
#[track_caller]
fn wait_finding(home: &TempHome, id: &str, severity: &str, within: Duration) -> Value {
    let mut last = Value::Null;
    let found = wait_until(within, || {
        let (doc, _) = findings(home);
        last = doc.clone();
        doc["findings"].as_array().into_iter().flatten().any(|f| f["id"] == id && f["severity"] == severity)
    });
    assert!(found, "doctor did not report {id} ({severity}) within {within:?}: {last:#}");
    let f = last["findings"].as_array().unwrap().iter().find(|f| f["id"] == id && f["severity"] == severity).unwrap();
    assert!(f["fix"]["hint"].as_str().is_some_and(|h| !h.is_empty()), "{id} carries its fix: {f:#}");
    f.clone()
}

fn status_text(home: &TempHome) -> String {
    run_cli(home, &["status"]).stdout
}

/// Two providers that answer 500: after one run both are `failing` (an error: no provider is
/// healthy), after three in a row both are cooling down and the runs themselves are failing;
/// `status` says the agent is failing and what failed last. Before any run: none of it.
#[test]
fn failing_providers_cooling_down_and_runs_failing_in_a_row() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let (a, b) = (FakeLlm::start(Reply::status(500)).unwrap(), FakeLlm::start(Reply::status(500)).unwrap());
    let config = format!(
        "[agent]\nbackend = \"openai\"\nretries = 0\ncooldown_s = 300\n\
         [[agent.provider]]\nname = \"primary\"\nbase_url = \"{}\"\nmodel = \"m\"\n\
         [[agent.provider]]\nname = \"fallback\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
        a.base_url(),
        b.base_url()
    );
    let g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    let (_, before) = findings(&home);
    assert!(!before.iter().any(|(id, _)| id.starts_with("provider-") || id == "runs-failing"), "{before:?}");
    assert!(status_text(&home).contains("agent:       healthy"), "{}", status_text(&home));

    let r = api.send("c1", "u1", "one").unwrap();
    assert_eq!(r.status, 502, "the run fails: {r:?}");
    let f = wait_finding(&home, "provider-failing", "error", Duration::from_secs(10));
    assert!(f["message"].as_str().unwrap().contains("no provider is healthy"), "{f:#}");
    let (_, ids) = findings(&home);
    assert!(!ids.iter().any(|(id, _)| id == "runs-failing"), "one failed run is not yet failing runs: {ids:?}");

    for text in ["two", "three"] {
        assert_eq!(api.send("c1", "u1", text).unwrap().status, 502);
    }
    wait_finding(&home, "provider-cooling-down", "error", Duration::from_secs(10));
    let f = wait_finding(&home, "runs-failing", "error", Duration::from_secs(10));
    assert!(f["message"].as_str().unwrap().contains("the last 3 runs failed"), "{f:#}");
    let doctor = run_cli(&home, &["doctor"]);
    assert_cli(&doctor, 1, "doctor with errors");
    assert!(doctor.stdout.contains("error[runs-failing]") && doctor.stdout.contains("    fix: "), "{}", doctor.stdout);
    let s = status_text(&home);
    assert!(s.contains("agent:       failing · backend openai · 0 ok, 3 failed (3 in a row)"), "{s}");
    assert!(s.contains("provider primary cooling_down until"), "{s}");
    assert!(s.contains("last failure: agent run: "), "{s}");
}

/// One Telegram adapter whose token the Bot API refuses (parked, not retried: an error) and
/// one whose Bot API cannot be reached (degraded, retried: a warning); `status` says the
/// platforms are failing and names both.
#[test]
fn degraded_and_parked_platforms() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).unwrap();
    let refused = format!("{}01:refused", std::process::id());
    let unreachable = format!("{}02:unreachable", std::process::id());
    fake.revoke(&refused);
    let closed = format!("http://127.0.0.1:{}", gatewarden_testkit::api::free_port());
    let config = format!(
        "[[platform]]\nkind = \"telegram\"\nname = \"refused\"\ntoken_env = \"GW_TG_REFUSED\"\napi_base = \"{}\"\n\
         [[platform]]\nkind = \"telegram\"\nname = \"away\"\ntoken_env = \"GW_TG_AWAY\"\napi_base = \"{closed}\"\n",
        fake.base_url()
    );
    write_config(home.path(), &config);
    let mut g = builder(&home)
        .env(TAG_VAR, sw.tag())
        .env("GATEWARDEN_CREDS_DIR", creds_dir())
        .env("GW_TG_REFUSED", &refused)
        .env("GW_TG_AWAY", &unreachable)
        .spawn();
    g.wait_ready(READY);
    let parked = wait_finding(&home, "platform-parked", "error", Duration::from_secs(20));
    assert_eq!(parked["subject"], "platform refused (telegram)", "{parked:#}");
    let degraded = wait_finding(&home, "platform-degraded", "warning", Duration::from_secs(20));
    assert_eq!(degraded["subject"], "platform away (telegram)", "{degraded:#}");
    let s = status_text(&home);
    assert!(s.contains("platforms:   failing · "), "{s}");
    assert!(s.contains("refused (telegram) parked") && s.contains("away (telegram) degraded"), "{s}");
    assert!(s.contains("last failure: platform "), "{s}");
}

/// 64 runs held by the provider (the worker's concurrency) with 16 KiB messages fill a 1 MiB
/// journal that cannot prune them (nothing is finished); four more wait in the queue, and a
/// reload lowers `max_queued` to 5: both caps are near.
#[test]
fn a_journal_and_a_queue_near_their_caps() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let llm = FakeLlm::start(Reply::held(Reply::text("late"))).unwrap();
    let config = |max_queued: u32| {
        format!(
            "drain_timeout_s = 1\n[journal]\nmax_size_mb = 1\nmax_queued = {max_queued}\n\
             [agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 600\nattempt_timeout_s = 600\n",
            llm.base_url()
        )
    };
    let g = gateway(&home, &sw, &config(1000));
    let api = Api::new(g.listen());
    let big = "x".repeat(16 * 1024);
    for n in 0..64 {
        let r = api.send_async(&format!("chat-{n}"), "u", &big).unwrap();
        assert_eq!(r.status, 202, "{r:?}");
    }
    assert!(wait_until(Duration::from_secs(30), || llm.holding() == 64), "64 runs in flight: {}", llm.holding());
    let (_, ids) = findings(&home);
    assert!(!ids.iter().any(|(id, _)| id == "queue-near-cap"), "nothing waits yet: {ids:?}");
    for n in 0..4 {
        assert_eq!(api.send_async("one-chat", "u", &format!("waiting {n}")).unwrap().status, 202);
    }
    let j = wait_finding(&home, "journal-near-cap", "warning", Duration::from_secs(10));
    assert!(j["message"].as_str().unwrap().contains("max_size_mb = 1"), "{j:#}");
    write_config(home.path(), &config(5));
    assert_cli(&run_cli(&home, &["reload"]), 0, "reload with max_queued = 5");
    let q = wait_finding(&home, "queue-near-cap", "warning", Duration::from_secs(10));
    assert!(q["message"].as_str().unwrap().contains("4 messages waiting of max_queued = 5"), "{q:#}");
    // `top` shows the same queue.
    let top = run_cli(&home, &["top", "--json"]).json();
    assert_eq!((top["queue"]["queued"].as_u64(), top["runs_in_flight"].as_u64()), (Some(4), Some(64)), "{top:#}");
    llm.release();
}

/// The first upstream the configuration names answers with a `Date` two hours behind this
/// machine's: `clock-skew` (an error: certificates look expired or not valid yet). A provider
/// whose clock agrees gives no finding. No gateway needs to run.
#[test]
fn the_clock_far_off() {
    let home = TempHome::new();
    let llm = FakeLlm::start(Reply::text("hi")).unwrap();
    write_config(
        home.path(),
        &format!("[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n", llm.base_url()),
    );
    llm.set_clock(-7200);
    let f = wait_finding(&home, "clock-skew", "error", Duration::from_secs(10));
    assert!(f["message"].as_str().unwrap().contains("2 h ahead of 127.0.0.1:"), "{f:#}");
    llm.set_clock(1);
    let (_, ids) = findings(&home);
    assert!(!ids.iter().any(|(id, _)| id == "clock-skew"), "{ids:?}");
}
