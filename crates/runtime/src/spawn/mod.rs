//! Starting gateway processes that outlive their starter: in their own session (Unix) or
//! detached from the console (Windows), optionally inheriting the HTTP listener so connections
//! that arrive during a restart wait in the kernel's backlog instead of being refused.
//!
//! Signature shared by every OS: `detach(cmd: &mut Command, listener: Option<&TcpListener>)
//! -> Option<String>` prepares `cmd` and returns the `--inherit-listener` value to pass, if
//! the OS can hand the socket over; `adopt_listener(value) -> io::Result<TcpListener>` takes
//! it over in the child; `listener_handle(&TcpListener) -> Option<String>` and
//! `exec_in_place(Command, Option<TcpListener>) -> io::Error` re-execute this very process
//! (PID 1 of a container) keeping the listener.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub use imp::{DETACH_KEEPS_OUTPUT, adopt_listener, detach, exec_in_place, listener_handle};

/// This executable's path, as it was when [`remember_self_exe`] first ran (early in `main`).
///
/// An update renames a new binary over ours while we run; Linux then reports our image as
/// `<path> (deleted)`, which cannot be started. Successors, backstops and re-executions must
/// start the *path* (now the new binary), so the path is captured before any swap can happen.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    match SELF_EXE.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe(),
    }
}

/// Captures [`self_exe`]; call first thing in `main`.
pub fn remember_self_exe() {
    if let Ok(p) = std::env::current_exe() {
        let _ = SELF_EXE.set(p);
    }
}

static SELF_EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
