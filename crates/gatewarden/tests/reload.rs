//! Issue 27 §2 and issue 30 §5 (first item) through the real binary: `gatewarden reload` and
//! SIGHUP change what can change live (a provider and its key, the log level; the chat side is
//! in platform_telegram.rs, `systemctl reload` in systemd.rs), a configuration that does not
//! load is refused naming the file, line and key while a client sees no failure, and every
//! signal of the README's table ends or continues as documented with its sender recorded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::otlp::OtlpReceiver;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use work_common::*;

/// How a reload is asked for.
#[derive(Debug, Clone, Copy)]
enum Route {
    Sighup,
    Cli,
}

/// Reloads `g`'s home by `route` and returns the ledger's new `reload` event.
#[track_caller]
fn reload(home: &TempHome, g: &mut Gateway, route: Route) -> Value {
    let before = home.events("reload").len();
    match route {
        Route::Sighup => g.signal(sig::SIGHUP),
        Route::Cli => assert_cli(&run_cli(home, &["reload"]), 0, "reload"),
    }
    wait_events(home, "reload", before + 1, READY).swap_remove(before)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

/// The reply of a sync message.
#[track_caller]
fn reply(api: &Api, text: &str) -> String {
    let r = api.send("c", "u", text).expect("POST /v1/messages");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().expect("json")["reply"].as_str().unwrap_or_default().to_owned()
}

/// The same incarnation answers, and nothing else started in the home.
#[track_caller]
fn same_incarnation(home: &TempHome, inc: &str) {
    assert_eq!(run_cli(home, &["status", "--json"]).json()["incarnation"].as_str(), Some(inc));
    assert_eq!(home.events("started").len(), 1, "a reload is not a restart:\n{}", home.ledger_text());
}

fn openai(llm: &FakeLlm, key_env: &str) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\ntimeout_s = 20\nretries = 0\n\
         [[agent.provider]]\nname = \"p\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"{key_env}\"\n",
        llm.base_url()
    )
}

/// A provider (and the key it is called with) is switched by SIGHUP, then back by the CLI:
/// each request reaches the provider the file names at that moment, with its key.
#[test]
fn sighup_and_reload_switch_the_provider_and_its_key() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let a = FakeLlm::start(Reply::text("from a")).unwrap();
    let b = FakeLlm::start(Reply::text("from b")).unwrap();
    write_config(home.path(), &openai(&a, "GW_TEST_KEY_A"));
    let mut g =
        builder(&home).env(TAG_VAR, sw.tag()).env("GW_TEST_KEY_A", "key-a").env("GW_TEST_KEY_B", "key-b").spawn();
    g.wait_ready(READY);
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let api = Api::new(g.listen()).with_timeout(Duration::from_secs(30));
    assert_eq!(reply(&api, "one"), "from a");

    write_config(home.path(), &openai(&b, "GW_TEST_KEY_B"));
    let ev = reload(&home, &mut g, Route::Sighup);
    let changed = strings(&ev["changed"]);
    assert!(changed.iter().any(|k| k == "agent.provider"), "{ev}");
    assert_eq!(ev["requester"]["pid"], json!(std::process::id()), "the SIGHUP's sender: {ev}");
    assert_eq!(reply(&api, "two"), "from b");
    let seen = b.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].header("authorization"), Some("Bearer key-b"));
    assert_eq!(a.requests(), 1, "the old provider is not called any more");

    write_config(home.path(), &openai(&a, "GW_TEST_KEY_A"));
    let ev = reload(&home, &mut g, Route::Cli);
    assert_eq!(ev["requester"]["channel"], json!("cli"), "{ev}");
    assert_eq!(reply(&api, "three"), "from a");
    assert_eq!((a.requests(), b.requests()), (2, 1));
    assert_eq!(a.seen()[1].header("authorization"), Some("Bearer key-a"));
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!(st["providers"][0]["name"], json!("p"), "{st}");
    same_incarnation(&home, &inc);
    stop_cleanly(&home, &mut g);
}

/// `log_level` applies at once: `error` hides the start-up lines, `info` (by SIGHUP) shows the
/// reload's own line, `warn` (by the CLI) hides it but keeps a warning, `error` hides both.
#[test]
fn sighup_and_reload_change_the_log_level() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "log_level = \"error\"\n");
    let count = |g: &Gateway, s: &str| g.stderr().matches(s).count();
    assert_eq!(count(&g, "info:"), 0, "{}", g.stderr());

    write_config(home.path(), "log_level = \"info\"\n");
    let ev = reload(&home, &mut g, Route::Sighup);
    assert_eq!(strings(&ev["changed"]), ["log_level"]);
    must_wait_until(READY, "the reload's info line", || count(&g, "info: reloaded") == 1);

    write_config(home.path(), "log_level = \"warn\"\n");
    reload(&home, &mut g, Route::Cli);
    g.signal(sig::SIGUSR2);
    wait_events(&home, "signal_ignored", 1, READY);
    must_wait_until(READY, "the warning", || count(&g, "warn: SIGUSR2 from pid") == 1);
    assert_eq!(count(&g, "info: reloaded"), 1, "an info line under warn:\n{}", g.stderr());

    write_config(home.path(), "log_level = \"error\"\n");
    reload(&home, &mut g, Route::Sighup);
    g.signal(sig::SIGUSR2);
    wait_events(&home, "signal_ignored", 2, READY);
    // The line would have been written before the event; the event is there, the line is not.
    assert_eq!(count(&g, "warn: SIGUSR2 from pid"), 1, "a warning under error:\n{}", g.stderr());
    assert_eq!(count(&g, "info: reloaded"), 1, "{}", g.stderr());
    stop_cleanly(&home, &mut g);
}

/// `[telemetry]` added by a reload starts exporting at once (the metrics, then a message's
/// spans), and a changed one replaces the exporter (the new `service_name` is what arrives).
#[test]
fn reload_starts_and_replaces_the_otlp_exporter() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let otlp = OtlpReceiver::start().expect("OTLP receiver");
    let mut g = gateway(&home, &sw, "");
    let telemetry = |service: &str| {
        format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval_s = 3600\ntimeout_s = 5\nservice_name = \"{service}\"\n",
            otlp.endpoint()
        )
    };
    let from = |service: &str| otlp.points().iter().filter(|p| p.service == service).count();
    write_config(home.path(), &telemetry("gw-reload-a"));
    let ev = reload(&home, &mut g, Route::Sighup);
    assert!(strings(&ev["changed"]).iter().any(|k| k == "telemetry.otlp_endpoint"), "{ev}");
    must_wait_until(READY, "metrics from the new exporter", || from("gw-reload-a") > 0);
    let id = Api::new(g.listen()).submit("c", "traced");
    must_wait_until(READY, "the message's spans", || {
        otlp.spans().iter().any(|s| s.attributes.get("gatewarden.message_id") == Some(&id))
    });

    write_config(home.path(), &telemetry("gw-reload-b"));
    reload(&home, &mut g, Route::Cli);
    must_wait_until(READY, "metrics from the replaced exporter", || from("gw-reload-b") > 0);
    stop_cleanly(&home, &mut g);
}

/// A configuration that does not load is refused, by the CLI (exit 78) and by SIGHUP, naming
/// the file, line and key; the gateway runs on as it was, and a client calling it all along
/// sees no failed request. The fixed file then reloads.
#[test]
fn a_config_that_does_not_load_is_refused_and_no_request_fails() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "admins = [\"a\"]\n[agent]\nbackend = \"echo\"\n");
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let (ok, failed, stop) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let client = {
        let (ok, failed, stop) = (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
        let api = Api::new(g.listen()).with_timeout(Duration::from_secs(10));
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let text = format!("ping {n}");
                match api.send("c", "u", &text) {
                    Ok(r)
                        if r.status == 200
                            && r.json().ok().and_then(|v| v["reply"].as_str().map(str::to_owned)) == Some(text) =>
                    {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.push(format!("{:?}", other.map(|r| (r.status, r.text()))));
                    }
                }
            }
            errors
        })
    };
    let calls = |n: u64| must_wait_until(READY, "the client's calls", || ok.load(Ordering::Relaxed) >= n);
    calls(20);

    write_config(home.path(), "admins = [\"a\", \"b\"]\nbogus_key = 1\n[agent]\nbackend = \"echo\"\n");
    let out = run_cli(&home, &["reload"]);
    assert_cli(&out, 78, "reload of a config that does not load");
    assert!(out.stderr.contains("config.toml:2: unknown key 'bogus_key'"), "{out:#?}");
    assert!(out.stderr.contains("runs on as it was"), "{out:#?}");
    let ev = wait_events(&home, "reload_refused", 1, READY).swap_remove(0);
    assert_eq!((ev["key"].as_str(), ev["line"].as_u64()), (Some("bogus_key"), Some(2)), "{ev}");
    assert!(ev["file"].as_str().is_some_and(|f| f.ends_with("/config.toml")), "{ev}");
    assert_eq!(ev["requester"]["channel"], json!("cli"), "{ev}");
    calls(ok.load(Ordering::Relaxed) + 10);

    write_config(home.path(), "drain_timeout_s = \"soon\"\n[agent]\nbackend = \"echo\"\n");
    g.signal(sig::SIGHUP);
    let ev = wait_events(&home, "reload_refused", 2, READY).swap_remove(1);
    assert_eq!((ev["key"].as_str(), ev["line"].as_u64()), (Some("drain_timeout_s"), Some(1)), "{ev}");
    assert_eq!(ev["requester"]["pid"], json!(std::process::id()), "{ev}");
    assert!(g.stderr().contains("reload refused:"), "{}", g.stderr());
    calls(ok.load(Ordering::Relaxed) + 10);
    assert!(home.events("reload").is_empty(), "nothing was applied:\n{}", home.ledger_text());

    write_config(home.path(), "admins = [\"a\", \"b\"]\n[agent]\nbackend = \"echo\"\n");
    let out = run_cli(&home, &["reload", "--json"]);
    assert_cli(&out, 0, "reload of the fixed file");
    assert_eq!(strings(&out.json()["reload"]["changed"]), ["admins"], "{out:#?}");
    calls(ok.load(Ordering::Relaxed) + 10);
    stop.store(true, Ordering::Relaxed);
    let errors = client.join().unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "failed requests: {errors:?}");
    same_incarnation(&home, &inc);
    stop_cleanly(&home, &mut g);
}

/// A reload with keys only a restart applies applies the rest (module notes of runtime
/// reload.rs: the live part is not held back), names the others on its output, in the ledger
/// and in `status`, with what applies them (a stop and a start here: an unsupervised restart's
/// successor keeps the running drain timeout), until the file runs.
#[test]
fn restart_keys_are_named_and_the_live_part_is_applied() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "admins = [\"a\"]\n");
    write_config(home.path(), "admins = [\"a\", \"b\"]\ndrain_timeout_s = 5\n[http]\nmax_connections = 64\n");
    let out = run_cli(&home, &["reload"]);
    assert_cli(&out, 0, "reload");
    assert!(out.stdout.contains("applied admins"), "{out:#?}");
    let waits = "needs a restart (the gateway runs on with the old values): drain_timeout_s, http.max_connections; \
                 run `gatewarden stop && gatewarden start`";
    assert!(out.stdout.contains(waits), "{out:#?}");
    let ev = home.events("reload").pop().expect("reload");
    let pending = json!(["drain_timeout_s", "http.max_connections"]);
    assert_eq!((&ev["changed"], &ev["restart_needed"]), (&json!(["admins"]), &pending), "{ev}");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!((&st["restart_needed"], &st["drain_timeout_s"]), (&pending, &json!(30)), "{st}");
    assert!(run_cli(&home, &["status"]).stdout.contains("restart for: drain_timeout_s, http.max_connections"));

    stop_cleanly(&home, &mut g);
    assert_cli(&cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], Duration::from_secs(30)), 0, "start");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!((&st["restart_needed"], &st["drain_timeout_s"]), (&Value::Null, &json!(5)), "{st}");
    let ev = reload(&home, &mut g, Route::Cli);
    assert_eq!((&ev["changed"], &ev["restart_needed"]), (&json!([]), &json!([])), "the file runs: {ev}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// The signals of the README's table that do not end the gateway: SIGUSR2 and a SIGPIPE from
/// another process are recorded and ignored, SIGHUP reloads; each names its sender (this test
/// process). SIGQUIT then drains and ends it as unexpected (exit 1), recorded with its sender.
#[test]
fn each_signal_ends_or_continues_as_documented_and_names_its_sender() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "");
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let me = json!(std::process::id());
    for (sig, name) in [(sig::SIGUSR2, "SIGUSR2"), (sig::SIGPIPE, "SIGPIPE")] {
        let n = home.events("signal_ignored").len();
        g.signal(sig);
        let ev = wait_events(&home, "signal_ignored", n + 1, READY).swap_remove(n);
        assert_eq!((ev["signal"].as_str(), &ev["sender"]["pid"]), (Some(name), &me), "{ev}");
        assert!(serving(&mut g), "{name} ends nothing");
    }
    let ev = reload(&home, &mut g, Route::Sighup);
    assert_eq!((&ev["requester"]["pid"], ev["requester"]["signal"].as_str()), (&me, Some("SIGHUP")), "{ev}");
    assert!(serving(&mut g), "SIGHUP ends nothing");
    same_incarnation(&home, &inc);

    g.signal(sig::SIGQUIT);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 1, "SIGQUIT");
    let stop = home.events("stop_requested").pop().expect("the SIGQUIT is recorded");
    assert_eq!((&stop["requester"]["pid"], stop["reason"].as_str()), (&me, Some("SIGQUIT")), "{stop}");
    assert_eq!(stop["unexpected"], json!(true), "{stop}");
    let exited = home.events("exited").pop().expect("exited");
    let from = format!("SIGQUIT from pid {}", std::process::id());
    assert!(exited["reason"].as_str().is_some_and(|r| r.contains(&from)), "{exited}");
    assert!(home.events("drained").len() == 1, "drained first:\n{}", home.ledger_text());
}

/// SIGUSR1 is a planned restart (exit 75, a successor), its sender recorded.
#[test]
fn sigusr1_restarts_and_names_its_sender() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "");
    g.signal(sig::SIGUSR1);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "SIGUSR1");
    let req = home.events("restart_requested").pop().expect("restart_requested");
    assert_eq!(req["requester"]["pid"], json!(std::process::id()), "{req}");
    wait_new_ready(home.path(), &[g.pid()], READY).expect("the successor");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], READY), 0, "stop");
}

/// A successor waiting for its predecessor's lock (the handlers are installed before it
/// waits) ends at once on a SIGTERM, recorded with the sender, instead of dying by the default
/// action or starting anyway once the lock is free; its predecessor, still draining, then
/// serves on.
#[test]
fn a_successor_waiting_for_the_lock_ends_on_a_sigterm_and_says_so() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let gate = home.scratch("gate", "");
    let mut g = gateway(&home, &sw, &gated_exec(&gate));
    let _held = Api::new(g.listen()).submit("c", "held");
    wait_active(g.listen(), 1);
    g.signal(sig::SIGUSR1);
    let successor = wait_events(&home, "successor_started", 1, READY)[0]["successor_pid"].as_u64().unwrap() as u32;
    wait_state(&home, "draining", READY);
    must_wait_until(READY, "the successor's handlers", || catches_signal(successor, sig::SIGTERM));
    send_signal(successor, sig::SIGTERM).unwrap();
    assert!(wait_until(READY, || !pid_alive(successor)), "the successor still waits for the lock");
    let refused = wait_events(&home, "start_refused", 1, READY).swap_remove(0);
    let why = format!("SIGTERM from pid {} ", std::process::id());
    assert_eq!(refused["code"], json!(1), "{refused}");
    assert!(
        refused["reason"].as_str().is_some_and(|r| r.contains(&why) && r.contains("waiting for the predecessor")),
        "{refused}"
    );
    assert_eq!(refused["pid"], json!(successor), "{refused}");
    // Nothing would replace the predecessor now: it cancels its drain and serves on (issue 27
    // §1, crates/runtime/src/restart.rs), and the backstop stands down.
    wait_events(&home, "drain_cancelled", 1, READY);
    std::fs::write(&gate, b"").unwrap();
    wait_state(&home, "running", READY);
    assert!(g.alive(), "the predecessor serves on: {}", g.diag());
    assert_cli(&cli_tagged(&home, &sw, &["stop"], READY), 0, "stop");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "the predecessor, stopped");
}

/// Issue 30 §5: a bare SIGTERM names its sender, pid and command line, in the ledger and the
/// log (siginfo through the SA_SIGINFO handler, runtime signals/unix.rs).
#[test]
fn a_sigterm_names_its_sender_in_the_ledger_and_the_log() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, "");
    // The sender waits on its stdin after the kill, so its command line can still be read;
    // closing it ends the sender.
    let mut sender = std::process::Command::new("sh")
        .args(["-c", &format!("kill -TERM {} && read _", g.pid())])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the sender");
    let st = g.wait_exit(EXIT);
    let pid = sender.id();
    drop(sender.stdin.take());
    let _ = sender.wait();
    assert_exit_code(&g, st, 1, "bare SIGTERM");
    let stop = home.events("stop_requested").pop().expect("the SIGTERM is recorded");
    assert_eq!(stop["requester"]["pid"], json!(pid), "{stop}");
    let argv = strings(&stop["requester"]["argv"]).join(" ");
    assert!(argv.contains(&format!("kill -TERM {}", g.pid())), "{stop}");
    let exited = home.events("exited").pop().expect("exited");
    let from = format!("SIGTERM from pid {pid}");
    assert!(exited["reason"].as_str().is_some_and(|r| r.contains(&from)), "{exited}");
    assert!(g.stderr().contains(&from), "{}", g.stderr());
}
