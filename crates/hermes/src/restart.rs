//! A verified restart: success only for a new `(pid, start time)` that is ready.
//!
//! SIGUSR1 makes hermes drain and exit 75, and nothing but a supervisor starts it again
//! (measured: unsupervised, it stays down). So SIGUSR1 is sent only when a supervisor that
//! revives 75 is proven ([`SupervisedBy::revives_exit_75`]); otherwise stop, then start.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::platform::{self, Signal, SignalOutcome};
use serde::Serialize;
use serde_json::json;

use crate::holder::{self, Finding};
use crate::home::HermesHome;
use crate::launch::{self, Launch};
use crate::ledger;
use crate::start::{self, StartError};
use crate::status::is_ready;
use crate::stop::{self, StopError, StopOptions};
use crate::supervisor::{self, SupervisedBy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPath {
    /// SIGUSR1 to a child of a proven supervisor, which respawned it.
    Sigusr1,
    /// Verified stop, then a detached start.
    StopStart,
    /// Nothing ran: a plain start.
    Start,
}

#[derive(Debug, Serialize)]
pub struct Restarted {
    pub old: Option<ProcessIdentity>,
    pub new: ProcessIdentity,
    pub path: RestartPath,
    pub elapsed_ms: u64,
    /// The child when we started it (stop+start, start); `None` when the supervisor did.
    #[serde(skip)]
    pub child: Option<std::process::Child>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestartError {
    #[error("cannot identify the process holding the hermes lock: {0}")]
    Unidentified(String),
    #[error("nothing could start hermes again, so it was not stopped: {0}")]
    NothingToStart(String),
    #[error(transparent)]
    Stop(#[from] StopError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("not signalling pid {pid}: {why}")]
    Signal { pid: u32, why: String },
    #[error("hermes is managed by {0}: restart it through that manager (or install gatewarden's unit)")]
    ServiceManager(String),
    #[error("no new ready hermes replaced pid {} within {:.1} s", old.pid, after.as_secs_f64())]
    NotReplaced { old: ProcessIdentity, after: Duration },
}

#[derive(Debug, Clone)]
pub struct RestartOptions {
    pub stop: StopOptions,
    /// Budget for the new process to become ready.
    pub ready_timeout: Duration,
}

impl Default for RestartOptions {
    fn default() -> Self {
        RestartOptions { stop: StopOptions::default(), ready_timeout: Duration::from_secs(60) }
    }
}

/// Restarts the gateway of `home`. `start_cmd` builds the detached command used when no
/// proven supervisor will (see [`start::command_for`]) from what [`launch::resolve`] chose
/// (`explicit`: `--hermes`), which is resolved before anything is stopped: a gateway is never
/// stopped when nothing could start it again.
pub fn restart(
    home: &HermesHome,
    opts: &RestartOptions,
    explicit: Option<PathBuf>,
    start_cmd: impl FnOnce(&Launch) -> Command,
) -> Result<Restarted, RestartError> {
    let started = Instant::now();
    let old = match holder::find(home) {
        Finding::Unknown(why) => return Err(RestartError::Unidentified(why)),
        Finding::Unproven { identity, why, .. } => {
            return Err(RestartError::Stop(StopError::Unproven { pid: identity.pid, why }));
        }
        Finding::Free => None,
        Finding::Held { identity, .. } => Some(identity),
    };
    let Some(old) = old else {
        let launch = launch::resolve(home, explicit, None).map_err(RestartError::NothingToStart)?;
        let s = start::start(home, start_cmd(&launch), opts.ready_timeout)?;
        return Ok(done(home, None, s.identity, RestartPath::Start, started, Some(s.child)));
    };
    let sup = supervisor::detect(old);
    ledger::record(home, "restart.requested", json!({"target_pid": old.pid, "supervisor": sup.label()}));
    if sup.revives_exit_75() {
        match platform::signal_verified(&old, Signal::Restart) {
            SignalOutcome::Sent => {}
            SignalOutcome::Unverifiable(why) | SignalOutcome::Failed(why) => {
                return Err(RestartError::Signal { pid: old.pid, why });
            }
            // Gone meanwhile (its supervisor restarts it anyway) or no SIGUSR1 here: verify below.
            SignalOutcome::Gone | SignalOutcome::Mismatch | SignalOutcome::Unsupported => {}
        }
        let deadline = Instant::now() + opts.stop.timeout + opts.ready_timeout;
        let mut new = None;
        stop::wait_until(deadline, || {
            new = holder::find(home).identity().filter(|id| *id != old && is_ready(home, *id));
            new.is_some()
        });
        return match new {
            Some(id) => Ok(done(home, Some(old), id, RestartPath::Sigusr1, started, None)),
            None => Err(RestartError::NotReplaced { old, after: started.elapsed() }),
        };
    }
    if matches!(sup, SupervisedBy::Systemd { .. } | SupervisedBy::Launchd | SupervisedBy::S6) {
        // hermes's own unit revives a stop it did not order (Restart=always): a detached
        // start beside it would make two owners, the loser exiting 1 every 5 s.
        return Err(RestartError::ServiceManager(sup.label()));
    }
    let launch = match launch::resolve(home, explicit, Some(old)) {
        Ok(l) => l,
        Err(why) => {
            ledger::record(home, "restart.refused", json!({"target_pid": old.pid, "why": why}));
            return Err(RestartError::NothingToStart(why));
        }
    };
    ledger::record(home, "restart.launch", json!({"command": launch.display(), "source": launch.source}));
    stop::stop_identity(home, old, &opts.stop)?;
    let s = start::start(home, start_cmd(&launch), opts.ready_timeout)?;
    Ok(done(home, Some(old), s.identity, RestartPath::StopStart, started, Some(s.child)))
}

fn done(
    home: &HermesHome,
    old: Option<ProcessIdentity>,
    new: ProcessIdentity,
    path: RestartPath,
    started: Instant,
    child: Option<std::process::Child>,
) -> Restarted {
    let r = Restarted { old, new, path, elapsed_ms: started.elapsed().as_millis() as u64, child };
    ledger::record(home, "restart.done", json!({"old_pid": old.map(|o| o.pid), "new_pid": new.pid, "path": path}));
    r
}
