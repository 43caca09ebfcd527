//! A small stderr logger: plain, journald-friendly lines by default (`<level>: message`, no
//! timestamp, since journald stamps them; a timestamp is added on a terminal), or JSON.
//!
//! Deliberately tiny: the gateway logs lifecycle events, not request traces, and every
//! dependency costs start-up time and memory on the hot paths this project measures.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

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
        Format::Plain if tty => format!("{} {}: {msg}\n", gatewarden_lifecycle::timefmt::now(), level.as_str()),
        Format::Plain => format!("{}: {msg}\n", level.as_str()),
    };
    // One write per line so concurrent lines do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
