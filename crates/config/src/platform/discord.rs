//! `kind = "discord"`: the Gateway WebSocket and REST (crates/platforms/src/discord/).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, validate_api_base};
use crate::ConfigError;

/// A Discord table's own keys. Its WebSocket connects directly: no proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discord {
    /// The REST base (default `https://discord.com/api/v10`), whose `/gateway/bot` names the
    /// gateway: `wss://` only, `ws://` only under an `http://` base for tests.
    #[serde(default)]
    pub api_base: Option<String>,
}

impl KindSettings for Discord {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        validate_api_base(bad, self.api_base.as_deref(), true)?;
        for (key, ids) in [("allowed_chats", &table.allowed_chats), ("admins", &table.admins)] {
            if let Some(c) = ids.iter().find(|c| c.parse::<u64>().is_err()) {
                return Err(bad(key, format!("{c:?}: Discord channel and user ids are numbers (snowflakes)")));
            }
        }
        if let Some(u) = table.allowed_users.iter().find(|u| u.parse::<u64>().is_err()) {
            return Err(bad("allowed_users", format!("{u:?}: Discord user ids are numbers (snowflakes)")));
        }
        Ok(())
    }
}
