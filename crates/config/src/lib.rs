//! `<home>/config.toml`: the gateway's configuration.
//!
//! Every key is optional; a missing file means all defaults. The file is read once at start and
//! any problem is fatal (the caller exits 78, EX_CONFIG, the exit table's `FatalConfig`, so a
//! supervisor does not respawn a gateway that can never start). Errors name the file, the
//! 1-based line and the key, e.g.
//!
//! ```text
//! /home/a/.local/state/gatewarden/config.toml:7: unknown key 'delay' in [agent] (expected one of: backend, delay_ms, …)
//! /home/a/.local/state/gatewarden/config.toml:3: invalid value for 'drain_timeout_s': expected a non-negative integer, found string "30"
//! ```
//!
//! Loading is two passes over the same text: serde (with `deny_unknown_fields`) builds the typed
//! [`Config`], and toml's spanned document tree maps an error's byte span back to the key and
//! line it belongs to. Semantic checks (an `exec` backend needs a `command`, …) run afterwards
//! and use the same index for their line numbers. `crates/config/config.example.toml` documents
//! every key.

mod env;
pub use env::{ENV_PREFIX, key_paths, var_name};

use gatewarden_lifecycle::exit::ExitIntent;
use gatewarden_lifecycle::fsio::ReadOutcome;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

pub mod platform;
pub use platform::{Access, KindSettings, PlatformConfig, PlatformKind, PlatformSettings};

pub mod secrets;
pub use secrets::{Secret, SecretId, Secrets};

/// The configuration file's name inside the home.
pub const CONFIG_FILE: &str = "config.toml";

/// Upper bound for every `*_s` duration, so that no consumer can overflow `Instant + Duration`
/// on a hostile value (one week).
pub const MAX_SECONDS: u64 = 7 * 24 * 3600;

/// Upper bound for the millisecond knobs (one hour).
pub const MAX_MILLIS: u64 = 3600 * 1000;

const TOP_KEYS: &[&str] = &[
    "listen",
    "api_token",
    "api_token_env",
    "api_token_file",
    "admins",
    "drain_timeout_s",
    "log_level",
    "agent",
    "http",
    "journal",
    "platform",
    "cluster",
    "update",
    "telemetry",
    "attachments",
];
const HTTP_KEYS: &[&str] = &["allowed_hosts", "max_connections", "header_timeout_s", "body_timeout_s", "ui_show_text"];
const JOURNAL_KEYS: &[&str] = &["max_age_days", "max_size_mb", "max_queued_per_chat", "max_queued"];

/// Upper bound for `[http] max_connections` (each connection costs at least one descriptor).
pub const MAX_CONNECTIONS: usize = 1 << 20;
const AGENT_KEYS: &[&str] = &[
    "backend",
    "delay_ms",
    "command",
    "timeout_s",
    "kill_grace_ms",
    "base_url",
    "model",
    "api_key_env",
    "api_key_file",
    "history_turns",
    "history_chars",
    "ca_file",
    "provider",
    "retries",
    "backoff_ms",
    "cooldown_s",
    "attempt_timeout_s",
    "hermes_home",
    "hermes_program",
    "approval_timeout_s",
    "max_reply_bytes",
    "failure_text",
    "failure_reasons_for_admins",
    "transcription",
];
const CLUSTER_KEYS: &[&str] =
    &["name", "store", "password_env", "password_file", "lease_ttl_s", "renew_interval_s", "ca_file"];
const UPDATE_KEYS: &[&str] = &["public_key", "probation_s", "source", "ca_file"];
const ATTACHMENTS_KEYS: &[&str] = &["max_file_mb", "max_message_mb", "timeout_s", "stall_s", "allowed_types"];
const TELEMETRY_KEYS: &[&str] =
    &["otlp_endpoint", "ca_file", "proxy", "metrics_interval_s", "timeout_s", "queue", "service_name"];

/// Why the configuration cannot be used. Every variant maps to [`ExitIntent::FatalConfig`]'s exit
/// code (78, `EX_CONFIG` from sysexits.h; protocol.md §6.1).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not UTF-8 or not TOML.
    #[error("{}:{line}: {message}", path.display())]
    Syntax { path: PathBuf, line: usize, message: String },
    /// A key the gateway does not know (typos must not be silently ignored).
    #[error(
        "{}:{line}: unknown key '{key}'{} (expected one of: {expected}){}",
        path.display(),
        table.as_deref().map(|t| format!(" in [{t}]")).unwrap_or_default(),
        hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default()
    )]
    UnknownKey {
        path: PathBuf,
        line: usize,
        key: String,
        /// `None` for the top level, else the table's name (`agent`).
        table: Option<String>,
        expected: String,
        /// What was probably meant: `did you mean 'token_env'?`, or the platform kinds that
        /// take the key.
        hint: Option<Box<str>>,
    },
    /// A known key with a value of the wrong type or outside its allowed range.
    #[error(
        "{}:{line}: invalid value for '{key}'{}: {message}",
        path.display(),
        table.as_deref().map(|t| format!(" in [{t}]")).unwrap_or_default()
    )]
    InvalidValue { path: PathBuf, line: usize, key: String, table: Option<String>, message: String },
    /// A non-loopback `listen` address without an `api_token`: the API would be open to the
    /// network with no authentication.
    #[error(
        "listen address {listen} is not a loopback address and no api_token is set; set api_token_file (or api_token_env) in {CONFIG_FILE} or listen on 127.0.0.1"
    )]
    Exposed { listen: SocketAddr },
    /// A setting from the environment (`GATEWARDEN_…`, crates/config/src/env.rs) that cannot
    /// be used: named by its variable.
    #[error("{var} (environment): {message}")]
    Env { var: String, key: String, message: String },
}

impl ConfigError {
    /// The process exit code for this error: always the exit table's (crates/lifecycle/src/exit.rs)
    /// code for fatal configuration.
    pub fn exit_code(&self) -> i32 {
        i32::from(ExitIntent::FatalConfig.code())
    }

    /// The offending key, when the error is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. } | ConfigError::InvalidValue { key, .. } => Some(key),
            ConfigError::Exposed { .. } => Some("listen"),
            ConfigError::Env { key, .. } => Some(key),
            ConfigError::Read { .. } | ConfigError::Syntax { .. } => None,
        }
    }

    /// The table of the offending key (`agent`, `agent.provider`), when it has one.
    pub fn table(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { table, .. } | ConfigError::InvalidValue { table, .. } => table.as_deref(),
            _ => None,
        }
    }

    /// What is wrong, without the file and line.
    fn without_location(&self) -> String {
        let table = |t: &Option<String>| t.as_deref().map(|t| format!(" in [{t}]")).unwrap_or_default();
        match self {
            ConfigError::Syntax { message, .. } => message.clone(),
            ConfigError::UnknownKey { key, table: t, expected, hint, .. } => {
                let hint = hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default();
                format!("unknown key '{key}'{} (expected one of: {expected}){hint}", table(t))
            }
            ConfigError::InvalidValue { key, table: t, message, .. } => {
                format!("invalid value for '{key}'{}: {message}", table(t))
            }
            other => other.to_string(),
        }
    }

    /// The same error on another line of its file.
    fn at_line(self, at: usize) -> ConfigError {
        match self {
            ConfigError::Syntax { path, message, .. } => ConfigError::Syntax { path, line: at, message },
            ConfigError::UnknownKey { path, key, table, expected, hint, .. } => {
                ConfigError::UnknownKey { path, line: at, key, table, expected, hint }
            }
            ConfigError::InvalidValue { path, key, table, message, .. } => {
                ConfigError::InvalidValue { path, line: at, key, table, message }
            }
            other => other,
        }
    }

    /// The 1-based line in the file, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Syntax { line, .. }
            | ConfigError::UnknownKey { line, .. }
            | ConfigError::InvalidValue { line, .. } => Some(*line),
            ConfigError::Read { .. } | ConfigError::Exposed { .. } | ConfigError::Env { .. } => None,
        }
    }
}

/// The whole configuration file.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the HTTP API (default `127.0.0.1:7878`).
    #[serde(deserialize_with = "de_socket_addr")]
    pub listen: SocketAddr,
    /// Bearer token required by the HTTP API, written in the file; `None` = no authentication
    /// (loopback only) unless [`Config::api_token_env`] or [`Config::api_token_file`] names it
    /// (the one resolver, crates/config/src/secrets.rs, reads those; [`Config::has_api_token`]).
    pub api_token: Option<String>,
    /// The variable holding the token (`<home>/secrets.env`, then the environment).
    pub api_token_env: Option<String>,
    /// The file holding the token (relative to the home; a systemd credential under systemd).
    pub api_token_file: Option<PathBuf>,
    /// User ids allowed to run admin commands (`/restart`, `/stop`) from chat.
    pub admins: Vec<String>,
    /// How long a drain waits for active runs before they are interrupted.
    pub drain_timeout_s: u64,
    /// The least severe log line written (`info`, `warn`, `error`); a reload changes it live.
    pub log_level: LogLevel,
    /// The agent backend.
    pub agent: AgentConfig,
    /// The HTTP listener's limits and the `Host` names it answers to.
    pub http: HttpConfig,
    /// How long finished messages stay in the journal.
    pub journal: JournalConfig,
    /// `[[platform]]` tables: the chat platform adapters.
    pub platform: Vec<PlatformConfig>,
    /// Active/standby with other gateways through a shared store (`None` = standalone).
    pub cluster: Option<ClusterConfig>,
    /// `gatewarden update`: signature key and probation.
    pub update: UpdateConfig,
    /// `[telemetry]`: OpenTelemetry export of message traces and metrics (crates/telemetry).
    pub telemetry: TelemetryConfig,
    /// `[attachments]`: the bounds on the files messages carry (issue 29;
    /// crates/platforms/src/attachments.rs).
    pub attachments: AttachmentsConfig,
}

/// The `[attachments]` table: what a file a message carries may be, downloaded before the
/// message is journaled (crates/platforms/src/attachments.rs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttachmentsConfig {
    /// The largest file taken, in MiB.
    pub max_file_mb: u64,
    /// All the files of one message together, in MiB.
    pub max_message_mb: u64,
    /// One message's downloads end within this many seconds.
    pub timeout_s: u64,
    /// A download that sends nothing for this many seconds is abandoned.
    pub stall_s: u64,
    /// The content types taken, as prefixes (`image/`, `application/pdf`); empty: every type
    /// the gateway recognises by its content.
    pub allowed_types: Vec<String>,
}

impl Default for AttachmentsConfig {
    fn default() -> Self {
        AttachmentsConfig {
            max_file_mb: 20,
            max_message_mb: 50,
            timeout_s: 120,
            stall_s: 30,
            allowed_types: Vec::new(),
        }
    }
}

/// The `[telemetry]` table: where OTLP/HTTP traces and metrics go (none by default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://host:4318`); `/v1/traces` and `/v1/metrics`
    /// are appended. `None`: nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// A private CA (PEM) for an https endpoint (crates/net).
    pub ca_file: Option<PathBuf>,
    /// The collector's own proxy, instead of the environment's.
    pub proxy: Option<String>,
    /// How often the metrics behind `/metrics` are exported.
    pub metrics_interval_s: u64,
    /// Each export request gives up after this long.
    pub timeout_s: u64,
    /// Export batches waiting at most; past it new ones are dropped (and counted).
    pub queue: usize,
    /// `service.name` of the exported resource.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            ca_file: None,
            proxy: None,
            metrics_interval_s: 60,
            timeout_s: 10,
            queue: 256,
            service_name: "gatewarden".into(),
        }
    }
}

/// The `[http]` table: what the listener accepts (docs/security.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `Host` names (with or without a port) accepted besides the loopback names and the bound
    /// address; a request naming any other host is refused (421), which defeats DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Open connections at most; the effective cap is also bounded by the descriptor limit.
    pub max_connections: usize,
    /// A connection must deliver a complete request head within this long of connecting or of
    /// its previous response: bounds both a slow header and an idle keep-alive connection.
    pub header_timeout_s: u64,
    /// A request body must arrive completely within this long of its head.
    pub body_timeout_s: u64,
    /// Without an `api_token`, `/ui` is open to every local user: it shows message text
    /// (messages, replies, failure reasons, the log tail) only when this is true.
    pub ui_show_text: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_hosts: Vec::new(),
            max_connections: 512,
            header_timeout_s: 10,
            body_timeout_s: 30,
            ui_show_text: false,
        }
    }
}

impl HttpConfig {
    /// `header_timeout_s` as a duration.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_s)
    }

    /// `body_timeout_s` as a duration.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_s)
    }
}

/// The `[journal]` table: retention of finished messages (queued and running ones are never
/// pruned). `0` disables a bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// Finished messages older than this many days are deleted.
    pub max_age_days: u64,
    /// Oldest finished messages are deleted while the journal's data exceeds this many MiB.
    pub max_size_mb: u64,
    /// Queued messages one chat may have waiting; past it its new messages are refused (HTTP
    /// 429, a chat notice). Retention never deletes queued work, so this is what bounds it.
    pub max_queued_per_chat: u64,
    /// Queued messages in all chats together, refused the same way past it.
    pub max_queued: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig { max_age_days: 30, max_size_mb: 256, max_queued_per_chat: 500, max_queued: 5_000 }
    }
}

/// The shortest `api_token` accepted.
pub const MIN_API_TOKEN_BYTES: usize = 16;
/// How to make a good `api_token` (config errors and `doctor` say it).
pub const MAKE_API_TOKEN: &str = "openssl rand -hex 32";

/// What is wrong with a token a person chose (`api_token`, the fleet dashboard's
/// `GATEWARDEN_DASHBOARD_TOKEN`), or `None`: the one rule for both.
pub fn token_problem(token: &str) -> Option<String> {
    if token.trim().is_empty() {
        return Some("must not be empty".into());
    }
    // It travels in an HTTP header or a form, where only visible ASCII survives: any other
    // token could never authenticate.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("must be printable ASCII without spaces".into());
    }
    // A short token is guessable over loopback at HTTP speed.
    (token.len() < MIN_API_TOKEN_BYTES)
        .then(|| format!("must be at least {MIN_API_TOKEN_BYTES} bytes (make one with: {MAKE_API_TOKEN})"))
}

/// Bounds for the `[journal]` queue caps (0 disables a cap).
const MAX_QUEUED: u64 = 10_000_000;

impl JournalConfig {
    /// The age bound, `None` when disabled.
    pub fn max_age(&self) -> Option<Duration> {
        (self.max_age_days > 0).then(|| Duration::from_secs(self.max_age_days * 24 * 3600))
    }

    /// The size bound in bytes, `None` when disabled.
    pub fn max_bytes(&self) -> Option<u64> {
        (self.max_size_mb > 0).then(|| self.max_size_mb * 1024 * 1024)
    }

    /// Why a new message is refused when its chat has `chat` queued messages and all chats
    /// `all`: `None` takes it. A cap of 0 is no cap.
    pub fn queue_refusal(&self, chat: u64, all: u64) -> Option<String> {
        let over = |n: u64, cap: u64| cap > 0 && n >= cap;
        if over(chat, self.max_queued_per_chat) {
            return Some(format!(
                "this chat has {chat} messages waiting (max_queued_per_chat = {}); send it again once they are answered",
                self.max_queued_per_chat
            ));
        }
        over(all, self.max_queued).then(|| {
            format!(
                "the gateway has {all} messages waiting (max_queued = {}); send it again in a while",
                self.max_queued
            )
        })
    }
}

/// `[update]`: how `gatewarden update` verifies and probes a new release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateConfig {
    /// A minisign public key (base64, the second line of a `.pub` file). When set, every
    /// release needs a detached signature made with it.
    pub public_key: Option<String>,
    /// How long the new incarnation must stay up after it is ready before it is blessed.
    pub probation_s: u64,
    /// What chat `/update` installs: a path, or a URL (which then needs `public_key`).
    pub source: Option<String>,
    /// A private CA (PEM) for https update URLs (crates/net).
    pub ca_file: Option<PathBuf>,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig { public_key: None, probation_s: 10, source: None, ca_file: None }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            api_token: None,
            api_token_env: None,
            api_token_file: None,
            admins: Vec::new(),
            drain_timeout_s: 30,
            log_level: LogLevel::Info,
            agent: AgentConfig::default(),
            http: HttpConfig::default(),
            journal: JournalConfig::default(),
            platform: Vec::new(),
            cluster: None,
            update: UpdateConfig::default(),
            telemetry: TelemetryConfig::default(),
            attachments: AttachmentsConfig::default(),
        }
    }
}

// Hand-written so that the API token never reaches a log line.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("api_token", &self.api_token.as_ref().map(|_| "<redacted>"))
            .field("api_token_env", &self.api_token_env)
            .field("api_token_file", &self.api_token_file)
            .field("admins", &self.admins)
            .field("drain_timeout_s", &self.drain_timeout_s)
            .field("log_level", &self.log_level)
            .field("agent", &self.agent)
            .field("http", &self.http)
            .field("journal", &self.journal)
            .field("platform", &self.platform)
            .field("cluster", &self.cluster)
            .field("update", &self.update)
            .field("telemetry", &self.telemetry)
            .field("attachments", &self.attachments)
            .finish()
    }
}

/// `log_level`: the least severe line the gateway's log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Everything: start, readiness, each lifecycle step (the default).
    #[default]
    Info,
    /// Warnings and errors only.
    Warn,
    /// Errors only.
    Error,
}

/// Which agent backend answers messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Replies with the message text (embedded default).
    #[default]
    Echo,
    /// Runs a command per message.
    Exec,
    /// Any OpenAI-compatible chat-completions upstream.
    Openai,
    /// hermes-agent's own agent through its API server (`/v1/runs`).
    Hermes,
}

impl BackendKind {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Echo => "echo",
            BackendKind::Exec => "exec",
            BackendKind::Openai => "openai",
            BackendKind::Hermes => "hermes",
        }
    }
}

/// The `[agent]` table. Keys that belong to another backend are accepted and ignored, so that
/// switching `backend` is a one-line change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub backend: BackendKind,
    /// echo: wait this long before replying (cancellable).
    pub delay_ms: u64,
    /// exec: argv of the command run once per message.
    pub command: Vec<String>,
    /// Every backend: a run taking longer than this is cancelled and fails with a timeout.
    pub timeout_s: u64,
    /// exec: after SIGTERM to the process group, wait this long before SIGKILL.
    pub kill_grace_ms: u64,
    /// openai: base URL of the upstream, e.g. `https://api.openai.com/v1`.
    pub base_url: Option<String>,
    /// openai: model name sent upstream.
    pub model: Option<String>,
    /// openai: name of the environment variable holding the API key (`None` = no key sent);
    /// hermes: the API server's key. Looked up in `<home>/secrets.env`, then the environment.
    pub api_key_env: Option<String>,
    /// Or the file holding the key (0600, ours; relative to the home). Not both.
    pub api_key_file: Option<PathBuf>,
    /// Chat platforms: how many earlier turns of the conversation a run gets.
    pub history_turns: usize,
    /// openai: the character budget for those turns (the oldest are dropped first).
    pub history_chars: usize,
    /// openai: a private CA (PEM) for an https upstream (crates/net).
    pub ca_file: Option<PathBuf>,
    /// openai: `[[agent.provider]]` upstreams, tried in order (see [`ProviderConfig`]).
    pub provider: Vec<ProviderConfig>,
    /// openai: retries of one provider (429, 5xx, refused, timed out) before the next one.
    pub retries: u32,
    /// openai: the first retry's backoff; doubled per retry, jittered, capped at 30 s.
    pub backoff_ms: u64,
    /// openai: a provider that failed this many calls in a row is skipped this long.
    pub cooldown_s: u64,
    /// openai: one attempt's wait for the response head (bounded by `timeout_s`).
    pub attempt_timeout_s: u64,
    /// hermes: a hermes home whose gateway (with its API server) gatewarden starts, supervises
    /// and stops itself; `base_url` and the key then default to its `.env`.
    pub hermes_home: Option<PathBuf>,
    /// hermes: the `hermes` executable for `hermes_home` (default: `GATEWARDEN_HERMES`, else
    /// `hermes` on `PATH`).
    pub hermes_program: Option<PathBuf>,
    /// hermes: an approval the chat leaves unanswered this long is answered "deny".
    pub approval_timeout_s: u64,
    /// Every backend: the largest reply a run may produce, counted as it streams to chats and
    /// callers; past it the run ends with a failure (an endless stream must not exhaust memory).
    pub max_reply_bytes: usize,
    /// What a chat or `/v1/messages` caller is told when a run fails, followed by the reference
    /// `gatewarden trace` takes; the reason itself is the operator's (trace, status, log).
    pub failure_text: String,
    /// The platforms' and the API's admins get the whole reason in their own chats.
    pub failure_reasons_for_admins: bool,
    /// `[agent.transcription]`: voice and audio attachments transcribed for every backend
    /// (`None`: they are named as files).
    pub transcription: Option<TranscriptionConfig>,
}

/// The default of `[agent] max_reply_bytes` (1 MiB, the exec backend's stdout cap too).
pub const DEFAULT_MAX_REPLY_BYTES: usize = 1 << 20;
/// The largest `[agent] max_reply_bytes` accepted.
pub const MAX_REPLY_BYTES: usize = 256 << 20;
/// The default of `[agent] failure_text`.
pub const DEFAULT_FAILURE_TEXT: &str = "sorry, that failed";

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            backend: BackendKind::Echo,
            delay_ms: 0,
            command: Vec::new(),
            timeout_s: 120,
            kill_grace_ms: 2000,
            base_url: None,
            model: None,
            api_key_env: None,
            api_key_file: None,
            history_turns: 10,
            history_chars: 8000,
            ca_file: None,
            provider: Vec::new(),
            retries: 2,
            backoff_ms: 500,
            cooldown_s: 30,
            attempt_timeout_s: 30,
            hermes_home: None,
            hermes_program: None,
            approval_timeout_s: 300,
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
            failure_text: DEFAULT_FAILURE_TEXT.to_owned(),
            failure_reasons_for_admins: false,
            transcription: None,
        }
    }
}

impl AgentConfig {
    /// `timeout_s` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s)
    }

    /// `delay_ms` as a duration.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// `kill_grace_ms` as a duration.
    pub fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms)
    }

    /// The openai backend's upstreams in order: `[[agent.provider]]`, or the one upstream of
    /// `base_url`/`model`/`api_key_env`/`ca_file`.
    pub fn providers(&self) -> Vec<ProviderConfig> {
        if !self.provider.is_empty() {
            return self.provider.clone();
        }
        vec![ProviderConfig {
            name: None,
            base_url: self.base_url.clone().unwrap_or_default(),
            model: self.model.clone().unwrap_or_default(),
            api_key_env: self.api_key_env.clone(),
            api_key_file: self.api_key_file.clone(),
            headers: std::collections::BTreeMap::new(),
            ca_file: self.ca_file.clone(),
            proxy: None,
        }]
    }
}

// ---- [[agent.provider]] (issue 17): one block, kept together for the crates/config move. ----

const PROVIDER_KEYS: &[&str] =
    &["name", "base_url", "model", "api_key_env", "api_key_file", "headers", "ca_file", "proxy"];

/// One `[[agent.provider]]` table: an OpenAI-compatible upstream. The first is the primary,
/// the rest are fallbacks (crates/agent/src/backend/openai.rs).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// In status, metrics and the ledger; default: the host of `base_url`.
    #[serde(default)]
    pub name: Option<String>,
    pub base_url: String,
    pub model: String,
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Or the file holding the key. Not both.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Extra request headers (an organisation id, a gateway's routing key).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// This provider's own proxy (`http://` or `socks5h://`), instead of the environment's.
    #[serde(default)]
    pub proxy: Option<String>,
}

impl ProviderConfig {
    /// `name`, else the host of `base_url`.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| gatewarden_net::url_host(self.base_url.trim()).to_string())
    }
}

/// `[agent]`'s openai keys: one upstream or `[[agent.provider]]`, each a usable URL and model.
fn validate_providers(a: &AgentConfig, index: &KeyIndex) -> Result<(), ConfigError> {
    let agent = |key: &str, message: String| index.invalid(&["agent", key], message);
    let prov = |key: &str, message: String| index.invalid(&["agent", "provider", key], message);
    if a.backoff_ms > MAX_MILLIS {
        return Err(agent("backoff_ms", format!("must be at most {MAX_MILLIS} milliseconds")));
    }
    if a.retries > 10 {
        return Err(agent("retries", "must be at most 10".into()));
    }
    if a.cooldown_s > MAX_SECONDS {
        return Err(agent("cooldown_s", format!("must be at most {MAX_SECONDS} seconds")));
    }
    if a.attempt_timeout_s == 0 || a.attempt_timeout_s > MAX_SECONDS {
        return Err(agent("attempt_timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
    }
    if a.backend != BackendKind::Openai {
        return Ok(());
    }
    if a.provider.is_empty() {
        match a.base_url.as_deref().map(str::trim) {
            None | Some("") => {
                return Err(agent(
                    "base_url",
                    "backend \"openai\" needs base_url, e.g. \"https://api.openai.com/v1\", or [[agent.provider]] tables".into(),
                ));
            }
            Some(url) => check_url(url).map_err(|m| agent("base_url", m))?,
        }
        if a.model.as_deref().is_none_or(|m| m.trim().is_empty()) {
            return Err(agent("model", "backend \"openai\" needs a model".into()));
        }
        return Ok(());
    }
    if a.base_url.is_some() || a.model.is_some() {
        let key = if a.base_url.is_some() { "base_url" } else { "model" };
        return Err(agent(key, "set each upstream in [[agent.provider]], not also in [agent]".into()));
    }
    let mut names = std::collections::BTreeSet::new();
    for p in &a.provider {
        check_url(p.base_url.trim()).map_err(|m| prov("base_url", m))?;
        if p.model.trim().is_empty() {
            return Err(prov("model", "must not be empty".into()));
        }
        one_source(&prov, "api_key", p.api_key_env.as_deref(), p.api_key_file.as_deref())?;
        check_headers(&prov, &p.headers)?;
        let name = p.display_name();
        if name.trim().is_empty() || !names.insert(name.clone()) {
            return Err(prov("name", format!("two providers are named {name:?}; give each a unique name")));
        }
    }
    Ok(())
}

/// Extra request headers: each a token name and a value without control characters.
fn check_headers(
    bad: &dyn Fn(&str, String) -> ConfigError,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    for (k, v) in headers {
        let token = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token || v.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(bad("headers", format!("{k:?} is not a valid header name and value")));
        }
    }
    Ok(())
}

/// A secret named two ways, `<what>_env` (a variable) and `<what>_file` (a file): each well
/// formed, and at most one of them (crates/config/src/secrets.rs reads it).
pub(crate) fn one_source(
    bad: &dyn Fn(&str, String) -> ConfigError,
    what: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<(), ConfigError> {
    let (env_key, file_key) = (format!("{what}_env"), format!("{what}_file"));
    if env.is_some_and(|v| v.is_empty() || v.contains(['=', '\0'])) {
        return Err(bad(&env_key, "must be the name of an environment variable".into()));
    }
    if file.is_some_and(|f| f.as_os_str().is_empty()) {
        return Err(bad(&file_key, "must be the path of a file".into()));
    }
    if env.is_some() && file.is_some() {
        return Err(bad(&file_key, format!("set {env_key} or {file_key}, not both")));
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{url:?} must start with http:// or https://"));
    }
    if url.starts_with("https://") && !gatewarden_net::TLS {
        return Err(format!("{url:?} is https, but {NO_TLS}"));
    }
    Ok(())
}

#[cfg(test)]
mod provider_tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(Path::new("/h/config.toml"), text)
    }

    #[test]
    fn providers_in_order_and_the_single_upstream_as_one() {
        let c = parse(
            r#"
[agent]
backend = "openai"
retries = 1
backoff_ms = 20

[[agent.provider]]
name = "primary"
base_url = "http://127.0.0.1:1/v1"
model = "m1"
api_key_env = "K1"
headers = { "OpenAI-Organization" = "org-1" }

[[agent.provider]]
base_url = "http://fallback.example:8000/v1"
model = "m2"
proxy = "socks5h://127.0.0.1:1080"
"#,
        )
        .unwrap();
        let p = c.agent.providers();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].display_name(), p[0].model.as_str()), ("primary".into(), "m1"));
        assert_eq!(p[0].headers.get("OpenAI-Organization").map(String::as_str), Some("org-1"));
        assert_eq!(p[1].display_name(), "fallback.example:8000");
        assert_eq!((c.agent.retries, c.agent.backoff_ms), (1, 20));

        let one = parse("[agent]\nbackend = \"openai\"\nbase_url = \"http://h/v1\"\nmodel = \"m\"\n").unwrap();
        let p = one.agent.providers();
        assert_eq!((p.len(), p[0].base_url.as_str(), p[0].display_name()), (1, "http://h/v1", "h".into()));
    }

    #[test]
    fn provider_errors_name_the_key_and_line() {
        let base = "[agent]\nbackend = \"openai\"\n[[agent.provider]]\nbase_url = \"http://a/v1\"\nmodel = \"m\"\n";
        let e = parse(&format!("{base}[[agent.provider]]\nbase_url = \"http://b/v1\"\nmodel = \"m\"\nmodle = 1\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(":9:") && e.contains("'modle'") && e.contains("[agent.provider]"), "{e}");
        let e = parse(&format!("{base}[[agent.provider]]\nbase_url = \"ftp://b\"\nmodel = \"m\"\n")).unwrap_err();
        assert_eq!(e.key(), Some("base_url"), "{e}");
        let e = parse(&format!("{base}[[agent.provider]]\nbase_url = \"http://a/v2\"\nmodel = \"m\"\n")).unwrap_err();
        assert!(e.to_string().contains("unique name"), "{e}");
        let e = parse(&format!("{base}headers = {{ \"X-A\" = \"a\\r\\nb\" }}\n")).unwrap_err();
        assert_eq!(e.key(), Some("headers"), "{e}");
        let e = parse("[agent]\nbackend = \"openai\"\nmodel = \"m\"\n[[agent.provider]]\nbase_url = \"http://a\"\nmodel = \"m\"\n")
            .unwrap_err();
        assert_eq!(e.key(), Some("model"), "{e}");
        let e = parse("[agent]\nbackend = \"openai\"\n").unwrap_err();
        assert_eq!(e.key(), Some("base_url"), "{e}");
        let e = parse(&format!("{base}proxy = \"ftp://x\"\n")).unwrap_err();
        assert_eq!(e.key(), Some("proxy"), "{e}");
    }

    #[test]
    fn hermes_needs_a_home_or_an_api_server_with_its_key() {
        let e = parse("[agent]\nbackend = \"hermes\"\n").unwrap_err();
        assert_eq!(e.key(), Some("base_url"), "{e}");
        let c = parse("[agent]\nbackend = \"hermes\"\nhermes_home = \"hermes\"\n").unwrap();
        assert_eq!(c.agent.hermes_home.as_deref(), Some(Path::new("/h/hermes")), "relative to the home");
        assert_eq!(c.agent.approval_timeout_s, 300);
        let e = parse("[agent]\nbackend = \"hermes\"\nbase_url = \"http://127.0.0.1:8642\"\n").unwrap_err();
        assert_eq!(e.key(), Some("api_key_env"), "{e}");
        parse("[agent]\nbackend = \"hermes\"\nbase_url = \"http://127.0.0.1:8642\"\napi_key_env = \"K\"\n").unwrap();
        let e = parse("[agent]\nbackend = \"hermes\"\nhermes_home = \"/x\"\napproval_timeout_s = 0\n").unwrap_err();
        assert_eq!(e.key(), Some("approval_timeout_s"), "{e}");
    }
}

// ---- end of [[agent.provider]] ----

// ---- [agent.transcription] (issue 29 §1): one block. ----

const TRANSCRIPTION_KEYS: &[&str] = &[
    "base_url",
    "model",
    "api_key_env",
    "api_key_file",
    "ca_file",
    "proxy",
    "headers",
    "language",
    "max_file_mb",
    "timeout_s",
    "provider",
];

/// The default `[agent.transcription] model`.
pub const DEFAULT_TRANSCRIPTION_MODEL: &str = "whisper-1";

/// The `[agent.transcription]` table: an OpenAI-compatible `/audio/transcriptions` provider
/// (or `[[agent.transcription.provider]]` tables, tried in order as `[[agent.provider]]` are)
/// for the voice and audio attachments of messages (crates/agent/src/backend/transcribe.rs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TranscriptionConfig {
    /// The provider's base URL (`https://api.openai.com/v1`); `/audio/transcriptions` is
    /// appended.
    pub base_url: Option<String>,
    /// The model sent (default `whisper-1`).
    pub model: String,
    pub api_key_env: Option<String>,
    /// Or the file holding the key. Not both.
    pub api_key_file: Option<PathBuf>,
    /// A private CA (PEM) for an https provider (crates/net).
    pub ca_file: Option<PathBuf>,
    /// This provider's own proxy, instead of the environment's.
    pub proxy: Option<String>,
    /// Extra request headers.
    pub headers: std::collections::BTreeMap<String, String>,
    /// The audio's language (ISO-639-1, `en`), sent when set: better accuracy and latency.
    pub language: Option<String>,
    /// The largest file sent, in MiB (OpenAI's limit is 25 MB); a larger one is named instead.
    pub max_file_mb: u64,
    /// One file's transcription (every provider and retry) ends within this many seconds.
    pub timeout_s: u64,
    /// Several providers, tried in order (instead of `base_url`, `model`, the key, `ca_file`,
    /// `proxy` and `headers` above).
    pub provider: Vec<ProviderConfig>,
}

impl Default for TranscriptionConfig {
    fn default() -> Self {
        TranscriptionConfig {
            base_url: None,
            model: DEFAULT_TRANSCRIPTION_MODEL.to_owned(),
            api_key_env: None,
            api_key_file: None,
            ca_file: None,
            proxy: None,
            headers: std::collections::BTreeMap::new(),
            language: None,
            max_file_mb: 25,
            timeout_s: 120,
            provider: Vec::new(),
        }
    }
}

impl TranscriptionConfig {
    /// The providers in order: `[[agent.transcription.provider]]`, or the one of `base_url`.
    pub fn providers(&self) -> Vec<ProviderConfig> {
        if !self.provider.is_empty() {
            return self.provider.clone();
        }
        vec![ProviderConfig {
            name: None,
            base_url: self.base_url.clone().unwrap_or_default(),
            model: self.model.clone(),
            api_key_env: self.api_key_env.clone(),
            api_key_file: self.api_key_file.clone(),
            headers: self.headers.clone(),
            ca_file: self.ca_file.clone(),
            proxy: self.proxy.clone(),
        }]
    }

    /// `timeout_s` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s)
    }
}

/// `[agent.transcription]`: one provider or a list, each a usable URL, model, key and headers.
fn validate_transcription(t: &TranscriptionConfig, index: &KeyIndex) -> Result<(), ConfigError> {
    let top = |key: &str, message: String| index.invalid(&["agent", "transcription", key], message);
    let prov = |key: &str, message: String| index.invalid(&["agent", "transcription", "provider", key], message);
    if t.max_file_mb == 0 || t.max_file_mb > 1 << 16 {
        return Err(top("max_file_mb", format!("must be between 1 and {}", 1 << 16)));
    }
    if t.timeout_s == 0 || t.timeout_s > MAX_SECONDS {
        return Err(top("timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
    }
    if let Some(l) = &t.language
        && (l.is_empty() || l.len() > 16 || !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(top("language", format!("{l:?} is not a language code (e.g. \"en\")")));
    }
    let single = t.provider.is_empty();
    if !single {
        let own = [
            ("base_url", t.base_url.is_some()),
            ("api_key_env", t.api_key_env.is_some()),
            ("api_key_file", t.api_key_file.is_some()),
            ("ca_file", t.ca_file.is_some()),
            ("proxy", t.proxy.is_some()),
            ("headers", !t.headers.is_empty()),
        ];
        if let Some((key, _)) = own.iter().find(|(_, set)| *set) {
            return Err(top(key, "set each provider in [[agent.transcription.provider]], not also here".into()));
        }
    } else if t.base_url.as_deref().is_none_or(|u| u.trim().is_empty()) {
        return Err(top(
            "base_url",
            "[agent.transcription] needs base_url, e.g. \"https://api.openai.com/v1\", or [[agent.transcription.provider]] tables".into(),
        ));
    }
    let bad: &dyn Fn(&str, String) -> ConfigError = if single { &top } else { &prov };
    let mut names = std::collections::BTreeSet::new();
    for p in t.providers() {
        check_url(p.base_url.trim()).map_err(|m| bad("base_url", m))?;
        if p.model.trim().is_empty() {
            return Err(bad("model", "must not be empty".into()));
        }
        one_source(bad, "api_key", p.api_key_env.as_deref(), p.api_key_file.as_deref())?;
        check_headers(bad, &p.headers)?;
        let name = p.display_name();
        if name.trim().is_empty() || !names.insert(name.clone()) {
            return Err(bad("name", format!("two providers are named {name:?}; give each a unique name")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod transcription_tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(Path::new("/h/config.toml"), text)
    }

    #[test]
    fn one_provider_with_defaults_or_a_list_in_order() {
        assert_eq!(parse("[agent]\n").unwrap().agent.transcription, None, "off unless configured");
        let c = parse(
            "[agent]\nbackend = \"exec\"\ncommand = [\"x\"]\n[agent.transcription]\nbase_url = \"http://h/v1\"\nca_file = \"ca.pem\"\n",
        );
        // The CA file does not exist: named at its key.
        let e = c.unwrap_err();
        assert_eq!((e.table(), e.key()), (Some("agent.transcription"), Some("ca_file")), "{e}");
        let t = parse("[agent.transcription]\nbase_url = \"http://h/v1\"\nlanguage = \"en\"\n")
            .unwrap()
            .agent
            .transcription
            .unwrap();
        assert_eq!(
            (t.model.as_str(), t.max_file_mb, t.timeout_s, t.language.as_deref()),
            ("whisper-1", 25, 120, Some("en"))
        );
        let p = t.providers();
        assert_eq!((p.len(), p[0].base_url.as_str(), p[0].display_name()), (1, "http://h/v1", "h".into()));
        let t = parse(
            "[agent.transcription]\ntimeout_s = 30\n[[agent.transcription.provider]]\nname = \"a\"\nbase_url = \"http://a/v1\"\nmodel = \"w1\"\n\
             [[agent.transcription.provider]]\nbase_url = \"http://b/v1\"\nmodel = \"w2\"\nproxy = \"socks5h://127.0.0.1:1080\"\n",
        )
        .unwrap()
        .agent
        .transcription
        .unwrap();
        let names: Vec<_> = t.providers().iter().map(|p| (p.display_name(), p.model.clone())).collect();
        assert_eq!(names, [("a".into(), "w1".into()), ("b".into(), "w2".into())]);
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = parse("[agent]\n[agent.transcription]\nbase_url = \"http://h/v1\"\nlangauge = \"en\"\n").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.contains(":4:") && shown.contains("'langauge'") && shown.contains("[agent.transcription]"),
            "{shown}"
        );
        assert!(shown.contains("did you mean 'language'"), "{shown}");
        let bad = |text: &str, key: &str| {
            let e = parse(text).unwrap_err();
            assert_eq!(e.key(), Some(key), "{e}");
        };
        bad("[agent.transcription]\n", "base_url");
        bad("[agent.transcription]\nbase_url = \"ftp://h\"\n", "base_url");
        bad("[agent.transcription]\nbase_url = \"http://h\"\nmax_file_mb = 0\n", "max_file_mb");
        bad("[agent.transcription]\nbase_url = \"http://h\"\ntimeout_s = 0\n", "timeout_s");
        bad("[agent.transcription]\nbase_url = \"http://h\"\nlanguage = \"en us\"\n", "language");
        bad("[agent.transcription]\nbase_url = \"http://h\"\nmodel = \" \"\n", "model");
        bad(
            "[agent.transcription]\nbase_url = \"http://h\"\napi_key_env = \"K\"\napi_key_file = \"k\"\n",
            "api_key_file",
        );
        bad("[agent.transcription]\nbase_url = \"http://h\"\nheaders = { \"X\" = \"a\\nb\" }\n", "headers");
        bad("[agent.transcription]\nbase_url = \"http://h\"\nproxy = \"ftp://x\"\n", "proxy");
        let list = "[[agent.transcription.provider]]\nbase_url = \"http://a/v1\"\nmodel = \"w\"\n";
        bad(&format!("[agent.transcription]\nbase_url = \"http://h\"\n{list}"), "base_url");
        bad(&format!("[agent.transcription]\n{list}{list}"), "name");
    }
}

// ---- end of [agent.transcription] ----

/// Largest accepted `config.toml`.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The `[cluster]` table: gateways (on any host) with the same `name` and `store` elect one
/// active through a fenced lease (crates/cluster). The store URL carries no password: it
/// comes from `password_env` or `password_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    /// `postgres://user@host:port/database`.
    pub store: String,
    pub password_env: Option<String>,
    /// Relative paths are relative to the home.
    pub password_file: Option<PathBuf>,
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    #[serde(default = "default_renew_interval_s")]
    pub renew_interval_s: u64,
    /// A private CA (PEM) for the store's TLS (crates/net).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn default_lease_ttl_s() -> u64 {
    15
}

fn default_renew_interval_s() -> u64 {
    5
}

impl ClusterConfig {
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s)
    }

    pub fn renew_interval(&self) -> Duration {
        Duration::from_secs(self.renew_interval_s)
    }

    /// The store URL the cluster connects with: `store`, plus `sslrootcert=<ca_file>` when
    /// `ca_file` is set (crates/cluster/src/tls.rs reads both).
    pub fn store_url(&self) -> String {
        let Some(ca) = &self.ca_file else { return self.store.clone() };
        let mut path = String::new();
        for b in ca.to_string_lossy().bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' | b'~' => path.push(char::from(b)),
                _ => path.push_str(&format!("%{b:02X}")),
            }
        }
        let sep = if self.store.contains('?') { '&' } else { '?' };
        format!("{}{sep}sslrootcert={path}", self.store)
    }

    fn validate(&self, index: &KeyIndex) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| index.invalid(&["cluster", key], message);
        if self.name.is_empty()
            || self.name.len() > 64
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(bad("name", "must be 1 to 64 characters from A-Z, a-z, 0-9, '-', '_', '.'".into()));
        }
        let Some(rest) = self.store.strip_prefix("postgres://").or_else(|| self.store.strip_prefix("postgresql://"))
        else {
            return Err(bad("store", "must be a postgres://user@host:port/database URL".into()));
        };
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        if authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':')) {
            return Err(bad("store", "must not contain a password; use password_env or password_file".into()));
        }
        let query = rest.split_once('?').map_or("", |(_, q)| q);
        for (k, v) in query.split('&').filter_map(|p| p.split_once('=')) {
            if k == "sslmode" && !matches!(v, "disable" | "prefer" | "require" | "verify-ca" | "verify-full") {
                return Err(bad(
                    "store",
                    format!("sslmode={v:?} is not one of disable, prefer, require, verify-ca, verify-full"),
                ));
            }
            if k == "sslrootcert" {
                return Err(bad("store", "use ca_file in [cluster] instead of sslrootcert".into()));
            }
        }
        one_source(&bad, "password", self.password_env.as_deref(), self.password_file.as_deref())?;
        if self.lease_ttl_s < 2 || self.lease_ttl_s > 3600 {
            return Err(bad("lease_ttl_s", "must be between 2 and 3600 seconds".into()));
        }
        if self.renew_interval_s == 0 || self.renew_interval_s * 2 > self.lease_ttl_s {
            return Err(bad(
                "renew_interval_s",
                format!("must be at least 1 and at most half of lease_ttl_s ({})", self.lease_ttl_s),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Reads the home's configuration (`<home>/config.toml`, or the file `GATEWARDEN_CONFIG`
    /// names: crates/lifecycle/src/home.rs `config_path_with`) with the environment's
    /// `GATEWARDEN_…` settings over it (crates/config/src/env.rs); a missing file and no setting
    /// yield [`Config::default`]. Relative `*_file` and `ca_file` paths are the home's either way.
    pub fn load(home: &Path) -> Result<Config, ConfigError> {
        Config::load_with_env(home, &|k| std::env::var(k).ok())
    }

    /// [`Config::load`] with the environment given.
    pub fn load_with_env(home: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let path = gatewarden_lifecycle::home::config_path_with(home, |k| env(k).map(Into::into));
        // The home's one read helper: no symlinks, FIFOs or devices, and a size cap checked
        // before anything is allocated (a 1 GB config.toml is refused, not loaded).
        let bytes = match gatewarden_lifecycle::fsio::read_capped(&path, MAX_CONFIG_BYTES) {
            ReadOutcome::Ok(bytes) => bytes,
            ReadOutcome::Missing => Vec::new(),
            ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
                return Err(ConfigError::Read { path, source: std::io::Error::other(why) });
            }
        };
        let text = Config::utf8(&path, &bytes)?;
        env::load(&path, home, text, env)
    }

    fn utf8<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, ConfigError> {
        std::str::from_utf8(bytes).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            line: line_of(bytes, e.valid_up_to()),
            message: "file is not valid UTF-8".into(),
        })
    }

    /// Parses and validates file contents; `path` is only used in error messages.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::from_toml_str(path, Config::utf8(path, bytes)?)
    }

    /// Parses and validates TOML text; `path` is only used in error messages, and its folder
    /// is what relative `*_file` and `ca_file` paths are relative to.
    pub fn from_toml_str(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_in(path, text, path.parent().unwrap_or(Path::new(".")))
    }

    /// [`Config::from_toml_str`] for the configuration of the home `home`: relative paths are
    /// the home's, wherever the file itself is (`GATEWARDEN_CONFIG`).
    pub(crate) fn from_toml_in(path: &Path, text: &str, home: &Path) -> Result<Config, ConfigError> {
        let index = KeyIndex::build(path, text)?;
        // `[[agent]]` or `agent = 1` would otherwise surface as a confusing serde message about
        // the first field.
        for table in ["agent", "http", "journal"] {
            if index.find(&[table]).is_some_and(|e| !e.is_table) {
                return Err(index.invalid(&[table], format!("expected a table ([{table}])")));
            }
        }
        // `[[platform]]` tables are read apart, each by its kind (crates/config/src/platform/),
        // so that their errors keep their lines and keys; the rest of the file is serde's.
        let mut doc = toml::de::DeTable::parse(text).map_err(|e| index.syntax_error(&e))?;
        let platforms = doc.get_mut().remove("platform");
        let mut config = Config::deserialize(toml::de::Deserializer::from(doc)).map_err(|e| index.serde_error(&e))?;
        if let Some(platforms) = platforms {
            config.platform = index.platforms(platforms)?;
        }
        config.validate(&index)?;
        // Relative CA and secret files are the home's (README, "Secrets").
        config.resolve_ca_files(home);
        config.validate_outbound(&index)?;
        Ok(config)
    }

    /// Every `ca_file` and `*_file` made absolute against `home`.
    fn resolve_ca_files(&mut self, home: &Path) {
        let fix = |f: &mut Option<PathBuf>| {
            if let Some(p) = f.as_mut()
                && p.is_relative()
            {
                *p = home.join(&*p);
            }
        };
        fix(&mut self.api_token_file);
        fix(&mut self.agent.ca_file);
        fix(&mut self.agent.hermes_home);
        fix(&mut self.agent.api_key_file);
        for p in &mut self.agent.provider {
            fix(&mut p.ca_file);
            fix(&mut p.api_key_file);
        }
        if let Some(t) = self.agent.transcription.as_mut() {
            fix(&mut t.ca_file);
            fix(&mut t.api_key_file);
            for p in &mut t.provider {
                fix(&mut p.ca_file);
                fix(&mut p.api_key_file);
            }
        }
        fix(&mut self.update.ca_file);
        fix(&mut self.telemetry.ca_file);
        if let Some(c) = self.cluster.as_mut() {
            fix(&mut c.ca_file);
            fix(&mut c.password_file);
        }
        for p in &mut self.platform {
            for f in p.files_mut() {
                fix(f);
            }
        }
    }

    /// Each `ca_file` is read and must hold certificates, and each `proxy` must be a proxy URL
    /// without credentials. A CA file that cannot be used is a configuration error; a server
    /// whose certificate it does not verify is a connection failure later (crates/net).
    fn validate_outbound(&self, index: &KeyIndex) -> Result<(), ConfigError> {
        let check = |table: &str, ca: Option<&Path>| match ca {
            Some(path) => gatewarden_net::ClientTls::from_ca_file(path)
                .map(drop)
                .map_err(|e| index.invalid(&[table, "ca_file"], e.to_string())),
            None => Ok(()),
        };
        check("agent", self.agent.ca_file.as_deref())?;
        for p in &self.agent.provider {
            if let Some(path) = &p.ca_file {
                gatewarden_net::ClientTls::from_ca_file(path)
                    .map_err(|e| index.invalid(&["agent", "provider", "ca_file"], e.to_string()))?;
            }
            if let Some(proxy) = &p.proxy
                && let Err(e) = gatewarden_net::ProxyUrl::parse(proxy)
            {
                return Err(index.invalid(&["agent", "provider", "proxy"], e.to_string()));
            }
        }
        if let Some(t) = &self.agent.transcription {
            // The table's own keys, or each provider's: at the line of the one set.
            let table: &[&str] = if t.provider.is_empty() {
                &["agent", "transcription"]
            } else {
                &["agent", "transcription", "provider"]
            };
            let at = |key: &'static str| [table, &[key]].concat();
            for p in t.providers() {
                if let Some(path) = &p.ca_file {
                    gatewarden_net::ClientTls::from_ca_file(path)
                        .map_err(|e| index.invalid(&at("ca_file"), e.to_string()))?;
                }
                if let Some(proxy) = &p.proxy
                    && let Err(e) = gatewarden_net::ProxyUrl::parse(proxy)
                {
                    return Err(index.invalid(&at("proxy"), e.to_string()));
                }
            }
        }
        check("update", self.update.ca_file.as_deref())?;
        check("telemetry", self.telemetry.ca_file.as_deref())?;
        if let Some(proxy) = &self.telemetry.proxy
            && let Err(e) = gatewarden_net::ProxyUrl::parse(proxy)
        {
            return Err(index.invalid(&["telemetry", "proxy"], e.to_string()));
        }
        check("cluster", self.cluster.as_ref().and_then(|c| c.ca_file.as_deref()))?;
        for (i, p) in self.platform.iter().enumerate() {
            if let Some(path) = &p.ca_file {
                gatewarden_net::ClientTls::from_ca_file(path)
                    .map_err(|e| index.invalid_in_platform(i, "ca_file", e.to_string()))?;
            }
            if let Some(proxy) = p.proxy()
                && let Err(e) = gatewarden_net::ProxyUrl::parse(proxy)
            {
                return Err(index.invalid_in_platform(i, "proxy", e.to_string()));
            }
        }
        Ok(())
    }

    /// True when `listen` is a loopback address (127.0.0.0/8 or ::1).
    pub fn is_loopback_listen(&self) -> bool {
        self.listen.ip().is_loopback()
    }

    /// The start-up exposure check: a non-loopback `listen` requires an `api_token`. Kept apart
    /// from [`Config::load`] because a command-line `--listen` may override the file.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        if self.is_loopback_listen() || self.has_api_token() {
            Ok(())
        } else {
            Err(ConfigError::Exposed { listen: self.listen })
        }
    }

    /// Whether the HTTP API has a token: written in the file, or named by `api_token_env` or
    /// `api_token_file` (whose value a start resolves, and refuses to run without).
    pub fn has_api_token(&self) -> bool {
        self.api_token.is_some() || self.api_token_env.is_some() || self.api_token_file.is_some()
    }

    /// `drain_timeout_s` as a duration.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout_s)
    }

    fn validate(&self, index: &KeyIndex) -> Result<(), ConfigError> {
        let top = |key: &str, message: String| index.invalid(&[key], message);
        let agent = |key: &str, message: String| index.invalid(&["agent", key], message);

        if let Some(why) = self.api_token.as_deref().and_then(token_problem) {
            return Err(top("api_token", why));
        }
        one_source(&top, "api_token", self.api_token_env.as_deref(), self.api_token_file.as_deref())?;
        if self.api_token.is_some() && (self.api_token_env.is_some() || self.api_token_file.is_some()) {
            let key = if self.api_token_env.is_some() { "api_token_env" } else { "api_token_file" };
            return Err(top(key, "set api_token, api_token_env or api_token_file, not two of them".into()));
        }
        let http = |key: &str, message: String| index.invalid(&["http", key], message);
        let h = &self.http;
        if h.max_connections == 0 || h.max_connections > MAX_CONNECTIONS {
            return Err(http("max_connections", format!("must be between 1 and {MAX_CONNECTIONS}")));
        }
        if h.header_timeout_s == 0 || h.header_timeout_s > MAX_SECONDS {
            return Err(http("header_timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        if h.body_timeout_s == 0 || h.body_timeout_s > MAX_SECONDS {
            return Err(http("body_timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        if let Some(bad) = h.allowed_hosts.iter().find(|n| !valid_host(n)) {
            return Err(http(
                "allowed_hosts",
                format!("{bad:?} is not a host name (expected e.g. \"gw.example.com\")"),
            ));
        }
        let journal = |key: &str, message: String| index.invalid(&["journal", key], message);
        if self.journal.max_age_days > 100 * 365 {
            return Err(journal("max_age_days", "must be at most 36500 days (0 keeps messages forever)".into()));
        }
        if self.journal.max_size_mb > 1 << 30 {
            return Err(journal("max_size_mb", format!("must be at most {} MiB (0 means no bound)", 1u64 << 30)));
        }
        for (key, n) in
            [("max_queued_per_chat", self.journal.max_queued_per_chat), ("max_queued", self.journal.max_queued)]
        {
            if n > MAX_QUEUED {
                return Err(journal(key, format!("must be at most {MAX_QUEUED} (0 means no cap)")));
            }
        }
        let a = &self.attachments;
        let attachments = |key: &str, message: String| index.invalid(&["attachments", key], message);
        for (key, n, max) in [
            ("max_file_mb", a.max_file_mb, 1 << 16),
            ("max_message_mb", a.max_message_mb, 1 << 16),
            ("timeout_s", a.timeout_s, MAX_SECONDS),
            ("stall_s", a.stall_s, MAX_SECONDS),
        ] {
            if n == 0 || n > max {
                return Err(attachments(key, format!("must be between 1 and {max}")));
            }
        }
        if a.allowed_types.iter().any(|t| t.trim().is_empty() || t.contains(char::is_whitespace)) {
            return Err(attachments("allowed_types", "each must be a MIME type or prefix, e.g. \"image/\"".into()));
        }
        if self.admins.iter().any(|a| a.trim().is_empty()) {
            return Err(top("admins", "user ids must not be empty".into()));
        }
        if self.drain_timeout_s > MAX_SECONDS {
            return Err(top("drain_timeout_s", format!("must be at most {MAX_SECONDS} seconds")));
        }
        if let Some(c) = &self.cluster {
            c.validate(index)?;
        }
        let t = &self.telemetry;
        let telemetry = |key: &str, message: String| index.invalid(&["telemetry", key], message);
        if let Some(url) = &t.otlp_endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(telemetry("otlp_endpoint", "must be an http:// or https:// URL".into()));
        }
        if let Some(url) = t.otlp_endpoint.as_deref().filter(|u| u.starts_with("https://"))
            && !gatewarden_net::TLS
        {
            return Err(telemetry("otlp_endpoint", format!("{url:?} is https, but {NO_TLS}")));
        }
        if t.metrics_interval_s == 0 || t.metrics_interval_s > MAX_SECONDS {
            return Err(telemetry("metrics_interval_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        if t.timeout_s == 0 || t.timeout_s > MAX_SECONDS {
            return Err(telemetry("timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        if t.queue == 0 || t.queue > 65_536 {
            return Err(telemetry("queue", "must be between 1 and 65536".into()));
        }
        if self.update.probation_s > MAX_SECONDS {
            return Err(index.invalid(&["update", "probation_s"], format!("must be at most {MAX_SECONDS} seconds")));
        }
        if self.update.public_key.as_ref().is_some_and(|k| k.trim().is_empty()) {
            return Err(index.invalid(&["update", "public_key"], "must not be empty".into()));
        }
        let a = &self.agent;
        if a.timeout_s == 0 || a.timeout_s > MAX_SECONDS {
            return Err(agent("timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        if a.delay_ms > MAX_MILLIS {
            return Err(agent("delay_ms", format!("must be at most {MAX_MILLIS} milliseconds")));
        }
        if a.kill_grace_ms > MAX_MILLIS {
            return Err(agent("kill_grace_ms", format!("must be at most {MAX_MILLIS} milliseconds")));
        }
        one_source(&agent, "api_key", a.api_key_env.as_deref(), a.api_key_file.as_deref())?;
        if a.history_turns > 1000 {
            return Err(agent("history_turns", "must be at most 1000".into()));
        }
        if a.history_chars > 10_000_000 {
            return Err(agent("history_chars", "must be at most 10000000 characters".into()));
        }
        if !(1024..=MAX_REPLY_BYTES).contains(&a.max_reply_bytes) {
            return Err(agent("max_reply_bytes", format!("must be between 1024 and {MAX_REPLY_BYTES} bytes")));
        }
        if a.failure_text.trim().is_empty() || a.failure_text.len() > 1000 {
            return Err(agent("failure_text", "must be a short non-empty text (at most 1000 bytes)".into()));
        }
        self.validate_platforms(index)?;
        validate_providers(a, index)?;
        if let Some(t) = &a.transcription {
            validate_transcription(t, index)?;
        }
        match a.backend {
            BackendKind::Echo => {}
            BackendKind::Exec => {
                if a.command.is_empty() {
                    return Err(agent(
                        "command",
                        "backend \"exec\" needs a non-empty argv list, e.g. command = [\"/usr/local/bin/my-agent\", \"--flag\"]"
                            .into(),
                    ));
                }
                if a.command[0].is_empty() || a.command.iter().any(|s| s.contains('\0')) {
                    return Err(agent(
                        "command",
                        "the program name must be non-empty and no argument may contain NUL".into(),
                    ));
                }
            }
            BackendKind::Openai => {}
            BackendKind::Hermes => {
                match (&a.base_url, &a.hermes_home) {
                    (None, None) => {
                        return Err(agent(
                            "base_url",
                            "backend \"hermes\" needs base_url (hermes's API server, e.g. \"http://127.0.0.1:8642\") or hermes_home".into(),
                        ));
                    }
                    (Some(url), _) => check_url(url.trim()).map_err(|m| agent("base_url", m))?,
                    (None, Some(_)) => {}
                }
                if a.base_url.is_some()
                    && a.hermes_home.is_none()
                    && a.api_key_env.is_none()
                    && a.api_key_file.is_none()
                {
                    return Err(agent(
                        "api_key_env",
                        "backend \"hermes\" needs the API server's key: api_key_env names the variable holding API_SERVER_KEY (or api_key_file the file)".into(),
                    ));
                }
                if a.approval_timeout_s == 0 || a.approval_timeout_s > MAX_SECONDS {
                    return Err(agent("approval_timeout_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
                }
            }
        }
        Ok(())
    }
}

/// A `Host` header value as configured: a name or address, optionally with a port; no scheme,
/// path or whitespace.
fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_'))
}

/// What a build without the `tls` feature says about an https URL.
pub(crate) const NO_TLS: &str =
    "this build has no TLS (it was built with --no-default-features); build it with the default features";

impl Config {
    /// Each `[[platform]]` table: a unique, well-formed adapter name, then its own checks
    /// (crates/config/src/platform/), each error at that table's line for the key.
    fn validate_platforms(&self, index: &KeyIndex) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for (i, p) in self.platform.iter().enumerate() {
            let bad = |key: &str, message: String| index.invalid_in_platform(i, key, message);
            let name = p.adapter_name();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(bad("name", format!("{name:?}: use letters, digits, '-' and '_'")));
            }
            if !names.insert(name.clone()) {
                return Err(bad(
                    "name",
                    format!("two [[platform]] tables are named {name:?}; give each a unique name"),
                ));
            }
            p.validate(&bad)?;
        }
        Ok(())
    }
}

fn de_socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.trim().parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not a socket address (expected IP:PORT such as \"127.0.0.1:7878\" or \"[::1]:7878\")"
        ))
    })
}

/// 1-based line number of byte offset `at`.
fn line_of(bytes: &[u8], at: usize) -> usize {
    let at = at.min(bytes.len());
    bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1
}

/// One `key = value` (or `[table]` header) of the document, with its spans.
struct Entry {
    path: Vec<String>,
    key: Range<usize>,
    value: Range<usize>,
    is_table: bool,
    /// Which `[[platform]]` table (0-based) the key belongs to.
    platform: Option<usize>,
}

/// Maps byte spans of the document back to keys and lines.
struct KeyIndex<'a> {
    path: &'a Path,
    text: &'a str,
    entries: Vec<Entry>,
}

impl<'a> KeyIndex<'a> {
    fn build(path: &'a Path, text: &'a str) -> Result<Self, ConfigError> {
        let doc = toml::de::DeTable::parse(text).map_err(|e| syntax_error(path, text, &e))?;
        let mut entries = Vec::new();
        collect(&[], doc.get_ref(), None, &mut entries);
        Ok(KeyIndex { path, text, entries })
    }

    fn syntax_error(&self, e: &toml::de::Error) -> ConfigError {
        syntax_error(self.path, self.text, e)
    }

    /// The `[[platform]]` tables of `value` (the document's `platform`), each read by its kind.
    fn platforms(&self, value: toml::Spanned<toml::de::DeValue<'_>>) -> Result<Vec<PlatformConfig>, ConfigError> {
        use toml::de::DeValue;
        let not_tables = || self.invalid(&["platform"], "expected a list of tables ([[platform]])".into());
        let DeValue::Array(items) = value.into_inner() else { return Err(not_tables()) };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let span = item.span();
            let DeValue::Table(table) = item.into_inner() else { return Err(not_tables()) };
            let read = platform::located(table, span.clone()).map_err(|e| match e {
                platform::TableError::Serde { kind, error } => self.platform_serde_error(kind, &error),
                platform::TableError::Kind { at, message } => {
                    let line = match at {
                        Some(at) => self.line(at.start),
                        None => self.line(self.platform_start(i).unwrap_or(span.start)),
                    };
                    ConfigError::InvalidValue {
                        path: self.path.to_path_buf(),
                        line,
                        key: "kind".into(),
                        table: Some("platform".into()),
                        message,
                    }
                }
            })?;
            out.push(read);
        }
        Ok(out)
    }

    /// Where `[[platform]]` table `i`'s first key is.
    fn platform_start(&self, i: usize) -> Option<usize> {
        self.entries.iter().filter(|e| e.platform == Some(i)).map(|e| e.key.start).min()
    }

    /// An "invalid value" error for `key` of `[[platform]]` table `i`: the key's line, else the
    /// table's first key's.
    fn invalid_in_platform(&self, i: usize, key: &str, message: String) -> ConfigError {
        let at = self
            .entries
            .iter()
            .find(|e| e.platform == Some(i) && e.path.last().is_some_and(|k| k == key))
            .map(|e| e.key.start)
            .or_else(|| self.platform_start(i));
        match at {
            Some(at) => ConfigError::InvalidValue {
                path: self.path.to_path_buf(),
                line: self.line(at),
                key: key.to_owned(),
                table: Some("platform".into()),
                message,
            },
            None => self.invalid(&["platform", key], message),
        }
    }

    /// [`KeyIndex::serde_error`] for a table of `kind`: an unknown key lists that kind's keys,
    /// and names the kinds that take it, if any.
    fn platform_serde_error(&self, kind: PlatformKind, err: &toml::de::Error) -> ConfigError {
        let mut e = self.serde_error(err);
        if let ConfigError::UnknownKey { key, expected, hint, .. } = &mut e {
            let keys = kind.keys();
            *expected = keys.join(", ");
            *hint = kinds_taking(key).or_else(|| did_you_mean(key, &keys)).map(Into::into);
        }
        e
    }

    fn line(&self, at: usize) -> usize {
        line_of(self.text.as_bytes(), at)
    }

    fn find(&self, path: &[&str]) -> Option<&Entry> {
        self.entries.iter().find(|e| e.path.iter().map(String::as_str).eq(path.iter().copied()))
    }

    /// The entry whose key or value span most tightly encloses `at`.
    fn enclosing(&self, at: usize) -> Option<&Entry> {
        let contains = |r: &Range<usize>| r.start <= at && at < r.end.max(r.start + 1);
        self.entries.iter().filter(|e| contains(&e.key) || contains(&e.value)).min_by_key(|e| {
            let k = if contains(&e.key) { e.key.len() } else { usize::MAX };
            let v = if contains(&e.value) { e.value.len() } else { usize::MAX };
            k.min(v)
        })
    }

    /// An "invalid value" error for a key path; the line is the key's, else its table's.
    fn invalid(&self, path: &[&str], message: String) -> ConfigError {
        let at =
            self.find(path).or_else(|| self.find(&path[..path.len().saturating_sub(1)])).map_or(0, |e| e.key.start);
        let (table, key) = split_path(path);
        ConfigError::InvalidValue { path: self.path.to_path_buf(), line: self.line(at), key, table, message }
    }

    /// Turns a serde error (unknown field, wrong type, bad enum variant, …) into a located one.
    fn serde_error(&self, err: &toml::de::Error) -> ConfigError {
        let message = err.message().trim_end().to_string();
        let at = err.span().map_or(0, |s| s.start);
        let line = self.line(at);
        let Some(entry) = self.enclosing(at) else {
            return ConfigError::Syntax { path: self.path.to_path_buf(), line, message };
        };
        let path: Vec<&str> = entry.path.iter().map(String::as_str).collect();
        let (table, key) = split_path(&path);
        let line = self.line(entry.key.start);
        if message.starts_with("unknown field") {
            let keys: &[&str] = match table.as_deref() {
                None => TOP_KEYS,
                Some("agent") => AGENT_KEYS,
                Some("agent.provider") => PROVIDER_KEYS,
                Some("agent.transcription") => TRANSCRIPTION_KEYS,
                Some("agent.transcription.provider") => PROVIDER_KEYS,
                Some("http") => HTTP_KEYS,
                Some("journal") => JOURNAL_KEYS,
                Some("cluster") => CLUSTER_KEYS,
                Some("update") => UPDATE_KEYS,
                Some("telemetry") => TELEMETRY_KEYS,
                Some("attachments") => ATTACHMENTS_KEYS,
                // `[[platform]]`: the kind's keys (platform_serde_error).
                Some(_) => &[],
            };
            let expected = if keys.is_empty() { String::from("(no keys)") } else { keys.join(", ") };
            let hint = did_you_mean(&key, keys).map(Into::into);
            return ConfigError::UnknownKey { path: self.path.to_path_buf(), line, key, table, expected, hint };
        }
        ConfigError::InvalidValue { path: self.path.to_path_buf(), line, key, table, message: friendlier(&message) }
    }
}

fn split_path(path: &[&str]) -> (Option<String>, String) {
    match path.split_last() {
        Some((key, [])) => (None, (*key).to_string()),
        Some((key, table)) => (Some(table.join(".")), (*key).to_string()),
        None => (None, String::new()),
    }
}

/// serde's type errors say `u64`; users write TOML.
fn friendlier(message: &str) -> String {
    let m = message
        .replace("expected u64", "expected a non-negative integer")
        .replace("expected a sequence", "expected a list");
    // serde's "invalid type: integer `123`, expected a string": what the key wants first.
    match m.strip_prefix("invalid type: ").and_then(|rest| rest.split_once(", expected ")) {
        Some((found, wanted)) => format!("expected {wanted}, found {found}"),
        None => m,
    }
}

fn collect(prefix: &[String], table: &toml::de::DeTable<'_>, platform: Option<usize>, out: &mut Vec<Entry>) {
    for (key, value) in table.iter() {
        let mut path = prefix.to_vec();
        path.push(key.get_ref().to_string());
        out.push(Entry {
            path: path.clone(),
            key: key.span(),
            value: value.span(),
            is_table: matches!(value.get_ref(), toml::de::DeValue::Table(_)),
            platform,
        });
        match value.get_ref() {
            toml::de::DeValue::Table(inner) => collect(&path, inner, platform, out),
            // `[[agent.provider]]` and `[[platform]]`: each table's keys, so an error points at
            // its line and names its key (a platform's, in its own table).
            toml::de::DeValue::Array(items) if path.first().is_some_and(|p| p == "agent" || p == "platform") => {
                let is_platform = path.len() == 1 && path[0] == "platform";
                for (i, item) in items.iter().enumerate() {
                    if let toml::de::DeValue::Table(inner) = item.get_ref() {
                        collect(&path, inner, if is_platform { Some(i) } else { platform }, out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn syntax_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    ConfigError::Syntax {
        path: path.to_path_buf(),
        line: line_of(text.as_bytes(), e.span().map_or(0, |s| s.start)),
        message: format!("TOML syntax error: {}", e.message().trim_end()),
    }
}

/// `did you mean 'token_env'?` for an unknown `key`: the first known key it starts (or that
/// starts it), else the nearest within two edits.
fn did_you_mean(key: &str, known: &[&str]) -> Option<String> {
    let prefix =
        known.iter().find(|k| k.len() > key.len() && k.starts_with(key) || key.starts_with(**k) && k.len() > 2);
    let near = || {
        let bound = if key.len() >= 4 { 2 } else { 1 };
        known
            .iter()
            .map(|k| (edit_distance(key, k), *k))
            .filter(|(d, _)| *d <= bound)
            .min_by_key(|(d, _)| *d)
            .map(|(_, k)| k)
    };
    prefix.copied().or_else(near).map(|k| format!("did you mean '{k}'?"))
}

/// Levenshtein distance, with a swap of two neighbours counted as one edit (`modle`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `nick is for kind = "irc" or "xmpp" only`: a key some other kinds take.
fn kinds_taking(key: &str) -> Option<String> {
    let kinds: Vec<String> = PlatformKind::ALL
        .iter()
        .filter(|k| k.own_keys().contains(&key))
        .map(|k| format!("\"{}\"", k.as_str()))
        .collect();
    let (last, rest) = kinds.split_last()?;
    let list = if rest.is_empty() { last.clone() } else { format!("{} or {last}", rest.join(", ")) };
    Some(format!("{key} is for kind = {list} only"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(Path::new("/h/config.toml"), text)
    }

    fn err(text: &str) -> String {
        parse(text).expect_err("must be rejected").to_string()
    }

    /// `[telemetry]`: nothing exported by default; the endpoint must be http(s); its bounds
    /// are checked; an unknown key names the table's keys.
    #[test]
    fn telemetry_table() {
        assert_eq!(parse("").unwrap().telemetry, TelemetryConfig::default());
        let c = parse("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nqueue = 8\n").unwrap();
        assert_eq!((c.telemetry.otlp_endpoint.as_deref(), c.telemetry.queue), (Some("http://127.0.0.1:4318"), 8));
        for (bad, key) in [
            ("otlp_endpoint = \"ftp://x\"", "otlp_endpoint"),
            ("queue = 0", "queue"),
            ("timeout_s = 0", "timeout_s"),
            ("metrics_interval_s = 0", "metrics_interval_s"),
            ("proxy = \"ftp://p\"", "proxy"),
        ] {
            let e = parse(&format!("[telemetry]\n{bad}\n")).unwrap_err();
            assert_eq!(e.key(), Some(key), "{bad}: {e}");
        }
        assert!(err("[telemetry]\nendpoint = \"x\"\n").contains("otlp_endpoint"), "the known keys are named");
    }

    #[test]
    fn missing_file_is_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), "127.0.0.1:7878");
        assert_eq!(c.api_token, None);
        assert!(c.admins.is_empty());
        assert_eq!(c.drain_timeout_s, 30);
        assert_eq!(c.agent.backend, BackendKind::Echo);
        assert_eq!(c.agent.delay_ms, 0);
        assert_eq!(c.agent.timeout_s, 120);
        assert!(c.is_loopback_listen());
        c.check_exposure().unwrap();
    }

    #[test]
    fn empty_and_comment_only_files_are_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
        assert_eq!(parse("# nothing\n\n").unwrap(), Config::default());
        assert_eq!(parse("[agent]\n").unwrap(), Config::default());
    }

    #[test]
    fn example_file_parses_and_documents_every_key() {
        let text = include_str!("../config.example.toml");
        let c = parse(text).expect("config.example.toml must parse");
        assert_eq!(c.agent.backend, BackendKind::Echo);
        // The example shows every key commented out or set; each must be mentioned.
        for key in TOP_KEYS
            .iter()
            .chain(AGENT_KEYS)
            .chain(HTTP_KEYS)
            .chain(JOURNAL_KEYS)
            .chain(CLUSTER_KEYS)
            .chain(UPDATE_KEYS)
            .chain(TELEMETRY_KEYS)
            .chain(ATTACHMENTS_KEYS)
        {
            assert!(
                text.contains(&format!("{key} =")) || text.contains(&format!("[{key}]")),
                "config.example.toml does not document '{key}'"
            );
        }
        for key in TRANSCRIPTION_KEYS {
            assert!(
                text.contains(&format!("{key} =")),
                "config.example.toml does not document [agent.transcription] {key}"
            );
        }
        let voice = parse(&enable_block(text, "transcription")).unwrap_or_else(|e| panic!("transcription block: {e}"));
        assert_eq!(voice.agent.transcription.map(|t| t.model), Some("whisper-1".into()));
        // Uncommenting every commented-out assignment of each backend block must still parse.
        for backend in ["exec", "openai", "hermes"] {
            let enabled = enable_block(text, backend);
            let c = parse(&enabled).unwrap_or_else(|e| panic!("{backend} block: {e}"));
            assert_eq!(c.agent.backend.as_str(), backend);
        }
    }

    /// Every platform kind has a `# [[platform]]` block in config.example.toml that parses on
    /// its own, once uncommented, into a table of that kind; the block shows each of the
    /// kind's own keys, and the shared keys are shown in the first (Telegram) block.
    #[test]
    fn example_file_has_a_block_for_every_platform_kind_with_its_keys() {
        let text = include_str!("../config.example.toml");
        let blocks = platform_blocks(text);
        let mut seen = Vec::new();
        for block in &blocks {
            let c = parse(&block.enabled).unwrap_or_else(|e| panic!("{e}\n{}", block.enabled));
            assert_eq!(c.platform.len(), 1, "{}", block.enabled);
            let kind = c.platform[0].kind();
            for key in kind.own_keys() {
                assert!(block.documents(key), "config.example.toml's {} block does not show '{key}'", kind.as_str());
            }
            seen.push(kind);
        }
        for kind in PlatformKind::ALL {
            assert!(seen.contains(kind), "config.example.toml has no [[platform]] block of kind {:?}", kind.as_str());
        }
        let first = blocks.first().expect("a [[platform]] block");
        for key in platform::shared_keys() {
            assert!(first.documents(key), "config.example.toml's first [[platform]] block does not show '{key}'");
        }
    }

    /// One `# [[platform]]` block of config.example.toml: its lines as written, and uncommented
    /// (one `# ` dropped: `# # key = …` alternatives stay comments).
    struct Block {
        written: String,
        enabled: String,
    }

    impl Block {
        fn documents(&self, key: &str) -> bool {
            self.written.lines().any(|l| l.trim_start_matches(['#', ' ']).starts_with(&format!("{key} =")))
        }
    }

    /// The example's `# [[platform]]` blocks: from that line on while lines are commented-out
    /// assignments or comments (`# key = …`, `#   # …`, `# # …`).
    fn platform_blocks(text: &str) -> Vec<Block> {
        let mut out: Vec<Block> = Vec::new();
        let mut inside = false;
        for line in text.lines() {
            if line == "# [[platform]]" {
                out.push(Block { written: String::new(), enabled: String::new() });
                inside = true;
            }
            let rest = line.strip_prefix("# ").filter(|r| {
                let r = r.trim_start();
                r.starts_with('#')
                    || r.starts_with("[[platform]]")
                    || r.split_once(" =").is_some_and(|(k, _)| !k.contains(' '))
            });
            match (inside, rest, out.last_mut()) {
                (true, Some(rest), Some(b)) => {
                    b.written.push_str(line);
                    b.written.push('\n');
                    b.enabled.push_str(rest);
                    b.enabled.push('\n');
                }
                _ => inside = false,
            }
        }
        out
    }

    /// Uncomments the `#! <backend>:` block of config.example.toml and drops the active
    /// `backend = …` line, as the file's comments tell a user to do.
    fn enable_block(text: &str, backend: &str) -> String {
        let marker = format!("#! {backend}:");
        let mut out = String::new();
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("#! ") {
                inside = line.starts_with(&marker);
                continue;
            }
            let line = match (inside, line.strip_prefix("# ")) {
                (true, Some(rest)) => rest,
                _ if line.starts_with("backend =") => continue,
                _ => line,
            };
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    #[test]
    fn full_file_round_trips() {
        let c = parse(
            r#"
listen = "0.0.0.0:9000"
api_token = "s3cret-0123456789"
admins = ["42", "alice"]
drain_timeout_s = 5

[agent]
backend = "openai"
timeout_s = 9
base_url = "http://127.0.0.1:1/v1"
model = "m"
api_key_env = "MY_KEY"
"#,
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9000".parse().unwrap());
        assert!(!c.is_loopback_listen());
        c.check_exposure().unwrap();
        assert_eq!(c.admins, vec!["42", "alice"]);
        assert_eq!(c.agent.backend, BackendKind::Openai);
        assert_eq!(c.agent.api_key_env.as_deref(), Some("MY_KEY"));
        assert!(!format!("{c:?}").contains("s3cret"), "Debug leaks the token");
    }

    #[test]
    fn unknown_key_in_agent_names_file_line_and_key() {
        let e = err("listen = \"127.0.0.1:1\"\n\n[agent]\nbackend = \"echo\"\ndelay = 5\n");
        assert!(
            e.starts_with("/h/config.toml:5: unknown key 'delay' in [agent] (expected one of: backend, delay_ms,"),
            "{e}"
        );
    }

    #[test]
    fn unknown_top_level_key() {
        let p = parse("# c\nlisten = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
        assert_eq!(p.line(), Some(3));
        assert_eq!(p.key(), Some("listen_port"));
        assert_eq!(p.exit_code(), 78);
        let e = p.to_string();
        assert!(
            e.starts_with("/h/config.toml:3: unknown key 'listen_port' (expected one of: listen, api_token"),
            "{e}"
        );
    }

    #[test]
    fn unknown_table_is_an_unknown_key() {
        let e = err("[agent]\n\n[agnet]\nbackend = \"echo\"\n");
        assert!(e.starts_with("/h/config.toml:3: unknown key 'agnet'"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_key() {
        let e = err("listen = \"127.0.0.1:1\"\n\ndrain_timeout_s = \"30\"\n");
        assert!(e.starts_with("/h/config.toml:3: invalid value for 'drain_timeout_s': "), "{e}");
        let e = err("drain_timeout_s = -1\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'drain_timeout_s'"), "{e}");
        let e = err("[agent]\nbackend = \"carrier-pigeon\"\n");
        assert!(
            e.starts_with("/h/config.toml:2: invalid value for 'backend' in [agent]: ") && e.contains("carrier-pigeon"),
            "{e}"
        );
        let e = err("[[agent]]\nbackend = \"echo\"\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'agent': expected a table"), "{e}");
        let e = err("agent = 3\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'agent'"), "{e}");
        let e = err("admins = \"root\"\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'admins'"), "{e}");
        let e = err("[agent]\ncommand = [\"a\", 3]\n");
        assert!(e.starts_with("/h/config.toml:2: invalid value for 'command' in [agent]"), "{e}");
        let e = err("agent = { backend = \"echo\", delay_ms = true }\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'delay_ms' in [agent]"), "{e}");
    }

    #[test]
    fn bad_listen() {
        let e = err("\nlisten = \"localhost\"\n");
        assert!(
            e.starts_with("/h/config.toml:2: invalid value for 'listen': \"localhost\" is not a socket address"),
            "{e}"
        );
    }

    #[test]
    fn syntax_error_has_a_line() {
        let e = parse("listen = \"127.0.0.1:1\"\n[agent\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 2, .. }), "{e}");
        let e = Config::from_bytes(Path::new("/h/config.toml"), b"a = 1\n\xff\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 2, .. }), "{e}");
    }

    #[test]
    fn semantic_checks() {
        let e = err("[agent]\nbackend = \"exec\"\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'command' in [agent]"), "{e}");
        let e = err("[agent]\nbackend = \"exec\"\ncommand = []\n");
        assert!(e.starts_with("/h/config.toml:3: invalid value for 'command' in [agent]"), "{e}");
        let e = err("[agent]\nbackend = \"openai\"\nmodel = \"m\"\n");
        assert!(e.contains("'base_url' in [agent]"), "{e}");
        let e = err("[agent]\nbackend = \"openai\"\nbase_url = \"ftp://x\"\nmodel = \"m\"\n");
        assert!(e.starts_with("/h/config.toml:3: invalid value for 'base_url'"), "{e}");
        let e = err("[agent]\nbackend = \"openai\"\nbase_url = \"http://x\"\n");
        assert!(e.contains("'model' in [agent]"), "{e}");
        let e = err("[agent]\n\ntimeout_s = 0\n");
        assert!(e.starts_with("/h/config.toml:3: invalid value for 'timeout_s' in [agent]"), "{e}");
        let e = err("drain_timeout_s = 99999999999\n");
        assert!(e.contains("'drain_timeout_s'"), "{e}");
        let e = err("api_token = \"\"\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'api_token'"), "{e}");
        let e = err("api_token = \"caf\u{e9}\"\n");
        assert!(e.starts_with("/h/config.toml:1: invalid value for 'api_token'"), "{e}");
        let e = err("api_token = \"two words\"\n");
        assert!(e.contains("'api_token'"), "{e}");
        let e = err("api_token = \"x\"\n");
        assert!(e.contains("'api_token'") && e.contains("at least 16 bytes") && e.contains("openssl rand"), "{e}");
        parse("api_token = \"0123456789abcdef\"\n").unwrap();
        let e = err("[http]\nmax_connections = 0\n");
        assert!(e.starts_with("/h/config.toml:2: invalid value for 'max_connections' in [http]"), "{e}");
        let e = err("[http]\nallowed_hosts = [\"http://x/\"]\n");
        assert!(e.contains("'allowed_hosts' in [http]"), "{e}");
        let e = err("[http]\nheader_timeout_s = 0\n");
        assert!(e.contains("'header_timeout_s' in [http]"), "{e}");
        let e = err("[journal]\nmax_age = 3\n");
        assert!(
            e.contains("unknown key 'max_age' in [journal] (expected one of: max_age_days, max_size_mb, max_queued_per_chat, max_queued)"),
            "{e}"
        );
        let c = parse("[http]\nallowed_hosts = [\"gw.example.com\", \"[::1]:8080\"]\n[journal]\nmax_age_days = 0\n")
            .unwrap();
        assert_eq!(c.http.allowed_hosts.len(), 2);
        assert_eq!(c.journal.max_age(), None);
        let c = parse("[journal]\nmax_queued_per_chat = 2\nmax_queued = 3\n").unwrap();
        assert_eq!(c.journal.queue_refusal(1, 2), None);
        assert!(c.journal.queue_refusal(2, 2).is_some_and(|w| w.contains("max_queued_per_chat = 2")));
        assert!(c.journal.queue_refusal(0, 3).is_some_and(|w| w.contains("max_queued = 3")));
        let c = parse("[journal]\nmax_queued_per_chat = 0\nmax_queued = 0\n").unwrap();
        assert_eq!(c.journal.queue_refusal(u64::MAX, u64::MAX), None, "0 is no cap");
        assert!(err("[journal]\nmax_queued = 99999999999\n").contains("'max_queued' in [journal]"));
        let e = err("[agent]\napi_key_env = \"A=B\"\n");
        assert!(e.contains("'api_key_env'"), "{e}");
        // Keys of another backend are accepted.
        parse("[agent]\nbackend = \"echo\"\ncommand = [\"x\"]\nmodel = \"m\"\n").unwrap();
    }

    /// `ca_file` is read when the configuration is (relative to the home), and a broken one is
    /// a configuration error naming the key; a proxy URL must not carry credentials.
    #[test]
    fn ca_files_and_proxies() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join(CONFIG_FILE);
        let load = |text: &str| Config::from_toml_str(&cfg, text);
        let e = load("[agent]\nca_file = \"missing.pem\"\n").unwrap_err();
        assert_eq!(e.exit_code(), 78);
        let m = e.to_string();
        assert!(m.contains("'ca_file' in [agent]") && m.contains("missing.pem: no such file"), "{m}");
        std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
        let m = load("[update]\nca_file = \"junk.pem\"\n").unwrap_err().to_string();
        assert!(m.contains("'ca_file' in [update]") && m.contains("holds no PEM certificate"), "{m}");
        let tg = "[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\n";
        let m = load(&format!("{tg}proxy = \"http://me:pw123@p:3128\"\n")).unwrap_err().to_string();
        assert!(m.contains("'proxy' in [platform]") && m.contains("credentials") && !m.contains("pw123"), "{m}");
        let c = load(&format!("{tg}proxy = \"socks5h://127.0.0.1:1080\"\n")).unwrap();
        assert_eq!(c.platform[0].proxy(), Some("socks5h://127.0.0.1:1080"));
        assert_eq!(c.platform[0].ca_file, None);
    }

    #[test]
    fn cluster_table() {
        let c =
            parse("[cluster]\nname = \"prod\"\nstore = \"postgres://gw@127.0.0.1:5432/gw\"\npassword_env = \"PGPW\"\n")
                .unwrap();
        let cl = c.cluster.unwrap();
        assert_eq!((cl.lease_ttl_s, cl.renew_interval_s), (15, 5));
        assert_eq!(cl.password_env.as_deref(), Some("PGPW"));
        let e = err("[cluster]\nname = \"p\"\nstore = \"postgres://gw:hunter2@db/gw\"\n");
        assert!(
            e.starts_with("/h/config.toml:3: invalid value for 'store' in [cluster]: must not contain a password"),
            "{e}"
        );
        let e = err("[cluster]\nname = \"p\"\nstore = \"postgres://gw@db/gw?sslmode=allow\"\n");
        assert!(e.contains("'store' in [cluster]") && e.contains("sslmode"), "{e}");
        let mut c = parse("[cluster]\nname = \"p\"\nstore = \"postgres://gw@db/gw?sslmode=verify-full\"\n")
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.store_url(), "postgres://gw@db/gw?sslmode=verify-full");
        c.ca_file = Some("/etc/gw/store ca.pem".into());
        assert_eq!(c.store_url(), "postgres://gw@db/gw?sslmode=verify-full&sslrootcert=/etc/gw/store%20ca.pem");
        let e = err("[cluster]\nname = \"p\"\nstore = \"mysql://db/gw\"\n");
        assert!(e.contains("'store' in [cluster]"), "{e}");
        let e = err("[cluster]\nname = \"a b\"\nstore = \"postgres://db/gw\"\n");
        assert!(e.starts_with("/h/config.toml:2: invalid value for 'name' in [cluster]"), "{e}");
        let e = err("[cluster]\nname = \"p\"\nstore = \"postgres://db/gw\"\nlease_ttl_s = 4\nrenew_interval_s = 3\n");
        assert!(e.starts_with("/h/config.toml:5: invalid value for 'renew_interval_s' in [cluster]"), "{e}");
        let e = err("[cluster]\nname = \"p\"\nstore = \"postgres://db/gw\"\nttl = 4\n");
        assert!(e.contains("unknown key 'ttl' in [cluster] (expected one of: name, store,"), "{e}");
        let e = err("[cluster]\nstore = \"postgres://db/gw\"\n");
        assert!(e.contains("name"), "{e}");
    }

    #[test]
    fn cluster_password_sources() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let base = "[cluster]\nname = \"n\"\nstore = \"postgres://u@h/d\"\n";
        let load =
            |extra: &str| Config::from_toml_str(&dir.path().join(CONFIG_FILE), &format!("{base}{extra}")).unwrap();
        let password = |c: &Config| Secrets::resolve_with(dir.path(), c, &|_| None).get(&SecretId::Cluster);
        let c = load("password_file = \"pw\"\n");
        assert_eq!(c.cluster.as_ref().unwrap().password_file.as_deref(), Some(pw.as_path()), "relative to the home");
        assert_eq!(password(&c).unwrap().unwrap().expose(), "s3cret");
        assert_eq!(password(&load("")).unwrap(), None);
        let e = password(&load("password_env = \"GATEWARDEN_TEST_SURELY_UNSET_VAR\"\n")).unwrap_err();
        assert!(e.contains("GATEWARDEN_TEST_SURELY_UNSET_VAR"), "{e}");
        let both = Config::from_toml_str(
            &dir.path().join(CONFIG_FILE),
            &format!("{base}password_env = \"A\"\npassword_file = \"pw\"\n"),
        )
        .unwrap_err();
        assert!(both.to_string().contains("set password_env or password_file, not both"), "{both}");
    }

    #[test]
    fn exposure_check() {
        let c = parse("listen = \"0.0.0.0:7878\"\n").unwrap();
        let e = c.check_exposure().unwrap_err();
        assert_eq!(e.exit_code(), 78);
        assert!(e.to_string().contains("0.0.0.0:7878"), "{e}");
        let c = parse("listen = \"[::1]:7878\"\n").unwrap();
        assert!(c.is_loopback_listen());
        c.check_exposure().unwrap();
    }

    #[test]
    fn gatewarden_config_names_the_file_and_relative_paths_stay_the_home_s() {
        let home = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let file = elsewhere.path().join("gw.toml");
        std::fs::write(&file, "drain_timeout_s = 7\n[agent]\nbackend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_file = \"key\"\n").unwrap();
        // The home's own file is not read when the variable names another.
        std::fs::write(home.path().join(CONFIG_FILE), "drain_timeout_s = 99\n").unwrap();
        let var = file.to_string_lossy().into_owned();
        let env = |k: &str| (k == "GATEWARDEN_CONFIG").then(|| var.clone());
        let c = Config::load_with_env(home.path(), &env).unwrap();
        assert_eq!(c.drain_timeout_s, 7);
        assert_eq!(c.agent.api_key_file.as_deref(), Some(home.path().join("key").as_path()));
        // Errors name the file that was read.
        std::fs::write(&file, "drain_timeout_s = \"x\"\n").unwrap();
        let e = Config::load_with_env(home.path(), &env).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:1:", file.display())), "{e}");
    }

    #[test]
    fn unreadable_path_is_a_read_error() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading fails with something other than NotFound.
        std::fs::create_dir(dir.path().join(CONFIG_FILE)).unwrap();
        let e = Config::load(dir.path()).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
        assert_eq!(e.exit_code(), 78);
    }

    /// Closed by default: no `access` key is pairing, except where a sender can be forged
    /// (allowlist); `open` is written out; pairing is refused where it could be abused.
    #[test]
    fn access_defaults_per_kind_and_its_keys_validate() {
        let tg = "[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\n";
        let c = parse(tg).unwrap();
        let p = &c.platform[0];
        assert_eq!((p.access, p.access(), p.require_mention), (None, Access::Pairing, true));
        let c = parse(&format!("{tg}access = \"open\"\nallowed_users = [\"7\"]\nrequire_mention = false\n")).unwrap();
        let p = &c.platform[0];
        assert_eq!(
            (p.access(), p.allowed_users.as_slice(), p.require_mention),
            (Access::Open, &["7".to_owned()][..], false)
        );
        assert_eq!(parse(&format!("{tg}access = \"allowlist\"\n")).unwrap().platform[0].access(), Access::Allowlist);
        let e = parse(&format!("{tg}access = \"everyone\"\n")).unwrap_err();
        assert_eq!(e.key(), Some("access"), "{e}");
        assert!(err(&format!("{tg}allowed_users = [\" \"]\n")).contains("allowed_users"));
        let irc = "[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"gw\"\n";
        assert_eq!(parse(irc).unwrap().platform[0].access(), Access::Allowlist, "an IRC nick can be taken by anyone");
        let e = err(&format!("{irc}access = \"pairing\"\n"));
        assert!(e.contains("access") && e.contains("forged"), "{e}");
        assert_eq!(parse(&format!("{irc}access = \"open\"\n")).unwrap().platform[0].access(), Access::Open);
        let mail = "[[platform]]\nkind = \"email\"\ntoken_env = \"PW\"\nimap = \"imaps://h\"\nsmtp = \"smtp://h:587\"\naccount = \"bot@h\"\n";
        assert_eq!(parse(mail).unwrap().platform[0].access(), Access::Allowlist);
        assert!(err(&format!("{mail}access = \"pairing\"\n")).contains("forged"));
        let dc = "[[platform]]\nkind = \"discord\"\ntoken_env = \"D\"\n";
        assert!(err(&format!("{dc}allowed_users = [\"bob\"]\n")).contains("snowflakes"));
        assert!(PlatformKind::Irc.forgeable() && PlatformKind::Email.forgeable() && !PlatformKind::Xmpp.forgeable());
    }

    /// Each `[[platform]]` table is read by its kind, and its errors keep their file, line and
    /// key: a type error names the key, an unknown key suggests the one meant or names the kinds
    /// that take it, and a check of the second table points into the second table.
    #[test]
    fn platform_errors_are_located_in_their_own_table() {
        let tg = "[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\n";
        let e = err(&format!("{tg}admins = [123]\n"));
        assert!(e.starts_with("/h/config.toml:4: invalid value for 'admins' in [platform]: expected a string"), "{e}");
        let e = parse("[[platform]]\nkind = \"telegram\"\ntoken = \"T\"\n").unwrap_err();
        assert_eq!((e.line(), e.key()), (Some(3), Some("token")), "{e}");
        let e = e.to_string();
        assert!(e.contains("unknown key 'token' in [platform]") && e.ends_with("did you mean 'token_env'?"), "{e}");
        assert!(e.contains("expected one of: kind, name, token_env") && e.contains("poll_timeout_s"), "{e}");
        let e = err(&format!("{tg}pol_timeout_s = 3\n"));
        assert!(e.ends_with("did you mean 'poll_timeout_s'?"), "{e}");
        let e = err("[[platform]]\nkind = \"discord\"\ntoken_env = \"D\"\npoll_timeout_s = 3\n");
        assert!(e.ends_with("poll_timeout_s is for kind = \"telegram\", \"matrix\" or \"email\" only"), "{e}");
        assert!(e.contains("ca_file, api_base)"), "discord's own keys: {e}");
        // The second table's own line, though the first has the same key.
        let irc = "[[platform]]\nkind = \"irc\"\nserver = \"h\"\nnick = \"a\"\n";
        let e =
            parse(&format!("{irc}[[platform]]\nkind = \"irc\"\nname = \"b\"\nserver = \"h\"\nnick = \"two words\"\n"))
                .unwrap_err();
        assert_eq!((e.line(), e.key()), (Some(9), Some("nick")), "{e}");
        let e = parse(&format!("{tg}\n[[platform]]\nname = \"x\"\n")).unwrap_err();
        assert_eq!((e.line(), e.key()), (Some(6), Some("kind")), "{e}");
        let e = parse(&format!("{tg}[[platform]]\nkind = \"icq\"\n")).unwrap_err();
        assert_eq!((e.line(), e.key()), (Some(5), Some("kind")), "{e}");
        assert!(e.to_string().contains("expected one of: telegram, matrix, irc, xmpp, discord, email, slack"), "{e}");
        let e = parse("platform = 3\n").unwrap_err();
        assert_eq!((e.line(), e.key()), (Some(1), Some("platform")), "{e}");
        // Inline tables (what GATEWARDEN_PLATFORM holds) read the same.
        let c = parse("platform = [{kind = \"irc\", server = \"h\", nick = \"n\", tls = true}]\n").unwrap();
        assert_eq!(c.platform[0].own::<platform::Irc>().and_then(|i| i.addr()).as_deref(), Some("h:6697"));
    }

    /// Serde's own view of a table (`#[serde(tag = "kind")]`, no spans) reads what the file's
    /// loader reads, and writes the flat table back.
    #[test]
    fn platform_tables_round_trip_through_serde() {
        let text = "[[platform]]\nkind = \"slack\"\nname = \"s\"\ntoken_env = \"A\"\nbot_token_env = \"B\"\nadmins = [\"U1\"]\n";
        let loaded = parse(text).unwrap().platform.remove(0);
        let value = toml::Value::try_from(&loaded).unwrap();
        assert_eq!(value.get("kind").and_then(|k| k.as_str()), Some("slack"));
        assert_eq!(value.get("bot_token_env").and_then(|k| k.as_str()), Some("B"), "flat, as the file has it");
        let back: PlatformConfig = value.try_into().unwrap();
        assert_eq!(back, loaded);
        let bad: Result<PlatformConfig, _> =
            toml::from_str::<toml::Value>("kind = \"slack\"\nnick = \"x\"\n").unwrap().try_into();
        assert!(bad.is_err());
        for kind in PlatformKind::ALL {
            assert_eq!(PlatformConfig::new(*kind).kind(), *kind);
            assert!(kind.keys().contains(&"ca_file") && kind.keys().contains(&"kind"));
        }
    }

    #[test]
    fn email_platforms_validate_their_keys() {
        let ok = "[[platform]]\nkind = \"email\"\ntoken_env = \"PW\"\nimap = \"imaps://h\"\nsmtp = \"smtp://h:587\"\naccount = \"bot@h\"\n";
        let c = parse(&format!("{ok}allowed_senders = [\"a@h\", \"@x.org\"]\n")).unwrap();
        let PlatformSettings::Email(mail) = &c.platform[0].settings else { panic!("{c:?}") };
        assert_eq!(mail.allowed_senders.len(), 2);
        assert!(err(&ok.replace("imaps://h", "https://h")).contains("needs imap"));
        assert!(err(&ok.replace("smtp://h:587", "h:587")).contains("needs smtp"));
        assert!(err(&ok.replace("bot@h", "bot")).contains("needs account"));
        assert!(err(&ok.replace("token_env = \"PW\"\n", "")).contains("needs token_env"));
        assert!(err(&format!("{ok}allowed_senders = [\"nobody\"]\n")).contains("allowed_senders"));
        assert!(err(&format!("{ok}allowed_chats = [\"x\"]\n")).contains("allowed_senders"));
        assert!(err(&format!("{ok}nick = \"x\"\n")).contains("irc"));
        assert!(err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\naccount = \"a@b\"\n").contains("email"));
    }

    #[test]
    fn xmpp_platforms_validate_their_keys() {
        let x = parse(
            "[[platform]]\nkind = \"xmpp\"\ntoken_env = \"XP\"\njid = \"bot@example.org\"\n\
             rooms = [\"ops@conference.example.org\"]\nserver = \"127.0.0.1:5222\"\nnick = \"gw\"\n\
             allowed_chats = [\"me@example.org\"]\n",
        )
        .unwrap();
        let PlatformSettings::Xmpp(xmpp) = &x.platform[0].settings else { panic!("{x:?}") };
        assert_eq!(xmpp.jid.as_deref(), Some("bot@example.org"));
        let base = "[[platform]]\nkind = \"xmpp\"\ntoken_env = \"XP\"\n";
        assert!(err(base).contains("needs jid"));
        for bad_jid in ["bot", "bot@", "@d", "a b@d", "bot@d/res", "a@b@c"] {
            assert!(err(&format!("{base}jid = \"{bad_jid}\"\n")).contains("jid"), "{bad_jid}");
        }
        let with = |extra: &str| err(&format!("{base}jid = \"b@d\"\n{extra}"));
        assert!(with("rooms = [\"no-domain\"]\n").contains("rooms"));
        assert!(with("allowed_chats = [\"#chan\"]\n").contains("allowed_chats"));
        assert!(with("server = \"h h\"\n").contains("server"));
        assert!(with("tls = true\n").contains("irc"));
        assert!(with("proxy = \"http://p:1\"\n").contains("proxy"));
        assert!(err("[[platform]]\nkind = \"xmpp\"\njid = \"b@d\"\n").contains("token_env"));
        assert!(err("[[platform]]\nkind = \"irc\"\nserver = \"h\"\nnick = \"b\"\njid = \"b@d\"\n").contains("xmpp"));
    }

    #[test]
    fn discord_platforms_validate_their_keys() {
        let d = parse(
            "[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\nallowed_chats = [\"123\"]\nadmins = [\"42\"]\n",
        )
        .unwrap();
        assert_eq!((d.platform[0].kind(), d.platform[0].adapter_name().as_str()), (PlatformKind::Discord, "discord"));
        assert!(err("[[platform]]\nkind = \"discord\"\n").contains("needs token_env"));
        assert!(
            err("[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\nallowed_chats = [\"#general\"]\n")
                .contains("snowflakes")
        );
        assert!(
            err("[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\nadmins = [\"me\"]\n").contains("snowflakes")
        );
        assert!(
            err("[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\nproxy = \"http://p:1\"\n")
                .contains("proxy is for kind = \"telegram\" or \"matrix\" only")
        );
        assert!(
            err("[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\napi_base = \"ftp://x\"\n").contains("http://")
        );
        assert!(err("[[platform]]\nkind = \"discord\"\ntoken_env = \"DT\"\nnick = \"x\"\n").contains("irc"));
    }

    /// The API token is a secret like the others: written in the file, or named by a variable
    /// or a file (relative to the home), one of the three; a non-loopback listener accepts any.
    #[test]
    fn the_api_token_is_written_or_named_by_a_variable_or_a_file() {
        let c = parse("api_token_file = \"api.token\"\nlisten = \"0.0.0.0:7878\"\n").unwrap();
        assert_eq!(c.api_token_file.as_deref(), Some(Path::new("/h/api.token")));
        assert!(c.has_api_token() && c.check_exposure().is_ok());
        let c = parse("api_token_env = \"GW_TOKEN\"\nlisten = \"0.0.0.0:7878\"\n").unwrap();
        assert!(c.check_exposure().is_ok());
        let open = parse("listen = \"0.0.0.0:7878\"\n").unwrap().check_exposure().unwrap_err().to_string();
        assert!(open.contains("api_token_file"), "{open}");
        let e = err("api_token_env = \"A\"\napi_token_file = \"f\"\n");
        assert!(e.contains("set api_token_env or api_token_file, not both"), "{e}");
        let e = err("api_token = \"0123456789abcdef\"\napi_token_file = \"f\"\n");
        assert!(e.contains("'api_token_file'") && e.contains("not two of them"), "{e}");
        assert!(err("api_token_env = \"\"\n").contains("name of an environment variable"));
        let dir = tempfile::tempdir().unwrap();
        let c = Config::from_toml_str(&dir.path().join(CONFIG_FILE), "api_token_file = \"t\"\n").unwrap();
        let resolve = |c: &Config| Secrets::resolve_with(dir.path(), c, &|_| None);
        let tok = dir.path().join("t");
        std::fs::write(&tok, "0123456789abcdef0123\n").unwrap();
        #[cfg(unix)]
        std::fs::set_permissions(&tok, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert_eq!(resolve(&c).api_token().map(|t| t.expose().to_owned()).as_deref(), Some("0123456789abcdef0123"));
        assert_eq!(resolve(&c).report()[0].secret, "api_token");
        std::fs::write(&tok, "too-short\n").unwrap();
        let s = resolve(&c);
        assert_eq!(s.api_token(), None);
        let p = s.problems();
        assert!(p.len() == 1 && p[0].starts_with("api_token: the value of api_token_file"), "{p:?}");
        assert!(p[0].contains("at least 16 bytes") && !p[0].contains("too-short"), "{p:?}");
        // Written in the file, it needs no resolving.
        let inline = parse("api_token = \"0123456789abcdef\"\n").unwrap();
        assert_eq!(resolve(&inline).api_token().map(|t| t.expose().to_owned()).as_deref(), Some("0123456789abcdef"));
        assert!(inline.secret_specs().is_empty());
    }

    /// Every secret can be named by a variable or a file, never both, and only where its
    /// platform reads it; files are relative to the home.
    #[test]
    fn secrets_are_named_by_a_variable_or_a_file() {
        let c = parse("[[platform]]\nkind = \"telegram\"\ntoken_file = \"tg.token\"\n").unwrap();
        assert_eq!(c.platform[0].token_file.as_deref(), Some(Path::new("/h/tg.token")));
        let both = err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\ntoken_file = \"t\"\n");
        assert!(both.contains("'token_file'") && both.contains("set token_env or token_file, not both"), "{both}");
        assert!(err("[[platform]]\nkind = \"telegram\"\n").contains("needs token_env"));
        let slack = "[[platform]]\nkind = \"slack\"\ntoken_file = \"/a\"\nbot_token_file = \"/b\"\n";
        let c = parse(slack).unwrap();
        assert_eq!(c.platform[0].own::<platform::Slack>().unwrap().bot_token_file.as_deref(), Some(Path::new("/b")));
        assert!(
            err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\nbot_token_file = \"b\"\n").contains("slack")
        );
        assert!(
            err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\nsasl_password_file = \"p\"\n").contains("irc")
        );
        let irc = "[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"n\"\nsasl_password_file = \"p\"\n";
        let c = parse(irc).unwrap();
        assert_eq!(
            c.platform[0].own::<platform::Irc>().unwrap().sasl_password_file.as_deref(),
            Some(Path::new("/h/p"))
        );
        let p = "[agent]\nbackend = \"openai\"\n[[agent.provider]]\nbase_url = \"http://a/v1\"\nmodel = \"m\"\n";
        let e = err(&format!("{p}api_key_env = \"K\"\napi_key_file = \"k\"\n"));
        assert!(e.contains("set api_key_env or api_key_file, not both"), "{e}");
        let c = parse(&format!("{p}api_key_file = \"k\"\n")).unwrap();
        assert_eq!(c.agent.provider[0].api_key_file.as_deref(), Some(Path::new("/h/k")));
        let hermes = "[agent]\nbackend = \"hermes\"\nbase_url = \"http://127.0.0.1:8642\"\napi_key_file = \"k\"\n";
        assert_eq!(parse(hermes).unwrap().agent.api_key_file.as_deref(), Some(Path::new("/h/k")));
    }

    #[test]
    fn slack_needs_both_tokens_and_no_proxy() {
        let ok = "[[platform]]\nkind = \"slack\"\ntoken_env = \"SLACK_APP\"\nbot_token_env = \"SLACK_BOT\"\n";
        let s = parse(ok).unwrap();
        assert_eq!((s.platform[0].kind(), s.platform[0].adapter_name().as_str()), (PlatformKind::Slack, "slack"));
        let PlatformSettings::Slack(slack) = &s.platform[0].settings else { panic!("{s:?}") };
        assert_eq!(slack.bot_token_env.as_deref(), Some("SLACK_BOT"));
        assert!(err("[[platform]]\nkind = \"slack\"\ntoken_env = \"A\"\n").contains("needs bot_token_env"));
        assert!(err("[[platform]]\nkind = \"slack\"\nbot_token_env = \"B\"\n").contains("needs token_env"));
        assert!(err(&format!("{ok}proxy = \"http://p:3128\"\n")).contains("proxy is for kind"));
        assert!(err(&format!("{ok}api_base = \"slack.com\"\n")).contains("http://"));
        assert!(
            err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\nbot_token_env = \"B\"\n")
                .contains("slack\" only")
        );
    }

    #[test]
    fn matrix_and_irc_platforms_validate_their_keys() {
        let m = parse("[[platform]]\nkind = \"matrix\"\ntoken_env = \"MX\"\napi_base = \"http://127.0.0.1:8008\"\nallowed_chats = [\"!r:hs\"]\n").unwrap();
        assert_eq!((m.platform[0].kind(), m.platform[0].adapter_name().as_str()), (PlatformKind::Matrix, "matrix"));
        assert!(err("[[platform]]\nkind = \"matrix\"\ntoken_env = \"MX\"\n").contains("needs api_base"));
        assert!(err("[[platform]]\nkind = \"matrix\"\napi_base = \"http://h:1\"\n").contains("needs token_env"));
        assert!(err("[[platform]]\nkind = \"matrix\"\ntoken_env = \"MX\"\napi_base = \"h:1\"\n").contains("http://"));
        assert!(
            err("[[platform]]\nkind = \"matrix\"\ntoken_env = \"MX\"\napi_base = \"http://h:1\"\nnick = \"x\"\n")
                .contains("irc")
        );

        // IRC: the password is optional; server and nick are required.
        let i = parse("[[platform]]\nkind = \"irc\"\nserver = \"127.0.0.1:6667\"\nnick = \"gwbot\"\nallowed_chats = [\"#gw\", \"alice\"]\n").unwrap();
        assert_eq!(
            i.platform[0].own::<platform::Irc>().map(|i| (i.server.as_deref(), i.nick.as_deref())).unwrap(),
            (Some("127.0.0.1:6667"), Some("gwbot"))
        );
        assert!(err("[[platform]]\nkind = \"irc\"\nnick = \"gwbot\"\n").contains("server"));
        // A bare host takes the port from `tls`: 6697 with TLS, else 6667.
        let irc = |extra: &str| parse(&format!("[[platform]]\nkind = \"irc\"\nnick = \"gwbot\"\n{extra}")).unwrap();
        assert_eq!(
            irc("server = \"h\"\n").platform[0].own::<platform::Irc>().unwrap().addr().as_deref(),
            Some("h:6667")
        );
        assert_eq!(
            irc("server = \"h\"\ntls = true\n").platform[0].own::<platform::Irc>().unwrap().addr().as_deref(),
            Some("h:6697")
        );
        assert_eq!(
            irc("server = \"h:7000\"\ntls = true\n").platform[0].own::<platform::Irc>().unwrap().addr().as_deref(),
            Some("h:7000")
        );
        assert_eq!(
            irc("server = \"[::1]:7000\"\n").platform[0].own::<platform::Irc>().unwrap().addr().as_deref(),
            Some("[::1]:7000")
        );
        assert!(err("[[platform]]\nkind = \"irc\"\nserver = \"h h\"\nnick = \"gwbot\"\n").contains("host:port"));
        assert!(err("[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\ntls = true\n").contains("irc"));
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h\"\nnick = \"b\"\nproxy = \"http://p:1\"\n")
                .contains("proxy")
        );
        assert!(err("[[platform]]\nkind = \"irc\"\nserver = \"h:0\"\nnick = \"gwbot\"\n").contains("port"));
        assert!(err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\n").contains("needs nick"));
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"two words\"\n").contains("needs nick")
        );
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"b\"\nallowed_chats = [\"#a,#b\"]\n")
                .contains("allowed_chats")
        );
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"b\"\napi_base = \"http://h\"\n")
                .contains("api_base is for kind")
        );
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"b\"\ntoken_env = \"\"\n")
                .contains("token_env")
        );
        assert!(
            err("[[platform]]\nkind = \"irc\"\nserver = \"h:6667\"\nnick = \"b\"\nchannels = []\n")
                .contains("channels")
        );
    }
}
