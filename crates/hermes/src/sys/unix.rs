//! Unix: sessions and process groups.

use std::os::unix::process::CommandExt;
use std::process::Command;

pub fn detach(cmd: &mut Command) {
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| rustix::process::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
}

pub fn own_process_group(cmd: &mut Command) {
    cmd.process_group(0);
}

pub fn kill_process_group(pgid: u32) {
    if let Some(pid) = i32::try_from(pgid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

pub fn exit_signal(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// If `child` has exited: SIGKILL what is left of its process group, then reap it. The group
/// is killed *before* the reap, while the exited child still reserves its pid (and so the
/// group id): after the reap a new, unrelated group could get that id.
pub fn reap_with_group(child: &mut std::process::Child) -> std::io::Result<Option<std::process::ExitStatus>> {
    use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
    let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) else { return child.try_wait() };
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    match waitid(WaitId::Pid(pid), opts) {
        Ok(Some(_)) => {
            kill_process_group(child.id());
            child.wait().map(Some)
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A regular file with an execute bit (following links: a venv's `bin/python` is one).
pub fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
