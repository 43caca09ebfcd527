//! The CLI's edge of the desired-state record (`gatewarden_lifecycle::desired`): the operator's
//! verbs record what they want, every starter checks before it starts, and the ledger keeps
//! both the decision and every start it prevented.

use std::sync::OnceLock;
use std::time::SystemTime;

use gatewarden_control::Requester;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::desired::{self, Desired, Refusal, Starter, Want};
use gatewarden_lifecycle::ledger::{Ledger, Line, Writer, read_tail};
use serde_json::json;

/// When the operator invoked this command (the first line of `main`): orders a `run` against a
/// stop issued after it (`desired::overrides`), whichever process reaches the file first.
static ISSUED: OnceLock<SystemTime> = OnceLock::new();

pub fn set_issued(at: SystemTime) {
    let _ = ISSUED.set(at);
}

fn issued() -> Option<SystemTime> {
    ISSUED.get().copied()
}

fn ledger(home: &Home) -> Ledger {
    Ledger::new(home.ledger(), Writer::current())
}

fn requester_json() -> serde_json::Value {
    let r = Requester::cli();
    json!({"pid": r.pid, "argv": r.argv, "channel": r.channel})
}

/// `stop`: records `stopped` before anything is signalled. A home that cannot record it
/// still gets its stop (a full disk must not keep a gateway up): `Err` says why, and the stop
/// says what may undo it. `Ok(None)`: no home. Also says whether this stop is news (the record
/// wanted `run` until now). The stop is in flight while this process lives: a `start` that
/// replaces the record meanwhile waits for it (`launch.rs`).
pub fn record_stop(home: &Home) -> Result<Option<(Desired, bool)>, String> {
    if !home.dir().is_dir() {
        return Ok(None);
    }
    let mut was_run = false;
    desired::record_if(home.dir(), Want::Stopped, "cli stop", true, issued(), |d| {
        was_run = d.want == Want::Run;
        true
    })
    .map(|(d, _)| Some((d, was_run)))
    .map_err(|e| format!("cannot record the stop in {}: {e}", desired::path(home.dir()).display()))
}

/// After a stop that stopped a gateway or ended a `run` intent: the ledger has the stop
/// exactly once. The gateway records a stop it receives; one that reached it only while it
/// was already draining for a restart, or reached nobody (between a restart's old incarnation
/// and its successor, which then stays down), is recorded here.
pub fn ledger_stop_if_unrecorded(home: &Home, d: Option<&Desired>) {
    let me = u64::from(std::process::id());
    let recorded = read_tail(&home.ledger(), Some(500)).ok().unwrap_or_default().iter().any(|l| {
        matches!(l, Line::Event(e) if e.get("event").and_then(|v| v.as_str()) == Some("stop_requested")
            && e.get("requester").and_then(|r| r.get("pid")).and_then(|p| p.as_u64()) == Some(me))
    });
    if !recorded {
        let _ = ledger(home).append(
            "stop_requested",
            json!({"requester": requester_json(), "reason": "stop", "want": "stopped", "seq": d.map(|d| d.seq)}),
        );
    }
}

/// `start` / `restart` by the operator: records `run` (this process carries it out, so it is
/// in flight while this process lives) and returns the sequence it runs under. The gateway's
/// own `started` / `restart_requested` lines are the ledger's record of it. A stop issued
/// after this command was invoked overrides it: refused (and in the ledger).
pub fn record_run(home: &Home, verb: &str) -> Result<u64, Refusal> {
    record_run_replacing(home, verb).map(|(seq, _)| seq)
}

/// [`record_run`], with the record it replaced (`None` when nothing was written).
pub fn record_run_replacing(home: &Home, verb: &str) -> Result<(u64, Option<Desired>), Refusal> {
    // `cli start`, or `dashboard start` for a button's (Requester::cli).
    let by = format!("{} {verb}", Requester::cli().channel);
    let mut before = None;
    let recorded = desired::record_if(home.dir(), Want::Run, &by, true, issued(), |d| {
        before = Some(d.clone());
        true
    });
    match recorded {
        Ok((d, true)) => Ok((d.seq, before)),
        Ok((d, false)) => {
            let r = Refusal::Stopped(Box::new(d));
            prevented(home, verb, &r);
            Err(r)
        }
        Err(e) => {
            errln!("warning: cannot record the {verb} in {}: {e}", desired::path(home.dir()).display());
            Ok((desired::current(home.dir()).seq, None))
        }
    }
}

/// A stop recorded after the request `seq` (its sequence is later, so it wins): recorded as the
/// start it prevents (`by`), and returned.
pub fn later_stop(home: &Home, by: &str, seq: u64) -> Option<Refusal> {
    let d = desired::current(home.dir());
    (d.want == Want::Stopped && d.seq > seq).then(|| {
        let r = Refusal::Stopped(Box::new(d));
        prevented(home, by, &r);
        r
    })
}

/// Checks the record before `by` starts anything; a refusal is recorded (`start_prevented`)
/// and returned.
pub fn may_start(home: &Home, by: &str, starter: Starter) -> Result<Desired, Refusal> {
    desired::check(home.dir(), starter).inspect_err(|r| prevented(home, by, r))
}

/// Records a start that the desired state prevented.
pub fn prevented(home: &Home, by: &str, r: &Refusal) {
    let mut v = r.json();
    v["by"] = json!(by);
    let _ = ledger(home).append("start_prevented", v);
}

/// Records a process this command started in its own process group, for whoever must end it
/// (an update ends every group its candidates started: update/mod.rs `end_candidates`).
pub fn note_spawned(home: &Home, pid: u32) {
    let ledger =
        gatewarden_lifecycle::ledger::Ledger::new(home.ledger(), gatewarden_lifecycle::ledger::Writer::current());
    let _ = ledger.append("gateway_spawned", serde_json::json!({"spawned_pid": pid}));
}
