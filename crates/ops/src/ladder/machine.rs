//! The restart ladder's decisions: a pure state machine, observation in, action out.
//!
//! The driver (`ladder/mod.rs`) looks at the world — the control endpoint's answer, the
//! lock, the desired state, the owner — and hands each look to [`Watch::step`] as an
//! [`Observation`]; it carries out the [`Action`] it gets back (start a new incarnation, stop
//! a wedged one, report). Time is the elapsed time in each observation, so the tests below
//! run the ladder against scripted worlds with no process and no clock.
//!
//! Invariants (crates/runtime/README.md, restart routes):
//! 1. Success is a **new** incarnation answering `running`; the old one, in any state, is not.
//! 2. A later stop ends the watch at once: nothing more is started.
//! 3. At most one kick per restart (a start through the owner, or a direct one), and only
//!    after the owner's own revive delay (`kick_after`), or at once when the owner gave up.
//! 4. A lock holder silent for longer than [`UNRESPONSIVE`], or an old incarnation draining
//!    past its drain budget plus [`DRAIN_GRACE`], is wedged: stopped, then replaced.
//! 5. Every path ends by the deadline, with what was seen last; a next incarnation that refused
//!    to start (exit 78) is started once more at once, and refused again ends the watch.

use std::time::Duration;

/// A lock holder silent on its control endpoint for this long is wedged, not busy.
pub const UNRESPONSIVE: Duration = Duration::from_secs(3);
/// Beyond the drain budget: the cancelled runs' clean-up and the HTTP wind-down.
pub const DRAIN_GRACE: Duration = Duration::from_secs(15);
/// How often a gone gateway's owner is asked whether it gave up on the unit.
const UNIT_CHECK_EVERY: Duration = Duration::from_millis(100);

/// What the control endpoint said about the gateway before the restart was requested.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answer {
    pub incarnation: Option<String>,
    pub state: Option<String>,
    /// Seconds since it started.
    pub uptime_s: Option<f64>,
}

/// The first move, from the old gateway's answer (class H3: concurrent restarts coalesce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// An incarnation started after this request is already running: nothing to do.
    Coalesced,
    /// The old gateway is already draining or stopping: join that, do not ask twice.
    Join(String),
    /// Ask the gateway to restart.
    Request,
}

/// `since_request`: how long ago the restart was requested.
pub fn begin(old: &Answer, since_request: Duration) -> Begin {
    let started_since = old.uptime_s.is_some_and(|up| up < since_request.as_secs_f64());
    match old.state.as_deref() {
        Some("running") if started_since => Begin::Coalesced,
        Some(s @ ("draining" | "stopping")) => Begin::Join(s.to_owned()),
        _ => Begin::Request,
    }
}

/// What is fixed for one watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The old incarnation (empty when none was seen).
    pub old: String,
    /// When the watch gives up, since it began.
    pub deadline: Duration,
    /// How long the lock may stay free before the ladder starts a gateway itself
    /// (`ManagerKind::kick_after`: the owner's revive delay plus a margin).
    pub kick_after: Duration,
    /// The old incarnation's drain budget, if it reported one.
    pub drain: Option<Duration>,
    /// `update`'s early failure: once the ladder kicked, the lock may stay free only this much
    /// longer than `kick_after`.
    pub fail_fast: Option<Duration>,
    /// The owner runs the gateway itself (systemd) and can be asked whether it gave up.
    pub owner_runs_gateway: bool,
}

/// One look at the control endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// It answered.
    Answer { incarnation: Option<String>, state: Option<String> },
    /// It did not answer; whether something holds the lock.
    Silent { lock_held: bool },
}

/// One look at the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// Since the watch began (monotonic).
    pub at: Duration,
    /// A stop is recorded in the desired state since the restart was requested.
    pub stop_recorded: bool,
    /// The owner's own relaunch ladder (launchd) failed, with why.
    pub relaunch_failed: Option<String>,
    pub seen: Seen,
    /// The owner's answer to "did you give up on the unit?", when [`Watch::wants_unit_check`]
    /// asked for it.
    pub unit_gave_up: Option<bool>,
    /// The ladder already started a new incarnation (a kick, or a wedged gateway's recovery).
    pub kicked: bool,
    /// A gateway refused to start (`start_refused`, not a prevented start) since the watch
    /// began; looked up only while nothing holds the lock.
    pub refused: bool,
    /// ... and one did since the ladder's own start (its kick).
    pub refused_after_kick: bool,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Look again shortly.
    Wait,
    /// The observed answer is the new incarnation, `running`: done.
    Ready,
    /// Start a new incarnation (through the owner, or directly), then keep watching.
    Kick { why: String },
    /// Stop the wedged gateway with the one stopper and start a new one; `old_answers`: the
    /// old incarnation still answers on its control endpoint.
    RecoverWedged { why: String, old_answers: bool },
    /// A later stop owns the gateway now.
    Overtaken,
    /// Not verified: what was seen.
    Fail { seen: String },
}

/// The watch for a new incarnation: the part of the ladder that loops.
#[derive(Debug, Clone)]
pub struct Watch {
    cfg: Config,
    draining_since: Option<Duration>,
    silent_since: Option<Duration>,
    gone_since: Option<Duration>,
    last_unit_check: Duration,
    seen: String,
    phase: String,
}

impl Watch {
    pub fn new(cfg: Config) -> Watch {
        Watch {
            cfg,
            draining_since: None,
            silent_since: None,
            gone_since: None,
            last_unit_check: Duration::ZERO,
            seen: "nothing yet".into(),
            phase: String::new(),
        }
    }

    /// What was seen last (the failure's wording).
    pub fn seen(&self) -> &str {
        &self.seen
    }

    /// The progress line for the last step.
    pub fn phase(&self) -> &str {
        &self.phase
    }

    /// Whether the next observation of a free lock should ask the owner if it gave up.
    pub fn wants_unit_check(&self, at: Duration) -> bool {
        self.cfg.owner_runs_gateway && at.saturating_sub(self.last_unit_check) >= UNIT_CHECK_EVERY
    }

    pub fn step(&mut self, obs: &Observation) -> Action {
        if obs.at >= self.cfg.deadline {
            return Action::Fail { seen: self.seen.clone() };
        }
        if obs.stop_recorded {
            return Action::Overtaken;
        }
        if let Some(why) = &obs.relaunch_failed {
            return Action::Fail { seen: why.clone() };
        }
        let old = self.cfg.old.clone();
        match &obs.seen {
            Seen::Answer { incarnation, state }
                if incarnation.as_deref() != Some(old.as_str()) && state.as_deref() == Some("running") =>
            {
                Action::Ready
            }
            Seen::Answer { incarnation, state } if incarnation.as_deref() == Some(old.as_str()) => {
                self.silent_since = None;
                let state = state.clone().unwrap_or_default();
                self.phase = format!("old gateway {old} is {state}");
                self.seen = format!("the old incarnation {old} still {state}");
                if matches!(state.as_str(), "draining" | "stopping") {
                    let since = *self.draining_since.get_or_insert(obs.at);
                    if self.cfg.drain.is_some_and(|d| obs.at - since > d + DRAIN_GRACE) {
                        let why = format!("the old gateway {old} is still {state} past its drain budget");
                        return Action::RecoverWedged { why, old_answers: true };
                    }
                }
                Action::Wait
            }
            Seen::Answer { incarnation, state } => {
                self.silent_since = None;
                self.phase = "new incarnation starting".into();
                self.seen = format!(
                    "new incarnation {} in state {}",
                    incarnation.clone().unwrap_or_default(),
                    state.clone().unwrap_or_default()
                );
                Action::Wait
            }
            Seen::Silent { lock_held: true } => {
                self.gone_since = None;
                self.phase = "waiting for the new gateway".into();
                self.seen = "a process holds the lock but does not answer yet".into();
                let since = *self.silent_since.get_or_insert(obs.at);
                if obs.at - since > UNRESPONSIVE {
                    let why = "the lock holder does not answer on its control endpoint".to_owned();
                    return Action::RecoverWedged { why, old_answers: false };
                }
                Action::Wait
            }
            Seen::Silent { lock_held: false } => {
                self.silent_since = None;
                self.phase = "waiting for a gateway to take the lock".into();
                self.seen = "no gateway holds the lock".into();
                let gone = obs.at - *self.gone_since.get_or_insert(obs.at);
                if obs.unit_gave_up.is_some() {
                    self.last_unit_check = obs.at;
                }
                let kick_after = self.cfg.kick_after;
                if let Some(extra) = self.cfg.fail_fast
                    && obs.kicked
                    && gone >= kick_after + extra
                {
                    let seen = format!(
                        "no gateway took the lock, not even one started {:.1}s ago",
                        (gone - kick_after).as_secs_f64()
                    );
                    return Action::Fail { seen };
                }
                // A next incarnation that refused to start is tried once more (a port may have
                // been taken for a moment); refused again, it will not start by waiting.
                if obs.kicked && obs.refused_after_kick {
                    return Action::Fail { seen: "the gateway the restart started could not start either".into() };
                }
                if obs.kicked {
                    Action::Wait
                } else if obs.refused {
                    Action::Kick { why: "the new gateway could not start".into() }
                } else if obs.unit_gave_up == Some(true) {
                    Action::Kick { why: "the service manager gave up on the unit".into() }
                } else if gone >= kick_after {
                    Action::Kick { why: format!("no gateway took the lock within {:.1}s", kick_after.as_secs_f64()) }
                } else {
                    Action::Wait
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn cfg() -> Config {
        Config {
            old: "old1".into(),
            deadline: Duration::from_secs(90),
            kick_after: Duration::from_secs(2),
            drain: Some(Duration::from_secs(30)),
            fail_fast: None,
            owner_runs_gateway: false,
        }
    }

    fn obs(at: Duration, seen: Seen) -> Observation {
        Observation {
            at,
            stop_recorded: false,
            relaunch_failed: None,
            seen,
            unit_gave_up: None,
            kicked: false,
            refused: false,
            refused_after_kick: false,
        }
    }

    fn answer(inc: &str, state: &str) -> Seen {
        Seen::Answer { incarnation: Some(inc.into()), state: Some(state.into()) }
    }

    const GONE: Seen = Seen::Silent { lock_held: false };
    const SILENT: Seen = Seen::Silent { lock_held: true };

    /// A next incarnation that refused to start is started once more at once (not after
    /// `kick_after`); refused again, the watch ends instead of waiting out the deadline.
    #[test]
    fn a_refused_next_start_is_tried_once_more_then_ends_the_watch() {
        let mut w = Watch::new(cfg());
        let refused =
            |at, kicked, refused_after_kick| Observation { refused: true, kicked, refused_after_kick, ..obs(at, GONE) };
        assert_eq!(w.step(&obs(MS(0), GONE)), Action::Wait);
        assert_eq!(
            w.step(&refused(MS(20), false, false)),
            Action::Kick { why: "the new gateway could not start".into() }
        );
        assert_eq!(w.step(&refused(MS(40), true, false)), Action::Wait);
        assert!(matches!(w.step(&refused(MS(60), true, true)), Action::Fail { .. }));
        // Nothing started after the old one left (no manager): the ladder's own start, refused,
        // ends the watch too.
        let mut w = Watch::new(cfg());
        assert_eq!(w.step(&obs(MS(0), GONE)), Action::Wait);
        assert!(matches!(w.step(&obs(MS(2100), GONE)), Action::Kick { .. }));
        assert!(matches!(w.step(&refused(MS(2200), true, true)), Action::Fail { .. }));
    }

    #[test]
    fn only_a_new_running_incarnation_is_success() {
        let mut w = Watch::new(cfg());
        assert_eq!(w.step(&obs(MS(0), answer("old1", "running"))), Action::Wait);
        assert_eq!(w.seen(), "the old incarnation old1 still running");
        assert_eq!(w.step(&obs(MS(20), answer("new1", "starting"))), Action::Wait);
        assert_eq!(w.seen(), "new incarnation new1 in state starting");
        assert_eq!(w.step(&obs(MS(40), answer("new1", "running"))), Action::Ready);
    }

    #[test]
    fn a_later_stop_and_the_deadline_end_the_watch() {
        let mut w = Watch::new(cfg());
        let mut o = obs(MS(0), GONE);
        o.stop_recorded = true;
        assert_eq!(w.step(&o), Action::Overtaken);
        let mut w = Watch::new(cfg());
        w.step(&obs(MS(0), answer("old1", "draining")));
        let end = w.step(&obs(Duration::from_secs(90), answer("new1", "running")));
        assert_eq!(end, Action::Fail { seen: "the old incarnation old1 still draining".into() });
    }

    #[test]
    fn kicks_once_after_the_owners_delay() {
        let mut w = Watch::new(cfg());
        assert_eq!(w.step(&obs(MS(0), GONE)), Action::Wait);
        assert_eq!(w.step(&obs(MS(1999), GONE)), Action::Wait);
        assert!(matches!(w.step(&obs(MS(2000), GONE)), Action::Kick { why } if why.contains("within 2.0s")));
        let mut o = obs(MS(2100), GONE);
        o.kicked = true;
        assert_eq!(w.step(&o), Action::Wait, "one kick per restart");
    }

    #[test]
    fn a_manager_that_gave_up_is_kicked_at_once_and_asked_at_most_every_100ms() {
        let mut w = Watch::new(Config { owner_runs_gateway: true, ..cfg() });
        assert!(w.wants_unit_check(MS(100)));
        let mut o = obs(MS(100), GONE);
        o.unit_gave_up = Some(false);
        assert_eq!(w.step(&o), Action::Wait);
        assert!(!w.wants_unit_check(MS(150)));
        assert!(w.wants_unit_check(MS(200)));
        o.at = MS(200);
        o.unit_gave_up = Some(true);
        assert!(matches!(w.step(&o), Action::Kick { why } if why.contains("gave up")));
        assert!(!Watch::new(cfg()).wants_unit_check(MS(500)), "only owners that run the gateway");
    }

    #[test]
    fn a_silent_lock_holder_is_wedged_after_unresponsive() {
        let mut w = Watch::new(cfg());
        assert_eq!(w.step(&obs(MS(0), SILENT)), Action::Wait);
        assert_eq!(w.step(&obs(UNRESPONSIVE, SILENT)), Action::Wait);
        // An answer in between restarts the silence clock.
        assert_eq!(w.step(&obs(UNRESPONSIVE + MS(10), answer("new1", "starting"))), Action::Wait);
        assert_eq!(w.step(&obs(UNRESPONSIVE + MS(20), SILENT)), Action::Wait);
        let t = UNRESPONSIVE * 2 + MS(30);
        assert!(matches!(w.step(&obs(t, SILENT)), Action::RecoverWedged { old_answers: false, .. }));
    }

    #[test]
    fn draining_past_its_budget_is_wedged_and_without_a_budget_never() {
        let mut w = Watch::new(cfg());
        assert_eq!(w.step(&obs(MS(0), answer("old1", "draining"))), Action::Wait);
        let limit = Duration::from_secs(30) + DRAIN_GRACE;
        assert_eq!(w.step(&obs(limit, answer("old1", "draining"))), Action::Wait);
        let end = w.step(&obs(limit + MS(1), answer("old1", "stopping")));
        assert!(
            matches!(end, Action::RecoverWedged { old_answers: true, why } if why.contains("past its drain budget"))
        );
        let mut w = Watch::new(Config { drain: None, ..cfg() });
        w.step(&obs(MS(0), answer("old1", "draining")));
        assert_eq!(w.step(&obs(Duration::from_secs(80), answer("old1", "draining"))), Action::Wait);
    }

    #[test]
    fn fail_fast_gives_up_once_even_the_ladders_own_start_took_no_lock() {
        let mut w = Watch::new(Config { fail_fast: Some(Duration::from_secs(3)), ..cfg() });
        w.step(&obs(MS(0), GONE));
        let mut o = obs(Duration::from_secs(4), GONE);
        o.kicked = true;
        assert_eq!(w.step(&o), Action::Wait);
        o.at = Duration::from_secs(5);
        assert!(matches!(w.step(&o), Action::Fail { seen } if seen.contains("not even one started 3.0s ago")));
        // Without fail-fast the same world waits for the deadline.
        let mut w = Watch::new(cfg());
        w.step(&obs(MS(0), GONE));
        assert_eq!(w.step(&o), Action::Wait);
    }

    #[test]
    fn the_owners_relaunch_failure_ends_the_watch() {
        let mut w = Watch::new(cfg());
        let mut o = obs(MS(0), GONE);
        o.relaunch_failed = Some("launchd did not bring it back".into());
        assert_eq!(w.step(&o), Action::Fail { seen: "launchd did not bring it back".into() });
    }

    #[test]
    fn concurrent_restarts_coalesce_or_join() {
        let running =
            |up: f64| Answer { incarnation: Some("a".into()), state: Some("running".into()), uptime_s: Some(up) };
        assert_eq!(begin(&running(0.5), Duration::from_secs(1)), Begin::Coalesced);
        assert_eq!(begin(&running(100.0), Duration::from_secs(1)), Begin::Request);
        let draining = Answer { state: Some("draining".into()), ..Answer::default() };
        assert_eq!(begin(&draining, Duration::ZERO), Begin::Join("draining".into()));
        assert_eq!(begin(&Answer::default(), Duration::ZERO), Begin::Request);
    }
}
