//! Telegram Bot API adapter: `getUpdates` long-poll with offset, `sendMessage`.
//!
//! - **Nothing lost.** An update is handed to the [`Host`] (journaled) before the offset moves
//!   past it; the offset is confirmed to Telegram only by the next `getUpdates`, so an update
//!   whose commit failed, or that arrived while we died, is delivered again, and the journal
//!   deduplicates it by `update_id`.
//! - **At most one duplicate reply.** `sendMessage` has no idempotency key: a crash between a
//!   send and the outbox commit sends that reply once more after the restart.
//! - **Never fight.** A 409 (another `getUpdates`, or a webhook) is retried with backoff; if it
//!   persists past `conflict_standby_s` the adapter reports "another consumer is active" and
//!   stands by, probing once per bound. It never calls `deleteWebhook` and never drops pending
//!   updates.
//! - **Clean hand-over.** [`Adapter::stop_intake`] issues one `getUpdates` with `timeout=0`
//!   that confirms the committed offset and ends our own in-flight long poll on the server
//!   (Telegram answers it 409 "terminated by other getUpdates request"), so no abandoned poll
//!   lingers into the successor's first poll.
//! - **Flood control.** A 429 waits the `retry_after` it names (capped) before the same call.
//! - **Showing work** (skeleton/progress.rs decides when): `sendChatAction` `typing`;
//!   previews are a `sendMessage`, then `editMessageText` ("message is not modified" is done),
//!   removed with `deleteMessage` once the reply is sent.
//! - **The command menu.** At connect, `setMyCommands` for the default scope (the commands
//!   everyone may run) and, for each of `[[platform]] admins`, a `BotCommandScopeChat` of
//!   their private chat (the chat id of a private chat is the user's id) with the admin
//!   commands too; each only when `getMyCommands` shows it differs. Best-effort: a failure
//!   does not fail the connect; a 429 is waited out once, then left to the next connect.
//! - **Bounded polls.** A long poll's `timeout` is never longer than [`Host::receive_budget`]
//!   (a cluster active's lease left; crates/cluster/README.md); under one second left,
//!   the receiver does not poll at all and looks again shortly.
//! - **Restartable.** [`Adapter::start`] after [`Adapter::close`] starts afresh: new threads and
//!   new flags; the committed offset carries over (the journal deduplicates anyway).
//!
//! The loops, states, pacing and drain are the skeleton's (crates/platforms/src/skeleton):
//! this module is the Bot API protocol ([`Proto`]), blocking ureq like the openai backend
//! (crates/agent/src/backend/openai.rs).
//!
//! [`Adapter::start`]: crate::Adapter::start
//! [`Adapter::close`]: crate::Adapter::close
//! [`Adapter::stop_intake`]: crate::Adapter::stop_intake
//! [`Host`]: crate::Host
//! [`Host::receive_budget`]: crate::Host::receive_budget

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Telegram as Settings;
use gatewarden_net::Outbound;
use serde_json::{Value, json};

use crate::attachments::Attachment;
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound, MenuCommand, names_word};

/// The public Bot API.
pub const DEFAULT_API_BASE: &str = "https://api.telegram.org";
/// Telegram's limit on one message's text, in characters.
const MAX_TEXT_CHARS: usize = 4096;
const MAX_BODY_BYTES: u64 = 16 << 20;
/// `sendPhoto`'s limit; a larger image goes as a document.
const MAX_PHOTO_BYTES: u64 = 10 << 20;
/// One upload's bound (50 MB at a slow 1 MB/s).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest long poll worth starting under a receive budget (the Bot API's `timeout` is
/// whole seconds).
const MIN_BUDGETED_POLL: Duration = Duration::from_secs(1);

/// Why a Bot API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ApiError {
    /// No answer (connect, timeout, reset, unreadable body).
    Network(String),
    /// 409: another consumer (getUpdates or a webhook).
    Conflict(String),
    /// 429 with `retry_after`.
    Flood(Duration),
    /// 401/404: the token is rejected.
    Unauthorized(String),
    /// 400/403: this request will never succeed (unknown chat, bot blocked).
    Rejected(String),
    /// 5xx and anything else.
    Server(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Network(m) => write!(f, "cannot reach the Bot API: {m}"),
            ApiError::Conflict(m) | ApiError::Unauthorized(m) | ApiError::Rejected(m) | ApiError::Server(m) => {
                f.write_str(m)
            }
            ApiError::Flood(d) => write!(f, "flood control: retry after {} s", d.as_secs()),
        }
    }
}

/// One Bot API endpoint (`<api_base>/bot<token>/`).
#[derive(Clone)]
struct Api {
    http: ureq::Agent,
    prefix: String,
    token: String,
}

impl Api {
    /// TLS and proxy from `out` (crates/net): a certificate that does not verify fails the call
    /// as [`ApiError::Network`] naming the host and the reason, before the token is sent.
    fn new(base: &str, token: &str, out: &Outbound) -> Api {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        Api { http, prefix: format!("{}/bot{token}/", base.trim_end_matches('/')), token: token.to_owned() }
    }

    /// The token never reaches a log line or a status report.
    fn redact(&self, s: String) -> String {
        if self.token.is_empty() { s } else { s.replace(&self.token, "<token>") }
    }

    fn call(&self, method: &str, body: &Value, timeout: Duration) -> Result<Value, ApiError> {
        let response = self
            .http
            .post(format!("{}{method}", self.prefix))
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send_json(body)
            .map_err(|e| ApiError::Network(self.redact(gatewarden_net::describe(&e, &self.prefix))))?;
        self.answer(response)
    }

    /// A `multipart/form-data` call with one file (https://core.telegram.org/bots/api#sending-files:
    /// "Post the file using multipart/form-data in the usual way that files are uploaded via the
    /// browser"), streamed from the store: the file is never read into memory whole.
    fn upload(
        &self,
        method: &str,
        fields: &[(&str, String)],
        file: (&str, &OutFile),
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let (field, f) = file;
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let form = crate::filexfer::multipart(&fields, field, f).map_err(ApiError::Rejected)?;
        let response = crate::filexfer::post_form(&self.http, &format!("{}{method}", self.prefix), None, form, timeout)
            .map_err(|e| ApiError::Network(self.redact(gatewarden_net::describe(&e, &self.prefix))))?;
        self.answer(response)
    }

    fn answer(&self, response: ureq::http::Response<ureq::Body>) -> Result<Value, ApiError> {
        let status = response.status().as_u16();
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(|e| ApiError::Network(self.redact(e)))?;
        if status == 200 && v["ok"] == Value::Bool(true) {
            return Ok(v["result"].clone());
        }
        let code = v["error_code"].as_u64().map_or(status, |c| u16::try_from(c).unwrap_or(status));
        let desc = self.redact(v["description"].as_str().map_or_else(|| format!("HTTP {status}"), str::to_owned));
        Err(match code {
            409 => ApiError::Conflict(desc),
            429 => ApiError::Flood(Duration::from_secs(v["parameters"]["retry_after"].as_u64().unwrap_or(1))),
            401 | 404 => ApiError::Unauthorized(desc),
            400 | 403 => ApiError::Rejected(desc),
            _ => ApiError::Server(format!("HTTP {code}: {desc}")),
        })
    }
}

impl ApiError {
    fn failure(self) -> Failure {
        match self {
            ApiError::Conflict(desc) => Failure::Conflict(desc),
            ApiError::Flood(d) => Failure::RateLimited(Some(d)),
            ApiError::Unauthorized(desc) => Failure::Rejected(desc),
            e @ (ApiError::Network(_) | ApiError::Server(_) | ApiError::Rejected(_)) => Failure::Down(e.to_string()),
        }
    }
}

/// The Telegram adapter.
pub type Telegram = Skeleton<Proto>;

/// The Bot API protocol.
pub struct Proto {
    token: String,
    base: String,
    /// `ca_file` and `proxy` (crates/net).
    out: Outbound,
    allowed: Vec<String>,
    /// `[[platform]] admins`: their private chats get the admin commands in the menu.
    admins: Vec<String>,
    poll_timeout: Duration,
    /// The next offset: every update below it is committed to the journal. Kept across starts.
    offset: Arc<AtomicI64>,
}

impl Skeleton<Proto> {
    /// Fails only when `ca_file` or `proxy` cannot be used (the configuration check read them
    /// already).
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Telegram, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let out = Outbound::new(cfg.ca_file.as_deref(), s.proxy.as_deref())
            .map_err(|e| AdapterError::Start { name: cfg.adapter_name(), message: e.to_string() })?;
        let proto = Proto {
            token,
            base: s.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned()),
            out,
            allowed: cfg.allowed_chats.clone(),
            admins: cfg.admins.clone(),
            poll_timeout: Duration::from_secs(s.poll_timeout_s),
            offset: Arc::new(AtomicI64::new(0)),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl Proto {
    fn api(&self) -> Api {
        Api::new(&self.base, &self.token, &self.out)
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Telegram, AdapterError> {
        Telegram::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 32,
        pace: None,
        min_receive: MIN_BUDGETED_POLL,
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(200),
    };
    type Receiver = Poller;
    type Sender = Poster;

    fn credential(&self) -> &str {
        &self.token
    }

    fn watchdog_after(&self) -> Duration {
        self.poll_timeout + Duration::from_secs(30)
    }

    fn open(&self, _host: &Arc<dyn Host>) -> Result<(Poller, Poster), String> {
        let rx = Poller {
            api: self.api(),
            base: self.base.clone(),
            token: self.token.clone(),
            out: self.out.clone(),
            allowed: self.allowed.clone(),
            admins: self.admins.clone(),
            poll_timeout: self.poll_timeout,
            offset: Arc::clone(&self.offset),
            pending: None,
            me: Me::default(),
        };
        Ok((rx, Poster { api: self.api() }))
    }

    /// One `getUpdates` that returns at once: confirms the committed offset and ends our own
    /// in-flight long poll on the server.
    fn hand_over(&self) {
        let offset = self.offset.load(Ordering::Acquire);
        let body = json!({"offset": offset, "timeout": 0, "limit": 1});
        let _ = self.api().call("getUpdates", &body, Duration::from_secs(5));
    }
}

/// The `timeout` of the next long poll: the configured one, bounded by the host's receive
/// budget and rounded down to whole seconds; `None` when less than [`MIN_BUDGETED_POLL`] is
/// left (do not poll now).
fn budgeted_poll(own: Duration, budget: Option<Duration>) -> Option<Duration> {
    match budget {
        None => Some(own),
        Some(b) if b < MIN_BUDGETED_POLL => None,
        Some(b) => Some(Duration::from_secs(own.min(b).as_secs())),
    }
}

/// The bot as `getMe` names it: a mention is `@username` (or a `text_mention` of its id), a
/// reply is one to a message `from` its id (https://core.telegram.org/bots/api#messageentity,
/// #message `reply_to_message`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Me {
    id: Option<i64>,
    username: Option<String>,
}

/// Turns one update into an inbound message (`None`: neither text nor a file we take).
/// `allowed` is `allowed_chats`.
fn parse_update(u: &Value, me: &Me, allowed: &[String]) -> Option<Inbound> {
    let id = u["update_id"].as_i64()?;
    let m = &u["message"];
    let attachments = media(m);
    // A file's words are its `caption` (https://core.telegram.org/bots/api#message).
    let text = match (m["text"].as_str(), m["caption"].as_str()) {
        (Some(t), _) => t,
        (None, Some(c)) => c,
        (None, None) if !attachments.is_empty() => "",
        (None, None) => return None,
    };
    let chat = id_string(&m["chat"]["id"])?;
    let user = id_string(&m["from"]["id"]).unwrap_or_default();
    let sent_at = m["date"].as_u64().map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    // "private", "group", "supergroup" or "channel" (https://core.telegram.org/bots/api#chat).
    let kind =
        if m["chat"]["type"].as_str().is_none_or(|t| t == "private") { ChatKind::Direct } else { ChatKind::Group };
    let mentioned = me.username.as_deref().is_some_and(|n| names_word(text, &format!("@{n}")))
        || ["entities", "caption_entities"].iter().any(|k| {
            m[*k].as_array().is_some_and(|es| {
                es.iter()
                    .any(|e| e["type"] == "text_mention" && me.id.is_some_and(|i| e["user"]["id"].as_i64() == Some(i)))
            })
        });
    let replied = me.id.is_some_and(|i| m["reply_to_message"]["from"]["id"].as_i64() == Some(i));
    Some(Inbound {
        event_id: id.to_string(),
        listed: allowed.contains(&chat),
        chat_id: chat,
        user_id: user,
        text: text.to_owned(),
        sent_at,
        chat: kind,
        addressed: mentioned || replied,
        attachments,
    })
}

/// The files a message carries: `photo` (its largest size), `document`, `voice`, `audio`,
/// `video_note` (https://core.telegram.org/bots/api#message), each fetched by its `file_id`.
fn media(m: &Value) -> Vec<Attachment> {
    let file = |f: &Value, name: &str, declared: &str| -> Option<Attachment> {
        Some(Attachment {
            name: f["file_name"].as_str().unwrap_or(name).to_owned(),
            declared: f["mime_type"].as_str().unwrap_or(declared).to_owned(),
            size: f["file_size"].as_u64(),
            fetch: f["file_id"].as_str()?.to_owned(),
            outcome: None,
        })
    };
    let mut out = Vec::new();
    // PhotoSize[]: the sizes of one photo; the largest is the one worth reading. Telegram
    // serves photos as JPEG.
    if let Some(sizes) = m["photo"].as_array() {
        let largest = sizes.iter().max_by_key(|p| {
            p["file_size"]
                .as_u64()
                .unwrap_or(0)
                .max(p["width"].as_u64().unwrap_or(0) * p["height"].as_u64().unwrap_or(0))
        });
        out.extend(largest.and_then(|p| file(p, "photo.jpg", "image/jpeg")));
    }
    let kinds = [
        ("document", "document", "application/octet-stream"),
        ("voice", "voice.ogg", "audio/ogg"),
        ("audio", "audio.mp3", "audio/mpeg"),
        ("video_note", "video_note.mp4", "video/mp4"),
    ];
    for (key, name, declared) in kinds {
        if m[key].is_object() {
            out.extend(file(&m[key], name, declared));
        }
    }
    out
}

fn id_string(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Telegram wants numeric chat ids as numbers, `@channel` names as strings.
fn chat_json(chat: &str) -> Value {
    chat.parse::<i64>().map_or_else(|_| json!(chat), |n| json!(n))
}

/// Splits `text` into pieces Telegram accepts (never empty).
#[cfg(test)]
fn pieces(text: &str) -> Vec<String> {
    skeleton::pieces(text, &Proto::LIMITS)
}

/// The receive side: `getMe`, then `getUpdates` long polls.
pub struct Poller {
    api: Api,
    base: String,
    token: String,
    out: Outbound,
    allowed: Vec<String>,
    admins: Vec<String>,
    poll_timeout: Duration,
    offset: Arc<AtomicI64>,
    /// The offset past the last batch, confirmed once it is journaled.
    pending: Option<i64>,
    /// Who the bot is (`getMe`), for mentions and replies in groups.
    me: Me,
}

impl skeleton::Receiver for Poller {
    /// `getMe` first: "connected" and "credentials rejected" are known at once, not after the
    /// first long poll ends.
    fn connect(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        let me = self.api.call("getMe", &json!({}), Duration::from_secs(10)).map_err(ApiError::failure)?;
        self.me = Me { id: me["id"].as_i64(), username: me["username"].as_str().map(str::to_owned) };
        for (scope, commands) in menus(&ctx.host().menu(), &self.admins) {
            sync_menu(&self.api, ctx, &scope, &commands);
        }
        Ok(())
    }

    fn receive(&mut self, _ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        self.pending = None;
        let Some(timeout) = budgeted_poll(self.poll_timeout, budget) else {
            return Ok(Batch::default());
        };
        let offset = self.offset.load(Ordering::Acquire);
        let body = json!({"offset": offset, "timeout": timeout.as_secs(), "allowed_updates": ["message"]});
        let updates =
            self.api.call("getUpdates", &body, timeout + Duration::from_secs(10)).map_err(ApiError::failure)?;
        let Some(list) = updates.as_array() else {
            return Err(Failure::Down("getUpdates returned no list".into()));
        };
        let mut messages = Vec::new();
        for u in list {
            let Some(id) = u["update_id"].as_i64() else { continue };
            if id < offset {
                continue; // confirmed already
            }
            // Every text message goes to the host: whether it is served is the access policy's
            // to decide (crates/runtime/src/access/), with `listed` saying what allowed_chats says.
            if let Some(msg) = parse_update(u, &self.me, &self.allowed) {
                messages.push(msg);
            }
            let next = id.saturating_add(1);
            self.pending = Some(self.pending.map_or(next, |p| p.max(next)));
        }
        Ok(Batch { messages, gap: None })
    }

    /// Moves the offset past the batch; Telegram hears it with the next `getUpdates`.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        if let Some(next) = self.pending.take() {
            self.offset.store(next, Ordering::Release);
        }
        Ok(())
    }

    /// `getFile` names the file's path, then `GET <api_base>/file/bot<token>/<file_path>`
    /// (https://core.telegram.org/bots/api#getfile; the Bot API serves files up to 20 MB).
    fn fetch(&mut self, _ctx: &Ctx, a: &Attachment, timeout: Duration) -> Result<Box<dyn Read + Send>, String> {
        let f = self.api.call("getFile", &json!({"file_id": a.fetch}), timeout.min(Duration::from_secs(30)));
        let f = f.map_err(|e| e.to_string())?;
        let Some(path) = f["file_path"].as_str() else { return Err("getFile returned no file_path".into()) };
        let url =
            format!("{}/file/bot{}/{}", self.base.trim_end_matches('/'), self.token, path.trim_start_matches('/'));
        crate::filexfer::download(&self.api.http, &url, None, timeout).map_err(|e| self.api.redact(e))
    }

    /// A new HTTP agent: no pooled connection of the old one is reused.
    fn disconnect(&mut self) {
        self.api = Api::new(&self.base, &self.token, &self.out);
    }
}

/// Most admins' chats given their own menu (one `getMyCommands` and maybe one `setMyCommands`
/// each at connect).
const MAX_ADMIN_MENUS: usize = 32;

/// The menus to set: `(scope, commands)`, the default scope's first.
fn menus(menu: &[MenuCommand], admins: &[String]) -> Vec<(Value, Value)> {
    if menu.is_empty() {
        return Vec::new();
    }
    let list = |admin: bool| -> Value {
        menu.iter()
            .filter(|c| admin || !c.admin)
            .map(|c| json!({"command": c.name, "description": c.description}))
            .collect()
    };
    let mut out = vec![(json!({"type": "default"}), list(false))];
    for a in admins.iter().filter(|a| a.parse::<i64>().is_ok()).take(MAX_ADMIN_MENUS) {
        out.push((json!({"type": "chat", "chat_id": chat_json(a)}), list(true)));
    }
    out
}

/// Sets one scope's menu when it differs; a 429 is waited out once (module notes).
fn sync_menu(api: &Api, ctx: &Ctx, scope: &Value, commands: &Value) {
    let timeout = Duration::from_secs(10);
    for attempt in 0..2 {
        let r = api.call("getMyCommands", &json!({"scope": scope}), timeout).and_then(|have| {
            if have == *commands {
                return Ok(());
            }
            api.call("setMyCommands", &json!({"scope": scope, "commands": commands}), timeout).map(drop)
        });
        match r {
            Err(ApiError::Flood(d)) if attempt == 0 => ctx.pause(d.min(Duration::from_secs(30))),
            _ => return,
        }
    }
}

/// The send side: `sendMessage`, and the previews' calls.
pub struct Poster {
    api: Api,
}

fn send_error(e: ApiError) -> SendError {
    match e {
        ApiError::Flood(d) => SendError::RateLimited(Some(d)),
        ApiError::Rejected(desc) => SendError::Rejected(desc),
        ApiError::Unauthorized(desc) => SendError::Unauthorized(desc),
        e => SendError::Failed(e.to_string()),
    }
}

/// Calls that show work are short: a slow one is skipped, not waited for.
const SHOW_TIMEOUT: Duration = Duration::from_secs(10);

impl skeleton::Sender for Poster {
    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        let body = json!({"chat_id": chat_json(chat), "text": piece});
        self.api.call("sendMessage", &body, Duration::from_secs(30)).map(drop).map_err(send_error)
    }

    /// `sendPhoto` for a JPEG, PNG or WebP image within the photo limit (10 MB), else
    /// `sendDocument` (https://core.telegram.org/bots/api#sendphoto, #senddocument; 50 MB).
    /// No idempotency key: a crash between the upload and the outbox commit uploads it once
    /// more after the restart, as for text.
    fn send_file(&mut self, chat: &str, file: &OutFile, _id: PieceId) -> Result<(), SendError> {
        let photo =
            matches!(file.kind.as_str(), "image/jpeg" | "image/png" | "image/webp") && file.size <= MAX_PHOTO_BYTES;
        let (method, field) = if photo { ("sendPhoto", "photo") } else { ("sendDocument", "document") };
        let chat = chat_json(chat);
        let chat = chat.as_str().map_or_else(|| chat.to_string(), str::to_owned);
        self.api.upload(method, &[("chat_id", chat)], (field, file), UPLOAD_TIMEOUT).map(drop).map_err(send_error)
    }

    /// The action lasts 5 s or until the bot's next message; there is no "off".
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if !on {
            return Ok(());
        }
        let body = json!({"chat_id": chat_json(chat), "action": "typing"});
        self.api.call("sendChatAction", &body, SHOW_TIMEOUT).map(drop).map_err(send_error)
    }

    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let Some(id) = shown else {
            let body = json!({"chat_id": chat_json(chat), "text": text});
            let m = self.api.call("sendMessage", &body, SHOW_TIMEOUT).map_err(send_error)?;
            return match m["message_id"].as_i64() {
                Some(id) => Ok(Some(id.to_string())),
                None => Err(SendError::Failed("sendMessage returned no message_id".into())),
            };
        };
        let Ok(message_id) = id.parse::<i64>() else { return Err(SendError::Rejected(format!("bad message id {id}"))) };
        let body = json!({"chat_id": chat_json(chat), "message_id": message_id, "text": text});
        match self.api.call("editMessageText", &body, SHOW_TIMEOUT) {
            Ok(_) => Ok(Some(id.to_owned())),
            Err(ApiError::Rejected(desc)) if desc.contains("message is not modified") => Ok(Some(id.to_owned())),
            Err(e) => Err(send_error(e)),
        }
    }

    fn unpreview(&mut self, chat: &str, shown: &str) -> Result<(), SendError> {
        let Ok(message_id) = shown.parse::<i64>() else { return Ok(()) };
        let body = json!({"chat_id": chat_json(chat), "message_id": message_id});
        match self.api.call("deleteMessage", &body, SHOW_TIMEOUT) {
            // Already gone, or too old for a bot to delete (48 h): nothing more to do.
            Ok(_) | Err(ApiError::Rejected(_)) => Ok(()),
            Err(e) => Err(send_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_parse_and_odd_ones_are_skipped() {
        let me = Me::default();
        let u = json!({"update_id": 7, "message": {"text": "hi", "chat": {"id": -100}, "from": {"id": 42}, "date": 1}});
        let m = parse_update(&u, &me, &[]).unwrap();
        assert_eq!(
            (m.event_id.as_str(), m.chat_id.as_str(), m.user_id.as_str(), m.text.as_str()),
            ("7", "-100", "42", "hi")
        );
        assert!(parse_update(&json!({"update_id": 8, "edited_message": {}}), &me, &[]).is_none());
        assert!(
            parse_update(&json!({"update_id": 9, "message": {"photo": [], "chat": {"id": 1}}}), &me, &[]).is_none(),
            "a photo without sizes carries nothing"
        );
        assert!(parse_update(&json!("garbage"), &me, &[]).is_none());
    }

    /// Photos (the largest size), documents, voice, audio and video notes are taken, with the
    /// caption as the text.
    #[test]
    fn files_are_taken_with_their_caption() {
        let me = Me::default();
        let photo = json!({"update_id": 10, "message": {"chat": {"id": 1}, "caption": "what is this", "photo": [
            {"file_id": "small", "width": 90, "height": 90, "file_size": 1000},
            {"file_id": "big", "width": 1280, "height": 960, "file_size": 90000}]}});
        let m = parse_update(&photo, &me, &[]).unwrap();
        assert_eq!(m.text, "what is this");
        assert_eq!(m.attachments.len(), 1);
        let a = &m.attachments[0];
        assert_eq!(
            (a.fetch.as_str(), a.name.as_str(), a.declared.as_str(), a.size),
            ("big", "photo.jpg", "image/jpeg", Some(90000))
        );
        let voice = json!({"update_id": 11, "message": {"chat": {"id": 1}, "voice": {"file_id": "v", "mime_type": "audio/ogg", "duration": 2}}});
        let v = parse_update(&voice, &me, &[]).unwrap();
        assert_eq!((v.text.as_str(), v.attachments[0].name.as_str(), v.attachments[0].size), ("", "voice.ogg", None));
        let doc = json!({"update_id": 12, "message": {"chat": {"id": 1}, "document": {"file_id": "d", "file_name": "notes.txt", "mime_type": "text/plain"}}});
        assert_eq!(parse_update(&doc, &me, &[]).unwrap().attachments[0].name, "notes.txt");
        for key in ["audio", "video_note"] {
            let u = json!({"update_id": 13, "message": {"chat": {"id": 1}, key: {"file_id": "x"}}});
            assert_eq!(parse_update(&u, &me, &[]).unwrap().attachments.len(), 1, "{key}");
        }
    }

    /// Groups and private chats as `chat.type` says; a group message is addressed by
    /// `@username`, a `text_mention` of the bot or a reply to the bot's message; `listed` is
    /// what allowed_chats says.
    #[test]
    fn chat_kinds_mentions_and_replies() {
        let me = Me { id: Some(555), username: Some("gw_bot".into()) };
        let msg = |chat: Value, text: &str, extra: Value| {
            let mut m = json!({"text": text, "chat": chat, "from": {"id": 42}, "date": 1});
            if let (Some(m), Some(x)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(x.clone());
            }
            parse_update(&json!({"update_id": 1, "message": m}), &me, &["-100".to_owned()]).unwrap()
        };
        let dm = msg(json!({"id": 42, "type": "private"}), "hello", json!({}));
        assert_eq!((dm.chat, dm.listed, dm.addressed), (ChatKind::Direct, false, false));
        let g = json!({"id": -100, "type": "supergroup"});
        let plain = msg(g.clone(), "hello all", json!({}));
        assert_eq!((plain.chat, plain.listed, plain.addressed), (ChatKind::Group, true, false));
        assert!(msg(g.clone(), "@GW_bot what time is it", json!({})).addressed);
        assert!(msg(g.clone(), "/status@gw_bot", json!({})).addressed);
        assert!(!msg(g.clone(), "@gw_bot_fan hi", json!({})).addressed);
        let tm = json!({"entities": [{"type": "text_mention", "offset": 0, "length": 2, "user": {"id": 555}}]});
        assert!(msg(g.clone(), "gw hi", tm).addressed);
        assert!(msg(g.clone(), "yes", json!({"reply_to_message": {"message_id": 3, "from": {"id": 555}}})).addressed);
        assert!(!msg(g.clone(), "yes", json!({"reply_to_message": {"message_id": 3, "from": {"id": 9}}})).addressed);
        let other = msg(json!({"id": -200, "type": "group"}), "hi", json!({}));
        assert_eq!((other.chat, other.listed), (ChatKind::Group, false));
    }

    #[test]
    fn the_menu_scopes_admin_commands_to_the_admins_chats() {
        let c = |name: &str, admin| MenuCommand { name: name.into(), description: format!("do {name}"), admin };
        let menu = [c("status", false), c("restart", true)];
        let m = menus(&menu, &["42".into(), "@nope".into()]);
        assert_eq!(m.len(), 2, "the default scope and one admin chat (a non-numeric id has no private chat)");
        assert_eq!(m[0].0, json!({"type": "default"}));
        assert_eq!(m[0].1, json!([{"command": "status", "description": "do status"}]));
        assert_eq!(m[1].0, json!({"type": "chat", "chat_id": 42}));
        assert_eq!(m[1].1.as_array().map(Vec::len), Some(2));
        assert!(menus(&[], &["42".into()]).is_empty(), "no menu from a host without one");
    }

    #[test]
    fn polls_never_outlast_the_receive_budget() {
        let s = Duration::from_secs;
        assert_eq!(budgeted_poll(s(25), None), Some(s(25)));
        assert_eq!(budgeted_poll(s(25), Some(s(60))), Some(s(25)));
        assert_eq!(budgeted_poll(s(25), Some(Duration::from_millis(2900))), Some(s(2)), "rounded down");
        assert_eq!(budgeted_poll(s(25), Some(Duration::from_millis(999))), None, "too little left: no poll");
        assert_eq!(budgeted_poll(s(25), Some(Duration::ZERO)), None);
        assert_eq!(budgeted_poll(s(0), Some(s(5))), Some(s(0)), "short polls stay short");
    }

    #[test]
    fn long_replies_are_split_on_characters() {
        let text: String = std::iter::repeat_n('é', MAX_TEXT_CHARS + 10).collect();
        let p = pieces(&text);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].chars().count(), MAX_TEXT_CHARS);
        assert_eq!(pieces(""), vec!["(empty reply)".to_owned()]);
        assert_eq!(chat_json("-5"), json!(-5));
        assert_eq!(chat_json("@chan"), json!("@chan"));
    }
}
