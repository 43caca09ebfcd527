//! Restart routes. Every route starts with the same drain; they differ in who starts the next
//! incarnation:
//!
//! - **supervised** (systemd, launchd, container, external): exit 75 and let the manager
//!   relaunch — the manager owns the process, so a second starter would race it;
//! - **unsupervised**: this gateway starts its successor — a new process in its own session,
//!   which inherits the HTTP listening socket (Unix), waits for our lock, and serves the same
//!   socket. Chosen over exec-in-place because the successor is a fresh process with a fresh
//!   identity taking the lock through the normal path (no special-cased lock inheritance),
//!   and over a plain respawn because the shared socket keeps its backlog: connections that
//!   arrive mid-restart wait instead of being refused.

use std::process::{Command, Stdio};

use gatewarden_lifecycle::ExitIntent;
use serde_json::json;

use crate::gateway::Gateway;
use crate::{Outcome, ResolvedOptions, spawn};

/// Starts a restart; `None` means the gateway keeps running (the restart could not start).
pub fn begin(gw: &Gateway, opts: &ResolvedOptions, why: &str) -> Option<Outcome> {
    if gw.supervisor.restarts_on_exit() {
        return Some(Outcome::new(
            ExitIntent::PlannedRestart,
            format!("planned restart {why}; {} starts the next incarnation", gw.supervisor.as_str()),
        ));
    }
    match spawn_successor(gw, opts) {
        Ok(pid) => {
            gw.record("successor_started", json!({"successor_pid": pid}));
            crate::info!("successor pid {pid} will take over after the drain");
            Some(Outcome::new(
                ExitIntent::PlannedRestart,
                format!("planned restart {why}; successor pid {pid} takes over"),
            ))
        }
        Err(e) => {
            crate::error!("restart {why} failed: cannot start a successor ({e}); still running");
            gw.record("restart_failed", json!({"reason": e.to_string()}));
            None
        }
    }
}

fn spawn_successor(gw: &Gateway, opts: &ResolvedOptions) -> std::io::Result<u32> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(gw.home.dir()).arg("run");
    cmd.arg("--listen").arg(gw.listen().unwrap_or(&opts.listen));
    cmd.arg("--drain-timeout").arg(opts.drain_timeout.as_secs().to_string());
    cmd.arg("--takeover-timeout").arg(opts.takeover_timeout.as_secs().to_string());
    cmd.arg("--supervisor").arg("none").arg("--successor");
    if opts.log_json {
        cmd.arg("--log-format").arg("json");
    }
    match &opts.log_file {
        Some(f) => {
            cmd.arg("--log-file").arg(f);
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
