//! Stopping a gateway on Windows: a pure state machine (class I).
//!
//! Windows has no SIGTERM: `TerminateProcess` is a kill, and running it before the drain
//! corrupted hermes' database five times in six days (#112750). So a stop is:
//!
//! 1. ask gracefully (control-channel `stop`, or an addressed planned-stop marker);
//! 2. wait up to the deadline (drain + grace) for the process to go;
//! 3. after the deadline, **re-verify identity** `(pid, start_time)` immediately before acting;
//! 4. terminate only if it is still the same process; if the pid now belongs to someone else
//!    (reused while we waited), the target is gone and nothing is terminated; if identity
//!    cannot be verified, nothing is terminated and the stop is reported as failed.
//!
//! The caller probes and acts; [`StopMachine::next`] decides.

use std::time::Duration;

/// What the caller learned about the target pid just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// No such process (or it has exited).
    Gone,
    /// A process with this pid exists, with this start time (if readable).
    Alive {
        /// Its start time, `None` when the OS would not say.
        start_time: Option<u64>,
    },
    /// The probe failed.
    Unknown,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStep {
    /// Send the graceful request (once).
    RequestGraceful,
    /// Probe again after this long.
    Wait(Duration),
    /// Terminate this pid now (identity was verified by the observation just passed in).
    Terminate {
        /// The pid.
        pid: u32,
    },
    /// Finished.
    Done(StopOutcome),
}

/// How a stop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// It exited on its own after the graceful request.
    Stopped,
    /// It was already gone before we asked.
    AlreadyGone,
    /// The pid now names another process: ours is gone; nothing was terminated.
    PidReused,
    /// It ignored the request and was terminated after the deadline.
    Terminated,
    /// Still running (or undecidable); the message says why. CLI exit code 1.
    StillRunning(String),
}

/// Timing and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopConfig {
    /// How long to wait for a graceful exit (drain + grace).
    pub graceful_deadline: Duration,
    /// How long to wait for the process to vanish after terminating it.
    pub terminate_wait: Duration,
    /// Probe interval.
    pub poll: Duration,
    /// `--no-kill`: never terminate.
    pub no_kill: bool,
}

impl StopConfig {
    /// Deadline of drain + [`crate::spec::STOP_GRACE_S`], at least 1 s.
    #[must_use]
    pub fn for_drain(drain_timeout_s: u64) -> Self {
        Self {
            graceful_deadline: Duration::from_secs(drain_timeout_s.saturating_add(crate::spec::STOP_GRACE_S).max(1)),
            terminate_wait: Duration::from_secs(5),
            poll: Duration::from_millis(100),
            no_kill: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Graceful,
    Terminating { since: Duration },
}

/// The stop state machine for one target `(pid, start_time)`.
#[derive(Debug, Clone)]
pub struct StopMachine {
    cfg: StopConfig,
    pid: u32,
    start_time: Option<u64>,
    phase: Phase,
    done: Option<StopOutcome>,
}

/// Whether the observed process is provably our target.
fn same_identity(expected: Option<u64>, seen: Option<u64>) -> Option<bool> {
    match (expected, seen) {
        (Some(a), Some(b)) => Some(a == b),
        // Without both start times we cannot tell a reused pid from ours.
        _ => None,
    }
}

impl StopMachine {
    /// A machine for the target recorded as `(pid, start_time)`.
    #[must_use]
    pub fn new(cfg: StopConfig, pid: u32, start_time: Option<u64>) -> Self {
        Self { cfg, pid, start_time, phase: Phase::Start, done: None }
    }

    fn finish(&mut self, o: StopOutcome) -> StopStep {
        self.done = Some(o.clone());
        StopStep::Done(o)
    }

    /// Decides the next step from a fresh probe at `elapsed` since the stop began.
    pub fn next(&mut self, elapsed: Duration, probe: Probe) -> StopStep {
        if let Some(o) = &self.done {
            return StopStep::Done(o.clone());
        }
        let identity = match probe {
            Probe::Gone => None,
            Probe::Alive { start_time } => Some(same_identity(self.start_time, start_time)),
            Probe::Unknown => Some(None),
        };
        match self.phase {
            Phase::Start => match identity {
                None => self.finish(StopOutcome::AlreadyGone),
                Some(Some(false)) => self.finish(StopOutcome::PidReused),
                // Alive (verified or not): asking is harmless, it is addressed to the
                // incarnation and the gateway checks it (class B).
                Some(_) => {
                    self.phase = Phase::Graceful;
                    StopStep::RequestGraceful
                }
            },
            Phase::Graceful => match identity {
                None => self.finish(StopOutcome::Stopped),
                Some(Some(false)) => self.finish(StopOutcome::PidReused),
                Some(_) if elapsed < self.cfg.graceful_deadline => StopStep::Wait(self.cfg.poll),
                Some(_) if self.cfg.no_kill => self.finish(StopOutcome::StillRunning(format!(
                    "pid {} still running after {:?} and --no-kill was given",
                    self.pid, self.cfg.graceful_deadline
                ))),
                Some(Some(true)) => {
                    self.phase = Phase::Terminating { since: elapsed };
                    StopStep::Terminate { pid: self.pid }
                }
                Some(None) => self.finish(StopOutcome::StillRunning(format!(
                    "pid {} is still alive after {:?} but its identity cannot be verified \
                     (start time unavailable or probe failed); not terminating",
                    self.pid, self.cfg.graceful_deadline
                ))),
            },
            Phase::Terminating { since } => match identity {
                None => self.finish(StopOutcome::Terminated),
                Some(Some(false)) => self.finish(StopOutcome::Terminated),
                Some(_) if elapsed.saturating_sub(since) < self.cfg.terminate_wait => StopStep::Wait(self.cfg.poll),
                Some(_) => self.finish(StopOutcome::StillRunning(format!("pid {} survived termination", self.pid))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(v: u64) -> Duration {
        Duration::from_secs(v)
    }
    const ALIVE: Probe = Probe::Alive { start_time: Some(7) };

    fn machine() -> StopMachine {
        StopMachine::new(StopConfig::for_drain(0), 700, Some(7))
    }

    #[test]
    fn graceful_stop_never_terminates() {
        // I1: drains and exits in time.
        let mut m = machine();
        assert_eq!(m.next(s(0), ALIVE), StopStep::RequestGraceful);
        assert!(matches!(m.next(s(4), ALIVE), StopStep::Wait(_)));
        assert_eq!(m.next(s(5), Probe::Gone), StopStep::Done(StopOutcome::Stopped));
        assert_eq!(m.next(s(6), ALIVE), StopStep::Done(StopOutcome::Stopped));
    }

    #[test]
    fn terminates_only_after_deadline_with_verified_identity() {
        // I2.
        let mut m = machine();
        m.next(s(0), ALIVE);
        assert!(matches!(m.next(s(29), ALIVE), StopStep::Wait(_)));
        assert_eq!(m.next(s(30), ALIVE), StopStep::Terminate { pid: 700 });
        assert!(matches!(m.next(s(31), ALIVE), StopStep::Wait(_)));
        assert_eq!(m.next(s(32), Probe::Gone), StopStep::Done(StopOutcome::Terminated));
    }

    #[test]
    fn reused_pid_is_never_terminated() {
        let mut m = machine();
        m.next(s(0), ALIVE);
        assert_eq!(m.next(s(30), Probe::Alive { start_time: Some(8) }), StopStep::Done(StopOutcome::PidReused));
        let mut m = machine();
        assert_eq!(m.next(s(0), Probe::Alive { start_time: Some(8) }), StopStep::Done(StopOutcome::PidReused));
    }

    #[test]
    fn unverifiable_identity_is_never_terminated() {
        for probe in [Probe::Alive { start_time: None }, Probe::Unknown] {
            let mut m = machine();
            m.next(s(0), ALIVE);
            assert!(matches!(m.next(s(30), probe), StopStep::Done(StopOutcome::StillRunning(_))));
        }
        let mut m = StopMachine::new(StopConfig::for_drain(0), 700, None);
        m.next(s(0), ALIVE);
        assert!(matches!(m.next(s(30), ALIVE), StopStep::Done(StopOutcome::StillRunning(_))));
    }

    #[test]
    fn no_kill_and_survivors_report_still_running() {
        let mut cfg = StopConfig::for_drain(0);
        cfg.no_kill = true;
        let mut m = StopMachine::new(cfg, 700, Some(7));
        m.next(s(0), ALIVE);
        assert!(matches!(m.next(s(30), ALIVE), StopStep::Done(StopOutcome::StillRunning(_))));

        let mut m = machine();
        m.next(s(0), ALIVE);
        m.next(s(30), ALIVE);
        assert!(matches!(m.next(s(36), ALIVE), StopStep::Done(StopOutcome::StillRunning(_))));
    }

    #[test]
    fn already_gone() {
        assert_eq!(machine().next(s(0), Probe::Gone), StopStep::Done(StopOutcome::AlreadyGone));
    }
}
