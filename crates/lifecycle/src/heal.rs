//! Self-healing of stale state. Callable only with the instance lock in hand: when the lock is
//! free, every record is stale by definition, and holding it while cleaning keeps a starting
//! gateway from writing its records in the middle of the cleanup.

use std::path::PathBuf;

use serde_json::json;

use crate::fsio;
use crate::home::Home;
use crate::ledger::{Ledger, Writer};
use crate::lock::InstanceLock;
use crate::marker::{self, MarkerKind, SelfIdentity, Verdict};

/// Removes what a dead gateway left behind: the pid record, bad markers, and `extra` files
/// (e.g. the control socket). Markers naming another live process are kept. The state file is
/// kept too (its last `gateway_state` is history, reported as such), unless it names another
/// home.
/// Returns the names removed, also recorded in the ledger as `stale_cleaned`.
pub fn heal_stale(
    home: &Home,
    _held: &InstanceLock,
    by: &str,
    me: Option<&SelfIdentity>,
    extra: &[PathBuf],
) -> Vec<String> {
    let mut removed = Vec::new();
    let pid_file = home.pid_file();
    let pid_is_ours =
        me.is_some_and(|me| crate::records::read_pid_record(&pid_file).ok().is_some_and(|r| r.pid == me.pid));
    if !pid_is_ours && fsio::remove_if_exists(&pid_file).unwrap_or(false) {
        removed.push("gateway.pid".to_string());
    }
    // A state file copied from another home (a cloned profile, a restored backup) describes
    // that home's gateway, not ours: it is not our history.
    let state_file = home.state_file();
    if let Some(other) = crate::records::read_state(&state_file).ok().and_then(|s| s.record.home)
        && !home.is(&other)
        && fsio::remove_if_exists(&state_file).unwrap_or(false)
    {
        removed.push(format!("gateway_state.json (names another home, {other})"));
    }
    for kind in [MarkerKind::PlannedStop, MarkerKind::Takeover] {
        if let Verdict::Removed { why } = marker::probe(home.dir(), kind, me, crate::probe::probe_u32) {
            removed.push(format!("{} ({why})", kind.file_name()));
        }
    }
    for p in extra {
        if fsio::remove_if_exists(p).unwrap_or(false) {
            removed.push(p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        }
    }
    if !removed.is_empty() {
        let ledger = Ledger::new(home.ledger(), Writer::current());
        let _ = ledger.append("stale_cleaned", json!({"files": removed, "by": by}));
    }
    removed
}
