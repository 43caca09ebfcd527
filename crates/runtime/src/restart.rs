//! Restart routes. Every route starts with the same drain; they differ in who starts the next
//! incarnation, decided by [`Supervisor::route`] (the one table, in the lifecycle crate):
//!
//! - **exit for the manager** (systemd, launchd, `gatewarden supervise`, all *proven*): exit 75
//!   and let the manager relaunch — the manager owns the process, so a second starter would
//!   race it;
//! - **re-exec in place** (PID 1 of a container): nothing would revive PID 1, so after the drain
//!   the same pid executes a fresh image that adopts the listener;
//! - **spawn a successor** (everything else): a new process in its own session, which inherits
//!   the HTTP listening socket (Unix), waits for our lock, and serves the same socket.
//!
//! Whatever the route, **nothing stops before the next incarnation is proven to run**
//! (`startable.rs`, the one answer to "could a gateway start in this home now"): on the
//! spawn route the successor itself prepares (config, secrets, journal, agent, adapters, the
//! inherited listener) before it waits for our lock, and says `prepared` or why not on its
//! stdout ([`Answer`]); on the other two routes a preflight child of the same binary
//! (`run --preflight`, our own arguments, our environment) answers the same question. Only
//! after `prepared` does the drain begin. A refusal keeps this incarnation serving, untouched:
//! the ledger's `restart_refused` has the reason and the requester, and the requester is told.
//!
//! A requester that is not a `gatewarden restart` CLI (which verifies by itself) gets a
//! **backstop**: a detached `gatewarden restart --backstop` that waits for a new incarnation
//! and starts one through the owner (or directly) if none appears in time, so no route ends
//! with nothing running.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use gatewarden_lifecycle::ExitIntent;
use gatewarden_lifecycle::supervisor::RestartRoute;
use serde_json::json;

use crate::app::App;
use crate::cause::RestartAnswer;
use crate::cause::{Asker, Outcome, Reexec};
use crate::gateway::Gateway;
use crate::options::{RUN_TAG, ResolvedOptions};
use gatewarden_lifecycle::platform::spawn;

/// The channel of the one requester that verifies the restart by itself.
pub const VERIFYING_CHANNEL: &str = "cli";
/// Beyond the drain budget, how long the backstop waits in all.
const BACKSTOP_GRACE: Duration = Duration::from_secs(60);
/// The restart's bounds and answers, shared with its requesters (crates/control).
pub use gatewarden_control::proto::{JOINED, PREPARE_PATIENCE, VERDICT_PATIENCE};
/// A successor's or preflight child's answer on its stdout: `prepared <pid>`.
pub const PREPARED: &str = "prepared";
/// ... or `refused <NotStartable as JSON>`.
pub const REFUSED: &str = "refused";

/// A restart someone asked for: why (for the exit reason), the requester's channel (the CLI
/// verifies by itself: no backstop), and who waits for the verdict.
pub struct Ask {
    pub why: String,
    pub channel: String,
    pub requester: serde_json::Value,
    pub asker: Asker,
}

/// Starts a restart; `None` means the gateway keeps running (refused, or the restart could not
/// start), and the asker has been told why.
///
/// The next incarnation and the backstop carry out the desired state in force now
/// (`gatewarden_lifecycle::desired`): its sequence goes with them, and a stop recorded later
/// makes them stay down. A stop already recorded refuses the restart here: its own request
/// (or signal) is on its way, and nothing is started meanwhile.
pub async fn begin(app: &Arc<App>, opts: &ResolvedOptions, ask: Ask) -> Option<Outcome> {
    use gatewarden_lifecycle::desired::{self, Starter};
    let gw = &app.gw;
    let why = ask.why.clone();
    let seq = match desired::check(gw.home.dir(), Starter::Resume) {
        Ok(d) => d.seq,
        Err(r) => {
            crate::info!("restart {why} refused: {}", r.describe());
            let mut v = r.json();
            v["by"] = json!("restart");
            gw.record("start_prevented", v);
            app.tell(ask.asker, Err(format!("not restarting: {}", r.describe())));
            return None;
        }
    };
    let opts = &Carrying { opts, seq };
    let refuse = |reason: String, ask: Ask| {
        crate::error!("restart {why} refused: {reason}; still running");
        gw.record("restart_refused", json!({"requester": ask.requester, "reason": reason}));
        crate::notices::forget_restart_requester(gw.home.dir(), &gw.me.id);
        app.tell(ask.asker, Err(reason));
        None
    };
    let outcome = match gw.supervisor.route() {
        RestartRoute::ExitForManager => {
            if let Err(e) = preflight(opts, manager_args(gw)).await {
                return refuse(e, ask);
            }
            Outcome::new(
                ExitIntent::PlannedRestart,
                format!("planned restart {why}; {} starts the next incarnation", gw.supervisor.as_str()),
            )
        }
        RestartRoute::ReexecInPlace => {
            if let Err(e) = preflight(opts, successor_args(gw, opts)).await {
                return refuse(e, ask);
            }
            match reexec_plan(gw, opts) {
                Ok(plan) => {
                    gw.set_handing_over();
                    let mut o = Outcome::new(
                        ExitIntent::PlannedRestart,
                        format!("planned restart {why}; PID {} re-executes in place", gw.me.pid),
                    );
                    o.reexec = Some(plan);
                    app.tell(ask.asker, Ok(RestartAnswer::Accepted));
                    // Same pid, and nothing can interrupt an exec halfway: no backstop needed.
                    return Some(o);
                }
                Err(e) => {
                    crate::error!("restart {why} failed: cannot prepare to re-execute ({e}); still running");
                    gw.record("restart_failed", json!({"reason": e.to_string()}));
                    app.tell(ask.asker, Err(format!("cannot prepare to re-execute: {e}")));
                    return None;
                }
            }
        }
        RestartRoute::SpawnSuccessor => match prepared_successor(gw, opts).await {
            Ok((successor, handing_over)) => {
                let pid = successor.child.id();
                // Only a successor that is prepared holds the listener for us.
                if handing_over {
                    gw.set_handing_over();
                }
                gw.watch_successor(successor);
                crate::info!("successor pid {pid} is prepared; it takes over after the drain");
                Outcome::new(
                    ExitIntent::PlannedRestart,
                    format!("planned restart {why}; successor pid {pid} takes over"),
                )
            }
            Err(Unproven::Refused(e)) => return refuse(format!("the new gateway cannot start: {e}"), ask),
            Err(Unproven::Spawn(e)) => {
                crate::error!("restart {why} failed: cannot start a successor ({e}); still running");
                gw.record("restart_failed", json!({"reason": e.to_string()}));
                app.tell(ask.asker, Err(format!("cannot start a successor: {e}")));
                return None;
            }
        },
    };
    if ask.channel != VERIFYING_CHANNEL {
        spawn_backstop(gw, opts).await;
    }
    app.tell(ask.asker, Ok(RestartAnswer::Accepted));
    Some(outcome)
}

/// A successor that said `prepared`: the process (our child, so its pid cannot be reused
/// before we reap it) and its stdout, which ends when it exits.
pub struct Successor {
    pub child: Child,
    pub lines: mpsc::Receiver<Line>,
}

/// What a child said on its stdout.
#[derive(Debug)]
pub enum Line {
    Prepared,
    /// Why not, in its words (a config error names file, line and key).
    Refused(String),
    /// Its stdout closed: it exited (or closed it).
    Closed,
}

/// Parses one stdout line of the protocol; `None` for anything else.
pub fn parse_line(line: &str) -> Option<Line> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        PREPARED => Some(Line::Prepared),
        REFUSED => Some(Line::Refused(serde_json::from_str(rest).unwrap_or_else(|_| rest.trim().to_owned()))),
        _ => None,
    }
}

/// Says on stdout what [`parse_line`] reads: `prepared <pid>`, or `refused <reason as a JSON
/// string>` (one line, whatever the reason holds).
pub fn say(result: Result<(), &str>) {
    use std::io::Write;
    let line = match result {
        Ok(()) => format!("{PREPARED} {}", std::process::id()),
        Err(why) => format!("{REFUSED} {}", json!(why)),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Why a child gave no `prepared`.
struct NoAnswer {
    reason: String,
    /// It was ended by a signal before it answered: someone else's doing, not its answer.
    killed: bool,
}

/// Why no successor took the restart on.
enum Unproven {
    Spawn(std::io::Error),
    Refused(String),
}

/// How many times a child that was killed before it answered is started again.
const KILLED_RETRIES: usize = 1;

/// Spawns the successor and waits for its `prepared`; one killed before it answered (another
/// process's doing, e.g. an update ending what it thinks are its candidates) is started once
/// more. The successor, and whether it inherited our listener.
async fn prepared_successor(gw: &Gateway, opts: &Carrying<'_>) -> Result<(Successor, bool), Unproven> {
    let mut tries = 0;
    loop {
        let (child, handing_over) = spawn_successor(gw, opts).map_err(Unproven::Spawn)?;
        gw.record("successor_started", json!({"successor_pid": child.id()}));
        match answer_of(child, PREPARE_PATIENCE).await {
            Ok(s) => return Ok((s, handing_over)),
            Err(e) if e.killed && tries < KILLED_RETRIES => {
                crate::warn!("the successor was killed before it answered ({}); starting another", e.reason);
                tries += 1;
            }
            Err(e) => return Err(Unproven::Refused(e.reason)),
        }
    }
}

/// Waits (off the async workers) for `child`'s answer: `prepared`, or why not. A child that
/// refuses, exits without answering or overruns `patience` is ended and reaped (it is ours and
/// unreaped, so its pid names it).
async fn answer_of(mut child: Child, patience: Duration) -> Result<Successor, NoAnswer> {
    let no = |reason: String| NoAnswer { reason, killed: false };
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(no("no stdout pipe to the new gateway".into()));
    };
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(l) = parse_line(&line)
                && tx.send(l).is_err()
            {
                return;
            }
        }
        let _ = tx.send(Line::Closed);
    });
    let waited = tokio::task::spawn_blocking(move || {
        let first = lines.recv_timeout(patience);
        (child, lines, first)
    })
    .await;
    let Ok((mut child, lines, first)) = waited else { return Err(no("lost the wait for the new gateway".into())) };
    let reason = match first {
        Ok(Line::Prepared) => return Ok(Successor { child, lines }),
        Ok(Line::Refused(why)) => why,
        Ok(Line::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            let status = tokio::task::spawn_blocking(move || child.wait()).await;
            return Err(match status {
                Ok(Ok(s)) => NoAnswer {
                    reason: format!("it exited ({s}) before it could say whether it can run; see the log"),
                    killed: spawn::exit_signal(s).is_some(),
                },
                _ => no("it exited before it could say whether it can run; see the log".into()),
            });
        }
        Err(mpsc::RecvTimeoutError::Timeout) => format!("it did not finish preparing within {patience:?}"),
    };
    let _ = child.kill();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    Err(no(reason))
}

/// The same question asked of a child of this binary, in our environment, with the arguments
/// the next incarnation runs with (the manager's, or the re-executed image's): `run --preflight`
/// answers from `startable` in its dry run, and exits.
async fn preflight(opts: &Carrying<'_>, args: Vec<std::ffi::OsString>) -> Result<(), String> {
    let exe = opts.exe().map_err(|e| format!("cannot find the gatewarden executable: {e}"))?;
    let mut tries = 0;
    loop {
        let mut cmd = Command::new(&exe);
        cmd.args(&args).arg("--preflight");
        // Not one of our runs: the sweep of the next incarnation must not count it.
        cmd.env_remove(RUN_TAG);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("cannot run the preflight {}: {e}", exe.display()))?;
        let pid = child.id();
        match answer_of(child, PREPARE_PATIENCE).await {
            Ok(mut done) => {
                // It exits right after answering; reaped off the main loop.
                tokio::task::spawn_blocking(move || done.child.wait());
                crate::info!("preflight pid {pid}: the next incarnation can start");
                return Ok(());
            }
            Err(e) if e.killed && tries < KILLED_RETRIES => tries += 1,
            Err(e) => return Err(format!("the new gateway cannot start: {}", e.reason)),
        }
    }
}

/// What the service manager runs again: our own arguments.
fn manager_args(gw: &Gateway) -> Vec<std::ffi::OsString> {
    gw.me.argv.iter().skip(1).map(Into::into).collect()
}

/// The options and the desired-state sequence a restart carries out.
struct Carrying<'a> {
    opts: &'a ResolvedOptions,
    seq: u64,
}

impl std::ops::Deref for Carrying<'_> {
    type Target = ResolvedOptions;
    fn deref(&self) -> &ResolvedOptions {
        self.opts
    }
}

/// The arguments a successor (or the re-executed image) runs with.
fn successor_args(gw: &Gateway, opts: &Carrying<'_>) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = vec!["--home".into(), gw.home.dir().into(), "run".into()];
    a.extend(["--listen".into(), gw.listen().unwrap_or(&opts.listen).into()]);
    a.extend(["--drain-timeout".into(), opts.drain_timeout.as_secs().to_string().into()]);
    a.extend(["--takeover-timeout".into(), opts.takeover_timeout.as_secs().to_string().into()]);
    a.push("--successor".into());
    a.extend(["--desired-seq".into(), opts.seq.to_string().into()]);
    if opts.log_json {
        a.extend(["--log-format".into(), "json".into()]);
    }
    if let Some(f) = &opts.log_file {
        a.extend(["--log-file".into(), f.into()]);
    }
    a
}

fn reexec_plan(gw: &Gateway, opts: &Carrying<'_>) -> std::io::Result<Reexec> {
    let exe = opts.exe()?;
    let listener = gw.kept_listener().map(std::net::TcpListener::try_clone).transpose()?;
    let mut args = successor_args(gw, opts);
    if let Some(fd) = listener.as_ref().and_then(spawn::listener_handle) {
        args.extend(["--inherit-listener".into(), fd.into()]);
    }
    Ok(Reexec { exe, args, listener })
}

/// The successor, and whether it inherited our listener.
fn spawn_successor(gw: &Gateway, opts: &Carrying<'_>) -> std::io::Result<(Child, bool)> {
    let exe = opts.exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(successor_args(gw, opts));
    // The successor is as unsupervised as we are; say so rather than let it re-detect.
    cmd.args(["--supervisor", "none"]);
    match &opts.log_file {
        Some(_) => {
            cmd.stderr(Stdio::null());
        }
        None => {
            cmd.stderr(Stdio::inherit());
        }
    }
    // Its stdout is how it says `prepared` (or why not).
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let handing_over =
        spawn::detach(&mut cmd, gw.kept_listener()).map(|fd| cmd.arg("--inherit-listener").arg(fd)).is_some();
    Ok((cmd.spawn()?, handing_over))
}

/// `gatewarden restart --backstop <incarnation>` in its own session: it outlives us, waits
/// for the next incarnation, and starts one if none comes (see `cmd/restart.rs`). Waits (within
/// [`PREPARE_PATIENCE`]) for its `prepared`: it resets a systemd unit's counters first
/// (`reset-failed`), and that must land before our exit 75 is counted, or the revival would be
/// wiped from `NRestarts` (a race a loaded machine lost). No answer: the restart goes on.
async fn spawn_backstop(gw: &Gateway, opts: &Carrying<'_>) {
    let Ok(exe) = opts.exe() else { return };
    let mut cmd = Command::new(exe);
    let budget = opts.drain_timeout + BACKSTOP_GRACE;
    cmd.arg("--home").arg(gw.home.dir()).arg("restart");
    cmd.args(["--backstop", &gw.me.id, "--timeout", &budget.as_secs().to_string()]);
    cmd.args(["--desired-seq", &opts.seq.to_string()]);
    // Not one of our runs: the next incarnation's sweep must not kill it.
    cmd.env_remove(RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    spawn::detach(&mut cmd, None);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            crate::warn!("cannot start the restart backstop: {e}");
            return;
        }
    };
    gw.record("restart_backstop", json!({"backstop_pid": child.id()}));
    let Some(stdout) = child.stdout.take() else { return };
    // Read off the async workers; the backstop is never ended here, whatever it says.
    let (tx, said) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let said = BufReader::new(stdout).lines().map_while(Result::ok).find_map(|l| parse_line(&l));
        let _ = tx.send(said);
    });
    if !matches!(tokio::time::timeout(PREPARE_PATIENCE, said).await, Ok(Ok(Some(Line::Prepared)))) {
        crate::warn!("the restart backstop did not say it was prepared; restarting all the same");
    }
}
