//! `kind = "telegram"`: the Bot API (crates/platforms/src/telegram.rs).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, default_poll_timeout, validate_api_base, validate_poll_timeout};
use crate::ConfigError;

/// A Telegram table's own keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Telegram {
    /// The Bot API's base URL (default `https://api.telegram.org`).
    #[serde(default)]
    pub api_base: Option<String>,
    /// The long-poll `timeout` of getUpdates.
    #[serde(default = "default_poll_timeout")]
    pub poll_timeout_s: u64,
    /// This platform's own proxy, `http://host:port` or `socks5h://host:port`, instead of
    /// `HTTPS_PROXY` / `ALL_PROXY`; credentials only through the environment.
    #[serde(default)]
    pub proxy: Option<String>,
}

impl Default for Telegram {
    fn default() -> Self {
        Telegram { api_base: None, poll_timeout_s: default_poll_timeout(), proxy: None }
    }
}

impl KindSettings for Telegram {
    fn validate(&self, _: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        validate_api_base(bad, self.api_base.as_deref(), true)?;
        validate_poll_timeout(bad, self.poll_timeout_s)
    }

    fn proxy(&self) -> Option<&str> {
        self.proxy.as_deref()
    }
}
