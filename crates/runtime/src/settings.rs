//! What config.toml and the secrets it names make: the configuration, the agent backend and
//! the chat adapters, built but not started. The one load path of a start ([`crate::prepare`])
//! and of a reload (reload.rs), so a secret source the config crate learns comes along to both
//! by construction.

use std::path::PathBuf;

use gatewarden_agent::Agent;
use gatewarden_config::{CONFIG_FILE, Config, ConfigError, Secrets};
use gatewarden_lifecycle::Home;

use crate::options::RUN_TAG;
use crate::platforms::Platforms;

/// Built from the home's configuration; nothing runs yet.
pub struct Settings {
    pub config: Config,
    /// Where each secret came from (status shows the sources, never a value).
    pub secrets: Secrets,
    pub agent: Box<dyn Agent>,
    pub platforms: Platforms,
}

/// Why the configuration cannot be used, located where the config crate can tell: the file,
/// the 1-based line and the key (docs/protocol.md: `reload_refused`, `start_refused`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The whole reason, as the config crate words it (it names the file and line itself).
    pub message: String,
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: Option<String>,
}

impl LoadError {
    fn config(home: &Home, e: &ConfigError) -> LoadError {
        LoadError {
            message: e.to_string(),
            file: home.dir().join(CONFIG_FILE),
            line: e.line(),
            key: e.key().map(str::to_owned),
        }
    }

    /// A failure past the file's syntax (a platform's missing credential), about `key`.
    fn other(home: &Home, key: Option<&str>, message: String) -> LoadError {
        LoadError { message, file: home.dir().join(CONFIG_FILE), line: None, key: key.map(str::to_owned) }
    }

    /// `{"reason", "file", "line", "key"}` for the ledger.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"reason": self.message, "file": self.file, "line": self.line, "key": self.key})
    }
}

/// What `run`'s command line sets instead of the file (a restart's successor is given both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub listen: Option<String>,
    pub drain_timeout: Option<std::time::Duration>,
}

/// Loads `<home>/config.toml`, applies what the command line overrides, refuses an exposed
/// listener without a token, and builds the agent (its processes tagged with the home and
/// `incarnation`, their scratch files in `<home>/runs/<incarnation>/`) and the chat adapters,
/// reading the secrets they name.
pub fn load(home: &Home, overrides: &Overrides, incarnation: &str) -> Result<Settings, LoadError> {
    let mut config = Config::load(home.dir()).map_err(|e| LoadError::config(home, &e))?;
    if let Some(l) = &overrides.listen {
        config.listen =
            l.parse().map_err(|e| LoadError::other(home, Some("listen"), format!("invalid --listen {l:?}: {e}")))?;
    }
    if let Some(d) = overrides.drain_timeout {
        config.drain_timeout_s = d.as_secs();
    }
    config.check_exposure().map_err(|e| LoadError::config(home, &e))?;
    // Afresh at every start and reload, in this process: every start path finds the same
    // secrets (crates/config/src/secrets.rs). One that cannot be had refuses the load, named.
    let secrets = Secrets::resolve(home.dir(), &config);
    secrets.check().map_err(|e| LoadError::other(home, None, e.to_string()))?;
    let tag = crate::options::run_tag(home, incarnation);
    let scratch = home.runs_dir().join(incarnation);
    let agent =
        gatewarden_agent::build_agent_with(&config.agent, &secrets, vec![(RUN_TAG.to_owned(), tag)], Some(scratch));
    let platforms = Platforms::build(&config, &secrets).map_err(|e| LoadError::other(home, Some("platform"), e))?;
    Ok(Settings { config, secrets, agent, platforms })
}
