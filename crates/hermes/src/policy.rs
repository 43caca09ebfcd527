//! What `supervise` does after each exit of its hermes child: pure data over the exit status
//! and what hermes's files say afterwards (its exit codes alone do not tell planned, fatal
//! configuration and unplanned apart).
//!
//! | child exit | facts after the exit | action |
//! |---|---|---|
//! | 75 | — | restart at once; a planned restart is not counted by the brake (see [`counts_for_brake`]) |
//! | 0 | we asked it to stop, or its state says `stopped` | stay down |
//! | 0 | state `startup_failed` | park, with hermes's `exit_reason` |
//! | 0 | anything else (SIGTERM during start-up, hermes #103191) | unplanned: restart with backoff |
//! | 1 | another live process holds the lock | park "owned by pid N" (else a loop: hermes exits 1 for a duplicate) |
//! | 1 | we asked it to stop | stay down; the planned stop was misreported (watcher race, expired marker) |
//! | 78 | — | park (fatal configuration) |
//! | 1, other, signal | — | crash: restart with backoff; past the crash-loop brake, every restart waits the cap (30 s) |
//!
//! Backoff and the brake are gatewarden-service's [`SupervisePolicy`]. hermes's own
//! respawn-storm brake is off under our supervisor ([`crate::start::Mode::Supervised`]).

use std::time::Duration;

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_service::supervise::{Action, ChildExit, RestartHistory, SupervisePolicy};
use serde::Serialize;

use crate::files;
use crate::holder;
use crate::home::HermesHome;

/// What is known after a child exited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExitFacts {
    pub exit: ChildExit,
    /// hermes's `gateway_state` for that child (only when the record names it).
    pub state: Option<String>,
    pub exit_reason: Option<String>,
    /// We wrote a stop marker / forwarded a stop to it.
    pub stop_requested: bool,
    /// Another live process holds the lock now.
    pub other_holder: Option<ProcessIdentity>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParkKind {
    /// hermes wrote `startup_failed` (a fatal configuration it exits 0 for).
    StartupFailed,
    /// Another process owns the home.
    OwnedByOther,
    /// Exit 78.
    FatalConfig,
    /// Too many restarts in the brake window (older versions; a crash loop now keeps retrying).
    CrashLoop,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum HermesAction {
    RestartNow,
    Restart {
        backoff_ms: u64,
    },
    StayDown,
    /// Stay down, and record why this exit was not what hermes should have reported.
    StayDownAnomaly {
        note: String,
    },
    Park {
        kind: ParkKind,
        reason: String,
    },
}

/// Gathers [`ExitFacts`] from hermes's files right after `child` exited.
pub fn facts_after_exit(home: &HermesHome, child: ProcessIdentity, exit: ChildExit, stop_requested: bool) -> ExitFacts {
    let own = files::read_state(home).ok().filter(|s| s.names(child));
    ExitFacts {
        exit,
        state: own.as_ref().and_then(|s| s.gateway_state.clone()),
        exit_reason: own.and_then(|s| s.exit_reason),
        stop_requested,
        other_holder: holder::find(home).identity().filter(|id| *id != child),
    }
}

/// The decision for an exit at `now` (monotonic, see [`RestartHistory`]).
pub fn decide(f: &ExitFacts, policy: &SupervisePolicy, history: &RestartHistory, now: Duration) -> HermesAction {
    match f.exit {
        // Someone asked for it (SIGUSR1, chat /restart, `gatewarden restart`): never parked,
        // or the sixth `restart` within a minute would leave the gateway down.
        ChildExit::Code(PLANNED_RESTART) => HermesAction::RestartNow,
        ChildExit::Code(0) => {
            if f.stop_requested || f.state.as_deref() == Some("stopped") {
                return HermesAction::StayDown;
            }
            if f.state.as_deref() == Some("startup_failed") {
                let why = f.exit_reason.as_deref().unwrap_or("no reason recorded");
                return HermesAction::Park {
                    kind: ParkKind::StartupFailed,
                    reason: format!("hermes failed to start: {why}; fix the configuration, then start again"),
                };
            }
            // An unplanned exit 0: restart like a crash.
            crash(policy, history, now, ChildExit::Code(1))
        }
        ChildExit::Code(1) if f.other_holder.is_some() => {
            let pid = f.other_holder.map_or(0, |h| h.pid);
            HermesAction::Park {
                kind: ParkKind::OwnedByOther,
                reason: format!("the hermes home is owned by pid {pid}; not starting a second gateway"),
            }
        }
        ChildExit::Code(1) if f.stop_requested => HermesAction::StayDownAnomaly {
            note: "planned stop, but hermes reported failure (exit 1: marker race or expired marker)".into(),
        },
        exit => crash(policy, history, now, exit),
    }
}

/// Whether a restart after `exit` goes into the brake's history: crashes do, planned
/// restarts (75) do not.
pub fn counts_for_brake(exit: ChildExit) -> bool {
    exit != ChildExit::Code(PLANNED_RESTART)
}

/// hermes's (and gatewarden's) planned-restart exit code.
const PLANNED_RESTART: i32 = gatewarden_service::exit_code::PLANNED_RESTART;

fn crash(policy: &SupervisePolicy, history: &RestartHistory, now: Duration, exit: ChildExit) -> HermesAction {
    match policy.decide(exit, history, now) {
        Action::RestartNow => HermesAction::RestartNow,
        Action::Restart { backoff } => HermesAction::Restart { backoff_ms: backoff.as_millis() as u64 },
        Action::StayDown => HermesAction::StayDown,
        Action::Park { kind, reason } => HermesAction::Park {
            kind: match kind {
                gatewarden_service::supervise::ParkKind::FatalConfig => ParkKind::FatalConfig,
                gatewarden_service::supervise::ParkKind::CrashLoop => ParkKind::CrashLoop,
            },
            reason,
        },
    }
}

/// [`ChildExit`] of a finished child.
pub fn child_exit(status: std::process::ExitStatus) -> ChildExit {
    match (status.code(), gatewarden_lifecycle::platform::spawn::exit_signal(status)) {
        (Some(c), _) => ChildExit::Code(c),
        (None, Some(s)) => ChildExit::Signal(s),
        (None, None) => ChildExit::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(exit: ChildExit) -> ExitFacts {
        ExitFacts { exit, state: None, exit_reason: None, stop_requested: false, other_holder: None }
    }

    #[test]
    fn the_table() {
        let p = SupervisePolicy::default();
        let h = RestartHistory::new(Duration::ZERO);
        let now = Duration::from_secs(100);
        let d = |f: ExitFacts| decide(&f, &p, &h, now);
        assert_eq!(d(facts(ChildExit::Code(75))), HermesAction::RestartNow);
        assert_eq!(d(ExitFacts { state: Some("stopped".into()), ..facts(ChildExit::Code(0)) }), HermesAction::StayDown);
        assert_eq!(d(ExitFacts { stop_requested: true, ..facts(ChildExit::Code(0)) }), HermesAction::StayDown);
        let parked = d(ExitFacts {
            state: Some("startup_failed".into()),
            exit_reason: Some("whatsapp: open policy without allow-all opt-in".into()),
            ..facts(ChildExit::Code(0))
        });
        assert!(
            matches!(&parked, HermesAction::Park { kind: ParkKind::StartupFailed, reason } if reason.contains("open policy"))
        );
        // SIGTERM during start-up left `running`: unplanned.
        assert!(matches!(
            d(ExitFacts { state: Some("running".into()), ..facts(ChildExit::Code(0)) }),
            HermesAction::Restart { .. }
        ));
        let owner = ProcessIdentity { pid: 4242, start_time: 1 };
        assert!(matches!(
            d(ExitFacts { other_holder: Some(owner), ..facts(ChildExit::Code(1)) }),
            HermesAction::Park { kind: ParkKind::OwnedByOther, reason } if reason.contains("pid 4242")
        ));
        assert!(matches!(
            d(ExitFacts { stop_requested: true, ..facts(ChildExit::Code(1)) }),
            HermesAction::StayDownAnomaly { .. }
        ));
        assert!(matches!(d(facts(ChildExit::Code(78))), HermesAction::Park { kind: ParkKind::FatalConfig, .. }));
        assert!(matches!(d(facts(ChildExit::Signal(9))), HermesAction::Restart { backoff_ms: 100 }));
        assert!(matches!(d(facts(ChildExit::Code(1))), HermesAction::Restart { .. }));
    }

    #[test]
    fn repeated_crashes_trip_the_brake_and_keep_retrying() {
        let p = SupervisePolicy::default();
        let mut h = RestartHistory::new(Duration::ZERO);
        let mut now = Duration::from_millis(10);
        let mut backoffs = Vec::new();
        for _ in 0..8 {
            let HermesAction::Restart { backoff_ms } = decide(&facts(ChildExit::Code(1)), &p, &h, now) else {
                panic!("a crash loop must keep retrying");
            };
            backoffs.push(backoff_ms);
            h.record_restart(&p, ChildExit::Code(1), now);
            now += Duration::from_millis(500);
        }
        assert_eq!(backoffs, [100, 200, 400, 800, 1600, 30_000, 30_000, 30_000]);
    }

    #[test]
    fn planned_restarts_never_trip_the_brake() {
        let p = SupervisePolicy::default();
        let mut h = RestartHistory::new(Duration::ZERO);
        // A full brake window of crashes, then a planned restart: still at once.
        for i in 0..5 {
            h.record_restart(&p, ChildExit::Code(1), Duration::from_millis(10 * i));
        }
        assert_eq!(decide(&facts(ChildExit::Code(75)), &p, &h, Duration::from_millis(60)), HermesAction::RestartNow);
        assert!(!counts_for_brake(ChildExit::Code(75)) && counts_for_brake(ChildExit::Code(1)));
    }
}
