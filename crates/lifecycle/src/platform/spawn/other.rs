//! Other OSes: no sessions, process groups, hand-over or exec; children run as plain children.

use std::io;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus};

use super::Reaped;

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

pub fn kill_process_group(_pgid: u32) {}

pub fn exit_signal(_status: ExitStatus) -> Option<i32> {
    None
}

/// No process groups to clean here: reaping is all.
pub fn reap_with_group(child: &mut Child) -> io::Result<Option<ExitStatus>> {
    child.try_wait()
}

pub fn run_as(_cmd: &mut Command, _uid: u32, _gid: u32) {}

pub fn is_executable(p: &std::path::Path) -> bool {
    p.is_file()
}

pub fn spawn_watched(cmd: &mut Command, mut report: impl FnMut(Reaped) + Send + 'static) -> io::Result<u32> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    std::thread::Builder::new().name("supervise-wait".into()).spawn(move || {
        let code = child.wait().ok().and_then(|s| s.code());
        report(Reaped::Child { pid, code, signal: None });
    })?;
    Ok(pid)
}

pub fn is_pid1() -> bool {
    false
}

pub fn real_uid() -> u32 {
    0
}

pub fn process_groups() -> Vec<(u32, u32)> {
    Vec::new()
}
