//! Issue 21, "cancel drain": a restart's drain cancelled while it waits on a run. The gateway
//! runs on as the same incarnation (serving new connections, running the run it waited on and
//! new messages), and everything the restart had set going stands down: the successor waiting
//! for the lock, the backstop, and a `gatewarden restart` waiting for the new incarnation. A
//! stop's drain, or no drain at all, is not cancelled. The other restart routes (a manager's
//! exit, PID 1's re-exec) are in tests/supervise.rs and tests/host_env.rs. Real processes,
//! loopback only.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::time::Duration;
use work_common::*;

const RESTART_TIMEOUT: Duration = Duration::from_secs(90);

/// A gateway whose runs wait for the returned gate file ([`gated_exec`]).
fn gated_gateway(home: &TempHome, sw: &Sweeper) -> (Gateway, std::path::PathBuf) {
    let gate = home.scratch("gate", "");
    (gateway(home, sw, &gated_exec(&gate)), gate)
}

/// The spawn route, asked for by a requester that does not verify (`send /restart`, as a chat
/// would): a successor and a backstop are started; the cancel stands both down.
#[test]
fn a_cancelled_restart_drain_runs_on_and_its_successor_and_backstop_stand_down() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let (g, gate) = gated_gateway(&home, &sw);
    let api = Api::new(g.listen());
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let waited_on = api.submit("c1", "before the restart");
    wait_active(g.listen(), 1);

    assert_cli(&cli_tagged(&home, &sw, &["send", "/restart"], READY), 0, "send /restart");
    let successor = wait_events(&home, "successor_started", 1, READY)[0]["successor_pid"].as_u64().unwrap() as u32;
    let backstop = wait_events(&home, "restart_backstop", 1, READY)[0]["backstop_pid"].as_u64().unwrap() as u32;
    // A second request during the drain joins this restart, and is cancelled with it.
    wait_state(&home, "draining", READY);
    assert_cli(&cli_tagged(&home, &sw, &["send", "/restart"], READY), 0, "send /restart again");
    cancel_keeps(&home, &inc, |a| run_cli(&home, a));
    let joined = wait_events(&home, "restart_requested", 2, READY);
    assert_eq!(joined[1]["joined"], json!("restart"), "{}", home.ledger_text());
    let once = holds_for(Duration::from_secs(1), || home.events("successor_started").len() == 1);
    assert_eq!(once, Ok(()), "the joined request restarted after the cancel:\n{}", home.ledger_text());

    // Both helpers of the restart are gone, and say why.
    assert!(wait_until(READY, || !pid_alive(successor)), "successor {successor} still waits for the lock");
    assert!(wait_until(READY, || !pid_alive(backstop)), "backstop {backstop} still runs");
    let prevented = home.events("start_prevented");
    assert!(prevented.iter().any(|e| e["by"] == "successor" && e["why"] == "cancelled"), "{}", home.ledger_text());
    let b = wait_events(&home, "restart_backstop", 2, READY);
    assert_eq!(b[1]["ok"], json!(false), "{}", b[1]);
    assert!(b[1]["seen"].as_str().unwrap_or_default().contains("cancelled"), "{}", b[1]);
    assert_eq!(home.events("started").len(), 1, "nothing else started:\n{}", home.ledger_text());

    // The same incarnation serves new connections and runs the run it waited on, then new ones.
    std::fs::write(&gate, b"").unwrap();
    let m = wait_final(&api, &waited_on, READY);
    assert_eq!(
        (m["state"].as_str(), m["reply"].as_str().map(str::trim)),
        (Some("done"), Some("before the restart")),
        "{m}"
    );
    let after = api.submit("c2", "after the cancel");
    let m = wait_final(&api, &after, READY);
    assert_eq!(m["state"], json!("done"), "{m}");
    assert_eq!(run_cli(&home, &["status", "--json"]).json()["incarnation"].as_str(), Some(inc.as_str()));

    // A later restart is not bound by the cancel.
    assert_cli(&cli_tagged(&home, &sw, &["restart", "--timeout", "60"], RESTART_TIMEOUT), 0, "restart after");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_ne!(st["incarnation"].as_str(), Some(inc.as_str()), "{st:#}");
}

/// A `gatewarden restart` waiting for the new incarnation is told the restart was cancelled
/// (exit 1, naming who cancelled and which incarnation runs on). A stop's drain, and a gateway
/// that is not draining, refuse the cancel with the reason; the stop goes on.
#[test]
fn a_waiting_restart_reports_the_cancel_and_only_a_restart_drain_is_cancelled() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let (mut g, gate) = gated_gateway(&home, &sw);
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");

    let out = run_cli(&home, &["cancel-drain"]);
    assert_cli(&out, 1, "cancel-drain while running");
    assert!(out.stderr.contains("nothing to cancel"), "{}", out.stderr);

    let run = send_bg(g.listen(), "c", "waited on");
    wait_active(g.listen(), 1);
    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "60"], RESTART_TIMEOUT);
    cancel_keeps(&home, &inc, |a| run_cli(&home, a));
    let out = restart.join().unwrap();
    assert_cli(&out, 1, "restart whose drain was cancelled");
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(said.contains("the restart was cancelled by `cli cancel-drain`"), "{said}");
    assert!(said.contains(&format!("incarnation {inc}")), "{said}");
    let r = home.events("restart_result");
    assert_eq!(r.last().map(|e| e["ok"].clone()), Some(json!(false)), "{}", home.ledger_text());

    // A stop's drain: the cancel is refused and the stop completes once the run ends.
    let stop = cli_bg(&home, &sw, &["stop", "--timeout", "60"], RESTART_TIMEOUT);
    wait_state(&home, "draining", READY);
    let out = run_cli(&home, &["cancel-drain"]);
    assert_cli(&out, 1, "cancel-drain of a stop");
    assert!(out.stderr.contains("only a restart's drain can be cancelled"), "{}", out.stderr);
    std::fs::write(&gate, b"").unwrap();
    assert_cli(&stop.join().unwrap(), 0, "stop");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "planned stop");
    let (resp, _) = run.join().unwrap();
    assert_eq!(resp.expect("an answer").status, 200);
}

/// A stop issued during a restart's drain wins over a cancel that comes after it: the cancel is
/// refused naming the stop, the drain ends, and nothing runs afterwards (the successor obeys
/// the stop). A stop stays down.
#[test]
fn a_stop_during_a_restart_drain_is_not_undone_by_a_cancel() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let (mut g, gate) = gated_gateway(&home, &sw);
    let run = send_bg(g.listen(), "c", "waited on");
    wait_active(g.listen(), 1);
    assert_cli(&cli_tagged(&home, &sw, &["send", "/restart"], READY), 0, "send /restart");
    wait_state(&home, "draining", READY);
    let stop = cli_bg(&home, &sw, &["stop", "--timeout", "60"], RESTART_TIMEOUT);
    must_wait_until(READY, "the stop recorded", || {
        std::fs::read_to_string(home.file("desired_state.json")).unwrap_or_default().contains("\"stopped\"")
    });
    let out = run_cli(&home, &["cancel-drain"]);
    assert_cli(&out, 1, "cancel-drain after a stop");
    assert!(out.stderr.contains("a stop was recorded since"), "{}", out.stderr);
    std::fs::write(&gate, b"").unwrap();
    assert_cli(&stop.join().unwrap(), 0, "stop");
    g.wait_exit(EXIT);
    let _ = run.join();
    must_wait_until(READY, "nothing holds the home", || !home.lock_held());
    assert_eq!(home.events("started").len(), 1, "nothing started after the stop:\n{}", home.ledger_text());
    assert!(home.events("drain_cancelled").is_empty(), "{}", home.ledger_text());
}
