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
    cli_mode(bin, home, args, env, timeout, Mode::Test)
}

/// Like [`cli_with`] with stdout (and stderr too, when `stderr_too`) a pipe whose reader is
/// already gone, as in `gatewarden history | head -c1` once `head` has exited: every write
/// fails with `EPIPE`. The output captured is stderr's when it stays open.
#[track_caller]
pub fn cli_reader_gone<S: AsRef<OsStr>>(bin: impl AsRef<Path>, home: &Path, args: &[S], stderr_too: bool) -> CliOutput {
    cli_mode(bin, home, args, &[], Duration::from_secs(30), Mode::ReaderGone { stderr_too })
}

/// How [`cli_mode`] sets the process up.
#[derive(Clone, Copy)]
enum Mode {
    /// The deterministic test environment, output captured.
    Test,
    /// The host's real environment, output captured.
    Host,
    /// The test environment; stdout (and stderr) closed for reading.
    ReaderGone { stderr_too: bool },
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
    cli_mode(bin, home, args, env, timeout, Mode::Host)
}

/// The write end of a pipe whose read end is closed.
fn reader_gone_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Stdio::from(writer)
}

/// Like [`cli_with`] with stdout and stderr on a terminal (a pseudo-terminal through
/// util-linux `script`): what an operator sees. Its output arrives with `\r\n` line ends.
#[track_caller]
pub fn cli_on_terminal(bin: impl AsRef<Path>, home: &Path, args: &[&str], env: &[(&str, &str)], timeout: Duration) -> CliOutput {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut line = vec![quote(&bin.as_ref().to_string_lossy()), "--home".into(), quote(&home.to_string_lossy())];
    line.extend(args.iter().map(|a| quote(a)));
    // `script` runs the command under a shell: `--home` is in the line, not added again.
    cli_raw(Path::new("script"), &["-qefc", &line.join(" "), "/dev/null"], env, timeout, Mode::Test)
}

#[track_caller]
fn cli_mode<S: AsRef<OsStr>>(
    bin: impl AsRef<Path>,
    home: &Path,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
    mode: Mode,
) -> CliOutput {
    let mut all: Vec<&OsStr> = vec![OsStr::new("--home"), home.as_os_str()];
    all.extend(args.iter().map(AsRef::as_ref));
    cli_raw(bin.as_ref(), &all, env, timeout, mode)
}

#[track_caller]
fn cli_raw<S: AsRef<OsStr>>(
    bin: &Path,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
    mode: Mode,
) -> CliOutput {
    let mut cmd = Command::new(bin);
    match mode {
        Mode::Host => crate::host_env(&mut cmd),
        Mode::Test | Mode::ReaderGone { .. } => crate::test_env(&mut cmd),
    }
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Mode::ReaderGone { stderr_too } = mode {
        cmd.stdout(reader_gone_pipe());
        if stderr_too {
            cmd.stderr(reader_gone_pipe());
        }
    }
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let pid = child.id();
    // Drain pipes on threads so a chatty CLI cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut p) = pipe {
                let _ = std::io::Read::read_to_end(&mut p, &mut b);
            }
            b
        })
    };
    let to = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let te = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
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
