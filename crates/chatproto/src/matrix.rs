//! `matrix`: a blocking client for the Matrix client-server API (v3), plain HTTP over ureq.
//!
//! What it covers, and nothing more: password login (or an access token) with a caller-chosen
//! `device_id`, `whoami`, joining and creating rooms, the `/sync` long-poll with a `since` token
//! and a server-side timeout, and sending `m.room.message` text events with a transaction id.
//!
//! * **Media.** `m.image`, `m.file`, `m.audio` and `m.video` messages come with their [`Media`]
//!   (name, `info.mimetype`, `info.size`, the `mxc://` URL). [`Client::download`] reads one
//!   through the authenticated media API (`GET /_matrix/client/v1/media/download/{server}/{id}`,
//!   spec v1.11; Synapse 1.111+) with the access token, falling back to the older
//!   `/_matrix/media/v3/download/…` when the server does not know the endpoint (404/405
//!   `M_UNRECOGNIZED`). [`Client::upload`] is `POST /_matrix/media/v3/upload`; the upload has no
//!   transaction id (a retry stores the bytes again), the message event that names it does.
//!   Encrypted media (`file` instead of `url`) has no key here: [`Media::url`] is `None`.
//!
//! * **Sync.** [`Client::sync`] asks for `m.room.message` timeline events only (an inline filter)
//!   and returns the text messages (`msgtype` `m.text`) sent by *others*, the rooms the user is
//!   invited to, the rooms whose timeline was `limited` (a gap: the server skipped events), and
//!   the `next_batch` token to pass as `since` next time. Edits (`m.replace`) are not new
//!   messages and are skipped. Without `since`, the server returns recent history; an adapter that
//!   only wants new messages discards that first batch and keeps its token.
//! * **Idempotent sends.** [`Client::send_text`] PUTs to `.../send/m.room.message/{txnId}`. The
//!   homeserver remembers transaction ids per device, so a retry with the same id (after a timeout,
//!   or after a restart that logged in again with the same `device_id`) returns the first
//!   `event_id` and delivers nothing new. The adapter's durable outbox supplies the id.
//! * **Errors** are typed by what the caller should do ([`ErrorKind`]): `M_UNKNOWN_TOKEN`,
//!   `M_MISSING_TOKEN`, `M_USER_DEACTIVATED` (and `M_FORBIDDEN` at login) reject the credentials;
//!   429 / `M_LIMIT_EXCEEDED` is rate limiting with the server's `retry_after_ms` (or
//!   `Retry-After`); connection failures, timeouts and 5xx are transient.
//! * **Total parsing.** Responses are read with a size cap and parsed from `serde_json::Value`
//!   field by field: a malformed event is skipped, a malformed body is an [`Error::Protocol`],
//!   nothing panics.
//!
//! **End-to-end encryption is out of scope.** Messages in encrypted rooms arrive as
//! `m.room.encrypted` and are not returned; a bot must be invited to unencrypted rooms. (E2EE
//! needs an Olm/Megolm crypto store, i.e. `matrix-sdk`, which needs a newer rustc than this
//! workspace's.) Plain HTTP instead of `ruma`'s typed API keeps the dependency to the ureq
//! already in the workspace, for the handful of endpoints used here.
//!
//! Blocking: run a [`Client`] on a dedicated thread (see `crates/agent/src/backend/openai.rs` for
//! why not `spawn_blocking`). [`Client`] is `Clone + Send + Sync`: a sync loop and a sender can
//! share one login.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

/// Largest response body read (a first `/sync` of a busy account is the big one).
const MAX_BODY_BYTES: u64 = 32 << 20;
/// Bytes of an unparseable body kept in an error message.
const ERROR_BODY_BYTES: usize = 512;
/// Timeline events per room per sync (the rest is reported as a gap).
const TIMELINE_LIMIT: u32 = 100;

/// What the caller should do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The server refused the credentials: park the adapter with the reason; retrying cannot help.
    Rejected,
    /// Rate limited: retry after [`Error::retry_after`] (or a backoff when the server gave none).
    RateLimited,
    /// Unreachable, timed out or failing server: retry with backoff, report `degraded`.
    Transient,
    /// The request itself is wrong (unknown room, not invited, bad configuration): retrying the
    /// same request will fail the same way.
    Permanent,
}

/// A Matrix client error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Credentials rejected (`M_UNKNOWN_TOKEN`, `M_MISSING_TOKEN`, `M_USER_DEACTIVATED`, or
    /// `M_FORBIDDEN` on login).
    #[error("matrix: credentials rejected ({errcode}): {message}")]
    Rejected {
        /// The Matrix `errcode`.
        errcode: String,
        /// The server's `error` text.
        message: String,
    },
    /// HTTP 429 or `M_LIMIT_EXCEEDED`.
    #[error("matrix: rate limited ({message}); retry after {retry_after:?}")]
    RateLimited {
        /// `retry_after_ms` from the body, else the `Retry-After` header.
        retry_after: Option<Duration>,
        /// The server's `error` text.
        message: String,
    },
    /// Connection refused or reset, timeout, DNS failure, or a 5xx answer.
    #[error("matrix: homeserver unavailable: {0}")]
    Transient(String),
    /// Any other error answer (for example `M_FORBIDDEN` joining a room one is not invited to).
    #[error("matrix: HTTP {status} {errcode}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The Matrix `errcode` (empty when the body had none).
        errcode: String,
        /// The server's `error` text, or the start of the body.
        message: String,
    },
    /// A 2xx answer whose body is not what the API specifies.
    #[error("matrix: unexpected response: {0}")]
    Protocol(String),
    /// The call needs a login first.
    #[error("matrix: not logged in")]
    NotLoggedIn,
    /// Bad configuration or argument (URL, empty transaction id, https without the `tls` feature).
    #[error("matrix: invalid configuration: {0}")]
    Config(String),
}

impl Error {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Rejected { .. } | Error::NotLoggedIn => ErrorKind::Rejected,
            Error::RateLimited { .. } => ErrorKind::RateLimited,
            Error::Transient(_) => ErrorKind::Transient,
            // A 2xx with a body we cannot read is most likely a proxy or a half-written answer.
            Error::Protocol(_) => ErrorKind::Transient,
            Error::Api { .. } | Error::Config(_) => ErrorKind::Permanent,
        }
    }

    /// The server's requested wait, for [`ErrorKind::RateLimited`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A login: who we are and the token that proves it.
#[derive(Clone, PartialEq, Eq)]
pub struct Session {
    /// Fully qualified user id, `@name:server`.
    pub user_id: String,
    /// The device the token belongs to (transaction ids are remembered per device).
    pub device_id: Option<String>,
    /// The access token.
    pub access_token: String,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("user_id", &self.user_id)
            .field("device_id", &self.device_id)
            .field("access_token", &"<redacted>")
            .finish()
    }
}

/// The file of an `m.image`, `m.file`, `m.audio` or `m.video` message (spec "m.room.message
/// msgtypes").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Media {
    /// `m.image`, `m.file`, `m.audio` or `m.video`.
    pub msgtype: String,
    /// The file name: `filename`, else `body` (before spec v1.10 the body was the name).
    pub name: String,
    /// `info.mimetype`, as the sender declares it.
    pub mimetype: Option<String>,
    /// `info.size` in bytes, as the sender declares it.
    pub size: Option<u64>,
    /// `mxc://server/id`; `None` for encrypted media (`file`), which needs keys this client
    /// does not have.
    pub url: Option<String>,
}

/// A text message from someone else, as returned by [`Client::sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMessage {
    /// The room it was sent in.
    pub room_id: String,
    /// The event id: unique per homeserver, the key to deduplicate on.
    pub event_id: String,
    /// The sender's user id.
    pub sender: String,
    /// The plain-text body; for a file, its caption (`body` when a `filename` differs from it,
    /// spec v1.10), else empty.
    pub body: String,
    /// The file a media message carries.
    pub media: Option<Media>,
    /// Sender's server timestamp (ms since the epoch), 0 when absent.
    pub origin_server_ts: u64,
    /// The message mentions us: our user id in `m.mentions.user_ids` (which clients also set
    /// for the sender of the event a reply answers, spec v1.7 "User and room mentions"), or
    /// in its body or formatted body (a mention pill links to it; an older reply's fallback
    /// quotes it).
    pub mentions_me: bool,
}

/// One `/sync` answer, reduced to what an adapter acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncBatch {
    /// The token to pass as `since` next time (persist it after the messages are journaled).
    pub next_batch: String,
    /// Text messages from others, in timeline order per room.
    pub messages: Vec<TextMessage>,
    /// Rooms the user has been invited to (join them with [`Client::join`]).
    pub invites: Vec<String>,
    /// Those of [`SyncBatch::invites`] whose invite says `is_direct` (a direct chat, spec
    /// "Direct Messaging": the `m.room.member` invite event of our user in `invite_state`).
    pub direct_invites: Vec<String>,
    /// Rooms whose timeline was `limited`: the server skipped events between the last batch and
    /// this one (read them with [`Client::messages_before`] from the room's `prev_batch`).
    pub gaps: Vec<String>,
    /// `(room, prev_batch)` of each room in [`SyncBatch::gaps`] that gave one.
    pub prev_batches: Vec<(String, String)>,
}

/// One page of a room's history, newest first ([`Client::messages_before`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryPage {
    /// Text messages from others, newest first.
    pub messages: Vec<TextMessage>,
    /// Where the next (older) page starts; `None` when the history (or the range) is exhausted.
    pub next: Option<String>,
}

/// A blocking Matrix client for one homeserver.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: ureq::Agent,
    request_timeout: Duration,
    session: Option<Session>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("base", &self.base).field("session", &self.session).finish()
    }
}

enum Method {
    Get,
    Post,
    Put,
}

impl Client {
    /// A client for `homeserver` (`http://host:port` or `https://…`, with or without a trailing
    /// `/`). `request_timeout` bounds every call; a sync adds its own long-poll timeout on top.
    /// The system trust store and the environment's proxy.
    pub fn new(homeserver: &str, request_timeout: Duration) -> Result<Client, Error> {
        Client::with_outbound(homeserver, request_timeout, &gatewarden_net::Outbound::system())
    }

    /// [`Client::new`] with this homeserver's own TLS and proxy settings (crates/net).
    pub fn with_outbound(
        homeserver: &str,
        request_timeout: Duration,
        out: &gatewarden_net::Outbound,
    ) -> Result<Client, Error> {
        let base = homeserver.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) || base.contains(char::is_whitespace) {
            return Err(Error::Config(format!("homeserver URL must be http(s)://host[:port], got {homeserver:?}")));
        }
        let http = gatewarden_net::http_config(out)
            .http_status_as_error(false)
            .timeout_global(Some(request_timeout))
            .build()
            .new_agent();
        Ok(Client { base, http, request_timeout, session: None })
    }

    /// The homeserver base URL.
    pub fn homeserver(&self) -> &str {
        &self.base
    }

    /// The current login, if any.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Our user id, once logged in (or after [`Client::whoami`] with a bare token).
    pub fn user_id(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.user_id.as_str()).filter(|u| !u.is_empty())
    }

    /// Logs in with `m.login.password`. Pass a stable `device_id` so transaction ids stay
    /// idempotent across re-logins (they are remembered per device).
    pub fn login_password(&mut self, user: &str, password: &str, device_id: Option<&str>) -> Result<Session, Error> {
        let mut body = json!({
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user},
            "password": password,
            "initial_device_display_name": "gatewarden",
        });
        if let Some(d) = device_id {
            body["device_id"] = json!(d);
        }
        let v = self.request(Method::Post, "/_matrix/client/v3/login", &[], Some(&body), None, true)?;
        let session = Session {
            user_id: str_field(&v, "user_id")?,
            device_id: v["device_id"].as_str().map(str::to_string),
            access_token: str_field(&v, "access_token")?,
        };
        self.session = Some(session.clone());
        Ok(session)
    }

    /// Uses an existing access token. The user id is learned by [`Client::whoami`], which the
    /// caller should call next (sync needs it to tell our own messages from others').
    pub fn set_access_token(&mut self, token: impl Into<String>) {
        self.session = Some(Session { user_id: String::new(), device_id: None, access_token: token.into() });
    }

    /// `GET /account/whoami`: checks the token and records the user and device ids.
    pub fn whoami(&mut self) -> Result<Session, Error> {
        let v = self.request(Method::Get, "/_matrix/client/v3/account/whoami", &[], None, None, false)?;
        let user_id = str_field(&v, "user_id")?;
        let session = self.session.as_mut().ok_or(Error::NotLoggedIn)?;
        session.user_id = user_id;
        if let Some(d) = v["device_id"].as_str() {
            session.device_id = Some(d.to_string());
        }
        Ok(session.clone())
    }

    /// Joins a room by id (`!x:server`) or alias (`#x:server`); returns the room id.
    pub fn join(&self, room: &str) -> Result<String, Error> {
        let path = format!("/_matrix/client/v3/join/{}", encode_segment(room));
        let v = self.request(Method::Post, &path, &[], Some(&json!({})), None, false)?;
        str_field(&v, "room_id")
    }

    /// How many users have joined `room` (`GET /rooms/{roomId}/joined_members`): a room of two,
    /// the bot and one person, is a direct chat whatever it is called.
    pub fn joined_member_count(&self, room: &str) -> Result<usize, Error> {
        let path = format!("/_matrix/client/v3/rooms/{}/joined_members", encode_segment(room));
        let v = self.request(Method::Get, &path, &[], None, None, false)?;
        Ok(v["joined"].as_object().map_or(0, serde_json::Map::len))
    }

    /// Sends any `m.room.message` content (a test user's mention: `m.mentions`, a reply's
    /// `m.relates_to`); returns the event id. [`Client::send_text`] is the plain case.
    pub fn send_content(&self, room_id: &str, txn_id: &str, content: &Value) -> Result<String, Error> {
        self.send_message(room_id, txn_id, content)
    }

    /// Creates a direct chat with `user`: a private room whose invite says `is_direct` (spec
    /// "Direct Messaging"); returns the room id.
    pub fn create_direct(&self, user: &str) -> Result<String, Error> {
        let body = json!({"preset": "trusted_private_chat", "invite": [user], "is_direct": true});
        let v = self.request(Method::Post, "/_matrix/client/v3/createRoom", &[], Some(&body), None, false)?;
        str_field(&v, "room_id")
    }

    /// Creates a private room and invites `invite` (user ids); returns the room id.
    pub fn create_room(&self, invite: &[&str]) -> Result<String, Error> {
        let body = json!({"preset": "private_chat", "invite": invite});
        let v = self.request(Method::Post, "/_matrix/client/v3/createRoom", &[], Some(&body), None, false)?;
        str_field(&v, "room_id")
    }

    /// One `/sync`: waits up to `timeout` for new events after `since` (the server answers
    /// sooner when something arrives). `since = None` is an initial sync (recent history).
    pub fn sync(&self, since: Option<&str>, timeout: Duration) -> Result<SyncBatch, Error> {
        let own = self.user_id().ok_or(Error::NotLoggedIn)?.to_string();
        let timeout_ms = timeout.as_millis().to_string();
        let filter = sync_filter();
        let mut query = vec![("timeout", timeout_ms.as_str()), ("filter", filter.as_str())];
        if let Some(s) = since {
            query.push(("since", s));
        }
        let v = self.request(Method::Get, "/_matrix/client/v3/sync", &query, None, Some(timeout), false)?;
        parse_sync(&v, &own)
    }

    /// One page (up to `limit` events) of `room_id`'s history backwards from `from` (a sync's
    /// `prev_batch`, or an earlier page's `next`), stopping at `to` (the `since` token the gap
    /// started after).
    pub fn messages_before(&self, room_id: &str, from: &str, to: &str, limit: u32) -> Result<HistoryPage, Error> {
        let own = self.user_id().ok_or(Error::NotLoggedIn)?.to_string();
        let path = format!("/_matrix/client/v3/rooms/{}/messages", encode_segment(room_id));
        let limit = limit.to_string();
        let filter = json!({"types": ["m.room.message"]}).to_string();
        let query = [("dir", "b"), ("from", from), ("to", to), ("limit", limit.as_str()), ("filter", filter.as_str())];
        let v = self.request(Method::Get, &path, &query, None, None, false)?;
        Ok(parse_history(&v, room_id, &own))
    }

    /// Sends a text message with transaction id `txn_id`; returns the event id. Re-sending with
    /// the same `txn_id` from the same device returns the same event id and delivers nothing new.
    pub fn send_text(&self, room_id: &str, txn_id: &str, body: &str) -> Result<String, Error> {
        self.send_message(room_id, txn_id, &json!({"msgtype": "m.text", "body": body}))
    }

    /// Sends an `m.room.message` with this `content` (see [`Client::send_text`]).
    fn send_message(&self, room_id: &str, txn_id: &str, content: &Value) -> Result<String, Error> {
        if txn_id.is_empty() {
            return Err(Error::Config("empty transaction id".into()));
        }
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            encode_segment(room_id),
            encode_segment(txn_id)
        );
        let v = self.request(Method::Put, &path, &[], Some(content), None, false)?;
        str_field(&v, "event_id")
    }

    /// Replaces the text of our message `event_id` (an `m.replace` edit, client-server API
    /// "Event replacements": the fallback `body` is `* <text>`, the new text in
    /// `m.new_content`); returns the edit's event id.
    pub fn edit_text(&self, room_id: &str, txn_id: &str, event_id: &str, body: &str) -> Result<String, Error> {
        let content = json!({
            "msgtype": "m.text",
            "body": format!("* {body}"),
            "m.new_content": {"msgtype": "m.text", "body": body},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        });
        self.send_message(room_id, txn_id, &content)
    }

    /// `PUT /rooms/{room}/typing/{user}`: our typing notice on for `timeout`, or off. Needs
    /// the user id ([`Client::whoami`]).
    pub fn typing(&self, room_id: &str, on: bool, timeout: Duration) -> Result<(), Error> {
        let user = self.user_id().ok_or(Error::NotLoggedIn)?;
        let path = format!("/_matrix/client/v3/rooms/{}/typing/{}", encode_segment(room_id), encode_segment(user));
        let body = if on {
            json!({"typing": true, "timeout": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)})
        } else {
            json!({"typing": false})
        };
        self.request(Method::Put, &path, &[], Some(&body), None, false).map(drop)
    }

    /// `PUT /rooms/{room}/redact/{event}/{txn}`: removes an event's content.
    pub fn redact(&self, room_id: &str, event_id: &str, txn_id: &str) -> Result<String, Error> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/redact/{}/{}",
            encode_segment(room_id),
            encode_segment(event_id),
            encode_segment(txn_id)
        );
        let v = self.request(Method::Put, &path, &[], Some(&json!({})), None, false)?;
        str_field(&v, "event_id")
    }

    /// Opens the download of `mxc` (`mxc://server/id`), bounded by `timeout` in all: the
    /// authenticated media API with our token, else the older unauthenticated one when the
    /// server does not know the first (module notes). The body is not read here.
    pub fn download(&self, mxc: &str, timeout: Duration) -> Result<Box<dyn std::io::Read + Send>, Error> {
        let (server, id) = parse_mxc(mxc).ok_or_else(|| Error::Config(format!("not an mxc:// URL: {mxc:?}")))?;
        let token = self.session.as_ref().map(|s| format!("Bearer {}", s.access_token)).ok_or(Error::NotLoggedIn)?;
        let (server, id) = (encode_segment(server), encode_segment(id));
        let mut last = None;
        for path in [
            format!("/_matrix/client/v1/media/download/{server}/{id}"),
            format!("/_matrix/media/v3/download/{server}/{id}"),
        ] {
            let url = format!("{}{path}", self.base);
            let resp = self
                .http
                .get(&url)
                .header("Authorization", &token)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call()
                .map_err(|e| transport_error(e, &self.base))?;
            let status = resp.status().as_u16();
            if (200..300).contains(&status) {
                return Ok(Box::new(resp.into_body().into_reader()));
            }
            let e = self.error_answer(resp, false);
            if !unknown_endpoint(&e) {
                return Err(e);
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| Error::Protocol("no media endpoint".into())))
    }

    /// `POST /_matrix/media/v3/upload`: stores `size` bytes of `body` as `content_type` named
    /// `name`, bounded by `timeout`; returns the `mxc://` URL. Not idempotent (module notes).
    pub fn upload(
        &self,
        name: &str,
        content_type: &str,
        size: u64,
        body: &mut dyn std::io::Read,
        timeout: Duration,
    ) -> Result<String, Error> {
        let token = self.session.as_ref().map(|s| format!("Bearer {}", s.access_token)).ok_or(Error::NotLoggedIn)?;
        let url = format!("{}/_matrix/media/v3/upload", self.base);
        let resp = self
            .http
            .post(&url)
            .query("filename", name)
            .header("Authorization", &token)
            .header("Content-Type", content_type)
            .header("Content-Length", size.to_string())
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send(ureq::SendBody::from_reader(body))
            .map_err(|e| transport_error(e, &self.base))?;
        let v = self.answer(resp, "/_matrix/media/v3/upload", false)?;
        let uri = str_field(&v, "content_uri")?;
        parse_mxc(&uri).ok_or_else(|| Error::Protocol(format!("upload returned {uri:?}, not an mxc:// URL")))?;
        Ok(uri)
    }

    /// Sends the media message naming `media` (its `url` from [`Client::upload`]) with
    /// transaction id `txn_id`, idempotent like [`Client::send_text`]; returns the event id.
    pub fn send_media(&self, room_id: &str, txn_id: &str, media: &Media) -> Result<String, Error> {
        let url = media.url.as_deref().ok_or_else(|| Error::Config("media without an mxc:// URL".into()))?;
        let mut info = json!({});
        if let Some(m) = &media.mimetype {
            info["mimetype"] = json!(m);
        }
        if let Some(n) = media.size {
            info["size"] = json!(n);
        }
        let content =
            json!({"msgtype": media.msgtype, "body": media.name, "filename": media.name, "url": url, "info": info});
        self.send_message(room_id, txn_id, &content)
    }

    /// One HTTP exchange. `long_poll` extends the timeout for `/sync`; `login` makes
    /// `M_FORBIDDEN` mean rejected credentials.
    fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        long_poll: Option<Duration>,
        login: bool,
    ) -> Result<Value, Error> {
        let url = format!("{}{path}", self.base);
        let token = match (&self.session, login) {
            (_, true) => None,
            (Some(s), false) => Some(format!("Bearer {}", s.access_token)),
            (None, false) => return Err(Error::NotLoggedIn),
        };
        let timeout = self.request_timeout + long_poll.unwrap_or_default();
        let result = match method {
            Method::Get => {
                let mut rb = self.http.get(&url);
                for (k, v) in query {
                    rb = rb.query(*k, *v);
                }
                if let Some(t) = &token {
                    rb = rb.header("Authorization", t);
                }
                rb.config().timeout_global(Some(timeout)).build().call()
            }
            Method::Post | Method::Put => {
                let mut rb = match method {
                    Method::Put => self.http.put(&url),
                    _ => self.http.post(&url),
                };
                for (k, v) in query {
                    rb = rb.query(*k, *v);
                }
                if let Some(t) = &token {
                    rb = rb.header("Authorization", t);
                }
                rb.config().timeout_global(Some(timeout)).build().send_json(body.unwrap_or(&json!({})))
            }
        };
        let resp = result.map_err(|e| transport_error(e, &self.base))?;
        self.answer(resp, path, login)
    }

    /// A JSON answer's body, or its error.
    fn answer(&self, mut resp: ureq::http::Response<ureq::Body>, path: &str, login: bool) -> Result<Value, Error> {
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(self.error_answer(resp, login));
        }
        let raw = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec()
            .map_err(|e| transport_error(e, &self.base))?;
        serde_json::from_slice(&raw).map_err(|e| Error::Protocol(format!("{path}: {e}: {}", snippet(&raw))))
    }

    /// An error answer as an [`Error`] (its body read with a cap).
    fn error_answer(&self, mut resp: ureq::http::Response<ureq::Body>, login: bool) -> Error {
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
        match resp.body_mut().with_config().limit(MAX_BODY_BYTES).read_to_vec() {
            Ok(raw) => classify(status, retry_after.as_deref(), &raw, login),
            Err(e) => transport_error(e, &self.base),
        }
    }
}

/// A server that does not know the endpoint (an older Synapse asked for authenticated media),
/// as opposed to one that knows it and refuses (`M_NOT_FOUND`: no such media).
fn unknown_endpoint(e: &Error) -> bool {
    matches!(e, Error::Api { status: 404 | 405, errcode, .. } if errcode == "M_UNRECOGNIZED")
}

/// `(server, media id)` of `mxc://server/id`; `None` for anything else (no further `/`, no
/// empty part).
pub fn parse_mxc(url: &str) -> Option<(&str, &str)> {
    let (server, id) = url.strip_prefix("mxc://")?.split_once('/')?;
    (!server.is_empty() && !id.is_empty() && !id.contains('/')).then_some((server, id))
}

/// The inline `/sync` filter: message timelines only, no presence, account data or member lists.
fn sync_filter() -> String {
    json!({
        "presence": {"types": []},
        "account_data": {"types": []},
        "room": {
            "timeline": {"limit": TIMELINE_LIMIT, "types": ["m.room.message"]},
            "state": {"lazy_load_members": true, "types": []},
            "ephemeral": {"types": []},
            "account_data": {"types": []},
        },
    })
    .to_string()
}

/// Maps an error answer to an [`Error`]. Pure, so every branch is unit-tested.
pub fn classify(status: u16, retry_after_header: Option<&str>, body: &[u8], login: bool) -> Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let errcode = v["errcode"].as_str().unwrap_or_default().to_string();
    let message = v["error"].as_str().map_or_else(|| snippet(body), str::to_string);
    if status == 429 || errcode == "M_LIMIT_EXCEEDED" {
        let from_body = v["retry_after_ms"].as_u64().map(Duration::from_millis);
        // `Retry-After` in seconds (the HTTP-date form is not used by homeservers).
        let from_header = retry_after_header.and_then(|h| h.trim().parse::<u64>().ok()).map(Duration::from_secs);
        return Error::RateLimited { retry_after: from_body.or(from_header), message };
    }
    let rejected = matches!(errcode.as_str(), "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN" | "M_USER_DEACTIVATED")
        || (login && (errcode == "M_FORBIDDEN" || status == 401 || status == 403));
    if rejected {
        return Error::Rejected { errcode, message };
    }
    if status >= 500 || status == 408 {
        return Error::Transient(format!("HTTP {status} {errcode}: {message}"));
    }
    Error::Api { status, errcode, message }
}

fn transport_error(e: ureq::Error, base: &str) -> Error {
    use ureq::Error as U;
    match e {
        U::BadUri(m) => Error::Config(format!("bad homeserver URL: {m}")),
        U::RequireHttpsOnly(m) => Error::Config(m),
        U::TlsRequired => Error::Config("https homeserver, but this build has no TLS".into()),
        U::BodyExceedsLimit(n) => Error::Protocol(format!("response body over {n} bytes")),
        // Refused, reset, timed out, DNS, a body cut short by a dying server, and a certificate
        // that does not verify (named with the host and the reason): all may heal, and the
        // adapter retries them with backoff as `degraded`.
        other => Error::Transient(gatewarden_net::describe(&other, base)),
    }
}

/// Reduces a `/sync` body to a [`SyncBatch`]. Total: anything but a missing `next_batch` is
/// tolerated, event by event.
pub fn parse_sync(v: &Value, own_user_id: &str) -> Result<SyncBatch, Error> {
    let next_batch = v["next_batch"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::Protocol("sync response without next_batch".into()))?
        .to_string();
    let mut batch = SyncBatch { next_batch, ..SyncBatch::default() };
    if let Some(join) = v["rooms"]["join"].as_object() {
        for (room_id, room) in join {
            let timeline = &room["timeline"];
            if timeline["limited"].as_bool() == Some(true) {
                batch.gaps.push(room_id.clone());
                if let Some(p) = timeline["prev_batch"].as_str().filter(|p| !p.is_empty()) {
                    batch.prev_batches.push((room_id.clone(), p.to_owned()));
                }
            }
            let Some(events) = timeline["events"].as_array() else { continue };
            batch.messages.extend(events.iter().filter_map(|e| text_message(room_id, e, own_user_id)));
        }
    }
    if let Some(invite) = v["rooms"]["invite"].as_object() {
        for (room_id, room) in invite {
            batch.invites.push(room_id.clone());
            let events = room["invite_state"]["events"].as_array().map(Vec::as_slice).unwrap_or_default();
            let direct = events.iter().any(|e| {
                e["type"] == "m.room.member"
                    && e["state_key"].as_str() == Some(own_user_id)
                    && e["content"]["is_direct"] == Value::Bool(true)
            });
            if direct {
                batch.direct_invites.push(room_id.clone());
            }
        }
    }
    Ok(batch)
}

/// Parses a `/messages` answer (`chunk` newest first with `dir=b`, `end`). Pure.
pub fn parse_history(v: &Value, room_id: &str, own_user_id: &str) -> HistoryPage {
    let chunk = v["chunk"].as_array().map(Vec::as_slice).unwrap_or_default();
    let messages = chunk.iter().filter_map(|e| text_message(room_id, e, own_user_id)).collect();
    // An empty chunk ends the range even if the server still gives an `end`.
    let next = v["end"].as_str().filter(|e| !e.is_empty() && !chunk.is_empty()).map(str::to_owned);
    HistoryPage { messages, next }
}

fn text_message(room_id: &str, e: &Value, own_user_id: &str) -> Option<TextMessage> {
    if e["type"].as_str()? != "m.room.message" {
        return None;
    }
    let content = &e["content"];
    if content["m.relates_to"]["rel_type"].as_str() == Some("m.replace") {
        return None;
    }
    let media = match content["msgtype"].as_str()? {
        "m.text" => None,
        "m.image" | "m.file" | "m.audio" | "m.video" => Some(media(content)?),
        _ => return None,
    };
    let sender = e["sender"].as_str()?;
    if sender == own_user_id {
        return None;
    }
    let raw_body = content["body"].as_str()?;
    // A file's body is its caption only when a `filename` differs from it (spec v1.10).
    let body = match (&media, content["filename"].as_str()) {
        (None, _) => raw_body,
        (Some(_), Some(f)) if f != raw_body => raw_body,
        (Some(_), _) => "",
    };
    let listed = content["m.mentions"]["user_ids"].as_array().is_some_and(|ids| ids.iter().any(|i| i == own_user_id));
    let named = !own_user_id.is_empty()
        && (body.contains(own_user_id) || content["formatted_body"].as_str().is_some_and(|f| f.contains(own_user_id)));
    Some(TextMessage {
        room_id: room_id.to_string(),
        event_id: e["event_id"].as_str()?.to_string(),
        sender: sender.to_string(),
        body: body.to_string(),
        media,
        origin_server_ts: e["origin_server_ts"].as_u64().unwrap_or(0),
        mentions_me: listed || named,
    })
}

/// The [`Media`] of a media message's `content`; `None` without a name or any file.
fn media(content: &Value) -> Option<Media> {
    let name = content["filename"].as_str().or_else(|| content["body"].as_str())?;
    let url = content["url"].as_str().map(str::to_owned);
    if url.is_none() && !content["file"].is_object() {
        return None;
    }
    let info = &content["info"];
    Some(Media {
        msgtype: content["msgtype"].as_str()?.to_owned(),
        name: name.to_owned(),
        mimetype: info["mimetype"].as_str().filter(|m| !m.is_empty()).map(str::to_owned),
        size: info["size"].as_u64(),
        url,
    })
}

fn str_field(v: &Value, key: &str) -> Result<String, Error> {
    v[key]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::Protocol(format!("no string {key:?} in {}", snippet(v.to_string().as_bytes()))))
}

/// Percent-encodes one URL path segment (room ids carry `!` and `:`, aliases `#`).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn snippet(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    match s.char_indices().nth(ERROR_BODY_BYTES) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classifies_error_answers() {
        let body = br#"{"errcode":"M_UNKNOWN_TOKEN","error":"Invalid access token passed."}"#;
        let e = classify(401, None, body, false);
        assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");

        let body = br#"{"errcode":"M_LIMIT_EXCEEDED","error":"Too Many Requests","retry_after_ms":1500}"#;
        let e = classify(429, Some("9"), body, false);
        assert_eq!((e.kind(), e.retry_after()), (ErrorKind::RateLimited, Some(Duration::from_millis(1500))));
        // Header only (newer servers may drop the body field).
        let e = classify(429, Some("2"), br#"{"errcode":"M_LIMIT_EXCEEDED"}"#, false);
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));

        let forbidden = br#"{"errcode":"M_FORBIDDEN","error":"Invalid username or password"}"#;
        assert_eq!(classify(403, None, forbidden, true).kind(), ErrorKind::Rejected);
        // Outside login, M_FORBIDDEN is about the request (e.g. joining without an invite).
        assert!(matches!(classify(403, None, forbidden, false), Error::Api { status: 403, .. }));

        assert_eq!(classify(502, None, b"<html>Bad Gateway</html>", false).kind(), ErrorKind::Transient);
        let e = classify(404, None, b"not json at all", false);
        assert!(
            matches!(&e, Error::Api { status: 404, errcode, message } if errcode.is_empty() && message == "not json at all")
        );
    }

    #[test]
    fn sync_keeps_text_from_others_and_reports_invites_and_gaps() {
        let v = json!({
            "next_batch": "s72_1",
            "rooms": {
                "join": {
                    "!a:hs": {"timeline": {"limited": true, "events": [
                        {"type": "m.room.message", "event_id": "$1", "sender": "@alice:hs",
                         "origin_server_ts": 5, "content": {"msgtype": "m.text", "body": "hi"}},
                        {"type": "m.room.message", "event_id": "$2", "sender": "@bot:hs",
                         "content": {"msgtype": "m.text", "body": "own echo"}},
                        {"type": "m.room.message", "event_id": "$3", "sender": "@alice:hs",
                         "content": {"msgtype": "m.image", "body": "cat.png"}},
                        {"type": "m.room.message", "event_id": "$4", "sender": "@alice:hs",
                         "content": {"msgtype": "m.text", "body": "* hi!",
                                     "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}}},
                        {"type": "m.room.encrypted", "event_id": "$5", "sender": "@alice:hs", "content": {}},
                        {"type": "m.room.message", "event_id": "$6", "sender": "@alice:hs", "content": {}},
                        "not an object",
                        {"type": "m.room.message", "event_id": 7, "sender": "@alice:hs",
                         "content": {"msgtype": "m.text", "body": "bad id"}},
                    ]}},
                    "!b:hs": {"timeline": "garbage"},
                },
                "invite": {
                    "!c:hs": {"invite_state": {"events": []}},
                    "!d:hs": {"invite_state": {"events": [{"type": "m.room.member", "state_key": "@bot:hs",
                                                          "content": {"membership": "invite", "is_direct": true}}]}},
                },
            },
        });
        let b = parse_sync(&v, "@bot:hs").unwrap();
        assert_eq!(b.next_batch, "s72_1");
        assert_eq!(b.messages.len(), 1, "{b:?}");
        assert_eq!((b.messages[0].event_id.as_str(), b.messages[0].body.as_str()), ("$1", "hi"));
        assert_eq!(b.messages[0].origin_server_ts, 5);
        assert_eq!(b.invites, vec!["!c:hs".to_string(), "!d:hs".to_string()]);
        assert_eq!(b.direct_invites, vec!["!d:hs".to_string()], "only an invite that says is_direct");
        assert!(!b.messages[0].mentions_me);
        assert_eq!(b.gaps, vec!["!a:hs".to_string()]);

        assert!(matches!(parse_sync(&json!({"rooms": {}}), "@bot:hs"), Err(Error::Protocol(_))));
    }

    /// A mention is `m.mentions` naming us, or our user id in the body or the formatted body.
    #[test]
    fn mentions_of_the_bot() {
        let msg = |content: Value| {
            let e = json!({"type": "m.room.message", "event_id": "$1", "sender": "@alice:hs", "content": content});
            text_message("!r:hs", &e, "@bot:hs").unwrap().mentions_me
        };
        assert!(!msg(json!({"msgtype": "m.text", "body": "hello bot"})));
        assert!(msg(json!({"msgtype": "m.text", "body": "bot: hi", "m.mentions": {"user_ids": ["@bot:hs"]}})));
        assert!(msg(json!({"msgtype": "m.text", "body": "> <@bot:hs> earlier\n\nyes"})));
        assert!(msg(json!({"msgtype": "m.text", "body": "Bot: hi",
                           "formatted_body": "<a href=\"https://matrix.to/#/@bot:hs\">Bot</a>: hi"})));
        assert!(!msg(json!({"msgtype": "m.text", "body": "hi", "m.mentions": {"user_ids": ["@carol:hs"]}})));
    }

    /// `m.image`/`m.file`/`m.audio` carry their media; the body is a caption only when a
    /// `filename` differs from it; encrypted media has no URL; a file without one is skipped.
    #[test]
    fn media_messages_carry_their_file() {
        let msg = |content: Value| {
            let e = json!({"type": "m.room.message", "event_id": "$1", "sender": "@alice:hs", "content": content});
            text_message("!r:hs", &e, "@bot:hs")
        };
        let m = msg(json!({"msgtype": "m.image", "body": "cat.png", "url": "mxc://hs/abc",
                           "info": {"mimetype": "image/png", "size": 12}}))
        .unwrap();
        assert_eq!(m.body, "");
        let media = m.media.unwrap();
        assert_eq!(
            (media.msgtype.as_str(), media.name.as_str(), media.mimetype.as_deref(), media.size, media.url.as_deref()),
            ("m.image", "cat.png", Some("image/png"), Some(12), Some("mxc://hs/abc"))
        );
        let m = msg(json!({"msgtype": "m.file", "body": "summarise this", "filename": "notes.txt",
                           "url": "mxc://hs/n"}))
        .unwrap();
        assert_eq!((m.body.as_str(), m.media.as_ref().unwrap().name.as_str()), ("summarise this", "notes.txt"));
        assert_eq!(m.media.unwrap().mimetype, None);
        let m = msg(json!({"msgtype": "m.audio", "body": "a.ogg", "filename": "a.ogg", "url": "mxc://hs/a"})).unwrap();
        assert_eq!((m.body.as_str(), m.media.unwrap().msgtype.as_str()), ("", "m.audio"));
        let enc = msg(json!({"msgtype": "m.file", "body": "secret.pdf", "file": {"url": "mxc://hs/e"}})).unwrap();
        assert_eq!(enc.media.unwrap().url, None, "encrypted media cannot be read");
        assert!(msg(json!({"msgtype": "m.image", "body": "no url"})).is_none());
        assert!(msg(json!({"msgtype": "m.location", "body": "here", "geo_uri": "geo:1,2"})).is_none());
        assert!(msg(json!({"msgtype": "m.text", "body": "hi"})).unwrap().media.is_none());
    }

    /// Only an unknown endpoint falls back to the unauthenticated media API.
    #[test]
    fn media_download_falls_back_only_for_an_unknown_endpoint() {
        let unknown = br#"{"errcode":"M_UNRECOGNIZED","error":"Unrecognized request"}"#;
        assert!(unknown_endpoint(&classify(404, None, unknown, false)));
        assert!(unknown_endpoint(&classify(405, None, unknown, false)));
        let missing = br#"{"errcode":"M_NOT_FOUND","error":"Not found"}"#;
        assert!(!unknown_endpoint(&classify(404, None, missing, false)));
        let forbidden = br#"{"errcode":"M_FORBIDDEN","error":"no"}"#;
        assert!(!unknown_endpoint(&classify(403, None, forbidden, false)));
        assert!(!unknown_endpoint(&classify(502, None, b"bad gateway", false)));
    }

    #[test]
    fn mxc_urls_parse_strictly() {
        assert_eq!(parse_mxc("mxc://example.org/AbC123"), Some(("example.org", "AbC123")));
        for bad in ["mxc://example.org/", "mxc:///id", "mxc://hs/a/b", "https://hs/a", "mxc://hs"] {
            assert_eq!(parse_mxc(bad), None, "{bad}");
        }
    }

    #[test]
    fn encodes_room_ids_and_aliases_as_one_segment() {
        assert_eq!(encode_segment("!abc:example.org"), "%21abc%3Aexample.org");
        assert_eq!(encode_segment("#room/x:hs"), "%23room%2Fx%3Ahs");
        assert_eq!(encode_segment("txn-1_a.b~"), "txn-1_a.b~");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }

    #[test]
    fn rejects_non_http_homeservers_and_needs_a_login() {
        assert!(matches!(Client::new("matrix.org", Duration::from_secs(1)), Err(Error::Config(_))));
        let c = Client::new("http://127.0.0.1:1/", Duration::from_secs(1)).unwrap();
        assert_eq!(c.homeserver(), "http://127.0.0.1:1");
        assert!(matches!(c.sync(None, Duration::ZERO), Err(Error::NotLoggedIn)));
        assert!(matches!(c.send_text("!r:hs", "", "x"), Err(Error::Config(_))));
    }

    #[test]
    fn connection_refused_is_transient() {
        // Bind then drop: the port is (almost certainly) closed for the connect below.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = Client::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5)).unwrap();
        let e = c.login_password("u", "p", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    }

    proptest! {
        #[test]
        fn classify_and_parse_are_total(body in proptest::collection::vec(any::<u8>(), 0..256),
                                        status in 100u16..600, login: bool, header in proptest::option::of(".{0,8}")) {
            let _ = classify(status, header.as_deref(), &body, login).kind();
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                let _ = parse_sync(&v, "@me:hs");
            }
        }

        #[test]
        fn sync_parser_survives_arbitrary_event_shapes(ty in "[a-z.]{0,16}", msgtype in proptest::option::of("m\\.[a-z]{0,6}"),
                                                       body in proptest::option::of(".{0,20}"), sender in ".{0,12}") {
            let v = json!({"next_batch": "t", "rooms": {"join": {"!r:hs": {"timeline": {"events": [
                {"type": ty, "sender": sender, "event_id": "$e", "content": {"msgtype": msgtype, "body": body}}
            ]}}}}});
            let b = parse_sync(&v, "@me:hs").unwrap();
            prop_assert!(b.messages.len() <= 1);
        }
    }
}
