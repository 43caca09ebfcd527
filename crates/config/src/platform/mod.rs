//! `[[platform]]` tables: the keys every platform has ([`PlatformConfig`]) and each kind's own
//! settings, one file per kind (`telegram.rs`, …), each its own struct with its own
//! `validate()`. The platforms crate's protocols name them (`Protocol::Settings`,
//! crates/platforms/src/skeleton/mod.rs); they live here, below the protocols, because the
//! configuration is loaded and checked before any adapter exists (`check`, `doctor`, reload).
//!
//! A new platform is one file here plus one line in [`registry!`]'s list below (and its
//! protocol in crates/platforms, docs/adding-a-platform.md).
//!
//! Loading keeps errors located: the derived `#[serde(tag = "kind")]` of [`PlatformSettings`]
//! buffers a table before it reads `kind`, which loses toml's spans, so the file's loader
//! ([`located`]) reads `kind` itself, splits the table into the shared keys and the kind's
//! own, and deserializes each part straight from the spanned document: an error still names
//! its line and key.

mod discord;
mod email;
mod irc;
mod matrix;
mod mattermost;
mod signal;
mod slack;
mod telegram;
mod webhook;
mod whatsapp;
mod xmpp;

pub use discord::Discord;
pub use email::Email;
pub use irc::Irc;
pub use matrix::Matrix;
pub use mattermost::Mattermost;
pub use signal::{Signal, e164_ok};
pub use slack::Slack;
pub use telegram::Telegram;
pub use webhook::{Signature as WebhookSignature, Webhook};
pub use whatsapp::Whatsapp;
pub use xmpp::Xmpp;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::secrets::PlatformSecret;
use crate::{ConfigError, MAX_SECONDS};

/// Builds a located "invalid value" error for a key of the table being validated.
pub type Bad<'a> = dyn Fn(&str, String) -> ConfigError + 'a;

/// What each kind's settings provide besides their keys.
pub trait KindSettings:
    Kind
    + Default
    + Clone
    + PartialEq
    + Eq
    + std::fmt::Debug
    + Serialize
    + for<'de> Deserialize<'de>
    + Into<PlatformSettings>
{
    /// Whether `token_env` or `token_file` is required (IRC's server password is optional).
    const TOKEN_REQUIRED: bool = true;

    /// The kind's own checks, after the shared keys of `table` passed theirs; `bad` locates an
    /// error at a key of this table.
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError>;

    /// Secrets besides `token_*`: `(which, <what>_env, <what>_file)`.
    fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
        Vec::new()
    }

    /// The `*_file` paths, made absolute against the home when loaded.
    fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        Vec::new()
    }

    /// This table's own proxy, for kinds that connect through one.
    fn proxy(&self) -> Option<&str> {
        None
    }
}

/// The kind a settings type belongs to: written by [`registry!`], so a type and its kind
/// cannot disagree.
pub trait Kind: Sized {
    const KIND: PlatformKind;
    /// These settings, when `s` is of this kind.
    fn of(s: &PlatformSettings) -> Option<&Self>;
}

/// The one list of platform kinds: `Variant("name", module::Type)`. Generates [`PlatformKind`],
/// [`PlatformSettings`] (`#[serde(tag = "kind")]`) and their dispatch.
macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident($name:literal, $ty:ty),)*) => {
        /// Which chat platform an adapter speaks.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub enum PlatformKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl PlatformKind {
            /// Every kind, in the registry's order.
            pub const ALL: &[PlatformKind] = &[$(PlatformKind::$variant),*];

            /// The name used in the config file.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(PlatformKind::$variant => $name,)*
                }
            }

            /// The keys of this kind's own settings (besides [`shared_keys`]).
            pub fn own_keys(self) -> &'static [&'static str] {
                match self {
                    $(PlatformKind::$variant => field_names::<$ty>(),)*
                }
            }
        }

        $(impl Kind for $ty {
            const KIND: PlatformKind = PlatformKind::$variant;
            fn of(s: &PlatformSettings) -> Option<&Self> {
                match s {
                    PlatformSettings::$variant(x) => Some(x),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }

        impl From<$ty> for PlatformSettings {
            fn from(s: $ty) -> PlatformSettings {
                PlatformSettings::$variant(s)
            }
        })*

        /// One kind's own settings, tagged by `kind`.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(tag = "kind")]
        pub enum PlatformSettings {
            $(#[serde(rename = $name)] $variant($ty),)*
        }

        impl PlatformSettings {
            pub fn kind(&self) -> PlatformKind {
                match self {
                    $(PlatformSettings::$variant(_) => PlatformKind::$variant,)*
                }
            }

            /// `kind`'s settings with every key at its default.
            pub fn default_of(kind: PlatformKind) -> PlatformSettings {
                match kind {
                    $(PlatformKind::$variant => PlatformSettings::$variant(<$ty>::default()),)*
                }
            }

            /// `kind`'s own keys read from `de` (a table without `kind` and the shared keys).
            fn deserialize_kind<'de, D: Deserializer<'de>>(kind: PlatformKind, de: D) -> Result<PlatformSettings, D::Error> {
                Ok(match kind {
                    $(PlatformKind::$variant => PlatformSettings::$variant(<$ty>::deserialize(de)?),)*
                })
            }

            fn token_required(&self) -> bool {
                match self {
                    $(PlatformSettings::$variant(_) => <$ty as KindSettings>::TOKEN_REQUIRED,)*
                }
            }

            fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
                match self {
                    $(PlatformSettings::$variant(s) => s.validate(table, bad),)*
                }
            }

            /// Secrets besides `token_*` ([`KindSettings::secrets`]).
            pub fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
                match self {
                    $(PlatformSettings::$variant(s) => s.secrets(),)*
                }
            }

            fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
                match self {
                    $(PlatformSettings::$variant(s) => s.files_mut(),)*
                }
            }

            /// This table's own proxy ([`KindSettings::proxy`]).
            pub fn proxy(&self) -> Option<&str> {
                match self {
                    $(PlatformSettings::$variant(s) => s.proxy(),)*
                }
            }
        }
    };
}

registry! {
    /// The Telegram Bot API (getUpdates long-poll).
    Telegram("telegram", Telegram),
    /// Matrix client-server API (`/sync` long-poll, unencrypted rooms only).
    Matrix("matrix", Matrix),
    /// IRC (one TCP connection, one nick).
    Irc("irc", Irc),
    /// XMPP (one account's stream, direct chats and MUC rooms, the server's archive).
    Xmpp("xmpp", Xmpp),
    /// Discord: the Gateway WebSocket (v10) to receive, REST to reply.
    Discord("discord", Discord),
    /// Email: one IMAP account read (IDLE), replies by SMTP submission.
    Email("email", Email),
    /// Slack: Socket Mode events over a WebSocket, replies with `chat.postMessage`.
    Slack("slack", Slack),
    /// Mattermost: the v4 WebSocket to receive, REST posts to reply.
    Mattermost("mattermost", Mattermost),
    /// WhatsApp: the Cloud API's webhook on the gateway's listener in, the Graph API out.
    Whatsapp("whatsapp", Whatsapp),
    /// Signal: signal-cli's JSON-RPC daemon over HTTP (`receive` in manual receive mode).
    Signal("signal", Signal),
    /// Signed inbound webhooks (alerts, CI, tickets) on the gateway's listener; replies to a
    /// callback URL.
    Webhook("webhook", Webhook),
}

impl PlatformKind {
    /// Whether a sender id on this platform can be forged by whoever sends the message: an
    /// email's `From`, an IRC nick on a network without nick registration. Such platforms get
    /// no pairing (a pairing reply would let strangers make the gateway send mail or flood).
    pub fn forgeable(self) -> bool {
        matches!(self, PlatformKind::Irc | PlatformKind::Email)
    }

    /// The access policy of a `[[platform]]` without an `access` key.
    pub fn default_access(self) -> Access {
        if self.forgeable() { Access::Allowlist } else { Access::Pairing }
    }

    /// Every key a table of this kind takes: `kind`, the shared keys, its own.
    pub fn keys(self) -> Vec<&'static str> {
        std::iter::once("kind").chain(shared_keys().iter().copied()).chain(self.own_keys().iter().copied()).collect()
    }
}

/// Who may reach the agent through a `[[platform]]` (README, "Access"): decided per sender.
/// `admins` are always allowed; `allowed_users` too; anyone else is governed by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// An unknown sender's direct message gets a pairing code; the owner approves it.
    Pairing,
    /// Only `admins`, `allowed_users` and the chats `allowed_chats` names.
    Allowlist,
    /// Anyone who finds the bot (must be written out).
    Open,
}

impl Access {
    /// The name used in the config file and in `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Pairing => "pairing",
            Access::Allowlist => "allowlist",
            Access::Open => "open",
        }
    }
}

/// One `[[platform]]` table: the keys every kind has, and the kind's own [`settings`]
/// (`kind` is theirs). Credentials come only from the variables or files named here.
///
/// [`settings`]: PlatformConfig::settings
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformConfig {
    /// Unique adapter name (journal rows, status, metrics); defaults to `kind`.
    pub name: Option<String>,
    /// The environment variable holding the credential (Telegram: the bot token; Matrix: the
    /// access token; IRC, optional: the server password sent as `PASS`; Slack: the app-level
    /// token); looked up in `<home>/secrets.env`, then the environment (crates/config/src/secrets.rs).
    pub token_env: Option<String>,
    /// Or the file holding it (0600, ours; relative to the home). Not both.
    pub token_file: Option<PathBuf>,
    /// The groups and rooms served (Telegram chat ids, Matrix room ids, IRC channels, Slack and
    /// Discord channel ids); a direct chat listed here (a Telegram user's chat id, an IRC nick,
    /// an XMPP bare JID) is served too. Empty: no group (with `access = "open"`: every chat).
    /// Email has none: it serves `allowed_senders`.
    pub allowed_chats: Vec<String>,
    /// Platform user ids allowed to run `/restart`, `/stop`, `/update`, `/approve CODE` and
    /// `/revoke USER` from this platform; always allowed to talk to the agent.
    pub admins: Vec<String>,
    /// Who may reach the agent: `pairing`, `allowlist` or `open`. Unset: `pairing`, except on
    /// platforms whose sender ids can be forged (IRC, email): `allowlist` ([`PlatformKind::forgeable`]).
    pub access: Option<Access>,
    /// Sender ids (as the platform names them) allowed to talk to the agent besides `admins`.
    pub allowed_users: Vec<String>,
    /// In a group or room the agent answers only a message that mentions it or replies to it.
    pub require_mention: bool,
    /// How long a conflict signal (Telegram 409, IRC 433) may persist before the adapter
    /// stands by.
    pub conflict_standby_s: u64,
    /// A private CA (PEM): this connection trusts it and nothing else (crates/net). Relative
    /// paths are relative to the home.
    pub ca_file: Option<PathBuf>,
    /// The kind and its own keys.
    #[serde(flatten)]
    pub settings: PlatformSettings,
}

/// The shared keys as the file spells them (serde's view of [`PlatformConfig`] without
/// `settings`, which cannot be flattened under `deny_unknown_fields`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Shared {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    token_env: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    allowed_chats: Vec<String>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    access: Option<Access>,
    #[serde(default)]
    allowed_users: Vec<String>,
    #[serde(default = "default_require_mention")]
    require_mention: bool,
    #[serde(default = "default_conflict_standby")]
    conflict_standby_s: u64,
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

/// The keys every `[[platform]]` table takes besides `kind`.
pub fn shared_keys() -> &'static [&'static str] {
    field_names::<Shared>()
}

fn is_shared(key: &str) -> bool {
    shared_keys().contains(&key)
}

fn default_require_mention() -> bool {
    true
}

fn default_conflict_standby() -> u64 {
    60
}

impl PlatformConfig {
    /// A table of `kind` with every other key at its default, as `[[platform]] kind = "…"` alone
    /// reads (code and tests that build one name only what differs: `..PlatformConfig::new(k)`).
    pub fn new(kind: PlatformKind) -> Self {
        PlatformConfig::with(PlatformSettings::default_of(kind))
    }

    /// A table with these settings and every shared key at its default.
    pub fn with(settings: impl Into<PlatformSettings>) -> Self {
        PlatformConfig {
            name: None,
            token_env: None,
            token_file: None,
            allowed_chats: Vec::new(),
            admins: Vec::new(),
            access: None,
            allowed_users: Vec::new(),
            require_mention: default_require_mention(),
            conflict_standby_s: default_conflict_standby(),
            ca_file: None,
            settings: settings.into(),
        }
    }

    fn from_parts(s: Shared, settings: PlatformSettings) -> Self {
        PlatformConfig {
            name: s.name,
            token_env: s.token_env,
            token_file: s.token_file,
            allowed_chats: s.allowed_chats,
            admins: s.admins,
            access: s.access,
            allowed_users: s.allowed_users,
            require_mention: s.require_mention,
            conflict_standby_s: s.conflict_standby_s,
            ca_file: s.ca_file,
            settings,
        }
    }

    /// The kind's own settings, when the table is of kind `S`.
    pub fn own<S: Kind>(&self) -> Option<&S> {
        S::of(&self.settings)
    }

    /// The platform.
    pub fn kind(&self) -> PlatformKind {
        self.settings.kind()
    }

    /// The access policy in force: `access`, else the kind's default ([`PlatformKind::default_access`]).
    pub fn access(&self) -> Access {
        self.access.unwrap_or(self.kind().default_access())
    }

    /// The adapter's name: `name`, else the kind.
    pub fn adapter_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.kind().as_str().to_owned())
    }

    /// This table's own proxy, when its kind has one.
    pub fn proxy(&self) -> Option<&str> {
        self.settings.proxy()
    }

    /// The shared checks, then the kind's own; `bad` locates an error at a key of this table.
    pub(crate) fn validate(&self, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = self.adapter_name();
        if self.token_env.is_none() && self.token_file.is_none() && self.settings.token_required() {
            return Err(bad(
                "token_env",
                format!(
                    "[[platform]] {name:?} needs token_env, the name of the environment variable holding its token (or token_file, the file)"
                ),
            ));
        }
        crate::one_source(bad, "token", self.token_env.as_deref(), self.token_file.as_deref())?;
        self.settings.validate(self, bad)?;
        if self.admins.iter().chain(&self.allowed_chats).any(|a| a.trim().is_empty()) {
            return Err(bad("admins", "ids must not be empty".into()));
        }
        if self.allowed_users.iter().any(|a| a.trim().is_empty()) {
            return Err(bad("allowed_users", "ids must not be empty".into()));
        }
        if self.access == Some(Access::Pairing) && self.kind().forgeable() {
            return Err(bad(
                "access",
                format!(
                    "[[platform]] {name:?} ({}): its sender ids can be forged, so it sends no pairing codes (strangers could make the gateway send mail or flood); use access = \"allowlist\" with allowed_users",
                    self.kind().as_str()
                ),
            ));
        }
        if self.conflict_standby_s == 0 || self.conflict_standby_s > MAX_SECONDS {
            return Err(bad("conflict_standby_s", format!("must be between 1 and {MAX_SECONDS} seconds")));
        }
        Ok(())
    }

    /// Every `*_file` path of the table, for resolving against the home.
    pub(crate) fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        let mut out = vec![&mut self.ca_file, &mut self.token_file];
        out.extend(self.settings.files_mut());
        out
    }
}

/// Reads a table with no spans to keep (a `toml::Table`, JSON): the same split as the file's
/// loader ([`located`]), whose errors it reports without a location.
impl<'de> Deserialize<'de> for PlatformConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let kind = match table.remove("kind") {
            Some(toml::Value::String(k)) => kind_named(&k).map_err(D::Error::custom)?,
            Some(_) => return Err(D::Error::custom("kind: expected a string")),
            None => return Err(D::Error::missing_field("kind")),
        };
        let (shared, own): (toml::Table, toml::Table) = table.into_iter().partition(|(k, _)| is_shared(k));
        let shared = Shared::deserialize(toml::Value::Table(shared)).map_err(|e| D::Error::custom(e.message()))?;
        let own = PlatformSettings::deserialize_kind(kind, toml::Value::Table(own))
            .map_err(|e| D::Error::custom(e.message()))?;
        Ok(PlatformConfig::from_parts(shared, own))
    }
}

/// The kind named `name`, or why not.
fn kind_named(name: &str) -> Result<PlatformKind, String> {
    PlatformKind::ALL.iter().copied().find(|k| k.as_str() == name).ok_or_else(|| {
        let all: Vec<&str> = PlatformKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("unknown kind {name:?} (expected one of: {})", all.join(", "))
    })
}

/// What went wrong reading one `[[platform]]` table from the spanned document.
pub(crate) enum TableError {
    /// From toml (a type, an unknown key) in a table of `kind`: located by its span.
    Serde { kind: PlatformKind, error: toml::de::Error },
    /// `kind` is missing or names no platform: at this key (`kind`) or the table.
    Kind { at: Option<std::ops::Range<usize>>, message: String },
}

/// One `[[platform]]` table read from the spanned document: `kind` first, then the shared keys
/// and the kind's own keys each from their part of the table, so that toml's spans (and with
/// them the error's line and key) survive.
pub(crate) fn located(
    table: toml::de::DeTable<'_>,
    span: std::ops::Range<usize>,
) -> Result<PlatformConfig, TableError> {
    use toml::de::DeValue;
    let mut table = table;
    let kind = match table.remove_entry("kind") {
        Some((_, v)) => {
            let at = Some(v.span());
            match v.get_ref() {
                DeValue::String(k) => kind_named(k).map_err(|message| TableError::Kind { at, message })?,
                _ => return Err(TableError::Kind { at, message: "expected a string, the platform's kind".into() }),
            }
        }
        None => {
            let all: Vec<&str> = PlatformKind::ALL.iter().map(|k| k.as_str()).collect();
            return Err(TableError::Kind {
                at: None,
                message: format!("every [[platform]] needs kind = one of: {}", all.join(", ")),
            });
        }
    };
    let (shared, own): (toml::de::DeTable<'_>, toml::de::DeTable<'_>) =
        table.into_iter().partition(|(k, _)| is_shared(k.get_ref()));
    let part = |t| toml::de::Deserializer::from(toml::Spanned::new(span.clone(), t));
    let serde = |error| TableError::Serde { kind, error };
    let shared = Shared::deserialize(part(shared)).map_err(serde)?;
    let own = PlatformSettings::deserialize_kind(kind, part(own)).map_err(serde)?;
    Ok(PlatformConfig::from_parts(shared, own))
}

/// The field names serde reads for `T` (a struct), asked of serde itself so that the key lists
/// in errors and in the example's test never drift from the types.
fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Fields(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names read")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut f = Fields(None);
    let _ = T::deserialize(&mut f);
    f.0.unwrap_or(&[])
}

/// `api_base`: an http(s) URL (https needs TLS, which default builds have). `None` is the
/// platform's public https API when `default_https`.
pub(crate) fn validate_api_base(bad: &Bad<'_>, api_base: Option<&str>, default_https: bool) -> Result<(), ConfigError> {
    if let Some(url) = api_base.map(str::trim) {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(bad("api_base", format!("{url:?} must start with http:// or https://")));
        }
        if url.starts_with("https://") && !gatewarden_net::TLS {
            return Err(bad("api_base", format!("{url:?} is https, but {}", crate::NO_TLS)));
        }
    } else if default_https && !gatewarden_net::TLS {
        return Err(bad(
            "api_base",
            format!(
                "the default API base (https://api.telegram.org, https://discord.com/api/v10) is https, but {}",
                crate::NO_TLS
            ),
        ));
    }
    Ok(())
}

/// `poll_timeout_s` (the kinds that long-poll): at most 300 seconds.
pub(crate) fn validate_poll_timeout(bad: &Bad<'_>, poll_timeout_s: u64) -> Result<(), ConfigError> {
    if poll_timeout_s > 300 {
        return Err(bad("poll_timeout_s", "must be at most 300 seconds".into()));
    }
    Ok(())
}

/// `server`: `host:port` with a numeric port, or `host` (IRC: the port then follows `tls`;
/// XMPP: 5222).
pub(crate) fn server_ok(server: Option<&str>) -> Result<(), String> {
    let Some(s) = server.map(str::trim).filter(|s| !s.is_empty()) else {
        return Err("needs server = \"host:port\"".into());
    };
    let Some((host, port)) = s.rsplit_once(':') else {
        if s.contains(char::is_whitespace) {
            return Err(format!("server {s:?} must be host or host:port"));
        }
        return Ok(());
    };
    if host.is_empty() || host.contains(char::is_whitespace) || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("server {s:?} must be host:port with a port between 1 and 65535"));
    }
    Ok(())
}

/// The 25 s long-poll most kinds default to.
pub(crate) fn default_poll_timeout() -> u64 {
    25
}
