//! `run --replace`: hand the home over from a running gateway to this process.
//!
//! Order (bug-classes C and H): identify the holder by its record and re-verify it against the
//! live process; write a takeover marker naming exactly that incarnation (so its exit is a
//! planned 0 that no supervisor revives); ask it to stop over the control channel, falling
//! back to a verified SIGTERM; wait for the lock with a deadline; only then re-verify identity
//! and kill; if the pid survives the kill, abort rather than start beside it.

use std::time::{Duration, Instant};

use gatewarden_control::{Client, Endpoint, Op, Requester, StopReason};
use gatewarden_lifecycle::identity::IdentityCheck;
use gatewarden_lifecycle::marker::{self, MarkerKind};
use gatewarden_lifecycle::platform::{self, Signal, SignalOutcome};
use gatewarden_lifecycle::{Home, InstanceLock, ProcessIdentity};
use serde_json::json;

/// How long the killed process may take to release the lock before we give up.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Waits for the lock until `deadline`, keeping it when taken.
fn wait_for_lock(path: &std::path::Path, deadline: Instant) -> Option<InstanceLock> {
    InstanceLock::acquire(path, deadline.saturating_duration_since(Instant::now())).ok()
}

pub fn take_over(
    home: &Home,
    home_str: &str,
    grace: Duration,
    ledger: &gatewarden_lifecycle::ledger::Ledger,
) -> Result<InstanceLock, String> {
    let lock_path = home.lock();
    let target = match gatewarden_lifecycle::holder::lock_holder(home) {
        Ok(h) => {
            if let Some(note) = h.note {
                crate::warn!("{note}");
            }
            h.identity
        }
        Err(why) => {
            // The holder may be between taking the lock and writing its record, or just
            // exiting: give it a moment, never signal a guess.
            return wait_for_lock(&lock_path, Instant::now() + Duration::from_secs(2)).ok_or_else(|| {
                format!(
                    "a gateway holds the lock but cannot be identified safely ({why}); stop it with \
                     `gatewarden stop` or by its service manager"
                )
            });
        }
    };
    match target.check() {
        IdentityCheck::Same => {}
        IdentityCheck::Gone | IdentityCheck::Different { .. } => {
            // The record is stale but someone holds the lock; it may be a gateway that has
            // not written its record yet. Wait briefly; never signal a stranger.
            return wait_for_lock(&lock_path, Instant::now() + Duration::from_secs(2))
                .ok_or_else(|| format!("the lock is held but gateway.pid names {target}, which is not running"));
        }
        IdentityCheck::Unverifiable(why) => return Err(format!("cannot verify {target}: {why}; not taking over")),
    }
    crate::info!("taking over from the gateway at {target}");
    marker::write(home.dir(), MarkerKind::Takeover, target, home_str)
        .map_err(|e| format!("cannot write the takeover marker: {e}"))?;
    let outcome = hand_over(home, target, grace);
    marker::clear_if_targets(home.dir(), MarkerKind::Takeover, target);
    let _ = ledger.append(
        "takeover",
        json!({"target": {"pid": target.pid, "start_time": target.start_time}, "outcome": match &outcome { Ok(how) => how.clone(), Err(e) => e.clone() }}),
    );
    outcome.map(|_| ()).and_then(|()| {
        InstanceLock::try_acquire(&lock_path)
            .map_err(|e| format!("the previous gateway exited but the lock is unavailable: {e}"))
    })
}

/// Ends `target`; returns how. The lock is free when this returns `Ok`.
fn hand_over(home: &Home, target: ProcessIdentity, grace: Duration) -> Result<String, String> {
    let lock_path = home.lock();
    let deadline = Instant::now() + grace;
    let asked = ask_to_stop(home, deadline);
    if !asked {
        match platform::signal_verified(&target, Signal::Terminate) {
            SignalOutcome::Sent | SignalOutcome::Gone | SignalOutcome::Unsupported => {}
            other => return Err(format!("not signalling {target}: {other:?}")),
        }
    }
    if let Some(l) = wait_for_lock(&lock_path, deadline) {
        drop(l);
        return Ok(if asked { "stopped via control".into() } else { "stopped via SIGTERM".into() });
    }
    crate::warn!("{target} did not stop within {grace:?}; killing it after re-verifying its identity");
    match platform::signal_verified(&target, Signal::Kill) {
        SignalOutcome::Sent | SignalOutcome::Gone => {}
        other => return Err(format!("{target} did not stop and was not killed: {other:?}")),
    }
    match wait_for_lock(&lock_path, Instant::now() + AFTER_KILL) {
        Some(l) => {
            drop(l);
            Ok("killed after the grace period".into())
        }
        None => Err(format!("{target} survived SIGKILL and still holds the lock; aborting the takeover")),
    }
}

fn ask_to_stop(home: &Home, deadline: Instant) -> bool {
    let ep = Endpoint::for_home(home.dir());
    let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_secs(2));
    let Ok(mut c) = Client::connect(&ep, left) else { return false };
    c.call(Op::Stop { requester: Requester::current("control"), reason: StopReason::Takeover }, left).is_ok()
}
