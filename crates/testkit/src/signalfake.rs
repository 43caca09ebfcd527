//! A fake signal-cli daemon (`signal-cli daemon --http`) on loopback, faithful to what the
//! Signal adapter (crates/platforms/src/signal.rs) relies on, and the REST wrapper it must
//! refuse. Each modelled behaviour, with the public source it follows (signal-cli's man page
//! https://github.com/AsamK/signal-cli/blob/master/man/signal-cli-jsonrpc.5.adoc, its HTTP
//! handler src/main/java/org/asamk/signal/http/HttpServerHandler.java and its CHANGELOG.md):
//!
//! - **Endpoints** (signal-cli-jsonrpc(5), "With `--http`"): `POST /api/v1/rpc` (one JSON-RPC
//!   2.0 request; a body that is not `application/json` is 415, another method 405), `GET
//!   /api/v1/events` (Server-Sent Events, `event:receive` with the same JSON as `receive`),
//!   `GET /api/v1/check` (200). Anything else is 404.
//! - **Methods**: `version` (`{"version": "0.14.6"}`, [`Options::version`]), `listAccounts`
//!   (`[{"number": …}]`, multi-account mode only), `send` (`recipient` or `groupId`,
//!   `message`; answers `{"timestamp", "results": [{"type": "SUCCESS", …}]}`), `sendTyping`
//!   (`recipient` or `groupId`, `stop`), `receive` (`timeout` in seconds, default 3, and
//!   `maxMessages`; ReceiveCommand.java). Unknown methods are -32601.
//! - **Attachments** (signal-cli-jsonrpc(5); GetAttachmentCommand.java, DataURI.java):
//!   [`FakeSignal::message_files`] queues a `dataMessage` with `attachments[]` (`contentType`,
//!   `filename`, `id`, `size`); `getAttachment` (`id`, and `recipient` or `groupId`, one of
//!   them required) answers `{"data": <base64>}` (counted, [`FakeSignal::fetches`]); an
//!   unknown id is -1 "Could not find attachment with ID". `send` takes `attachments`: data
//!   URIs `data:<type>;filename=<url-encoded name>;base64,<data>`, recorded with the message
//!   ([`Sent::files`]); a file past [`Options::max_attachment`] is -1 (signal-cli's
//!   AttachmentInvalidException).
//! - **Accounts** (signal-cli-jsonrpc(5), "Multi-account mode"): without
//!   [`Options::single`] the daemon serves several accounts and a request names its own with
//!   `params.account`; one it does not know is -32602 "Specified account does not exist" (the
//!   adapter's bad credential). In single-account mode (`-a ACCOUNT daemon`) there is no
//!   `listAccounts`, and an `account` param is an unknown field (-32602), as Jackson reads
//!   the command's params.
//! - **Receive modes** (DaemonCommand.java, ManagerImpl.java): with `--receive-mode=manual`
//!   ([`Mode::Manual`]) nothing is taken from Signal's server until a client asks: a
//!   `receive` call takes the queued messages (signal-cli acknowledges them to the server as
//!   it takes them) and returns once `timeout` seconds pass without one, or after
//!   `maxMessages`; an SSE client receives while it is connected. Only one receive at a time:
//!   another is -1 "Receive command cannot be used if messages are already being received."
//!   Messages taken by a `receive` whose answer cannot be written (the client died) are gone
//!   ([`Stats::lost`]). In the default on-start mode ([`Mode::OnStart`]) the daemon receives
//!   all the time: what arrives with no SSE client is dropped ([`Stats::lost`]) and every
//!   `receive` call is refused as above.
//! - **The 0.14.6 change** (CHANGELOG.md 0.14.6, commit 248c0c0d "Fix HTTP handler to accept
//!   ACI/UUID account parameter in SSE endpoint"): the SSE endpoint's `account` query value is
//!   decoded with `+` kept and may be the account's ACI; before 0.14.6 a raw `+` decoded to a
//!   space (`URLDecoder`), so `?account=+49…` was 400 in multi-account mode and only `%2B49…`
//!   worked. [`Options::version`] picks the spelling.
//! - **Rate limits** (CHANGELOG.md 0.14.3; SendMessageResultUtils.java): [`FakeSignal::flood`]
//!   answers the next sends -5 with `data.response.results[].retryAfterSeconds`.
//! - **The REST wrapper** ([`Options::wrapper`]: bbernhard/signal-cli-rest-api,
//!   https://bbernhard.github.io/signal-cli-rest-api/): `GET /v1/about` (`{"versions": ["v1",
//!   "v2"], "build": 2, "mode": …, "version": …}`), `POST /v2/send`; `/api/v1/rpc` is gin's
//!   404. Every TCP connection is counted ([`Stats::connections`]).
//!
//! Plain std threads, like the other fakes of this crate.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use gatewarden_fakewire::http1;

/// When the daemon takes messages from Signal's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--receive-mode=manual`: only while a client receives.
    Manual,
    /// The default `on-start`: always.
    OnStart,
}

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The accounts the daemon serves (the first in single-account mode).
    pub accounts: Vec<String>,
    /// `signal-cli -a ACCOUNT daemon`: one account, no `account` params.
    pub single: bool,
    /// What `version` answers; before "0.14.6" the SSE query decodes `+` as a space.
    pub version: String,
    pub mode: Mode,
    /// Be bbernhard's signal-cli-rest-api instead of the daemon.
    pub wrapper: bool,
    /// The largest attachment `send` takes, in bytes (Signal's: 100 MB).
    pub max_attachment: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            accounts: vec!["+4915100000001".into()],
            single: false,
            version: "0.14.6".into(),
            mode: Mode::Manual,
            wrapper: false,
            max_attachment: 1 << 20,
        }
    }
}

/// A message the daemon sent for a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub account: String,
    /// The number or UUID of a direct chat.
    pub recipient: Option<String>,
    pub group: Option<String>,
    pub text: String,
    /// The files it carried: (type, name, bytes).
    pub files: Vec<(String, String, Vec<u8>)>,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// TCP connections accepted.
    pub connections: u64,
    /// Requests of any kind.
    pub requests: u64,
    pub receive_calls: u64,
    /// `receive` calls refused because another receive was running.
    pub busy: u64,
    /// Messages taken from the server queue and never handed over (an answer that could not be
    /// written, or on-start mode with nobody listening).
    pub lost: u64,
    /// Messages waiting on Signal's server.
    pub queued: u64,
}

/// One `receive` answer: the ids (`<sourceUuid>:<timestamp>`) of the messages it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub ids: Vec<String>,
    /// Their texts.
    pub texts: Vec<String>,
    /// Whether the answer was written to the client.
    pub written: bool,
}

struct State {
    opts: Options,
    /// Signal's server queue: (account, `{"envelope", "account"}`).
    queue: VecDeque<(String, Value)>,
    receiving: bool,
    sse: usize,
    sent: Vec<Sent>,
    typing: Vec<(String, bool)>,
    answers: Vec<Answer>,
    stats: Stats,
    last_ts: u64,
    flood: Option<(u32, u64)>,
    wrapper_sends: u64,
    /// Attachments received, by id.
    attachments: std::collections::HashMap<String, Vec<u8>>,
    /// `getAttachment` answers given, by id.
    fetches: Vec<String>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fake daemon.
pub struct FakeSignal {
    addr: SocketAddr,
    shared: Shared,
}

/// The ACI the fake gives a number (stable, UUID-shaped).
pub fn aci_of(number: &str) -> String {
    let digits: String = number.chars().filter(char::is_ascii_digit).collect();
    format!("00000000-0000-4000-8000-{:0>12}", &digits[digits.len().saturating_sub(12)..])
}

impl FakeSignal {
    pub fn start(opts: Options) -> io::Result<FakeSignal> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared: Shared = Arc::new((
            Mutex::new(State {
                opts,
                queue: VecDeque::new(),
                receiving: false,
                sse: 0,
                sent: Vec::new(),
                typing: Vec::new(),
                answers: Vec::new(),
                stats: Stats::default(),
                last_ts: 0,
                flood: None,
                wrapper_sends: 0,
                attachments: std::collections::HashMap::new(),
                fetches: Vec::new(),
            }),
            Condvar::new(),
        ));
        let s = Arc::clone(&shared);
        std::thread::Builder::new().name("signal-fake".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                lock(&s).stats.connections += 1;
                let s = Arc::clone(&s);
                let _ = std::thread::Builder::new().name("signal-fake-conn".into()).spawn(move || serve(&s, stream));
            }
        })?;
        Ok(FakeSignal { addr, shared })
    }

    /// `http://127.0.0.1:<port>`: the adapter's `api_base`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A direct message from `from` to the first account; returns its id
    /// (`<sourceUuid>:<timestamp>`, the adapter's event id).
    pub fn message(&self, from: &str, text: &str) -> String {
        self.push(from, text, None, json!({}))
    }

    /// A message in group `group` (base64 id).
    pub fn group_message(&self, group: &str, from: &str, text: &str) -> String {
        self.push(from, text, Some(group), json!({}))
    }

    /// A message with extra `dataMessage` fields (`mentions`, `quote`).
    pub fn message_with(&self, from: &str, text: &str, group: Option<&str>, extra: Value) -> String {
        self.push(from, text, group, extra)
    }

    fn push(&self, from: &str, text: &str, group: Option<&str>, extra: Value) -> String {
        let mut s = lock(&self.shared);
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let ts = now.max(s.last_ts + 1);
        s.last_ts = ts;
        let account = s.opts.accounts.first().cloned().unwrap_or_default();
        let mut data = json!({"timestamp": ts, "message": text, "expiresInSeconds": 0, "viewOnce": false});
        if let Some(g) = group {
            data["groupInfo"] = json!({"groupId": g, "groupName": "group", "revision": 1, "type": "DELIVER"});
        }
        if let (Some(d), Some(x)) = (data.as_object_mut(), extra.as_object()) {
            d.extend(x.clone());
        }
        let aci = aci_of(from);
        let item = json!({
            "envelope": {"source": from, "sourceNumber": from, "sourceUuid": aci, "sourceName": "someone",
                         "sourceDevice": 1, "timestamp": ts, "serverReceivedTimestamp": ts,
                         "serverDeliveredTimestamp": ts, "dataMessage": data},
            "account": account,
        });
        if s.opts.mode == Mode::OnStart && s.sse == 0 {
            // Received by the daemon itself and handed to nobody.
            s.stats.lost += 1;
        } else {
            s.queue.push_back((account, item));
        }
        self.shared.1.notify_all();
        format!("{aci}:{ts}")
    }

    /// A direct message from `from` carrying `files` (content type, file name, bytes), with
    /// `text` (empty: none). Returns its id.
    pub fn message_files(&self, from: &str, text: &str, files: &[(&str, &str, &[u8])]) -> String {
        let list: Vec<Value> = {
            let mut s = lock(&self.shared);
            files
                .iter()
                .enumerate()
                .map(|(i, (kind, name, bytes))| {
                    let id = format!("att{}x{i}.bin", s.last_ts + 1);
                    s.attachments.insert(id.clone(), bytes.to_vec());
                    json!({"contentType": kind, "filename": name, "id": id, "size": bytes.len(), "uploadTimestamp": 1})
                })
                .collect()
        };
        let mut extra = json!({"attachments": list});
        if text.is_empty() {
            extra["message"] = Value::Null;
        }
        self.push(from, text, None, extra)
    }

    /// Keeps `bytes` as attachment `id` without a message: a test that writes its own
    /// `attachments[]` (a declared size that lies) with [`FakeSignal::message_with`].
    pub fn attachment(&self, id: &str, bytes: &[u8]) {
        lock(&self.shared).attachments.insert(id.to_owned(), bytes.to_vec());
    }

    /// The attachment ids `getAttachment` served, in order.
    pub fn fetches(&self) -> Vec<String> {
        lock(&self.shared).fetches.clone()
    }

    /// Any envelope (a receipt, a typing notice, a sync message), as `{"envelope": …}` items.
    pub fn envelope(&self, envelope: Value) {
        let mut s = lock(&self.shared);
        let account = s.opts.accounts.first().cloned().unwrap_or_default();
        let item = json!({"envelope": envelope, "account": account});
        s.queue.push_back((account, item));
        self.shared.1.notify_all();
    }

    pub fn sent(&self) -> Vec<Sent> {
        lock(&self.shared).sent.clone()
    }

    /// Waits until `pred` holds of what was sent; returns it either way.
    pub fn wait_sent(&self, timeout: Duration, pred: impl Fn(&[Sent]) -> bool) -> Result<Vec<Sent>, Vec<Sent>> {
        let end = Instant::now() + timeout;
        let mut s = lock(&self.shared);
        loop {
            if pred(&s.sent) {
                return Ok(s.sent.clone());
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(s.sent.clone());
            }
            s = self.shared.1.wait_timeout(s, left.min(Duration::from_millis(100))).map_or_else(|p| p.into_inner().0, |g| g.0);
        }
    }

    /// Every `sendTyping`: (chat, stop).
    pub fn typing(&self) -> Vec<(String, bool)> {
        lock(&self.shared).typing.clone()
    }

    pub fn answers(&self) -> Vec<Answer> {
        lock(&self.shared).answers.clone()
    }

    pub fn stats(&self) -> Stats {
        let s = lock(&self.shared);
        Stats { queued: s.queue.len() as u64, ..s.stats.clone() }
    }

    /// The daemon's (first) account.
    pub fn account(&self) -> String {
        lock(&self.shared).opts.accounts.first().cloned().unwrap_or_default()
    }

    /// Sends made through the wrapper's `/v2/send`.
    pub fn wrapper_sends(&self) -> u64 {
        lock(&self.shared).wrapper_sends
    }

    /// The next `calls` sends are rate limited, naming `retry_after` seconds.
    pub fn flood(&self, calls: u32, retry_after: u64) {
        lock(&self.shared).flood = Some((calls, retry_after));
    }

    /// Removes (or adds back) an account, as `signal-cli deleteLocalAccountData` would.
    pub fn set_accounts(&self, accounts: &[&str]) {
        lock(&self.shared).opts.accounts = accounts.iter().map(|a| (*a).to_owned()).collect();
    }
}

/// signal-cli's answers: keep-alive (no `Connection: close`), always a `Content-Type`.
fn respond(w: &mut TcpStream, status: u16, ctype: &str, body: &[u8]) -> io::Result<()> {
    http1::write_response(w, status, &[("Content-Type", ctype)], body)
}

fn serve(s: &Shared, stream: TcpStream) {
    let Ok(mut w) = stream.try_clone() else { return };
    let mut r = BufReader::new(stream);
    while let Ok(req) = http1::read_request(&mut r, 8 << 20) {
        let wrapper = {
            let mut st = lock(s);
            st.stats.requests += 1;
            st.opts.wrapper
        };
        let done = if wrapper { serve_wrapper(s, &mut w, &req) } else { serve_daemon(s, &mut w, &req) };
        if done.is_err() {
            return;
        }
    }
}

fn serve_wrapper(s: &Shared, w: &mut TcpStream, req: &http1::Request) -> io::Result<()> {
    match (req.method.as_str(), req.path()) {
        ("GET", "/v1/about") => {
            let about = json!({"versions": ["v1", "v2"], "build": 2, "mode": "json-rpc", "version": "0.92",
                               "capabilities": {"v2/send": ["quotes", "mentions"]}});
            respond(w, 200, "application/json; charset=utf-8", about.to_string().as_bytes())
        }
        ("POST", "/v2/send") => {
            lock(s).wrapper_sends += 1;
            respond(w, 201, "application/json; charset=utf-8", br#"{"timestamp":"1700000000000"}"#)
        }
        _ => respond(w, 404, "text/plain", b"404 page not found"),
    }
}

fn serve_daemon(s: &Shared, w: &mut TcpStream, req: &http1::Request) -> io::Result<()> {
    match req.path() {
        "/api/v1/check" if req.method == "GET" => respond(w, 200, "application/json", b""),
        "/api/v1/check" => respond(w, 405, "text/plain", b""),
        "/api/v1/rpc" if req.method != "POST" => respond(w, 405, "text/plain", b""),
        "/api/v1/rpc" if !req.header("content-type").unwrap_or_default().starts_with("application/json") => respond(w, 415, "text/plain", b""),
        "/api/v1/rpc" => {
            let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let id = v.get("id").cloned().unwrap_or(Value::Null);
            let Some(method) = v["method"].as_str() else {
                let e = json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "method field must be set", "data": null}, "id": null});
                return respond(w, 200, "application/json", e.to_string().as_bytes());
            };
            let params = v.get("params").cloned().unwrap_or(json!({}));
            let (outcome, taken) = rpc(s, method, params);
            let body = match outcome {
                Ok(result) => json!({"jsonrpc": "2.0", "result": result, "id": id}),
                Err(error) => json!({"jsonrpc": "2.0", "error": error, "id": id}),
            };
            let written = respond(w, 200, "application/json", body.to_string().as_bytes());
            if let Some((ids, texts)) = taken {
                let mut st = lock(s);
                if written.is_err() {
                    st.stats.lost += ids.len() as u64;
                }
                st.answers.push(Answer { ids, texts, written: written.is_ok() });
            }
            written
        }
        "/api/v1/events" if req.method == "GET" => events(s, w, req.query()),
        "/api/v1/events" => respond(w, 405, "text/plain", b""),
        _ => respond(w, 404, "text/plain", b""),
    }
}

fn err(code: i64, message: &str) -> Value {
    json!({"code": code, "message": message, "data": null})
}

/// Which account a request is for, by the daemon's mode; `Err` is the JSON-RPC error.
fn account_for(st: &State, params: &Value) -> Result<String, Value> {
    let named = params.get("account").and_then(Value::as_str);
    if st.opts.single {
        return match named {
            Some(_) => Err(err(-32602, "Unrecognized field \"account\"")),
            None => Ok(st.opts.accounts.first().cloned().unwrap_or_default()),
        };
    }
    match named {
        Some(a) if st.opts.accounts.iter().any(|x| x == a) => Ok(a.to_owned()),
        Some(_) => Err(err(-32602, "Specified account does not exist")),
        None if st.opts.accounts.len() == 1 => Ok(st.opts.accounts[0].clone()),
        None => Err(err(-32602, "Method requires valid account parameter")),
    }
}

/// Runs one method; the ids of the messages a `receive` took, if it took any.
/// A method's outcome, and for a `receive` the ids and texts of the messages it took.
type Outcome = (Result<Value, Value>, Option<(Vec<String>, Vec<String>)>);

fn rpc(s: &Shared, method: &str, params: Value) -> Outcome {
    let mut st = lock(s);
    match method {
        "version" => (Ok(json!({"version": st.opts.version})), None),
        "listAccounts" if st.opts.single => (Err(err(-32601, "Method not implemented")), None),
        "listAccounts" => {
            (Ok(Value::Array(st.opts.accounts.iter().map(|a| json!({"number": a})).collect())), None)
        }
        "send" | "sendTyping" => {
            let account = match account_for(&st, &params) {
                Ok(a) => a,
                Err(e) => return (Err(e), None),
            };
            let recipient = match &params["recipient"] {
                Value::String(r) => Some(r.clone()),
                Value::Array(a) => a.first().and_then(Value::as_str).map(str::to_owned),
                _ => None,
            };
            let group = params["groupId"].as_str().map(str::to_owned);
            let Some(chat) = recipient.clone().or_else(|| group.clone()) else {
                return (Err(err(-1, "No recipients given")), None);
            };
            if method == "sendTyping" {
                st.typing.push((chat, params["stop"].as_bool().unwrap_or(false)));
                s.1.notify_all();
                return (Ok(json!({})), None);
            }
            if let Some((n, after)) = st.flood.take() {
                if n > 1 {
                    st.flood = Some((n - 1, after));
                }
                let results = json!([{"recipientAddress": {"number": recipient}, "type": "RATE_LIMIT_FAILURE",
                                      "retryAfterSeconds": after}]);
                let mut e = err(-5, "Failed to send message due to rate limiting");
                e["data"] = json!({"response": {"timestamp": st.last_ts, "results": results}});
                return (Err(e), None);
            }
            let text = params["message"].as_str().unwrap_or("").to_owned();
            let mut files = Vec::new();
            for uri in params["attachments"].as_array().into_iter().flatten() {
                let Some(f) = uri.as_str().and_then(data_uri) else {
                    return (Err(err(-1, "Invalid attachment: not a data URI")), None);
                };
                if f.2.len() > st.opts.max_attachment {
                    return (Err(err(-1, "Failed to add attachment: attachment too large")), None);
                }
                files.push(f);
            }
            if text.is_empty() && files.is_empty() {
                return (Err(err(-1, "No message or attachments given")), None);
            }
            st.sent.push(Sent { account, recipient: recipient.clone(), group, text, files });
            st.last_ts += 1;
            let ts = st.last_ts;
            s.1.notify_all();
            let r = json!([{"recipientAddress": {"number": recipient}, "type": "SUCCESS"}]);
            (Ok(json!({"timestamp": ts, "results": r})), None)
        }
        "getAttachment" => {
            if let Err(e) = account_for(&st, &params) {
                return (Err(e), None);
            }
            let id = params["id"].as_str().unwrap_or("").to_owned();
            if params["recipient"].as_str().is_none() && params["groupId"].as_str().is_none() {
                return (Err(err(-32602, "one of recipient or groupId is required")), None);
            }
            let Some(bytes) = st.attachments.get(&id).cloned() else {
                return (Err(err(-1, &format!("Could not find attachment with ID: {id}"))), None);
            };
            st.fetches.push(id);
            use base64::Engine;
            (Ok(json!({"data": base64::engine::general_purpose::STANDARD.encode(bytes)})), None)
        }
        "receive" => {
            st.stats.receive_calls += 1;
            let account = match account_for(&st, &params) {
                Ok(a) => a,
                Err(e) => return (Err(e), None),
            };
            if st.receiving || st.opts.mode == Mode::OnStart {
                st.stats.busy += 1;
                let e = err(-1, "Receive command cannot be used if messages are already being received.");
                return (Err(e), None);
            }
            let timeout = Duration::from_secs_f64(params["timeout"].as_f64().unwrap_or(3.0).clamp(0.0, 600.0));
            let max = params["maxMessages"].as_i64().filter(|m| *m >= 0).map(|m| m as usize);
            st.receiving = true;
            let mut items = Vec::new();
            let mut ids = Vec::new();
            let mut texts = Vec::new();
            let mut deadline = Instant::now() + timeout;
            while max.is_none_or(|m| items.len() < m) {
                if let Some(i) = st.queue.iter().position(|(a, _)| *a == account) {
                    let Some((_, item)) = st.queue.remove(i) else { break };
                    texts.push(item["envelope"]["dataMessage"]["message"].as_str().unwrap_or("").to_owned());
                    ids.push(format!(
                        "{}:{}",
                        item["envelope"]["sourceUuid"].as_str().unwrap_or(""),
                        item["envelope"]["timestamp"]
                    ));
                    items.push(item);
                    deadline = Instant::now() + timeout;
                    continue;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = s.1.wait_timeout(st, left).map_or_else(|p| p.into_inner().0, |g| g.0);
            }
            st.receiving = false;
            (Ok(Value::Array(items)), Some((ids, texts)))
        }
        _ => (Err(err(-32601, "Method not implemented")), None),
    }
}

/// A `data:<type>;filename=<name>;base64,<data>` URI as signal-cli reads it (DataURI.java:
/// the parameter URL-decoded): `(type, name, bytes)`.
fn data_uri(uri: &str) -> Option<(String, String, Vec<u8>)> {
    use base64::Engine;
    let (head, data) = uri.strip_prefix("data:")?.split_once(',')?;
    let head = head.strip_suffix(";base64")?;
    let (kind, params) = head.split_once(';').unwrap_or((head, ""));
    let name = params.strip_prefix("filename=").map(|n| query_value(n, false)).unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD.decode(data).ok()?;
    Some((kind.to_owned(), name, bytes))
}

/// `URLDecoder.decode` of a query value: `%XX` decoded, and `+` a space before 0.14.6 (kept
/// since: Util.getQueryMap escapes it first).
fn query_value(raw: &str, plus_kept: bool) -> String {
    let mut out = Vec::new();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' if !plus_kept => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `version` (`0.14.6`) is at least 0.14.6.
pub fn plus_kept(version: &str) -> bool {
    let n: Vec<u32> = version.split(['.', '-']).take(3).map(|p| p.parse().unwrap_or(0)).collect();
    (n.first().copied().unwrap_or(0), n.get(1).copied().unwrap_or(0), n.get(2).copied().unwrap_or(0)) >= (0, 14, 6)
}

/// The SSE stream: the accounts of `?account=` (all without it), `event:receive` per message.
fn events(s: &Shared, w: &mut TcpStream, query: &str) -> io::Result<()> {
    let account = {
        let st = lock(s);
        let kept = plus_kept(&st.opts.version);
        let raw = query.split('&').find_map(|kv| kv.strip_prefix("account="));
        match raw.map(|r| query_value(r, kept)) {
            _ if st.opts.single => None,
            Some(a) if !a.is_empty() => {
                match st.opts.accounts.iter().find(|x| **x == a || (kept && aci_of(x) == a)) {
                    Some(x) => Some(x.clone()),
                    None => {
                        drop(st);
                        return respond(w, 400, "text/plain", b"");
                    }
                }
            }
            _ => None,
        }
    };
    http1::write_head(w, 200, &[("Content-Type", "text/event-stream")])?;
    w.flush()?;
    let mut st = lock(s);
    st.sse += 1;
    let outcome = loop {
        let i = st.queue.iter().position(|(a, _)| account.as_ref().is_none_or(|x| x == a));
        if let Some(i) = i {
            let Some((_, item)) = st.queue.remove(i) else { continue };
            let line = format!("event:receive\ndata:{item}\n\n");
            if w.write_all(line.as_bytes()).and_then(|()| w.flush()).is_err() {
                st.stats.lost += 1;
                break Err(io::Error::other("client gone"));
            }
            continue;
        }
        st = s.1.wait_timeout(st, Duration::from_millis(500)).map_or_else(|p| p.into_inner().0, |g| g.0);
        if w.write_all(b":\n\n").and_then(|()| w.flush()).is_err() {
            break Err(io::Error::other("client gone"));
        }
    };
    st.sse -= 1;
    outcome
}

/// A minimal SSE client for the fake's own tests: the `data:` lines of the first `n` events
/// of `GET /api/v1/events?<query>`, or the HTTP status when it is not 200.
pub fn read_events(addr: SocketAddr, query: &str, n: usize, timeout: Duration) -> Result<Vec<Value>, u16> {
    let mut c = TcpStream::connect(addr).map_err(|_| 0u16)?;
    let _ = c.set_read_timeout(Some(timeout));
    let req = format!("GET /api/v1/events?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n");
    c.write_all(req.as_bytes()).map_err(|_| 0u16)?;
    let mut r = BufReader::new(c);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|_| 0u16)?;
    let code: u16 = status.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    if code != 200 {
        return Err(code);
    }
    let mut out = Vec::new();
    let mut line = String::new();
    let end = Instant::now() + timeout;
    while out.len() < n && Instant::now() < end {
        line.clear();
        if r.read_line(&mut line).map_err(|_| 0u16)? == 0 {
            break;
        }
        if let Some(d) = line.trim_end().strip_prefix("data:") {
            out.push(serde_json::from_str(d).unwrap_or(Value::Null));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Data URIs as DataURI.java reads them (the file name URL-decoded); an attachment past
    /// `max_attachment` is -1; `getAttachment` answers base64 and needs a recipient or group.
    #[test]
    fn signal_attachments_both_ways() {
        assert_eq!(
            data_uri("data:text/plain;filename=r+port%3Bx.txt;base64,aGk="),
            Some(("text/plain".into(), "r port;x.txt".into(), b"hi".to_vec()))
        );
        assert_eq!(data_uri("data:text/plain,hi"), None, "not base64");
        let fake = FakeSignal::start(Options { accounts: vec!["+1555".into()], max_attachment: 2, ..Options::default() }).unwrap();
        let send = |uri: &str| json!({"recipient": ["+1666"], "message": "", "attachments": [uri]});
        assert_eq!(rpc(&fake.shared, "send", send("data:text/plain;filename=a;base64,aGk=")).0.map(|_| ()), Ok(()));
        assert_eq!(rpc(&fake.shared, "send", send("data:text/plain;filename=a;base64,aGkh")).0.unwrap_err()["code"], -1);
        assert_eq!(fake.sent()[0].files, [("text/plain".into(), "a".into(), b"hi".to_vec())]);
        fake.attachment("x.bin", b"hi");
        let got = rpc(&fake.shared, "getAttachment", json!({"id": "x.bin", "recipient": "+1666"})).0.unwrap();
        assert_eq!(got, json!({"data": "aGk="}));
        assert_eq!(rpc(&fake.shared, "getAttachment", json!({"id": "x.bin"})).0.unwrap_err()["code"], -32602);
        assert_eq!(rpc(&fake.shared, "getAttachment", json!({"id": "y", "recipient": "+1"})).0.unwrap_err()["code"], -1);
    }

    /// The 0.14.6 change: a raw `+` in `?account=` was a space before (400), kept since; `%2B`
    /// works in both; the ACI only since 0.14.6.
    #[test]
    fn the_sse_account_query_in_both_versions() {
        let acct = "+4915100000001";
        for (version, raw_plus_ok) in [("0.14.5", false), ("0.14.6", true)] {
            // A fake per read: a stream the client left takes messages until its write fails.
            let read = |query: &str| {
                let f = FakeSignal::start(Options { version: version.into(), ..Options::default() }).unwrap();
                f.message("+4917000000002", "one");
                read_events(f.addr(), query, 1, Duration::from_secs(5))
            };
            let got = read(&format!("account={acct}"));
            assert_eq!(got.is_ok(), raw_plus_ok, "{version}: {got:?}");
            if !raw_plus_ok {
                assert_eq!(got, Err(400));
            }
            let got = read("account=%2B4915100000001").unwrap();
            assert_eq!(got[0]["envelope"]["dataMessage"]["message"], "one", "{version}");
            let by_aci = read(&format!("account={}", aci_of(acct)));
            assert_eq!(by_aci.is_ok(), raw_plus_ok, "{version}: the ACI");
        }
        assert!(plus_kept("0.14.6") && plus_kept("0.15.0") && !plus_kept("0.14.5") && !plus_kept("0.13.24"));
        assert_eq!(query_value("%2B49+1", false), "+49 1");
        assert_eq!(query_value("%2B49+1", true), "+49+1");
    }
}
