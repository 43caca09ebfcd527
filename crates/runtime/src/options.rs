//! How one incarnation is asked to run: the command line ([`RunOptions`]), merged with
//! config.toml ([`ResolvedOptions`]), and `[cluster]` with its secrets resolved
//! ([`ClusterSettings`]).

use std::sync::Arc;
use std::time::Duration;

use gatewarden_cluster::PgStore;
use gatewarden_config::ClusterConfig;
use gatewarden_lifecycle::{Home, Supervisor};

pub use gatewarden_control::runs::{RUN_TAG, run_tag};

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The home as resolved (not necessarily existing yet).
    pub home: Home,
    /// Overrides `listen` from config.toml.
    pub listen: Option<String>,
    pub replace: bool,
    /// How long `--replace` waits for the previous gateway before killing it.
    pub takeover_timeout: Duration,
    /// Overrides `drain_timeout_s` from config.toml.
    pub drain_timeout: Option<Duration>,
    pub supervisor: Option<Supervisor>,
    /// This process is the successor of a restarting gateway: wait for its lock (it is
    /// draining) instead of reporting "already running".
    pub successor: bool,
    /// A listening socket handed over by the predecessor (`spawn::adopt_listener`).
    pub inherit_listener: Option<String>,
    /// Print `ready <incarnation> <pid> <listen>` on stdout once running (for `start`).
    pub ready_stdout: bool,
    /// Where the logger writes, passed on to a successor.
    pub log_file: Option<std::path::PathBuf>,
    pub log_json: bool,
    /// The desired-state sequence this start carries out (`start`, a successor); `None` for a
    /// foreground `run` (the operator's own start) or a service manager's launch.
    pub desired_seq: Option<u64>,
    /// Only answer whether a gateway could start (`startable`'s dry run) and exit: a restart's
    /// preflight (restart.rs).
    pub preflight: bool,
}

impl RunOptions {
    /// A foreground `run` of `home` with every option at its default (tests, embedders).
    pub fn for_home(home: Home) -> RunOptions {
        RunOptions {
            home,
            listen: None,
            replace: false,
            takeover_timeout: Duration::from_secs(30),
            drain_timeout: None,
            supervisor: None,
            successor: false,
            inherit_listener: None,
            ready_stdout: false,
            log_file: None,
            log_json: false,
            desired_seq: None,
            preflight: false,
        }
    }
}

/// Options after config.toml and the command line are merged.
pub struct ResolvedOptions {
    pub listen: String,
    pub drain_timeout: Duration,
    /// `[cluster]`: compete for the lease; `None` = always active.
    pub cluster: Option<ClusterSettings>,
    /// The executable that successors and restart backstops run; `None`: this one
    /// (`gatewarden_lifecycle::platform::spawn::self_exe`). An in-process test points it at a harmless program.
    pub exe: Option<std::path::PathBuf>,
    /// A successor's listener, adopted while it prepared (startable.rs);
    /// taken once, when the gateway starts serving.
    pub adopted: std::sync::Mutex<Option<std::net::TcpListener>>,
    pub opts: RunOptions,
}

impl ResolvedOptions {
    /// The executable a successor or backstop runs.
    pub fn exe(&self) -> std::io::Result<std::path::PathBuf> {
        match &self.exe {
            Some(p) => Ok(p.clone()),
            None => gatewarden_lifecycle::platform::spawn::self_exe(),
        }
    }
}

impl std::ops::Deref for ResolvedOptions {
    type Target = RunOptions;
    fn deref(&self) -> &RunOptions {
        &self.opts
    }
}

/// `[cluster]` with its password resolved (at start, so a missing one is a config error).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub config: ClusterConfig,
    /// From crates/config/src/secrets.rs; its `Debug` is redacted.
    pub password: Option<gatewarden_config::Secret>,
    /// The cluster's journal; its writes take their epoch from the driver once started
    /// (cluster.rs).
    pub store: Option<Arc<PgStore>>,
}

impl ClusterSettings {
    pub fn new(config: ClusterConfig, password: Option<gatewarden_config::Secret>) -> Result<ClusterSettings, String> {
        let store = PgStore::start_journal(&config.store_url(), password.as_ref().map(|p| p.expose()), &config.name)
            .map_err(|e| format!("[cluster] store: {e}"))?;
        Ok(ClusterSettings { config, password, store: Some(Arc::new(store)) })
    }
}

/// This machine's name, for the cluster holder identities: `$GATEWARDEN_HOST`, else the
/// kernel's or `/etc/hostname`, else the environment (`COMPUTERNAME` on Windows).
pub fn host_name() -> String {
    let from_env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let from_file = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    from_env("GATEWARDEN_HOST")
        .or_else(|| from_file("/proc/sys/kernel/hostname"))
        .or_else(|| from_file("/etc/hostname"))
        .or_else(|| from_env("COMPUTERNAME"))
        .or_else(|| from_env("HOSTNAME"))
        .unwrap_or_else(|| "unknown".into())
}
