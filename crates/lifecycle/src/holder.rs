//! Whom to signal for a home: the process holding its lock, identified as exactly as the OS
//! allows. Used by every path that may signal a gateway (`stop`, `run --replace`).
//!
//! The pid record says who *should* hold the lock; the kernel's lock table (where readable)
//! says who *does*. When they disagree the record has been left stale or tampered with, and
//! the kernel wins — a signal must never reach a process only because a file named it.

use crate::home::Home;
use crate::identity::ProcessIdentity;
use crate::lock::holder_pids;
use crate::platform;
use crate::records::read_pid_record;

/// The process to signal, and a note when the record disagreed with the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub identity: ProcessIdentity,
    pub note: Option<String>,
}

pub fn lock_holder(home: &Home) -> Result<Holder, String> {
    let recorded = read_pid_record(&home.pid_file()).ok().and_then(|r| r.identity());
    decide(recorded, settled_holder_pids(&home.lock(), recorded), platform::start_time)
}

/// The kernel's holders of `lock` (`None` where the OS does not tell), read again when the
/// answer disagrees with `recorded`: /proc/locks is generated page by page while other
/// processes take and drop locks, so one read can miss a line. Look again before overruling
/// the record or finding nobody.
pub fn settled_holder_pids(lock: &std::path::Path, recorded: Option<ProcessIdentity>) -> Option<Vec<u32>> {
    let mut kernel = holder_pids(lock);
    for _ in 0..2 {
        let settled = match (&kernel, recorded) {
            (None, _) => true,
            (Some(pids), Some(r)) => pids.contains(&r.pid),
            (Some(pids), None) => !pids.is_empty(),
        };
        if settled {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        kernel = holder_pids(lock);
    }
    kernel
}

/// Pure decision behind [`lock_holder`].
pub fn decide(
    recorded: Option<ProcessIdentity>,
    kernel: Option<Vec<u32>>,
    start_time: impl Fn(u32) -> Option<u64>,
) -> Result<Holder, String> {
    match kernel {
        // The OS cannot tell: the record (re-verified before any signal) is all there is.
        None => recorded.map(|identity| Holder { identity, note: None }).ok_or_else(|| {
            "gateway.pid does not identify the lock holder (missing, unreadable or without a start time)".to_string()
        }),
        Some(pids) if pids.is_empty() => Err("no process holds the lock any more".into()),
        Some(pids) => {
            if let Some(r) = recorded.filter(|r| pids.contains(&r.pid)) {
                return Ok(Holder { identity: r, note: None });
            }
            let pid = pids[0];
            let start = start_time(pid).ok_or_else(|| format!("the lock holder pid {pid} cannot be identified"))?;
            let note = match recorded {
                Some(r) => format!("gateway.pid names pid {}, but the kernel says pid {pid} holds the lock", r.pid),
                None => format!("gateway.pid is unusable; the kernel says pid {pid} holds the lock"),
            };
            Ok(Holder { identity: ProcessIdentity { pid, start_time: start }, note: Some(note) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REC: ProcessIdentity = ProcessIdentity { pid: 10, start_time: 100 };

    #[test]
    fn kernel_beats_a_disagreeing_record() {
        let st = |pid: u32| Some(u64::from(pid) * 10);
        assert_eq!(decide(Some(REC), Some(vec![10]), st).unwrap(), Holder { identity: REC, note: None });
        let h = decide(Some(REC), Some(vec![20]), st).unwrap();
        assert_eq!(h.identity, ProcessIdentity { pid: 20, start_time: 200 });
        assert!(h.note.unwrap().contains("pid 20 holds"));
        assert!(decide(Some(REC), Some(vec![]), st).is_err());
        assert!(decide(Some(REC), Some(vec![20]), |_| None).is_err());
    }

    #[test]
    fn without_a_lock_table_the_record_is_used() {
        assert_eq!(decide(Some(REC), None, |_| None).unwrap().identity, REC);
        assert!(decide(None, None, |_| None).is_err());
    }
}
