//! What an OS without Unix process groups, uids or PID 1 does (Windows and the rest): one
//! copy, re-exported by `windows.rs` and `other.rs`.

use std::io;
use std::process::{Child, Command, ExitStatus};

use super::Reaped;

/// No process-group kill (Windows would need a job object: not done).
pub fn kill_process_group(_pgid: u32) {}

pub fn exit_signal(_status: ExitStatus) -> Option<i32> {
    None
}

/// No process groups to clean here: reaping is all.
pub fn reap_with_group(child: &mut Child) -> io::Result<Option<ExitStatus>> {
    child.try_wait()
}

/// No uids: the child runs as we do.
pub fn run_as(_cmd: &mut Command, _uid: u32, _gid: u32) {}

pub fn is_executable(p: &std::path::Path) -> bool {
    p.is_file()
}

/// Spawns `cmd` and reports its end through `report`. No orphan re-parenting here, so there
/// is nothing else to reap.
pub fn spawn_watched(cmd: &mut Command, mut report: impl FnMut(Reaped) + Send + 'static) -> io::Result<u32> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    std::thread::Builder::new().name("supervise-wait".into()).spawn(move || {
        let code = child.wait().ok().and_then(|s| s.code());
        report(Reaped::Child { pid, code, signal: None });
    })?;
    Ok(pid)
}

/// No PID-namespace init here.
pub fn is_pid1() -> bool {
    false
}

/// No zombies to see here.
pub fn zombie_children(_me: u32) -> Vec<u32> {
    Vec::new()
}

/// No PID 1 of ours to reap for here: nothing started.
pub fn reap_orphans(_grace: std::time::Duration) -> bool {
    false
}

/// Not meaningful without Unix uids.
pub fn real_uid() -> u32 {
    0
}

/// Every process and its process group, `(pid, pgid)`: no process groups of this kind here
/// (a candidate's tree is not tracked).
pub fn process_groups() -> Vec<(u32, u32)> {
    Vec::new()
}
