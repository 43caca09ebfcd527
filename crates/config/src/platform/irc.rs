//! `kind = "irc"`: one TCP (or TLS) connection, one nick (crates/platforms/src/irc.rs).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, server_ok};
use crate::ConfigError;
use crate::secrets::PlatformSecret;

/// An IRC table's own keys; `token_env` / `token_file`, optional, hold the server password
/// (`PASS`). It connects directly: no proxy, no `api_base`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Irc {
    /// The server, `host:port` or `host` (the port then follows `tls`).
    #[serde(default)]
    pub server: Option<String>,
    /// The nick; never replaced by another one on a collision.
    #[serde(default)]
    pub nick: Option<String>,
    /// TLS (verified like every connection, crates/net); the default port becomes 6697.
    #[serde(default)]
    pub tls: bool,
    /// SASL PLAIN as the account named `nick`, with the password in this environment
    /// variable; registration fails (the adapter is parked) if the server cannot do it.
    #[serde(default)]
    pub sasl_password_env: Option<String>,
    /// Or the file holding that password.
    #[serde(default)]
    pub sasl_password_file: Option<PathBuf>,
}

impl Irc {
    /// `server` as `host:port`, the port defaulting to 6697 with `tls`, else 6667.
    pub fn addr(&self) -> Option<String> {
        let s = self.server.as_deref()?.trim();
        let has_port =
            s.rsplit_once(':').is_some_and(|(h, p)| p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')));
        Some(if has_port { s.to_owned() } else { format!("{s}:{}", if self.tls { 6697 } else { 6667 }) })
    }
}

/// One IRC word (a nick or a channel): non-empty, no space, comma or control character, no
/// leading `:`.
fn word_ok(s: &str) -> bool {
    !s.is_empty() && !s.starts_with(':') && !s.contains(|c: char| c == ' ' || c == ',' || c.is_control())
}

impl KindSettings for Irc {
    // Many servers need no password.
    const TOKEN_REQUIRED: bool = false;

    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        crate::one_source(bad, "sasl_password", self.sasl_password_env.as_deref(), self.sasl_password_file.as_deref())?;
        if let Err(why) = server_ok(self.server.as_deref()) {
            return Err(bad("server", format!("[[platform]] {name:?} (irc): {why}")));
        }
        if !self.nick.as_deref().is_some_and(word_ok) || self.nick.as_deref().is_some_and(|n| n.starts_with(['#', '&']))
        {
            return Err(bad(
                "nick",
                format!(
                    "[[platform]] {name:?} (irc) needs nick, one word without spaces, commas or control characters"
                ),
            ));
        }
        if let Some(c) = table.allowed_chats.iter().find(|c| !word_ok(c)) {
            return Err(bad(
                "allowed_chats",
                format!("{c:?}: IRC channels (#name) or nicks, without spaces, commas or control characters"),
            ));
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
        vec![(PlatformSecret::SaslPassword, self.sasl_password_env.as_deref(), self.sasl_password_file.as_deref())]
    }

    fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        vec![&mut self.sasl_password_file]
    }
}
