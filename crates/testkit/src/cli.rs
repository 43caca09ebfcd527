use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Captured result of one CLI invocation.
#[derive(Debug, Clone)]
pub struct CliOutput {
    /// Exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Pid the CLI process had (for `requester.pid` checks).
    pub pid: u32,
    pub elapsed: Duration,
}

impl CliOutput {
    /// stdout + stderr, lowercased, for message checks.
    pub fn text_lc(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr).to_lowercase()
    }
    /// stdout parsed as one JSON value.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
    pub fn panicked(&self) -> bool {
        self.stderr.contains("panicked") || self.code == Some(101)
    }
}

/// `bin --home HOME <args>` with the deterministic test env, 30 s deadline.
pub fn cli<S: AsRef<OsStr>>(bin: impl AsRef<Path>, home: &Path, args: &[S]) -> CliOutput {
    cli_with(bin, home, args, &[], Duration::from_secs(30))
}

/// Like [`cli`] with extra environment variables.
pub fn cli_env<S: AsRef<OsStr>>(bin: impl AsRef<Path>, home: &Path, args: &[S], env: &[(&str, &str)]) -> CliOutput {
    cli_with(bin, home, args, env, Duration::from_secs(30))
}

/// Runs the CLI; kills it and panics if it does not finish within `timeout`.
#[track_caller]
pub fn cli_with<S: AsRef<OsStr>>(
    bin: impl AsRef<Path>,
    home: &Path,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
) -> CliOutput {
    cli_mode(bin, home, args, env, timeout, false)
}

/// Like [`cli_with`] in the host's real environment (see `GatewayBuilder::host_default`).
#[track_caller]
pub fn cli_host<S: AsRef<OsStr>>(
    bin: impl AsRef<Path>,
    home: &Path,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
) -> CliOutput {
    cli_mode(bin, home, args, env, timeout, true)
}

#[track_caller]
fn cli_mode<S: AsRef<OsStr>>(
    bin: impl AsRef<Path>,
    home: &Path,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
    host_default: bool,
) -> CliOutput {
    let bin = bin.as_ref();
    let mut cmd = Command::new(bin);
    if host_default {
        cmd.env_remove("GATEWARDEN_HOME");
    } else {
        crate::test_env(&mut cmd);
    }
    cmd.arg("--home").arg(home).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let pid = child.id();
    // Drain pipes on threads so a chatty CLI cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut b);
        b
    });
    let te = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut b);
        b
    });
    let mut status = None;
    crate::wait_until(timeout, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    let elapsed = start.elapsed();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        let e = String::from_utf8_lossy(&te.join().unwrap_or_default()).into_owned();
        let argv: Vec<String> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
        panic!("`gatewarden {argv:?}` did not finish within {timeout:?}; stderr:\n{e}");
    };
    CliOutput {
        code: status.code(),
        stdout: String::from_utf8_lossy(&to.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&te.join().unwrap_or_default()).into_owned(),
        pid,
        elapsed,
    }
}
