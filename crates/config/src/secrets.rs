//! Secrets: the one resolver every consumer goes through (the platforms, the agent backends, the
//! cluster store; `check`, `doctor` and `status` report it).
//!
//! A secret is named in config.toml one of two ways, never both: `<what>_env = "NAME"` (a
//! variable) or `<what>_file = "PATH"` (a file, relative to the home). The gateway resolves each
//! when it is prepared, in its own process, so every start path (`run`, `start`, `restart`, a
//! successor, the backstop, an update's candidate, the dashboard, a service manager) finds the
//! same secrets in the same places:
//!
//! - `<what>_file`: `$CREDENTIALS_DIRECTORY/<id>` when systemd loaded it (the generated unit's
//!   `LoadCredential=<id>:PATH`, [`credential_id`]), else the file itself.
//! - `<what>_env`: the line `NAME=…` of `<home>/secrets.env`, else the variable in the
//!   process's environment. The file wins: a successor inherits its predecessor's environment,
//!   so only the file changes what the next start sees.
//!
//! Files follow lifecycle fsio's rules for secrets (`read_private`: a regular file of ours or
//! root's that nobody else can write or read (our group may read it), at most 64 KiB, reached
//! through folders and links nobody else could have changed); a trailing newline is trimmed. Nothing here
//! ever formats a value: [`Secret`] prints as `<redacted>`, and every message names where a
//! secret was looked for, never what was found.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, MAX_SECRET_BYTES, ReadOutcome};
use serde::Serialize;

use crate::{BackendKind, Config};

/// The optional file of `NAME=value` lines in the home.
pub const SECRETS_FILE: &str = "secrets.env";
/// The variable systemd sets to the directory of a unit's loaded credentials.
pub const CREDENTIALS_ENV: &str = "CREDENTIALS_DIRECTORY";

/// A secret value. Its `Debug` and `Display` never show it; [`Secret::expose`] is the one way
/// to the value, at the place it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the request or the login that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(v: String) -> Secret {
        Secret(v)
    }
}

impl From<&str> for Secret {
    fn from(v: &str) -> Secret {
        Secret(v.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Which secret of a `[[platform]]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlatformSecret {
    /// `token_*`: the credential (IRC: the server password).
    Token,
    /// `bot_token_*`: Slack's bot token.
    BotToken,
    /// `sasl_password_*`: IRC's SASL password.
    SaslPassword,
    /// `app_secret_*`: WhatsApp's app secret (the webhook's signatures).
    AppSecret,
    /// `verify_token_*`: WhatsApp's webhook verify token.
    VerifyToken,
    /// `secret_*`: a webhook's HMAC secret (its signatures, in and out).
    Secret,
}

impl PlatformSecret {
    fn key(self) -> &'static str {
        match self {
            PlatformSecret::Token => "token",
            PlatformSecret::BotToken => "bot_token",
            PlatformSecret::SaslPassword => "sasl_password",
            PlatformSecret::AppSecret => "app_secret",
            PlatformSecret::VerifyToken => "verify_token",
            PlatformSecret::Secret => "secret",
        }
    }
}

/// Which secret of the configuration.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretId {
    /// `api_token_*`: the HTTP API's bearer token.
    ApiToken,
    /// A `[[platform]]` table's, by adapter name.
    Platform { name: String, what: PlatformSecret },
    /// `[agent] api_key_*`: the openai backend's one upstream, or hermes's API server.
    Agent,
    /// `[[agent.provider]] api_key_*`, by provider name.
    Provider { name: String },
    /// `[cluster] password_*`: the store's password.
    Cluster,
    /// `[agent.transcription] api_key_*`: its one provider.
    Transcription,
    /// `[[agent.transcription.provider]] api_key_*`, by provider name.
    TranscriptionProvider { name: String },
}

/// How config.toml names a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// `<what>_env`: a variable name.
    Env(String),
    /// `<what>_file`: an absolute path (made so against the home when loaded).
    File(PathBuf),
}

/// One secret the configuration uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    pub id: SecretId,
    pub named: Named,
}

impl SecretSpec {
    /// The key stem: `api_token`, `token`, `bot_token`, `sasl_password`, `api_key`, `password`.
    pub fn key(&self) -> &'static str {
        match &self.id {
            SecretId::ApiToken => "api_token",
            SecretId::Platform { what, .. } => what.key(),
            SecretId::Agent
            | SecretId::Provider { .. }
            | SecretId::Transcription
            | SecretId::TranscriptionProvider { .. } => "api_key",
            SecretId::Cluster => "password",
        }
    }

    /// `[[platform]] "tg" token`, `[[agent.provider]] "openai" api_key`, `[cluster] password`.
    pub fn what(&self) -> String {
        match &self.id {
            SecretId::ApiToken => "api_token".into(),
            SecretId::Platform { name, what } => format!("[[platform]] {name:?} {}", what.key()),
            SecretId::Agent => "[agent] api_key".into(),
            SecretId::Provider { name } => format!("[[agent.provider]] {name:?} api_key"),
            SecretId::Cluster => "[cluster] password".into(),
            SecretId::Transcription => "[agent.transcription] api_key".into(),
            SecretId::TranscriptionProvider { name } => format!("[[agent.transcription.provider]] {name:?} api_key"),
        }
    }

    /// `token_env TELEGRAM_BOT_TOKEN` or `token_file /path`.
    pub fn named_as(&self) -> String {
        match &self.named {
            Named::Env(var) => format!("{}_env {var}", self.key()),
            Named::File(path) => format!("{}_file {}", self.key(), path.display()),
        }
    }
}

/// The systemd credential name under which a unit loads `path` (`LoadCredential=<id>:<path>`):
/// the file's name and a hash of the whole path, so two files of the same name never meet and
/// an id always means the same file. Stable across versions: installed units carry it.
pub fn credential_id(path: &Path) -> String {
    // FNV-1a, 64 bits: tiny, dependency-free and fixed forever.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.to_string_lossy().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let stem: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .take(64)
        .collect();
    format!("gatewarden.{stem}.{h:016x}")
}

impl Config {
    /// Every secret this configuration uses: the API token's, the platforms', the running backend's (openai:
    /// the providers', hermes: its API server key), the cluster store's. Keys of a backend that
    /// is not selected name nothing that is read.
    pub fn secret_specs(&self) -> Vec<SecretSpec> {
        let mut out = Vec::new();
        let mut push = |id: SecretId, env: &Option<String>, file: &Option<PathBuf>| {
            let named = match (env, file) {
                (_, Some(f)) => Named::File(f.clone()),
                (Some(v), None) => Named::Env(v.clone()),
                (None, None) => return,
            };
            out.push(SecretSpec { id, named });
        };
        push(SecretId::ApiToken, &self.api_token_env, &self.api_token_file);
        for p in &self.platform {
            let name = p.adapter_name();
            let id = |what| SecretId::Platform { name: name.clone(), what };
            push(id(PlatformSecret::Token), &p.token_env, &p.token_file);
            for (what, env, file) in p.settings.secrets() {
                push(id(what), &env.map(str::to_owned), &file.map(Path::to_path_buf));
            }
        }
        let a = &self.agent;
        match a.backend {
            BackendKind::Openai if !a.provider.is_empty() => {
                for p in &a.provider {
                    push(SecretId::Provider { name: p.display_name() }, &p.api_key_env, &p.api_key_file);
                }
            }
            BackendKind::Openai | BackendKind::Hermes => push(SecretId::Agent, &a.api_key_env, &a.api_key_file),
            BackendKind::Echo | BackendKind::Exec => {}
        }
        // Every backend: the transcript is text.
        if let Some(t) = &a.transcription {
            match t.provider.is_empty() {
                true => push(SecretId::Transcription, &t.api_key_env, &t.api_key_file),
                false => {
                    for p in &t.provider {
                        push(
                            SecretId::TranscriptionProvider { name: p.display_name() },
                            &p.api_key_env,
                            &p.api_key_file,
                        );
                    }
                }
            }
        }
        if let Some(c) = &self.cluster {
            push(SecretId::Cluster, &c.password_env, &c.password_file);
        }
        out
    }

    /// `(credential id, file)` of every `*_file` secret: the generated systemd unit loads each
    /// (`LoadCredential=`), and the gateway then reads systemd's copy.
    pub fn credential_files(&self) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = Vec::new();
        for s in self.secret_specs() {
            if let Named::File(path) = s.named
                && !out.iter().any(|(_, p)| *p == path)
            {
                out.push((credential_id(&path), path));
            }
        }
        out
    }
}

/// Where a secret was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// systemd's copy of a `*_file` (`$CREDENTIALS_DIRECTORY/<id>`).
    Credential(PathBuf),
    /// The `*_file` itself.
    File(PathBuf),
    /// `<home>/secrets.env`.
    SecretsEnv(PathBuf),
    /// The process's environment.
    Environment,
}

impl Source {
    /// `systemd-credential`, `file`, `secrets.env` or `environment` (status, docs/protocol.md).
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Credential(_) => "systemd-credential",
            Source::File(_) => "file",
            Source::SecretsEnv(_) => "secrets.env",
            Source::Environment => "environment",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Credential(p) => write!(f, "the systemd credential {}", p.display()),
            Source::File(p) | Source::SecretsEnv(p) => write!(f, "{}", p.display()),
            Source::Environment => f.write_str("the environment"),
        }
    }
}

/// Why a named secret cannot be had. Says where it was looked for, never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// `<what>_env` names a variable that neither `secrets.env` nor the environment sets.
    Unset { var: String, env_file: PathBuf },
    /// Set, but empty.
    Empty { source: Source },
    /// A file (the `*_file` or systemd's copy) that cannot be used.
    File { path: PathBuf, why: String },
    /// Found, but not usable as what it is for (an API token too short): says why, never the
    /// value.
    Invalid { source: Source, why: String },
}

/// A found secret and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub value: Secret,
    pub source: Source,
}

/// One secret of the configuration, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub spec: SecretSpec,
    pub outcome: Result<Found, Problem>,
}

impl Entry {
    /// The problem in words, with how to provide the secret; `None` when it was found.
    pub fn problem(&self) -> Option<String> {
        let p = self.outcome.as_ref().err()?;
        let (what, key) = (self.spec.what(), self.spec.key());
        Some(match p {
            Problem::Unset { var, env_file } => format!(
                "{what}: {var} ({key}_env) is set in neither {} nor the environment; add the line {var}=… to {} (mode 0600), or name a file with {key}_file",
                env_file.display(),
                env_file.display()
            ),
            Problem::Empty { source } => {
                format!("{what}: {} is empty in {source}", self.spec.named_as())
            }
            Problem::Invalid { source, why } => {
                format!("{what}: the value of {} in {source} {why}", self.spec.named_as())
            }
            Problem::File { path, why } => {
                let shown = path.display().to_string();
                let why = if why.contains(&shown) { why.clone() } else { format!("{shown}: {why}") };
                format!("{what}: {key}_file {why}")
            }
        })
    }

    /// For a secret found only in the environment (`whose`: "this shell", "this process"):
    /// that a service, the dashboard and a restart's successor may not have it, and where to
    /// put it instead.
    pub fn only_in_environment(&self, env_file: &Path, whose: &str) -> Option<String> {
        let Ok(Found { source: Source::Environment, .. }) = &self.outcome else { return None };
        let Named::Env(var) = &self.spec.named else { return None };
        Some(format!(
            "{}: {var} ({}_env) comes only from the environment of {whose}; a service, the dashboard's Start and a restart's successor do not have it: add the line {var}=… to {} (mode 0600)",
            self.spec.what(),
            self.spec.key(),
            env_file.display()
        ))
    }
}

/// One secret as `status --json` reports it (docs/protocol.md): what, how it is named, where it
/// was found or why not. Never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub secret: String,
    pub named: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// `<home>/secrets.env` as read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EnvFile {
    Absent,
    /// The values are secrets too: a `Debug` of [`Secrets`] shows none.
    Loaded(Vec<(String, Secret)>),
    Unusable(String),
}

/// Every secret of a configuration, resolved once (at a gateway's preparation, a reload, a
/// `check` or a `doctor`). Cheap to call again: a reload re-reads everything afresh.
#[derive(Debug, Clone)]
pub struct Secrets {
    env_file_path: PathBuf,
    env_file: EnvFile,
    entries: Vec<Entry>,
    /// `api_token` written in config.toml itself (the other secrets never are).
    inline_api_token: Option<Secret>,
}

/// The secrets a configuration needs are not all there. Lists each problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.join("; "))]
pub struct SecretsError {
    pub problems: Vec<String>,
}

impl SecretsError {
    /// Fatal configuration: the exit table's code (78).
    pub fn exit_code(&self) -> i32 {
        i32::from(gatewarden_lifecycle::exit::ExitIntent::FatalConfig.code())
    }
}

impl Secrets {
    /// Resolves `config`'s secrets for `home` from this process's environment.
    pub fn resolve(home: &Path, config: &Config) -> Secrets {
        Secrets::resolve_with(home, config, &|k| std::env::var_os(k))
    }

    /// Without a home: this process's environment and the `*_file`s only (a backend built
    /// outside a gateway: tests, embedding).
    pub fn from_environment(config: &Config) -> Secrets {
        Secrets::with_env_file(PathBuf::from(SECRETS_FILE), EnvFile::Absent, config, &|k| std::env::var_os(k))
    }

    /// [`Secrets::resolve`] with the environment injected.
    pub fn resolve_with(home: &Path, config: &Config, env: &dyn Fn(&str) -> Option<OsString>) -> Secrets {
        let env_file_path = home.join(SECRETS_FILE);
        let env_file = match fsio::read_private(&env_file_path, MAX_SECRET_BYTES) {
            ReadOutcome::Missing => EnvFile::Absent,
            ReadOutcome::Ok(bytes) => match parse_env_file(&bytes) {
                Ok(lines) => EnvFile::Loaded(lines.into_iter().map(|(k, v)| (k, Secret(v))).collect()),
                Err(why) => EnvFile::Unusable(format!("{}: {why}", env_file_path.display())),
            },
            ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
                EnvFile::Unusable(if why.contains(&env_file_path.display().to_string()) {
                    why
                } else {
                    format!("{}: {why}", env_file_path.display())
                })
            }
        };
        Secrets::with_env_file(env_file_path, env_file, config, env)
    }

    fn with_env_file(
        env_file_path: PathBuf,
        env_file: EnvFile,
        config: &Config,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Secrets {
        let credentials = env(CREDENTIALS_ENV).map(PathBuf::from).filter(|d| d.is_absolute());
        let inline_api_token = config.api_token.clone().map(Secret);
        let mut s = Secrets { env_file_path, env_file, entries: Vec::new(), inline_api_token };
        s.entries = config
            .secret_specs()
            .into_iter()
            .map(|spec| {
                let outcome = s.lookup(&spec.named, credentials.as_deref(), env).and_then(|f| usable(&spec.id, f));
                Entry { spec, outcome }
            })
            .collect();
        s
    }

    fn lookup(
        &self,
        named: &Named,
        credentials: Option<&Path>,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Found, Problem> {
        match named {
            Named::File(path) => {
                if let Some(dir) = credentials {
                    let copy = dir.join(credential_id(path));
                    if let Some(found) = read_file(&copy, Source::Credential(copy.clone())).transpose() {
                        return found;
                    }
                }
                match read_file(path, Source::File(path.clone())) {
                    Ok(Some(found)) => Ok(found),
                    Ok(None) => Err(Problem::File { path: path.clone(), why: "no such file".into() }),
                    Err(p) => Err(p),
                }
            }
            Named::Env(var) => {
                let from_file = match &self.env_file {
                    EnvFile::Loaded(lines) => lines.iter().find(|(k, _)| k == var).map(|(_, v)| v.0.clone()),
                    EnvFile::Absent | EnvFile::Unusable(_) => None,
                };
                let (value, source) = match from_file {
                    Some(v) => (v, Source::SecretsEnv(self.env_file_path.clone())),
                    None => match env(var) {
                        Some(v) => (v.to_string_lossy().trim().to_owned(), Source::Environment),
                        None => {
                            return Err(Problem::Unset { var: var.clone(), env_file: self.env_file_path.clone() });
                        }
                    },
                };
                if value.is_empty() {
                    return Err(Problem::Empty { source });
                }
                Ok(Found { value: Secret(value), source })
            }
        }
    }

    /// Each secret, in the order of the configuration.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// `<home>/secrets.env`.
    pub fn env_file(&self) -> &Path {
        &self.env_file_path
    }

    /// Every reason a gateway could not get its secrets: an unusable `secrets.env`, then each
    /// missing or unreadable secret with how to provide it. Empty when all are there.
    pub fn problems(&self) -> Vec<String> {
        let file = match &self.env_file {
            EnvFile::Unusable(why) => {
                Some(format!("{why} (secrets.env must be a regular file of NAME=value lines, ours, mode 0600)"))
            }
            EnvFile::Absent | EnvFile::Loaded(_) => None,
        };
        file.into_iter().chain(self.entries.iter().filter_map(Entry::problem)).collect()
    }

    /// `Ok` when every secret is there and `secrets.env` (if any) is usable.
    pub fn check(&self) -> Result<(), SecretsError> {
        let problems = self.problems();
        if problems.is_empty() { Ok(()) } else { Err(SecretsError { problems }) }
    }

    /// The secrets found only in this process's environment, each in words (see
    /// [`Entry::only_in_environment`]).
    pub fn only_in_environment(&self) -> Vec<String> {
        self.entries.iter().filter_map(|e| e.only_in_environment(&self.env_file_path, "this process")).collect()
    }

    /// The secret `id`: `Ok(None)` when the configuration names none, `Err` (the problem in
    /// words) when it names one that cannot be had.
    pub fn get(&self, id: &SecretId) -> Result<Option<Secret>, String> {
        match self.entries.iter().find(|e| e.spec.id == *id) {
            None => Ok(None),
            Some(e) => match &e.outcome {
                Ok(f) => Ok(Some(f.value.clone())),
                Err(_) => Err(e.problem().unwrap_or_default()),
            },
        }
    }

    /// The HTTP API's token: `api_token` from config.toml, else the one `api_token_env` or
    /// `api_token_file` names (`None` when it cannot be had: [`Secrets::check`] says why).
    pub fn api_token(&self) -> Option<Secret> {
        self.inline_api_token.clone().or_else(|| self.get(&SecretId::ApiToken).ok().flatten())
    }

    /// The platform `name`'s secret `what` (see [`Secrets::get`]).
    pub fn platform(&self, name: &str, what: PlatformSecret) -> Result<Option<Secret>, String> {
        self.get(&SecretId::Platform { name: name.to_owned(), what })
    }

    /// For `status --json`: each secret, how it is named, and its source or problem.
    pub fn report(&self) -> Vec<Report> {
        self.entries
            .iter()
            .map(|e| Report {
                secret: e.spec.what(),
                named: e.spec.named_as(),
                source: e.outcome.as_ref().ok().map(|f| f.source.kind()),
                problem: e.problem(),
            })
            .collect()
    }
}

/// A found secret, checked for what it is for: an API token must be one a client can send
/// and nobody can guess (config's `token_problem`, the rule of `api_token` written in the file).
fn usable(id: &SecretId, found: Found) -> Result<Found, Problem> {
    match id {
        SecretId::ApiToken => match crate::token_problem(found.value.expose()) {
            Some(why) => Err(Problem::Invalid { source: found.source, why }),
            None => Ok(found),
        },
        _ => Ok(found),
    }
}

/// A file holding one secret, read by the resolver's rules (fsio `read_private`, a trailing
/// newline trimmed), for a secret outside config.toml (the fleet dashboard's token file): the
/// value, or why not in words that name the file and never the value.
pub fn read_secret_file(path: &Path) -> Result<Secret, String> {
    let source = Source::File(path.to_owned());
    match read_file(path, source) {
        Ok(Some(found)) => Ok(found.value),
        Ok(None) => Err(format!("{}: no such file", path.display())),
        Err(Problem::File { path, why }) => {
            let shown = path.display().to_string();
            Err(if why.contains(&shown) { why } else { format!("{shown}: {why}") })
        }
        // read_file's only other problem.
        Err(_) => Err(format!("{} is empty", path.display())),
    }
}

/// A secret file's value: `Ok(None)` when it does not exist.
fn read_file(path: &Path, source: Source) -> Result<Option<Found>, Problem> {
    let bytes = match fsio::read_private(path, MAX_SECRET_BYTES) {
        ReadOutcome::Missing => return Ok(None),
        ReadOutcome::Ok(b) => b,
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
            return Err(Problem::File { path: path.to_owned(), why });
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(Problem::File { path: path.to_owned(), why: "not UTF-8".into() });
    };
    let value = text.trim_end_matches(['\r', '\n']);
    if value.is_empty() {
        return Err(Problem::Empty { source });
    }
    Ok(Some(Found { value: Secret(value.to_owned()), source }))
}

/// The lines of `<home>/secrets.env` (none when it is missing), read as the gateway reads them
/// (`init` keeps a secret already there); the reason when the file cannot be used.
pub fn read_env_lines(home: &Path) -> Result<Vec<(String, Secret)>, String> {
    let path = home.join(SECRETS_FILE);
    match fsio::read_private(&path, MAX_SECRET_BYTES) {
        ReadOutcome::Ok(bytes) => parse_env_file(&bytes)
            .map(|l| l.into_iter().map(|(k, v)| (k, Secret(v))).collect())
            .map_err(|why| format!("{}: {why}", path.display())),
        ReadOutcome::Missing => Ok(Vec::new()),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => Err(why),
    }
}

/// Sets `NAME=value` lines in `<home>/secrets.env` (`gatewarden init`): a name already there
/// has its line replaced where it is, a new one is added at the end, every other line (comments
/// included) is kept. The file is written whole and atomically, 0600; one that cannot be used
/// (a link, not ours, readable by others, malformed) is left alone and the reason returned,
/// naming lines by number only. A value must be one line without surrounding quotes of its own
/// or blanks: what [`parse_env_file`] would read back differently is refused.
pub fn set_env_lines(home: &Path, set: &[(&str, &Secret)]) -> Result<PathBuf, String> {
    let path = home.join(SECRETS_FILE);
    let old = match fsio::read_private(&path, MAX_SECRET_BYTES) {
        ReadOutcome::Ok(bytes) => bytes,
        ReadOutcome::Missing => Vec::new(),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => return Err(why),
    };
    parse_env_file(&old).map_err(|why| format!("{}: {why}", path.display()))?;
    let mut lines: Vec<String> = String::from_utf8_lossy(&old).lines().map(str::to_owned).collect();
    for (name, value) in set {
        let v = value.expose();
        let quoted = [('"', '"'), ('\'', '\'')].iter().any(|(a, b)| v.starts_with(*a) && v.ends_with(*b));
        if v.is_empty() || v.contains(['\n', '\r']) || v.trim() != v || quoted {
            return Err(format!("the value for {name} must be one line, without blanks or quotes around it"));
        }
        let line = format!("{name}={v}");
        let at = lines.iter().position(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("export ").map_or(l, str::trim_start);
            l.split_once('=').is_some_and(|(k, _)| k.trim_end() == *name)
        });
        match at {
            Some(i) => lines[i] = line,
            None => lines.push(line),
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    fsio::atomic_write(&path, text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `secrets.env`: `NAME=value` lines (`export NAME=value` too, so a shell can source it); blank
/// lines and `#` comments are skipped; the value is trimmed, and one pair of matching quotes
/// around it removed. A malformed line or a name set twice is an error naming the line, never
/// its text (it may hold a secret).
fn parse_env_file(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 (at byte {})", e.valid_up_to()))?;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut first_line: Vec<usize> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {n}: expected NAME=value"));
        };
        let name = name.trim_end();
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("line {n}: expected NAME=value, NAME of letters, digits and '_'"));
        }
        if let Some(at) = out.iter().position(|(k, _)| k == name) {
            return Err(format!("line {n}: {name} is set twice (first on line {})", first_line[at]));
        }
        let value = value.trim();
        let value = [b'"', b'\'']
            .iter()
            .find_map(|q| {
                let q = char::from(*q);
                value.strip_prefix(q).and_then(|v| v.strip_suffix(q))
            })
            .unwrap_or(value);
        out.push((name.to_owned(), value.to_owned()));
        first_line.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn write_private(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }

    fn config(home: &Path, text: &str) -> Config {
        Config::from_toml_str(&home.join("config.toml"), text).unwrap()
    }

    fn resolve(home: &Path, c: &Config, env: &[(&str, &str)]) -> Secrets {
        let env: HashMap<String, OsString> = env.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
        Secrets::resolve_with(home, c, &|k| env.get(k).cloned())
    }

    const TWO: &str = "[[platform]]\nkind = \"telegram\"\nname = \"tg\"\ntoken_env = \"TG\"\n\
        [[platform]]\nkind = \"slack\"\ntoken_env = \"APP\"\nbot_token_file = \"bot.token\"\n\
        [agent]\nbackend = \"openai\"\n[[agent.provider]]\nname = \"p\"\nbase_url = \"http://h/v1\"\nmodel = \"m\"\napi_key_env = \"K\"\n";

    #[test]
    fn a_secret_never_prints_its_value() {
        let s = Secret::new("hunter2-very-secret");
        assert_eq!(format!("{s} {s:?} {:?}", Some(&s)), "<redacted> Secret(<redacted>) Some(Secret(<redacted>))");
        assert_eq!(s.expose(), "hunter2-very-secret");
    }

    #[test]
    fn specs_follow_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), TWO);
        let specs = c.secret_specs();
        let named: Vec<String> = specs.iter().map(|s| format!("{}: {}", s.what(), s.named_as())).collect();
        let bot = dir.path().join("bot.token");
        assert_eq!(
            named,
            [
                "[[platform]] \"tg\" token: token_env TG".to_owned(),
                "[[platform]] \"slack\" token: token_env APP".to_owned(),
                format!("[[platform]] \"slack\" bot_token: bot_token_file {}", bot.display()),
                "[[agent.provider]] \"p\" api_key: api_key_env K".to_owned(),
            ]
        );
        assert_eq!(c.credential_files(), vec![(credential_id(&bot), bot.clone())]);
        // A backend that is not selected reads no key.
        let echo = config(dir.path(), "[agent]\nbackend = \"echo\"\napi_key_env = \"K\"\n");
        assert!(echo.secret_specs().is_empty());
    }

    #[test]
    fn credential_ids_are_stable_and_tell_files_apart() {
        let a = credential_id(Path::new("/etc/gw/token"));
        assert_eq!(a, credential_id(Path::new("/etc/gw/token")));
        assert!(a.starts_with("gatewarden.token."), "{a}");
        assert_ne!(a, credential_id(Path::new("/etc/other/token")));
        let odd = credential_id(Path::new("/x/my key:1"));
        assert!(odd.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)), "{odd}");
        // Installed units carry these: the hash must never change.
        assert_eq!(a, "gatewarden.token.4ef72e7eb956cff5");
    }

    #[test]
    fn secrets_env_beats_the_environment_and_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let c = config(home, TWO);
        write_private(&home.join(SECRETS_FILE), "# tokens\nTG=from-file\n\nexport K = \"quoted key\"\n");
        write_private(&home.join("bot.token"), "xoxb-bot\n");
        let s = resolve(home, &c, &[("TG", "from-env"), ("APP", " xapp-1 ")]);
        assert_eq!(s.problems(), Vec::<String>::new());
        let tg = |w| s.platform("tg", w);
        assert_eq!(tg(PlatformSecret::Token).unwrap().unwrap().expose(), "from-file");
        assert_eq!(tg(PlatformSecret::BotToken), Ok(None));
        assert_eq!(s.platform("slack", PlatformSecret::Token).unwrap().unwrap().expose(), "xapp-1");
        assert_eq!(s.platform("slack", PlatformSecret::BotToken).unwrap().unwrap().expose(), "xoxb-bot");
        assert_eq!(s.get(&SecretId::Provider { name: "p".into() }).unwrap().unwrap().expose(), "quoted key");
        let kinds: Vec<_> = s.report().into_iter().map(|r| r.source.unwrap_or("-")).collect();
        assert_eq!(kinds, ["secrets.env", "environment", "file", "secrets.env"]);
        let only = s.only_in_environment();
        assert_eq!(only.len(), 1, "{only:?}");
        assert!(only[0].contains("APP (token_env)") && only[0].contains(SECRETS_FILE), "{}", only[0]);
        // Nothing reported carries a value.
        let all = format!("{s:?} {:?} {:?}", s.report(), s.problems());
        for v in ["from-file", "from-env", "xapp-1", "xoxb-bot", "quoted key"] {
            assert!(!all.contains(v), "{v} leaked: {all}");
        }
    }

    /// `[agent.transcription]`'s key is read for every backend (the transcript is text), and
    /// one that cannot be had refuses `check` and a start, named like every other secret.
    #[test]
    fn a_transcription_key_is_a_secret_of_every_backend() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let one = config(
            home,
            "[agent]\nbackend = \"echo\"\n[agent.transcription]\nbase_url = \"http://h/v1\"\napi_key_env = \"VOICE_KEY\"\n",
        );
        let s = resolve(home, &one, &[]);
        let p = s.problems();
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(
            p[0].starts_with("[agent.transcription] api_key: VOICE_KEY (api_key_env) is set in neither"),
            "{}",
            p[0]
        );
        assert!(s.check().is_err());
        let s = resolve(home, &one, &[("VOICE_KEY", "sk-voice")]);
        assert_eq!(s.get(&SecretId::Transcription).unwrap().unwrap().expose(), "sk-voice");
        let two = config(
            home,
            "[agent.transcription]\n[[agent.transcription.provider]]\nname = \"a\"\nbase_url = \"http://a/v1\"\nmodel = \"w\"\napi_key_file = \"a.key\"\n\
             [[agent.transcription.provider]]\nbase_url = \"http://b/v1\"\nmodel = \"w\"\n",
        );
        let s = resolve(home, &two, &[]);
        let p = s.problems();
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with("[[agent.transcription.provider]] \"a\" api_key: api_key_file"), "{}", p[0]);
        write_private(&home.join("a.key"), "sk-a\n");
        let s = resolve(home, &two, &[]);
        assert_eq!(s.get(&SecretId::TranscriptionProvider { name: "a".into() }).unwrap().unwrap().expose(), "sk-a");
        assert_eq!(s.get(&SecretId::TranscriptionProvider { name: "b".into() }), Ok(None));
    }

    #[test]
    fn every_missing_secret_is_named_with_how_to_give_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let c = config(home, TWO);
        write_private(&home.join(SECRETS_FILE), "TG=\n");
        let s = resolve(home, &c, &[]);
        let p = s.problems();
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(p[0].starts_with("[[platform]] \"tg\" token: token_env TG is empty in"), "{}", p[0]);
        assert!(
            p[1].contains("APP (token_env) is set in neither") && p[1].contains("add the line APP=… to"),
            "{}",
            p[1]
        );
        assert!(p[2].contains("bot_token_file") && p[2].contains("no such file"), "{}", p[2]);
        assert!(p[3].starts_with("[[agent.provider]] \"p\" api_key: K (api_key_env)"), "{}", p[3]);
        let e = s.check().unwrap_err();
        assert_eq!(e.exit_code(), 78);
        assert!(s.get(&SecretId::Provider { name: "p".into() }).unwrap_err().contains("K (api_key_env)"));
    }

    #[cfg(unix)]
    #[test]
    fn unsafe_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let c = config(home, "[[platform]]\nkind = \"telegram\"\ntoken_file = \"tg.token\"\n");
        let tok = home.join("tg.token");
        write_private(&tok, "t0k\n");
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = resolve(home, &c, &[]).problems();
        assert!(p.len() == 1 && p[0].contains("token_file") && p[0].contains("mode 644"), "{p:?}");
        std::fs::remove_file(&tok).unwrap();
        // A link is followed only where nobody else could have made it: not out of a folder
        // anyone may write.
        let open = home.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let real = home.join("real");
        write_private(&real, "t0k\n");
        std::os::unix::fs::symlink(&real, open.join("tg.token")).unwrap();
        std::os::unix::fs::symlink(open.join("tg.token"), &tok).unwrap();
        let p = resolve(home, &c, &[]).problems();
        assert!(p.len() == 1 && p[0].contains("writable by group or others (mode 777) and not sticky"), "{p:?}");
        // One of ours, to a file of ours, is followed.
        std::fs::remove_file(&tok).unwrap();
        std::os::unix::fs::symlink(&real, &tok).unwrap();
        let s = resolve(home, &c, &[]);
        assert_eq!(s.platform("telegram", PlatformSecret::Token).unwrap().unwrap().expose(), "t0k");
        // A broken secrets.env is a problem of its own, named with its line, never its text.
        write_private(&home.join(SECRETS_FILE), "A=1\nthis-line-is-secret\n");
        let p = resolve(home, &c, &[]).problems();
        assert!(p[0].contains("secrets.env: line 2: expected NAME=value"), "{p:?}");
        assert!(!p[0].contains("this-line-is-secret"), "{p:?}");
        write_private(&home.join(SECRETS_FILE), "A=1\nA=2\n");
        assert!(resolve(home, &c, &[]).problems()[0].contains("line 2: A is set twice (first on line 1)"));
    }

    #[test]
    fn systemd_credentials_come_first_for_files() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let c = config(home, "[[platform]]\nkind = \"telegram\"\ntoken_file = \"/nonexistent/tg.token\"\n");
        let creds = home.join("creds");
        std::fs::create_dir(&creds).unwrap();
        // The id of the path as the config resolved it (a drive is prefixed on Windows).
        let (id, _) = c.credential_files().remove(0);
        write_private(&creds.join(&id), "from-systemd\n");
        let s = resolve(home, &c, &[(CREDENTIALS_ENV, creds.to_str().unwrap())]);
        assert_eq!(s.platform("telegram", PlatformSecret::Token).unwrap().unwrap().expose(), "from-systemd");
        assert_eq!(s.report()[0].source, Some("systemd-credential"));
        // Without the credential, the file itself (missing here).
        assert!(resolve(home, &c, &[]).problems()[0].contains("no such file"));
    }

    #[test]
    fn env_file_lines() {
        assert_eq!(
            parse_env_file(b"A=1\n  # c\nexport B='two words'\nC = \"x=y\"\r\nD=\n").unwrap(),
            [("A", "1"), ("B", "two words"), ("C", "x=y"), ("D", "")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .to_vec()
        );
        assert!(parse_env_file(b"1A=x\n").unwrap_err().contains("line 1"));
        assert!(parse_env_file(b"\xff").unwrap_err().contains("UTF-8"));
    }

    #[cfg(unix)]
    #[test]
    fn init_sets_lines_and_keeps_the_rest() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SECRETS_FILE);
        write_private(&path, "# mine\nexport TG=old\nOTHER=keep\n");
        let (tg, key) = (Secret::new("123:abc"), Secret::new("sk-1"));
        set_env_lines(dir.path(), &[("TG", &tg), ("KEY", &key)]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\nTG=123:abc\nOTHER=keep\nKEY=sk-1\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // What it writes reads back as given.
        let back = parse_env_file(&std::fs::read(&path).unwrap()).unwrap();
        assert!(back.contains(&("TG".into(), "123:abc".into())) && back.contains(&("KEY".into(), "sk-1".into())));
        // Values that would not read back the same are refused, and the file is left alone.
        for bad in ["two\nlines", " padded", "'quoted'", ""] {
            assert!(set_env_lines(dir.path(), &[("TG", &Secret::new(bad))]).is_err(), "{bad:?}");
        }
        assert!(std::fs::read_to_string(&path).unwrap().contains("TG=123:abc"));
        // A file others may read is not touched.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(set_env_lines(dir.path(), &[("TG", &tg)]).unwrap_err().contains("chmod 600"));
    }
}
