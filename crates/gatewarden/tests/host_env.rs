//! Issue 7: restarts never strand the gateway, in the environments users really run it in.
//! These tests do NOT use the testkit's deterministic environment (`GATEWARDEN_SUPERVISOR=none`
//! and scrubbed manager variables): the binary runs with the host's real environment, as PID 1
//! of a PID namespace, and from a shell that inherited another unit's variables.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use work_common::*;

const RESTART_TIMEOUT: Duration = Duration::from_secs(60);
/// Chat `/restart` needs an admin who came with the API token (docs/security.md).
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u1\"]\n";

/// `gatewarden <args>` in the host's environment, tagged for the sweeper.
fn host_cli(home: &TempHome, sw: &Sweeper, args: &[&str]) -> CliOutput {
    cli_host(bin(), home.path(), args, &[(TAG_VAR, sw.tag())], RESTART_TIMEOUT)
}

fn status_json(home: &TempHome, sw: &Sweeper) -> Value {
    host_cli(home, sw, &["status", "--json"]).json()
}

/// `status --json` once it has the gateway's own answer (exit 0). `status` asks the control
/// endpoint for 200 ms only; on a loaded machine it may miss it and fall back to the records,
/// which for PID 1 of a namespace name another pid than the host sees holding the lock
/// ("starting", exit 4).
#[track_caller]
fn live_status(home: &TempHome, sw: &Sweeper) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(READY, || {
        let out = host_cli(home, sw, &["status", "--json"]);
        last = serde_json::from_str(out.stdout.trim()).unwrap_or(Value::Null);
        out.code == Some(0)
    });
    assert!(ok, "status never had the gateway's answer: {last:#}\n{}", home.ledger_text());
    last
}

/// Waits for a running incarnation other than `old`; returns its status.
#[track_caller]
fn wait_other_incarnation(home: &TempHome, sw: &Sweeper, old: &str) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(Duration::from_secs(30), || {
        let out = host_cli(home, sw, &["status", "--json"]);
        last = serde_json::from_str(out.stdout.trim()).unwrap_or(Value::Null);
        last["state"] == "running" && last["incarnation"].as_str().is_some_and(|i| i != old)
    });
    assert!(ok, "no new incarnation after {old}: {last:#}\n{}", home.ledger_text());
    last
}

/// The host-default path: `start`, ten `restart`s in a row, chat `/restart`, SIGUSR1. Every one
/// ends with exactly one new incarnation running (the bug: a container's default detection
/// exited 75 for a manager that did not exist, and one restart in three left nothing running).
#[test]
fn host_default_restarts_never_strand_the_gateway() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), ADMIN);
    let out = host_cli(&home, &sw, &["start", "--listen", "127.0.0.1:0"]);
    assert_cli(&out, 0, "start");
    let mut st = status_json(&home, &sw);
    assert_eq!(st["state"], json!("running"), "{st:#}");
    assert!(st["supervisor_evidence"].is_string(), "status shows the evidence: {st:#}");
    let listen = st["listen"].clone();
    for i in 0..10 {
        let old = st["incarnation"].as_str().unwrap().to_owned();
        let out = host_cli(&home, &sw, &["restart", "--timeout", "60"]);
        assert_cli(&out, 0, &format!("restart #{i}"));
        st = status_json(&home, &sw);
        assert_eq!(st["state"], json!("running"), "after restart #{i}: {st:#}");
        assert_ne!(st["incarnation"].as_str(), Some(old.as_str()), "restart #{i} changed nothing");
        assert_eq!(st["listen"], listen, "the address survives restart #{i}");
        assert_eq!(lock_holders(&home.lock_file()).len(), 1, "one lock holder after restart #{i}");
    }
    // Chat /restart.
    let old = st["incarnation"].as_str().unwrap().to_owned();
    let addr: std::net::SocketAddr = listen.as_str().unwrap().parse().unwrap();
    let r = Api::new(addr).with_token("t0k-0123456789abcdef").send("c1", "u1", "/restart").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    st = wait_other_incarnation(&home, &sw, &old);
    // SIGUSR1 (a supervisor-less gateway used to ignore it).
    let old = st["incarnation"].as_str().unwrap().to_owned();
    send_signal(st["pid"].as_u64().unwrap() as u32, sig::SIGUSR1).unwrap();
    st = wait_other_incarnation(&home, &sw, &old);
    assert_eq!(st["listen"], listen);
    let out = host_cli(&home, &sw, &["stop"]);
    assert_cli(&out, 0, "stop");
    assert!(lock_holders(&home.lock_file()).is_empty());
}

/// A gateway launched from a shell that inherited another unit's `INVOCATION_ID` and
/// `NOTIFY_SOCKET` is not supervised by that unit: it says so, never notifies the foreign
/// socket, and its planned restart starts a successor instead of exiting into nothing.
#[test]
fn inherited_unit_environment_is_not_evidence() {
    use std::os::unix::net::UnixDatagram;
    let home = TempHome::new();
    let sw = Sweeper::new();
    let sock_path = home.scratch("foreign-notify", "sock");
    let foreign = UnixDatagram::bind(&sock_path).unwrap();
    foreign.set_nonblocking(true).unwrap();
    let mut g = builder(&home)
        .host_default()
        .env("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
        .env("NOTIFY_SOCKET", sock_path.as_os_str())
        .env_remove("GATEWARDEN_SUPERVISOR")
        .env(TAG_VAR, sw.tag())
        .spawn();
    g.wait_ready(READY);
    let st = status_json(&home, &sw);
    assert_eq!(st["supervisor"], json!("none"), "{st:#}");
    let ev = st["supervisor_evidence"].as_str().unwrap_or_default();
    assert!(ev.contains("inherited"), "the evidence names what was ignored: {ev}");
    // doctor shows the same verdict and evidence.
    let doc = host_cli(&home, &sw, &["doctor", "--json"]).json();
    let sup = doc["findings"].as_array().unwrap().iter().find(|f| f["id"] == "supervisor").cloned();
    let msg = sup.as_ref().and_then(|f| f["message"].as_str()).unwrap_or_default().to_owned();
    assert!(msg.contains("none") && msg.contains("inherited"), "doctor: {doc:#}");
    let old = st["incarnation"].as_str().unwrap().to_owned();
    g.signal(sig::SIGUSR1);
    let st = wait_other_incarnation(&home, &sw, &old);
    assert_ne!(st["pid"].as_u64(), Some(u64::from(g.pid())));
    let st = g.try_wait_exit(EXIT).expect("the old incarnation exits");

    assert_exit_code(&g, st, 75, "planned restart");
    let mut buf = [0u8; 4096];
    assert!(foreign.recv(&mut buf).is_err(), "the foreign unit's NOTIFY_SOCKET was notified");

    // `start` from the same shell launches an unsupervised gateway too.
    assert_cli(&host_cli(&home, &sw, &["stop"]), 0, "stop");
    let out = cli_host(
        bin(),
        home.path(),
        &["start", "--listen", "127.0.0.1:0"],
        &[(TAG_VAR, sw.tag()), ("INVOCATION_ID", "feedface"), ("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
        RESTART_TIMEOUT,
    );
    assert_cli(&out, 0, "start");
    assert_eq!(status_json(&home, &sw)["supervisor"], json!("none"));
    assert_cli(&host_cli(&home, &sw, &["restart"]), 0, "restart");
    assert_cli(&host_cli(&home, &sw, &["stop"]), 0, "stop");
}

/// `gatewarden run` as PID 1 of a new PID namespace (`unshare`), once it answers `running`: the
/// `unshare` child and its status; `None` (reported) without `unshare`.
fn pid1_gateway(home: &TempHome, sw: &Sweeper) -> Option<(std::process::Child, Value)> {
    if Command::new("unshare").arg("--version").output().is_err() {
        return gatewarden_testkit::unavailable("unshare", "not installed (util-linux)");
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(bin());
    cmd.arg("--home").arg(home.path()).args(["run", "--listen", "127.0.0.1:0"]);
    cmd.env_remove("GATEWARDEN_HOME").env_remove("GATEWARDEN_SUPERVISOR").env(TAG_VAR, sw.tag());
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(home.scratch("pid1", "log")).unwrap());
    let child = cmd.spawn().expect("unshare");
    let mut st = Value::Null;
    let up = wait_until(READY, || {
        st = serde_json::from_str(host_cli(home, sw, &["status", "--json"]).stdout.trim()).unwrap_or(Value::Null);
        st["state"] == "running"
    });
    assert!(up, "PID 1 gateway not ready: {st:#}");
    Some((child, st))
}

/// PID 1 of a PID namespace (a container's init): nothing revives it, so a planned restart
/// re-executes in place — same pid, new incarnation, same listener — and a stop exits 0.
#[test]
fn pid1_restarts_re_execute_in_place() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let Some((mut child, mut st)) = pid1_gateway(&home, &sw) else { return };
    assert_eq!(st["pid"], json!(1), "{st:#}");
    assert_eq!(st["supervisor"], json!("container"), "{st:#}");
    let listen = st["listen"].clone();
    // One read of /proc/locks can miss a line (see below): the holder is waited for here too.
    let mut host_pid = Vec::new();
    let one = wait_until(Duration::from_secs(5), || {
        host_pid = lock_holders(&home.lock_file());
        host_pid.len() == 1
    });
    assert!(one, "one process holds the lock: {host_pid:?}");
    for i in 0..3 {
        let old = st["incarnation"].as_str().unwrap().to_owned();
        let out = host_cli(&home, &sw, &["restart", "--timeout", "60"]);
        assert_cli(&out, 0, &format!("PID 1 restart #{i}"));
        st = live_status(&home, &sw);
        assert_eq!(st["pid"], json!(1), "still PID 1 after restart #{i}: {st:#}");
        assert_ne!(st["incarnation"].as_str(), Some(old.as_str()));
        assert_eq!(st["listen"], listen);
        // /proc/locks is read in pages while other tests' locks come and go, so one read can
        // miss a line: the same process must be seen holding it within the deadline.
        let mut holders = Vec::new();
        let same = wait_until(Duration::from_secs(5), || {
            holders = lock_holders(&home.lock_file());
            holders == host_pid
        });
        assert!(same, "the same process holds the lock: {holders:?}, not {host_pid:?}");
        assert!(child.try_wait().unwrap().is_none(), "the namespace's init exited");
    }
    let addr: std::net::SocketAddr = listen.as_str().unwrap().parse().unwrap();
    assert_eq!(http_get(addr, "/readyz", Duration::from_secs(2)).unwrap().status, 200);
    assert_cli(&host_cli(&home, &sw, &["stop"]), 0, "stop");
    let mut status = None;
    wait_until(EXIT, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.and_then(|s| s.code()), Some(0), "PID 1 exits 0 on a planned stop");
}

/// PID 1's re-exec route (issue 21, cancel drain): cancelled during the drain, PID 1 keeps its
/// image and incarnation instead of re-executing; a later restart re-executes as usual.
#[test]
fn pid1_cancelled_restart_drain_keeps_its_image() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let gate = home.scratch("gate", "");
    std::fs::write(home.path().join("config.toml"), gated_exec(&gate)).unwrap();
    let Some((mut child, st)) = pid1_gateway(&home, &sw) else { return };
    let inc = st["incarnation"].as_str().unwrap().to_owned();
    let addr: std::net::SocketAddr = st["listen"].as_str().unwrap().parse().unwrap();
    let run = std::thread::spawn(move || gatewarden_testkit::api::Api::new(addr).send("c", "u", "waited on"));
    assert!(wait_until(READY, || status_json(&home, &sw)["active_runs"] == 1));
    assert_cli(&host_cli(&home, &sw, &["send", "/restart"]), 0, "send /restart");
    cancel_keeps(&home, &inc, |a| host_cli(&home, &sw, a));
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(run.join().unwrap().expect("an answer").status, 200);
    let st = status_json(&home, &sw);
    assert_eq!((st["pid"].clone(), st["incarnation"].as_str()), (json!(1), Some(inc.as_str())), "{st:#}");
    assert!(child.try_wait().unwrap().is_none(), "the namespace's init exited");
    assert_cli(&host_cli(&home, &sw, &["restart", "--timeout", "60"]), 0, "restart after the cancel");
    let st = status_json(&home, &sw);
    assert_eq!(st["pid"], json!(1), "{st:#}");
    assert_ne!(st["incarnation"].as_str(), Some(inc.as_str()), "{st:#}");
    assert_cli(&host_cli(&home, &sw, &["stop"]), 0, "stop");
    assert!(wait_until(EXIT, || child.try_wait().unwrap().is_some()), "PID 1 did not exit");
}

/// Issue 28, a container's PID 1: every child is reaped — 20 exec runs each leave an orphan
/// that exits after the run (re-parented to PID 1, which nobody else would reap) — and a bare
/// SIGTERM from outside the namespace (the container runtime's `stop`) is a planned stop: exit
/// 0 within the owner's budget, recorded as the runtime's, and not the operator's `stopped`.
#[test]
fn pid1_reaps_orphans_and_takes_the_runtimes_sigterm_as_its_stop() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let agent = "(sleep 0.2 >/dev/null 2>&1 &); cat";
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "drain_timeout_s = 60\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n",
            json!(agent)
        ),
    )
    .unwrap();
    let Some((mut child, st)) = pid1_gateway(&home, &sw) else { return };
    let addr: std::net::SocketAddr = st["listen"].as_str().unwrap().parse().unwrap();
    let host_pid = lock_holders(&home.lock_file());
    assert_eq!(host_pid.len(), 1, "one gateway");
    for i in 0..20 {
        let r = Api::new(addr).send("c", "u", &format!("run {i}")).unwrap();
        assert_eq!(r.status, 200, "run {i}: {}", r.text());
    }
    let mut left = Vec::new();
    let clean = wait_until(Duration::from_secs(20), || {
        left = gatewarden_lifecycle::platform::spawn::zombie_children(host_pid[0]);
        left.is_empty()
    });
    assert!(clean, "PID 1 left zombies: {left:?}");

    let t0 = Instant::now();
    send_signal(host_pid[0], sig::SIGTERM).unwrap();
    let mut status = None;
    wait_until(Duration::from_secs(15), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let took = t0.elapsed();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "the runtime's stop exits 0\n{}", home.ledger_text());
    assert!(took < Duration::from_secs(10), "within Docker's grace: {took:?}");
    let stops = home.events("stop_requested");
    assert_eq!(stops.len(), 1, "{}", home.ledger_text());
    assert_eq!(stops[0]["by"], json!("container runtime"), "{}", stops[0]);
    let exited = home.events("exited");
    assert!(exited[0]["reason"].as_str().unwrap_or_default().contains("container runtime"), "{}", exited[0]);
    let desired = home.read_json("desired_state.json").unwrap_or(Value::Null);
    assert_ne!(desired["want"], json!("stopped"), "not the operator's stop: {desired}");
    // The next start of the container runs.
    let Some((mut again, st)) = pid1_gateway(&home, &sw) else { return };
    assert_eq!(st["state"], json!("running"), "{st:#}");
    assert_cli(&host_cli(&home, &sw, &["stop"]), 0, "stop");
    assert!(wait_until(EXIT, || again.try_wait().unwrap().is_some()), "PID 1 did not exit");
}

/// A gateway that holds the lock but cannot answer (SIGSTOP): `status` says `unresponsive`
/// (exit 4) and why; `restart` stops it by the verified escalation and starts a new one.
#[test]
fn wedged_gateway_is_reported_and_restarted() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = builder(&home).env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    g.signal(sig::SIGSTOP);
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 4, "status of a stopped gateway");
    let v = out.json();
    assert_eq!(v["state"], json!("unresponsive"), "{v:#}");
    assert!(v["unresponsive"].as_str().unwrap_or_default().contains("stopped"), "{v:#}");
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "60"], RESTART_TIMEOUT);
    assert_cli(&out, 0, "restart of a wedged gateway");
    assert!(g.try_wait_exit(EXIT).is_some(), "the wedged gateway is gone");
    let (pid, _, _) = wait_new_ready(home.path(), &[g.pid()], READY).expect("a new incarnation");
    assert_ne!(pid, g.pid());
    assert!(!home.events("restart_recovered").is_empty(), "{}", home.ledger_text());
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART_TIMEOUT), 0, "stop");
}

/// A manager was declared but nothing revives the exit 75: the gateway's backstop starts the
/// next incarnation itself and records that it had to.
#[test]
fn backstop_starts_a_gateway_no_manager_revives() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), ADMIN);
    let mut g = builder(&home).supervisor("external").env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    let r = Api::new(addr).with_token("t0k-0123456789abcdef").send("c1", "u1", "/restart").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let st = g.wait_exit(EXIT);

    assert_exit_code(&g, st, 75, "planned restart for a manager");
    let (pid, _, _) = wait_new_ready(home.path(), &[g.pid()], Duration::from_secs(30)).expect("backstop started one");
    assert_ne!(pid, g.pid());
    let ev = wait_events(&home, "restart_backstop", 2, Duration::from_secs(30));
    let result = ev.iter().find(|e| e.get("ok").is_some()).expect("a backstop result");
    assert_eq!(result["ok"], json!(true), "{result}");
    assert_eq!(result["kicked"], json!(true), "{result}");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART_TIMEOUT), 0, "stop");
}

/// Records copied from another home never pass for this home's state.
#[test]
fn records_of_another_home_heal() {
    let a = TempHome::new();
    let b = TempHome::new();
    let mut g = start(&a);
    stop_cleanly(&a, &mut g);
    std::fs::create_dir_all(b.path()).unwrap();
    for f in ["gateway_state.json", "gateway.pid"] {
        let _ = std::fs::copy(a.file(f), b.file(f));
    }
    // Make it look live: A's last state as running.
    let mut st: Value = serde_json::from_slice(&std::fs::read(b.state_file()).unwrap()).unwrap();
    st["gateway_state"] = json!("running");
    std::fs::write(b.state_file(), serde_json::to_vec(&st).unwrap()).unwrap();
    let out = run_cli(&b, &["status", "--json"]);
    assert_cli(&out, 3, "status in B");
    let v = out.json();
    assert!(v.get("last_state").is_none() || v["last_state"].is_null(), "A's state shown as B's: {v:#}");
    // With B's lock present (B ran once), the foreign file is healed away and reported.
    let mut gb = start(&b);
    stop_cleanly(&b, &mut gb);
    std::fs::write(b.state_file(), serde_json::to_vec(&st).unwrap()).unwrap();
    let out = run_cli(&b, &["status", "--json"]);
    assert_cli(&out, 3, "status in B");
    let v = out.json();
    assert_ne!(v["last_state"], json!("running"), "{v:#}");
    assert!(!b.exists("gateway_state.json"), "A's state file stays in B");
    let cleaned = v["cleaned"].to_string();
    assert!(cleaned.contains("another home"), "{v:#}");
}

/// A start-up refusal (port taken) names the port's holder at once and is recorded: `status`
/// and `history` show it, not the previous run's exit.
#[test]
fn startup_refusal_names_the_port_holder_and_is_recorded() {
    let home = TempHome::new();
    let mut g = start(&home);
    stop_cleanly(&home, &mut g);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut g = builder(&home).listen(format!("127.0.0.1:{port}")).spawn();
    let t0 = Instant::now();
    let st = g.wait_exit(EXIT);

    assert_exit_code(&g, st, 78, "port taken");
    let err = g.stderr();
    let me = std::process::id();
    assert!(err.contains(&format!("pid {me}")), "the holder (this test, pid {me}) is named: {err}");
    println!("refused after {:?}", t0.elapsed());
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 3, "status");
    let v = out.json();
    assert_eq!(v["last_exit_code"], json!(78), "{v:#}");
    assert!(v["last_exit_reason"].as_str().unwrap_or_default().contains("taken"), "{v:#}");
    let refused = home.events("start_refused");
    assert_eq!(refused.len(), 1, "{}", home.ledger_text());
    assert_eq!(refused[0]["code"], json!(78));
    // A refusal because another gateway runs leaves that gateway's state file alone.
    let mut g1 = start(&home);
    let mut g2 = builder(&home).spawn();
    let st = g2.wait_exit(EXIT);

    assert_exit_code(&g2, st, 78, "second gateway");
    assert_eq!(home.state().as_deref(), Some("running"), "the running gateway's state was overwritten");
    assert_eq!(home.events("start_refused").len(), 2);
    stop_cleanly(&home, &mut g1);
    drop(taken);
}

/// Issue 22, item 3: the port is still held by a process on its way out. `start --timeout S`
/// waits for it within S, saying who holds it, and starts once it is free; a holder that does
/// not go away is named with exit 78 only after the timeout. The gateway itself (`run`, what a
/// service manager launches) keeps failing fast, so a manager parks instead of looping.
#[test]
fn start_waits_for_a_port_on_its_way_out_then_names_a_holder_that_stays() {
    let home = TempHome::new();
    // A holder that leaves after 1.5 s: its own process, so the OS names it.
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let script = format!(
        "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('127.0.0.1',{port}))\ns.listen()\nprint('bound',flush=True)\ntime.sleep(1.5)\n"
    );
    let spawn_holder = || {
        let mut c = Command::new("python3")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(c.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "bound");
        c
    };
    let listen = format!("127.0.0.1:{port}");
    let mut holder = spawn_holder();
    let out = run_cli(&home, &["start", "--listen", &listen, "--timeout", "20"]);
    assert_cli(&out, 0, "start while the port is on its way out");
    let named = format!("pid {} (python3)", holder.id());
    assert!(out.stderr.contains(&named), "start did not say who held the port: {out:#?}");
    let _ = holder.wait();
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");

    // The gateway itself, as a manager runs it: refused at once (78), naming the holder.
    let mut holder = spawn_holder();
    let mut g = builder(&home).listen(listen.clone()).spawn();
    let t0 = Instant::now();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run on a taken port");
    assert!(t0.elapsed() < Duration::from_millis(1500), "run waited {:?} for the port", t0.elapsed());
    let _ = holder.wait();

    // A holder that stays past the timeout: 78, naming it, after the timeout.
    let stays = TcpListener::bind(&listen).unwrap();
    let t0 = Instant::now();
    let out = run_cli(&home, &["start", "--listen", &listen, "--timeout", "2"]);
    assert_eq!(out.code, Some(78), "{out:#?}");
    assert!(t0.elapsed() >= Duration::from_secs(2), "gave up before the timeout: {:?}", t0.elapsed());
    assert!(out.stderr.contains(&format!("pid {}", std::process::id())), "{out:#?}");
    assert!(home.events("start_refused").iter().any(|e| e["by"] == "start"), "{}", home.ledger_text());
    assert!(!home.lock_held());
    drop(stays);
}
