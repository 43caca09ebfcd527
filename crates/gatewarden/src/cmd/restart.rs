//! `gatewarden restart`: request a restart and exit 0 only when a **new incarnation** holds
//! the lock and is ready; otherwise exit 1 naming what was seen and the recovery command.
//!
//! One ladder, observation → action, bounded by `--timeout`:
//! - the gateway answers: ask it to restart (a systemd unit's start-rate counter is reset
//!   first, so planned restarts never trip its crash-loop brake), then watch;
//! - it does not answer within [`UNRESPONSIVE`] (SIGSTOPped, wedged), or stays draining past its
//!   drain budget plus [`DRAIN_GRACE`]: stop it with the one stopper (marker + verified SIGTERM,
//!   verified SIGKILL) and start a new incarnation;
//! - nobody holds the lock for longer than the owner allows (`ManagerKind::kick_after`: its
//!   restart delay plus a margin), or the manager gave up on the unit (start limit, failed):
//!   start it through the owner, or directly (`kicked` in the ledger).
//!
//! `--backstop INCARNATION` is the same ladder without the request: the gateway launches it
//! for every planned restart that no verifying CLI asked for (chat `/restart`, SIGUSR1, a control
//! request), so no route ends with nothing running.
//!
//! The desired state binds the ladder (`gatewarden_lifecycle::desired`, `cmd/intent.rs`): an
//! operator's restart records `run` first (so a restart of a stopped gateway starts it), and
//! the ladder — the CLI's and the backstop's — checks before every start and stops watching
//! as soon as a later stop is recorded: that stop owns the gateway now, and it stays down.
//!
//! The orchestrator first moves itself into its own session (a detached copy of this command
//! does the work while this process relays its exit code), so killing the old gateway's
//! process group — e.g. when `/restart` ran this from inside the gateway — cannot kill it.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use gatewarden_control::stopper::{self, StopOutcome, StopPlan};
use gatewarden_control::{Client, ClientError, Endpoint, Op, Requester, StatusReport};
use gatewarden_lifecycle::desired::{self, Refusal, Starter};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::lock::LockProbe;
use gatewarden_lifecycle::platform::spawn;
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, InstanceLock};
use serde_json::{Value, json};

use super::manager::{self, ServiceManager};
use super::presence::{Presence, presence};
use super::progress::Progress;

/// Set in the detached orchestrator (module doc); `restart` passes the desired-state sequence
/// it recorded in it. Removed from everything the orchestrator starts.
pub(super) const ORCHESTRATOR_ENV: &str = "GATEWARDEN_RESTART_ORCHESTRATOR";
const POLL: Duration = Duration::from_millis(20);
/// A lock holder silent on its control endpoint for this long is wedged, not busy.
const UNRESPONSIVE: Duration = Duration::from_secs(3);
/// Beyond the drain budget: the cancelled runs' clean-up and the HTTP wind-down.
const DRAIN_GRACE: Duration = Duration::from_secs(15);
/// `update`: after the ladder started a new incarnation itself, how long the lock may stay free
/// before the restart counts as failed (a started gateway takes the lock within milliseconds).
const FAIL_FAST: Duration = Duration::from_secs(3);
/// The budget of the stopper for a wedged gateway (it is not draining anything useful).
const WEDGED_STOP: Duration = Duration::from_secs(10);

pub fn restart(
    home: &Home,
    timeout_s: u64,
    backstop: Option<String>,
    desired_seq: Option<u64>,
) -> anyhow::Result<ExitCode> {
    if let Some(old) = backstop {
        escape_unit(home);
        let home = home.canonicalized();
        // Already detached by the gateway that launched it.
        let seq = desired_seq.unwrap_or_else(|| desired::current(home.dir()).seq);
        return Ok(run_backstop(&home, &old, timeout_s, seq));
    }
    // The operator's intent first, before anything that takes time: a `stop` issued right
    // after this command is ordered after it. The detached copy inherits the sequence.
    let seq = match std::env::var(ORCHESTRATOR_ENV).ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(seq) => seq,
        None => match super::intent::record_run(&home.canonicalized(), "restart") {
            Ok(seq) => seq,
            Err(r) => {
                eprintln!("not restarting: {}", r.describe());
                return Ok(ExitCode::from(1));
            }
        },
    };
    escape_unit(home);
    let home = home.canonicalized();
    if std::env::var_os(ORCHESTRATOR_ENV).is_none()
        && spawn::DETACH_KEEPS_OUTPUT
        && let Some(code) = relay_to_detached_orchestrator(&seq.to_string())
    {
        return Ok(code);
    }
    orchestrate(&home, timeout_s, seq)
}

/// Launched from inside the unit (chat `/restart` or `/update`, an exec-backend run, the
/// gateway's own backstop): the manager kills the unit's whole cgroup when the old gateway
/// exits, a new session does not help. Move into a transient scope first (H2); this returns
/// only if that is not needed.
pub(super) fn escape_unit(home: &Home) {
    if let Some(m) = manager::installed(&home.canonicalized())
        && let Some(why) = manager::escape_unit_cgroup(&m)
    {
        eprintln!("warning: {why}; restarting from inside {}", m.describe());
    }
}

/// In the first process of a restarting verb: runs the same command line detached (module
/// doc) and returns its exit code; `None` in the detached copy, which does the work.
pub(super) fn detach() -> Option<ExitCode> {
    if std::env::var_os(ORCHESTRATOR_ENV).is_none() && spawn::DETACH_KEEPS_OUTPUT {
        return relay_to_detached_orchestrator("1");
    }
    None
}

/// `update`'s restart: the whole ladder in this (already detached) process; the status of the
/// new incarnation once it is verified `running`, else what was seen. Unlike `restart`, it
/// gives up early when even a new incarnation the ladder started itself takes no lock within
/// [`FAIL_FAST`]: a release that cannot start fails at once instead of at the deadline.
pub(super) fn restart_verified(home: &Home, timeout_s: u64) -> Result<StatusReport, String> {
    let seq = desired::current(home.dir()).seq;
    let (result, failure) = orchestrate_with(home, timeout_s, Some(FAIL_FAST), seq);
    match result {
        Ok(code) if code == ExitCode::SUCCESS => status_of(&Endpoint::for_home(home.dir()), Duration::from_secs(2))
            .map_err(|e| format!("after the restart: {e}")),
        Ok(_) => Err(format!("the restart was not verified: {}", failure.unwrap_or_else(|| "see above".into()))),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Runs this same command line in a new session and relays its exit code.
fn relay_to_detached_orchestrator(value: &str) -> Option<ExitCode> {
    let exe = manager::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(ORCHESTRATOR_ENV, value);
    // Launched from an agent run (chat-driven restarts), this process carries the run's tag,
    // and the next incarnation kills what the old one's runs left behind; the orchestrator
    // must not be mistaken for such a leftover.
    cmd.env_remove(gatewarden_runtime::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    spawn::detach(&mut cmd, None);
    let status = cmd.spawn().ok()?.wait().ok()?;
    Some(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)))
}

pub(super) fn status_of(ep: &Endpoint, t: Duration) -> Result<StatusReport, String> {
    Client::connect(ep, t).and_then(|mut c| c.status(t)).map_err(|e| e.to_string())
}

pub(super) fn lock_held(home: &Home) -> bool {
    !matches!(InstanceLock::probe(&home.lock()), LockProbe::Free(_) | LockProbe::Missing)
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

fn orchestrate(home: &Home, timeout_s: u64, seq: u64) -> anyhow::Result<ExitCode> {
    orchestrate_with(home, timeout_s, None, seq).0
}

/// The ladder's exit code, and what it saw when it failed.
fn orchestrate_with(
    home: &Home,
    timeout_s: u64,
    fail_fast: Option<Duration>,
    seq: u64,
) -> (anyhow::Result<ExitCode>, Option<String>) {
    let t0 = Instant::now();
    let mut ladder = Ladder::new(home, timeout_s, t0, seq, "restart");
    ladder.fail_fast = fail_fast;
    ladder.inner = fail_fast.is_some();
    let code = run_ladder(home, &ladder, t0);
    (code, ladder.failure.take())
}

fn run_ladder(home: &Home, ladder: &Ladder, t0: Instant) -> anyhow::Result<ExitCode> {
    let ep = Endpoint::for_home(home.dir());

    match presence(home, "restart") {
        Presence::NotRunning { .. } => {
            eprintln!("no gateway running in {}; starting one", home.dir().display());
            let code = ladder.start_fresh(None)?;
            // Every outcome is in the ledger, a restart that only had to start one too.
            if !ladder.recorded.get() {
                ladder.record_result(json!({"ok": code == ExitCode::SUCCESS, "old": null, "started": true,
                                            "elapsed_ms": ladder.t0.elapsed().as_millis() as u64}));
            }
            return Ok(code);
        }
        Presence::Unknown(why) => anyhow::bail!("cannot tell whether a gateway runs: {why}"),
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
    let started_since_request = old.uptime_s.is_some_and(|up| up < t0.elapsed().as_secs_f64());
    if started_since_request && old.state.as_deref() == Some("running") {
        ladder.report(&format!(
            "restarted (by a concurrent request): incarnation {} (pid {}) is ready",
            old.incarnation.clone().unwrap_or_default(),
            old.pid.map_or("?".into(), |p| p.to_string())
        ));
        let _ = ladder.ledger.append("restart_result", json!({"ok": true, "new": old.incarnation, "coalesced": true}));
        return Ok(ExitCode::SUCCESS);
    }
    let joining = matches!(old.state.as_deref(), Some("draining" | "stopping"));
    if joining {
        ladder.progress.phase(&format!("joining the {} already in progress", old.state.as_deref().unwrap_or("stop")));
    } else {
        if let Some(m) = &ladder.owner {
            m.prepare_restart();
        }
        ladder.progress.phase("requesting restart");
        let requested = Client::connect(&ep, Duration::from_secs(2))
            .and_then(|mut c| c.call(Op::Restart { requester: Requester::current("cli") }, Duration::from_secs(5)));
        match requested {
            Ok(_) => {}
            // An explicit refusal (or a protocol mismatch) is final.
            Err(e @ (ClientError::Refused { .. } | ClientError::VersionMismatch { .. } | ClientError::Protocol(_))) => {
                ladder.progress.finish();
                eprintln!("the gateway refused the restart: {e}");
                return Ok(ExitCode::from(1));
            }
            // The connection broke or timed out: the gateway is going away, most likely for a
            // concurrent restart. The ladder below decides whether a new incarnation came.
            Err(e) => {
                ladder.progress.phase(&format!("the gateway is going away ({e}); waiting for the next incarnation"))
            }
        }
    }
    ladder.finish(ladder.await_new(Some(&old), drain_budget(&old)), old.incarnation.as_deref())
}

fn drain_budget(s: &StatusReport) -> Option<Duration> {
    s.extra.get("drain_timeout_s").and_then(Value::as_u64).map(Duration::from_secs)
}

/// A planned restart that no verifying CLI asked for: wait for the next incarnation, start one
/// if none comes, record the result. Exit code as `restart`'s.
fn run_backstop(home: &Home, old_inc: &str, timeout_s: u64, seq: u64) -> ExitCode {
    let ladder = Ladder::new(home, timeout_s, Instant::now(), seq, "backstop");
    if let Some(m) = &ladder.owner {
        m.prepare_restart();
    }
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
    owner: Option<std::sync::Arc<dyn ServiceManager>>,
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
}

impl<'h> Ladder<'h> {
    fn new(home: &'h Home, timeout_s: u64, t0: Instant, seq: u64, by: &'static str) -> Ladder<'h> {
        Ladder {
            home,
            t0,
            deadline: t0 + Duration::from_secs(timeout_s),
            ledger: Ledger::new(home.ledger(), Writer::current()),
            owner: manager::installed(home).map(|m| std::sync::Arc::new(m) as std::sync::Arc<dyn ServiceManager>),
            progress: Progress::new(),
            kicked: std::cell::Cell::new(false),
            fail_fast: None,
            failure: std::cell::RefCell::new(None),
            inner: false,
            seq,
            by,
            prevented: std::cell::Cell::new(false),
            recorded: std::cell::Cell::new(false),
        }
    }

    /// Appends this restart's `restart_result` (the one place that does).
    fn record_result(&self, fields: Value) {
        self.recorded.set(true);
        let _ = self.ledger.append("restart_result", fields);
    }

    /// A stop recorded since the restart was requested (or any stop in force): the ladder
    /// starts nothing more. Written to the ledger once.
    fn stopped(&self) -> Option<Refusal> {
        let r = desired::check(self.home.dir(), Starter::Resume).err()?;
        if !self.prevented.replace(true) {
            super::intent::prevented(self.home, self.by, &r);
        }
        Some(r)
    }

    /// The ladder's outcome line: stdout, or stderr when run inside `update`.
    fn report(&self, line: &str) {
        if self.inner {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Starts a new incarnation: through the owner when a service is installed, else directly.
    /// Losing the lock race to a concurrent starter (another restart's successor) is success
    /// once that gateway answers `running`.
    fn start_fresh(&self, lock: Option<InstanceLock>) -> anyhow::Result<ExitCode> {
        drop(lock);
        if let Some(r) = self.stopped() {
            return self.finish(Err(format!("overtaken by a stop: {}", r.describe())), None);
        }
        let listen = read_state(&self.home.state_file()).ok().and_then(|s| s.listen);
        // Inside `update` stdout is the update's own (`--json`): the start reports to stderr.
        let report = if self.inner { super::start::Report::Stderr } else { super::start::Report::Stdout };
        let left = self.left().as_secs().max(1);
        let code = super::start::start_reporting(self.home, listen.as_deref(), left, None, Some(self.seq), report)?;
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
                self.record_result(json!({"ok": true, "new": s.incarnation, "coalesced": true,
                           "elapsed_ms": self.t0.elapsed().as_millis() as u64, "kicked": self.kicked.get()}));
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
        self.progress.phase(&format!("{why}: starting a new incarnation"));
        let result = match &self.owner {
            Some(m) => m.start().map_err(|e| format!("{e:#}")),
            None => {
                let listen = read_state(&self.home.state_file()).ok().and_then(|s| s.listen);
                start_detached(self.home, listen.as_deref(), self.seq)
            }
        };
        if let Err(e) = result {
            eprintln!("starting a new incarnation failed: {e}");
        }
    }

    /// A wedged gateway: the one stopper (no control: it is silent), then a new incarnation.
    fn recover_wedged(&self, why: &str, old: Option<&StatusReport>) -> anyhow::Result<ExitCode> {
        if let Some(r) = self.stopped() {
            return self.finish(Err(format!("overtaken by a stop: {}", r.describe())), None);
        }
        eprintln!("{why}; stopping it (verified escalation) and starting a new incarnation");
        let mut plan = StopPlan::new(Requester::current("cli"), WEDGED_STOP.min(self.left()));
        plan.skip_control = old.is_none();
        plan.keep_lock = true;
        plan.by = "restart";
        let progress = &self.progress;
        let outcome = stopper::stop(self.home, &plan, &mut |p| match p {
            stopper::Phase::Terminating(t) => progress.phase(&format!("stopping {t}: marker and SIGTERM")),
            stopper::Phase::Killing(t) => progress.phase(&format!("{t} did not stop: killing it")),
            stopper::Phase::Draining => progress.phase("draining"),
            stopper::Phase::Note(n) => eprintln!("{n}"),
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
                self.record_result(
                    json!({"ok": ok, "old": old.and_then(|o| o.incarnation.clone()), "recovered": true, "kicked": true,
                           "elapsed_ms": self.t0.elapsed().as_millis() as u64}),
                );
                Ok(code)
            }
            other => self.finish(
                Err(format!("the wedged gateway could not be stopped: {}", other.describe())),
                old.and_then(|o| o.incarnation.as_deref()),
            ),
        }
    }

    /// Watches until a new incarnation is `running`, acting on what it sees (module doc).
    fn await_new(&self, old: Option<&StatusReport>, drain: Option<Duration>) -> Result<StatusReport, String> {
        let ep = Endpoint::for_home(self.home.dir());
        let old_inc = old.and_then(|o| o.incarnation.clone()).unwrap_or_default();
        let kick_after = match &self.owner {
            Some(m) => m.kind().kick_after(m.restart_delay()),
            None => gatewarden_service::ManagerKind::None.kick_after(None),
        };
        let drain_limit = drain.map(|d| d + DRAIN_GRACE);
        let mut draining_since: Option<Instant> = None;
        let mut silent_since: Option<Instant> = None;
        let mut gone_since: Option<Instant> = None;
        let mut last_unit_check = Instant::now();
        let mut seen = String::from("nothing yet");
        // launchd relaunches asynchronously (throttles, pended spawns, unloaded labels): its
        // ladder runs beside this loop and may escalate; its failure ends the wait early.
        let mut launchd = self.owner.clone().filter(|m| m.kind().needs_relaunch_ladder()).map(|m| {
            let old_id = old.and_then(|o| o.pid).map(|p| (p, old_inc.clone()));
            let budget = self.left();
            std::thread::spawn(move || m.relaunch_ladder(old_id, budget).map(|r| r.map_err(|e| format!("{e:#}"))))
        });
        loop {
            if Instant::now() >= self.deadline {
                return Err(seen);
            }
            // A later stop owns the gateway now: nothing more to watch or start.
            if let Some(r) = self.stopped() {
                return Err(format!("overtaken by a stop: {}", r.describe()));
            }
            if launchd.as_ref().is_some_and(|h| h.is_finished())
                && let Some(Some(Err(why))) = launchd.take().and_then(|h| h.join().ok())
            {
                return Err(why);
            }
            match status_of(&ep, Duration::from_millis(300)) {
                Ok(s)
                    if s.incarnation.as_deref() != Some(old_inc.as_str()) && s.state.as_deref() == Some("running") =>
                {
                    return Ok(s);
                }
                Ok(s) if s.incarnation.as_deref() == Some(old_inc.as_str()) => {
                    silent_since = None;
                    let state = s.state.clone().unwrap_or_default();
                    self.progress.phase(&format!("old gateway {old_inc} is {state}"));
                    seen = format!("the old incarnation {old_inc} still {state}");
                    if matches!(state.as_str(), "draining" | "stopping") {
                        let since = *draining_since.get_or_insert_with(Instant::now);
                        if drain_limit.is_some_and(|l| since.elapsed() > l) {
                            let why = format!("the old gateway {old_inc} is still {state} past its drain budget");
                            return self.recover_wedged_inline(&why, old);
                        }
                    }
                }
                Ok(s) => {
                    silent_since = None;
                    self.progress.phase("new incarnation starting");
                    seen = format!(
                        "new incarnation {} in state {}",
                        s.incarnation.unwrap_or_default(),
                        s.state.unwrap_or_default()
                    );
                }
                Err(_) if lock_held(self.home) => {
                    gone_since = None;
                    self.progress.phase("waiting for the new gateway");
                    seen = "a process holds the lock but does not answer yet".into();
                    let since = *silent_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > UNRESPONSIVE {
                        let why = "the lock holder does not answer on its control endpoint".to_owned();
                        return self.recover_wedged_inline(&why, None);
                    }
                }
                Err(_) => {
                    silent_since = None;
                    self.progress.phase("waiting for a gateway to take the lock");
                    seen = "no gateway holds the lock".into();
                    let since = *gone_since.get_or_insert_with(Instant::now);
                    let gave_up = self.owner.as_ref().is_some_and(|m| {
                        m.kind().runs_gateway_directly() && last_unit_check.elapsed() >= Duration::from_millis(100) && {
                            last_unit_check = Instant::now();
                            m.gave_up()
                        }
                    });
                    if let Some(extra) = self.fail_fast
                        && self.kicked.get()
                        && since.elapsed() >= kick_after + extra
                    {
                        return Err(format!(
                            "no gateway took the lock, not even one started {:.1}s ago",
                            (since.elapsed() - kick_after).as_secs_f64()
                        ));
                    }
                    if gave_up {
                        self.kick("the service manager gave up on the unit");
                    } else if since.elapsed() >= kick_after {
                        self.kick(&format!("no gateway took the lock within {:.1}s", kick_after.as_secs_f64()));
                    }
                }
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

    fn finish(&self, result: Result<StatusReport, String>, old: Option<&str>) -> anyhow::Result<ExitCode> {
        self.progress.finish();
        let elapsed_ms = self.t0.elapsed().as_millis() as u64;
        let kicked = self.kicked.get();
        match result {
            Ok(new) => {
                self.record_result(
                    json!({"ok": true, "old": old, "new": new.incarnation, "elapsed_ms": elapsed_ms, "kicked": kicked}),
                );
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
                self.record_result(json!({"ok": false, "seen": seen, "elapsed_ms": elapsed_ms, "kicked": kicked}));
                eprintln!("restart not verified after {:.1}s: {seen}", elapsed_ms as f64 / 1000.0);
                self.failure.replace(Some(seen));
                if !self.prevented.get() {
                    eprintln!("recover with: gatewarden --home {} start", self.home.dir().display());
                }
                Ok(ExitCode::from(1))
            }
        }
    }
}

/// `gatewarden start` as a detached child (its own session), so the ladder keeps watching.
fn start_detached(home: &Home, listen: Option<&str>, seq: u64) -> Result<(), String> {
    let exe = manager::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(home.dir()).arg("start").args(["--desired-seq", &seq.to_string()]);
    cmd.env_remove(ORCHESTRATOR_ENV);
    if let Some(l) = listen {
        cmd.args(["--listen", l]);
    }
    cmd.env_remove(gatewarden_runtime::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    spawn::detach(&mut cmd, None);
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    super::start::note_spawned(home, child.id());
    Ok(())
}
