//! The `gatewarden --hermes-home DIR …` verbs end to end: the real binary against the real
//! hermes-agent package (`scripts/hermes-venv`), and the unit under the REAL systemd user
//! manager (`eval "$(scripts/systemd-user)"`).
//!
//! Every hermes runs hermetically: `HERMES_HOME`, `HOME` and `XDG_STATE_HOME` in a temp dir,
//! `TIRITH_ENABLED=false` (no download on first start), no inherited supervisor variables.
//! The CLI starts hermes in its own session (own process group); the [`Lab`] drop guard kills
//! every group it saw. Under `CI` a missing venv or user manager fails the test.
#![cfg(target_os = "linux")]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gatewarden_testkit::have_user_manager;
use gatewarden_testkit::hermes::{SCRUB, venv};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gatewarden")
}

/// Variables neither the CLI nor its hermes may inherit from the test's environment: the
/// hermes ones, and gatewarden's own.
const SCRUB_MORE: &[&str] = &[
    "GATEWARDEN_HOME",
    "GATEWARDEN_SUPERVISOR",
    // Unit directories follow the lab's HOME unless a test points at the real manager's.
    "XDG_CONFIG_HOME",
];

struct Lab {
    dir: tempfile::TempDir,
    home: PathBuf,
    hermes: PathBuf,
    /// Process groups to kill on drop (hermes sessions, supervise).
    groups: Mutex<BTreeSet<u32>>,
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

impl Lab {
    fn new() -> Option<Lab> {
        let venv = venv()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        for d in [home.clone(), dir.path().join("user"), dir.path().join("xdg")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        Some(Lab { dir, home, hermes: venv.join("bin/hermes"), groups: Mutex::new(BTreeSet::new()) })
    }

    fn user_home(&self) -> PathBuf {
        self.dir.path().join("user")
    }

    /// `gatewarden --hermes-home HOME <args>`, hermetic.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.arg("--hermes-home").arg(&self.home).args(args);
        self.hermetic(&mut cmd);
        cmd
    }

    fn hermetic(&self, cmd: &mut Command) {
        for k in SCRUB.iter().chain(SCRUB_MORE) {
            cmd.env_remove(k);
        }
        cmd.env("HOME", self.user_home())
            .env("XDG_STATE_HOME", self.dir.path().join("xdg"))
            .env("TIRITH_ENABLED", "false")
            .env("HERMES_GATEWAY_MAX_STARTS", "0")
            .env("GATEWARDEN_HERMES", &self.hermes)
            .stdin(Stdio::null());
    }

    fn cli(&self, args: &[&str]) -> Out {
        let cmd = self.command(args);
        self.finish(cmd, Duration::from_secs(60))
    }

    fn finish(&self, mut cmd: Command, timeout: Duration) -> Out {
        let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn gatewarden");
        let out = wait_output(child, timeout);
        let o = Out {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        // Whatever hermes now holds the home is ours to kill at the end.
        if let Some(pid) = self.holder() {
            self.track(pid);
        }
        o
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> Out {
        let o = self.cli(args);
        assert_eq!(o.code, Some(0), "{args:?}: stdout {}\nstderr {}", o.stdout, o.stderr);
        o
    }

    fn status(&self) -> (Option<i32>, Value) {
        let o = self.cli(&["status", "--json"]);
        (o.code, o.json())
    }

    /// The lock holder's pid, read by our own status (read-only).
    fn holder(&self) -> Option<u32> {
        let mut cmd = Command::new(bin());
        cmd.arg("--hermes-home").arg(&self.home).args(["status", "--json"]);
        self.hermetic(&mut cmd);
        let out = cmd.output().ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["pid"].as_u64().and_then(|p| u32::try_from(p).ok())
    }

    fn track(&self, pgid: u32) {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).insert(pgid);
    }

    fn ledger(&self) -> Vec<Value> {
        std::fs::read_to_string(self.home.join("gatewarden/actions.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// hermes's `gateway_state.json`.
    fn hermes_state(&self) -> Value {
        std::fs::read(self.home.join("gateway_state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
    }

    /// hermes's lifecycle files that must never be deleted by us.
    #[track_caller]
    fn assert_hermes_files_kept(&self) {
        for f in ["gateway.lock", "gateway_state.json"] {
            assert!(self.home.join(f).exists(), "{f} was deleted");
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for g in self.groups.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: plain syscall; a negative pid addresses a group this test's CLI created.
            unsafe {
                libc::kill(-(*g as i32), libc::SIGKILL);
            }
        }
    }
}

fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("output"),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!("gatewarden did not exit within {timeout:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
}

/// How long a hermes gateway may take to come up under supervise: a slow machine's bound, not
/// a product one (the wait itself is for hermes saying `running`). hermes-agent's Python
/// start-up took over 30 s with both cores loaded by other tests and a build.
const HERMES_UP: Duration = Duration::from_secs(60);

#[track_caller]
fn must(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_of(v: &Value) -> u32 {
    v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).unwrap_or_else(|| panic!("no pid in {v}"))
}

fn send(pid: u32, sig: i32) {
    // SAFETY: plain syscall on a pid this test started (through the CLI).
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// status → start → status → restart (stop + start: nothing supervises it) → stop → status,
/// each through the binary, with the native exit codes; hermes's files are never deleted.
#[test]
fn status_start_restart_stop_through_the_binary() {
    let Some(lab) = Lab::new() else { return };
    let (code, v) = lab.status();
    assert_eq!((code, v["phase"].as_str()), (Some(3), Some("not-running")), "{v}");

    let out = lab.ok(&["start", "--timeout", "30"]);
    assert!(out.stdout.contains("ready"), "{}", out.stdout);
    let (code, v) = lab.status();
    assert_eq!(code, Some(0), "{v}");
    assert_eq!((v["kind"].as_str(), v["phase"].as_str()), (Some("hermes-gateway"), Some("running")), "{v}");
    assert_eq!(v["gateway_state"], "running");
    assert_eq!(v["supervisor"], "none");
    assert!(v["elapsed_ms"].as_f64().is_some_and(|ms| ms < 50.0), "status took {}", v["elapsed_ms"]);
    let first = pid_of(&v);
    // A second start is a no-op on the running gateway.
    lab.ok(&["start"]);
    assert_eq!(pid_of(&lab.status().1), first);

    // `--home` on a hermes home is recognised and said so.
    let mut cmd = Command::new(bin());
    cmd.arg("--home").arg(&lab.home).args(["status", "--json"]);
    lab.hermetic(&mut cmd);
    let rec = lab.finish(cmd, Duration::from_secs(30));
    assert_eq!(rec.code, Some(0), "{}", rec.stderr);
    assert!(rec.stderr.contains("is a hermes-agent home"), "{}", rec.stderr);
    assert_eq!(pid_of(&rec.json()), first);

    let out = lab.ok(&["restart", "--timeout", "30"]);
    assert!(out.stdout.contains("stop-start"), "unsupervised: no SIGUSR1, stop then start: {}", out.stdout);
    let (code, v) = lab.status();
    let second = pid_of(&v);
    assert_eq!((code, v["phase"].as_str()), (Some(0), Some("running")), "{v}");
    assert_ne!(second, first, "restart must give a new process");
    assert!(lab.ledger().iter().any(|e| e["event"] == "restart.done" && e["path"] == "stop-start"));

    for round in 0..3 {
        if round > 0 {
            lab.ok(&["start"]);
        }
        let t = Instant::now();
        let out = lab.ok(&["stop", "--timeout", "20"]);
        assert!(out.stdout.contains("hermes recorded: stopped"), "round {round}: {}", out.stdout);
        assert!(t.elapsed() < Duration::from_secs(10), "round {round}: stop took {:?}", t.elapsed());
        assert_eq!(lab.hermes_state()["gateway_state"], "stopped");
        assert_eq!(lab.status().0, Some(3));
        lab.assert_hermes_files_kept();
    }
    // Stopping nothing is fine.
    assert!(lab.ok(&["stop"]).stdout.contains("no hermes gateway running"));

    // history merges hermes's exit diagnostics with our ledger; doctor finds nothing.
    let h = lab.ok(&["history", "-n", "200", "--json"]);
    let events: Vec<Value> = h.stdout.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    assert!(events.iter().any(|e| e["source"] == "exit-diag" && e["event"] == "gateway.exit_clean"), "{}", h.stdout);
    assert!(events.iter().any(|e| e["source"] == "gatewarden" && e["event"] == "stop.done"), "{}", h.stdout);
    let d = lab.ok(&["doctor", "--json"]);
    assert_eq!(d.json()["findings"], serde_json::json!([]), "{}", d.stdout);
    assert!(lab.ok(&["logs", "-n", "5"]).stdout.contains("gateway.run"), "logs shows hermes's gateway.log");
    // Verbs that have no meaning for hermes say so instead of acting on a native home.
    assert_eq!(lab.cli(&["send", "hi"]).code, Some(1));
    assert_eq!(lab.cli(&["start", "--listen", "127.0.0.1:0"]).code, Some(1));
}

/// `supervise` through the CLI: a real exit 75 (SIGUSR1 to hermes) is respawned at once, and
/// planned restarts never trip the crash-loop brake;
/// `restart` proves the supervisor and takes the SIGUSR1 path; SIGTERM to supervise is a
/// planned stop (hermes exits 0, records `stopped`; supervise exits 0).
#[test]
fn supervise_respawns_a_real_exit_75_and_stops_planned() {
    let Some(lab) = Lab::new() else { return };
    // A brake of one restart: planned restarts (75) must not count, or the second parks.
    let mut cmd = lab.command(&["supervise", "--brake-restarts", "1", "--hermes"]);
    cmd.arg(&lab.hermes);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut sup = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn supervise");
    lab.track(sup.id());
    let label = format!("gatewarden:{}", sup.id());
    let mut first = 0;
    must(HERMES_UP, "hermes running under supervise", || {
        let (code, v) = lab.status();
        first = v["pid"].as_u64().unwrap_or(0) as u32;
        code == Some(0) && v["phase"] == "running" && v["supervisor"] == label.as_str()
    });
    lab.track(first);

    // A real planned restart: hermes drains and exits 75; supervise respawns it at once.
    send(first, libc::SIGUSR1);
    let mut second = 0;
    must(HERMES_UP, "a new hermes after exit 75", || {
        let (code, v) = lab.status();
        second = v["pid"].as_u64().unwrap_or(0) as u32;
        code == Some(0) && v["phase"] == "running" && second != first
    });
    lab.track(second);
    // "At once" is supervise's own doing: its next ledger line after the exit is the respawn,
    // close behind. (Timed from the signal instead, it was hermes's drain and Python start-up
    // that took over 10 s on a loaded CI machine, not supervise.)
    let ledger = lab.ledger();
    let at = ledger.iter().rposition(|e| e["event"] == "supervise.exit").expect("a supervise.exit ledger line");
    let last = &ledger[at];
    assert_eq!(last["pid"], serde_json::json!(first), "{last}");
    assert_eq!(last["facts"]["exit"], serde_json::json!({"kind": "code", "value": 75}), "{last}");
    assert_eq!(last["action"]["action"], "restart-now", "{last}");
    let next = ledger[at + 1..].iter().find(|e| e["event"].as_str().is_some_and(|n| n.starts_with("supervise.")));
    let next = next.unwrap_or_else(|| panic!("nothing supervise did after the exit: {ledger:?}"));
    assert_eq!(
        (&next["event"], &next["pid"]),
        (&serde_json::json!("supervise.spawned"), &serde_json::json!(second)),
        "{next}"
    );
    let ts = |e: &Value| gatewarden_lifecycle::timefmt::parse(e["ts"].as_str().unwrap_or_default()).expect("ts");
    let gap = ts(next).duration_since(ts(last)).unwrap_or_default();
    assert!(gap < Duration::from_secs(2), "exit 75 respawned {gap:?} after the exit was recorded");

    // `restart` sees the proven supervisor and uses SIGUSR1.
    let out = lab.ok(&["restart", "--timeout", "30"]);
    assert!(out.stdout.contains("sigusr1"), "{}", out.stdout);
    let third = pid_of(&lab.status().1);
    lab.track(third);
    assert!(third != second && third != first);

    // SIGTERM to supervise: marker-first stop, hermes exits 0 `stopped`, supervise exits 0.
    send(sup.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = sup.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "supervise did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = sup.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("staying down"), "{err}");
    assert_eq!(lab.hermes_state()["gateway_state"], "stopped");
    assert_eq!(lab.status().0, Some(3));
    lab.assert_hermes_files_kept();
}

/// `service install` refuses while hermes's own unit for the home is enabled (two managers
/// must never own one gateway) and writes nothing; `--print` shows what it fixes.
#[test]
fn service_install_refuses_beside_an_enabled_hermes_unit() {
    let Some(lab) = Lab::new() else { return };
    let units = lab.user_home().join(".config/systemd/user");
    std::fs::create_dir_all(units.join("default.target.wants")).unwrap();
    let text = format!("[Service]\nEnvironment=\"HERMES_HOME={}\"\nExecStart=/bin/true\n", lab.home.display());
    std::fs::write(units.join("hermes-gateway-test.service"), text).unwrap();
    std::os::unix::fs::symlink(
        units.join("hermes-gateway-test.service"),
        units.join("default.target.wants/hermes-gateway-test.service"),
    )
    .unwrap();
    let before: Vec<_> = std::fs::read_dir(&units).unwrap().flatten().map(|e| e.file_name()).collect();
    let out = lab.cli(&["service", "install", "--no-start"]);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("hermes-gateway-test.service") && out.stderr.contains("--adopt"), "{}", out.stderr);
    let after: Vec<_> = std::fs::read_dir(&units).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(before.len(), after.len(), "nothing installed");
    let st = lab.cli(&["service", "status", "--json"]);
    assert_eq!(st.code, Some(4), "not installed: {}", st.stdout);
    assert_eq!(st.json()["hermes_units"][0]["enabled"], true);

    let p = lab.ok(&["service", "install", "--print"]);
    assert!(p.stdout.contains("# Compared with hermes's generated hermes-gateway unit"), "{}", p.stdout);
    assert!(
        p.stdout.lines().any(|l| l.starts_with("ExecStart=") && l.contains(" supervise --hermes ")),
        "{}",
        p.stdout
    );
    assert!(p.stdout.contains("Type=notify\n"), "{}", p.stdout);
}

// ---- the unit under the real systemd user manager ----

/// The manager's environment is not the lab's: a drop-in makes a unit's hermes hermetic.
fn hermetic_dropin(lab: &Lab, unit: &str) {
    let dropin = real_config_dir().join(format!("systemd/user/{unit}.d"));
    std::fs::create_dir_all(&dropin).unwrap();
    let d = lab.dir.path();
    std::fs::write(
        dropin.join("hermetic.conf"),
        format!(
            "[Service]\nEnvironment=\"HOME={}\" \"XDG_STATE_HOME={}\" TIRITH_ENABLED=false\n",
            d.join("user").display(),
            d.join("xdg").display()
        ),
    )
    .unwrap();
}

fn systemctl(args: &[&str]) -> Output {
    Command::new("systemctl").arg("--user").args(args).output().expect("run systemctl")
}

/// Where the user manager reads units (the test's real config dir, not the lab's `HOME`).
fn real_config_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".config"))
}

/// Our unit for the lab's home, removed (stopped, disabled, deleted) on drop; `hermes_unit`
/// is a hermes-generated unit for the same home, removed too.
struct Unit<'a> {
    lab: &'a Lab,
    name: String,
    hermes_unit: Option<String>,
}

impl Unit<'_> {
    fn show(&self, prop: &str) -> String {
        let o = systemctl(&["show", "-p", prop, "--value", &self.name]);
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    fn cli(&self, args: &[&str]) -> Out {
        let mut cmd = self.lab.command(args);
        cmd.env("XDG_CONFIG_HOME", real_config_dir());
        self.lab.finish(cmd, Duration::from_secs(120))
    }
}

impl Drop for Unit<'_> {
    fn drop(&mut self) {
        let _ = self.cli(&["service", "uninstall"]);
        let dir = real_config_dir().join("systemd/user");
        for name in std::iter::once(&self.name).chain(self.hermes_unit.as_ref()) {
            let _ = systemctl(&["disable", "--now", name]);
            let _ = std::fs::remove_file(dir.join(name));
            let _ = std::fs::remove_dir_all(dir.join(format!("{name}.d")));
            let _ = systemctl(&["reset-failed", name]);
        }
        let _ = systemctl(&["daemon-reload"]);
        let _ = systemctl(&["reset-failed", &self.name]);
    }
}

/// The unit runs `gatewarden supervise` under the real manager: ready only when hermes runs
/// (Type=notify), a planned restart is revived at once by supervise (no RestartSec, no
/// systemd restart), and `systemctl --user stop` ends with Result=success and hermes
/// `stopped`.
#[test]
fn unit_under_the_real_user_manager() {
    let Some(lab) = Lab::new() else { return };
    if !have_user_manager() {
        return;
    }
    let name = lab.cli(&["service", "status", "--json"]).json()["unit"].as_str().expect("unit name").to_owned();
    let unit = Unit { lab: &lab, name, hermes_unit: None };
    hermetic_dropin(&lab, &unit.name);
    let hermes = lab.hermes.to_string_lossy().into_owned();
    let t = Instant::now();
    let out = unit.cli(&["service", "install", "--hermes", &hermes]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ready under"), "{}", out.stdout);
    eprintln!("install + ready: {:?}", t.elapsed());
    assert_eq!(unit.show("ActiveState"), "active");
    let main: u32 = unit.show("MainPID").parse().expect("MainPID");
    let (code, v) = lab.status();
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["supervisor"], format!("gatewarden:{main}"), "supervise is the unit's main process: {v}");
    let first = pid_of(&v);
    let st = unit.cli(&["service", "status", "--json"]);
    assert_eq!(st.code, Some(0), "{}", st.stdout);

    // A planned restart is revived at once by supervise, not by systemd.
    let t = Instant::now();
    let out = unit.cli(&["restart", "--timeout", "30"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("sigusr1"), "{}", out.stdout);
    let revived = t.elapsed();
    let (_, v) = lab.status();
    assert_ne!(pid_of(&v), first);
    assert!(revived < Duration::from_secs(5), "hermes's own unit waits RestartSec=5; ours took {revived:?}");
    assert_eq!(unit.show("MainPID"), main.to_string(), "supervise itself was not restarted");
    assert_eq!(unit.show("NRestarts"), "0");

    // systemctl stop: SIGTERM to supervise → marker-first stop → hermes exits 0 → success.
    let o = systemctl(&["stop", &unit.name]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(unit.show("Result"), "success");
    assert_eq!(unit.show("ActiveState"), "inactive");
    assert_eq!(lab.hermes_state()["gateway_state"], "stopped");
    assert_eq!(lab.status().0, Some(3));
    lab.assert_hermes_files_kept();
}

/// hermes's own generated unit (`generate_systemd_unit()` of the real package) runs the home:
/// `service install` refuses; `--adopt` disables it, stops its gateway the planned way, stops
/// the unit before its `RestartSec=5` revives it, and installs ours, which then owns hermes.
#[test]
fn adopt_takes_over_from_hermes_own_unit() {
    let Some(lab) = Lab::new() else { return };
    if !have_user_manager() {
        return;
    }
    let name = lab.cli(&["service", "status", "--json"]).json()["unit"].as_str().expect("unit name").to_owned();
    let theirs = format!("hermes-gateway-gwtest-{}.service", std::process::id());
    let unit = Unit { lab: &lab, name, hermes_unit: Some(theirs.clone()) };
    let python = lab.hermes.with_file_name("python");
    let generated = Command::new(&python)
        .args(["-c", "from hermes_cli.gateway import generate_systemd_unit; print(generate_systemd_unit())"])
        .env("HERMES_HOME", &lab.home)
        .env("HOME", lab.user_home())
        .env("TIRITH_ENABLED", "false")
        .output()
        .expect("run the venv's python");
    let text = String::from_utf8_lossy(&generated.stdout).into_owned();
    assert!(text.contains("RestartSec=5") && text.contains("HERMES_HOME="), "{text}");
    let dir = real_config_dir().join("systemd/user");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&theirs), text).unwrap();
    hermetic_dropin(&lab, &theirs);
    assert!(systemctl(&["daemon-reload"]).status.success());
    let o = systemctl(&["enable", "--now", &theirs]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let label = format!("systemd:{theirs}");
    must(Duration::from_secs(30), "hermes running under its own unit", || {
        let (code, v) = lab.status();
        code == Some(0) && v["phase"] == "running" && v["supervisor"] == label.as_str()
    });
    let old = pid_of(&lab.status().1);

    let hermes = lab.hermes.to_string_lossy().into_owned();
    let refused = unit.cli(&["service", "install", "--hermes", &hermes]);
    assert_eq!(refused.code, Some(1), "{}\n{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains(&theirs) && refused.stderr.contains("--adopt"), "{}", refused.stderr);
    assert!(!dir.join(&unit.name).exists(), "nothing installed on refusal");
    assert_eq!(pid_of(&lab.status().1), old, "the refusal left hermes alone");

    let out = unit.cli(&["service", "install", "--adopt", "--hermes", &hermes]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ready under"), "{}", out.stdout);
    let show = |u: &str, p: &str| {
        String::from_utf8_lossy(&systemctl(&["show", "-p", p, "--value", u]).stdout).trim().to_owned()
    };
    // hermes's unit: disabled, stopped, and no restart pending (SubState would be auto-restart).
    assert_eq!(String::from_utf8_lossy(&systemctl(&["is-enabled", &theirs]).stdout).trim(), "disabled");
    assert_eq!((show(&theirs, "ActiveState"), show(&theirs, "SubState")), ("inactive".into(), "dead".into()));
    assert_eq!(show(&unit.name, "ActiveState"), "active");
    let (code, v) = lab.status();
    assert_eq!(code, Some(0), "{v}");
    assert_ne!(pid_of(&v), old);
    assert_eq!(v["supervisor"], format!("gatewarden:{}", show(&unit.name, "MainPID")), "{v}");
    assert!(lab.ledger().iter().any(|e| e["event"] == "service.adopt" && e["hermes_unit"] == theirs.as_str()));
    lab.assert_hermes_files_kept();
}
