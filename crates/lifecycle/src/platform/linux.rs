//! Linux: `/proc/<pid>/stat` for state and start time, `pidfd` for race-free signalling.

use std::path::Path;

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, pidfd_open, pidfd_send_signal};

pub use super::unix::{canonical, create_private_dir, set_private_file, sync_dir};
use super::unix::{kill, kill_zero, to_rustix};
use super::{Signal, SignalOutcome};
use crate::identity::{IdentityCheck, ProcessIdentity, check_against};
use crate::probe::{Liveness, ProcStat, classify_unix, parse_proc_stat};

fn proc_stat(pid: u32) -> ProcStat {
    match std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")) {
        Ok(bytes) => match parse_proc_stat(&bytes) {
            Some((state, start_time)) => ProcStat::Read { state, start_time },
            None => ProcStat::Unreadable,
        },
        Err(_) => ProcStat::Unreadable,
    }
}

pub fn probe(pid: u32) -> Liveness {
    let k = kill_zero(pid);
    let live = classify_unix(k, proc_stat(pid));
    if live == (Liveness::Alive { start_time: None }) && kill_zero(pid) == crate::probe::KillZero::NoSuchProcess {
        // The stat read lost a race with the exit.
        return Liveness::Dead;
    }
    live
}

pub fn start_time(pid: u32) -> Option<u64> {
    match proc_stat(pid) {
        ProcStat::Read { start_time, .. } => Some(start_time),
        ProcStat::Unreadable => None,
    }
}

/// Opens a pidfd first, then re-verifies the start time, then signals through the pidfd: the
/// pidfd pins the process, so a pid recycled after the check cannot receive the signal.
pub fn signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome {
    let Some(pid) = i32::try_from(id.pid).ok().and_then(Pid::from_raw) else {
        return SignalOutcome::Gone;
    };
    let pidfd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => Some(fd),
        Err(Errno::SRCH) => return SignalOutcome::Gone,
        // Kernels before 5.3, or seccomp: fall back to check-then-kill.
        Err(_) => None,
    };
    match check_against(id, probe(id.pid)) {
        IdentityCheck::Same => {}
        IdentityCheck::Gone => return SignalOutcome::Gone,
        IdentityCheck::Different { .. } => return SignalOutcome::Mismatch,
        IdentityCheck::Unverifiable(why) => return SignalOutcome::Unverifiable(why),
    }
    let sent = match &pidfd {
        Some(fd) => pidfd_send_signal(fd, to_rustix(sig)).map_err(std::io::Error::from),
        None => kill(id.pid, sig),
    };
    match sent {
        Ok(()) => SignalOutcome::Sent,
        Err(e) if e.raw_os_error() == Some(Errno::SRCH.raw_os_error()) => SignalOutcome::Gone,
        Err(e) => SignalOutcome::Failed(e.to_string()),
    }
}

/// Holders of the flock on `path`, from `/proc/locks`.
pub fn lock_holders(path: &std::path::Path) -> Option<Vec<u32>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let dev = meta.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    Some(crate::lock::parse_proc_locks(&text, major, minor, meta.ino()))
}

/// The parent pid, from field 4 of `/proc/<pid>/stat`.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let bytes = std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    crate::probe::parse_proc_stat_ppid(&bytes)
}
