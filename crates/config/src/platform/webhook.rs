//! `kind = "webhook"`: signed inbound webhooks (crates/platforms/src/webhook.rs) for alerts, CI
//! and ticket systems: `POST /hooks/webhook/<name>` on the gateway's own listener in, an
//! optional signed POST to `callback_url` out.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig};
use crate::ConfigError;
use crate::secrets::PlatformSecret;

/// The replay window when `replay_window_s` is not set.
pub const DEFAULT_REPLAY_WINDOW_S: u64 = 300;
/// The largest body taken when `max_body_bytes` is not set.
pub const DEFAULT_MAX_BODY_BYTES: usize = 256 << 10;
/// The listener's own bound on every body (crates/runtime/src/http/mod.rs): a larger
/// `max_body_bytes` could never be reached.
pub const MAX_BODY_BYTES: usize = 2 << 20;
/// Requests per minute when `rate_per_minute` is not set.
pub const DEFAULT_RATE_PER_MINUTE: u32 = 60;

/// How requests are signed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signature {
    /// `X-Gatewarden-Timestamp` and `X-Gatewarden-Signature: sha256=<hex>`, the HMAC-SHA256 of
    /// `timestamp + "." + body` (README, "Webhooks").
    #[default]
    Gatewarden,
    /// GitHub's `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the body alone; no
    /// timestamp, so `X-GitHub-Delivery` is required and deduplicates.
    Github,
}

/// A webhook table's own keys; `secret_env` / `secret_file` hold the shared HMAC secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// The environment variable holding the HMAC secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Or the file holding it.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The signature scheme (default `gatewarden`).
    #[serde(default)]
    pub signature: Signature,
    /// How far a request's timestamp may be from now, either way (default 300 s).
    #[serde(default)]
    pub replay_window_s: Option<u64>,
    /// The largest body taken (default 256 KiB, at most 2 MiB); larger gets 413.
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// Requests per minute taken (default 60); more get 429 with `Retry-After`.
    #[serde(default)]
    pub rate_per_minute: Option<u32>,
    /// Where replies are POSTed, signed the same way; without it a reply is only fetchable
    /// (`GET /v1/messages/{id}`).
    #[serde(default)]
    pub callback_url: Option<String>,
}

impl Webhook {
    pub fn replay_window_s(&self) -> u64 {
        self.replay_window_s.unwrap_or(DEFAULT_REPLAY_WINDOW_S)
    }

    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES)
    }

    pub fn rate_per_minute(&self) -> u32 {
        self.rate_per_minute.unwrap_or(DEFAULT_RATE_PER_MINUTE)
    }
}

impl KindSettings for Webhook {
    /// The secret is `secret_*`; there is no token.
    const TOKEN_REQUIRED: bool = false;

    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        crate::one_source(bad, "secret", self.secret_env.as_deref(), self.secret_file.as_deref())?;
        if self.secret_env.is_none() && self.secret_file.is_none() {
            return Err(bad(
                "secret_env",
                format!(
                    "[[platform]] {name:?} (webhook) needs secret_env, the environment variable holding the HMAC secret its senders sign with, or secret_file"
                ),
            ));
        }
        if table.token_env.is_some() || table.token_file.is_some() {
            return Err(bad("token_env", "a webhook has no token: its secret is secret_env or secret_file".into()));
        }
        if !(1..=crate::MAX_SECONDS).contains(&self.replay_window_s()) {
            return Err(bad("replay_window_s", format!("must be 1 to {} seconds", crate::MAX_SECONDS)));
        }
        if !(1..=MAX_BODY_BYTES).contains(&self.max_body_bytes()) {
            return Err(bad("max_body_bytes", format!("must be 1 to {MAX_BODY_BYTES} (the listener's bound)")));
        }
        if self.rate_per_minute() == 0 {
            return Err(bad("rate_per_minute", "must be at least 1".into()));
        }
        if let Some(url) = self.callback_url.as_deref().map(str::trim) {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad("callback_url", format!("{url:?} must start with http:// or https://")));
            }
            if url.starts_with("https://") && !gatewarden_net::TLS {
                return Err(bad("callback_url", format!("{url:?} is https, but {}", crate::NO_TLS)));
            }
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
        vec![(PlatformSecret::Secret, self.secret_env.as_deref(), self.secret_file.as_deref())]
    }

    fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        vec![&mut self.secret_file]
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    fn load(own: &str) -> Result<Config, String> {
        let text = format!("[[platform]]\nkind = \"webhook\"\nname = \"alerts\"\n{own}");
        Config::from_toml_str(Path::new("/h/config.toml"), &text).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_defaults_and_their_words() {
        let c = load("secret_env = \"S\"\n").unwrap();
        let w = c.platform[0].own::<super::Webhook>().unwrap();
        assert_eq!((w.replay_window_s(), w.max_body_bytes(), w.rate_per_minute()), (300, 256 << 10, 60));
        assert_eq!(w.signature, super::Signature::Gatewarden);
        assert_eq!(c.platform[0].settings.secrets().len(), 1);
        let c = load("secret_env = \"S\"\nsignature = \"github\"\ncallback_url = \"http://127.0.0.1:9/cb\"\n").unwrap();
        assert_eq!(c.platform[0].own::<super::Webhook>().unwrap().signature, super::Signature::Github);
        for (own, words) in [
            ("", "needs secret_env"),
            ("secret_env = \"S\"\nsecret_file = \"s\"\n", "not both"),
            ("secret_env = \"S\"\ntoken_env = \"T\"\n", "has no token"),
            ("secret_env = \"S\"\nreplay_window_s = 0\n", "replay_window_s"),
            ("secret_env = \"S\"\nmax_body_bytes = 3000000\n", "listener's bound"),
            ("secret_env = \"S\"\nrate_per_minute = 0\n", "at least 1"),
            ("secret_env = \"S\"\ncallback_url = \"ftp://x\"\n", "must start with http"),
            ("secret_env = \"S\"\nsignature = \"stripe\"\n", "signature"),
        ] {
            let e = load(own).expect_err(own);
            assert!(e.contains(words), "{own}: {e}");
        }
    }
}
