//! `run --replace`: hand the home over from a running gateway to this process, through the one
//! stopper (`gatewarden_control::stopper`) with reason `takeover` (so the old gateway's exit is
//! a planned 0 that no supervisor revives) and `keep_lock`: the lock is ours from the moment the
//! old gateway releases it, so no `status` probe or concurrent start can slip in between.

use std::time::Duration;

use gatewarden_control::stopper::{self, Phase, StopOutcome, StopPlan};
use gatewarden_control::{Requester, StopReason};
use gatewarden_lifecycle::{Home, InstanceLock};
use serde_json::json;

pub fn take_over(
    home: &Home,
    grace: Duration,
    ledger: &gatewarden_lifecycle::ledger::Ledger,
) -> Result<InstanceLock, String> {
    let mut plan = StopPlan::new(Requester::current("control"), grace);
    plan.reason = StopReason::Takeover;
    plan.keep_lock = true;
    plan.by = "takeover";
    let outcome = stopper::stop(home, &plan, &mut |p| match p {
        Phase::Draining => crate::info!("taking over: the previous gateway is draining"),
        Phase::Terminating(t) => crate::info!("taking over from {t}: takeover marker and SIGTERM"),
        Phase::Killing(t) => {
            crate::warn!("{t} did not stop within {grace:?}; killing it after re-verifying its identity")
        }
        Phase::Note(n) => crate::warn!("{n}"),
    });
    let (result, target, how) = match outcome {
        StopOutcome::Stopped { how, target, lock: Some(l) } => (Ok(l), target, how.describe().to_owned()),
        StopOutcome::Stopped { how, target, lock: None } => {
            (Err("the previous gateway exited but the lock was not kept".to_owned()), target, how.describe().to_owned())
        }
        StopOutcome::Unidentifiable { why } => {
            let e = format!(
                "a gateway holds the lock but cannot be identified safely ({why}); stop it with `gatewarden stop` or by its service manager"
            );
            (Err(e.clone()), None, e)
        }
        StopOutcome::NotSignalled { target, why } => {
            let e = format!("not signalling {target}: {why}");
            (Err(e.clone()), Some(target), e)
        }
        StopOutcome::SurvivedKill { target } => {
            let e = format!("{target} survived SIGKILL and still holds the lock; aborting the takeover");
            (Err(e.clone()), Some(target), e)
        }
        StopOutcome::StillRunning { target } => {
            (Err("the previous gateway is still running".into()), target, "still running".into())
        }
        StopOutcome::Unknown { why } => (Err(format!("cannot probe the lock: {why}")), None, why),
    };
    let _ = ledger.append(
        "takeover",
        json!({"target": target.map(|t| json!({"pid": t.pid, "start_time": t.start_time})), "outcome": how}),
    );
    result
}
