//! A log's last lines, then what is appended: shared by `logs` for a native home and for a
//! hermes home (`hermes.rs`), each with its own rules for what may be opened.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use gatewarden_lifecycle::ledger;

/// The last `n` lines of the log that `open` opens (`Ok(None)`: not there yet), then (with
/// `follow`) what is appended; `missing` says why there may be no file yet. `open` decides
/// what may be opened: a native home's rules (`logs.rs`) or a hermes home's (`hermes.rs`),
/// so a link, FIFO or foreign file planted at the name is refused by both.
pub fn tail(
    path: &Path,
    open: impl Fn() -> std::io::Result<Option<File>>,
    follow: bool,
    n: usize,
    missing: &str,
) -> crate::Result<ExitCode> {
    let mut pos = match open() {
        Ok(Some(mut f)) => {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            // Backwards from the end: a huge log costs a bounded read.
            let bytes = ledger::tail_bytes(&mut f, len, Some(n))?;
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                println!("{l}");
            }
            len
        }
        Ok(None) if !follow => {
            println!("no log yet at {} ({missing})", path.display());
            return Ok(ExitCode::SUCCESS);
        }
        Ok(None) => 0,
        Err(e) => crate::bail!("cannot read {}: {e}", path.display()),
    };
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    // Following a file has no readiness event to wait on portably; a short poll is the tool.
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Ok(Some(mut f)) = open() else { continue };
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
