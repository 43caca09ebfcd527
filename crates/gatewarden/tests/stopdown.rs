//! Issue 22, item 6: a stop stays down when another actor is mid-flight. The operator's
//! intent is a durable record (`desired_state.json`, crates/lifecycle/src/desired.rs) that every
//! starter obeys: a restart's successor and backstop, `doctor --fix`. (Updates and rollbacks:
//! tests/update.rs.) Real processes, unsupervised (the successor route), loopback only; every
//! detached process is tagged, and "stays down" is checked once every one of them has ended, so
//! nothing is left that could still start a gateway.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use work_common::*;

/// Chat `/restart` needs an admin who came with the API token (docs/security.md).
const TOKEN: &str = "t0k-0123456789abcdef";
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u\"]\n";
/// Every process of a scenario has ended by then (the backstop gives up on a stop at once).
const SETTLE: Duration = Duration::from_secs(20);

/// A CLI verb as a child process, tagged, started now (for "B 5 ms after A").
fn spawn_cli(home: &TempHome, sw: &Sweeper, args: &[&str]) -> Child {
    let mut cmd = Command::new(bin());
    test_env(&mut cmd);
    cmd.arg("--home").arg(home.path()).args(args).env(TAG_VAR, sw.tag());
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd.spawn().expect("spawn gatewarden")
}

/// `start` on a free port; the gateway's address.
fn start_cli(home: &TempHome, sw: &Sweeper) -> std::net::SocketAddr {
    let out = cli_tagged(home, sw, &["start", "--listen", "127.0.0.1:0", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&out, 0, "start");
    current_gateway(home.path()).and_then(|g| g.3).expect("the started gateway's address")
}

fn wait_child(c: &mut Child, timeout: Duration) -> Option<i32> {
    let mut code = None;
    let done = wait_until(timeout, || {
        code = c.try_wait().ok().flatten().map(|s| s.code().unwrap_or(-1));
        code.is_some()
    });
    assert!(done, "pid {} did not exit within {timeout:?}", c.id());
    code
}

/// Once every tagged process has ended, nothing holds the lock and the record says stopped.
#[track_caller]
fn assert_stays_down(home: &TempHome, sw: &Sweeper, what: &str) {
    let mut left = Vec::new();
    let settled = wait_until(SETTLE, || {
        left = sw.tagged();
        left.is_empty()
    });
    let cmdlines: Vec<_> = left.iter().map(|&p| (p, sweep::cmdline_of(p))).collect();
    assert!(settled, "{what}: still running after {SETTLE:?}: {cmdlines:?}\n{}", home.ledger_text());
    assert!(!home.lock_held(), "{what}: a gateway runs again after the stop\n{}", home.ledger_text());
    let d = home.read_json("desired_state.json").unwrap_or(Value::Null);
    assert_eq!(d["want"], json!("stopped"), "{what}: {d}");
}

/// `restart`, then `stop` 2–10 ms later: the gateway ends stopped, every time, and the ledger
/// has the stop. (Before: running again in 8 of 16 tries, and no `stop_requested`.)
#[test]
fn stop_right_after_restart_stays_down() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    for (i, delay_ms) in [2u64, 4, 7, 10].into_iter().enumerate() {
        start_cli(&home, &sw);
        let mut restart = spawn_cli(&home, &sw, &["restart", "--timeout", "20"]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let stop = cli_tagged(&home, &sw, &["stop", "--timeout", "20"], Duration::from_secs(30));
        assert_cli(&stop, 0, &format!("stop {delay_ms} ms after restart"));
        wait_child(&mut restart, Duration::from_secs(30));
        assert_stays_down(&home, &sw, &format!("stop {delay_ms} ms after restart"));
        // The stop is in the ledger exactly once, whoever received it.
        let mine =
            home.events("stop_requested").into_iter().filter(|e| e["requester"]["pid"] == json!(stop.pid)).count();
        assert_eq!(mine, 1, "stop {delay_ms} ms after restart (try {i}):\n{}", home.ledger_text());
    }
}

/// A `stop` during a restart's drain, with a 2.5 s run in flight: the run finishes (200, its
/// reply), and the gateway stays down; the successor that was waiting exits before it is ready.
#[test]
fn stop_during_a_restart_drain_keeps_it_down_and_the_run_finishes() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2500\n");
    let addr = start_cli(&home, &sw);
    let run = send_bg(addr, "B", "in flight");
    wait_active(addr, 1);
    let mut restart = spawn_cli(&home, &sw, &["restart", "--timeout", "30"]);
    wait_state(&home, "draining", Duration::from_secs(10));
    let stop = cli_tagged(&home, &sw, &["stop", "--timeout", "30"], Duration::from_secs(40));
    assert_cli(&stop, 0, "stop during the drain");
    let (r, took) = run.join().unwrap();
    let r = r.expect("the run's connection");
    assert_eq!(r.status, 200, "the run must finish, not be cut: {}", r.text());
    assert_eq!(r.json().unwrap()["reply"], json!("in flight"));
    assert!(took >= Duration::from_millis(2400), "the run was cut short ({took:?})");
    let code = wait_child(&mut restart, Duration::from_secs(30));
    assert_ne!(code, Some(0), "the restart did not happen, so it must not claim it did");
    assert_stays_down(&home, &sw, "stop during the drain");
    let prevented = home.events("start_prevented");
    assert!(prevented.iter().any(|e| e["by"] == json!("successor")), "{}", home.ledger_text());
}

/// Chat `/restart` (`gatewarden send /restart`), then `stop` while the restart is under way
/// (a run holds its drain): the restart's backstop does not start the gateway again. (Before:
/// it did, 2 s later, 4 of 4.)
#[test]
fn stop_after_a_chat_restart_beats_the_backstop() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), &format!("{ADMIN}drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2000\n"));
    let api = Api::new(start_cli(&home, &sw)).with_token(TOKEN);
    let run = send_bg_as(&api, "B", "in flight");
    wait_active_as(&api, 1);
    // Answered once the successor is prepared (issue 27 §1), so the drain is under way.
    let sent = cli_tagged(&home, &sw, &["send", "/restart"], Duration::from_secs(30));
    assert_cli(&sent, 0, "send /restart");
    let stop = cli_tagged(&home, &sw, &["stop", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&stop, 0, "stop after /restart");
    let _ = run.join();
    assert_stays_down(&home, &sw, "stop after chat /restart");
    let backstop = home.events("restart_backstop");
    let result = backstop.iter().find(|e| e.get("ok").is_some()).expect("the backstop's result");
    assert_eq!(result["ok"], json!(false), "{}", home.ledger_text());
    assert!(!home.events("start_prevented").is_empty(), "{}", home.ledger_text());
}

/// Chat `/restart`, then `send /stop` while the old incarnation drains a run: the stop reaches
/// a gateway that no longer classifies requests, and is recorded on receipt all the same; the
/// successor and the backstop stay down, and the run finishes.
#[test]
fn a_control_stop_during_a_chat_restarts_drain_stays_down() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), &format!("{ADMIN}drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2000\n"));
    let api = Api::new(start_cli(&home, &sw)).with_token(TOKEN);
    let run = send_bg_as(&api, "B", "in flight");
    wait_active_as(&api, 1);
    assert_cli(&cli_tagged(&home, &sw, &["send", "/restart"], Duration::from_secs(10)), 0, "send /restart");
    wait_state(&home, "draining", Duration::from_secs(10));
    assert_cli(&cli_tagged(&home, &sw, &["send", "/stop"], Duration::from_secs(10)), 0, "send /stop");
    let (r, _) = run.join().unwrap();
    assert_eq!(r.expect("the run's connection").status, 200, "the run finishes");
    assert_stays_down(&home, &sw, "send /stop during a chat restart's drain");
    let d = home.read_json("desired_state.json").unwrap();
    assert_eq!(d["requester"], json!("cli-send"), "{d}");
}

/// `doctor --fix` right after `restart` (from 12 ms on, again and again until the restart is
/// done): the handover is recognised, and the brand-new incarnation is not restarted again.
#[test]
fn doctor_fix_during_a_restart_does_not_restart_again() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    start_cli(&home, &sw);
    let mut restart = spawn_cli(&home, &sw, &["restart", "--timeout", "20"]);
    std::thread::sleep(Duration::from_millis(12));
    let t0 = Instant::now();
    let mut doctors = 0;
    let mut fixes = Vec::new();
    while restart.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(20) {
        let out = cli_tagged(&home, &sw, &["doctor", "--fix"], Duration::from_secs(30));
        doctors += 1;
        if out.stderr.contains("doctor: running") {
            fixes.push(out.stderr);
        }
    }
    assert_eq!(wait_child(&mut restart, Duration::from_secs(20)), Some(0), "the restart");
    assert!(fixes.is_empty(), "doctor restarted during the handover ({doctors} runs): {fixes:#?}");
    let requested = home.events("restart_requested");
    assert_eq!(requested.len(), 1, "one restart, not two:\n{}", home.ledger_text());
    assert_eq!(home.events("ready").len(), 2, "the first gateway and one successor:\n{}", home.ledger_text());
    // The new incarnation is healthy: doctor now finds nothing to fix.
    let after = cli_tagged(&home, &sw, &["doctor", "--fix"], Duration::from_secs(30));
    assert!(!after.stderr.contains("doctor: running"), "{after:#?}");
    let stop = cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30));
    assert_cli(&stop, 0, "stop");
}

/// The other side of the handover rule: a gateway that is really wedged (SIGSTOP) while no
/// restart is in flight is still restarted by `doctor --fix`.
#[test]
fn doctor_fix_still_restarts_a_wedged_gateway() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    start_cli(&home, &sw);
    let (old, ..) = current_gateway(home.path()).expect("the started gateway");
    send_signal(old, sig::SIGSTOP).unwrap();
    let out = cli_tagged(&home, &sw, &["doctor", "--fix"], Duration::from_secs(60));
    assert!(out.stderr.contains("doctor: running"), "{out:#?}");
    let (new, ..) = wait_new_ready(home.path(), &[old], READY).expect("a new incarnation");
    assert_ne!(new, old);
    assert!(wait_until(EXIT, || !pid_alive(old)), "the wedged gateway is gone");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
}

/// A CLI verb as a child process with its output captured.
fn spawn_cli_piped(home: &TempHome, sw: &Sweeper, args: &[&str]) -> Child {
    let mut cmd = Command::new(bin());
    test_env(&mut cmd);
    cmd.arg("--home").arg(home.path()).args(args).env(TAG_VAR, sw.tag());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("spawn gatewarden")
}

fn output(c: Child) -> (Option<i32>, String) {
    let o = c.wait_with_output().expect("wait");
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// Issue 22, item 7: of two `start`s 5 ms apart, one starts the gateway and the other says
/// "already running" with exit 0 (before: 78, "the gateway exited during start-up").
#[test]
fn two_starts_5_ms_apart_both_succeed_with_one_gateway() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    for i in 0..3 {
        let args = ["start", "--listen", "127.0.0.1:0", "--timeout", "20"];
        let a = spawn_cli_piped(&home, &sw, &args);
        std::thread::sleep(Duration::from_millis(5));
        let b = spawn_cli_piped(&home, &sw, &args);
        let ((ca, oa), (cb, ob)) = (output(a), output(b));
        assert_eq!((ca, cb), (Some(0), Some(0)), "try {i}:\n--- A\n{oa}\n--- B\n{ob}");
        let started = [&oa, &ob].iter().filter(|o| o.contains("started gateway pid")).count();
        let already = [&oa, &ob].iter().filter(|o| o.contains("already running")).count();
        assert_eq!((started, already), (1, 1), "try {i}:\n--- A\n{oa}\n--- B\n{ob}");
        assert_eq!(lock_holders(&home.lock_file()).len(), 1);
        assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
    }
}

/// Issue 22, item 7: a `restart` while a `start` is starting the gateway exits 0 and writes
/// its `restart_result` (before: "restarted (by a concurrent request)" and nothing in the
/// ledger).
#[test]
fn restart_during_a_start_records_its_result() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    for (i, delay_ms) in [0u64, 2, 5].into_iter().enumerate() {
        let start = spawn_cli_piped(&home, &sw, &["start", "--listen", "127.0.0.1:0", "--timeout", "20"]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let restart = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
        let (cs, os) = output(start);
        assert_eq!(cs, Some(0), "start: {os}");
        assert_cli(&restart, 0, "restart during a start");
        let results = home.events("restart_result");
        assert_eq!(results.len(), i + 1, "every restart has its result:\n{}", home.ledger_text());
        assert_eq!(results[i]["ok"], json!(true), "{}", results[i]);
        assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
    }
}

/// Issue 22, item 1: `flock gateway.lock sleep 30`, then `stop`: the flock process is not a
/// gateway, so it is never signalled; `stop` names it, and `start` does not call it "already
/// running", nor `status` "running" (exit 4 naming it). (Before: SIGTERM to flock.)
#[test]
fn a_lock_holder_that_is_not_a_gateway_is_named_never_signalled() {
    let home = TempHome::new();
    // Its own process group, so its `sleep` child goes with it at the end.
    let mut flock = Command::new("flock")
        .arg(home.lock_file())
        .args(["sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("flock(1) from util-linux");
    must_wait_until(Duration::from_secs(5), "flock holds gateway.lock", || home.lock_held());
    let stop = run_cli(&home, &["stop", "--timeout", "3"]);
    assert!(flock.try_wait().unwrap().is_none(), "stop signalled flock: {stop:#?}");
    let named = format!("pid {} (flock), which is not a gateway", flock.id());
    assert!(stop.text_lc().contains(&named), "{stop:#?}");
    assert_eq!(stop.code, Some(1), "nothing was stopped: {stop:#?}");
    let start = run_cli(&home, &["start", "--listen", "127.0.0.1:0", "--timeout", "10"]);
    assert!(flock.try_wait().unwrap().is_none(), "start signalled flock: {start:#?}");
    assert!(!start.text_lc().contains("already running"), "{start:#?}");
    assert!(start.text_lc().contains(&named), "{start:#?}");
    assert_eq!(start.code, Some(1), "{start:#?}");
    // Issue 30, item 4: nor does `status` (before: exit 0, `running` with pid null, `starting`).
    let st = run_cli(&home, &["status", "--json"]);
    assert_eq!(st.code, Some(4), "{st:#?}");
    assert_eq!(st.json()["running"], json!(false), "{st:#?}");
    assert!(st.json()["note"].as_str().is_some_and(|n| n.contains(&named)), "{st:#?}");
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", flock.id())]).status();
    let _ = flock.wait();
}

/// `supervise` launched by a service manager (the LaunchAgent runs it; declared here the way
/// the environment says so) obeys a recorded stop: it starts no gateway and exits 0, so the
/// manager does not loop. Launched by the operator it is a start, as before.
#[test]
fn supervise_launched_by_a_manager_obeys_a_recorded_stop() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "listen = \"127.0.0.1:0\"\n[agent]\nbackend = \"echo\"\n");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop (records it)");
    let supervise = |supervisor: &str| {
        let mut cmd = Command::new(bin());
        test_env(&mut cmd);
        cmd.arg("--home").arg(home.path()).arg("supervise").env(TAG_VAR, sw.tag());
        cmd.env("GATEWARDEN_SUPERVISOR", supervisor);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd.spawn().expect("spawn supervise")
    };
    let mut managed = supervise("launchd");
    assert_eq!(wait_child(&mut managed, Duration::from_secs(10)), Some(0), "supervise under a manager");
    assert!(!home.lock_held() && home.events("started").is_empty(), "{}", home.ledger_text());
    let prevented = home.events("start_prevented");
    assert!(prevented.iter().any(|e| e["by"] == json!("supervise")), "{}", home.ledger_text());

    let mut by_hand = supervise("none");
    must_wait_until(READY, "the operator's supervise to start a gateway", || {
        current_gateway(home.path()).is_some_and(|g| g.2 == "running")
    });
    send_signal(by_hand.id(), sig::SIGTERM).unwrap();
    assert_eq!(wait_child(&mut by_hand, EXIT), Some(0));
}

/// Issue 22, item 2: a home holding `gateway.pid`/`gateway_state.json` copied from another home
/// whose gateway is alive. This home's lock is free (or its lock file was never made), so that
/// process is not this home's gateway: `status` and `stop` heal the records and say so, and
/// nobody is signalled.
#[test]
fn a_copied_record_naming_a_live_gateway_is_healed_never_signalled() {
    let sw = Sweeper::new();
    let source = TempHome::new();
    start_cli(&source, &sw);
    let (pid, ..) = current_gateway(source.path()).expect("the source gateway");
    for with_lock in [false, true] {
        let copy = TempHome::new();
        for f in ["gateway.pid", "gateway_state.json"] {
            std::fs::copy(source.path().join(f), copy.path().join(f)).unwrap();
        }
        if with_lock {
            std::fs::copy(source.path().join("gateway.lock"), copy.path().join("gateway.lock")).unwrap();
        }
        let verb = if with_lock { "stop" } else { "status" };
        let out = run_cli(&copy, &[verb]);
        let expect = if with_lock { 0 } else { 3 };
        assert_eq!(out.code, Some(expect), "{verb} with the lock file {with_lock}: {out:#?}");
        assert!(out.text_lc().contains("gateway.pid"), "{verb} does not say what it healed: {out:#?}");
        for f in ["gateway.pid", "gateway_state.json"] {
            assert!(!copy.path().join(f).exists(), "{verb} left the copied {f}: {out:#?}");
        }
        assert!(copy.ledger_text().contains("stale_cleaned"), "{}", copy.ledger_text());
        assert_eq!(current_gateway(source.path()).map(|g| g.0), Some(pid), "the source gateway was touched");
    }
    assert_cli(&run_cli(&source, &["stop"]), 0, "stop the source");
}
