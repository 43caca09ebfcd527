use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A live, unrelated process that logs every catchable signal it receives (SIGHUP, SIGINT,
/// SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2) — the "recycled PID" of class C. Killed on drop.
pub struct Decoy {
    child: Child,
    log: PathBuf,
}

impl Decoy {
    /// Path of the `gw-decoy` executable. Order: `$GW_DECOY_BIN` at run time, the copy that
    /// testkit's build.rs compiled into its OUT_DIR, then `target/<profile>/gw-decoy` next to
    /// the running test executable (`cargo build -p gatewarden-testkit --bins`).
    pub fn bin() -> PathBuf {
        if let Some(p) = std::env::var_os("GW_DECOY_BIN").filter(|p| !p.is_empty()) {
            return p.into();
        }
        let built = env!("GW_DECOY_BIN");
        if !built.is_empty() && Path::new(built).exists() {
            return built.into();
        }
        if let Ok(exe) = std::env::current_exe() {
            // target/<profile>/deps/<test-exe> -> target/<profile>/gw-decoy
            for dir in exe.ancestors().skip(1).take(2) {
                let p = dir.join("gw-decoy");
                if p.exists() {
                    return p;
                }
            }
        }
        panic!(
            "gw-decoy not found: build.rs did not produce it and no target/<profile>/gw-decoy; \
             run `cargo build -p gatewarden-testkit --bins` or set GW_DECOY_BIN"
        );
    }

    /// Spawns a decoy with its signal log in `dir` and waits (5 s) until its handlers are
    /// installed.
    pub fn spawn(dir: &Path) -> Decoy {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("decoy-{}-{n}.signals", std::process::id()));
        let ready = dir.join(format!("decoy-{}-{n}.ready", std::process::id()));
        std::fs::write(&log, b"").expect("create decoy log");
        let mut child = Command::new(Self::bin())
            .arg(&log)
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn gw-decoy");
        let ok =
            crate::wait_until(Duration::from_secs(5), || ready.exists() || child.try_wait().ok().flatten().is_some());
        if !ok || !ready.exists() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gw-decoy did not become ready");
        }
        Decoy { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn start_time(&self) -> u64 {
        crate::proc_start_time(self.pid()).expect("decoy start time")
    }
    /// Still running (not exited, not a zombie)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    /// Names of the signals received so far, in order (`["SIGTERM", ...]`).
    pub fn signals(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }
    /// Asserts the decoy is alive and received nothing.
    #[track_caller]
    pub fn assert_untouched(&mut self, context: &str) {
        let sigs = self.signals();
        assert!(sigs.is_empty(), "{context}: decoy pid {} received {sigs:?}", self.pid());
        assert!(self.alive(), "{context}: decoy pid {} is no longer alive", self.pid());
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoy_logs_signals_and_survives_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Decoy::spawn(dir.path());
        assert!(d.signals().is_empty());
        for s in [libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGUSR2] {
            // each signal is logged before the next is sent, so order is deterministic
            let n = d.signals().len();
            crate::send_signal(d.pid(), s).unwrap();
            assert!(crate::wait_until(Duration::from_secs(5), || d.signals().len() == n + 1));
        }
        assert_eq!(d.signals(), ["SIGTERM", "SIGUSR1", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR2"]);
        assert!(d.alive());
        assert!(crate::proc_start_time(d.pid()).is_some());
    }
}
