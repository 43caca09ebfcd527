//! `gatewarden supervise` with real child processes: the exit-code table (0 stays down, 75 and
//! crashes restart, 78 parks), the crash-loop brake, stop forwarding, and orphan reaping as
//! PID 1 of a new PID namespace. Loopback only; every wait has a deadline.
#![cfg(target_os = "linux")]

mod common;
use common::*;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `gatewarden supervise`, killed (with its gateway) on drop.
struct Supervise {
    child: Child,
    home: PathBuf,
    stderr: PathBuf,
    /// The supervise process itself (differs from `child` under `unshare --fork`).
    pid: u32,
}

impl Supervise {
    fn spawn(home: &TempHome, extra: &[&str]) -> Supervise {
        let stderr = home.scratch("supervise", ".stderr");
        let mut cmd = Command::new(bin());
        test_env(&mut cmd);
        cmd.arg("--home").arg(home.path()).arg("supervise").args(["--listen", "127.0.0.1:0"]).args(extra);
        Self::finish(cmd, home, stderr)
    }

    fn finish(mut cmd: Command, home: &TempHome, stderr: PathBuf) -> Supervise {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&stderr).unwrap());
        let child = cmd.spawn().expect("spawn supervise");
        let pid = child.id();
        Supervise { child, home: home.path().to_owned(), stderr, pid }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for supervise to exit; its exit code.
    #[track_caller]
    fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut st = None;
        let done = wait_until(timeout, || {
            st = self.child.try_wait().ok().flatten();
            st.is_some()
        });
        assert!(done, "supervise did not exit within {timeout:?}; log:\n{}", self.log());
        st.unwrap().code()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Supervise {
    fn drop(&mut self) {
        if self.running() {
            // The gateway first (it would otherwise outlive a killed supervisor).
            if let Some(pid) = gateway_pid_in(&self.home) {
                let _ = send_signal(pid, sig::SIGKILL);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn gateway_pid_in(home: &std::path::Path) -> Option<u32> {
    let b = std::fs::read(home.join("gateway.pid")).ok()?;
    serde_json::from_slice::<Value>(&b).ok()?["pid"].as_u64().map(|p| p as u32)
}

/// `status --json` once it reports `running` with an incarnation other than `not`.
#[track_caller]
fn wait_running(home: &TempHome, not: Option<&str>, timeout: Duration) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(timeout, || {
        let out = run_cli(home, &["status", "--json"]);
        if out.code != Some(0) {
            return false;
        }
        last = out.json();
        last["state"] == "running" && last["incarnation"].as_str() != not
    });
    assert!(ok, "no running gateway (other than {not:?}) within {timeout:?}; last status: {last}");
    last
}

fn count(home: &TempHome, event: &str) -> usize {
    home.events(event).len()
}

/// Exit 0 (planned stop via `gatewarden stop`): the gateway stays down and supervise exits 0.
#[test]
fn planned_stop_stays_down_and_supervise_exits_0() {
    let home = TempHome::new();
    let mut s = Supervise::spawn(&home, &[]);
    let st = wait_running(&home, None, READY);
    assert_eq!(st["supervisor"], "external", "the child must run with --supervisor external: {st}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert_eq!(s.wait_exit(EXIT), Some(0), "supervise after a planned stop; log:\n{}", s.log());
    assert_eq!(count(&home, "started"), 1, "no restart after a planned stop:\n{}", home.ledger_text());
    assert!(!home.lock_held());
    assert_cli(&run_cli(&home, &["status"]), 3, "status after stop");
}

/// Exit 75 (`gatewarden restart` → the supervised gateway exits 75) restarts at once, and a
/// kill -9 (a crash) restarts with backoff: each time a new incarnation becomes ready while
/// the same supervisor keeps running.
#[test]
fn planned_restart_and_kill9_are_restarted() {
    let home = TempHome::new();
    let mut s = Supervise::spawn(&home, &[]);
    let first = wait_running(&home, None, READY);
    let inc1 = first["incarnation"].as_str().unwrap().to_owned();

    let out = run_cli(&home, &["restart"]);
    assert_cli(&out, 0, "restart under supervise");
    let second = wait_running(&home, Some(&inc1), READY);
    let inc2 = second["incarnation"].as_str().unwrap().to_owned();
    assert!(s.running(), "supervise must survive a planned restart; log:\n{}", s.log());
    let exited = home.events("exited");
    assert_eq!(exited.last().unwrap()["code"], 75, "planned restart exits 75:\n{}", home.ledger_text());

    let pid2 = second["pid"].as_u64().unwrap() as u32;
    send_signal(pid2, sig::SIGKILL).unwrap();
    let third = wait_running(&home, Some(&inc2), READY);
    assert_ne!(third["pid"].as_u64().unwrap() as u32, pid2);
    assert!(s.running());
    let restarts = home.events("supervise_child_exited");
    assert_eq!(restarts.len(), 2, "{}", home.ledger_text());
    assert_eq!(restarts[0]["exit"], json!({"kind": "code", "value": 75}));
    assert_eq!(restarts[1]["exit"], json!({"kind": "signal", "value": 9}));
    assert!(!home.exists("supervise_state.json"));
}

/// The manager route (issue 21, cancel drain): a restart under supervise ends in exit 75 for
/// the manager to relaunch; cancelled during its drain, the same child runs on, supervise sees
/// no exit, and the backstop stands down.
/// A stray SIGTERM to the supervised gateway (a `kill` from another process than supervise,
/// its parent) is not the supervisor's stop: the gateway exits 1, recorded as unexpected with
/// the sender, and supervise revives it. Before, any bare SIGTERM under a declared supervisor
/// was a planned stop (exit 0), and supervise left it down.
#[test]
fn a_stray_sigterm_to_the_supervised_gateway_is_revived() {
    let home = TempHome::new();
    let mut s = Supervise::spawn(&home, &[]);
    let first = wait_running(&home, None, READY);
    let pid = first["pid"].as_u64().unwrap() as u32;
    let inc = first["incarnation"].as_str().unwrap().to_owned();
    // From this test process: neither supervise (the gateway's parent) nor outside its PID
    // namespace.
    send_signal(pid, sig::SIGTERM).unwrap();
    let second = wait_running(&home, Some(&inc), READY);
    assert_ne!(second["pid"].as_u64(), Some(u64::from(pid)));
    assert!(s.running(), "supervise keeps running; log:\n{}", s.log());
    let exited = home.events("exited");
    assert_eq!(exited[0]["code"], 1, "a stray SIGTERM is unexpected:\n{}", home.ledger_text());
    let stop = home.events("stop_requested");
    assert_eq!(stop[0]["unexpected"], json!(true), "{stop:?}");
    assert_eq!(stop[0]["requester"]["pid"], json!(std::process::id()), "the sender is named: {stop:?}");
    let children = home.events("supervise_child_exited");
    assert_eq!(children[0]["exit"], json!({"kind": "code", "value": 1}), "{}", home.ledger_text());
    // supervise's own stop still reaches the gateway as a planned stop.
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert_eq!(s.wait_exit(EXIT), Some(0), "log:\n{}", s.log());
}

#[test]
fn a_cancelled_restart_drain_under_supervise_keeps_the_child() {
    let home = TempHome::new();
    let gate = home.scratch("gate", "");
    std::fs::write(home.path().join("config.toml"), gated_exec(&gate)).unwrap();
    let mut s = Supervise::spawn(&home, &[]);
    let first = wait_running(&home, None, READY);
    let inc = first["incarnation"].as_str().unwrap().to_owned();
    let addr: std::net::SocketAddr = first["listen"].as_str().unwrap().parse().unwrap();
    let run = std::thread::spawn(move || gatewarden_testkit::api::Api::new(addr).send("c", "u", "waited on"));
    assert!(wait_until(READY, || run_cli(&home, &["status", "--json"]).json()["active_runs"] == 1));
    assert_cli(&run_cli(&home, &["send", "/restart"]), 0, "send /restart");
    cancel_keeps(&home, &inc, |a| run_cli(&home, a));
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(run.join().unwrap().expect("an answer").status, 200);
    let b = wait_until(READY, || home.events("restart_backstop").iter().any(|e| e["ok"] == json!(false)));
    assert!(b, "the backstop did not stand down:\n{}", home.ledger_text());
    assert!(s.running(), "{}", s.log());
    assert_eq!(count(&home, "supervise_child_exited"), 0, "{}", home.ledger_text());
    assert_eq!(run_cli(&home, &["status", "--json"]).json()["incarnation"].as_str(), Some(inc.as_str()));
}

/// Exit 78 (fatal configuration) parks: supervise_state.json says why, status shows it,
/// supervise exits 0, and there is no restart loop.
#[test]
fn fatal_config_parks_without_a_restart_loop() {
    let home = TempHome::new();
    home.write("config.toml", "listen = \"127.0.0.1:0\"\nno_such_key = 1\n");
    let mut s = Supervise::spawn(&home, &[]);
    assert_eq!(s.wait_exit(EXIT), Some(0), "supervise parks with exit 0; log:\n{}", s.log());
    let parked = home.read_json("supervise_state.json").expect("supervise_state.json");
    assert_eq!(parked["kind"], "fatal-config", "{parked}");
    assert_eq!(parked["last_exit"], json!({"kind": "code", "value": 78}), "{parked}");
    assert_eq!(count(&home, "supervise_child_exited"), 1, "exactly one child run:\n{}", home.ledger_text());
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 3, "status of a parked home");
    assert_eq!(out.json()["parked"]["kind"], "fatal-config", "{}", out.stdout);
    let human = run_cli(&home, &["status"]);
    assert!(human.stdout.contains("parked:"), "{}", human.stdout);
    // doctor reports the park with its fix.
    let doc = run_cli(&home, &["doctor", "--json"]);
    let ids: Vec<String> =
        doc.json()["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_owned()).collect();
    assert!(ids.contains(&"parked-fatal-config".to_owned()), "{ids:?}");
}

/// The crash-loop brake (issue 22, item 5): repeated crashes (kill -9) within the window never
/// end the supervision (a gateway left down for good is what the unit used to do); past the
/// brake every restart waits the cap, and `status` names the crash loop and the next restart.
#[test]
fn a_crash_loop_is_braked_and_named_never_parked() {
    let home = TempHome::new();
    let mut s = Supervise::spawn(&home, &["--brake-restarts", "2", "--backoff-ms", "20", "--max-backoff-ms", "3000"]);
    let mut inc: Option<String> = None;
    for round in 0..4 {
        let st = wait_running(&home, inc.as_deref(), READY);
        inc = st["incarnation"].as_str().map(str::to_owned);
        let pid = st["pid"].as_u64().unwrap() as u32;
        if let Err(e) = send_signal(pid, sig::SIGKILL) {
            panic!(
                "kill -9 {pid} (round {round}): {e}; status {st}; log:\n{}\nledger:\n{}",
                s.log(),
                home.ledger_text()
            );
        }
        // Past two restarts in the window: the braked wait, seen from outside.
        if round >= 2 {
            let mut st = Value::Null;
            must_wait_until(Duration::from_secs(5), "status names the braked crash loop", || {
                st = run_cli(&home, &["status", "--json"]).json();
                st["crash_loop"]["detail"]["delay_ms"] == json!(3000)
            });
            let sentence = st["crash_loop"]["sentence"].as_str().unwrap_or_default().to_owned();
            assert!(sentence.contains("crashes in a row"), "{st}");
            assert!(sentence.contains("exit"), "{st}");
        }
        assert!(s.running(), "supervise ended on a crash loop (round {round}); log:\n{}", s.log());
    }
    // It came back after the braked wait, and nothing was parked.
    wait_running(&home, inc.as_deref(), Duration::from_secs(15));
    assert!(!home.exists("supervise_state.json"), "{}", home.ledger_text());
    assert!(count(&home, "crash_backoff") >= 4, "{}", home.ledger_text());
    let doc = run_cli(&home, &["doctor", "--json"]);
    let ids: Vec<String> =
        doc.json()["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_owned()).collect();
    assert!(ids.contains(&"crash-loop".to_owned()), "{ids:?}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert_eq!(s.wait_exit(EXIT), Some(0), "log:\n{}", s.log());
}

/// SIGTERM to supervise is a graceful stop of the child (control `stop`: exit 0, ledger names
/// supervise as the requester) and supervise exits 0.
#[test]
fn sigterm_to_supervise_stops_the_child_gracefully() {
    let home = TempHome::new();
    let mut s = Supervise::spawn(&home, &[]);
    let st = wait_running(&home, None, READY);
    let child = st["pid"].as_u64().unwrap() as u32;
    send_signal(s.pid, sig::SIGTERM).unwrap();
    assert_eq!(s.wait_exit(EXIT), Some(0), "log:\n{}", s.log());
    assert!(!pid_alive(child), "the gateway outlived supervise");
    let req = home.events("stop_requested");
    assert_eq!(req.len(), 1, "{}", home.ledger_text());
    assert_eq!(req[0]["requester"]["pid"], json!(s.pid), "{}", req[0]);
    assert_eq!(req[0]["requester"]["channel"], "signal");
    let exited = home.events("exited");
    assert_eq!(exited.last().unwrap()["code"], 0, "{}", home.ledger_text());
    assert_eq!(count(&home, "started"), 1);
}

/// Whether `unshare --pid --fork --mount-proc` works here (root, or user namespaces).
fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// (pid, ppid, state) of every process, from /proc.
fn processes() -> Vec<(u32, u32, char)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(i) = stat.rfind(')') else { continue };
        let mut f = stat[i + 1..].split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        v.push((pid, ppid, state));
    }
    v
}

/// As PID 1 of a new PID namespace, supervise reaps orphans. The gateway's exec backend runs a
/// command that leaves a grandchild behind in its own session (`setsid`, so the backend's
/// process-group kill does not reach it); when its parent shell exits the grandchild is
/// re-parented to the namespace's PID 1 — supervise — and when it exits (after touching a
/// file) it must not stay a zombie.
#[test]
fn as_pid1_it_reaps_orphans() {
    if !unshare_works() {
        gatewarden_testkit::unavailable::<()>("`unshare --pid --fork --mount-proc`", "not usable here (needs root)");
        return;
    }
    let home = TempHome::new();
    let done = home.scratch("orphan-done", "");
    let started = home.scratch("orphan-pid", "");
    // The shell waits (a condition, not a sleep) until the grandchild is in its own session,
    // so the backend's process-group kill at the end of the run cannot reach it.
    let cmd = format!(
        "setsid sh -c 'echo $$ > {s}; sleep 0.3; touch {d}' >/dev/null 2>&1 </dev/null & \
         while [ ! -s {s} ]; do sleep 0.01; done; echo ok",
        s = started.display(),
        d = done.display()
    );
    home.write(
        "config.toml",
        format!("listen = \"127.0.0.1:0\"\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {cmd:?}]\n"),
    );
    let stderr = home.scratch("supervise", ".stderr");
    let mut c = Command::new("unshare");
    test_env(&mut c);
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(bin())
        .arg("--home")
        .arg(home.path())
        .arg("supervise");
    let mut s = Supervise::finish(c, &home, stderr);
    // The supervise process is unshare's child (PID 1 inside).
    let unshare_pid = s.pid;
    must_wait_until(READY, "supervise under unshare", || processes().iter().any(|(_, ppid, _)| *ppid == unshare_pid));
    let sup = processes().into_iter().find(|(_, ppid, _)| *ppid == unshare_pid).unwrap().0;
    s.pid = sup;
    wait_running(&home, None, READY);
    assert!(s.log().contains("running as PID 1"), "{}", s.log());

    let out = run_cli(&home, &["send", "hello"]);
    assert_cli(&out, 0, "send");
    must_wait_until(READY, "the orphan ran", || done.exists());
    let zombies = || processes().into_iter().filter(|(_, ppid, st)| *ppid == sup && *st == 'Z').count();
    must_wait_until(EXIT, "no zombie children of supervise", || zombies() == 0);
    assert_eq!(holds_for(Duration::from_millis(300), || zombies() == 0), Ok(()), "a zombie appeared");
    must_wait_until(EXIT, "supervise logged the reaping", || s.log().contains("reaped orphan"));

    send_signal(sup, sig::SIGTERM).unwrap();
    assert_eq!(s.wait_exit(EXIT), Some(0), "log:\n{}", s.log());
    assert_eq!(home.events("exited").last().unwrap()["code"], 0, "{}", home.ledger_text());
}
