//! Starting `hermes gateway run`, detached or as a supervised child, verified ready.
//!
//! Ready = the child's pid holds `gateway.lock` (kernel lock table) and hermes's
//! `gateway_state.json` says `running`/`degraded` for that very process. Never a hermes CLI
//! verb: they print guidance, exit 0 whatever happened, and unlink `gateway.lock`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::platform::{self, spawn};
use serde_json::json;

use crate::holder::{self, Finding};
use crate::home::{HermesHome, STDIO_LOG};
use crate::launch::{self, Launch};
use crate::ledger;
use crate::status::is_ready;
use crate::supervisor::{SUPERVISOR_TAG, render_tag};

/// How the child is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `gatewarden start`: own session, outlives us, hermes's storm brake left as configured.
    Detached,
    /// A child of `gatewarden supervise` (this process): `--external-supervisor` (so chat
    /// `/restart` exits 75 to us), hermes's own respawn-storm brake off (ours replaces it: it
    /// would sleep 10–300 s before starts and count planned restarts as a storm), and the
    /// supervisor tag that lets `restart` prove a supervisor revives exit 75.
    Supervised,
}

/// hermes's own supervisor markers: an inherited one would make a child believe another
/// supervisor runs it (ours says so with `--external-supervisor` where it is true).
const HERMES_SUPERVISOR_ENV: &[&str] = &["HERMES_GATEWAY_EXTERNAL_SUPERVISOR", "HERMES_S6_SUPERVISED_CHILD"];

/// The `hermes gateway run` command for `home`. Callers may add to it (tests make it
/// hermetic) before passing it to [`spawn`].
pub fn command(home: &HermesHome, hermes: &Path, mode: Mode) -> Command {
    command_for(home, &Launch::hermes(hermes, launch::Source::Explicit), mode)
}

/// [`command`] for a resolved [`Launch`] (what ran before, see [`crate::launch`]).
///
/// The child inherits our environment without our own service manager's variables
/// (`supervisor::MANAGER_ENV`: with them it would believe systemd runs it directly, or answer
/// our manager) and without hermes's supervisor markers.
pub fn command_for(home: &HermesHome, launch: &Launch, mode: Mode) -> Command {
    let mut cmd = Command::new(&launch.program);
    for k in gatewarden_lifecycle::supervisor::MANAGER_ENV.iter().chain(HERMES_SUPERVISOR_ENV) {
        cmd.env_remove(k);
    }
    cmd.args(&launch.args);
    cmd.env("HERMES_HOME", home.env_value()).env("PYTHONUNBUFFERED", "1").stdin(Stdio::null());
    match mode {
        Mode::Detached => {
            spawn::detach(&mut cmd, None);
        }
        Mode::Supervised => {
            cmd.arg("--external-supervisor").env("HERMES_GATEWAY_MAX_STARTS", "0");
            if let Some(me) = ProcessIdentity::current() {
                cmd.env(SUPERVISOR_TAG, render_tag(me));
            }
            spawn::own_process_group(&mut cmd);
        }
    }
    cmd
}

/// The hermes executable: `--hermes`, else `hermes` next to gatewarden's `PATH` lookup.
pub fn default_hermes(flag: Option<PathBuf>, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    explicit_hermes(flag, env).unwrap_or_else(|| PathBuf::from("hermes"))
}

/// The hermes executable the operator named: `--hermes`, else `GATEWARDEN_HERMES`.
pub fn explicit_hermes(flag: Option<PathBuf>, env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    flag.or_else(|| env("GATEWARDEN_HERMES").filter(|v| !v.is_empty()).map(PathBuf::from))
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("a hermes gateway already runs in this home ({0})")]
    AlreadyRunning(ProcessIdentity),
    #[error("cannot identify the process holding the hermes lock: {0}")]
    Unidentified(String),
    #[error("cannot open hermes's output log {}: {source}", log.display())]
    Log { log: PathBuf, source: std::io::Error },
    #[error("cannot start {}: {source}", program.display())]
    Spawn { program: PathBuf, source: std::io::Error },
    #[error("hermes exited ({status}) before it was ready; see {}", log.display())]
    Exited { status: String, log: PathBuf },
    #[error("hermes (pid {pid}) was not ready after {:.1} s", after.as_secs_f64())]
    NotReady { pid: u32, after: Duration, child: Box<Child> },
}

/// A started, ready hermes.
#[derive(Debug)]
pub struct Started {
    pub identity: ProcessIdentity,
    pub elapsed: Duration,
    /// The child handle: dropping it neither kills nor waits (a detached hermes outlives us).
    pub child: Child,
}

/// Spawns `cmd` with stdout/stderr appended to `<home>/gatewarden/gateway-stdio.log`.
/// The log is opened through the home's folder handle (no link followed, owner checked); one
/// that cannot be opened safely is refused with the reason, never replaced by a null sink.
/// When we run as root in a home that belongs to another user, hermes runs as that user: a
/// root hermes would obey a configuration the home's owner writes.
pub fn spawn(home: &HermesHome, mut cmd: Command) -> Result<Child, StartError> {
    let program = PathBuf::from(cmd.get_program());
    let log = home.stdio_log();
    let out = home.open_ours().and_then(|d| d.open_append(STDIO_LOG)).and_then(|f| Ok((f.try_clone()?, f)));
    let (a, b) = out.map_err(|source| StartError::Log { log: log.clone(), source })?;
    cmd.stdout(a).stderr(b);
    if let Some((uid, gid)) = launch::run_as(home).map_err(|source| StartError::Log { log, source })? {
        spawn::run_as(&mut cmd, uid, gid);
    }
    cmd.spawn().map_err(|source| StartError::Spawn { program, source })
}

/// Starts `cmd` (from [`command`]) unless a gateway already runs, and waits until ready.
pub fn start(home: &HermesHome, cmd: Command, timeout: Duration) -> Result<Started, StartError> {
    match holder::find(home) {
        Finding::Held { identity, .. } => return Err(StartError::AlreadyRunning(identity)),
        Finding::Unknown(why) => return Err(StartError::Unidentified(why)),
        // Something foreign holds the lock: hermes could not take it.
        Finding::Unproven { holds_lock: true, why, .. } => return Err(StartError::Unidentified(why)),
        // Only a record names a process that is not this home's gateway: nothing runs here.
        Finding::Unproven { holds_lock: false, .. } | Finding::Free => {}
    }
    let started = Instant::now();
    let child = spawn(home, cmd)?;
    ledger::record(home, "start.spawned", json!({"pid": child.id()}));
    let s = wait_ready(home, child, started + timeout)?;
    ledger::record(home, "start.ready", json!({"pid": s.identity.pid, "start_time": s.identity.start_time}));
    Ok(Started { elapsed: started.elapsed(), ..s })
}

/// Waits until `child` is ready, failing early if it exits.
pub fn wait_ready(home: &HermesHome, mut child: Child, deadline: Instant) -> Result<Started, StartError> {
    let started = Instant::now();
    let pid = child.id();
    let mut identity = None;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StartError::Exited { status: describe(status), log: home.stdio_log() });
        }
        if identity.is_none() {
            identity = platform::start_time(pid).map(|start_time| ProcessIdentity { pid, start_time });
        }
        if let Some(id) = identity
            && is_ready(home, id)
        {
            return Ok(Started { identity: id, elapsed: started.elapsed(), child });
        }
        if Instant::now() >= deadline {
            return Err(StartError::NotReady { pid, after: started.elapsed(), child: Box::new(child) });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `exit code N` or `signal N`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), exit_signal(status)) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "unknown status".into(),
    }
}

/// The signal that ended a process, where the OS has signals.
pub fn exit_signal(status: ExitStatus) -> Option<i32> {
    spawn::exit_signal(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_do_not_inherit_our_manager_or_another_supervisor() {
        let home = HermesHome::at(PathBuf::from("/h"));
        for mode in [Mode::Detached, Mode::Supervised] {
            let cmd = command(&home, Path::new("hermes"), mode);
            let removed: Vec<_> = cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k.to_owned()).collect();
            for k in ["NOTIFY_SOCKET", "INVOCATION_ID", "LISTEN_FDS", "HERMES_GATEWAY_EXTERNAL_SUPERVISOR"] {
                assert!(removed.iter().any(|r| r == k), "{k} removed in {mode:?}: {removed:?}");
            }
            assert!(cmd.get_envs().any(|(k, v)| k == "HERMES_HOME" && v.is_some()));
        }
    }
}
