//! Pieces shared by every Unix implementation.

use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::process::{Pid, test_kill_process};

use crate::liveness::KillZero;

use super::{Credentials, DirFacts, NodeFacts, NodeKind, Signal};

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

/// Bytes the calling user may still write on the filesystem holding `path` (`statvfs`:
/// available blocks × fragment size); `None` when it cannot be asked.
pub fn free_space(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

pub fn create_private_dir(path: &Path) -> io::Result<()> {
    // Directories created here are 0700; an existing directory's mode is never changed (a
    // `--home /tmp` must not narrow /tmp for everyone): the caller checks it instead.
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

pub fn create_private_dir_new(path: &Path) -> io::Result<()> {
    // Not recursive: an existing directory (planted, or a name reused) is an error.
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

pub fn private_on_create(opts: &mut OpenOptions) {
    // The mode the file is created with, so it is never readable by others, not even for
    // the instant before a chmod (the umask can only narrow it).
    opts.mode(0o600);
}

pub fn dir_facts(path: &Path, follow: bool) -> io::Result<Option<DirFacts>> {
    let meta = if follow { std::fs::metadata(path)? } else { std::fs::symlink_metadata(path)? };
    Ok(Some(facts(&meta)))
}

fn facts(meta: &std::fs::Metadata) -> DirFacts {
    DirFacts {
        is_dir: meta.is_dir(),
        is_link: meta.file_type().is_symlink(),
        owner: meta.uid(),
        me: rustix::process::geteuid().as_raw(),
        mode: meta.mode() & 0o7777,
    }
}

pub fn node_facts(path: &Path) -> io::Result<Option<NodeFacts>> {
    Ok(Some(node(&std::fs::symlink_metadata(path)?)))
}

/// Kind, owner, group and mode (no ACL: the OS file adds it for an open file).
pub(crate) fn node(meta: &std::fs::Metadata) -> NodeFacts {
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        NodeKind::Link
    } else if t.is_dir() {
        NodeKind::Dir
    } else if t.is_file() {
        NodeKind::File
    } else {
        NodeKind::Other
    };
    NodeFacts { kind, owner: meta.uid(), group: meta.gid(), mode: meta.mode() & 0o7777, acl: None }
}

pub fn credentials() -> Option<Credentials> {
    let mut groups = vec![rustix::process::getegid().as_raw()];
    // Without the supplementary groups a group-readable secret is refused, never wrongly taken.
    for g in rustix::process::getgroups().unwrap_or_default() {
        if !groups.contains(&g.as_raw()) {
            groups.push(g.as_raw());
        }
    }
    Some(Credentials { uid: rustix::process::geteuid().as_raw(), groups })
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

/// Points fd 1 at what fd 2 is and returns a handle on the original stdout, close-on-exec: a
/// process started later (a background gateway) must not hold the caller's stdout open.
pub fn stdout_to_stderr() -> io::Result<File> {
    use std::os::fd::AsFd;
    let out = std::io::stdout();
    let saved = rustix::io::fcntl_dupfd_cloexec(out.as_fd(), 3)?;
    rustix::stdio::dup2_stdout(std::io::stderr().as_fd())?;
    Ok(File::from(saved))
}

/// One line from stdin; on a terminal its echo is off while it is typed (and back on after,
/// whatever happens), and the newline the user typed is echoed to stderr.
pub fn read_hidden_line() -> io::Result<String> {
    use rustix::termios::{LocalModes, OptionalActions, isatty, tcgetattr, tcsetattr};
    use std::io::BufRead;
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let saved = if isatty(fd) { Some(tcgetattr(fd)?) } else { None };
    if let Some(t) = &saved {
        let mut quiet = t.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        // The newline still shows, so the prompt's line ends.
        quiet.local_modes.insert(LocalModes::ECHONL);
        tcsetattr(fd, OptionalActions::Flush, &quiet)?;
    }
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    if let Some(t) = &saved {
        let _ = tcsetattr(fd, OptionalActions::Flush, t);
    }
    read.map(|_| line)
}
