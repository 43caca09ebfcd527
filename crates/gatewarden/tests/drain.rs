//! Issue 3, the drain: the cap on a run that never ends (F6-like) and the exec backend's process
//! group after a cancelled drain, 503 + Retry-After with one notice per chat per drain, async
//! messages accepted while draining run by the next incarnation, and runs interrupted by a
//! drain timeout or SIGKILL re-run exactly once (F4). Real processes, loopback only.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};
use work_common::*;

/// Pids (one per line) a test's exec script wrote, once it wrote at least `n`.
fn read_pids(path: &Path, n: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    must_wait_until(Duration::from_secs(10), &format!("{n} pids in {}", path.display()), || {
        pids =
            std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.len() >= n
    });
    pids
}

/// An exec command that never ends, ignores SIGTERM (so only the SIGKILL escalation ends it)
/// and leaves two background descendants in its group (a grandchild and a great-grandchild).
/// It writes its own pid and theirs to `pids`.
fn never_ending_exec(pids: &Path) -> String {
    let p = pids.display();
    let script = format!(
        "trap '' TERM; echo $$ > '{p}.tmp'; sleep 1000 & echo $! >> '{p}.tmp'; \
         sh -c 'sleep 1000 & echo $! >> \"$0\"; wait' '{p}.tmp' & echo $! >> '{p}.tmp'; \
         sleep 0.2; mv '{p}.tmp' '{p}'; wait"
    );
    format!("[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {}]\nkill_grace_ms = 500\n", json!(script))
}

/// F6-like drain cap + "an exec backend whose children are all gone after a cancelled drain":
/// a run that never ends, drain_timeout_s = 1. `gatewarden stop` returns within the drain
/// budget + kill grace + slack, the client gets 503 "interrupted", the ledger's `drained`
/// counts 1 interrupted run, and NO process of the run's group (leader, grandchild,
/// great-grandchild) remains.
#[test]
fn f6_drain_cap_cancels_a_never_ending_exec_run_and_kills_its_whole_group() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let pids_file = home.scratch("pids", ".txt");
    let cfg = format!("drain_timeout_s = 1\n{}", never_ending_exec(&pids_file));
    let mut g = gateway(&home, &sw, &cfg);
    let addr = g.listen();
    let run = send_bg(addr, "c", "never ends");
    let pids = read_pids(&pids_file, 4);
    let leader = pids[0];
    assert_eq!(sweep::pgid_of(leader), Some(leader), "the exec command leads its own group");
    for &p in &pids {
        assert_eq!(sweep::pgid_of(p), Some(leader), "pid {p} should be in the run's group {leader}");
    }
    assert_ne!(sweep::pgid_of(g.pid()), Some(leader));

    let t0 = Instant::now();
    let out = run_cli(&home, &["stop"]);
    let took = t0.elapsed();
    assert_cli(&out, 0, "stop");
    assert!(took >= Duration::from_millis(900), "stop returned after {took:?}: the drain budget was not honoured");
    assert!(took < Duration::from_millis(1000 + 500 + 3000), "stop took {took:?} (drain 1 s + grace 0.5 s)");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "planned stop");

    assert!(
        group_gone(leader, Duration::from_secs(5)),
        "run group {leader} still has members: {:?}",
        sweep::group_members(leader)
    );
    for &p in &pids {
        assert!(!pid_alive(p), "pid {p} of the cancelled run survived ({:?})", sweep::cmdline_of(p));
    }
    let (r, _) = run.join().unwrap();
    let r = r.expect("client got an answer");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json().unwrap()["error"]["type"], json!("interrupted"), "{}", r.text());
    let d = home.events("drained");
    assert_eq!(d.len(), 1, "{}", home.ledger_text());
    assert_eq!((d[0]["runs_at_start"].clone(), d[0]["interrupted"].clone()), (json!(1), json!(1)), "{}", d[0]);
    assert!(d[0]["duration_ms"].as_u64().unwrap() >= 1000, "{}", d[0]);
}

/// The same cap on the restart route: the new incarnation is ready within drain + grace +
/// slack, the run's group is gone, and the old gateway exited 75.
#[test]
fn f6_drain_cap_bounds_a_restart_too() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let pids_file = home.scratch("pids", ".txt");
    let cfg = format!("drain_timeout_s = 1\n{}", never_ending_exec(&pids_file));
    let mut g = gateway(&home, &sw, &cfg);
    let run = send_bg(g.listen(), "c", "never ends");
    let pids = read_pids(&pids_file, 4);
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&out, 0, "restart");
    assert!(out.elapsed < Duration::from_millis(1000 + 500 + 3000), "restart took {:?}", out.elapsed);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "restart");
    assert!(group_gone(pids[0], Duration::from_secs(5)), "{:?}", sweep::group_members(pids[0]));
    assert!(pids.iter().all(|&p| !pid_alive(p)));
    let _ = run.join();
}

/// After an exec run ends normally, a background grandchild it left is swept with its group.
#[test]
fn exec_leftover_grandchild_is_swept_when_the_run_ends() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let cfg =
        "[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"sleep 1000 >/dev/null 2>&1 & echo $!\"]\n";
    let g = gateway(&home, &sw, cfg);
    let r = Api::new(g.listen()).send("c", "u", "x").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let pid: u32 = r.json().unwrap()["reply"].as_str().unwrap().trim().parse().unwrap();
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(pid)), "grandchild {pid} outlived its run");
}

/// F4: async runs in flight when the gateway is SIGKILLed (no drain at all) are re-run exactly
/// once by the next incarnation: done, reply == text, attempts == 2.
#[test]
fn f4_async_runs_cut_by_sigkill_are_rerun_exactly_once() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\ndelay_ms = 2000\n");
    let api = Api::new(g.listen());
    let ids: Vec<String> = (0..3).map(|i| api.submit(&format!("k{i}"), &format!("killed {i}"))).collect();
    must_wait_until(Duration::from_secs(5), "all 3 running", || {
        ids.iter().all(|id| api.message(id).is_some_and(|m| m["state"] == "running"))
    });
    g.kill();
    must_wait_until(EXIT, "lock free", || !home.lock_held());

    let g2 = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\ndelay_ms = 200\n");
    let api2 = Api::new(g2.listen());
    for (i, id) in ids.iter().enumerate() {
        let m = wait_final(&api2, id, Duration::from_secs(15));
        assert_eq!(
            (m["state"].as_str(), m["reply"].as_str(), m["attempts"].as_i64()),
            (Some("done"), Some(format!("killed {i}").as_str()), Some(2)),
            "{m}"
        );
    }
    assert!(g2.stderr().contains("resuming 3"), "the log should say it resumed 3:\n{}", g2.stderr_tail(20));
}

/// F4 (scenario text): SIGKILL arrives ~1 s into the drain wait. Every async run active at
/// drain start, and every message accepted during the drain, is run by the next incarnation:
/// the interrupted ones exactly once more (attempts 2), the queued one once (attempts 1).
#[test]
fn f4_sigkill_during_the_drain_loses_nothing() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, "drain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 5000\n");
    let api = Api::new(g.listen());
    let ids: Vec<String> = (0..2).map(|i| api.submit("s", &format!("active {i}"))).collect();
    must_wait_until(Duration::from_secs(5), "both running", || {
        ids.iter().all(|id| api.message(id).is_some_and(|m| m["state"] == "running"))
    });
    let stop = cli_bg(&home, &sw, &["stop", "--timeout", "60", "--no-kill"], Duration::from_secs(70));
    wait_state(&home, "draining", Duration::from_secs(5));
    let late = api.submit("s", "accepted while draining");
    // ~1 s into the wait (the scenario's timing; the state above anchors it).
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(home.state().as_deref(), Some("draining"));
    g.kill();
    let out = stop.join().unwrap();
    assert!(!out.panicked(), "{out:?}");
    must_wait_until(EXIT, "lock free", || !home.lock_held());

    let g2 = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\ndelay_ms = 100\n");
    let api2 = Api::new(g2.listen());
    for (i, id) in ids.iter().enumerate() {
        let m = wait_final(&api2, id, Duration::from_secs(15));
        assert_eq!(
            (m["state"].as_str(), m["reply"].as_str(), m["attempts"].as_i64()),
            (Some("done"), Some(format!("active {i}").as_str()), Some(2)),
            "{m}"
        );
    }
    let m = wait_final(&api2, &late, Duration::from_secs(15));
    assert_eq!((m["state"].as_str(), m["attempts"].as_i64()), (Some("done"), Some(1)), "{m}");
}

/// A run interrupted by the drain timeout is re-run once by the next incarnation; interrupted
/// again, it ends `failed` with a reason ("interrupted twice") instead of running forever.
#[test]
fn drain_timeout_interrupts_rerun_once_then_fail_with_a_reason() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let cfg = "drain_timeout_s = 1\n[agent]\nbackend = \"echo\"\ndelay_ms = 30000\n";
    let g = gateway(&home, &sw, cfg);
    let api = Api::new(g.listen());
    let id = api.submit("x", "too slow");
    for round in 1..=2 {
        let addr = current_gateway(home.path()).unwrap().3.unwrap();
        let api = Api::new(addr);
        // `start` returns once the new incarnation is ready, and it recovers the journal after
        // that: until then the row still reads `running` from the stopped incarnation's attempt.
        // So the wait is for this round's attempt; a third attempt never matches.
        let mut last = Value::Null;
        let ok = wait_until(READY, || {
            last = api.message(&id).unwrap_or(Value::Null);
            last["state"] == "running" && last["attempts"] == json!(round)
        });
        assert!(ok, "attempt {round} not running: {last}\n{}", home.ledger_text());
        let out = run_cli(&home, &["stop"]);
        assert_cli(&out, 0, &format!("stop #{round}"));
        assert!(out.elapsed < Duration::from_secs(8), "stop #{round} took {:?}", out.elapsed);
        let s = cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], Duration::from_secs(30));
        assert_cli(&s, 0, "start");
    }
    let addr = current_gateway(home.path()).unwrap().3.unwrap();
    let m = wait_final(&Api::new(addr), &id, Duration::from_secs(10));
    assert_eq!(m["state"], json!("failed"), "{m}");
    assert_eq!(m["attempts"], json!(2), "{m}");
    assert!(m["reason"].as_str().is_some_and(|r| r.contains("interrupted")), "{m}");
    let _ = run_cli(&home, &["stop"]);
}

/// Exec runs of a SIGKILLed gateway: on Windows the job object (KILL_ON_JOB_CLOSE) takes the
/// tree down with the gateway; on Linux nothing reaches the orphaned group, so the next
/// incarnation kills every process tagged with a previous incarnation of this home before it
/// re-runs the message — never two copies of one run at once.
#[test]
fn exec_runs_of_a_sigkilled_gateway_are_killed_before_the_next_incarnation_reruns() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let pids_file = home.scratch("pids", ".txt");
    let cfg = never_ending_exec(&pids_file);
    let mut g = gateway(&home, &sw, &cfg);
    let accepted = Api::new(g.listen()).send_async("c", "u", "never ends").unwrap();
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let pids = read_pids(&pids_file, 4);
    g.kill();
    let _ = g.wait_exit(Duration::from_secs(5));
    // Nothing reaches a process group when its gateway is SIGKILLed; the next incarnation must
    // clean up before it re-runs the message, or the run would execute twice at once.
    assert!(!sweep::group_members(pids[0]).is_empty(), "precondition: the orphaned run is still alive");
    std::fs::remove_file(&pids_file).unwrap();
    let g2 = gateway(&home, &sw, &cfg);
    let gone = group_gone(pids[0], Duration::from_secs(5));
    let survivors: Vec<(u32, Vec<String>)> =
        sweep::group_members(pids[0]).into_iter().map(|p| (p, sweep::cmdline_of(p))).collect();
    let swept = wait_events(&home, "orphan_runs_killed", 1, Duration::from_secs(5));
    drop(g2);
    sw.sweep();
    assert!(gone, "the orphaned run outlived the next incarnation's start: {survivors:?}");
    assert!(
        swept[0]["pids"].as_array().is_some_and(|p| p.iter().any(|v| v == &json!(pids[0]))),
        "the ledger should name the killed run leader {}: {swept:?}",
        pids[0]
    );
}

/// Issue 30, item 5: `stop --timeout 2` during a run that outlasts it (drain budget 30 s): the
/// stopper SIGKILLs the gateway, and the run's processes (the `sh -c` and what it started,
/// every one carrying the incarnation's run tag) end with it, ended by the stopper as it ends
/// the gateway, not left for the next start. (Before: they ran on until the next `start`.)
#[test]
fn a_gateway_killed_by_the_stopper_leaves_no_agent_process() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let pids_file = home.scratch("pids", ".txt");
    let g = gateway(&home, &sw, &format!("drain_timeout_s = 30\n{}", never_ending_exec(&pids_file)));
    let inc = incarnation_of(&home, g.pid()).expect("its incarnation");
    let accepted = Api::new(g.listen()).send_async("c", "u", "outlasts the stop").unwrap();
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let pids = read_pids(&pids_file, 4);
    let stop = cli_tagged(&home, &sw, &["stop", "--timeout", "2"], Duration::from_secs(30));
    assert_cli(&stop, 0, "stop");
    assert!(stop.stdout.contains("killed"), "the stop had to kill: {stop:#?}");
    let left: Vec<(u32, Vec<String>)> =
        pids.iter().filter(|&&p| pid_alive(p)).map(|&p| (p, sweep::cmdline_of(p))).collect();
    let ended = home.events("orphan_runs_killed");
    sw.sweep();
    assert!(left.is_empty(), "the run's processes outlived the stop: {left:?}\n{}", home.ledger_text());
    assert!(ended.iter().any(|e| e["incarnation"] == json!(inc) && e["by"] == json!("stop")), "{}", home.ledger_text());
}
