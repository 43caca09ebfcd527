//! Who holds a hermes home's `gateway.lock`, found without taking the lock.
//!
//! hermes takes its lock with a single non-blocking try: a manager that probes by locking
//! makes a starting hermes exit 1 (measured: 2 of 8 starts under a tight probe loop). So:
//! - Linux: the kernel's lock table (`/proc/locks`, gatewarden-lifecycle's `holder_pids`)
//!   names the holder; the record is only cross-checked.
//! - Elsewhere (no lock table): hermes's record, believed only while the process it names is
//!   alive with the recorded start time. The lock is never taken here either.
//!
//! A live process is not enough to be signalled: the home may belong to someone less
//! privileged than us, who writes `gateway.pid` naming any process (its start time is public
//! in `/proc`), or hard-links `gateway.lock` to a file some other daemon locks. [`judge`]
//! decides, from [`Evidence`], whether a candidate is proven to be this home's gateway;
//! one that is not is [`Finding::Unproven`], reported and never signalled.

use gatewarden_lifecycle::holder::decide;
use gatewarden_lifecycle::identity::IdentityCheck;
use gatewarden_lifecycle::{ProcessIdentity, platform};

use crate::files::recorded_identity;
use crate::home::HermesHome;
use crate::sys;

/// How the holder was identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The kernel's lock table.
    Kernel,
    /// hermes's record, re-verified against the live process.
    Record,
}

/// What looking for the holder found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Held {
        identity: ProcessIdentity,
        source: Source,
        note: Option<String>,
    },
    /// No live process holds it (or the lock file does not exist).
    Free,
    /// A live process that the lock or the record points at, not proven to be this home's
    /// hermes gateway ([`judge`]): never signalled. `holds_lock`: the kernel says it holds
    /// `gateway.lock` (a hermes could not start beside it).
    Unproven {
        identity: ProcessIdentity,
        holds_lock: bool,
        why: String,
    },
    /// Something holds it (or may), but it cannot be identified: never signal.
    Unknown(String),
}

impl Finding {
    pub fn identity(&self) -> Option<ProcessIdentity> {
        match self {
            Finding::Held { identity, .. } => Some(*identity),
            _ => None,
        }
    }
}

/// What is known about a candidate, for [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    /// The kernel's lock table says it holds `gateway.lock`; `false`: only hermes's record
    /// names it (no lock table on this OS, or no lock file).
    pub holds_lock: bool,
    pub lock_file_exists: bool,
    /// Its command line and environment are `hermes gateway run` for this `HERMES_HOME`;
    /// `None`: this OS (or our rights) cannot tell.
    pub runs_hermes_here: Option<bool>,
    pub target_uid: Option<u32>,
    pub home_owner: Option<u32>,
    pub me: Option<u32>,
}

/// Whether a candidate is proven to be this home's gateway: `Ok(how)` or `Err(why not)`.
/// The rules, in order:
/// 1. its command line and environment say `hermes gateway run` for this home: proven;
/// 2. it holds the lock (kernel) and runs as the home's owner: proven. Another uid holding a
///    file of a home it does not own is how a hard link to some daemon's lock file looks;
/// 3. named only by the record: never with the lock file gone (anyone can write a record),
///    and otherwise only when nobody else controls the record (the home, the process and we
///    are one uid) and the process is not known to be something else.
pub fn judge(pid: u32, e: &Evidence) -> Result<&'static str, String> {
    if e.runs_hermes_here == Some(true) {
        return Ok("its command line and environment are `hermes gateway run` for this home");
    }
    let uid = |u: Option<u32>| u.map_or("?".to_string(), |u| u.to_string());
    let not_hermes = match e.runs_hermes_here {
        Some(false) => "its command line and environment are not `hermes gateway run` for this home",
        _ => "its command line and environment cannot be read",
    };
    let same = |a: Option<u32>, b: Option<u32>| a.is_none() || b.is_none() || a == b;
    if e.holds_lock {
        if same(e.target_uid, e.home_owner) {
            return Ok("it holds gateway.lock (kernel lock table)");
        }
        return Err(format!(
            "pid {pid} holds gateway.lock but runs as uid {}, not as the home's owner (uid {}), and {not_hermes}",
            uid(e.target_uid),
            uid(e.home_owner)
        ));
    }
    if !e.lock_file_exists {
        return Err(format!("gateway.lock is missing and only gateway.pid names pid {pid}; {not_hermes}"));
    }
    if e.runs_hermes_here == Some(false) {
        return Err(format!("gateway.pid names pid {pid}, but {not_hermes}"));
    }
    if same(e.target_uid, e.me) && same(e.home_owner, e.me) {
        return Ok("named by hermes's record, alive with the recorded start time");
    }
    Err(format!(
        "only gateway.pid names pid {pid} (uid {}), a record that uid {} controls; {not_hermes}",
        uid(e.target_uid),
        uid(e.home_owner)
    ))
}

/// Whether `pid` runs `hermes gateway run` for `home` (`HERMES_HOME`, else `$HOME/.hermes`,
/// compared canonically). `None` when its command line or environment cannot be read.
pub fn runs_hermes_here(home: &HermesHome, pid: u32) -> Option<bool> {
    let argv = platform::argv(pid)?;
    let env = platform::environ(pid)?;
    let var = |k: &str| {
        env.split(|&b| b == 0).find_map(|kv| kv.strip_prefix(k.as_bytes()).and_then(|r| r.strip_prefix(b"=")))
    };
    let path = |b: &[u8]| std::path::PathBuf::from(String::from_utf8_lossy(b).into_owned());
    let theirs = match var("HERMES_HOME").filter(|v| !v.is_empty()) {
        Some(h) => path(h),
        None => path(var("HOME")?).join(".hermes"),
    };
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let words = argv.iter().any(|a| a == "gateway") && argv.iter().any(|a| a == "run");
    Some(words && canon(&theirs) == canon(home.dir()))
}

/// Finds the holder. Reads `/proc/locks`, `/proc/<pid>` and hermes's records only.
pub fn find(home: &HermesHome) -> Finding {
    let lock_file_exists = home.lock().exists();
    match candidate(home, lock_file_exists) {
        Finding::Held { identity, source, note } => {
            let evidence = Evidence {
                holds_lock: source == Source::Kernel,
                lock_file_exists,
                runs_hermes_here: runs_hermes_here(home, identity.pid),
                target_uid: platform::process_uid(identity.pid),
                home_owner: home.owner().ok().flatten().map(|(uid, _)| uid),
                me: sys::effective_uid(),
            };
            match judge(identity.pid, &evidence) {
                Ok(_) => Finding::Held { identity, source, note },
                Err(why) => Finding::Unproven { identity, holds_lock: evidence.holds_lock, why },
            }
        }
        other => other,
    }
}

/// The process the lock table or the record points at, before [`judge`].
fn candidate(home: &HermesHome, lock_file_exists: bool) -> Finding {
    let lock = home.lock();
    let recorded = recorded_identity(home);
    if !lock_file_exists {
        // Someone unlinked it (hermes's own `gateway stop`/`status` do when they find it
        // free): a gateway may still hold the lock on the old inode, and a new one can start
        // beside it. The record is a candidate only for a live process with its start time.
        return match recorded.map(|r| (r, r.check())) {
            Some((identity, IdentityCheck::Same)) => Finding::Held {
                identity,
                source: Source::Record,
                note: Some(format!("gateway.lock is missing while pid {} runs: someone unlinked it", identity.pid)),
            },
            _ => Finding::Free,
        };
    }
    let kernel = gatewarden_lifecycle::holder::settled_holder_pids(&lock, recorded);
    let source = if kernel.is_some() { Source::Kernel } else { Source::Record };
    match (kernel, recorded) {
        (Some(pids), _) if pids.is_empty() => Finding::Free,
        (None, None) => Finding::Free,
        (None, Some(r)) => match r.check() {
            IdentityCheck::Same => Finding::Held { identity: r, source, note: None },
            IdentityCheck::Gone | IdentityCheck::Different { .. } => Finding::Free,
            IdentityCheck::Unverifiable(why) => Finding::Unknown(why),
        },
        (kernel, recorded) => match decide(recorded, kernel, platform::start_time) {
            Ok(h) => {
                // The record's start time is believed only if the live process agrees.
                let mut identity = h.identity;
                if let Some(live) = platform::start_time(identity.pid) {
                    identity.start_time = live;
                }
                Finding::Held { identity, source, note: h.note }
            }
            Err(why) => Finding::Unknown(why),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(holds_lock: bool, lock_file_exists: bool, hermes: Option<bool>, uids: [Option<u32>; 3]) -> Evidence {
        let [target_uid, home_owner, me] = uids;
        Evidence { holds_lock, lock_file_exists, runs_hermes_here: hermes, target_uid, home_owner, me }
    }

    #[test]
    fn a_proven_hermes_is_stoppable_whoever_runs_it() {
        // Root's hermes in a user's home (an old unit without User=): its argv and env prove it.
        assert!(judge(9, &ev(true, true, Some(true), [Some(0), Some(1000), Some(0)])).is_ok());
        assert!(judge(9, &ev(false, false, Some(true), [Some(0), Some(1000), Some(0)])).is_ok());
    }

    #[test]
    fn a_record_alone_never_proves_with_the_lock_file_gone() {
        // The attack of issue 18 item 2: the owner names root's process in gateway.pid.
        let e = judge(42, &ev(false, false, Some(false), [Some(0), Some(1000), Some(0)])).unwrap_err();
        assert!(e.contains("gateway.lock is missing") && e.contains("pid 42"), "{e}");
        // Even one's own process: a record is not proof.
        assert!(judge(42, &ev(false, false, Some(false), [Some(7), Some(7), Some(7)])).is_err());
        assert!(judge(42, &ev(false, false, None, [Some(7), Some(7), Some(7)])).is_err());
    }

    #[test]
    fn a_lock_holder_of_another_uid_is_how_a_planted_hard_link_looks() {
        assert!(judge(5, &ev(true, true, Some(false), [Some(1000), Some(1000), Some(0)])).is_ok());
        assert!(judge(5, &ev(true, true, None, [Some(1000), Some(1000), Some(7)])).is_ok());
        let e = judge(5, &ev(true, true, Some(false), [Some(0), Some(1000), Some(2000)])).unwrap_err();
        assert!(e.contains("uid 0") && e.contains("uid 1000"), "{e}");
        // Root stopping a user's home, a root daemon holding the (hard-linked) lock: refused
        // unless argv/env prove hermes.
        assert!(judge(5, &ev(true, true, Some(false), [Some(0), Some(1000), Some(0)])).is_err());
        assert!(judge(5, &ev(true, true, None, [Some(7), Some(1000), Some(7)])).is_err());
    }

    #[test]
    fn a_record_with_the_lock_present_needs_one_uid_all_round() {
        // No lock table (macOS): today's behaviour when nobody else controls the record.
        assert!(judge(3, &ev(false, true, None, [Some(501), Some(501), Some(501)])).is_ok());
        assert!(judge(3, &ev(false, true, None, [None, None, None])).is_ok());
        assert!(judge(3, &ev(false, true, None, [Some(0), Some(501), Some(0)])).is_err());
        assert!(judge(3, &ev(false, true, Some(false), [Some(501), Some(501), Some(501)])).is_err());
    }
}
