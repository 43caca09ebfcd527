//! `service install` and `service uninstall` as transactions (issue 27 §4), as pure data: the
//! steps for a manager and what is there before ([`install_plan`], [`uninstall_plan`]), and
//! for a failure at any step the steps that put back what was there ([`undo`]).
//! crates/ops/src/service.rs carries them out through the per-OS facade; the model test below
//! runs every plan against a small world of definition, manager and gateways, fails each step
//! (before and after its effect), and checks that the undo ends where the world began.
//!
//! The rules the plans keep:
//! - nothing is stopped before the manager has answered and accepted the definition (for
//!   systemd and the Task Scheduler the definition is loaded, not started, before the gateway
//!   outside the manager is stopped; launchd starts a job when it loads it, so there the plist
//!   is checked first and loaded after the stop);
//! - the gateway outside the manager is stopped as a hand-over (the operator still wants it to
//!   run) and started again, at its address, by any failure after that;
//! - the managed gateway must answer `running` before the install counts as done.

use crate::ManagerKind;

/// What is there before the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Before {
    /// A definition for this home is installed (its bytes are kept, to be put back).
    pub installed: bool,
    /// The manager runs this home's gateway (it owns it).
    pub managed_running: bool,
    /// A gateway runs in this home outside the manager.
    pub unmanaged_running: bool,
}

/// One step forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The manager answers (systemd: `daemon-reload`; launchd: `launchctl print` of the
    /// domain; Task Scheduler: `schtasks /Query`). Changes nothing.
    CheckManager,
    /// This version's definition is written and the manager accepts it, without starting it
    /// (systemd: written, `daemon-reload`, loaded without errors; launchd: written and linted,
    /// loaded later by [`Step::Enable`]; Task Scheduler: registered).
    Load,
    /// Enabled for boot or login (systemd `enable`; launchd `bootstrap`, which also starts the
    /// job; elsewhere nothing more).
    Enable,
    /// The gateway outside the manager is stopped (a hand-over: the desired state stays `run`).
    StopUnmanaged,
    /// The manager starts the gateway.
    Start,
    /// The gateway the manager started answers `running`.
    VerifyReady,
    /// The managed gateway is stopped gracefully, through the manager (uninstall).
    StopManaged,
    /// The definition is disabled and removed, and the manager forgets it (uninstall).
    Remove,
}

/// One step back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    /// Stop the gateway the manager runs (gracefully, then the manager's stop).
    StopManaged,
    /// Start the gateway outside the manager again, at the address it listened on.
    StartUnmanaged,
    /// Put back the definition that was installed (its bytes and its enablement), or none.
    RestoreDefinition,
    /// Start the managed gateway again through the manager, and wait until it is ready.
    StartManaged,
}

impl Step {
    /// What puts back this step's effect (also when the step failed half-way), newest first.
    pub fn undo(self, kind: ManagerKind, before: &Before) -> &'static [Undo] {
        match self {
            Step::CheckManager | Step::VerifyReady => &[],
            // launchd started the job when it loaded it.
            Step::Enable if loading_starts(kind) && !before.managed_running => {
                &[Undo::StopManaged, Undo::RestoreDefinition]
            }
            Step::Load | Step::Enable | Step::Remove => &[Undo::RestoreDefinition],
            Step::StopUnmanaged => &[Undo::StartUnmanaged],
            // Started by this transaction: stopped again.
            Step::Start => &[Undo::StopManaged],
            // An uninstall's stop of the gateway the manager ran: started again.
            Step::StopManaged if before.managed_running => &[Undo::StartManaged],
            Step::StopManaged => &[],
        }
    }
}

/// Whether loading the definition starts the job (launchd: `KeepAlive` with `SuccessfulExit`
/// implies `RunAtLoad`), so it must wait until the gateway outside the manager is stopped.
pub fn loading_starts(kind: ManagerKind) -> bool {
    kind == ManagerKind::Launchd
}

/// The steps of `service install` (`start`: start it now, unless the manager already runs it).
pub fn install_plan(kind: ManagerKind, before: &Before, start: bool) -> Vec<Step> {
    let mut plan = vec![Step::CheckManager, Step::Load];
    // Already the manager's: the new definition applies at its next restart.
    if before.managed_running {
        plan.push(Step::Enable);
        return plan;
    }
    if !start {
        // Nothing is stopped that would not be started again; launchd would start the job by
        // loading it, so it is loaded by the next `gatewarden start`.
        if !loading_starts(kind) {
            plan.push(Step::Enable);
        }
        return plan;
    }
    if loading_starts(kind) {
        if before.unmanaged_running {
            plan.push(Step::StopUnmanaged);
        }
        plan.push(Step::Enable);
    } else {
        plan.push(Step::Enable);
        if before.unmanaged_running {
            plan.push(Step::StopUnmanaged);
        }
    }
    plan.extend([Step::Start, Step::VerifyReady]);
    plan
}

/// The steps of `service uninstall`.
pub fn uninstall_plan(before: &Before) -> Vec<Step> {
    let mut plan = vec![Step::CheckManager];
    if before.managed_running {
        plan.push(Step::StopManaged);
    }
    plan.push(Step::Remove);
    plan
}

/// What puts the world back after `plan[failed]` failed: the undo of every step up to and
/// including the failed one, newest first, each once; the definition is put back last, so the
/// gateway is back first even when the manager that failed cannot take the old definition.
pub fn undo(kind: ManagerKind, plan: &[Step], failed: usize, before: &Before) -> Vec<Undo> {
    let mut out: Vec<Undo> = Vec::new();
    for step in plan.iter().take(failed.saturating_add(1)).rev() {
        for u in step.undo(kind, before) {
            if !out.contains(u) {
                out.push(*u);
            }
        }
    }
    out.sort_by_key(|u| *u == Undo::RestoreDefinition);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a manager and a home hold. `definition`: none, the one installed before (`Old`),
    /// or this version's (`New`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct World {
        definition: Def,
        enabled: bool,
        loaded: bool,
        managed_running: bool,
        unmanaged_running: bool,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Def {
        None,
        Old,
        New,
    }

    struct Model {
        kind: ManagerKind,
        w: World,
        /// Who holds the home's lock: at most one gateway ever runs.
        violations: Vec<String>,
    }

    impl Model {
        fn new(kind: ManagerKind, w: World) -> Model {
            Model { kind, w, violations: Vec::new() }
        }

        fn one_gateway(&mut self, what: &str) {
            if self.w.managed_running && self.w.unmanaged_running {
                self.violations.push(format!("two gateways after {what}"));
            }
        }

        fn step(&mut self, s: Step) {
            let w = &mut self.w;
            match s {
                Step::CheckManager | Step::VerifyReady => {}
                Step::Load => {
                    w.definition = Def::New;
                    // A running job keeps what it was started with; launchd loads at Enable.
                    if !loading_starts(self.kind) {
                        w.loaded = true;
                    }
                }
                Step::Enable => {
                    w.enabled = true;
                    if loading_starts(self.kind) && !w.loaded {
                        w.loaded = true;
                        // KeepAlive's SuccessfulExit implies RunAtLoad; a gateway holding the
                        // lock makes the job's child exit 78, which is the "two gateways"
                        // this plan must never cause.
                        if w.unmanaged_running {
                            self.violations.push("launchd job loaded while a gateway ran outside it".into());
                        }
                        w.managed_running = true;
                    }
                }
                Step::StopUnmanaged => w.unmanaged_running = false,
                Step::Start => w.managed_running = true,
                Step::StopManaged => w.managed_running = false,
                Step::Remove => {
                    w.definition = Def::None;
                    w.enabled = false;
                    w.loaded = false;
                }
            }
            self.one_gateway(&format!("{s:?}"));
        }

        fn undo(&mut self, u: Undo, before: &World) {
            let w = &mut self.w;
            match u {
                Undo::StopManaged => w.managed_running = false,
                Undo::StartUnmanaged => w.unmanaged_running = true,
                Undo::RestoreDefinition => {
                    w.definition = before.definition;
                    w.enabled = before.enabled;
                    w.loaded = before.loaded;
                }
                Undo::StartManaged => w.managed_running = true,
            }
            self.one_gateway(&format!("undo {u:?}"));
        }
    }

    /// Every world a transaction may start from (never two gateways at once).
    fn worlds() -> Vec<World> {
        let mut out = Vec::new();
        for definition in [Def::None, Def::Old] {
            for managed_running in [false, true] {
                for unmanaged_running in [false, true] {
                    let installed = definition != Def::None;
                    if managed_running && (!installed || unmanaged_running) {
                        continue;
                    }
                    out.push(World {
                        definition,
                        enabled: installed,
                        loaded: installed,
                        managed_running,
                        unmanaged_running,
                    });
                }
            }
        }
        out
    }

    fn before_of(w: &World) -> Before {
        Before {
            installed: w.definition != Def::None,
            managed_running: w.managed_running,
            unmanaged_running: w.unmanaged_running,
        }
    }

    const KINDS: [ManagerKind; 4] =
        [ManagerKind::Systemd, ManagerKind::Launchd, ManagerKind::TaskScheduler, ManagerKind::Scm];

    /// Runs `plan`, failing step `fail` (after its effect when `half`), then its undo.
    fn run(kind: ManagerKind, start: &World, plan: &[Step], fail: Option<(usize, bool)>) -> Model {
        let mut m = Model::new(kind, *start);
        for (i, s) in plan.iter().enumerate() {
            if let Some((at, half)) = fail
                && at == i
            {
                if half {
                    m.step(*s);
                }
                for u in undo(kind, plan, i, &before_of(start)) {
                    m.undo(u, start);
                }
                return m;
            }
            m.step(*s);
        }
        m
    }

    #[test]
    fn every_failed_install_ends_where_it_began() {
        for kind in KINDS {
            for w in worlds() {
                for start in [true, false] {
                    let plan = install_plan(kind, &before_of(&w), start);
                    for at in 0..plan.len() {
                        for half in [false, true] {
                            let m = run(kind, &w, &plan, Some((at, half)));
                            let what = format!("{kind} {w:?} start={start} fails at {:?} (half: {half})", plan[at]);
                            assert_eq!(m.w, w, "{what}: plan {plan:?}");
                            assert!(m.violations.is_empty(), "{what}: {:?}", m.violations);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_successful_install_leaves_one_managed_gateway_or_what_ran() {
        for kind in KINDS {
            for w in worlds() {
                for start in [true, false] {
                    let plan = install_plan(kind, &before_of(&w), start);
                    let m = run(kind, &w, &plan, None);
                    let what = format!("{kind} {w:?} start={start}: {plan:?}");
                    assert!(m.violations.is_empty(), "{what}: {:?}", m.violations);
                    assert_eq!(m.w.definition, Def::New, "{what}");
                    if start || w.managed_running {
                        assert!(m.w.managed_running && !m.w.unmanaged_running, "{what}: {:?}", m.w);
                    } else {
                        // --no-start stops nothing.
                        assert_eq!(m.w.unmanaged_running, w.unmanaged_running, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_is_stopped_before_the_manager_answered_and_accepted_the_definition() {
        for kind in KINDS {
            for w in worlds() {
                let plan = install_plan(kind, &before_of(&w), true);
                assert_eq!(&plan[..2], [Step::CheckManager, Step::Load], "{kind} {w:?}");
                if let Some(stop) = plan.iter().position(|s| *s == Step::StopUnmanaged) {
                    assert!(stop > 1, "{kind}: {plan:?}");
                    assert_eq!(plan.last(), Some(&Step::VerifyReady), "{kind}: {plan:?}");
                }
            }
        }
        // systemd: enabled (and so loaded and accepted) before the stop; launchd loads after it.
        let b = Before { installed: false, managed_running: false, unmanaged_running: true };
        assert_eq!(
            install_plan(ManagerKind::Systemd, &b, true),
            [Step::CheckManager, Step::Load, Step::Enable, Step::StopUnmanaged, Step::Start, Step::VerifyReady]
        );
        assert_eq!(
            install_plan(ManagerKind::Launchd, &b, true),
            [Step::CheckManager, Step::Load, Step::StopUnmanaged, Step::Enable, Step::Start, Step::VerifyReady]
        );
        assert_eq!(install_plan(ManagerKind::Launchd, &b, false), [Step::CheckManager, Step::Load]);
        assert_eq!(
            install_plan(ManagerKind::TaskScheduler, &b, true),
            install_plan(ManagerKind::Systemd, &b, true),
            "a scheduled task is registered without starting, like a unit"
        );
    }

    #[test]
    fn a_failed_hand_over_stops_the_managed_gateway_before_starting_the_old_one() {
        let b = Before { installed: false, managed_running: false, unmanaged_running: true };
        for kind in KINDS {
            let plan = install_plan(kind, &b, true);
            let at = plan.len() - 1;
            assert_eq!(
                undo(kind, &plan, at, &b),
                [Undo::StopManaged, Undo::StartUnmanaged, Undo::RestoreDefinition],
                "{kind}: {plan:?}"
            );
        }
        // The manager refusing the definition stops nothing and starts nothing.
        let plan = install_plan(ManagerKind::Systemd, &b, true);
        assert_eq!(undo(ManagerKind::Systemd, &plan, 1, &b), [Undo::RestoreDefinition]);
        assert!(undo(ManagerKind::Systemd, &plan, 0, &b).is_empty());
    }

    #[test]
    fn every_failed_uninstall_ends_where_it_began() {
        for kind in KINDS {
            for w in worlds().into_iter().filter(|w| w.definition != Def::None && !w.unmanaged_running) {
                let plan = uninstall_plan(&before_of(&w));
                for at in 0..plan.len() {
                    for half in [false, true] {
                        let m = run(kind, &w, &plan, Some((at, half)));
                        assert_eq!(m.w, w, "{kind} {w:?} uninstall fails at {:?} (half: {half})", plan[at]);
                    }
                }
                let done = run(kind, &w, &plan, None);
                assert_eq!(done.w.definition, Def::None);
                assert!(!done.w.managed_running && !done.w.enabled, "{:?}", done.w);
            }
        }
    }
}
