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
