//! The one stopper: every way gatewarden ends a gateway (`stop`, `restart` of a wedged gateway,
//! `supervise`, `run --replace`) goes through [`stop`], so the escalation is written once:
//!
//! 1. control `stop` (or `stop{takeover}`), then wait for the connection's end-of-file;
//! 2. if the lock is still held: a marker naming the lock holder, then a SIGTERM sent through a
//!    handle opened *before* the identity re-check (`platform::signal_verified`);
//! 3. wait for the lock;
//! 4. if still held and killing is allowed: identify the holder afresh, verified SIGKILL, wait;
//! 5. after a kill: end what the killed incarnation's agent runs left (issue 30, item 5).
//!
//! It never signals a process that the kernel's lock table (or, where the OS does not tell, a
//! re-verified pid record) does not name as the holder. When the caller takes over the home,
//! the lock is returned held, so nobody can slip in between the stop and the take-over.

use std::time::{Duration, Instant};

use gatewarden_lifecycle::holder::lock_holder;
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::lock::LockProbe;
use gatewarden_lifecycle::marker::{self, MarkerKind};
use gatewarden_lifecycle::platform::{self, Signal, SignalOutcome, signal_verified};
use gatewarden_lifecycle::records::read_pid_record;
use gatewarden_lifecycle::{Home, InstanceLock, ProcessIdentity};
use serde_json::json;

use crate::{Client, Endpoint, Op, Requester, StopReason};

/// How long a SIGKILLed process may take to release the lock.
const AFTER_KILL: Duration = Duration::from_secs(5);
/// How long a stopped (SIGSTOP) target is given before the kill.
const STOPPED_PATIENCE: Duration = Duration::from_secs(1);
/// Upper bound for reaching the control endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What to stop and how far to go.
#[derive(Debug, Clone)]
pub struct StopPlan {
    pub requester: Requester,
    pub reason: StopReason,
    /// The whole budget: the graceful phases share it, the kill comes after it.
    pub budget: Duration,
    /// Part of the budget reserved for the marker + SIGTERM phase after a control stop that
    /// did not finish (a drain that hangs).
    pub term_grace: Duration,
    /// Skip the control request (the caller knows the endpoint is silent).
    pub skip_control: bool,
    /// Escalate to SIGKILL after the budget.
    pub kill: bool,
    /// Return the lock held (for a caller that takes the home over).
    pub keep_lock: bool,
    /// Written as `by` in the ledger's `stop_escalated`.
    pub by: &'static str,
}

impl StopPlan {
    pub fn new(requester: Requester, budget: Duration) -> StopPlan {
        StopPlan {
            requester,
            reason: StopReason::Stop,
            budget,
            term_grace: (budget / 4).min(Duration::from_secs(10)),
            skip_control: false,
            kill: true,
            keep_lock: false,
            by: "stop",
        }
    }
}

/// How the gateway ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// It was not running.
    NotRunning,
    /// It drained and exited on a control request.
    Control,
    /// It exited after the marker and SIGTERM.
    Terminated,
    /// It was killed after the budget.
    Killed,
}

impl How {
    pub fn describe(self) -> &'static str {
        match self {
            How::NotRunning => "it was not running",
            How::Control => "stopped via control",
            How::Terminated => "stopped via planned-stop marker and SIGTERM",
            How::Killed => "killed after the grace period",
        }
    }
}

/// The typed outcome; `Stopped.lock` is `Some` exactly when the plan asked to keep it.
#[derive(Debug)]
pub enum StopOutcome {
    Stopped {
        how: How,
        target: Option<ProcessIdentity>,
        lock: Option<InstanceLock>,
    },
    /// Still running after the budget, and killing was not allowed.
    StillRunning {
        target: Option<ProcessIdentity>,
    },
    /// The holder cannot be identified safely: nothing was signalled.
    Unidentifiable {
        why: String,
    },
    /// A signal was refused by the identity re-check (or the OS), so nothing more was tried.
    NotSignalled {
        target: ProcessIdentity,
        why: String,
    },
    /// SIGKILL was sent and the lock is still held.
    SurvivedKill {
        target: ProcessIdentity,
    },
    /// The lock cannot be probed.
    Unknown {
        why: String,
    },
}

impl StopOutcome {
    /// One line for logs and the ledger.
    pub fn describe(&self) -> String {
        match self {
            StopOutcome::Stopped { how, target: Some(t), .. } => format!("{} ({t})", how.describe()),
            StopOutcome::Stopped { how, .. } => how.describe().to_owned(),
            StopOutcome::StillRunning { .. } => "still running after the budget".into(),
            StopOutcome::Unidentifiable { why } => format!("not signalled: {why}"),
            StopOutcome::NotSignalled { target, why } => format!("{target} not signalled: {why}"),
            StopOutcome::SurvivedKill { target } => format!("{target} survived SIGKILL"),
            StopOutcome::Unknown { why } => format!("lock not probed: {why}"),
        }
    }
}

/// Phases reported to the caller as they begin (for a spinner or a log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Draining,
    Terminating(ProcessIdentity),
    Killing(ProcessIdentity),
    Note(String),
}

/// Stops the gateway of `home` following `plan`; see the module doc.
pub fn stop(home: &Home, plan: &StopPlan, on_phase: &mut dyn FnMut(Phase)) -> StopOutcome {
    let t0 = Instant::now();
    let deadline = t0 + plan.budget;
    let lock_path = home.lock();
    let take = |until: Instant| InstanceLock::acquire(&lock_path, until.saturating_duration_since(Instant::now())).ok();
    let done = |how: How, target: Option<ProcessIdentity>, lock: InstanceLock| StopOutcome::Stopped {
        how,
        target,
        lock: plan.keep_lock.then_some(lock),
    };
    match InstanceLock::probe(&lock_path) {
        LockProbe::Free(guard) => return done(How::NotRunning, None, guard),
        LockProbe::Missing => {
            return match plan.keep_lock {
                true => match InstanceLock::try_acquire(&lock_path) {
                    Ok(l) => done(How::NotRunning, None, l),
                    Err(e) => StopOutcome::Unknown { why: e.to_string() },
                },
                false => StopOutcome::Stopped { how: How::NotRunning, target: None, lock: None },
            };
        }
        LockProbe::Error(why) => return StopOutcome::Unknown { why },
        LockProbe::Held => {}
    }

    // Who holds the lock now, for the record (signals re-identify right before sending).
    let first = lock_holder(home).ok().map(|h| h.identity);
    // 1. Control stop, bounded so the marker + SIGTERM phase keeps its share.
    let graceful_until = deadline.checked_sub(plan.term_grace).filter(|d| *d > Instant::now()).unwrap_or(deadline);
    if !plan.skip_control && request_stop(home, &plan.requester, plan.reason, graceful_until, on_phase) {
        if let Some(l) = take(graceful_until) {
            return done(How::Control, first, l);
        }
        on_phase(Phase::Note("the gateway did not finish its drain in time".into()));
    }
    if let Some(l) = take(Instant::now()) {
        return done(How::Control, first, l);
    }

    // 2. Marker + verified SIGTERM to whoever the kernel says holds the lock.
    let target = match identify(home, on_phase) {
        Ok(t) => t,
        Err(why) => {
            // Between the probe and now it may simply have exited.
            return match take(Instant::now() + Duration::from_millis(200)) {
                Some(l) => done(How::Control, first, l),
                None => StopOutcome::Unidentifiable { why },
            };
        }
    };
    let kind = match plan.reason {
        StopReason::Takeover => MarkerKind::Takeover,
        StopReason::Stop => MarkerKind::PlannedStop,
    };
    if let Err(e) = marker::write(home.dir(), kind, target, &home.dir().to_string_lossy()) {
        on_phase(Phase::Note(format!("cannot write the {} marker: {e}", kind.file_name())));
    }
    on_phase(Phase::Terminating(target));
    match signal_verified(&target, Signal::Terminate) {
        // Unsupported (Windows): the gateway's marker watch stops it.
        SignalOutcome::Sent | SignalOutcome::Gone | SignalOutcome::Unsupported => {}
        other => {
            marker::clear_if_targets(home.dir(), kind, target);
            return StopOutcome::NotSignalled { target, why: format!("{other:?}") };
        }
    }
    // 3. Wait for the lock. A stopped process (SIGSTOP) cannot act on SIGTERM: once it has
    // stayed stopped for STOPPED_PATIENCE it goes straight to the kill.
    let until = deadline.max(Instant::now() + Duration::from_millis(100));
    let mut stopped_since: Option<Instant> = None;
    loop {
        let slice = (Instant::now() + Duration::from_millis(100)).min(until);
        if let Some(l) = take(slice) {
            return done(How::Terminated, Some(target), l);
        }
        if Instant::now() >= until {
            break;
        }
        if platform::is_stopped(target.pid) == Some(true) {
            if stopped_since.get_or_insert_with(Instant::now).elapsed() >= STOPPED_PATIENCE && plan.kill {
                on_phase(Phase::Note(format!("{target} is stopped (SIGSTOP): it cannot drain")));
                break;
            }
        } else {
            stopped_since = None;
        }
    }
    if !plan.kill {
        return StopOutcome::StillRunning { target: Some(target) };
    }

    // 4. Verified SIGKILL of the holder, identified afresh.
    let target = match identify(home, on_phase) {
        Ok(t) => t,
        Err(why) => {
            return match take(Instant::now() + Duration::from_millis(200)) {
                Some(l) => done(How::Terminated, Some(target), l),
                None => StopOutcome::Unidentifiable { why },
            };
        }
    };
    on_phase(Phase::Killing(target));
    // Whose runs it leaves, known while its pid record still names it.
    let incarnation =
        read_pid_record(&home.pid_file()).ok().filter(|r| r.identity() == Some(target)).and_then(|r| r.incarnation);
    let outcome = signal_verified(&target, Signal::Kill);
    let _ = Ledger::new(home.ledger(), Writer::current()).append(
        "stop_escalated",
        json!({"target": {"pid": target.pid, "start_time": target.start_time}, "after_ms": t0.elapsed().as_millis() as u64,
               "outcome": format!("{outcome:?}"), "by": plan.by}),
    );
    match outcome {
        SignalOutcome::Sent | SignalOutcome::Gone => {}
        other => return StopOutcome::NotSignalled { target, why: format!("{other:?}") },
    }
    match take(Instant::now() + AFTER_KILL) {
        Some(l) => {
            marker::clear_if_targets(home.dir(), kind, target);
            if let Some(inc) = incarnation {
                end_runs_of(home, &inc, plan.by);
            }
            done(How::Killed, Some(target), l)
        }
        None => StopOutcome::SurvivedKill { target },
    }
}

/// Step 5: a killed gateway could not end its runs' process groups (an exec backend's `sh -c …`
/// outlives it): they are ended here, found by the incarnation's run tag and each pinned and
/// re-checked before the signal (`runs::end_runs`), and waited for (bounded).
fn end_runs_of(home: &Home, incarnation: &str, by: &str) {
    let pids = crate::runs::end_runs(home, incarnation);
    if pids.is_empty() {
        return;
    }
    let _ = Ledger::new(home.ledger(), Writer::current())
        .append("orphan_runs_killed", json!({"pids": pids, "incarnation": incarnation, "by": by}));
    let until = Instant::now() + AFTER_KILL;
    while Instant::now() < until && pids.iter().any(|&p| platform::probe(p).is_alive()) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Step 1 alone: control `stop`, then wait for end-of-file until `until`. False if the
/// endpoint did not take the request. (A service manager's stop follows it in `stop`.)
pub fn request_stop(
    home: &Home,
    requester: &Requester,
    reason: StopReason,
    until: Instant,
    on_phase: &mut dyn FnMut(Phase),
) -> bool {
    let ep = Endpoint::for_home(home.dir());
    let t = CONNECT_TIMEOUT.min(until.saturating_duration_since(Instant::now())).max(Duration::from_millis(50));
    let op = Op::Stop { requester: requester.clone(), reason };
    match Client::connect(&ep, t).and_then(|mut c| c.call(op, t).map(|_| c)) {
        Ok(mut c) => {
            on_phase(Phase::Draining);
            c.wait_closed(until.saturating_duration_since(Instant::now()));
            true
        }
        Err(e) => {
            on_phase(Phase::Note(format!("control request failed ({e}); using a marker and SIGTERM")));
            false
        }
    }
}

/// The lock holder to signal, reporting when the pid record disagreed with the kernel.
fn identify(home: &Home, on_phase: &mut dyn FnMut(Phase)) -> Result<ProcessIdentity, String> {
    lock_holder(home).map(|h| {
        if let Some(note) = h.note {
            on_phase(Phase::Note(note));
        }
        h.identity
    })
}
