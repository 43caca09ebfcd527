//! `gatewarden logs [-f] [-n N]`: the gateway's own log file.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use gatewarden_lifecycle::Home;

pub fn logs(home: &Home, follow: bool, n: usize) -> anyhow::Result<ExitCode> {
    let path = home.logs_dir().join("gateway.log");
    tail(&path, follow, n, "only background starts write one; `run` logs to stderr")
}

/// The last `n` lines of `path`, then (with `follow`) what is appended; `missing` says why
/// there may be no file yet. Shared with a hermes home's `logs` (cmd/hermes.rs).
pub fn tail(path: &Path, follow: bool, n: usize, missing: &str) -> anyhow::Result<ExitCode> {
    let mut pos = match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                println!("{l}");
            }
            bytes.len() as u64
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !follow => {
            println!("no log yet at {} ({missing})", path.display());
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    // Following a file has no readiness event to wait on portably; a short poll is the tool.
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Ok(mut f) = std::fs::File::open(path) else { continue };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < pos {
            pos = 0; // rotated
        }
        if len > pos {
            let mut buf = Vec::new();
            f.seek(SeekFrom::Start(pos))?;
            f.read_to_end(&mut buf)?;
            pos += buf.len() as u64;
            let mut out = std::io::stdout().lock();
            out.write_all(String::from_utf8_lossy(&buf).as_bytes())?;
            out.flush()?;
        }
    }
}
