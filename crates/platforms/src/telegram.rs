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
//! - **Bounded polls.** A long poll's `timeout` is never longer than [`Host::receive_budget`]
//!   (a cluster active's lease left; docs/architecture.md, "Cluster"); under one second left,
//!   the receiver does not poll at all and looks again shortly.
//! - **Restartable.** [`Adapter::start`] after [`Adapter::close`] starts afresh: new threads and
//!   new flags; the committed offset carries over (the journal deduplicates anyway).
//!
//! Two OS threads per adapter (a receiver that blocks in the long poll, a sender that drains
//! the outbox), blocking ureq like the openai backend (crates/agent/src/backend/openai.rs):
//! replies never wait for a long poll to end.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_config::PlatformConfig;
use gatewarden_net::Outbound;
use serde_json::{Value, json};

use crate::wait::{self, Flags};
use crate::{Adapter, AdapterError, Host, Inbound, Sent, State, Status};

/// The public Bot API.
pub const DEFAULT_API_BASE: &str = "https://api.telegram.org";
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Longest `retry_after` honoured as given; a larger one is capped (and retried then).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Telegram's limit on one message's text, in characters.
const MAX_TEXT_CHARS: usize = 4096;
const MAX_BODY_BYTES: u64 = 16 << 20;
/// The shortest long poll worth starting under a receive budget (the Bot API's `timeout` is
/// whole seconds).
const MIN_BUDGETED_POLL: Duration = Duration::from_secs(1);
/// How long the receiver waits before looking at a too-small receive budget again.
const NO_BUDGET_WAIT: Duration = Duration::from_millis(200);

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
        let status = response.status().as_u16();
        let text = response
            .into_body()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(|e| ApiError::Network(self.redact(e.to_string())))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
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

/// The Telegram adapter.
pub struct Telegram {
    name: String,
    token: String,
    base: String,
    /// `ca_file` and `proxy` (crates/net).
    out: Outbound,
    allowed: Vec<String>,
    poll_timeout: Duration,
    conflict_bound: Duration,
    status: Arc<Status>,
    /// The current start's flags; replaced by every [`Adapter::start`], so threads of an
    /// earlier start (stopped, maybe still finishing) never see the new start's flags.
    shared: Mutex<Arc<Shared>>,
    /// The next offset, kept across starts.
    offset: Arc<AtomicI64>,
    /// The host of the current start ([`Adapter::stop_intake`] asks it for the budget).
    host: Mutex<Option<Arc<dyn Host>>>,
    done: Mutex<Vec<mpsc::Receiver<()>>>,
}

/// What the adapter's threads share.
struct Shared {
    flags: Flags,
    /// The next offset: every update below it is committed to the journal.
    offset: Arc<AtomicI64>,
    close_deadline: Mutex<Option<Instant>>,
}

impl Telegram {
    /// Fails only when `ca_file` or `proxy` cannot be used (the configuration check read them
    /// already).
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Telegram, AdapterError> {
        let out = Outbound::new(cfg.ca_file.as_deref(), cfg.proxy.as_deref())
            .map_err(|e| AdapterError::Start { name: cfg.adapter_name(), message: e.to_string() })?;
        Ok(Telegram {
            name: cfg.adapter_name(),
            token,
            base: cfg.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned()),
            out,
            allowed: cfg.allowed_chats.clone(),
            poll_timeout: Duration::from_secs(cfg.poll_timeout_s),
            conflict_bound: Duration::from_secs(cfg.conflict_standby_s),
            status: Arc::new(Status::default()),
            shared: Mutex::new(Arc::new(Shared::new(Arc::new(AtomicI64::new(0))))),
            offset: Arc::new(AtomicI64::new(0)),
            host: Mutex::new(None),
            done: Mutex::new(Vec::new()),
        })
    }

    fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn spawn(&self, what: &str, f: impl FnOnce() + Send + 'static) -> Result<(), AdapterError> {
        let done = wait::spawn(&self.name, what, f)?;
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push(done);
        Ok(())
    }

    /// One `getUpdates` that returns at once: confirms the committed offset and ends our own
    /// in-flight long poll on the server.
    fn terminate_poll(&self) {
        let api = Api::new(&self.base, &self.token, &self.out);
        let offset = self.offset.load(Ordering::Acquire);
        let _ = api.call("getUpdates", &json!({"offset": offset, "timeout": 0, "limit": 1}), Duration::from_secs(5));
    }
}

impl Shared {
    fn new(offset: Arc<AtomicI64>) -> Shared {
        Shared { flags: Flags::default(), offset, close_deadline: Mutex::new(None) }
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

/// Turns one update into an inbound message (`None`: not a text message).
fn parse_update(u: &Value) -> Option<Inbound> {
    let id = u["update_id"].as_i64()?;
    let m = &u["message"];
    let text = m["text"].as_str()?;
    let chat = id_string(&m["chat"]["id"])?;
    let user = id_string(&m["from"]["id"]).unwrap_or_default();
    let sent_at = m["date"].as_u64().map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    Some(Inbound { event_id: id.to_string(), chat_id: chat, user_id: user, text: text.to_owned(), sent_at })
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
fn pieces(text: &str) -> Vec<String> {
    if text.is_empty() {
        return vec!["(empty reply)".to_owned()];
    }
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(MAX_TEXT_CHARS).map(|c| c.iter().collect()).collect()
}

struct Receiver {
    name: String,
    api: Api,
    base: String,
    token: String,
    out: Outbound,
    allowed: Vec<String>,
    poll_timeout: Duration,
    conflict_bound: Duration,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
}

impl Receiver {
    fn set(&self, s: State) {
        if self.status.set(s.clone()) {
            self.host.state_changed(&self.name, &s);
        }
    }

    fn stopping(&self) -> bool {
        self.shared.flags.get().stop
    }

    /// Sleeps `d` unless intake stops first.
    fn pause(&self, d: Duration) {
        self.shared.flags.sleep(d, |b| b.stop);
    }

    fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut conflict_since: Option<Instant> = None;
        let mut hello = true;
        while !self.stopping() {
            if self.shared.flags.take_kick() {
                self.api = Api::new(&self.base, &self.token, &self.out);
                self.set(State::Connecting);
                hello = true;
            }
            if hello {
                // `getMe` first: "connected" and "credentials rejected" are known at once, not
                // after the first long poll ends.
                match self.api.call("getMe", &json!({}), Duration::from_secs(10)) {
                    Ok(_) => {
                        hello = false;
                        self.status.progress();
                        self.set(State::Connected);
                    }
                    Err(ApiError::Unauthorized(desc)) => {
                        self.set(State::Parked(format!("credentials rejected: {desc}")));
                        return;
                    }
                    Err(ApiError::Flood(d)) => self.pause(d.min(MAX_RETRY_AFTER)),
                    Err(e) => {
                        self.set(State::Degraded(e.to_string()));
                        self.pause(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                continue;
            }
            // A poll cannot be fenced: it must end before our lease can (receive_budget).
            let Some(timeout) = budgeted_poll(self.poll_timeout, self.host.receive_budget()) else {
                self.pause(NO_BUDGET_WAIT);
                continue;
            };
            let offset = self.shared.offset.load(Ordering::Acquire);
            let body = json!({"offset": offset, "timeout": timeout.as_secs(), "allowed_updates": ["message"]});
            let result = self.api.call("getUpdates", &body, timeout + Duration::from_secs(10));
            if self.stopping() && result.is_err() {
                break;
            }
            match result {
                Ok(updates) => {
                    conflict_since = None;
                    backoff = BACKOFF_MIN;
                    self.status.progress();
                    self.set(State::Connected);
                    if let Err(e) = self.commit(&updates) {
                        self.set(State::Degraded(format!("cannot journal an inbound message: {e}")));
                        self.pause(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                Err(ApiError::Conflict(desc)) => {
                    self.status.conflict();
                    let since = *conflict_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.conflict_bound {
                        self.set(State::Standby(format!("another consumer is active: {desc}")));
                        // One probe per bound: slow enough never to fight the other consumer.
                        self.pause(self.conflict_bound);
                    } else {
                        self.pause(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                Err(ApiError::Flood(d)) => self.pause(d.min(MAX_RETRY_AFTER)),
                Err(ApiError::Unauthorized(desc)) => {
                    self.set(State::Parked(format!("credentials rejected: {desc}")));
                    return;
                }
                Err(e @ (ApiError::Network(_) | ApiError::Server(_) | ApiError::Rejected(_))) => {
                    self.set(State::Degraded(e.to_string()));
                    self.pause(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Hands each update to the host in order, moving the offset past each one committed.
    fn commit(&self, updates: &Value) -> Result<(), String> {
        let Some(list) = updates.as_array() else {
            return Err("getUpdates returned no list".into());
        };
        for u in list {
            let Some(id) = u["update_id"].as_i64() else { continue };
            if id < self.shared.offset.load(Ordering::Acquire) {
                continue; // confirmed already
            }
            if let Some(msg) = parse_update(u)
                && (self.allowed.is_empty() || self.allowed.contains(&msg.chat_id))
            {
                let lag = msg.sent_at.and_then(|t| SystemTime::now().duration_since(t).ok()).map(|d| d.as_secs_f64());
                self.host.deliver(&self.name, msg)?;
                self.status.received(lag);
            }
            self.shared.offset.store(id.saturating_add(1), Ordering::Release);
        }
        Ok(())
    }
}

struct Sender {
    name: String,
    api: Api,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
}

impl Sender {
    fn closing_done(&self, empty: bool) -> bool {
        let deadline = *self.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner());
        deadline.is_some_and(|d| empty || Instant::now() >= d)
    }

    fn run(self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let empty = match self.flush() {
                Ok(empty) => {
                    backoff = BACKOFF_MIN;
                    empty
                }
                Err(e) => {
                    // The receiver sets `connected` again at its next successful poll; a parked
                    // adapter stays parked (its reason is the one that matters).
                    if !matches!(self.status.state(), State::Parked(_)) {
                        let state = State::Degraded(format!("cannot send: {e}"));
                        if self.status.set(state.clone()) {
                            self.host.state_changed(&self.name, &state);
                        }
                    }
                    if self.closing_done(false) {
                        return;
                    }
                    self.shared.flags.sleep(backoff, |_| false);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            if self.closing_done(empty) {
                return;
            }
            if empty {
                self.shared.flags.sleep(Duration::from_secs(1), |b| b.wake || b.close);
                self.shared.flags.take_wake();
            }
        }
    }

    /// Sends what the outbox holds. `Ok(true)` when it is empty.
    fn flush(&self) -> Result<bool, String> {
        let batch = self.host.outbox(&self.name, 32)?;
        if batch.is_empty() {
            return Ok(true);
        }
        for item in batch {
            for piece in pieces(&item.text) {
                loop {
                    let body = json!({"chat_id": chat_json(&item.chat_id), "text": piece});
                    match self.api.call("sendMessage", &body, Duration::from_secs(30)) {
                        Ok(_) => {
                            self.status.sent();
                            self.status.progress();
                            break;
                        }
                        Err(ApiError::Flood(d)) => {
                            let d = d.min(MAX_RETRY_AFTER);
                            if self.closing_done(false) {
                                return Err(format!(
                                    "flood control (retry after {} s) past the drain deadline",
                                    d.as_secs()
                                ));
                            }
                            std::thread::sleep(d);
                        }
                        Err(ApiError::Rejected(desc)) => {
                            self.host.sent(item.seq, Sent::Rejected(desc));
                            return Ok(false);
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            self.host.sent(item.seq, Sent::Ok);
        }
        Ok(false)
    }
}

impl Adapter for Telegram {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "telegram"
    }

    fn credential(&self) -> &str {
        &self.token
    }

    fn status(&self) -> &Arc<Status> {
        &self.status
    }

    fn start(&self, host: Arc<dyn Host>) -> Result<(), AdapterError> {
        self.status.set(State::Connecting);
        let shared = Arc::new(Shared::new(Arc::clone(&self.offset)));
        *self.shared.lock().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&shared);
        *self.host.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&host));
        let rx = Receiver {
            name: self.name.clone(),
            api: Api::new(&self.base, &self.token, &self.out),
            base: self.base.clone(),
            token: self.token.clone(),
            out: self.out.clone(),
            allowed: self.allowed.clone(),
            poll_timeout: self.poll_timeout,
            conflict_bound: self.conflict_bound,
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host: Arc::clone(&host),
        };
        let tx = Sender {
            name: self.name.clone(),
            api: Api::new(&self.base, &self.token, &self.out),
            status: Arc::clone(&self.status),
            shared,
            host,
        };
        self.spawn("recv", move || rx.run())?;
        self.spawn("send", move || tx.run())
    }

    fn wake(&self) {
        self.shared().flags.update(|b| b.wake = true);
    }

    fn reconnect(&self) {
        self.shared().flags.update(|b| b.kick = true);
    }

    fn stop_intake(&self) {
        let shared = self.shared();
        let already = shared.flags.get().stop;
        shared.flags.update(|b| b.stop = true);
        let started = self.host.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // A zero budget is a demoted cluster active: our last poll ended before the lease did,
        // and a successor may be polling now, which a terminating poll would cut. (A graceful
        // stop comes here while still active, so it confirms the offset.)
        let no_budget = started.as_ref().and_then(|h| h.receive_budget()).is_some_and(|b| b.is_zero());
        if !already && started.is_some() && !no_budget && !matches!(self.status.state(), State::Parked(_)) {
            self.terminate_poll();
        }
    }

    fn close(&self, deadline: Instant) -> bool {
        self.stop_intake();
        let shared = self.shared();
        wait::begin_close(&shared.flags, &shared.close_deadline, deadline);
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()));
        let mut all = true;
        for rx in done {
            all &= wait::ended_by(&rx, deadline, Duration::from_millis(200));
        }
        self.status.set(State::Closed);
        all
    }

    fn watchdog_after(&self) -> Duration {
        self.poll_timeout + Duration::from_secs(30)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_parse_and_odd_ones_are_skipped() {
        let u = json!({"update_id": 7, "message": {"text": "hi", "chat": {"id": -100}, "from": {"id": 42}, "date": 1}});
        let m = parse_update(&u).unwrap();
        assert_eq!(
            (m.event_id.as_str(), m.chat_id.as_str(), m.user_id.as_str(), m.text.as_str()),
            ("7", "-100", "42", "hi")
        );
        assert!(parse_update(&json!({"update_id": 8, "edited_message": {}})).is_none());
        assert!(parse_update(&json!({"update_id": 9, "message": {"photo": [], "chat": {"id": 1}}})).is_none());
        assert!(parse_update(&json!("garbage")).is_none());
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
