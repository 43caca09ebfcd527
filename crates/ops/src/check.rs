//! `gatewarden check`: would this binary start in this home? `update` runs it from the staged
//! release against the live home before anything changes (the preflight), and an operator may
//! run it by hand. It never takes the instance lock and never writes. Its answer is the one a
//! gateway's own start and a restart's preflight use (crates/runtime/src/startable.rs: config,
//! the secrets it names, the agent, the chat adapters, the journal schema as a read-only
//! migration dry run, telemetry, the listen address), one finding per step; each secret is
//! named as the gateway would resolve it (crates/ops/src/secrets.rs); then the service
//! definition.

use std::process::ExitCode;

use gatewarden_lifecycle::Home;
use gatewarden_runtime::startable::{Overrides, Purpose, Step, startable};
use serde_json::{Value, json};

use crate::owner;

/// One finding: a name, whether it passes (`None`: not checked), whether a pass warns, and
/// what was seen.
struct Finding {
    name: &'static str,
    ok: Option<bool>,
    detail: String,
    warning: bool,
}

impl Finding {
    fn pass(name: &'static str, detail: String) -> Finding {
        Finding { name, ok: Some(true), detail, warning: false }
    }

    fn fail(name: &'static str, detail: String) -> Finding {
        Finding { name, ok: Some(false), detail, warning: false }
    }
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
    let ok = findings.iter().all(|f| f.ok != Some(false));
    if json_out {
        outln!("{}", document(&findings));
    } else {
        outln!("gatewarden {} against {}", gatewarden_lifecycle::VERSION, home.dir().display());
        print_lines(&findings);
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// What `check` found for this executable in `home` (`init` runs it on what it wrote).
pub struct Report(Vec<Finding>);

impl Report {
    pub fn ok(&self) -> bool {
        self.0.iter().all(|f| f.ok != Some(false))
    }

    /// `check --json`'s document.
    pub fn to_json(&self) -> Value {
        document(&self.0)
    }

    /// `check`'s lines.
    pub fn print(&self) {
        print_lines(&self.0);
    }
}

pub fn report(home: &Home) -> crate::Result<Report> {
    let home = home.canonicalized();
    Ok(Report(run_checks(&home, &owner::current_exe()?)))
}

fn document(findings: &[Finding]) -> Value {
    let list: Vec<Value> = findings
        .iter()
        .map(|f| json!({"check": f.name, "ok": f.ok, "warning": f.warning, "detail": f.detail}))
        .collect();
    json!({"ok": findings.iter().all(|f| f.ok != Some(false)), "version": gatewarden_lifecycle::VERSION, "checks": list})
}

fn print_lines(findings: &[Finding]) {
    use crate::ui::{Tone, paint};
    for f in findings {
        let verdict = match (f.ok, f.warning) {
            (Some(false), _) => paint(Tone::Bad, "FAIL"),
            (Some(true), true) => paint(Tone::Warn, "warn"),
            (Some(true), false) => paint(Tone::Good, "ok  "),
            (None, _) => paint(Tone::Dim, "-   "),
        };
        outln!("  {verdict} {:<9} {}", f.name, f.detail);
    }
}

/// The one answer to "could a gateway start here now" (its `check` purpose: nothing written),
/// one finding per step. Secrets are told one by one, as the gateway would find each (a secret
/// missing here that the running gateway or the installed unit has passes with a warning: a
/// start where they run finds it), so a refusal at the secrets step is theirs to judge.
fn run_checks(home: &Home, target: &std::path::Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let (passed, failed) = match startable(home, &Overrides::default(), &Purpose::Check) {
        Ok(s) => (s.found, None),
        Err(e) => (e.passed, Some((e.step, e.reason))),
    };
    let config = gatewarden_config::Config::load(home.dir()).ok();
    for (step, detail) in passed {
        match (step, &config) {
            (Step::Secrets, Some(c)) => out.extend(secret_findings(home, c)),
            _ => out.push(Finding::pass(step.as_str(), detail)),
        }
    }
    if let Some((step, reason)) = failed {
        match (step, &config) {
            (Step::Secrets, Some(c)) => out.extend(secret_findings(home, c)),
            _ => out.push(Finding::fail(step.as_str(), reason)),
        }
        for later in Step::ALL.iter().skip_while(|s| **s != step).skip(1) {
            let detail = format!("not checked ({} failed here)", step.as_str());
            out.push(Finding { name: later.as_str(), ok: None, detail, warning: false });
        }
    }
    if let Some(c) = &config {
        out.extend(access_finding(home, c));
    }
    out.push(service_finding(home, target));
    out
}

/// One finding per secret: missing or unreadable ones fail, named with how to give them; one
/// that only an environment holds passes with a warning.
fn secret_findings(home: &Home, config: &gatewarden_config::Config) -> Vec<Finding> {
    use crate::secrets::Level;
    let found = crate::secrets::verdicts(home, config);
    if found.is_empty() {
        let file = home.config_file();
        let name = file.file_name().map_or("config.toml".into(), |n| n.to_string_lossy());
        return vec![Finding::pass("secrets", format!("none named in {name}"))];
    }
    found
        .into_iter()
        .map(|v| Finding {
            name: "secrets",
            ok: Some(v.level != Level::Fail),
            detail: v.detail,
            warning: v.level == Level::Warn,
        })
        .collect()
}

/// Who may reach the agent through each platform, named (README "Access"): a warning where
/// anyone can, where no `access` key leaves the default (the change an update made: `update`
/// repeats check's warnings after its preflight), or where the pairing book cannot be read
/// (the gateway starts, deciding without it).
fn access_finding(home: &Home, c: &gatewarden_config::Config) -> Option<Finding> {
    use gatewarden_runtime::access;
    let said = access::said(c);
    let book = match c.cluster {
        Some(_) => Ok(()),
        None => access::pairing::Keeper::load(home.dir()).map(drop),
    };
    if said.is_empty() && book.is_ok() {
        return None;
    }
    let mut detail: Vec<String> = said.iter().map(|s| s.text.clone()).collect();
    if let Err(e) = &book {
        detail.push(format!("the pairing book cannot be read ({e}): approved senders are strangers until it is fixed"));
    }
    let warning = book.is_err() || said.iter().any(|s| s.open || s.implicit);
    Some(Finding { name: "access", ok: Some(true), detail: detail.join("; "), warning })
}

/// An installed definition must run the executable an update swaps.
fn service_finding(home: &Home, target: &std::path::Path) -> Finding {
    let Some(m) = owner::installed(home) else {
        return Finding::pass("service", "none installed".into());
    };
    let exe = target.display().to_string();
    let text = m.managed().state.path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    match text {
        Some(t) if t.contains(&exe) => Finding::pass("service", format!("{} runs {exe}", m.describe())),
        Some(_) => Finding::fail(
            "service",
            format!("{} does not run {exe}; reinstall it with `gatewarden service install`", m.describe()),
        ),
        None => Finding::pass("service", format!("{} (definition not readable here)", m.describe())),
    }
}
