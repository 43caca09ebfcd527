//! The renewal/demotion state machine, as data. It is given the time of every event and
//! answers what to do and when to wake up; the driver does the I/O.
//!
//! The rule that makes a paused or cut-off active safe: its local deadline is the monotonic
//! instant at which it *sent* its last successful renewal (or acquisition), plus the TTL,
//! minus a margin. The database computed the expiry from a later instant (when it received the
//! request), so the local deadline always comes first: the active stops before any standby
//! can be granted the lease.

use std::time::{Duration, Instant};

/// Lease timing from `[cluster]` in config.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
    pub renew_every: Duration,
    /// Subtracted from the TTL for the local deadline.
    pub margin: Duration,
}

impl Timing {
    /// `renew_every` must leave at least two renewals per TTL.
    pub fn new(ttl: Duration, renew_every: Duration) -> Result<Timing, String> {
        if renew_every.is_zero() || renew_every.saturating_mul(2) > ttl {
            return Err(format!("renew interval {renew_every:?} must be positive and at most half the TTL {ttl:?}"));
        }
        Ok(Timing { ttl, renew_every, margin: ttl / 4 })
    }

    /// How long a standby waits before it tries again, knowing the holder's lease expires in
    /// `expires_in` (database clock): just after the expiry, but never longer than 9/10 of a
    /// renewal interval, so a released lease is taken within one interval, query time included.
    pub fn standby_wait(&self, expires_in: Duration) -> Duration {
        (expires_in + Duration::from_millis(20)).min(self.renew_every * 9 / 10)
    }
}

/// Why an active stops being active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoteReason {
    /// A renewal found the lease expired or held by a newer epoch.
    Lost,
    /// No renewal succeeded before the local deadline (store unreachable, or a pause).
    Deadline,
    /// A fenced write was refused.
    Fenced,
    /// Graceful: released after draining.
    Released,
}

impl DemoteReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DemoteReason::Lost => "lost",
            DemoteReason::Deadline => "deadline",
            DemoteReason::Fenced => "fenced",
            DemoteReason::Released => "released",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Standby { retry_at: Instant },
    Active { epoch: i64, deadline: Instant, renew_at: Instant },
}

/// What happened, with the instant the request was sent where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Acquired {
        epoch: i64,
        sent: Instant,
    },
    Held {
        expires_in: Duration,
    },
    Renewed {
        sent: Instant,
    },
    /// The store answered: not ours any more.
    RenewRefused,
    /// The store did not answer (error or timeout).
    Failed,
    Fenced,
    Released,
}

/// What the driver must do after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Promote { epoch: i64 },
    Demote { epoch: i64, reason: DemoteReason },
}

#[derive(Debug, Clone)]
pub struct Machine {
    pub timing: Timing,
    pub role: Role,
}

impl Machine {
    pub fn new(timing: Timing, now: Instant) -> Machine {
        Machine { timing, role: Role::Standby { retry_at: now } }
    }

    /// The epoch we hold, if active and before the deadline at `now`.
    pub fn active_epoch(&self, now: Instant) -> Option<i64> {
        match self.role {
            Role::Active { epoch, deadline, .. } if now < deadline => Some(epoch),
            _ => None,
        }
    }

    /// When the driver must act next: the renewal, or the retry of a standby; an active also
    /// wakes at its deadline.
    pub fn next_wakeup(&self) -> Instant {
        match self.role {
            Role::Standby { retry_at } => retry_at,
            Role::Active { deadline, renew_at, .. } => renew_at.min(deadline),
        }
    }

    /// How long the next store call may take: an active must hear back before its deadline.
    pub fn call_budget(&self, now: Instant) -> Duration {
        match self.role {
            Role::Standby { .. } => self.timing.renew_every,
            Role::Active { deadline, .. } => deadline.saturating_duration_since(now),
        }
    }

    /// Time passes: an active past its deadline demotes (before the lease can expire).
    pub fn tick(&mut self, now: Instant) -> Action {
        match self.role {
            Role::Active { epoch, deadline, .. } if now >= deadline => {
                self.role = Role::Standby { retry_at: now };
                Action::Demote { epoch, reason: DemoteReason::Deadline }
            }
            _ => Action::Nothing,
        }
    }

    pub fn step(&mut self, input: Input, now: Instant) -> Action {
        // A late answer never resurrects a lease whose deadline passed.
        if let a @ Action::Demote { .. } = self.tick(now) {
            return a;
        }
        let t = self.timing;
        match (self.role, input) {
            (Role::Standby { .. }, Input::Acquired { epoch, sent }) => {
                let deadline = sent + t.ttl - t.margin;
                if now >= deadline {
                    // The grant arrived too late to use; the next attempt re-acquires.
                    self.role = Role::Standby { retry_at: now };
                    return Action::Nothing;
                }
                self.role = Role::Active { epoch, deadline, renew_at: now + t.renew_every };
                Action::Promote { epoch }
            }
            (Role::Standby { .. }, Input::Held { expires_in }) => {
                self.role = Role::Standby { retry_at: now + t.standby_wait(expires_in) };
                Action::Nothing
            }
            (Role::Standby { .. }, _) => {
                self.role = Role::Standby { retry_at: now + t.renew_every };
                Action::Nothing
            }
            (Role::Active { epoch, .. }, Input::Renewed { sent }) => {
                let deadline = sent + t.ttl - t.margin;
                self.role = Role::Active { epoch, deadline, renew_at: now + t.renew_every };
                Action::Nothing
            }
            (Role::Active { epoch, deadline, .. }, Input::Failed) => {
                // Retry soon, but keep the deadline: only a successful renewal moves it.
                self.role = Role::Active { epoch, deadline, renew_at: now + t.renew_every / 4 };
                Action::Nothing
            }
            (Role::Active { epoch, .. }, Input::RenewRefused) => self.demote(epoch, DemoteReason::Lost, now),
            (Role::Active { epoch, .. }, Input::Fenced) => self.demote(epoch, DemoteReason::Fenced, now),
            (Role::Active { epoch, .. }, Input::Released) => self.demote(epoch, DemoteReason::Released, now),
            (Role::Active { .. }, Input::Acquired { .. } | Input::Held { .. }) => Action::Nothing,
        }
    }

    fn demote(&mut self, epoch: i64, reason: DemoteReason, now: Instant) -> Action {
        self.role = Role::Standby { retry_at: now + self.timing.renew_every };
        Action::Demote { epoch, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(4), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn timing_needs_two_renewals_per_ttl() {
        assert!(Timing::new(Duration::from_secs(3), Duration::from_secs(2)).is_err());
        assert!(Timing::new(Duration::from_secs(3), Duration::ZERO).is_err());
        let t = timing();
        assert_eq!(t.margin, Duration::from_secs(1));
        assert_eq!(t.standby_wait(Duration::from_millis(100)), Duration::from_millis(120));
        assert_eq!(t.standby_wait(Duration::from_secs(30)), Duration::from_millis(900));
    }

    #[test]
    fn acquire_renew_and_demote_at_the_deadline_before_expiry() {
        let t0 = Instant::now();
        let mut m = Machine::new(timing(), t0);
        assert_eq!(
            m.step(Input::Acquired { epoch: 7, sent: t0 }, t0 + Duration::from_millis(10)),
            Action::Promote { epoch: 7 }
        );
        assert_eq!(m.active_epoch(t0 + Duration::from_secs(1)), Some(7));
        // Renewal sent at 1 s succeeds: deadline moves to 1 + 4 - 1 = 4 s.
        let s = t0 + Duration::from_secs(1);
        assert_eq!(m.step(Input::Renewed { sent: s }, s + Duration::from_millis(5)), Action::Nothing);
        // Then the store stops answering.
        assert_eq!(m.step(Input::Failed, t0 + Duration::from_secs(2)), Action::Nothing);
        assert_eq!(m.step(Input::Failed, t0 + Duration::from_secs(3)), Action::Nothing);
        assert_eq!(m.active_epoch(t0 + Duration::from_millis(3999)), Some(7));
        assert_eq!(m.active_epoch(t0 + Duration::from_secs(4)), None);
        // The wake-up is never later than the deadline, which is 1 s (the margin) before the
        // database's earliest possible expiry (sent + ttl = 5 s).
        assert!(m.next_wakeup() <= t0 + Duration::from_secs(4));
        assert_eq!(m.tick(t0 + Duration::from_secs(4)), Action::Demote { epoch: 7, reason: DemoteReason::Deadline });
        assert_eq!(m.active_epoch(t0 + Duration::from_secs(4)), None);
    }

    #[test]
    fn a_late_success_after_a_pause_does_not_resurrect_the_lease() {
        let t0 = Instant::now();
        let mut m = Machine::new(timing(), t0);
        m.step(Input::Acquired { epoch: 1, sent: t0 }, t0);
        // Paused for 10 s (SIGSTOP); the renewal answer is processed afterwards.
        let woke = t0 + Duration::from_secs(10);
        assert_eq!(
            m.step(Input::Renewed { sent: t0 + Duration::from_secs(1) }, woke),
            Action::Demote { epoch: 1, reason: DemoteReason::Deadline }
        );
        // A grant that arrives after its own deadline is not used either.
        assert_eq!(m.step(Input::Acquired { epoch: 2, sent: t0 }, woke), Action::Nothing);
        assert_eq!(m.active_epoch(woke), None);
    }

    #[test]
    fn refused_renewal_and_fence_demote_at_once() {
        let t0 = Instant::now();
        for (input, reason) in [
            (Input::RenewRefused, DemoteReason::Lost),
            (Input::Fenced, DemoteReason::Fenced),
            (Input::Released, DemoteReason::Released),
        ] {
            let mut m = Machine::new(timing(), t0);
            m.step(Input::Acquired { epoch: 3, sent: t0 }, t0);
            assert_eq!(m.step(input, t0 + Duration::from_millis(1)), Action::Demote { epoch: 3, reason });
            assert_eq!(m.active_epoch(t0 + Duration::from_millis(1)), None);
        }
    }

    #[test]
    fn a_standby_retries_right_after_the_holders_expiry() {
        let t0 = Instant::now();
        let mut m = Machine::new(timing(), t0);
        assert_eq!(m.next_wakeup(), t0);
        m.step(Input::Held { expires_in: Duration::from_millis(300) }, t0);
        assert_eq!(m.next_wakeup(), t0 + Duration::from_millis(320));
        m.step(Input::Failed, t0);
        assert_eq!(m.next_wakeup(), t0 + Duration::from_secs(1));
        assert_eq!(m.call_budget(t0), Duration::from_secs(1));
    }
}
