//! CLI surface: status object (§4), history and lenient ledger reading (J1), unusable homes,
//! home creation, usage errors.
#![cfg(target_os = "linux")]

mod common;
use common::*;
use std::time::Duration;

fn is_hex16(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// §4: `status --json` while running has every field with the right value; `GET /v1/status`
/// shares the shape; text `status` exits 0.
#[test]
fn status_json_fields_while_running() {
    let home = TempHome::new();
    let mut g = start(&home);
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 0, "status --json while running");
    let v = out.json();
    assert_eq!(v["running"], json!(true), "{v}");
    assert_eq!(v["pid"], json!(g.pid()), "{v}");
    assert_eq!(v["start_time"], json!(g.start_time()), "{v}");
    assert!(is_hex16(&v["incarnation"]), "incarnation must be 16 hex digits: {v}");
    assert!(v["version"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(v["state"], json!("running"), "{v}");
    assert_eq!(v["home"], json!(home.path()), "home must be canonical: {v}");
    assert_eq!(v["listen"], json!(g.listen().to_string()), "{v}");
    assert!(v["uptime_s"].as_f64().is_some_and(|u| u >= 0.0), "{v}");
    assert_eq!(v["supervisor"], json!("none"), "{v}");
    assert_eq!(v["active_runs"], json!(0), "{v}");
    assert!(v["control"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(v["files"]["pid"], json!("ok"), "{v}");
    assert_eq!(v["files"]["state"], json!("ok"), "{v}");

    let rec = home.pid_record().unwrap();
    assert_eq!(rec["incarnation"], v["incarnation"], "gateway.pid vs status incarnation");

    let r = http_get(g.listen(), "/v1/status", Duration::from_secs(2)).expect("GET /v1/status");
    assert_eq!(r.status, 200);
    let h = r.json().unwrap();
    for k in ["running", "pid", "start_time", "incarnation", "version", "state", "home", "listen", "supervisor"] {
        assert_eq!(h[k], v[k], "/v1/status vs status --json differ on `{k}`: {h} vs {v}");
    }
    let healthz = http_get(g.listen(), "/healthz", Duration::from_secs(2)).expect("GET /healthz");
    assert_eq!(healthz.status, 200);

    assert_cli(&run_cli(&home, &["status"]), 0, "text status while running");
    stop_cleanly(&home, &mut g);
}

/// §4: not running → `running:false`, identity fields null, exit 3 (fresh home and a home
/// that does not exist).
#[test]
fn status_json_not_running_has_null_identity() {
    let home = TempHome::new();
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 3, "status --json, empty home");
    let v = out.json();
    assert_eq!(v["running"], json!(false), "{v}");
    for k in ["pid", "start_time", "incarnation"] {
        assert!(v[k].is_null(), "`{k}` must be null when not running: {v}");
    }
    let missing = TempHome::uncreated();
    assert_cli(&run_cli(&missing, &["status"]), 3, "status on a home that does not exist");
}

/// `gateway.pid` has every §2.1 field; the incarnation changes across starts; the home is
/// created 0700, control.sock is 0600, and the lock is held by the gateway.
#[test]
fn run_creates_home_0700_and_writes_full_records() {
    use std::os::unix::fs::PermissionsExt;
    let home = TempHome::uncreated();
    let mut g = start(&home);
    let mode = std::fs::metadata(home.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "home mode {mode:o}");
    let rec = home.pid_record().expect("gateway.pid JSON");
    assert_eq!(rec["pid"], json!(g.pid()));
    assert_eq!(rec["kind"], json!("gatewarden"));
    assert!(rec["argv"].as_array().is_some_and(|a| !a.is_empty()), "{rec}");
    assert_eq!(rec["start_time"], json!(g.start_time()));
    assert_eq!(rec["home"], json!(home.path()));
    assert!(is_hex16(&rec["incarnation"]), "{rec}");
    assert!(rec["version"].is_string() && rec["started_at"].is_string(), "{rec}");
    let state = home.state_record().unwrap();
    for k in ["exit_reason", "exit_code", "active_runs", "listen", "control", "supervisor", "updated_at"] {
        assert!(state.get(k).is_some(), "gateway_state.json lacks `{k}`: {state}");
    }
    let control = state["control"].as_str().unwrap().to_string();
    let cmode = std::fs::metadata(&control).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(cmode.ok(), Some(0o600), "control socket {control} mode");
    assert_eq!(lock_holders(&home.lock_file()), vec![g.pid()]);
    let inc1 = rec["incarnation"].clone();
    stop_cleanly(&home, &mut g);
    let mut g2 = start(&home);
    assert_ne!(home.pid_record().unwrap()["incarnation"], inc1, "incarnation must be random per start");
    stop_cleanly(&home, &mut g2);
}

/// `GATEWARDEN_HOME` selects the home like `--home`.
#[test]
fn gatewarden_home_env_selects_home() {
    let home = TempHome::new();
    let mut g = builder(&home).home_via_env().spawn();
    g.wait_ready(READY);
    let out = cli_env(bin(), home.path(), &["status"], &[]);
    assert_cli(&out, 0, "status --home on a home started via GATEWARDEN_HOME");
    stop_cleanly(&home, &mut g);
}

/// J1: `history` on a ledger with a non-UTF-8 line, a garbage line and a truncated line does
/// not panic, exits 0, and prints the valid events (newest last; `-n` limits).
#[test]
fn j1_history_tolerates_non_utf8_and_garbage_lines() {
    let home = TempHome::new();
    let ev = |event: &str, ts: &str| {
        json!({"ts": ts, "event": event, "pid": 4242, "start_time": 3921877,
               "incarnation": "9f2c4e1a7b3d5e60", "version": "0.1.0"})
        .to_string()
    };
    let mut ledger = Vec::new();
    ledger.extend_from_slice(ev("started", "2026-11-29T15:04:05.123456+00:00").as_bytes());
    ledger.extend_from_slice(b"\n\xff\xfe\x17\x03\x03\xc7 cp936 \xb2\xe2\xca\xd4\n");
    ledger.extend_from_slice(b"this is not json\n{\"event\": \"trunc\n\n[1,2,3]\n");
    ledger.extend_from_slice(ev("exited", "2026-11-29T15:05:05.123456+00:00").as_bytes());
    ledger.push(b'\n');
    std::fs::write(home.ledger(), &ledger).unwrap();

    let out = run_cli(&home, &["history"]);
    assert_cli(&out, 0, "history on a partly corrupt ledger");
    let (i_start, i_exit) = (out.stdout.find("started"), out.stdout.find("exited"));
    assert!(i_start.is_some() && i_exit.is_some(), "history lost valid events:\n{}", out.stdout);
    assert!(i_start < i_exit, "history must print newest last:\n{}", out.stdout);

    let out = run_cli(&home, &["history", "--json"]);
    assert_cli(&out, 0, "history --json");
    let events: Vec<Value> = out
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("history --json line is not JSON ({e}): {l:?}")))
        .collect();
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(names, ["started", "exited"], "history --json events: {events:?}");

    let out = run_cli(&home, &["history", "-n", "1", "--json"]);
    assert_cli(&out, 0, "history -n 1 --json");
    let lines: Vec<&str> = out.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{:?}", out.stdout);
    assert!(lines[0].contains("exited"), "-n 1 must keep the newest: {lines:?}");
}

/// A real start/stop leaves started → ready → stop_requested → exited, in order, in history.
#[test]
fn history_shows_real_lifecycle_in_order() {
    let home = TempHome::new();
    let mut g = start(&home);
    stop_cleanly(&home, &mut g);
    let out = run_cli(&home, &["history", "--json"]);
    assert_cli(&out, 0, "history --json");
    let names: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    let pos = |n: &str| names.iter().position(|x| x == n).unwrap_or_else(|| panic!("no `{n}` in {names:?}"));
    assert!(
        pos("started") < pos("ready") && pos("ready") < pos("stop_requested") && pos("stop_requested") < pos("exited"),
        "events out of order: {names:?}"
    );
}

/// Unusable home (a regular file where the directory should be): `run` exits 78 with a clear
/// message; `status` exits 4 ("unknown: home unreadable", protocol §5.2) with a message.
#[test]
fn unusable_home_run_exits_78_status_exits_4() {
    let home = TempHome::home_is_a_file();
    let mut g = builder(&home).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run with a file as home");
    let err = g.stderr();
    assert!(
        err.contains(&*home.path().to_string_lossy()) || err.to_lowercase().contains("home"),
        "run's message should name the home:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = run_cli(&home, &["status"]);
    assert_cli(&out, 4, "status with a file as home");
    assert!(!out.stdout.trim().is_empty() || !out.stderr.trim().is_empty(), "status printed nothing");
}

/// §5.2: usage errors exit 2.
#[test]
fn usage_error_exits_2() {
    let home = TempHome::new();
    assert_cli(&run_cli(&home, &["frobnicate"]), 2, "unknown verb");
    assert_cli(&run_cli(&home, &["stop", "--timeout", "soon"]), 2, "bad --timeout");
}

/// Issue 28: shell completions (bash, zsh, fish) and the man page come from the parser itself
/// (what release tarballs ship, scripts/release): each names every public verb, the bash script
/// parses, and the man page has a section per verb. Neither needs a home.
#[test]
fn completions_and_man_page_come_from_the_parser() {
    let home = TempHome::new();
    let verbs = ["run", "status", "stop", "start", "restart", "update", "supervise", "history", "completions"];
    for shell in ["bash", "zsh", "fish"] {
        let out = run_cli(&home, &["completions", shell]);
        assert_cli(&out, 0, shell);
        for v in verbs {
            assert!(out.stdout.contains(v), "{shell} completions lack {v}");
        }
    }
    let bash = run_cli(&home, &["completions", "bash"]);
    let script = home.scratch("completion", "bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let syntax = std::process::Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));
    let man = run_cli(&home, &["man"]);
    assert_cli(&man, 0, "man");
    assert!(man.stdout.starts_with(".ie") && man.stdout.contains(".TH gatewarden 1"), "{}", &man.stdout[..200]);
    for v in verbs {
        assert!(man.stdout.contains(&format!(".SH \"GATEWARDEN {}\"", v.to_ascii_uppercase())), "no section for {v}");
    }
    assert!(!man.stdout.contains("CRASH-BACKOFF"), "hidden verbs stay out of the man page");
    assert_cli(&run_cli(&home, &["completions", "tcsh"]), 2, "an unknown shell is a usage error");
    assert!(!home.path().join("gateway.lock").exists(), "no home was touched");
}

/// Issue 27 §7 and issue 33 §3: no verb panics on a closed stdout (`history -n 200 | head -c1`
/// exited 134):
/// each verb, with stdout (and then stderr too) a pipe whose reader is gone, exits with the
/// code it has with a reader, and finishes its work: `stop` with no reader still stops.
#[test]
fn no_verb_panics_when_the_reader_of_its_output_is_gone() {
    let home = TempHome::new();
    let mut g = start(&home);
    let api = api::Api::new(g.listen());
    for i in 0..40 {
        api.send("c", "u", &format!("message {i}")).expect("send");
    }
    let verbs: &[&[&str]] = &[
        &["history", "-n", "200"],
        &["history", "-n", "200", "--json"],
        &["status"],
        &["status", "--json"],
        &["check"],
        &["check", "--json"],
        &["doctor"],
        &["service", "install", "--print"],
        &["service", "status"],
        &["logs", "-n", "50"],
        &["send", "hello"],
        &["trace", "no-such-message"],
        &["update", "--status"],
        &["start"],
        &["reload"],
        &["top", "--once"],
        &["top", "--json"],
        &["pairing", "list"],
        &["pairing", "list", "--json"],
        &["cancel-drain"],
        &["init", "--force", "--platform", "none", "--backend", "echo"],
    ];
    for args in verbs {
        let with_reader = run_cli(&home, args);
        assert!(!with_reader.panicked(), "{args:?} with a reader: {with_reader:#?}");
        for stderr_too in [false, true] {
            let out = cli_reader_gone(bin(), home.path(), args, stderr_too);
            assert!(!out.panicked(), "{args:?} (stderr closed too: {stderr_too}) panicked: {out:#?}");
            assert_eq!(
                out.code, with_reader.code,
                "{args:?} (stderr closed too: {stderr_too}) exits as it does with a reader: {out:#?}"
            );
        }
    }
    let out = cli_reader_gone(bin(), home.path(), &["stop"], true);
    assert_eq!(out.code, Some(0), "stop with no reader: {out:#?}");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "stopped by a `stop` whose output nobody read");
}
