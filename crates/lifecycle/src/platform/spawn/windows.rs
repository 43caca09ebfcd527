//! Windows: detached consoles and new process groups; no descriptor hand-over, no exec.

use std::io;
use std::net::TcpListener;
use std::os::windows::process::CommandExt;
use std::process::{Child, Command, ExitStatus};

use super::Reaped;

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

/// Windows has no process-group kill; a job object would be needed (not done).
pub fn kill_process_group(_pgid: u32) {}

pub fn exit_signal(_status: ExitStatus) -> Option<i32> {
    None
}

/// No process groups to clean here: reaping is all.
pub fn reap_with_group(child: &mut Child) -> io::Result<Option<ExitStatus>> {
    child.try_wait()
}

/// Windows has no uids; the child runs as we do.
pub fn run_as(_cmd: &mut Command, _uid: u32, _gid: u32) {}

pub fn is_executable(p: &std::path::Path) -> bool {
    p.is_file()
}

/// Spawns `cmd` and reports its end through `report`. Windows has no orphan re-parenting, so
/// there is nothing else to reap.
pub fn spawn_watched(cmd: &mut Command, mut report: impl FnMut(Reaped) + Send + 'static) -> io::Result<u32> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    std::thread::Builder::new().name("supervise-wait".into()).spawn(move || {
        let code = child.wait().ok().and_then(|s| s.code());
        report(Reaped::Child { pid, code, signal: None });
    })?;
    Ok(pid)
}

/// Windows has no PID 1.
pub fn is_pid1() -> bool {
    false
}

/// Not meaningful on Windows.
pub fn real_uid() -> u32 {
    0
}

/// Every process and its process group, `(pid, pgid)`: Windows has no process groups of this
/// kind (a candidate's tree is not tracked there).
pub fn process_groups() -> Vec<(u32, u32)> {
    Vec::new()
}
