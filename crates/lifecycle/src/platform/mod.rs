//! The per-OS facade: one file per OS, identical signatures, no decisions.
//!
//! Each implementation gathers facts from its OS and hands them to the pure mappings in
//! [`crate::liveness`] and [`crate::procfs`], which sit below it (the facade never calls up into
//! the modules that use it). Callers use only the functions re-exported here:
//!
//! - `probe(pid: u32) -> Liveness`
//! - `start_time(pid: u32) -> Option<u64>`
//! - `signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome`
//! - `create_private_dir(path: &Path) -> io::Result<()>` (creates missing directories 0700 on
//!   Unix; never changes an existing directory's mode)
//! - `create_private_dir_new(path: &Path) -> io::Result<()>`: one new directory, 0700 on Unix
//!   from its creation; an existing one is an error (nothing planted is reused)
//! - `private_on_create(opts: &mut OpenOptions)`: files `opts` creates are 0600 from the first
//!   instant on Unix (the mode of the `open`, not a later chmod)
//! - `dir_facts(path: &Path, follow: bool) -> io::Result<Option<DirFacts>>`: owner and mode,
//!   `None` where the OS has no Unix ownership (Windows: the profile's ACL protects the home)
//! - `node_facts(path: &Path) -> io::Result<Option<NodeFacts>>`: kind, owner, group and mode of
//!   a path itself (`lstat`), for the secret files' walk (fsio); `None` where the OS has no Unix
//!   ownership
//! - `open_node_facts(file: &File) -> io::Result<Option<NodeFacts>>`: the same of an open file
//!   (`fstat`: no race with a rename between the check and the read), with its POSIX ACL (Linux)
//! - `credentials() -> Option<Credentials>`: our effective uid and every group we are in
//! - `no_follow(opts: &mut OpenOptions, nonblocking: bool)`: never open through a symlink
//!   (`O_NOFOLLOW`, `FILE_FLAG_OPEN_REPARSE_POINT`); optionally `O_NONBLOCK`
//! - `link_refused(e: &io::Error) -> bool`: the open failed because the path is a symlink
//! - `is_link(file: &File) -> bool`: the opened handle is a link (Windows reparse point)
//! - `is_transient(e: &io::Error) -> bool`: a resource error (no fds, no memory), not bad content
//! - `set_private_file(file: &File) -> io::Result<()>` (0600 on Unix)
//! - `canonical(path: &Path) -> io::Result<PathBuf>`
//! - `sync_dir(path: &Path)`: make a rename durable where the OS supports it
//! - `free_space(path: &Path) -> Option<u64>`: bytes the user may still write on that
//!   filesystem (`statvfs`, `GetDiskFreeSpaceExW`)
//! - `parent_pid(pid: u32) -> Option<u32>`
//! - `cmdline(pid: u32) -> Option<Vec<String>>`: a process's arguments, where the OS tells and
//!   also names lock holders (so a holder can be told from a gateway); `argv(pid)` the same but
//!   `Some(empty)` for a process with none (a zombie, a kernel thread)
//! - `environ(pid: u32) -> Option<Vec<u8>>` (NUL-separated), `cgroup(pid: u32) -> Option<String>`,
//!   `process_uid(pid: u32) -> Option<u32>`: what `/proc` tells of a process (Linux; `None`
//!   elsewhere)
//! - `processes_with_env(key, value, argv_words) -> Vec<u32>`: processes by environment and argv
//!   (Linux; empty elsewhere)
//! - `kill_tagged(key: &str, accept: &dyn Fn(&str) -> bool) -> Vec<u32>`: kill leftover
//!   processes carrying an environment tag (runs of a dead incarnation), where the OS allows
//! - `lock_holders(path: &Path) -> Option<Vec<u32>>`: who the kernel says holds a file lock,
//!   where the OS exposes it
//! - `systemd_main_pid() -> Option<u32>`: `MainPID` of the systemd unit whose cgroup we are in
//! - `is_stopped(pid: u32) -> Option<bool>`: whether a process is stopped (SIGSTOP, traced)
//! - `port_listeners(port: u16) -> Vec<PortListener>`: who listens on a TCP port, where the OS
//!   tells
//! - `release_startup_pages() -> usize`: drop the clean code pages start-up touched from our
//!   page tables once the gateway is ready (Linux; 0 elsewhere)
//! - `process_usage(pid: u32) -> Option<ProcessUsage>`: CPU time, resident memory and threads
//!   of a process (`gatewarden top`; Linux; `None` elsewhere)
//! - `stdout_to_stderr() -> io::Result<File>`: points this process's stdout at its stderr and
//!   returns the original stdout (a verb's `--json`: its one document alone on stdout)
//! - `read_hidden_line() -> io::Result<String>`: a line from stdin with the terminal's echo off
//!   (`init`'s secrets; echoed where the OS cannot turn it off)
//!
//! Starting, watching and ending child processes: [`spawn`] (the same pattern, its own files).

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(target_os = "macos", path = "macos.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(target_os = "linux", target_os = "macos", windows)), path = "fallback.rs")]
mod imp;

#[cfg(unix)]
mod unix;

#[cfg(not(target_os = "linux"))]
mod without_procfs;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod without_owners;

pub use imp::*;

pub mod spawn;

impl crate::identity::ProcessIdentity {
    /// The calling process. `None` only if the OS will not tell us our own start time.
    pub fn current() -> Option<Self> {
        let pid = std::process::id();
        start_time(pid).map(|start_time| Self { pid, start_time })
    }

    /// Re-checks this identity against the live system.
    pub fn check(&self) -> crate::identity::IdentityCheck {
        crate::identity::check_against(self, probe(self.pid))
    }
}

/// Ownership facts about a directory, for the pure checks in [`crate::home`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirFacts {
    pub is_dir: bool,
    pub is_link: bool,
    pub owner: u32,
    /// Our effective uid.
    pub me: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
}

/// What a path is, for the secret files' rule (fsio `secret_node_insecurity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    File,
    Dir,
    Link,
    /// A FIFO, socket or device.
    Other,
}

/// A path's (or an open file's) kind, owner, group and mode, and its POSIX access ACL where it
/// has one: with an ACL the mode's group bits are the ACL's mask, not the owning group's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub kind: NodeKind,
    pub owner: u32,
    pub group: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// The entries of an extended ACL (`system.posix_acl_access`); `None` without one, or
    /// where the OS has none (a path's facts never carry it: only an open file's are read).
    pub acl: Option<Vec<AclEntry>>,
}

/// One entry of a POSIX ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: AclTag,
    /// The uid or gid of a named [`AclTag::User`] or [`AclTag::Group`] entry.
    pub id: u32,
    /// `rwx` as `0o4 | 0o2 | 0o1`.
    pub perm: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclTag {
    /// The owner (the mode's user bits).
    UserObj,
    /// A named user.
    User,
    /// The owning group.
    GroupObj,
    /// A named group.
    Group,
    /// The most any named entry or the owning group gets (the mode's group bits).
    Mask,
    /// Everyone else (the mode's other bits).
    Other,
}

/// Who we are, for the secret files' rule: the effective uid and every group we are in (the
/// effective gid and the supplementary groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub groups: Vec<u32>,
}

/// A signal the kernel may send. On Windows only [`Signal::Kill`] exists (TerminateProcess);
/// the others report [`SignalOutcome::Unsupported`], and graceful stops go through the control
/// channel or a marker instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Terminate,
    Interrupt,
    Kill,
    /// SIGUSR1: planned restart.
    Restart,
}

/// What [`signal_verified`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalOutcome {
    /// The identity was re-verified and the signal delivered.
    Sent,
    /// The process is gone; nothing was sent.
    Gone,
    /// The pid now belongs to another process; nothing was sent.
    Mismatch,
    /// Identity could not be verified; nothing was sent.
    Unverifiable(String),
    /// The signal does not exist on this OS; nothing was sent.
    Unsupported,
    /// Verified, but delivery failed.
    Failed(String),
}

impl SignalOutcome {
    pub fn sent(&self) -> bool {
        matches!(self, SignalOutcome::Sent)
    }
}

/// What [`process_usage`] tells of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessUsage {
    /// User plus system CPU time since it started, in seconds.
    pub cpu_s: f64,
    pub rss_bytes: u64,
    pub threads: u64,
}

/// A process listening on a TCP port, as far as the OS tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortListener {
    pub pid: u32,
    /// The program name (`comm` on Linux).
    pub program: String,
    /// The gatewarden (or hermes) home whose `gateway.lock` the process holds open, if any.
    pub home: Option<std::path::PathBuf>,
}

impl std::fmt::Display for PortListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.program)?;
        if let Some(h) = &self.home {
            write!(f, ", the gateway of {}", h.display())?;
        }
        Ok(())
    }
}
