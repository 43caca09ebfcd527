//! The launchd restart-verification ladder: a pure state machine.
//!
//! After asking for a restart, launchd's answer is asynchronous and can silently not happen:
//! a respawn inside `ThrottleInterval` is *pended* and may never fire (hermes #62128), an
//! unloaded label is never revived by KeepAlive (#27592), `kickstart -k` can kill a respawn
//! that already happened and start a duplicate (#42446, #10317). So the caller feeds the
//! ladder [`Observation`]s and executes the [`LadderAction`]s it returns until it gets
//! [`LadderAction::Succeeded`] or [`LadderAction::Failed`].
//!
//! Invariants (bug-classes class E):
//! 1. Success means a **new incarnation** (different from the old one) holds the lock *and*
//!    is supervised by the label (its pid, or its parent `gatewarden supervise`, is a pid
//!    launchd reports), *and* the label is loaded. Nothing else counts.
//! 2. No escalation before `ThrottleInterval` + margin has passed since the old instance exited
//!    (launchd may still honour a pended spawn).
//! 3. Escalation order: plain `kickstart` (a no-op when a spawn already happened, so it cannot
//!    double-start) → `kickstart -k` → `bootout`/`bootstrap` from a helper outside the job's
//!    coalition.
//! 4. `kickstart -k` and bootout are **never** issued while a newer incarnation is alive; if one
//!    is alive but not supervised by the label, the ladder waits, then fails with an
//!    explanation instead of fighting it.
//! 5. An unloaded label goes straight to the helper (kickstart cannot load a label); the ladder
//!    never succeeds while the label is unloaded, and its failure names the command that
//!    re-bootstraps it.
//!
//! The ladder is driven by elapsed time supplied in observations, so tests run it against a
//! scripted model of launchd with no real clock.

use std::time::Duration;

use super::LaunchdTarget;
use crate::command::sh_quote;

/// A gateway incarnation: the pair the lock record publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// Process id.
    pub pid: u32,
    /// The 16-hex incarnation id from `gateway.pid`.
    pub incarnation: String,
}

/// Who holds the home's lock right now, as read from the lock record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// The gateway's pid.
    pub pid: u32,
    /// Its parent pid (the `gatewarden supervise` process under our plist), if known.
    pub parent_pid: Option<u32>,
    /// Its incarnation id.
    pub incarnation: String,
}

/// One look at the world.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observation {
    /// Time since the ladder started (monotonic).
    pub elapsed: Duration,
    /// Whether `launchctl print` finds the label.
    pub label_loaded: bool,
    /// Pids launchd reports for the label (normally zero or one).
    pub launchd_pids: Vec<u32>,
    /// The current lock holder, if any gateway runs in the home.
    pub lock_holder: Option<LockHolder>,
    /// launchd reports a pending (throttled) spawn.
    pub throttle_pending: bool,
}

/// What the caller should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LadderAction {
    /// Observe again after this long.
    Wait(Duration),
    /// `launchctl kickstart <target>`.
    Kickstart,
    /// `launchctl kickstart -k <target>`.
    KickstartKill,
    /// Run `bootout` + `bootstrap` in a helper outside the job's coalition
    /// (see [`super::helper_script`]).
    BootoutBootstrapFromHelper,
    /// Verified: this pid is the new, supervised gateway.
    Succeeded {
        /// The new gateway's pid.
        pid: u32,
    },
    /// Not verified within the ladder's deadlines.
    Failed {
        /// Why.
        reason: String,
        /// The command a human should run.
        recovery_command: String,
    },
}

/// Timing of the ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LadderConfig {
    /// The plist's `ThrottleInterval`.
    pub throttle_interval: Duration,
    /// Extra wait after the throttle before escalating (at least 1 s is enforced).
    pub respawn_margin: Duration,
    /// How long the old instance may take to drain and exit.
    pub drain_wait: Duration,
    /// Wait after a plain kickstart.
    pub kickstart_wait: Duration,
    /// Wait after `kickstart -k`.
    pub kill_wait: Duration,
    /// Wait for a helper's bootout/bootstrap (it waits for the old process itself).
    pub helper_wait: Duration,
    /// How many helper attempts before giving up.
    pub max_helper_attempts: u32,
    /// How long to watch an unsupervised newer gateway before giving up.
    pub hold_wait: Duration,
    /// Observation interval.
    pub poll: Duration,
}

impl LadderConfig {
    /// Defaults derived from the plist: 10 s margin (20 s total for a 10 s throttle, as
    /// hermes), drain wait = `ExitTimeOut`, helper wait = `ExitTimeOut` + 30 s.
    #[must_use]
    pub fn for_plist(throttle_interval_s: u64, exit_timeout_s: u64) -> Self {
        Self {
            throttle_interval: Duration::from_secs(throttle_interval_s),
            respawn_margin: Duration::from_secs(10),
            drain_wait: Duration::from_secs(exit_timeout_s),
            kickstart_wait: Duration::from_secs(10),
            kill_wait: Duration::from_secs(15),
            helper_wait: Duration::from_secs(exit_timeout_s.saturating_add(30)),
            max_helper_attempts: 2,
            hold_wait: Duration::from_secs(15),
            poll: Duration::from_millis(250),
        }
    }

    fn respawn_wait(&self) -> Duration {
        self.throttle_interval.saturating_add(self.respawn_margin.max(Duration::from_secs(1)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    AwaitOldExit,
    AwaitRespawn,
    AfterKickstart,
    AfterKickstartKill,
    AfterHelper(u32),
    /// A newer gateway is alive but launchd does not report it.
    Holding,
}

/// The ladder. Create one per restart, then call [`RestartLadder::next`] until it returns a
/// terminal action (after which it keeps returning that action).
#[derive(Debug, Clone)]
pub struct RestartLadder {
    cfg: LadderConfig,
    target: LaunchdTarget,
    old: Option<Incarnation>,
    stage: Stage,
    stage_since: Duration,
    done: Option<LadderAction>,
}

impl RestartLadder {
    /// A ladder verifying that `old` (or, with `None`, "nothing") was replaced by a new
    /// supervised gateway for `target`.
    #[must_use]
    pub fn new(cfg: LadderConfig, target: LaunchdTarget, old: Option<Incarnation>) -> Self {
        Self { cfg, target, old, stage: Stage::AwaitOldExit, stage_since: Duration::ZERO, done: None }
    }

    fn enter(&mut self, stage: Stage, now: Duration) {
        self.stage = stage;
        self.stage_since = now;
    }

    fn finish(&mut self, action: LadderAction) -> LadderAction {
        self.done = Some(action.clone());
        action
    }

    fn fail(&mut self, reason: String, label_loaded: bool) -> LadderAction {
        let recovery_command = if label_loaded {
            format!("launchctl kickstart -k {}", self.target.service())
        } else {
            format!(
                "launchctl bootstrap {} {} && launchctl kickstart {}",
                self.target.domain(),
                sh_quote(&self.target.plist_path),
                self.target.service()
            )
        };
        self.finish(LadderAction::Failed { reason, recovery_command })
    }

    /// Decides the next action from an observation.
    pub fn next(&mut self, obs: &Observation) -> LadderAction {
        if let Some(done) = &self.done {
            return done.clone();
        }
        let now = obs.elapsed;
        let in_stage = now.saturating_sub(self.stage_since);
        let old_inc = self.old.as_ref().map(|o| o.incarnation.as_str());
        let holder = obs.lock_holder.as_ref();
        let old_alive = holder.is_some_and(|h| Some(h.incarnation.as_str()) == old_inc);
        let newer = holder.filter(|h| Some(h.incarnation.as_str()) != old_inc);
        if let Some(h) = newer {
            let supervised =
                obs.launchd_pids.contains(&h.pid) || h.parent_pid.is_some_and(|p| obs.launchd_pids.contains(&p));
            if supervised && obs.label_loaded {
                return self.finish(LadderAction::Succeeded { pid: h.pid });
            }
            // A newer gateway that launchd does not (yet) report: never kill or boot it out.
            if self.stage != Stage::Holding {
                self.enter(Stage::Holding, now);
            }
        } else if self.stage == Stage::Holding {
            // It went away; start over from waiting for launchd.
            self.enter(Stage::AwaitRespawn, now);
        }
        let poll = LadderAction::Wait(self.cfg.poll);
        match self.stage {
            Stage::Holding => {
                if in_stage_since(self.stage_since, now) < self.cfg.hold_wait {
                    return poll;
                }
                let pid = newer.map_or(0, |h| h.pid);
                self.fail(
                    format!(
                        "a newer gateway (pid {pid}) holds the lock but launchd does not \
                         supervise it; not escalating against it (stop it, then start the service)"
                    ),
                    obs.label_loaded,
                )
            }
            Stage::AwaitOldExit => {
                if !old_alive {
                    self.enter(Stage::AwaitRespawn, now);
                    return self.next(obs);
                }
                if in_stage < self.cfg.drain_wait {
                    return poll;
                }
                if !obs.label_loaded {
                    return self.helper(now, obs);
                }
                // The old instance is wedged past its drain budget and no newer one exists.
                self.enter(Stage::AfterKickstartKill, now);
                LadderAction::KickstartKill
            }
            Stage::AwaitRespawn => {
                if !obs.label_loaded {
                    return self.helper(now, obs);
                }
                if in_stage < self.cfg.respawn_wait() {
                    return poll;
                }
                self.enter(Stage::AfterKickstart, now);
                LadderAction::Kickstart
            }
            Stage::AfterKickstart => {
                if !obs.label_loaded {
                    return self.helper(now, obs);
                }
                if in_stage < self.cfg.kickstart_wait {
                    return poll;
                }
                self.enter(Stage::AfterKickstartKill, now);
                LadderAction::KickstartKill
            }
            Stage::AfterKickstartKill => {
                if in_stage < self.cfg.kill_wait && obs.label_loaded {
                    return poll;
                }
                self.helper(now, obs)
            }
            Stage::AfterHelper(attempt) => {
                if in_stage < self.cfg.helper_wait {
                    return poll;
                }
                if attempt < self.cfg.max_helper_attempts {
                    self.enter(Stage::AfterHelper(attempt + 1), now);
                    return LadderAction::BootoutBootstrapFromHelper;
                }
                let why = if obs.label_loaded {
                    if obs.throttle_pending {
                        "launchd keeps the spawn pended"
                    } else {
                        "launchd reports no supervised gateway"
                    }
                } else {
                    "the label is still not loaded after bootstrap"
                };
                self.fail(format!("restart not verified after every escalation: {why}"), obs.label_loaded)
            }
        }
    }

    fn helper(&mut self, now: Duration, obs: &Observation) -> LadderAction {
        if self.cfg.max_helper_attempts == 0 {
            return self.fail("bootout/bootstrap escalation is disabled".into(), obs.label_loaded);
        }
        self.enter(Stage::AfterHelper(1), now);
        LadderAction::BootoutBootstrapFromHelper
    }
}

fn in_stage_since(since: Duration, now: Duration) -> Duration {
    now.saturating_sub(since)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> LaunchdTarget {
        LaunchdTarget::new(501, "ai.gatewarden.gateway", "/Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist")
    }

    fn old() -> Incarnation {
        Incarnation { pid: 100, incarnation: "aaaa".into() }
    }

    fn obs(t: u64, loaded: bool, pids: &[u32], holder: Option<(u32, Option<u32>, &str)>) -> Observation {
        Observation {
            elapsed: Duration::from_secs(t),
            label_loaded: loaded,
            launchd_pids: pids.to_vec(),
            lock_holder: holder.map(|(pid, parent_pid, inc)| LockHolder { pid, parent_pid, incarnation: inc.into() }),
            throttle_pending: false,
        }
    }

    #[test]
    fn new_supervised_incarnation_succeeds_immediately() {
        let mut l = RestartLadder::new(LadderConfig::for_plist(10, 100), target(), Some(old()));
        assert_eq!(l.next(&obs(0, true, &[200], Some((201, Some(200), "bbbb")))), LadderAction::Succeeded { pid: 201 });
        // Terminal actions stick.
        assert_eq!(l.next(&obs(1, false, &[], None)), LadderAction::Succeeded { pid: 201 });
    }

    #[test]
    fn old_incarnation_never_counts() {
        let mut l = RestartLadder::new(LadderConfig::for_plist(10, 100), target(), Some(old()));
        assert_eq!(
            l.next(&obs(0, true, &[100], Some((100, None, "aaaa")))),
            LadderAction::Wait(Duration::from_millis(250))
        );
    }

    #[test]
    fn escalates_only_after_throttle_plus_margin() {
        let mut l = RestartLadder::new(LadderConfig::for_plist(10, 100), target(), Some(old()));
        assert!(matches!(l.next(&obs(0, true, &[], None)), LadderAction::Wait(_)));
        assert!(matches!(l.next(&obs(19, true, &[], None)), LadderAction::Wait(_)));
        assert_eq!(l.next(&obs(20, true, &[], None)), LadderAction::Kickstart);
        assert!(matches!(l.next(&obs(29, true, &[], None)), LadderAction::Wait(_)));
        assert_eq!(l.next(&obs(30, true, &[], None)), LadderAction::KickstartKill);
        assert!(matches!(l.next(&obs(44, true, &[], None)), LadderAction::Wait(_)));
        assert_eq!(l.next(&obs(45, true, &[], None)), LadderAction::BootoutBootstrapFromHelper);
    }

    #[test]
    fn unloaded_label_goes_to_helper_and_failure_names_bootstrap() {
        let mut cfg = LadderConfig::for_plist(10, 100);
        cfg.max_helper_attempts = 1;
        let mut l = RestartLadder::new(cfg, target(), None);
        assert_eq!(l.next(&obs(0, false, &[], None)), LadderAction::BootoutBootstrapFromHelper);
        match l.next(&obs(1000, false, &[], None)) {
            LadderAction::Failed { recovery_command, .. } => {
                assert!(recovery_command.starts_with("launchctl bootstrap gui/501 /Users/a/"), "{recovery_command}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn never_kills_a_newer_unsupervised_incarnation() {
        let mut l = RestartLadder::new(LadderConfig::for_plist(10, 100), target(), Some(old()));
        let mut t = 0;
        loop {
            let a = l.next(&obs(t, true, &[], Some((300, Some(1), "cccc"))));
            assert_ne!(a, LadderAction::KickstartKill);
            assert_ne!(a, LadderAction::BootoutBootstrapFromHelper);
            if let LadderAction::Failed { reason, .. } = a {
                assert!(reason.contains("pid 300"), "{reason}");
                break;
            }
            t += 1;
            assert!(t < 1000);
        }
    }

    #[test]
    fn wedged_old_instance_is_killed_after_drain_wait() {
        let mut l = RestartLadder::new(LadderConfig::for_plist(10, 100), target(), Some(old()));
        let alive = Some((100, None, "aaaa"));
        assert!(matches!(l.next(&obs(99, true, &[100], alive)), LadderAction::Wait(_)));
        assert_eq!(l.next(&obs(100, true, &[100], alive)), LadderAction::KickstartKill);
    }
}
