//! Discord adapter: the Gateway WebSocket (API v10, JSON) to receive, REST Create Message to
//! reply.
//!
//! - **Credential.** `token_env` names the variable holding the bot token; it is the credential
//!   lock's key. Discord itself would deliver every event to a second gateway on the same
//!   token; the lock (or the cluster lease) refuses that gateway instead.
//! - **Intents.** IDENTIFY asks for GUILD_MESSAGES, DIRECT_MESSAGES and the privileged
//!   MESSAGE_CONTENT intent, which must be enabled for the bot in the Developer Portal: without
//!   it Discord closes with 4014 and the adapter parks, saying so (README, "Discord").
//! - **Nothing lost across a restart.** Each dispatch carries a sequence number `s`. The
//!   adapter keeps `session_id`, `resume_gateway_url` and the `seq` of the last batch whose
//!   messages are journaled in `<home>/platforms/discord-<name>.json`, written only in
//!   [`skeleton::Receiver::confirm`], after the journal commit. A successor (a restart, a kill
//!   -9, a reconnect) RESUMEs from that `seq` on the resume URL, and Discord replays every
//!   dispatch after it; what was journaled already is deduplicated by message id. Discord
//!   keeps a session resumable only for a while: past it (INVALID_SESSION `false`, close 4007
//!   or 4009) the adapter identifies anew and reports the gap as `degraded`, never silently.
//! - **Heartbeats.** Every `heartbeat_interval` (the first one jittered), with the last `s`
//!   received; a heartbeat due while the previous one has no ACK means a zombied connection:
//!   close with a non-1000 code (the session stays resumable), reconnect and resume.
//! - **RECONNECT (op 7), INVALID_SESSION (op 9), close codes.** Op 7 and a resumable op 9 resume
//!   on a new connection at once; 4004 (bad token), 4010–4014 (shards, version, intents) are
//!   fatal: the adapter parks naming the code; every other close reconnects and resumes.
//! - **Replies.** `POST /channels/{id}/messages`, 2,000 characters a piece, mentions disabled,
//!   with an enforced `nonce` (`<home prefix><outbox seq>.<piece>`): a resend after a crash
//!   within Discord's nonce window returns the first message instead of a second one. The
//!   per-route buckets (`X-RateLimit-Remaining`, `-Reset-After`) are waited out before a
//!   request, a 429 waits its `retry_after` (for every route when `global`), and the skeleton
//!   paces all sends under the documented global 50 requests a second.
//! - **Files** (issue 29 §1/§2). In: a message's `attachments[]` (`filename`, `content_type`,
//!   `size`, the CDN `url`), downloaded with a plain `GET` from Discord's CDN hosts only (or a
//!   configured `api_base`'s origin: crates/platforms/src/filexfer.rs), never with the bot
//!   token (the URL is signed). Out: Create Message as `multipart/form-data` with
//!   `payload_json` and `files[0]`, with the piece's enforced `nonce` like a text piece, so a
//!   resend after a crash within the nonce window returns the first message; past it, one
//!   duplicate at worst. A file past the upload limit (413) is rejected, not retried.
//! - **The agent at work** (skeleton/progress.rs). Typing: `POST /channels/{id}/typing`,
//!   refreshed every 4 s while a run is in progress (Discord shows it about 10 s, and stops it
//!   when the bot's next message arrives: nothing to call for "off"). Preview: a message of its
//!   own (Create Message), edited as the reply grows (`PATCH /channels/{id}/messages/{id}`),
//!   deleted (`DELETE …`; Unknown Message counts as deleted) once the reply is sent as its own
//!   message or the run is abandoned. These calls share the replies' client, so each route's
//!   bucket and the global limit hold for them too; a 429 holds the chat's previews, never the
//!   outbox.
//! - **Whose messages.** Messages by bots (ours included) and empty ones are ignored; every
//!   other goes to the host, a guild's as a group's, marked `listed` when `allowed_chats` (channel
//!   ids, DM channels too) names its channel and addressed when it mentions the bot or replies
//!   to its message: the access policy decides (crates/runtime/src/access/).
//!
//! The loops, states, backoff and drain are the skeleton's (crates/platforms/src/skeleton);
//! the wire is `gateway.rs` (tungstenite over crates/net's rustls) and `rest.rs` (ureq).

mod gateway;
mod rest;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Discord as Settings;
use gatewarden_lifecycle::fsio;
use gatewarden_net::Outbound;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use gateway::{CloseAction, Payload, close_action, decode};
use gateway::{Frame, Socket, SocketError, WsUrl, parse_url};
use rest::{Rest, RestError};

use crate::attachments::Attachment;
use crate::filexfer::FileHosts;
use crate::skeleton::{
    self, Batch, Ctx, Failure, Limits, OutFile, Pace, PieceId, PieceLimit, Protocol, SendError, Skeleton,
};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// The public REST API, version 10.
pub const DEFAULT_API_BASE: &str = "https://discord.com/api/v10";
/// GUILD_MESSAGES (1 << 9) | DIRECT_MESSAGES (1 << 12) | MESSAGE_CONTENT (1 << 15).
pub const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);
/// Discord's epoch for snowflakes, in ms since the Unix epoch.
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
/// Characters per message.
const MAX_TEXT_CHARS: usize = 2000;
/// Connect, handshake and HELLO/READY bound.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest one receive reads when the host sets no budget; short, so the drain is prompt.
const RECEIVE_SLICE: Duration = Duration::from_secs(1);
/// One socket read at most (the drain's flag is looked at in between).
const READ_SLICE: Duration = Duration::from_millis(250);
/// An idle session saves its `seq` at most this often (a batch with messages saves at once).
const SAVE_IDLE_EVERY: Duration = Duration::from_secs(60);
/// Dispatches buffered from a resume's replay before a receive takes them.
const MAX_QUEUE: usize = 10_000;
/// The bound on one reply piece's request.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound on one typing, preview or preview-removal request (they hold up the outbox).
const SHOW_TIMEOUT: Duration = Duration::from_secs(10);
/// A non-1000 close: the session stays resumable ("Gateway Close Event Codes").
const CLOSE_RESUMABLE: u16 = 4000;
/// Where Discord serves attachments (docs/reference "Image Formatting": the CDN, and the
/// media proxy a `proxy_url` names).
const CDN_HOSTS: &[&str] = &["https://cdn.discordapp.com", "https://media.discordapp.net"];
/// One upload's bound (Discord's 10 MiB default at a slow 1 MB/s, and then some).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// What the home keeps for one Discord adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Saved {
    session_id: Option<String>,
    resume_gateway_url: Option<String>,
    /// The `s` of the last dispatch whose batch is journaled.
    seq: u64,
    /// This home's nonce prefix.
    nonce_prefix: String,
}

/// The Discord adapter.
pub type Discord = Skeleton<Proto>;

/// The Gateway and REST protocol.
pub struct Proto {
    token: String,
    base: String,
    out: Outbound,
    name: String,
    allowed: Vec<String>,
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Discord, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let out = Outbound::new(cfg.ca_file.as_deref(), None)
            .map_err(|e| AdapterError::Start { name: cfg.adapter_name(), message: e.to_string() })?;
        let proto = Proto {
            token,
            base: s.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned()),
            out,
            name: cfg.adapter_name(),
            allowed: cfg.allowed_chats.clone(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Discord, AdapterError> {
        Discord::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 32,
        // The global limit: 50 requests a second per bot (docs: "Rate Limits").
        pace: Some(Pace { burst: 50, every: Duration::from_millis(20) }),
        min_receive: Duration::from_millis(250),
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(300),
    };
    type Receiver = GatewayRx;
    type Sender = Poster;

    fn credential(&self) -> &str {
        &self.token
    }

    fn watchdog_after(&self) -> Duration {
        // A receive returns at least every RECEIVE_SLICE while connected.
        Duration::from_secs(90)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(GatewayRx, Poster), String> {
        let path = host.state_dir().map(|d| d.join(format!("discord-{}.json", self.name)));
        let saved = load(path.as_ref()).map_err(|e| format!("session file: {e}"))?;
        let plain_ok = self.base.starts_with("http://");
        let tx =
            Poster { rest: Rest::new(&self.base, &self.token, &self.out), nonce_prefix: saved.nonce_prefix.clone() };
        let rx = GatewayRx {
            rest: Rest::new(&self.base, &self.token, &self.out),
            cdn: gatewarden_net::http_config(&self.out).http_status_as_error(false).build().new_agent(),
            files: FileHosts::new(&self.base, DEFAULT_API_BASE, CDN_HOSTS),
            token: self.token.clone(),
            tls: self.out.tls.clone(),
            plain_ok,
            allowed: self.allowed.clone(),
            path,
            saved_at: Instant::now(),
            saved,
            socket: None,
            session: None,
            received_seq: 0,
            heartbeat: Heartbeat::default(),
            queue: Vec::new(),
            pending: None,
            pending_busy: false,
            gap: None,
            reopen: None,
            me: None,
            failed: None,
        };
        Ok((rx, tx))
    }
}

/// A random hex prefix (std's per-process random hash keys, the pid and the time).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{:08x}", h.finish() as u32)
}

/// A fraction in [0, 1) for the first heartbeat's jitter and the identify wait.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Reads the saved session (missing or unreadable: none) and makes the nonce prefix durable.
fn load(path: Option<&PathBuf>) -> Result<Saved, String> {
    let saved = path
        .and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
        .and_then(|b| serde_json::from_slice::<Saved>(&b).ok());
    if let Some(s) = saved.filter(|s| !s.nonce_prefix.is_empty()) {
        return Ok(s);
    }
    let s = Saved { nonce_prefix: random_hex(), ..Saved::default() };
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

/// A MESSAGE_CREATE worth answering (`None`: a bot's, empty, or not a message). `me` is our
/// bot's user id (READY), `allowed` is `allowed_chats`. A message in a guild (it has a
/// `guild_id`) is a group's; it is addressed when its `mentions` name us or it replies to our
/// message (`referenced_message`; docs/resources/message "Message Object").
fn parse_message(d: &Value, me: Option<&str>, allowed: &[String]) -> Option<Inbound> {
    if d["author"]["bot"] == Value::Bool(true) {
        return None;
    }
    let id = d["id"].as_str()?;
    let attachments = attachments(d);
    // A message that is only a file has empty `content`.
    let text = d["content"].as_str().filter(|t| !t.trim().is_empty() || !attachments.is_empty())?;
    let chat = d["channel_id"].as_str()?;
    let user = d["author"]["id"].as_str()?;
    let sent_at = id
        .parse::<u64>()
        .ok()
        .map(|n| SystemTime::UNIX_EPOCH + Duration::from_millis((n >> 22).saturating_add(DISCORD_EPOCH_MS)));
    let mentioned = me.is_some_and(|me| {
        d["mentions"].as_array().is_some_and(|ms| ms.iter().any(|u| u["id"].as_str() == Some(me)))
            || d["referenced_message"]["author"]["id"].as_str() == Some(me)
    });
    let guild = d["guild_id"].as_str().is_some_and(|g| !g.is_empty());
    Some(Inbound {
        event_id: id.to_owned(),
        chat_id: chat.to_owned(),
        user_id: user.to_owned(),
        text: text.to_owned(),
        sent_at,
        chat: if guild { ChatKind::Group } else { ChatKind::Direct },
        listed: allowed.iter().any(|a| a == chat),
        addressed: mentioned,
        attachments,
    })
}

/// The files a message carries: its `attachments[]` (docs/resources/message "Attachment
/// Object": `filename`, `content_type` when Discord knows it, `size`, `url` on the CDN), each
/// fetched by its `url`.
fn attachments(d: &Value) -> Vec<Attachment> {
    let Some(list) = d["attachments"].as_array() else { return Vec::new() };
    list.iter()
        .filter_map(|a| {
            Some(Attachment {
                name: a["filename"].as_str().unwrap_or("file").to_owned(),
                declared: a["content_type"].as_str().unwrap_or_default().to_owned(),
                size: a["size"].as_u64(),
                fetch: a["url"].as_str().filter(|u| !u.is_empty())?.to_owned(),
                outcome: None,
            })
        })
        .collect()
}

/// The live session (from READY, or the saved one being resumed).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    id: String,
    resume_url: String,
}

#[derive(Debug, Default)]
struct Heartbeat {
    interval: Duration,
    next: Option<Instant>,
    acked: bool,
}

/// The receive side: one gateway connection.
pub struct GatewayRx {
    rest: Rest,
    /// Downloads from the CDN: no `Authorization` (its URLs are signed; the bot token is for
    /// the API only).
    cdn: ureq::Agent,
    files: FileHosts,
    token: String,
    tls: gatewarden_net::ClientTls,
    /// `ws://` allowed (an `http://` API base: tests).
    plain_ok: bool,
    allowed: Vec<String>,
    path: Option<PathBuf>,
    saved: Saved,
    saved_at: Instant,
    socket: Option<Socket>,
    session: Option<Session>,
    /// The last `s` received (heartbeats carry it).
    received_seq: u64,
    heartbeat: Heartbeat,
    /// Dispatches read while connecting (a resume's replay), for the next receive.
    queue: Vec<Payload>,
    /// The `s` past the last batch, saved once it is journaled, and whether the batch had
    /// messages (an idle one is saved only now and then).
    pending: Option<u64>,
    pending_busy: bool,
    /// A session that could not be resumed: reported with the next batch.
    gap: Option<String>,
    /// Reconnect before the next read (op 7, resumable op 9), with the reason.
    reopen: Option<String>,
    /// Our own user id (READY).
    me: Option<String>,
    /// A failure held back until the batch read before it is journaled.
    failed: Option<Failure>,
}

impl GatewayRx {
    fn hang(&mut self) {
        if let Some(mut s) = self.socket.take() {
            s.close(CLOSE_RESUMABLE);
        }
    }

    /// Forgets the session: the next connect identifies, and the gap is reported.
    fn lose_session(&mut self, why: &str) {
        if self.session.take().is_some() || self.saved.session_id.is_some() {
            self.gap = Some(format!(
                "the Discord session could not be resumed ({why}); messages sent since the last journaled one are not answered"
            ));
        }
        self.saved.session_id = None;
        self.saved.resume_gateway_url = None;
        self.saved.seq = 0;
        self.received_seq = 0;
    }

    fn identify(&mut self) -> Result<(), Failure> {
        let identify = json!({"op": 2, "d": {
            "token": self.token,
            "intents": INTENTS,
            "properties": {"os": std::env::consts::OS, "browser": "gatewarden", "device": "gatewarden"},
        }});
        self.send(&identify)
    }

    fn send(&mut self, v: &Value) -> Result<(), Failure> {
        let Some(s) = self.socket.as_mut() else { return Err(Failure::Lost("no gateway connection".into())) };
        s.send(v).map_err(|e| Failure::Lost(e.to_string()))
    }

    /// Opens a connection and identifies or resumes, reading up to READY or RESUMED (queueing
    /// the replay on the way).
    fn open_session(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        self.hang();
        self.queue.clear();
        self.pending = None;
        // No heartbeat is due before this connection's HELLO.
        self.heartbeat = Heartbeat::default();
        let resume = self.saved.session_id.clone().zip(self.saved.resume_gateway_url.clone());
        let url = match &resume {
            Some((_, url)) => url.clone(),
            None => self.rest.gateway_url().map_err(rest_failure)?,
        };
        let target: WsUrl = parse_url(&url, self.plain_ok).map_err(|e| match e {
            // A URL we refuse is a configuration problem, not a passing one.
            SocketError::Url(m) => Failure::Rejected(m),
            SocketError::Lost(m) => Failure::Down(m),
        })?;
        let socket = Socket::open(&target, &self.tls, CONNECT_TIMEOUT).map_err(|e| Failure::Down(e.to_string()))?;
        self.socket = Some(socket);
        let end = Instant::now() + CONNECT_TIMEOUT;
        // HELLO first.
        let hello = loop {
            match self.read_until(end)? {
                Some(p) if p.op == 10 => break p,
                Some(_) => {}
                None => return Err(self.lost("no HELLO from the gateway")),
            }
        };
        let ms = hello.d["heartbeat_interval"].as_u64().unwrap_or(41_250).clamp(100, 600_000);
        self.heartbeat = Heartbeat {
            interval: Duration::from_millis(ms),
            next: Some(Instant::now() + Duration::from_millis(ms).mul_f64(jitter())),
            acked: true,
        };
        match &resume {
            Some((id, url)) => {
                self.session = Some(Session { id: id.clone(), resume_url: url.clone() });
                self.received_seq = self.saved.seq;
                let r = json!({"op": 6, "d": {"token": self.token, "session_id": id, "seq": self.saved.seq}});
                self.send(&r)?;
            }
            None => self.identify()?,
        }
        loop {
            let Some(p) = self.read_until(end)? else {
                return Err(self.lost("no READY or RESUMED from the gateway"));
            };
            match (p.op, p.t.as_deref()) {
                (0, Some("READY")) => {
                    let id = p.d["session_id"].as_str().unwrap_or_default().to_owned();
                    // Before `resume_gateway_url` existed, sessions resumed where they began.
                    let resume_url =
                        p.d["resume_gateway_url"].as_str().filter(|u| !u.is_empty()).unwrap_or(url.as_str()).to_owned();
                    self.me = p.d["user"]["id"].as_str().map(str::to_owned);
                    self.session = Some(Session { id, resume_url });
                    self.take(p);
                    // A new session is saved at once: READY carries no message, so nothing awaits
                    // the journal, and a restart before the first batch's confirm then resumes
                    // this session instead of identifying anew (which loses what this one was
                    // sent meanwhile). A failed save is reported by the next confirm.
                    if self.queue.iter().all(|q| q.t.as_deref() != Some("MESSAGE_CREATE")) {
                        let _ = self.save_session(self.received_seq);
                    }
                    return Ok(());
                }
                (0, Some("RESUMED")) => {
                    self.take(p);
                    return Ok(());
                }
                (0, _) => self.take(p),
                (9, _) if p.d == Value::Bool(true) && resume.is_some() => {
                    // Resumable, but not now: a new connection resumes.
                    return Err(self.lost("INVALID_SESSION (resumable) while resuming"));
                }
                (9, _) => {
                    // "wait a random amount of time—between 1 and 5 seconds—then send a fresh
                    // Opcode 2 Identify".
                    self.lose_session("INVALID_SESSION");
                    self.queue.clear();
                    ctx.pause(Duration::from_secs(1) + Duration::from_secs(4).mul_f64(jitter()));
                    if ctx.ending() {
                        return Err(self.lost("draining"));
                    }
                    self.identify()?;
                }
                _ => {}
            }
        }
    }

    /// Saves the live session with `seq`, the position past what is journaled.
    fn save_session(&mut self, seq: u64) -> Result<(), String> {
        self.saved.seq = seq;
        if let Some(s) = &self.session {
            self.saved.session_id = Some(s.id.clone());
            self.saved.resume_gateway_url = Some(s.resume_url.clone());
        }
        self.saved_at = Instant::now();
        match &self.path {
            Some(p) => save(p, &self.saved).map_err(|e| format!("cannot save the Discord session: {e}")),
            None => Ok(()),
        }
    }

    fn lost(&mut self, why: &str) -> Failure {
        self.hang();
        Failure::Lost(why.to_owned())
    }

    /// Queues a dispatch for the next batch.
    fn take(&mut self, p: Payload) {
        if let Some(s) = p.s {
            self.received_seq = self.received_seq.max(s);
        }
        if self.queue.len() < MAX_QUEUE {
            self.queue.push(p);
        } else {
            // Beyond the bound the rest is replayed again by the next resume.
            self.reopen = Some("too many replayed events at once".into());
        }
    }

    /// Reads one payload before `end`, answering heartbeats on the way. `None`: time is up.
    fn read_until(&mut self, end: Instant) -> Result<Option<Payload>, Failure> {
        loop {
            let now = Instant::now();
            if now >= end {
                return Ok(None);
            }
            self.heartbeat_if_due(now)?;
            let mut wait = (end - now).min(READ_SLICE);
            if let Some(next) = self.heartbeat.next {
                wait = wait.min(next.saturating_duration_since(now).max(Duration::from_millis(1)));
            }
            let Some(socket) = self.socket.as_mut() else { return Err(Failure::Lost("no gateway connection".into())) };
            match socket.read(wait) {
                Ok(Frame::Idle) => {}
                Ok(Frame::Closed(code, reason)) => return Err(self.closed(code, &reason)),
                Ok(Frame::Payload(p)) => match p.op {
                    11 => self.heartbeat.acked = true,
                    1 => {
                        // The gateway asks for a heartbeat now.
                        let hb = json!({"op": 1, "d": self.seq_json()});
                        self.send(&hb)?;
                    }
                    _ => return Ok(Some(p)),
                },
                Err(e) => return Err(self.lost(&e.to_string())),
            }
        }
    }

    fn seq_json(&self) -> Value {
        if self.received_seq == 0 { Value::Null } else { json!(self.received_seq) }
    }

    fn heartbeat_if_due(&mut self, now: Instant) -> Result<(), Failure> {
        let Some(next) = self.heartbeat.next else { return Ok(()) };
        if now < next {
            return Ok(());
        }
        if !self.heartbeat.acked {
            // "If a client does not receive a heartbeat ACK between its attempts at sending
            // heartbeats, … terminate the connection with a non-1000 close code, reconnect, and
            // attempt to Resume."
            return Err(self.lost("no heartbeat ACK from the gateway; reconnecting to resume"));
        }
        let hb = json!({"op": 1, "d": self.seq_json()});
        self.send(&hb)?;
        self.heartbeat.acked = false;
        self.heartbeat.next = Some(now + self.heartbeat.interval);
        Ok(())
    }

    /// The server closed: what the code asks for.
    fn closed(&mut self, code: Option<u16>, reason: &str) -> Failure {
        self.hang();
        let Some(code) = code else { return Failure::Lost("the gateway closed the connection".into()) };
        match close_action(code) {
            CloseAction::Fatal(why) => Failure::Rejected(format!("Discord closed the gateway with {why}")),
            CloseAction::NewSession => {
                self.lose_session(&format!("close {code} {reason}"));
                Failure::Lost(format!("the gateway closed with {code} {reason}; identifying anew"))
            }
            CloseAction::Resume => Failure::Lost(format!("the gateway closed with {code} {reason}; resuming")),
        }
    }

    /// Turns queued dispatches into the batch, and moves the pending `seq`.
    fn drain_queue(&mut self, messages: &mut Vec<Inbound>) {
        for p in std::mem::take(&mut self.queue) {
            if let Some(s) = p.s {
                self.pending = Some(self.pending.map_or(s, |x| x.max(s)));
            }
            if p.t.as_deref() != Some("MESSAGE_CREATE") {
                continue;
            }
            if let Some(m) = parse_message(&p.d, self.me.as_deref(), &self.allowed)
                && Some(&m.user_id) != self.me.as_ref()
            {
                messages.push(m);
                self.pending_busy = true;
            }
        }
    }
}

fn rest_failure(e: RestError) -> Failure {
    match e {
        RestError::Unauthorized(m) => Failure::Rejected(format!("GET /gateway/bot: {m}")),
        RestError::Limited(d) => Failure::RateLimited(Some(d)),
        e => Failure::Down(format!("GET /gateway/bot: {e}")),
    }
}

impl skeleton::Receiver for GatewayRx {
    fn connect(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        self.reopen = None;
        self.failed = None;
        self.open_session(ctx)
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        self.pending = None;
        self.pending_busy = false;
        if let Some(f) = self.failed.take() {
            return Err(f);
        }
        let mut messages = Vec::new();
        if self.queue.is_empty()
            && let Some(why) = self.reopen.take()
        {
            // Op 7 or a resumable op 9: resume on a new connection now, unjournaled dispatches
            // included (the resume starts from the saved `seq`).
            self.open_session(ctx).map_err(|f| match f {
                Failure::Lost(m) => Failure::Lost(format!("{why}: {m}")),
                other => other,
            })?;
        }
        self.drain_queue(&mut messages);
        let end = Instant::now() + budget.unwrap_or(RECEIVE_SLICE).min(RECEIVE_SLICE);
        while messages.is_empty() && self.reopen.is_none() && !ctx.ending() {
            let p = match self.read_until(end) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                // What was read before the failure is journaled first (its `seq` saved), so the
                // resume replays less.
                Err(f) if self.pending.is_some() => {
                    self.failed = Some(f);
                    break;
                }
                Err(f) => return Err(f),
            };
            match p.op {
                0 => {
                    self.take(p);
                    self.drain_queue(&mut messages);
                }
                7 => self.reopen = Some("the gateway asked to reconnect (op 7)".into()),
                9 if p.d == Value::Bool(true) => self.reopen = Some("INVALID_SESSION (resumable)".into()),
                9 => {
                    self.lose_session("INVALID_SESSION");
                    return Err(self.lost("INVALID_SESSION (not resumable); identifying anew"));
                }
                _ => {}
            }
        }
        Ok(Batch { messages, gap: self.gap.take() })
    }

    /// Saves the session and the `seq` past the journaled batch.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let Some(seq) = self.pending.take() else { return Ok(()) };
        let session_changed = self.session.as_ref().map(|s| &s.id) != self.saved.session_id.as_ref();
        // An idle batch (no message: heartbeats' neighbours, guild events) need not cost an
        // fsync every time: resuming from an older `seq` replays them, and they answer nothing.
        let busy = std::mem::take(&mut self.pending_busy);
        if !busy && !session_changed && self.saved_at.elapsed() < SAVE_IDLE_EVERY {
            self.saved.seq = seq;
            return Ok(());
        }
        self.save_session(seq)
    }

    fn disconnect(&mut self) {
        self.hang();
    }

    /// `GET` of the attachment's CDN `url`, without the bot token (the URL is signed), and only
    /// from Discord's CDN hosts (or a configured `api_base`'s origin: filexfer.rs).
    fn fetch(
        &mut self,
        _ctx: &Ctx,
        a: &Attachment,
        timeout: Duration,
    ) -> Result<Box<dyn std::io::Read + Send>, String> {
        self.files.check(&a.fetch)?;
        crate::filexfer::download(&self.cdn, &a.fetch, None, timeout)
    }

    fn hang_up(&mut self) -> Vec<Inbound> {
        self.hang();
        Vec::new()
    }
}

/// The send side: Create Message for replies; Trigger Typing Indicator, and Create, Edit and
/// Delete Message for previews, all through one [`Rest`] (one set of route buckets).
pub struct Poster {
    rest: Rest,
    nonce_prefix: String,
}

/// The enforced nonce of one piece (at most 25 characters; longer: none).
fn nonce(prefix: &str, id: PieceId) -> Option<String> {
    let n = format!("{prefix}{}.{}", id.seq, id.index);
    (n.len() <= 25).then_some(n)
}

/// A REST failure as the skeleton's sender takes it.
fn send_error(e: RestError) -> SendError {
    match e {
        RestError::Limited(d) => SendError::RateLimited(Some(d)),
        RestError::Rejected(m) | RestError::Gone(m) => SendError::Rejected(m),
        RestError::Unauthorized(m) => SendError::Unauthorized(m),
        e @ (RestError::Network(_) | RestError::Server(_)) => SendError::Failed(e.to_string()),
    }
}

impl skeleton::Sender for Poster {
    fn send(&mut self, chat: &str, piece: &str, id: PieceId) -> Result<(), SendError> {
        let nonce = nonce(&self.nonce_prefix, id);
        self.rest.create_message(chat, piece, nonce.as_deref(), SEND_TIMEOUT).map(drop).map_err(send_error)
    }

    /// Create Message with the file as `files[0]` (multipart, docs/reference "Uploading
    /// Files"), with the same enforced nonce as a text piece: a resend after a crash within
    /// Discord's nonce window returns the first message instead of uploading a second one;
    /// past the window the worst case is one duplicate, as for text.
    fn send_file(&mut self, chat: &str, file: &OutFile, id: PieceId) -> Result<(), SendError> {
        let nonce = nonce(&self.nonce_prefix, id);
        self.rest.upload_message(chat, file, nonce.as_deref(), UPLOAD_TIMEOUT).map(drop).map_err(send_error)
    }

    /// Trigger Typing Indicator. Discord shows it for about 10 s, or until the bot's next
    /// message in the channel, so `off` needs no call.
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if !on {
            return Ok(());
        }
        self.rest.trigger_typing(chat, SHOW_TIMEOUT).map_err(send_error)
    }

    /// A preview is a message of its own (Create Message, no nonce: it is not a reply), then
    /// Edit Message of it.
    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        match shown {
            None => match self.rest.create_message(chat, text, None, SHOW_TIMEOUT).map_err(send_error)? {
                Some(id) => {
                    // The new message ended the typing indicator: it is shown again at once rather
                    // than at the next refresh (best-effort, like the indicator itself).
                    let _ = self.rest.trigger_typing(chat, SHOW_TIMEOUT);
                    Ok(Some(id))
                }
                None => Err(SendError::Failed("Create Message returned no message id".into())),
            },
            Some(id) => {
                self.rest.edit_message(chat, id, text, SHOW_TIMEOUT).map_err(send_error)?;
                Ok(Some(id.to_owned()))
            }
        }
    }

    /// Delete Message (one already gone, Unknown Message, counts as done: rest.rs).
    fn unpreview(&mut self, chat: &str, shown: &str) -> Result<(), SendError> {
        self.rest.delete_message(chat, shown, SHOW_TIMEOUT).map_err(send_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_and_bots_and_empty_ones_are_skipped() {
        let d = json!({"id": "1177000000000000000", "channel_id": "42", "author": {"id": "7"}, "content": "hi"});
        let m = parse_message(&d, None, &[]).unwrap();
        assert_eq!(
            (m.event_id.as_str(), m.chat_id.as_str(), m.user_id.as_str(), m.text.as_str()),
            ("1177000000000000000", "42", "7", "hi")
        );
        let t = m.sent_at.unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
        assert_eq!(t, (1_177_000_000_000_000_000u64 >> 22) + DISCORD_EPOCH_MS, "the snowflake's time");
        let bot = json!({"id": "2", "channel_id": "42", "author": {"id": "7", "bot": true}, "content": "hi"});
        assert!(parse_message(&bot, None, &[]).is_none());
        let empty = json!({"id": "3", "channel_id": "42", "author": {"id": "7"}, "content": ""});
        assert!(parse_message(&empty, None, &[]).is_none(), "no content: the message-content intent is missing");
        assert!(parse_message(&json!("garbage"), None, &[]).is_none());
    }

    /// `attachments[]` become the message's files, fetched by their CDN `url`; a message that
    /// is only a file is delivered with empty text; an attachment without a URL is skipped.
    #[test]
    fn attachments_are_taken_and_a_file_alone_is_a_message() {
        let d = json!({"id": "9", "channel_id": "42", "author": {"id": "7"}, "content": "", "attachments": [
            {"id": "1", "filename": "cat.png", "content_type": "image/png", "size": 1234,
             "url": "https://cdn.discordapp.com/attachments/42/1/cat.png?ex=1&is=2&hm=3", "proxy_url": "https://media.discordapp.net/x"},
            {"id": "2", "filename": "notes", "size": 5, "url": "https://cdn.discordapp.com/attachments/42/2/notes"},
            {"id": "3", "filename": "gone.txt", "size": 5}]});
        let m = parse_message(&d, None, &[]).unwrap();
        assert_eq!(m.text, "");
        assert_eq!(m.attachments.len(), 2);
        let a = &m.attachments[0];
        assert_eq!(
            (a.name.as_str(), a.declared.as_str(), a.size, a.fetch.as_str()),
            ("cat.png", "image/png", Some(1234), "https://cdn.discordapp.com/attachments/42/1/cat.png?ex=1&is=2&hm=3")
        );
        assert_eq!((m.attachments[1].declared.as_str(), m.attachments[1].size), ("", Some(5)), "no content_type");
        let hosts = FileHosts::new(DEFAULT_API_BASE, DEFAULT_API_BASE, CDN_HOSTS);
        assert!(hosts.check(&a.fetch).is_ok());
        assert!(hosts.check("https://discord.com/api/v10/x").is_err(), "the API host is not the CDN");
        let none = json!({"id": "9", "channel_id": "42", "author": {"id": "7"}, "content": "", "attachments": []});
        assert!(parse_message(&none, None, &[]).is_none(), "no text and no file");
    }

    /// A guild message is a group's; a mention of the bot or a reply to its message addresses
    /// it; `listed` is what allowed_chats says.
    #[test]
    fn guilds_mentions_and_replies() {
        let me = Some("900");
        let base = json!({"id": "5", "channel_id": "42", "author": {"id": "7"}, "content": "hi"});
        let with = |extra: Value| {
            let mut d = base.clone();
            if let (Some(d), Some(x)) = (d.as_object_mut(), extra.as_object()) {
                d.extend(x.clone());
            }
            parse_message(&d, me, &["42".to_owned()]).unwrap()
        };
        let dm = with(json!({}));
        assert_eq!((dm.chat, dm.listed, dm.addressed), (ChatKind::Direct, true, false));
        let g = with(json!({"guild_id": "1"}));
        assert_eq!((g.chat, g.addressed), (ChatKind::Group, false));
        assert!(with(json!({"guild_id": "1", "mentions": [{"id": "900"}]})).addressed);
        assert!(!with(json!({"guild_id": "1", "mentions": [{"id": "901"}]})).addressed);
        assert!(with(json!({"guild_id": "1", "referenced_message": {"author": {"id": "900"}}})).addressed);
        assert!(!parse_message(&base, me, &[]).unwrap().listed);
    }

    #[test]
    fn nonces_fit_discords_25_characters() {
        let p = random_hex();
        assert_eq!(p.len(), 8);
        assert_eq!(nonce("abcd1234", PieceId { seq: 7, index: 2 }).as_deref(), Some("abcd12347.2"));
        assert!(nonce("abcd1234", PieceId { seq: i64::MAX, index: 0 }).is_none());
    }

    #[test]
    fn the_session_file_is_created_once_and_survives_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platforms").join("discord-d.json");
        let first = load(Some(&path)).unwrap();
        assert_eq!((first.session_id.as_deref(), first.seq), (None, 0));
        assert_eq!(load(Some(&path)).unwrap(), first, "the nonce prefix is durable before any send");
        let s =
            Saved { session_id: Some("s".into()), resume_gateway_url: Some("wss://r".into()), seq: 9, ..first.clone() };
        save(&path, &s).unwrap();
        assert_eq!(load(Some(&path)).unwrap(), s);
        std::fs::write(&path, b"garbage").unwrap();
        assert_eq!(load(Some(&path)).unwrap().session_id, None);
    }
}
