//! The per-OS facade: one file per OS, identical signatures, no decisions.
//!
//! Each implementation gathers facts from its OS and hands them to the pure mappings in
//! [`crate::probe`]. Callers use only the functions re-exported here:
//!
//! - `probe(pid: u32) -> Liveness`
//! - `start_time(pid: u32) -> Option<u64>`
//! - `signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome`
//! - `create_private_dir(path: &Path) -> io::Result<()>` (0700 on Unix)
//! - `set_private_file(file: &File) -> io::Result<()>` (0600 on Unix)
//! - `canonical(path: &Path) -> io::Result<PathBuf>`
//! - `sync_dir(path: &Path)`: make a rename durable where the OS supports it
//! - `parent_pid(pid: u32) -> Option<u32>`
//! - `kill_tagged(key: &str, accept: &dyn Fn(&str) -> bool) -> Vec<u32>`: kill leftover
//!   processes carrying an environment tag (runs of a dead incarnation), where the OS allows
//! - `lock_holders(path: &Path) -> Option<Vec<u32>>`: who the kernel says holds a file lock,
//!   where the OS exposes it

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(target_os = "macos", path = "macos.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(target_os = "linux", target_os = "macos", windows)), path = "fallback.rs")]
mod imp;

#[cfg(unix)]
mod unix;

pub use imp::*;

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
