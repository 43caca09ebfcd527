//! `gatewarden cancel-drain`: cancels the drain of a planned restart, so the gateway runs on.
//! Exit 0 only once the gateway answers `running` as the **same incarnation**; otherwise exit 1
//! with the gateway's reason (nothing is draining, the drain ends in a stop, systemd was told
//! the unit is stopping, a cluster hands over, or the drain is already past cancelling).
//!
//! The gateway decides (crates/runtime, `drain::may_cancel`) and records the cancel in the
//! desired state before it answers (`desired::record_cancel`): the restart's successor, its
//! backstop and a `gatewarden restart` waiting for the new incarnation stand down on it.

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_control::proto::Op;
use gatewarden_control::{Client, ClientError, Endpoint, Requester};
use gatewarden_lifecycle::Home;
use serde_json::Value;

use crate::presence::{Presence, presence};
use crate::ready::status_of;

/// The gateway answers once its adapters are started again (bounded there by 30 s).
const ANSWER: Duration = Duration::from_secs(35);

pub fn cancel_drain(home: &Home, json: bool) -> crate::Result<ExitCode> {
    crate::outcome::outcome(home, "cancel-drain", json, || cancel(home))
}

fn cancel(home: &Home) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    if !matches!(presence(&home, "cancel-drain"), Presence::Running) {
        errln!("no gateway running in {}: nothing to cancel", home.dir().display());
        return Ok(ExitCode::from(1));
    }
    let ep = Endpoint::for_home(home.dir());
    let answer = Client::connect(&ep, Duration::from_secs(2))
        .and_then(|mut c| c.call(Op::CancelDrain { requester: Requester::cli() }, ANSWER));
    let result = match answer {
        Ok(v) => v,
        Err(e) => {
            // The gateway's refusal in its own words; anything else as the client saw it.
            let why = match e {
                ClientError::Refused { message, .. } => message,
                e => e.to_string(),
            };
            errln!("the drain was not cancelled: {why}");
            return Ok(ExitCode::from(1));
        }
    };
    let inc = result.get("incarnation").and_then(Value::as_str).unwrap_or_default().to_owned();
    // Verified, not assumed: the same incarnation answers `running`.
    match status_of(&ep, Duration::from_secs(2)) {
        Ok(s) if s.incarnation.as_deref() == Some(inc.as_str()) && s.state.as_deref() == Some("running") => {
            outln!(
                "drain cancelled: incarnation {inc} (pid {}) runs on, {} run(s) active",
                s.pid.map_or("?".into(), |p| p.to_string()),
                s.active_runs.unwrap_or(0)
            );
            if let Some(e) = result.get("platforms_error").and_then(Value::as_str) {
                errln!("warning: a chat platform did not start again: {e}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(s) => {
            errln!(
                "the gateway said the drain was cancelled, but now incarnation {} is {}",
                s.incarnation.unwrap_or_default(),
                s.state.unwrap_or_default()
            );
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            errln!("the gateway said the drain was cancelled, but does not answer now: {e}");
            Ok(ExitCode::from(1))
        }
    }
}
