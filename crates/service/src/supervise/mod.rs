//! The restart policy of `gatewarden supervise`: pure, table-tested.
//!
//! `supervise` runs `gatewarden run` as a child and, on each exit, asks [`decide`] what to do.
//! It is the supervisor under launchd and the Windows task (see [`crate::launchd`]); systemd
//! plays the same role natively. The mapping is the exit-code contract of
//! `docs/protocol.md` §6.1:
//!
//! | child exit | action |
//! |---|---|
//! | 0 planned stop / takeover | [`Action::StayDown`]: supervise exits 0 |
//! | 75 planned restart | [`Action::RestartNow`] |
//! | 1, any other code, a signal | [`Action::Restart`] with exponential backoff |
//! | 78 fatal configuration | [`Action::Park`]: record why, exit 0 (no respawn loop) |
//!
//! Backoff starts at 100 ms and doubles per consecutive crash up to 30 s; a child that ran
//! healthy for 60 s resets it. A crash loop never ends the supervision (a gateway left down
//! for good by a passing fault is worse than a retry every 30 s), but it is braked and visible:
//! after 5 restarts within 60 s (crashes; planned restarts are asked for and never count) every
//! further restart waits the full cap, and each wait is in the ledger (`crash_backoff`), where
//! `status` and `doctor` name the crash loop, as under systemd (hermes #56519: do not spin at
//! 100% CPU for days, #64432). Only a fatal configuration parks.
//!
//! Time is a monotonic [`Duration`] since an arbitrary epoch (the supervisor's start), so the
//! policy is testable without a clock.

mod state;

use std::collections::VecDeque;
use std::time::Duration;

pub use state::{
    PARKED_STATE_FILE, ParkKind, ParkedState, ParkedStateError, ParkedStateRead, clear_parked_state, read_parked_state,
    rfc3339_utc, write_parked_state,
};

use crate::exit_code;

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "lowercase")]
pub enum ChildExit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal (Unix).
    Signal(i32),
    /// The OS reported neither (treated as a crash).
    Unknown,
}

impl std::fmt::Display for ChildExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit code {c}"),
            Self::Signal(s) => write!(f, "signal {s}"),
            Self::Unknown => f.write_str("unknown exit"),
        }
    }
}

/// What the supervisor does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Planned stop: do not restart; supervise exits 0.
    StayDown,
    /// Planned restart: start the child again immediately.
    RestartNow,
    /// Crash: start the child again after this delay.
    Restart {
        /// Delay before the restart.
        backoff: Duration,
    },
    /// Stop restarting: record [`ParkedState`] and exit 0 so no outer manager loops either.
    Park {
        /// Why, for `status` and `doctor`.
        kind: ParkKind,
        /// Human-readable reason.
        reason: String,
    },
}

/// Tunables of the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisePolicy {
    /// First crash backoff.
    pub initial_backoff: Duration,
    /// Backoff cap.
    pub max_backoff: Duration,
    /// Uptime after which a child counts as healthy (resets the backoff).
    pub healthy_uptime: Duration,
    /// Crash-loop brake window.
    pub brake_window: Duration,
    /// Restarts allowed within the window at the growing backoff; past them, each restart
    /// waits [`Self::max_backoff`].
    pub brake_max_restarts: usize,
}

impl Default for SupervisePolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            healthy_uptime: Duration::from_secs(60),
            brake_window: Duration::from_secs(60),
            brake_max_restarts: 5,
        }
    }
}

/// What the supervisor remembers between exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartHistory {
    /// When the current child was started.
    pub child_started_at: Duration,
    /// When recent restarts happened (pruned to the brake window).
    pub restarts: VecDeque<Duration>,
    /// Crashes in a row without a healthy run in between.
    pub consecutive_crashes: u32,
}

impl RestartHistory {
    /// History for a first child started at `now`.
    #[must_use]
    pub fn new(now: Duration) -> Self {
        Self { child_started_at: now, restarts: VecDeque::new(), consecutive_crashes: 0 }
    }

    /// Records that the child which ended with `exit` was restarted at `now`.
    pub fn record_restart(&mut self, policy: &SupervisePolicy, exit: ChildExit, now: Duration) {
        let uptime = now.saturating_sub(self.child_started_at);
        if is_crash(exit) {
            self.consecutive_crashes =
                if uptime >= policy.healthy_uptime { 1 } else { self.consecutive_crashes.saturating_add(1) };
        } else if uptime >= policy.healthy_uptime {
            self.consecutive_crashes = 0;
        }
        if exit != ChildExit::Code(exit_code::PLANNED_RESTART) {
            self.restarts.push_back(now);
        }
        prune(&mut self.restarts, policy.brake_window, now);
        self.child_started_at = now;
    }

    /// Restarts within the brake window ending at `now`.
    #[must_use]
    pub fn restarts_within(&self, window: Duration, now: Duration) -> usize {
        self.restarts.iter().filter(|t| now.saturating_sub(**t) <= window && **t <= now).count()
    }
}

fn prune(q: &mut VecDeque<Duration>, window: Duration, now: Duration) {
    while q.front().is_some_and(|t| now.saturating_sub(*t) > window) {
        q.pop_front();
    }
    // Bound memory whatever the inputs (a clock going backwards keeps old entries).
    while q.len() > 1024 {
        q.pop_front();
    }
}

fn is_crash(exit: ChildExit) -> bool {
    !matches!(exit, ChildExit::Code(exit_code::PLANNED_STOP | exit_code::PLANNED_RESTART | exit_code::FATAL_CONFIG))
}

impl SupervisePolicy {
    /// Backoff after `crashes` consecutive crashes (1-based): `initial * 2^(crashes-1)`,
    /// capped.
    #[must_use]
    pub fn backoff(&self, crashes: u32) -> Duration {
        let shift = crashes.saturating_sub(1).min(31);
        self.initial_backoff.checked_mul(1u32 << shift).unwrap_or(self.max_backoff).min(self.max_backoff)
    }

    /// The decision for a child that ended with `exit` at `now`.
    #[must_use]
    pub fn decide(&self, exit: ChildExit, history: &RestartHistory, now: Duration) -> Action {
        match exit {
            ChildExit::Code(exit_code::PLANNED_STOP) => return Action::StayDown,
            ChildExit::Code(exit_code::FATAL_CONFIG) => {
                return Action::Park {
                    kind: ParkKind::FatalConfig,
                    reason: "the gateway exited 78 (fatal configuration: bad config, unusable \
                             home, listen address taken, or another instance holds the lock); \
                             not restarting until it is fixed"
                        .into(),
                };
            }
            _ => {}
        }
        // A planned restart is asked for, not a crash: it never trips the crash-loop brake (as
        // `gatewarden restart` resets systemd's start limit for the same reason).
        if exit == ChildExit::Code(exit_code::PLANNED_RESTART) {
            return Action::RestartNow;
        }
        let uptime = now.saturating_sub(history.child_started_at);
        let crashes = if uptime >= self.healthy_uptime { 1 } else { history.consecutive_crashes.saturating_add(1) };
        // Braked: too many restarts in the window, or a loop no healthy run has broken since.
        // The cap then holds until 60 s of health, so the delay only grows.
        let braked = history.restarts_within(self.brake_window, now) >= self.brake_max_restarts
            || usize::try_from(crashes).unwrap_or(usize::MAX) > self.brake_max_restarts;
        Action::Restart { backoff: if braked { self.max_backoff } else { self.backoff(crashes) } }
    }
}

/// [`SupervisePolicy::decide`] with the default policy.
#[must_use]
pub fn decide(exit: ChildExit, history: &RestartHistory, now: Duration) -> Action {
    SupervisePolicy::default().decide(exit, history, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }
    const fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn planned_restarts_never_trip_the_brake() {
        let p = SupervisePolicy::default();
        let mut h = RestartHistory::new(s(0));
        for i in 0..20 {
            let now = s(1) + ms(100 * i);
            assert_eq!(p.decide(ChildExit::Code(75), &h, now), Action::RestartNow, "planned restart #{i}");
            h.record_restart(&p, ChildExit::Code(75), now);
        }
        assert_eq!(h.restarts_within(p.brake_window, s(3)), 0);
        // Real crashes still do.
        let mut braked = false;
        for i in 0..20 {
            let now = s(4) + ms(100 * i);
            if p.decide(ChildExit::Code(1), &h, now) == (Action::Restart { backoff: p.max_backoff }) {
                braked = true;
                break;
            }
            h.record_restart(&p, ChildExit::Code(1), now);
        }
        assert!(braked, "a crash loop must still be braked");
    }

    #[test]
    fn exit_table() {
        let h = RestartHistory::new(s(0));
        let now = s(100);
        let table: &[(ChildExit, Action)] = &[
            (ChildExit::Code(0), Action::StayDown),
            (ChildExit::Code(75), Action::RestartNow),
            (ChildExit::Code(1), Action::Restart { backoff: ms(100) }),
            (ChildExit::Code(2), Action::Restart { backoff: ms(100) }),
            (ChildExit::Code(-1), Action::Restart { backoff: ms(100) }),
            (ChildExit::Signal(9), Action::Restart { backoff: ms(100) }),
            (ChildExit::Unknown, Action::Restart { backoff: ms(100) }),
        ];
        for (exit, want) in table {
            assert_eq!(&decide(*exit, &h, now), want, "{exit}");
        }
        assert!(matches!(decide(ChildExit::Code(78), &h, now), Action::Park { kind: ParkKind::FatalConfig, .. }));
    }

    #[test]
    fn backoff_doubles_to_cap_and_resets_after_healthy_uptime() {
        let p = SupervisePolicy { brake_max_restarts: usize::MAX, ..SupervisePolicy::default() };
        let mut h = RestartHistory::new(s(0));
        let mut now = ms(10);
        let mut seen = Vec::new();
        for _ in 0..12 {
            let Action::Restart { backoff } = p.decide(ChildExit::Code(1), &h, now) else {
                panic!("expected restart");
            };
            seen.push(backoff);
            now += backoff;
            h.record_restart(&p, ChildExit::Code(1), now);
            now += ms(10);
        }
        let want: Vec<_> = [100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000, 30_000]
            .into_iter()
            .map(ms)
            .collect();
        assert_eq!(seen, want);
        // 60 s of healthy uptime resets the backoff.
        now += s(60);
        assert_eq!(p.decide(ChildExit::Signal(11), &h, now), Action::Restart { backoff: ms(100) });
    }

    #[test]
    fn a_crash_loop_is_braked_to_the_cap_and_never_parks() {
        let p = SupervisePolicy::default();
        let mut h = RestartHistory::new(s(0));
        let mut now = s(1);
        for _ in 0..5 {
            assert!(matches!(p.decide(ChildExit::Code(1), &h, now), Action::Restart { backoff } if backoff < s(30)));
            h.record_restart(&p, ChildExit::Code(1), now);
            now += s(1);
        }
        // Past five restarts in a minute: every restart waits the cap, for as long as it lasts.
        for _ in 0..100 {
            assert_eq!(p.decide(ChildExit::Signal(9), &h, now), Action::Restart { backoff: s(30) });
            now += s(30);
            h.record_restart(&p, ChildExit::Signal(9), now);
        }
        // A planned restart is not a crash, even inside a crash loop; a stop is still a stop.
        assert_eq!(p.decide(ChildExit::Code(75), &h, now), Action::RestartNow);
        assert_eq!(p.decide(ChildExit::Code(0), &h, now), Action::StayDown);
        // 60 s of health end the loop: back to the first step.
        h.child_started_at = now;
        assert_eq!(p.decide(ChildExit::Code(1), &h, now + s(61)), Action::Restart { backoff: ms(100) });
    }

    #[test]
    fn spaced_out_restarts_never_park() {
        let p = SupervisePolicy::default();
        let mut h = RestartHistory::new(s(0));
        let mut now = s(0);
        for _ in 0..100 {
            now += s(15);
            let a = p.decide(ChildExit::Code(75), &h, now);
            assert_eq!(a, Action::RestartNow);
            h.record_restart(&p, ChildExit::Code(75), now);
        }
        assert!(h.restarts.len() <= 5);
    }

    #[test]
    fn clock_going_backwards_does_not_panic() {
        let h = RestartHistory::new(s(100));
        assert!(matches!(decide(ChildExit::Code(1), &h, s(1)), Action::Restart { .. }));
    }
}
