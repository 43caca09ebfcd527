//! Pieces shared by every Unix implementation.

use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::process::{Pid, test_kill_process};

use crate::probe::KillZero;

use super::{DirFacts, Signal};

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
    // Directories created here are 0700; an existing directory's mode is never changed (a
    // `--home /tmp` must not narrow /tmp for everyone): the caller checks it instead.
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

pub fn dir_facts(path: &Path, follow: bool) -> io::Result<Option<DirFacts>> {
    let meta = if follow { std::fs::metadata(path)? } else { std::fs::symlink_metadata(path)? };
    Ok(Some(DirFacts {
        is_dir: meta.is_dir(),
        is_link: meta.file_type().is_symlink(),
        owner: meta.uid(),
        me: rustix::process::geteuid().as_raw(),
        mode: meta.mode() & 0o7777,
    }))
}

pub fn no_follow(opts: &mut OpenOptions, nonblocking: bool) {
    let mut flags = OFlags::NOFOLLOW;
    if nonblocking {
        // A FIFO opened for reading would otherwise block until a writer appears.
        flags |= OFlags::NONBLOCK;
    }
    opts.custom_flags(flags.bits() as i32);
}

pub fn link_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::LOOP.raw_os_error())
}

pub fn is_link(_file: &File) -> bool {
    // O_NOFOLLOW already refused every link at open time.
    false
}

pub fn is_transient(e: &io::Error) -> bool {
    [Errno::MFILE, Errno::NFILE, Errno::NOMEM, Errno::INTR, Errno::NOBUFS]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
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
