//! Windows: a per-user Scheduled Task running `gatewarden supervise` (no admin), or with
//! `--system` an SCM service running `gatewarden supervise --scm`. Type-checked on Linux; see
//! `mod.rs` for the facade.

use std::path::PathBuf;
use std::time::Duration;

use crate::Context;
use gatewarden_service::command::{CommandRunner, SystemRunner};
use gatewarden_service::doctor::{self, Finding};
use gatewarden_service::windows::{render_task_xml, scm_install, task_xml_utf16le};
use gatewarden_service::windows_scm::{self, ScmState};
use gatewarden_service::{Scope, ServiceSpec};
use serde_json::json;

use super::ServiceState;
pub use super::not_systemd::{gave_up, host_findings, prepare_restart, verify_restart};

pub const MANAGER: gatewarden_service::ManagerKind = gatewarden_service::ManagerKind::TaskScheduler;
const SCM_MANAGER: gatewarden_service::ManagerKind = gatewarden_service::ManagerKind::Scm;

fn name(spec: &ServiceSpec) -> String {
    spec.names().windows_name()
}

fn user_id() -> String {
    let user = std::env::var("USERNAME").unwrap_or_default();
    match std::env::var("USERDOMAIN") {
        Ok(d) if !d.is_empty() => format!("{d}\\{user}"),
        _ => user,
    }
}

fn schtasks(args: &[&str]) -> crate::Result<gatewarden_service::command::CommandOutput> {
    Ok(SystemRunner { timeout: Duration::from_secs(60) }.run("schtasks", args)?)
}

fn checked(args: &[&str]) -> crate::Result<()> {
    let out = schtasks(args)?;
    if !out.success() {
        crate::bail!("`schtasks {}` failed ({:?}): {}", args.join(" "), out.code, out.stderr.trim());
    }
    Ok(())
}

#[allow(dead_code)]
pub fn definition_path(_spec: &ServiceSpec) -> Option<PathBuf> {
    None
}

pub fn render(spec: &ServiceSpec) -> crate::Result<String> {
    match spec.scope {
        Scope::User => Ok(render_task_xml(spec, &user_id())?),
        Scope::System => Ok(format!("{:#?}\n", scm_install(spec)?)),
    }
}

/// The manager answers: `schtasks /Query` lists the tasks; the SCM answers a query for this
/// service (installed or not).
pub fn check_manager(spec: &ServiceSpec) -> crate::Result<()> {
    match spec.scope {
        Scope::User => checked(&["/Query", "/FO", "CSV", "/NH"]).context("the Task Scheduler does not answer"),
        // A query fails alike for a service not installed: only an SCM that cannot be
        // reached at all is a refusal here; `load` reports the rest.
        Scope::System => match windows_scm::query(&name(spec)) {
            Err(e @ windows_scm::ScmError::Unsupported) => {
                Err(crate::Error::msg(format!("the service control manager does not answer: {e}")))
            }
            _ => Ok(()),
        },
    }
}

/// The task's XML (`schtasks /Query /XML`); for the SCM only whether it is installed (its
/// configuration cannot be put back byte for byte: a failed install removes a new service and
/// leaves an old one as it was registered).
pub fn save(spec: &ServiceSpec) -> crate::Result<super::Saved> {
    let n = name(spec);
    match spec.scope {
        Scope::User => {
            let out = schtasks(&["/Query", "/TN", &n, "/XML"])?;
            let bytes = out.success().then(|| out.stdout.into_bytes());
            Ok(super::Saved { enabled: bytes.is_some(), bytes })
        }
        Scope::System => {
            let installed = windows_scm::query(&n).is_ok();
            Ok(super::Saved { bytes: installed.then(Vec::new), enabled: installed })
        }
    }
}

/// Registers the task (`schtasks /Create /XML`, not run) or the service (not started).
pub fn load(spec: &ServiceSpec) -> crate::Result<()> {
    match spec.scope {
        Scope::User => create_task(spec, &render(spec)?),
        Scope::System => Ok(windows_scm::install(&scm_install(spec)?)?),
    }
}

/// Nothing more: the task's logon trigger and the service's auto-start are in the definition.
pub fn enable(_spec: &ServiceSpec) -> crate::Result<()> {
    Ok(())
}

/// Registers the saved task again (or deletes it); removes a service that was not installed.
pub fn restore(spec: &ServiceSpec, saved: &super::Saved) -> crate::Result<()> {
    let n = name(spec);
    match (spec.scope, &saved.bytes) {
        (Scope::User, Some(xml)) => create_task(spec, &gatewarden_service::windows::decode_task_xml(xml)),
        (Scope::User, None) => {
            let _ = schtasks(&["/Delete", "/TN", &n, "/F"]);
            Ok(())
        }
        (Scope::System, Some(_)) => Ok(()),
        (Scope::System, None) => {
            // Best effort: a service that was never registered fails the same way.
            let _ = windows_scm::uninstall(&n);
            Ok(())
        }
    }
}

/// Ends and deletes the task, or stops and deletes the service.
pub fn remove(spec: &ServiceSpec) -> crate::Result<()> {
    let n = name(spec);
    match spec.scope {
        Scope::User => {
            let _ = schtasks(&["/End", "/TN", &n]);
            checked(&["/Delete", "/TN", &n, "/F"])
        }
        Scope::System => Ok(windows_scm::uninstall(&n)?),
    }
}

/// `schtasks /Create /XML` from a file in the home (the only way to pass a task's XML).
fn create_task(spec: &ServiceSpec, xml: &str) -> crate::Result<()> {
    let n = name(spec);
    let file = spec.home.join(format!(".{n}.task.xml"));
    std::fs::write(&file, task_xml_utf16le(xml)).with_context(|| format!("cannot write {}", file.display()))?;
    let f = file.to_string_lossy().into_owned();
    let created = checked(&["/Create", "/TN", &n, "/XML", &f, "/F"]);
    let _ = std::fs::remove_file(&file);
    created
}

pub fn query(spec: &ServiceSpec) -> ServiceState {
    let n = name(spec);
    let mut st = ServiceState { scope: Some(spec.scope), unit: n.clone(), ..ServiceState::default() };
    match spec.scope {
        Scope::User => {
            st.manager = MANAGER;
            if let Ok(out) = schtasks(&["/Query", "/TN", &n, "/FO", "CSV", "/NH"]) {
                st.installed = out.success();
                // "\gatewarden","N/A","Running" (the status word is localized; best effort).
                st.active = out.success() && out.stdout.contains("Running");
                if let Some(line) = out.stdout.lines().find(|l| !l.trim().is_empty()) {
                    st.detail.insert("schtasks".into(), json!(line.trim()));
                }
            }
        }
        Scope::System => {
            st.manager = SCM_MANAGER;
            if let Ok(s) = windows_scm::query(&n) {
                st.installed = true;
                st.active = matches!(s.state, ScmState::Running | ScmState::StartPending);
                st.main_pid = s.pid;
                st.detail.insert("state".into(), json!(s.state));
            }
        }
    }
    st
}

fn start(spec: &ServiceSpec) -> crate::Result<()> {
    let n = name(spec);
    match spec.scope {
        Scope::User => checked(&["/Run", "/TN", &n]),
        Scope::System => Ok(windows_scm::start(&n)?),
    }
}

/// The task: the gateway's own planned stop already ended `supervise` with 0. The SCM service:
/// a stop control, which the service host turns into a graceful stop with StopPending
/// checkpoints.
pub fn stop(spec: &ServiceSpec) -> crate::Result<()> {
    match spec.scope {
        Scope::User => Ok(()),
        Scope::System => windows_scm::stop(&name(spec)).map(drop).map_err(Into::into),
    }
}

pub fn kick(spec: &ServiceSpec) -> crate::Result<()> {
    start(spec)
}

pub fn drift(spec: &ServiceSpec) -> Vec<Finding> {
    if spec.scope == Scope::System {
        return Vec::new();
    }
    let expected = match render(spec) {
        Ok(x) => x,
        Err(e) => {
            return super::unrenderable("scheduled task", "task", e);
        }
    };
    let installed =
        schtasks(&["/Query", "/TN", &name(spec), "/XML"]).ok().filter(|o| o.success()).map(|o| o.stdout.into_bytes());
    doctor::check_task(installed.as_deref(), &expected)
}

super::definition_manager!(
    /// A per-user scheduled task runs `gatewarden supervise`.
    TaskScheduler
);

super::definition_manager!(
    /// A Windows service (SCM, `--system`) runs `gatewarden supervise --scm`.
    Scm
);

/// The facade's constructor: this OS's manager for `spec`, with what it says now.
pub fn definition(spec: ServiceSpec) -> super::Owner {
    let state = query(&spec);
    let m = super::Managed { spec, state };
    match m.spec.scope {
        Scope::System => std::sync::Arc::new(Scm(m)),
        Scope::User => std::sync::Arc::new(TaskScheduler(m)),
    }
}
