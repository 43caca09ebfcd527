//! "Who owns this home's gateway?" — the service manager whose definition for this home is
//! installed and which runs it (systemd: the unit is active or its `MainPID` is the gateway;
//! launchd / Task Scheduler / SCM: the job runs `gatewarden supervise`). `stop`, `start`,
//! `restart` and `status` ask here first, so every lifecycle verb goes through the owner.
//!
//! Cheap when nothing is installed: a definition-file existence check, no subprocess.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::home::resolve_with;
use gatewarden_service::{ManagerKind, Scope, ServiceSpec};
use serde_json::{Value, json};

use gatewarden_service::doctor::Finding;
use serde::Serialize;

#[cfg(not(target_os = "linux"))]
mod not_systemd;
/// The per-OS facade of the service manager (one file per OS, identical signatures):
/// `render`, `definition_path`, `check_manager`, `save`, `load`, `enable`, `restore`,
/// `remove` (the steps of `service install` / `uninstall`, `service.rs`), `query`, `stop`
/// (the manager's stop, after the caller's graceful request), `kick` (start now, bypassing
/// backoff and failed states), `drift`, `host_findings`, `verify_restart`, `prepare_restart`.
/// Only the implementations of [`ServiceManager`] call it.
#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(target_os = "macos", path = "macos.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(target_os = "linux", target_os = "macos", windows)), path = "fallback.rs")]
pub(crate) mod svc;

pub mod runtime;

/// The manager this OS's definitions are for (systemd on Linux, launchd on macOS, …).
pub const NATIVE_MANAGER: ManagerKind = svc::MANAGER;

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

/// Whether `home` is the per-OS default home (it gets the bare service names).
pub fn is_default_home(home: &Home) -> bool {
    let default = resolve_with(None, |k| if k == "GATEWARDEN_HOME" { None } else { std::env::var_os(k) });
    let canon = |p: &std::path::Path| gatewarden_lifecycle::platform::canonical(p).unwrap_or_else(|_| p.to_owned());
    default.is_ok_and(|d| canon(&d) == canon(home.dir()))
}

/// This executable, canonical (service definitions need an absolute path). The path captured
/// at start (`spawn::self_exe`): an update may have renamed a new binary over it since.
pub fn current_exe() -> io::Result<PathBuf> {
    let exe = gatewarden_lifecycle::platform::spawn::self_exe()?;
    Ok(gatewarden_lifecycle::platform::canonical(&exe).unwrap_or(exe))
}

/// The spec this version renders for `home` in `scope`: defaults plus the drain budget from
/// `config.toml` (an unreadable config keeps the default; `run` reports it).
pub fn spec_for(home: &Home, scope: Scope) -> io::Result<ServiceSpec> {
    let mut spec = ServiceSpec::new(current_exe()?, home.dir());
    spec.revert_exe = Some(crate::release::good_copy(home));
    spec.is_default_home = is_default_home(home);
    spec.scope = scope;
    if scope == Scope::System {
        spec.run_as_user = system_user(home);
    }
    if let Ok(cfg) = gatewarden_config::Config::load(home.dir()) {
        spec.drain_timeout_s = cfg.drain_timeout_s;
        spec.credentials = cfg.credential_files();
    }
    Ok(spec)
}

/// Whom a system unit for `home` runs as (`User=`): its owner, root's home too, by the one rule
/// of native and hermes units (`gatewarden_service::spec::run_as_for`). `None` where that is not
/// known (no home yet: the systemd unit then refuses to render, `SpecError::NoUser`) or where
/// the OS has no Unix owners (a Windows service runs as `--run-as` or LocalSystem).
fn system_user(home: &Home) -> Option<String> {
    let facts = gatewarden_lifecycle::platform::node_facts(home.canonicalized().dir()).ok()??;
    let me = gatewarden_lifecycle::platform::credentials().map(|c| c.uid);
    let owner = gatewarden_service::spec::run_as_for(Scope::System, Some((facts.owner, facts.group)), me).ok()??;
    Some(owner.0.to_string())
}

/// What a definition was before `service install` or `uninstall` changed it: what
/// [`ServiceManager::restore`] puts back (crates/service/src/transaction.rs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    /// The definition's bytes (the unit file, the plist, the task's XML); `None`: none.
    pub bytes: Option<Vec<u8>>,
    /// Enabled for boot or login (systemd `is-enabled`; launchd: loaded).
    pub enabled: bool,
}

/// A service definition for one home (rendered by this version) and what its manager says
/// about it. Every owner carries one; a runtime owner's is not installed.
#[derive(Debug, Clone)]
pub struct Managed {
    pub spec: ServiceSpec,
    pub state: ServiceState,
}

/// What gatewarden asks of whoever owns a home's gateway: one implementation per manager —
/// `svc`'s per-OS definitions (systemd on Linux; launchd on macOS; Task Scheduler and SCM on
/// Windows) and the [`runtime`] owners declared by the running gateway (`gatewarden
/// supervise`, container PID 1, nobody). Install, query, drift, start, stop and the restart
/// ladder (`ladder/mod.rs`) go through it; what differs between managers is data on its
/// [`ManagerKind`], and no verb compares manager names.
pub trait ServiceManager: Send + Sync {
    /// The definition and the manager's view of it.
    fn managed(&self) -> &Managed;

    fn kind(&self) -> ManagerKind {
        self.managed().state.manager
    }

    /// "systemd user unit gatewarden-1a2b3c4d.service".
    fn describe(&self) -> String {
        let st = &self.managed().state;
        let scope = match st.scope {
            Some(Scope::System) => "system ",
            Some(Scope::User) if st.manager == ManagerKind::Systemd => "user ",
            _ => "",
        };
        format!("{} {scope}{} {}", st.manager, st.manager.unit_word(), st.unit)
    }

    /// Whether it owns the running gateway (pid `gateway_pid`, if known): active, or running
    /// exactly that pid.
    fn owns(&self, gateway_pid: Option<u32>) -> bool {
        let st = &self.managed().state;
        st.active || (gateway_pid.is_some() && st.main_pid == gateway_pid)
    }

    /// The definition this version would install.
    fn render(&self) -> crate::Result<String>;
    /// The manager answers (systemd: `daemon-reload`). Changes nothing.
    fn check_manager(&self) -> crate::Result<()>;
    /// What is installed now, for [`ServiceManager::restore`].
    fn save(&self) -> crate::Result<Saved>;
    /// Writes this version's definition and has the manager accept it, without starting it
    /// (launchd: written and linted; loading it is [`ServiceManager::enable`]).
    fn load(&self) -> crate::Result<()>;
    /// Enables it for boot or login (launchd: loads it, which starts the job).
    fn enable(&self) -> crate::Result<()>;
    /// Puts back what [`ServiceManager::save`] saw: its definition and enablement, or none.
    fn restore(&self, saved: &Saved) -> crate::Result<()>;
    /// Disables and removes the definition; the manager forgets it (the gateway is stopped
    /// first, by the caller).
    fn remove(&self) -> crate::Result<()>;
    /// Asks the manager again.
    fn query(&self) -> ServiceState;
    /// The installed definition against this version's rendering.
    fn drift(&self) -> Vec<Finding>;
    /// Host-level findings (a user unit without lingering, …).
    fn host_findings(&self) -> Vec<Finding>;
    /// The manager's stop, after the caller's graceful request: stop and keep it down.
    fn stop(&self) -> crate::Result<()>;
    /// Start now, bypassing any restart backoff or failed state, on behalf of the desired-state
    /// request `on_behalf` (what a direct start passes on; a manager decides itself).
    fn start(&self, on_behalf: u64) -> crate::Result<()>;

    /// The manager's own delay before it revives an exit (systemd's `RestartSec`), if known.
    fn restart_delay(&self) -> Option<std::time::Duration> {
        let detail = &self.managed().state.detail;
        detail.get("restart_sec_ms").and_then(Value::as_u64).map(std::time::Duration::from_millis)
    }
    /// Before a planned restart: keep it from counting as a crash (systemd's start limit).
    fn prepare_restart(&self) {}
    /// The manager gave up on it (a tripped start limit, `failed`, inactive while we wait).
    fn gave_up(&self) -> bool {
        false
    }
    /// Where the manager relaunches asynchronously with quirks of its own (launchd): drive its
    /// verification ladder until a new supervised incarnation holds the lock; `None` where the
    /// restart loop's observation is the whole verification.
    fn relaunch_ladder(&self, _old: Option<(u32, String)>, _budget: std::time::Duration) -> Option<crate::Result<u32>> {
        None
    }
}

/// Implements [`ServiceManager`] for a per-OS definition type over its file's facade
/// functions (the identical signatures every `svc` file has).
macro_rules! definition_manager {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name(pub super::Managed);

        impl super::ServiceManager for $name {
            fn managed(&self) -> &super::Managed {
                &self.0
            }
            fn render(&self) -> crate::Result<String> {
                render(&self.0.spec)
            }
            fn check_manager(&self) -> crate::Result<()> {
                check_manager(&self.0.spec)
            }
            fn save(&self) -> crate::Result<super::Saved> {
                save(&self.0.spec)
            }
            fn load(&self) -> crate::Result<()> {
                load(&self.0.spec)
            }
            fn enable(&self) -> crate::Result<()> {
                enable(&self.0.spec)
            }
            fn restore(&self, saved: &super::Saved) -> crate::Result<()> {
                restore(&self.0.spec, saved)
            }
            fn remove(&self) -> crate::Result<()> {
                remove(&self.0.spec)
            }
            fn query(&self) -> super::ServiceState {
                query(&self.0.spec)
            }
            fn drift(&self) -> Vec<gatewarden_service::doctor::Finding> {
                drift(&self.0.spec)
            }
            fn host_findings(&self) -> Vec<gatewarden_service::doctor::Finding> {
                host_findings(&self.0.spec)
            }
            fn stop(&self) -> crate::Result<()> {
                stop(&self.0.spec)
            }
            fn start(&self, _on_behalf: u64) -> crate::Result<()> {
                kick(&self.0.spec)
            }
            fn prepare_restart(&self) {
                prepare_restart(&self.0.spec)
            }
            fn gave_up(&self) -> bool {
                gave_up(&self.0.spec)
            }
            fn relaunch_ladder(
                &self,
                old: Option<(u32, String)>,
                budget: std::time::Duration,
            ) -> Option<crate::Result<u32>> {
                verify_restart(&self.0.spec, old, budget)
            }
        }
    };
}
use definition_manager;

/// A shared owner (the restart ladder hands it to a thread).
pub type Owner = Arc<dyn ServiceManager>;

/// This OS's manager for `spec` (installed or not), with what it says now.
pub fn definition(spec: ServiceSpec) -> Owner {
    svc::definition(spec)
}

/// The installed definition for this home, user scope first.
pub fn installed(home: &Home) -> Option<Owner> {
    for scope in [Scope::User, Scope::System] {
        let Ok(spec) = spec_for(home, scope) else { return None };
        let m = definition(spec);
        if m.managed().state.installed {
            return Some(m);
        }
    }
    None
}

/// The manager that owns the running gateway (pid `gateway_pid`, if known): installed, and
/// active or running exactly that pid.
pub fn owner(home: &Home, gateway_pid: Option<u32>) -> Option<Owner> {
    installed(home).filter(|m| m.owns(gateway_pid))
}

/// Whoever owns this home's gateway, always someone: an installed definition, else the
/// supervisor the gateway declared in its state record (`supervise` / another external
/// supervisor, container PID 1), else nobody (the CLI starts it).
pub fn of(home: &Home) -> Owner {
    installed(home).unwrap_or_else(|| runtime::declared(home))
}

impl Managed {
    /// The `service` object of `status --json`.
    pub fn status_json(&self) -> Value {
        let mut v = json!({
            "manager": self.state.manager,
            "scope": self.state.scope,
            "unit": self.state.unit,
            "installed": self.state.installed,
            "active": self.state.active,
            "main_pid": self.state.main_pid,
        });
        if let Some(obj) = v.as_object_mut() {
            for (k, val) in &self.state.detail {
                obj.insert(k.clone(), val.clone());
            }
        }
        v
    }
}

/// Whether this process runs inside `unit`'s cgroup (Linux; `false` elsewhere).
pub fn in_unit_cgroup(unit: &str) -> bool {
    std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|t| cgroup_has_unit(&t, unit))
}

/// Pure: whether a `/proc/<pid>/cgroup` text places the process in `unit`.
pub fn cgroup_has_unit(cgroup: &str, unit: &str) -> bool {
    cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2)).any(|path| path.split('/').any(|seg| seg == unit))
}

/// Re-executes this command line in a transient systemd scope (`systemd-run --scope`), so
/// that the manager killing `unit`'s cgroup cannot kill it (class H2). Returns only if that
/// is not needed or not possible (with the reason, for a warning).
pub fn escape_unit_cgroup(m: &Managed) -> Option<String> {
    if !m.state.manager.runs_gateway_directly()
        || std::env::var_os(crate::env::SCOPED_ENV).is_some()
        || !in_unit_cgroup(&m.state.unit)
    {
        return None;
    }
    let exe = match current_exe() {
        Ok(e) => e,
        Err(e) => return Some(format!("cannot find this executable: {e}")),
    };
    let mut cmd = Command::new("systemd-run");
    if m.spec.scope == Scope::User {
        cmd.arg("--user");
    }
    cmd.args(["--scope", "--quiet", "--collect", "--"]).arg(exe).args(std::env::args_os().skip(1));
    cmd.env(crate::env::SCOPED_ENV, "1");
    let e = gatewarden_lifecycle::platform::spawn::exec_in_place(cmd, None);
    Some(format!("cannot move into a transient scope with systemd-run: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_membership_is_by_path_segment() {
        let cg = "0::/user.slice/user-0.slice/user@0.service/app.slice/gatewarden-1a2b3c4d.service\n";
        assert!(cgroup_has_unit(cg, "gatewarden-1a2b3c4d.service"));
        assert!(!cgroup_has_unit(cg, "gatewarden.service"));
        assert!(!cgroup_has_unit("0::/user.slice/run-r1.scope\n", "gatewarden-1a2b3c4d.service"));
        assert!(!cgroup_has_unit("garbage", "x.service"));
    }
}
