use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::TempHome;

/// Exit code of a status (`None` if killed by a signal).
pub fn exit_code(s: ExitStatus) -> Option<i32> {
    s.code()
}

/// Terminating signal of a status (`None` if it exited normally).
pub fn exit_signal(s: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    s.signal()
}

/// Builder for a `gatewarden --home H run --listen 127.0.0.1:0 [...]` process.
pub struct GatewayBuilder {
    bin: PathBuf,
    home: PathBuf,
    log_dir: PathBuf,
    listen: String,
    extra: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    home_via_env: bool,
    host_default: bool,
}

impl GatewayBuilder {
    pub fn new(bin: impl AsRef<Path>, home: &TempHome) -> Self {
        Self {
            bin: bin.as_ref().to_path_buf(),
            home: home.path().to_path_buf(),
            log_dir: home.root().to_path_buf(),
            listen: "127.0.0.1:0".into(),
            extra: Vec::new(),
            env: Vec::new(),
            home_via_env: false,
            host_default: false,
        }
    }
    /// Override the listen address (tests use loopback only).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }
    /// `run --replace`.
    pub fn replace(self) -> Self {
        self.arg("--replace")
    }
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.extra.push(a.into());
        self
    }
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.env.push((k.into(), Some(v.into())));
        self
    }
    /// `GATEWARDEN_SUPERVISOR` override (default `none`).
    pub fn supervisor(self, s: &str) -> Self {
        self.env("GATEWARDEN_SUPERVISOR", s)
    }
    /// The host's real environment, as a user's shell has it: nothing scrubbed, no
    /// `GATEWARDEN_SUPERVISOR` (only `GATEWARDEN_HOME` is removed; the home is `--home`).
    pub fn host_default(mut self) -> Self {
        self.host_default = true;
        self
    }
    /// Remove a variable from the environment.
    pub fn env_remove(mut self, k: impl Into<OsString>) -> Self {
        self.env.push((k.into(), None));
        self
    }
    /// Pass the home as `GATEWARDEN_HOME` instead of `--home`.
    pub fn home_via_env(mut self) -> Self {
        self.home_via_env = true;
        self
    }

    pub fn spawn(self) -> Gateway {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("gateway-{}-{n}", std::process::id());
        let stderr_path = self.log_dir.join(format!("{tag}.stderr"));
        let stdout_path = self.log_dir.join(format!("{tag}.stdout"));
        let mut cmd = Command::new(&self.bin);
        if self.host_default {
            crate::host_env(&mut cmd);
        } else {
            crate::test_env(&mut cmd);
        }
        if self.home_via_env {
            cmd.env("GATEWARDEN_HOME", &self.home);
        } else {
            cmd.arg("--home").arg(&self.home);
        }
        cmd.arg("run").arg("--listen").arg(&self.listen).args(&self.extra);
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).expect("stdout log"))
            .stderr(std::fs::File::create(&stderr_path).expect("stderr log"));
        crate::proc::die_with_test(&mut cmd);
        let spawned_at = Instant::now();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        let pid = child.id();
        Gateway {
            child,
            pid,
            start_time: crate::proc_start_time(pid),
            home: self.home,
            stderr_path,
            stdout_path,
            status: None,
            listen: None,
            spawned_at,
        }
    }
}

/// A spawned gateway process. Killed (SIGKILL) and reaped on drop if still running.
pub struct Gateway {
    child: Child,
    pid: u32,
    start_time: Option<u64>,
    home: PathBuf,
    stderr_path: PathBuf,
    stdout_path: PathBuf,
    status: Option<ExitStatus>,
    listen: Option<SocketAddr>,
    spawned_at: Instant,
}

/// What `wait_ready` observed when the gateway did not become ready.
#[derive(Debug)]
pub enum NotReady {
    Exited(ExitStatus),
    Timeout(String),
}

impl Gateway {
    /// `run --listen 127.0.0.1:0` in `home` with defaults.
    pub fn spawn(bin: impl AsRef<Path>, home: &TempHome) -> Gateway {
        GatewayBuilder::new(bin, home).spawn()
    }
    /// Spawn and wait (10 s) until ready.
    pub fn start_ready(bin: impl AsRef<Path>, home: &TempHome) -> Gateway {
        let mut g = Self::spawn(bin, home);
        g.wait_ready(Duration::from_secs(10));
        g
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
    /// `/proc` start time, read right after spawn (fork time; unchanged by exec).
    pub fn start_time(&self) -> u64 {
        self.start_time.expect("start time of a freshly spawned child")
    }
    pub fn spawned_at(&self) -> Instant {
        self.spawned_at
    }
    /// Listen address, known after `wait_ready`.
    pub fn listen(&self) -> SocketAddr {
        self.listen.expect("listen address is known only after wait_ready")
    }
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Non-blocking: the exit status if the process has exited (reaps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status
    }
    pub fn alive(&mut self) -> bool {
        self.exited().is_none()
    }

    /// One readiness probe: state file names this pid as `running` with a `listen` address,
    /// and `GET /readyz` there answers 200.
    pub fn ready_now(&mut self) -> Option<SocketAddr> {
        let b = std::fs::read(self.home.join("gateway_state.json")).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
        if v.get("pid")?.as_u64()? != self.pid as u64 || v.get("gateway_state")? != "running" {
            return None;
        }
        let addr: SocketAddr = v.get("listen")?.as_str()?.parse().ok()?;
        let r = crate::http_get(addr, "/readyz", Duration::from_millis(1000)).ok()?;
        (r.status == 200).then_some(addr)
    }

    /// Waits until ready (see [`Gateway::ready_now`]); returns early if the process exits.
    pub fn try_wait_ready(&mut self, timeout: Duration) -> Result<SocketAddr, NotReady> {
        let mut found = None;
        let mut exited = None;
        crate::wait_until(timeout, || {
            if let Some(s) = self.exited() {
                exited = Some(s);
                return true;
            }
            found = self.ready_now();
            found.is_some()
        });
        if let Some(a) = found {
            self.listen = Some(a);
            return Ok(a);
        }
        if let Some(s) = exited {
            return Err(NotReady::Exited(s));
        }
        Err(NotReady::Timeout(format!(
            "state file: {:?}",
            std::fs::read(self.home.join("gateway_state.json")).map(|b| String::from_utf8_lossy(&b).into_owned())
        )))
    }

    /// Like [`Gateway::try_wait_ready`], panicking with diagnostics (stderr tail) on failure.
    #[track_caller]
    pub fn wait_ready(&mut self, timeout: Duration) -> SocketAddr {
        match self.try_wait_ready(timeout) {
            Ok(a) => a,
            Err(NotReady::Exited(s)) => {
                panic!("gateway pid {} exited ({s}) before ready\n{}", self.pid, self.diag())
            }
            Err(NotReady::Timeout(why)) => {
                panic!("gateway pid {} not ready within {timeout:?} ({why})\n{}", self.pid, self.diag())
            }
        }
    }

    /// Waits for exit up to `timeout`.
    pub fn try_wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        crate::wait_until(timeout, || self.exited().is_some());
        self.status
    }

    /// Waits for exit, panicking with diagnostics on timeout.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match self.try_wait_exit(timeout) {
            Some(s) => s,
            None => panic!("gateway pid {} still running after {timeout:?}\n{}", self.pid, self.diag()),
        }
    }

    /// Sends a signal. Panics if the process was already reaped (its pid may be reused).
    #[track_caller]
    pub fn signal(&mut self, sig: i32) {
        assert!(self.status.is_none(), "signal to an already-reaped gateway pid {}", self.pid);
        crate::send_signal(self.pid, sig).expect("kill(2)");
    }

    /// SIGKILL and reap (no-op if already exited).
    pub fn kill(&mut self) -> ExitStatus {
        if self.exited().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.status.expect("reaped")
    }

    pub fn stderr(&self) -> String {
        std::fs::read(&self.stderr_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
    pub fn stdout(&self) -> String {
        std::fs::read(&self.stdout_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
    /// Last `n` lines of stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let s = self.stderr();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
    /// Diagnostics for panic messages: exit status, stderr tail, home listing.
    pub fn diag(&self) -> String {
        let listing: Vec<String> = std::fs::read_dir(&self.home)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        format!(
            "--- status: {:?}; age {:?}; home {} = {listing:?}\n--- stderr tail:\n{}\n---",
            self.status,
            self.spawned_at.elapsed(),
            self.home.display(),
            self.stderr_tail(40)
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill(); // SIGKILL also ends a SIGSTOPped process
            let _ = self.child.wait();
        }
    }
}
