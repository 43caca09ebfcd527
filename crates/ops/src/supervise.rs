//! `gatewarden supervise`: a minimal, correct supervisor for places without a service manager
//! (the Windows task and service, the macOS LaunchAgent, containers where it is PID 1, WSL,
//! Termux).
//!
//! It runs `gatewarden run --supervisor external` as its child (so a planned restart is an
//! exit 75 for us to act on) and applies `gatewarden_service::supervise`'s policy to each exit:
//! 0 stays down (supervise exits 0), 75 restarts at once, 1 / a signal restarts with backoff,
//! 78 and the crash-loop brake park — `supervise_state.json` says why, `status` and `doctor`
//! show it — and supervise exits 0 so an outer manager (launchd, Task Scheduler) does not
//! loop either. SIGTERM / SIGINT / SIGHUP / console events stop the child through the one
//! stopper (`gatewarden_control::stopper`), then supervise waits for it and exits 0. As PID 1 it reaps every orphan re-parented to it.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use gatewarden_control::Requester;
use gatewarden_control::stopper::{self, StopPlan};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{ExitIntent, Home};
use gatewarden_service::naming::ServiceNames;
use gatewarden_service::spec::stop_timeout_s;
use gatewarden_service::supervise::{
    Action, ChildExit, ParkedState, RestartHistory, SupervisePolicy, clear_parked_state, write_parked_state,
};
use gatewarden_service::windows_scm::{self, ServiceHooks, StopCause};
use serde_json::json;

use crate::options::SuperviseArgs;
use crate::os::{self, Event};

pub fn supervise(home: &Home, args: SuperviseArgs) -> crate::Result<ExitCode> {
    let home = home.ensure()?;
    let (tx, rx) = mpsc::channel::<Event>();
    if args.scm {
        return run_as_scm_service(home, args, tx, rx);
    }
    os::proc::forward_stop_events(tx.clone())?;
    let code = Supervisor::new(home, args, tx).run(&rx);
    Ok(ExitCode::from(code))
}

/// Under the SCM: the service body is the same loop; a stop control is a stop event.
fn run_as_scm_service(
    home: Home,
    args: SuperviseArgs,
    tx: Sender<Event>,
    rx: Receiver<Event>,
) -> crate::Result<ExitCode> {
    let name = ServiceNames::new(home.dir(), crate::owner::is_default_home(&home)).windows_name();
    let stopped = Arc::new(AtomicBool::new(false));
    let stop_tx = tx.clone();
    let is_stopped = Arc::clone(&stopped);
    let done = Arc::clone(&stopped);
    let hooks = ServiceHooks {
        request_stop: Box::new(move |cause| {
            let what = match cause {
                StopCause::Stop => "SERVICE_CONTROL_STOP",
                StopCause::Shutdown => "SERVICE_CONTROL_SHUTDOWN",
                StopCause::Preshutdown => "SERVICE_CONTROL_PRESHUTDOWN",
            };
            let _ = stop_tx.send(Event::Stop { channel: "scm", what });
        }),
        is_stopped: Box::new(move || is_stopped.load(Ordering::SeqCst)),
        run: Box::new(move || {
            let code = Supervisor::new(home, args, tx).run(&rx);
            done.store(true, Ordering::SeqCst);
            i32::from(code)
        }),
        progress: Default::default(),
    };
    windows_scm::run_service(&name, hooks)?;
    Ok(ExitCode::SUCCESS)
}

struct Supervisor {
    home: Home,
    args: SuperviseArgs,
    policy: SupervisePolicy,
    tx: Sender<Event>,
    ledger: Ledger,
    t0: Instant,
    /// Drain budget of the child, for the stop escalation deadline.
    drain_s: u64,
    orphans_reaped: u64,
}

fn log(msg: &str) {
    errln!("gatewarden supervise[{}]: {msg}", std::process::id());
}

impl Supervisor {
    fn new(home: Home, args: SuperviseArgs, tx: Sender<Event>) -> Supervisor {
        let policy = SupervisePolicy {
            initial_backoff: Duration::from_millis(args.backoff_ms),
            max_backoff: Duration::from_millis(args.max_backoff_ms),
            brake_window: Duration::from_secs(args.brake_window_s),
            brake_max_restarts: args.brake_restarts,
            ..SupervisePolicy::default()
        };
        let drain_s = args
            .drain_timeout
            .or_else(|| gatewarden_config::Config::load(home.dir()).ok().map(|c| c.drain_timeout_s))
            .unwrap_or(30);
        let ledger = Ledger::new(home.ledger(), Writer::current());
        Supervisor { home, args, policy, tx, ledger, t0: Instant::now(), drain_s, orphans_reaped: 0 }
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// The desired state (`intent.rs`) before every start of a child: launched by an
    /// operator (no service manager around us) supervise is a start and records `run`; launched
    /// by a manager (at boot, after a crash) or restarting a child, it obeys a recorded stop.
    /// The sequence the children carry out, or `None`: stay down.
    fn desired_seq(&self, first: bool) -> Option<u64> {
        use gatewarden_lifecycle::Supervisor as Sup;
        let managed = self.args.scm || !matches!(Sup::detect(None).supervisor, Sup::None | Sup::Container) || !first;
        let decided = match managed {
            false => crate::intent::record_run(&self.home, "supervise"),
            true => crate::intent::may_start(&self.home, "supervise", gatewarden_lifecycle::desired::Starter::Resume)
                .map(|d| d.seq),
        };
        match decided {
            Ok(seq) => Some(seq),
            Err(r) => {
                log(&format!("not starting the gateway: {}", r.describe()));
                None
            }
        }
    }

    fn child_command(&self, seq: u64) -> crate::Result<Command> {
        let mut cmd = Command::new(crate::owner::current_exe()?);
        cmd.arg("--home").arg(self.home.dir()).arg("run").args(["--supervisor", "external"]);
        cmd.args(["--desired-seq", &seq.to_string()]);
        if let Some(l) = &self.args.listen {
            cmd.args(["--listen", l]);
        }
        if let Some(d) = self.args.drain_timeout {
            cmd.args(["--drain-timeout", &d.to_string()]);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
        Ok(cmd)
    }

    /// The supervision loop; returns supervise's exit code.
    fn run(mut self, rx: &Receiver<Event>) -> u8 {
        // A new supervisor is a new decision: an old park no longer applies.
        let _ = clear_parked_state(self.home.dir());
        if gatewarden_lifecycle::platform::spawn::is_pid1() {
            log("running as PID 1: reaping orphans");
        }
        let mut history = RestartHistory::new(self.now());
        let mut first = true;
        loop {
            let Some(seq) = self.desired_seq(std::mem::take(&mut first)) else { return 0 };
            let mut cmd = match self.child_command(seq) {
                Ok(c) => c,
                Err(e) => {
                    log(&format!("cannot build the gateway command: {e}"));
                    return 1;
                }
            };
            let pid = match os::spawn_watched(&mut cmd, self.tx.clone()) {
                Ok(p) => p,
                Err(e) => {
                    log(&format!("cannot start the gateway: {e}"));
                    return 1;
                }
            };
            history.child_started_at = self.now();
            log(&format!("started gateway pid {pid}"));
            let (exit, stopping) = self.wait_child(rx, pid);
            if let Some(why) = stopping {
                log(&format!("gateway pid {pid} ended ({exit}) after a stop request ({why}); exiting"));
                return 0;
            }
            let now = self.now();
            // A swapped-in release that ended before it was blessed: the old binary goes back
            // and runs next, at once (`update/mod.rs`).
            if exit != ChildExit::Code(i32::from(ExitIntent::PlannedRestart.code()))
                && crate::update::revert_after_crash(&self.home, &exit.to_string(), "supervise")
            {
                log(&format!(
                    "gateway pid {pid} ({exit}) ran an unblessed update: reverted, restarting the previous binary"
                ));
                continue;
            }
            let action = self.policy.decide(exit, &history, now);
            let _ = self.ledger.append(
                "supervise_child_exited",
                json!({"child_pid": pid, "exit": exit, "action": format!("{action:?}")}),
            );
            match action {
                Action::StayDown => {
                    log(&format!("gateway pid {pid} stopped ({exit}): staying down"));
                    return 0;
                }
                Action::RestartNow => log(&format!("gateway pid {pid} asked for a restart ({exit}): restarting")),
                Action::Restart { backoff } => {
                    log(&format!("gateway pid {pid} ended ({exit}): restarting in {} ms", backoff.as_millis()));
                    // Where `status` and `doctor` read a crash loop's next restart (as under systemd).
                    let _ = self.ledger.append(
                        "crash_backoff",
                        json!({"crashes": history.consecutive_crashes.saturating_add(1), "exit": exit.to_string(),
                               "delay_ms": u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX), "by": "supervise"}),
                    );
                    if let Some(why) = self.pause(rx, backoff) {
                        log(&format!("stop requested ({why}) during backoff; exiting"));
                        return 0;
                    }
                }
                Action::Park { kind, reason } => {
                    let restarts =
                        u32::try_from(history.restarts_within(self.policy.brake_window, now)).unwrap_or(u32::MAX);
                    let state = ParkedState::new(
                        kind,
                        reason.clone(),
                        exit,
                        restarts,
                        std::process::id(),
                        self.home.dir().to_string_lossy(),
                    );
                    if let Err(e) = write_parked_state(self.home.dir(), &state) {
                        log(&format!("cannot record the parked state: {e}"));
                    }
                    let _ =
                        self.ledger.append("supervise_parked", json!({"kind": kind, "reason": reason, "exit": exit}));
                    log(&format!("parked: {reason}"));
                    log(&format!("after fixing the cause: gatewarden --home {} start", self.home.dir().display()));
                    return 0;
                }
            }
            history.record_restart(&self.policy, exit, self.now());
        }
    }

    /// Waits for child `pid` to end, turning stop events into the one stopper (control stop,
    /// marker + verified SIGTERM, verified kill after the drain budget plus grace) on its own
    /// thread, so this loop keeps reaping meanwhile. Returns its exit and, if a stop was
    /// requested, what asked.
    fn wait_child(&mut self, rx: &Receiver<Event>, pid: u32) -> (ChildExit, Option<String>) {
        let mut stopping: Option<String> = None;
        loop {
            let Ok(ev) = rx.recv() else { return (ChildExit::Unknown, stopping) };
            match ev {
                Event::ChildExited { pid: p, exit } if p == pid => return (exit, stopping),
                Event::ChildExited { .. } => {}
                Event::OrphanReaped { pid: o } => {
                    self.orphans_reaped += 1;
                    log(&format!("reaped orphan pid {o} ({} so far)", self.orphans_reaped));
                }
                Event::Stop { channel, what } => {
                    if stopping.is_some() {
                        log(&format!("{what}: already stopping gateway pid {pid}"));
                        continue;
                    }
                    log(&format!("{what}: stopping gateway pid {pid} gracefully"));
                    stopping = Some(what.to_owned());
                    let budget = Duration::from_secs(stop_timeout_s(self.drain_s, 0, 0));
                    let home = self.home.clone();
                    std::thread::spawn(move || {
                        let mut plan = StopPlan::new(Requester::current(channel), budget);
                        plan.by = "supervise";
                        let outcome = stopper::stop(&home, &plan, &mut |p| {
                            if let stopper::Phase::Note(n) = p {
                                log(&n);
                            }
                        });
                        if !matches!(outcome, stopper::StopOutcome::Stopped { .. }) {
                            log(&format!("stopping gateway pid {pid}: {}", outcome.describe()));
                        }
                    });
                }
            }
        }
    }

    /// Sleeps `d` unless a stop arrives (returned).
    fn pause(&mut self, rx: &Receiver<Event>, d: Duration) -> Option<String> {
        let until = Instant::now() + d;
        loop {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Event::Stop { what, .. }) => return Some(what.to_owned()),
                Ok(Event::OrphanReaped { .. } | Event::ChildExited { .. }) => {}
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => return Some("event channel closed".into()),
            }
        }
    }
}
