//! The restart ladder: the one loop, shared by `restart` (the verb and the gateway's backstop,
//! `restart.rs`) and `update` ([`restart_verified`]), that ends only when a **new
//! incarnation** holds the lock and is ready, or with what was seen. The decisions are the
//! pure machine in `machine.rs` (unit-tested without processes); this file observes and acts:
//! - the gateway answers: ask it to restart (a systemd unit's start-rate counter is reset
//!   first, so planned restarts never trip its crash-loop brake), then watch;
//! - it does not answer within [`machine::UNRESPONSIVE`] (SIGSTOPped, wedged), or stays
//!   draining past its drain budget plus [`machine::DRAIN_GRACE`]: stop it with the one stopper
//!   (marker + verified SIGTERM, verified SIGKILL) and start a new incarnation;
//! - nobody holds the lock for longer than the owner allows (`ManagerKind::kick_after`: its
//!   restart delay plus a margin), or the manager gave up on the unit (start limit, failed):
//!   start it through the owner (`ServiceManager::start`; for a gateway nobody manages that
//!   is a direct `gatewarden start`), recorded as `kicked` in the ledger.
//!
//! The desired state binds the ladder (`gatewarden_lifecycle::desired`, `intent.rs`): it
//! checks before every start and stops watching as soon as a later stop is recorded: that
//! stop owns the gateway now, and it stays down.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use gatewarden_control::proto::RESTART_REFUSED;
use gatewarden_control::stopper::{self, StopOutcome, StopPlan};
use gatewarden_control::{Client, ClientError, Endpoint, Op, Requester, StatusReport};
use gatewarden_lifecycle::desired::{self, Refusal, Starter};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{Home, InstanceLock};
use serde_json::{Value, json};

pub mod machine;

use machine::{Action, Begin, Seen, UNRESPONSIVE};

use crate::owner;
use crate::presence::{Presence, presence};
use crate::progress::Progress;
use crate::ready::{lock_held, status_of};

const POLL: Duration = Duration::from_millis(20);
/// `update`: after the ladder started a new incarnation itself, how long the lock may stay free
/// before the restart counts as failed (a started gateway takes the lock within milliseconds).
const FAIL_FAST: Duration = Duration::from_secs(3);
/// The budget of the stopper for a wedged gateway (it is not draining anything useful).
const WEDGED_STOP: Duration = Duration::from_secs(10);

/// `update`'s restart: the whole ladder in this (already detached) process; the status of the
/// new incarnation once it is verified `running`, else what was seen. Unlike `restart`, it
/// gives up early when even a new incarnation the ladder started itself takes no lock within
/// `FAIL_FAST` (3 s): a release that cannot start fails at once instead of at the deadline.
pub fn restart_verified(home: &Home, timeout_s: u64) -> Result<StatusReport, String> {
    let seq = desired::current(home.dir()).seq;
    let (result, failure) = orchestrate_with(home, timeout_s, Some(FAIL_FAST), seq);
    match result {
        Ok(code) if code == ExitCode::SUCCESS => status_of(&Endpoint::for_home(home.dir()), Duration::from_secs(2))
            .map_err(|e| format!("after the restart: {e}")),
        Ok(_) => Err(format!("the restart was not verified: {}", failure.unwrap_or_else(|| "see above".into()))),
        Err(e) => Err(e.chain()),
    }
}

/// The old gateway's status, retried for up to [`UNRESPONSIVE`] while it holds the lock.
fn old_status(home: &Home, ep: &Endpoint) -> Result<StatusReport, String> {
    let until = Instant::now() + UNRESPONSIVE;
    loop {
        match status_of(ep, Duration::from_millis(500)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= until || !lock_held(home) => return Err(e),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

pub fn orchestrate(home: &Home, timeout_s: u64, seq: u64) -> crate::Result<ExitCode> {
    orchestrate_with(home, timeout_s, None, seq).0
}

/// The ladder's exit code, and what it saw when it failed.
fn orchestrate_with(
    home: &Home,
    timeout_s: u64,
    fail_fast: Option<Duration>,
    seq: u64,
) -> (crate::Result<ExitCode>, Option<String>) {
    let t0 = Instant::now();
    let mut ladder = Ladder::new(home, timeout_s, t0, seq, "restart");
    ladder.fail_fast = fail_fast;
    ladder.inner = fail_fast.is_some();
    let code = run_ladder(home, &ladder, t0);
    (code, ladder.failure.take())
}

fn run_ladder(home: &Home, ladder: &Ladder, t0: Instant) -> crate::Result<ExitCode> {
    let ep = Endpoint::for_home(home.dir());

    match presence(home, "restart") {
        Presence::NotRunning { .. } => {
            errln!("no gateway running in {}; starting one", home.dir().display());
            let code = ladder.start_fresh(None)?;
            // Every outcome is in the ledger, a restart that only had to start one too.
            if !ladder.recorded.get() {
                let ok = ladder.record_result(json!({"ok": code == ExitCode::SUCCESS, "old": null, "started": true,
                                            "elapsed_ms": ladder.t0.elapsed().as_millis() as u64}));
                if code == ExitCode::SUCCESS && !ok {
                    errln!("restart not verified: which incarnation runs could not be told");
                    return Ok(ExitCode::from(1));
                }
            }
            return Ok(code);
        }
        Presence::Unknown(why) => crate::bail!("cannot tell whether a gateway runs: {why}"),
        Presence::Running => {}
    }
    let old = match old_status(home, &ep) {
        Ok(s) => s,
        Err(e) if lock_held(home) => {
            let why = format!("the gateway holds the lock but its control endpoint is silent ({e})");
            return ladder.recover_wedged(&why, None);
        }
        // It went away while we looked: start (or join whoever starts) the next one.
        Err(_) => return ladder.finish(ladder.await_new(None, None), None),
    };
    // Concurrent restarts coalesce (H3): an incarnation that started after this request already
    // satisfies it, and one that is already draining is joined instead of restarted twice.
    let answer =
        machine::Answer { incarnation: old.incarnation.clone(), state: old.state.clone(), uptime_s: old.uptime_s };
    match machine::begin(&answer, t0.elapsed()) {
        Begin::Coalesced => {
            ladder.report(&format!(
                "restarted (by a concurrent request): incarnation {} (pid {}) is ready",
                old.incarnation.clone().unwrap_or_default(),
                old.pid.map_or("?".into(), |p| p.to_string())
            ));
            let named = ladder.record_result(json!({"ok": true, "new": old.incarnation, "coalesced": true}));
            return Ok(if named { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        Begin::Join(state) => ladder.progress.phase(&format!("joining the {state} already in progress")),
        Begin::Request => {
            ladder.owner.prepare_restart();
            ladder.progress.phase("requesting restart");
            // Answered once the gateway knows whether the next incarnation can run.
            let requested = Client::connect(&ep, Duration::from_secs(2)).and_then(|mut c| {
                c.call(Op::Restart { requester: Requester::cli() }, gatewarden_control::proto::VERDICT_PATIENCE)
            });
            match requested {
                Ok(_) => {}
                Err(ClientError::Refused { code, message }) if code == RESTART_REFUSED => {
                    ladder.progress.finish();
                    return Ok(ladder.refused(&old, &message));
                }
                // An explicit refusal (or a protocol mismatch) is final.
                Err(
                    e @ (ClientError::Refused { .. } | ClientError::VersionMismatch { .. } | ClientError::Protocol(_)),
                ) => {
                    ladder.progress.finish();
                    errln!("the gateway refused the restart: {e}");
                    // A stop under way is the usual reason (issue 30, item 2): in the ledger too.
                    ladder.record_result(json!({"ok": false, "old": old.incarnation, "seen": e.to_string(),
                                                "elapsed_ms": ladder.t0.elapsed().as_millis() as u64}));
                    return Ok(ExitCode::from(1));
                }
                // The connection broke or timed out: the gateway is going away, most likely for a
                // concurrent restart. The ladder below decides whether a new incarnation came.
                Err(e) => {
                    ladder.progress.phase(&format!("the gateway is going away ({e}); waiting for the next incarnation"))
                }
            }
        }
    }
    ladder.finish(ladder.await_new(Some(&old), drain_budget(&old)), old.incarnation.as_deref())
}

/// What the ladder says when the desired state ends it: a stop, or a cancelled drain.
fn overtaken(r: &Refusal) -> String {
    match r {
        Refusal::Cancelled(_) => format!("not restarted: {}", r.describe()),
        _ => format!("overtaken by a stop: {}", r.describe()),
    }
}

fn drain_budget(s: &StatusReport) -> Option<Duration> {
    s.extra.get("drain_timeout_s").and_then(Value::as_u64).map(Duration::from_secs)
}

/// A `restart_result` is a success only if it names the new incarnation (issue 30 §6: a
/// success with `new: null` is not one): otherwise `ok` becomes false, with why in `seen`.
fn named_success(fields: &mut Value) -> bool {
    if fields["ok"] != json!(true) {
        return false;
    }
    if fields.get("new").is_some_and(|n| n.as_str().is_some_and(|s| !s.is_empty())) {
        return true;
    }
    fields["ok"] = json!(false);
    fields["seen"] = json!("a gateway may have started, but which incarnation runs could not be told");
    false
}

/// Why each gateway that tried to start since `since` could not (its `start_refused`, or the
/// supervisor that parked it), newest first.
fn start_refusals_since(home: &Home, since: std::time::SystemTime) -> Vec<String> {
    use gatewarden_lifecycle::fsio::ReadOutcome;
    use gatewarden_lifecycle::ledger::{Line, read_tail};
    let ReadOutcome::Ok(lines) = read_tail(&home.ledger(), Some(200)) else { return Vec::new() };
    lines
        .iter()
        .rev()
        .filter_map(|l| {
            let Line::Event(e) = l else { return None };
            let at = e.get("ts").and_then(Value::as_str).and_then(gatewarden_lifecycle::timefmt::parse)?;
            if at < since {
                return None;
            }
            let reason = e.get("reason").and_then(Value::as_str).unwrap_or("no reason recorded");
            match e.get("event").and_then(Value::as_str)? {
                // Code 0 is a start the operator's stop prevented: nothing failed.
                "start_refused" if e.get("code") != Some(&json!(0)) => {
                    let code = e.get("code").map_or_else(|| "?".into(), Value::to_string);
                    Some(format!("the new gateway could not start: {reason} (exit {code})"))
                }
                "supervise_parked" => Some(format!("the supervisor parked the new gateway: {reason}")),
                _ => None,
            }
        })
        .collect()
}

/// A planned restart that no verifying CLI asked for: wait for the next incarnation, start one
/// if none comes, record the result. Exit code as `restart`'s.
pub fn run_backstop(home: &Home, old_inc: &str, timeout_s: u64, seq: u64) -> ExitCode {
    let ladder = Ladder::new(home, timeout_s, Instant::now(), seq, "backstop");
    ladder.owner.prepare_restart();
    // The gateway that launched us drains and exits only after this line (its restart.rs): a
    // unit's counters reset after systemd revived it would lose that revival from NRestarts.
    gatewarden_runtime::restart::say(Ok(()));
    // Then our stdout is its pipe no more: the gateway stops reading, and exits.
    drop(gatewarden_lifecycle::platform::stdout_to_stderr());
    let ep = Endpoint::for_home(home.dir());
    let old = status_of(&ep, Duration::from_millis(500))
        .ok()
        .filter(|s| s.incarnation.as_deref() == Some(old_inc))
        .unwrap_or_else(|| StatusReport { incarnation: Some(old_inc.to_owned()), ..Default::default() });
    let result = ladder.await_new(Some(&old), drain_budget(&old));
    let kicked = ladder.kicked.get();
    let _ = ladder.ledger.append(
        "restart_backstop",
        json!({"ok": result.is_ok(), "old": old_inc, "kicked": kicked,
               "new": result.as_ref().ok().and_then(|s| s.incarnation.clone()),
               "seen": result.as_ref().err(), "elapsed_ms": ladder.t0.elapsed().as_millis() as u64}),
    );
    if result.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// The restart ladder's state: who owns the gateway, the deadline, and what was done.
struct Ladder<'h> {
    home: &'h Home,
    t0: Instant,
    deadline: Instant,
    ledger: Ledger,
    owner: owner::Owner,
    progress: Progress,
    kicked: std::cell::Cell<bool>,
    /// See [`restart_verified`].
    fail_fast: Option<Duration>,
    /// What [`Self::finish`] saw when the restart was not verified.
    failure: std::cell::RefCell<Option<String>>,
    /// Run inside `update` ([`restart_verified`]): the ladder's outcome lines are progress
    /// there, so they go to stderr and `update --json` keeps stdout to its one document.
    inner: bool,
    /// The desired-state sequence this restart carries out, passed to what it starts.
    seq: u64,
    /// `restart` or `backstop`, for the ledger's `start_prevented`.
    by: &'static str,
    /// A stop recorded during the restart was already written to the ledger.
    prevented: std::cell::Cell<bool>,
    /// This restart's `restart_result` is in the ledger.
    recorded: std::cell::Cell<bool>,
    /// When the ladder began, on the wall clock (the ledger's).
    began: std::time::SystemTime,
    /// When the ladder started a gateway itself (its kick).
    kicked_at: std::cell::Cell<Option<std::time::SystemTime>>,
}

impl<'h> Ladder<'h> {
    fn new(home: &'h Home, timeout_s: u64, t0: Instant, seq: u64, by: &'static str) -> Ladder<'h> {
        Ladder {
            home,
            t0,
            deadline: t0 + Duration::from_secs(timeout_s),
            ledger: Ledger::new(home.ledger(), Writer::current()),
            owner: owner::of(home),
            progress: Progress::new(),
            kicked: std::cell::Cell::new(false),
            fail_fast: None,
            failure: std::cell::RefCell::new(None),
            inner: false,
            seq,
            by,
            prevented: std::cell::Cell::new(false),
            recorded: std::cell::Cell::new(false),
            began: std::time::SystemTime::now(),
            kicked_at: std::cell::Cell::new(None),
        }
    }

    /// Appends this restart's `restart_result` (the one place that does); whether it is a
    /// success. A success names the incarnation it ended with, whichever way it got there (a
    /// start with nothing running, a recovery): looked up when the caller could not say, and
    /// when that cannot be told either, it is no success ([`named_success`]).
    fn record_result(&self, mut fields: Value) -> bool {
        self.recorded.set(true);
        fields["requester_pid"] = json!(crate::orchestrator::requester_pid());
        if fields["ok"] == json!(true) && fields.get("new").is_none_or(Value::is_null) {
            let now = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_secs(1)).ok();
            fields["new"] = json!(now.and_then(|s| s.incarnation));
        }
        let ok = named_success(&mut fields);
        let _ = self.ledger.append("restart_result", fields);
        ok
    }

    /// A stop recorded since the restart was requested (or any stop in force), or a cancel of
    /// this restart's drain: the ladder starts nothing more. Written to the ledger once.
    fn stopped(&self) -> Option<Refusal> {
        let r = desired::check(self.home.dir(), Starter::Carry { basis: self.seq }).err()?;
        if !self.prevented.replace(true) {
            crate::intent::prevented(self.home, self.by, &r);
        }
        Some(r)
    }

    /// The gateway refused the restart: the next incarnation could not start, and the running
    /// one keeps serving (crates/runtime/src/restart.rs). Exit 78, the exit table's fatal
    /// configuration: what the next incarnation would have exited with, and nothing to retry
    /// until it is fixed.
    fn refused(&self, old: &StatusReport, why: &str) -> ExitCode {
        let code = gatewarden_lifecycle::ExitIntent::FatalConfig.code();
        self.record_result(json!({"ok": false, "refused": true, "old": old.incarnation, "seen": why,
                                  "elapsed_ms": self.t0.elapsed().as_millis() as u64}));
        self.failure.replace(Some(format!("restart refused: {why}")));
        errln!("restart refused: {why}");
        errln!(
            "the running gateway keeps serving, untouched (incarnation {}, pid {})",
            old.incarnation.as_deref().unwrap_or("?"),
            old.pid.map_or("?".into(), |p| p.to_string())
        );
        // Inside `update` the update says what comes next (it rolls back).
        if !self.inner {
            let home = self.home.dir().display();
            errln!("fix that, then: gatewarden --home {home} check && gatewarden --home {home} restart");
        }
        ExitCode::from(code)
    }

    /// The ladder's outcome line: stdout, or stderr when run inside `update`.
    fn report(&self, line: &str) {
        if self.inner {
            errln!("{line}");
        } else {
            outln!("{line}");
        }
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Starts a new incarnation: through the owner when a service is installed, else directly.
    /// Losing the lock race to a concurrent starter (another restart's successor) is success
    /// once that gateway answers `running`.
    fn start_fresh(&self, lock: Option<InstanceLock>) -> crate::Result<ExitCode> {
        drop(lock);
        if let Some(r) = self.stopped() {
            return self.finish(Err(overtaken(&r)), None);
        }
        // As the incarnation it replaces ran (previous.rs).
        let before = crate::previous::of(self.home);
        // Inside `update` stdout is the update's own (`--json`): the start reports to stderr.
        let report = if self.inner { crate::launch::Report::Stderr } else { crate::launch::Report::Stdout };
        let left = self.left().as_secs().max(1);
        let code = crate::launch::launch(
            self.home,
            before.listen.as_deref(),
            left,
            before.drain_timeout_s,
            Some(self.seq),
            report,
            crate::launch::Via::Owner,
        )?;
        if code == ExitCode::SUCCESS {
            return Ok(code);
        }
        let ep = Endpoint::for_home(self.home.dir());
        let until = Instant::now() + UNRESPONSIVE.min(self.left());
        while Instant::now() < until {
            if let Ok(s) = status_of(&ep, Duration::from_millis(300))
                && s.state.as_deref() == Some("running")
            {
                // Every outcome is in the ledger, this one too (issue 22, item 7).
                if !self.record_result(json!({"ok": true, "new": s.incarnation, "coalesced": true,
                           "elapsed_ms": self.t0.elapsed().as_millis() as u64, "kicked": self.kicked.get()}))
                {
                    errln!("restart not verified: which incarnation runs could not be told");
                    return Ok(ExitCode::from(1));
                }
                self.report(&format!(
                    "restarted (by a concurrent request): incarnation {} (pid {}) is ready",
                    s.incarnation.unwrap_or_default(),
                    s.pid.map_or("?".into(), |p| p.to_string())
                ));
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(POLL);
        }
        Ok(code)
    }

    /// Starts once while waiting (the owner's `kick`, or a direct start); recorded as `kicked`.
    fn kick(&self, why: &str) {
        if self.stopped().is_some() || self.kicked.replace(true) {
            return;
        }
        self.kicked_at.set(Some(std::time::SystemTime::now()));
        self.progress.phase(&format!("{why}: starting a new incarnation"));
        let result = self.owner.start(self.seq).map_err(|e| e.chain());
        if let Err(e) = result {
            errln!("starting a new incarnation failed: {e}");
        }
    }

    /// A wedged gateway: the one stopper (no control: it is silent), then a new incarnation.
    fn recover_wedged(&self, why: &str, old: Option<&StatusReport>) -> crate::Result<ExitCode> {
        if let Some(r) = self.stopped() {
            return self.finish(Err(overtaken(&r)), None);
        }
        errln!("{why}; stopping it (verified escalation) and starting a new incarnation");
        let mut plan = StopPlan::new(Requester::cli(), WEDGED_STOP.min(self.left()));
        plan.skip_control = old.is_none();
        plan.keep_lock = true;
        plan.by = "restart";
        let progress = &self.progress;
        let outcome = stopper::stop(self.home, &plan, &mut |p| match p {
            stopper::Phase::Terminating(t) => progress.phase(&format!("stopping {t}: marker and SIGTERM")),
            stopper::Phase::Killing(t) => progress.phase(&format!("{t} did not stop: killing it")),
            stopper::Phase::Draining => progress.phase("draining"),
            stopper::Phase::Note(n) => errln!("{n}"),
        });
        let _ = self.ledger.append("restart_recovered", json!({"why": why, "stop": outcome.describe()}));
        match outcome {
            StopOutcome::Stopped { lock, .. } => {
                self.progress.finish();
                self.kicked.set(true);
                let code = self.start_fresh(lock)?;
                let ok = code == ExitCode::SUCCESS;
                if self.recorded.get() {
                    return Ok(code);
                }
                let named = self.record_result(
                    json!({"ok": ok, "old": old.and_then(|o| o.incarnation.clone()), "recovered": true, "kicked": true,
                           "elapsed_ms": self.t0.elapsed().as_millis() as u64}),
                );
                if ok && !named {
                    errln!("restart not verified: which incarnation runs could not be told");
                    return Ok(ExitCode::from(1));
                }
                Ok(code)
            }
            other => self.finish(
                Err(format!("the wedged gateway could not be stopped: {}", other.describe())),
                old.and_then(|o| o.incarnation.as_deref()),
            ),
        }
    }

    /// Watches until a new incarnation is `running`: observes, lets the machine decide
    /// (`machine.rs`), acts.
    fn await_new(&self, old: Option<&StatusReport>, drain: Option<Duration>) -> Result<StatusReport, String> {
        let ep = Endpoint::for_home(self.home.dir());
        let old_inc = old.and_then(|o| o.incarnation.clone()).unwrap_or_default();
        let kick_after = self.owner.kind().kick_after(self.owner.restart_delay());
        let began = Instant::now();
        let mut watch = machine::Watch::new(machine::Config {
            old: old_inc.clone(),
            deadline: self.left(),
            kick_after,
            drain,
            fail_fast: self.fail_fast,
            owner_runs_gateway: self.owner.kind().runs_gateway_directly(),
        });
        // launchd relaunches asynchronously (throttles, pended spawns, unloaded labels): its
        // ladder runs beside this loop and may escalate; its failure ends the wait early.
        let mut launchd = Some(self.owner.clone()).filter(|m| m.kind().needs_relaunch_ladder()).map(|m| {
            let old_id = old.and_then(|o| o.pid).map(|p| (p, old_inc.clone()));
            let budget = self.left();
            std::thread::spawn(move || m.relaunch_ladder(old_id, budget).map(|r| r.map_err(|e| e.chain())))
        });
        loop {
            let stop = self.stopped();
            let relaunch_failed = match launchd.as_ref().is_some_and(|h| h.is_finished()) {
                true => launchd.take().and_then(|h| h.join().ok()).flatten().and_then(Result::err),
                false => None,
            };
            let answer = status_of(&ep, Duration::from_millis(300));
            let seen = match &answer {
                Ok(s) => Seen::Answer { incarnation: s.incarnation.clone(), state: s.state.clone() },
                Err(_) => Seen::Silent { lock_held: lock_held(self.home) },
            };
            let at = began.elapsed();
            let unit_gave_up = match &seen {
                Seen::Silent { lock_held: false } if watch.wants_unit_check(at) => Some(self.owner.gave_up()),
                _ => None,
            };
            let (refused, refused_after_kick) = match &seen {
                Seen::Silent { lock_held: false } => {
                    let since_kick = self.kicked_at.get().map(|t| !start_refusals_since(self.home, t).is_empty());
                    (!start_refusals_since(self.home, self.began).is_empty(), since_kick.unwrap_or(false))
                }
                _ => (false, false),
            };
            let obs = machine::Observation {
                at,
                stop_recorded: stop.is_some(),
                relaunch_failed,
                seen,
                unit_gave_up,
                kicked: self.kicked.get(),
                refused,
                refused_after_kick,
            };
            match watch.step(&obs) {
                Action::Wait => {}
                Action::Ready => return answer,
                Action::Kick { why } => self.kick(&why),
                Action::RecoverWedged { why, old_answers } => {
                    return self.recover_wedged_inline(&why, old.filter(|_| old_answers));
                }
                Action::Overtaken => return Err(stop.as_ref().map(overtaken).unwrap_or_default()),
                Action::Fail { seen } => return Err(seen),
            }
            if !watch.phase().is_empty() {
                self.progress.phase(watch.phase());
            }
            std::thread::sleep(POLL);
        }
    }

    /// [`Self::recover_wedged`] from inside the wait: its result as the wait's.
    fn recover_wedged_inline(&self, why: &str, old: Option<&StatusReport>) -> Result<StatusReport, String> {
        match self.recover_wedged(why, old) {
            Ok(code) if code == ExitCode::SUCCESS => {
                let ep = Endpoint::for_home(self.home.dir());
                status_of(&ep, Duration::from_secs(1)).map_err(|e| format!("recovered, but: {e}"))
            }
            _ => Err(format!("{why}; recovery failed")),
        }
    }

    fn finish(&self, result: Result<StatusReport, String>, old: Option<&str>) -> crate::Result<ExitCode> {
        self.progress.finish();
        let elapsed_ms = self.t0.elapsed().as_millis() as u64;
        let kicked = self.kicked.get();
        match result {
            Ok(new) => {
                if !self.record_result(
                    json!({"ok": true, "old": old, "new": new.incarnation, "elapsed_ms": elapsed_ms, "kicked": kicked}),
                ) {
                    errln!("restart not verified: which incarnation runs could not be told");
                    return Ok(ExitCode::from(1));
                }
                self.report(&format!(
                    "restarted: incarnation {} → {} (pid {}) ready in {:.2}s",
                    old.unwrap_or("-"),
                    new.incarnation.unwrap_or_default(),
                    new.pid.map_or("?".into(), |p| p.to_string()),
                    elapsed_ms as f64 / 1000.0
                ));
                Ok(ExitCode::SUCCESS)
            }
            Err(seen) => {
                // A next incarnation that could not start says why in the ledger: that, not
                // only what the lock shows, is the failure (belt and braces behind the preflight:
                // a config edited after it, a port taken in between).
                let refusal = start_refusals_since(self.home, self.began).into_iter().next();
                let seen = match &refusal {
                    Some(why) => format!("{why}; {seen}"),
                    None => seen,
                };
                self.record_result(json!({"ok": false, "seen": seen, "elapsed_ms": elapsed_ms, "kicked": kicked}));
                errln!("restart not verified after {:.1}s: {seen}", elapsed_ms as f64 / 1000.0);
                self.failure.replace(Some(seen));
                let home = self.home.dir().display();
                match (self.prevented.get(), refusal) {
                    (true, _) => {}
                    (false, Some(_)) => errln!(
                        "recover: fix that, then gatewarden --home {home} check && gatewarden --home {home} start"
                    ),
                    (false, None) => errln!("recover with: gatewarden --home {home} start"),
                }
                Ok(ExitCode::from(1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A success always names the new incarnation; one that cannot is recorded as a failure.
    #[test]
    fn a_success_that_names_no_incarnation_is_no_success() {
        let mut f = json!({"ok": true, "new": "abc"});
        assert!(named_success(&mut f));
        for new in [json!(null), json!("")] {
            let mut f = json!({"ok": true, "new": new});
            assert!(!named_success(&mut f));
            assert_eq!(f["ok"], json!(false), "{f}");
            assert!(f["seen"].as_str().is_some_and(|s| s.contains("could not be told")), "{f}");
        }
        let mut f = json!({"ok": true});
        assert!(!named_success(&mut f) && f["ok"] == json!(false));
        let mut f = json!({"ok": false, "seen": "x"});
        assert!(!named_success(&mut f) && f["seen"] == json!("x"));
    }
}
