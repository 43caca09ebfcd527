//! macOS: `proc_pidinfo(PROC_PIDTBSDINFO)` for state and start time.
//!
//! Platform-specific behaviour: BSD info is readable only for our own user's processes (or as
//! root); for others the start time is unknown, so they probe as `Alive { start_time: None }`
//! and are never signalled. There is no pidfd, so signalling is check-then-kill.

use std::mem::MaybeUninit;

pub use super::unix::{
    canonical, create_private_dir, create_private_dir_new, credentials, dir_facts, free_space, is_link, is_transient,
    link_refused, no_follow, node_facts, private_on_create, read_hidden_line, set_private_file, stdout_to_stderr,
    sync_dir,
};
use super::unix::{kill, kill_zero};
use super::{NodeFacts, Signal, SignalOutcome};
use crate::identity::{IdentityCheck, ProcessIdentity, check_against};
use crate::liveness::{Liveness, ProcStat, classify_unix};

const SZOMB: u32 = 5;

/// An open file's facts. macOS ACLs are not POSIX ACLs and are not read: the mode decides.
pub fn open_node_facts(file: &std::fs::File) -> std::io::Result<Option<NodeFacts>> {
    Ok(Some(super::unix::node(&file.metadata()?)))
}

fn bsd_info(pid: u32) -> ProcStat {
    let Ok(ipid) = libc::c_int::try_from(pid) else {
        return ProcStat::Unreadable;
    };
    let mut info = MaybeUninit::<libc::proc_bsdinfo>::zeroed();
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    // SAFETY: the buffer is a properly sized, writable proc_bsdinfo.
    let n = unsafe { libc::proc_pidinfo(ipid, libc::PROC_PIDTBSDINFO, 0, info.as_mut_ptr().cast(), size) };
    if n != size {
        return ProcStat::Unreadable;
    }
    // SAFETY: proc_pidinfo filled all `size` bytes.
    let info = unsafe { info.assume_init() };
    let state = if info.pbi_status == SZOMB { 'Z' } else { 'S' };
    let start_time = info.pbi_start_tvsec * 100 + info.pbi_start_tvusec / 10_000;
    ProcStat::Read { state, start_time }
}

pub fn probe(pid: u32) -> Liveness {
    classify_unix(kill_zero(pid), bsd_info(pid))
}

pub fn start_time(pid: u32) -> Option<u64> {
    match bsd_info(pid) {
        ProcStat::Read { start_time, .. } => Some(start_time),
        ProcStat::Unreadable => None,
    }
}

pub fn signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome {
    match check_against(id, probe(id.pid)) {
        IdentityCheck::Same => {}
        IdentityCheck::Gone => return SignalOutcome::Gone,
        IdentityCheck::Different { .. } => return SignalOutcome::Mismatch,
        IdentityCheck::Unverifiable(why) => return SignalOutcome::Unverifiable(why),
    }
    match kill(id.pid, sig) {
        Ok(()) => SignalOutcome::Sent,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => SignalOutcome::Gone,
        Err(e) => SignalOutcome::Failed(e.to_string()),
    }
}

/// macOS has no lock table a process can read: unknown.
pub fn lock_holders(_path: &std::path::Path) -> Option<Vec<u32>> {
    None
}

/// The parent pid (`pbi_ppid`); `None` for processes we may not inspect.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let ipid = libc::c_int::try_from(pid).ok()?;
    let mut info = MaybeUninit::<libc::proc_bsdinfo>::zeroed();
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    // SAFETY: the buffer is a properly sized, writable proc_bsdinfo.
    let n = unsafe { libc::proc_pidinfo(ipid, libc::PROC_PIDTBSDINFO, 0, info.as_mut_ptr().cast(), size) };
    if n != size {
        return None;
    }
    // SAFETY: proc_pidinfo filled all `size` bytes.
    Some(unsafe { info.assume_init() }.pbi_ppid)
}

/// Not implemented on macOS (no cheap way to read another process's environment): nothing is
/// killed. Runs there die with their process group when the gateway drains.
pub fn kill_tagged(_key: &str, _accept: &dyn Fn(&str) -> bool) -> Vec<u32> {
    Vec::new()
}

pub use super::without_procfs::{
    argv, cgroup, cmdline, environ, is_stopped, port_listeners, process_uid, process_usage, processes_with_env,
    release_startup_pages, systemd_main_pid,
};
