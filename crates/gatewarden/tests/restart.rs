//! Issue 3, restarts: bug classes F (the drain never waits on its requester, no cascade),
//! G (a restart is verified, or fails loudly with the recovery command) and H (the
//! orchestrator survives the old gateway's process group). Real processes, loopback only.
//! Unsupervised restarts (`GATEWARDEN_SUPERVISOR=none`, the testkit default) take the successor
//! route; every detached process is tagged and swept by a [`Sweeper`].
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use work_common::*;

/// Chat `/restart` needs an admin who came with the API token (issue 8, docs/security.md).
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u-s\", \"u\"]\n";

/// F1: drain_timeout_s = 180 and the restart comes from a chat message. The requester is
/// answered "restarting…" at once, the old incarnation exits 75 and a new one is ready within
/// seconds: the drain did not wait on the request that caused it.
#[test]
fn f1_restart_requester_is_not_waited_on() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, &format!("{ADMIN}drain_timeout_s = 180\n[agent]\nbackend = \"echo\"\n"));
    let addr = g.listen();
    let old_inc = incarnation_of(&home, g.pid()).unwrap();

    let t0 = Instant::now();
    let r = Api::new(addr).with_token("t0k-0123456789abcdef").send("S", "u-s", "/restart").unwrap();
    let answered = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["reply"], json!("restarting…"), "{v}");
    assert_eq!(v["command"], json!(true), "{v}");
    assert!(answered < Duration::from_secs(1), "/restart answered after {answered:?}");

    let st = g.wait_exit(Duration::from_secs(10));
    assert_exit_code(&g, st, 75, "planned restart (unsupervised, successor started)");
    let (new_pid, new_inc, new_addr) =
        wait_new_ready(home.path(), &[g.pid()], Duration::from_secs(10)).expect("a new incarnation ready");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "restart took {took:?} (drain_timeout_s = 180)");
    assert_ne!(new_inc, old_inc);
    assert_eq!(new_addr, addr, "the successor serves the same address");
    // The new incarnation is in its own session: it does not die with the old one's.
    assert_eq!(sweep::sid_of(new_pid), Some(new_pid), "successor should lead its own session");

    let req = home.events("restart_requested");
    assert_eq!(req.len(), 1, "{}", home.ledger_text());
    assert_eq!(req[0]["requester"]["channel"], json!("chat"), "{}", req[0]);
    let started = home.events("successor_started");
    assert_eq!(started.len(), 1, "{}", home.ledger_text());
    assert_eq!(started[0]["successor_pid"], json!(new_pid), "{}", started[0]);
    let drained = home.events("drained");
    assert_eq!(drained.len(), 1, "{}", home.ledger_text());
    assert_eq!(drained[0]["runs_at_start"], json!(0), "the requester is not a run: {}", drained[0]);
    assert_eq!(drained[0]["interrupted"], json!(0), "{}", drained[0]);
    assert!(drained[0]["duration_ms"].as_u64().unwrap() < 1000, "{}", drained[0]);
    assert!(
        home.events("exited").iter().any(|e| e["code"] == json!(75) && e["pid"] == json!(g.pid())),
        "{}",
        home.ledger_text()
    );
    // The new incarnation works.
    assert_eq!(
        Api::new(addr).with_token("t0k-0123456789abcdef").send("S", "u-s", "after").unwrap().json().unwrap()["reply"],
        json!("after")
    );
}

/// F3 (async): an async `/restart` is journaled as a finished command (done, command: true,
/// never run), the next incarnation never re-runs it, no second restart happens in a bounded
/// observation window, and S gets exactly one "back online" notice naming the new incarnation.
/// A further (CLI) restart neither replays the row nor repeats the notice.
#[test]
fn f3_async_restart_is_never_replayed_and_notice_comes_once() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, &format!("{ADMIN}drain_timeout_s = 180\n[agent]\nbackend = \"echo\"\n"));
    let addr = g.listen();
    let api = Api::new(addr).with_token("t0k-0123456789abcdef");

    let r = api.send_async("S", "u-s", "/restart").unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json().unwrap()["message_id"].as_str().unwrap().to_string();
    let st = g.wait_exit(Duration::from_secs(10));
    assert_exit_code(&g, st, 75, "async /restart");
    let (pid2, inc2, _) = wait_new_ready(home.path(), &[g.pid()], Duration::from_secs(10)).expect("new incarnation");

    let m = api.message(&id).expect("the /restart row is resolvable");
    assert_eq!((m["state"].as_str(), m["command"].as_bool()), (Some("done"), Some(true)), "{m}");
    assert_eq!(m["attempts"], json!(0), "a command is never run as an agent run: {m}");
    assert_eq!(m["reply"], json!("restarting…"), "{m}");

    // No cascade: no second restart while we watch (anchored: the new incarnation is ready).
    let quiet = holds_for(Duration::from_secs(5), || {
        home.events("restart_requested").len() == 1 && current_gateway(home.path()).is_some_and(|g| g.0 == pid2)
    });
    assert!(quiet.is_ok(), "a second restart / new incarnation appeared:\n{}", home.ledger_text());

    let n = api.notices("S").unwrap();
    assert_eq!(n.len(), 1, "exactly one back-online notice: {n:?}");
    assert!(
        n[0].contains("back online") && n[0].contains(&inc2),
        "notice should name the new incarnation {inc2}: {n:?}"
    );
    assert!(api.notices("S").unwrap().is_empty(), "the notice is delivered once");
    assert!(api.notices("B").unwrap().is_empty(), "only the requester's chat is told");

    // A third incarnation (CLI restart): the row is untouched, no notice again.
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&out, 0, "restart");
    let (pid3, _, _) =
        wait_new_ready(home.path(), &[g.pid(), pid2], Duration::from_secs(10)).expect("third incarnation");
    assert_ne!(pid3, pid2);
    let m2 = api.message(&id).unwrap();
    assert_eq!(
        (m2["state"].clone(), m2["attempts"].clone(), m2["updated_at"].clone()),
        (m["state"].clone(), m["attempts"].clone(), m["updated_at"].clone()),
        "the row changed: {m} → {m2}"
    );
    assert!(api.notices("S").unwrap().is_empty(), "no second back-online notice after a CLI restart");
    assert_eq!(home.events("restart_requested").len(), 2, "{}", home.ledger_text());
}

/// `gatewarden restart`: exit 0 only with a new incarnation running; prints old → new; the
/// ledger's restart_result names both. With nothing running it starts one.
#[test]
fn restart_cli_verifies_the_new_incarnation() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, "listen = \"127.0.0.1:0\"\n[agent]\nbackend = \"echo\"\n");
    let old_inc = incarnation_of(&home, g.pid()).unwrap();
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&out, 0, "restart");
    // Verified before it returned: no waiting here.
    let (pid, inc, state, _) = current_gateway(home.path()).expect("a gateway holds the lock when restart returns");
    assert_eq!(state, "running");
    assert_ne!(pid, g.pid());
    assert!(out.stdout.contains(&old_inc) && out.stdout.contains(&inc), "{out:?}");
    let res = home.events("restart_result");
    assert_eq!(res.len(), 1, "{}", home.ledger_text());
    assert_eq!(
        (res[0]["ok"].clone(), res[0]["old"].clone(), res[0]["new"].clone()),
        (json!(true), json!(old_inc), json!(inc)),
        "{}",
        res[0]
    );
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "restarted gateway");

    // Nothing running → restart starts one.
    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop");
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    assert_cli(&out, 0, "restart with nothing running");
    assert!(current_gateway(home.path()).is_some_and(|g| g.2 == "running"), "{out:?}");
}

/// G1: a supervisor that never relaunches (`--supervisor external`, no manager). The gateway
/// exits 75 as told; nothing revives it, so `restart` starts the next incarnation itself after
/// the restart delay (issue 7: no route ends with nothing running) and records `kicked`.
/// A config that does not load is refused before anything stops (exit 78). When the config
/// breaks after that check, during the drain, it exits 1 naming why the next gateway could not
/// start and prints the recovery command; the ledger has `restart_result` ok=false. Running the
/// printed command after fixing the cause recovers (and G6: nothing stale is reported
/// afterwards).
#[test]
fn g1_supervisor_never_restarts_is_reported_with_the_recovery_command() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "listen = \"127.0.0.1:0\"\n");
    let mut g = builder(&home).supervisor("external").env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(40));
    assert_cli(&out, 0, "restart with a supervisor that never relaunches");
    let st = g.wait_exit(EXIT);

    assert_exit_code(&g, st, 75, "supervised planned restart");
    let res = home.events("restart_result");
    assert_eq!(res.len(), 1, "{}", home.ledger_text());
    assert_eq!((res[0]["ok"].clone(), res[0]["kicked"].clone()), (json!(true), json!(true)), "{}", res[0]);
    assert!(home.events("successor_started").is_empty(), "a supervised gateway must not start its own successor");
    let (pid, _, state, _) = current_gateway(home.path()).expect("the kicked gateway");
    assert_eq!(state, "running");

    // A config that does not load is found before anything stops (issue 27 §1): refused, 78.
    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop");
    assert!(wait_until(EXIT, || !pid_alive(pid)));
    let slow = "listen = \"127.0.0.1:0\"\ndrain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 2000\n";
    write_config(home.path(), slow);
    let mut g = builder(&home).supervisor("external").env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    write_config(home.path(), &format!("{slow}bogus_key = 1\n"));
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "8"], Duration::from_secs(30));
    assert_cli(&out, 78, "restart with a config that does not load");
    assert!(g.alive(), "a refused restart stops nothing: {}", g.diag());

    // Now the config breaks after that check, during the drain: nothing can come back, and
    // `restart` says why (never only "no gateway holds the lock") and how to recover.
    write_config(home.path(), slow);
    let run = send_bg(g.listen(), "B", "held through the drain");
    wait_active(g.listen(), 1);
    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(40));
    wait_state(&home, "draining", READY);
    write_config(home.path(), &format!("{slow}bogus_key = 1\n"));
    let out = restart.join().unwrap();
    let _ = run.join();
    assert_cli(&out, 1, "restart when nothing can start");
    let st = g.wait_exit(EXIT);

    assert_exit_code(&g, st, 75, "supervised planned restart");
    let recovery = format!("gatewarden --home {} start", home.path().display());
    assert!(out.stderr.contains(&recovery), "stderr should print `{recovery}`:\n{}", out.stderr);
    assert!(
        out.stderr.contains("could not start") && out.stderr.contains("unknown key 'bogus_key'"),
        "should say why nothing runs:\n{}",
        out.stderr
    );
    assert!(!out.stdout.to_lowercase().contains("restarted"), "must not claim success: {out:?}");
    let res = home.events("restart_result");
    assert_eq!(res.len(), 3, "{}", home.ledger_text());
    assert_eq!(res[2]["ok"], json!(false), "{}", res[2]);
    assert!(res[2]["seen"].as_str().is_some_and(|s| s.contains("bogus_key")), "{}", res[2]);
    assert!(current_gateway(home.path()).is_none(), "nothing runs");

    // The recovery command, verbatim (minus the binary name), once the cause is fixed.
    write_config(home.path(), "listen = \"127.0.0.1:0\"\n");
    let args: Vec<&str> = recovery.split(' ').skip(3).collect();
    let rec = cli_tagged(&home, &sw, &args, Duration::from_secs(30));
    assert_cli(&rec, 0, "recovery command");
    let st = run_cli(&home, &["status"]);
    assert_cli(&st, 0, "status after recovery");
    assert!(!st.text_lc().contains("not verified") && !st.text_lc().contains("warning"), "stale warning: {st:?}");
}

/// G3-like: the new incarnation becomes ready late (the old one drains a 3 s run first).
/// `restart` keeps polling until it sees the new incarnation `running` and exits 0; the run is
/// delivered.
#[test]
fn g3_restart_waits_for_a_late_new_incarnation() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, "drain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 3000\n");
    let addr = g.listen();
    let b = send_bg(addr, "B", "slow");
    wait_active(addr, 1);
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
    assert_cli(&out, 0, "restart through a slow drain");
    assert!(
        out.elapsed >= Duration::from_millis(2000),
        "restart returned after {:?}, before the drain could end",
        out.elapsed
    );
    let (rb, _) = b.join().unwrap();
    assert_eq!(rb.unwrap().json().unwrap()["reply"], json!("slow"));
    let res = home.events("restart_result");
    assert_eq!(res.len(), 1);
    assert_eq!(res[0]["ok"], json!(true), "{}", res[0]);
    assert!(current_gateway(home.path()).is_some_and(|c| c.0 != g.pid() && c.2 == "running"));
}

/// H1 (exec route): `gatewarden restart` runs INSIDE an exec-backend run, i.e. in the run's
/// process group, which the drain SIGTERMs/SIGKILLs after drain_timeout_s (the run waits on
/// the restart, the restart on the drain: hermes' self-kill). The orchestrator must survive
/// the group kill, see the new incarnation and record restart_result ok=true.
#[test]
fn h1_orchestrator_inside_the_run_group_survives_the_drain_kill() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let out = home.scratch("restart-out", ".txt");
    let script = format!(
        "'{}' --home '{}' restart --timeout 30 > '{}' 2>&1; echo \"exit $?\" >> '{}'",
        bin(),
        home.path().display(),
        out.display(),
        out.display()
    );
    let cfg = format!(
        "drain_timeout_s = 2\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {}]\nkill_grace_ms = 300\n",
        json!(script)
    );
    let mut g = gateway(&home, &sw, &cfg);
    let addr = g.listen();
    let old_inc = incarnation_of(&home, g.pid()).unwrap();
    let run = send_bg(addr, "ops", "please restart");
    let st = g.wait_exit(Duration::from_secs(20));
    assert_exit_code(&g, st, 75, "restart requested from inside a run");
    let (new_pid, new_inc, _) =
        wait_new_ready(home.path(), &[g.pid()], Duration::from_secs(15)).expect("a new incarnation within 15 s");
    let res = wait_events(&home, "restart_result", 1, Duration::from_secs(15));
    assert_eq!(res.len(), 1, "{}", home.ledger_text());
    assert_eq!(
        (res[0]["ok"].clone(), res[0]["old"].clone(), res[0]["new"].clone()),
        (json!(true), json!(old_inc), json!(new_inc)),
        "{}",
        res[0]
    );
    // The run was interrupted (the drain killed its group) and is not replayed (sync).
    let (r, _) = run.join().unwrap();
    let r = r.expect("the run's client gets an answer");
    assert_eq!(r.status, 503, "the interrupted run: {}", r.text());
    let drained = home.events("drained");
    assert_eq!(drained[0]["interrupted"], json!(1), "{}", drained[0]);
    // Exactly one restart: the interrupted sync run is never re-run.
    assert!(
        holds_for(Duration::from_secs(3), || home.events("restart_requested").len() == 1
            && current_gateway(home.path()).is_some_and(|c| c.0 == new_pid))
        .is_ok(),
        "{}",
        home.ledger_text()
    );
    // The orchestrator ran in its own session (it wrote restart_result after the group died).
    assert_ne!(res[0]["pid"], json!(g.pid()));
}

/// H1 (process-group route): the gateway leads its own process group; `gatewarden restart` is
/// started INSIDE that group; once the gateway started its successor the whole group is
/// SIGKILLed (a service manager's KillMode=control-group). The orchestrator survives, a new
/// gateway runs, and restart_result ok=true is recorded.
#[test]
fn h1_orchestrator_survives_sigkill_of_the_old_gateways_group() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 5000\n");
    // The gateway, leading a new process group in our session.
    let mut gcmd = Command::new(bin());
    test_env(&mut gcmd);
    sw.tag_command(&mut gcmd);
    let errf = std::fs::File::create(home.scratch("gw", ".stderr")).unwrap();
    gcmd.args(["--home", home.path().to_str().unwrap(), "run", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(errf);
    std::os::unix::process::CommandExt::process_group(&mut gcmd, 0);
    let mut gw = KillOnDrop(gcmd.spawn().unwrap());
    let gpid = gw.0.id();
    let (_, _, addr) = wait_new_ready(home.path(), &[], READY).expect("gateway ready");
    assert_eq!(current_gateway(home.path()).unwrap().0, gpid);
    // A slow run keeps the old gateway draining, so the group kill lands mid-restart.
    let slow = send_bg(addr, "B", "slow");
    wait_active(addr, 1);

    let outp = home.scratch("restart", ".out");
    let mut rcmd = Command::new(bin());
    test_env(&mut rcmd);
    sw.tag_command(&mut rcmd);
    rcmd.args(["--home", home.path().to_str().unwrap(), "restart", "--timeout", "30"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&outp).unwrap())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut rcmd, gpid as i32);
    let mut relay = KillOnDrop(rcmd.spawn().unwrap());
    assert_eq!(sweep::pgid_of(relay.0.id()), Some(gpid), "restart CLI must start inside the gateway's group");

    wait_events(&home, "successor_started", 1, Duration::from_secs(10));
    // The ledger event precedes the published phase by a moment: wait for the phase.
    wait_state(&home, "draining", Duration::from_secs(5));
    let k = Command::new("kill").args(["-KILL", "--", &format!("-{gpid}")]).status().unwrap();
    assert!(k.success());
    let st = gw.0.wait().unwrap();
    assert_eq!(exit_signal(st), Some(9), "old gateway killed with its group");
    let rs = relay.0.wait().unwrap();
    assert_eq!(
        exit_signal(rs),
        Some(9),
        "the restart CLI in the group was killed with it (else the scenario did not happen)"
    );

    let (new_pid, new_inc, _) =
        wait_new_ready(home.path(), &[gpid], Duration::from_secs(15)).expect("new gateway within 15 s");
    let res = wait_events(&home, "restart_result", 1, Duration::from_secs(15));
    assert_eq!((res[0]["ok"].clone(), res[0]["new"].clone()), (json!(true), json!(new_inc)), "{}", res[0]);
    assert_ne!(sweep::pgid_of(new_pid), Some(gpid));
    let _ = slow.join();
}

/// H3 (invariant 3): two `gatewarden restart` at the same moment coalesce into ONE new
/// incarnation; both report success.
#[test]
fn concurrent_restarts_coalesce_into_one_new_incarnation() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    // A 3 s run keeps the first restart's drain open, so the second request surely arrives
    // while it is in progress (under load the two CLIs may start a second apart).
    let mut g = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\ndelay_ms = 3000\n");
    let run = send_bg(g.listen(), "bystander", "slow");
    wait_active(g.listen(), 1);
    let a = cli_bg(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    let b = cli_bg(&home, &sw, &["restart", "--timeout", "20"], Duration::from_secs(30));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(run.join().unwrap().0.unwrap().status, 200, "the bystander's run is drained");
    assert_cli(&a, 0, "restart A");
    assert_cli(&b, 0, "restart B");
    g.wait_exit(EXIT);
    let (pid2, _, _) = wait_new_ready(home.path(), &[g.pid()], READY).unwrap();
    let quiet = holds_for(Duration::from_secs(2), || current_gateway(home.path()).is_some_and(|c| c.0 == pid2));
    assert!(quiet.is_ok(), "{}", home.ledger_text());
    assert_eq!(home.events("successor_started").len(), 1, "{}", home.ledger_text());
    assert_eq!(home.events("started").len(), 2, "one old + one new incarnation:\n{}", home.ledger_text());
}

/// Kills (SIGKILL) and reaps a child on drop.
struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
