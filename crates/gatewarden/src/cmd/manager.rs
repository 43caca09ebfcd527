//! "Who owns this home's gateway?" — the service manager whose definition for this home is
//! installed and which runs it (systemd: the unit is active or its `MainPID` is the gateway;
//! launchd / Task Scheduler / SCM: the job runs `gatewarden supervise`). `stop`, `start`,
//! `restart` and `status` ask here first, so every lifecycle verb goes through the owner.
//!
//! Cheap when nothing is installed: a definition-file existence check, no subprocess.

use std::io;
use std::path::PathBuf;
use std::process::Command;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::home::resolve_with;
use gatewarden_service::{ManagerKind, Scope, ServiceSpec};
use serde_json::{Value, json};

use super::os::{self, ServiceState};

/// Set in the environment of a restart that already moved out of the unit's cgroup.
const SCOPED_ENV: &str = "GATEWARDEN_RESTART_SCOPED";

/// An installed service definition for this home and what its manager says about it.
#[derive(Debug, Clone)]
pub struct Managed {
    pub spec: ServiceSpec,
    pub state: ServiceState,
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
    spec.revert_exe = Some(super::update::good_copy(home));
    spec.is_default_home = is_default_home(home);
    spec.scope = scope;
    if let Ok(cfg) = gatewarden_config::Config::load(home.dir()) {
        spec.drain_timeout_s = cfg.drain_timeout_s;
    }
    Ok(spec)
}

/// The installed definition for this home, user scope first.
pub fn installed(home: &Home) -> Option<Managed> {
    for scope in [Scope::User, Scope::System] {
        let Ok(spec) = spec_for(home, scope) else { return None };
        let state = os::svc::query(&spec);
        if state.installed {
            return Some(Managed { spec, state });
        }
    }
    None
}

/// The manager that owns the running gateway (pid `gateway_pid`, if known): installed, and
/// active or running exactly that pid.
pub fn owner(home: &Home, gateway_pid: Option<u32>) -> Option<Managed> {
    installed(home).filter(|m| m.owns(gateway_pid))
}

/// What gatewarden asks of whoever owns a home's gateway — one implementation per manager,
/// behind the per-OS facade `os::svc` (systemd on Linux, launchd on macOS, Task Scheduler or
/// SCM on Windows). The restart ladder (cmd/restart.rs) is one loop over this trait and the
/// parameters its [`ManagerKind`] carries; no verb compares manager names.
pub trait ServiceManager: Send + Sync {
    fn kind(&self) -> ManagerKind;
    /// "systemd user unit gatewarden-1a2b3c4d.service".
    fn describe(&self) -> String;
    /// Whether it owns the running gateway (pid `gateway_pid`, if known): active, or running
    /// exactly that pid.
    fn owns(&self, gateway_pid: Option<u32>) -> bool;
    /// Stop and keep it down.
    fn stop(&self) -> anyhow::Result<()>;
    /// Start now, bypassing any restart backoff or failed state.
    fn start(&self) -> anyhow::Result<()>;
    /// The manager's own delay before it revives an exit (systemd's `RestartSec`), if known.
    fn restart_delay(&self) -> Option<std::time::Duration>;
    /// Before a planned restart: keep it from counting as a crash (systemd's start limit).
    fn prepare_restart(&self);
    /// The manager gave up on it (a tripped start limit, `failed`, inactive while we wait).
    fn gave_up(&self) -> bool;
    /// Where the manager relaunches asynchronously with quirks of its own (launchd): drive its
    /// verification ladder until a new supervised incarnation holds the lock; `None` where the
    /// restart loop's observation is the whole verification.
    fn relaunch_ladder(&self, old: Option<(u32, String)>, budget: std::time::Duration) -> Option<anyhow::Result<u32>>;
}

impl ServiceManager for Managed {
    fn kind(&self) -> ManagerKind {
        self.state.manager
    }

    fn describe(&self) -> String {
        let scope = match self.state.scope {
            Some(Scope::System) => "system ",
            Some(Scope::User) if self.state.manager == ManagerKind::Systemd => "user ",
            _ => "",
        };
        format!("{} {scope}{} {}", self.state.manager, self.state.manager.unit_word(), self.state.unit)
    }

    fn owns(&self, gateway_pid: Option<u32>) -> bool {
        self.state.active || (gateway_pid.is_some() && self.state.main_pid == gateway_pid)
    }

    fn stop(&self) -> anyhow::Result<()> {
        os::svc::stop(&self.spec)
    }

    fn start(&self) -> anyhow::Result<()> {
        os::svc::kick(&self.spec)
    }

    fn restart_delay(&self) -> Option<std::time::Duration> {
        self.state.detail.get("restart_sec_ms").and_then(Value::as_u64).map(std::time::Duration::from_millis)
    }

    fn prepare_restart(&self) {
        os::svc::prepare_restart(&self.spec);
    }

    fn gave_up(&self) -> bool {
        let fresh = os::svc::query(&self.spec);
        let get = |k: &str| fresh.detail.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        get("result") == "start-limit-hit" || matches!(get("active_state").as_str(), "failed" | "inactive")
    }

    fn relaunch_ladder(&self, old: Option<(u32, String)>, budget: std::time::Duration) -> Option<anyhow::Result<u32>> {
        os::svc::verify_restart(&self.spec, old, budget)
    }
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
        || std::env::var_os(SCOPED_ENV).is_some()
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
    cmd.env(SCOPED_ENV, "1");
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
