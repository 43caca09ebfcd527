//! `LaunchdModel`: a scripted model of launchd's observable behaviour, and the class E
//! scenarios (E1–E8) run against the restart ladder.
//!
//! The model keeps: a loaded flag, the job's pid, a KeepAlive policy, `ThrottleInterval` with
//! pended spawns (optionally pended forever, hermes #62128), `kickstart` that may do nothing,
//! bootstrap EIO injection, and the home's lock (one holder; a spawned gateway that finds the
//! lock held exits 78). It records violations the ladder must never cause: a double start, or
//! killing an incarnation newer than the one being replaced.

use std::time::Duration;

use gatewarden_service::launchd::{
    Incarnation, LadderAction, LadderConfig, LaunchdTarget, LockHolder, Observation, RestartLadder,
};
use proptest::prelude::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Policy {
    SuccessfulExitFalse,
    KeepAliveTrue,
}

#[derive(Clone, Debug)]
struct Gateway {
    pid: u32,
    ppid: Option<u32>,
    incarnation: String,
    /// Scheduled exit (time, code); `None` = runs until killed.
    exit_at: Option<(Duration, i32)>,
}

#[derive(Debug)]
pub struct LaunchdModel {
    now: Duration,
    loaded: bool,
    policy: Policy,
    /// The job is `gatewarden supervise` (gateway is its child) rather than the gateway.
    supervised: bool,
    throttle: Duration,
    last_spawn: Duration,
    /// `Some(Some(t))` spawn pending at t; `Some(None)` pended forever.
    pending: Option<Option<Duration>>,
    pend_forever: bool,
    kickstart_noop: bool,
    bootstrap_eio: u32,
    job_pid: Option<u32>,
    gateway: Option<Gateway>,
    /// A gateway outside launchd holding the lock.
    stray: Option<Gateway>,
    /// Incarnation being replaced, for violation checks.
    old_incarnation: Option<String>,
    /// The same, as the ladder is told.
    old: Option<Incarnation>,
    old_exited_at: Option<Duration>,
    next_id: u32,
    pub spawns: u32,
    pub violations: Vec<String>,
}

impl LaunchdModel {
    /// A loaded job running one gateway, spawned `since_spawn` ago.
    pub fn running(policy: Policy, supervised: bool, throttle_s: u64, since_spawn: Duration) -> Self {
        let mut m = Self {
            now: Duration::from_secs(1000),
            loaded: true,
            policy,
            supervised,
            throttle: Duration::from_secs(throttle_s),
            last_spawn: Duration::ZERO,
            pending: None,
            pend_forever: false,
            kickstart_noop: false,
            bootstrap_eio: 0,
            job_pid: None,
            gateway: None,
            stray: None,
            old_incarnation: None,
            old: None,
            old_exited_at: None,
            next_id: 100,
            spawns: 0,
            violations: Vec::new(),
        };
        m.spawn();
        m.last_spawn = m.now.saturating_sub(since_spawn);
        m.spawns = 0;
        m.old_incarnation = m.gateway.as_ref().map(|g| g.incarnation.clone());
        m.old = m.gateway.as_ref().map(|g| Incarnation { pid: g.pid, incarnation: g.incarnation.clone() });
        m
    }

    /// The incarnation the restart replaces (fixed at construction).
    pub fn old(&self) -> Option<Incarnation> {
        self.old.clone()
    }

    /// The current gateway will exit with `code` after `after`.
    pub fn schedule_exit(&mut self, after: Duration, code: i32) {
        let at = self.now + after;
        if let Some(g) = &mut self.gateway {
            g.exit_at = Some((at, code));
        }
    }

    fn fresh(&mut self) -> (u32, String) {
        self.next_id += 1;
        (self.next_id, format!("inc{:04}", self.next_id))
    }

    fn lock_free(&self) -> bool {
        self.gateway.is_none() && self.stray.is_none()
    }

    fn start_gateway(&mut self, ppid: Option<u32>, pid: Option<u32>) -> bool {
        if !self.lock_free() {
            return false;
        }
        let (id, inc) = self.fresh();
        self.gateway = Some(Gateway { pid: pid.unwrap_or(id), ppid, incarnation: inc, exit_at: None });
        true
    }

    fn spawn(&mut self) {
        if self.job_pid.is_some() {
            self.violations.push(format!("double start at {:?}", self.now));
            return;
        }
        self.spawns += 1;
        self.pending = None;
        self.last_spawn = self.now;
        let (job, _) = self.fresh();
        self.job_pid = Some(job);
        let started =
            if self.supervised { self.start_gateway(Some(job), None) } else { self.start_gateway(None, Some(job)) };
        if !started {
            // Lock held: `run` exits 78. The supervisor parks and exits 0.
            let code = if self.supervised { 0 } else { 78 };
            self.job_exit(code);
        }
    }

    fn job_exit(&mut self, code: i32) {
        self.job_pid = None;
        let revive = match self.policy {
            Policy::KeepAliveTrue => true,
            Policy::SuccessfulExitFalse => code != 0,
        };
        if !revive || !self.loaded {
            return;
        }
        if self.pend_forever {
            self.pending = Some(None);
            return;
        }
        let at = self.last_spawn + self.throttle;
        if at <= self.now {
            self.spawn();
        } else {
            self.pending = Some(Some(at));
        }
    }

    fn gateway_exit(&mut self, code: i32) {
        let Some(g) = self.gateway.take() else { return };
        if Some(&g.incarnation) == self.old_incarnation.as_ref() {
            self.old_exited_at = Some(self.now);
        }
        if self.supervised {
            match code {
                // supervise restarts 75 and crashes itself, without launchd.
                75 | 1 => {
                    let job = self.job_pid;
                    self.start_gateway(job, None);
                }
                // 0 and 78: supervise exits 0 (parks on 78).
                _ => self.job_exit(0),
            }
        } else {
            self.job_exit(code);
        }
    }

    fn kill_job(&mut self, what: &str) {
        if let Some(g) = &self.gateway
            && Some(&g.incarnation) != self.old_incarnation.as_ref()
        {
            self.violations.push(format!("{what} killed newer incarnation {}", g.incarnation));
        }
        if let Some(g) = self.gateway.take()
            && Some(&g.incarnation) == self.old_incarnation.as_ref()
        {
            self.old_exited_at = Some(self.now);
        }
        self.job_pid = None;
    }

    pub fn advance(&mut self, dt: Duration) {
        let target = self.now + dt;
        loop {
            let exit = self.gateway.as_ref().and_then(|g| g.exit_at).filter(|(t, _)| *t <= target);
            let spawn = self.pending.flatten().filter(|t| *t <= target);
            match (exit, spawn) {
                (Some((te, code)), s) if s.is_none_or(|ts| te <= ts) => {
                    self.now = self.now.max(te);
                    self.gateway_exit(code);
                }
                (_, Some(ts)) => {
                    self.now = self.now.max(ts);
                    self.pending = None;
                    if self.job_pid.is_none() && self.loaded {
                        self.spawn();
                    }
                }
                _ => break,
            }
        }
        self.now = target;
    }

    pub fn apply(&mut self, a: &LadderAction) {
        match a {
            LadderAction::Kickstart => {
                if self.loaded && self.job_pid.is_none() && !self.kickstart_noop {
                    self.spawn();
                }
            }
            LadderAction::KickstartKill => {
                if self.loaded {
                    if self.job_pid.is_some() {
                        self.kill_job("kickstart -k");
                    }
                    if !self.kickstart_noop {
                        self.spawn();
                    }
                }
            }
            LadderAction::BootoutBootstrapFromHelper => {
                if self.job_pid.is_some() {
                    self.kill_job("bootout");
                }
                self.loaded = false;
                self.pending = None;
                // The helper waits for the old pid (killed above), then retries bootstrap.
                for _ in 0..3 {
                    if self.bootstrap_eio > 0 {
                        self.bootstrap_eio -= 1;
                        continue;
                    }
                    self.loaded = true;
                    self.spawn(); // RunAtLoad
                    break;
                }
            }
            LadderAction::Wait(_) | LadderAction::Succeeded { .. } | LadderAction::Failed { .. } => {}
        }
    }

    pub fn observe(&self, t0: Duration) -> Observation {
        let holder = self.stray.as_ref().or(self.gateway.as_ref());
        Observation {
            elapsed: self.now - t0,
            label_loaded: self.loaded,
            launchd_pids: if self.loaded { self.job_pid.into_iter().collect() } else { vec![] },
            lock_holder: holder.map(|g| LockHolder {
                pid: g.pid,
                parent_pid: g.ppid,
                incarnation: g.incarnation.clone(),
            }),
            throttle_pending: self.pending.is_some(),
        }
    }
}

fn target() -> LaunchdTarget {
    LaunchdTarget::new(501, "ai.gatewarden.gateway", "/Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist")
}

struct Run {
    outcome: LadderAction,
    /// (elapsed, action) for every non-wait action.
    actions: Vec<(Duration, LadderAction)>,
    /// Elapsed time at which the old instance exited, if it did.
    old_exit: Option<Duration>,
}

fn drive(m: &mut LaunchdModel, cfg: LadderConfig) -> Run {
    let t0 = m.now;
    let mut ladder = RestartLadder::new(cfg, target(), m.old());
    let mut actions = Vec::new();
    for _ in 0..100_000 {
        let obs = m.observe(t0);
        let a = ladder.next(&obs);
        match &a {
            LadderAction::Wait(d) => m.advance(*d),
            LadderAction::Succeeded { pid } => {
                // Invariant: success only with the label loaded and the new gateway holding the lock.
                assert!(m.loaded, "succeeded with the label unloaded");
                let g = m.gateway.as_ref().expect("a gateway");
                assert_eq!(g.pid, *pid);
                assert_ne!(Some(&g.incarnation), m.old_incarnation.as_ref());
                return Run { outcome: a, actions, old_exit: m.old_exited_at.map(|t| t - t0) };
            }
            LadderAction::Failed { .. } => {
                return Run { outcome: a, actions, old_exit: m.old_exited_at.map(|t| t - t0) };
            }
            other => {
                if matches!(other, LadderAction::KickstartKill | LadderAction::BootoutBootstrapFromHelper) {
                    let newer_alive =
                        obs.lock_holder.as_ref().is_some_and(|h| Some(&h.incarnation) != m.old_incarnation.as_ref());
                    assert!(!newer_alive, "{other:?} issued while a newer incarnation is alive");
                }
                actions.push((obs.elapsed, other.clone()));
                m.apply(other);
            }
        }
    }
    panic!("ladder did not terminate");
}

fn cfg(throttle_s: u64) -> LadderConfig {
    LadderConfig::for_plist(throttle_s, 100)
}

fn escalations(r: &Run) -> Vec<&LadderAction> {
    r.actions.iter().map(|(_, a)| a).collect()
}

/// E1: planned restart (75) under `SuccessfulExit = false`, gateway run directly: launchd
/// respawns after the throttle; the ladder sees the new pid without escalating.
#[test]
fn e1_planned_restart_under_successful_exit_false() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 10, Duration::from_secs(3));
    m.schedule_exit(Duration::from_secs(2), 75);
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }), "{:?}", r.outcome);
    assert!(escalations(&r).is_empty(), "{:?}", r.actions);
    assert!(m.now - Duration::from_secs(1000) < Duration::from_secs(20));
    assert_eq!(m.spawns, 1);
    assert!(m.violations.is_empty(), "{:?}", m.violations);
}

/// E2: `KeepAlive = true`: even exit 0 respawns; the ladder still verifies a new pid.
#[test]
fn e2_keepalive_true_exit_zero() {
    let mut m = LaunchdModel::running(Policy::KeepAliveTrue, false, 10, Duration::from_secs(60));
    m.schedule_exit(Duration::from_secs(1), 0);
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }));
    assert!(escalations(&r).is_empty());
}

/// E3: the respawn is pended forever; the ladder waits past ThrottleInterval, then a plain
/// kickstart yields the new gateway.
#[test]
fn e3_pended_spawn_is_kickstarted_after_the_throttle() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 10, Duration::from_secs(3));
    m.pend_forever = true;
    m.schedule_exit(Duration::from_secs(1), 75);
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }), "{:?}", r.outcome);
    assert_eq!(escalations(&r), [&LadderAction::Kickstart]);
    let (t, _) = r.actions[0];
    assert!(t - r.old_exit.unwrap() > Duration::from_secs(10), "escalated at {t:?}");
    assert!(m.violations.is_empty());
}

/// E3 (failure): nothing works; the ladder climbs every rung and fails with a recovery
/// command, never claiming success.
#[test]
fn e3_total_failure_reports_recovery_command() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 10, Duration::from_secs(3));
    m.pend_forever = true;
    m.kickstart_noop = true;
    m.bootstrap_eio = 1000;
    m.schedule_exit(Duration::from_secs(1), 75);
    let r = drive(&mut m, cfg(10));
    match &r.outcome {
        LadderAction::Failed { recovery_command, reason } => {
            assert!(recovery_command.contains("launchctl bootstrap gui/501"), "{recovery_command}");
            assert!(reason.contains("not loaded"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        escalations(&r),
        [
            &LadderAction::Kickstart,
            &LadderAction::KickstartKill,
            &LadderAction::BootoutBootstrapFromHelper,
            &LadderAction::BootoutBootstrapFromHelper,
        ]
    );
}

/// E5: the label was left unloaded; the helper bootstraps (one EIO, retried) and the label is
/// loaded with a supervised gateway at the end.
#[test]
fn e5_unloaded_label_recovers_through_helper_with_eio() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, true, 10, Duration::from_secs(60));
    m.kill_job("test setup");
    m.violations.clear();
    m.loaded = false;
    m.bootstrap_eio = 1;
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }), "{:?}", r.outcome);
    assert_eq!(escalations(&r), [&LadderAction::BootoutBootstrapFromHelper]);
    assert!(m.loaded);
}

/// E6: a newer gateway runs outside launchd (holds the lock); the ladder never kills or boots
/// out against it, and fails with an explanation.
#[test]
fn e6_never_kickstart_kill_a_newer_incarnation() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 10, Duration::from_secs(60));
    m.schedule_exit(Duration::from_secs(1), 75);
    m.advance(Duration::ZERO);
    m.stray = Some(Gateway { pid: 9999, ppid: Some(1), incarnation: "stray".into(), exit_at: None });
    let r = drive(&mut m, cfg(10));
    assert!(
        !escalations(&r)
            .iter()
            .any(|a| matches!(a, LadderAction::KickstartKill | LadderAction::BootoutBootstrapFromHelper)),
        "{:?}",
        r.actions
    );
    match r.outcome {
        LadderAction::Failed { reason, .. } => assert!(reason.contains("9999"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(m.violations.is_empty(), "{:?}", m.violations);
}

/// E6b: a slow KeepAlive respawn races the plain kickstart: still exactly one start.
#[test]
fn e6_respawn_racing_kickstart_starts_once() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 20, Duration::ZERO);
    m.schedule_exit(Duration::ZERO, 1);
    // Ladder escalates at throttle + 1 s margin = 21 s; launchd respawns at 20 s.
    let mut c = cfg(20);
    c.respawn_margin = Duration::from_secs(1);
    let r = drive(&mut m, c);
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }));
    assert_eq!(m.spawns, 1);
    assert!(m.violations.is_empty(), "{:?}", m.violations);
}

/// E7: a deliberate stop (exit 0) under our plist stays down for 60 s; `start` (kickstart)
/// then yields exactly one gateway.
#[test]
fn e7_deliberate_stop_stays_down_then_start_works() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, true, 10, Duration::from_secs(60));
    m.schedule_exit(Duration::from_secs(1), 0);
    m.advance(Duration::from_secs(61));
    assert!(m.job_pid.is_none() && m.gateway.is_none());
    assert_eq!(m.spawns, 0);
    assert!(m.loaded, "the label stays loaded: start needs no bootstrap");
    m.apply(&LadderAction::Kickstart);
    let t0 = m.now;
    let mut ladder = RestartLadder::new(cfg(10), target(), None);
    assert!(matches!(ladder.next(&m.observe(t0)), LadderAction::Succeeded { .. }));
    assert_eq!(m.spawns, 1);
}

/// E8: exit 78 under our plist parks: no respawn within 60 s.
#[test]
fn e8_fatal_config_does_not_loop() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, true, 10, Duration::from_secs(60));
    m.schedule_exit(Duration::from_secs(1), 78);
    m.advance(Duration::from_secs(60));
    assert_eq!(m.spawns, 0);
    // The old direct policy would loop: one respawn per throttle interval.
    let mut old = LaunchdModel::running(Policy::SuccessfulExitFalse, false, 10, Duration::from_secs(60));
    old.stray = Some(Gateway { pid: 1, ppid: None, incarnation: "holder".into(), exit_at: None });
    old.schedule_exit(Duration::from_secs(1), 78);
    old.advance(Duration::from_secs(60));
    assert!(old.spawns >= 5, "{}", old.spawns);
}

/// A wedged old instance (never exits) is killed only after its drain budget.
#[test]
fn wedged_old_instance_is_kickstart_killed_after_drain() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, true, 10, Duration::from_secs(60));
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }));
    assert_eq!(r.actions.len(), 1);
    assert_eq!(r.actions[0], (Duration::from_secs(100), LadderAction::KickstartKill));
    assert!(m.violations.is_empty());
}

/// Planned restart under our own plist: the supervisor restarts the child; launchd is not
/// involved and the ladder verifies at once.
#[test]
fn supervised_planned_restart_needs_no_launchd() {
    let mut m = LaunchdModel::running(Policy::SuccessfulExitFalse, true, 10, Duration::from_secs(1));
    m.schedule_exit(Duration::from_secs(2), 75);
    let r = drive(&mut m, cfg(10));
    assert!(matches!(r.outcome, LadderAction::Succeeded { .. }));
    assert!(r.actions.is_empty());
    assert_eq!(m.spawns, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever launchd does, the ladder terminates, never double-starts, never kills a newer
    /// incarnation (asserted inside `drive`), never succeeds unloaded (ditto), and never
    /// kickstarts before ThrottleInterval has passed since the old instance exited.
    #[test]
    fn ladder_invariants_hold_against_any_launchd(
        keepalive_true in any::<bool>(),
        supervised in any::<bool>(),
        throttle in 1u64..30,
        since_spawn in 0u64..40,
        pend_forever in any::<bool>(),
        kickstart_noop in any::<bool>(),
        eio in 0u32..5,
        exit in proptest::option::of((0u64..150, prop_oneof![Just(0), Just(1), Just(75), Just(78)])),
        unloaded in any::<bool>(),
        stray in any::<bool>(),
    ) {
        let policy = if keepalive_true { Policy::KeepAliveTrue } else { Policy::SuccessfulExitFalse };
        let mut m = LaunchdModel::running(policy, supervised, throttle, Duration::from_secs(since_spawn));
        m.pend_forever = pend_forever;
        m.kickstart_noop = kickstart_noop;
        m.bootstrap_eio = eio;
        if let Some((after, code)) = exit {
            m.schedule_exit(Duration::from_secs(after), code);
        }
        if unloaded {
            m.loaded = false;
        }
        if stray {
            m.schedule_exit(Duration::ZERO, 1);
            m.advance(Duration::ZERO);
            if m.gateway.is_none() {
                m.stray = Some(Gateway { pid: 1, ppid: None, incarnation: "stray".into(), exit_at: None });
            }
        }
        let r = drive(&mut m, cfg(throttle));
        prop_assert!(m.violations.is_empty(), "{:?}", m.violations);
        for (t, a) in &r.actions {
            if *a == LadderAction::Kickstart
                && let Some(old_exit) = r.old_exit
            {
                prop_assert!(*t >= old_exit + Duration::from_secs(throttle), "kickstart at {t:?}, old exit {old_exit:?}");
            }
        }
        let terminal = matches!(r.outcome, LadderAction::Succeeded { .. } | LadderAction::Failed { .. });
        prop_assert!(terminal);
    }
}
