//! The processes an update started itself, and the ending of those it leaves behind: a
//! rollback or a commit ends only what this transaction started (never a bystander, nor what a
//! concurrent verb started), each process pinned by its identity.

use std::time::{Duration, Instant};

use gatewarden_lifecycle::ledger::Ledger;
use gatewarden_lifecycle::{Home, fsio};
use serde_json::json;

use super::Txn;

/// A candidate that hangs before it takes the lock may still hold the listening socket it
/// inherited, and the old version could not bind it: kill what listens on the gateway's
/// port without holding a gateway lock, if this update started it ([`ours`]: a
/// member of the process group of a process it started, so never a bystander, nor the
/// successor a concurrent `restart` is starting), pinned by its identity.
pub(super) fn kill_unready(home: &Home, ledger: &Ledger, t: &Txn) {
    let Some(me) = gatewarden_lifecycle::ProcessIdentity::current() else { return };
    let listen = gatewarden_lifecycle::records::read_state(&home.state_file()).ok().and_then(|s| s.listen);
    let Some(port) = listen.and_then(|l| l.parse::<std::net::SocketAddr>().ok()).map(|a| a.port()) else { return };
    use gatewarden_lifecycle::platform;
    let ours = ours(home, t);
    let groups = platform::spawn::process_groups();
    let pgid_of = |pid: u32| groups.iter().find(|(p, _)| *p == pid).map(|(_, g)| *g);
    for l in platform::port_listeners(port) {
        let Some(start_time) = platform::start_time(l.pid) else { continue };
        if l.home.is_some() || l.pid == me.pid || start_time < me.start_time {
            continue;
        }
        if !pgid_of(l.pid).is_some_and(|g| ours.contains(&g)) {
            continue;
        }
        let id = gatewarden_lifecycle::ProcessIdentity { pid: l.pid, start_time };
        let sent = platform::signal_verified(&id, platform::Signal::Kill);
        errln!("killing {l}, a new-version process that never became ready: {sent:?}");
        let _ = ledger.append("update_killed_candidate", json!({"pid": l.pid, "program": l.program}));
    }
}

/// The processes this update started itself since transaction `t` began, read from the
/// ledger ([`started_by`]): never one a concurrent verb started (issue 30, item 5: a
/// rollback killed the successor a concurrent `restart` had just spawned).
fn ours(home: &Home, t: &Txn) -> Vec<u32> {
    let me = [std::process::id(), crate::orchestrator::requester_pid()];
    let mut events = Vec::new();
    if let fsio::ReadOutcome::Ok(lines) = gatewarden_lifecycle::ledger::read_tail(&home.ledger(), Some(2000)) {
        for line in lines {
            let gatewarden_lifecycle::ledger::Line::Event(e) = line else { continue };
            if e.get("ts").and_then(|v| v.as_str()).is_some_and(|ts| ts >= t.started.as_str()) {
                events.push(e);
            }
        }
    }
    started_by(&me, &events)
}

/// Ends every process group a candidate of this transaction started, except the one of
/// `keep` (the gateway the transaction ends with) and this updater's own. The leaders are
/// the processes this update started itself ([`ours`]); a group is ended only
/// when every member started after this updater (so never a group that was there before,
/// like the one a test harness or shell started the old gateway in), each member pinned by
/// (pid, start time) and killed through `signal_verified`. Without this a candidate that
/// hangs without taking the lock outlives the rollback, and a forked child that holds the
/// lock after its candidate exited keeps the old version from starting (issue 18, item 10).
pub(super) fn end(home: &Home, ledger: &Ledger, t: &Txn, keep: Option<u32>) {
    use gatewarden_lifecycle::{ProcessIdentity, platform};
    let Some(me) = ProcessIdentity::current() else { return };
    let started_after_me = |pid: u32| platform::start_time(pid).is_some_and(|st| st >= me.start_time);
    let groups = gatewarden_lifecycle::platform::spawn::process_groups();
    let pgid_of = |pid: u32| groups.iter().find(|(p, _)| *p == pid).map(|(_, g)| *g);
    let (mine, kept) = (pgid_of(me.pid), keep.and_then(pgid_of));
    let mut ended = Vec::new();
    for leader in ours(home, t) {
        if Some(leader) == mine || Some(leader) == kept || leader == me.pid {
            continue;
        }
        let members: Vec<u32> = groups.iter().filter(|(_, g)| *g == leader).map(|(p, _)| *p).collect();
        if members.is_empty() || !members.iter().all(|&p| started_after_me(p)) {
            continue;
        }
        for pid in members {
            let Some(start_time) = platform::start_time(pid) else { continue };
            let id = ProcessIdentity { pid, start_time };
            if matches!(platform::signal_verified(&id, platform::Signal::Kill), platform::SignalOutcome::Sent) {
                ended.push(id);
            }
        }
    }
    if ended.is_empty() {
        return;
    }
    let pids: Vec<u32> = ended.iter().map(|i| i.pid).collect();
    errln!("ended {} process(es) that candidates of this update left: {pids:?}", pids.len());
    let _ = ledger.append("update_ended_candidates", json!({"pids": pids}));
    // Their locks and sockets are released at exit: wait for it (bounded).
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until && ended.iter().any(|i| platform::start_time(i.pid) == Some(i.start_time)) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pure: the processes `me` (this updater, and the command the operator ran) started, from the
/// ledger's `events` in order: what it spawned (`gateway_spawned` it wrote), the successor of a
/// gateway that took on a restart it asked for (`restart_requested` naming it, then
/// `successor_started`), and what those spawned in turn. A process a concurrent verb started
/// (the successor of a restart someone else asked for) is not among them.
fn started_by(me: &[u32], events: &[serde_json::Map<String, serde_json::Value>]) -> Vec<u32> {
    let pid_at = |e: &serde_json::Map<String, serde_json::Value>, k: &str| {
        e.get(k).and_then(serde_json::Value::as_u64).and_then(|p| u32::try_from(p).ok())
    };
    let mut ours: Vec<u32> = me.to_vec();
    // Per gateway, who the restart it carries out was taken on for (a joined or refused
    // request started nothing).
    let mut restarting_for: std::collections::HashMap<u32, Option<u32>> = std::collections::HashMap::new();
    for e in events {
        let Some(writer) = pid_at(e, "pid") else { continue };
        match e.get("event").and_then(|v| v.as_str()) {
            Some("restart_requested") if !e.contains_key("joined") => {
                let by = e.get("requester").and_then(|r| r.as_object()).and_then(|r| pid_at(r, "pid"));
                restarting_for.insert(writer, by);
            }
            Some("successor_started")
                if restarting_for.get(&writer).copied().flatten().is_some_and(|p| ours.contains(&p)) =>
            {
                ours.extend(pid_at(e, "successor_pid"));
            }
            Some("gateway_spawned") if ours.contains(&writer) => ours.extend(pid_at(e, "spawned_pid")),
            _ => {}
        }
    }
    ours.retain(|p| !me.contains(p));
    ours.sort_unstable();
    ours.dedup();
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_ends_only_what_it_started() {
        let ev = |v: serde_json::Value| v.as_object().unwrap().clone();
        let events = vec![
            // The update's own restart of gateway 10: its successor 11 is ours.
            ev(json!({"event": "restart_requested", "pid": 10, "requester": {"pid": 5}})),
            ev(json!({"event": "successor_started", "pid": 10, "successor_pid": 11})),
            // A concurrent `restart` (pid 7) asks 11: its successor 12 is not ours.
            ev(json!({"event": "restart_requested", "pid": 11, "requester": {"pid": 7}})),
            ev(json!({"event": "successor_started", "pid": 11, "successor_pid": 12})),
            // The ladder's kick: a `gatewarden start` 20, whose gateway 21 is ours too.
            ev(json!({"event": "gateway_spawned", "pid": 5, "spawned_pid": 20})),
            ev(json!({"event": "gateway_spawned", "pid": 20, "spawned_pid": 21})),
            // What the concurrent `restart` spawned itself is not.
            ev(json!({"event": "gateway_spawned", "pid": 7, "spawned_pid": 30})),
        ];
        assert_eq!(started_by(&[5, 4], &events), vec![11, 20, 21]);
        assert!(started_by(&[99], &events).is_empty());
    }
}
