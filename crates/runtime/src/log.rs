//! A small logger to stderr or to a size-rotated file: plain, journald-friendly lines by default (`<level>: message`, no
//! timestamp, since journald stamps them; a timestamp is added on a terminal), or JSON.
//!
//! Deliberately tiny: the gateway logs lifecycle events, not request traces, and every
//! dependency costs start-up time and memory on the hot paths this project measures.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Rotate the log file past this size; keep this many older generations.
pub const ROTATE_BYTES: u64 = 5 << 20;
pub const KEEP: u32 = 3;

struct FileSink {
    path: PathBuf,
    file: File,
    size: u64,
}

static FILE: OnceLock<Mutex<FileSink>> = OnceLock::new();

/// Sends log lines to `path` (appending, rotated by size) instead of stderr.
pub fn init_file(path: &Path, format: Format) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        // 0700 whatever the umask (an existing folder's mode is left alone).
        gatewarden_lifecycle::platform::create_private_dir(dir)?;
    }
    // Never through a symlink planted in the home's logs folder.
    let file = gatewarden_lifecycle::fsio::open_append(path)?;
    let size = file.metadata()?.len();
    let _ = FILE.set(Mutex::new(FileSink { path: path.to_owned(), file, size }));
    let _ = FORMAT.set((format, false));
    Ok(())
}

fn rotate(sink: &mut FileSink) {
    let generation = |n: u32| PathBuf::from(format!("{}.{n}", sink.path.display()));
    for n in (1..KEEP).rev() {
        let _ = std::fs::rename(generation(n), generation(n + 1));
    }
    let _ = std::fs::rename(&sink.path, generation(1));
    if let Ok(f) = gatewarden_lifecycle::fsio::open_append(&sink.path) {
        sink.file = f;
        sink.size = 0;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Plain,
    Json,
}

static FORMAT: OnceLock<(Format, bool)> = OnceLock::new();

/// Chooses the format once; later calls are ignored.
pub fn init(format: Format) {
    let _ = FORMAT.set((format, std::io::stderr().is_terminal()));
}

#[derive(Debug, Clone, Copy)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

pub fn write(level: Level, msg: std::fmt::Arguments<'_>) {
    let (format, tty) = *FORMAT.get_or_init(|| (Format::Plain, std::io::stderr().is_terminal()));
    let line = match format {
        Format::Json => {
            let v = serde_json::json!({"ts": gatewarden_lifecycle::timefmt::now(), "level": level.as_str(), "msg": msg.to_string()});
            format!("{v}\n")
        }
        Format::Plain if tty || FILE.get().is_some() => {
            format!("{} {}: {msg}\n", gatewarden_lifecycle::timefmt::now(), level.as_str())
        }
        Format::Plain => format!("{}: {msg}\n", level.as_str()),
    };
    remember(level, line.trim_end());
    if let Some(sink) = FILE.get() {
        if let Ok(mut sink) = sink.lock() {
            if sink.size + line.len() as u64 > ROTATE_BYTES {
                rotate(&mut sink);
            }
            if sink.file.write_all(line.as_bytes()).is_ok() {
                sink.size += line.len() as u64;
            }
        }
        return;
    }
    // One write per line so concurrent lines do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The last lines logged, for the dashboard's live log tail (bounded: [`RECENT`] lines).
pub const RECENT: usize = 200;
static TAIL: Mutex<std::collections::VecDeque<(&'static str, String)>> = Mutex::new(std::collections::VecDeque::new());

fn remember(level: Level, line: &str) {
    let mut t = TAIL.lock().unwrap_or_else(|p| p.into_inner());
    if t.len() >= RECENT {
        t.pop_front();
    }
    t.push_back((level.as_str(), line.to_owned()));
}

/// The recent lines, oldest first, as `(level, line)`.
pub fn recent() -> Vec<(&'static str, String)> {
    TAIL.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
}

#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
