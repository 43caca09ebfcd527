//! `gatewarden restart`: request a restart and exit 0 only when a **new incarnation** holds
//! the lock and is ready; otherwise exit 1 naming what was seen and the recovery command.
//!
//! The orchestrator first moves itself into its own session (a detached copy of this command
//! does the work while this process relays its exit code), so killing the old gateway's
//! process group — e.g. when `/restart` ran this from inside the gateway — cannot kill it.
//! Its result is recorded in the ledger either way.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use gatewarden_control::{Client, ClientError, Endpoint, Op, Requester, StatusReport};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, InstanceLock};
use gatewarden_runtime::spawn;
use serde_json::json;

use super::manager::{self, Managed};
use super::presence::{Presence, presence};
use super::progress::Progress;

const ORCHESTRATOR_ENV: &str = "GATEWARDEN_RESTART_ORCHESTRATOR";
const POLL: Duration = Duration::from_millis(20);
/// How long a lock holder may stay silent (between incarnations) before restart gives up.
const SETTLE: Duration = Duration::from_secs(5);

pub fn restart(home: &Home, timeout_s: u64) -> anyhow::Result<ExitCode> {
    // Launched from inside the unit (chat `/restart`, an exec-backend run, an updater): the
    // manager kills the unit's whole cgroup when the old gateway exits, a new session does not
    // help. Move into a transient scope first (H2); this returns only if that is not needed.
    if let Some(m) = manager::installed(&home.canonicalized())
        && let Some(why) = manager::escape_unit_cgroup(&m)
    {
        eprintln!("warning: {why}; restarting from inside {}", m.describe());
    }
    if std::env::var_os(ORCHESTRATOR_ENV).is_none()
        && spawn::DETACH_KEEPS_OUTPUT
        && let Some(code) = relay_to_detached_orchestrator()
    {
        return Ok(code);
    }
    orchestrate(&home.canonicalized(), timeout_s)
}

/// Runs this same command line in a new session and relays its exit code.
fn relay_to_detached_orchestrator() -> Option<ExitCode> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(ORCHESTRATOR_ENV, "1");
    // Launched from an agent run (chat-driven restarts), this process carries the run's tag,
    // and the next incarnation kills what the old one's runs left behind; the orchestrator
    // must not be mistaken for such a leftover.
    cmd.env_remove(gatewarden_runtime::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    spawn::detach(&mut cmd, None);
    let status = cmd.spawn().ok()?.wait().ok()?;
    Some(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)))
}

fn status_of(ep: &Endpoint) -> Result<StatusReport, String> {
    let t = Duration::from_millis(500);
    Client::connect(ep, t).and_then(|mut c| c.status(t)).map_err(|e| e.to_string())
}

fn orchestrate(home: &Home, timeout_s: u64) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(timeout_s);
    let ledger = Ledger::new(home.ledger(), Writer::current());
    let recovery = format!("gatewarden --home {} start", home.dir().display());
    let ep = Endpoint::for_home(home.dir());

    match presence(home, "restart") {
        Presence::NotRunning { .. } => {
            let listen = read_state(&home.state_file()).ok().and_then(|s| s.listen);
            eprintln!("no gateway running in {}; starting one", home.dir().display());
            return super::start::start(home, listen.as_deref(), timeout_s, None);
        }
        Presence::Unknown(why) => anyhow::bail!("cannot tell whether a gateway runs: {why}"),
        Presence::Running => {}
    }
    // A gateway between incarnations (draining, or a successor taking over) may not answer for
    // a moment: give it a bounded chance before giving up.
    let settle = Instant::now() + SETTLE;
    let old = loop {
        match status_of(&ep) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= settle => {
                eprintln!(
                    "a gateway holds the lock but does not answer on its control endpoint ({e}); not restarting blindly"
                );
                eprintln!("recover with: gatewarden --home {} stop && {recovery}", home.dir().display());
                return Ok(ExitCode::from(1));
            }
            Err(_) => std::thread::sleep(POLL),
        }
    };
    // Concurrent restarts coalesce (H3): an incarnation that started after this request already
    // satisfies it, and one that is already draining is joined instead of restarted twice.
    let started_since_request = old.uptime_s.is_some_and(|up| up < t0.elapsed().as_secs_f64());
    if started_since_request && old.state.as_deref() == Some("running") {
        println!(
            "restarted (by a concurrent request): incarnation {} (pid {}) is ready",
            old.incarnation.clone().unwrap_or_default(),
            old.pid.map_or("?".into(), |p| p.to_string())
        );
        let _ = ledger.append("restart_result", json!({"ok": true, "new": old.incarnation, "coalesced": true}));
        return Ok(ExitCode::SUCCESS);
    }
    let joining = matches!(old.state.as_deref(), Some("draining" | "stopping"));
    let old_inc = old.incarnation.clone().unwrap_or_default();
    // Under systemd the gateway exits 75 and systemd revives it after `RestartSec`; if that
    // does not happen promptly (a long RestartSec, a start limit), start the unit ourselves so
    // no backoff delays the restart (G2).
    let managed = manager::owner(home, old.pid);
    let owner = managed.clone().filter(Managed::runs_gateway_directly);
    let kick_after = owner.as_ref().map(|m| match m.restart_delay_ms() {
        Some(ms) if ms <= 1000 => Duration::from_millis(ms + 1000),
        _ => Duration::ZERO,
    });
    let mut gone_since: Option<Instant> = None;
    let mut kick: Option<std::thread::JoinHandle<Result<(), String>>> = None;
    let progress = Progress::new();
    if joining {
        progress.phase(&format!("joining the {} already in progress", old.state.as_deref().unwrap_or("stop")));
    } else {
        progress.phase("requesting restart");
        let requested = Client::connect(&ep, Duration::from_secs(2))
            .and_then(|mut c| c.call(Op::Restart { requester: Requester::current("cli") }, Duration::from_secs(5)));
        match requested {
            Ok(_) => {}
            // An explicit refusal (or a protocol mismatch) is final.
            Err(e @ (ClientError::Refused { .. } | ClientError::VersionMismatch { .. } | ClientError::Protocol(_))) => {
                progress.finish();
                eprintln!("the gateway refused the restart: {e}");
                return Ok(ExitCode::from(1));
            }
            // The connection broke or timed out: the gateway is going away, most likely for a
            // concurrent restart. Verification below decides whether a new incarnation came.
            Err(e) => progress.phase(&format!("the gateway is going away ({e}); waiting for the next incarnation")),
        }
    }

    // launchd relaunches asynchronously (throttles, pended spawns, unloaded labels): its ladder
    // runs beside the status loop and may escalate; its failure ends the wait early.
    let mut ladder = managed.filter(|m| !m.runs_gateway_directly()).map(|m| {
        let old_id = old.pid.map(|p| (p, old_inc.clone()));
        let budget = deadline.saturating_duration_since(Instant::now());
        std::thread::spawn(move || m.verify_restart(old_id, budget).map(|r| r.map_err(|e| format!("{e:#}"))))
    });
    let mut seen = String::from("nothing yet");
    let result = loop {
        if Instant::now() >= deadline {
            break Err(seen);
        }
        if ladder.as_ref().is_some_and(|h| h.is_finished())
            && let Some(Some(Err(why))) = ladder.take().and_then(|h| h.join().ok())
        {
            break Err(why);
        }
        match status_of(&ep) {
            Ok(s) if s.incarnation.as_deref() != Some(old_inc.as_str()) && s.state.as_deref() == Some("running") => {
                break Ok(s);
            }
            Ok(s) if s.incarnation.as_deref() == Some(old_inc.as_str()) => {
                progress.phase(&format!("old gateway {} is {}", old_inc, s.state.as_deref().unwrap_or("?")));
                seen = format!("the old incarnation {old_inc} still {}", s.state.unwrap_or_default());
            }
            Ok(s) => {
                progress.phase("new incarnation starting");
                seen = format!(
                    "new incarnation {} in state {}",
                    s.incarnation.unwrap_or_default(),
                    s.state.unwrap_or_default()
                );
            }
            Err(_) => {
                let held = !matches!(InstanceLock::probe(&home.lock()), gatewarden_lifecycle::lock::LockProbe::Free(_));
                progress.phase(if held {
                    "waiting for the new gateway"
                } else {
                    "waiting for a gateway to take the lock"
                });
                seen = if held {
                    "a process holds the lock but does not answer yet".into()
                } else {
                    "no gateway holds the lock".into()
                };
                if !held {
                    let since = *gone_since.get_or_insert_with(Instant::now);
                    if let (Some(m), Some(after), None) = (&owner, kick_after, &kick)
                        && since.elapsed() >= after
                    {
                        progress.phase(&format!("starting {} (not waiting for its restart delay)", m.state.unit));
                        let m = m.clone();
                        kick = Some(std::thread::spawn(move || m.kick().map_err(|e| format!("{e:#}"))));
                    }
                }
            }
        }
        std::thread::sleep(POLL);
    };
    progress.finish();
    let kicked = kick.is_some();
    if let Some(Err(e)) = kick.and_then(|h| if h.is_finished() { h.join().ok() } else { None }) {
        eprintln!("starting the unit failed: {e}");
    }
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    match result {
        Ok(new) => {
            let _ = ledger.append(
                "restart_result",
                json!({"ok": true, "old": old_inc, "new": new.incarnation, "elapsed_ms": elapsed_ms, "kicked": kicked}),
            );
            println!(
                "restarted: incarnation {} → {} (pid {}) ready in {:.2}s",
                old_inc,
                new.incarnation.unwrap_or_default(),
                new.pid.map_or("?".into(), |p| p.to_string()),
                elapsed_ms as f64 / 1000.0
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(seen) => {
            let _ = ledger.append(
                "restart_result",
                json!({"ok": false, "old": old_inc, "seen": seen, "elapsed_ms": elapsed_ms, "kicked": kicked}),
            );
            eprintln!("restart not verified after {timeout_s}s: {seen}");
            eprintln!("recover with: {recovery}");
            Ok(ExitCode::from(1))
        }
    }
}
