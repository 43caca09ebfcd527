//! A verb that restarts the gateway must survive the gateway's end: it first moves out of the
//! unit's cgroup ([`escape_unit`]) and into its own session ([`detach`]), leaving a process that
//! only relays the detached copy's exit code. Shared by `restart` and `update`.

use std::process::{Command, ExitCode, Stdio};

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::platform::spawn;

use crate::env::ORCHESTRATOR_ENV;
use crate::owner;

/// Launched from inside the unit (chat `/restart` or `/update`, an exec-backend run, the
/// gateway's own backstop): the manager kills the unit's whole cgroup when the old gateway
/// exits, a new session does not help. Move into a transient scope first (H2); this returns
/// only if that is not needed.
pub fn escape_unit(home: &Home) {
    if let Some(m) = owner::installed(&home.canonicalized())
        && let Some(why) = owner::escape_unit_cgroup(m.managed())
    {
        errln!("warning: {why}; restarting from inside {}", m.describe());
    }
}

/// In the first process of a restarting verb: runs the same command line detached (module
/// doc) and returns its exit code; `None` in the detached copy, which does the work.
pub fn detach() -> Option<ExitCode> {
    if std::env::var_os(ORCHESTRATOR_ENV).is_none() && spawn::DETACH_KEEPS_OUTPUT {
        return relay_to_detached_orchestrator("1");
    }
    None
}

/// Runs this same command line in a new session and relays its exit code.
pub fn relay_to_detached_orchestrator(value: &str) -> Option<ExitCode> {
    let exe = owner::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(ORCHESTRATOR_ENV, value);
    // Launched from an agent run (chat-driven restarts), this process carries the run's tag,
    // and the next incarnation kills what the old one's runs left behind; the orchestrator
    // must not be mistaken for such a leftover.
    cmd.env_remove(gatewarden_control::runs::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    spawn::detach(&mut cmd, None);
    let status = cmd.spawn().ok()?.wait().ok()?;
    Some(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)))
}

/// The pid of the command the operator ran: in the detached orchestrator, the first process,
/// which relays its exit code; the ledger names it as the requester (issue 22, item 7).
pub fn requester_pid() -> u32 {
    let me = std::process::id();
    match std::env::var_os(ORCHESTRATOR_ENV) {
        Some(_) => gatewarden_lifecycle::platform::parent_pid(me).unwrap_or(me),
        None => me,
    }
}
