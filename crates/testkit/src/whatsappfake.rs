//! A fake WhatsApp Cloud API on loopback: the Graph API endpoints the WhatsApp adapter
//! (crates/platforms/src/whatsapp.rs) calls, and Meta's webhook sender, which POSTs
//! notifications to the gateway's `/hooks/whatsapp/<name>`. Each modelled behaviour, with the
//! public documentation it follows:
//!
//! - **Webhook notifications**
//!   (https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/components,
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/payload-examples): a POST
//!   of `{"object": "whatsapp_business_account", "entry": [{"id": <WABA id>, "changes":
//!   [{"field": "messages", "value": {"messaging_product": "whatsapp", "metadata":
//!   {"display_phone_number", "phone_number_id"}, "contacts": [...], "messages": [{"from",
//!   "id": "wamid.…", "timestamp", "type": "text", "text": {"body"}}]}}]}]}`; status updates
//!   carry `statuses[]` instead of `messages[]`.
//! - **Signatures** (https://developers.facebook.com/docs/graph-api/webhooks/getting-started,
//!   "Validate Payloads"): every POST has `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of
//!   the payload, keyed by the app secret>`.
//! - **Redelivery** (webhooks/components: "If we send a webhook request to your endpoint and
//!   your server responds with an HTTP status code other than 200, or if we are unable to
//!   deliver the webhook for another reason, we will keep trying with decreasing frequency until
//!   the request succeeds, for up to 7 days"): a notification not answered 200 (another status,
//!   no connection, no answer within [`Options::answer_timeout`], Meta's 20 s cut to keep tests
//!   short) is sent again, the same bytes, after a backoff doubling from
//!   [`Options::retry_first`] to [`Options::retry_max`]. Notifications go out concurrently
//!   ([`Options::senders`]) and in no guaranteed order, as Meta's do.
//! - **The verification request** (getting-started, "Verification Requests"): [`FakeWhatsapp::verify`]
//!   sends `GET <callback>?hub.mode=subscribe&hub.challenge=<n>&hub.verify_token=<token>`.
//! - **`POST /{version}/{phone-number-id}/messages`**
//!   (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/messages): bearer
//!   access token; a text message (`messaging_product`, `to`, `type: text`, `text.body` of at
//!   most 4,096 characters) answers `{"messaging_product", "contacts": [{"input", "wa_id"}],
//!   "messages": [{"id": "wamid.…"}]}`; `status: read` with `message_id` (and optionally
//!   `typing_indicator: {type: text}`,
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/typing-indicators) answers
//!   `{"success": true}`.
//! - **Errors** (https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes,
//!   in the Graph API's `{"error": {"message", "type", "code", "error_data": {"details"},
//!   "fbtrace_id"}}`): a missing or wrong token is HTTP 401 code 190; a text to a customer
//!   whose last message is more than 24 h old is HTTP 400 code 131047 (re-engagement);
//!   [`FakeWhatsapp::flood`] answers the next sends HTTP 400 code 130429 (throughput) with a
//!   `Retry-After`.
//! - **Media** (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/media,
//!   webhooks/payload-examples): [`FakeWhatsapp::media_message`] sends an `image`,
//!   `document`, `audio`, `video` or `sticker` message carrying a media `id` and `mime_type`
//!   (and `filename`, `caption`); `GET /{version}/{media-id}` with the bearer answers
//!   `{"messaging_product", "url", "mime_type", "sha256", "file_size", "id"}`, and `GET url`
//!   with the bearer serves the bytes (401 without it; each counted, [`FakeWhatsapp::downloads`]).
//!   `POST /{version}/{phone-number-id}/media` takes `multipart/form-data` with
//!   `messaging_product=whatsapp`, `type` and `file`, and answers `{"id"}`; a file past
//!   [`Options::max_upload`] is refused (HTTP 400, code 131053, "Media upload error").
//!   A message of type `image`, `document`, `audio`, `video` or `sticker` names an uploaded
//!   `id` (an unknown one is code 131053 too) and is recorded ([`FakeWhatsapp::media_sent`]).
//! - **`GET /{version}/{phone-number-id}`**
//!   (https://developers.facebook.com/docs/graph-api/reference/whatsapp-business-phone-number/):
//!   the number's `id`, `display_phone_number` and `verified_name`; 401 code 190 with a bad
//!   token.
//!
//! Plain std threads, like the other fakes of this crate.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};

use gatewarden_fakewire::{form, http1};

pub const WABA_ID: &str = "102290129340398";
pub const DISPLAY_NUMBER: &str = "15550783881";

#[derive(Debug, Clone)]
pub struct Options {
    pub phone_number_id: String,
    pub token: String,
    pub app_secret: String,
    pub verify_token: String,
    pub version: String,
    /// Webhook POSTs in flight at once.
    pub senders: usize,
    pub retry_first: Duration,
    pub retry_max: Duration,
    /// How long a webhook POST waits for its answer (Meta: 20 s).
    pub answer_timeout: Duration,
    /// The largest media upload taken, in bytes (Meta: 100 MB for documents).
    pub max_upload: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            phone_number_id: "106540352242922".into(),
            token: "EAAfake-access-token".into(),
            app_secret: "fake-app-secret".into(),
            verify_token: "fake-verify-token".into(),
            version: "v21.0".into(),
            senders: 4,
            retry_first: Duration::from_millis(100),
            retry_max: Duration::from_secs(2),
            answer_timeout: Duration::from_secs(20),
            max_upload: 1 << 20,
        }
    }
}

/// A text the business sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub to: String,
    pub text: String,
    pub id: String,
    pub at: Instant,
}

/// A `status: read` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedRead {
    pub message_id: String,
    pub typing: bool,
}

/// A media upload the business made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub id: String,
    /// The `type` field.
    pub kind: String,
    pub file_name: String,
    pub bytes: Vec<u8>,
}

/// A media message the business sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaSent {
    pub to: String,
    /// `image`, `document`, `audio`, …
    pub kind: String,
    pub media_id: String,
    pub filename: Option<String>,
}

/// One webhook POST and how it was answered (`None`: no answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub note: usize,
    pub status: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Webhook POSTs made (first deliveries and redeliveries).
    pub posts: u64,
    pub redeliveries: u64,
    /// Notifications answered 200.
    pub delivered: u64,
    /// Notifications not yet answered 200.
    pub pending: u64,
    /// Graph API calls refused with an error.
    pub errors: u64,
}

struct Note {
    body: Vec<u8>,
    attempts: u32,
    done: bool,
    inflight: bool,
    next_at: Instant,
}

struct State {
    opts: Options,
    webhook: Option<String>,
    notes: Vec<Note>,
    attempts: Vec<Attempt>,
    posted: Vec<Posted>,
    reads: Vec<MarkedRead>,
    /// wa_id → unix seconds of its last message (the customer-service window).
    last_inbound: HashMap<String, u64>,
    revoked: bool,
    flood: (u32, u64),
    errors: u64,
    seq: u64,
    /// Media by id: (mime type, bytes): the customers' and the uploads.
    media: HashMap<String, (String, Vec<u8>)>,
    uploads: Vec<Upload>,
    media_sent: Vec<MediaSent>,
    /// Media files served (`GET url`), by id.
    downloads: Vec<String>,
    base: String,
}

struct Shared {
    state: Mutex<State>,
    dropped: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct FakeWhatsapp {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

const TICK: Duration = Duration::from_millis(10);

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `sha256=<hex>` of `body` keyed by `secret`: Meta's `X-Hub-Signature-256`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let Ok(mut mac) = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret) else { return String::new() };
    mac.update(body);
    let sum = mac.finalize().into_bytes();
    format!("sha256={}", sum.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

impl FakeWhatsapp {
    pub fn start(opts: Options) -> io::Result<FakeWhatsapp> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let senders = opts.senders.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                opts,
                webhook: None,
                notes: Vec::new(),
                attempts: Vec::new(),
                posted: Vec::new(),
                reads: Vec::new(),
                last_inbound: HashMap::new(),
                revoked: false,
                flood: (0, 0),
                errors: 0,
                seq: 0,
                media: HashMap::new(),
                uploads: Vec::new(),
                media_sent: Vec::new(),
                downloads: Vec::new(),
                base: format!("http://{addr}"),
            }),
            dropped: AtomicBool::new(false),
        });
        listener.set_nonblocking(true)?;
        let s = Arc::clone(&shared);
        std::thread::Builder::new().name("wafake-accept".into()).spawn(move || {
            while !s.dropped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let s = Arc::clone(&s);
                        let _ = std::thread::Builder::new().name("wafake-conn".into()).spawn(move || serve(&s, conn));
                    }
                    Err(_) => std::thread::sleep(TICK),
                }
            }
        })?;
        for _ in 0..senders {
            let s = Arc::clone(&shared);
            std::thread::Builder::new().name("wafake-hook".into()).spawn(move || sender(&s))?;
        }
        Ok(FakeWhatsapp { shared, addr })
    }

    /// `http://127.0.0.1:<port>`, for `api_base`.
    pub fn api_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn options(&self) -> Options {
        self.shared.lock().opts.clone()
    }

    /// Where notifications are POSTed (`http://127.0.0.1:<port>/hooks/whatsapp/<name>`).
    pub fn set_webhook(&self, url: &str) {
        self.shared.lock().webhook = Some(url.to_owned());
    }

    /// A text from `from` (a wa_id), sent now; returns its `wamid`.
    pub fn message(&self, from: &str, text: &str) -> String {
        self.message_at(from, text, unix_now())
    }

    /// A text from `from` whose `timestamp` is `at` (unix seconds): a notification delivered
    /// late, as Meta's retries can.
    pub fn message_at(&self, from: &str, text: &str, at: u64) -> String {
        let mut s = self.shared.lock();
        let (wamid, value) = compose(&mut s, from, text, at);
        push_note(&mut s, value);
        wamid
    }

    /// A text notification as [`FakeWhatsapp::message_at`] makes it (the customer's window
    /// opens), not sent: its `wamid` and body, for a test that delivers it itself.
    pub fn compose(&self, from: &str, text: &str, at: u64) -> (String, Vec<u8>) {
        let (wamid, value) = compose(&mut self.shared.lock(), from, text, at);
        (wamid, notification(value).to_string().into_bytes())
    }

    /// A media message from `from`: `kind` (`image`, `document`, `audio`, `video`, `sticker`)
    /// whose media is `bytes`, declared `mime`; `extra` fields join the media object
    /// (`filename`, `caption`, `voice`). Returns its `wamid`.
    pub fn media_message(&self, from: &str, kind: &str, mime: &str, bytes: &[u8], extra: Value) -> String {
        let mut s = self.shared.lock();
        s.seq += 1;
        let media_id = format!("{}", 1_000_000 + s.seq);
        s.media.insert(media_id.clone(), (mime.to_owned(), bytes.to_vec()));
        let mut object = json!({"mime_type": mime, "sha256": "fake", "id": media_id});
        if let (Some(o), Some(x)) = (object.as_object_mut(), extra.as_object()) {
            o.extend(x.clone());
        }
        let (wamid, mut value) = compose(&mut s, from, "", unix_now());
        value["messages"][0]["type"] = json!(kind);
        if let Some(m) = value["messages"][0].as_object_mut() {
            m.remove("text");
            m.insert(kind.to_owned(), object);
        }
        push_note(&mut s, value);
        wamid
    }

    /// The media uploads, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.lock().uploads.clone()
    }

    /// The media messages sent, in order.
    pub fn media_sent(&self) -> Vec<MediaSent> {
        self.shared.lock().media_sent.clone()
    }

    /// The media files served, by id.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.lock().downloads.clone()
    }

    /// A status notification (`delivered`) for one of our messages: not a message.
    pub fn status(&self, wamid: &str, to: &str) -> usize {
        let mut s = self.shared.lock();
        let value = json!({
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": DISPLAY_NUMBER, "phone_number_id": s.opts.phone_number_id},
            "statuses": [{"id": wamid, "status": "delivered", "timestamp": unix_now().to_string(), "recipient_id": to}],
        });
        push_note(&mut s, value)
    }

    /// The GET verification request to the webhook: `(status, body)`.
    pub fn verify(&self, verify_token: &str, challenge: &str) -> io::Result<(u16, String)> {
        let url = self.shared.lock().webhook.clone().ok_or_else(|| io::Error::other("no webhook set"))?;
        let q = format!("hub.mode=subscribe&hub.challenge={challenge}&hub.verify_token={}", encode(verify_token));
        request(&url, "GET", &q, &[], b"", Duration::from_secs(10))
    }

    /// POSTs `body` to the webhook with the given signature header (none: unsigned), once.
    pub fn post_raw(&self, body: &[u8], signature: Option<&str>) -> io::Result<(u16, String)> {
        let url = self.shared.lock().webhook.clone().ok_or_else(|| io::Error::other("no webhook set"))?;
        let headers: Vec<(&str, &str)> = signature.map(|s| ("X-Hub-Signature-256", s)).into_iter().collect();
        request(&url, "POST", "", &headers, body, Duration::from_secs(10))
    }

    pub fn posted(&self) -> Vec<Posted> {
        self.shared.lock().posted.clone()
    }

    pub fn reads(&self) -> Vec<MarkedRead> {
        self.shared.lock().reads.clone()
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.shared.lock().attempts.clone()
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared.lock();
        let delivered = s.notes.iter().filter(|n| n.done).count() as u64;
        let posts = s.attempts.len() as u64;
        Stats {
            posts,
            redeliveries: posts.saturating_sub(s.notes.iter().filter(|n| n.attempts > 0).count() as u64),
            delivered,
            pending: s.notes.len() as u64 - delivered,
            errors: s.errors,
        }
    }

    /// Waits until every notification is answered 200.
    pub fn wait_delivered(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.stats().pending == 0 {
                return true;
            }
            std::thread::sleep(TICK);
        }
        self.stats().pending == 0
    }

    /// The access token is refused from now on (401, code 190).
    pub fn revoke(&self) {
        self.shared.lock().revoked = true;
    }

    /// The next `calls` sends are refused with code 130429 and `Retry-After: retry_after`.
    pub fn flood(&self, calls: u32, retry_after: u64) {
        self.shared.lock().flood = (calls, retry_after);
    }
}

impl Drop for FakeWhatsapp {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
    }
}

fn compose(s: &mut State, from: &str, text: &str, at: u64) -> (String, Value) {
    s.seq += 1;
    let wamid = format!("wamid.HBgL{from}FQIAEhgU{:012X}", s.seq);
    let e = s.last_inbound.entry(from.to_owned()).or_insert(0);
    *e = (*e).max(at);
    let message = json!({"from": from, "id": wamid, "timestamp": at.to_string(), "type": "text", "text": {"body": text}});
    let value = json!({
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": DISPLAY_NUMBER, "phone_number_id": s.opts.phone_number_id},
        "contacts": [{"profile": {"name": format!("User {from}")}, "wa_id": from}],
        "messages": [message],
    });
    (wamid, value)
}

fn notification(value: Value) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{"id": WABA_ID, "changes": [{"field": "messages", "value": value}]}]})
}

fn push_note(s: &mut State, value: Value) -> usize {
    let body = notification(value);
    s.notes.push(Note {
        body: body.to_string().into_bytes(),
        attempts: 0,
        done: false,
        inflight: false,
        next_at: Instant::now(),
    });
    s.notes.len() - 1
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One webhook sender: the oldest due notification, POSTed signed; redelivered on anything but
/// 200 (module notes).
fn sender(shared: &Shared) {
    while !shared.dropped.load(Ordering::SeqCst) {
        let job = {
            let mut s = shared.lock();
            let now = Instant::now();
            let url = s.webhook.clone();
            let pick = url.as_ref().and_then(|_| s.notes.iter().position(|n| !n.done && !n.inflight && n.next_at <= now));
            match (url, pick) {
                (Some(url), Some(i)) => {
                    let n = &mut s.notes[i];
                    n.inflight = true;
                    n.attempts += 1;
                    let sig = sign(s.opts.app_secret.as_bytes(), &s.notes[i].body);
                    Some((i, url, s.notes[i].body.clone(), sig, s.opts.answer_timeout))
                }
                _ => None,
            }
        };
        let Some((i, url, body, sig, timeout)) = job else {
            std::thread::sleep(TICK);
            continue;
        };
        let status = request(&url, "POST", "", &[("X-Hub-Signature-256", &sig)], &body, timeout).ok().map(|(st, _)| st);
        let mut s = shared.lock();
        s.attempts.push(Attempt { note: i, status });
        let (first, max) = (s.opts.retry_first, s.opts.retry_max);
        let n = &mut s.notes[i];
        n.inflight = false;
        if status == Some(200) {
            n.done = true;
        } else {
            let backoff = first.saturating_mul(1 << n.attempts.saturating_sub(1).min(16)).min(max);
            n.next_at = Instant::now() + backoff;
        }
    }
}

/// One HTTP/1.1 request to `url` (`http://host:port/path`): `(status, body)`.
fn request(
    url: &str,
    method: &str,
    query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").ok_or_else(|| io::Error::other("not http://"))?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let addr: SocketAddr = host.parse().map_err(io::Error::other)?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    let target = if query.is_empty() { path } else { format!("{path}?{query}") };
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: facebookexternalua\r\nConnection: close\r\n");
    if method == "POST" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes())?;
    // A server that refuses the body (413) may answer and close before reading it all: its
    // answer is still read.
    let _ = c.write_all(body);
    let mut r = BufReader::new(c);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok()).ok_or_else(|| io::Error::other("no status"))?;
    let mut len = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut out = Vec::new();
    match len {
        Some(n) => {
            out.resize(n.min(1 << 20), 0);
            r.read_exact(&mut out)?;
        }
        None => {
            r.take(1 << 20).read_to_end(&mut out)?;
        }
    }
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

fn graph_error(status: u16, code: i64, message: &str) -> (u16, Option<u64>, Value) {
    (
        status,
        None,
        json!({"error": {"message": message, "type": "OAuthException", "code": code,
                         "error_data": {"messaging_product": "whatsapp", "details": message}, "fbtrace_id": "AFakeTrace"}}),
    )
}

fn serve(shared: &Shared, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut w) = conn.try_clone() else { return };
    let Ok(req) = http1::read_request(&mut BufReader::new(conn), 8 << 20) else { return };
    let (method, path, token) = (req.method.as_str(), req.path(), req.bearer());
    if let Some(id) = path.strip_prefix("/media-file/") {
        // The media URL: the bytes, with the bearer.
        let mut s = shared.lock();
        let file = s.media.get(id).cloned().filter(|_| token == Some(s.opts.token.as_str()) && !s.revoked);
        let Some((mime, bytes)) = file else {
            drop(s);
            let _ = http1::write_response(&mut w, 401, &[("Connection", "close")], b"");
            return;
        };
        s.downloads.push(id.to_owned());
        drop(s);
        let _ = http1::write_response(&mut w, 200, &[("Content-Type", &mime), ("Connection", "close")], &bytes);
        return;
    }
    let args: Value = if path.ends_with("/media") && method == "POST" {
        // The upload's form, as JSON for graph(): its fields, and the file as "\u0000file".
        let form = form::parse(req.header("content-type").unwrap_or_default(), &req.body).unwrap_or_default();
        let mut v = json!({});
        for p in form {
            match p.filename {
                Some(f) => v["\u{0}file"] = json!({"name": f, "type": p.content_type, "bytes": p.bytes}),
                None => v[p.name.as_str()] = json!(String::from_utf8_lossy(&p.bytes)),
            }
        }
        v
    } else {
        serde_json::from_slice(&req.body).unwrap_or(Value::Null)
    };
    let (status, retry_after, answer) = graph(&mut shared.lock(), method, path, token, &args);
    let retry = retry_after.map(|s| s.to_string());
    let mut headers = vec![("Content-Type", "application/json; charset=UTF-8"), ("Connection", "close")];
    headers.extend(retry.as_deref().map(|r| ("Retry-After", r)));
    let _ = http1::write_response(&mut w, status, &headers, answer.to_string().as_bytes());
}

/// One Graph API call: `(status, Retry-After, body)`.
fn graph(s: &mut State, method: &str, path: &str, token: Option<&str>, args: &Value) -> (u16, Option<u64>, Value) {
    let answer = graph_answer(s, method, path, token, args);
    if answer.0 != 200 {
        s.errors += 1;
    }
    answer
}

fn graph_answer(s: &mut State, method: &str, path: &str, token: Option<&str>, args: &Value) -> (u16, Option<u64>, Value) {
    let node = format!("/{}/{}", s.opts.version, s.opts.phone_number_id);
    if s.revoked || token != Some(s.opts.token.as_str()) {
        return graph_error(401, 190, "Error validating access token: Session has expired.");
    }
    match (method, path) {
        ("GET", p) if p == node => (
            200,
            None,
            json!({"id": s.opts.phone_number_id, "display_phone_number": DISPLAY_NUMBER, "verified_name": "Fake Business"}),
        ),
        ("POST", p) if p == format!("{node}/messages") => send(s, args),
        ("POST", p) if p == format!("{node}/media") => upload(s, args),
        ("GET", p) if p.strip_prefix(&format!("/{}/", s.opts.version)).is_some_and(|id| s.media.contains_key(id)) => {
            let id = p.rsplit('/').next().unwrap_or("").to_owned();
            let (mime, bytes) = s.media.get(&id).cloned().unwrap_or_default();
            let url = format!("{}/media-file/{id}", s.base);
            (200, None, json!({"messaging_product": "whatsapp", "url": url, "mime_type": mime, "sha256": "fake",
                               "file_size": bytes.len(), "id": id}))
        }
        _ => graph_error(400, 100, "Unsupported request: the object does not exist or the method is not supported"),
    }
}

/// `POST /{phone-number-id}/media` (the form as [`serve`] made it JSON).
fn upload(s: &mut State, args: &Value) -> (u16, Option<u64>, Value) {
    if args["messaging_product"] != "whatsapp" {
        return graph_error(400, 100, "(#100) The parameter messaging_product is required.");
    }
    let file = &args["\u{0}file"];
    let bytes: Vec<u8> = file["bytes"].as_array().into_iter().flatten().filter_map(|b| b.as_u64().map(|b| b as u8)).collect();
    if file.is_null() {
        return graph_error(400, 100, "(#100) The parameter file is required.");
    }
    if bytes.len() > s.opts.max_upload {
        return graph_error(400, 131053, "Media upload error: the file is too large.");
    }
    s.seq += 1;
    let id = format!("{}", 9_000_000 + s.seq);
    let kind = args["type"].as_str().unwrap_or("").to_owned();
    s.media.insert(id.clone(), (kind.clone(), bytes.clone()));
    s.uploads.push(Upload { id: id.clone(), kind, file_name: file["name"].as_str().unwrap_or("").to_owned(), bytes });
    (200, None, json!({"id": id}))
}

fn send(s: &mut State, args: &Value) -> (u16, Option<u64>, Value) {
    if args["messaging_product"] != "whatsapp" {
        return graph_error(400, 100, "(#100) The parameter messaging_product is required.");
    }
    if args["status"] == "read" {
        let Some(id) = args["message_id"].as_str() else {
            return graph_error(400, 100, "(#100) The parameter message_id is required.");
        };
        let typing = args["typing_indicator"]["type"] == "text";
        s.reads.push(MarkedRead { message_id: id.to_owned(), typing });
        return (200, None, json!({"success": true}));
    }
    if s.flood.0 > 0 {
        s.flood.0 -= 1;
        let (st, _, v) = graph_error(400, 130429, "Rate limit hit: Cloud API message throughput has been reached.");
        return (st, Some(s.flood.1), v);
    }
    let kind = args["type"].as_str().unwrap_or("");
    if matches!(kind, "image" | "document" | "audio" | "video" | "sticker") {
        let (Some(to), Some(id)) = (args["to"].as_str(), args[kind]["id"].as_str()) else {
            return graph_error(400, 100, "(#100) Invalid parameter: to and the media id are required");
        };
        if !s.media.contains_key(id) {
            return graph_error(400, 131053, "Media upload error: unknown media id.");
        }
        if s.last_inbound.get(to).is_none_or(|at| unix_now().saturating_sub(*at) >= 24 * 3600) {
            return graph_error(400, 131047, "Re-engagement message: more than 24 hours have passed.");
        }
        let filename = args[kind]["filename"].as_str().map(str::to_owned);
        s.media_sent.push(MediaSent { to: to.to_owned(), kind: kind.to_owned(), media_id: id.to_owned(), filename });
        s.seq += 1;
        let id = format!("wamid.OUT{:012X}", s.seq);
        return (200, None, json!({"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}], "messages": [{"id": id}]}));
    }
    let (Some(to), Some(text)) = (args["to"].as_str(), args["text"]["body"].as_str()) else {
        return graph_error(400, 100, "(#100) Invalid parameter: to and text.body are required");
    };
    if args["type"] != "text" || text.chars().count() > 4096 || text.is_empty() {
        return graph_error(400, 100, "(#100) Invalid parameter: text.body");
    }
    let open = s.last_inbound.get(to).is_some_and(|at| unix_now().saturating_sub(*at) < 24 * 3600);
    if !open {
        return graph_error(
            400,
            131047,
            "Re-engagement message: More than 24 hours have passed since the recipient last replied to the sender number.",
        );
    }
    s.seq += 1;
    let id = format!("wamid.OUT{:012X}", s.seq);
    s.posted.push(Posted { to: to.to_owned(), text: text.to_owned(), id: id.clone(), at: Instant::now() });
    (200, None, json!({"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}], "messages": [{"id": id}]}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's published `X-Hub-Signature-256` test values
    /// (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries).
    #[test]
    fn signs_like_github_and_meta() {
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    /// Uploads past `max_upload` and messages naming unknown media are code 131053; an upload
    /// then a document message naming it is recorded.
    #[test]
    fn whatsapp_media_upload_and_refusals() {
        let fake = FakeWhatsapp::start(Options { max_upload: 4, ..Options::default() }).unwrap();
        let o = fake.options();
        let mut s = fake.shared.lock();
        let media = format!("/{}/{}/media", o.version, o.phone_number_id);
        let messages = format!("/{}/{}/messages", o.version, o.phone_number_id);
        let form = |bytes: &[u8]| json!({"messaging_product": "whatsapp", "type": "text/plain",
                                         "\u{0}file": {"name": "a.txt", "type": "text/plain", "bytes": bytes}});
        assert_eq!(graph(&mut s, "POST", &media, Some(&o.token), &form(b"12345")).2["error"]["code"], 131053);
        let (st, _, v) = graph(&mut s, "POST", &media, Some(&o.token), &form(b"1234"));
        assert_eq!(st, 200);
        let id = v["id"].as_str().unwrap().to_owned();
        s.last_inbound.insert("1555".into(), unix_now());
        let doc = |id: &str| json!({"messaging_product": "whatsapp", "to": "1555", "type": "document",
                                     "document": {"id": id, "filename": "a.txt"}});
        assert_eq!(graph(&mut s, "POST", &messages, Some(&o.token), &doc("404")).2["error"]["code"], 131053);
        assert_eq!(graph(&mut s, "POST", &messages, Some(&o.token), &doc(&id)).0, 200);
        assert_eq!(s.media_sent.len(), 1);
        assert_eq!((s.uploads.len(), s.uploads[0].bytes.as_slice()), (1, &b"1234"[..]));
        let (st, _, node) = graph(&mut s, "GET", &format!("/{}/{id}", o.version), Some(&o.token), &Value::Null);
        assert_eq!((st, node["file_size"].as_u64()), (200, Some(4)));
    }

    #[test]
    fn errors_and_window() {
        let fake = FakeWhatsapp::start(Options::default()).unwrap();
        let o = fake.options();
        let mut s = fake.shared.lock();
        let node = format!("/{}/{}/messages", o.version, o.phone_number_id);
        let text = json!({"messaging_product": "whatsapp", "to": "1555", "type": "text", "text": {"body": "hi"}});
        assert_eq!(graph(&mut s, "POST", &node, Some("wrong"), &text).2["error"]["code"], 190);
        assert_eq!(graph(&mut s, "POST", &node, Some(&o.token), &text).2["error"]["code"], 131047);
        s.last_inbound.insert("1555".into(), unix_now());
        assert_eq!(graph(&mut s, "POST", &node, Some(&o.token), &text).0, 200);
        s.flood = (1, 3);
        let (st, retry, v) = graph(&mut s, "POST", &node, Some(&o.token), &text);
        assert_eq!((st, retry, v["error"]["code"].as_i64()), (400, Some(3), Some(130429)));
        assert_eq!(s.posted.len(), 1);
    }
}
