//! Unix sockets. Nothing the socket says is believed before three checks: the folder (for the
//! shared short-path folder) is a real directory of ours with mode 0700, the socket file is
//! ours, and the peer's kernel-reported uid (`SO_PEERCRED` / `getpeereid`) is ours.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use super::{Halves, untrusted};
use crate::Endpoint;

pub(crate) fn connect(ep: &Endpoint, shared_folder: Option<&Path>, _deadline: Instant) -> io::Result<Halves> {
    let Endpoint::Socket(path) = ep else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "named pipes exist only on Windows"));
    };
    if let Some(dir) = shared_folder {
        check_private_dir(dir).map_err(untrusted)?;
    }
    check_socket(path)?;
    // connect(2) on a Unix socket either succeeds or fails at once; no retry loop needed.
    let s = UnixStream::connect(path)?;
    let me = uid();
    let peer = peer_uid(&s)?;
    if peer != me {
        return Err(untrusted(format!(
            "the process listening on {} runs as uid {peer}, not uid {me}: not a gateway of ours",
            path.display()
        )));
    }
    let r = s.try_clone()?;
    Ok((Box::new(r), Box::new(s)))
}

/// Our effective uid: the one the kernel reports for our sockets and files.
pub(crate) fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The socket file must be a socket owned by us. A missing file is `NotFound` (nothing listens).
fn check_socket(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_socket() {
        return Err(untrusted(format!("{} is not a socket", path.display())));
    }
    if meta.uid() != uid() {
        return Err(untrusted(format!("{} is owned by uid {}, not uid {}", path.display(), meta.uid(), uid())));
    }
    Ok(())
}

/// A directory (not a symlink) owned by us, with no group or other permissions.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    if !meta.file_type().is_dir() {
        return Err(format!("{} is not a directory (a symlink?)", dir.display()));
    }
    if meta.uid() != uid() {
        return Err(format!("{} is owned by uid {}, not uid {}", dir.display(), meta.uid(), uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!("{} has mode {:o}, not 0700", dir.display(), meta.mode() & 0o7777));
    }
    Ok(())
}

/// Creates the socket folder 0700 if missing, then checks it; never adopts someone else's.
pub(crate) fn prepare_private_dir(dir: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    check_private_dir(dir)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(s)?.uid.as_raw())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: a valid socket fd and two valid out-pointers.
    if unsafe { libc::getpeereid(s.as_raw_fd(), &mut uid, &mut gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(uid)
}
