//! `gatewarden service install | uninstall | status`: this home's service definition with the
//! OS's manager (systemd unit, LaunchAgent, Scheduled Task or SCM service), rendered by
//! `gatewarden_service` and applied through the per-OS facade in `os/`.

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_lifecycle::Home;
use gatewarden_service::transaction::{self, Before, Step, Undo};
use gatewarden_service::{Scope, ServiceSpec};
use serde_json::json;

use crate::options::{InstallArgs, ServiceAction, ServiceArgs, UninstallArgs};
use crate::owner;
use crate::presence::{Presence, presence};

pub fn service(home: &Home, args: ServiceArgs) -> crate::Result<ExitCode> {
    match args.action {
        ServiceAction::Install(a) => crate::outcome::outcome(home, "service install", a.json, || install(home, &a)),
        ServiceAction::Uninstall(a) => {
            crate::outcome::outcome(home, "service uninstall", a.json, || uninstall(home, &a))
        }
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
    // Said on the command line, else the home's owner (spec_for; a system unit always names one).
    if a.run_as.is_some() {
        spec.run_as_user = a.run_as.clone();
    }
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

/// How long the managed gateway has to answer `running` after the manager started it.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a gateway handed over between owners has to stop.
const HAND_OVER_WITHIN_S: u64 = 60;

/// `service install` as one transaction (crates/service/src/transaction.rs): nothing is
/// stopped before the manager has answered and accepted the definition; the gateway that ran
/// outside the manager is handed over and the managed one must answer `running`; any failure
/// puts back what was there (the previous definition, the gateway outside the manager running
/// at its address) and exits 1 with the reason.
fn install(home: &Home, a: &InstallArgs) -> crate::Result<ExitCode> {
    if a.print {
        let spec = spec_with_overrides(&absolute(home), a)?;
        out!("{}", owner::definition(spec).render()?);
        return Ok(ExitCode::SUCCESS);
    }
    let home = home.ensure()?;
    // A service reads its home's config.toml (the unit carries no GATEWARDEN_CONFIG): installing
    // it while this shell names another file would run a configuration nobody looked at.
    let config = home.config_file();
    if config != home.dir().join(gatewarden_config::CONFIG_FILE) {
        crate::bail!(
            "--config / GATEWARDEN_CONFIG names {}, but a service reads {}: move the configuration there (or unset it) and install again",
            config.display(),
            home.dir().join(gatewarden_config::CONFIG_FILE).display()
        );
    }
    let spec = spec_with_overrides(&home, a)?;
    let gateway_pid = running_pid(&home);
    let m = owner::definition(spec);
    let state = &m.managed().state;
    let owned = state.installed && m.owns(gateway_pid);
    let before = Before {
        installed: state.installed,
        managed_running: owned,
        unmanaged_running: gateway_pid.is_some() && !owned,
    };
    let plan = transaction::install_plan(m.kind(), &before, !a.no_start);
    let mut t = match Txn::begin(&home, m, before, "install") {
        Ok(t) => t,
        Err(e) => return Ok(refuse(&home, "install", &e)),
    };
    if before.unmanaged_running && plan.contains(&Step::StopUnmanaged) {
        errln!(
            "a gateway already runs in {} outside the service manager; once {} accepts the definition it is handed over",
            home.dir().display(),
            t.m.kind()
        );
    }
    // The copy `ExecStopPost=` runs to revert a release that cannot start (`update/mod.rs`).
    let exe = &t.m.managed().spec.exe;
    if let Err(e) = crate::release::refresh_good_copy(&home, exe) {
        errln!("warning: cannot keep a last known good copy of {}: {e}", exe.display());
    }
    if let Some(code) = t.run(&plan) {
        return Ok(code);
    }
    let st = t.m.query();
    let where_ = st.path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default();
    outln!("installed {}{where_}", t.m.describe());
    if owned {
        outln!("the gateway keeps running; the new definition applies at its next restart (`gatewarden restart`)");
    } else if let Some(s) = &t.ready {
        outln!(
            "gateway pid {} ready on http://{}",
            s.pid.map_or("?".into(), |p| p.to_string()),
            s.listen.clone().unwrap_or_default()
        );
    }
    for f in t.m.host_findings() {
        errln!("note: {}", f.message);
    }
    Ok(ExitCode::SUCCESS)
}

/// `service uninstall` with the same care: the manager must answer before anything is stopped,
/// and a failure to remove the definition puts it back and starts the gateway it ran again.
fn uninstall(home: &Home, a: &UninstallArgs) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let found = if a.system {
        owner::spec_for(&home, Scope::System).ok().map(owner::definition).filter(|m| m.managed().state.installed)
    } else {
        owner::installed(&home)
    };
    let Some(m) = found else {
        outln!("no service is installed for {}", home.dir().display());
        return Ok(ExitCode::SUCCESS);
    };
    let managed_running = m.managed().state.active || running_pid(&home).is_some_and(|p| m.owns(Some(p)));
    let before = Before { installed: true, managed_running, unmanaged_running: false };
    let plan = transaction::uninstall_plan(&before);
    let mut t = match Txn::begin(&home, m, before, "uninstall") {
        Ok(t) => t,
        Err(e) => return Ok(refuse(&home, "uninstall", &e)),
    };
    if let Some(code) = t.run(&plan) {
        return Ok(code);
    }
    // Down for good now: nothing a restart left in flight starts it again (as `stop` does).
    let desired = crate::intent::record_stop(&home).inspect_err(|e| errln!("warning: {e}")).ok().flatten();
    if managed_running {
        crate::intent::ledger_stop_if_unrecorded(&home, desired.as_ref().map(|(d, _)| d));
    }
    outln!("uninstalled {}", t.m.describe());
    Ok(ExitCode::SUCCESS)
}

/// Refused before anything changed: the reason, in the ledger too; exit 1.
fn refuse(home: &Home, verb: &str, e: &crate::Error) -> ExitCode {
    errln!("service {verb} refused, nothing changed: {}", e.chain());
    ledger(home, json!({"verb": verb, "outcome": "refused", "step": "check_manager", "reason": e.chain()}));
    ExitCode::from(1)
}

fn ledger(home: &Home, fields: serde_json::Value) {
    let l = gatewarden_lifecycle::ledger::Ledger::new(home.ledger(), gatewarden_lifecycle::ledger::Writer::current());
    let _ = l.append("service_transaction", fields);
}

/// One `service install` or `uninstall` under way: the manager, what was there, and what the
/// steps so far produced.
struct Txn<'h> {
    home: &'h Home,
    m: owner::Owner,
    before: Before,
    verb: &'static str,
    /// The definition as it was (from before any step).
    saved: owner::Saved,
    /// Where the gateway outside the manager listened: it comes back there.
    unmanaged_listen: Option<String>,
    /// The managed gateway's report once it answered `running`.
    ready: Option<gatewarden_control::StatusReport>,
    /// Its pid before the hand-over (the managed one must be another process).
    unmanaged_pid: Option<u32>,
}

impl<'h> Txn<'h> {
    /// What is there: the manager must answer and say what is installed before anything
    /// changes.
    fn begin(home: &'h Home, m: owner::Owner, before: Before, verb: &'static str) -> crate::Result<Txn<'h>> {
        m.check_manager()?;
        let saved = m.save()?;
        let (unmanaged_pid, unmanaged_listen) = if before.unmanaged_running {
            let ep = gatewarden_control::Endpoint::for_home(home.dir());
            let s = crate::ready::status_of(&ep, Duration::from_secs(2)).ok();
            (running_pid(home), s.and_then(|s| s.listen))
        } else {
            (None, None)
        };
        Ok(Txn { home, m, before, verb, saved, unmanaged_listen, ready: None, unmanaged_pid })
    }

    /// Runs `plan`; on a failure, its undo. `None`: done; else the exit code.
    fn run(&mut self, plan: &[Step]) -> Option<ExitCode> {
        for (i, step) in plan.iter().enumerate() {
            if let Err(e) = self.forward(*step) {
                let why = e.chain();
                errln!("service {} failed ({}): {why}", self.verb, step_name(*step));
                let undo = transaction::undo(self.m.kind(), plan, i, &self.before);
                let mut not_undone = Vec::new();
                for u in &undo {
                    if let Err(e) = self.back(*u) {
                        errln!("could not undo ({}): {}", undo_name(*u), e.chain());
                        not_undone.push(format!("{}: {}", undo_name(*u), e.chain()));
                    }
                }
                let outcome = if not_undone.is_empty() { "rolled_back" } else { "rollback_incomplete" };
                ledger(
                    self.home,
                    json!({"verb": self.verb, "outcome": outcome, "step": step_name(*step), "reason": why,
                           "undone": undo.iter().map(|u| undo_name(*u)).collect::<Vec<_>>(), "not_undone": not_undone}),
                );
                if not_undone.is_empty() {
                    errln!("put back what was there before `service {}`; nothing else changed", self.verb);
                } else {
                    errln!(
                        "not everything could be put back; see `gatewarden --home {} doctor`",
                        self.home.dir().display()
                    );
                }
                return Some(ExitCode::from(1));
            }
        }
        ledger(self.home, json!({"verb": self.verb, "outcome": "done", "unit": self.m.managed().state.unit}));
        None
    }

    fn forward(&mut self, step: Step) -> crate::Result<()> {
        match step {
            Step::CheckManager => self.m.check_manager(),
            Step::Load => self.m.load(),
            Step::Enable => self.m.enable(),
            Step::StopUnmanaged => crate::halt::hand_over(self.home, None, HAND_OVER_WITHIN_S),
            Step::Start => {
                // The operator asks for it to run (a stop issued after this command wins).
                let seq = crate::intent::record_run(self.home, "service install")
                    .map_err(|r| crate::Error::msg(format!("not starting: {}", r.describe())))?;
                errln!("starting the gateway through {}…", self.m.describe());
                self.m.start(seq)
            }
            Step::VerifyReady => {
                let not = self.unmanaged_pid;
                let s = crate::ready::wait_ready_where(self.home, READY_WITHIN, |s| s.pid.is_some() && s.pid != not)
                    .ok_or_else(|| {
                        crate::Error::msg(format!(
                            "{} started, but no gateway answered `running` within {}s",
                            self.m.describe(),
                            READY_WITHIN.as_secs()
                        ))
                    })?;
                if !self.m.owns(s.pid) && !owner::installed(self.home).is_some_and(|m| m.owns(s.pid)) {
                    crate::bail!(
                        "the gateway that answers (pid {}) is not run by {}",
                        s.pid.map_or("?".into(), |p| p.to_string()),
                        self.m.describe()
                    );
                }
                self.ready = Some(s);
                Ok(())
            }
            Step::StopManaged => {
                crate::halt::hand_over(self.home, Some(self.m.as_ref()), self.m.managed().spec.stop_timeout_s())
            }
            Step::Remove => self.m.remove(),
        }
    }

    fn back(&mut self, u: Undo) -> crate::Result<()> {
        errln!("undoing: {}", undo_name(u));
        match u {
            Undo::StopManaged => {
                crate::halt::hand_over(self.home, Some(self.m.as_ref()), self.m.managed().spec.stop_timeout_s())
            }
            Undo::StartUnmanaged => {
                let code = crate::launch::launch(
                    self.home,
                    self.unmanaged_listen.as_deref(),
                    READY_WITHIN.as_secs(),
                    None,
                    None,
                    crate::launch::Report::Stderr,
                    crate::launch::Via::Direct,
                )?;
                if code != ExitCode::SUCCESS {
                    crate::bail!("the gateway that ran before did not start again");
                }
                Ok(())
            }
            Undo::RestoreDefinition => self.m.restore(&self.saved),
            Undo::StartManaged => {
                let seq = gatewarden_lifecycle::desired::current(self.home.dir()).seq;
                self.m.start(seq)?;
                crate::ready::wait_ready(self.home, READY_WITHIN)
                    .map(drop)
                    .ok_or_else(|| crate::Error::msg(format!("{} did not bring the gateway back", self.m.describe())))
            }
        }
    }
}

fn step_name(s: Step) -> &'static str {
    match s {
        Step::CheckManager => "check_manager",
        Step::Load => "load",
        Step::Enable => "enable",
        Step::StopUnmanaged => "stop_unmanaged",
        Step::Start => "start",
        Step::VerifyReady => "verify_ready",
        Step::StopManaged => "stop_managed",
        Step::Remove => "remove",
    }
}

fn undo_name(u: Undo) -> &'static str {
    match u {
        Undo::StopManaged => "stop the managed gateway",
        Undo::StartUnmanaged => "start the gateway that ran outside the manager",
        Undo::RestoreDefinition => "put back the previous definition",
        Undo::StartManaged => "start the managed gateway again",
    }
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
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let st = &m.managed().state;
        outln!("manager:    {}", st.manager);
        outln!("unit:       {}", st.unit);
        outln!("installed:  {}", if st.installed { "yes" } else { "no" });
        if let Some(p) = &st.path {
            outln!("definition: {}", p.display());
        }
        if st.installed {
            outln!("active:     {}", if st.active { "yes" } else { "no" });
            outln!("main pid:   {}", st.main_pid.map_or("-".into(), |p| p.to_string()));
            for (k, v) in &st.detail {
                let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                outln!("{:<11} {text}", format!("{}:", k.replace('_', " ")));
            }
        } else {
            outln!("install it with: gatewarden --home {} service install", home.dir().display());
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
