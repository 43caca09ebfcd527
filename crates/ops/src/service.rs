//! `gatewarden service install | uninstall | status`: this home's service definition with the
//! OS's manager (systemd unit, LaunchAgent, Scheduled Task or SCM service), rendered by
//! `gatewarden_service` and applied through the per-OS facade in `os/`.

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_lifecycle::Home;
use gatewarden_service::{Scope, ServiceSpec};
use serde_json::json;

use crate::options::{InstallArgs, ServiceAction, ServiceArgs, UninstallArgs};
use crate::owner;
use crate::presence::{Presence, presence};

pub fn service(home: &Home, args: ServiceArgs) -> crate::Result<ExitCode> {
    match args.action {
        ServiceAction::Install(a) => install(home, &a),
        ServiceAction::Uninstall(a) => uninstall(home, &a),
        ServiceAction::Status { json } => status(home, json),
    }
}

/// An absolute home path without creating anything (for `--print`).
fn absolute(home: &Home) -> Home {
    let h = home.canonicalized();
    if h.dir().is_absolute() {
        return h;
    }
    std::env::current_dir().map(|d| Home::at(d.join(h.dir()))).unwrap_or(h)
}

fn spec_with_overrides(home: &Home, a: &InstallArgs) -> crate::Result<ServiceSpec> {
    let scope = if a.system { Scope::System } else { Scope::User };
    let mut spec = owner::spec_for(home, scope)?;
    spec.run_as_user = a.run_as.clone();
    if a.restart_sec_ms.is_some() {
        spec.restart_sec_ms = a.restart_sec_ms;
    }
    if let Some(w) = a.watchdog_s {
        spec.watchdog_s = w;
    }
    if let Some(b) = a.start_limit_burst {
        spec.start_limit_burst = b;
    }
    Ok(spec)
}

fn install(home: &Home, a: &InstallArgs) -> crate::Result<ExitCode> {
    if a.print {
        let spec = spec_with_overrides(&absolute(home), a)?;
        print!("{}", owner::definition(spec).render()?);
        return Ok(ExitCode::SUCCESS);
    }
    let home = home.ensure()?;
    let spec = spec_with_overrides(&home, a)?;
    let gateway_pid = running_pid(&home);
    let m = owner::definition(spec);
    let before = &m.managed().state;
    let owned = before.installed && m.owns(gateway_pid);
    if gateway_pid.is_some() && !owned {
        eprintln!(
            "a gateway already runs in {} outside the service manager; stopping it so the {} manager can own it",
            home.dir().display(),
            before.manager
        );
        let code = crate::halt::stop(&home, 60, false)?;
        if code != ExitCode::SUCCESS {
            crate::bail!("could not stop the running gateway; not installing the service");
        }
    }
    let start_now = !a.no_start && !owned;
    // The copy `ExecStopPost=` runs to revert a release that cannot start (`update/mod.rs`).
    let exe = &m.managed().spec.exe;
    if let Err(e) = crate::release::refresh_good_copy(&home, exe) {
        eprintln!("warning: cannot keep a last known good copy of {}: {e}", exe.display());
    }
    m.install(start_now)?;
    let state = m.query();
    let where_ = state.path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default();
    println!("installed {}{where_}", m.describe());
    if owned {
        println!("the gateway keeps running; the new definition applies at its next restart (`gatewarden restart`)");
    } else if start_now {
        match crate::ready::wait_ready(&home, Duration::from_secs(30)) {
            Some(s) => println!(
                "gateway pid {} ready on http://{}",
                s.pid.map_or("?".into(), |p| p.to_string()),
                s.listen.unwrap_or_default()
            ),
            None => {
                eprintln!("the service was started but the gateway did not report ready within 30 s");
                eprintln!(
                    "check: gatewarden --home {} service status; gatewarden --home {0} logs",
                    home.dir().display()
                );
                return Ok(ExitCode::from(1));
            }
        }
    }
    for f in m.host_findings() {
        eprintln!("note: {}", f.message);
    }
    Ok(ExitCode::SUCCESS)
}

fn uninstall(home: &Home, a: &UninstallArgs) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let found = if a.system {
        owner::spec_for(&home, Scope::System).ok().map(owner::definition).filter(|m| m.managed().state.installed)
    } else {
        owner::installed(&home)
    };
    let Some(m) = found else {
        println!("no service is installed for {}", home.dir().display());
        return Ok(ExitCode::SUCCESS);
    };
    // Graceful first, through the owner (drains, exits 0, stays down).
    if m.managed().state.active || running_pid(&home).is_some() {
        let code = crate::halt::stop(&home, m.managed().spec.stop_timeout_s(), false)?;
        if code != ExitCode::SUCCESS {
            eprintln!("warning: the gateway did not stop cleanly; removing the service anyway");
        }
    }
    m.uninstall()?;
    println!("uninstalled {}", m.describe());
    Ok(ExitCode::SUCCESS)
}

fn status(home: &Home, as_json: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let m = match owner::installed(&home) {
        Some(m) => m,
        None => {
            let spec = owner::spec_for(&home, Scope::User)?;
            owner::definition(spec)
        }
    };
    let code = match (m.managed().state.installed, m.managed().state.active) {
        (true, true) => 0,
        (true, false) => 3,
        _ => 4,
    };
    if as_json {
        let mut v = m.managed().status_json();
        if let Some(o) = v.as_object_mut() {
            o.insert("path".into(), json!(m.managed().state.path));
            o.insert("home".into(), json!(home.dir()));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let st = &m.managed().state;
        println!("manager:    {}", st.manager);
        println!("unit:       {}", st.unit);
        println!("installed:  {}", if st.installed { "yes" } else { "no" });
        if let Some(p) = &st.path {
            println!("definition: {}", p.display());
        }
        if st.installed {
            println!("active:     {}", if st.active { "yes" } else { "no" });
            println!("main pid:   {}", st.main_pid.map_or("-".into(), |p| p.to_string()));
            for (k, v) in &st.detail {
                let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                println!("{:<11} {text}", format!("{}:", k.replace('_', " ")));
            }
        } else {
            println!("install it with: gatewarden --home {} service install", home.dir().display());
        }
    }
    Ok(ExitCode::from(code))
}

/// The running gateway's pid (the lock is held and the record names it), if any.
pub fn running_pid(home: &Home) -> Option<u32> {
    match presence(home, "service") {
        Presence::Running => gatewarden_lifecycle::records::read_pid_record(&home.pid_file()).ok().map(|r| r.pid),
        _ => None,
    }
}
