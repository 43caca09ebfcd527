//! Windows: detached consoles and new process groups.

use std::os::windows::process::CommandExt;
use std::process::Command;

const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
const DETACHED_PROCESS: u32 = 0x0000_0008;

pub fn detach(cmd: &mut Command) {
    cmd.creation_flags(CREATE_NEW_PROCESS_GROUP | DETACHED_PROCESS);
}

pub fn own_process_group(cmd: &mut Command) {
    cmd.creation_flags(CREATE_NEW_PROCESS_GROUP);
}

/// Windows has no process-group kill; a job object would be needed (not done).
pub fn kill_process_group(_pgid: u32) {}

pub fn exit_signal(_status: std::process::ExitStatus) -> Option<i32> {
    None
}

/// No process groups to clean here: reaping is all.
pub fn reap_with_group(child: &mut std::process::Child) -> std::io::Result<Option<std::process::ExitStatus>> {
    child.try_wait()
}

pub fn is_executable(p: &std::path::Path) -> bool {
    p.is_file()
}
