//! `gatewarden --hermes-home DIR restart` never stops what it cannot start again (issue 22
//! item 4): the command is resolved before anything is stopped, and by default it is exactly
//! what ran (hermes's record of its argv), not whatever `hermes` is on `PATH`.
//!
//! The gateway here is a small stand-in for `hermes gateway run` that keeps hermes 0.19's
//! on-disk contract (crates/hermes/README.md): it takes `gateway.lock` once, writes
//! `gateway.pid` (`pid`, `kind`, `argv` = `sys.argv`, `start_time`) and `gateway_state.json`
//! `running`, and on the planned-stop marker unlinks it, records `stopped` and exits 0. The
//! real package is covered by hermes_cli.rs; this needs only python3.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use gatewarden_testkit::{pid_alive, unavailable};
use serde_json::Value;

const FAKE: &str = r#"
import fcntl, json, os, sys, time
home = os.environ["HERMES_HOME"]
lock = open(os.path.join(home, "gateway.lock"), "a+")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(1)
start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
rec = {"pid": os.getpid(), "kind": "hermes-gateway", "argv": sys.argv, "start_time": start}
def write(name, obj):
    tmp = os.path.join(home, name + ".tmp")
    json.dump(obj, open(tmp, "w")); os.replace(tmp, os.path.join(home, name))
write("gateway.pid", rec)
write("gateway_state.json", dict(rec, gateway_state="running"))
marker = os.path.join(home, ".gateway-planned-stop.json")
while True:
    if os.path.exists(marker):
        os.unlink(marker)
        write("gateway_state.json", dict(rec, gateway_state="stopped"))
        os.unlink(os.path.join(home, "gateway.pid"))
        sys.exit(0)
    time.sleep(0.05)
"#;

struct Lab {
    dir: tempfile::TempDir,
    started: Vec<u32>,
}

impl Lab {
    fn new() -> Option<Lab> {
        let python =
            ["/usr/bin/python3", "/usr/local/bin/python3"].into_iter().map(PathBuf::from).find(|p| p.is_file());
        let Some(python) = python else { return unavailable("python3", "no /usr/bin/python3") };
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(dir.path().join("venv/bin")).unwrap();
        let script = dir.path().join("venv/bin/hermes");
        std::fs::write(&script, format!("#!{}\n{FAKE}", python.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(Lab { dir, started: Vec::new() })
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn script(&self) -> PathBuf {
        self.dir.path().join("venv/bin/hermes")
    }

    /// `gatewarden --hermes-home HOME <args>`; `hermes` given explicitly or not at all, and
    /// never on `PATH`.
    fn cli(&self, args: &[&str], explicit: Option<&Path>) -> (Option<i32>, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gatewarden"));
        cmd.arg("--hermes-home").arg(self.home()).args(args);
        for k in gatewarden_testkit::SCRUBBED_ENV.iter().chain(gatewarden_testkit::hermes::SCRUB) {
            cmd.env_remove(k);
        }
        cmd.env_remove("GATEWARDEN_HERMES").env("PATH", "/usr/bin:/bin").stdin(Stdio::null());
        if let Some(p) = explicit {
            cmd.env("GATEWARDEN_HERMES", p);
        }
        let out = cmd.output().expect("gatewarden");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    }

    fn holder(&self) -> Option<u32> {
        let v: Value = serde_json::from_slice(&std::fs::read(self.home().join("gateway.pid")).ok()?).ok()?;
        let pid = u32::try_from(v["pid"].as_u64()?).ok()?;
        pid_alive(pid).then_some(pid)
    }

    fn start(&mut self) -> u32 {
        let (code, text) = self.cli(&["start", "--timeout", "20"], Some(&self.script()));
        assert_eq!(code, Some(0), "{text}");
        let pid = self.holder().expect("a running stand-in");
        self.started.push(pid);
        pid
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(p) = self.holder() {
            self.started.push(p);
        }
        for p in &self.started {
            // The stand-ins lead their own sessions (started detached).
            // SAFETY: plain kill(2) of a process group this test started.
            unsafe { libc::kill(-(*p as libc::pid_t), libc::SIGKILL) };
        }
    }
}

#[test]
fn restart_runs_what_ran_when_hermes_is_not_on_path() {
    let Some(mut lab) = Lab::new() else { return };
    let old = lab.start();
    let t0 = Instant::now();
    let (code, text) = lab.cli(&["restart", "--timeout", "20"], None);
    assert_eq!(code, Some(0), "restart without `hermes` on PATH: {text}");
    let new = lab.holder().expect("running again");
    lab.started.push(new);
    assert_ne!(new, old, "{text}");
    assert!(!pid_alive(old));
    eprintln!("restarted {old} -> {new} in {:?}: {text}", t0.elapsed());
    let ledger = std::fs::read_to_string(lab.home().join("gatewarden/actions.jsonl")).unwrap();
    assert!(ledger.contains(r#""event":"restart.launch""#) && ledger.contains(r#""source":"record""#), "{ledger}");
}

#[test]
fn restart_never_stops_what_it_cannot_start_again() {
    let Some(mut lab) = Lab::new() else { return };
    let old = lab.start();
    // What ran is gone (a venv removed under a running gateway), and nothing is on PATH.
    let moved = lab.dir.path().join("elsewhere");
    std::fs::rename(lab.script(), &moved).unwrap();
    let (code, text) = lab.cli(&["restart", "--timeout", "20"], None);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("was not stopped") && text.contains("venv/bin/hermes"), "{text}");
    assert_eq!(lab.holder(), Some(old), "the gateway was stopped with nothing to start: {text}");
    // An explicit hermes that does not exist is refused the same way.
    let (code, text) = lab.cli(&["restart", "--timeout", "20"], Some(Path::new("/nonexistent/hermes")));
    assert_eq!((code, lab.holder()), (Some(1), Some(old)), "{text}");
    let ledger = std::fs::read_to_string(lab.home().join("gatewarden/actions.jsonl")).unwrap();
    assert!(ledger.contains(r#""event":"restart.refused""#), "{ledger}");
}
