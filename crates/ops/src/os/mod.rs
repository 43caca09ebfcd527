//! The per-OS process facade (`proc_unix.rs`, `proc_windows.rs`, identical signatures): what
//! `supervise` needs from the OS — spawning a watched child (and reaping orphans when PID 1),
//! forwarding stop signals / console events, replacing the process image, the user id, file
//! modes. Decisions (what to do with an exit, when to escalate) stay in the verb modules.

use gatewarden_service::supervise::ChildExit;

#[cfg_attr(unix, path = "proc_unix.rs")]
#[cfg_attr(windows, path = "proc_windows.rs")]
pub mod proc;

/// Something `supervise` is told while it waits.
#[derive(Debug)]
pub enum Event {
    /// The child ended.
    ChildExited { pid: u32, exit: ChildExit },
    /// An orphan (not our child) was reaped; we are PID 1 or a subreaper (Unix only).
    #[cfg_attr(windows, allow(dead_code))]
    OrphanReaped { pid: u32 },
    /// A stop was requested by a signal or console event (`channel`, `what`).
    Stop { channel: &'static str, what: &'static str },
}
