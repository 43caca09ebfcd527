//! `kind = "mattermost"`: the v4 WebSocket and REST API of one server
//! (crates/platforms/src/mattermost.rs).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig};
use crate::ConfigError;

/// A Mattermost table's own keys; `token_env` / `token_file` hold a personal access token or a
/// bot account's token. Its WebSocket connects directly: no proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mattermost {
    /// The server's URL, `https://chat.example.com` (required; `http://` for a loopback test
    /// server only).
    #[serde(default)]
    pub server: Option<String>,
}

/// Whether `s` is an `http(s)://host[:port][/path]` URL without query, fragment or user info.
fn server_url_ok(s: &str) -> bool {
    let rest = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://"));
    rest.is_some_and(|r| {
        let authority = r.split('/').next().unwrap_or_default();
        !authority.is_empty() && !r.contains(['?', '#', '@']) && !r.contains(char::is_whitespace)
    })
}

impl KindSettings for Mattermost {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        let Some(server) = self.server.as_deref().map(str::trim) else {
            return Err(bad(
                "server",
                format!("[[platform]] {name:?} (mattermost) needs server, the server's URL (https://chat.example.com)"),
            ));
        };
        if !server_url_ok(server) {
            return Err(bad("server", format!("{server:?}: an http:// or https:// URL, host and optional path")));
        }
        if server.starts_with("https://") && !gatewarden_net::TLS {
            return Err(bad("server", format!("{server:?} is https, but {}", crate::NO_TLS)));
        }
        if let Some(c) = table.allowed_chats.iter().find(|c| c.is_empty() || c.contains(['/', ' '])) {
            return Err(bad("allowed_chats", format!("{c:?}: channel ids (26 characters), not names")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        for ok in ["https://chat.example.com", "http://127.0.0.1:8065", "https://example.com/mattermost/"] {
            assert!(server_url_ok(ok), "{ok}");
        }
        for bad in ["chat.example.com", "https://", "https://u@h", "https://h/?x", "ftp://h", "https://h x"] {
            assert!(!server_url_ok(bad), "{bad}");
        }
    }
}
