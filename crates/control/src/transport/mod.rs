//! Per-OS connect: identical signatures, no decisions.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub(crate) use imp::{connect, uid};

/// Read half and write half of one connection.
pub(crate) type Halves = (Box<dyn std::io::Read + Send>, Box<dyn std::io::Write + Send>);
