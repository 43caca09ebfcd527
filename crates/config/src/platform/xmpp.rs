//! `kind = "xmpp"`: one account's stream, direct chats and MUC rooms (crates/platforms/src/xmpp.rs).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, server_ok};
use crate::ConfigError;

/// An XMPP table's own keys; `token_env` / `token_file` hold the account's password. It
/// connects directly to `server`: no proxy, no `api_base`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Xmpp {
    /// The account's bare JID, `user@domain` (required).
    #[serde(default)]
    pub jid: Option<String>,
    /// The rooms (MUC) to join, as bare JIDs `room@conference.domain`.
    #[serde(default)]
    pub rooms: Vec<String>,
    /// Where to connect, `host:port` (default: the JID's domain, port 5222).
    #[serde(default)]
    pub server: Option<String>,
    /// The nick in rooms (default: the JID's local part).
    #[serde(default)]
    pub nick: Option<String>,
    /// Files (XEP-0066 URLs in, XEP-0363 uploads out) over plain `http://` too, but only to a
    /// loopback host: for a test server without https. Default: https only.
    #[serde(default)]
    pub http_files_on_loopback: bool,
}

/// A bare JID `local@domain` as the XMPP adapter takes it (no resource, no spaces or quotes).
fn bare_jid_ok(s: &str) -> bool {
    let forbidden = |c: char| c.is_whitespace() || c.is_control() || "\"&'/:<>".contains(c);
    s.split_once('@').is_some_and(|(l, d)| !l.is_empty() && !d.is_empty() && !d.contains('@')) && !s.contains(forbidden)
}

impl KindSettings for Xmpp {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        if !self.jid.as_deref().is_some_and(bare_jid_ok) {
            return Err(bad(
                "jid",
                format!("[[platform]] {name:?} (xmpp) needs jid, the account's bare JID user@domain"),
            ));
        }
        if let Some(r) = self.rooms.iter().find(|r| !bare_jid_ok(r)) {
            return Err(bad("rooms", format!("{r:?}: a room's bare JID, room@conference.domain")));
        }
        if let Some(c) = table.allowed_chats.iter().find(|c| !bare_jid_ok(c)) {
            return Err(bad(
                "allowed_chats",
                format!("{c:?}: bare JIDs (user@domain) whose direct messages are served"),
            ));
        }
        if self.server.is_some() && server_ok(self.server.as_deref()).is_err() {
            return Err(bad("server", format!("[[platform]] {name:?} (xmpp): server must be host:port")));
        }
        if self.nick.as_deref().is_some_and(|n| n.trim().is_empty() || n.contains(char::is_control)) {
            return Err(bad("nick", "the room nick must not be empty or contain control characters".into()));
        }
        Ok(())
    }
}
