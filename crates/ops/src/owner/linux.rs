//! Linux: systemd (user units, or system units with `--system`). See `mod.rs` for the facade.

use std::path::PathBuf;
use std::time::Duration;

use crate::Context;
use gatewarden_lifecycle::fsio;
use gatewarden_service::command::{CommandRunner, SystemRunner};
use gatewarden_service::doctor::{self, Finding};
use gatewarden_service::systemd::{self, Systemctl, parse_show};
use gatewarden_service::{Scope, ServiceSpec};
use serde_json::json;

use super::ServiceState;

pub const MANAGER: gatewarden_service::ManagerKind = gatewarden_service::ManagerKind::Systemd;

/// `$XDG_CONFIG_HOME`, else `~/.config`.
fn user_config_dir() -> String {
    std::env::var("XDG_CONFIG_HOME")
        .ok()
        .filter(|p| p.starts_with('/'))
        .or_else(|| std::env::var("HOME").ok().filter(|h| !h.is_empty()).map(|h| format!("{h}/.config")))
        .unwrap_or_else(|| "/root/.config".into())
}

fn unit(spec: &ServiceSpec) -> String {
    spec.names().systemd_unit()
}

/// A runner whose deadline covers a blocking `systemctl stop` of this spec.
fn runner(spec: &ServiceSpec) -> SystemRunner {
    SystemRunner { timeout: Duration::from_secs(spec.stop_timeout_s().saturating_add(30)) }
}

pub fn definition_path(spec: &ServiceSpec) -> Option<PathBuf> {
    Some(PathBuf::from(systemd::unit_path(spec.scope, &user_config_dir(), &unit(spec))))
}

pub fn render(spec: &ServiceSpec) -> crate::Result<String> {
    // systemd ≥ 254 grows the restart delay itself; older ones run the crash-backoff helper.
    let mut spec = spec.clone();
    spec.restart_steps = systemd_version().is_some_and(|v| v >= 254);
    Ok(systemd::render_unit(&spec)?)
}

/// The running systemd's version (`systemctl --version`: `systemd 252 (252.38-1~deb12u1)`).
fn systemd_version() -> Option<u32> {
    let out = SystemRunner { timeout: Duration::from_secs(5) }.run("systemctl", &["--version"]).ok()?;
    out.stdout.lines().next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The manager answers: `daemon-reload`, the call that fails first when the user manager or
/// its bus is gone ("Failed to connect to bus"). Nothing of this home's changes.
pub fn check_manager(spec: &ServiceSpec) -> crate::Result<()> {
    let r = runner(spec);
    Systemctl::new(&r, spec.scope).daemon_reload().context("the systemd manager does not answer")?;
    Ok(())
}

/// The unit file's bytes and whether it is enabled.
pub fn save(spec: &ServiceSpec) -> crate::Result<super::Saved> {
    let path = definition_path(spec).context("no unit path")?;
    let bytes = match fsio::read_capped(&path, 1 << 20) {
        fsio::ReadOutcome::Missing => None,
        fsio::ReadOutcome::Ok(b) => Some(b),
        fsio::ReadOutcome::Unreadable(why) | fsio::ReadOutcome::Transient(why) => {
            crate::bail!("cannot read the installed unit {}: {why}", path.display())
        }
    };
    let enabled = bytes.is_some() && {
        let r = runner(spec);
        matches!(Systemctl::new(&r, spec.scope).is_enabled(&unit(spec)), Ok(true))
    };
    Ok(super::Saved { bytes, enabled })
}

/// Writes this version's unit and has systemd load it (`daemon-reload`): accepted when it is
/// `loaded` (a unit systemd cannot use is `bad-setting` or `error`, with `LoadError`).
pub fn load(spec: &ServiceSpec) -> crate::Result<()> {
    let text = render(spec)?;
    write_unit(spec, Some(text.as_bytes()))?;
    let r = runner(spec);
    Systemctl::new(&r, spec.scope).daemon_reload()?;
    let map = show(spec, "LoadState,LoadError").context("systemctl show failed after daemon-reload")?;
    match map.get("LoadState").map(String::as_str) {
        Some("loaded") => Ok(()),
        other => crate::bail!(
            "systemd did not accept {}: LoadState={} {}",
            unit(spec),
            other.unwrap_or("?"),
            map.get("LoadError").map(String::as_str).unwrap_or_default()
        ),
    }
}

/// `enable`; a previous crash loop or failed state must not block the fresh definition.
pub fn enable(spec: &ServiceSpec) -> crate::Result<()> {
    let r = runner(spec);
    let sc = Systemctl::new(&r, spec.scope);
    let u = unit(spec);
    sc.enable(&u)?;
    let _ = sc.reset_failed(&u);
    Ok(())
}

/// Puts back the saved unit file (or none), reloads, and enables or disables it as it was.
pub fn restore(spec: &ServiceSpec, saved: &super::Saved) -> crate::Result<()> {
    let r = runner(spec);
    let sc = Systemctl::new(&r, spec.scope);
    let u = unit(spec);
    if saved.bytes.is_none() || !saved.enabled {
        // Before the file goes: `disable` needs the unit to name its symlinks.
        let _ = sc.disable(&u);
    }
    write_unit(spec, saved.bytes.as_deref())?;
    sc.daemon_reload()?;
    if saved.bytes.is_some() && saved.enabled {
        sc.enable(&u)?;
    }
    let _ = sc.reset_failed(&u);
    Ok(())
}

/// Disables and removes the unit (the caller stopped the gateway; a unit still activating is
/// stopped too), then reloads.
pub fn remove(spec: &ServiceSpec) -> crate::Result<()> {
    let r = runner(spec);
    let sc = Systemctl::new(&r, spec.scope);
    let u = unit(spec);
    // Best effort: the unit may be stopped, disabled or unknown already.
    let _ = sc.stop(&u);
    let _ = sc.disable(&u);
    write_unit(spec, None)?;
    if let Some(path) = definition_path(spec) {
        let dropins = PathBuf::from(format!("{}.d", path.display()));
        if dropins.is_dir() {
            errln!("note: drop-ins remain in {} (not written by gatewarden)", dropins.display());
        }
    }
    sc.daemon_reload()?;
    let _ = sc.reset_failed(&u);
    Ok(())
}

/// Writes the unit file (`None`: removes it).
fn write_unit(spec: &ServiceSpec, bytes: Option<&[u8]>) -> crate::Result<()> {
    let path = definition_path(spec).context("no unit path")?;
    match bytes {
        Some(b) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            fsio::atomic_write(&path, b).with_context(|| format!("cannot write {}", path.display()))
        }
        None => fsio::remove_if_exists(&path).map(drop).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// `systemctl show` of a few properties, as a map.
fn show(spec: &ServiceSpec, props: &str) -> Option<std::collections::BTreeMap<String, String>> {
    show_or_why(spec, props).ok()
}

/// [`show`], or what `systemctl` said when it failed (the manager does not answer).
fn show_or_why(spec: &ServiceSpec, props: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let u = unit(spec);
    let mut args = Vec::new();
    if spec.scope == Scope::User {
        args.push("--user");
    }
    args.extend(["show", "-p", props, u.as_str()]);
    let out = SystemRunner { timeout: Duration::from_secs(10) }.run("systemctl", &args).map_err(|e| e.to_string())?;
    if !out.success() {
        return Err(out.stderr.trim().to_owned());
    }
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())))
        .collect())
}

pub fn query(spec: &ServiceSpec) -> ServiceState {
    let path = definition_path(spec);
    let installed = path.as_ref().is_some_and(|p| p.exists());
    let mut st = ServiceState {
        manager: MANAGER,
        scope: Some(spec.scope),
        unit: unit(spec),
        installed,
        path,
        ..ServiceState::default()
    };
    if !installed {
        return st;
    }
    let props = format!("{},LoadState,RestartUSec", systemd::SHOW_PROPERTIES);
    let Some(map) = show(spec, &props) else {
        st.detail.insert("error".into(), json!("systemctl show failed (is the manager running?)"));
        return st;
    };
    let text: String = map.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let parsed = parse_show(&text);
    st.main_pid = parsed.main_pid;
    let active = map.get("ActiveState").map(String::as_str).unwrap_or("");
    // "auto-restart" sits in `activating`: the manager will bring it back by itself.
    st.active = matches!(active, "active" | "activating" | "reloading");
    for (k, key) in [
        ("ActiveState", "active_state"),
        ("SubState", "sub_state"),
        ("Result", "result"),
        ("LoadState", "load_state"),
        ("InvocationID", "invocation_id"),
    ] {
        if let Some(v) = map.get(k).filter(|v| !v.is_empty()) {
            st.detail.insert(key.into(), json!(v));
        }
    }
    if let Some(n) = parsed.n_restarts {
        st.detail.insert("n_restarts".into(), json!(n));
    }
    if let Some(c) = parsed.exec_main_status {
        st.detail.insert("exec_main_status".into(), json!(c));
    }
    if let Some(systemd::TimeSpan::Finite(d)) = map.get("RestartUSec").and_then(|v| systemd::parse_timespan(v)) {
        st.detail.insert("restart_sec_ms".into(), json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
    }
    st
}

pub fn stop(spec: &ServiceSpec) -> crate::Result<()> {
    let r = runner(spec);
    Ok(Systemctl::new(&r, spec.scope).stop(&unit(spec))?)
}

/// Starts the unit now, whatever its backoff or failed state. A `start` job waits for a pending
/// `RestartSec` timer (systemd queues it behind the auto-restart), so a unit in `auto-restart`
/// gets `restart` (which ends the wait at once); an inactive or failed one `reset-failed` +
/// `start`; one already starting or running is left alone (systemd is on it, and restarting
/// it would kill a newer incarnation).
pub fn kick(spec: &ServiceSpec) -> crate::Result<()> {
    let r = runner(spec);
    let sc = Systemctl::new(&r, spec.scope);
    let u = unit(spec);
    // A unit still deactivating (its `ExecStopPost=` running) is about to enter `auto-restart`;
    // a `start` issued now would queue behind the `RestartSec` timer, so wait for it (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let map = loop {
        let map = show(spec, "ActiveState,SubState").unwrap_or_default();
        if map.get("ActiveState").map(String::as_str) != Some("deactivating") || std::time::Instant::now() >= deadline {
            break map;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    let active = map.get("ActiveState").map(String::as_str).unwrap_or("");
    let sub = map.get("SubState").map(String::as_str).unwrap_or("");
    match (active, sub) {
        (_, "auto-restart") => Ok(sc.restart(&u)?),
        ("active" | "reloading", _) | ("activating", "start" | "start-pre" | "start-post") => Ok(()),
        _ => {
            let _ = sc.reset_failed(&u);
            Ok(sc.start(&u)?)
        }
    }
}

/// The installed unit (with drop-ins, as `systemctl cat` shows it) against this version's
/// rendering, plus a tripped start limit.
pub fn drift(spec: &ServiceSpec) -> Vec<Finding> {
    let expected = match render(spec) {
        Ok(t) => t,
        Err(e) => {
            return super::unrenderable("systemd unit", "unit", e);
        }
    };
    let Some(path) = definition_path(spec).filter(|p| p.exists()) else {
        return doctor::check_systemd_unit(None, &expected);
    };
    let u = unit(spec);
    let mut args = Vec::new();
    if spec.scope == Scope::User {
        args.push("--user");
    }
    args.extend(["cat", u.as_str()]);
    let cat = SystemRunner { timeout: Duration::from_secs(10) }
        .run("systemctl", &args)
        .ok()
        .filter(|o| o.success())
        .map(|o| o.stdout);
    let text = match cat {
        Some(t) => t,
        None => match std::fs::read(&path) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                return vec![Finding::new(
                    doctor::FindingId::DefinitionUnreadable,
                    doctor::Severity::Error,
                    path.display().to_string(),
                    format!("cannot read the installed unit: {e}"),
                    doctor::FixAction::RefreshDefinition { manager: doctor::Manager::Systemd },
                )];
            }
        },
    };
    let mut out = doctor::check_systemd_unit(Some(&text), &expected);
    let props = format!("{},LoadState,LoadError,NeedDaemonReload,UnitFileState", systemd::SHOW_PROPERTIES);
    match show_or_why(spec, &props) {
        Ok(map) => {
            let t: String = map.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            out.extend(doctor::check_systemd_load(Ok(&doctor::UnitLoad::parse(&t)), &u, spec.scope));
            out.extend(doctor::check_systemd_status(&parse_show(&t), &u, spec.scope));
        }
        Err(why) => out.extend(doctor::check_systemd_load(Err(&why), &u, spec.scope)),
    }
    out
}

/// Host-level findings: a user unit without lingering stops at logout.
pub fn host_findings(spec: &ServiceSpec) -> Vec<Finding> {
    if spec.scope != Scope::User {
        return Vec::new();
    }
    let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) else {
        return Vec::new();
    };
    let linger = SystemRunner { timeout: Duration::from_secs(5) }
        .run("loginctl", &["show-user", &user, "-p", "Linger", "--value"])
        .ok()
        .filter(|o| o.success())
        .and_then(|o| match o.stdout.trim() {
            "yes" => Some(true),
            "no" => Some(false),
            _ => None,
        });
    doctor::check_linger(&user, linger)
}

/// No asynchronous relaunch ladder here: restarts are verified by the caller's status loop
/// (and `kick`).
pub fn verify_restart(
    _spec: &ServiceSpec,
    _old: Option<(u32, String)>,
    _budget: std::time::Duration,
) -> Option<crate::Result<u32>> {
    None
}

/// A planned restart is not a crash: `reset-failed` zeroes the unit's start-rate counter, so
/// planned restarts never trip `StartLimitBurst`, which stays the crash-loop brake for real
/// crashes (each of those is counted as before). Best effort and bounded.
pub fn prepare_restart(spec: &ServiceSpec) {
    let r = SystemRunner { timeout: Duration::from_secs(5) };
    let _ = Systemctl::new(&r, spec.scope).reset_failed(&unit(spec));
}

/// The manager gave up on the unit: a tripped start limit, `failed`, or inactive while a
/// restart waits for it.
pub fn gave_up(spec: &ServiceSpec) -> bool {
    let fresh = query(spec);
    let get = |k: &str| fresh.detail.get(k).and_then(serde_json::Value::as_str).unwrap_or("").to_owned();
    get("result") == "start-limit-hit" || matches!(get("active_state").as_str(), "failed" | "inactive")
}

super::definition_manager!(
    /// A systemd unit (user or system) runs the gateway itself.
    Systemd
);

/// The facade's constructor: this OS's manager for `spec`, with what it says now.
pub fn definition(spec: ServiceSpec) -> super::Owner {
    let state = query(&spec);
    std::sync::Arc::new(Systemd(super::Managed { spec, state }))
}
