//! Against a REAL systemd user manager (`scripts/systemd-user` starts one; `scripts/test` evals
//! its environment): the `[S]` scenarios of bug-classes.md classes D, G and H, with units
//! installed by `gatewarden service install` itself. Each test has its own temp home, so its
//! own unit name, and a guard that stops and removes the unit (and its probe) at the end.
//!
//! Without a user manager the tests print why and pass; with `CI` set they fail instead.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use work_common::soak::{SteadyStream, steady_stream};
use work_common::{Api, Sweeper, TAG_VAR};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn systemctl(args: &[&str]) -> std::process::Output {
    Command::new("systemctl").arg("--user").args(args).output().expect("run systemctl")
}

fn config_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".config"))
        .join("systemd/user")
}

/// A unit installed by `gatewarden service install` for a temp home; removed on drop.
struct Unit {
    home: TempHome,
    name: String,
    probe: Option<String>,
}

impl Unit {
    /// Writes `config` (if any) into a fresh home and runs `service install <args>`.
    fn install(config: Option<&str>, args: &[&str]) -> Unit {
        Self::install_as(TempHome::new(), bin(), config, args)
    }

    /// The unit `service install` would install for `home` (with `config`), not installed yet;
    /// removed on drop all the same.
    fn named(home: TempHome, config: Option<&str>) -> Unit {
        if let Some(c) = config {
            home.write("config.toml", c);
        }
        let st = run_cli(&home, &["service", "status", "--json"]);
        let name = st.json()["unit"].as_str().expect("unit name").to_owned();
        Unit { home, name, probe: None }
    }

    /// [`Unit::install`] by the binary `exe` (which becomes the unit's `ExecStart=`).
    fn install_as(home: TempHome, exe: &str, config: Option<&str>, args: &[&str]) -> Unit {
        let unit = Unit::named(home, config);
        let mut full = vec!["service", "install"];
        full.extend_from_slice(args);
        let out = cli_with(exe, unit.home.path(), &full, &[], Duration::from_secs(60));
        assert_cli(&out, 0, "service install");
        unit
    }

    fn path(&self) -> PathBuf {
        config_dir().join(&self.name)
    }

    fn show(&self) -> BTreeMap<String, String> {
        let out = systemctl(&[
            "show",
            "-p",
            "MainPID,NRestarts,ActiveState,SubState,Result,TimeoutStopUSec,InvocationID",
            &self.name,
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect()
    }

    fn prop(&self, k: &str) -> String {
        self.show().get(k).cloned().unwrap_or_default()
    }

    fn main_pid(&self) -> u32 {
        self.prop("MainPID").parse().unwrap_or(0)
    }

    fn cli(&self, args: &[&str]) -> CliOutput {
        cli_with(bin(), self.home.path(), args, &[], Duration::from_secs(60))
    }

    /// `status --json` once it is `running` under a MainPID other than `not`.
    #[track_caller]
    fn wait_running(&self, not: u32, timeout: Duration) -> Value {
        let mut last = Value::Null;
        let ok = wait_until(timeout, || {
            let pid = self.main_pid();
            if pid == 0 || pid == not {
                return false;
            }
            let out = self.cli(&["status", "--json"]);
            last = if out.code == Some(0) { out.json() } else { Value::Null };
            last["state"] == "running" && last["pid"] == json!(pid)
        });
        assert!(
            ok,
            "{}: no running gateway with a new MainPID (old {not}) within {timeout:?}; last {last}; {:?}",
            self.name,
            self.show()
        );
        last
    }

    /// A oneshot probe unit that touches a file, wired as `OnFailure=` through a drop-in.
    fn add_on_failure_probe(&mut self) -> PathBuf {
        let flag = self.home.scratch("on-failure-ran", "");
        let probe = format!("gw-probe-{}", self.name);
        std::fs::write(
            config_dir().join(&probe),
            format!("[Service]\nType=oneshot\nExecStart=/bin/touch {}\n", flag.display()),
        )
        .unwrap();
        let dropin = config_dir().join(format!("{}.d", self.name));
        std::fs::create_dir_all(&dropin).unwrap();
        std::fs::write(dropin.join("on-failure.conf"), format!("[Unit]\nOnFailure={probe}\n")).unwrap();
        assert!(systemctl(&["daemon-reload"]).status.success());
        self.probe = Some(probe);
        flag
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let _ = cli_with(bin(), self.home.path(), &["service", "uninstall"], &[], Duration::from_secs(120));
        let _ = systemctl(&["stop", &self.name]);
        let _ = std::fs::remove_file(self.path());
        let _ = std::fs::remove_dir_all(config_dir().join(format!("{}.d", self.name)));
        if let Some(p) = &self.probe {
            let _ = systemctl(&["stop", p]);
            let _ = std::fs::remove_file(config_dir().join(p));
            let _ = systemctl(&["reset-failed", p]);
        }
        let _ = systemctl(&["daemon-reload"]);
        let _ = systemctl(&["reset-failed", &self.name]);
    }
}

const LOOPBACK: &str = "listen = \"127.0.0.1:0\"\n";

/// `service install --print` renders the exit-code contract (no manager needed).
#[test]
fn print_renders_the_exit_code_contract() {
    let home = TempHome::new();
    home.write("config.toml", format!("{LOOPBACK}drain_timeout_s = 45\n"));
    let out = run_cli(&home, &["service", "install", "--print"]);
    assert_cli(&out, 0, "service install --print");
    let u = &out.stdout;
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "RestartForceExitStatus=75",
        "SuccessExitStatus=75",
        "RestartPreventExitStatus=78",
        "RestartSec=0s",
        "KillMode=mixed",
        "WantedBy=default.target",
        // max(max(45, 0 + 10) + 30, 45 + 60 + 10, 30) = 115
        "TimeoutStopSec=115",
    ] {
        assert!(u.lines().any(|l| l == line), "missing {line:?} in:\n{u}");
    }
    let exec = format!("ExecStart={} run --home {} --supervisor systemd", bin(), home.path().display());
    assert!(u.lines().any(|l| l == exec), "missing {exec:?} in:\n{u}");
    assert!(!home.exists("gateway.lock"), "--print must not touch the home");
    let sys = run_cli(&home, &["service", "install", "--print", "--system", "--run-as", "gw"]);
    assert_cli(&sys, 0, "--print --system");
    assert!(sys.stdout.contains("User=gw\n") && sys.stdout.contains("WantedBy=multi-user.target\n"), "{}", sys.stdout);
}

/// Issue 31 §1: a system unit always names the user it runs as, by the rule hermes units
/// follow: the home's owner (root's home: `User=0`, said), or `--run-as`; with no owner known
/// (no home yet) and none given, none is written. Before, `--system` alone wrote no `User=`,
/// so the gateway ran as root whoever owned the home.
#[test]
fn a_system_unit_always_names_its_user() {
    use std::os::unix::fs::MetadataExt;
    let home = TempHome::new();
    home.write("config.toml", LOOPBACK);
    let owner = std::fs::metadata(home.path()).unwrap().uid();
    let out = run_cli(&home, &["service", "install", "--print", "--system"]);
    assert_cli(&out, 0, "--print --system");
    assert!(out.stdout.contains(&format!("\nUser={owner}\n")), "the home's owner:\n{}", out.stdout);
    if owner == 0 {
        // Another user's home, as root: that user, never root.
        std::os::unix::fs::chown(home.path(), Some(65534), Some(65534)).unwrap();
        let out = run_cli(&home, &["service", "install", "--print", "--system"]);
        std::os::unix::fs::chown(home.path(), Some(0), Some(0)).unwrap();
        assert_cli(&out, 0, "--print --system, another user's home");
        assert!(out.stdout.contains("\nUser=65534\n"), "{}", out.stdout);
    } else {
        gatewarden_testkit::unavailable::<()>("a home of another user", "needs root");
    }
    let gone = home.root().join("no-home-yet");
    let out = cli(bin(), &gone, &["service", "install", "--print", "--system"]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("must name the user it runs as") && out.stderr.contains("--run-as"), "{out:?}");
    assert!(!out.stdout.contains("[Service]"), "no unit without User=: {out:?}");
    let out = cli(bin(), &gone, &["service", "install", "--print", "--system", "--run-as", "gw"]);
    assert_cli(&out, 0, "--run-as without a home");
    assert!(out.stdout.contains("\nUser=gw\n"), "{}", out.stdout);
}

/// D2: SIGUSR1 to MainPID → exit 75 → new MainPID, NRestarts + 1, Result=success, and the
/// OnFailure= probe did not run.
#[test]
fn d2_planned_restart_revives_and_is_not_a_failure() {
    if !have_user_manager() {
        return;
    }
    let mut u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let flag = u.add_on_failure_probe();
    let first = u.wait_running(0, READY);
    let old = first["pid"].as_u64().unwrap() as u32;
    let n0: u32 = u.prop("NRestarts").parse().unwrap();
    assert_eq!(first["supervisor"], "systemd");
    send_signal(old, sig::SIGUSR1).unwrap();
    // The scenario's bound is on systemd's revival (a new MainPID); the new gateway then
    // reaches `running` within the usual start-up deadline.
    let revived = wait_until(Duration::from_secs(6), || ![0, old].contains(&u.main_pid()));
    assert!(revived, "no new MainPID within 6 s: {:?}\n{}", u.show(), u.home.ledger_text());
    u.wait_running(old, READY);
    assert_eq!(u.prop("NRestarts").parse::<u32>().unwrap(), n0 + 1, "{:?}\n{}", u.show(), u.home.ledger_text());
    assert_eq!(u.prop("Result"), "success", "{:?}", u.show());
    assert_eq!(u.home.events("exited").last().unwrap()["code"], 75, "{}", u.home.ledger_text());
    assert_eq!(holds_for(Duration::from_secs(1), || !flag.exists()), Ok(()), "the OnFailure= probe ran");
}

/// Issue 27 §2: `systemctl --user reload` runs the unit's `ExecReload=` (`gatewarden reload`,
/// synchronous): a changed file is applied in place (same MainPID, recorded as asked by
/// systemd), and a file that does not load fails the reload while the gateway runs on.
#[test]
fn systemctl_reload_applies_in_place_and_fails_on_a_config_that_does_not_load() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(&format!("{LOOPBACK}admins = [\"a\"]\n")), &[]);
    let first = u.wait_running(0, READY);
    let pid = u.main_pid();
    u.home.write("config.toml", format!("{LOOPBACK}admins = [\"a\", \"b\"]\n"));
    let out = systemctl(&["reload", &u.name]);
    assert!(out.status.success(), "systemctl reload: {out:?}\n{}", u.home.ledger_text());
    let ev = u.home.events("reload").pop().expect("reload recorded before systemctl returned");
    assert_eq!((&ev["changed"], &ev["requester"]["channel"]), (&json!(["admins"]), &json!("systemd")), "{ev}");

    u.home.write("config.toml", format!("{LOOPBACK}admins = [\"a\"]\nbogus_key = 1\n"));
    let out = systemctl(&["reload", &u.name]);
    assert!(!out.status.success(), "a config that does not load must fail the reload: {out:?}");
    let ev = u.home.events("reload_refused").pop().expect("reload_refused");
    assert_eq!((ev["key"].as_str(), ev["line"].as_u64()), (Some("bogus_key"), Some(3)), "{ev}");
    assert_eq!((u.main_pid(), u.prop("ActiveState")), (pid, "active".to_owned()), "{:?}", u.show());
    let now = u.cli(&["status", "--json"]).json();
    assert_eq!((&now["incarnation"], &now["state"]), (&first["incarnation"], &json!("running")), "{now}");
}

/// D3: `gatewarden stop` → inactive with MainPID 0, and it stays so; a stale gateway.pid does
/// not block a later `gatewarden start`, which goes through systemd again.
#[test]
fn d3_planned_stop_stays_down_and_start_revives() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let first = u.wait_running(0, READY);
    let out = u.cli(&["stop"]);
    assert_cli(&out, 0, "stop");
    assert!(out.stdout.contains("stays down"), "{}", out.stdout);
    let down = || {
        let s = u.show();
        s["ActiveState"] == "inactive" && s["MainPID"] == "0"
    };
    assert!(down(), "{:?}", u.show());
    assert_eq!(u.prop("Result"), "success");
    // Bounded observation (the scenario says 30 s; RestartSec is 100 ms, so 3 s is 30 restart delays).
    assert_eq!(holds_for(Duration::from_secs(3), down), Ok(()), "the unit came back: {:?}", u.show());
    assert_eq!(u.home.events("exited").last().unwrap()["code"], 0);

    // A stale gateway.pid naming a dead process.
    let mut rec = first.clone();
    rec["pid"] = json!(4_000_000);
    u.home.write("gateway.pid", rec.to_string());
    let out = u.cli(&["start"]);
    assert_cli(&out, 0, "start after stop");
    assert!(out.stdout.contains("via systemd"), "{}", out.stdout);
    let again = u.wait_running(0, READY);
    assert_ne!(again["pid"], first["pid"]);
    assert_eq!(u.prop("ActiveState"), "active");
}

/// D5: kill -9 MainPID is revived (Restart=on-failure) despite the stale files it leaves, and
/// reaches running.
#[test]
fn d5_kill9_is_revived_despite_stale_files() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let old = u.wait_running(0, READY)["pid"].as_u64().unwrap() as u32;
    send_signal(old, sig::SIGKILL).unwrap();
    // RestartSec (0.1 s) + 5 s.
    let new = u.wait_running(old, Duration::from_millis(5100));
    assert_eq!(new["state"], "running");
    let status = u.cli(&["status", "--json"]).json();
    assert_eq!(status["service"]["main_pid"], new["pid"], "{status}");
}

fn exec_config(drain_s: u64, command: &str) -> String {
    format!(
        "{LOOPBACK}drain_timeout_s = {drain_s}\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {command:?}]\n"
    )
}

/// Starts an async run (the exec command) and waits until the gateway counts it as active.
fn start_long_run(u: &Unit) {
    let out = u.cli(&["send", "--async", "work"]);
    assert_cli(&out, 0, "send --async");
    must_wait_until(READY, "an active run", || u.cli(&["status", "--json"]).json()["active_runs"] == 1);
}

/// D6 via `gatewarden stop` (through systemd): the drain of a 3 s run completes inside the
/// stop, Result=success, and the rendered TimeoutStopSec covers drain + headroom.
#[test]
fn d6_stop_timeout_covers_the_drain() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(&exec_config(10, "sleep 3; echo done")), &["--restart-sec-ms", "100"]);
    u.wait_running(0, READY);
    // max(max(10, 10) + 30, 10 + 70, 30) = 80 s ≥ drain + 30 s grace.
    assert_eq!(u.prop("TimeoutStopUSec"), "1min 20s", "{:?}", u.show());
    start_long_run(&u);
    let t0 = Instant::now();
    let out = u.cli(&["stop"]);
    assert_cli(&out, 0, "stop");
    assert!(t0.elapsed() >= Duration::from_secs(1), "the stop did not wait for the run");
    let s = u.show();
    assert_eq!((s["ActiveState"].as_str(), s["Result"].as_str()), ("inactive", "success"), "{s:?}");
    let drained = u.home.events("drained");
    assert_eq!(drained.last().unwrap()["interrupted"], 0, "{}", u.home.ledger_text());
}

/// D6 with a bare `systemctl --user stop` (what a shutdown or an operator does): the stop must
/// also be a planned stop, Result=success, never `timeout`.
#[test]
fn d6_systemctl_stop_is_a_planned_stop() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(&exec_config(10, "sleep 3; echo done")), &["--restart-sec-ms", "100"]);
    u.wait_running(0, READY);
    start_long_run(&u);
    let out = systemctl(&["stop", &u.name]);
    assert!(out.status.success(), "{out:?}");
    let s = u.show();
    assert_ne!(s["Result"], "timeout", "{s:?}");
    let drained = u.home.events("drained");
    assert_eq!(drained.last().map(|d| d["interrupted"].clone()), Some(json!(0)), "{}", u.home.ledger_text());
    assert_eq!(
        s["Result"], "success",
        "systemd's stop signal ended the gateway as an unexpected exit ({s:?}); the unit needs \
         KillSignal=SIGINT (a planned stop) — see the report to the lead"
    );
}

/// H2: `gatewarden restart` launched from inside the unit's cgroup (an exec-backend run of the
/// gateway itself, like a chat `/restart` or an updater) moves into a transient scope and
/// survives the cgroup kill: its `restart_result` is recorded ok and a new MainPID is running.
#[test]
fn h2_restart_from_inside_the_unit_survives() {
    if !have_user_manager() {
        return;
    }
    // The command needs the home path, which only exists once the Unit's home does: write the
    // config after install, then restart through systemd to pick it up.
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let out_file = u.home.scratch("restart-out", ".txt");
    let pid_file = u.home.scratch("restart-pid", ".txt");
    // `setsid` so the backend's process-group kill at the end of the run does not reach it;
    // the shell waits (a condition) until it runs in its new session. It stays in the cgroup.
    let cmd = format!(
        "setsid sh -c 'echo $$ > {pid}; exec {bin} --home {home} restart' >{out} 2>&1 </dev/null & \
         while [ ! -s {pid} ]; do sleep 0.01; done; echo started",
        pid = pid_file.display(),
        bin = bin(),
        home = u.home.path().display(),
        out = out_file.display()
    );
    u.home.write("config.toml", exec_config(10, &cmd));
    assert_cli(&u.cli(&["restart"]), 0, "restart to load the exec config");
    let before = u.wait_running(0, READY);
    let old = before["pid"].as_u64().unwrap() as u32;
    let results_before = u.home.events("restart_result").len();

    assert_cli(&u.cli(&["send", "go"]), 0, "send");
    must_wait_until(Duration::from_secs(20), "the in-unit restart's result", || {
        u.home.events("restart_result").len() > results_before
    });
    let r = u.home.events("restart_result").pop().unwrap();
    let out = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert_eq!(r["ok"], true, "restart_result {r}; its output:\n{out}");
    u.wait_running(old, READY);
    assert!(!out.contains("restarting from inside"), "it did not leave the cgroup:\n{out}");
}

/// G2: with RestartSec=300 s, `gatewarden restart` does not wait for the backoff: it starts the
/// unit itself and a new incarnation is ready quickly.
#[test]
fn g2_long_restart_sec_does_not_delay_restart() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "300000"]);
    let old = u.wait_running(0, READY)["pid"].as_u64().unwrap() as u32;
    let t0 = Instant::now();
    let out = u.cli(&["restart"]);
    assert_cli(&out, 0, "restart");
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    u.wait_running(old, Duration::from_secs(5));
    let r = u.home.events("restart_result").pop().unwrap();
    assert_eq!((r["ok"].clone(), r["kicked"].clone()), (json!(true), json!(true)), "{r}");
}

/// D7: doctor names a drifted directive of the installed unit, and `--fix` rewrites it.
#[test]
fn d7_doctor_finds_drift_and_fix_rewrites_the_unit() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--no-start"]);
    let clean = u.cli(&["doctor", "--json"]);
    assert_cli(&clean, 0, "doctor on a fresh unit");
    let text = std::fs::read_to_string(u.path()).unwrap();
    std::fs::write(
        u.path(),
        text.replace("SuccessExitStatus=75\n", "").replace("TimeoutStopSec=100", "TimeoutStopSec=20"),
    )
    .unwrap();
    let out = u.cli(&["doctor", "--json"]);
    assert_cli(&out, 1, "doctor with drift");
    let findings = out.json()["findings"].as_array().unwrap().clone();
    let has = |id: &str, subject: &str| findings.iter().any(|f| f["id"] == id && f["subject"] == subject);
    assert!(has("directive-missing", "Service.SuccessExitStatus"), "{findings:#?}");
    assert!(has("stop-timeout-too-short", "Service.TimeoutStopSec"), "{findings:#?}");
    let human = u.cli(&["doctor"]);
    assert!(human.stdout.contains("SuccessExitStatus=75") && human.stdout.contains("fix:"), "{}", human.stdout);

    let fixed = u.cli(&["doctor", "--fix"]);
    assert_cli(&fixed, 0, "doctor --fix");
    let text = std::fs::read_to_string(u.path()).unwrap();
    assert!(text.contains("SuccessExitStatus=75\n") && text.contains("TimeoutStopSec=100\n"), "{text}");
    assert_cli(&u.cli(&["doctor"]), 0, "doctor after --fix");
}

/// Issue 7, item 8: planned restarts do not count against the unit's start limit
/// (`StartLimitBurst=5` in the default unit): eight `restart`s in a row are each revived by
/// systemd itself (never `start-limit-hit`, never kicked), while `supervisor` in status is the
/// proven `systemd` with its evidence.
#[test]
fn planned_restarts_never_trip_the_start_limit() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &[]);
    let mut st = u.wait_running(0, READY);
    assert_eq!(st["supervisor"], json!("systemd"), "{st:#}");
    let ev = st["supervisor_evidence"].as_str().unwrap_or_default().to_owned();
    assert!(ev.contains("SYSTEMD_EXEC_PID") || ev.contains("MainPID"), "{ev}");
    for i in 0..8 {
        let old = st["pid"].as_u64().unwrap() as u32;
        let out = u.cli(&["restart"]);
        assert_cli(&out, 0, &format!("restart #{i}"));
        st = u.wait_running(old, Duration::from_secs(5));
        assert_ne!(u.prop("Result"), "start-limit-hit", "restart #{i}: {:?}", u.show());
    }
    let results = u.home.events("restart_result");
    assert_eq!(results.len(), 8, "{}", u.home.ledger_text());
    for r in &results {
        assert_eq!((r["ok"].clone(), r["kicked"].clone()), (json!(true), json!(false)), "{r}");
    }
}

/// Issue 22, item 6 under systemd: chat `/restart` (`gatewarden send /restart`), then `stop`.
/// The restart's backstop gives up instead of starting the unit again (before: 3 of 6 came
/// back, 246 ms after "stays down until `gatewarden start`"), and a bare `systemctl start`
/// afterwards is a launch that obeys the recorded stop: it exits 0 before it is ready.
#[test]
fn d9_stop_after_a_chat_restart_stays_down() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    u.wait_running(0, READY);
    assert_cli(&u.cli(&["send", "/restart"]), 0, "send /restart");
    let out = u.cli(&["stop"]);
    assert_cli(&out, 0, "stop after /restart");
    let readies = || u.home.events("ready").len();
    let ready_before = readies();
    // The backstop either gives up on the recorded stop or goes with the unit's cgroup; once
    // it is gone nothing is left that could start the unit.
    let backstop = u.home.events("restart_backstop").iter().find_map(|e| e["backstop_pid"].as_u64());
    let backstop = backstop.expect("the gateway started a backstop") as u32;
    must_wait_until(Duration::from_secs(30), "the restart backstop to end", || !pid_alive(backstop));
    // Never running again: no incarnation becomes ready after the stop. A launch systemd had
    // already scheduled for the exit 75 may still come; it reads the stop and exits 0 before
    // it is ready (`start_prevented`), and the unit settles down.
    let down = || {
        let s = u.show();
        s["ActiveState"] == "inactive" && s["MainPID"] == "0" && !u.home.lock_held()
    };
    must_wait_until(Duration::from_secs(10), "the unit down", down);
    assert_eq!(
        holds_for(Duration::from_secs(2), || readies() == ready_before),
        Ok(()),
        "it came back: {:?}\n{}",
        u.show(),
        u.home.ledger_text()
    );
    must_wait_until(Duration::from_secs(10), "the unit down", down);
    for result in u.home.events("restart_backstop").iter().filter(|e| e.get("ok").is_some()) {
        assert_eq!(result["ok"], json!(false), "{}", u.home.ledger_text());
    }

    let prevented = || u.home.events("start_prevented").iter().filter(|e| e["by"] == json!("systemd")).count();
    let before = prevented();
    let _ = systemctl(&["start", &u.name]);
    must_wait_until(Duration::from_secs(10), "the launch to obey the stop", || prevented() > before);
    must_wait_until(Duration::from_secs(10), "the unit down", down);
    assert_eq!(readies(), ready_before, "a bare systemctl start ran it: {}", u.home.ledger_text());
    // `gatewarden start` is what ends the stop.
    assert_cli(&u.cli(&["start"]), 0, "start");
    u.wait_running(0, READY);
}

/// Issue 21, cancel drain, under systemd: the drain of a planned restart told systemd
/// `STOPPING=1`, which cannot be taken back, so the cancel is refused with that reason and the
/// restart completes (systemd revives the unit once the run ends).
#[test]
fn a_restart_drain_under_systemd_is_not_cancelled() {
    if !have_user_manager() {
        return;
    }
    let home = TempHome::new();
    let gate = home.scratch("gate", "");
    let u =
        Unit::install_as(home, bin(), Some(&format!("{LOOPBACK}{}", gated_exec(&gate))), &["--restart-sec-ms", "100"]);
    let first = u.wait_running(0, READY);
    start_long_run(&u);
    assert_cli(&u.cli(&["send", "/restart"]), 0, "send /restart");
    must_wait_until(READY, "draining", || u.home.state().as_deref() == Some("draining"));
    let out = u.cli(&["cancel-drain"]);
    assert_cli(&out, 1, "cancel-drain under systemd");
    assert!(out.stderr.contains("systemd was told the unit is stopping"), "{}", out.stderr);
    assert!(u.home.events("drain_cancelled").is_empty(), "{}", u.home.ledger_text());
    std::fs::write(&gate, b"").unwrap();
    let pid = first["pid"].as_u64().unwrap() as u32;
    let next = u.wait_running(pid, Duration::from_secs(30));
    assert_ne!(next["incarnation"], first["incarnation"], "{next:#}");
}

/// Issue 22, item 5: seven kill -9 in a row, each as soon as the gateway is back. With the old
/// unit (`StartLimitBurst=5` in 60 s) the fifth or sixth left it `failed` for good while
/// `status` said "last state: running" and `doctor` found nothing. Now the unit never gives
/// up: every kill is revived, after a growing delay (`crash-backoff`, systemd < 254, or
/// `RestartSteps=`), and `status`, `doctor` and the ledger name the crash loop.
#[test]
fn a_crash_loop_is_named_and_never_ends_the_unit() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &[]);
    let mut pid = u.wait_running(0, READY)["pid"].as_u64().unwrap() as u32;
    for i in 0..7 {
        send_signal(pid, sig::SIGKILL).unwrap();
        // The ladder after crash n waits backoff(n-1): at most 3.2 s by the seventh.
        let st = u.wait_running(pid, Duration::from_secs(15));
        assert_ne!(u.prop("Result"), "start-limit-hit", "kill #{i}: {:?}", u.show());
        pid = st["pid"].as_u64().unwrap() as u32;
    }
    // While it runs again: the loop that led here is named.
    let status = u.cli(&["status", "--json"]).json();
    let sentence = status["crash_loop"]["sentence"].as_str().unwrap_or_default().to_owned();
    assert!(sentence.starts_with("7 crashes in a row"), "{status:#}");
    let doctor = u.cli(&["doctor", "--json"]);
    assert!(doctor.stdout.contains("crash-loop"), "{}", doctor.stdout);
    // The growing delay is in the ledger (the helper on systemd < 254; systemd's own otherwise).
    let unit_text = std::fs::read_to_string(u.path()).unwrap();
    if unit_text.contains("crash-backoff") {
        let delays: Vec<u64> =
            u.home.events("crash_backoff").iter().map(|e| e["delay_ms"].as_u64().unwrap_or(0)).collect();
        assert_eq!(delays, [0, 100, 200, 400, 800, 1600, 3200], "{}", u.home.ledger_text());
        let exits = u.home.events("crash_backoff");
        assert!(exits.iter().all(|e| e["exit"] == "killed by SIGKILL"), "{exits:?}");
    } else {
        assert!(unit_text.contains("RestartSteps="), "{unit_text}");
    }
    // Down, waiting out the eighth delay: status says what happened, not "last state: running".
    send_signal(pid, sig::SIGKILL).unwrap();
    let mut st = Value::Null;
    let named = wait_until(Duration::from_secs(3), || {
        st = u.cli(&["status", "--json"]).json();
        st["running"] == json!(false)
            && st["crash_loop"]["sentence"].as_str().is_some_and(|s| s.starts_with("8 crashes"))
    });
    assert!(named, "{st:#}");
    // The gateway could not record its end (issue 27 §2: never a guess). A signal is named only
    // as what systemd reported, when its `crash_backoff` line came before this status looked.
    let reason = st["last_exit_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("ended without recording an exit"), "{st:#}");
    let guessed = reason.split("its supervisor reported").next().unwrap_or_default();
    assert!(!guessed.contains("SIGKILL") && !guessed.contains("OOM"), "{st:#}");
}

/// Issue 22's kill -9 budget: without `RestartSteps=` (systemd < 254) the unit restarts at once
/// (`RestartSec=0`) and the crash-backoff helper holds the whole delay. When the helper cannot
/// run (here: the unit's binary replaced by one that fails at once), the unit's own fallback
/// delay still holds, so a broken binary is no hot restart loop; and once a working binary is
/// back, the loop ends by itself.
#[test]
fn a_binary_that_cannot_run_is_retried_slowly_and_recovers() {
    if !have_user_manager() {
        return;
    }
    let home = TempHome::new();
    let exe = home.scratch("gatewarden", "");
    std::fs::copy(bin(), &exe).unwrap();
    let u = Unit::install_as(home, exe.to_str().unwrap(), Some(LOOPBACK), &[]);
    let unit_text = std::fs::read_to_string(u.path()).unwrap();
    if !unit_text.contains("crash-backoff") {
        assert!(unit_text.contains("RestartSteps="), "{unit_text}");
        eprintln!("systemd >= 254: RestartSteps= brakes the loop; no helper to lose");
        return;
    }
    assert!(unit_text.contains("RestartSec=0s\n"), "{unit_text}");
    let old = u.wait_running(0, READY)["pid"].as_u64().unwrap() as u32;
    let n0: u32 = u.prop("NRestarts").parse().unwrap();
    // Broken in place (a new inode: the running gateway keeps its own).
    let swap = |from: &std::path::Path| {
        let tmp = exe.with_extension("new");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, &exe).unwrap();
    };
    let broken = u.home.scratch("broken", ".sh");
    std::fs::write(&broken, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    swap(&broken);
    send_signal(old, sig::SIGKILL).unwrap();
    // Without the fallback this is hundreds of restarts a second.
    let restarts = || u.prop("NRestarts").parse::<u32>().unwrap_or(u32::MAX).saturating_sub(n0);
    assert_eq!(holds_for(Duration::from_secs(2), || restarts() == 0), Ok(()), "{:?}", u.show());
    swap(std::path::Path::new(bin()));
    let back = u.wait_running(old, Duration::from_secs(30));
    assert!(restarts() <= 3, "{} restarts: {:?}", restarts(), u.show());
    assert_eq!(back["state"], "running");
}

/// Issue 27 §3: a secret named by `*_file` reaches the gateway systemd starts through its
/// credentials (`LoadCredential=` in the generated unit → `$CREDENTIALS_DIRECTORY`), and a
/// restart reads it afresh. The file itself is readable by others, which the gateway refuses to
/// read: only systemd's private copy can have delivered it; `check` says the unit loads it.
#[test]
fn a_file_secret_reaches_the_unit_as_a_systemd_credential() {
    use gatewarden_testkit::llmfake::{FakeLlm, Reply};
    use std::os::unix::fs::PermissionsExt;
    if !have_user_manager() {
        return;
    }
    let llm = FakeLlm::start(Reply::text("ok")).unwrap();
    let home = TempHome::new();
    let key_file = home.scratch("openai", "key");
    let put = |key: &str| {
        std::fs::write(&key_file, format!("{key}\n")).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    };
    let first = format!("sk-credential-{}-1", std::process::id());
    put(&first);
    let config = format!(
        "{LOOPBACK}[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_file = \"{}\"\n",
        llm.base_url(),
        key_file.display()
    );
    let u = Unit::install_as(home, bin(), Some(&config), &[]);
    let unit_text = std::fs::read_to_string(u.path()).unwrap();
    let loads = format!(":{}", key_file.display());
    assert!(
        unit_text.lines().any(|l| l.starts_with("LoadCredential=gatewarden.openai") && l.ends_with(&loads)),
        "no LoadCredential= for the key file:\n{unit_text}"
    );
    let st = u.wait_running(0, READY);
    assert_eq!(st["secrets"][0]["source"], json!("systemd-credential"), "{st:#}");
    let key_of = |st: &Value, text: &str| {
        let addr = st["listen"].as_str().unwrap().parse().unwrap();
        let r =
            gatewarden_testkit::api::Api::new(addr).with_timeout(Duration::from_secs(30)).send("c", "u", text).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        llm.asked(text)[0].header("authorization").unwrap_or_default().to_owned()
    };
    assert_eq!(key_of(&st, "first"), format!("Bearer {first}"));
    let check = u.cli(&["check"]);
    assert!(
        check.stdout.lines().any(|l| l.contains("ok   secrets") && l.contains("loaded by the installed systemd unit")),
        "{check:#?}"
    );

    let second = format!("sk-credential-{}-2", std::process::id());
    put(&second);
    let old = st["pid"].as_u64().unwrap() as u32;
    assert_cli(&u.cli(&["restart"]), 0, "restart under systemd");
    let st = u.wait_running(old, READY);
    assert_eq!(key_of(&st, "second"), format!("Bearer {second}"), "systemd loaded it afresh");
    assert!(!u.home.ledger_text().contains(&second) && !check.stdout.contains(&first), "no secret is shown");
}

/// A client calling `POST /v1/messages` at `addr` every 20–30 ms until stopped; what failed.
fn caller(addr: std::net::SocketAddr) -> SteadyStream<(Api, Vec<String>)> {
    let api = Api::new(addr).with_timeout(Duration::from_secs(5));
    steady_stream(27, 20, 10, (api, Vec::new()), |(api, failed), n| {
        match api.send("caller", "u", &format!("call {n}")) {
            Ok(r) if r.status == 200 => {}
            Ok(r) => failed.push(format!("call {n}: HTTP {}", r.status)),
            Err(e) => failed.push(format!("call {n}: {e}")),
        }
    })
}

/// Waits until `calls` has made `more` calls from now on, and at least the 10
/// [`assert_all_served`] asks for. (A fixed 300 ms pause made too few on a loaded machine.)
#[track_caller]
fn calls_after(calls: &SteadyStream<(Api, Vec<String>)>, more: u32) {
    let want = (calls.sent() + more).max(10);
    must_wait_until(READY, &format!("{want} calls made"), || calls.sent() >= want);
}

/// Stops `calls`: at least `min` calls were made and none failed.
#[track_caller]
fn assert_all_served(calls: SteadyStream<(Api, Vec<String>)>, min: u32, what: &str) {
    let (sent, (_, failed)) = calls.stop();
    assert!(sent >= min, "{what}: only {sent} calls made");
    assert!(failed.is_empty(), "{what}: {} of {sent} calls failed: {failed:?}", failed.len());
}

/// What `systemctl --user` needs to reach the manager, pointed at nothing: "Failed to connect
/// to bus" for every call, as after the user manager went away.
const NO_BUS: [(&str, &str); 2] = [
    ("XDG_RUNTIME_DIR", "/nonexistent/gw-no-bus"),
    ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/gw-no-bus/bus"),
];

/// The latest `service_transaction` ledger line.
fn last_transaction(home: &TempHome) -> Value {
    home.events("service_transaction").last().cloned().unwrap_or(Value::Null)
}

/// Issue 27 §4: `service install` with a manager that fails (no bus, so `daemon-reload` fails)
/// is refused before anything is stopped: exit 1 naming the manager's error, no unit written,
/// and the gateway running outside the manager serves a client calling it throughout (0
/// failed requests). Likewise `service uninstall` of a running unit: refused, the unit stays
/// and its gateway serves throughout. (Before: the running gateway was stopped first, then the
/// install failed, and nothing ran.)
#[test]
fn install_and_uninstall_with_a_manager_that_fails_change_nothing_and_the_gateway_serves_throughout() {
    if !have_user_manager() {
        return;
    }
    let sw = Sweeper::new();
    let u = Unit::named(TempHome::new(), Some(LOOPBACK));
    let mut g = builder(&u.home).env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    let calls = caller(addr);
    let env = [NO_BUS[0], NO_BUS[1], (TAG_VAR, sw.tag())];
    let out = cli_with(bin(), u.home.path(), &["service", "install"], &env, Duration::from_secs(60));
    // A few calls after the refusal too: nothing is stopped late.
    calls_after(&calls, 3);
    assert_all_served(calls, 10, "install with a broken manager");
    assert_cli(&out, 1, "service install with a broken manager");
    assert!(out.stderr.contains("Failed to connect to bus") && out.stderr.contains("nothing changed"), "{out:#?}");
    assert!(!u.path().exists(), "a unit was written: {}", u.path().display());
    assert!(g.alive(), "the gateway outside the manager was stopped");
    let st = run_cli(&u.home, &["status", "--json"]).json();
    assert_eq!(st["pid"], json!(g.pid()), "{st:#}");
    let t = last_transaction(&u.home);
    assert_eq!((t["verb"].as_str(), t["outcome"].as_str()), (Some("install"), Some("refused")), "{t}");

    // Installed for real: the gateway is handed over to the unit, which must answer.
    let out = cli_with(bin(), u.home.path(), &["service", "install"], &[(TAG_VAR, sw.tag())], Duration::from_secs(90));
    assert_cli(&out, 0, "service install");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "handed over to the unit");
    let st = u.wait_running(0, READY);
    assert_eq!(st["supervisor"], json!("systemd"), "{st:#}");
    assert_eq!(last_transaction(&u.home)["outcome"], json!("done"));
    let managed: std::net::SocketAddr = st["listen"].as_str().unwrap().parse().unwrap();
    let calls = caller(managed);
    let out = cli_with(bin(), u.home.path(), &["service", "uninstall"], &env, Duration::from_secs(60));
    calls_after(&calls, 3);
    assert_all_served(calls, 10, "uninstall with a broken manager");
    assert_cli(&out, 1, "service uninstall with a broken manager");
    assert!(out.stderr.contains("Failed to connect to bus"), "{out:#?}");
    assert!(u.path().exists(), "the unit was removed");
    assert_eq!(u.main_pid(), st["pid"].as_u64().unwrap() as u32, "{:?}", u.show());
    assert_eq!(u.prop("ActiveState"), "active");
    let _ = sw.sweep();
}

/// Issue 27 §4: a hand-over that fails after the gateway outside the manager was stopped (the
/// manager's start fails) puts back what was there: the operator's own earlier unit, byte for
/// byte and still enabled, and the gateway outside the manager running again at its address;
/// exit 1 with the reason, and the ledger says what was undone.
#[test]
fn a_failed_hand_over_puts_back_the_previous_unit_and_the_gateway_at_its_address() {
    if !have_user_manager() {
        return;
    }
    let sw = Sweeper::new();
    let u = Unit::named(TempHome::new(), Some(LOOPBACK));
    // What was there: a unit installed earlier (not started), edited by the operator since.
    let out = u.cli(&["service", "install", "--no-start"]);
    assert_cli(&out, 0, "service install --no-start");
    let edited = format!("{}# the operator's note\n", std::fs::read_to_string(u.path()).unwrap());
    std::fs::write(u.path(), &edited).unwrap();
    assert!(systemctl(&["daemon-reload"]).status.success());
    let mut g = builder(&u.home).env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    // The manager answers and loads the unit, but its start fails.
    let wrapper = u.home.scratch("bin", "");
    std::fs::create_dir_all(&wrapper).unwrap();
    let real = String::from_utf8(Command::new("sh").args(["-c", "command -v systemctl"]).output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    let script = wrapper.join("systemctl");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" start {} \"*) echo 'Job for {0} failed (injected).' >&2; exit 1;; esac\nexec {real} \"$@\"\n",
            u.name
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", wrapper.display(), std::env::var("PATH").unwrap_or_default());
    let out = cli_with(
        bin(),
        u.home.path(),
        &["service", "install"],
        &[("PATH", &path), (TAG_VAR, sw.tag())],
        Duration::from_secs(120),
    );
    assert_cli(&out, 1, "service install whose start fails");
    assert!(out.stderr.contains("injected") && out.stderr.contains("put back"), "{out:#?}");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "handed over (then put back)");
    assert_eq!(std::fs::read_to_string(u.path()).unwrap(), edited, "the operator's unit was not put back");
    let enabled = systemctl(&["is-enabled", &u.name]);
    assert_eq!(String::from_utf8_lossy(&enabled.stdout).trim(), "enabled");
    assert_eq!(u.prop("ActiveState"), "inactive", "{:?}", u.show());
    // The gateway outside the manager runs again, where it was.
    let st = run_cli(&u.home, &["status", "--json"]);
    assert_cli(&st, 0, "status after the rollback");
    let st = st.json();
    assert_eq!(st["listen"], json!(addr.to_string()), "{st:#}");
    assert_ne!(st["supervisor"], json!("systemd"), "{st:#}");
    assert_eq!(http_get(addr, "/readyz", Duration::from_secs(2)).map(|r| r.status).ok(), Some(200));
    let t = last_transaction(&u.home);
    assert_eq!((t["outcome"].as_str(), t["step"].as_str()), (Some("rolled_back"), Some("start")), "{t}");
    assert_cli(&cli_with(bin(), u.home.path(), &["stop"], &[(TAG_VAR, sw.tag())], Duration::from_secs(60)), 0, "stop");
    let _ = sw.sweep();
}

/// Issue 27 §4: `doctor` reports what a failed install leaves: a unit file systemd never
/// reloaded nor enabled (an error, exit 1; `--fix` loads and enables it, starting nothing),
/// and a manager that does not answer.
/// (Before: "no problems found".)
#[test]
fn doctor_reports_a_half_installed_unit_and_a_manager_that_does_not_answer() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::named(TempHome::new(), Some(LOOPBACK));
    let text = run_cli(&u.home, &["service", "install", "--print"]).stdout;
    std::fs::create_dir_all(config_dir()).unwrap();
    // What the old install left when `daemon-reload` failed: the file, nothing else.
    std::fs::write(u.path(), &text).unwrap();
    let ids = |out: &CliOutput| -> Vec<String> {
        out.json()["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap_or("").to_owned()).collect()
    };
    let out = run_cli(&u.home, &["doctor", "--json"]);
    assert_cli(&out, 1, "doctor on a half-installed unit");
    // systemd 252 loads a unit file on demand: what is missing is the enablement.
    assert!(ids(&out).iter().any(|i| i.starts_with("definition-not-")), "{}", out.stdout);
    let out = cli_env(bin(), u.home.path(), &["doctor", "--json"], &NO_BUS);
    assert_cli(&out, 1, "doctor with a manager that does not answer");
    assert!(ids(&out).contains(&"manager-unreachable".to_owned()), "{}", out.stdout);
    let out = run_cli(&u.home, &["doctor", "--fix"]);
    assert_cli(&out, 0, "doctor --fix");
    assert_eq!(u.prop("ActiveState"), "inactive", "--fix starts nothing: {:?}", u.show());
    let enabled = systemctl(&["is-enabled", &u.name]);
    assert_eq!(String::from_utf8_lossy(&enabled.stdout).trim(), "enabled");
    let out = run_cli(&u.home, &["doctor", "--json"]);
    assert!(!ids(&out).iter().any(|i| i.starts_with("definition-not")), "{}", out.stdout);
}

/// Restores the manager's environment on drop (`set-environment` is manager-wide: kept for as
/// short a time as the test needs).
struct ManagerEnv(&'static str);

impl ManagerEnv {
    fn set(name: &'static str, value: &str) -> ManagerEnv {
        assert!(systemctl(&["set-environment", &format!("{name}={value}")]).status.success());
        ManagerEnv(name)
    }
}

impl Drop for ManagerEnv {
    fn drop(&mut self) {
        let _ = systemctl(&["unset-environment", self.0]);
    }
}

/// Issue 27 §7: with `GATEWARDEN_SUPERVISOR=none` set manager-wide (`systemctl --user
/// set-environment`), the `Type=notify` unit still reaches `active`: the unit declares its
/// supervisor itself. (Before: the gateway believed it had none, never sent READY=1, the unit
/// hung in `activating` and `service install` blocked.) The variable is manager-wide, so every
/// unit started meanwhile sees it: it is set for the install alone, which a hang ends at 20 s.
#[test]
fn a_manager_wide_supervisor_none_cannot_hang_the_unit() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::named(TempHome::new(), Some(LOOPBACK));
    let sw = Sweeper::new();
    let env = ManagerEnv::set("GATEWARDEN_SUPERVISOR", "none");
    let install = work_common::cli_bg(&u.home, &sw, &["service", "install"], Duration::from_secs(60));
    let started = wait_until(Duration::from_secs(20), || install.is_finished());
    drop(env);
    assert!(started, "service install hangs under a manager-wide GATEWARDEN_SUPERVISOR=none: {:?}", u.show());
    let out = install.join().expect("the install's thread");
    assert_cli(&out, 0, "service install under a manager-wide GATEWARDEN_SUPERVISOR=none");
    let st = u.wait_running(0, READY);
    assert_eq!(st["supervisor"], json!("systemd"), "{st:#}");
    assert_eq!(u.prop("ActiveState"), "active");
}

/// Issue 27 §1 under a real systemd: `gatewarden restart` and SIGUSR1 with a config.toml that
/// does not load are refused before anything stops (the route is the manager's exit 75, so a
/// preflight child of the binary answers first): exit 78 naming the file, line and key, the
/// same MainPID and no restart counted, `restart_refused` in the ledger, and a client calling
/// throughout answered every time by the same incarnation.
#[test]
fn a_restart_whose_config_does_not_load_is_refused_under_systemd() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let first = u.wait_running(0, READY);
    let (pid, inc) = (first["pid"].as_u64().unwrap() as u32, first["incarnation"].as_str().unwrap().to_owned());
    let n0 = u.prop("NRestarts");
    let addr = first["listen"].as_str().unwrap().parse().unwrap();
    let caller = gatewarden_testkit::api::Caller::start(gatewarden_testkit::api::Api::new(addr));
    u.home.write("config.toml", format!("{LOOPBACK}bogus_key = 1\n"));

    let out = u.cli(&["restart", "--timeout", "30"]);
    assert_cli(&out, 78, "restart under systemd with a config that does not load");
    assert!(out.stderr.contains("config.toml:2: unknown key 'bogus_key'"), "{out:#?}");
    send_signal(pid, sig::SIGUSR1).unwrap();
    let refused = {
        let mut r = Vec::new();
        must_wait_until(READY, "two refusals", || {
            r = u.home.events("restart_refused");
            r.len() == 2
        });
        r
    };
    assert_eq!(
        (refused[0]["requester"]["channel"].as_str(), refused[1]["requester"]["channel"].as_str()),
        (Some("cli"), Some("signal"))
    );
    assert!(refused.iter().all(|r| r["reason"].as_str().unwrap_or_default().contains("bogus_key")), "{refused:?}");
    caller.finish().assert_only(&inc, "two refused restarts under systemd");
    let s = u.show();
    assert_eq!(
        (s["MainPID"].clone(), s["NRestarts"].clone(), s["ActiveState"].as_str()),
        (pid.to_string(), n0, "active"),
        "{s:?}"
    );
    for e in ["drained", "exited"] {
        assert!(u.home.events(e).is_empty(), "{e}:\n{}", u.home.ledger_text());
    }
}

/// Belt and braces under systemd: the config passed the preflight, then was broken while the
/// old gateway drained, so the gateway systemd launched next exits 78 and the unit stays down.
/// `restart` says why (not only "no gateway holds the lock"), `status` and `doctor` too, and
/// the recovery it prints works once the config is fixed.
#[test]
fn a_config_broken_during_the_drain_is_named_by_restart_status_and_doctor() {
    if !have_user_manager() {
        return;
    }
    let gate = std::env::temp_dir().join(format!("gw-refused-gate-{}", std::process::id()));
    let _ = std::fs::remove_file(&gate);
    let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done; cat", gate.display());
    let good = exec_config(60, &script);
    let u = Unit::install(Some(&good), &["--restart-sec-ms", "100"]);
    u.wait_running(0, READY);
    start_long_run(&u);
    let home = u.home.path().to_owned();
    let restart = std::thread::spawn(move || {
        cli_with(bin(), &home, &["restart", "--timeout", "20"], &[], Duration::from_secs(90))
    });
    must_wait_until(READY, "the drain", || u.home.state().as_deref() == Some("draining"));
    u.home.write("config.toml", format!("{good}bogus_key = 1\n"));
    std::fs::write(&gate, b"").unwrap();

    let out = restart.join().unwrap();
    let _ = std::fs::remove_file(&gate);
    assert_cli(&out, 1, "restart whose next incarnation cannot start");
    assert!(out.stderr.contains("the new gateway could not start") && out.stderr.contains("bogus_key"), "{out:#?}");
    let home = u.home.path().display().to_string();
    let recover = format!("gatewarden --home {home} start");
    assert!(out.stderr.contains(&recover), "{out:#?}");

    let st = u.cli(&["status"]);
    assert_cli(&st, 3, "status");
    assert!(st.stdout.contains("bogus_key") && st.stdout.contains("78"), "{st:#?}");
    let doc = u.cli(&["doctor"]);
    assert_cli(&doc, 1, "doctor");
    assert!(doc.stdout.contains("bogus_key"), "{doc:#?}");

    u.home.write("config.toml", &good);
    assert_cli(&u.cli(&["start"]), 0, "the printed recovery, once the config is fixed");
    u.wait_running(0, READY);
}

/// Issue 30, item 1 under a real systemd user manager: `stop` has recorded `stopped` but is slow
/// to reach the unit (SIGSTOPped right after its record), and a `start` comes. The start waits
/// for that stop, then starts the unit again: it exits 0 with the unit active and its gateway
/// running, and the desired state says `run`. (Before: "already running" of the gateway the
/// stop then ended: unit `inactive`, desired `run`.)
#[test]
fn start_right_after_a_stop_waits_for_it_and_starts_the_unit() {
    if !have_user_manager() {
        return;
    }
    let u = Unit::install(Some(LOOPBACK), &["--restart-sec-ms", "100"]);
    let first = u.wait_running(0, READY)["pid"].as_u64().unwrap() as u32;
    let (home, p) = (u.home.path().to_path_buf(), u.home.path().to_path_buf());
    let stop = std::thread::spawn(move || cli_with(bin(), &home, &["stop"], &[], Duration::from_secs(60)));
    let stopper = hold_recorded_stop(&u.home);
    let start = std::thread::spawn(move || cli_with(bin(), &p, &["start"], &[], Duration::from_secs(60)));
    wait_desired(&u.home, "taken over by the start", |d| d["want"] == json!("run"));
    let early = wait_until(Duration::from_secs(2), || start.is_finished());
    send_signal(stopper, sig::SIGCONT).unwrap();
    let (stop, start) = (stop.join().unwrap(), start.join().unwrap());
    assert!(!early, "start answered while the stop was still under way: {start:#?}");
    assert_cli(&stop, 0, "stop");
    assert_cli(&start, 0, "start");
    assert!(start.stdout.contains("via systemd"), "{start:#?}");
    let now = u.wait_running(first, READY);
    assert_eq!(u.prop("ActiveState"), "active");
    assert_eq!(u.home.read_json("desired_state.json").unwrap()["want"], json!("run"));
    assert_eq!(holds_for(Duration::from_secs(1), || u.prop("ActiveState") == "active"), Ok(()), "{now}");
}
