//! Pieces shared by every Unix implementation.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::process::{Pid, test_kill_process};

use crate::probe::KillZero;

use super::Signal;

pub(crate) fn kill_zero(pid: u32) -> KillZero {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return KillZero::NoSuchProcess;
    };
    match test_kill_process(pid) {
        Ok(()) => KillZero::Ok,
        Err(Errno::SRCH) => KillZero::NoSuchProcess,
        Err(Errno::PERM) => KillZero::PermissionDenied,
        Err(e) => KillZero::Other(e.raw_os_error()),
    }
}

pub(crate) fn to_rustix(sig: Signal) -> rustix::process::Signal {
    match sig {
        Signal::Terminate => rustix::process::Signal::TERM,
        Signal::Interrupt => rustix::process::Signal::INT,
        Signal::Kill => rustix::process::Signal::KILL,
        Signal::Restart => rustix::process::Signal::USR1,
    }
}

pub(crate) fn kill(pid: u32, sig: Signal) -> io::Result<()> {
    let pid =
        i32::try_from(pid).ok().and_then(Pid::from_raw).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    rustix::process::kill_process(pid, to_rustix(sig)).map_err(io::Error::from)
}

pub fn create_private_dir(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)?;
    // `recursive` leaves an existing directory's mode alone; tighten the leaf we own.
    let meta = std::fs::metadata(path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

pub fn set_private_file(file: &File) -> io::Result<()> {
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
}

pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

pub fn sync_dir(path: &Path) {
    // Best effort: the rename already happened; this only makes it survive power loss.
    if let Ok(dir) = File::open(path) {
        let _ = dir.sync_all();
    }
}
