//! The verbs for a hermes-agent home (`--hermes-home DIR`, `GATEWARDEN_HERMES_HOME`, or a
//! `--home` whose lock record says `"kind": "hermes-gateway"`): one function per verb over
//! `gatewarden_hermes`, with the native verbs' exit codes (status 0/3/4; 1 for a failed
//! action). hermes's own files are never deleted or rewritten here; our records live in
//! `<home>/gatewarden/` (crates/hermes/README.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Context;
use crate::bail;
use gatewarden_hermes::doctor::{self, Context as DoctorContext};
use gatewarden_hermes::launch::{self, Launch};
use gatewarden_hermes::restart::{self, RestartOptions};
use gatewarden_hermes::start::{self, Mode, StartError};
use gatewarden_hermes::status as hstatus;
use gatewarden_hermes::stop::{self, StopError, StopOptions, StopOutcome};
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_hermes::unit::{self, UnitOptions};
use gatewarden_hermes::{HermesHome, history, ledger};
use gatewarden_service::command::SystemRunner;
use gatewarden_service::supervise::SupervisePolicy;
use gatewarden_service::systemd::{self, Systemctl};
use gatewarden_service::{ManagerKind, Scope};
use serde_json::json;

use crate::options::{ServiceAction, ServiceArgs, SuperviseArgs};
use crate::os;

/// A native verb's flag given for a hermes home: refused, naming the flag.
pub fn refuse_native(verb: &str, given: &[(&str, bool)]) -> crate::Result<()> {
    match given.iter().find(|(_, set)| *set) {
        Some((flag, _)) => bail!("{flag} applies to native homes, not to `{verb}` of a hermes home"),
        None => Ok(()),
    }
}

/// Every verb but the fleet page first: a hermes home that is a link, or writable by group or
/// others, is refused as a native home is (docs/security.md), before anything is read from it
/// or run for it.
/// A home that does not exist yet is each verb's to report.
pub fn check_home(home: &HermesHome) -> crate::Result<()> {
    match home.check() {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(crate::Error::msg(e.to_string())),
        _ => Ok(()),
    }
}

/// The hermes executable: `--hermes`, else `GATEWARDEN_HERMES`, else `hermes` on `PATH`.
fn hermes_exe(flag: Option<PathBuf>) -> PathBuf {
    start::default_hermes(flag, |k| std::env::var_os(k))
}

/// `hermes_exe` as an absolute path (for a unit file), looked up on `PATH` when bare.
fn hermes_exe_absolute(flag: Option<PathBuf>) -> crate::Result<PathBuf> {
    let exe = hermes_exe(flag);
    if exe.is_absolute() {
        return Ok(exe);
    }
    if exe.components().count() > 1 {
        return Ok(std::env::current_dir()?.join(exe));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(&exe))
        .find(|p| p.is_file())
        .with_context(|| format!("{} is not on PATH: pass --hermes /path/to/venv/bin/hermes", exe.display()))
}

pub fn status(home: &HermesHome, as_json: bool) -> crate::Result<ExitCode> {
    let s = hstatus::status(home);
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        out!("{}", hstatus::render_text(&s));
    }
    Ok(ExitCode::from(u8::try_from(s.exit_code()).unwrap_or(4)))
}

fn stop_options(timeout_s: u64, no_kill: bool) -> StopOptions {
    StopOptions { timeout: Duration::from_secs(timeout_s), kill: !no_kill, ..StopOptions::default() }
}

pub fn stop(home: &HermesHome, timeout_s: u64, no_kill: bool) -> crate::Result<ExitCode> {
    // hermes's own unit (Restart=always) revives any exit 5 s later; say how to stop it for good.
    if let Some(u) = hstatus::status(home).supervisor.as_deref().and_then(|s| s.strip_prefix("systemd:"))
        && u.starts_with("hermes-gateway")
    {
        errln!("note: hermes's own unit {u} runs this gateway and restarts it 5 s after any exit;");
        errln!("      to keep it down: systemctl [--user] stop {u} (or adopt it: gatewarden service install --adopt)");
    }
    match stop::stop(home, &stop_options(timeout_s, no_kill)) {
        Ok(StopOutcome::NotRunning) => {
            outln!("no hermes gateway running in {}", home.display());
            Ok(ExitCode::SUCCESS)
        }
        Ok(StopOutcome::Stopped(r)) => {
            let recorded = r.gateway_state_after.as_deref().unwrap_or("nothing");
            let how = serde_json::to_value(r.path).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            outln!("stopped hermes pid {} ({how}, {} ms); hermes recorded: {recorded}", r.pid, r.elapsed_ms);
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ StopError::Unidentified(_)) => {
            errln!("cannot tell whether a hermes gateway runs: {e}");
            Ok(ExitCode::from(4))
        }
        Err(e @ StopError::StillRunning { killed: false, .. }) => {
            errln!("{e}; not killing it (--no-kill)");
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            errln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}

/// What `start` and `restart` run: `GATEWARDEN_HERMES`, else what ran last (hermes's record),
/// else `hermes` on `PATH` ([`launch::resolve`]).
fn explicit_hermes() -> Option<PathBuf> {
    start::explicit_hermes(None, |k| std::env::var_os(k))
}

pub fn start(home: &HermesHome, timeout_s: u64) -> crate::Result<ExitCode> {
    let launch = match launch::resolve(home, explicit_hermes(), None) {
        Ok(l) => l,
        Err(why) => {
            errln!("cannot start hermes: {why}");
            return Ok(ExitCode::from(1));
        }
    };
    match start::start(home, start::command_for(home, &launch, Mode::Detached), Duration::from_secs(timeout_s)) {
        Ok(s) => {
            outln!("hermes gateway {} ready in {} ms", s.identity, s.elapsed.as_millis());
            Ok(ExitCode::SUCCESS)
        }
        Err(StartError::AlreadyRunning(id)) => {
            outln!("already running: hermes {id}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            errln!("{e}");
            errln!("hermes's output: {}", home.stdio_log().display());
            Ok(ExitCode::from(1))
        }
    }
}

pub fn restart(home: &HermesHome, timeout_s: u64) -> crate::Result<ExitCode> {
    let opts = RestartOptions { ready_timeout: Duration::from_secs(timeout_s), ..RestartOptions::default() };
    match restart::restart(home, &opts, explicit_hermes(), |l| start::command_for(home, l, Mode::Detached)) {
        Ok(r) => {
            let old = r.old.map_or("nothing running".into(), |o| format!("pid {}", o.pid));
            let path =
                serde_json::to_value(r.path).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            outln!("restarted: {old} -> hermes {} ready ({path}, {} ms)", r.new, r.elapsed_ms);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            errln!("restart failed: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn log(msg: &str) {
    errln!("gatewarden supervise[{}]: {msg}", std::process::id());
}

pub fn supervise(home: &HermesHome, args: SuperviseArgs) -> crate::Result<ExitCode> {
    refuse_native(
        "supervise",
        &[("--listen", args.listen.is_some()), ("--drain-timeout", args.drain_timeout.is_some()), ("--scm", args.scm)],
    )?;
    let hermes = hermes_exe(args.hermes.clone());
    // A new supervisor is a new decision: an old park no longer applies.
    let _ = home.open_ours().and_then(|d| d.remove(gatewarden_hermes::home::PARKED_STATE));
    // SIGTERM / SIGINT / SIGHUP (a service manager's stop) become the loop's stop flag.
    let flag = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<os::Event>();
    os::proc::forward_stop_events(tx)?;
    let setter = Arc::clone(&flag);
    std::thread::spawn(move || {
        while let Ok(ev) = rx.recv() {
            if let os::Event::Stop { what, .. } = ev {
                log(&format!("{what}: stopping hermes (planned-stop marker first)"));
                setter.store(true, Ordering::SeqCst);
            }
        }
    });
    let notifier = gatewarden_lifecycle::sdnotify::Notifier::for_supervisor(
        gatewarden_lifecycle::Supervisor::detect(None).supervisor,
    );
    let cmd_home = home.clone();
    let sup = Supervise {
        home: home.clone(),
        command: Box::new(move || {
            start::command_for(&cmd_home, &Launch::hermes(&hermes, launch::Source::Explicit), Mode::Supervised)
        }),
        policy: SupervisePolicy {
            initial_backoff: Duration::from_millis(args.backoff_ms),
            brake_window: Duration::from_secs(args.brake_window_s),
            brake_max_restarts: args.brake_restarts,
            ..SupervisePolicy::default()
        },
        stop: StopOptions::default(),
    };
    let end = sup.run(&flag, |ev| match ev {
        Event::Spawned { pid } => {
            log(&format!("started hermes pid {pid}"));
            notifier.status(&format!("hermes pid {pid} starting")).unwrap_or_else(|e| log(&e));
        }
        Event::Ready { pid, .. } => {
            log(&format!("hermes pid {pid} is running"));
            notifier.send(&format!("READY=1\nSTATUS=hermes pid {pid} running")).unwrap_or_else(|e| log(&e));
        }
        Event::Exited { pid, facts, action } => {
            let action = serde_json::to_string(action).unwrap_or_default();
            log(&format!("hermes pid {pid} exited ({}): {action}", facts.exit));
        }
    });
    match end {
        Ok(End::StayedDown) => {
            notifier.send("STOPPING=1").unwrap_or_else(|e| log(&e));
            log("hermes stopped: staying down");
            Ok(ExitCode::SUCCESS)
        }
        // Exit 0 like the native supervisor: an outer manager must not loop on a park.
        Ok(End::Parked { reason, .. }) => {
            log(&format!("parked: {reason}"));
            log(&format!("after fixing the cause: gatewarden --hermes-home {} start", home.dir().display()));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            log(&format!("{e}"));
            Ok(ExitCode::from(1))
        }
    }
}

pub fn logs(home: &HermesHome, follow: bool, n: usize) -> crate::Result<ExitCode> {
    let open = || home.open_read(gatewarden_hermes::home::GATEWAY_LOG);
    crate::tail::tail(
        &home.gateway_log(),
        open,
        follow,
        n,
        "hermes has not written its gateway log yet",
        crate::tail::Shape::Text,
    )
}

pub fn history(home: &HermesHome, n: usize, as_json: bool) -> crate::Result<ExitCode> {
    let entries = history::history(home, n);
    if as_json {
        for e in &entries {
            outln!("{}", serde_json::to_string(e)?);
        }
    } else if entries.is_empty() {
        outln!("no history yet in {}", home.display());
    } else {
        out!("{}", history::render_text(&entries));
    }
    Ok(ExitCode::SUCCESS)
}

/// A doctor finding as printed: the library's findings plus unit drift (ours, installed,
/// against this version's rendering).
#[derive(serde::Serialize)]
struct Item {
    code: String,
    message: String,
    fix: String,
    fixed: bool,
}

pub fn doctor(home: &HermesHome, fix: bool, as_json: bool) -> crate::Result<ExitCode> {
    let mut items: Vec<Item> = doctor::doctor(home, &DoctorContext::discover(home))
        .into_iter()
        .map(|f| Item {
            code: serde_json::to_value(f.code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            message: f.message,
            fix: f.fix,
            fixed: false,
        })
        .collect();
    if let Some((path, scope)) = installed_unit(home) {
        let expected = unit::render(&unit_options(home, scope, None)?);
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        if actual != expected {
            let mut item = Item {
                code: "unit-drift".into(),
                message: format!("{} differs from what this version renders", path.display()),
                fix: "gatewarden doctor --fix rewrites it (applies at the next restart)".into(),
                fixed: false,
            };
            if fix {
                write_unit(&path, &expected, scope)?;
                ledger::record(home, "doctor.fix", json!({"code": "unit-drift", "unit": path}));
                item.fixed = true;
            }
            items.push(item);
        }
    }
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&json!({"home": home.display(), "findings": items}))?);
    } else if items.is_empty() {
        outln!("no findings for the hermes home {}", home.display());
    } else {
        for i in &items {
            outln!("{}: {}", i.code, i.message);
            outln!("  {}: {}", if i.fixed { "fixed" } else { "fix" }, i.fix);
        }
    }
    Ok(if items.iter().all(|i| i.fixed) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

// ---- service: systemd units running `gatewarden --hermes-home DIR supervise` ----

fn scope_of(system: bool) -> (Scope, unit::Scope) {
    if system { (Scope::System, unit::Scope::System) } else { (Scope::User, unit::Scope::User) }
}

fn service_scope(s: unit::Scope) -> Scope {
    match s {
        unit::Scope::User => Scope::User,
        unit::Scope::System => Scope::System,
    }
}

fn unit_path(home: &HermesHome, scope: unit::Scope) -> crate::Result<PathBuf> {
    let name = unit::unit_name(home);
    match scope {
        unit::Scope::User => unit::user_unit_dir()
            .map(|d| d.join(&name))
            .context("neither XDG_CONFIG_HOME nor HOME is set: no user unit directory"),
        unit::Scope::System => Ok(PathBuf::from(systemd::unit_path(Scope::System, "", &name))),
    }
}

/// Our installed unit for `home`: the user's first, then the system's.
fn installed_unit(home: &HermesHome) -> Option<(PathBuf, unit::Scope)> {
    [unit::Scope::User, unit::Scope::System]
        .into_iter()
        .filter_map(|s| unit_path(home, s).ok().map(|p| (p, s)))
        .find(|(p, _)| p.exists())
}

fn unit_options(home: &HermesHome, scope: unit::Scope, hermes: Option<PathBuf>) -> crate::Result<UnitOptions> {
    let canon = std::fs::canonicalize(home.dir()).unwrap_or_else(|_| home.dir().to_path_buf());
    let dir = if canon.is_absolute() { canon } else { std::env::current_dir()?.join(canon) };
    let me = gatewarden_hermes::sys::effective_uid();
    let owner = home.owner().with_context(|| format!("cannot use {} as a hermes home", home.dir().display()))?;
    let run_as = unit::run_as_for(scope, owner, me).map_err(crate::Error::msg)?;
    Ok(UnitOptions {
        home: HermesHome::at(dir),
        gatewarden: crate::owner::current_exe()?,
        hermes: hermes_exe_absolute(hermes)?,
        scope,
        drain_timeout_s: 0,
        run_as,
    })
}

fn runner() -> SystemRunner {
    // Covers a blocking `systemctl stop` (TimeoutStopSec is the drain budget plus 30 s).
    SystemRunner { timeout: Duration::from_secs(90) }
}

fn write_unit(path: &Path, text: &str, scope: unit::Scope) -> crate::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    gatewarden_lifecycle::fsio::atomic_write(path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    let r = runner();
    Systemctl::new(&r, service_scope(scope)).daemon_reload()?;
    Ok(())
}

pub fn service(home: &HermesHome, args: ServiceArgs) -> crate::Result<ExitCode> {
    if crate::owner::NATIVE_MANAGER != ManagerKind::Systemd {
        bail!(
            "service units for hermes homes are systemd units; on this OS run `gatewarden --hermes-home DIR supervise` under your manager"
        );
    }
    match args.action {
        ServiceAction::Install(a) => {
            refuse_native(
                "service install",
                &[
                    ("--run-as", a.run_as.is_some()),
                    ("--restart-sec-ms", a.restart_sec_ms.is_some()),
                    ("--watchdog-s", a.watchdog_s.is_some()),
                    ("--start-limit-burst", a.start_limit_burst.is_some()),
                ],
            )?;
            service_install(home, a.system, a.print, a.no_start, a.adopt, a.hermes)
        }
        ServiceAction::Uninstall(a) => service_uninstall(home, a.system),
        ServiceAction::Status { json } => service_status(home, json),
    }
}

fn service_install(
    home: &HermesHome,
    system: bool,
    print: bool,
    no_start: bool,
    adopt: bool,
    hermes: Option<PathBuf>,
) -> crate::Result<ExitCode> {
    let (scope, uscope) = scope_of(system);
    let opts = unit_options(home, uscope, hermes)?;
    if print {
        out!("{}", unit::render_print(&opts));
        return Ok(ExitCode::SUCCESS);
    }
    // Two managers must never own one gateway: hermes's own unit revives what we stop.
    let enabled: Vec<_> = unit::find_hermes_units(home).into_iter().filter(|u| u.enabled).collect();
    if !enabled.is_empty() && !adopt {
        let names: Vec<&str> = enabled.iter().map(|u| u.name.as_str()).collect();
        errln!(
            "hermes's own unit {} is enabled for this home: two managers must never own one gateway",
            names.join(", ")
        );
        errln!("rerun with --adopt to stop and disable it (a planned stop) and install gatewarden's unit instead");
        return Ok(ExitCode::from(1));
    }
    for u in &enabled {
        adopt_from(home, u)?;
    }
    let path = unit_path(home, uscope)?;
    write_unit(&path, &unit::render(&opts), uscope)?;
    let name = unit::unit_name(home);
    let r = runner();
    let sc = Systemctl::new(&r, scope);
    sc.enable(&name)?;
    let _ = sc.reset_failed(&name);
    ledger::record(home, "service.install", json!({"unit": name, "path": path}));
    outln!("installed {name} ({})", path.display());
    if no_start {
        return Ok(ExitCode::SUCCESS);
    }
    // A gateway running outside the unit would make its supervisor park "owned by pid N".
    if let Some(id) = hstatus::status(home).identity() {
        errln!("a hermes gateway ({id}) runs outside the unit; stopping it (planned) so the unit can own it");
        stop::stop_identity(home, id, &StopOptions::default())?;
    }
    sc.start(&name)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut ready = None;
    stop::wait_until(deadline, || {
        ready = hstatus::status(home).identity().filter(|id| hstatus::is_ready(home, *id));
        ready.is_some()
    });
    match ready {
        Some(id) => {
            outln!("hermes gateway {id} ready under {name}");
            Ok(ExitCode::SUCCESS)
        }
        None => {
            errln!("the unit was started but hermes did not report running within 60 s");
            errln!("check: gatewarden --hermes-home {} service status; … logs", home.dir().display());
            Ok(ExitCode::from(1))
        }
    }
}

/// `--adopt`: hermes's unit is disabled, its gateway stopped the planned way (marker first),
/// and the unit stopped at once so its `Restart=always` (5 s later) does not revive it.
fn adopt_from(home: &HermesHome, u: &unit::HermesUnit) -> crate::Result<()> {
    let r = runner();
    let sc = Systemctl::new(&r, service_scope(u.scope));
    errln!("adopting: disabling hermes's unit {}", u.name);
    sc.disable(&u.name)?;
    match stop::stop(home, &StopOptions::default()) {
        Ok(_) => {}
        Err(e) => errln!("warning: stopping hermes's gateway: {e}"),
    }
    sc.stop(&u.name)?;
    let _ = sc.reset_failed(&u.name);
    ledger::record(home, "service.adopt", json!({"hermes_unit": u.name, "path": u.path}));
    Ok(())
}

fn service_uninstall(home: &HermesHome, system: bool) -> crate::Result<ExitCode> {
    let found = if system {
        Some((unit_path(home, unit::Scope::System)?, unit::Scope::System)).filter(|(p, _)| p.exists())
    } else {
        installed_unit(home)
    };
    let Some((path, uscope)) = found else {
        outln!("no gatewarden unit is installed for {}", home.display());
        return Ok(ExitCode::SUCCESS);
    };
    let name = unit::unit_name(home);
    let r = runner();
    let sc = Systemctl::new(&r, service_scope(uscope));
    // The unit's stop is SIGTERM to supervise, which stops hermes marker first (exit 0).
    if let Err(e) = sc.stop(&name) {
        errln!("warning: stopping {name}: {e}");
    }
    let _ = sc.disable(&name);
    gatewarden_lifecycle::fsio::remove_if_exists(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    sc.daemon_reload()?;
    let _ = sc.reset_failed(&name);
    ledger::record(home, "service.uninstall", json!({"unit": name}));
    outln!("uninstalled {name}");
    Ok(ExitCode::SUCCESS)
}

fn service_status(home: &HermesHome, as_json: bool) -> crate::Result<ExitCode> {
    let name = unit::unit_name(home);
    let found = installed_unit(home);
    let show = found.as_ref().and_then(|(_, s)| {
        let r = SystemRunner { timeout: Duration::from_secs(10) };
        Systemctl::new(&r, service_scope(*s)).show(&name).ok()
    });
    let active = show.as_ref().and_then(|s| s.active_state.clone()).is_some_and(|a| {
        matches!(a, systemd::ActiveState::Active | systemd::ActiveState::Activating | systemd::ActiveState::Reloading)
    });
    let hermes_units = unit::find_hermes_units(home);
    let code: u8 = match (found.is_some(), active) {
        (true, true) => 0,
        (true, false) => 3,
        _ => 4,
    };
    if as_json {
        let v = json!({
            "manager": "systemd",
            "unit": name,
            "home": home.display(),
            "installed": found.is_some(),
            "path": found.as_ref().map(|(p, _)| p),
            "scope": found.as_ref().map(|(_, s)| s),
            "active": active,
            "systemd": show,
            "hermes_units": hermes_units,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!("manager:    systemd");
        outln!("unit:       {name}");
        outln!("installed:  {}", if found.is_some() { "yes" } else { "no" });
        if let Some((p, _)) = &found {
            outln!("definition: {}", p.display());
            outln!("active:     {}", if active { "yes" } else { "no" });
            if let Some(s) = &show {
                outln!("main pid:   {}", s.main_pid.map_or("-".into(), |p| p.to_string()));
                outln!("sub state:  {}", s.sub_state.as_deref().unwrap_or("-"));
                outln!("restarts:   {}", s.n_restarts.map_or("-".into(), |n| n.to_string()));
            }
        } else {
            outln!("install it with: gatewarden --hermes-home {} service install", home.dir().display());
        }
        for u in &hermes_units {
            outln!(
                "hermes unit: {} ({}){}",
                u.name,
                u.path.display(),
                if u.enabled { ", ENABLED: two managers if ours is installed too" } else { ", not enabled" }
            );
        }
    }
    Ok(ExitCode::from(code))
}
