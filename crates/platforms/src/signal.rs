//! Signal adapter: signal-cli's own JSON-RPC daemon over HTTP (`signal-cli -a +NUMBER daemon
//! --http 127.0.0.1:8080 --receive-mode=manual`), `receive` to read, `send` to reply.
//!
//! - **Which mode, and what a restart can lose.** signal-cli takes a message from Signal's
//!   server (and acknowledges it there) once, and hands it over once: it has no client
//!   acknowledgement. In its default `on-start` receive mode the daemon receives all the time
//!   and gives each message to whoever listens on `/api/v1/events` at that moment, so what
//!   arrives while the gateway is down or restarting is gone. With `--receive-mode=manual`
//!   nothing is taken from Signal's server until a client asks, so messages wait there while
//!   the gateway is down; the adapter asks with the `receive` method, one bounded call at a
//!   time, and journals what it returns: while the chat is quiet a call waits up to
//!   [`RECEIVE_WAIT`] for one message (`maxMessages` 1: it returns as soon as one arrives), and
//!   after a message the next calls gather a burst ([`FOLLOW_WAIT`] of silence or
//!   [`MAX_MESSAGES`] messages) until one comes back empty (`Limits::redelivers = false`: the
//!   skeleton retries a failed commit, then reports the loss). A graceful restart loses
//!   nothing: the drain lets the call in flight finish and journals its answer. **The worst
//!   case** is a crash (kill -9) while a `receive` is in flight: the daemon goes on taking
//!   messages for that call (one in a quiet chat, up to [`MAX_MESSAGES`] in a burst) and its
//!   answer reaches no one; or the gateway dies before it journaled all of an answer in hand.
//!   Those messages are lost: one answer per crash (asserted in
//!   crates/gatewarden/tests/platform_signal.rs). The SSE stream would not avoid it (its
//!   events are unacknowledged too, and it also loses what is written into a stream that is
//!   being closed), so it is not used.
//! - **Another receiver.** A second `receive` while one runs is refused by the daemon ("already
//!   being received"), which is also what an `on-start` daemon answers every time: a
//!   [`Failure::Conflict`](skeleton::Failure) naming both causes, retried with backoff, then
//!   `standby` past `conflict_standby_s`. After a crash, the orphaned call ends within about a
//!   second, and the successor's `receive` goes through.
//! - **Version and the wrapper.** At connect, `version` (signal-cli-jsonrpc(5)); a base that
//!   has no `/api/v1/rpc` but answers `GET /v1/about` with a `versions` list is bbernhard's
//!   signal-cli-rest-api, whose REST API (`/v2/send`, `/v1/receive/…`) is another protocol:
//!   `degraded` saying what to run instead, retried with the skeleton's backoff (up to 15 s),
//!   never in a tight loop. The 0.14.6 change of `GET /api/v1/events?account=` (a raw `+` kept,
//!   an ACI accepted; before it, `+` decoded to a space, so only `%2B` worked) does not touch
//!   this adapter, which names its account only inside JSON bodies, the same in every version.
//! - **Accounts.** `listAccounts` answers in multi-account mode (`signal-cli daemon --http`):
//!   the account must be one of them, else the adapter is parked (the bad credential), and
//!   every request names it (`params.account`). In single-account mode (`-a NUMBER daemon`)
//!   there is no `listAccounts` and no `account` param; an answer for another number parks.
//!   The credential lock is keyed by the number.
//! - **Chats.** A group message is the chat `<groupId>` (base64) and replies go to `groupId`; a
//!   direct message is the sender's number (else its ACI) and replies go to `recipient`.
//!   Addressed: a mention of our number, or a quote (reply) of our message. Only `dataMessage`s
//!   with text are answered: receipts, typing, sync messages (our own, from linked devices),
//!   reactions and edits are not.
//! - **Replies.** `send`, pieces of at most [`MAX_TEXT_BYTES`] UTF-8 bytes: signal-cli sends a
//!   longer body as a truncated text plus a `text/x-signal-plain` attachment
//!   (lib/…/config/ServiceConfig.java `MAX_MESSAGE_SIZE_BYTES = 2000` in AsamK/signal-cli).
//!   `-5` (rate limited) waits its `retryAfterSeconds`; `-1` (unregistered user, not a group
//!   member) rejects the entry. No idempotency key: a crash between a send and the outbox
//!   commit sends that piece again.
//! - **Files** (issue 29; signal-cli-jsonrpc(5)). In: a `dataMessage`'s `attachments[]`
//!   (`contentType`, `filename`, `id`, `size`; a message of only files is still a message),
//!   fetched with `getAttachment` (`id`, and `recipient` the sender or `groupId` the group),
//!   whose answer is the file as base64 `data` (GetAttachmentCommand.java): the answer is read
//!   bounded by the store's per-file bound in base64 (4/3 of it, plus the envelope) before it
//!   is decoded, so a lying or huge answer is refused without being held. Out: `send` with
//!   `attachments: ["data:<type>;filename=<name>;base64,<data>"]` (the man page's data URI, the
//!   name URL-encoded as DataURI.java decodes it) and an empty `message`; the base64 is
//!   encoded as the request streams from the store, never whole in memory. No idempotency
//!   key: Signal's timestamp makes a resend a new message, so a crash between the send and the
//!   outbox commit sends that entry's files again (worst case one duplicate, as for text).
//! - **The agent at work.** `sendTyping` (and `stop: true` at the end); Signal clients show it
//!   for 15 s, so the skeleton's 4 s refresh is sent at most every [`TYPING_EVERY`]. No
//!   previews: they would be edits, which Signal clients list as edited messages.
//!
//! Plain HTTP to a loopback daemon (it has no authentication); an `https://` `api_base` (a
//! TLS front) goes through crates/net like every adapter. The loops, states and drain are the
//! skeleton's (crates/platforms/src/skeleton).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::{Signal as Settings, e164_ok};
use gatewarden_net::Outbound;
use serde_json::{Value, json};

use crate::attachments::Attachment;
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// `signal-cli daemon --http`'s default address.
pub const DEFAULT_API_BASE: &str = "http://127.0.0.1:8080";
/// Bytes per reply piece (signal-cli's `MAX_MESSAGE_SIZE_BYTES`).
pub const MAX_TEXT_BYTES: usize = 2000;
/// A `receive` of a quiet chat returns after this long without a message (or at the first).
pub const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// A `receive` after a message returns after this long without another (a burst's gather).
pub const FOLLOW_WAIT: Duration = Duration::from_millis(25);
/// A `receive` returns after this many messages: what one crash can lose at most.
pub const MAX_MESSAGES: u32 = 8;
/// Bound on every other call.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_BODY_BYTES: u64 = 16 << 20;
/// Bound on one file's `send` (the base64 streamed from the store).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Files one message carries at most (Signal's clients send up to 32).
const MAX_FILES: usize = 32;
/// The per-file bound `getAttachment` answers are read under when the store names none.
const DEFAULT_MAX_FILE: u64 = 20 << 20;
/// The JSON around a `getAttachment` answer's base64.
const ANSWER_OVERHEAD: u64 = 64 << 10;
/// A typing notice lasts 15 s on Signal's clients: refreshed this often, not every 4 s.
pub const TYPING_EVERY: Duration = Duration::from_secs(10);

/// signal-cli's JSON-RPC error codes (SignalJsonRpcCommandHandler.java, JsonRpcResponse.java).
const USER_ERROR: i64 = -1;
const IO_ERROR: i64 = -3;
const UNTRUSTED_KEY_ERROR: i64 = -4;
const RATELIMIT_ERROR: i64 = -5;
const INVALID_PARAMS: i64 = -32602;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
enum RpcError {
    /// No answer (connect, timeout, unreadable body).
    Network(String),
    /// An HTTP answer that is not JSON-RPC (404: no `/api/v1/rpc` here).
    Http(u16),
    /// A JSON-RPC error.
    Rpc { code: i64, message: String, data: Value },
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Network(m) => write!(f, "cannot reach the signal-cli daemon: {m}"),
            RpcError::Http(s) => write!(f, "HTTP {s}"),
            RpcError::Rpc { code, message, .. } => write!(f, "{message} (JSON-RPC error {code})"),
        }
    }
}

/// `retryAfterSeconds` of a rate-limited send (`data.response.results[]`).
fn retry_after(data: &Value) -> Option<Duration> {
    data["response"]["results"]
        .as_array()?
        .iter()
        .filter_map(|r| r["retryAfterSeconds"].as_u64())
        .max()
        .map(Duration::from_secs)
}

/// The daemon's "another receive is running" (ManagerImpl.java's AlreadyReceivingException).
fn already_receiving(e: &RpcError) -> bool {
    matches!(e, RpcError::Rpc { code: USER_ERROR, message, .. } if message.contains("already being received"))
}

/// The account is not the daemon's (multi-account mode).
fn unknown_account(e: &RpcError) -> bool {
    matches!(e, RpcError::Rpc { code: INVALID_PARAMS, message, .. }
        if message.contains("account does not exist") || message.contains("requires valid account"))
}

/// The daemon's JSON-RPC endpoint.
#[derive(Clone)]
struct Rpc {
    http: ureq::Agent,
    base: String,
    /// `Some(account)` in multi-account mode: named in every request.
    account_param: Option<String>,
}

impl Rpc {
    fn new(base: &str, out: &Outbound) -> Rpc {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        Rpc { http, base: base.trim_end_matches('/').to_owned(), account_param: None }
    }

    fn call(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
        self.call_limited(method, params, timeout, MAX_BODY_BYTES)
    }

    /// The request body of `method` with `params` (the account named in multi-account mode).
    fn request(&self, method: &str, mut params: Value) -> Value {
        if let (Some(a), Some(p)) = (&self.account_param, params.as_object_mut()) {
            p.insert("account".into(), json!(a));
        }
        json!({"jsonrpc": "2.0", "method": method, "params": params, "id": method})
    }

    /// [`Rpc::call`] reading at most `limit` bytes of the answer.
    fn call_limited(&self, method: &str, params: Value, timeout: Duration, limit: u64) -> Result<Value, RpcError> {
        let url = format!("{}/api/v1/rpc", self.base);
        let body = self.request(method, params);
        let response = self
            .http
            .post(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send_json(&body)
            .map_err(|e| RpcError::Network(gatewarden_net::describe(&e, &url)))?;
        Rpc::answer(response, limit)
    }

    /// A request whose body is streamed (`length` bytes of JSON from `body`).
    fn call_streamed(
        &self,
        body: Box<dyn std::io::Read + Send>,
        length: u64,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        let url = format!("{}/api/v1/rpc", self.base);
        let response = self
            .http
            .post(&url)
            .header("Content-Type", "application/json")
            .header("Content-Length", &length.to_string())
            .config()
            .timeout_global(Some(timeout))
            .build()
            .send(ureq::SendBody::from_owned_reader(body))
            .map_err(|e| RpcError::Network(gatewarden_net::describe(&e, &url)))?;
        Rpc::answer(response, MAX_BODY_BYTES)
    }

    fn answer(response: ureq::http::Response<ureq::Body>, limit: u64) -> Result<Value, RpcError> {
        let status = response.status().as_u16();
        let v = crate::json_body(response, limit).map_err(RpcError::Network)?;
        if status != 200 || v["jsonrpc"] != "2.0" {
            return Err(RpcError::Http(status));
        }
        match v.get("error").filter(|e| !e.is_null()) {
            Some(e) => Err(RpcError::Rpc {
                code: e["code"].as_i64().unwrap_or(0),
                message: e["message"].as_str().unwrap_or("").to_owned(),
                data: e["data"].clone(),
            }),
            None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
        }
    }

    /// `GET /v1/about`: bbernhard's signal-cli-rest-api answers `{"versions": […], …}`.
    fn wrapper_about(&self) -> Option<Value> {
        let url = format!("{}/v1/about", self.base);
        let r = self.http.get(&url).config().timeout_global(Some(CALL_TIMEOUT)).build().call().ok()?;
        if r.status().as_u16() != 200 {
            return None;
        }
        let text = r.into_body().with_config().limit(1 << 20).read_to_string().ok()?;
        serde_json::from_str::<Value>(&text).ok().filter(|v| v["versions"].is_array())
    }
}

/// What `connect` says when `base` is bbernhard's REST wrapper.
fn wrapper_message(base: &str, account: &str, about: &Value) -> String {
    format!(
        "{base} is bbernhard's signal-cli-rest-api (/v1/about: mode {}, version {}), not signal-cli's daemon: its REST API is not signal-cli's JSON-RPC; point api_base at `signal-cli -a {account} daemon --http 127.0.0.1:8080 --receive-mode=manual` instead",
        about["mode"].as_str().unwrap_or("?"),
        about["version"].as_str().unwrap_or("?"),
    )
}

/// `"0.14.6"` as numbers (missing or odd parts are 0).
fn parse_version(v: &str) -> (u32, u32, u32) {
    let mut n = v.split(['.', '-', '+']).map(|p| p.parse::<u32>().unwrap_or(0));
    (n.next().unwrap_or(0), n.next().unwrap_or(0), n.next().unwrap_or(0))
}

/// The oldest daemon with `--http` (signal-cli 0.11.10; `receive` over JSON-RPC since 0.11.5).
const OLDEST: (u32, u32, u32) = (0, 11, 10);

/// The Signal adapter.
pub type Signal = Skeleton<Proto>;

/// signal-cli's JSON-RPC over HTTP.
pub struct Proto {
    account: String,
    base: String,
    out: Outbound,
    allowed: Vec<String>,
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig) -> Result<Signal, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let start_error = |message: String| AdapterError::Start { name: cfg.adapter_name(), message };
        let account = s.account.clone().ok_or_else(|| start_error("no account is configured".into()))?;
        let out = Outbound::new(cfg.ca_file.as_deref(), None).map_err(|e| start_error(e.to_string()))?;
        let proto = Proto {
            account,
            base: s.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned()),
            out,
            allowed: cfg.allowed_chats.clone(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    // No secret: signal-cli's daemon has no authentication; the account is the credential.
    fn from_config(cfg: &PlatformConfig, _creds: &crate::Credentials<'_>) -> Result<Signal, AdapterError> {
        Signal::new(cfg)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Bytes(MAX_TEXT_BYTES),
        line_per_piece: false,
        batch: 16,
        // The daemon's -5 answers pace the replies.
        pace: None,
        // Under a budget a call may last `timeout × (maxMessages + 1)`: at least two waits.
        min_receive: Duration::from_secs(2),
        // What a `receive` returned is nowhere else: journaled, never dropped for a redelivery.
        redelivers: false,
        listens_through_drain: false,
        connected_after_receive: false,
        // The drain waits for the `receive` in flight, whose answer is journaled.
        close_grace: Duration::from_secs(3),
    };
    type Receiver = Receiver;
    type Sender = Sender;

    fn credential(&self) -> &str {
        &self.account
    }

    fn watchdog_after(&self) -> Duration {
        RECEIVE_WAIT + FOLLOW_WAIT * MAX_MESSAGES + CALL_TIMEOUT + Duration::from_secs(30)
    }

    fn open(&self, _host: &Arc<dyn Host>) -> Result<(Receiver, Sender), String> {
        let rpc = Rpc::new(&self.base, &self.out);
        let rx = Receiver {
            rpc: rpc.clone(),
            account: self.account.clone(),
            allowed: self.allowed.clone(),
            version: None,
            shared: Arc::new(std::sync::Mutex::new(None)),
            following: false,
        };
        let tx = Sender { rpc, mode: Arc::clone(&rx.shared), typing: HashMap::new() };
        Ok((rx, tx))
    }
}

/// The account param both halves use, once `connect` learned the daemon's mode.
type Mode = Arc<std::sync::Mutex<Option<Option<String>>>>;

/// The receive side: `version`, `listAccounts`, then `receive` calls.
pub struct Receiver {
    rpc: Rpc,
    account: String,
    allowed: Vec<String>,
    version: Option<String>,
    shared: Mode,
    /// The last `receive` brought messages: gather the rest of the burst.
    following: bool,
}

impl skeleton::Receiver for Receiver {
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        self.rpc.account_param = None;
        let version = match self.rpc.call("version", json!({}), CALL_TIMEOUT) {
            Ok(v) => v["version"].as_str().unwrap_or("unknown").to_owned(),
            // signal-cli 0.14.4 validates the Host header against its --http address (CHANGELOG.md).
            Err(RpcError::Http(421)) => {
                return Err(Failure::Down(format!(
                    "the signal-cli daemon at {} refused our Host header (HTTP 421: it accepts its own --http address, localhost and 127.0.0.1): set api_base to that address",
                    self.rpc.base
                )));
            }
            Err(RpcError::Http(status)) => {
                return Err(Failure::Down(match self.rpc.wrapper_about() {
                    Some(about) => wrapper_message(&self.rpc.base, &self.account, &about),
                    None => format!(
                        "no signal-cli daemon at {}: POST /api/v1/rpc answered HTTP {status} (run `signal-cli -a {} daemon --http 127.0.0.1:8080 --receive-mode=manual`)",
                        self.rpc.base, self.account
                    ),
                }));
            }
            Err(e) => return Err(Failure::Down(e.to_string())),
        };
        if version != "unknown" && parse_version(&version) < OLDEST {
            return Err(Failure::Down(format!("signal-cli {version} has no HTTP daemon: 0.11.10 or newer is needed")));
        }
        let multi = match self.rpc.call("listAccounts", json!({}), CALL_TIMEOUT) {
            Ok(Value::Array(list)) => {
                let numbers: Vec<&str> = list.iter().filter_map(|a| a["number"].as_str()).collect();
                if !numbers.contains(&self.account.as_str()) {
                    return Err(Failure::Rejected(format!(
                        "account {} is not registered with the signal-cli daemon at {} (it has: {}); register or link it (`signal-cli -a {} link`)",
                        self.account,
                        self.rpc.base,
                        if numbers.is_empty() { "none".to_owned() } else { numbers.join(", ") },
                        self.account
                    )));
                }
                true
            }
            Ok(_) => true,
            Err(RpcError::Network(m)) => return Err(Failure::Down(m)),
            // Single-account mode has no listAccounts.
            Err(_) => false,
        };
        self.rpc.account_param = multi.then(|| self.account.clone());
        *self.shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.rpc.account_param.clone());
        self.version = Some(version);
        Ok(())
    }

    fn receive(&mut self, _ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        let (wait, max) = receive_bounds(budget, self.following);
        let params = json!({"timeout": wait.as_secs_f64(), "maxMessages": max});
        // Never cut short by us: the daemon would take messages for an answer no one reads.
        let bound = wait * (max + 1) + CALL_TIMEOUT;
        let items = match self.rpc.call("receive", params, bound) {
            Ok(Value::Array(items)) => items,
            Ok(_) => Vec::new(),
            Err(e) if already_receiving(&e) => {
                return Err(Failure::Conflict(format!(
                    "signal-cli is already receiving for {}: another client calls receive or reads /api/v1/events, or the daemon runs in its default on-start receive mode (start it with --receive-mode=manual)",
                    self.account
                )));
            }
            Err(e) if unknown_account(&e) => {
                return Err(Failure::Rejected(format!("account {} is not the daemon's: {e}", self.account)));
            }
            Err(RpcError::Rpc { code: RATELIMIT_ERROR, data, .. }) => {
                return Err(Failure::RateLimited(retry_after(&data)));
            }
            Err(e @ RpcError::Network(_)) => return Err(Failure::Lost(e.to_string())),
            Err(e) => {
                let v = self.version.as_deref().unwrap_or("?");
                return Err(Failure::Down(format!("receive (signal-cli {v}): {e}")));
            }
        };
        self.following = !items.is_empty();
        let mut messages = Vec::new();
        for item in &items {
            if let Some(a) = item["account"].as_str().filter(|a| *a != self.account) {
                return Err(Failure::Rejected(format!(
                    "the signal-cli daemon at {} serves {a}, not {}",
                    self.rpc.base, self.account
                )));
            }
            if let Some(m) = parse_envelope(&item["envelope"], &self.account, &self.allowed) {
                messages.push(m);
            }
        }
        Ok(Batch { messages, gap: None })
    }

    /// `getAttachment` (module notes): the answer read under the store's bound, then decoded.
    fn fetch(&mut self, ctx: &Ctx, a: &Attachment, timeout: Duration) -> Result<Box<dyn std::io::Read + Send>, String> {
        let handle: Value = serde_json::from_str(&a.fetch).map_err(|_| "a malformed attachment handle".to_owned())?;
        let max = ctx.host().attachments().map_or(DEFAULT_MAX_FILE, |(_, b)| b.per_file);
        let limit = max.saturating_add(2).saturating_div(3).saturating_mul(4).saturating_add(ANSWER_OVERHEAD);
        let data = match self.rpc.call_limited("getAttachment", handle, timeout, limit) {
            Ok(v) => v,
            Err(RpcError::Network(m)) if m.contains("limit") => {
                return Err(format!("too large (> {})", crate::attachments::human_size(max)));
            }
            Err(e) => return Err(e.to_string()),
        };
        let Some(b64) = data["data"].as_str() else { return Err("getAttachment returned no data".into()) };
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format!("getAttachment returned bad base64: {e}"))?;
        Ok(Box::new(std::io::Cursor::new(bytes)))
    }
}

/// The `receive` call's `timeout` and `maxMessages`: one message within [`RECEIVE_WAIT`] while
/// the chat is quiet, a burst after a message (`following`). Each message restarts the
/// daemon's timeout, so a call lasts up to `timeout × (maxMessages + 1)`: under the host's
/// budget, `maxMessages` shrinks to fit.
fn receive_bounds(budget: Option<Duration>, following: bool) -> (Duration, u32) {
    let (wait, max) = if following { (FOLLOW_WAIT, MAX_MESSAGES) } else { (RECEIVE_WAIT, 1) };
    match budget {
        None => (wait, max),
        Some(b) => {
            let wait = wait.min(b);
            let fits = (b.as_secs_f64() / wait.as_secs_f64()).floor() as u32;
            (wait, fits.saturating_sub(1).clamp(1, max))
        }
    }
}

/// Whether `chat` is a person (a number, an ACI UUID, `u:username`, `PNI:…`) rather than a
/// group id (base64 of 32 bytes).
fn is_person(chat: &str) -> bool {
    let uuid = chat.len() == 36
        && chat
            .char_indices()
            .all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() });
    e164_ok(chat) || uuid || chat.starts_with("u:") || chat.starts_with("PNI:")
}

/// One received envelope as an inbound message (`None`: not a text message for the agent).
/// `account` is ours; `allowed` is `allowed_chats`.
fn parse_envelope(env: &Value, account: &str, allowed: &[String]) -> Option<Inbound> {
    let data = env.get("dataMessage")?;
    let has_files = data["attachments"].as_array().is_some_and(|a| !a.is_empty());
    let text = match data["message"].as_str().filter(|t| !t.trim().is_empty()) {
        Some(t) => t,
        None if has_files => "",
        None => return None,
    };
    if data.get("reaction").is_some_and(|r| !r.is_null()) || data.get("remoteDelete").is_some_and(|r| !r.is_null()) {
        return None;
    }
    let number = env["sourceNumber"].as_str().filter(|s| !s.is_empty());
    let aci = env["sourceUuid"].as_str().filter(|s| !s.is_empty());
    let user = number.or(aci)?.to_owned();
    if number == Some(account) {
        return None;
    }
    let ts = data["timestamp"].as_u64().or_else(|| env["timestamp"].as_u64())?;
    let group = data["groupInfo"]["groupId"].as_str().filter(|g| !g.is_empty());
    let (chat_id, kind) = match group {
        Some(g) => (g.to_owned(), ChatKind::Group),
        None => (user.clone(), ChatKind::Direct),
    };
    let mentioned = data["mentions"].as_array().is_some_and(|ms| ms.iter().any(|m| m["number"] == account));
    let quoted = data["quote"]["authorNumber"] == account;
    let listed = allowed.iter().any(|a| *a == chat_id || (group.is_none() && aci.is_some_and(|u| u == a)));
    let attachments = files(data, group.map_or_else(|| json!({"recipient": user}), |g| json!({"groupId": g})));
    Some(Inbound {
        // A Signal message is named by its author and timestamp (quotes and reactions name it so).
        event_id: format!("{}:{ts}", aci.unwrap_or(&user)),
        chat_id,
        user_id: user,
        text: text.to_owned(),
        sent_at: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(ts)),
        chat: kind,
        listed,
        addressed: mentioned || quoted,
        attachments,
    })
}

/// The files of a `dataMessage`, each fetched by `getAttachment` with its `id` and `whence`
/// (`recipient` the sender, or `groupId`): the handle is that call's params, as JSON.
fn files(data: &Value, whence: Value) -> Vec<Attachment> {
    let list = data["attachments"].as_array().into_iter().flatten();
    list.filter_map(|a| {
        let id = a["id"].as_str().filter(|i| !i.is_empty())?;
        let declared = a["contentType"].as_str().unwrap_or("").to_owned();
        let mut handle = whence.clone();
        handle["id"] = json!(id);
        Some(Attachment {
            name: a["filename"].as_str().filter(|f| !f.trim().is_empty()).unwrap_or(id).to_owned(),
            declared,
            size: a["size"].as_u64(),
            fetch: handle.to_string(),
            outcome: None,
        })
    })
    .take(MAX_FILES)
    .collect()
}

/// Encodes what it reads from `inner` as padded standard base64, a chunk at a time.
struct Base64Reader<R> {
    inner: R,
    out: Vec<u8>,
    pos: usize,
    done: bool,
}

impl<R: std::io::Read> std::io::Read for Base64Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use base64::Engine;
        while self.pos == self.out.len() {
            if self.done {
                return Ok(0);
            }
            // A whole chunk (a multiple of 3 bytes) unless it is the last: padding only at the end.
            let mut chunk = vec![0u8; 48 << 10];
            let mut n = 0;
            while n < chunk.len() {
                match self.inner.read(&mut chunk[n..]) {
                    Ok(0) => {
                        self.done = true;
                        break;
                    }
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            chunk.truncate(n);
            self.out = base64::engine::general_purpose::STANDARD.encode(&chunk).into_bytes();
            self.pos = 0;
        }
        let k = (self.out.len() - self.pos).min(buf.len());
        buf[..k].copy_from_slice(&self.out[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

/// The `send` request carrying `file` as a data URI (module notes), streamed: `(body, length)`.
fn file_request(rpc: &Rpc, params: Value, file: &OutFile) -> Result<(Box<dyn std::io::Read + Send>, u64), String> {
    use std::io::Read;
    let (opened, len) = gatewarden_lifecycle::fsio::open_regular(&file.path)
        .ok()
        .ok_or_else(|| format!("the stored file {} is gone", file.name))?;
    // The base64 goes where this mark is in the serialised request (no JSON escaping is needed
    // within it: base64 has none of JSON's special characters).
    let mark = format!("gatewarden-data-{}", crate::sha256_hex(file.path.to_string_lossy().as_bytes()));
    let name: String = form_urlencoded::byte_serialize(file.name.as_bytes()).collect();
    let kind: String = file.kind.chars().filter(|c| c.is_ascii_alphanumeric() || "/.+-_".contains(*c)).collect();
    let mut params = params;
    params["message"] = json!("");
    params["attachments"] = json!([format!("data:{kind};filename={name};base64,{mark}")]);
    let text = rpc.request("send", params).to_string();
    let Some((head, tail)) = text.split_once(&mark) else { return Err("cannot build the request".into()) };
    let encoded = len.div_ceil(3) * 4;
    let length = head.len() as u64 + encoded + tail.len() as u64;
    let data = Base64Reader { inner: opened.take(len), out: Vec::new(), pos: 0, done: false };
    let body = std::io::Cursor::new(head.as_bytes().to_vec())
        .chain(data)
        .chain(std::io::Cursor::new(tail.as_bytes().to_vec()));
    Ok((Box::new(body), length))
}

/// The send side: `send` and `sendTyping`.
pub struct Sender {
    rpc: Rpc,
    mode: Mode,
    /// When "typing" was last sent to each chat.
    typing: HashMap<String, Instant>,
}

impl Sender {
    fn call(&mut self, method: &str, chat: &str, params: Value) -> Result<Value, SendError> {
        let params = self.target(chat, params)?;
        self.rpc.call(method, params, CALL_TIMEOUT).map_err(send_error)
    }

    /// `params` addressed to `chat`, the account param set as `connect` learned it.
    fn target(&mut self, chat: &str, mut params: Value) -> Result<Value, SendError> {
        let Some(account) = self.mode.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Err(SendError::Lost("not connected to the signal-cli daemon yet".into()));
        };
        self.rpc.account_param = account;
        if is_person(chat) {
            params["recipient"] = json!([chat]);
        } else {
            params["groupId"] = json!(chat);
        }
        Ok(params)
    }
}

/// A failed call as the skeleton's sender takes it.
fn send_error(e: RpcError) -> SendError {
    match &e {
        RpcError::Rpc { code: RATELIMIT_ERROR, data, .. } => SendError::RateLimited(retry_after(data)),
        _ if unknown_account(&e) => SendError::Unauthorized(e.to_string()),
        RpcError::Rpc { code: USER_ERROR | UNTRUSTED_KEY_ERROR | INVALID_PARAMS, .. } => {
            SendError::Rejected(e.to_string())
        }
        RpcError::Rpc { code: IO_ERROR, .. } | RpcError::Rpc { .. } | RpcError::Http(_) => {
            SendError::Failed(e.to_string())
        }
        RpcError::Network(_) => SendError::Failed(e.to_string()),
    }
}

impl skeleton::Sender for Sender {
    fn ready(&self) -> bool {
        self.mode.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        self.call("send", chat, json!({"message": piece})).map(drop)
    }

    /// `send` with the file as a data URI (module notes).
    fn send_file(&mut self, chat: &str, file: &OutFile, _id: PieceId) -> Result<(), SendError> {
        let params = self.target(chat, json!({}))?;
        let (body, length) = file_request(&self.rpc, params, file).map_err(SendError::Rejected)?;
        self.rpc.call_streamed(body, length, UPLOAD_TIMEOUT).map(drop).map_err(send_error)
    }

    /// `sendTyping`, at most every [`TYPING_EVERY`] per chat while on; `stop: true` once off.
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if on && self.typing.get(chat).is_some_and(|t| t.elapsed() < TYPING_EVERY) {
            return Ok(());
        }
        if !on && self.typing.remove(chat).is_none() {
            return Ok(());
        }
        self.call("sendTyping", chat, json!({"stop": !on}))?;
        if on {
            self.typing.insert(chat.to_owned(), Instant::now());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "+4915100000001";

    fn env(data: Value) -> Value {
        json!({"sourceNumber": "+4917000000002", "sourceUuid": "00000000-0000-4000-8000-000000000002",
               "timestamp": 1_700_000_000_123u64, "dataMessage": data})
    }

    #[test]
    fn direct_and_group_messages() {
        let d = parse_envelope(&env(json!({"timestamp": 1_700_000_000_123u64, "message": "hi"})), ME, &[]).unwrap();
        assert_eq!(d.event_id, "00000000-0000-4000-8000-000000000002:1700000000123");
        assert_eq!(
            (d.chat_id.as_str(), d.user_id.as_str(), d.chat),
            ("+4917000000002", "+4917000000002", ChatKind::Direct)
        );
        assert_eq!(d.sent_at, Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)));
        let g = json!({"timestamp": 5, "message": "hi all", "groupInfo": {"groupId": "R3JvdXA=", "type": "DELIVER"}});
        let g = parse_envelope(&env(g), ME, &["R3JvdXA=".to_owned()]).unwrap();
        assert_eq!((g.chat_id.as_str(), g.chat, g.listed, g.addressed), ("R3JvdXA=", ChatKind::Group, true, false));
        let m = json!({"timestamp": 6, "message": "\u{fffc} ping", "groupInfo": {"groupId": "R3JvdXA="},
                       "mentions": [{"number": ME, "uuid": "x", "start": 0, "length": 1}]});
        assert!(parse_envelope(&env(m), ME, &[]).unwrap().addressed);
        let q = json!({"timestamp": 7, "message": "yes", "groupInfo": {"groupId": "R3JvdXA="}, "quote": {"id": 1, "authorNumber": ME}});
        assert!(parse_envelope(&env(q), ME, &[]).unwrap().addressed);
    }

    /// `dataMessage.attachments[]` as signal-cli prints them: each fetched by `getAttachment`
    /// with its id and the sender (or the group); a message of only files is a message.
    #[test]
    fn signal_attachments_are_parsed_with_their_fetch_params() {
        let photo =
            json!({"contentType": "image/jpeg", "filename": "a.jpg", "id": "qkcMEyCZ7sFTm2PoSjEE.jpg", "size": 2048});
        let voice = json!({"contentType": "audio/aac", "filename": null, "id": "Vx1.aac", "size": 99});
        let d = parse_envelope(&env(json!({"timestamp": 8, "attachments": [photo, voice]})), ME, &[]).unwrap();
        assert_eq!(d.text, "");
        let got: Vec<_> = d.attachments.iter().map(|a| (a.name.as_str(), a.declared.as_str(), a.size)).collect();
        assert_eq!(got, [("a.jpg", "image/jpeg", Some(2048)), ("Vx1.aac", "audio/aac", Some(99))]);
        let handle: Value = serde_json::from_str(&d.attachments[0].fetch).unwrap();
        assert_eq!(handle, json!({"recipient": "+4917000000002", "id": "qkcMEyCZ7sFTm2PoSjEE.jpg"}));
        let g = json!({"timestamp": 9, "message": "see", "groupInfo": {"groupId": "R3JvdXA="}, "attachments": [{"id": "x.png"}]});
        let g = parse_envelope(&env(g), ME, &[]).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&g.attachments[0].fetch).unwrap(),
            json!({"groupId": "R3JvdXA=", "id": "x.png"})
        );
        assert!(parse_envelope(&env(json!({"timestamp": 10, "attachments": []})), ME, &[]).is_none());
    }

    /// The streamed `send` of a file is the JSON-RPC request with its data URI, of the length
    /// announced, whatever the file's size modulo 3 (and past one encoding chunk).
    #[test]
    fn signal_file_sends_stream_a_data_uri() {
        use base64::Engine;
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        for size in [0usize, 1, 2, 3, 4, (48 << 10) + 1] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let path = dir.path().join(format!("f{size}"));
            std::fs::write(&path, &bytes).unwrap();
            let f = OutFile { name: "r port;x.txt".into(), kind: "text/plain".into(), path, size: size as u64 };
            let rpc = Rpc::new("http://127.0.0.1:1", &Outbound::new(None, None).unwrap());
            let (mut body, length) = file_request(&rpc, json!({"recipient": ["+1"]}), &f).unwrap();
            let mut out = Vec::new();
            body.read_to_end(&mut out).unwrap();
            assert_eq!(out.len() as u64, length, "size {size}");
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!((v["method"].as_str(), v["params"]["message"].as_str()), (Some("send"), Some("")));
            let uri = v["params"]["attachments"][0].as_str().unwrap();
            let data = uri.strip_prefix("data:text/plain;filename=r+port%3Bx.txt;base64,").unwrap();
            assert_eq!(base64::engine::general_purpose::STANDARD.decode(data).unwrap(), bytes, "size {size}");
        }
    }

    #[test]
    fn receipts_typing_sync_reactions_and_our_own_are_not_answered() {
        assert!(parse_envelope(&json!({"sourceNumber": "+4917000000002", "receiptMessage": {}}), ME, &[]).is_none());
        assert!(parse_envelope(&json!({"sourceNumber": "+4917000000002", "typingMessage": {}}), ME, &[]).is_none());
        assert!(parse_envelope(&json!({"sourceNumber": ME, "syncMessage": {"sentMessage": {}}}), ME, &[]).is_none());
        assert!(parse_envelope(&env(json!({"timestamp": 1, "message": "  "})), ME, &[]).is_none());
        assert!(
            parse_envelope(&env(json!({"timestamp": 1, "message": "x", "reaction": {"emoji": "👍"}})), ME, &[])
                .is_none()
        );
        let mut own = env(json!({"timestamp": 1, "message": "x"}));
        own["sourceNumber"] = json!(ME);
        assert!(parse_envelope(&own, ME, &[]).is_none());
        assert!(parse_envelope(&json!("garbage"), ME, &[]).is_none());
    }

    #[test]
    fn people_and_groups_are_told_apart() {
        assert!(is_person("+4917000000002"));
        assert!(is_person("00000000-0000-4000-8000-000000000002"));
        assert!(is_person("u:someone.01"));
        assert!(!is_person("+abc/def0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0="), "a group id may start with +");
        assert!(!is_person("R3JvdXA="));
    }

    #[test]
    fn versions_errors_and_bounds() {
        assert_eq!(parse_version("0.14.6"), (0, 14, 6));
        assert_eq!(parse_version("0.13.24-SNAPSHOT"), (0, 13, 24));
        assert!(parse_version("0.11.9") < OLDEST && parse_version("0.14.6") >= OLDEST);
        let busy = RpcError::Rpc {
            code: -1,
            message: "Receive command cannot be used if messages are already being received.".into(),
            data: Value::Null,
        };
        assert!(already_receiving(&busy));
        let gone =
            RpcError::Rpc { code: -32602, message: "Specified account does not exist".into(), data: Value::Null };
        assert!(unknown_account(&gone));
        assert!(matches!(send_error(gone), SendError::Unauthorized(_)));
        let limited = RpcError::Rpc {
            code: -5,
            message: "Failed to send message due to rate limiting".into(),
            data: json!({"response": {"results": [{"type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": 7}]}}),
        };
        assert_eq!(send_error(limited), SendError::RateLimited(Some(Duration::from_secs(7))));
        let unreg = RpcError::Rpc { code: -1, message: "The user +1 is not registered.".into(), data: Value::Null };
        assert!(matches!(send_error(unreg), SendError::Rejected(_)));
        assert_eq!(receive_bounds(None, false), (RECEIVE_WAIT, 1), "a quiet chat: the first message at once");
        assert_eq!(receive_bounds(None, true), (FOLLOW_WAIT, MAX_MESSAGES), "a burst");
        assert_eq!(receive_bounds(Some(Proto::LIMITS.min_receive), false), (RECEIVE_WAIT, 1), "the least budget");
        assert_eq!(receive_bounds(Some(Duration::from_millis(100)), true), (FOLLOW_WAIT, 3), "fits the budget");
        assert_eq!(receive_bounds(Some(Duration::from_secs(60)), true).1, MAX_MESSAGES);
        let about = json!({"versions": ["v1", "v2"], "mode": "json-rpc", "version": "0.92"});
        let m = wrapper_message("http://x:8080", ME, &about);
        assert!(m.contains("signal-cli-rest-api") && m.contains("--receive-mode=manual") && m.contains(ME), "{m}");
    }

    #[test]
    fn replies_are_cut_at_signals_2000_bytes() {
        let text: String = std::iter::repeat_n('é', MAX_TEXT_BYTES).collect();
        let pieces = skeleton::pieces(&text, &Proto::LIMITS);
        assert_eq!(pieces.len(), 2);
        assert!(pieces.iter().all(|p| p.len() <= MAX_TEXT_BYTES));
    }
}
