//! macOS: a LaunchAgent running `gatewarden supervise` (see `gatewarden_service::launchd` for
//! the KeepAlive policy). Type-checked on Linux; see `mod.rs` for the facade.

use std::path::PathBuf;
use std::time::Duration;

use crate::Context;
use gatewarden_lifecycle::fsio;
use gatewarden_service::command::{CommandRunner, SystemRunner};
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

/// launchd answers for this user's domain (`launchctl print` of the label: loaded or not).
pub fn check_manager(spec: &ServiceSpec) -> crate::Result<()> {
    user_scope_only(spec)?;
    let r = runner();
    Launchctl::new(&r).print(&target(spec)).context("launchd does not answer")?;
    Ok(())
}

/// The plist's bytes and whether its job is loaded.
pub fn save(spec: &ServiceSpec) -> crate::Result<super::Saved> {
    let t = target(spec);
    let path = PathBuf::from(&t.plist_path);
    let bytes = match fsio::read_capped(&path, 1 << 20) {
        fsio::ReadOutcome::Missing => None,
        fsio::ReadOutcome::Ok(b) => Some(b),
        fsio::ReadOutcome::Unreadable(why) | fsio::ReadOutcome::Transient(why) => {
            crate::bail!("cannot read the installed plist {}: {why}", path.display())
        }
    };
    let r = runner();
    let enabled = Launchctl::new(&r).print(&t)?.is_some();
    Ok(super::Saved { bytes, enabled })
}

/// Writes the plist and has `plutil -lint` accept it. Not loaded: launchd starts a job with
/// `KeepAlive`'s `SuccessfulExit` as it loads it, which is [`enable`]'s (after any gateway
/// outside launchd has stopped).
pub fn load(spec: &ServiceSpec) -> crate::Result<()> {
    let text = render(spec)?;
    // The plist names log files in <home>/logs; launchd will not create the directory.
    let logs = spec.home.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let path = PathBuf::from(target(spec).plist_path);
    write_plist(&path, Some(text.as_bytes()))?;
    let p = path.to_string_lossy().into_owned();
    let out = runner().run("plutil", &["-lint", &p])?;
    if !out.success() {
        crate::bail!("plutil refuses {p}: {}", out.stdout.trim());
    }
    Ok(())
}

/// Loads the job (`bootstrap`) unless it is loaded; loading starts it.
pub fn enable(spec: &ServiceSpec) -> crate::Result<()> {
    user_scope_only(spec)?;
    let t = target(spec);
    let r = runner();
    let lc = Launchctl::new(&r);
    if lc.print(&t)?.is_none() {
        lc.bootstrap(&t)?;
    }
    Ok(())
}

/// Unloads the job, puts back the saved plist (or none), and loads it again if it was loaded.
pub fn restore(spec: &ServiceSpec, saved: &super::Saved) -> crate::Result<()> {
    let t = target(spec);
    let r = runner();
    let lc = Launchctl::new(&r);
    if lc.print(&t)?.is_some() {
        lc.bootout(&t)?;
    }
    write_plist(std::path::Path::new(&t.plist_path), saved.bytes.as_deref())?;
    if saved.bytes.is_some() && saved.enabled {
        lc.bootstrap(&t)?;
    }
    Ok(())
}

/// Unloads the job and removes the plist.
pub fn remove(spec: &ServiceSpec) -> crate::Result<()> {
    let t = target(spec);
    let r = runner();
    let lc = Launchctl::new(&r);
    if lc.print(&t)?.is_some() {
        lc.bootout(&t)?;
    }
    write_plist(std::path::Path::new(&t.plist_path), None)
}

/// Writes the plist (`None`: removes it).
fn write_plist(path: &std::path::Path, bytes: Option<&[u8]>) -> crate::Result<()> {
    match bytes {
        Some(b) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            fsio::atomic_write(path, b).with_context(|| format!("cannot write {}", path.display()))
        }
        None => fsio::remove_if_exists(path).map(drop).with_context(|| format!("cannot remove {}", path.display())),
    }
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
    let t = target(spec);
    let bytes = std::fs::read(&t.plist_path).ok();
    let mut out = doctor::check_launchd_plist(bytes.as_deref(), &expected);
    if bytes.is_some() {
        let r = runner();
        let loaded = Launchctl::new(&r).print(&t).map(|p| p.is_some()).map_err(|e| e.to_string());
        out.extend(doctor::check_launchd_loaded(loaded.as_ref().map(|l| *l).map_err(String::as_str), &t.label));
    }
    out
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
            errln!("launchctl: {e}");
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
