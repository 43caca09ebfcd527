//! The process runner: the staged binary's `--version` and its preflight `check`, each bounded
//! in time and output.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gatewarden_lifecycle::Home;

use super::version::parse_version;

/// The staged binary's `check` against the live home; `Ok` with its `warn` lines (what the new
/// version changes for this home, e.g. a new default).
pub(super) fn preflight(home: &Home, staged: &Path, target: &Path) -> Result<Vec<String>, String> {
    let mut cmd = Command::new(staged);
    cmd.arg("--home").arg(home.dir()).arg("check").arg("--target").arg(target);
    let out = run_bounded(cmd, Duration::from_secs(30))?;
    if out.0 == Some(0) {
        let notes = out.1.lines().map(str::trim).filter(|l| l.starts_with("warn "));
        return Ok(notes.map(str::to_owned).collect());
    }
    let text = format!("{}{}", out.1, out.2);
    Err(format!("exit {}: {}", out.0.map_or("?".into(), |c| c.to_string()), text.trim()))
}

/// What the staged binary says its version is (`gatewarden X` from `--version`).
pub(super) fn release_version(path: &Path) -> Result<String, String> {
    let mut cmd = Command::new(path);
    cmd.arg("--version");
    let (code, out, err) = run_bounded(cmd, Duration::from_secs(10))
        .map_err(|e| format!("{} is not an executable gatewarden release: {e}", path.display()))?;
    parse_version(&out).filter(|_| code == Some(0)).ok_or_else(|| {
        format!("{} is not a gatewarden release: `--version` printed {:?} {:?}", path.display(), out.trim(), err.trim())
    })
}

/// Runs `cmd`, killing it after `limit`: (exit code, stdout, stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<(Option<i32>, String, String), String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        if let Some(s) = out.as_mut() {
            let _ = s.take(1 << 20).read_to_string(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.take(1 << 20).read_to_string(&mut e);
        }
        (o, e)
    });
    let until = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {}s", limit.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let (o, e) = reader.join().unwrap_or_default();
    Ok((status.code(), o, e))
}
