//! `gatewarden check`: would this binary start in this home? `update` runs it from the staged
//! release against the live home before anything changes (the preflight), and an operator may
//! run it by hand. It never takes the instance lock and never writes: config, the journal
//! schema (a read-only migration dry run), the listen address, and the service definition.

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::records::read_state;
use serde_json::{Value, json};

use crate::owner;

/// One finding: a name, whether it passes, and what was seen.
struct Finding {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// `target`: the executable the service definition should run (`update` passes the path it
/// swaps; by default this executable).
pub fn check(home: &Home, target: Option<&std::path::Path>, json_out: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let target = match target {
        Some(t) => t.to_path_buf(),
        None => owner::current_exe()?,
    };
    let findings = run_checks(&home, &target);
    let ok = findings.iter().all(|f| f.ok);
    if json_out {
        let list: Vec<Value> =
            findings.iter().map(|f| json!({"check": f.name, "ok": f.ok, "detail": f.detail})).collect();
        println!("{}", json!({"ok": ok, "version": gatewarden_lifecycle::VERSION, "checks": list}));
    } else {
        println!("gatewarden {} against {}", gatewarden_lifecycle::VERSION, home.dir().display());
        for f in &findings {
            println!("  {} {:<8} {}", if f.ok { "ok  " } else { "FAIL" }, f.name, f.detail);
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn run_checks(home: &Home, target: &std::path::Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let config = gatewarden_config::Config::load(home.dir());
    out.push(match &config {
        Ok(c) => match c.check_exposure() {
            Ok(()) => Finding { name: "config", ok: true, detail: format!("{} parses", home.config_file().display()) },
            Err(e) => Finding { name: "config", ok: false, detail: e.to_string() },
        },
        Err(e) => Finding { name: "config", ok: false, detail: e.to_string() },
    });
    out.push(match gatewarden_journal::check_schema(home.dir()) {
        Ok(0) => Finding { name: "journal", ok: true, detail: "none yet (created at first start)".into() },
        Ok(v) => Finding { name: "journal", ok: true, detail: format!("schema {v} opens with this build") },
        Err(e) => Finding { name: "journal", ok: false, detail: e.to_string() },
    });
    if let Ok(c) = &config {
        out.push(listen_finding(home, &c.listen.to_string()));
    }
    out.push(service_finding(home, target));
    out
}

/// The address must be bindable, or be the one the live gateway serves (it is handed over, or
/// freed by the drain, at the restart).
fn listen_finding(home: &Home, configured: &str) -> Finding {
    let running = crate::ready::status_of(&Endpoint::for_home(home.dir()), Duration::from_millis(500)).ok();
    let live = running.as_ref().and_then(|s| s.listen.clone()).or_else(|| {
        // A gateway started with `--listen` keeps that address across restarts.
        running.as_ref().and(read_state(&home.state_file()).ok().and_then(|s| s.listen))
    });
    if let Some(live) = live {
        return Finding { name: "listen", ok: true, detail: format!("{live}, served by the running gateway") };
    }
    match std::net::TcpListener::bind(configured) {
        Ok(_) => Finding { name: "listen", ok: true, detail: format!("{configured} is free") },
        Err(e) => Finding { name: "listen", ok: false, detail: format!("cannot bind {configured}: {e}") },
    }
}

/// An installed definition must run the executable an update swaps.
fn service_finding(home: &Home, target: &std::path::Path) -> Finding {
    let Some(m) = owner::installed(home) else {
        return Finding { name: "service", ok: true, detail: "none installed".into() };
    };
    let exe = target.display().to_string();
    let text = m.managed().state.path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    match text {
        Some(t) if t.contains(&exe) => {
            Finding { name: "service", ok: true, detail: format!("{} runs {exe}", m.describe()) }
        }
        Some(_) => Finding {
            name: "service",
            ok: false,
            detail: format!("{} does not run {exe}; reinstall it with `gatewarden service install`", m.describe()),
        },
        None => {
            Finding { name: "service", ok: true, detail: format!("{} (definition not readable here)", m.describe()) }
        }
    }
}
