//! `kind = "signal"`: signal-cli's JSON-RPC daemon over HTTP (crates/platforms/src/signal.rs).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, validate_api_base};
use crate::ConfigError;

/// A Signal table's own keys. signal-cli's HTTP daemon has no authentication of its own, so
/// there is no token: `token_env` / `token_file` are refused. The credential lock is keyed by
/// `account`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signal {
    /// The daemon, `http://host:port` of `signal-cli daemon --http` (default
    /// `http://127.0.0.1:8080`).
    #[serde(default)]
    pub api_base: Option<String>,
    /// The account's number, E.164 (`+4915…`), as signal-cli names it (required).
    #[serde(default)]
    pub account: Option<String>,
}

/// An E.164 number: `+`, then 6 to 15 digits.
pub fn e164_ok(s: &str) -> bool {
    s.strip_prefix('+').is_some_and(|d| (6..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

impl KindSettings for Signal {
    // The daemon has no authentication (signal-cli-jsonrpc(5): "HTTP server has no
    // authentication").
    const TOKEN_REQUIRED: bool = false;

    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        if !self.account.as_deref().is_some_and(e164_ok) {
            return Err(bad(
                "account",
                format!(
                    "[[platform]] {name:?} (signal) needs account, the number signal-cli is registered or linked with, in international format (\"+4915123456789\")"
                ),
            ));
        }
        if table.token_env.is_some() || table.token_file.is_some() {
            return Err(bad(
                "token_env",
                format!(
                    "[[platform]] {name:?} (signal): signal-cli's daemon takes no token; keep it on loopback (api_base = \"http://127.0.0.1:8080\")"
                ),
            ));
        }
        validate_api_base(bad, self.api_base.as_deref(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_e164() {
        assert!(e164_ok("+4915123456789"));
        assert!(!e164_ok("4915123456789"), "the + is part of signal-cli's spelling");
        assert!(!e164_ok("+49 151"));
        assert!(!e164_ok("+12345"));
        assert!(!e164_ok("+1234567890123456"));
        assert!(!e164_ok(""));
    }
}
