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
/// home; one that still claims a live gateway is closed by [`record_unrecorded_exit`].
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
    if let Some(what) = record_unrecorded_exit(home, by) {
        removed.push(what);
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

/// What `exited` says for an incarnation that ended without recording its exit: nobody can
/// tell why (SIGKILL, the OOM killer, a power cut and a crash before the exit path look alike
/// from here).
pub const UNRECORDED_EXIT: &str = "ended without recording an exit; why is not known";

/// A state file of this home that still claims a live gateway, with the lock free: that
/// incarnation ended without its exit path. Its `exited` line is added on its behalf (its pid,
/// start time and incarnation; `code` null, `intent` `unknown`, what the record tells, and
/// `recorded_by`), and the state file is closed as `stopped`, so this happens once: the lock
/// guard [`heal_stale`] requires keeps a second healer out meanwhile. Returns what was done.
fn record_unrecorded_exit(home: &Home, by: &str) -> Option<String> {
    let state_file = home.state_file();
    let mut s = crate::records::read_state(&state_file).ok()?;
    if s.gateway_state == crate::records::GatewayState::Stopped || s.record.home.as_deref().is_some_and(|h| !home.is(h))
    {
        return None;
    }
    let last = s.gateway_state.as_str().to_owned();
    let writer =
        Writer { pid: s.record.pid, start_time: s.record.start_time, incarnation: s.record.incarnation.clone() };
    // The one end that is known: the stopper's verified SIGKILL, which it recorded.
    let (intent, reason) = match known_end(home, s.record.pid, s.record.start_time, s.record.started_at.as_deref()) {
        Some(Known::Stopper(by)) => {
            ("killed", format!("killed with SIGKILL by the stopper ({by}) after it did not stop in time"))
        }
        Some(Known::Supervisor(exit)) => {
            ("unknown", format!("{UNRECORDED_EXIT} by itself; its supervisor reported: {exit}"))
        }
        None => ("unknown", UNRECORDED_EXIT.to_owned()),
    };
    let fields = json!({
        "code": null, "intent": intent, "reason": reason,
        "last_state": last, "last_seen": s.updated_at, "started_at": s.record.started_at,
        "recorded_by": {"pid": std::process::id(), "by": by},
    });
    let _ = Ledger::new(home.ledger(), writer).append("exited", fields);
    let seen = s.updated_at.as_deref().map(|t| format!(", last seen {last} at {t}")).unwrap_or_default();
    s.gateway_state = crate::records::GatewayState::Stopped;
    s.exit_reason = Some(format!("{reason} (pid {}{seen})", s.record.pid));
    s.exit_code = None;
    s.active_runs = 0;
    s.updated_at = Some(crate::timefmt::now());
    let _ = fsio::write_json(&state_file, &s);
    Some(format!("gateway_state.json (closed: pid {} {UNRECORDED_EXIT})", s.record.pid))
}

/// What others recorded about how an incarnation ended.
enum Known {
    /// The stopper's verified SIGKILL (`stop_escalated`), and for whom.
    Stopper(String),
    /// Its supervisor's account after it started (`crash_backoff`'s `exit`, as systemd or
    /// `supervise` saw it).
    Supervisor(String),
}

/// How `pid` (of that start time, started at `started_at`) ended, when someone who saw it
/// recorded it; the newest account first.
fn known_end(home: &Home, pid: u32, start_time: Option<u64>, started_at: Option<&str>) -> Option<Known> {
    use serde_json::Value;
    let crate::fsio::ReadOutcome::Ok(lines) = crate::ledger::read_tail(&home.ledger(), Some(200)) else { return None };
    let since = started_at.and_then(crate::timefmt::parse);
    lines.iter().rev().find_map(|l| {
        let crate::ledger::Line::Event(e) = l else { return None };
        match e.get("event")?.as_str()? {
            "stop_escalated" => {
                let t = e.get("target")?;
                let same = t.get("pid")?.as_u64()? == u64::from(pid)
                    && start_time.is_none_or(|st| t.get("start_time").and_then(Value::as_u64) == Some(st));
                same.then(|| Known::Stopper(e.get("by").and_then(Value::as_str).unwrap_or("stop").to_owned()))
            }
            "crash_backoff" => {
                let at = e.get("ts").and_then(Value::as_str).and_then(crate::timefmt::parse)?;
                let after = since.is_some_and(|s| at >= s);
                after.then(|| e.get("exit").and_then(Value::as_str).map(|x| Known::Supervisor(x.to_owned()))).flatten()
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Line, read_tail};
    use crate::records::{GatewayState, read_state};

    fn events(home: &Home, name: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let crate::fsio::ReadOutcome::Ok(lines) = read_tail(&home.ledger(), None) else { return Vec::new() };
        lines
            .into_iter()
            .filter_map(|l| match l {
                Line::Event(e) if e.get("event").and_then(|v| v.as_str()) == Some(name) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// A state file still claiming `running` with the lock free gets one `exited` on behalf
    /// of that incarnation ("why is not known", with what the record tells) and is closed;
    /// the next heal adds nothing. The stopper's recorded SIGKILL is a known end.
    #[test]
    fn an_unrecorded_end_is_recorded_once_and_says_only_what_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path()).ensure().unwrap();
        let state = |pid: u32| {
            json!({"pid": pid, "start_time": 77, "incarnation": "aaaaaaaaaaaaaaaa", "home": home.dir(),
                   "gateway_state": "running", "updated_at": "2026-12-01T10:00:00+00:00",
                   "started_at": "2026-12-01T09:59:00+00:00"})
        };
        std::fs::write(home.state_file(), state(4242).to_string()).unwrap();
        let lock = InstanceLock::acquire(&home.lock(), std::time::Duration::from_secs(1)).unwrap();
        let cleaned = heal_stale(&home, &lock, "status", None, &[]);
        assert!(cleaned.iter().any(|c| c.contains("gateway_state.json (closed")), "{cleaned:?}");
        let ex = events(&home, "exited");
        assert_eq!(ex.len(), 1);
        let e = &ex[0];
        assert_eq!((e["pid"].as_u64(), e["incarnation"].as_str()), (Some(4242), Some("aaaaaaaaaaaaaaaa")));
        assert_eq!((e["code"].is_null(), e["intent"].as_str()), (true, Some("unknown")));
        assert_eq!(e["reason"].as_str(), Some(UNRECORDED_EXIT));
        assert_eq!(e["last_state"].as_str(), Some("running"));
        assert_eq!(e["recorded_by"]["by"].as_str(), Some("status"));
        let s = read_state(&home.state_file()).ok().unwrap();
        assert_eq!(s.gateway_state, GatewayState::Stopped);
        assert!(s.exit_reason.unwrap().contains("last seen running at 2026-12-01T10:00:00"));
        heal_stale(&home, &lock, "status", None, &[]);
        assert_eq!(events(&home, "exited").len(), 1, "recorded once");

        // Killed by the stopper, which said so: that is known.
        std::fs::write(home.state_file(), state(4343).to_string()).unwrap();
        let stopper = Ledger::new(home.ledger(), Writer::current());
        stopper.append("stop_escalated", json!({"target": {"pid": 4343, "start_time": 77}, "by": "stop"})).unwrap();
        heal_stale(&home, &lock, "run", None, &[]);
        let ex = events(&home, "exited");
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[1]["intent"].as_str(), Some("killed"));
        assert!(ex[1]["reason"].as_str().unwrap().contains("by the stopper (stop)"), "{:?}", ex[1]);
    }
}
