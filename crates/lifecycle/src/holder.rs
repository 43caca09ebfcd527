//! Whom to signal for a home: the process holding its lock, identified as exactly as the OS
//! allows. Used by every path that may signal a gateway (`stop`, `run --replace`).
//!
//! The pid record says who *should* hold the lock; the kernel's lock table (where readable)
//! says who *does*. When they disagree the record has been left stale or tampered with, and
//! the kernel wins — a signal must never reach a process only because a file named it.
//!
//! Holding the lock file does not make a process a gateway either: `flock gateway.lock sleep
//! 30`, or a `gatewarden status` healing records, hold it too. Where the OS names the holder it
//! also tells its arguments, and only a `gatewarden … run` of this home is ever returned
//! ([`fits_gateway`]); anything else is reported by name (issue 22, item 1).

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
    let holder = decide(recorded, settled_holder_pids(&home.lock(), recorded), platform::start_time)?;
    let pid = holder.identity.pid;
    match platform::cmdline(pid) {
        Some(argv) => fits_gateway(&argv, &own_name(), |h| home.is(h))
            .map(|()| holder)
            .map_err(|name| format!("the lock is held by pid {pid} ({name}), which is not a gateway")),
        None => Ok(holder),
    }
}

/// This executable's file name: a gateway started from it fits whatever it is called.
fn own_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// When the OS names a lock holder that is not this home's gateway: who, for messages
/// (`start` must not call that "already running").
pub fn foreign_holder(home: &Home) -> Option<String> {
    let pids = platform::lock_holders(&home.lock())?;
    pids.iter().find_map(|&pid| {
        let argv = platform::cmdline(pid)?;
        let name = fits_gateway(&argv, &own_name(), |h| home.is(h)).err()?;
        Some(format!("the lock is held by pid {pid} ({name}), which is not a gateway"))
    })
}

/// Whether a lock holder's arguments are those of a gateway of this home: a `gatewarden`
/// executable (by name, or named as this executable is) running `run`, naming this home if it
/// names one. Pure; `Err` is the program's name (with its verb when it is gatewarden), for
/// the message.
pub fn fits_gateway(argv: &[String], own_name: &str, is_home: impl Fn(&str) -> bool) -> Result<(), String> {
    let base = |a: &str| a.rsplit(['/', '\\']).next().unwrap_or(a).to_owned();
    let program = argv.first().map(|a| base(a)).unwrap_or_default();
    let is_gatewarden = program.starts_with("gatewarden") || (!own_name.is_empty() && program == own_name);
    // A relative home is relative to the holder's directory, which we do not know. Rooted
    // counts as absolute (`/h` on Windows has a root but no drive: still not relative).
    let relative = |h: &str| !std::path::Path::new(h).has_root();
    let mut home_ok = true;
    let mut verb = None;
    let mut args = argv.iter().skip(1);
    while let Some(a) = args.next() {
        if a == "--home" {
            home_ok &= args.next().is_some_and(|h| relative(h) || is_home(h));
        } else if let Some(h) = a.strip_prefix("--home=") {
            home_ok &= relative(h) || is_home(h);
        } else if a == "--hermes-home" {
            args.next();
        } else if !a.starts_with('-') && verb.is_none() {
            verb = Some(a.as_str());
        }
    }
    match (is_gatewarden, verb) {
        (true, Some("run")) if home_ok => Ok(()),
        (true, Some(v)) => Err(format!("{program} {v}")),
        _ => Err(if program.is_empty() { "unknown".into() } else { program }),
    }
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
    fn only_a_gatewarden_run_of_this_home_fits() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let home = |h: &str| h == "/h";
        assert_eq!(
            fits_gateway(&argv(&["/usr/bin/gatewarden", "--home", "/h", "run", "--listen", "x"]), "gw", home),
            Ok(())
        );
        assert_eq!(fits_gateway(&argv(&["gatewarden-9.9.9", "run", "--supervisor", "none"]), "gw", home), Ok(()));
        assert_eq!(fits_gateway(&argv(&["C:\\gw\\gatewarden.exe", "--home=/h", "run"]), "gw", home), Ok(()));
        assert_eq!(fits_gateway(&argv(&["flock", "/h/gateway.lock", "sleep", "30"]), "gw", home), Err("flock".into()));
        assert_eq!(
            fits_gateway(&argv(&["/bin/gatewarden", "--home", "/h", "status"]), "gw", home),
            Err("gatewarden status".into())
        );
        assert_eq!(
            fits_gateway(&argv(&["gatewarden", "--home", "/other", "run"]), "gw", home),
            Err("gatewarden run".into())
        );
        assert_eq!(fits_gateway(&argv(&["sleep", "run"]), "gw", home), Err("sleep".into()));
        assert_eq!(fits_gateway(&[], "gw", home), Err("unknown".into()));
        assert_eq!(
            fits_gateway(&argv(&["/opt/gw", "--hermes-home", "x", "run"]), "gw", home),
            Ok(()),
            "renamed like us"
        );
    }

    #[test]
    fn without_a_lock_table_the_record_is_used() {
        assert_eq!(decide(Some(REC), None, |_| None).unwrap().identity, REC);
        assert!(decide(None, None, |_| None).is_err());
    }
}
