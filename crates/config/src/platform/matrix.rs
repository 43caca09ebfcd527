//! `kind = "matrix"`: the client-server API (crates/platforms/src/matrix.rs).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, default_poll_timeout, validate_api_base, validate_poll_timeout};
use crate::ConfigError;

/// A Matrix table's own keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// The homeserver, `http://host:port` or `https://…` (required).
    #[serde(default)]
    pub api_base: Option<String>,
    /// The `/sync` timeout.
    #[serde(default = "default_poll_timeout")]
    pub poll_timeout_s: u64,
    /// This platform's own proxy, instead of `HTTPS_PROXY` / `ALL_PROXY`.
    #[serde(default)]
    pub proxy: Option<String>,
}

impl Default for Matrix {
    fn default() -> Self {
        Matrix { api_base: None, poll_timeout_s: default_poll_timeout(), proxy: None }
    }
}

impl KindSettings for Matrix {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        if self.api_base.is_none() {
            return Err(bad(
                "api_base",
                format!(
                    "[[platform]] {:?} (matrix) needs api_base, the homeserver URL (http://host:port or https://…)",
                    table.adapter_name()
                ),
            ));
        }
        validate_api_base(bad, self.api_base.as_deref(), false)?;
        validate_poll_timeout(bad, self.poll_timeout_s)
    }

    fn proxy(&self) -> Option<&str> {
        self.proxy.as_deref()
    }
}
