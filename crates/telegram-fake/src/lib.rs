//! A fake Telegram Bot API server, faithful to the semantics gatewarden's lifecycle depends on
//! (https://core.telegram.org/bots/api#getupdates; the reference notes are in the repository's
//! crates/platforms/README.md):
//!
//! - **Long polls.** `getUpdates` blocks up to `timeout` seconds until an update arrives.
//! - **Offset confirmation.** Updates below `offset` are confirmed and forgotten; a negative
//!   offset keeps the last `-offset` updates.
//! - **Single consumer.** A new `getUpdates` ends the in-flight one with 409 "Conflict:
//!   terminated by other getUpdates request; make sure that only one bot instance is running".
//! - **Lingering sessions.** A poll whose client went away stays held for [`Options::linger`]
//!   (Telegram: about 30 s): a `getUpdates` in that window gets that 409.
//! - **Webhooks.** While a webhook is set, `getUpdates` gets 409 "Conflict: can't use
//!   getUpdates method while webhook is active; use deleteWebhook to delete the webhook first".
//! - **Flood control.** [`FakeTelegram::flood`] makes the next calls answer 429 with
//!   `parameters.retry_after`.
//! - `sendMessage` (logged for [`FakeTelegram::sent`]), `getMe`, `setWebhook`,
//!   `deleteWebhook`, `getWebhookInfo` (`pending_update_count`).
//! - **Chats** (https://core.telegram.org/bots/api#chat, #message, #messageentity):
//!   [`FakeTelegram::inject`] writes in a `private` chat, [`FakeTelegram::inject_group`] in a
//!   `supergroup`, where each `@word` of the text comes as a `mention` entity (UTF-16 offsets)
//!   and a reply to the bot's message carries `reply_to_message` with the bot as `from`;
//!   `getMe` answers the bot's id (the token's first part) and `username`
//!   ([`FakeTelegram::username`]).
//! - **Showing work** (https://core.telegram.org/bots/api#sendchataction,
//!   #editmessagetext, #deletemessage): `sendChatAction` takes one of the documented actions
//!   (logged with its time, [`FakeTelegram::actions`]); `editMessageText` edits a message the
//!   bot sent in that chat (logged, [`FakeTelegram::edits`]), answering 400 "Bad Request:
//!   message is not modified: …" when the text is unchanged and "Bad Request: message to edit
//!   not found" for an unknown or deleted one; `deleteMessage` deletes one
//!   ("Bad Request: message to delete not found" otherwise). [`FakeTelegram::visible`] is the
//!   chat as a user sees it: the bot's messages not deleted, with their current text.
//! - **The command menu** (https://core.telegram.org/bots/api#setmycommands, #getmycommands,
//!   #botcommandscope): `setMyCommands` stores up to 100 commands per scope (`default`,
//!   `all_private_chats`, `all_group_chats`, `all_chat_administrators`, `chat` with
//!   `chat_id`), each command 1-32 characters of lowercase letters, digits and underscores
//!   and a description of 1-256 characters (400 otherwise); `getMyCommands` returns a scope's
//!   list (empty when unset). Each set is logged ([`FakeTelegram::command_sets`]).
//! - **Per-method flood control**: [`FakeTelegram::flood_method`] makes the next calls of
//!   one method answer 429 with `retry_after` (Telegram limits edits and messages per chat).
//!
//! - **Files in** (https://core.telegram.org/bots/api#getfile, #file, #photosize, #document,
//!   #voice, #audio, #videonote): [`FakeTelegram::inject_media`] sends a `photo` (two sizes,
//!   the larger one the file), `document`, `voice`, `audio` or `video_note` with an optional
//!   `caption`; `getFile` answers `{file_id, file_unique_id, file_size, file_path}` ("Bad
//!   Request: file is too big" past 20 MB, the Bot API's download limit), and
//!   `GET /file/bot<token>/<file_path>` serves the bytes (logged, [`FakeTelegram::downloads`]);
//!   a file injected with `stall` sends its first bytes and then nothing, forever.
//! - **Files out** (https://core.telegram.org/bots/api#sendphoto, #senddocument,
//!   #sending-files): `sendPhoto` and `sendDocument` take `multipart/form-data` with the file
//!   in the `photo` / `document` field (logged, [`FakeTelegram::files`]); a photo over 10 MB
//!   is refused "Bad Request: PHOTO_INVALID_DIMENSIONS"-style with 400.
//! - **Consumers told apart.** `<base>/c/<consumer>` is the same API as `<base>`, with every
//!   `getUpdates` logged under that consumer's name ([`FakeTelegram::polls`]: start, end,
//!   requested timeout, whether it ended in a 409), so a test with two gateways on one token
//!   (each configured with its own `api_base`) knows which of them polled, and when.
//!
//! The server runs on its own thread and runtime; [`FakeTelegram::kill`] drops every
//! connection at once and [`FakeTelegram::revive`] listens again on the same port with the same
//! queues. The test API is both Rust methods and HTTP (`/_fake/...`, for scripts and benches).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use gatewarden_fakewire::form::FormPart;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

/// The 409 a poll gets when another `getUpdates` replaces it.
pub const TERMINATED: &str =
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running";
/// The 409 `getUpdates` gets while a webhook is set.
pub const WEBHOOK_ACTIVE: &str =
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first";

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long a poll abandoned by its client keeps the consumer slot.
    pub linger: Duration,
    /// Where to listen (default: an ephemeral loopback port).
    pub addr: SocketAddr,
}

impl Default for Options {
    fn default() -> Self {
        Options { linger: Duration::from_secs(30), addr: SocketAddr::from(([127, 0, 0, 1], 0)) }
    }
}

/// A message the bot sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    pub message_id: i64,
    pub chat_id: Value,
    pub text: String,
}

/// A file the bot sent (`sendPhoto`, `sendDocument`).
#[derive(Debug, Clone, PartialEq)]
pub struct SentFile {
    pub message_id: i64,
    pub method: String,
    pub chat_id: Value,
    pub file_name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// A file a user sends ([`FakeTelegram::inject_media`]).
#[derive(Debug, Clone, Default)]
pub struct Media {
    /// `photo`, `document`, `voice`, `audio` or `video_note`.
    pub kind: String,
    pub bytes: Vec<u8>,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
    pub caption: Option<String>,
    /// The `file_size` the message declares (default: the real size).
    pub declared_size: Option<u64>,
    /// The download sends its first bytes, then stalls forever.
    pub stall: bool,
}

struct StoredFile {
    path: String,
    bytes: Arc<Vec<u8>>,
    stall: bool,
}

/// The Bot API's download limit for bots.
const MAX_DOWNLOAD: usize = 20 << 20;

/// A `sendChatAction` the bot made.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatAction {
    pub chat_id: Value,
    pub action: String,
    pub at: Instant,
}

/// An `editMessageText` that changed a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    pub message_id: i64,
    pub chat_id: Value,
    pub text: String,
    pub at: Instant,
}

/// The `chat_action` values the Bot API documents.
const ACTIONS: &[&str] = &[
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

/// Counters for one bot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub get_updates: u64,
    /// 409s answered (terminated polls, lingering sessions, webhook).
    pub conflicts: u64,
    /// Updates not yet confirmed.
    pub pending: usize,
    /// Updates confirmed by an offset.
    pub confirmed: u64,
    pub sent: usize,
    /// The longest time no `getUpdates` was in flight, since the last reset: the polling gap a
    /// restart causes.
    pub max_poll_gap_ms: u64,
}

/// One `getUpdates`, as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollRecord {
    /// The `<consumer>` of a `/c/<consumer>/…` address; empty for the plain address.
    pub consumer: String,
    pub start: SystemTime,
    /// When the answer was produced, or the client went away (`None`: still in flight).
    pub end: Option<SystemTime>,
    /// The `timeout` the client asked for.
    pub timeout_s: u64,
    /// Answered 409.
    pub conflict: bool,
}

#[derive(Default)]
struct Bot {
    /// Files users sent, by `file_id`.
    files: HashMap<String, StoredFile>,
    next_file: u64,
    downloads: Vec<String>,
    sent_files: Vec<SentFile>,
    polls: Vec<PollRecord>,
    queue: VecDeque<Value>,
    next_update: i64,
    next_message: i64,
    poll: Option<(u64, oneshot::Sender<()>)>,
    linger_until: Option<Instant>,
    webhook: Option<String>,
    flood: Option<(u64, u32)>,
    sent: Vec<SentMessage>,
    /// Current text of each message the bot sent, by id; `None` once deleted.
    texts: HashMap<i64, Option<String>>,
    actions: Vec<ChatAction>,
    edits: Vec<Edit>,
    /// The command menu by scope key (`default`, `chat:<id>`, …), and every set in order.
    commands: HashMap<String, Value>,
    command_sets: Vec<(String, Value)>,
    method_flood: HashMap<String, (u64, u32)>,
    /// Every API call by method, with its time (flooded ones too).
    calls: Vec<(String, Instant)>,
    stats: Stats,
    notify: Arc<Notify>,
    /// Since when no `getUpdates` is in flight.
    idle_since: Option<Instant>,
}

struct Shared {
    opts: Options,
    bots: Mutex<HashMap<String, Bot>>,
    revoked: Mutex<Vec<String>>,
    poll_ids: AtomicU64,
}

impl Shared {
    fn bots(&self) -> MutexGuard<'_, HashMap<String, Bot>> {
        self.bots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with<R>(&self, token: &str, f: impl FnOnce(&mut Bot) -> R) -> R {
        let mut bots = self.bots();
        let bot = bots.entry(token.to_owned()).or_insert_with(|| Bot {
            next_update: 1000,
            next_message: 1,
            ..Bot::default()
        });
        f(bot)
    }
}

/// A running fake server.
pub struct FakeTelegram {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kill: Mutex<Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>>,
}

impl FakeTelegram {
    /// Starts a server with `opts`.
    pub fn start(opts: Options) -> std::io::Result<FakeTelegram> {
        let shared = Arc::new(Shared {
            opts: opts.clone(),
            bots: Mutex::new(HashMap::new()),
            revoked: Mutex::new(Vec::new()),
            poll_ids: AtomicU64::new(1),
        });
        let listener = std::net::TcpListener::bind(opts.addr)?;
        let addr = listener.local_addr()?;
        let fake = FakeTelegram { shared, addr, kill: Mutex::new(None) };
        fake.serve(listener)?;
        Ok(fake)
    }

    fn serve(&self, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = router(Arc::clone(&self.shared));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = std::thread::Builder::new().name("telegram-fake".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = rx => {}
                }
            });
            // Dropping the runtime cancels every connection task: sockets close at once.
            drop(rt);
        })?;
        *self.kill.lock().unwrap_or_else(|p| p.into_inner()) = Some((tx, handle));
        Ok(())
    }

    /// `http://127.0.0.1:<port>`, the `api_base` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and drops every connection (in-flight polls included). Queues, sent
    /// messages and counters are kept for [`FakeTelegram::revive`].
    pub fn kill(&self) {
        if let Some((tx, handle)) = self.kill.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(());
            let _ = handle.join();
        }
        for bot in self.shared.bots().values_mut() {
            bot.poll = None;
            bot.linger_until = None;
        }
    }

    /// Listens again on the same port (retrying briefly while the port is in TIME_WAIT).
    pub fn revive(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => return self.serve(l),
                Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::AddrInUse => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A user writes `text` in `chat_id`, a private chat; returns the update id.
    pub fn inject(&self, token: &str, chat_id: i64, user_id: i64, text: &str) -> i64 {
        inject_message(&self.shared, token, &Injected { chat_id, user_id, text, chat_type: "private", reply_to: None })
    }

    /// A user writes `text` in the group `chat_id` (type `supergroup`), replying to the bot's
    /// message `reply_to` when given; returns the update id. `@username` mentions in the text
    /// come as `mention` entities, as Telegram marks them.
    pub fn inject_group(&self, token: &str, chat_id: i64, user_id: i64, text: &str, reply_to: Option<i64>) -> i64 {
        inject_message(&self.shared, token, &Injected { chat_id, user_id, text, chat_type: "supergroup", reply_to })
    }

    /// The bot's `@username`, as `getMe` answers it.
    pub fn username(token: &str) -> String {
        format!("fake{}_bot", bot_id(token))
    }

    /// A user sends a file (`media.kind`) in the private chat `chat_id`; returns the update id.
    pub fn inject_media(&self, token: &str, chat_id: i64, user_id: i64, media: Media) -> i64 {
        let bot = bot_id(token);
        let _ = bot;
        self.shared.with(token, |b| {
            let mut file = |bytes: Vec<u8>, stall: bool, ext: &str| {
                b.next_file += 1;
                let id = format!("file{}", b.next_file);
                let path = format!("{}/file_{}.{ext}", media.kind, b.next_file);
                let size = bytes.len() as u64;
                b.files.insert(id.clone(), StoredFile { path, bytes: Arc::new(bytes), stall });
                (id, size)
            };
            let (id, size) = file(media.bytes.clone(), media.stall, "bin");
            let size = media.declared_size.unwrap_or(size);
            let mut obj = json!({"file_id": id, "file_unique_id": format!("u{id}"), "file_size": size});
            if let Some(n) = &media.file_name {
                obj["file_name"] = json!(n);
            }
            if let Some(m) = &media.mime_type {
                obj["mime_type"] = json!(m);
            }
            let value = if media.kind == "photo" {
                // A thumbnail first, as Telegram lists sizes smallest first.
                let (thumb, tsize) = file(b"\xff\xd8\xff\xe0thumb".to_vec(), false, "jpg");
                obj["width"] = json!(1280);
                obj["height"] = json!(960);
                json!([{"file_id": thumb, "file_unique_id": format!("u{thumb}"), "file_size": tsize, "width": 90, "height": 67}, obj])
            } else {
                obj
            };
            let uid = b.next_update;
            b.next_update += 1;
            let date = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let mut message = json!({
                "message_id": uid,
                "date": date,
                "chat": {"id": chat_id, "type": "private"},
                "from": {"id": user_id, "is_bot": false, "first_name": format!("user{user_id}")},
            });
            message[media.kind.as_str()] = value;
            if let Some(c) = &media.caption {
                message["caption"] = json!(c);
            }
            b.queue.push_back(json!({"update_id": uid, "message": message}));
            b.notify.notify_waiters();
            uid
        })
    }

    /// The `file_path`s downloaded, in order.
    pub fn downloads(&self, token: &str) -> Vec<String> {
        self.shared.with(token, |b| b.downloads.clone())
    }

    /// The files the bot sent, oldest first.
    pub fn files(&self, token: &str) -> Vec<SentFile> {
        self.shared.with(token, |b| b.sent_files.clone())
    }

    /// What the bot sent, oldest first.
    pub fn sent(&self, token: &str) -> Vec<SentMessage> {
        self.shared.with(token, |b| b.sent.clone())
    }

    /// Waits until `pred` holds for what the bot sent, at most `timeout`; returns the last view.
    pub fn wait_sent(
        &self,
        token: &str,
        timeout: Duration,
        pred: impl Fn(&[SentMessage]) -> bool,
    ) -> Result<Vec<SentMessage>, Vec<SentMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            let sent = self.sent(token);
            if pred(&sent) {
                return Ok(sent);
            }
            if Instant::now() >= deadline {
                return Err(sent);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stats(&self, token: &str) -> Stats {
        self.shared.with(token, |b| Stats { pending: b.queue.len(), sent: b.sent.len(), ..b.stats.clone() })
    }

    /// Sets (`Some`) or deletes the webhook, as `setWebhook`/`deleteWebhook` would.
    pub fn set_webhook(&self, token: &str, url: Option<&str>) {
        self.shared.with(token, |b| b.webhook = url.map(str::to_owned));
    }

    /// The next `calls` API calls of this bot answer 429 with `retry_after` seconds.
    pub fn flood(&self, token: &str, retry_after: u64, calls: u32) {
        self.shared.with(token, |b| b.flood = Some((retry_after, calls)));
    }

    /// Restarts the polling-gap measurement.
    pub fn reset_gap(&self, token: &str) {
        self.shared.with(token, |b| {
            b.stats.max_poll_gap_ms = 0;
            b.idle_since = None;
        });
    }

    /// Every `getUpdates` of this bot so far, oldest first.
    pub fn polls(&self, token: &str) -> Vec<PollRecord> {
        self.shared.with(token, |b| b.polls.clone())
    }

    /// The next `calls` calls of `method` by this bot answer 429 with `retry_after` seconds.
    pub fn flood_method(&self, token: &str, method: &str, retry_after: u64, calls: u32) {
        self.shared.with(token, |b| b.method_flood.insert(method.to_owned(), (retry_after, calls)));
    }

    /// When each call of `method` arrived (answered 429 or not), oldest first.
    pub fn calls(&self, token: &str, method: &str) -> Vec<Instant> {
        self.shared.with(token, |b| b.calls.iter().filter(|(m, _)| m == method).map(|(_, t)| *t).collect())
    }

    /// Every `sendChatAction`, oldest first.
    pub fn actions(&self, token: &str) -> Vec<ChatAction> {
        self.shared.with(token, |b| b.actions.clone())
    }

    /// Every `editMessageText` that changed a message, oldest first.
    pub fn edits(&self, token: &str) -> Vec<Edit> {
        self.shared.with(token, |b| b.edits.clone())
    }

    /// The bot's messages a user sees now: not deleted, with their current text.
    pub fn visible(&self, token: &str) -> Vec<SentMessage> {
        self.shared.with(token, |b| {
            b.sent
                .iter()
                .filter_map(|m| match b.texts.get(&m.message_id) {
                    Some(Some(t)) => Some(SentMessage { text: t.clone(), ..m.clone() }),
                    _ => None,
                })
                .collect()
        })
    }

    /// The command menu of `scope` (`default`, `chat:<id>`, …; module notes).
    pub fn commands(&self, token: &str, scope: &str) -> Value {
        self.shared.with(token, |b| b.commands.get(scope).cloned().unwrap_or_else(|| json!([])))
    }

    /// Every `setMyCommands` as `(scope, commands)`, oldest first.
    pub fn command_sets(&self, token: &str) -> Vec<(String, Value)> {
        self.shared.with(token, |b| b.command_sets.clone())
    }

    /// Every later call with this token answers 401 Unauthorized.
    pub fn revoke(&self, token: &str) {
        self.shared.revoked.lock().unwrap_or_else(|p| p.into_inner()).push(token.to_owned());
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One user message to queue as an update.
struct Injected<'a> {
    chat_id: i64,
    user_id: i64,
    text: &'a str,
    /// `private`, `group`, `supergroup` or `channel` (https://core.telegram.org/bots/api#chat).
    chat_type: &'a str,
    /// The bot's message this one replies to (`reply_to_message`, with the bot as `from`).
    reply_to: Option<i64>,
}

/// The bot's user id: the token's first part, as the real Bot API's tokens are made.
fn bot_id(token: &str) -> u64 {
    token.split(':').next().unwrap_or("0").parse::<u64>().unwrap_or(0)
}

/// `mention` entities for each `@word` in `text` (https://core.telegram.org/bots/api#messageentity:
/// offsets and lengths in UTF-16 code units).
fn mention_entities(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut units = 0usize;
    let mut start: Option<usize> = None;
    for c in text.chars().chain(std::iter::once(' ')) {
        let word = c.is_alphanumeric() || c == '_';
        match (start, c) {
            (None, '@') => start = Some(units),
            (Some(at), _) if !word => {
                if units - at > 1 {
                    out.push(json!({"type": "mention", "offset": at, "length": units - at}));
                }
                start = if c == '@' { Some(units) } else { None };
            }
            _ => {}
        }
        units += c.len_utf16();
    }
    out
}

fn inject_message(shared: &Shared, token: &str, m: &Injected<'_>) -> i64 {
    let bot = bot_id(token);
    shared.with(token, |b| {
        let id = b.next_update;
        b.next_update += 1;
        let date = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut message = json!({
            "message_id": id,
            "date": date,
            "chat": {"id": m.chat_id, "type": m.chat_type},
            "from": {"id": m.user_id, "is_bot": false, "first_name": format!("user{}", m.user_id)},
            "text": m.text,
        });
        let entities = mention_entities(m.text);
        if !entities.is_empty() {
            message["entities"] = json!(entities);
        }
        if let Some(r) = m.reply_to {
            let replied = b.texts.get(&r).cloned().flatten().unwrap_or_default();
            message["reply_to_message"] = json!({
                "message_id": r, "date": date, "chat": {"id": m.chat_id, "type": m.chat_type},
                "from": {"id": bot, "is_bot": true, "first_name": "fake", "username": format!("fake{bot}_bot")},
                "text": replied,
            });
        }
        b.queue.push_back(json!({"update_id": id, "message": message}));
        b.notify.notify_waiters();
        id
    })
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/_fake/inject", post(http_inject))
        .route("/_fake/sent", get(http_sent))
        .route("/_fake/stats", get(http_stats))
        .route("/_fake/actions", get(http_actions))
        .route("/_fake/visible", get(http_visible))
        .route("/file/{bot}/{*path}", get(download))
        .route("/{bot}/{method}", post(api).get(api))
        .route("/c/{consumer}/{bot}/{method}", post(consumer_api).get(consumer_api))
        .with_state(shared)
}

fn ok(result: Value) -> Response {
    Json(json!({"ok": true, "result": result})).into_response()
}

fn fail(code: u16, description: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(json!({"ok": false, "error_code": code, "description": description}))).into_response()
}

/// Query parameters and a JSON body, merged (the body wins), as the Bot API accepts either.
fn params(query: HashMap<String, String>, body: &Bytes) -> HashMap<String, Value> {
    let mut p: HashMap<String, Value> = query
        .into_iter()
        .map(|(k, v)| {
            let parsed = serde_json::from_str(&v).unwrap_or(Value::String(v));
            (k, parsed)
        })
        .collect();
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) {
        p.extend(m);
    }
    p
}

fn int(p: &HashMap<String, Value>, key: &str) -> Option<i64> {
    match p.get(key)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

async fn consumer_api(
    State(shared): State<Arc<Shared>>,
    Path((consumer, bot, method)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    call(shared, consumer, bot, method, query, (content_type(&headers), body)).await
}

async fn api(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    call(shared, String::new(), bot, method, query, (content_type(&headers), body)).await
}

fn content_type(h: &HeaderMap) -> String {
    h.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

/// `GET /file/bot<token>/<file_path>`: the bytes of a file `getFile` named.
async fn download(State(shared): State<Arc<Shared>>, Path((bot, path)): Path<(String, String)>) -> Response {
    let Some(token) = bot.strip_prefix("bot") else { return fail(404, "Not Found") };
    let found = shared.with(token, |b| {
        let f = b.files.values().find(|f| f.path == path).map(|f| (Arc::clone(&f.bytes), f.stall));
        if f.is_some() {
            b.downloads.push(path.clone());
        }
        f
    });
    let Some((bytes, stall)) = found else { return fail(404, "Not Found: file not found") };
    if stall {
        use futures_util::StreamExt;
        let first = Bytes::copy_from_slice(&bytes[..bytes.len().min(16)]);
        let s = futures_util::stream::iter([Ok::<Bytes, std::io::Error>(first)]).chain(futures_util::stream::pending());
        return (StatusCode::OK, axum::body::Body::from_stream(s)).into_response();
    }
    (StatusCode::OK, bytes.as_ref().clone()).into_response()
}

/// `sendPhoto` / `sendDocument` with the file uploaded in `field`.
fn send_file(shared: &Shared, token: &str, method: &str, field: &str, content_type: &str, body: &[u8]) -> Response {
    let Some(parts) = gatewarden_fakewire::form::parse(content_type, body) else {
        return fail(400, "Bad Request: there is no file in the request");
    };
    let text = |k: &str| {
        parts
            .iter()
            .find(|p| p.name == k && p.filename.is_none())
            .map(|p| String::from_utf8_lossy(&p.bytes).into_owned())
    };
    let Some(chat) = text("chat_id").filter(|c| !c.is_empty()) else {
        return fail(400, "Bad Request: chat_id is empty");
    };
    let chat = chat.parse::<i64>().map_or_else(|_| json!(chat), |n| json!(n));
    let Some(FormPart { filename, content_type: ctype, bytes, .. }) =
        parts.iter().find(|p| p.name == field && p.filename.is_some())
    else {
        return fail(400, &format!("Bad Request: there is no {field} in the request"));
    };
    if field == "photo" && bytes.len() > 10 << 20 {
        return fail(400, "Bad Request: PHOTO_INVALID_DIMENSIONS");
    }
    shared.with(token, |b| {
        let id = b.next_message;
        b.next_message += 1;
        b.sent_files.push(SentFile {
            message_id: id,
            method: method.to_owned(),
            chat_id: chat.clone(),
            file_name: filename.clone().unwrap_or_default(),
            content_type: ctype.clone(),
            bytes: bytes.clone(),
        });
        ok(json!({"message_id": id, "chat": {"id": chat}}))
    })
}

/// Ends a [`PollRecord`] however its handler ends (answered, or dropped with the client).
struct PollLog {
    shared: Arc<Shared>,
    token: String,
    index: usize,
    conflict: bool,
}

impl Drop for PollLog {
    fn drop(&mut self) {
        self.shared.with(&self.token, |b| {
            if let Some(p) = b.polls.get_mut(self.index) {
                p.end.get_or_insert_with(SystemTime::now);
                p.conflict = self.conflict;
            }
        });
    }
}

async fn call(
    shared: Arc<Shared>,
    consumer: String,
    bot: String,
    method: String,
    query: HashMap<String, String>,
    (ctype, body): (String, Bytes),
) -> Response {
    let Some(token) =
        bot.strip_prefix("bot").filter(|t| t.split_once(':').is_some_and(|(id, _)| id.parse::<u64>().is_ok()))
    else {
        return fail(404, "Not Found");
    };
    if shared.revoked.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|t| t == token) {
        return fail(401, "Unauthorized");
    }
    shared.with(token, |b| {
        if b.calls.len() < 100_000 {
            b.calls.push((method.clone(), Instant::now()));
        }
    });
    let flooded = shared.with(token, |b| match b.flood {
        Some((after, n)) if n > 0 => {
            b.flood = (n > 1).then_some((after, n - 1));
            Some(after)
        }
        _ => None,
    });
    let flooded = flooded.or_else(|| {
        shared.with(token, |b| match b.method_flood.get(&method).copied() {
            Some((after, n)) if n > 0 => {
                b.method_flood.insert(method.clone(), (after, n - 1));
                Some(after)
            }
            _ => None,
        })
    });
    if let Some(after) = flooded {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"ok": false, "error_code": 429, "description": format!("Too Many Requests: retry after {after}"), "parameters": {"retry_after": after}})),
        )
            .into_response();
    }
    let p = params(query, &body);
    match method.as_str() {
        "getUpdates" => {
            let timeout_s = int(&p, "timeout").unwrap_or(0).clamp(0, 3600) as u64;
            let index = shared.with(token, |b| {
                let start = SystemTime::now();
                b.polls.push(PollRecord { consumer, start, end: None, timeout_s, conflict: false });
                b.polls.len() - 1
            });
            let mut log = PollLog { shared: Arc::clone(&shared), token: token.to_owned(), index, conflict: false };
            let r = get_updates(Arc::clone(&shared), token.to_owned(), p).await;
            log.conflict = r.status() == StatusCode::CONFLICT;
            r
        }
        "sendMessage" => send_message(&shared, token, &p),
        "sendPhoto" => send_file(&shared, token, "sendPhoto", "photo", &ctype, &body),
        "sendDocument" => send_file(&shared, token, "sendDocument", "document", &ctype, &body),
        "getFile" => {
            let id = p.get("file_id").and_then(Value::as_str).unwrap_or("").to_owned();
            shared.with(token, |b| match b.files.get(&id) {
                None => fail(400, "Bad Request: invalid file_id"),
                Some(f) if f.bytes.len() > MAX_DOWNLOAD => fail(400, "Bad Request: file is too big"),
                Some(f) => ok(json!({"file_id": id, "file_unique_id": format!("u{id}"), "file_size": f.bytes.len(), "file_path": f.path})),
            })
        }
        "sendChatAction" => send_chat_action(&shared, token, &p),
        "editMessageText" => edit_message_text(&shared, token, &p),
        "deleteMessage" => delete_message(&shared, token, &p),
        "setMyCommands" => set_my_commands(&shared, token, &p),
        "getMyCommands" => match scope_key(&p) {
            Ok(scope) => shared.with(token, |b| ok(b.commands.get(&scope).cloned().unwrap_or_else(|| json!([])))),
            Err(e) => fail(400, &e),
        },
        "getMe" => {
            let id = bot_id(token);
            ok(json!({"id": id, "is_bot": true, "first_name": "fake", "username": format!("fake{id}_bot")}))
        }
        "setWebhook" => {
            let url = p.get("url").and_then(Value::as_str).unwrap_or("").to_owned();
            shared.with(token, |b| b.webhook = (!url.is_empty()).then_some(url));
            ok(json!(true))
        }
        "deleteWebhook" => {
            let drop_pending = p.get("drop_pending_updates").and_then(Value::as_bool).unwrap_or(false);
            shared.with(token, |b| {
                b.webhook = None;
                if drop_pending {
                    b.queue.clear();
                }
            });
            ok(json!(true))
        }
        "getWebhookInfo" => shared.with(token, |b| {
            ok(json!({"url": b.webhook.clone().unwrap_or_default(), "pending_update_count": b.queue.len()}))
        }),
        _ => fail(404, "Not Found: method not found"),
    }
}

fn send_message(shared: &Shared, token: &str, p: &HashMap<String, Value>) -> Response {
    let Some(chat) = p.get("chat_id").cloned().filter(|c| c.is_i64() || c.as_str().is_some_and(|s| !s.is_empty()))
    else {
        return fail(400, "Bad Request: chat_id is empty");
    };
    let text = p.get("text").and_then(Value::as_str).unwrap_or("");
    if text.is_empty() {
        return fail(400, "Bad Request: message text is empty");
    }
    if text.chars().count() > 4096 {
        return fail(400, "Bad Request: message is too long");
    }
    shared.with(token, |b| {
        let id = b.next_message;
        b.next_message += 1;
        b.sent.push(SentMessage { message_id: id, chat_id: chat.clone(), text: text.to_owned() });
        b.texts.insert(id, Some(text.to_owned()));
        ok(json!({"message_id": id, "chat": {"id": chat}, "text": text}))
    })
}

fn chat_param(p: &HashMap<String, Value>) -> Option<Value> {
    p.get("chat_id").cloned().filter(|c| c.is_i64() || c.as_str().is_some_and(|s| !s.is_empty()))
}

/// The message `id` the bot sent in `chat`, if not deleted.
fn own_message<'a>(b: &'a Bot, chat: &Value, id: i64) -> Option<&'a str> {
    // `chat_id` may come as a number or as a string of one.
    let key = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let same_chat = b.sent.iter().any(|m| m.message_id == id && key(&m.chat_id) == key(chat));
    b.texts.get(&id).and_then(|t| t.as_deref()).filter(|_| same_chat)
}

fn send_chat_action(shared: &Shared, token: &str, p: &HashMap<String, Value>) -> Response {
    let Some(chat) = chat_param(p) else { return fail(400, "Bad Request: chat_id is empty") };
    let action = p.get("action").and_then(Value::as_str).unwrap_or("");
    if !ACTIONS.contains(&action) {
        return fail(400, "Bad Request: wrong parameter action in request");
    }
    shared.with(token, |b| b.actions.push(ChatAction { chat_id: chat, action: action.to_owned(), at: Instant::now() }));
    ok(json!(true))
}

fn edit_message_text(shared: &Shared, token: &str, p: &HashMap<String, Value>) -> Response {
    let Some(chat) = chat_param(p) else { return fail(400, "Bad Request: chat_id is empty") };
    let Some(id) = int(p, "message_id") else { return fail(400, "Bad Request: message identifier is not specified") };
    let text = p.get("text").and_then(Value::as_str).unwrap_or("");
    if text.is_empty() {
        return fail(400, "Bad Request: message text is empty");
    }
    if text.chars().count() > 4096 {
        return fail(400, "Bad Request: MESSAGE_TOO_LONG");
    }
    shared.with(token, |b| {
        let Some(current) = own_message(b, &chat, id) else {
            return fail(400, "Bad Request: message to edit not found");
        };
        if current == text {
            return fail(
                400,
                "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
            );
        }
        b.texts.insert(id, Some(text.to_owned()));
        b.edits.push(Edit { message_id: id, chat_id: chat.clone(), text: text.to_owned(), at: Instant::now() });
        ok(json!({"message_id": id, "chat": {"id": chat}, "text": text}))
    })
}

fn delete_message(shared: &Shared, token: &str, p: &HashMap<String, Value>) -> Response {
    let Some(chat) = chat_param(p) else { return fail(400, "Bad Request: chat_id is empty") };
    let Some(id) = int(p, "message_id") else { return fail(400, "Bad Request: message identifier is not specified") };
    shared.with(token, |b| {
        if own_message(b, &chat, id).is_none() {
            return fail(400, "Bad Request: message to delete not found");
        }
        b.texts.insert(id, None);
        ok(json!(true))
    })
}

/// A `BotCommandScope` as a key: `default`, `all_private_chats`, …, `chat:<chat_id>`.
fn scope_key(p: &HashMap<String, Value>) -> Result<String, String> {
    let scope = match p.get("scope") {
        None | Some(Value::Null) => return Ok("default".into()),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).map_err(|_| "Bad Request: can't parse scope JSON object".to_string())?
        }
        Some(v) => v.clone(),
    };
    match scope["type"].as_str() {
        Some(t @ ("default" | "all_private_chats" | "all_group_chats" | "all_chat_administrators")) => Ok(t.to_owned()),
        Some("chat") => match &scope["chat_id"] {
            Value::Number(n) => Ok(format!("chat:{n}")),
            Value::String(s) if !s.is_empty() => Ok(format!("chat:{s}")),
            _ => Err("Bad Request: chat_id is empty".into()),
        },
        _ => Err("Bad Request: unsupported bot command scope type".into()),
    }
}

fn set_my_commands(shared: &Shared, token: &str, p: &HashMap<String, Value>) -> Response {
    let scope = match scope_key(p) {
        Ok(s) => s,
        Err(e) => return fail(400, &e),
    };
    let commands = match p.get("commands") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).unwrap_or(Value::Null),
        Some(v) => v.clone(),
        None => Value::Null,
    };
    let Some(list) = commands.as_array() else { return fail(400, "Bad Request: can't parse commands JSON object") };
    if list.len() > 100 {
        return fail(400, "Bad Request: too many commands");
    }
    for c in list {
        let name = c["command"].as_str().unwrap_or("");
        let valid = (1..=32).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return fail(400, "Bad Request: BOT_COMMAND_INVALID");
        }
        let desc = c["description"].as_str().unwrap_or("");
        if !(1..=256).contains(&desc.chars().count()) {
            return fail(400, "Bad Request: command description is empty or too long");
        }
    }
    let list: Vec<Value> =
        list.iter().map(|c| json!({"command": c["command"], "description": c["description"]})).collect();
    shared.with(token, |b| {
        b.commands.insert(scope.clone(), json!(list));
        b.command_sets.push((scope, json!(list)));
    });
    ok(json!(true))
}

/// Marks the poll abandoned if its handler is dropped before answering (the client went away).
struct Abandon {
    shared: Arc<Shared>,
    token: String,
    id: u64,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let mut bots = self.shared.bots();
        if let Some(b) = bots.get_mut(&self.token)
            && b.poll.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            b.poll = None;
            if self.armed {
                b.linger_until = Some(Instant::now() + self.shared.opts.linger);
            }
        }
    }
}

/// Marks the end of a `getUpdates` (however it ends): no poll in flight from then on, unless a
/// newer one took over.
struct PollEnd {
    shared: Arc<Shared>,
    token: String,
}

impl Drop for PollEnd {
    fn drop(&mut self) {
        self.shared.with(&self.token, |b| {
            if b.poll.is_none() {
                b.idle_since = Some(Instant::now());
            }
        });
    }
}

async fn get_updates(shared: Arc<Shared>, token: String, p: HashMap<String, Value>) -> Response {
    let _end = PollEnd { shared: Arc::clone(&shared), token: token.clone() };
    let offset = int(&p, "offset").unwrap_or(0);
    let limit = int(&p, "limit").unwrap_or(100).clamp(1, 100) as usize;
    let timeout = Duration::from_secs(int(&p, "timeout").unwrap_or(0).clamp(0, 3600) as u64);
    let id = shared.poll_ids.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = oneshot::channel();
    let take = |b: &mut Bot| -> Vec<Value> { b.queue.iter().take(limit).cloned().collect() };
    let notify = {
        let mut bots = shared.bots();
        let b =
            bots.entry(token.clone()).or_insert_with(|| Bot { next_update: 1000, next_message: 1, ..Bot::default() });
        b.stats.get_updates += 1;
        if let Some(t) = b.idle_since.take() {
            b.stats.max_poll_gap_ms = b.stats.max_poll_gap_ms.max(t.elapsed().as_millis() as u64);
        }
        if b.webhook.is_some() {
            b.stats.conflicts += 1;
            return fail(409, WEBHOOK_ACTIVE);
        }
        if b.linger_until.is_some_and(|t| Instant::now() < t) {
            b.stats.conflicts += 1;
            return fail(409, TERMINATED);
        }
        b.linger_until = None;
        if let Some((_, old)) = b.poll.take() {
            let _ = old.send(());
        }
        // Confirmation: everything below a positive offset is forgotten.
        if offset > 0 {
            let before = b.queue.len();
            b.queue.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
            b.stats.confirmed += (before - b.queue.len()) as u64;
        } else if offset < 0 {
            let keep = offset.unsigned_abs() as usize;
            while b.queue.len() > keep {
                b.queue.pop_front();
                b.stats.confirmed += 1;
            }
        }
        if !b.queue.is_empty() || timeout.is_zero() {
            return ok(Value::Array(take(b)));
        }
        b.poll = Some((id, tx));
        Arc::clone(&b.notify)
    };
    let mut guard = Abandon { shared: Arc::clone(&shared), token: token.clone(), id, armed: true };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let ready = shared.with(&token, |b| (!b.queue.is_empty()).then(|| take(b)));
        if let Some(updates) = ready {
            guard.armed = false;
            return ok(Value::Array(updates));
        }
        tokio::select! {
            _ = &mut rx => {
                guard.armed = false;
                shared.with(&token, |b| b.stats.conflicts += 1);
                return fail(409, TERMINATED);
            }
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => {
                guard.armed = false;
                return ok(json!([]));
            }
        }
    }
}

async fn http_inject(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (Some(token), Some(chat), Some(text)) = (v["token"].as_str(), v["chat_id"].as_i64(), v["text"].as_str()) else {
        return fail(400, "inject needs token, chat_id and text");
    };
    let user = v["user_id"].as_i64().unwrap_or(chat);
    let chat_type = v["chat_type"].as_str().unwrap_or("private");
    ok(json!(inject_message(
        &shared,
        token,
        &Injected { chat_id: chat, user_id: user, text, chat_type, reply_to: v["reply_to"].as_i64() }
    )))
}

async fn http_sent(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let token = q.get("token").cloned().unwrap_or_default();
    let sent = shared.with(&token, |b| b.sent.clone());
    ok(Value::Array(
        sent.into_iter().map(|s| json!({"message_id": s.message_id, "chat_id": s.chat_id, "text": s.text})).collect(),
    ))
}

async fn http_stats(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let token = q.get("token").cloned().unwrap_or_default();
    let reset = q.contains_key("reset_gap");
    let s = shared.with(&token, |b| {
        let s = Stats { pending: b.queue.len(), sent: b.sent.len(), ..b.stats.clone() };
        if reset {
            b.stats.max_poll_gap_ms = 0;
            b.idle_since = None;
        }
        s
    });
    ok(json!({"get_updates": s.get_updates, "conflicts": s.conflicts, "pending": s.pending, "confirmed": s.confirmed,
              "sent": s.sent, "max_poll_gap_ms": s.max_poll_gap_ms}))
}

async fn http_actions(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let token = q.get("token").cloned().unwrap_or_default();
    let actions = shared.with(&token, |b| b.actions.clone());
    ok(Value::Array(actions.into_iter().map(|a| json!({"chat_id": a.chat_id, "action": a.action})).collect()))
}

async fn http_visible(State(shared): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let token = q.get("token").cloned().unwrap_or_default();
    let fake_view = shared.with(&token, |b| {
        b.sent
            .iter()
            .filter_map(|m| match b.texts.get(&m.message_id) {
                Some(Some(t)) => Some(json!({"message_id": m.message_id, "chat_id": m.chat_id, "text": t})),
                _ => None,
            })
            .collect::<Vec<_>>()
    });
    ok(Value::Array(fake_view))
}

#[cfg(test)]
mod mention_tests {
    use super::*;

    #[test]
    fn mentions_are_entities_in_utf16_units() {
        assert_eq!(mention_entities("@gw_bot hi"), vec![json!({"type": "mention", "offset": 0, "length": 7})]);
        assert_eq!(
            mention_entities("é @a and @bc"),
            vec![
                json!({"type": "mention", "offset": 2, "length": 2}),
                json!({"type": "mention", "offset": 9, "length": 3})
            ]
        );
        assert!(mention_entities("x @ y").is_empty());
    }
}
