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

/// When we run as root, hands `file` to the owner of `dir` (mode 0644, like hermes's own
/// JSON files), so the process that owns the home can read and unlink it.
pub fn give_to_owner_of(file: &std::fs::File, dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    if rustix::process::geteuid().is_root() {
        let meta = std::fs::metadata(dir)?;
        let (uid, gid) = (rustix::fs::Uid::from_raw(meta.uid()), rustix::fs::Gid::from_raw(meta.gid()));
        rustix::fs::fchown(file, Some(uid), Some(gid))?;
    }
    Ok(())
}
