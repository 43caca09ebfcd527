//! Mattermost adapter: the v4 WebSocket event stream to receive, REST posts to reply
//! (https://api.mattermost.com/, https://developers.mattermost.com/api-documentation/).
//!
//! - **Credential.** `token_env` / `token_file` hold a bot account's token or a personal access
//!   token. `GET /api/v4/users/me` checks it at connect (our user id and username; a 401 parks
//!   the adapter naming it); the WebSocket (`<server>/api/v4/websocket`) is authenticated with
//!   the `authentication_challenge` action (`seq` 1; `seq_reply` 1 with `status: "OK"`, a
//!   `FAIL` parks too), then the server's `hello`. The credential lock is keyed by the server
//!   and the token's SHA-256 (`host[:port][/path]/<16 hex digits>`): never the token itself.
//! - **Nothing lost across restarts.** The WebSocket does not redeliver: what is posted while
//!   no connection is up is read back over REST. Every channel's position, the `create_at` of
//!   the last post handled (journaled, or skipped as ours or a bot's), is saved in
//!   `<home>/platforms/mattermost-<name>.json` in `confirm`, after the journal commit, with a
//!   `floor` (when the last read-back began, less a minute's margin). After every connect (a
//!   start, a restart, a reconnect) and after a gap in the events' `seq`, the adapter lists the
//!   bot's channels on all teams (`GET /api/v4/users/{id}/channels`: public, private, direct
//!   and group messages it is a member of) and reads back each whose `last_post_at` is past its
//!   position less [`SKEW_MS`] (a channel never seen: past the floor) with
//!   `GET /api/v4/channels/{id}/posts?since=…`, page after page (the server returns at most
//!   1,000 posts modified since then; the next page starts at the page's newest `update_at`).
//!   The journal deduplicates by post id, so a post read back and also received on the
//!   WebSocket is answered once. After a whole read-back, positions older than the new floor
//!   are dropped (the floor serves those channels), so the file keeps the active ones. Worst case: a post in a channel the bot left or was removed
//!   from while the gateway was down, and more than 1,000 posts in one channel modified within
//!   the same millisecond; neither is read back.
//! - **Conversations.** A post in a thread (`root_id`) is the chat `<channel>/<root_id>`, and
//!   the reply goes to that thread; a top-level post is the chat `<channel>`. A direct channel
//!   (`channel_type` `D`) is a direct chat, every other (`O`, `P`, `G`) a group's, `listed`
//!   when `allowed_chats` names the channel id and addressed when the `posted` event's
//!   `mentions` name us, the text has `@<our username>`, or it replies in a thread under our
//!   post. System posts (`type` not empty), our own and other bots' (`props.from_bot`) are not
//!   answered; edits and deletions are not `posted` events.
//! - **Replies.** `POST /api/v4/posts` with `channel_id`, `message` and `root_id`, at most
//!   [`MAX_TEXT_CHARS`] characters a piece; a 429 waits its `Retry-After` (else
//!   `X-Ratelimit-Reset`). No idempotency key: a crash between a post and the outbox commit
//!   posts that piece again after the restart.
//! - **Files** (issue 29; https://api.mattermost.com/#tag/files). In: a post's `file_ids`,
//!   described by `metadata.files[]` (`id`, `name`, `mime_type`, `size`; a file it does not
//!   describe is named by its id, its type left to the content), downloaded with `GET
//!   /api/v4/files/{id}` and the token under the skeleton's bounds (attachments.rs); a post of
//!   only files is a message with empty text. Out: `POST /api/v4/files` (multipart
//!   `channel_id`, `files`) returns `file_infos[].id`, then a post in the chat's thread with
//!   `file_ids`. The text path sends no `pending_post_id`, so neither does this one: a crash
//!   between the post and the outbox commit uploads and posts that entry's files again after
//!   the restart (worst case one duplicate, as for text).
//! - **The agent at work** (skeleton/progress.rs). Typing: the WebSocket action `user_typing`
//!   (`channel_id`, `parent_id`), written by the receive side between its reads (it owns the
//!   socket); nothing for "off" (clients stop showing it after a few seconds). Preview: a post of
//!   its own in the chat's thread, edited with `PUT /api/v4/posts/{id}/patch` as the reply
//!   grows, deleted with `DELETE /api/v4/posts/{id}` (404 counts as deleted) once the reply is
//!   out as its own post, as Slack's are.
//!
//! The WebSocket is crates/chatproto/src/ws.rs's client (TLS from crates/net, `ws://` only
//! from an `http://` server, a loopback fake); REST is ureq through crates/net's settings. The
//! loops, states, backoff and drain are the skeleton's (crates/platforms/src/skeleton).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_chatproto::ws::{self, Incoming};
use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Mattermost as Settings;
use gatewarden_lifecycle::fsio;
use gatewarden_net::{ClientTls, Outbound};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::attachments::Attachment;
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// Characters per post: the server's default `MaxPostSize` (16,383 runes).
pub const MAX_TEXT_CHARS: usize = 16_383;
const MAX_BODY_BYTES: u64 = 16 << 20;
/// The largest WebSocket message accepted.
const MAX_WS_MESSAGE: usize = 4 << 20;
/// Bound on every REST call and on opening the WebSocket (TCP, TLS, handshake, `hello`).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on one file upload (streamed from the store).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Files one post carries at most (the server's limit).
const MAX_FILES: usize = 10;
/// One socket read waits at most this long.
const READ_SLICE: Duration = Duration::from_millis(50);
/// A receive without a budget waits at most this long for a post.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// After its first post, a receive reads on only while posts keep coming (each read waiting
/// [`QUICK_READ`]), and at most this long, before it returns the batch.
const GATHER: Duration = Duration::from_millis(50);
const QUICK_READ: Duration = Duration::from_millis(1);
/// We ping this often; a connection silent for [`DEAD_AFTER`] is dropped.
const PING_EVERY: Duration = Duration::from_secs(15);
const DEAD_AFTER: Duration = Duration::from_secs(45);
/// A channel with a position is read back from this much before it: a post created just
/// before the last one journaled but broadcast after it is not skipped (the journal drops
/// what it has).
pub const SKEW_MS: i64 = 10_000;
/// The floor for channels never seen is the last read-back's start less this margin (clock
/// skew between the gateway and the server).
const FLOOR_MARGIN_MS: i64 = 60_000;
/// Pages of one channel's read-back, at most.
const MAX_PAGES: usize = 100;
/// Our own post ids remembered (a reply under one of them is addressed to us).
const OURS_KEPT: usize = 1024;
/// Typing notices waiting for the receive side, at most.
const TYPING_QUEUE: usize = 64;

/// What the home keeps for one Mattermost adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Saved {
    /// Channel id -> the `create_at` (ms) of the last post handled there.
    channels: BTreeMap<String, i64>,
    /// Channels never seen are read back from here (ms since the epoch).
    floor: i64,
}

/// Why a REST call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ApiError {
    /// No answer (connect, timeout, unreadable body).
    Network(String),
    /// 429, with `Retry-After` (else `X-Ratelimit-Reset`).
    RateLimited(Option<Duration>),
    /// 401: the token is refused.
    Auth(String),
    /// 404: no such post or channel.
    NotFound(String),
    /// Any other 4xx: this request will never succeed.
    Refused(String),
    /// 5xx.
    Server(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Network(m) => write!(f, "cannot reach the Mattermost server: {m}"),
            ApiError::RateLimited(d) => write!(f, "rate limited (Retry-After {:?})", d.map(|d| d.as_secs())),
            ApiError::Auth(m) | ApiError::NotFound(m) | ApiError::Refused(m) | ApiError::Server(m) => f.write_str(m),
        }
    }
}

impl ApiError {
    fn failure(self) -> Failure {
        match self {
            ApiError::RateLimited(d) => Failure::RateLimited(d),
            ApiError::Auth(m) => Failure::Rejected(format!("the token (token_env) is refused: {m}")),
            e => Failure::Down(e.to_string()),
        }
    }

    fn send_error(self) -> SendError {
        match self {
            ApiError::RateLimited(d) => SendError::RateLimited(d),
            ApiError::Auth(m) => SendError::Unauthorized(format!("the token (token_env) is refused: {m}")),
            ApiError::NotFound(m) | ApiError::Refused(m) => SendError::Rejected(m),
            e @ (ApiError::Network(_) | ApiError::Server(_)) => SendError::Failed(e.to_string()),
        }
    }
}

/// Classifies one answer: the body of a 2xx, else the error (the body's `message` and `id`,
/// as the API's AppError carries them).
fn classify(status: u16, body: &Value, retry_after: Option<Duration>, what: &str) -> Result<Value, ApiError> {
    if (200..300).contains(&status) {
        return Ok(body.clone());
    }
    let message = body["message"].as_str().unwrap_or("");
    let id = body["id"].as_str().unwrap_or("");
    let text = match (message.is_empty(), id.is_empty()) {
        (true, _) => format!("{what}: HTTP {status}"),
        (false, true) => format!("{what}: HTTP {status}: {message}"),
        (false, false) => format!("{what}: HTTP {status}: {message} ({id})"),
    };
    Err(match status {
        429 => ApiError::RateLimited(retry_after),
        401 => ApiError::Auth(text),
        404 => ApiError::NotFound(text),
        400..=499 => ApiError::Refused(text),
        _ => ApiError::Server(text),
    })
}

/// The REST API at `<server>/api/v4`.
#[derive(Clone)]
struct Rest {
    http: ureq::Agent,
    base: String,
    token: String,
}

impl Rest {
    fn new(server: &str, token: &str, out: &Outbound) -> Rest {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        Rest { http, base: format!("{}/api/v4", server.trim_end_matches('/')), token: token.to_owned() }
    }

    /// `method path` with `body` (JSON), bounded by [`CALL_TIMEOUT`].
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.token);
        let sent = match method {
            "GET" | "DELETE" => {
                let req = if method == "GET" { self.http.get(&url) } else { self.http.delete(&url) };
                req.header("Authorization", &auth).config().timeout_global(Some(CALL_TIMEOUT)).build().call()
            }
            _ => {
                let req = if method == "PUT" { self.http.put(&url) } else { self.http.post(&url) };
                req.header("Authorization", &auth)
                    .header("Content-Type", "application/json")
                    .config()
                    .timeout_global(Some(CALL_TIMEOUT))
                    .build()
                    .send(body.map(Value::to_string).unwrap_or_default())
            }
        };
        let response = sent.map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))?;
        let status = response.status().as_u16();
        let header = |name: &str| crate::header_secs(&response, name);
        // `X-Ratelimit-Reset` is seconds until the reset; a value past an hour is no wait we use.
        let retry_after = header("retry-after").or_else(|| header("x-ratelimit-reset").filter(|d| d.as_secs() <= 3600));
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(ApiError::Network)?;
        classify(status, &v, retry_after, &format!("{method} {path}"))
    }

    /// `GET /files/{id}`: the file's bytes, streamed, bounded by `timeout` in all.
    fn download(&self, id: &str, timeout: Duration) -> Result<Box<dyn std::io::Read + Send>, String> {
        if !id_ok(id) {
            return Err(format!("{id:?} is not a file id"));
        }
        crate::filexfer::download(&self.http, &format!("{}/files/{id}", self.base), Some(&self.token), timeout)
    }

    /// `POST /files` of one stored file to `channel`; returns its file id.
    fn upload(&self, channel: &str, file: &OutFile) -> Result<String, ApiError> {
        let form = crate::filexfer::multipart(&[("channel_id", channel)], "files", file).map_err(ApiError::Refused)?;
        let url = format!("{}/files", self.base);
        let bearer = format!("Bearer {}", self.token);
        let response = crate::filexfer::post_form(&self.http, &url, Some(&bearer), form, UPLOAD_TIMEOUT)
            .map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))?;
        let status = response.status().as_u16();
        let retry_after = crate::header_secs(&response, "retry-after");
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(ApiError::Network)?;
        let v = classify(status, &v, retry_after, "POST /files")?;
        v["file_infos"][0]["id"]
            .as_str()
            .filter(|i| id_ok(i))
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Server("POST /files returned no file id".into()))
    }
}

/// The Mattermost adapter.
pub type Mattermost = Skeleton<Proto>;

/// The WebSocket and REST protocol.
pub struct Proto {
    token: String,
    server: String,
    credential: String,
    out: Outbound,
    name: String,
    allowed: Vec<String>,
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Mattermost, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let start_error = |message: String| AdapterError::Start { name: cfg.adapter_name(), message };
        let server = s.server.as_deref().map(str::trim).unwrap_or_default().trim_end_matches('/').to_owned();
        ws_url(&server).ok_or_else(|| start_error(format!("server {server:?} is not an http(s):// URL")))?;
        let out = Outbound::new(cfg.ca_file.as_deref(), None).map_err(|e| start_error(e.to_string()))?;
        let proto = Proto {
            credential: credential_key(&server, &token),
            token,
            server,
            out,
            name: cfg.adapter_name(),
            allowed: cfg.allowed_chats.clone(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

/// The credential lock's key: the server without its scheme, and the token's hash.
fn credential_key(server: &str, token: &str) -> String {
    let at = server.split_once("://").map_or(server, |(_, r)| r);
    let digest = crate::sha256_hex(token.as_bytes());
    format!("{at}/{}", digest.get(..16).unwrap_or(&digest))
}

/// `<server>/api/v4/websocket` as a `ws(s)://` URL.
fn ws_url(server: &str) -> Option<String> {
    let (scheme, rest) = if let Some(r) = server.strip_prefix("https://") {
        ("wss", r)
    } else {
        ("ws", server.strip_prefix("http://")?)
    };
    let url = format!("{scheme}://{}/api/v4/websocket", rest.trim_end_matches('/'));
    ws::parse_url(&url).map(|_| url)
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Mattermost, AdapterError> {
        Mattermost::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 16,
        // The server's own 429s pace the posts.
        pace: None,
        min_receive: READ_SLICE,
        // What is not confirmed is read back from the saved positions.
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(300),
    };
    type Receiver = EventStream;
    type Sender = Poster;

    fn credential(&self) -> &str {
        &self.credential
    }

    fn watchdog_after(&self) -> Duration {
        DEAD_AFTER + Duration::from_secs(30)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(EventStream, Poster), String> {
        let path = host.state_dir().map(|d| d.join(format!("mattermost-{}.json", self.name)));
        let saved = load(path.as_deref()).map_err(|e| format!("positions file: {e}"))?;
        let url = ws_url(&self.server).ok_or_else(|| format!("server {:?} is not an http(s):// URL", self.server))?;
        let typing = Arc::new(Mutex::new(VecDeque::new()));
        let rest = Rest::new(&self.server, &self.token, &self.out);
        let rx = EventStream {
            rest: rest.clone(),
            tls: self.out.tls.clone(),
            url,
            token: self.token.clone(),
            allowed: self.allowed.clone(),
            me: None,
            conn: None,
            next_action: 1,
            next_event: None,
            last_frame: Instant::now(),
            last_ping: Instant::now(),
            readback: false,
            readback_floor: 0,
            readback_base: Saved::default(),
            lost: None,
            path,
            pending: None,
            saved,
            ours: VecDeque::new(),
            typing: Arc::clone(&typing),
        };
        Ok((rx, Poster { rest, typing }))
    }
}

/// Reads the saved positions (missing or unreadable: none, from now on).
fn load(path: Option<&Path>) -> Result<Saved, String> {
    let saved = path
        .and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
        .and_then(|b| serde_json::from_slice::<Saved>(&b).ok());
    if let Some(s) = saved {
        return Ok(s);
    }
    // A first start answers nothing posted before it.
    let s = Saved { channels: BTreeMap::new(), floor: now_ms() };
    if let Some(p) = path {
        save(p, &s)?;
    }
    Ok(s)
}

fn save(path: &Path, s: &Saved) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        gatewarden_lifecycle::platform::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fsio::write_json(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0))
}

/// Our account, from `GET /users/me`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Me {
    id: String,
    username: String,
}

/// The `(channel, root_id)` of a chat id.
fn split_chat(chat: &str) -> (&str, &str) {
    chat.split_once('/').unwrap_or((chat, ""))
}

/// Whether `text` mentions `@username` (Mattermost's mention: the name, then no name character).
fn mentions_name(text: &str, username: &str) -> bool {
    if username.is_empty() {
        return false;
    }
    let needle = format!("@{username}");
    let lower = text.to_lowercase();
    let mut from = 0;
    while let Some(i) = lower.get(from..).and_then(|t| t.find(&needle.to_lowercase())) {
        let end = from + i + needle.len();
        let next = lower.get(end..).and_then(|t| t.chars().next());
        if !next.is_some_and(|c| c.is_alphanumeric() || "._-".contains(c)) {
            return true;
        }
        from = end;
    }
    false
}

/// What the receiver knows when it parses a post.
struct Parse<'a> {
    me: Option<&'a Me>,
    allowed: &'a [String],
    ours: &'a VecDeque<String>,
}

/// A post worth answering (`None`: a system post, ours, a bot's, empty, malformed).
/// `channel_type` is the `posted` event's (or the channel's `type` on a read-back), `mentions`
/// the event's user ids.
fn parse_post(post: &Value, channel_type: Option<&str>, mentions: &[String], p: &Parse<'_>) -> Option<Inbound> {
    let id = post["id"].as_str().filter(|s| !s.is_empty() && !s.contains('/'))?;
    let channel = post["channel_id"].as_str().filter(|s| !s.is_empty() && !s.contains('/'))?;
    let user = post["user_id"].as_str().filter(|u| !u.is_empty())?;
    if p.me.is_some_and(|m| m.id == user)
        || post["type"].as_str().is_some_and(|t| !t.is_empty())
        || !post["type"].is_null() && !post["type"].is_string()
        || post["props"]["from_bot"] == "true"
        || post["props"]["from_webhook"] == "true"
        || post["delete_at"].as_i64().is_some_and(|d| d > 0)
    {
        return None;
    }
    let attachments = files(post);
    let text = post["message"].as_str().filter(|t| !t.trim().is_empty() || !attachments.is_empty())?;
    let root = post["root_id"].as_str().unwrap_or("");
    if root.contains('/') {
        return None;
    }
    let chat = if root.is_empty() { channel.to_owned() } else { format!("{channel}/{root}") };
    let sent_at = post["create_at"]
        .as_i64()
        .and_then(|ms| u64::try_from(ms).ok())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
    let direct = channel_type == Some("D");
    let addressed = p.me.is_some_and(|me| {
        mentions.contains(&me.id)
            || mentions_name(text, &me.username)
            || (!root.is_empty() && p.ours.iter().any(|o| o == root))
    });
    Some(Inbound {
        event_id: id.to_owned(),
        chat_id: chat,
        user_id: user.to_owned(),
        text: text.to_owned(),
        sent_at,
        chat: if direct { ChatKind::Direct } else { ChatKind::Group },
        listed: p.allowed.iter().any(|a| a == channel),
        addressed,
        attachments,
    })
}

/// The files a post carries: its `file_ids`, described by `metadata.files[]` where given
/// (module notes).
fn files(post: &Value) -> Vec<Attachment> {
    let described = post["metadata"]["files"].as_array();
    let ids = post["file_ids"].as_array().into_iter().flatten().filter_map(Value::as_str);
    ids.filter(|id| id_ok(id))
        .take(MAX_FILES)
        .map(|id| {
            let info = described.and_then(|fs| fs.iter().find(|f| f["id"] == id)).unwrap_or(&Value::Null);
            Attachment {
                name: info["name"].as_str().filter(|n| !n.trim().is_empty()).unwrap_or(id).to_owned(),
                declared: info["mime_type"].as_str().unwrap_or("").to_owned(),
                size: info["size"].as_u64(),
                fetch: id.to_owned(),
                outcome: None,
            }
        })
        .collect()
}

/// One `posted` event: its post (a JSON string in `data.post`), channel type and mentions.
fn posted(event: &Value) -> Option<(Value, Option<String>, Vec<String>)> {
    let data = &event["data"];
    let post: Value = serde_json::from_str(data["post"].as_str()?).ok()?;
    if !post.is_object() {
        return None;
    }
    let kind = data["channel_type"].as_str().map(str::to_owned);
    let mentions =
        data["mentions"].as_str().and_then(|m| serde_json::from_str::<Vec<String>>(m).ok()).unwrap_or_default();
    Some((post, kind, mentions))
}

/// The receive side: `GET /users/me`, the WebSocket and its events, the read-back.
pub struct EventStream {
    rest: Rest,
    tls: ClientTls,
    url: String,
    token: String,
    allowed: Vec<String>,
    me: Option<Me>,
    conn: Option<ws::Client>,
    /// Our next action's `seq`.
    next_action: i64,
    /// The server's next event `seq` (a gap: events were dropped, read back).
    next_event: Option<i64>,
    last_frame: Instant,
    last_ping: Instant,
    /// A read-back is due (after a connect or a `seq` gap).
    readback: bool,
    /// The local time the due read-back was asked for (the next floor, less the margin), and
    /// the journaled positions then: a post that came after a `seq` gap moves its channel's
    /// position, not where the read-back starts.
    readback_floor: i64,
    readback_base: Saved,
    /// The connection failed after a batch was read: reported at the next receive.
    lost: Option<String>,
    path: Option<PathBuf>,
    /// The positions once the last batch is journaled.
    pending: Option<Saved>,
    saved: Saved,
    /// Our own recent post ids.
    ours: VecDeque<String>,
    /// `(channel, root)` of typing notices the sender asked for.
    typing: Arc<Mutex<VecDeque<(String, String)>>>,
}

impl EventStream {
    fn drop_conn(&mut self) {
        if let Some(mut c) = self.conn.take() {
            c.close(None);
        }
    }

    /// Sends an action with the next `seq`; returns that `seq`.
    fn action(&mut self, action: &str, data: Value) -> Result<i64, String> {
        let seq = self.next_action;
        self.next_action += 1;
        let conn = self.conn.as_mut().ok_or("no WebSocket")?;
        conn.send_text(json!({"seq": seq, "action": action, "data": data}).to_string())
            .map_err(|e| format!("cannot write to the WebSocket: {e}"))?;
        Ok(seq)
    }

    /// Reads one message: `Ok(None)` when none came in the read timeout.
    fn read(&mut self) -> Result<Option<Value>, String> {
        let conn = self.conn.as_mut().ok_or("no WebSocket")?;
        match conn.read() {
            Incoming::Text(t) => {
                self.last_frame = Instant::now();
                Ok(Some(serde_json::from_str(&t).unwrap_or(Value::Null)))
            }
            Incoming::Other => {
                self.last_frame = Instant::now();
                Ok(None)
            }
            Incoming::Idle => Ok(None),
            Incoming::Close(frame) => Err(format!(
                "the server closed the WebSocket{}",
                frame.map(|(code, reason)| format!(" ({code} {reason})")).unwrap_or_default()
            )),
            Incoming::Closed(e) | Incoming::Failed(e) => Err(format!("the WebSocket failed: {e}")),
        }
    }

    /// An event's `seq`: a gap since the last one asks for a read-back.
    fn track_seq(&mut self, v: &Value) {
        let Some(seq) = v["seq"].as_i64() else { return };
        if let Some(want) = self.next_event
            && seq > want
        {
            self.ask_readback();
        }
        self.next_event = Some(seq + 1);
    }

    fn ask_readback(&mut self) {
        if !self.readback {
            self.readback = true;
            self.readback_floor = now_ms();
            self.readback_base = self.saved.clone();
        }
    }

    /// One message of the stream: a `posted` event's inbound message, if any.
    fn handle(&mut self, v: &Value, out: &mut Vec<Inbound>) {
        if v.get("event").is_some() {
            self.track_seq(v);
        }
        if v["event"] != "posted" {
            return;
        }
        let Some((post, kind, mentions)) = posted(v) else { return };
        self.note(&post);
        let p = Parse { me: self.me.as_ref(), allowed: &self.allowed, ours: &self.ours };
        if let Some(m) = parse_post(&post, kind.as_deref(), &mentions, &p) {
            out.push(m);
        }
    }

    /// A post handled (answered or not): its channel's position moves past it at `confirm`;
    /// our own are remembered.
    fn note(&mut self, post: &Value) {
        let (Some(channel), Some(at)) = (post["channel_id"].as_str(), post["create_at"].as_i64()) else { return };
        let pending = self.pending.get_or_insert_with(|| self.saved.clone());
        let pos = pending.channels.entry(channel.to_owned()).or_insert(at);
        *pos = (*pos).max(at);
        if let (Some(me), Some(id)) = (&self.me, post["id"].as_str())
            && post["user_id"].as_str() == Some(me.id.as_str())
        {
            if self.ours.len() >= OURS_KEPT {
                self.ours.pop_front();
            }
            self.ours.push_back(id.to_owned());
        }
    }

    /// The posts of the bot's channels since their positions (module notes), oldest first per
    /// channel; the floor moves to when this read-back began, less the margin. `false`: cut
    /// short by the drain (the successor reads back again). A channel the server will not let
    /// us read (403, 404) is skipped and named in the batch's gap, never retried in a loop.
    fn read_back(&mut self, ctx: &Ctx) -> Result<(Vec<Inbound>, bool, Option<String>), Failure> {
        let me = self.me.clone().ok_or_else(|| Failure::Lost("not logged in".into()))?;
        let channels = self.rest.call("GET", &format!("/users/{}/channels", me.id), None).map_err(ApiError::failure)?;
        let mut out = Vec::new();
        let mut unread = Vec::new();
        for ch in channels.as_array().map(Vec::as_slice).unwrap_or_default() {
            if ctx.ending() {
                return Ok((out, false, None));
            }
            let Some(id) = ch["id"].as_str().filter(|c| !c.is_empty() && !c.contains(['/', '?', '&'])) else {
                continue;
            };
            let since = match self.readback_base.channels.get(id) {
                Some(pos) => pos - SKEW_MS,
                None => self.readback_base.floor,
            }
            .max(0);
            if ch["last_post_at"].as_i64().is_some_and(|last| last <= since) {
                continue;
            }
            let posts = match self.posts_since(id, since) {
                Ok(p) => p,
                Err(ApiError::NotFound(e) | ApiError::Refused(e)) => {
                    unread.push(format!("{id} ({e})"));
                    continue;
                }
                Err(e) => return Err(e.failure()),
            };
            let kind = ch["type"].as_str().map(str::to_owned);
            for post in posts {
                self.note(&post);
                let p = Parse { me: self.me.as_ref(), allowed: &self.allowed, ours: &self.ours };
                if post["create_at"].as_i64().is_some_and(|c| c > since)
                    && let Some(m) = parse_post(&post, kind.as_deref(), &[], &p)
                {
                    out.push(m);
                }
            }
        }
        let pending = self.pending.get_or_insert_with(|| self.saved.clone());
        pending.floor = pending.floor.max(self.readback_floor - FLOOR_MARGIN_MS);
        // Every channel was read up to the floor: one whose position is older needs none (the
        // floor serves it), which keeps the file to the channels active lately.
        let floor = pending.floor;
        pending.channels.retain(|_, pos| *pos >= floor);
        let gap = (!unread.is_empty()).then(|| format!("posts not read back from {}", unread.join(", ")));
        Ok((out, true, gap))
    }

    /// `GET /channels/{id}/posts?since=…`, page after page, oldest first.
    fn posts_since(&self, channel: &str, since: i64) -> Result<Vec<Value>, ApiError> {
        let mut seen = HashSet::new();
        let mut out: Vec<Value> = Vec::new();
        let mut from = since;
        for _ in 0..MAX_PAGES {
            let list = self.rest.call("GET", &format!("/channels/{channel}/posts?since={from}"), None)?;
            let mut fresh = 0;
            let mut newest = from;
            for post in list["posts"].as_object().map(|m| m.values().collect::<Vec<_>>()).unwrap_or_default() {
                newest = newest.max(post["update_at"].as_i64().unwrap_or(from));
                if post["channel_id"].as_str() == Some(channel)
                    && let Some(id) = post["id"].as_str()
                    && seen.insert(id.to_owned())
                {
                    fresh += 1;
                    out.push(post.clone());
                }
            }
            // The next page: modified after this page's newest, less one ms (posts sharing it
            // come again and are dropped above); no new post, or no progress, ends it.
            if fresh == 0 || newest - 1 <= from {
                break;
            }
            from = newest - 1;
        }
        out.sort_by_key(|p| (p["create_at"].as_i64().unwrap_or(0), p["id"].as_str().map(str::to_owned)));
        Ok(out)
    }

    /// Writes the typing notices the sender asked for.
    fn flush_typing(&mut self) -> Result<(), String> {
        let queued: Vec<_> = self.typing.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for (channel, parent) in queued {
            self.action("user_typing", json!({"channel_id": channel, "parent_id": parent}))?;
        }
        Ok(())
    }

    /// Opens the WebSocket and authenticates: the challenge's `OK`, then `hello`.
    fn open_socket(&mut self) -> Result<(), Failure> {
        let parts = ws::parse_url(&self.url).ok_or_else(|| Failure::Down(format!("{}: not a ws(s) URL", self.url)))?;
        let opts = ws::Options {
            request: &self.url,
            timeout: CALL_TIMEOUT,
            write_timeout: CALL_TIMEOUT,
            max_message: MAX_WS_MESSAGE,
        };
        let conn = ws::Client::open(&parts, &self.tls, &opts)
            .map_err(|e| Failure::Down(format!("WebSocket {}: {e}", parts.authority())))?;
        self.conn = Some(conn);
        self.next_action = 1;
        self.next_event = None;
        let challenge = self.action("authentication_challenge", json!({"token": self.token})).map_err(Failure::Down)?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        let (mut authed, mut hello) = (false, false);
        while !(authed && hello) {
            if Instant::now() >= deadline {
                return Err(Failure::Down("the WebSocket sent no hello".into()));
            }
            let Some(v) = self.read().map_err(Failure::Down)? else { continue };
            if v["seq_reply"].as_i64() == Some(challenge) {
                if v["status"] != "OK" {
                    let why = v["error"]["message"].as_str().or(v["error"]["id"].as_str()).unwrap_or("FAIL");
                    return Err(Failure::Rejected(format!("the WebSocket refused the token: {why}")));
                }
                authed = true;
            } else if v["event"] == "hello" {
                self.track_seq(&v);
                hello = true;
            }
        }
        if let Some(c) = &self.conn {
            c.set_read_timeout(READ_SLICE);
        }
        self.last_frame = Instant::now();
        self.last_ping = Instant::now();
        Ok(())
    }
}

impl skeleton::Receiver for EventStream {
    /// `GET /users/me` (our id; a refused token parks at once), the WebSocket, and a read-back
    /// at the next receive.
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        self.drop_conn();
        self.lost = None;
        let me = self.rest.call("GET", "/users/me", None).map_err(ApiError::failure)?;
        let id =
            me["id"].as_str().filter(|s| !s.is_empty()).ok_or_else(|| Failure::Down("GET /users/me: no id".into()))?;
        self.me = Some(Me { id: id.to_owned(), username: me["username"].as_str().unwrap_or("").to_owned() });
        self.readback = false;
        self.ask_readback();
        self.open_socket().inspect_err(|_| self.drop_conn())
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        if let Some(why) = self.lost.take() {
            return Err(Failure::Lost(why));
        }
        if self.pending.take().is_some() {
            // The last batch was not confirmed (a failed journal commit): the WebSocket will
            // not send it again, so it is read back from the journaled positions.
            self.ask_readback();
        }
        if self.readback {
            let (messages, whole, gap) = self.read_back(ctx)?;
            self.readback = !whole;
            return Ok(Batch { messages, gap });
        }
        let mut messages = Vec::new();
        let mut deadline = Instant::now() + budget.unwrap_or(RECEIVE_WAIT).min(RECEIVE_WAIT);
        if let Some(c) = &self.conn {
            c.set_read_timeout(READ_SLICE);
        }
        loop {
            let now = Instant::now();
            let mut failed = None;
            if now.duration_since(self.last_frame) > DEAD_AFTER {
                failed = Some(format!("nothing from the server for {} s", DEAD_AFTER.as_secs()));
            } else if now.duration_since(self.last_ping) >= PING_EVERY {
                self.last_ping = now;
                if let Some(Err(e)) = self.conn.as_mut().map(ws::Client::ping) {
                    failed = Some(format!("cannot ping: {e}"));
                }
            }
            if failed.is_none()
                && let Err(e) = self.flush_typing()
            {
                failed = Some(e);
            }
            let read = if failed.is_none() { self.read() } else { Ok(None) };
            match (failed, read) {
                (None, Ok(Some(v))) => {
                    let before = messages.len();
                    self.handle(&v, &mut messages);
                    if before == 0 && !messages.is_empty() {
                        deadline = deadline.min(Instant::now() + GATHER);
                        if let Some(c) = &self.conn {
                            c.set_read_timeout(QUICK_READ);
                        }
                    }
                }
                // Posts in hand and nothing more at once: the batch is done.
                (None, Ok(None)) if !messages.is_empty() => break,
                (None, Ok(None)) => {}
                (Some(e), _) | (None, Err(e)) => {
                    self.drop_conn();
                    if messages.is_empty() {
                        return Err(Failure::Lost(e));
                    }
                    // Journal what came first; the loss is reported at the next receive.
                    self.lost = Some(e);
                    break;
                }
            }
            if Instant::now() >= deadline || ctx.ending() || self.readback {
                break;
            }
        }
        Ok(Batch { messages, gap: None })
    }

    /// `GET /files/{id}` with the token.
    fn fetch(
        &mut self,
        _ctx: &Ctx,
        a: &Attachment,
        timeout: Duration,
    ) -> Result<Box<dyn std::io::Read + Send>, String> {
        self.rest.download(&a.fetch, timeout)
    }

    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let Some(next) = self.pending.take() else { return Ok(()) };
        if next == self.saved {
            return Ok(());
        }
        if let Some(p) = &self.path {
            save(p, &next)?;
        }
        self.saved = next;
        Ok(())
    }

    fn disconnect(&mut self) {
        self.drop_conn();
    }

    fn hang_up(&mut self) -> Vec<Inbound> {
        self.drop_conn();
        Vec::new()
    }
}

/// The send side: posts, patches and deletions over REST; typing through the receive side.
pub struct Poster {
    rest: Rest,
    typing: Arc<Mutex<VecDeque<(String, String)>>>,
}

impl Poster {
    /// `POST /posts` of `text` to `chat` (its thread, if any); returns the post.
    fn post(&self, chat: &str, text: &str) -> Result<Value, ApiError> {
        let (channel, root) = split_chat(chat);
        let body = json!({"channel_id": channel, "message": text, "root_id": root});
        self.rest.call("POST", "/posts", Some(&body))
    }
}

/// A post id as a path segment (Mattermost ids are 26 lowercase letters and digits).
fn id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric())
}

impl skeleton::Sender for Poster {
    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        self.post(chat, piece).map(drop).map_err(ApiError::send_error)
    }

    /// The upload, then a post with its file id in the chat's thread (module notes).
    fn send_file(&mut self, chat: &str, file: &OutFile, _id: PieceId) -> Result<(), SendError> {
        let (channel, root) = split_chat(chat);
        let id = self.rest.upload(channel, file).map_err(ApiError::send_error)?;
        let body = json!({"channel_id": channel, "message": "", "root_id": root, "file_ids": [id]});
        self.rest.call("POST", "/posts", Some(&body)).map(drop).map_err(ApiError::send_error)
    }

    /// Queues a `user_typing` action for the receive side's next write (best-effort: a full
    /// queue drops it, the next refresh comes 4 s later).
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if on {
            let (channel, root) = split_chat(chat);
            let mut q = self.typing.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() < TYPING_QUEUE {
                q.push_back((channel.to_owned(), root.to_owned()));
            }
        }
        Ok(())
    }

    /// A preview is a post of its own in the chat's thread, then patched.
    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let Some(id) = shown else {
            let v = self.post(chat, text).map_err(ApiError::send_error)?;
            return match v["id"].as_str().filter(|i| id_ok(i)) {
                Some(id) => Ok(Some(id.to_owned())),
                None => Err(SendError::Failed("POST /posts returned no id".into())),
            };
        };
        if !id_ok(id) {
            return Err(SendError::Rejected(format!("{id:?} is not a post id")));
        }
        let body = json!({"message": text});
        self.rest.call("PUT", &format!("/posts/{id}/patch"), Some(&body)).map_err(ApiError::send_error)?;
        Ok(Some(id.to_owned()))
    }

    /// `DELETE /posts/{id}`; a post already gone (404) counts as deleted.
    fn unpreview(&mut self, _chat: &str, shown: &str) -> Result<(), SendError> {
        if !id_ok(shown) {
            return Ok(());
        }
        gone_is_done(self.rest.call("DELETE", &format!("/posts/{shown}"), None))
    }
}

fn gone_is_done(r: Result<Value, ApiError>) -> Result<(), SendError> {
    match r {
        Ok(_) | Err(ApiError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.send_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Me {
        Me { id: "botid".into(), username: "gwbot".into() }
    }

    fn post(extra: Value) -> Value {
        let mut p = json!({"id": "p1", "channel_id": "c1", "user_id": "u1", "message": "hi", "create_at": 1_700_000_000_123_i64,
                           "update_at": 1_700_000_000_123_i64, "delete_at": 0, "root_id": "", "type": "", "props": {}});
        if let (Some(p), Some(x)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(x.clone());
        }
        p
    }

    fn parse(p: &Value, kind: Option<&str>, mentions: &[String], ours: &[&str]) -> Option<Inbound> {
        let me = me();
        let ours: VecDeque<String> = ours.iter().map(|s| (*s).to_owned()).collect();
        let allowed = ["c1".to_owned()];
        parse_post(p, kind, mentions, &Parse { me: Some(&me), allowed: &allowed, ours: &ours })
    }

    #[test]
    fn posts_map_to_inbound_and_threads_stay_threads() {
        let m = parse(&post(json!({})), Some("O"), &[], &[]).unwrap();
        assert_eq!((m.event_id.as_str(), m.chat_id.as_str(), m.user_id.as_str()), ("p1", "c1", "u1"));
        assert_eq!(m.sent_at, Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)));
        assert_eq!((m.chat, m.listed, m.addressed), (ChatKind::Group, true, false));
        let t = parse(&post(json!({"root_id": "r1", "channel_id": "c2"})), Some("P"), &[], &[]).unwrap();
        assert_eq!((t.chat_id.as_str(), t.listed), ("c2/r1", false));
        assert_eq!(split_chat("c2/r1"), ("c2", "r1"));
        assert_eq!(split_chat("c2"), ("c2", ""));
        assert_eq!(parse(&post(json!({})), Some("D"), &[], &[]).unwrap().chat, ChatKind::Direct);
    }

    /// A post's `file_ids` with `metadata.files[]` (the API's FileInfo): each file by its id,
    /// name, type and size; a post of only files is a message; an undescribed file is named by
    /// its id; an id that is no path segment is dropped.
    #[test]
    fn mattermost_posts_carry_their_files() {
        let files = json!({"file_ids": ["f1", "f2", "../x"], "message": "", "metadata": {"files": [
            {"id": "f1", "name": "shot.png", "extension": "png", "size": 1234, "mime_type": "image/png"}]}});
        let m = parse(&post(files), Some("O"), &[], &[]).unwrap();
        assert_eq!(m.text, "");
        let got: Vec<_> =
            m.attachments.iter().map(|a| (a.name.as_str(), a.declared.as_str(), a.size, a.fetch.as_str())).collect();
        assert_eq!(got, [("shot.png", "image/png", Some(1234), "f1"), ("f2", "", None, "f2")]);
        assert!(parse(&post(json!({"message": " "})), Some("O"), &[], &[]).is_none(), "no text and no file");
    }

    #[test]
    fn ours_bots_system_posts_and_garbage_are_not_answered() {
        for extra in [
            json!({"user_id": "botid"}),
            json!({"type": "system_join_channel"}),
            json!({"type": 7}),
            json!({"props": {"from_bot": "true"}}),
            json!({"props": {"from_webhook": "true"}}),
            json!({"delete_at": 5}),
            json!({"message": "  "}),
            json!({"message": 5}),
            json!({"id": ""}),
            json!({"channel_id": "c1/../c2"}),
            json!({"root_id": "../x"}),
            json!({"user_id": null}),
        ] {
            assert!(parse(&post(extra.clone()), Some("O"), &[], &[]).is_none(), "{extra}");
        }
        assert!(parse(&json!("garbage"), None, &[], &[]).is_none());
    }

    #[test]
    fn mentions_and_replies_to_our_posts_address_the_bot() {
        let p = post(json!({}));
        assert!(parse(&p, Some("O"), &["botid".into()], &[]).unwrap().addressed);
        assert!(!parse(&p, Some("O"), &["other".into()], &[]).unwrap().addressed);
        assert!(parse(&post(json!({"message": "hey @GWbot, look"})), Some("O"), &[], &[]).unwrap().addressed);
        assert!(!parse(&post(json!({"message": "hey @gwbot2"})), Some("O"), &[], &[]).unwrap().addressed);
        assert!(!parse(&post(json!({"message": "mail gwbot@x"})), Some("O"), &[], &[]).unwrap().addressed);
        let reply = post(json!({"root_id": "mine"}));
        assert!(parse(&reply, Some("O"), &[], &["mine"]).unwrap().addressed);
        assert!(!parse(&reply, Some("O"), &[], &["other"]).unwrap().addressed);
    }

    #[test]
    fn posted_events_carry_their_post_as_a_string() {
        let inner = post(json!({})).to_string();
        let ev = json!({"event": "posted", "seq": 3, "data": {"post": inner, "channel_type": "D",
                        "mentions": "[\"botid\"]"}, "broadcast": {"channel_id": "c1"}});
        let (p, kind, mentions) = posted(&ev).unwrap();
        assert_eq!((p["id"].as_str(), kind.as_deref(), mentions), (Some("p1"), Some("D"), vec!["botid".to_owned()]));
        for bad in [json!({"data": {"post": "{"}}), json!({"data": {"post": 5}}), json!({"data": {"post": "[1]"}})] {
            assert!(posted(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn answers_are_classified() {
        let s = Duration::from_secs;
        assert_eq!(classify(201, &json!({"id": "x"}), None, "m"), Ok(json!({"id": "x"})));
        assert_eq!(classify(429, &Value::Null, Some(s(3)), "m"), Err(ApiError::RateLimited(Some(s(3)))));
        let body = json!({"id": "api.context.session_expired.app_error", "message": "Invalid or expired session", "status_code": 401});
        assert_eq!(
            classify(401, &body, None, "GET /users/me"),
            Err(ApiError::Auth(
                "GET /users/me: HTTP 401: Invalid or expired session (api.context.session_expired.app_error)".into()
            ))
        );
        assert!(matches!(classify(404, &Value::Null, None, "m"), Err(ApiError::NotFound(_))));
        assert!(matches!(classify(403, &Value::Null, None, "m"), Err(ApiError::Refused(_))));
        assert!(matches!(classify(502, &Value::Null, None, "m"), Err(ApiError::Server(_))));
        assert!(matches!(ApiError::Auth("x".into()).failure(), Failure::Rejected(_)));
        assert_eq!(ApiError::RateLimited(None).send_error(), SendError::RateLimited(None));
        assert_eq!(gone_is_done(Err(ApiError::NotFound("gone".into()))), Ok(()));
        assert_eq!(gone_is_done(Err(ApiError::Refused("no".into()))), Err(SendError::Rejected("no".into())));
    }

    #[test]
    fn urls_and_the_credential_key() {
        assert_eq!(ws_url("https://chat.example.com").as_deref(), Some("wss://chat.example.com/api/v4/websocket"));
        assert_eq!(ws_url("http://127.0.0.1:8065/mm/").as_deref(), Some("ws://127.0.0.1:8065/mm/api/v4/websocket"));
        assert_eq!(ws_url("ftp://x"), None);
        assert_eq!(ws_url("https://"), None);
        let k = credential_key("https://chat.example.com", "secret-token");
        assert!(k.starts_with("chat.example.com/") && k.len() == "chat.example.com/".len() + 16, "{k}");
        assert!(!k.contains("secret"));
        assert_ne!(k, credential_key("https://chat.example.com", "other-token"));
        assert_ne!(k, credential_key("https://other.example.com", "secret-token"));
        assert!(id_ok("abcdefghijklmnopqrstuvwxyz") && !id_ok("../x") && !id_ok(""));
        let text: String = std::iter::repeat_n('é', MAX_TEXT_CHARS + 1).collect();
        assert_eq!(skeleton::pieces(&text, &Proto::LIMITS).len(), 2);
    }
}
