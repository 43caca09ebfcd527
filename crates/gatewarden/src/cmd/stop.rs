//! `gatewarden stop`: graceful through the control channel (fallback: planned-stop marker plus
//! a verified SIGTERM), wait for the lock, then — unless `--no-kill` — re-verify identity and
//! kill. Never signals a process whose identity was not re-checked just before.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use gatewarden_control::{Client, Endpoint, Op, Requester, StopReason};
use gatewarden_lifecycle::holder::lock_holder;
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::marker::{self, MarkerKind};
use gatewarden_lifecycle::platform::{Signal, SignalOutcome, signal_verified};
use gatewarden_lifecycle::records::read_pid_record;
use gatewarden_lifecycle::{Home, InstanceLock};
use serde_json::json;

use super::presence::{Presence, presence};

/// Upper bound for reaching the control endpoint; never more than a quarter of `--timeout`,
/// so a wedged endpoint cannot eat the graceful fallback's share of the budget.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const AFTER_KILL: Duration = Duration::from_secs(5);

pub fn stop(home: &Home, timeout_s: u64, no_kill: bool) -> anyhow::Result<ExitCode> {
    let home = home.canonicalized();
    match presence(&home, "stop") {
        Presence::NotRunning { healed } => {
            println!("no gateway running in {}", home.dir().display());
            if !healed.is_empty() {
                println!("cleaned stale files: {}", healed.join(", "));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Presence::Unknown(why) => anyhow::bail!("cannot tell whether a gateway runs: {why}"),
        Presence::Running => {}
    }
    let budget = Duration::from_secs(timeout_s);
    let deadline = Instant::now() + budget;
    let control_timeout = CONNECT_TIMEOUT.min(budget / 4);
    let record = read_pid_record(&home.pid_file()).ok();
    let who = record.as_ref().map_or("the gateway".to_string(), |r| format!("gateway pid {}", r.pid));

    let ep = Endpoint::for_home(home.dir());
    let graceful = match Client::connect(&ep, control_timeout) {
        Ok(mut c) => {
            match c.call(Op::Stop { requester: Requester::current("cli"), reason: StopReason::Stop }, control_timeout) {
                Ok(_) => {
                    eprintln!("stopping {who}…");
                    c.wait_closed(deadline.saturating_duration_since(Instant::now()));
                    true
                }
                Err(e) => {
                    eprintln!("control request failed ({e}); falling back to a planned-stop marker and SIGTERM");
                    false
                }
            }
        }
        Err(e) => {
            eprintln!("control endpoint unavailable ({e}); falling back to a planned-stop marker and SIGTERM");
            false
        }
    };
    if !graceful {
        let t = match lock_holder(&home) {
            Ok(h) => {
                if let Some(note) = h.note {
                    eprintln!("{note}");
                }
                h.identity
            }
            Err(why) => {
                anyhow::bail!("cannot identify the gateway in {}: {why}; not signalling anything", home.dir().display())
            }
        };
        marker::write(home.dir(), MarkerKind::PlannedStop, t, &home.dir().to_string_lossy())?;
        match signal_verified(&t, Signal::Terminate) {
            // Unsupported (Windows): the gateway's marker watch stops it.
            SignalOutcome::Sent | SignalOutcome::Gone | SignalOutcome::Unsupported => {}
            other => eprintln!("not sending SIGTERM to {t}: {other:?}"),
        }
    }
    if InstanceLock::acquire(&home.lock(), deadline.saturating_duration_since(Instant::now())).is_ok() {
        println!("stopped {who}");
        return Ok(ExitCode::SUCCESS);
    }
    if no_kill {
        eprintln!("{who} is still running after {timeout_s}s; not killing it (--no-kill)");
        return Ok(ExitCode::from(1));
    }
    // Identified afresh: whoever holds the lock now, not whoever a file named at the start.
    let t = match lock_holder(&home) {
        Ok(h) => {
            if let Some(note) = h.note {
                eprintln!("{note}");
            }
            h.identity
        }
        Err(why) => {
            eprintln!(
                "{who} is still running after {timeout_s}s and cannot be identified ({why}); not killing anything"
            );
            return Ok(ExitCode::from(1));
        }
    };
    let outcome = signal_verified(&t, Signal::Kill);
    let ledger = Ledger::new(home.ledger(), Writer::current());
    let _ = ledger.append(
        "stop_escalated",
        json!({"target": {"pid": t.pid, "start_time": t.start_time}, "after_s": timeout_s, "outcome": format!("{outcome:?}")}),
    );
    match outcome {
        SignalOutcome::Sent | SignalOutcome::Gone => {}
        other => {
            eprintln!("{who} did not stop within {timeout_s}s and was not killed: {other:?}");
            return Ok(ExitCode::from(1));
        }
    }
    if InstanceLock::acquire(&home.lock(), AFTER_KILL).is_ok() {
        println!("killed {who} after it did not stop within {timeout_s}s");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{who} survived SIGKILL and still holds the lock");
        Ok(ExitCode::from(1))
    }
}
