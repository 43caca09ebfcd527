//! A fake Discord for gatewarden's tests and benches: the Gateway (WebSocket, API v10, JSON
//! encoding) and the REST routes a bot replies and shows progress with. Each behaviour
//! modelled cites the public developer documentation (https://discord.com/developers/docs/…,
//! below as `docs/…`):
//!
//! - **Connecting.** `GET /api/v10/gateway/bot` answers the gateway `url` (docs/events/gateway
//!   "Connecting", docs/topics/gateway "Get Gateway Bot"). A connection must ask for `v=10`
//!   and `encoding=json`, else close 4012 "Invalid API version".
//! - **HELLO, IDENTIFY, READY.** The server speaks first with op 10 HELLO and its
//!   `heartbeat_interval`; the client sends op 2 IDENTIFY (`token`, `intents`, `properties`)
//!   and gets the READY dispatch with `session_id`, `resume_gateway_url` and the bot `user`
//!   (docs/events/gateway "Identifying", docs/events/gateway-events "Hello", "Ready").
//! - **Heartbeats.** Every op 1 HEARTBEAT is answered with op 11 HEARTBEAT_ACK; the server may
//!   ask for one with op 1 (docs/events/gateway "Sending Heartbeats"). [`FakeDiscord::set_acks`]
//!   stops the ACKs, to test the client's zombied-connection rule ("If a client does not
//!   receive a heartbeat ACK between its attempts at sending heartbeats … it should terminate
//!   the connection with a non-1000 close code, reconnect, and attempt to Resume").
//! - **Sequence numbers.** Every dispatch (op 0) carries `s`, increasing by one per session
//!   (docs/events/gateway-events "Payload Structure").
//! - **RESUME.** Op 6 with `token`, `session_id` and `seq` on a connection to the
//!   `resume_gateway_url` replays every dispatch after `seq`, in order, then the RESUMED
//!   dispatch (docs/events/gateway "Resuming"). A session whose connection dropped stays
//!   resumable for [`Options::resume_window`] (Discord documents no exact window); past it, or
//!   for an unknown session, the answer is op 9 INVALID_SESSION `d: false`.
//! - **INVALID_SESSION, RECONNECT.** [`FakeDiscord::invalidate`] sends op 9 with `d` =
//!   resumable (docs/events/gateway-events "Invalid Session"; a non-resumable one forgets the
//!   session); [`FakeDiscord::reconnect`] sends op 7 (docs/events/gateway-events "Reconnect").
//! - **Close codes.** A bad token closes with 4004 "Authentication failed", the privileged
//!   message-content intent without [`Options::message_content_enabled`] with 4014
//!   "Disallowed intent(s)", a payload before IDENTIFY with 4003 "Not authenticated", a second
//!   IDENTIFY with 4005 "Already authenticated", bad JSON with 4002 "Decode error", an unknown
//!   op with 4001 (docs/topics/opcodes-and-status-codes "Gateway Close Event Codes").
//!   [`FakeDiscord::close_all`] closes every connection with any code.
//! - **MESSAGE_CREATE.** [`FakeDiscord::message`] dispatches a direct message (no `guild_id`)
//!   and [`FakeDiscord::guild_message`] a guild channel's (with `guild_id`, `mentions` of the
//!   bot, a reply's `referenced_message`) to every live session
//!   (detached ones keep it for their resume), `content` empty unless the session identified
//!   with the MESSAGE_CONTENT intent (docs/events/gateway "Message Content Intent"). Two
//!   sessions of one bot both get every event: Discord does not refuse a second consumer.
//!   A message the bot creates through REST is dispatched too, `author.bot: true`.
//! - **Create Message.** `POST /api/v10/channels/{id}/messages` with `Authorization: Bot
//!   <token>` (docs/resources/message "Create Message"): `content` of 1 to 2,000 characters
//!   (else 400, code 50035 or 50006); `nonce` with `enforce_nonce: true` returns the earlier
//!   message instead of creating a second one within [`Options::nonce_window`] ("checked for
//!   uniqueness in the past few minutes").
//! - **Files in** (https://discord.com/developers/docs/resources/message "Attachment
//!   Object"): [`FakeDiscord::message_with_files`] dispatches a message whose `attachments[]`
//!   carry `id`, `filename`, `content_type`, `size` and a `url` on the fake's own REST port
//!   standing in for the CDN (`/attachments/{channel}/{id}/{filename}?ex=…&is=…&hm=…`, signed
//!   URLs: no token needed). Each download is logged with whether it carried an
//!   `Authorization` header ([`FakeDiscord::downloads`]); a file declared larger than its bytes
//!   is served as it is.
//! - **Files out** (https://discord.com/developers/docs/reference#uploading-files): Create
//!   Message as `multipart/form-data` with `payload_json` (the JSON body: `content` may be
//!   empty when a file comes, `attachments[].id` names `files[n]`, `nonce` and
//!   `enforce_nonce` as above) and `files[n]` parts; each file is logged
//!   ([`FakeDiscord::uploads`]) unless the nonce returned an earlier message. A file over
//!   [`Options::max_upload`] is 413, code 40005 "Request entity too large" (docs/topics/
//!   opcodes-and-status-codes "JSON Error Codes").
//! - **Trigger Typing Indicator.** `POST /api/v10/channels/{id}/typing`, no body, answers 204
//!   (https://discord.com/developers/docs/resources/channel "Trigger Typing Indicator": the
//!   indicator lasts about 10 s or until the bot sends a message; the fake only records it).
//! - **Edit Message.** `PATCH /api/v10/channels/{id}/messages/{message.id}` with `content`
//!   (https://discord.com/developers/docs/resources/message "Edit Message"): the bot's own
//!   message, 1 to 2,000 characters, answered with the updated message object and dispatched as
//!   MESSAGE_UPDATE; any other id is 404, code 10008 "Unknown Message".
//! - **Delete Message.** `DELETE /api/v10/channels/{id}/messages/{message.id}`
//!   (https://discord.com/developers/docs/resources/message "Delete Message"): 204, dispatched as
//!   MESSAGE_DELETE; a message deleted already, or unknown, is 404 code 10008 "Unknown Message"
//!   (docs/topics/opcodes-and-status-codes "JSON Error Codes").
//!   Every REST call is logged ([`FakeDiscord::calls`]), and [`FakeDiscord::fault`] makes a
//!   route's next calls answer a 429 or an HTTP error, for tests of the client's error paths.
//! - **Rate limits.** Per-route buckets keyed by the major parameter (the channel): each of
//!   the four routes above has its own bucket per channel, of [`Options::bucket_limit`] per
//!   [`Options::bucket_window`], with the
//!   `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After` (rounded up to the
//!   millisecond, never before the bucket's own reset) and `-Bucket` headers; an
//!   exhausted bucket answers 429 with `retry_after` (seconds, a float), `global: false`,
//!   `X-RateLimit-Scope: user`; past [`Options::global_per_s`] requests a second, 429 with
//!   `global: true` and `X-RateLimit-Global: true` (docs/topics/rate-limits). A 401 for a bad
//!   token (docs/topics/opcodes-and-status-codes "HTTP Response Codes").
//!
//! Not modelled: sharding, compression, ETF, presence, the server closing a connection that
//! stops heartbeating, and identify's daily `session_start_limit` (reported, never enforced).
//!
//! Both servers run on their own threads; [`FakeDiscord::kill`] drops every connection and
//! stops listening, [`FakeDiscord::revive`] listens again on the same ports with the same
//! sessions (a session survives a dropped connection, as on Discord). The test API is Rust
//! methods, and HTTP under `/_fake/` for scripts and benches (crates/discord-fake/src/main.rs).

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use gatewarden_fakewire::form::{self, FormPart};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT (docs/events/gateway "List of Intents").
pub const INTENT_MESSAGE_CONTENT: u64 = 1 << 15;
/// The fake bot's user id (READY's `user.id`, the author of what it creates).
pub const BOT_USER_ID: &str = "900000000000000001";
/// Discord's epoch for snowflakes (docs/reference "Snowflakes"): 2015-01-01T00:00:00Z in ms.
pub const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
/// Events a detached session keeps for its resume; past it the session is invalidated.
const MAX_SESSION_EVENTS: usize = 10_000;

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The bot token the fake accepts.
    pub token: String,
    /// HELLO's `heartbeat_interval` (Discord: about 41.25 s).
    pub heartbeat_interval: Duration,
    /// How long a session with no connection can be resumed.
    pub resume_window: Duration,
    /// Whether the privileged message-content intent is enabled for the app (the developer
    /// portal's switch); `false`: IDENTIFY with it closes 4014.
    pub message_content_enabled: bool,
    /// Per-route bucket: requests per `bucket_window` for one route in one channel (Create
    /// Message, Edit Message, Delete Message and Trigger Typing Indicator each have their own).
    pub bucket_limit: u32,
    pub bucket_window: Duration,
    /// The global limit (Discord: 50 requests per second per bot).
    pub global_per_s: u32,
    /// How long an enforced nonce is remembered.
    pub nonce_window: Duration,
    /// The largest file Create Message takes (Discord: 10 MiB for a bot, by default).
    pub max_upload: usize,
    /// Where the REST API and the gateway listen (default: ephemeral loopback ports).
    pub rest_addr: SocketAddr,
    pub gateway_addr: SocketAddr,
}

impl Default for Options {
    fn default() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Options {
            token: "fake-bot-token".into(),
            heartbeat_interval: Duration::from_millis(41_250),
            resume_window: Duration::from_secs(120),
            message_content_enabled: true,
            bucket_limit: 5,
            bucket_window: Duration::from_secs(5),
            global_per_s: 50,
            nonce_window: Duration::from_secs(300),
            max_upload: 10 << 20,
            rest_addr: any,
            gateway_addr: any,
        }
    }
}

/// A message the bot created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    pub id: String,
    pub channel_id: String,
    /// Its content now (after any edit).
    pub content: String,
    pub nonce: Option<String>,
    /// Deleted (Delete Message).
    pub deleted: bool,
}

/// A file a user attaches ([`FakeDiscord::message_with_files`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeFile {
    pub filename: String,
    /// `content_type` (omitted when `None`, as Discord does for types it does not know).
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
    /// The `size` declared, when it is not the bytes' length.
    pub declared_size: Option<u64>,
}

/// One download of an attachment from the fake CDN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    /// The path, `/attachments/{channel}/{id}/{filename}`.
    pub path: String,
    /// Whether the request carried an `Authorization` header (the CDN needs none).
    pub authorization: bool,
}

/// One file the bot uploaded with Create Message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The message it was created with.
    pub message_id: String,
    pub channel_id: String,
    pub filename: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
    pub nonce: Option<String>,
}

/// The REST routes of a channel, each with its own rate-limit bucket per channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /channels/{id}/messages`.
    CreateMessage,
    /// `PATCH /channels/{id}/messages/{message.id}`.
    EditMessage,
    /// `DELETE /channels/{id}/messages/{message.id}`.
    DeleteMessage,
    /// `POST /channels/{id}/typing`.
    Typing,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::CreateMessage => "create-message",
            Route::EditMessage => "edit-message",
            Route::DeleteMessage => "delete-message",
            Route::Typing => "typing",
        }
    }
}

/// What [`FakeDiscord::fault`] makes a route answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A 429 of the route's bucket with this `retry_after` (the bucket is exhausted until then).
    Limited(Duration),
    /// This HTTP status (a 5xx: Discord's side failed).
    Status(u16),
}

/// One REST call to a channel route, as the fake saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestCall {
    pub route: Route,
    pub channel: String,
    /// The message created, edited or deleted.
    pub message: Option<String>,
    /// The content sent (Create and Edit Message).
    pub content: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    pub at: Instant,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub identifies: u64,
    pub resumes: u64,
    /// Resumes answered with the replay and RESUMED.
    pub resumed: u64,
    /// Dispatches replayed by resumes.
    pub replayed: u64,
    pub invalid_sessions: u64,
    pub heartbeats: u64,
    /// Connections made to the `resume_gateway_url` (path `/resume`).
    pub resume_url_connects: u64,
    /// Connections open now.
    pub connections: u64,
    /// 429s from a route bucket (faults included), and from the global limit.
    pub limited_route: u64,
    pub limited_global: u64,
    /// Create Message calls that returned an earlier message (enforced nonce).
    pub nonce_hits: u64,
    /// Close codes the fake sent.
    pub closes: Vec<u16>,
    /// The longest a session went without a connection before it was resumed (ms), since
    /// the last reset (`/_fake/stats?reset_gap=1`).
    pub max_resume_gap_ms: u64,
}

/// A command for one live connection.
#[derive(Debug, Clone, Copy)]
enum Cmd {
    Reconnect,
    Invalid(bool),
    Close(u16),
}

struct Session {
    /// Dispatches in order: (s, payload).
    events: Vec<(u64, Value)>,
    next_seq: u64,
    /// The connection attached now.
    conn: Option<u64>,
    detached_at: Option<Instant>,
    content: bool,
}

struct Bucket {
    remaining: u32,
    reset_at: Instant,
}

#[derive(Default)]
struct World {
    sessions: HashMap<String, Session>,
    conns: HashMap<u64, VecDeque<Cmd>>,
    sent: Vec<SentMessage>,
    nonces: HashMap<String, (usize, Instant)>,
    /// Per (route, channel).
    buckets: HashMap<(Route, String), Bucket>,
    global: Option<(Instant, u32)>,
    calls: Vec<RestCall>,
    faults: HashMap<Route, (u32, Fault)>,
    stats: Stats,
    next_id: u64,
    /// The attachments users sent: path -> bytes.
    files: HashMap<String, Vec<u8>>,
    downloads: Vec<Download>,
    uploads: Vec<Upload>,
}

struct Shared {
    opts: Options,
    world: Mutex<World>,
    changed: Condvar,
    acks: AtomicBool,
    /// Bumped by every kill: connections of an older generation end at once.
    generation: AtomicU64,
    conn_ids: AtomicU64,
    gateway_addr: Mutex<SocketAddr>,
    /// The gateway URL announced instead of `ws://<gateway_addr>` (a TLS front's `wss://`).
    public_gateway: Mutex<Option<String>>,
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gateway_url(&self) -> String {
        if let Some(u) = self.public_gateway.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return u;
        }
        format!("ws://{}", self.gateway_addr.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A new snowflake at `now` (docs/reference "Snowflakes": ms since the Discord epoch << 22).
    fn snowflake(w: &mut World) -> String {
        w.next_id += 1;
        let ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        (((ms.saturating_sub(DISCORD_EPOCH_MS)) << 22) | (w.next_id & 0x3f_ffff)).to_string()
    }

    /// Appends a dispatch to every session that can still get it.
    fn dispatch_all(&self, w: &mut World, t: &str, d: &Value) {
        let window = self.opts.resume_window;
        w.sessions
            .retain(|_, s| s.detached_at.is_none_or(|at| at.elapsed() < window) && s.events.len() < MAX_SESSION_EVENTS);
        for s in w.sessions.values_mut() {
            let mut d = d.clone();
            if t == "MESSAGE_CREATE" && !s.content {
                // docs/events/gateway "Message Content Intent": empty without the intent.
                d["content"] = json!("");
            }
            let seq = s.next_seq;
            s.next_seq += 1;
            s.events.push((seq, json!({"op": 0, "t": t, "s": seq, "d": d})));
        }
        self.changed.notify_all();
    }
}

struct Running {
    stop: Arc<AtomicBool>,
    rest: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
    gateway: Option<std::thread::JoinHandle<()>>,
}

/// The fake Discord.
pub struct FakeDiscord {
    shared: Arc<Shared>,
    rest_addr: SocketAddr,
    gateway_addr: SocketAddr,
    running: Mutex<Option<Running>>,
}

impl FakeDiscord {
    pub fn start(opts: Options) -> std::io::Result<FakeDiscord> {
        let rest = TcpListener::bind(opts.rest_addr)?;
        let gateway = TcpListener::bind(opts.gateway_addr)?;
        let (rest_addr, gateway_addr) = (rest.local_addr()?, gateway.local_addr()?);
        let shared = Arc::new(Shared {
            opts,
            world: Mutex::new(World::default()),
            changed: Condvar::new(),
            acks: AtomicBool::new(true),
            generation: AtomicU64::new(0),
            conn_ids: AtomicU64::new(1),
            gateway_addr: Mutex::new(gateway_addr),
            public_gateway: Mutex::new(None),
        });
        let fake = FakeDiscord { shared, rest_addr, gateway_addr, running: Mutex::new(None) };
        fake.serve(rest, gateway)?;
        Ok(fake)
    }

    fn serve(&self, rest: TcpListener, gateway: TcpListener) -> std::io::Result<()> {
        rest.set_nonblocking(true)?;
        gateway.set_nonblocking(true)?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = router(Arc::clone(&self.shared));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let rest_handle = std::thread::Builder::new().name("discord-fake-rest".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(rest) else { return };
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = rx => {}
                }
            });
            drop(rt);
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stop2) = (Arc::clone(&self.shared), Arc::clone(&stop));
        let gw_handle = std::thread::Builder::new()
            .name("discord-fake-gw".into())
            .spawn(move || accept_loop(&shared, &gateway, &stop2))?;
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Running { stop, rest: Some((tx, rest_handle)), gateway: Some(gw_handle) });
        Ok(())
    }

    /// `http://127.0.0.1:<port>/api/v10`, the `api_base` to configure.
    pub fn api_base(&self) -> String {
        format!("http://{}/api/v10", self.rest_addr)
    }

    pub fn rest_addr(&self) -> SocketAddr {
        self.rest_addr
    }

    pub fn gateway_url(&self) -> String {
        self.shared.gateway_url()
    }

    /// Where the gateway listens (for a TLS front).
    pub fn gateway_addr(&self) -> SocketAddr {
        self.gateway_addr
    }

    /// Announces `url` (e.g. a TLS front's `wss://localhost:<port>`) as the gateway and the
    /// resume URL's base.
    pub fn set_public_gateway(&self, url: &str) {
        *self.shared.public_gateway.lock().unwrap_or_else(|p| p.into_inner()) = Some(url.to_owned());
    }

    /// Stops listening and drops every connection at once (no close frame). Sessions, sent
    /// messages and counters are kept for [`FakeDiscord::revive`].
    pub fn kill(&self) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(mut r) = running {
            r.stop.store(true, Ordering::Release);
            if let Some((tx, h)) = r.rest.take() {
                let _ = tx.send(());
                let _ = h.join();
            }
            if let Some(h) = r.gateway.take() {
                let _ = h.join();
            }
        }
    }

    /// Listens again on the same ports.
    pub fn revive(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let bind = |addr| loop {
            match TcpListener::bind(addr) {
                Ok(l) => return Ok(l),
                Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::AddrInUse => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        let rest = bind(self.rest_addr)?;
        let gateway = bind(self.gateway_addr)?;
        self.serve(rest, gateway)
    }

    /// A user's message in `channel`: dispatched as MESSAGE_CREATE to every session. Returns
    /// the message id.
    pub fn message(&self, channel: &str, author: &str, content: &str) -> String {
        let mut w = self.shared.world();
        let id = Shared::snowflake(&mut w);
        let d = message_object(&id, channel, author, false, content, None);
        self.shared.dispatch_all(&mut w, "MESSAGE_CREATE", &d);
        id
    }

    /// A user's message in `channel` of guild `guild` (a guild text channel, not a DM): the
    /// MESSAGE_CREATE carries `guild_id`; with `mention`, `mentions` names the bot and the
    /// content starts `<@BOT_USER_ID>`; `reply_to`, a message of the bot, makes it a reply
    /// (`message_reference` and `referenced_message`, docs/resources/message "Message Object").
    pub fn guild_message(
        &self,
        guild: &str,
        channel: &str,
        author: &str,
        content: &str,
        mention: bool,
        reply_to: Option<&str>,
    ) -> String {
        let mut w = self.shared.world();
        let id = Shared::snowflake(&mut w);
        let text = if mention { format!("<@{BOT_USER_ID}> {content}") } else { content.to_owned() };
        let mut d = message_object(&id, channel, author, false, &text, None);
        d["guild_id"] = json!(guild);
        d["mentions"] =
            if mention { json!([{"id": BOT_USER_ID, "username": "fakebot", "bot": true}]) } else { json!([]) };
        if let Some(r) = reply_to {
            let replied = w.sent.iter().find(|m| m.id == r).map(|m| m.content.clone()).unwrap_or_default();
            d["message_reference"] = json!({"message_id": r, "channel_id": channel, "guild_id": guild});
            d["referenced_message"] = message_object(r, channel, BOT_USER_ID, true, &replied, None);
        }
        self.shared.dispatch_all(&mut w, "MESSAGE_CREATE", &d);
        id
    }

    /// A user's message in `channel` with `files` as its `attachments[]` (module notes), as
    /// MESSAGE_CREATE to every session. Returns the message id.
    pub fn message_with_files(&self, channel: &str, author: &str, content: &str, files: Vec<FakeFile>) -> String {
        let mut w = self.shared.world();
        let id = Shared::snowflake(&mut w);
        let mut d = message_object(&id, channel, author, false, content, None);
        let base = format!("http://{}", self.rest_addr);
        let mut list = Vec::new();
        for f in files {
            let aid = Shared::snowflake(&mut w);
            let path = format!("/attachments/{channel}/{aid}/{}", f.filename);
            let mut a = json!({
                "id": aid, "filename": f.filename,
                "size": f.declared_size.unwrap_or(f.bytes.len() as u64),
                "url": format!("{base}{path}?ex=67a1b2c3&is=67a06143&hm=0f1e2d"),
                "proxy_url": format!("{base}{path}?ex=67a1b2c3&is=67a06143&hm=0f1e2d&proxy=1"),
            });
            if let Some(t) = &f.content_type {
                a["content_type"] = json!(t);
            }
            w.files.insert(path, f.bytes);
            list.push(a);
        }
        d["attachments"] = Value::Array(list);
        self.shared.dispatch_all(&mut w, "MESSAGE_CREATE", &d);
        id
    }

    /// Every attachment download so far, in order.
    pub fn downloads(&self) -> Vec<Download> {
        self.shared.world().downloads.clone()
    }

    /// Every file the bot uploaded, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.world().uploads.clone()
    }

    /// Whether heartbeats are acknowledged (op 11).
    pub fn set_acks(&self, on: bool) {
        self.shared.acks.store(on, Ordering::Release);
    }

    fn command(&self, cmd: Cmd) {
        let mut w = self.shared.world();
        for q in w.conns.values_mut() {
            q.push_back(cmd);
        }
    }

    /// Op 7 RECONNECT to every connection.
    pub fn reconnect(&self) {
        self.command(Cmd::Reconnect);
    }

    /// Op 9 INVALID_SESSION to every connection; `resumable: false` forgets the sessions.
    pub fn invalidate(&self, resumable: bool) {
        self.command(Cmd::Invalid(resumable));
    }

    /// Closes every connection with `code`.
    pub fn close_all(&self, code: u16) {
        self.command(Cmd::Close(code));
    }

    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.world().sent.clone()
    }

    pub fn stats(&self) -> Stats {
        self.shared.world().stats.clone()
    }

    /// Every REST call to a channel route so far, in order.
    pub fn calls(&self) -> Vec<RestCall> {
        self.shared.world().calls.clone()
    }

    /// Waits until `pred(calls)` holds, up to `timeout`; the calls either way.
    pub fn wait_calls(
        &self,
        timeout: Duration,
        pred: impl Fn(&[RestCall]) -> bool,
    ) -> Result<Vec<RestCall>, Vec<RestCall>> {
        self.wait(timeout, |w| pred(&w.calls).then(|| w.calls.clone())).map_err(|()| self.calls())
    }

    /// The next `calls` requests to `route` (any channel) are answered with `fault`, after the
    /// global limit and the route's bucket are counted.
    pub fn fault(&self, route: Route, calls: u32, fault: Fault) {
        self.shared.world().faults.insert(route, (calls, fault));
    }

    /// Waits until `pred(stats)` holds, up to `timeout`.
    pub fn wait_stats(&self, timeout: Duration, pred: impl Fn(&Stats) -> bool) -> Result<Stats, Stats> {
        self.wait(timeout, |w| pred(&w.stats).then(|| w.stats.clone())).map_err(|()| self.stats())
    }

    /// Waits until `pred(sent)` holds, up to `timeout`; the messages either way.
    pub fn wait_sent(
        &self,
        timeout: Duration,
        pred: impl Fn(&[SentMessage]) -> bool,
    ) -> Result<Vec<SentMessage>, Vec<SentMessage>> {
        self.wait(timeout, |w| pred(&w.sent).then(|| w.sent.clone())).map_err(|()| self.sent())
    }

    fn wait<T>(&self, timeout: Duration, f: impl Fn(&World) -> Option<T>) -> Result<T, ()> {
        let end = Instant::now() + timeout;
        let mut w = self.shared.world();
        loop {
            if let Some(t) = f(&w) {
                return Ok(t);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(());
            }
            w = self
                .shared
                .changed
                .wait_timeout(w, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A message object (docs/resources/message "Message Object"), as far as a bot reads it.
fn message_object(id: &str, channel: &str, author: &str, bot: bool, content: &str, nonce: Option<&str>) -> Value {
    let mut m = json!({
        "id": id,
        "channel_id": channel,
        "author": {"id": author, "username": format!("user{author}"), "bot": bot},
        "content": content,
        "timestamp": gatewarden_now_iso(),
        "type": 0,
    });
    if let Some(n) = nonce {
        m["nonce"] = json!(n);
    }
    m
}

/// ISO 8601 of now.
fn gatewarden_now_iso() -> String {
    gatewarden_lifecycle::timefmt::format(SystemTime::now())
}

// ---------------------------------------------------------------------------------------------
// The gateway.

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, stop: &AtomicBool) {
    let generation = shared.generation.load(Ordering::Acquire);
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let shared = Arc::clone(shared);
                let _ = std::thread::Builder::new()
                    .name("discord-fake-conn".into())
                    .spawn(move || connection(&shared, stream, generation));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// One gateway connection, from the upgrade to its end.
fn connection(shared: &Arc<Shared>, stream: TcpStream, generation: u64) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut query = String::new();
    let mut path = String::new();
    // The error type is tungstenite's handshake callback signature, not ours to shrink.
    #[allow(clippy::result_large_err)]
    let callback = |req: &tungstenite::handshake::server::Request, resp| {
        query = req.uri().query().unwrap_or_default().to_owned();
        path = req.uri().path().to_owned();
        Ok(resp)
    };
    let Ok(mut ws) = tungstenite::accept_hdr(stream, callback) else { return };
    let _ = ws.get_ref().set_read_timeout(Some(Duration::from_millis(10)));
    let id = shared.conn_ids.fetch_add(1, Ordering::AcqRel);
    {
        let mut w = shared.world();
        w.conns.insert(id, VecDeque::new());
        w.stats.connections += 1;
        if path == "/resume" {
            w.stats.resume_url_connects += 1;
        }
    }
    let mut conn = Conn { shared, ws: &mut ws, id, session: None, sent_seq: 0, generation };
    if !(query.contains("v=10") && query.contains("encoding=json")) {
        conn.close(4012, "Invalid API version");
    } else {
        conn.run();
    }
    let mut w = shared.world();
    w.conns.remove(&id);
    w.stats.connections -= 1;
    if let Some(s) = conn.session.as_ref().and_then(|sid| w.sessions.get_mut(sid))
        && s.conn == Some(id)
    {
        s.conn = None;
        s.detached_at = Some(Instant::now());
    }
}

struct Conn<'a> {
    shared: &'a Shared,
    ws: &'a mut WebSocket<TcpStream>,
    id: u64,
    session: Option<String>,
    /// The last `s` written to this connection.
    sent_seq: u64,
    generation: u64,
}

enum Next {
    Go,
    End,
}

impl Conn<'_> {
    fn send(&mut self, v: &Value) -> bool {
        self.ws.send(Message::text(v.to_string())).is_ok()
    }

    fn close(&mut self, code: u16, reason: &str) {
        self.shared.world().stats.closes.push(code);
        let frame = CloseFrame { code: CloseCode::from(code), reason: reason.to_owned().into() };
        let _ = self.ws.close(Some(frame));
        // Flush the close frame, then wait briefly for the client's.
        let end = Instant::now() + Duration::from_millis(500);
        while Instant::now() < end {
            match self.ws.read() {
                Err(tungstenite::Error::Io(e)) if is_timeout(&e) => {}
                Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    fn run(&mut self) {
        let interval = self.shared.opts.heartbeat_interval.as_millis() as u64;
        if !self.send(&json!({"op": 10, "d": {"heartbeat_interval": interval}, "s": null, "t": null})) {
            return;
        }
        loop {
            if self.shared.generation.load(Ordering::Acquire) != self.generation {
                return; // killed: drop without a close frame
            }
            if let Next::End = self.commands() {
                return;
            }
            if let Next::End = self.push_events() {
                return;
            }
            match self.ws.read() {
                Ok(Message::Text(t)) => {
                    if let Next::End = self.payload(t.as_str()) {
                        return;
                    }
                }
                Ok(Message::Close(_))
                | Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    return;
                }
                Ok(Message::Binary(_)) => {
                    self.close(4002, "Decode error");
                    return;
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) if is_timeout(&e) => {}
                Err(_) => return,
            }
        }
    }

    fn commands(&mut self) -> Next {
        let cmd = self.shared.world().conns.get_mut(&self.id).and_then(VecDeque::pop_front);
        match cmd {
            None => Next::Go,
            Some(Cmd::Reconnect) => {
                self.send(&json!({"op": 7, "d": null, "s": null, "t": null}));
                Next::Go
            }
            Some(Cmd::Invalid(resumable)) => {
                {
                    let mut w = self.shared.world();
                    w.stats.invalid_sessions += 1;
                    if !resumable && let Some(sid) = self.session.take() {
                        w.sessions.remove(&sid);
                    }
                }
                self.send(&json!({"op": 9, "d": resumable, "s": null, "t": null}));
                Next::Go
            }
            Some(Cmd::Close(code)) => {
                self.close(code, "closed by the test");
                Next::End
            }
        }
    }

    /// Writes the attached session's dispatches this connection has not written yet.
    fn push_events(&mut self) -> Next {
        let Some(sid) = self.session.clone() else { return Next::Go };
        let fresh: Vec<(u64, Value)> = {
            let w = self.shared.world();
            match w.sessions.get(&sid) {
                Some(s) if s.conn == Some(self.id) => {
                    s.events.iter().filter(|(seq, _)| *seq > self.sent_seq).cloned().collect()
                }
                // Another connection resumed the session: this one is done.
                _ => return Next::End,
            }
        };
        for (seq, ev) in fresh {
            if !self.send(&ev) {
                return Next::End;
            }
            self.sent_seq = seq;
        }
        Next::Go
    }

    fn payload(&mut self, text: &str) -> Next {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            self.close(4002, "Decode error");
            return Next::End;
        };
        match v["op"].as_u64() {
            Some(1) => {
                self.shared.world().stats.heartbeats += 1;
                if self.shared.acks.load(Ordering::Acquire) {
                    self.send(&json!({"op": 11, "d": null, "s": null, "t": null}));
                }
                Next::Go
            }
            Some(2) => self.identify(&v["d"]),
            Some(6) => self.resume(&v["d"]),
            Some(_) if self.session.is_none() => {
                self.close(4003, "Not authenticated");
                Next::End
            }
            // Presence, voice state, request members: accepted, not modelled.
            Some(3 | 4 | 8) => Next::Go,
            _ => {
                self.close(4001, "Unknown opcode");
                Next::End
            }
        }
    }

    fn identify(&mut self, d: &Value) -> Next {
        if self.session.is_some() {
            self.close(4005, "Already authenticated");
            return Next::End;
        }
        if d["token"].as_str() != Some(self.shared.opts.token.as_str()) {
            self.close(4004, "Authentication failed");
            return Next::End;
        }
        let intents = d["intents"].as_u64().unwrap_or(0);
        let content = intents & INTENT_MESSAGE_CONTENT != 0;
        if content && !self.shared.opts.message_content_enabled {
            self.close(4014, "Disallowed intent(s)");
            return Next::End;
        }
        let mut w = self.shared.world();
        w.stats.identifies += 1;
        let sid = format!("fake{:016x}", Shared::snowflake(&mut w).parse::<u64>().unwrap_or(0));
        let ready = json!({
            "v": 10,
            "user": {"id": BOT_USER_ID, "username": "fakebot", "bot": true},
            "guilds": [],
            "session_id": sid,
            "resume_gateway_url": format!("{}/resume", self.shared.gateway_url()),
            "application": {"id": BOT_USER_ID},
        });
        let session = Session {
            events: vec![(1, json!({"op": 0, "t": "READY", "s": 1, "d": ready}))],
            next_seq: 2,
            conn: Some(self.id),
            detached_at: None,
            content,
        };
        w.sessions.insert(sid.clone(), session);
        self.session = Some(sid);
        self.sent_seq = 0;
        Next::Go
    }

    fn resume(&mut self, d: &Value) -> Next {
        if self.session.is_some() {
            self.close(4005, "Already authenticated");
            return Next::End;
        }
        if d["token"].as_str() != Some(self.shared.opts.token.as_str()) {
            self.close(4004, "Authentication failed");
            return Next::End;
        }
        let sid = d["session_id"].as_str().unwrap_or_default().to_owned();
        let seq = d["seq"].as_u64().unwrap_or(0);
        let window = self.shared.opts.resume_window;
        let mut w = self.shared.world();
        w.stats.resumes += 1;
        let ok = match w.sessions.get_mut(&sid) {
            Some(s) if s.detached_at.is_none_or(|at| at.elapsed() < window) && seq < s.next_seq => {
                // A connection still attached loses the session (it ends at its next look).
                let gap = s.detached_at.map_or(0, |at| at.elapsed().as_millis() as u64);
                s.conn = Some(self.id);
                s.detached_at = None;
                let replay = s.events.iter().filter(|(n, _)| *n > seq).count() as u64;
                let resumed = s.next_seq;
                s.next_seq += 1;
                s.events.push((resumed, json!({"op": 0, "t": "RESUMED", "s": resumed, "d": null})));
                Some((replay, gap))
            }
            _ => None,
        };
        match ok {
            Some((replay, gap)) => {
                w.stats.max_resume_gap_ms = w.stats.max_resume_gap_ms.max(gap);
                w.stats.resumed += 1;
                w.stats.replayed += replay;
                self.session = Some(sid);
                self.sent_seq = seq;
                Next::Go
            }
            None => {
                w.sessions.remove(&sid);
                w.stats.invalid_sessions += 1;
                drop(w);
                self.send(&json!({"op": 9, "d": false, "s": null, "t": null}));
                Next::Go
            }
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

// ---------------------------------------------------------------------------------------------
// REST.

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v10/gateway/bot", get(gateway_bot))
        .route("/api/v10/channels/{channel}/messages", post(create_message))
        .route("/api/v10/channels/{channel}/messages/{message}", patch(edit_message).delete(delete_message))
        .route("/api/v10/channels/{channel}/typing", post(trigger_typing))
        .route("/attachments/{channel}/{id}/{filename}", get(attachment))
        .route("/_fake/inject", post(inject))
        .route("/_fake/sent", get(sent))
        .route("/_fake/stats", get(stats))
        .with_state(shared)
}

fn error(status: StatusCode, code: u32, message: &str) -> Response {
    (status, [("content-type", "application/json")], json!({"code": code, "message": message}).to_string())
        .into_response()
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let want = format!("Bot {}", shared.opts.token);
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
}

async fn gateway_bot(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let body = json!({
        "url": shared.gateway_url(),
        "shards": 1,
        "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1},
    });
    (StatusCode::OK, [("content-type", "application/json")], body.to_string()).into_response()
}

fn limited(retry_after: Duration, global: bool) -> Response {
    let secs = retry_after.as_secs_f64().max(0.001);
    let body = json!({"message": "You are being rate limited.", "retry_after": secs, "global": global});
    let mut r =
        (StatusCode::TOO_MANY_REQUESTS, [("content-type", "application/json")], body.to_string()).into_response();
    let h = r.headers_mut();
    h.insert("retry-after", HeaderValue::from(secs.ceil() as u64));
    h.insert("x-ratelimit-scope", HeaderValue::from_static(if global { "global" } else { "user" }));
    if global {
        h.insert("x-ratelimit-global", HeaderValue::from_static("true"));
    }
    r
}

async fn create_message(
    State(shared): State<Arc<Shared>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let opts = &shared.opts;
    let mut w = shared.world();
    let (remaining, reset_after) = match admit(&shared, &mut w, Route::CreateMessage, &channel, None) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let ctype = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    // docs/reference "Uploading Files": the JSON body goes in `payload_json`, files in `files[n]`.
    let (json_body, files) = if ctype.starts_with("multipart/form-data") {
        let Some(parts) = form::parse(&ctype, &body) else {
            return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
        };
        let payload = parts.iter().find(|p| p.name == "payload_json").map(|p| p.bytes.clone()).unwrap_or_default();
        let files: Vec<FormPart> =
            parts.into_iter().filter(|p| p.name.starts_with("files[") && p.filename.is_some()).collect();
        (payload, files)
    } else {
        (body.to_vec(), Vec::new())
    };
    let Ok(v) = serde_json::from_slice::<Value>(&json_body) else {
        return error(StatusCode::BAD_REQUEST, 50109, "The request body contains invalid JSON.");
    };
    if channel.parse::<u64>().is_err() {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    }
    if files.iter().any(|f| f.bytes.len() > opts.max_upload) {
        log(&mut w, Route::CreateMessage, &channel, None, None, 413);
        shared.changed.notify_all();
        return error(StatusCode::PAYLOAD_TOO_LARGE, 40005, "Request entity too large");
    }
    let content = v["content"].as_str().unwrap_or_default().to_owned();
    if content.is_empty() && files.is_empty() {
        return error(StatusCode::BAD_REQUEST, 50006, "Cannot send an empty message");
    }
    if content.chars().count() > 2000 {
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length.");
    }
    let nonce = match &v["nonce"] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let enforce = v["enforce_nonce"].as_bool() == Some(true);
    let window = opts.nonce_window;
    let now = Instant::now();
    w.nonces.retain(|_, (_, at)| at.elapsed() < window);
    let earlier = nonce.as_ref().filter(|_| enforce).and_then(|n| w.nonces.get(n)).map(|(i, _)| *i);
    let msg = match earlier.and_then(|i| w.sent.get(i).cloned()) {
        Some(m) => {
            w.stats.nonce_hits += 1;
            m
        }
        None => {
            let id = Shared::snowflake(&mut w);
            let m = SentMessage {
                id: id.clone(),
                channel_id: channel.clone(),
                content: content.clone(),
                nonce: nonce.clone(),
                deleted: false,
            };
            if let (Some(n), true) = (&nonce, enforce) {
                let index = w.sent.len();
                w.nonces.insert(n.clone(), (index, now));
            }
            w.sent.push(m.clone());
            for FormPart { filename, content_type: ctype, bytes, .. } in &files {
                let upload = Upload {
                    message_id: id.clone(),
                    channel_id: channel.clone(),
                    filename: filename.clone().unwrap_or_default(),
                    content_type: ctype.clone(),
                    bytes: bytes.clone(),
                    nonce: nonce.clone(),
                };
                w.uploads.push(upload);
            }
            // The bot's own message comes back through the gateway too.
            let d = message_object(&id, &channel, BOT_USER_ID, true, &content, nonce.as_deref());
            shared.dispatch_all(&mut w, "MESSAGE_CREATE", &d);
            m
        }
    };
    log(&mut w, Route::CreateMessage, &channel, Some(&msg.id), Some(&content), 200);
    shared.changed.notify_all();
    let obj = message_object(&msg.id, &msg.channel_id, BOT_USER_ID, true, &msg.content, msg.nonce.as_deref());
    let mut r = (StatusCode::OK, [("content-type", "application/json")], obj.to_string()).into_response();
    bucket_headers(r.headers_mut(), opts.bucket_limit, remaining, reset_after, Route::CreateMessage);
    r
}

fn log(w: &mut World, route: Route, channel: &str, message: Option<&str>, content: Option<&str>, status: u16) {
    let call = RestCall {
        route,
        channel: channel.to_owned(),
        message: message.map(str::to_owned),
        content: content.map(str::to_owned),
        status,
        at: Instant::now(),
    };
    w.calls.push(call);
}

/// Counts one request to `route` in `channel` against the global limit, then the route's
/// bucket (docs/topics/rate-limits), then the test's [`Fault`]: the bucket's `(remaining,
/// reset_after)` for the headers, or the answer that refuses it (logged).
fn admit(
    shared: &Shared,
    w: &mut World,
    route: Route,
    channel: &str,
    message: Option<&str>,
) -> Result<(u32, Duration), Box<Response>> {
    let opts = &shared.opts;
    let now = Instant::now();
    // The global limit first (docs/topics/rate-limits "Global Rate Limit").
    let (start, count) = w.global.filter(|(t, _)| now.duration_since(*t) < Duration::from_secs(1)).unwrap_or((now, 0));
    if count >= opts.global_per_s {
        w.stats.limited_global += 1;
        log(w, route, channel, message, None, 429);
        shared.changed.notify_all();
        return Err(Box::new(limited(Duration::from_secs(1).saturating_sub(now.duration_since(start)), true)));
    }
    w.global = Some((start, count + 1));
    // The route's bucket, keyed by its major parameter.
    let fault = w.faults.get_mut(&route).filter(|(n, _)| *n > 0).map(|(n, f)| {
        *n -= 1;
        *f
    });
    let bucket = w
        .buckets
        .entry((route, channel.to_owned()))
        .or_insert(Bucket { remaining: opts.bucket_limit, reset_at: now + opts.bucket_window });
    if now >= bucket.reset_at {
        *bucket = Bucket { remaining: opts.bucket_limit, reset_at: now + opts.bucket_window };
    }
    if let Some(Fault::Limited(d)) = fault {
        bucket.remaining = 0;
        bucket.reset_at = bucket.reset_at.max(now + d);
    }
    let reset_after = bucket.reset_at.saturating_duration_since(now);
    if bucket.remaining == 0 {
        w.stats.limited_route += 1;
        log(w, route, channel, message, None, 429);
        shared.changed.notify_all();
        let mut r = limited(reset_after, false);
        bucket_headers(r.headers_mut(), opts.bucket_limit, 0, reset_after, route);
        return Err(Box::new(r));
    }
    bucket.remaining -= 1;
    let remaining = bucket.remaining;
    if let Some(Fault::Status(code)) = fault {
        log(w, route, channel, message, None, code);
        shared.changed.notify_all();
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Err(Box::new(error(status, 0, "500: Internal Server Error")));
    }
    Ok((remaining, reset_after))
}

/// The bot's own message `message` in `channel`, if it exists and is not deleted.
fn own_message<'a>(w: &'a mut World, channel: &str, message: &str) -> Option<&'a mut SentMessage> {
    w.sent.iter_mut().find(|m| m.id == message && m.channel_id == channel && !m.deleted)
}

async fn edit_message(
    State(shared): State<Arc<Shared>>,
    Path((channel, message)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let mut w = shared.world();
    let (remaining, reset_after) = match admit(&shared, &mut w, Route::EditMessage, &channel, Some(&message)) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, 50109, "The request body contains invalid JSON.");
    };
    let content = v["content"].as_str().unwrap_or_default().to_owned();
    if content.is_empty() {
        return error(StatusCode::BAD_REQUEST, 50006, "Cannot send an empty message");
    }
    if content.chars().count() > 2000 {
        return error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length.");
    }
    let Some(m) = own_message(&mut w, &channel, &message) else {
        log(&mut w, Route::EditMessage, &channel, Some(&message), Some(&content), 404);
        shared.changed.notify_all();
        return error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
    };
    m.content.clone_from(&content);
    let nonce = m.nonce.clone();
    let obj = message_object(&message, &channel, BOT_USER_ID, true, &content, nonce.as_deref());
    shared.dispatch_all(&mut w, "MESSAGE_UPDATE", &obj);
    log(&mut w, Route::EditMessage, &channel, Some(&message), Some(&content), 200);
    shared.changed.notify_all();
    let mut r = (StatusCode::OK, [("content-type", "application/json")], obj.to_string()).into_response();
    bucket_headers(r.headers_mut(), shared.opts.bucket_limit, remaining, reset_after, Route::EditMessage);
    r
}

async fn delete_message(
    State(shared): State<Arc<Shared>>,
    Path((channel, message)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let mut w = shared.world();
    let (remaining, reset_after) = match admit(&shared, &mut w, Route::DeleteMessage, &channel, Some(&message)) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let Some(m) = own_message(&mut w, &channel, &message) else {
        log(&mut w, Route::DeleteMessage, &channel, Some(&message), None, 404);
        shared.changed.notify_all();
        return error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
    };
    m.deleted = true;
    shared.dispatch_all(&mut w, "MESSAGE_DELETE", &json!({"id": message, "channel_id": channel}));
    log(&mut w, Route::DeleteMessage, &channel, Some(&message), None, 204);
    shared.changed.notify_all();
    let mut r = StatusCode::NO_CONTENT.into_response();
    bucket_headers(r.headers_mut(), shared.opts.bucket_limit, remaining, reset_after, Route::DeleteMessage);
    r
}

async fn trigger_typing(
    State(shared): State<Arc<Shared>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let mut w = shared.world();
    let (remaining, reset_after) = match admit(&shared, &mut w, Route::Typing, &channel, None) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if channel.parse::<u64>().is_err() {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    }
    log(&mut w, Route::Typing, &channel, None, None, 204);
    shared.changed.notify_all();
    let mut r = StatusCode::NO_CONTENT.into_response();
    bucket_headers(r.headers_mut(), shared.opts.bucket_limit, remaining, reset_after, Route::Typing);
    r
}

/// The fake CDN: an attachment's bytes, to anyone with its URL (the query is its signature; the
/// fake does not check it). Logs whether a token came along.
async fn attachment(
    State(shared): State<Arc<Shared>>,
    Path((channel, id, filename)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/attachments/{channel}/{id}/{filename}");
    let mut w = shared.world();
    let Some(bytes) = w.files.get(&path).cloned() else {
        return (StatusCode::NOT_FOUND, "Not Found").into_response();
    };
    w.downloads.push(Download { path, authorization: headers.contains_key("authorization") });
    shared.changed.notify_all();
    (StatusCode::OK, [("content-type", "application/octet-stream")], bytes).into_response()
}

/// docs/topics/rate-limits "Header Format".
fn bucket_headers(h: &mut HeaderMap, limit: u32, remaining: u32, reset_after: Duration, route: Route) {
    let reset = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default() + reset_after;
    h.insert("x-ratelimit-limit", HeaderValue::from(limit));
    h.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
    if let Ok(v) = HeaderValue::from_str(&millis_up(reset)) {
        h.insert("x-ratelimit-reset", v);
    }
    if let Ok(v) = HeaderValue::from_str(&millis_up(reset_after)) {
        h.insert("x-ratelimit-reset-after", v);
    }
    // One bucket hash per route shape; the channel makes it per resource (the major parameter).
    if let Ok(v) = HeaderValue::from_str(route.name()) {
        h.insert("x-ratelimit-bucket", v);
    }
}

/// Seconds with three decimals, rounded up to the millisecond: the headers never name a reset
/// before the bucket's own. Rounded to the nearest, a client that waits exactly what they say
/// could come up to 0.5 ms early and be refused with a 429 (a client on an idle machine answers
/// well within that; crates/platforms/tests/discord_fake.rs counts such 429s).
fn millis_up(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

async fn inject(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (Some(channel), Some(author), Some(content)) =
        (v["channel_id"].as_str(), v["author_id"].as_str(), v["content"].as_str())
    else {
        return error(StatusCode::BAD_REQUEST, 0, "need channel_id, author_id, content");
    };
    let mut w = shared.world();
    let id = Shared::snowflake(&mut w);
    let d = message_object(&id, channel, author, false, content, None);
    shared.dispatch_all(&mut w, "MESSAGE_CREATE", &d);
    (StatusCode::OK, json!({"id": id}).to_string()).into_response()
}

async fn sent(State(shared): State<Arc<Shared>>) -> Response {
    let list: Vec<Value> = shared
        .world()
        .sent
        .iter()
        .map(|m| json!({"id": m.id, "channel_id": m.channel_id, "content": m.content, "deleted": m.deleted}))
        .collect();
    (StatusCode::OK, Value::Array(list).to_string()).into_response()
}

async fn stats(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let s = {
        let mut w = shared.world();
        let s = w.stats.clone();
        if q.contains_key("reset_gap") {
            w.stats.max_resume_gap_ms = 0;
        }
        s
    };
    let body = json!({
        "identifies": s.identifies, "resumes": s.resumes, "resumed": s.resumed, "replayed": s.replayed,
        "invalid_sessions": s.invalid_sessions, "connections": s.connections,
        "limited_route": s.limited_route, "limited_global": s.limited_global,
        "max_resume_gap_ms": s.max_resume_gap_ms,
    });
    (StatusCode::OK, body.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header's reset is never earlier than the bucket's, and at most a millisecond later.
    #[test]
    fn reset_headers_round_up_to_the_millisecond() {
        for (d, want) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_nanos(1), "0.001"),
            (Duration::from_micros(499_400), "0.500"),
            (Duration::from_micros(499_600), "0.500"),
            (Duration::from_millis(500), "0.500"),
            (Duration::from_micros(1_999_001), "2.000"),
            (Duration::from_secs(1_764_921_600) + Duration::from_micros(1), "1764921600.001"),
        ] {
            assert_eq!(millis_up(d), want, "{d:?}");
        }
        let mut h = HeaderMap::new();
        let after = Duration::from_micros(499_400);
        bucket_headers(&mut h, 2, 0, after, Route::CreateMessage);
        let secs = |name: &str| h[name].to_str().ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        assert!(secs("x-ratelimit-reset-after") >= after.as_secs_f64(), "{h:?}");
    }
}
