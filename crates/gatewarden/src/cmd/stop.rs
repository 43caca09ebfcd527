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

use super::manager::{self, Managed};
use super::presence::{Presence, presence};

/// Upper bound for reaching the control endpoint; never more than a quarter of `--timeout`,
/// so a wedged endpoint cannot eat the graceful fallback's share of the budget.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const AFTER_KILL: Duration = Duration::from_secs(5);

pub fn stop(home: &Home, timeout_s: u64, no_kill: bool) -> anyhow::Result<ExitCode> {
    let home = home.canonicalized();
    let presence = presence(&home, "stop");
    let gateway_pid = match &presence {
        Presence::Running => read_pid_record(&home.pid_file()).ok().map(|r| r.pid),
        _ => None,
    };
    // Every lifecycle verb goes through whoever owns the running gateway.
    if !matches!(presence, Presence::Unknown(_))
        && let Some(m) = manager::owner(&home, gateway_pid)
    {
        return stop_via_manager(&home, &m, matches!(presence, Presence::Running), timeout_s, no_kill);
    }
    match presence {
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
    stop_direct(&home, timeout_s, no_kill)
}

/// Under a manager: a graceful stop request first (so the gateway exits 0, a planned stop, and
/// the manager records success instead of a failure), then the manager's own stop, which keeps
/// it down (`systemctl stop` also cancels a pending auto-restart); then the lock must be free.
/// If something still holds it (a gateway outside the manager), the direct path takes over.
fn stop_via_manager(
    home: &Home,
    m: &Managed,
    running: bool,
    timeout_s: u64,
    no_kill: bool,
) -> anyhow::Result<ExitCode> {
    let budget = Duration::from_secs(timeout_s);
    let deadline = Instant::now() + budget;
    let who =
        read_pid_record(&home.pid_file()).ok().map_or("the gateway".to_string(), |r| format!("gateway pid {}", r.pid));
    if running {
        eprintln!("{who} is owned by {}", m.describe());
        if !request_graceful(home, deadline, CONNECT_TIMEOUT.min(budget / 4), &who)
            && let Ok(h) = lock_holder(home)
        {
            // The marker makes the manager's stop signal a planned stop (exit 0).
            marker::write(home.dir(), MarkerKind::PlannedStop, h.identity, &home.dir().to_string_lossy())?;
        }
    }
    if let Err(e) = m.stop() {
        eprintln!("warning: {} stop failed: {e:#}", m.state.manager);
    }
    if InstanceLock::acquire(&home.lock(), deadline.saturating_duration_since(Instant::now())).is_ok() {
        if running {
            println!("stopped {who} ({}; it stays down until `gatewarden start`)", m.describe());
        } else {
            println!("no gateway was running; stopped {} (it stays down)", m.describe());
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("the lock is still held after {} stopped; stopping the holder directly", m.describe());
    stop_direct(home, deadline.saturating_duration_since(Instant::now()).as_secs().max(1), no_kill)
}

/// Control `stop`, then wait for the connection's end (the gateway's exit). False if the
/// control endpoint did not take the request.
fn request_graceful(home: &Home, deadline: Instant, control_timeout: Duration, who: &str) -> bool {
    let ep = Endpoint::for_home(home.dir());
    match Client::connect(&ep, control_timeout) {
        Ok(mut c) => {
            match c.call(Op::Stop { requester: Requester::current("cli"), reason: StopReason::Stop }, control_timeout) {
                Ok(_) => {
                    // The drain happens now; its end is the connection's end-of-file.
                    let progress = super::progress::Progress::new();
                    progress.phase(&format!("stopping {who}: draining active runs"));
                    c.wait_closed(deadline.saturating_duration_since(Instant::now()));
                    progress.finish();
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
    }
}

/// The gateway runs without a manager (or survived the manager's stop).
fn stop_direct(home: &Home, timeout_s: u64, no_kill: bool) -> anyhow::Result<ExitCode> {
    let home = home.clone();
    let budget = Duration::from_secs(timeout_s);
    let deadline = Instant::now() + budget;
    let control_timeout = CONNECT_TIMEOUT.min(budget / 4);
    let record = read_pid_record(&home.pid_file()).ok();
    let who = record.as_ref().map_or("the gateway".to_string(), |r| format!("gateway pid {}", r.pid));

    let graceful = request_graceful(&home, deadline, control_timeout, &who);
    if !graceful {
        let t = match target(&home) {
            Ok(t) => t,
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
    let t = match target(&home) {
        Ok(t) => t,
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

/// The lock holder to signal (see `lifecycle::holder`), saying so when the pid record
/// disagreed with the kernel.
fn target(home: &Home) -> Result<gatewarden_lifecycle::ProcessIdentity, String> {
    lock_holder(home).map(|h| {
        if let Some(note) = h.note {
            eprintln!("{note}");
        }
        h.identity
    })
}
