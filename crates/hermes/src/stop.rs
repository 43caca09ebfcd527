//! Stopping a hermes gateway so that it exits 0 ("planned"), verified.
//!
//! hermes 0.19 exits 1 for a SIGTERM it cannot attribute to a planned-stop marker, and its
//! marker watcher thread (0.5 s poll) races a signal sent after it: if the watcher fires
//! first and the SIGTERM arrives later, the shutdown handler runs twice, the second run finds
//! the marker consumed, and the planned stop exits 1 (measured: 8/30 at a 50 ms gap). So:
//!
//! 1. Holder identified without taking the lock ([`crate::holder`]).
//! 2. hermes reports it `running`/`degraded`/`draining`: write the marker only and give the
//!    watcher [`StopOptions::watcher_grace`] to act. The handler unlinks the marker when it
//!    takes it, so "marker gone" proves hermes acted: then no signal is ever sent.
//! 3. Otherwise (start-up: the watcher only acts once hermes runs), or if the marker is still
//!    untouched after the grace: rewrite the marker (fresh TTL) and send SIGTERM immediately,
//!    identity re-verified through a pidfd (gatewarden-lifecycle `signal_verified`).
//! 4. After [`StopOptions::timeout`]: SIGKILL, identity re-verified, and wait for the exit.
//!
//! Success means the process is gone; the report says whether hermes recorded `stopped`.

use std::time::{Duration, Instant};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::identity::IdentityCheck;
use gatewarden_lifecycle::platform::{self, Signal, SignalOutcome};
use serde::Serialize;
use serde_json::json;

use crate::files;
use crate::holder::{self, Finding};
use crate::home::HermesHome;
use crate::{ledger, marker};

#[derive(Debug, Clone)]
pub struct StopOptions {
    /// Budget for a graceful stop (watcher grace included) before SIGKILL.
    pub timeout: Duration,
    /// How long the marker alone is given while hermes runs (four watcher polls).
    pub watcher_grace: Duration,
    /// SIGKILL after the timeout (else report the gateway still running).
    pub kill: bool,
    /// How long to wait for the exit after SIGKILL.
    pub kill_wait: Duration,
}

impl Default for StopOptions {
    fn default() -> Self {
        StopOptions {
            timeout: Duration::from_secs(20),
            watcher_grace: Duration::from_secs(2),
            kill: true,
            kill_wait: Duration::from_secs(5),
        }
    }
}

/// How the gateway ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopPath {
    /// hermes's marker watcher acted; no signal was sent.
    Marker,
    /// Marker, then SIGTERM.
    MarkerAndSigterm,
    /// Escalated to SIGKILL after the timeout; hermes's state file will still say `running`.
    Killed,
    /// It exited on its own while we were stopping it (or the pid was recycled).
    Vanished,
}

#[derive(Debug, Clone, Serialize)]
pub struct StopReport {
    pub pid: u32,
    pub start_time: u64,
    pub path: StopPath,
    /// hermes's `gateway_state` for that process afterwards (`stopped` for a planned stop).
    pub gateway_state_after: Option<String>,
    pub elapsed_ms: u64,
}

impl StopReport {
    /// hermes recorded the stop as planned.
    pub fn planned(&self) -> bool {
        self.gateway_state_after.as_deref() == Some("stopped")
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum StopOutcome {
    NotRunning,
    Stopped(StopReport),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    #[error("cannot identify the process holding the hermes lock: {0}")]
    Unidentified(String),
    #[error("not stopping pid {pid}: it is not proven to be this home's hermes gateway ({why})")]
    Unproven { pid: u32, why: String },
    #[error("cannot write the planned-stop marker: {0}")]
    Marker(#[source] std::io::Error),
    #[error("not signalling pid {pid}: {why}")]
    Signal { pid: u32, why: String },
    #[error("pid {} is still running after {:.1} s{}", identity.pid, after.as_secs_f64(), if *killed { " and SIGKILL" } else { "" })]
    StillRunning { identity: ProcessIdentity, after: Duration, killed: bool },
}

/// Stops the gateway of `home`.
pub fn stop(home: &HermesHome, opts: &StopOptions) -> Result<StopOutcome, StopError> {
    let id = match holder::find(home) {
        Finding::Free => return Ok(StopOutcome::NotRunning),
        Finding::Unknown(why) => return Err(StopError::Unidentified(why)),
        Finding::Unproven { identity, why, .. } => {
            ledger::record(home, "stop.refused", json!({"target_pid": identity.pid, "why": why}));
            return Err(StopError::Unproven { pid: identity.pid, why });
        }
        Finding::Held { identity, .. } => identity,
    };
    stop_identity(home, id, opts).map(StopOutcome::Stopped)
}

/// Stops a known holder (used by `restart` and the supervisor, which know whom they mean).
pub fn stop_identity(home: &HermesHome, id: ProcessIdentity, opts: &StopOptions) -> Result<StopReport, StopError> {
    let started = Instant::now();
    let deadline = started + opts.timeout;
    ledger::record(home, "stop.requested", json!({"target_pid": id.pid, "target_start_time": id.start_time}));
    let serving = files::read_state(home).ok().is_some_and(|s| {
        s.names(id) && matches!(s.gateway_state.as_deref(), Some("running" | "degraded" | "draining"))
    });
    let mut path = None;
    if serving {
        marker::write_planned_stop(home, id).map_err(StopError::Marker)?;
        ledger::record(home, "stop.marker", json!({"target_pid": id.pid}));
        let grace_end = deadline.min(Instant::now() + opts.watcher_grace);
        let acted = wait_until(grace_end, || gone(id) || !marker::planned_stop_names(home, id));
        if acted {
            path = Some(StopPath::Marker);
        }
    }
    if path.is_none() {
        // Marker and signal back to back: the marker must be in place when the handler runs.
        marker::write_planned_stop(home, id).map_err(StopError::Marker)?;
        match platform::signal_verified(&id, Signal::Terminate) {
            SignalOutcome::Sent => {
                ledger::record(home, "stop.signal", json!({"target_pid": id.pid, "signal": "SIGTERM"}));
                path = Some(StopPath::MarkerAndSigterm);
            }
            SignalOutcome::Gone | SignalOutcome::Mismatch => path = Some(StopPath::Vanished),
            // No SIGTERM on this OS: the marker (hermes's watcher) is the stop.
            SignalOutcome::Unsupported => path = Some(StopPath::Marker),
            SignalOutcome::Unverifiable(why) | SignalOutcome::Failed(why) => {
                return Err(StopError::Signal { pid: id.pid, why });
            }
        }
    }
    let mut path = path.unwrap_or(StopPath::Marker);
    if !wait_until(deadline, || gone(id)) {
        if !opts.kill {
            return Err(StopError::StillRunning { identity: id, after: started.elapsed(), killed: false });
        }
        match platform::signal_verified(&id, Signal::Kill) {
            SignalOutcome::Sent => {
                ledger::record(
                    home,
                    "stop.kill",
                    json!({"target_pid": id.pid, "after_s": started.elapsed().as_secs_f64()}),
                );
                path = StopPath::Killed;
            }
            SignalOutcome::Gone | SignalOutcome::Mismatch => {}
            SignalOutcome::Unverifiable(why) | SignalOutcome::Failed(why) => {
                return Err(StopError::Signal { pid: id.pid, why });
            }
            SignalOutcome::Unsupported => {
                let why = "SIGKILL is not available on this OS".to_string();
                return Err(StopError::Signal { pid: id.pid, why });
            }
        }
        if !wait_until(Instant::now() + opts.kill_wait, || gone(id)) {
            return Err(StopError::StillRunning { identity: id, after: started.elapsed(), killed: true });
        }
    }
    let gateway_state_after = files::read_state(home).ok().filter(|s| s.names(id)).and_then(|s| s.gateway_state);
    let report = StopReport {
        pid: id.pid,
        start_time: id.start_time,
        path,
        gateway_state_after,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    ledger::record(
        home,
        "stop.done",
        json!({"target_pid": id.pid, "path": report.path, "gateway_state": report.gateway_state_after}),
    );
    Ok(report)
}

/// The process is no longer `id` (exited, zombie, or the pid was recycled).
pub fn gone(id: ProcessIdentity) -> bool {
    !matches!(id.check(), IdentityCheck::Same | IdentityCheck::Unverifiable(_))
}

/// Polls `cond` every 10 ms until it holds or `deadline` passes; returns whether it held.
pub fn wait_until(deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}
