//! The per-OS facade: one file per OS, identical signatures, no decisions.
//!
//! Each implementation gathers facts from its OS and hands them to the pure mappings in
//! [`crate::probe`]. Callers use only the functions re-exported here:
//!
//! - `probe(pid: u32) -> Liveness`
//! - `start_time(pid: u32) -> Option<u64>`
//! - `signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome`
//! - `create_private_dir(path: &Path) -> io::Result<()>` (creates missing directories 0700 on
//!   Unix; never changes an existing directory's mode)
//! - `dir_facts(path: &Path, follow: bool) -> io::Result<Option<DirFacts>>`: owner and mode,
//!   `None` where the OS has no Unix ownership (Windows: the profile's ACL protects the home)
//! - `no_follow(opts: &mut OpenOptions, nonblocking: bool)`: never open through a symlink
//!   (`O_NOFOLLOW`, `FILE_FLAG_OPEN_REPARSE_POINT`); optionally `O_NONBLOCK`
//! - `link_refused(e: &io::Error) -> bool`: the open failed because the path is a symlink
//! - `is_link(file: &File) -> bool`: the opened handle is a link (Windows reparse point)
//! - `is_transient(e: &io::Error) -> bool`: a resource error (no fds, no memory), not bad content
//! - `set_private_file(file: &File) -> io::Result<()>` (0600 on Unix)
//! - `canonical(path: &Path) -> io::Result<PathBuf>`
//! - `sync_dir(path: &Path)`: make a rename durable where the OS supports it
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
