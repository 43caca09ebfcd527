//! `kind = "slack"`: Socket Mode and the Web API (crates/platforms/src/slack.rs).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, validate_api_base};
use crate::ConfigError;
use crate::secrets::PlatformSecret;

/// A Slack table's own keys; `token_env` / `token_file` hold the app-level token (`xapp-…`,
/// the credential). Its WebSocket connects directly: no proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slack {
    /// The Web API base (default `https://slack.com/api/`).
    #[serde(default)]
    pub api_base: Option<String>,
    /// The environment variable holding the bot token (`xoxb-…`) that replies with
    /// `chat.postMessage`.
    #[serde(default)]
    pub bot_token_env: Option<String>,
    /// Or the file holding the bot token.
    #[serde(default)]
    pub bot_token_file: Option<PathBuf>,
}

impl KindSettings for Slack {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        crate::one_source(bad, "bot_token", self.bot_token_env.as_deref(), self.bot_token_file.as_deref())?;
        validate_api_base(bad, self.api_base.as_deref(), false)?;
        if self.api_base.is_none() && !gatewarden_net::TLS {
            return Err(bad("api_base", format!("the default https://slack.com/api/ is https, but {}", crate::NO_TLS)));
        }
        if self.bot_token_env.is_none() && self.bot_token_file.is_none() {
            return Err(bad(
                "bot_token_env",
                format!(
                    "[[platform]] {:?} (slack) needs bot_token_env, the environment variable holding the bot token (xoxb-…), or bot_token_file; token_env holds the app-level token (xapp-…)",
                    table.adapter_name()
                ),
            ));
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
        vec![(PlatformSecret::BotToken, self.bot_token_env.as_deref(), self.bot_token_file.as_deref())]
    }

    fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        vec![&mut self.bot_token_file]
    }
}
