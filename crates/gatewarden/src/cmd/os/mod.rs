//! The per-OS facade of the service verbs: the only `cfg` in the CLI's service code.
//!
//! Two halves, each one file per OS with identical signatures:
//!
//! - `svc` (`linux.rs` systemd, `macos.rs` launchd, `windows.rs` Task Scheduler / SCM,
//!   `fallback.rs` elsewhere): render, install, uninstall, query, start, stop and check the
//!   service definition of one home.
//!   `render(&ServiceSpec) -> Result<String>`, `definition_path(&ServiceSpec) -> Option<PathBuf>`,
//!   `install(&ServiceSpec, start: bool) -> Result<()>`, `uninstall(&ServiceSpec) -> Result<()>`,
//!   `query(&ServiceSpec) -> ServiceState`, `stop(&ServiceSpec) -> Result<()>` (the manager's
//!   stop, after the caller's graceful request), `kick(&ServiceSpec) -> Result<()>` (start now,
//!   bypassing backoff and failed states),
//!   `drift(&ServiceSpec) -> Vec<Finding>`, `host_findings(&ServiceSpec) -> Vec<Finding>`,
//!   (The SCM service body goes through `gatewarden_service::windows_scm`, already a facade.)
//! - `proc` (`proc_unix.rs`, `proc_windows.rs`): forwarding stop signals / console events, file
//!   modes and owners. Processes themselves (the watched child, reaping orphans when PID 1,
//!   replacing the process image, the user id, process groups) are lifecycle's per-OS facade,
//!   crates/lifecycle/src/platform/spawn; [`spawn_watched`] only turns its reports into events.
//!
//! Decisions (what to do with an exit, when to escalate) stay in the verb files.

use std::path::PathBuf;

use gatewarden_service::Scope;
use gatewarden_service::supervise::ChildExit;
use serde::Serialize;

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(target_os = "macos", path = "macos.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(target_os = "linux", target_os = "macos", windows)), path = "fallback.rs")]
pub mod svc;

#[cfg_attr(unix, path = "proc_unix.rs")]
#[cfg_attr(windows, path = "proc_windows.rs")]
pub mod proc;

/// What the service manager says about this home's service.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceState {
    /// Who manages the service (`systemd`, `launchd`, `task-scheduler`, `windows-service`, `none`).
    pub manager: gatewarden_service::ManagerKind,
    /// `user` or `system`.
    pub scope: Option<Scope>,
    /// Unit name, launchd label, task or service name.
    pub unit: String,
    /// A definition for this home is installed.
    pub installed: bool,
    /// The manager runs (or is starting) it.
    pub active: bool,
    /// The manager's main process (the gateway under systemd, the supervisor elsewhere).
    pub main_pid: Option<u32>,
    /// Where the definition lives.
    pub path: Option<PathBuf>,
    /// Manager-specific details (`ActiveState`, `SubState`, `NRestarts`, `Result`, …).
    pub detail: serde_json::Map<String, serde_json::Value>,
}

/// Something `supervise` is told while it waits.
#[derive(Debug)]
pub enum Event {
    /// The child ended.
    ChildExited { pid: u32, exit: ChildExit },
    /// An orphan (not our child) was reaped; we are PID 1 or a subreaper (Unix only).
    OrphanReaped { pid: u32 },
    /// A stop was requested by a signal or console event (`channel`, `what`).
    Stop { channel: &'static str, what: &'static str },
}

/// Spawns `cmd` as the supervised child (crates/lifecycle/src/platform/spawn) and reports its
/// end, and every orphan reaped meanwhile, on `tx`.
pub fn spawn_watched(cmd: &mut std::process::Command, tx: std::sync::mpsc::Sender<Event>) -> std::io::Result<u32> {
    use gatewarden_lifecycle::platform::spawn::{self, Reaped};
    spawn::spawn_watched(cmd, move |r| {
        let event = match r {
            Reaped::Child { pid, code, signal } => {
                let exit = match (code, signal) {
                    (Some(c), _) => ChildExit::Code(c),
                    (None, Some(s)) => ChildExit::Signal(s),
                    (None, None) => ChildExit::Unknown,
                };
                Event::ChildExited { pid, exit }
            }
            Reaped::Orphan { pid } => Event::OrphanReaped { pid },
        };
        // The receiver may be gone (supervise is exiting): nothing left to tell.
        let _ = tx.send(event);
    })
}

/// The finding every OS reports when this version cannot even render its own definition.
pub fn unrenderable(subject: &str, what: &str, e: impl std::fmt::Display) -> Vec<gatewarden_service::doctor::Finding> {
    use gatewarden_service::doctor::{Finding, FindingId, FixAction, Severity};
    vec![Finding::new(
        FindingId::DefinitionUnreadable,
        Severity::Error,
        subject,
        format!("cannot render the expected {what}: {e}"),
        FixAction::None,
    )]
}
