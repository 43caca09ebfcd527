//! Stopping the gateway and keeping it down, shared by `stop` (`stop.rs`) and `service
//! install`/`uninstall`: through the owning service manager when there is one, else the one
//! stopper (`gatewarden_control::stopper`): control stop, marker + verified SIGTERM, wait for
//! the lock, then — unless `--no-kill` — a verified kill.
//!
//! Before it signals anything it records `stopped` (`intent.rs`): every actor that could
//! start a gateway afterwards — a restart's successor or backstop, an update's rollback,
//! `doctor --fix`, a service manager's launch — reads that record first and stays down.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use gatewarden_control::stopper::{self, How, StopOutcome, StopPlan};
use gatewarden_control::{Requester, StopReason};
use gatewarden_lifecycle::holder::lock_holder;
use gatewarden_lifecycle::marker::{self, MarkerKind};
use gatewarden_lifecycle::records::read_pid_record;
use gatewarden_lifecycle::{Home, InstanceLock};

use crate::owner::{self, ServiceManager};
use crate::presence::{Presence, presence};

pub fn stop(home: &Home, timeout_s: u64, no_kill: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    // First: the intent is durable before any signal, so nothing mid-flight can undo it. On a
    // full disk it lands in the space reserved for it (fsio::write_json_reserved); failing
    // that, the gateway is stopped all the same and the exit code says it may not stay down.
    let recorded = crate::intent::record_stop(&home);
    let desired = recorded.as_ref().ok().cloned().flatten();
    if let Err(why) = &recorded {
        errln!("warning: {why}");
    }
    let presence = presence(&home, "stop");
    let news = matches!(presence, Presence::Running) || desired.as_ref().is_some_and(|(_, was_run)| *was_run);
    let code = stop_present(&home, presence, timeout_s, no_kill);
    if news {
        crate::intent::ledger_stop_if_unrecorded(&home, desired.as_ref().map(|(d, _)| d));
    }
    match (code, recorded) {
        (Ok(code), Err(_)) if code == ExitCode::SUCCESS => {
            errln!(
                "the stop is not recorded, so it may be undone: a restart under way (its successor or backstop), \
                 an update or its rollback, `doctor --fix`, `supervise` or a service manager may start the gateway \
                 again; free some space in {} and run `gatewarden stop` again",
                home.dir().display()
            );
            Ok(ExitCode::from(1))
        }
        (code, _) => code,
    }
}

/// Stops the gateway for a hand-over between owners: `service install` stops the gateway that
/// runs outside the manager before the manager starts its own, and a failed install or
/// uninstall stops the manager's again (crates/service/src/transaction.rs). Like [`stop`]
/// through `m` (or the one stopper without it), but nothing is recorded as the operator's
/// intent: the operator still wants a gateway, and the next one is about to start.
pub fn hand_over(home: &Home, m: Option<&dyn ServiceManager>, timeout_s: u64) -> crate::Result<()> {
    let home = home.canonicalized();
    let running = matches!(presence(&home, "stop"), Presence::Running);
    let code = match m {
        Some(m) => stop_via_manager(&home, m, running, timeout_s, false, Down::HandedOver)?,
        None if running => stop_direct(&home, timeout_s, false)?,
        None => ExitCode::SUCCESS,
    };
    if code != ExitCode::SUCCESS {
        crate::bail!("the gateway in {} did not stop within {timeout_s}s", home.dir().display());
    }
    Ok(())
}

/// What a stop through a manager leaves: down for good (`stop`) or handed over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Down {
    StaysDown,
    HandedOver,
}

/// `stop` once the intent is recorded: what the presence probe found decides the path.
fn stop_present(home: &Home, presence: Presence, timeout_s: u64, no_kill: bool) -> crate::Result<ExitCode> {
    let gateway_pid = match &presence {
        Presence::Running => read_pid_record(&home.pid_file()).ok().map(|r| r.pid),
        _ => None,
    };
    // Every lifecycle verb goes through whoever owns the running gateway.
    if !matches!(presence, Presence::Unknown(_))
        && let Some(m) = owner::owner(home, gateway_pid)
    {
        return stop_via_manager(
            home,
            m.as_ref(),
            matches!(presence, Presence::Running),
            timeout_s,
            no_kill,
            Down::StaysDown,
        );
    }
    match presence {
        Presence::NotRunning { healed } => {
            outln!("no gateway running in {}", home.dir().display());
            if !healed.is_empty() {
                outln!("cleaned stale files: {}", healed.join(", "));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Presence::Unknown(why) => crate::bail!("cannot tell whether a gateway runs: {why}"),
        Presence::Running => {}
    }
    stop_direct(home, timeout_s, no_kill)
}

/// Under a manager: a graceful stop request first (so the gateway exits 0, a planned stop, and
/// the manager records success instead of a failure), then the manager's own stop, which keeps
/// it down (`systemctl stop` also cancels a pending auto-restart); then the lock must be free.
/// If something still holds it (a gateway outside the manager), the direct path takes over.
fn stop_via_manager(
    home: &Home,
    m: &dyn ServiceManager,
    running: bool,
    timeout_s: u64,
    no_kill: bool,
    down: Down,
) -> crate::Result<ExitCode> {
    let budget = Duration::from_secs(timeout_s);
    let deadline = Instant::now() + budget;
    let who =
        read_pid_record(&home.pid_file()).ok().map_or("the gateway".to_string(), |r| format!("gateway pid {}", r.pid));
    if running {
        errln!("{who} is owned by {}", m.describe());
        // The graceful half of the one stopper: a control stop (the gateway exits 0, which the
        // manager records as success); if the endpoint is silent, the marker makes the
        // manager's own stop signal a planned stop (exit 0) too.
        let progress = crate::progress::Progress::new();
        let graceful = stopper::request_stop(home, &Requester::cli(), StopReason::Stop, deadline, &mut |p| match p {
            stopper::Phase::Note(n) => errln!("{n}"),
            _ => progress.phase(&format!("stopping {who}: draining active runs")),
        });
        progress.finish();
        if !graceful && let Ok(h) = lock_holder(home) {
            marker::write(home.dir(), MarkerKind::PlannedStop, h.identity, &home.dir().to_string_lossy())?;
        }
    }
    if let Err(e) = m.stop() {
        errln!("warning: {} stop failed: {}", m.kind(), e.chain());
    }
    if InstanceLock::acquire(&home.lock(), deadline.saturating_duration_since(Instant::now())).is_ok() {
        if down == Down::HandedOver {
            errln!("stopped {who} ({})", m.describe());
        } else if running {
            outln!("stopped {who} ({}; it stays down until `gatewarden start`)", m.describe());
        } else {
            outln!("no gateway was running; stopped {} (it stays down)", m.describe());
        }
        return Ok(ExitCode::SUCCESS);
    }
    errln!("the lock is still held after {} stopped; stopping the holder directly", m.describe());
    stop_direct(home, deadline.saturating_duration_since(Instant::now()).as_secs().max(1), no_kill)
}

/// The gateway runs without a manager (or survived the manager's stop): the one stopper.
fn stop_direct(home: &Home, timeout_s: u64, no_kill: bool) -> crate::Result<ExitCode> {
    let who =
        read_pid_record(&home.pid_file()).ok().map_or("the gateway".to_string(), |r| format!("gateway pid {}", r.pid));
    let mut plan = StopPlan::new(Requester::cli(), Duration::from_secs(timeout_s));
    plan.kill = !no_kill;
    let progress = crate::progress::Progress::new();
    let outcome = stopper::stop(home, &plan, &mut |p| match p {
        stopper::Phase::Draining => progress.phase(&format!("stopping {who}: draining active runs")),
        stopper::Phase::Terminating(t) => progress.phase(&format!("stopping {t}: planned-stop marker and SIGTERM")),
        stopper::Phase::Killing(t) => progress.phase(&format!("{t} did not stop within {timeout_s}s: killing it")),
        stopper::Phase::Note(n) => errln!("{n}"),
    });
    progress.finish();
    Ok(report(&who, timeout_s, outcome))
}

/// Prints a stopper outcome the way `stop` reports it; the exit code.
fn report(who: &str, timeout_s: u64, outcome: StopOutcome) -> ExitCode {
    match outcome {
        StopOutcome::Stopped { how: How::Killed, .. } => {
            outln!("killed {who} after it did not stop within {timeout_s}s");
            ExitCode::SUCCESS
        }
        StopOutcome::Stopped { how: How::NotRunning, .. } => {
            outln!("no gateway running (it exited before the stop)");
            ExitCode::SUCCESS
        }
        StopOutcome::Stopped { .. } => {
            outln!("stopped {who}");
            ExitCode::SUCCESS
        }
        StopOutcome::StillRunning { .. } => {
            errln!("{who} is still running after {timeout_s}s; not killing it (--no-kill)");
            ExitCode::from(1)
        }
        StopOutcome::Unidentifiable { why } => {
            errln!("not signalling anything: {why}");
            ExitCode::from(1)
        }
        StopOutcome::NotSignalled { target, why } => {
            errln!("{who} did not stop and {target} was not signalled: {why}");
            ExitCode::from(1)
        }
        StopOutcome::SurvivedKill { .. } => {
            errln!("{who} survived SIGKILL and still holds the lock");
            ExitCode::from(1)
        }
        StopOutcome::Unknown { why } => {
            errln!("cannot tell whether a gateway runs: {why}");
            ExitCode::from(4)
        }
    }
}
