//! `gatewarden doctor [--fix] [--json]`: compares the installed service definition with what
//! this version renders (wrong binary, missing `RestartForceExitStatus=75`, a `TimeoutStopSec`
//! below the drain, an old KeepAlive policy, …), and checks stale files, the listen port, the
//! home's permissions, a parked supervisor, the config file and its secrets (each one a
//! gateway could not get, or that only an environment holds), a last start that was refused,
//! (user units) lingering, and what the running gateway's users see (from its status,
//! `health.rs`): failing connections (a refused certificate, named with its host), degraded or
//! parked platforms, failing or cooling-down providers, runs failing in a row, a journal or a
//! queue near its cap; and this machine's clock against an upstream's (`probe.rs`). Each
//! finding is printed with its fix; `--fix` applies the fixes it can, then checks again. Exit 0
//! when no error remains, 1 otherwise.

use std::process::{Command, ExitCode};

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::desired::{self, Starter};
use gatewarden_lifecycle::lock::{InstanceLock, LockProbe};
use gatewarden_lifecycle::marker::MarkerKind;
use gatewarden_service::Scope;
use gatewarden_service::doctor::{self, Finding, FindingId, FixAction, HomeFacts, PortFacts, Severity};
use gatewarden_service::supervise::read_parked_state;
use serde::Serialize;
use serde_json::json;

use crate::os;
use crate::owner::{self, Owner};
// A lock holder silent this long is wedged: the restart ladder's measure, doctor --fix's too.
use crate::ladder::machine::UNRESPONSIVE;

/// One finding as the CLI reports it: the service crate's findings plus the CLI's own
/// (stale files, config), with a printable fix.
#[derive(Debug, Clone, Serialize)]
struct Item {
    id: String,
    severity: Severity,
    subject: String,
    message: String,
    fix: Fix,
    #[serde(skip_serializing_if = "Option::is_none")]
    fixed: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Fix {
    None,
    /// Re-render and reinstall the service definition.
    Refresh {
        command: String,
    },
    /// Run a command.
    Run {
        argv: Vec<String>,
    },
    /// Remove stale runtime files under the lock.
    HealStale,
    /// A human has to act.
    Manual {
        hint: String,
    },
}

impl Fix {
    fn describe(&self) -> Option<String> {
        Some(match self {
            Fix::None => return None,
            Fix::Refresh { command } => format!("rewrite the definition: {command} (or doctor --fix)"),
            Fix::Run { argv } => format!("run: {}", argv.join(" ")),
            Fix::HealStale => "remove them (doctor --fix, or any status/stop/start does it)".into(),
            Fix::Manual { hint } => hint.clone(),
        })
    }
}

fn from_finding(f: Finding, refresh_cmd: &str) -> Item {
    let fix = match f.fix {
        // Installing is the operator's choice, never an automatic fix.
        _ if f.id == FindingId::NotInstalled => Fix::Manual { hint: format!("to run it as a service: {refresh_cmd}") },
        FixAction::None => Fix::None,
        FixAction::RefreshDefinition { .. } => Fix::Refresh { command: refresh_cmd.to_owned() },
        FixAction::Run { argv } => Fix::Run { argv },
        FixAction::Manual { hint } => Fix::Manual { hint },
    };
    Item {
        id: f.id.as_str().to_owned(),
        severity: f.severity,
        subject: f.subject,
        message: f.message,
        fix,
        fixed: None,
    }
}

/// The findings as the dashboard shows them: what `doctor` would print, without fixing.
pub fn findings(home: &Home) -> Vec<gatewarden_dashboard::snapshot::Finding> {
    // The pages ask every 30 s: no look over the network for them.
    check(&home.canonicalized(), false)
        .into_iter()
        .map(|i| gatewarden_dashboard::snapshot::Finding {
            severity: serde_json::to_value(i.severity)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            code: i.id,
            message: format!("{}: {}", i.subject, i.message),
        })
        .collect()
}

pub fn doctor(home: &Home, fix: bool, json_out: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    // What the operator wanted when doctor looked: a fix never acts across a newer request.
    let basis = desired::current(home.dir()).seq;
    let mut items = check(&home, true);
    if fix {
        apply(&home, &mut items, basis);
        // Report what is left after fixing, keeping the record of what was fixed.
        let fixed: Vec<Item> = items.iter().filter(|i| i.fixed == Some(true)).cloned().collect();
        let mut after = check(&home, true);
        for i in &mut after {
            i.fixed = Some(false);
        }
        items = fixed.into_iter().chain(after).collect();
    }
    let remaining_errors = items.iter().filter(|i| i.fixed != Some(true) && i.severity == Severity::Error).count();
    if json_out {
        let v = json!({"home": home.dir(), "ok": remaining_errors == 0, "findings": items});
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_human(&home, &items);
    }
    Ok(if remaining_errors == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn print_human(home: &Home, items: &[Item]) {
    use crate::ui::{Tone, paint};
    let open: Vec<&Item> = items.iter().filter(|i| i.fixed != Some(true)).collect();
    for i in items.iter().filter(|i| i.fixed == Some(true)) {
        outln!("{}[{}] {}: {}", paint(Tone::Good, "fixed"), i.id, i.subject, i.message);
    }
    if open.iter().all(|i| i.severity == Severity::Info) {
        outln!("doctor: no problems found in {}", home.dir().display());
    }
    for i in open {
        let sev = match i.severity {
            Severity::Info => paint(Tone::Dim, "info"),
            Severity::Warning => paint(Tone::Warn, "warning"),
            Severity::Error => paint(Tone::Bad, "error"),
        };
        outln!("{sev}[{}] {}: {}", i.id, i.subject, i.message);
        if let Some(f) = i.fix.describe() {
            outln!("    fix: {f}");
        }
    }
}

/// The installed definition (or the user-scope spec when nothing is installed).
fn managed(home: &Home) -> Option<Owner> {
    owner::installed(home).or_else(|| Some(owner::definition(owner::spec_for(home, Scope::User).ok()?)))
}

/// Every finding; `network`: also look at an upstream (the clock), at most [`crate::probe::TIMEOUT`].
fn check(home: &Home, network: bool) -> Vec<Item> {
    let mut out: Vec<Finding> = Vec::new();
    let mut extra: Vec<Item> = Vec::new();
    let m = managed(home);
    let refresh_cmd = {
        let system = m.as_ref().is_some_and(|m| m.managed().spec.scope == Scope::System);
        format!("gatewarden --home {} service install{}", home.dir().display(), if system { " --system" } else { "" })
    };
    if let Some(m) = &m {
        out.extend(m.drift());
        if m.managed().state.installed {
            out.extend(m.host_findings());
        }
    }
    // Config.
    let config = gatewarden_config::Config::load(home.dir());
    if let Err(e) = &config {
        extra.push(Item {
            id: "config-invalid".into(),
            severity: Severity::Error,
            subject: home.config_file().display().to_string(),
            message: format!(
                "the gateway would exit {} (fatal configuration): {e}",
                gatewarden_lifecycle::ExitIntent::FatalConfig.code()
            ),
            fix: Fix::Manual { hint: config_hint(e) },
            fixed: None,
        });
    }
    if let Ok(c) = &config {
        extra.extend(secret_items(home, c));
        if network {
            extra.extend(clock_items(c));
        }
    }
    if let Ok(c) = &config {
        extra.extend(access(home, c));
    }
    // Home.
    out.extend(doctor::check_home(&home.dir().to_string_lossy(), &home_facts(home)));
    // Lock, stale files and the port.
    let running = match InstanceLock::probe(&home.lock()) {
        LockProbe::Held => true,
        LockProbe::Free(_guard) => {
            let stale = stale_files(home);
            if !stale.is_empty() {
                extra.push(Item {
                    id: "stale-files".into(),
                    severity: Severity::Warning,
                    subject: home.dir().display().to_string(),
                    message: format!("no gateway holds the lock, but these runtime files remain: {}", stale.join(", ")),
                    fix: Fix::HealStale,
                    fixed: None,
                });
            }
            false
        }
        LockProbe::Missing => false,
        LockProbe::Error(why) => {
            extra.push(Item {
                id: "lock-unreadable".into(),
                severity: Severity::Error,
                subject: home.lock().display().to_string(),
                message: format!("the instance lock cannot be probed: {why}"),
                fix: Fix::Manual { hint: "check the home's ownership and permissions".into() },
                fixed: None,
            });
            false
        }
    };
    if running {
        extra.extend(supervision(home));
    } else if config.is_ok()
        && let Some(item) = last_start_refused(home)
    {
        extra.push(item);
    }
    if let Ok(cfg) = &config
        && !running
        && cfg.listen.port() != 0
    {
        let in_use = std::net::TcpListener::bind(cfg.listen).is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse);
        out.extend(doctor::check_port(&PortFacts { addr: cfg.listen.to_string(), in_use, held_by_own_gateway: false }));
    }
    // A crash loop, named whoever restarts it (the unit's growing delay keeps it trying).
    if let Some(c) = crate::crash_loop::crash_loop(home, running) {
        extra.push(Item {
            id: "crash-loop".into(),
            severity: if running { Severity::Warning } else { Severity::Error },
            subject: home.ledger().display().to_string(),
            message: format!("the gateway is crash-looping: {}", c.sentence()),
            fix: Fix::Manual {
                hint: format!("find the cause in `gatewarden --home {} logs` and `history`", home.dir().display()),
            },
            fixed: None,
        });
    }
    // A full disk (issue 30, item 3): nothing the lifecycle records can be counted on there.
    if let Some(f) = gatewarden_lifecycle::disk::full(home.dir()) {
        extra.push(Item {
            id: "disk-full".into(),
            severity: Severity::Error,
            subject: f.path.clone(),
            message: f.describe(),
            fix: Fix::Manual { hint: format!("free space on the filesystem holding {}", f.path) },
            fixed: None,
        });
    }
    // Parked supervisor.
    let exe = owner::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "gatewarden".into());
    out.extend(doctor::check_parked(&read_parked_state(home.dir()), &exe, &home.dir().to_string_lossy()));

    doctor::sort_findings(&mut out);
    let mut items: Vec<Item> = out.into_iter().map(|f| from_finding(f, &refresh_cmd)).collect();
    items.extend(extra);
    items.sort_by_key(|i| std::cmp::Reverse(i.severity));
    items
}

/// Who may reach the agent (README "Access"): anyone, through an `open` platform (a warning,
/// said plainly); the default where the file has no `access` key (the change an update made);
/// a pairing book that cannot be read.
fn access(home: &Home, c: &gatewarden_config::Config) -> Vec<Item> {
    use gatewarden_runtime::access;
    let subject = home.config_file().display().to_string();
    let mut out: Vec<Item> = access::said(c)
        .into_iter()
        .filter(|s| s.open || s.implicit)
        .map(|s| Item {
            id: if s.open { "access-open" } else { "access-default" }.into(),
            severity: if s.open { Severity::Warning } else { Severity::Info },
            subject: subject.clone(),
            message: s.text,
            fix: Fix::Manual {
                hint: match s.open {
                    true => {
                        format!("if that is not what you want: access = \"pairing\" in [[platform]] {}", s.platform)
                    }
                    false => {
                        format!("write `access = ...` in [[platform]] {} to choose (README, \"Access\")", s.platform)
                    }
                },
            },
            fixed: None,
        })
        .collect();
    if c.cluster.is_none()
        && let Err(e) = access::pairing::Keeper::load(home.dir())
    {
        out.push(Item {
            id: "pairing-book".into(),
            severity: Severity::Warning,
            subject: home.dir().join(access::pairing::FILE).display().to_string(),
            message: format!("the pairing book cannot be read ({e}): approved senders are treated as strangers"),
            fix: Fix::Manual { hint: "restore it from a backup, or remove it and approve the senders again".into() },
            fixed: None,
        });
    }
    out
}

/// Who supervises the running gateway and the evidence for it (what a planned restart will do),
/// and what its status says is failing ([`connection_findings`]); an error when it holds the
/// lock but does not answer.
fn supervision(home: &Home) -> Vec<Item> {
    let t = std::time::Duration::from_millis(500);
    let subject = home.dir().display().to_string();
    match gatewarden_control::Client::connect(&Endpoint::for_home(home.dir()), t).and_then(|mut c| c.status(t)) {
        Ok(s) => {
            let evidence = s.extra.get("supervisor_evidence").and_then(|v| v.as_str()).unwrap_or("not reported");
            let mut items = connection_findings(&s.extra);
            items.extend(user_findings(home, &s));
            items.push(Item {
                id: "supervisor".into(),
                severity: Severity::Info,
                subject,
                message: format!(
                    "the running gateway (pid {}) is supervised by {}: {evidence}",
                    s.pid.map_or("?".into(), |p| p.to_string()),
                    s.supervisor.as_deref().unwrap_or("?")
                ),
                fix: Fix::None,
                fixed: None,
            });
            items
        }
        // A handover (a restart's successor holds the lock and binds its endpoint in a
        // moment) or a stop in progress is not a wedged gateway: whoever carries it out is
        // alive and finishes it.
        Err(e) => match desired::check(home.dir(), Starter::Repair { basis: desired::current(home.dir()).seq }) {
            Err(r) => vec![Item {
                id: "lifecycle-in-progress".into(),
                severity: Severity::Info,
                subject,
                message: format!("a gateway holds the lock but does not answer yet ({e}): {}", r.describe()),
                fix: Fix::None,
                fixed: None,
            }],
            Ok(_) => vec![unresponsive(home, subject, &e)],
        },
    }
}

/// Nothing runs, and the last gateway that tried to start here was refused (exit 78: a port
/// taken, a secret missing from its environment, …): what a restart whose next incarnation
/// failed leaves behind. A config that does not load is `config-invalid` instead.
fn last_start_refused(home: &Home) -> Option<Item> {
    let s = gatewarden_lifecycle::records::read_state(&home.state_file()).ok()?;
    let fatal = i32::from(gatewarden_lifecycle::ExitIntent::FatalConfig.code());
    if s.gateway_state != gatewarden_lifecycle::records::GatewayState::Stopped || s.exit_code != Some(fatal) {
        return None;
    }
    let dir = home.dir().display();
    Some(Item {
        id: "start-refused".into(),
        severity: Severity::Error,
        subject: dir.to_string(),
        message: format!(
            "no gateway runs: the last one to start here was refused (exit {fatal}): {}",
            s.exit_reason.as_deref().unwrap_or("no reason recorded")
        ),
        fix: Fix::Manual {
            hint: format!("fix that, then: gatewarden --home {dir} check && gatewarden --home {dir} start"),
        },
        fixed: None,
    })
}

/// The finding for a lock holder that does not answer and that nobody is handing over.
fn unresponsive(home: &Home, subject: String, e: &dyn std::fmt::Display) -> Item {
    Item {
        id: "gateway-unresponsive".into(),
        severity: Severity::Error,
        subject,
        message: format!("a gateway holds the lock but does not answer on its control endpoint: {e}"),
        fix: Fix::Run {
            argv: vec![
                owner::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "gatewarden".into()),
                "--home".into(),
                home.dir().display().to_string(),
                "restart".into(),
            ],
        },
        fixed: None,
    }
}

/// The running gateway's failing connections, from its status (crates/runtime gateway.rs
/// `status`): each `degraded` platform, and the agent's last failed run when a certificate
/// was refused. A refused certificate is named with its host (the reason says "TLS with
/// <host> failed: …") and its fix (crates/net `CertProblem`).
fn connection_findings(status: &std::collections::BTreeMap<String, serde_json::Value>) -> Vec<Item> {
    use gatewarden_net::CertProblem;
    let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_owned();
    let mut out = Vec::new();
    let platforms = status.get("platforms").and_then(|p| p.as_array()).map(Vec::as_slice).unwrap_or_default();
    for p in platforms.iter().filter(|p| p.get("state").and_then(|s| s.as_str()) == Some("degraded")) {
        let (reason, subject) = (text(p, "reason"), format!("platform {} ({})", text(p, "name"), text(p, "kind")));
        out.push(match CertProblem::find(&reason) {
            Some(problem) => Item {
                id: "tls-refused".into(),
                severity: Severity::Error,
                subject,
                message: format!("the certificate was refused, the adapter retries with backoff: {reason}"),
                fix: Fix::Manual { hint: problem.fix().into() },
                fixed: None,
            },
            None => Item {
                id: "platform-degraded".into(),
                severity: Severity::Warning,
                subject,
                message: format!("degraded, retrying with backoff: {reason}"),
                fix: Fix::Manual { hint: "find the cause in `gatewarden logs`".into() },
                fixed: None,
            },
        });
    }
    let agent = status.get("agent").cloned().unwrap_or_default();
    let failure = agent.get("last_failure").cloned().unwrap_or_default();
    let reason = text(&failure, "reason");
    if let Some(problem) = CertProblem::find(&reason) {
        // A past run: the upstream may have been fixed since, so a warning, not an error.
        out.push(Item {
            id: "tls-refused".into(),
            severity: Severity::Warning,
            subject: format!("agent ({})", text(&agent, "backend")),
            message: format!("the last failed run (at {}) was refused a certificate: {reason}", text(&failure, "at")),
            fix: Fix::Manual { hint: problem.fix().into() },
            fixed: None,
        });
    }
    out
}

/// What the running gateway's users see, from its status (`health.rs` reads it): a parked
/// platform, providers failing or cooling down, runs failing in a row, a journal or a queue
/// near its cap. (Degraded platforms and refused certificates: [`connection_findings`].)
fn user_findings(home: &Home, s: &gatewarden_control::StatusReport) -> Vec<Item> {
    use crate::health::{NEAR_CAP_PERCENT, RUNS_FAILING};
    let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_owned();
    let home_arg = format!("gatewarden --home {}", home.dir().display());
    let config = home.config_file().display().to_string();
    let item = |id: &str, severity, subject: String, message: String, hint: String| Item {
        id: id.into(),
        severity,
        subject,
        message,
        fix: Fix::Manual { hint },
        fixed: None,
    };
    let mut out = Vec::new();
    let platforms = s.extra.get("platforms").and_then(|p| p.as_array()).map(Vec::as_slice).unwrap_or_default();
    for p in platforms.iter().filter(|p| p.get("state").and_then(|s| s.as_str()) == Some("parked")) {
        out.push(item(
            "platform-parked",
            Severity::Error,
            format!("platform {} ({})", text(p, "name"), text(p, "kind")),
            format!("parked, not retried: {}", text(p, "reason")),
            format!(
                "fix what the reason names (a token: its line in {}; a setting: {config}), then `{home_arg} reload`",
                home.dir().join(gatewarden_config::secrets::SECRETS_FILE).display()
            ),
        ));
    }
    let providers = s.providers.as_deref().unwrap_or_default();
    let all_down = !providers.is_empty() && providers.iter().all(|p| p.state != "healthy");
    for p in providers.iter().filter(|p| p.state != "healthy") {
        let (id, what) = match p.state.as_str() {
            "cooling_down" => {
                let until = p.until.map(|u| format!(" until {u} (unix time)")).unwrap_or_default();
                ("provider-cooling-down", format!("skipped after failing calls in a row{until}"))
            }
            _ => ("provider-failing", "its last calls failed".to_owned()),
        };
        let why = p.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        out.push(item(
            id,
            if all_down { Severity::Error } else { Severity::Warning },
            format!("provider {}", p.name),
            format!("{what}{why}{}", if all_down { " (no provider is healthy: runs fail)" } else { "" }),
            format!(
                "check its base_url, model and key (`{home_arg} check`), and its status page; `{home_arg} logs` has each call"
            ),
        ));
    }
    let in_a_row = crate::health::failures_in_a_row(s);
    if in_a_row >= RUNS_FAILING {
        let agent = s.extra.get("agent").cloned().unwrap_or_default();
        let last = agent.get("last_failure").cloned().unwrap_or_default();
        out.push(item(
            "runs-failing",
            Severity::Error,
            format!("agent ({})", text(&agent, "backend")),
            format!("the last {in_a_row} runs failed; the last (at {}): {}", text(&last, "at"), text(&last, "reason")),
            format!("fix what the reason names ({config}, a key in secrets.env), then `{home_arg} reload`; `{home_arg} logs` has each run"),
        ));
    }
    let journal = s.extra.get("journal").cloned().unwrap_or_default();
    let n = |k: &str| journal.get(k).and_then(|v| v.as_u64());
    let near = |used: u64, cap: u64| cap > 0 && used.saturating_mul(100) >= cap.saturating_mul(NEAR_CAP_PERCENT);
    if let (Some(bytes), Some(max)) = (n("bytes"), n("max_bytes"))
        && near(bytes, max)
    {
        out.push(item(
            "journal-near-cap",
            Severity::Warning,
            home.dir().join("journal.sqlite3").display().to_string(),
            format!(
                "the journal holds {} MiB of its max_size_mb = {}: the oldest finished messages are deleted to stay below it, and what is queued or running is never deleted",
                bytes / (1024 * 1024),
                max / (1024 * 1024)
            ),
            format!("raise [journal] max_size_mb in {config} (then `{home_arg} reload`), or lower max_age_days"),
        ));
    }
    for (used, cap, key, scope) in [
        (n("queued"), n("max_queued"), "max_queued", "the gateway"),
        (n("busiest_chat_queued"), n("max_queued_per_chat"), "max_queued_per_chat", "one chat"),
    ] {
        if let (Some(used), Some(cap)) = (used, cap)
            && near(used, cap)
        {
            out.push(item(
                "queue-near-cap",
                if used >= cap { Severity::Error } else { Severity::Warning },
                format!("[journal] {key}"),
                format!("{scope} has {used} messages waiting of {key} = {cap}: past it new messages are refused (429, a chat notice)"),
                format!("find why runs are slow or stuck (`{home_arg} top`, `{home_arg} logs`), or raise {key} in {config}"),
            ));
        }
    }
    out
}

/// This machine's clock against the first upstream the configuration names (the provider,
/// else a Telegram platform's Bot API), from its answer's `Date`: `clock-skew` past
/// [`crate::probe::CLOCK_SKEW_MAX`]. Nothing when no upstream is named or it cannot be asked.
fn clock_items(config: &gatewarden_config::Config) -> Vec<Item> {
    use gatewarden_config::{BackendKind, platform::Telegram};
    let provider = (config.agent.backend == BackendKind::Openai)
        .then(|| config.agent.providers().into_iter().next())
        .flatten()
        .map(|p| (format!("{}/models", p.base_url.trim_end_matches('/')), p.ca_file, p.proxy));
    let telegram = || {
        config.platform.iter().find_map(|p| Some((p, p.own::<Telegram>()?))).map(|(p, tg)| {
            let base = tg.api_base.clone().unwrap_or_else(|| crate::probe::TELEGRAM_API.to_owned());
            (format!("{}/", base.trim_end_matches('/')), p.ca_file.clone(), tg.proxy.clone())
        })
    };
    let Some((url, ca_file, proxy)) = provider.or_else(telegram) else { return Vec::new() };
    let Ok(out) = gatewarden_net::Outbound::new(ca_file.as_deref(), proxy.as_deref()) else { return Vec::new() };
    let Ok(skew) = crate::probe::clock_skew(&url, &out) else { return Vec::new() };
    if skew.abs() < crate::probe::CLOCK_SKEW_MAX.as_secs_f64() {
        return Vec::new();
    }
    let host = gatewarden_net::url_host(&url).to_owned();
    vec![Item {
        id: "clock-skew".into(),
        severity: Severity::Error,
        subject: "this machine's clock".into(),
        message: format!(
            "it is {} {} {host}'s (its Date header): certificates may be refused as expired or not valid yet",
            human_secs(skew.abs()),
            if skew > 0.0 { "ahead of" } else { "behind" }
        ),
        fix: Fix::Manual {
            hint: "set the clock from the network: `timedatectl set-ntp true` (systemd), or your OS's time settings; `date -u` shows it".into(),
        },
        fixed: None,
    }]
}

fn human_secs(s: f64) -> String {
    let s = s as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

fn home_facts(home: &Home) -> HomeFacts {
    let Ok(meta) = std::fs::metadata(home.dir()) else {
        return HomeFacts::default();
    };
    let writable = meta.is_dir() && {
        let probe = home.dir().join(format!(".doctor-probe-{}", std::process::id()));
        let ok = std::fs::write(&probe, b"").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    };
    HomeFacts {
        exists: true,
        is_dir: meta.is_dir(),
        writable,
        mode: os::proc::mode(&meta),
        foreign_owner: os::proc::foreign_owner(&meta),
    }
}

/// Runtime files that are stale when the lock is free.
fn stale_files(home: &Home) -> Vec<String> {
    let mut v = Vec::new();
    for (p, name) in [
        (home.pid_file(), "gateway.pid"),
        (home.marker(MarkerKind::PlannedStop), MarkerKind::PlannedStop.file_name()),
        (home.marker(MarkerKind::Takeover), MarkerKind::Takeover.file_name()),
    ] {
        if p.exists() {
            v.push(name.to_owned());
        }
    }
    if let Endpoint::Socket(s) = Endpoint::for_home(home.dir())
        && s.exists()
    {
        v.push(s.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "control.sock".into()));
    }
    v
}

fn apply(home: &Home, items: &mut [Item], basis: u64) {
    let mut refreshed: Option<bool> = None;
    for i in items.iter_mut() {
        if i.id == "gateway-unresponsive" {
            // Silent for as long as `restart` calls a holder wedged, not for one slow answer on
            // a loaded machine, and looked at again right before acting: it may have answered
            // since (a handover that ended), or the operator asked for something since.
            let until = std::time::Instant::now() + UNRESPONSIVE;
            let still = loop {
                if !supervision(home).iter().any(|i| i.id == "gateway-unresponsive") {
                    break false;
                }
                if std::time::Instant::now() >= until {
                    break true;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            };
            if !still {
                continue;
            }
            if let Err(r) = crate::intent::may_start(home, "doctor", Starter::Repair { basis }) {
                errln!("doctor: not restarting the gateway: {}", r.describe());
                i.fixed = Some(false);
                continue;
            }
        }
        let ok = match &i.fix {
            Fix::None | Fix::Manual { .. } => continue,
            Fix::Refresh { .. } => *refreshed.get_or_insert_with(|| refresh(home)),
            Fix::HealStale => {
                matches!(crate::presence::presence(home, "doctor"), crate::presence::Presence::NotRunning { .. })
            }
            Fix::Run { argv } => {
                errln!("doctor: running {}", argv.join(" "));
                argv.split_first()
                    .is_some_and(|(p, rest)| Command::new(p).args(rest).status().is_ok_and(|s| s.success()))
            }
        };
        i.fixed = Some(ok);
    }
}

/// Rewrites the installed definition (without starting or restarting anything).
fn refresh(home: &Home) -> bool {
    let Some(m) = managed(home) else { return false };
    match m.load().and_then(|()| m.enable()) {
        Ok(()) => {
            errln!("doctor: rewrote {}", m.describe());
            true
        }
        Err(e) => {
            errln!("doctor: cannot rewrite {}: {}", m.describe(), e.chain());
            false
        }
    }
}

/// What to do about an invalid config: edit it, and for `api_token` how to make a good one.
/// Each secret a gateway could not get (an error: it would not start) or that only an
/// environment holds (a warning: a service or the dashboard's Start would not have it).
fn secret_items(home: &Home, config: &gatewarden_config::Config) -> Vec<Item> {
    use crate::secrets::Level;
    let env_file = home.dir().join(gatewarden_config::secrets::SECRETS_FILE);
    let hint = format!(
        "give it in {} (NAME=value lines, mode 0600) or name a file with its *_file key (README, \"Secrets\")",
        env_file.display()
    );
    crate::secrets::verdicts(home, config)
        .into_iter()
        .filter_map(|v| {
            let (id, severity) = match v.level {
                Level::Ok => return None,
                Level::Warn => ("secret-env-only", Severity::Warning),
                Level::Fail => ("secret-unavailable", Severity::Error),
            };
            Some(Item {
                id: id.into(),
                severity,
                subject: home.config_file().display().to_string(),
                message: v.detail,
                fix: Fix::Manual { hint: hint.clone() },
                fixed: None,
            })
        })
        .collect()
}

fn config_hint(e: &gatewarden_config::ConfigError) -> String {
    let edit = "edit config.toml (see crates/config/config.example.toml)";
    match e {
        gatewarden_config::ConfigError::InvalidValue { key, table: None, .. } if key == "api_token" => format!(
            "{edit}; make a token of at least {} bytes with `{}` and put it in the file api_token_file names (or api_token)",
            gatewarden_config::MIN_API_TOKEN_BYTES,
            gatewarden_config::MAKE_API_TOKEN
        ),
        _ => edit.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_connections_are_findings_and_healthy_ones_are_not() {
        let tls = "TLS with api.example:443 failed: certificate has expired";
        let status: std::collections::BTreeMap<String, serde_json::Value> = serde_json::from_value(json!({
            "platforms": [
                {"name": "tg", "kind": "telegram", "state": "degraded", "reason": tls},
                {"name": "mx", "kind": "matrix", "state": "degraded", "reason": "hs.example: connection refused"},
                {"name": "irc", "kind": "irc", "state": "connected", "reason": null},
            ],
            "agent": {"backend": "openai", "last_failure": {"at": "2026-12-01T00:00:00Z", "reason":
                "TLS with llm.example failed: certificate is not valid for this host name"}},
        }))
        .unwrap();
        let got: Vec<(String, Severity, String)> =
            connection_findings(&status).into_iter().map(|i| (i.id, i.severity, i.subject)).collect();
        assert_eq!(
            got,
            [
                ("tls-refused".into(), Severity::Error, "platform tg (telegram)".into()),
                ("platform-degraded".into(), Severity::Warning, "platform mx (matrix)".into()),
                ("tls-refused".into(), Severity::Warning, "agent (openai)".into()),
            ]
        );
        let quiet = json!({"agent": {"backend": "echo", "last_failure": {"reason": "exit 1"}}});
        assert!(connection_findings(&serde_json::from_value(quiet).unwrap()).is_empty());
    }
}
