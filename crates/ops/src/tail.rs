//! A log's last lines, then what is appended: shared by `logs` for a native home and for a
//! hermes home (`hermes.rs`), each with its own rules for what may be opened.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use gatewarden_lifecycle::ledger;

/// How [`tail`] writes each line: as it is (escaped on a terminal), or as one JSON object
/// (`logs --json`: crates/dashboard/src/gather.rs `log_line_json`, the reading the pages use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Text,
    Json,
}

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
    shape: Shape,
) -> crate::Result<ExitCode> {
    let emit = |line: &str| match shape {
        Shape::Text => outln!("{}", crate::screen::shown(line)),
        Shape::Json => outln!("{}", gatewarden_dashboard::gather::log_line_json(line)),
    };
    let mut pos = match open() {
        Ok(Some(mut f)) => {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            // Backwards from the end: a huge log costs a bounded read.
            let bytes = ledger::tail_bytes(&mut f, len, Some(n))?;
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                emit(l);
            }
            len
        }
        // JSON lines: nothing to show is no line at all (the reason goes to stderr).
        Ok(None) if !follow && shape == Shape::Json => {
            errln!("no log yet at {} ({missing})", path.display());
            return Ok(ExitCode::SUCCESS);
        }
        Ok(None) if !follow => {
            outln!("no log yet at {} ({missing})", path.display());
            return Ok(ExitCode::SUCCESS);
        }
        Ok(None) => 0,
        Err(e) => crate::bail!("cannot read {}: {e}", path.display()),
    };
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    // A JSON line is written once it is whole.
    let mut partial = String::new();
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
            let text = String::from_utf8_lossy(&buf);
            let shown = match shape {
                Shape::Text => crate::screen::shown(&text).into_owned(),
                Shape::Json => {
                    partial.push_str(&text);
                    let mut lines = String::new();
                    while let Some(end) = partial.find('\n') {
                        let line: String = partial.drain(..=end).collect();
                        let json = gatewarden_dashboard::gather::log_line_json(line.trim_end_matches(['\n', '\r']));
                        lines.push_str(&format!("{json}\n"));
                    }
                    lines
                }
            };
            let mut out = std::io::stdout().lock();
            let written = out.write_all(shown.as_bytes()).and_then(|()| out.flush());
            match written {
                // `logs -f | head`: the reader is done, so is following.
                Err(e) if crate::console::reader_gone(&e) => return Ok(ExitCode::SUCCESS),
                r => r?,
            }
        }
    }
}
