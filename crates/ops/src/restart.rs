//! `gatewarden restart`: request a restart and exit 0 only when a **new incarnation** holds
//! the lock and is ready; otherwise exit 1 naming what was seen and the recovery command.
//!
//! One ladder (`ladder/`), observation → action, bounded by `--timeout`:
//! - the gateway answers: ask it to restart (a systemd unit's start-rate counter is reset
//!   first, so planned restarts never trip its crash-loop brake), then watch;
//! - it does not answer within [`crate::ladder::machine::UNRESPONSIVE`] (SIGSTOPped, wedged), or stays
//!   draining past its drain budget plus [`crate::ladder::machine::DRAIN_GRACE`]: stop it with the one stopper
//!   (marker + verified SIGTERM, verified SIGKILL) and start a new incarnation;
//! - nobody holds the lock for longer than the owner allows (`ManagerKind::kick_after`: its
//!   restart delay plus a margin), or the manager gave up on the unit (start limit, failed):
//!   start it through the owner (`ServiceManager::start`; for a gateway nobody manages that
//!   is a direct `gatewarden start`), recorded as `kicked` in the ledger.
//!
//! `--backstop INCARNATION` is the same ladder without the request: the gateway launches it
//! for every planned restart that no verifying CLI asked for (chat `/restart`, SIGUSR1, a control
//! request), so no route ends with nothing running.
//!
//! The desired state binds the ladder (`gatewarden_lifecycle::desired`, `intent.rs`): an
//! operator's restart records `run` first (so a restart of a stopped gateway starts it), and
//! the ladder — the CLI's and the backstop's — checks before every start and stops watching
//! as soon as a later stop is recorded: that stop owns the gateway now, and it stays down.
//!
//! The orchestrator first moves itself into its own session (a detached copy of this command
//! does the work while this process relays its exit code), so killing the old gateway's
//! process group — e.g. when `/restart` ran this from inside the gateway — cannot kill it.

use std::process::ExitCode;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::desired;
use gatewarden_lifecycle::platform::spawn;

use crate::env::ORCHESTRATOR_ENV;
use crate::ladder::{orchestrate, run_backstop};
use crate::orchestrator::{escape_unit, relay_to_detached_orchestrator};

pub fn restart(
    home: &Home,
    timeout_s: u64,
    backstop: Option<String>,
    desired_seq: Option<u64>,
    json: bool,
) -> crate::Result<ExitCode> {
    // `--json`: one document from the first process, after the detached copy's verdict.
    crate::outcome::outcome(home, "restart", json, || restart_verified(home, timeout_s, backstop, desired_seq))
}

fn restart_verified(
    home: &Home,
    timeout_s: u64,
    backstop: Option<String>,
    desired_seq: Option<u64>,
) -> crate::Result<ExitCode> {
    if let Some(old) = backstop {
        escape_unit(home);
        let home = home.canonicalized();
        // Already detached by the gateway that launched it.
        let seq = desired_seq.unwrap_or_else(|| desired::current(home.dir()).seq);
        return Ok(run_backstop(&home, &old, timeout_s, seq));
    }
    // The operator's intent first, before anything that takes time: a `stop` issued right
    // after this command is ordered after it. The detached copy inherits the sequence.
    let seq = match std::env::var(ORCHESTRATOR_ENV).ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(seq) => seq,
        None => match crate::intent::record_run(&home.canonicalized(), "restart") {
            Ok(seq) => seq,
            Err(r) => {
                errln!("not restarting: {}", r.describe());
                return Ok(ExitCode::from(1));
            }
        },
    };
    escape_unit(home);
    let home = home.canonicalized();
    if std::env::var_os(ORCHESTRATOR_ENV).is_none()
        && spawn::DETACH_KEEPS_OUTPUT
        && let Some(code) = relay_to_detached_orchestrator(&seq.to_string())
    {
        return Ok(code);
    }
    orchestrate(&home, timeout_s, seq)
}
