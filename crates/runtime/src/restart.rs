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
//! Whatever the route, a requester that is not a `gatewarden restart` CLI (which verifies by
//! itself) gets a **backstop**: a detached `gatewarden restart --backstop` that waits for a new
//! incarnation and starts one through the owner (or directly) if none appears in time, so no
//! route ends with nothing running.

use std::process::{Command, Stdio};
use std::time::Duration;

use gatewarden_lifecycle::ExitIntent;
use gatewarden_lifecycle::supervisor::RestartRoute;
use serde_json::json;

use crate::cause::{Outcome, Reexec};
use crate::gateway::Gateway;
use crate::options::{RUN_TAG, ResolvedOptions};
use gatewarden_lifecycle::platform::spawn;

/// The channel of the one requester that verifies the restart by itself.
pub const VERIFYING_CHANNEL: &str = "cli";
/// Beyond the drain budget, how long the backstop waits in all.
const BACKSTOP_GRACE: Duration = Duration::from_secs(60);

/// Starts a restart; `None` means the gateway keeps running (the restart could not start).
///
/// The next incarnation and the backstop carry out the desired state in force now
/// (`gatewarden_lifecycle::desired`): its sequence goes with them, and a stop recorded later
/// makes them stay down. A stop already recorded refuses the restart here: its own request
/// (or signal) is on its way, and nothing is started meanwhile.
pub fn begin(gw: &Gateway, opts: &ResolvedOptions, why: &str, channel: &str) -> Option<Outcome> {
    use gatewarden_lifecycle::desired::{self, Starter};
    let seq = match desired::check(gw.home.dir(), Starter::Resume) {
        Ok(d) => d.seq,
        Err(r) => {
            crate::info!("restart {why} refused: {}", r.describe());
            let mut v = r.json();
            v["by"] = json!("restart");
            gw.record("start_prevented", v);
            return None;
        }
    };
    let opts = &Carrying { opts, seq };
    let outcome = match gw.supervisor.route() {
        RestartRoute::ExitForManager => Outcome::new(
            ExitIntent::PlannedRestart,
            format!("planned restart {why}; {} starts the next incarnation", gw.supervisor.as_str()),
        ),
        RestartRoute::ReexecInPlace => match reexec_plan(gw, opts) {
            Ok(plan) => {
                gw.set_handing_over();
                let mut o = Outcome::new(
                    ExitIntent::PlannedRestart,
                    format!("planned restart {why}; PID {} re-executes in place", gw.me.pid),
                );
                o.reexec = Some(plan);
                // Same pid, and nothing can interrupt an exec halfway: no backstop needed.
                return Some(o);
            }
            Err(e) => {
                crate::error!("restart {why} failed: cannot prepare to re-execute ({e}); still running");
                gw.record("restart_failed", json!({"reason": e.to_string()}));
                return None;
            }
        },
        RestartRoute::SpawnSuccessor => match spawn_successor(gw, opts) {
            Ok(pid) => {
                gw.record("successor_started", json!({"successor_pid": pid}));
                crate::info!("successor pid {pid} will take over after the drain");
                Outcome::new(
                    ExitIntent::PlannedRestart,
                    format!("planned restart {why}; successor pid {pid} takes over"),
                )
            }
            Err(e) => {
                crate::error!("restart {why} failed: cannot start a successor ({e}); still running");
                gw.record("restart_failed", json!({"reason": e.to_string()}));
                return None;
            }
        },
    };
    if channel != VERIFYING_CHANNEL {
        spawn_backstop(gw, opts);
    }
    Some(outcome)
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

fn spawn_successor(gw: &Gateway, opts: &Carrying<'_>) -> std::io::Result<u32> {
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
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let handing_over =
        spawn::detach(&mut cmd, gw.kept_listener()).map(|fd| cmd.arg("--inherit-listener").arg(fd)).is_some();
    let child = cmd.spawn()?;
    // Only a successor that exists holds the listener; a failed spawn leaves the gateway
    // running with its ordinary drain semantics.
    if handing_over {
        gw.set_handing_over();
    }
    Ok(child.id())
}

/// `gatewarden restart --backstop <incarnation>` in its own session: it outlives us, waits
/// for the next incarnation, and starts one if none comes (see `cmd/restart.rs`).
fn spawn_backstop(gw: &Gateway, opts: &Carrying<'_>) {
    let Ok(exe) = opts.exe() else { return };
    let mut cmd = Command::new(exe);
    let budget = opts.drain_timeout + BACKSTOP_GRACE;
    cmd.arg("--home").arg(gw.home.dir()).arg("restart");
    cmd.args(["--backstop", &gw.me.id, "--timeout", &budget.as_secs().to_string()]);
    cmd.args(["--desired-seq", &opts.seq.to_string()]);
    // Not one of our runs: the next incarnation's sweep must not kill it.
    cmd.env_remove(RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    spawn::detach(&mut cmd, None);
    match cmd.spawn() {
        Ok(child) => gw.record("restart_backstop", json!({"backstop_pid": child.id()})),
        Err(e) => crate::warn!("cannot start the restart backstop: {e}"),
    }
}
