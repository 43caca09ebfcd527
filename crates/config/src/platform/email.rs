//! `kind = "email"`: IMAP in, SMTP out (crates/platforms/src/email/).

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, default_poll_timeout, validate_poll_timeout};
use crate::ConfigError;

/// An email table's own keys; `token_env` / `token_file` hold the account's password. It
/// serves `allowed_senders`, not `allowed_chats`, and connects directly: no proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Email {
    /// The IMAP server, `imaps://host:993` (TLS) or `imap://host:143` (STARTTLS).
    #[serde(default)]
    pub imap: Option<String>,
    /// The SMTP submission server, `smtps://host:465` or `smtp://host:587` (STARTTLS).
    #[serde(default)]
    pub smtp: Option<String>,
    /// The account (`user@domain`): the IMAP and SMTP login and the `From` address.
    #[serde(default)]
    pub account: Option<String>,
    /// The senders served (addresses, or `@domain`); empty = anyone.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// How long one IMAP IDLE (or one poll's pause) lasts before it is renewed.
    #[serde(default = "default_poll_timeout")]
    pub poll_timeout_s: u64,
}

impl Default for Email {
    fn default() -> Self {
        Email {
            imap: None,
            smtp: None,
            account: None,
            allowed_senders: Vec::new(),
            poll_timeout_s: default_poll_timeout(),
        }
    }
}

impl KindSettings for Email {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        for (key, url, schemes) in
            [("imap", &self.imap, ["imaps://", "imap://"]), ("smtp", &self.smtp, ["smtps://", "smtp://"])]
        {
            let ok = url.as_deref().is_some_and(|u| {
                schemes.iter().any(|s| u.len() > s.len() && u.get(..s.len()).is_some_and(|h| h.eq_ignore_ascii_case(s)))
            });
            if !ok {
                return Err(bad(
                    key,
                    format!(
                        "[[platform]] {name:?} (email) needs {key} = \"{}host:port\" (TLS) or \"{}host:port\" (STARTTLS)",
                        schemes[0], schemes[1]
                    ),
                ));
            }
        }
        if !gatewarden_net::TLS {
            return Err(bad("imap", format!("email always uses TLS, but {}", crate::NO_TLS)));
        }
        if !self.account.as_deref().is_some_and(|a| a.contains('@') && !a.contains(char::is_whitespace)) {
            return Err(bad("account", format!("[[platform]] {name:?} (email) needs account = \"user@domain\"")));
        }
        if !table.allowed_chats.is_empty() {
            return Err(bad("allowed_chats", "email serves allowed_senders (addresses or @domain)".into()));
        }
        if self.allowed_senders.iter().any(|a| !a.contains('@') || a.trim().is_empty()) {
            return Err(bad("allowed_senders", "addresses (user@domain) or @domain".into()));
        }
        validate_poll_timeout(bad, self.poll_timeout_s)
    }
}
