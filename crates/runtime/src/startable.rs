//! "Could a gateway start in this home now?": the one answer. `run` builds its gateway from it
//! ([`crate::prepare`]), a restart's successor and preflight prove with it that the next
//! incarnation can run before the running one stops serving (restart.rs), and `gatewarden
//! check` reports it (crates/ops/src/check.rs). Whatever a start needs (the config and the
//! secrets it names, the agent and the chat adapters through the load path a reload shares,
//! settings.rs; the cluster store, the journal, telemetry, the listener) is added here once, so
//! every one of them checks it.

use std::sync::Arc;

use gatewarden_journal::Store;
use gatewarden_lifecycle::lock::LockProbe;
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, InstanceLock};

use crate::options::ClusterSettings;
use crate::settings::{self, Settings};

/// What the answer is for; they differ only where a check must not act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    /// `run`: everything built for real. An inherited listener (a restart's successor,
    /// `--inherit-listener`) is adopted now, before the predecessor is told "prepared";
    /// otherwise the listener is bound later, with patience (lib.rs).
    Run,
    /// Writes nothing: the journal's migrations are a dry run, the cluster store is not
    /// contacted, and the listen address is probed: it must be free, or the one this home's
    /// gateway serves. A restart's preflight child, which has the next incarnation's exact
    /// arguments.
    Preflight,
    /// As `Preflight`, for `gatewarden check`, which does not know the arguments the gateway
    /// runs with: while one runs, the address it serves is the one its restart keeps.
    Check,
}

impl Purpose {
    fn dry(&self) -> bool {
        matches!(self, Purpose::Preflight | Purpose::Check)
    }
}

/// The steps, in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Config,
    Secrets,
    Agent,
    Platforms,
    Cluster,
    Journal,
    Telemetry,
    Listen,
}

impl Step {
    pub const ALL: [Step; 8] = [
        Step::Config,
        Step::Secrets,
        Step::Agent,
        Step::Platforms,
        Step::Cluster,
        Step::Journal,
        Step::Telemetry,
        Step::Listen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Config => "config",
            Step::Secrets => "secrets",
            Step::Agent => "agent",
            Step::Platforms => "platforms",
            Step::Cluster => "cluster",
            Step::Journal => "journal",
            Step::Telemetry => "telemetry",
            Step::Listen => "listen",
        }
    }
}

/// Why no gateway could start: the step and its error (a config error names file, line and
/// key; a secret names the variable or file), and what the steps before it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotStartable {
    pub step: Step,
    pub reason: String,
    pub passed: Vec<(Step, String)>,
}

impl std::fmt::Display for NotStartable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The command line's say in it (`run`'s options).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`, `--drain-timeout`: what the command line sets instead of the file.
    pub settings: settings::Overrides,
    /// `--inherit-listener`: a successor's (or the re-executed PID 1's) listening socket.
    pub inherit_listener: Option<String>,
    /// The incarnation the agent's processes are tagged with and keep their scratch files
    /// under (settings.rs); empty in a dry run, which runs nothing.
    pub incarnation: String,
}

/// A gateway's parts, each proven to load.
pub struct Startable {
    pub settings: Settings,
    pub cluster: Option<ClusterSettings>,
    /// The journal the gateway writes; `None` in a dry run.
    pub journal: Option<Arc<dyn Store>>,
    pub telemetry: Option<gatewarden_telemetry::Exporter>,
    /// The adopted listener (a successor's, or the re-executed PID 1's).
    pub listener: Option<std::net::TcpListener>,
    /// What each step found, in order (for `check`).
    pub found: Vec<(Step, String)>,
}

/// The one answer (module doc).
pub fn startable(home: &Home, o: &Overrides, purpose: &Purpose) -> Result<Startable, NotStartable> {
    let mut found = Vec::new();
    build(home, o, purpose, &mut found).map_err(|(step, reason)| NotStartable { step, reason, passed: found })
}

fn build(
    home: &Home,
    o: &Overrides,
    purpose: &Purpose,
    found: &mut Vec<(Step, String)>,
) -> Result<Startable, (Step, String)> {
    let fail = |step: Step| move |reason: String| (step, reason);
    // The config, the secrets it names, the agent and the chat adapters: the load path a start
    // shares with a reload (settings.rs).
    let settings = settings::load(home, &o.settings, &o.incarnation).map_err(|e| (load_step(&e), e.message))?;
    let config = &settings.config;
    found.push((Step::Config, format!("{} loads", home.config_file().display())));
    found.push((Step::Secrets, format!("{} named, each found", settings.secrets.entries().len())));
    found.push((Step::Agent, format!("backend {}", settings.agent.name())));
    found.push((Step::Platforms, format!("{} adapter(s)", config.platform.len())));

    let cluster = match &config.cluster {
        Some(c) => {
            let password = settings.secrets.get(&gatewarden_config::SecretId::Cluster).map_err(fail(Step::Cluster))?;
            let cluster = match purpose.dry() {
                true => ClusterSettings { config: c.clone(), password, store: None },
                false => ClusterSettings::new(c.clone(), password).map_err(fail(Step::Cluster))?,
            };
            found.push((Step::Cluster, format!("[cluster] {}", c.name)));
            Some(cluster)
        }
        None => None,
    };

    // With `[cluster]` the journal is the cluster's, in PostgreSQL (cluster.rs); else the home's.
    let journal: Option<Arc<dyn Store>> = match (cluster.as_ref().and_then(|c| c.store.clone()), purpose.dry()) {
        (Some(store), _) => {
            found.push((Step::Journal, "the cluster's (PostgreSQL)".into()));
            Some(store)
        }
        (None, true) if cluster.is_some() => {
            found.push((Step::Journal, "the cluster's (PostgreSQL), not contacted here".into()));
            None
        }
        (None, true) => {
            let v = gatewarden_journal::check_schema(home.dir()).map_err(|e| fail(Step::Journal)(e.to_string()))?;
            found.push((
                Step::Journal,
                match v {
                    0 => "none yet (created at first start)".into(),
                    v => format!("schema {v} opens with this build"),
                },
            ));
            None
        }
        (None, false) => {
            let j = gatewarden_journal::Journal::open_in(home.dir())
                .map_err(|e| fail(Step::Journal)(format!("cannot open the journal: {e}")))?;
            found.push((Step::Journal, format!("{} opened", j.path().display())));
            Some(Arc::new(j))
        }
    };

    let telemetry =
        gatewarden_telemetry::Exporter::start(&config.telemetry).map_err(|e| fail(Step::Telemetry)(e.to_string()))?;
    if telemetry.is_some() {
        found.push((Step::Telemetry, "OTLP export".into()));
    }

    let listen = config.listen.to_string();
    let listener = match (purpose, &o.inherit_listener) {
        (Purpose::Run, Some(v)) => {
            let l = gatewarden_lifecycle::platform::spawn::adopt_listener(v)
                .map_err(|e| fail(Step::Listen)(format!("cannot adopt the inherited listener {v}: {e}")))?;
            let at = l.local_addr().map_or(listen.clone(), |a| a.to_string());
            found.push((Step::Listen, format!("{at} inherited")));
            Some(l)
        }
        (Purpose::Run, None) => None,
        (dry, _) => {
            let any_served = *dry == Purpose::Check;
            found.push((Step::Listen, probe_listen(home, &listen, any_served).map_err(fail(Step::Listen))?));
            None
        }
    };
    let found = std::mem::take(found);
    Ok(Startable { settings, cluster, journal, telemetry, listener, found })
}

/// The step a load error belongs to: one located in the file (or about `listen`) is the
/// config's, a platform's is the adapters', and one that names no key is a secret's (the
/// resolver's, crates/config/src/secrets.rs).
fn load_step(e: &settings::LoadError) -> Step {
    match (e.line, e.key.as_deref()) {
        (None, None) => Step::Secrets,
        (_, Some("platform")) => Step::Platforms,
        _ => Step::Config,
    }
}

/// The address can be bound, or this home's running gateway serves it (it is handed over, or
/// freed by the drain, at a restart); with `any_served`, whatever address that is.
fn probe_listen(home: &Home, configured: &str, any_served: bool) -> Result<String, String> {
    let running = matches!(InstanceLock::probe(&home.lock()), LockProbe::Held);
    let live = running.then(|| read_state(&home.state_file()).ok().and_then(|s| s.listen)).flatten();
    if let Some(live) = live.filter(|l| any_served || l == configured) {
        return Ok(format!("{live}, served by the running gateway"));
    }
    match std::net::TcpListener::bind(configured) {
        Ok(_) => Ok(format!("{configured} is free")),
        Err(e) => Err(format!("cannot bind {configured}: {e}")),
    }
}
