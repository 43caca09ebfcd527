//! Slack adapter: Socket Mode events over a WebSocket, replies with the Web API's
//! `chat.postMessage`.
//!
//! - **Credentials.** `token_env` holds the app-level token (`xapp-…`, scope
//!   `connections:write`): it opens the Socket Mode connections and is the credential lock's key,
//!   since Slack spreads one app's events over every connection opened with it. `bot_token_env`
//!   holds the bot token (`xoxb-…`) that `auth.test` checks at connect and that posts the
//!   replies. `invalid_auth`, `not_authed`, `account_inactive`, `token_revoked` and friends park
//!   the adapter naming the error; so does a `disconnect` with reason `link_disabled` (Socket
//!   Mode turned off for the app).
//! - **Nothing lost.** Every `events_api` envelope is acknowledged only in
//!   [`Receiver::confirm`](skeleton::Receiver::confirm), after the skeleton journaled the batch
//!   it came in (a receive returns at most [`GATHER`] after its first envelope, far inside
//!   Slack's 3 s). An envelope not acknowledged (a failed commit, a crash, one that came after
//!   the drain sealed the journal, a dropped connection) is redelivered by Slack with `retry_attempt` and `retry_reason`, and the journal
//!   drops the copy: the journal key is the message's `client_msg_id`, else the payload's
//!   `event_id`, both the same in every redelivery (and a `message` and an `app_mention` of one
//!   message share the `client_msg_id`). Envelopes the adapter ignores (edits, bots, joins,
//!   other event types) are acknowledged too, so Slack does not redeliver them. What a restart
//!   can and cannot lose is in README.md ("Slack").
//! - **Through the drain.** The connections stay open until the replies are out
//!   (`Limits::listens_through_drain`): what Slack sends them meanwhile is journaled and run by
//!   the successor, instead of waiting unacknowledged for a redelivery 3 s later.
//! - **Refresh without a gap.** On `disconnect` (`refresh_requested`, `warning`) the adapter
//!   opens a new connection (`apps.connections.open`, then the new URL's `hello`) before it
//!   closes the old one, reading both meanwhile; the old one is closed after the acks of what it
//!   carried. Slack may send on any open connection: every receive reads them all.
//! - **Threads.** A message in a thread is the chat `<channel>/<thread_ts>` (its own
//!   conversation), and the reply goes to the same thread (`thread_ts`); a top-level message is
//!   the chat `<channel>`. `allowed_chats` and `admins` are channel and user ids. Every message
//!   goes to the host: an `im`'s as a direct chat's, a channel's marked `listed` when
//!   `allowed_chats` names it and addressed when it mentions the bot (`<@U…>`, `app_mention`) or
//!   replies in a thread under the bot's message; the access policy decides.
//! - **Replies.** `chat.postMessage`, at most [`MAX_TEXT_CHARS`] characters a piece, `&`, `<`
//!   and `>` escaped as Slack asks; a 429 waits its `Retry-After` (the method's per-channel
//!   limit). No idempotency key: a crash between a post and the outbox commit posts that piece
//!   again after the restart.
//! - **Files** (issue 29 §1/§2). In: a message's `files[]` (`name`, `mimetype`, `size`,
//!   `url_private_download`), downloaded with `Authorization: Bearer <bot token>` and only
//!   from Slack's file host (`files.slack.com`, or a configured `api_base`'s origin:
//!   crates/platforms/src/filexfer.rs), redirects not followed. Out: the external upload,
//!   `files.getUploadURLExternal` → the bytes POSTed to its `upload_url` →
//!   `files.completeUploadExternal` into the chat (and its thread). No idempotency key: a
//!   resend after a crash shares the file once more at worst, as for text.
//! - **The agent at work** (skeleton/progress.rs). No typing indicator: Slack gives bots none in
//!   Socket Mode or the Web API, so `typing` stays a no-op. A preview is a message of its own,
//!   posted with `chat.postMessage` into the chat's thread (`thread_ts`, like the reply), edited
//!   with `chat.update` (channel and `ts`) as the reply grows, and deleted with `chat.delete`
//!   (`message_not_found` counts as deleted) once the reply is sent as its own message or the
//!   run is abandoned. `chat.update` and `chat.delete` are Tier 3 (about 50 a minute per app
//!   and workspace): each is counted on our side, and a 429's `Retry-After` holds that method
//!   (and the chat's previews), never the outbox.
//! - **Bots and edits are not answered**: messages with a `bot_id`, from our own bot user, or
//!   with a subtype other than `thread_broadcast` and `file_share` (`message_changed`,
//!   `bot_message`, `channel_join`, …).
//!
//! The WebSocket is crates/chatproto/src/ws.rs's client: TLS only from crates/net's rustls
//! configuration (`ca_file` pins a private CA); `ws://` is accepted only from an `http://`
//! `api_base` (a loopback fake). The loops, states, backoff and drain are the skeleton's
//! (crates/platforms/src/skeleton).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_chatproto::ws::{self, Incoming};
use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Slack as Settings;
use gatewarden_net::{ClientTls, Outbound};
use serde_json::{Value, json};

use crate::attachments::Attachment;
use crate::filexfer::FileHosts;
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// The public Web API.
pub const DEFAULT_API_BASE: &str = "https://slack.com/api/";
/// Characters per reply piece: Slack recommends at most 4,000 (it truncates past 40,000).
const MAX_TEXT_CHARS: usize = 4000;
const MAX_BODY_BYTES: u64 = 4 << 20;
/// Largest WebSocket message or frame accepted from the server.
const MAX_WS_MESSAGE: usize = 4 << 20;
/// Bound on every Web API call and on opening a connection (TCP, TLS, WebSocket, `hello`).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// One read of one connection waits at most this long.
const READ_SLICE: Duration = Duration::from_millis(20);
/// A read once a receive has envelopes in hand.
const QUICK_READ: Duration = Duration::from_millis(1);
/// A receive without a budget waits at most this long for an envelope.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// After its first envelope, a receive reads on only while envelopes keep coming, and at most
/// this long, before it returns the batch (whose acks must reach Slack within 3 s).
pub const GATHER: Duration = Duration::from_millis(100);
/// We ping each connection this often; one silent for [`DEAD_AFTER`] is dropped.
const PING_EVERY: Duration = Duration::from_secs(10);
const DEAD_AFTER: Duration = Duration::from_secs(35);
/// Connections open at once, at most (Slack allows 10 per app): the steady one and those a
/// `disconnect` retired but whose envelopes are not yet acknowledged.
const MAX_CONNS: usize = 4;
/// A failed refresh (`apps.connections.open` is a Tier 1 method) is tried again this late.
const REFRESH_RETRY: Duration = Duration::from_secs(5);
/// Where Slack serves files (`url_private_download`) and takes uploads (`upload_url`).
const FILE_HOSTS: &[&str] = &["https://files.slack.com"];
/// One upload's bound (a 50 MB message at a slow 1 MB/s, and then some).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// `ok: false` errors that no retry can fix: the token or the app is refused.
const AUTH_ERRORS: &[&str] = &[
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
    "missing_scope",
    "no_permission",
    "ekm_access_denied",
];
/// `ok: false` errors worth retrying.
const SERVER_ERRORS: &[&str] = &["internal_error", "fatal_error", "service_unavailable", "request_timeout"];

/// Why a Web API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ApiError {
    /// No answer (connect, timeout, unreadable body).
    Network(String),
    /// HTTP 429 or `ratelimited`, with `Retry-After`.
    RateLimited(Option<Duration>),
    /// [`AUTH_ERRORS`]: the token is refused.
    Auth(String),
    /// Any other `ok: false`: this request will never succeed (`channel_not_found`, …).
    Refused(String),
    /// 5xx and [`SERVER_ERRORS`].
    Server(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Network(m) => write!(f, "cannot reach the Slack Web API: {m}"),
            ApiError::RateLimited(d) => write!(f, "rate limited (Retry-After {:?})", d.map(|d| d.as_secs())),
            ApiError::Auth(m) | ApiError::Refused(m) | ApiError::Server(m) => f.write_str(m),
        }
    }
}

/// Classifies one Web API answer (`Retry-After` in seconds, when present).
fn classify(status: u16, body: &Value, retry_after: Option<Duration>, method: &str) -> Result<Value, ApiError> {
    if status == 429 {
        return Err(ApiError::RateLimited(retry_after));
    }
    if status == 200 && body["ok"] == Value::Bool(true) {
        return Ok(body.clone());
    }
    let error = body["error"].as_str().unwrap_or("");
    let what = if error.is_empty() { format!("{method}: HTTP {status}") } else { format!("{method}: {error}") };
    Err(if error == "ratelimited" {
        ApiError::RateLimited(retry_after)
    } else if AUTH_ERRORS.contains(&error) {
        ApiError::Auth(what)
    } else if status >= 500 || SERVER_ERRORS.contains(&error) || (error.is_empty() && status != 200) {
        ApiError::Server(what)
    } else {
        ApiError::Refused(what)
    })
}

/// The Web API at `base` (`https://slack.com/api/`).
#[derive(Clone)]
struct WebApi {
    http: ureq::Agent,
    base: String,
}

impl WebApi {
    fn new(base: &str, out: &Outbound) -> WebApi {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        WebApi { http, base: format!("{}/", base.trim_end_matches('/')) }
    }

    /// POSTs `body` (JSON; none: an empty form) to `method` with `token`.
    fn call(&self, method: &str, token: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}{method}", self.base);
        let req = self
            .http
            .post(&url)
            .header("Authorization", &format!("Bearer {token}"))
            .config()
            .timeout_global(Some(CALL_TIMEOUT))
            .build();
        let sent = match body {
            Some(b) => req.header("Content-Type", "application/json; charset=utf-8").send(b.to_string()),
            None => req.header("Content-Type", "application/x-www-form-urlencoded").send(""),
        };
        let response = sent.map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))?;
        let status = response.status().as_u16();
        let retry_after = crate::header_secs(&response, "retry-after");
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(ApiError::Network)?;
        classify(status, &v, retry_after, method)
    }

    /// POSTs `args` form-encoded to `method` with `token` (the upload methods take forms:
    /// https://api.slack.com/methods/files.getUploadURLExternal).
    fn call_form(&self, method: &str, token: &str, args: &[(&str, &str)]) -> Result<Value, ApiError> {
        let url = format!("{}{method}", self.base);
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(args).finish();
        let response = self
            .http
            .post(&url)
            .header("Authorization", &format!("Bearer {token}"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .config()
            .timeout_global(Some(CALL_TIMEOUT))
            .build()
            .send(body)
            .map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))?;
        let status = response.status().as_u16();
        let retry_after = crate::header_secs(&response, "retry-after");
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(ApiError::Network)?;
        classify(status, &v, retry_after, method)
    }
}

impl ApiError {
    fn failure(self) -> Failure {
        match self {
            ApiError::RateLimited(d) => Failure::RateLimited(d),
            ApiError::Auth(m) => Failure::Rejected(m),
            e @ (ApiError::Network(_) | ApiError::Server(_) | ApiError::Refused(_)) => Failure::Down(e.to_string()),
        }
    }
}

/// The Slack adapter.
pub type Slack = Skeleton<Proto>;

/// Socket Mode and the Web API.
pub struct Proto {
    app_token: String,
    bot_token: String,
    base: String,
    out: Outbound,
    tls: ClientTls,
    allowed: Vec<String>,
}

impl Skeleton<Proto> {
    /// `app_token` is `token_env`'s (`xapp-…`), `bot_token` `bot_token_env`'s (`xoxb-…`).
    pub fn new(cfg: &PlatformConfig, app_token: String, bot_token: String) -> Result<Slack, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let start_error = |message: String| AdapterError::Start { name: cfg.adapter_name(), message };
        let out = Outbound::new(cfg.ca_file.as_deref(), None).map_err(|e| start_error(e.to_string()))?;
        let tls = ClientTls::new(cfg.ca_file.as_deref()).map_err(|e| start_error(e.to_string()))?;
        let proto = Proto {
            app_token,
            bot_token,
            base: s.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned()),
            out,
            tls,
            allowed: cfg.allowed_chats.clone(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Slack, AdapterError> {
        // The app-level token is the credential; the bot token posts the replies.
        let bot =
            creds.required(gatewarden_config::secrets::PlatformSecret::BotToken, "bot_token_env or bot_token_file")?;
        Slack::new(cfg, creds.token()?, bot)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 16,
        // chat.postMessage's own 429s pace the replies.
        pace: None,
        min_receive: READ_SLICE,
        redelivers: true,
        // What Slack sends to the old connections during the drain is journaled (and run by
        // the successor) rather than left to a redelivery 3 s later; after the journal is
        // sealed a delivery is refused, so it stays unacknowledged and comes again.
        listens_through_drain: true,
        connected_after_receive: false,
        close_grace: Duration::from_millis(300),
    };
    type Receiver = SocketMode;
    type Sender = Poster;

    fn credential(&self) -> &str {
        &self.app_token
    }

    fn watchdog_after(&self) -> Duration {
        DEAD_AFTER + Duration::from_secs(30)
    }

    fn open(&self, _host: &Arc<dyn Host>) -> Result<(SocketMode, Poster), String> {
        let api = WebApi::new(&self.base, &self.out);
        let files = FileHosts::new(&self.base, DEFAULT_API_BASE, FILE_HOSTS);
        let rx = SocketMode {
            api: api.clone(),
            files: files.clone(),
            app_token: self.app_token.clone(),
            bot_token: self.bot_token.clone(),
            tls: self.tls.clone(),
            plain_ok: self.base.starts_with("http://"),
            allowed: self.allowed.clone(),
            me: None,
            conns: Vec::new(),
            next_id: 0,
            acks: Vec::new(),
            fatal: None,
            refresh: None,
        };
        let tx = Poster { api, files, bot_token: self.bot_token.clone(), update: Tier::new(), delete: Tier::new() };
        Ok((rx, tx))
    }
}

/// The `(channel, thread_ts)` of a chat id.
fn split_chat(chat: &str) -> (&str, Option<&str>) {
    match chat.split_once('/') {
        Some((channel, ts)) if !ts.is_empty() => (channel, Some(ts)),
        _ => (chat.trim_end_matches('/'), None),
    }
}

/// Slack's three control characters in message text.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A Slack `ts` (`"1700000000.000100"`) as a time.
fn ts_time(ts: &str) -> Option<SystemTime> {
    let (secs, micros) = ts.split_once('.').unwrap_or((ts, "0"));
    let secs = secs.parse::<u64>().ok()?;
    let micros = format!("{micros:0<6}").get(..6)?.parse::<u64>().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
}

/// Subtypes that are a person's new text.
const ANSWERED_SUBTYPES: &[&str] = &["thread_broadcast", "file_share"];

/// The inbound message of one `events_api` payload (`None`: not one the agent answers).
/// `me` is our bot's user id, `allowed` is `allowed_chats`. A message in an `im` is a direct
/// chat's (`channel_type`, else a `D…` channel id); anywhere else it is addressed when it is an
/// `app_mention`, its text mentions us (`<@U…>`) or it is a thread reply under our message
/// (`parent_user_id`; api.slack.com/events/message).
fn parse_event(payload: &Value, me: Option<&str>, allowed: &[String]) -> Option<Inbound> {
    let e = &payload["event"];
    if !matches!(e["type"].as_str(), Some("message" | "app_mention")) {
        return None;
    }
    if e["subtype"].as_str().is_some_and(|s| !ANSWERED_SUBTYPES.contains(&s)) || !e["bot_id"].is_null() {
        return None;
    }
    let user = e["user"].as_str().filter(|u| !u.is_empty() && Some(*u) != me)?;
    let attachments = files(e);
    // A `file_share` without a comment has empty `text`.
    let text = match e["text"].as_str() {
        Some(t) if !t.trim().is_empty() => t,
        _ if !attachments.is_empty() => "",
        _ => return None,
    };
    let channel = e["channel"].as_str().filter(|c| !c.is_empty() && !c.contains('/'))?;
    // One key per message: a redelivery keeps both ids, and a message that is also an
    // app_mention shares its client_msg_id.
    let key = match (e["client_msg_id"].as_str(), payload["event_id"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("msg:{m}"),
        (_, Some(ev)) if !ev.is_empty() => format!("ev:{ev}"),
        _ => format!("ts:{channel}/{}", e["ts"].as_str()?),
    };
    let chat = match e["thread_ts"].as_str().filter(|t| !t.is_empty()) {
        Some(thread) => format!("{channel}/{thread}"),
        None => channel.to_owned(),
    };
    let sent_at = e["ts"].as_str().and_then(ts_time);
    let direct = match e["channel_type"].as_str() {
        Some(t) => t == "im",
        None => channel.starts_with('D'),
    };
    let addressed = e["type"] == "app_mention"
        || me.is_some_and(|me| {
            text.contains(&format!("<@{me}>"))
                || text.contains(&format!("<@{me}|"))
                || e["parent_user_id"].as_str() == Some(me)
        });
    Some(Inbound {
        event_id: key,
        chat_id: chat,
        user_id: user.to_owned(),
        text: text.to_owned(),
        sent_at,
        chat: if direct { ChatKind::Direct } else { ChatKind::Group },
        listed: allowed.iter().any(|a| a == channel),
        addressed,
        attachments,
    })
}

/// The files a message carries: its `files[]` (https://api.slack.com/types/file: `name`,
/// `mimetype`, `size`, `url_private_download`, else `url_private`), each fetched by that URL
/// with the bot token. A file Slack hides (`mode` `tombstone` or `hidden_by_limit`) has no
/// URL and is skipped.
fn files(e: &Value) -> Vec<Attachment> {
    let Some(list) = e["files"].as_array() else { return Vec::new() };
    list.iter()
        .filter_map(|f| {
            let url =
                f["url_private_download"].as_str().or_else(|| f["url_private"].as_str()).filter(|u| !u.is_empty())?;
            Some(Attachment {
                name: f["name"].as_str().or_else(|| f["title"].as_str()).unwrap_or("file").to_owned(),
                declared: f["mimetype"].as_str().unwrap_or_default().to_owned(),
                size: f["size"].as_u64(),
                fetch: url.to_owned(),
                outcome: None,
            })
        })
        .collect()
}

/// A `ws://` or `wss://` URL's parts (crates/chatproto/src/ws.rs).
fn parse_ws_url(url: &str) -> Option<ws::WsUrl> {
    ws::parse_url(url)
}

/// One Socket Mode connection.
struct Conn {
    id: u64,
    ws: ws::Client,
    /// A `disconnect` asked us to move: closed once a newer connection said `hello`.
    retiring: bool,
    last_frame: Instant,
    last_ping: Instant,
    /// Messages read while waiting for `hello`.
    early: Vec<Value>,
}

impl Conn {
    /// Reads one message, waiting at most the stream's read timeout: `Ok(None)` on a timeout.
    fn read(&mut self) -> Result<Option<Value>, String> {
        match self.ws.read() {
            Incoming::Text(t) => {
                self.last_frame = Instant::now();
                Ok(Some(serde_json::from_str(&t).unwrap_or(Value::Null)))
            }
            Incoming::Close(frame) => Err(format!(
                "Slack closed the connection{}",
                frame.map(|(code, reason)| format!(" ({code} {reason})")).unwrap_or_default()
            )),
            Incoming::Other => {
                self.last_frame = Instant::now();
                Ok(None)
            }
            Incoming::Idle => Ok(None),
            Incoming::Closed(e) | Incoming::Failed(e) => Err(format!("the Socket Mode connection failed: {e}")),
        }
    }

    fn send(&mut self, text: String) -> Result<(), String> {
        self.ws.send_text(text).map_err(|e| format!("cannot write to the Socket Mode connection: {e}"))
    }

    /// A close frame, written without waiting for the answer.
    fn close(mut self) {
        self.ws.close(None);
    }
}

/// The receive side: `auth.test`, `apps.connections.open`, then the connections' envelopes.
pub struct SocketMode {
    api: WebApi,
    /// Where `url_private_download`s may point (the bot token goes with them).
    files: FileHosts,
    app_token: String,
    bot_token: String,
    tls: ClientTls,
    plain_ok: bool,
    allowed: Vec<String>,
    /// Our bot's user id (from `auth.test`): its own messages are not answered.
    me: Option<String>,
    conns: Vec<Conn>,
    next_id: u64,
    /// The envelopes of the last batch, by connection: acknowledged in `confirm`.
    acks: Vec<(u64, String)>,
    /// A `link_disabled`: parks at the next receive, after the batch in hand is journaled.
    fatal: Option<String>,
    /// A `disconnect` asked for a new connection: when to try (again).
    refresh: Option<Instant>,
}

impl SocketMode {
    /// `apps.connections.open`, the WebSocket, and its `hello`.
    fn open_conn(&mut self) -> Result<Conn, Failure> {
        let v = self.api.call("apps.connections.open", &self.app_token, None).map_err(ApiError::failure)?;
        let url = v["url"].as_str().ok_or_else(|| Failure::Down("apps.connections.open returned no url".into()))?;
        let parts = parse_ws_url(url)
            .ok_or_else(|| Failure::Down("apps.connections.open returned a URL that is not ws(s)://".into()))?;
        if !parts.tls && !self.plain_ok {
            return Err(Failure::Down("apps.connections.open returned a ws:// URL for an https API; refused".into()));
        }
        let opts = ws::Options {
            request: url,
            timeout: CALL_TIMEOUT,
            write_timeout: CALL_TIMEOUT,
            max_message: MAX_WS_MESSAGE,
        };
        let ws = ws::Client::open(&parts, &self.tls, &opts).map_err(|e| {
            let at = format!("{}:{}", parts.host, parts.port);
            Failure::Down(match e.stage {
                ws::Stage::Resolve => format!("cannot resolve {at}: {e}"),
                ws::Stage::Connect => format!("cannot connect to {at}: {e}"),
                ws::Stage::Socket => format!("cannot use {at}: {e}"),
                ws::Stage::Tls if e.detail.ends_with("is not a host name") => e.detail,
                ws::Stage::Tls => format!("TLS for {at}: {e}"),
                ws::Stage::Handshake if e.detail.starts_with("timed out") => {
                    format!("the WebSocket handshake timed out at {at}: no answer")
                }
                ws::Stage::Handshake => {
                    format!("the WebSocket handshake failed at {at}: {}", e.detail.trim_start_matches("TLS failed: "))
                }
            })
        })?;
        self.next_id += 1;
        let now = Instant::now();
        let mut conn =
            Conn { id: self.next_id, ws, retiring: false, last_frame: now, last_ping: now, early: Vec::new() };
        let deadline = now + CALL_TIMEOUT;
        loop {
            match conn.read().map_err(Failure::Down)? {
                Some(v) if v["type"] == "hello" => break,
                Some(_) if conn.early.len() >= MAX_CONNS * 256 => {
                    return Err(Failure::Down("the Socket Mode connection sent no hello".into()));
                }
                Some(v) => conn.early.push(v),
                None if Instant::now() >= deadline => {
                    return Err(Failure::Down("the Socket Mode connection sent no hello".into()));
                }
                None => {}
            }
        }
        conn.ws.set_read_timeout(READ_SLICE);
        Ok(conn)
    }

    fn drop_all(&mut self) {
        for c in self.conns.drain(..) {
            c.close();
        }
    }

    /// One message from connection `cid`: its envelope to acknowledge, its inbound message.
    fn handle(&mut self, cid: u64, v: &Value, out: &mut Vec<Inbound>) {
        match v["type"].as_str() {
            Some("disconnect") => match v["reason"].as_str() {
                Some("link_disabled") => {
                    self.fatal = Some("Socket Mode is turned off for this app (disconnect: link_disabled)".into());
                }
                // refresh_requested, warning, and any reason to come: move to a new connection.
                _ => {
                    if let Some(c) = self.conns.iter_mut().find(|c| c.id == cid) {
                        c.retiring = true;
                    }
                    self.refresh.get_or_insert_with(Instant::now);
                }
            },
            Some("hello") => {}
            _ => {
                // events_api, and interactive or slash_commands envelopes we do not serve:
                // every envelope is acknowledged, after the batch is journaled.
                if let Some(env) = v["envelope_id"].as_str() {
                    self.acks.push((cid, env.to_owned()));
                }
                if v["type"] == "events_api"
                    && let Some(msg) = parse_event(&v["payload"], self.me.as_deref(), &self.allowed)
                {
                    out.push(msg);
                }
            }
        }
    }

    /// Opens the connection a `disconnect` asked for; the old one stays until it is acked.
    fn refresh_now(&mut self) {
        let Some(at) = self.refresh else { return };
        if Instant::now() < at || self.conns.len() >= MAX_CONNS {
            return;
        }
        match self.open_conn() {
            Ok(c) => {
                self.conns.push(c);
                self.refresh = None;
            }
            // The old connection serves meanwhile; if it goes, the loss is reported then.
            Err(_) => self.refresh = Some(Instant::now() + REFRESH_RETRY),
        }
    }
}

impl skeleton::Receiver for SocketMode {
    /// `auth.test` with the bot token (our user id, and "rejected" known at once), then one
    /// connection.
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        self.drop_all();
        self.refresh = None;
        let me = self
            .api
            .call("auth.test", &self.bot_token, None)
            .map_err(|e| named(ApiError::failure(e), "bot token (bot_token_env)"))?;
        self.me = me["user_id"].as_str().map(str::to_owned);
        let conn = self.open_conn().map_err(|f| named(f, "app-level token (token_env)"))?;
        self.conns.push(conn);
        Ok(())
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        self.acks.clear();
        if let Some(why) = self.fatal.take() {
            self.drop_all();
            return Err(Failure::Rejected(why));
        }
        self.refresh_now();
        let mut messages = Vec::new();
        // Messages that came before a hello.
        for i in 0..self.conns.len() {
            let early = std::mem::take(&mut self.conns[i].early);
            let cid = self.conns[i].id;
            for v in early {
                self.handle(cid, &v, &mut messages);
            }
        }
        for c in &self.conns {
            c.ws.set_read_timeout(READ_SLICE);
        }
        let mut deadline = Instant::now() + budget.unwrap_or(RECEIVE_WAIT).min(RECEIVE_WAIT);
        if !self.acks.is_empty() {
            deadline = deadline.min(Instant::now() + GATHER);
        }
        let mut lost: Option<String> = None;
        while !self.conns.is_empty() {
            let got_before = self.acks.len();
            let mut i = 0;
            while i < self.conns.len() {
                let now = Instant::now();
                let c = &mut self.conns[i];
                let mut failed = None;
                if now.duration_since(c.last_frame) > DEAD_AFTER {
                    failed = Some(format!("no frame from Slack for {} s", DEAD_AFTER.as_secs()));
                } else if now.duration_since(c.last_ping) >= PING_EVERY {
                    c.last_ping = now;
                    if let Err(e) = c.ws.ping() {
                        failed = Some(format!("cannot ping: {e}"));
                    }
                }
                if !self.acks.is_empty() {
                    // Envelopes in hand: only what is already there, not another slice's wait.
                    c.ws.set_read_timeout(QUICK_READ);
                }
                let read = if failed.is_none() { c.read() } else { Ok(None) };
                let cid = c.id;
                match (failed, read) {
                    (None, Ok(Some(v))) => {
                        let before = self.acks.len();
                        self.handle(cid, &v, &mut messages);
                        if before == 0 && !self.acks.is_empty() {
                            // The first envelope: its ack is due within 3 s.
                            deadline = deadline.min(Instant::now() + GATHER);
                        }
                        i += 1;
                    }
                    (None, Ok(None)) => i += 1,
                    (Some(e), _) | (None, Err(e)) => {
                        // Its unacknowledged envelopes come again on another connection.
                        let c = self.conns.remove(i);
                        c.close();
                        self.acks.retain(|(id, _)| *id != cid);
                        lost = Some(e);
                    }
                }
            }
            // Once envelopes are in hand, a pass that brought no more ends the receive.
            let quiet = got_before > 0 && self.acks.len() == got_before;
            if quiet || Instant::now() >= deadline || self.fatal.is_some() || ctx.ending() {
                break;
            }
            if self.refresh.is_some_and(|at| Instant::now() >= at) {
                self.refresh_now();
            }
        }
        if self.conns.is_empty() && messages.is_empty() {
            return Err(Failure::Lost(lost.unwrap_or_else(|| "no Socket Mode connection".into())));
        }
        Ok(Batch { messages, gap: None })
    }

    /// Acknowledges the batch's envelopes on the connections that carried them, then closes the
    /// connections a `disconnect` retired once a newer one is up.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        for (cid, env) in std::mem::take(&mut self.acks) {
            let Some(i) = self.conns.iter().position(|c| c.id == cid) else { continue };
            if self.conns[i].send(json!({ "envelope_id": env }).to_string()).is_err() {
                // Not acknowledged: Slack redelivers it, and the journal drops the copy.
                self.conns.remove(i).close();
            }
        }
        if self.conns.iter().any(|c| !c.retiring) {
            let (old, keep): (Vec<Conn>, Vec<Conn>) = self.conns.drain(..).partition(|c| c.retiring);
            self.conns = keep;
            for c in old {
                c.close();
            }
        }
        Ok(())
    }

    fn disconnect(&mut self) {
        self.drop_all();
    }

    /// `GET` of the file's `url_private_download` with `Authorization: Bearer <bot token>`
    /// (https://api.slack.com/types/file#auth), only on Slack's file host (or a configured
    /// `api_base`'s origin: crates/platforms/src/filexfer.rs), so the token goes nowhere else.
    fn fetch(
        &mut self,
        _ctx: &Ctx,
        a: &Attachment,
        timeout: Duration,
    ) -> Result<Box<dyn std::io::Read + Send>, String> {
        self.files.check(&a.fetch)?;
        crate::filexfer::download(&self.api.http, &a.fetch, Some(&self.bot_token), timeout)
    }

    /// Closes the connections: what they carried unacknowledged is redelivered to the successor.
    fn hang_up(&mut self) -> Vec<Inbound> {
        self.drop_all();
        Vec::new()
    }
}

/// `f` with `what` named when it is a refusal (which token was refused).
fn named(f: Failure, what: &str) -> Failure {
    match f {
        Failure::Rejected(m) => Failure::Rejected(format!("{what}: {m}")),
        other => other,
    }
}

/// The send side: `chat.postMessage` with the bot token for replies and previews,
/// `chat.update` and `chat.delete` for previews.
pub struct Poster {
    api: WebApi,
    /// Where `upload_url`s may point.
    files: FileHosts,
    bot_token: String,
    /// `chat.update`'s and `chat.delete`'s own limits (their tiers are per app and workspace).
    update: Tier,
    delete: Tier,
}

/// A Web API failure as the skeleton's sender takes it.
fn send_error(e: ApiError) -> SendError {
    match e {
        ApiError::RateLimited(d) => SendError::RateLimited(d),
        ApiError::Refused(m) => SendError::Rejected(m),
        ApiError::Auth(m) => SendError::Unauthorized(format!("bot token (bot_token_env): {m}")),
        e @ (ApiError::Network(_) | ApiError::Server(_)) => SendError::Failed(e.to_string()),
    }
}

/// One Tier 3 method's limit, kept on our side (https://api.slack.com/apis/rate-limits: "50+
/// per minute", per method, app and workspace): the calls of the last minute, and a time a 429
/// named before which no call is made.
struct Tier {
    calls: std::collections::VecDeque<Instant>,
    until: Option<Instant>,
}

impl Tier {
    const PER_MINUTE: usize = 50;
    const MINUTE: Duration = Duration::from_secs(60);

    fn new() -> Tier {
        Tier { calls: std::collections::VecDeque::with_capacity(Self::PER_MINUTE), until: None }
    }

    /// Takes a call at `now`, or says how long to wait for one.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(t) = self.until.filter(|t| *t > now) {
            return Err(t - now);
        }
        while self.calls.front().is_some_and(|t| now.saturating_duration_since(*t) >= Self::MINUTE) {
            self.calls.pop_front();
        }
        if self.calls.len() >= Self::PER_MINUTE {
            let oldest = self.calls.front().copied().unwrap_or(now);
            return Err((oldest + Self::MINUTE).saturating_duration_since(now).max(Duration::from_millis(1)));
        }
        self.calls.push_back(now);
        Ok(())
    }

    /// A 429 (or `ratelimited`) of this method: nothing more before its `Retry-After`.
    fn limited(&mut self, e: &ApiError, now: Instant) {
        if let ApiError::RateLimited(d) = e {
            self.until = Some(now + d.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(300)));
        }
    }
}

impl Poster {
    /// POSTs the stored file's bytes to `url` (the raw body, with its length: Slack's upload
    /// URL takes either that or a form).
    fn upload(&self, url: &str, file: &OutFile) -> Result<(), SendError> {
        let gone = || SendError::Rejected(format!("the stored file {} is gone", file.name));
        let (opened, len) = gatewarden_lifecycle::fsio::open_regular(&file.path).ok().ok_or_else(gone)?;
        if len != file.size {
            return Err(gone());
        }
        let mut body = std::io::Read::take(opened, len);
        let response = self
            .api
            .http
            .post(url)
            .header("Content-Type", "application/octet-stream")
            .header("Content-Length", &len.to_string())
            .config()
            .timeout_global(Some(UPLOAD_TIMEOUT))
            .max_redirects(0)
            .build()
            .send(ureq::SendBody::from_reader(&mut body))
            .map_err(|e| SendError::Failed(format!("the upload failed: {}", gatewarden_net::describe(&e, url))))?;
        match response.status().as_u16() {
            200 => Ok(()),
            413 => Err(SendError::Rejected(format!("Slack refused {} as too large (HTTP 413)", file.name))),
            429 => Err(SendError::RateLimited(crate::header_secs(&response, "retry-after"))),
            s => Err(SendError::Failed(format!("the upload answered HTTP {s}"))),
        }
    }

    /// `method` through `tier`: waited out on our side, a 429 remembered for the next call.
    fn tiered(tier: &mut Tier, api: &WebApi, token: &str, method: &str, body: &Value) -> Result<Value, ApiError> {
        tier.take(Instant::now()).map_err(|d| ApiError::RateLimited(Some(d)))?;
        api.call(method, token, Some(body)).inspect_err(|e| tier.limited(e, Instant::now()))
    }

    /// `chat.postMessage` of `text` to `chat` (its thread, if any); returns the message's `ts`.
    fn post(&self, chat: &str, text: &str) -> Result<Value, ApiError> {
        let (channel, thread) = split_chat(chat);
        let mut body = json!({ "channel": channel, "text": escape(text) });
        if let Some(ts) = thread {
            body["thread_ts"] = json!(ts);
        }
        self.api.call("chat.postMessage", &self.bot_token, Some(&body))
    }
}

impl skeleton::Sender for Poster {
    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        self.post(chat, piece).map(drop).map_err(send_error)
    }

    /// The external upload (https://api.slack.com/messaging/files#uploading_files):
    /// `files.getUploadURLExternal` (`filename`, `length`) names an `upload_url` and a
    /// `file_id`; the bytes are POSTed there, streamed from the store (no token: the URL is the
    /// grant); `files.completeUploadExternal` shares the file in the chat (`channel_id`, and the
    /// thread's `thread_ts`). No idempotency key: a crash after the completion and before the
    /// outbox commit shares the file once more after the restart (one duplicate, as for text);
    /// a crash before it leaves an upload never shared, which Slack discards.
    fn send_file(&mut self, chat: &str, file: &OutFile, _id: PieceId) -> Result<(), SendError> {
        let (channel, thread) = split_chat(chat);
        let name = gatewarden_net::multipart::header_safe(&file.name);
        let length = file.size.to_string();
        let got = self
            .api
            .call_form("files.getUploadURLExternal", &self.bot_token, &[("filename", &name), ("length", &length)])
            .map_err(send_error)?;
        let (Some(upload_url), Some(file_id)) = (got["upload_url"].as_str(), got["file_id"].as_str()) else {
            return Err(SendError::Failed("files.getUploadURLExternal returned no upload_url or file_id".into()));
        };
        self.files.check(upload_url).map_err(|e| SendError::Failed(format!("upload_url: {e}")))?;
        self.upload(upload_url, file)?;
        let files = json!([{ "id": file_id, "title": name }]).to_string();
        let mut args = vec![("files", files.as_str()), ("channel_id", channel)];
        if let Some(ts) = thread {
            args.push(("thread_ts", ts));
        }
        self.api.call_form("files.completeUploadExternal", &self.bot_token, &args).map(drop).map_err(send_error)
    }

    // `typing` stays the skeleton's no-op: the Web API and Socket Mode give bots no typing
    // indicator (the RTM API's `typing` message is not available to them).

    /// A preview is a message of its own in the chat's thread (`chat.postMessage`, whose `ts`
    /// names it), then `chat.update` of it.
    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let Some(ts) = shown else {
            let v = self.post(chat, text).map_err(send_error)?;
            return match v["ts"].as_str().filter(|t| !t.is_empty()) {
                Some(ts) => Ok(Some(ts.to_owned())),
                None => Err(SendError::Failed("chat.postMessage returned no ts".into())),
            };
        };
        let (channel, _) = split_chat(chat);
        let body = json!({ "channel": channel, "ts": ts, "text": escape(text) });
        Self::tiered(&mut self.update, &self.api, &self.bot_token, "chat.update", &body).map_err(send_error)?;
        Ok(Some(ts.to_owned()))
    }

    /// `chat.delete`; a message already gone (`message_not_found`) counts as deleted.
    fn unpreview(&mut self, chat: &str, shown: &str) -> Result<(), SendError> {
        let (channel, _) = split_chat(chat);
        let body = json!({ "channel": channel, "ts": shown });
        gone_is_done(Self::tiered(&mut self.delete, &self.api, &self.bot_token, "chat.delete", &body))
    }
}

/// `chat.delete`'s outcome: `message_not_found` is what was wanted.
fn gone_is_done(r: Result<Value, ApiError>) -> Result<(), SendError> {
    match r {
        Ok(_) => Ok(()),
        Err(ApiError::Refused(m)) if m.ends_with(": message_not_found") => Ok(()),
        Err(e) => Err(send_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(event: Value) -> Value {
        json!({"type": "event_callback", "event_id": "Ev1", "event": event})
    }

    #[test]
    fn messages_map_to_inbound_and_threads_stay_threads() {
        let p = payload(
            json!({"type": "message", "user": "U1", "text": "hi", "channel": "C1", "ts": "1700000000.000100", "client_msg_id": "m-1"}),
        );
        let m = parse_event(&p, Some("UBOT"), &[]).unwrap();
        assert_eq!((m.event_id.as_str(), m.chat_id.as_str(), m.user_id.as_str()), ("msg:m-1", "C1", "U1"));
        assert_eq!(m.sent_at, Some(SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_100)));
        let t = payload(
            json!({"type": "app_mention", "user": "U1", "text": "<@UBOT> hi", "channel": "C1", "ts": "2.0", "thread_ts": "1.5"}),
        );
        let m = parse_event(&t, Some("UBOT"), &[]).unwrap();
        assert_eq!((m.event_id.as_str(), m.chat_id.as_str()), ("ev:Ev1", "C1/1.5"));
        assert_eq!(split_chat("C1/1.5"), ("C1", Some("1.5")));
        assert_eq!(split_chat("C1"), ("C1", None));
    }

    /// `files[]` become the message's files, fetched by `url_private_download` (else
    /// `url_private`); a `file_share` without a comment is delivered with empty text; a hidden
    /// file (no URL) is skipped.
    #[test]
    fn shared_files_are_taken_and_a_file_alone_is_a_message() {
        let p = payload(json!({"type": "message", "subtype": "file_share", "user": "U1", "text": "", "channel": "C1",
            "ts": "1.0", "files": [
                {"id": "F1", "name": "cat.png", "mimetype": "image/png", "size": 99,
                 "url_private": "https://files.slack.com/files-pri/T-F1/cat.png",
                 "url_private_download": "https://files.slack.com/files-pri/T-F1/download/cat.png"},
                {"id": "F2", "title": "notes", "url_private": "https://files.slack.com/files-pri/T-F2/notes"},
                {"id": "F3", "mode": "hidden_by_limit"}]}));
        let m = parse_event(&p, Some("UBOT"), &[]).unwrap();
        assert_eq!(m.text, "");
        assert_eq!(m.attachments.len(), 2);
        let a = &m.attachments[0];
        assert_eq!(
            (a.name.as_str(), a.declared.as_str(), a.size, a.fetch.as_str()),
            ("cat.png", "image/png", Some(99), "https://files.slack.com/files-pri/T-F1/download/cat.png")
        );
        assert_eq!(
            (m.attachments[1].name.as_str(), m.attachments[1].fetch.as_str()),
            ("notes", "https://files.slack.com/files-pri/T-F2/notes")
        );
        let hosts = FileHosts::new(DEFAULT_API_BASE, DEFAULT_API_BASE, FILE_HOSTS);
        assert!(hosts.check(&a.fetch).is_ok());
        assert!(hosts.check("https://evil.example/files-pri/x").is_err(), "the bot token goes to Slack only");
        let bare =
            payload(json!({"type": "message", "subtype": "file_share", "user": "U1", "text": "", "channel": "C1",
            "ts": "1.0", "files": [{"id": "F3", "mode": "tombstone"}]}));
        assert!(parse_event(&bare, None, &[]).is_none(), "no text and no file");
    }

    #[test]
    fn bots_edits_joins_and_our_own_messages_are_not_answered() {
        let base = json!({"type": "message", "user": "U1", "text": "x", "channel": "C1", "ts": "1.0"});
        let with = |k: &str, v: Value| {
            let mut e = base.clone();
            e[k] = v;
            payload(e)
        };
        assert!(parse_event(&payload(base.clone()), None, &[]).is_some());
        for sub in ["message_changed", "bot_message", "channel_join", "message_deleted"] {
            assert!(parse_event(&with("subtype", json!(sub)), None, &[]).is_none(), "{sub}");
        }
        assert!(parse_event(&with("subtype", json!("thread_broadcast")), None, &[]).is_some());
        assert!(parse_event(&with("bot_id", json!("B1")), None, &[]).is_none());
        assert!(parse_event(&payload(base.clone()), Some("U1"), &[]).is_none(), "our own bot user");
        assert!(parse_event(&with("text", json!("  ")), None, &[]).is_none());
        assert!(parse_event(&with("type", json!("reaction_added")), None, &[]).is_none());
        assert!(parse_event(&with("channel", json!("C1/x")), None, &[]).is_none());
        assert!(parse_event(&json!("garbage"), None, &[]).is_none());
    }

    /// An `im` is a direct chat; in a channel, a mention, an `app_mention` or a reply under the
    /// bot's message addresses it; `listed` is what allowed_chats says of the channel.
    #[test]
    fn direct_chats_mentions_and_thread_replies() {
        let ev = |x: Value| {
            let mut e = json!({"type": "message", "user": "U1", "text": "hi", "channel": "C1", "ts": "1.1",
                               "channel_type": "channel"});
            if let (Some(e), Some(x)) = (e.as_object_mut(), x.as_object()) {
                e.extend(x.clone());
            }
            parse_event(&json!({"event": e, "event_id": "Ev"}), Some("UBOT"), &["C1".to_owned()]).unwrap()
        };
        let plain = ev(json!({}));
        assert_eq!((plain.chat, plain.listed, plain.addressed), (ChatKind::Group, true, false));
        let im = ev(json!({"channel": "D9", "channel_type": "im"}));
        assert_eq!((im.chat, im.listed), (ChatKind::Direct, false));
        assert_eq!(ev(json!({"channel": "D9", "channel_type": null})).chat, ChatKind::Direct);
        assert!(ev(json!({"text": "<@UBOT> what now"})).addressed);
        assert!(ev(json!({"text": "<@UBOT|gw> what now"})).addressed);
        assert!(ev(json!({"type": "app_mention"})).addressed);
        assert!(ev(json!({"thread_ts": "1.0", "parent_user_id": "UBOT"})).addressed);
        assert!(!ev(json!({"thread_ts": "1.0", "parent_user_id": "U2", "text": "<@U2> hi"})).addressed);
    }

    #[test]
    fn web_api_answers_are_classified() {
        let s = Duration::from_secs;
        assert_eq!(classify(200, &json!({"ok": true, "x": 1}), None, "m"), Ok(json!({"ok": true, "x": 1})));
        assert_eq!(
            classify(429, &json!({"ok": false, "error": "ratelimited"}), Some(s(7)), "m"),
            Err(ApiError::RateLimited(Some(s(7))))
        );
        for e in ["invalid_auth", "not_authed", "account_inactive", "token_revoked"] {
            assert_eq!(
                classify(200, &json!({"ok": false, "error": e}), None, "m"),
                Err(ApiError::Auth(format!("m: {e}")))
            );
        }
        assert_eq!(
            classify(200, &json!({"ok": false, "error": "channel_not_found"}), None, "m"),
            Err(ApiError::Refused("m: channel_not_found".into()))
        );
        assert!(matches!(classify(503, &Value::Null, None, "m"), Err(ApiError::Server(_))));
        assert!(matches!(
            classify(200, &json!({"ok": false, "error": "fatal_error"}), None, "m"),
            Err(ApiError::Server(_))
        ));
    }

    #[test]
    fn tier_limits_are_kept_on_our_side_and_a_gone_preview_is_deleted() {
        let t0 = Instant::now();
        let mut t = Tier::new();
        for _ in 0..Tier::PER_MINUTE {
            assert_eq!(t.take(t0), Ok(()));
        }
        assert_eq!(t.take(t0 + Duration::from_secs(10)), Err(Duration::from_secs(50)), "50 a minute");
        assert_eq!(t.take(t0 + Tier::MINUTE), Ok(()), "the window slid");
        t.limited(&ApiError::RateLimited(Some(Duration::from_secs(7))), t0 + Tier::MINUTE);
        assert_eq!(t.take(t0 + Tier::MINUTE + Duration::from_secs(2)), Err(Duration::from_secs(5)), "a 429 holds it");
        assert!(t.calls.len() <= Tier::PER_MINUTE);
        assert_eq!(gone_is_done(Err(ApiError::Refused("chat.delete: message_not_found".into()))), Ok(()));
        assert_eq!(
            gone_is_done(Err(ApiError::Refused("chat.delete: cant_delete_message".into()))),
            Err(SendError::Rejected("chat.delete: cant_delete_message".into()))
        );
        assert_eq!(gone_is_done(Err(ApiError::RateLimited(None))), Err(SendError::RateLimited(None)));
    }

    #[test]
    fn urls_times_and_escapes() {
        assert_eq!(
            parse_ws_url("wss://wss-primary.slack.com/link/?ticket=t&app_id=A").map(|u| (u.tls, u.host, u.port)),
            Some((true, "wss-primary.slack.com".into(), 443))
        );
        assert_eq!(
            parse_ws_url("ws://127.0.0.1:9/link").map(|u| (u.tls, u.host, u.port)),
            Some((false, "127.0.0.1".into(), 9))
        );
        assert_eq!(parse_ws_url("ws://[::1]:9/").map(|u| (u.host, u.port)), Some(("::1".into(), 9)));
        assert_eq!(parse_ws_url("https://x/"), None);
        assert_eq!(parse_ws_url("wss://u@x/"), None);
        assert_eq!(parse_ws_url("wss://x:notaport/"), None);
        assert_eq!(ts_time("5.5"), Some(SystemTime::UNIX_EPOCH + Duration::from_millis(5500)));
        assert_eq!(ts_time("x"), None);
        assert_eq!(escape("a<b>&c"), "a&lt;b&gt;&amp;c");
        let text: String = std::iter::repeat_n('é', MAX_TEXT_CHARS + 1).collect();
        assert_eq!(skeleton::pieces(&text, &Proto::LIMITS).len(), 2);
    }
}
