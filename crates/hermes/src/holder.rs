//! Who holds a hermes home's `gateway.lock`, found without taking the lock.
//!
//! hermes takes its lock with a single non-blocking try: a manager that probes by locking
//! makes a starting hermes exit 1 (measured: 2 of 8 starts under a tight probe loop). So:
//! - Linux: the kernel's lock table (`/proc/locks`, gatewarden-lifecycle's `holder_pids`)
//!   names the holder; the record is only cross-checked.
//! - Elsewhere (no lock table): hermes's record, believed only while the process it names is
//!   alive with the recorded start time. The lock is never taken here either.

use gatewarden_lifecycle::holder::decide;
use gatewarden_lifecycle::identity::IdentityCheck;
use gatewarden_lifecycle::{ProcessIdentity, platform};

use crate::files::recorded_identity;
use crate::home::HermesHome;

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

/// Finds the holder. Reads `/proc/locks` and hermes's records only.
pub fn find(home: &HermesHome) -> Finding {
    let lock = home.lock();
    let recorded = recorded_identity(home);
    if !lock.exists() {
        // Someone unlinked it (hermes's own `gateway stop`/`status` do when they find it
        // free): a gateway may still hold the lock on the old inode, and a new one can start
        // beside it. Trust the record only for a live process with its start time.
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
