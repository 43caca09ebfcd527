//! Windows: detached consoles and new process groups; no descriptor hand-over, no exec.

use std::io;
use std::net::TcpListener;
use std::os::windows::process::CommandExt;
use std::process::Command;

const DETACHED_PROCESS: u32 = 0x0000_0008;
const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
const CREATE_NO_WINDOW: u32 = 0x0800_0000;

/// Platform-specific behaviour: sockets are not handed over (that needs WSADuplicateSocket and
/// a side channel); the successor binds the address itself, retrying while it is in use.
pub fn detach(cmd: &mut Command, _listener: Option<&TcpListener>) -> Option<String> {
    cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW);
    None
}

pub fn adopt_listener(_value: &str) -> io::Result<TcpListener> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "listener inheritance is not supported on Windows"))
}

/// DETACHED_PROCESS drops the console, so a detached orchestrator could not print.
pub const DETACH_KEEPS_OUTPUT: bool = false;

/// No listener inheritance on Windows.
pub fn listener_handle(_l: &TcpListener) -> Option<String> {
    None
}

/// Windows has no exec; nothing runs as a PID-namespace init there.
pub fn exec_in_place(_cmd: Command, _listener: Option<TcpListener>) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "re-executing in place is not supported on Windows")
}

pub fn own_process_group(cmd: &mut Command) {
    cmd.creation_flags(CREATE_NEW_PROCESS_GROUP);
}

pub use super::without_groups::*;
