//! Per-OS connect: identical signatures, no decisions (which folder to check first is the
//! caller's, from endpoint.rs).

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub(crate) use imp::{check_private_dir, connect, prepare_private_dir, uid};

/// The endpoint answered, but is not provably ours (another user's folder, socket or
/// process): nothing it says may be believed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Untrusted(pub String);

pub(crate) fn untrusted(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, Untrusted(why))
}

/// Read half and write half of one connection.
pub(crate) type Halves = (Box<dyn std::io::Read + Send>, Box<dyn std::io::Write + Send>);
