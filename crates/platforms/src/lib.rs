//! Chat platform adapters: one contract ([`Adapter`]), one skeleton that implements it
//! ([`skeleton::Skeleton`]), and a protocol module per platform.
//!
//! An adapter's life, driven by the gateway (crates/runtime/src/platforms.rs):
//! 1. the gateway takes the adapter's credential lock ([`credlock`]; with `[cluster]`, a credential
//!    lease in the store instead) — before any connection;
//! 2. [`Adapter::start`] connects and receives on its own OS threads (blocking HTTP with ureq,
//!    as the openai backend does), handing each inbound message to the [`Host`], which journals
//!    it durably before the adapter acknowledges it to the platform;
//! 3. replies leave through the journal's durable outbox: the host calls [`Adapter::wake`] when
//!    there is something to send, and the adapter reports each entry sent or failed;
//! 4. the adapter publishes its [`State`] and the time of its last successful receive or send
//!    ([`Snapshot::last_progress`]); the gateway's watchdog, not the adapter, decides that a deaf
//!    adapter is reconnected ([`Adapter::reconnect`]);
//! 5. drain: [`Adapter::stop_intake`] first (no new receives), then, once runs are idle,
//!    [`Adapter::close`] flushes the outbox within a deadline and stops the threads. (IRC's
//!    server keeps nothing for a successor, so its adapter listens on until `close`.)
//!
//! Steps 2 to 5 are the skeleton's ([`skeleton`]); a platform is a [`skeleton::Protocol`] in
//! its own module ([`telegram`], [`matrix`], [`irc`], [`discord`], [`xmpp`], [`email`],
//! [`slack`], [`mattermost`], [`whatsapp`], [`signal`], [`webhook`]), whose `Settings` are its `[[platform]]` keys
//! (crates/config/src/platform/), and one line in [`build`]'s `platforms!` list
//! (docs/adding-a-platform.md).

pub mod attachments;
pub mod credlock;
pub mod discord;
pub mod email;
mod filexfer;
pub mod hooksig;
pub mod irc;
pub mod matrix;
pub mod mattermost;
pub mod signal;
pub mod skeleton;
pub mod slack;
pub mod telegram;
pub mod webhook;
pub mod whatsapp;
pub mod xmpp;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_config::secrets::PlatformSecret;
use gatewarden_config::{PlatformConfig, PlatformKind, Secrets};
use serde::Serialize;

/// Where an adapter is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum State {
    /// Not started, or (re)connecting.
    Connecting,
    /// Receiving.
    Connected,
    /// The platform cannot be reached; retried with backoff.
    Degraded(String),
    /// Will not run until the configuration or the other holder changes (rejected credentials,
    /// the credential held by another gateway).
    Parked(String),
    /// A platform conflict signal persisted: another consumer is active; this adapter waits.
    Standby(String),
    /// Closed by the drain.
    Closed,
}

impl State {
    /// The state's name, as in `status --json` and the metrics label.
    pub fn name(&self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Connected => "connected",
            State::Degraded(_) => "degraded",
            State::Parked(_) => "parked",
            State::Standby(_) => "standby",
            State::Closed => "closed",
        }
    }

    /// The reason, for the states that have one.
    pub fn reason(&self) -> Option<&str> {
        match self {
            State::Degraded(r) | State::Parked(r) | State::Standby(r) => Some(r),
            _ => None,
        }
    }
}

/// An adapter's published facts, shared with the gateway (status, metrics, watchdog).
#[derive(Debug)]
pub struct Status {
    inner: Mutex<StatusInner>,
}

#[derive(Debug, Clone)]
struct StatusInner {
    state: State,
    since: SystemTime,
    last_progress: Option<SystemTime>,
    last_progress_at: Option<Instant>,
    lag_s: Option<f64>,
    received: u64,
    sent: u64,
    conflicts: u64,
    last_error: Option<String>,
}

/// A copy of [`Status`] at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    #[serde(flatten)]
    pub state: State,
    /// RFC 3339: when the state last changed.
    pub since: String,
    /// RFC 3339: the last successful receive or send.
    pub last_progress: Option<String>,
    /// Seconds since `last_progress`.
    pub progress_age_s: Option<f64>,
    /// Seconds between the platform's timestamp of the last inbound message and its commit.
    pub lag_s: Option<f64>,
    pub received: u64,
    /// Pieces sent (a long reply is several).
    pub sent: u64,
    pub conflicts: u64,
    /// The reason of the last `degraded` or `parked`, kept after recovery.
    pub last_error: Option<String>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            inner: Mutex::new(StatusInner {
                state: State::Connecting,
                since: SystemTime::now(),
                last_progress: None,
                last_progress_at: None,
                lag_s: None,
                received: 0,
                sent: 0,
                conflicts: 0,
                last_error: None,
            }),
        }
    }
}

impl StatusInner {
    fn set(&mut self, state: State) -> bool {
        if self.state == state {
            return false;
        }
        if let State::Degraded(why) | State::Parked(why) = &state {
            self.last_error = Some(why.clone());
        }
        self.state = state;
        self.since = SystemTime::now();
        true
    }
}

impl Status {
    fn with<R>(&self, f: impl FnOnce(&mut StatusInner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Moves to `state`; returns whether it changed (by name or reason).
    pub fn set(&self, state: State) -> bool {
        self.with(|s| s.set(state))
    }

    /// Moves to `state` unless the adapter is parked: a parked adapter stays parked until its
    /// next start, whichever half (receive or send) parked it, and keeps the reason that parked
    /// it. The skeleton's halves set their state through this; `start` and `close` use [`set`].
    ///
    /// [`set`]: Status::set
    pub fn set_unless_parked(&self, state: State) -> bool {
        // One lock: a receive that ends just as the sender parks cannot unpark.
        self.with(|s| !matches!(s.state, State::Parked(_)) && s.set(state))
    }

    pub fn parked(&self) -> bool {
        matches!(self.state(), State::Parked(_))
    }

    pub fn state(&self) -> State {
        self.with(|s| s.state.clone())
    }

    /// A successful receive or send.
    pub fn progress(&self) {
        self.with(|s| {
            s.last_progress = Some(SystemTime::now());
            s.last_progress_at = Some(Instant::now());
        });
    }

    /// How long since the last progress (since start when there was none).
    pub fn progress_age(&self, started: Instant) -> Duration {
        self.with(|s| s.last_progress_at.unwrap_or(started).elapsed())
    }

    pub fn received(&self, lag_s: Option<f64>) {
        self.with(|s| {
            s.received += 1;
            if lag_s.is_some() {
                s.lag_s = lag_s;
            }
        });
    }

    pub fn sent(&self) {
        self.with(|s| s.sent += 1);
    }

    pub fn conflict(&self) {
        self.with(|s| s.conflicts += 1);
    }

    pub fn snapshot(&self) -> Snapshot {
        self.with(|s| Snapshot {
            state: s.state.clone(),
            since: gatewarden_lifecycle::timefmt::format(s.since),
            last_progress: s.last_progress.map(gatewarden_lifecycle::timefmt::format),
            progress_age_s: s.last_progress_at.map(|t| t.elapsed().as_secs_f64()),
            lag_s: s.lag_s,
            received: s.received,
            sent: s.sent,
            conflicts: s.conflicts,
            last_error: s.last_error.clone(),
        })
    }
}

/// One message from a platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The platform's id for this event (Telegram: update_id); deduplicates redeliveries.
    pub event_id: String,
    pub chat_id: String,
    pub user_id: String,
    pub text: String,
    /// When the platform says it was sent.
    pub sent_at: Option<SystemTime>,
    /// One person's conversation with the bot, or a group (a room, a channel), as the platform
    /// says: the access policy treats them differently (crates/runtime/src/access/).
    pub chat: ChatKind,
    /// `allowed_chats` names this chat, by the platform's own rules (Matrix aliases resolved,
    /// IRC channels and nicks case-insensitively, XMPP `rooms` and bare JIDs; email: the sender
    /// matches `allowed_senders`). The adapter says so; the policy decides what it means.
    pub listed: bool,
    /// The message mentions the bot or replies to one of its messages: what a group message
    /// needs under `require_mention`.
    pub addressed: bool,
    /// The files it carries (issue 29): the protocol declares them, the skeleton downloads them
    /// into the store before [`Host::deliver`] (attachments.rs).
    pub attachments: Vec<attachments::Attachment>,
}

impl Inbound {
    /// The text the journal keeps: the message's own, then one line per attachment naming the
    /// stored file by its hash, or why it was refused ([`attachments::line`]), so the journal
    /// row refers to every file before the platform's position moves.
    pub fn journal_text(&self) -> String {
        let mut t = attachments::escape_text(&self.text);
        for a in &self.attachments {
            if !t.is_empty() {
                t.push('\n');
            }
            t.push_str(&attachments::line(a));
        }
        t
    }

    /// Why some of its attachments were refused, for the chat (one line each); `None` when none
    /// were.
    pub fn refusals(&self) -> Option<String> {
        let lines: Vec<String> = self
            .attachments
            .iter()
            .filter_map(|a| match &a.outcome {
                Some(attachments::Outcome::Refused(why)) => Some(format!("{}: {why}", a.name)),
                _ => None,
            })
            .collect();
        (!lines.is_empty()).then(|| format!("attachment refused: {}", lines.join("; ")))
    }
}

/// What kind of chat an [`Inbound`] message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChatKind {
    /// A direct (private) chat between one sender and the bot.
    #[default]
    Direct,
    /// A group, room or channel: several people, the bot among them.
    Group,
}

impl ChatKind {
    /// `direct` or `group` (ledger lines, tests).
    pub fn as_str(self) -> &'static str {
        match self {
            ChatKind::Direct => "direct",
            ChatKind::Group => "group",
        }
    }
}

/// Whether `text` names `name` as a word (case-insensitively): `@gwbot hi`, `gwbot: hi`, but
/// not `gwbots`. Platforms whose mentions are plain text (IRC, an XMPP room nick, a Telegram
/// `@username`) use it; `name` must not be empty.
pub fn names_word(text: &str, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let (hay, needle) = (text.to_lowercase(), name.to_lowercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
    hay.match_indices(&needle).any(|(at, m)| {
        let before = hay.get(..at).and_then(|s| s.chars().next_back());
        let after = hay.get(at + m.len()..).and_then(|s| s.chars().next());
        // `@name` is a mention however it starts; a bare name needs a boundary on both sides.
        (needle.starts_with('@') || !word(before)) && !word(after)
    })
}

/// A reply to send, from the journal's outbox.
pub use gatewarden_journal::Outgoing;

/// What the worker tells an adapter about one run in one chat ([`Adapter::show`]), so the chat
/// sees the agent at work. Best-effort: nothing here is journaled; the reply itself still
/// leaves through the outbox (docs/adding-a-platform.md, "Showing the agent at work").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// The run started: the chat shows "typing…" until [`Activity::Ended`].
    Started,
    /// More of the reply was written: appended to what the run wrote so far (an agent's text
    /// delta). A reply still being written 2 s after the start is previewed as it grows.
    Text(String),
    /// The run ended. `replied`: its reply (or failure notice) is in the outbox, and the preview
    /// goes once that entry is sent; otherwise (cancelled by the drain, re-run by the next
    /// incarnation) the preview goes now.
    Ended { replied: bool },
}

/// One command of the platform's command menu (Telegram's `setMyCommands`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MenuCommand {
    /// Without the slash: `status`.
    pub name: String,
    pub description: String,
    /// Only admins may run it: shown only in the admins' chats.
    pub admin: bool,
}

/// How a send ended, for the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Ok,
    /// The platform refused it for good (unknown chat, bot blocked): never retried.
    Rejected(String),
}

/// What the gateway offers an adapter. Every method blocks (journal commits) and is called
/// from the adapter's own threads.
pub trait Host: Send + Sync {
    /// Journals `msg` durably (a duplicate event id is not journaled again) and routes it (a
    /// run, or a chat command). `Ok` means committed: the adapter may now acknowledge it to the
    /// platform. `Err` means nothing was committed; the adapter must not acknowledge it.
    fn deliver(&self, adapter: &str, msg: Inbound) -> Result<(), String>;
    /// The journaled message id of `adapter`'s inbound event `event_id`, once delivered (a push
    /// platform answers its sender with it). `None`: not journaled (or dropped by the access
    /// policy), or a host that cannot say.
    fn message_id(&self, _adapter: &str, _event_id: &str) -> Option<String> {
        None
    }
    /// Up to `limit` outbox entries waiting for `adapter`, oldest first.
    fn outbox(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String>;
    /// Records how sending entry `seq` ended.
    fn sent(&self, seq: i64, outcome: Sent);
    /// A state change worth a ledger line (parked, standby, recovered).
    fn state_changed(&self, adapter: &str, state: &State);
    /// The longest one receive may block (a long poll's or a sync's `timeout`), when the gateway
    /// bounds it: a cluster active never waits on a platform longer than the lease it has left
    /// (crates/cluster/README.md). `None`: the adapter's own setting.
    fn receive_budget(&self) -> Option<Duration> {
        None
    }
    /// How far back an adapter starting without a saved receive position (Matrix: no sync token
    /// in this home) takes messages as new rather than as history. `None`: nothing before the
    /// start is answered (one home: a missing token is a first start). With a cluster, whose
    /// journal deduplicates event ids across gateways, a standby promoted on another host has
    /// no token of its own: the window lets it answer what arrived while no active listened.
    fn fresh_start_window(&self) -> Option<Duration> {
        None
    }
    /// A directory in the home where an adapter keeps small durable state (the Matrix `since`
    /// token), created by the adapter when needed. `None`: nothing survives a restart.
    fn state_dir(&self) -> Option<PathBuf> {
        None
    }
    /// The chat commands, for platforms with a command menu (runtime/src/commands.rs).
    fn menu(&self) -> Vec<MenuCommand> {
        Vec::new()
    }
    /// Whether `msg` would be delivered (the access policy, deciding nothing): the skeleton
    /// downloads a message's files only then, so a stranger cannot make the gateway fetch and
    /// store files.
    fn admits(&self, adapter: &str, msg: &Inbound) -> bool {
        let _ = (adapter, msg);
        true
    }
    /// Where downloaded attachments are stored and under which bounds. `None`: attachments are
    /// refused with a notice (nothing is stored).
    fn attachments(&self) -> Option<(attachments::Store, attachments::Bounds)> {
        None
    }
}

/// A request on the gateway's listener for one adapter, `/hooks/<kind>/<name>` (crates/runtime/
/// src/http/hooks.rs): what a platform that pushes (WhatsApp's webhook) is given, unparsed, so
/// its signature is checked over the exact bytes. The body is bounded by the listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookRequest {
    /// `GET` or `POST` (others never get here).
    pub post: bool,
    /// The query string, without `?`, still percent-encoded.
    pub query: String,
    /// The headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HookRequest {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// The answer to a [`HookRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookAnswer {
    pub status: u16,
    /// A plain-text body.
    pub body: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// The body is JSON (`application/json`), not plain text.
    pub json: bool,
}

impl HookAnswer {
    pub fn text(status: u16, body: impl Into<String>) -> HookAnswer {
        HookAnswer { status, body: body.into(), retry_after: None, json: false }
    }

    /// 503 with `Retry-After: 1`: try again shortly.
    pub fn unavailable(why: String) -> HookAnswer {
        HookAnswer { status: 503, body: why, retry_after: Some(1), json: false }
    }

    /// `status` with a JSON body.
    pub fn json(status: u16, body: &serde_json::Value) -> HookAnswer {
        HookAnswer { status, body: body.to_string(), retry_after: None, json: true }
    }

    /// 404: this adapter takes no pushed requests.
    pub fn not_found() -> HookAnswer {
        HookAnswer::text(404, "this adapter takes no requests")
    }
}

/// Why an adapter cannot be built or started.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// A secret the table names cannot be had: the resolver's words (crates/config/src/secrets.rs).
    #[error("{0}")]
    MissingCredential(String),
    /// The table names no credential the platform needs (config validation prevents it).
    #[error("[[platform]] {name}: no {key} is configured")]
    Unconfigured { name: String, key: &'static str },
    #[error("[[platform]] {name}: cannot start: {message}")]
    Start { name: String, message: String },
}

/// The adapter contract. Every method returns promptly except [`Adapter::close`], which is
/// bounded by its deadline.
pub trait Adapter: Send + Sync {
    /// The unique adapter name (`[[platform]] name`).
    fn name(&self) -> &str;
    /// The platform (`telegram`, …).
    fn kind(&self) -> &'static str;
    /// What the credential lock is keyed by: the secret that only one consumer may use.
    fn credential(&self) -> &str;
    fn status(&self) -> &Arc<Status>;
    /// Connects and starts receiving and sending on the adapter's own threads. Called again
    /// after [`Adapter::close`] (a cluster standby promoted anew), it starts afresh.
    fn start(&self, host: Arc<dyn Host>) -> Result<(), AdapterError>;
    /// The outbox has something for this adapter.
    fn wake(&self);
    /// The watchdog found no progress for too long: drop connections and reconnect.
    fn reconnect(&self);
    /// Drain, step 1: no new receives; the platform keeps what arrives for the successor.
    fn stop_intake(&self);
    /// Drain, step 2: send what the outbox holds until `deadline`, then stop. Returns whether
    /// the outbox was empty at the end (what is left waits for the successor).
    fn close(&self, deadline: Instant) -> bool;
    /// Parks the adapter without starting it (its credential is held elsewhere).
    fn park(&self, reason: String) {
        self.status().set(State::Parked(reason));
    }
    /// How long without progress before the watchdog reconnects.
    fn watchdog_after(&self) -> Duration;
    /// Shows a run's progress in `chat` (typing, a growing preview); `run` is the journaled
    /// message id, which the reply's outbox entry names. Never blocks; best-effort.
    fn show(&self, _chat: &str, _run: &str, _activity: Activity) {}
    /// A request pushed to this adapter on the gateway's listener (`/hooks/<kind>/<name>`):
    /// the one way the listener reaches an adapter. Blocks until the request's messages are
    /// journaled or refused, bounded (skeleton/push.rs). Default: 404, the adapter pulls.
    fn hook(&self, _req: &HookRequest) -> HookAnswer {
        HookAnswer::not_found()
    }
}

/// The lowercase hex SHA-256 of `data`: the credential lock's and lease's key, so the credential
/// itself is written nowhere.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// A response header holding whole seconds (`Retry-After` in its delta form), as a wait; the
/// REST clients of Slack, Mattermost, WhatsApp and webhook callbacks read their waits here.
pub(crate) fn header_secs<B>(response: &ureq::http::Response<B>, name: &str) -> Option<Duration> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// A JSON API's answer body read whole within `limit` bytes: the JSON, or `Null` when it is
/// none (the status says what happened); `Err` with the network's words when it cannot be read.
/// Every platform's REST client reads its answers here.
pub(crate) fn json_body(response: ureq::http::Response<ureq::Body>, limit: u64) -> Result<serde_json::Value, String> {
    let text = response.into_body().with_config().limit(limit).read_to_string().map_err(|e| e.to_string())?;
    Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// One `[[platform]]` table's credentials, from the resolved `secrets`
/// (crates/config/src/secrets.rs; the values leave their `Secret` here, for the protocol that
/// sends them).
pub struct Credentials<'a> {
    name: String,
    secrets: &'a Secrets,
}

impl Credentials<'_> {
    /// `what`, when configured.
    pub fn optional(&self, what: PlatformSecret) -> Result<Option<String>, AdapterError> {
        self.secrets
            .platform(&self.name, what)
            .map(|s| s.map(|s| s.expose().to_owned()))
            .map_err(AdapterError::MissingCredential)
    }

    /// `what`, which the table must configure through `key` (named in the error).
    pub fn required(&self, what: PlatformSecret, key: &'static str) -> Result<String, AdapterError> {
        self.optional(what)?.ok_or_else(|| AdapterError::Unconfigured { name: self.name.clone(), key })
    }

    /// The platform's main credential (`token_env` or `token_file`).
    pub fn token(&self) -> Result<String, AdapterError> {
        self.required(PlatformSecret::Token, "token_env or token_file")
    }
}

/// The one list of platforms the gateway builds, `Kind => protocol` (a
/// [`skeleton::FromConfig`]): it generates [`build`]. A new platform is its protocol file,
/// one line here and one in crates/config/src/platform/mod.rs's `registry!`; the match is
/// exhaustive, so a kind without its line here does not compile.
macro_rules! platforms {
    ($($kind:ident => $proto:ty,)*) => {
        /// Builds the adapter for one `[[platform]]` table, its credentials from `secrets`.
        pub fn build(cfg: &PlatformConfig, secrets: &Secrets) -> Result<Arc<dyn Adapter>, AdapterError> {
            let creds = Credentials { name: cfg.adapter_name(), secrets };
            match cfg.kind() {
                $(PlatformKind::$kind => {
                    Ok(Arc::new(<$proto as skeleton::FromConfig>::from_config(cfg, &creds)?))
                })*
            }
        }
    };
}

platforms! {
    Telegram => telegram::Proto,
    Matrix => matrix::Proto,
    Irc => irc::Proto,
    Xmpp => xmpp::Proto,
    Discord => discord::Proto,
    Email => email::Proto,
    Slack => slack::Proto,
    Mattermost => mattermost::Proto,
    Whatsapp => whatsapp::Proto,
    Signal => signal::Proto,
    Webhook => webhook::Proto,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fips_vectors() {
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // Padding that spills into a second block.
        assert_eq!(sha256_hex(&[b'a'; 64]), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
    }

    #[test]
    fn names_are_words() {
        assert!(names_word("@GwBot hello", "@gwbot"));
        assert!(names_word("gwbot: hello", "gwbot"));
        assert!(names_word("hi gwbot", "gwbot"));
        assert!(names_word("/status@gwbot", "@gwbot"));
        assert!(!names_word("gwbots are fun", "gwbot"));
        assert!(!names_word("xgwbot", "gwbot"));
        assert!(!names_word("@gwbot_x", "@gwbot"));
        assert!(!names_word("anything", ""));
    }

    #[test]
    fn the_last_error_outlives_the_recovery() {
        let s = Status::default();
        assert_eq!(s.snapshot().last_error, None);
        assert!(s.set(State::Degraded("cannot reach the Bot API".into())));
        assert!(s.set(State::Connected));
        assert!(s.set(State::Standby("another consumer is active".into())), "standby is no error");
        let snap = s.snapshot();
        assert_eq!((snap.state.name(), snap.last_error.as_deref()), ("standby", Some("cannot reach the Bot API")));
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["last_error"], "cannot reach the Bot API");
        assert_eq!(json["state"], "standby");
    }
}
