//! Stop paths, exit codes (class D1 / protocol.md §6.1), crash recovery, stop/replace escalation (class I's
//! drain-then-verify-then-kill on Unix). Real processes, loopback only.
#![cfg(target_os = "linux")]

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Planned stop via `gatewarden stop`: CLI 0, gateway 0, lock free when `stop` returns,
/// `status` 3, ledger has `stop_requested` (requester = the stop CLI's pid, channel cli) and
/// `exited` code 0; the gateway's log names the stopper.
#[test]
fn planned_stop_via_cli_exits_0_releases_lock_and_is_ledgered() {
    let home = TempHome::new();
    let mut g = start(&home);
    assert!(home.lock_held(), "lock not held by a ready gateway");
    assert_eq!(lock_holders(&home.lock_file()), vec![g.pid()]);

    let out = run_cli(&home, &["stop"]);
    assert_cli(&out, 0, "stop");
    assert!(!home.lock_held(), "lock still held when `stop` returned 0: {:?}", lock_holders(&home.lock_file()));
    let st = g.wait_exit(Duration::from_secs(2));
    assert_exit_code(&g, st, 0, "planned stop via CLI");

    let out2 = run_cli(&home, &["status"]);
    assert_cli(&out2, 3, "status after stop");

    let reqs = home.events("stop_requested");
    assert_eq!(reqs.len(), 1, "expected one stop_requested:\n{}", home.ledger_text());
    assert_eq!(reqs[0]["requester"]["pid"], json!(out.pid), "requester pid should be the stop CLI: {}", reqs[0]);
    assert_eq!(reqs[0]["requester"]["channel"], json!("cli"), "{}", reqs[0]);
    let exited = home.events("exited");
    assert!(
        exited.iter().any(|e| e["code"] == json!(0) && e["pid"] == json!(g.pid())),
        "no `exited` code 0 for pid {}:\n{}",
        g.pid(),
        home.ledger_text()
    );
    assert_events_carry_identity(&home);
    if let Some(s) = home.state_record() {
        assert_ne!(s["gateway_state"], json!("running"), "state file still claims running: {s}");
    }
    assert!(
        g.stderr().contains(&out.pid.to_string()),
        "gateway log should name the stopper pid {}:\n{}",
        out.pid,
        g.stderr_tail(30)
    );
}

/// SIGINT is a planned stop → 0.
#[test]
fn d1_sigint_is_planned_stop_exit_0() {
    let home = TempHome::new();
    let mut g = start(&home);
    g.signal(sig::SIGINT);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "SIGINT");
    assert!(!home.lock_held());
}

/// A bare SIGTERM (no marker) is unexpected → 1 (supervisor revives it), ledgered as such.
#[test]
fn d1_bare_sigterm_is_unexpected_exit_1() {
    let home = TempHome::new();
    let mut g = start(&home);
    g.signal(sig::SIGTERM);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 1, "bare SIGTERM");
    assert!(!home.lock_held());
    assert!(
        home.events("exited").iter().any(|e| e["code"] == json!(1)),
        "ledger lacks exited code 1:\n{}",
        home.ledger_text()
    );
}

/// D1: hermes-style planned-stop marker naming the gateway's own (pid, start_time), WITHOUT the
/// `home` field, followed by SIGTERM → 0.
#[test]
fn d1_hermes_marker_without_home_then_sigterm_exits_0() {
    let home = TempHome::new();
    let mut g = start(&home);
    home.write(".gateway-planned-stop.json", marker_json(g.pid(), Some(g.start_time()), None, &rfc3339_now()));
    g.signal(sig::SIGTERM);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "hermes marker (no home) + SIGTERM");
    assert!(!home.exists(".gateway-planned-stop.json"), "consumed marker left behind");
}

/// B2 / I1: a valid marker for self with no signal at all → the gateway exits 0 promptly
/// (event-driven watch: within 2 s), the marker is consumed, and the ledger names the writer.
#[test]
fn b2_marker_only_stop_exits_0_promptly() {
    let home = TempHome::new();
    let mut g = start(&home);
    let t0 = Instant::now();
    home.write(
        ".gateway-planned-stop.json",
        marker_json(g.pid(), Some(g.start_time()), Some(home.path()), &rfc3339_now()),
    );
    let st = g.wait_exit(Duration::from_secs(2));
    let took = t0.elapsed();
    eprintln!("marker-only stop took {took:?}");
    assert_exit_code(&g, st, 0, "marker-only planned stop");
    assert!(!home.exists(".gateway-planned-stop.json"), "marker not consumed");
    let reqs = home.events("stop_requested");
    assert!(
        reqs.iter().any(|e| e["requester"]["pid"] == json!(std::process::id())
            && e["requester"]["channel"] == json!("marker")),
        "stop_requested should name the marker writer (pid {}, channel marker):\n{}",
        std::process::id(),
        home.ledger_text()
    );
}

/// kill -9, then `status` (3, stale records cleaned) and `run` (starts) recover without any
/// manual cleanup.
#[test]
fn kill9_then_status_cleans_and_run_recovers() {
    let home = TempHome::new();
    let mut g = start(&home);
    let old_pid = g.pid();
    g.signal(sig::SIGKILL);
    g.wait_exit(EXIT);
    assert!(!home.lock_held());

    let out = run_cli(&home, &["status"]);
    assert_cli(&out, 3, "status after kill -9");
    let rec = home.pid_record();
    assert!(
        rec.as_ref().is_none_or(|r| r["pid"] != json!(old_pid)),
        "status left the dead gateway's gateway.pid: {rec:?}"
    );
    // gateway_state.json may keep the last state (protocol §1 says readers MAY drop the live
    // claim); what must hold is that status reports the truth:
    let js = run_cli(&home, &["status", "--json"]);
    assert_cli(&js, 3, "status --json after kill -9");
    assert_eq!(js.json()["running"], json!(false));
    assert!(
        home.events("stale_cleaned").iter().any(|e| e["by"] == json!("status")),
        "no stale_cleaned by status in ledger:\n{}",
        home.ledger_text()
    );

    let mut g2 = builder(&home).spawn();
    g2.wait_ready(Duration::from_secs(2));
    assert_pid_record_names(&home, &g2);
    stop_cleanly(&home, &mut g2);
}

/// kill -9 then straight `run` (stale pid file, state file, control socket all present) and
/// `stop` on the stale leftovers.
#[test]
fn kill9_then_run_directly_recovers_and_stop_says_nothing_running() {
    let home = TempHome::new();
    let mut g = start(&home);
    g.signal(sig::SIGKILL);
    g.wait_exit(EXIT);

    let out = run_cli(&home, &["stop", "--timeout", "2"]);
    assert_cli(&out, 0, "stop after kill -9");

    let mut g = start(&home);
    g.signal(sig::SIGKILL);
    g.wait_exit(EXIT);
    let mut g2 = builder(&home).spawn();
    g2.wait_ready(Duration::from_secs(2));
    assert_eq!(home.state().as_deref(), Some("running"));
    stop_cleanly(&home, &mut g2);
}

/// `stop --timeout 1` against a gateway that ignores graceful stop (SIGSTOPped): after the
/// bounded wait, `stop` re-verifies identity and SIGKILLs it; exits 0; lock free.
#[test]
fn stop_timeout_escalates_to_sigkill_for_unresponsive_gateway() {
    let home = TempHome::new();
    let mut g = start(&home);
    g.signal(sig::SIGSTOP);
    must_wait_until(Duration::from_secs(2), "gateway stopped (T)", || {
        std::fs::read_to_string(format!("/proc/{}/stat", g.pid()))
            .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('T'))
            .unwrap_or(false)
    });
    let out = cli_with(bin(), home.path(), &["stop", "--timeout", "1"], &[], Duration::from_secs(20));
    assert_cli(&out, 0, "stop --timeout 1 on a SIGSTOPped gateway");
    assert!(out.elapsed < Duration::from_secs(10), "stop --timeout 1 took {:?}", out.elapsed);
    let st = g.wait_exit(Duration::from_secs(2));
    assert_eq!(exit_signal(st), Some(sig::SIGKILL), "expected SIGKILL, got {st}\n{}", g.diag());
    assert!(!home.lock_held(), "lock held after stop returned 0");
    assert_cli(&run_cli(&home, &["status"]), 3, "status after forced stop");
    eprintln!("forced stop took {:?}", out.elapsed);
}

/// Same, with `--no-kill`: `stop` exits 1 and the gateway is still alive (and still holds the
/// lock).
#[test]
fn stop_no_kill_on_unresponsive_gateway_exits_1_and_leaves_it_alive() {
    let home = TempHome::new();
    let mut g = start(&home);
    g.signal(sig::SIGSTOP);
    let out = cli_with(bin(), home.path(), &["stop", "--timeout", "1", "--no-kill"], &[], Duration::from_secs(20));
    assert_cli(&out, 1, "stop --timeout 1 --no-kill on a SIGSTOPped gateway");
    assert!(out.elapsed < Duration::from_secs(10), "stop --timeout 1 --no-kill took {:?}", out.elapsed);
    assert!(g.alive(), "gateway died although --no-kill\n{}", g.diag());
    assert_eq!(lock_holders(&home.lock_file()), vec![g.pid()]);
    // Running, but it cannot answer: `unresponsive`, exit 4 (issue 7).
    let st = run_cli(&home, &["status"]);
    assert_cli(&st, 4, "status while the stopped gateway holds the lock");
    assert!(st.stdout.contains("unresponsive"), "{st:?}");
    // cleanup: kill-on-drop (SIGKILL works on a stopped process)
    g.kill();
}

/// `run --replace` when the old gateway is SIGSTOPped: the takeover escalates to a kill after
/// its bounded wait and the new gateway becomes ready.
#[test]
fn replace_escalates_to_kill_when_old_gateway_is_stopped() {
    let home = TempHome::new();
    let mut old = start(&home);
    old.signal(sig::SIGSTOP);
    let mut new = builder(&home).replace().spawn();
    let t0 = Instant::now();
    new.wait_ready(Duration::from_secs(60));
    let took = t0.elapsed();
    let st = old.wait_exit(Duration::from_secs(2));
    assert_eq!(exit_signal(st), Some(sig::SIGKILL), "old gateway should have been SIGKILLed, got {st}");
    assert_pid_record_names(&home, &new);
    assert_eq!(lock_holders(&home.lock_file()), vec![new.pid()]);
    eprintln!("replace of a stopped gateway took {took:?}");
    stop_cleanly(&home, &mut new);
}

/// Plain `run --replace`: old exits 0 (takeover), new ready, ledger `takeover` event.
#[test]
fn replace_running_gateway_old_exits_0_new_ready() {
    let home = TempHome::new();
    let mut old = start(&home);
    let mut new = builder(&home).replace().spawn();
    new.wait_ready(Duration::from_secs(15));
    let st = old.wait_exit(EXIT);
    assert_exit_code(&old, st, 0, "replaced gateway");
    assert_pid_record_names(&home, &new);
    assert!(
        home.events("takeover").iter().any(|e| e["target"]["pid"] == json!(old.pid())),
        "no takeover event:\n{}",
        home.ledger_text()
    );
    assert!(!home.exists(".gateway-takeover.json"), "takeover marker left behind");
    stop_cleanly(&home, &mut new);
}

/// D1: planned restart (SIGUSR1) under a supervisor → 75.
#[test]
fn d1_sigusr1_under_supervisor_is_planned_restart_exit_75() {
    let (home, sw) = (TempHome::new(), sweep::Sweeper::new());
    let mut g = builder(&home).supervisor("systemd").env(sweep::TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    g.signal(sig::SIGUSR1);
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "SIGUSR1 under supervisor=systemd");
    // No systemd starts the next incarnation here, so the restart's backstop (detached, its
    // own session) would: once this home is deleted, in a home it recreates, on the default
    // address. The operator's stop makes it stand down (crates/ops/src/ladder/mod.rs).
    let spawned = home.events("restart_backstop");
    let backstop = spawned.first().and_then(|e| e["backstop_pid"].as_u64()).expect("a backstop") as u32;
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert!(wait_until(Duration::from_secs(30), || !pid_alive(backstop)), "the backstop did not stand down");
    assert!(wait_until(EXIT, || sw.tagged().is_empty()), "left running: {:?}", sw.tagged());
}

/// A restart's backstop that outlives its home (deleted, or its volume gone) starts nothing:
/// it used to make an empty home and a gateway on the defaults there (127.0.0.1:7878).
#[test]
fn a_backstop_whose_home_is_gone_starts_nothing_and_makes_no_home() {
    let (home, sw) = (TempHome::new(), sweep::Sweeper::new());
    let gone = home.root().join("deleted-home");
    let out = cli_env(
        bin(),
        &gone,
        &["restart", "--backstop", "inc-gone", "--desired-seq", "0", "--timeout", "20"],
        &[(sweep::TAG_VAR, sw.tag())],
    );
    assert_cli(&out, 1, "a backstop in a deleted home");
    assert!(!gone.exists(), "the backstop made the home it was planned in: {out:#?}");
    assert!(sw.tagged().is_empty(), "started: {:?}", sw.tagged());
}

/// D1 (#103191): SIGTERM before `running` is never a clean 0.
#[test]
fn d1_sigterm_before_running_is_not_exit_0() {
    let home = TempHome::new();
    let mut g = builder(&home).spawn();
    g.signal(sig::SIGTERM);
    let st = g.wait_exit(EXIT);
    assert!(
        exit_code(st) == Some(1) || exit_signal(st) == Some(sig::SIGTERM),
        "SIGTERM during startup must be 1 (or death by SIGTERM), got {st}\n{}",
        g.diag()
    );
}

/// protocol.md §6.1: listen address taken → 78 (fatal configuration), lock released.
#[test]
fn d1_listen_address_taken_exits_78() {
    let home = TempHome::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut g = builder(&home).listen(addr.to_string()).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "listen address in use");
    assert!(!home.lock_held());
    assert!(g.stderr().contains(&addr.port().to_string()), "message should name the address:\n{}", g.stderr_tail(20));
}

/// Class I invariant 1 (drain before force): the control endpoint is wedged (the test replaces
/// `control.sock` with a listener that never answers) but the gateway itself is healthy.
/// `stop` must fall back to marker + SIGTERM and give the gateway its drain, so the gateway
/// exits 0 (planned) instead of being SIGKILLed right after the SIGTERM. Checked with a budget
/// that leaves room after the control connect attempt (--timeout 5) and with --timeout 1.
#[test]
fn i1_stop_with_wedged_control_socket_falls_back_gracefully_not_sigkill() {
    for timeout in ["5", "1"] {
        let home = TempHome::new();
        let mut g = start(&home);
        let sock = home.state_record().unwrap()["control"].as_str().unwrap().to_string();
        std::fs::remove_file(&sock).unwrap();
        let _wedged = std::os::unix::net::UnixListener::bind(&sock).unwrap(); // never accepts
        let out = cli_with(bin(), home.path(), &["stop", "--timeout", timeout], &[], Duration::from_secs(30));
        assert!(!out.panicked(), "{out:#?}");
        let st = g.wait_exit(EXIT);
        assert_eq!(
            exit_code(st),
            Some(0),
            "stop --timeout {timeout} with a wedged control socket: gateway should exit 0 via \
             marker+SIGTERM, got {st} (stop exit {:?}, took {:?}):\n{}\n{}",
            out.code,
            out.elapsed,
            out.stderr,
            g.diag()
        );
        assert_cli(&out, 0, &format!("stop --timeout {timeout}, wedged control socket"));
        assert!(!home.lock_held());
    }
}

/// `status` probes the lock by taking it for an instant; a gateway starting at that moment must
/// wait that out, never exit 78 ("lock held by another instance"). Hammer `status` from a
/// thread while starting gateways.
#[test]
fn c5_status_probes_during_startup_never_make_run_fail() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let home = TempHome::new();
    let stop_flag = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(AtomicU32::new(0));
    let hammer = {
        let (stop_flag, probes, home) = (stop_flag.clone(), probes.clone(), home.path().to_path_buf());
        std::thread::spawn(move || {
            while !stop_flag.load(Ordering::Relaxed) {
                let mut c = std::process::Command::new(bin());
                test_env(&mut c);
                let _ = c
                    .arg("--home")
                    .arg(&home)
                    .arg("status")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
                probes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut failures = Vec::new();
    for round in 0..20 {
        let mut g = builder(&home).spawn();
        match g.try_wait_ready(READY) {
            Ok(_) => {}
            Err(e) => failures.push(format!("round {round}: {e:?}\n{}", g.diag())),
        }
        if g.alive() {
            g.signal(sig::SIGINT);
            g.wait_exit(EXIT);
        }
    }
    stop_flag.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    assert!(probes.load(Ordering::Relaxed) > 20, "the status hammer barely ran");
    assert!(failures.is_empty(), "run failed while status probed the lock:\n{}", failures.join("\n"));
}
