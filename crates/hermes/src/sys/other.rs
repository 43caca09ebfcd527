//! Other OSes: no detaching.

use std::process::Command;

pub fn detach(_cmd: &mut Command) {}

pub fn own_process_group(_cmd: &mut Command) {}

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
