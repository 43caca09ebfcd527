//! The CLI's edge of the desired-state record (`gatewarden_lifecycle::desired`): the operator's
//! verbs record what they want, every starter checks before it starts, and the ledger keeps
//! both the decision and every start it prevented.

use gatewarden_control::Requester;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::desired::{self, Desired, Refusal, Starter, Want};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use serde_json::json;

fn ledger(home: &Home) -> Ledger {
    Ledger::new(home.ledger(), Writer::current())
}

fn requester_json() -> serde_json::Value {
    let r = Requester::current("cli");
    json!({"pid": r.pid, "argv": r.argv, "channel": r.channel})
}

/// `stop`: records `stopped` before anything is signalled, and `stop_requested` in the ledger.
/// A home that cannot record it still gets its stop (a full disk must not keep a gateway up).
pub fn record_stop(home: &Home) -> Option<Desired> {
    if !home.dir().is_dir() {
        return None;
    }
    match desired::record(home.dir(), Want::Stopped, "cli stop", false) {
        Ok(d) => {
            let _ = ledger(home).append(
                "stop_requested",
                json!({"requester": requester_json(), "reason": "stop", "want": "stopped", "seq": d.seq}),
            );
            Some(d)
        }
        Err(e) => {
            eprintln!("warning: cannot record the stop in {}: {e}", desired::path(home.dir()).display());
            None
        }
    }
}

/// `start` / `restart` by the operator: records `run` (this process carries it out, so it is
/// in flight while this process lives) and returns the sequence it runs under.
pub fn record_run(home: &Home, verb: &str) -> u64 {
    match desired::record(home.dir(), Want::Run, &format!("cli {verb}"), true) {
        Ok(d) => {
            let _ = ledger(home).append(
                "start_requested",
                json!({"requester": requester_json(), "verb": verb, "want": "run", "seq": d.seq}),
            );
            d.seq
        }
        Err(e) => {
            eprintln!("warning: cannot record the {verb} in {}: {e}", desired::path(home.dir()).display());
            desired::current(home.dir()).seq
        }
    }
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
