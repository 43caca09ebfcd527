//! macOS: a LaunchAgent running `gatewarden supervise` (see `gatewarden_service::launchd` for
//! the KeepAlive policy). Type-checked on Linux; see `mod.rs` for the facade.

use std::path::PathBuf;
use std::time::Duration;

use crate::Context;
use gatewarden_lifecycle::fsio;
use gatewarden_service::command::SystemRunner;
use gatewarden_service::doctor::{self, Finding};
use gatewarden_service::launchd::{self, Launchctl, LaunchdTarget};
use gatewarden_service::{Scope, ServiceSpec};
use serde_json::json;

use super::ServiceState;
pub use super::not_systemd::{gave_up, host_findings, prepare_restart};

pub const MANAGER: gatewarden_service::ManagerKind = gatewarden_service::ManagerKind::Launchd;

fn user_home() -> String {
    std::env::var("HOME").unwrap_or_default()
}

fn target(spec: &ServiceSpec) -> LaunchdTarget {
    let label = spec.names().launchd_label();
    let path = launchd::plist_path(&user_home(), &label);
    LaunchdTarget::new(gatewarden_lifecycle::platform::spawn::real_uid(), label, path)
}

fn runner() -> SystemRunner {
    SystemRunner { timeout: Duration::from_secs(60) }
}

fn user_scope_only(spec: &ServiceSpec) -> crate::Result<()> {
    if spec.scope == Scope::System {
        crate::bail!("system-wide LaunchDaemons are not supported; install a per-user LaunchAgent (without --system)");
    }
    Ok(())
}

#[allow(dead_code)]
pub fn definition_path(spec: &ServiceSpec) -> Option<PathBuf> {
    Some(PathBuf::from(target(spec).plist_path))
}

pub fn render(spec: &ServiceSpec) -> crate::Result<String> {
    user_scope_only(spec)?;
    Ok(launchd::render_plist(spec)?)
}

pub fn install(spec: &ServiceSpec, start: bool) -> crate::Result<()> {
    let text = render(spec)?;
    let t = target(spec);
    // The plist names log files in <home>/logs; launchd will not create the directory.
    let logs = spec.home.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let path = PathBuf::from(&t.plist_path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fsio::atomic_write(&path, text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    let r = runner();
    let lc = Launchctl::new(&r);
    if lc.print(&t)?.is_none() {
        lc.bootstrap(&t)?;
    }
    if start {
        lc.kickstart(&t, false)?;
    }
    Ok(())
}

pub fn uninstall(spec: &ServiceSpec) -> crate::Result<()> {
    let t = target(spec);
    let r = runner();
    let _ = Launchctl::new(&r).bootout(&t);
    fsio::remove_if_exists(std::path::Path::new(&t.plist_path))?;
    Ok(())
}

pub fn query(spec: &ServiceSpec) -> ServiceState {
    let t = target(spec);
    let path = PathBuf::from(&t.plist_path);
    let mut st = ServiceState {
        manager: MANAGER,
        scope: Some(Scope::User),
        unit: t.label.clone(),
        installed: path.exists(),
        path: Some(path),
        ..ServiceState::default()
    };
    if !st.installed {
        return st;
    }
    let r = runner();
    match Launchctl::new(&r).print(&t) {
        Ok(Some(p)) => {
            st.main_pid = p.pid;
            st.active = p.pid.is_some();
            st.detail.insert("loaded".into(), json!(true));
            if let Some(s) = &p.state {
                st.detail.insert("state".into(), json!(s));
            }
            st.detail.insert("spawn_pending".into(), json!(p.spawn_pending));
        }
        Ok(None) => {
            st.detail.insert("loaded".into(), json!(false));
        }
        Err(e) => {
            st.detail.insert("error".into(), json!(e.to_string()));
        }
    }
    st
}

fn start(spec: &ServiceSpec) -> crate::Result<()> {
    user_scope_only(spec)?;
    let t = target(spec);
    let r = runner();
    let lc = Launchctl::new(&r);
    if lc.print(&t)?.is_none() {
        lc.bootstrap(&t)?;
    }
    Ok(lc.kickstart(&t, false)?)
}

/// The gateway's own planned stop (exit 0) ends `supervise` with 0, and `SuccessfulExit =
/// false` keeps the job down with its label loaded: nothing to ask launchd.
pub fn stop(_spec: &ServiceSpec) -> crate::Result<()> {
    Ok(())
}

pub fn kick(spec: &ServiceSpec) -> crate::Result<()> {
    start(spec)
}

pub fn drift(spec: &ServiceSpec) -> Vec<Finding> {
    let expected = match launchd::launch_agent(spec) {
        Ok(a) => a,
        Err(e) => {
            return super::unrenderable("LaunchAgent", "plist", e);
        }
    };
    let bytes = std::fs::read(target(spec).plist_path).ok();
    doctor::check_launchd_plist(bytes.as_deref(), &expected)
}

/// Drives the launchd restart ladder (`gatewarden_service::launchd::RestartLadder`) until a new
/// incarnation supervised by the label holds the lock, or the ladder gives up. Observations:
/// `launchctl print` (loaded, pid, pended spawn) and the home's lock record; actions are
/// executed here, decisions are the ladder's.
pub fn verify_restart(spec: &ServiceSpec, old: Option<(u32, String)>, budget: Duration) -> Option<crate::Result<u32>> {
    use gatewarden_lifecycle::lock::{InstanceLock, LockProbe};
    use gatewarden_lifecycle::records::read_pid_record;
    use gatewarden_service::launchd::{
        Incarnation, LadderAction, LadderConfig, LockHolder, Observation, RestartLadder,
    };

    let t = target(spec);
    let r = runner();
    let lc = Launchctl::new(&r);
    let cfg = LadderConfig::for_plist(spec.throttle_interval_s, spec.stop_timeout_s());
    let old_pid = old.as_ref().map(|o| o.0);
    let mut ladder = RestartLadder::new(cfg, t.clone(), old.map(|(pid, incarnation)| Incarnation { pid, incarnation }));
    let t0 = std::time::Instant::now();
    loop {
        if t0.elapsed() > budget {
            return Some(Err(crate::Error::msg(format!(
                "launchd did not bring back a supervised gateway within {budget:?}; recover with: launchctl kickstart {}",
                t.service()
            ))));
        }
        let print = lc.print(&t).ok().flatten();
        let held = matches!(InstanceLock::probe(&spec.home.join("gateway.lock")), LockProbe::Held);
        let lock_holder =
            held.then(|| read_pid_record(&spec.home.join("gateway.pid")).ok()).flatten().map(|rec| LockHolder {
                pid: rec.pid,
                parent_pid: gatewarden_lifecycle::platform::parent_pid(rec.pid),
                incarnation: rec.incarnation.unwrap_or_default(),
            });
        let obs = Observation {
            elapsed: t0.elapsed(),
            label_loaded: print.is_some(),
            launchd_pids: print.as_ref().and_then(|p| p.pid).into_iter().collect(),
            lock_holder,
            throttle_pending: print.as_ref().is_some_and(|p| p.spawn_pending),
        };
        let step = match ladder.next(&obs) {
            LadderAction::Wait(d) => {
                std::thread::sleep(d);
                Ok(())
            }
            LadderAction::Kickstart => lc.kickstart(&t, false),
            LadderAction::KickstartKill => lc.kickstart(&t, true),
            LadderAction::BootoutBootstrapFromHelper => lc.submit_helper(
                &launchd::helper_label(&t),
                &launchd::helper_script(&t, old_pid, spec.stop_timeout_s().saturating_add(30)),
            ),
            LadderAction::Succeeded { pid } => return Some(Ok(pid)),
            LadderAction::Failed { reason, recovery_command } => {
                return Some(Err(crate::Error::msg(format!("{reason}; recover with: {recovery_command}"))));
            }
        };
        if let Err(e) = step {
            // A failed command is an observation too: the next look decides what to do.
            eprintln!("launchctl: {e}");
        }
    }
}

super::definition_manager!(
    /// A LaunchAgent runs `gatewarden supervise`, which runs the gateway.
    Launchd
);

/// The facade's constructor: this OS's manager for `spec`, with what it says now.
pub fn definition(spec: ServiceSpec) -> super::Owner {
    let state = query(&spec);
    std::sync::Arc::new(Launchd(super::Managed { spec, state }))
}
