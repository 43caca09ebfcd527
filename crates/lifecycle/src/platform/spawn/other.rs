//! Other OSes: no sessions, process groups, hand-over or exec; children run as plain children.

use std::io;
use std::net::TcpListener;
use std::process::Command;

pub fn detach(_cmd: &mut Command, _listener: Option<&TcpListener>) -> Option<String> {
    None
}

pub fn adopt_listener(_value: &str) -> io::Result<TcpListener> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "listener inheritance is not supported on this OS"))
}

pub const DETACH_KEEPS_OUTPUT: bool = true;

pub fn listener_handle(_l: &TcpListener) -> Option<String> {
    None
}

pub fn exec_in_place(_cmd: Command, _listener: Option<TcpListener>) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "re-executing in place is not supported on this OS")
}

pub fn own_process_group(_cmd: &mut Command) {}

/// No process groups here: nothing to signal.
#[derive(Debug)]
pub struct ProcessGroup;

impl ProcessGroup {
    pub fn prepare(_cmd: &mut Command) {}

    pub fn attach(_pid: Option<u32>) -> ProcessGroup {
        ProcessGroup
    }

    pub fn terminate(&self) {}

    pub fn kill(&self) {}
}

pub use super::without_groups::*;
