//! The supervise loop for a hermes child: spawn, wait, ask [`crate::policy`], act.
//!
//! Blocking and signal-agnostic: the CLI turns SIGTERM/SIGINT (or a service manager's stop)
//! into the `stop` flag and sends READY=1 from `on_event`. A stop request becomes the
//! marker-first stop of [`crate::stop`], so hermes exits 0 and records `stopped`.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::platform::{self, spawn};
use gatewarden_service::supervise::{RestartHistory, SupervisePolicy};
use serde::Serialize;
use serde_json::json;

use crate::home::{HermesHome, PARKED_STATE};
use crate::ledger;
use crate::policy::{self, ExitFacts, HermesAction, ParkKind};
use crate::start::{self, StartError};
use crate::status::is_ready;
use crate::stop::{self, StopOptions};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    Spawned {
        pid: u32,
    },
    /// The child holds the lock and hermes reports it running: send READY=1 now.
    Ready {
        pid: u32,
        start_time: u64,
    },
    Exited {
        pid: u32,
        facts: ExitFacts,
        action: HermesAction,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "end", rename_all = "kebab-case")]
pub enum End {
    /// Planned stop (ours or hermes's): supervise exits 0.
    StayedDown,
    /// Not restarting until someone intervenes; the reason is also in
    /// `<home>/gatewarden/supervise_state.json`.
    Parked { kind: ParkKind, reason: String },
}

pub struct Supervise {
    pub home: HermesHome,
    /// Builds the child command, normally [`start::command`] in [`start::Mode::Supervised`].
    pub command: Box<dyn Fn() -> Command + Send + Sync>,
    pub policy: SupervisePolicy,
    pub stop: StopOptions,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SuperviseError {
    #[error(transparent)]
    Start(#[from] StartError),
}

impl Supervise {
    /// Runs until a planned stop, a park, or `stop_flag` (then stops the child, marker first).
    pub fn run(&self, stop_flag: &AtomicBool, mut on_event: impl FnMut(&Event)) -> Result<End, SuperviseError> {
        let epoch = Instant::now();
        let mut history = RestartHistory::new(Duration::ZERO);
        loop {
            let mut child = start::spawn(&self.home, (self.command)())?;
            let pid = child.id();
            on_event(&Event::Spawned { pid });
            ledger::record(&self.home, "supervise.spawned", json!({"pid": pid}));
            let identity = platform::start_time(pid).map(|start_time| ProcessIdentity { pid, start_time });
            let (status, stop_requested) = self.watch(&mut child, identity, stop_flag, &mut on_event);
            let exit = status.map_or(gatewarden_service::supervise::ChildExit::Unknown, policy::child_exit);
            let facts = match identity {
                Some(id) => policy::facts_after_exit(&self.home, id, exit, stop_requested),
                None => ExitFacts { exit, state: None, exit_reason: None, stop_requested, other_holder: None },
            };
            let now = epoch.elapsed();
            let action = policy::decide(&facts, &self.policy, &history, now);
            ledger::record(&self.home, "supervise.exit", json!({"pid": pid, "facts": facts, "action": action}));
            on_event(&Event::Exited { pid, facts: facts.clone(), action: action.clone() });
            match action {
                HermesAction::StayDown | HermesAction::StayDownAnomaly { .. } => return Ok(End::StayedDown),
                HermesAction::Park { kind, reason } => {
                    let record = json!({"v": 1, "state": "parked", "kind": kind, "reason": reason, "last_exit": facts.exit,
                        "supervisor_pid": std::process::id(), "parked_at": gatewarden_lifecycle::timefmt::now()});
                    let _ = self
                        .home
                        .open_ours()
                        .and_then(|d| d.write_atomic(PARKED_STATE, record.to_string().as_bytes(), 0o600));
                    return Ok(End::Parked { kind, reason });
                }
                HermesAction::RestartNow => {}
                HermesAction::Restart { backoff_ms } => {
                    let until = Instant::now() + Duration::from_millis(backoff_ms);
                    if stop::wait_until(until, || stop_flag.load(Ordering::SeqCst)) {
                        return Ok(End::StayedDown);
                    }
                }
            }
            if policy::counts_for_brake(exit) {
                history.record_restart(&self.policy, exit, epoch.elapsed());
            } else {
                history.child_started_at = epoch.elapsed();
            }
        }
    }

    /// Waits for the child to exit, reporting readiness and forwarding a stop request.
    fn watch(
        &self,
        child: &mut Child,
        identity: Option<ProcessIdentity>,
        stop_flag: &AtomicBool,
        on_event: &mut impl FnMut(&Event),
    ) -> (Option<std::process::ExitStatus>, bool) {
        let mut ready = false;
        let mut stop_requested = false;
        loop {
            // What hermes leaves behind (the shutdown-diag helper, tool subprocesses) dies
            // with its group, as hermes's own unit does with ExecStopPost.
            match spawn::reap_with_group(child) {
                Ok(Some(status)) => return (Some(status), stop_requested),
                Ok(None) => {}
                Err(_) => return (None, stop_requested),
            }
            if let Some(id) = identity {
                if !ready && is_ready(&self.home, id) {
                    ready = true;
                    on_event(&Event::Ready { pid: id.pid, start_time: id.start_time });
                }
                if !stop_requested && stop_flag.load(Ordering::SeqCst) {
                    stop_requested = true;
                    // The stop waits for the exit (and escalates); the child is reaped below.
                    let _ = stop::stop_identity(&self.home, id, &self.stop);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
