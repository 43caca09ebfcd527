//! A fake Slack app on loopback: Socket Mode (WebSocket) and the few Web API methods the
//! gateway calls, faithful to what the Slack adapter (crates/platforms/src/slack.rs) relies on.
//! Each modelled behaviour, with the public documentation it follows:
//!
//! - **`apps.connections.open`** (https://api.slack.com/methods/apps.connections.open): a POST
//!   with the app-level token as `Authorization: Bearer`; answers `{"ok": true, "url":
//!   "wss://…/link/?ticket=…"}` (here `ws://127.0.0.1:<port>/link/?ticket=…&app_id=…`). A
//!   ticket is good for one connection.
//! - **`hello`** (https://api.slack.com/apis/connections/socket-implement): the first message of
//!   every connection, with `num_connections`, `debug_info` and `connection_info.app_id`.
//! - **Envelopes** (same page, "Acknowledge events"): an Events API event comes as
//!   `{"type": "events_api", "envelope_id", "payload", "accepts_response_payload",
//!   "retry_attempt", "retry_reason"}`, and the app acknowledges it by sending back
//!   `{"envelope_id": …}`. One not acknowledged within 3 s ([`Options::ack_timeout`]) is sent
//!   again, under a new `envelope_id`, with the same payload (`event_id` included),
//!   `retry_attempt` one higher and `retry_reason: "timeout"`, following the Events API's
//!   retry schedule (https://api.slack.com/apis/events-api#retries: nearly immediately, after
//!   1 minute, after 5 minutes; [`Options::retry_delays`]). An event whose attempts run out
//!   unacknowledged is counted lost ([`Stats::lost`]). The fake is stricter than the docs in one
//!   point: an acknowledgement counts only on the connection that carried that envelope
//!   ([`Stats::misrouted_acks`]).
//! - **Several connections** (socket-implement, on multiple connections: an app may open up to
//!   10 at once, and each payload goes to one of them): envelopes are spread round robin
//!   over the open connections that said `hello`. While none is open an event waits; it is lost
//!   once its whole retry schedule has passed (the docs say nothing about that case: this is
//!   the fake's assumption).
//! - **`disconnect`** (socket-implement, "Refreshing connections"): [`FakeSlack::disconnect`]
//!   sends `{"type": "disconnect", "reason": …, "debug_info": {"host": …}}` (`refresh_requested`,
//!   `warning`, `link_disabled`) on every open connection and closes each
//!   [`Options::disconnect_grace`] later (Slack: about 10 s after a `warning`).
//! - **`auth.test`** (https://api.slack.com/methods/auth.test): the bot token's `user_id` and
//!   `bot_id`.
//! - **`chat.postMessage`** (https://api.slack.com/methods/chat.postMessage): the bot token,
//!   `channel`, `text`, `thread_ts` (a reply in a thread); logged for [`FakeSlack::posted`].
//!   Its rate limit ("Special": about one message per second per channel,
//!   https://api.slack.com/apis/rate-limits) is modelled by [`FakeSlack::flood`]: HTTP 429 with
//!   `Retry-After` and `{"ok": false, "error": "ratelimited"}`. A post to an unknown channel is
//!   `channel_not_found`. Each post comes back as a `message` event with the bot's `bot_id`
//!   and `user` (as Slack echoes an app's own messages to its subscriptions).
//! - **`chat.update`** (https://api.slack.com/methods/chat.update): `channel` and `ts` of a
//!   message the bot posted, and the new `text`; `message_not_found` for any other (or a deleted)
//!   one, `channel_not_found`, `no_text`. Answers `channel`, `ts`, `text`, and comes back as a
//!   `message` event with subtype `message_changed`. Tier 3: more than
//!   [`Options::tier3_per_minute`] calls within a minute are answered HTTP 429 with
//!   `Retry-After` (https://api.slack.com/apis/rate-limits, "50+ per minute").
//! - **`chat.delete`** (https://api.slack.com/methods/chat.delete): `channel` and `ts`;
//!   `message_not_found` for a message that is not there (or deleted already); comes back as
//!   `message_deleted`. Tier 3 like `chat.update`, each method counted on its own.
//!   [`FakeSlack::flood_method`] answers any method's next calls 429. Every `chat.*` call is
//!   logged with its outcome ([`FakeSlack::calls`]); [`FakeSlack::visible`] is what a user sees.
//! - **`ok: false` errors** (https://api.slack.com/web#responses, each method's "Errors"): a
//!   missing token is `not_authed`, a wrong one `invalid_auth`; [`FakeSlack::revoke_app`] and
//!   [`FakeSlack::revoke_bot`] make a token answer `invalid_auth`, `account_inactive` or
//!   `token_revoked`.
//!
//! - **Files in** (https://api.slack.com/types/file, https://api.slack.com/events/message/file_share):
//!   [`FakeSlack::user_files`] delivers a `message` with subtype `file_share` whose `files[]`
//!   carry `id`, `name`, `title`, `mimetype`, `filetype`, `size`, `url_private` and
//!   `url_private_download` on the fake's own HTTP port (standing in for `files.slack.com`:
//!   `/files-pri/<team>-<file id>/download/<name>`). A download needs `Authorization: Bearer`
//!   with the bot token (https://api.slack.com/types/file#auth), else 403 (Slack answers a
//!   login page; the fake a plain refusal); each is logged ([`FakeSlack::downloads`]).
//! - **Files out** (https://api.slack.com/messaging/files#uploading_files): the external
//!   upload. `files.getUploadURLExternal` (form: `filename`, `length`; `invalid_arguments`
//!   without them) answers `upload_url` (on the fake's HTTP port, `/upload/v1/<file id>`) and
//!   `file_id`; a POST of the bytes to `upload_url` (raw, or a form's file part) answers 200
//!   `OK - <length>`, and 413 past [`Options::max_upload`] (the fake's assumption: Slack
//!   documents the limit, 1 GB, not the answer); `files.completeUploadExternal` (`files`, a
//!   JSON array of `{id, title}`; `channel_id`; `thread_ts`) shares each uploaded file in the
//!   channel, logged ([`FakeSlack::shared_files`]) and echoed as the bot's `file_share`
//!   message; a file id never uploaded to is `file_not_found`, an unknown channel
//!   `channel_not_found`. Form bodies are percent-decoded, as Slack reads them.
//! - **Consumers told apart.** `<base>/c/<consumer>/api/` is the same Web API, whose
//!   connection URLs carry the consumer's name, so a test with several gateways on one app
//!   knows which of them connected and received ([`Delivery::consumer`],
//!   [`FakeSlack::connected`]).
//!
//! [`FakeSlack::kill`] drops every connection and stops listening; [`FakeSlack::revive`]
//! listens again on the same two ports with the same events. Plain std threads, like the other
//! fakes of this crate.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tungstenite::Message;

use gatewarden_fakewire::{form, http1};

/// The fake's app.
pub const APP_ID: &str = "AFAKEAPP";
pub const TEAM_ID: &str = "TFAKETEAM";
/// The bot's ids (`auth.test`), as its own messages carry them.
pub const BOT_ID: &str = "BFAKEBOT";

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The app-level token (`xapp-…`) `apps.connections.open` accepts.
    pub app_token: String,
    /// The bot token (`xoxb-…`) `auth.test` and `chat.postMessage` accept.
    pub bot_token: String,
    /// The bot's user id.
    pub bot_user: String,
    /// How long an envelope waits for its acknowledgement (Slack: 3 s).
    pub ack_timeout: Duration,
    /// The waits before each redelivery after a timed-out attempt (Slack: 0, 1 min, 5 min).
    pub retry_delays: Vec<Duration>,
    /// How long after a `disconnect` message the connection is closed.
    pub disconnect_grace: Duration,
    /// Channels `chat.postMessage` accepts; empty: any.
    pub channels: Vec<String>,
    /// What connection URLs start with instead of `ws://<the WebSocket port>` (a TLS front in
    /// front of it: `wss://localhost:<port>`).
    pub ws_url: Option<String>,
    /// Calls a minute of each Tier 3 method (`chat.update`, `chat.delete`) before 429s.
    pub tier3_per_minute: usize,
    /// The largest upload the `upload_url` takes.
    pub max_upload: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            app_token: "xapp-1-AFAKEAPP-1-fake".into(),
            bot_token: "xoxb-fake-bot".into(),
            bot_user: "UFAKEBOT".into(),
            ack_timeout: Duration::from_secs(3),
            retry_delays: vec![Duration::ZERO, Duration::from_secs(60), Duration::from_secs(300)],
            disconnect_grace: Duration::from_secs(10),
            channels: Vec::new(),
            ws_url: None,
            tier3_per_minute: 50,
            max_upload: 8 << 20,
        }
    }
}

/// A message the bot posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub channel: String,
    pub text: String,
    pub thread_ts: Option<String>,
    pub ts: String,
}

/// One `chat.*` Web API call, as the fake answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `chat.postMessage`, `chat.update`, `chat.delete`.
    pub method: String,
    pub channel: String,
    /// The message posted (its new `ts`), updated or deleted.
    pub ts: Option<String>,
    pub thread_ts: Option<String>,
    pub text: Option<String>,
    /// The HTTP status, and the `error` of an `ok: false`.
    pub status: u16,
    pub error: Option<String>,
}

/// A file a user shares ([`FakeSlack::user_files`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlackFile {
    pub name: String,
    /// `mimetype` (`application/octet-stream` when `None`).
    pub mimetype: Option<String>,
    pub bytes: Vec<u8>,
    /// The `size` declared, when it is not the bytes' length.
    pub declared_size: Option<u64>,
}

/// One download of a user's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDownload {
    pub path: String,
    /// Whether it carried the bot token (`Authorization: Bearer <bot token>`).
    pub with_bot_token: bool,
    /// The HTTP status answered.
    pub status: u16,
}

/// A file the bot shared with the external upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFile {
    pub file_id: String,
    /// `filename` of `files.getUploadURLExternal`.
    pub filename: String,
    pub title: String,
    pub channel: String,
    pub thread_ts: Option<String>,
    pub bytes: Vec<u8>,
}

/// An upload begun with `files.getUploadURLExternal`.
struct PendingUpload {
    filename: String,
    bytes: Option<Vec<u8>>,
}

/// One envelope sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub event_id: String,
    pub envelope_id: String,
    /// The connection (numbered from 1 in the order they opened).
    pub conn: u64,
    /// The consumer whose connection carried it (`""` for the plain base).
    pub consumer: String,
    pub retry_attempt: u32,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// `apps.connections.open` calls answered `ok`.
    pub opens: u64,
    /// WebSocket connections accepted.
    pub connections: u64,
    /// Connections open now (that said `hello`), and the most open at once.
    pub open_now: usize,
    pub max_open: usize,
    /// Connections the app closed (a close frame or a hang-up), not the fake.
    pub closed_by_app: u64,
    pub acks: u64,
    /// Acknowledgements that came on another connection than their envelope's (ignored).
    pub misrouted_acks: u64,
    /// Envelopes sent again (`retry_attempt` > 0).
    pub redeliveries: u64,
    /// Events whose retries ran out unacknowledged.
    pub lost: u64,
    /// Events not yet acknowledged (nor lost).
    pub pending: usize,
    /// The longest time without any open connection since the first one opened (or
    /// [`FakeSlack::reset_gap`]): a restart's receive gap.
    pub max_gap_ms: u64,
}

struct Event {
    event_id: String,
    payload: Value,
    created: Instant,
    attempts: u32,
    acked: bool,
    lost: bool,
    /// The envelope in flight: (connection, envelope id, when sent).
    inflight: Option<(u64, String, Instant)>,
    /// Every envelope id sent for it, with its connection.
    envelopes: Vec<(u64, String)>,
    next_at: Instant,
}

struct Conn {
    consumer: String,
    out: VecDeque<String>,
    close_at: Option<Instant>,
    stream: TcpStream,
}

struct State {
    opts: Options,
    app_refused: Option<String>,
    bot_refused: Option<String>,
    events: Vec<Event>,
    conns: HashMap<u64, Conn>,
    /// Ticket -> consumer.
    tickets: HashMap<String, String>,
    /// The consumer of every connection accepted, in order.
    connected: Vec<String>,
    posted: Vec<Posted>,
    /// `ts` -> the text of its last `chat.update`.
    edited: HashMap<String, String>,
    /// The `ts` of deleted messages.
    deleted: std::collections::HashSet<String>,
    calls: Vec<Call>,
    /// Method -> the calls of the last minute (Tier 3).
    tier3: HashMap<String, VecDeque<Instant>>,
    /// Method -> (calls left, Retry-After) answered 429.
    floods: HashMap<String, (u32, u64)>,
    deliveries: Vec<Delivery>,
    stats: Stats,
    /// The HTTP port's address (file URLs and upload URLs point at it).
    http: SocketAddr,
    /// Users' files: path -> bytes.
    files: HashMap<String, Vec<u8>>,
    downloads: Vec<FileDownload>,
    /// `file_id` -> the upload begun for it.
    uploads: HashMap<String, PendingUpload>,
    shared_files: Vec<SharedFile>,
    rr: usize,
    seq: u64,
    /// Since when no connection is open (after the first one).
    no_conn_since: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    /// Bumped by every kill: the threads of an earlier life end.
    life: AtomicU64,
    dropped: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn alive(&self, life: u64) -> bool {
        !self.dropped.load(Ordering::SeqCst) && self.life.load(Ordering::SeqCst) == life
    }
}

/// The fake Slack (module notes).
pub struct FakeSlack {
    shared: Arc<Shared>,
    http: SocketAddr,
    ws: SocketAddr,
}

const TICK: Duration = Duration::from_millis(10);

impl FakeSlack {
    pub fn start(opts: Options) -> io::Result<FakeSlack> {
        let http = TcpListener::bind("127.0.0.1:0")?;
        let ws = TcpListener::bind("127.0.0.1:0")?;
        let (http_addr, ws_addr) = (http.local_addr()?, ws.local_addr()?);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                opts,
                app_refused: None,
                bot_refused: None,
                events: Vec::new(),
                conns: HashMap::new(),
                tickets: HashMap::new(),
                connected: Vec::new(),
                posted: Vec::new(),
                edited: HashMap::new(),
                deleted: std::collections::HashSet::new(),
                calls: Vec::new(),
                tier3: HashMap::new(),
                floods: HashMap::new(),
                deliveries: Vec::new(),
                stats: Stats::default(),
                http: http_addr,
                files: HashMap::new(),
                downloads: Vec::new(),
                uploads: HashMap::new(),
                shared_files: Vec::new(),
                rr: 0,
                seq: 0,
                no_conn_since: None,
            }),
            life: AtomicU64::new(0),
            dropped: AtomicBool::new(false),
        });
        let fake = FakeSlack { shared, http: http_addr, ws: ws_addr };
        fake.serve(http, ws)?;
        let s = Arc::clone(&fake.shared);
        std::thread::Builder::new().name("slackfake-sched".into()).spawn(move || {
            while !s.dropped.load(Ordering::SeqCst) {
                schedule(&mut s.lock());
                std::thread::sleep(TICK);
            }
        })?;
        Ok(fake)
    }

    fn serve(&self, http: TcpListener, ws: TcpListener) -> io::Result<()> {
        let life = self.shared.life.load(Ordering::SeqCst);
        let ws_addr = self.ws;
        for (listener, is_ws) in [(http, false), (ws, true)] {
            listener.set_nonblocking(true)?;
            let s = Arc::clone(&self.shared);
            std::thread::Builder::new().name("slackfake-accept".into()).spawn(move || {
                while s.alive(life) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let _ = conn.set_nonblocking(false);
                            let s = Arc::clone(&s);
                            let _ = std::thread::Builder::new().name("slackfake-conn".into()).spawn(move || {
                                if is_ws { serve_ws(&s, conn, life) } else { serve_http(&s, conn, ws_addr) }
                            });
                        }
                        Err(_) => std::thread::sleep(TICK),
                    }
                }
            })?;
        }
        Ok(())
    }

    /// `http://127.0.0.1:<port>/api/`, for `api_base`.
    pub fn api_base(&self) -> String {
        format!("http://{}/api/", self.http)
    }

    /// [`FakeSlack::api_base`] for consumer `name` (module notes).
    pub fn api_base_for(&self, name: &str) -> String {
        format!("http://{}/c/{name}/api/", self.http)
    }

    /// The consumer of every connection accepted so far, in order.
    pub fn connected(&self) -> Vec<String> {
        self.shared.lock().connected.clone()
    }

    /// The HTTP (Web API) and WebSocket addresses.
    pub fn addrs(&self) -> (SocketAddr, SocketAddr) {
        (self.http, self.ws)
    }

    pub fn options(&self) -> Options {
        self.shared.lock().opts.clone()
    }

    /// A user's message in `channel` (`thread_ts`: a reply in that thread), delivered as an
    /// `events_api` envelope with a fresh `event_id` and `client_msg_id`. Returns the event id.
    pub fn user_message(&self, channel: &str, user: &str, text: &str, thread_ts: Option<&str>) -> String {
        let mut s = self.shared.lock();
        s.seq += 1;
        let ts = ts_now(s.seq);
        let mut event = json!({
            "type": "message", "channel": channel, "user": user, "text": text, "ts": ts,
            "event_ts": ts, "channel_type": if channel.starts_with('D') { "im" } else { "channel" },
            "client_msg_id": format!("00000000-0000-4000-8000-{:012}", s.seq),
        });
        if let Some(t) = thread_ts {
            event["thread_ts"] = json!(t);
        }
        push_event(&mut s, event)
    }

    /// A user shares `files` in `channel` with the comment `text` (module notes): a
    /// `file_share` message. Returns the event id.
    pub fn user_files(&self, channel: &str, user: &str, text: &str, files: Vec<SlackFile>) -> String {
        let mut s = self.shared.lock();
        s.seq += 1;
        let ts = ts_now(s.seq);
        let base = format!("http://{}", s.http);
        let mut list = Vec::new();
        for f in files {
            s.seq += 1;
            let id = format!("F{:010}", s.seq);
            let path = format!("/files-pri/{TEAM_ID}-{id}/download/{}", f.name);
            let mimetype = f.mimetype.unwrap_or_else(|| "application/octet-stream".into());
            let filetype = f.name.rsplit_once('.').map_or("binary", |(_, ext)| ext).to_owned();
            list.push(json!({
                "id": id, "name": f.name, "title": f.name, "mimetype": mimetype, "filetype": filetype,
                "size": f.declared_size.unwrap_or(f.bytes.len() as u64), "mode": "hosted",
                "url_private": format!("{base}/files-pri/{TEAM_ID}-{id}/{}", f.name),
                "url_private_download": format!("{base}{path}"),
            }));
            s.files.insert(path, f.bytes);
        }
        let event = json!({
            "type": "message", "subtype": "file_share", "channel": channel, "user": user, "text": text,
            "ts": ts, "event_ts": ts, "channel_type": if channel.starts_with('D') { "im" } else { "channel" },
            "files": list, "upload": false,
        });
        push_event(&mut s, event)
    }

    /// Every download of a user's file so far, in order.
    pub fn downloads(&self) -> Vec<FileDownload> {
        self.shared.lock().downloads.clone()
    }

    /// Every file the bot shared (`files.completeUploadExternal`), in order.
    pub fn shared_files(&self) -> Vec<SharedFile> {
        self.shared.lock().shared_files.clone()
    }

    /// Uploads begun with `files.getUploadURLExternal` (completed or not).
    pub fn uploads_begun(&self) -> usize {
        self.shared.lock().uploads.len()
    }

    /// Any event (an edit, a join, an `app_mention`), delivered as `events_api`. Returns its
    /// event id.
    pub fn event(&self, event: Value) -> String {
        push_event(&mut self.shared.lock(), event)
    }

    /// The same payload again as a new event with the same `event_id` (Slack's redelivery of
    /// an event as the app would see it after the fake lost track of it).
    pub fn replay(&self, event_id: &str) -> bool {
        let mut s = self.shared.lock();
        let Some(e) = s.events.iter().find(|e| e.event_id == event_id) else { return false };
        let payload = e.payload.clone();
        let now = Instant::now();
        s.events.push(Event {
            event_id: event_id.to_owned(),
            payload,
            created: now,
            attempts: 0,
            acked: false,
            lost: false,
            inflight: None,
            envelopes: Vec::new(),
            next_at: now,
        });
        true
    }

    /// What the bot posted, in order.
    pub fn posted(&self) -> Vec<Posted> {
        self.shared.lock().posted.clone()
    }

    /// Waits until at least `n` posts arrived, up to `timeout`.
    pub fn wait_posted(&self, n: usize, timeout: Duration) -> Result<Vec<Posted>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.posted();
            if p.len() >= n {
                return Ok(p);
            }
            if Instant::now() >= deadline {
                return Err(format!("{} of {n} posts after {timeout:?}: {p:?}", p.len()));
            }
            std::thread::sleep(TICK);
        }
    }

    /// Every envelope sent so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.lock().deliveries.clone()
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared.lock();
        let mut st = s.stats.clone();
        st.open_now = s.conns.len();
        st.pending = s.events.iter().filter(|e| !e.acked && !e.lost).count();
        st
    }

    /// Connection URLs start with `url` from now on ([`Options::ws_url`]: a TLS front made
    /// after the fake, for its port).
    pub fn set_ws_url(&self, url: &str) {
        self.shared.lock().opts.ws_url = Some(url.to_owned());
    }

    /// Starts measuring [`Stats::max_gap_ms`] afresh.
    pub fn reset_gap(&self) {
        let mut s = self.shared.lock();
        s.stats.max_gap_ms = 0;
        if s.no_conn_since.is_some() {
            s.no_conn_since = Some(Instant::now());
        }
    }

    /// Sends `disconnect` with `reason` on every open connection, and closes each after
    /// [`Options::disconnect_grace`].
    pub fn disconnect(&self, reason: &str) {
        let mut s = self.shared.lock();
        let at = Instant::now() + s.opts.disconnect_grace;
        let msg = json!({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}).to_string();
        for c in s.conns.values_mut() {
            c.out.push_back(msg.clone());
            c.close_at.get_or_insert(at);
        }
    }

    /// A text frame as it is, on every open connection: what no Slack sends but a hostile
    /// network path or a broken server could (bad JSON, nesting too deep, a frame over the
    /// adapter's limit, envelopes of the wrong shape). Not an event: nothing tracks its ack.
    pub fn raw(&self, frame: &str) {
        for c in self.shared.lock().conns.values_mut() {
            c.out.push_back(frame.to_owned());
        }
    }

    /// The app-level token is answered `error` from now on (`None`: accepted again).
    pub fn revoke_app(&self, error: Option<&str>) {
        self.shared.lock().app_refused = error.map(str::to_owned);
    }

    /// The bot token is answered `error` from now on (`None`: accepted again).
    pub fn revoke_bot(&self, error: Option<&str>) {
        self.shared.lock().bot_refused = error.map(str::to_owned);
    }

    /// The next `calls` posts are answered 429 with `Retry-After: retry_after`.
    pub fn flood(&self, calls: u32, retry_after: u64) {
        self.flood_method("chat.postMessage", calls, retry_after);
    }

    /// The next `calls` calls of `method` are answered 429 with `Retry-After: retry_after`.
    pub fn flood_method(&self, method: &str, calls: u32, retry_after: u64) {
        self.shared.lock().floods.insert(method.to_owned(), (calls, retry_after));
    }

    /// Every `chat.*` call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Waits until `pred(calls)` holds, up to `timeout`; the calls either way.
    pub fn wait_calls(&self, timeout: Duration, pred: impl Fn(&[Call]) -> bool) -> Result<Vec<Call>, Vec<Call>> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.calls();
            if pred(&c) {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                return Err(c);
            }
            std::thread::sleep(TICK);
        }
    }

    /// The bot's messages as a user sees them now: not deleted, with their last edit.
    pub fn visible(&self) -> Vec<Posted> {
        let s = self.shared.lock();
        s.posted
            .iter()
            .filter(|p| !s.deleted.contains(&p.ts))
            .map(|p| Posted { text: s.edited.get(&p.ts).unwrap_or(&p.text).clone(), ..p.clone() })
            .collect()
    }

    /// Drops every connection and stops listening.
    pub fn kill(&self) {
        self.shared.life.fetch_add(1, Ordering::SeqCst);
        let mut s = self.shared.lock();
        for (_, c) in s.conns.drain() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        s.tickets.clear();
        for e in &mut s.events {
            e.inflight = None;
        }
    }

    /// Listens again on the same ports (retrying briefly while they are busy).
    pub fn revive(&self) -> io::Result<()> {
        let bind = |addr: SocketAddr| {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpListener::bind(addr) {
                    Ok(l) => return Ok(l),
                    Err(e) if Instant::now() < deadline && e.kind() == io::ErrorKind::AddrInUse => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let (http, ws) = (bind(self.http)?, bind(self.ws)?);
        self.serve(http, ws)
    }
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
        self.kill();
    }
}

/// A `ts` for now, unique per `seq`.
fn ts_now(seq: u64) -> String {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}", now.as_secs(), (u64::from(now.subsec_micros()) + seq) % 1_000_000)
}

fn push_event(s: &mut State, event: Value) -> String {
    s.seq += 1;
    let event_id = format!("Ev{:010}", s.seq);
    let now = Instant::now();
    let epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let payload = json!({
        "token": "verification-token-unused", "team_id": TEAM_ID, "api_app_id": APP_ID,
        "event": event, "type": "event_callback", "event_id": event_id, "event_time": epoch,
        "authorizations": [{"team_id": TEAM_ID, "user_id": s.opts.bot_user, "is_bot": true}],
    });
    s.events.push(Event {
        event_id: event_id.clone(),
        payload,
        created: now,
        attempts: 0,
        acked: false,
        lost: false,
        inflight: None,
        envelopes: Vec::new(),
        next_at: now,
    });
    event_id
}

/// Timeouts, redeliveries and losses: one pass.
fn schedule(s: &mut State) {
    let now = Instant::now();
    let (timeout, delays) = (s.opts.ack_timeout, s.opts.retry_delays.clone());
    let horizon = timeout * (delays.len() as u32 + 1) + delays.iter().sum::<Duration>();
    let mut conn_ids: Vec<u64> = s.conns.iter().filter(|(_, c)| c.close_at.is_none()).map(|(id, _)| *id).collect();
    if conn_ids.is_empty() {
        // Connections told to go still carry envelopes until they close.
        conn_ids = s.conns.keys().copied().collect();
    }
    conn_ids.sort_unstable();
    let mut lost = 0;
    let mut sends = Vec::new();
    for (i, e) in s.events.iter_mut().enumerate() {
        if e.acked || e.lost {
            continue;
        }
        if let Some((_, _, at)) = &e.inflight
            && now.duration_since(*at) >= timeout
        {
            e.inflight = None;
            match delays.get(e.attempts as usize - 1) {
                Some(d) => e.next_at = now + *d,
                None => {
                    e.lost = true;
                    lost += 1;
                    continue;
                }
            }
        }
        if e.inflight.is_none() && now >= e.next_at {
            if conn_ids.is_empty() {
                if now.duration_since(e.created) > horizon {
                    e.lost = true;
                    lost += 1;
                }
                continue;
            }
            sends.push(i);
        }
    }
    s.stats.lost += lost;
    for i in sends {
        let cid = conn_ids[s.rr % conn_ids.len()];
        s.rr = s.rr.wrapping_add(1);
        s.seq += 1;
        let envelope_id = format!("env-{:08x}-{}", s.seq, s.events[i].attempts);
        let e = &mut s.events[i];
        let retry_attempt = e.attempts;
        e.attempts += 1;
        e.inflight = Some((cid, envelope_id.clone(), now));
        e.envelopes.push((cid, envelope_id.clone()));
        let msg = json!({
            "envelope_id": envelope_id, "payload": e.payload, "type": "events_api",
            "accepts_response_payload": false, "retry_attempt": retry_attempt,
            "retry_reason": if retry_attempt == 0 { "" } else { "timeout" },
        });
        let consumer = s.conns.get(&cid).map(|c| c.consumer.clone()).unwrap_or_default();
        let e = &s.events[i];
        let d = Delivery { event_id: e.event_id.clone(), envelope_id, conn: cid, consumer, retry_attempt };
        if retry_attempt > 0 {
            s.stats.redeliveries += 1;
        }
        s.deliveries.push(d);
        if let Some(c) = s.conns.get_mut(&cid) {
            c.out.push_back(msg.to_string());
        }
    }
}

/// An acknowledgement of `envelope_id` on connection `cid`.
fn ack(s: &mut State, cid: u64, envelope_id: &str) {
    let Some(e) = s.events.iter_mut().find(|e| e.envelopes.iter().any(|(_, id)| id == envelope_id)) else {
        return;
    };
    let on = e.envelopes.iter().find(|(_, id)| id == envelope_id).map(|(c, _)| *c);
    if on != Some(cid) {
        s.stats.misrouted_acks += 1;
        return;
    }
    if !e.acked && !e.lost {
        e.acked = true;
        e.inflight = None;
        s.stats.acks += 1;
    }
}

fn serve_ws(shared: &Shared, stream: TcpStream, life: u64) {
    let mut consumer: Option<String> = None;
    // The error type is tungstenite's (its handshake callback), not ours to shrink.
    #[allow(clippy::result_large_err)]
    let check = |req: &tungstenite::handshake::server::Request,
                 resp: tungstenite::handshake::server::Response|
     -> Result<tungstenite::handshake::server::Response, tungstenite::handshake::server::ErrorResponse> {
        let query = req.uri().query().unwrap_or("");
        let ticket = query.split('&').find_map(|kv| kv.strip_prefix("ticket=")).unwrap_or("");
        let known = if req.uri().path().starts_with("/link") { shared.lock().tickets.remove(ticket) } else { None };
        if let Some(c) = known {
            consumer = Some(c);
            Ok(resp)
        } else {
            let mut r = tungstenite::handshake::server::ErrorResponse::new(Some("invalid ticket".into()));
            *r.status_mut() = tungstenite::http::StatusCode::UNAUTHORIZED;
            Err(r)
        }
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(sock) = stream.try_clone() else { return };
    let Ok(mut ws) = tungstenite::accept_hdr(stream, check) else { return };
    let Some(consumer) = consumer else { return };
    let _ = sock.set_read_timeout(Some(TICK));
    let cid = {
        let mut s = shared.lock();
        s.stats.connections += 1;
        let cid = s.stats.connections;
        let Ok(handle) = sock.try_clone() else { return };
        s.connected.push(consumer.clone());
        if let Some(t) = s.no_conn_since.take() {
            s.stats.max_gap_ms = s.stats.max_gap_ms.max(t.elapsed().as_millis() as u64);
        }
        s.conns.insert(cid, Conn { consumer, out: VecDeque::new(), close_at: None, stream: handle });
        s.stats.max_open = s.stats.max_open.max(s.conns.len());
        let hello = json!({
            "type": "hello", "num_connections": s.conns.len(),
            "debug_info": {"host": "applink-fake", "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": APP_ID},
        });
        if let Some(c) = s.conns.get_mut(&cid) {
            c.out.push_back(hello.to_string());
        }
        cid
    };
    loop {
        let (out, close) = {
            let mut s = shared.lock();
            let Some(c) = s.conns.get_mut(&cid) else { break };
            let out: Vec<String> = c.out.drain(..).collect();
            (out, c.close_at.is_some_and(|t| Instant::now() >= t))
        };
        if !shared.alive(life) {
            break;
        }
        let mut failed = false;
        for m in out {
            if ws.send(Message::text(m)).is_err() {
                failed = true;
                break;
            }
        }
        if failed || close {
            let _ = ws.close(None);
            let _ = ws.flush();
            break;
        }
        match ws.read() {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                if let Some(env) = v["envelope_id"].as_str() {
                    ack(&mut shared.lock(), cid, env);
                }
            }
            Ok(Message::Close(_)) => {
                shared.lock().stats.closed_by_app += 1;
                break;
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => {
                if shared.alive(life) {
                    shared.lock().stats.closed_by_app += 1;
                }
                break;
            }
        }
    }
    // A close leaves in-flight envelopes to their ack timeout, as on Slack.
    let mut s = shared.lock();
    if s.conns.remove(&cid).is_some() && s.conns.is_empty() {
        s.no_conn_since = Some(Instant::now());
    }
    drop(s);
    let _ = sock.shutdown(std::net::Shutdown::Both);
}

/// One Web API request (`Connection: close`).
fn serve_http(shared: &Shared, conn: TcpStream, ws: SocketAddr) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut w) = conn.try_clone() else { return };
    let Ok(req) = http1::read_request(&mut BufReader::new(conn), 64 << 20) else { return };
    let path = req.target.clone();
    let header = |name: &str| req.header(name).map(str::to_owned);
    if path.starts_with("/files-pri/") || path.starts_with("/upload/v1/") {
        let (ctype, auth) = (header("content-type").unwrap_or_default(), header("authorization"));
        let (status, ctype, bytes) = file_host(&mut shared.lock(), &path, auth, &ctype, req.body);
        let _ = http1::write_response(&mut w, status, &[("Content-Type", ctype), ("Connection", "close")], &bytes);
        return;
    }
    let json_body = header("content-type").is_some_and(|t| t.starts_with("application/json"));
    let args: Value = if json_body {
        serde_json::from_slice(&req.body).unwrap_or(Value::Null)
    } else {
        let text = String::from_utf8_lossy(&req.body).into_owned();
        Value::Object(
            text.split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (percent_decode(k), Value::String(percent_decode(v))))
                .collect(),
        )
    };
    // `/c/<consumer>/api/<method>` or `/api/<method>`.
    let (consumer, rest) = match path.strip_prefix("/c/").and_then(|r| r.split_once('/')) {
        Some((c, rest)) => (c.to_owned(), format!("/{rest}")),
        None => (String::new(), path.clone()),
    };
    let method = rest.strip_prefix("/api/").unwrap_or("").split('?').next().unwrap_or("").to_owned();
    let (status, retry_after, answer) = api(&mut shared.lock(), &method, req.bearer(), &args, ws, &consumer);
    let retry = retry_after.map(|s| s.to_string());
    let mut headers = vec![("Content-Type", "application/json; charset=utf-8"), ("Connection", "close")];
    headers.extend(retry.as_deref().map(|r| ("Retry-After", r)));
    let _ = http1::write_response(&mut w, status, &headers, answer.to_string().as_bytes());
}

/// A form value: `+` is a space, `%XY` a byte (https://url.spec.whatwg.org/#urlencoded-parsing).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The fake `files.slack.com`: a user's file for the bot token (`GET /files-pri/…`), and the
/// bytes of an external upload (`POST /upload/v1/<file id>`). `(status, content type, body)`.
fn file_host(
    s: &mut State,
    path: &str,
    auth: Option<String>,
    ctype: &str,
    body: Vec<u8>,
) -> (u16, &'static str, Vec<u8>) {
    let text = |status: u16, t: &str| (status, "text/plain", t.as_bytes().to_vec());
    if let Some(id) = path.strip_prefix("/upload/v1/") {
        // A form's file part, or the raw bytes.
        let bytes = match ctype.split_once("boundary=") {
            Some(_) if ctype.starts_with("multipart/form-data") => match form::parse(ctype, &body).and_then(form::first_file) {
                Some(f) => f,
                None => return text(400, "bad form"),
            },
            _ => body,
        };
        if bytes.len() > s.opts.max_upload {
            return text(413, "Request Entity Too Large");
        }
        let Some(u) = s.uploads.get_mut(id) else { return text(404, "Not Found") };
        let n = bytes.len();
        u.bytes = Some(bytes);
        return text(200, &format!("OK - {n}"));
    }
    let with_bot_token = auth.as_deref() == Some(format!("Bearer {}", s.opts.bot_token).as_str());
    let (status, answer) = match s.files.get(path) {
        Some(_) if !with_bot_token => (403, None),
        Some(b) => (200, Some(b.clone())),
        None => (404, None),
    };
    s.downloads.push(FileDownload { path: path.to_owned(), with_bot_token, status });
    match answer {
        Some(b) => (200, "application/octet-stream", b),
        None => text(status, "refused"),
    }
}

/// One Web API method: `(status, Retry-After, body)`; `chat.*` calls are logged.
fn api(
    s: &mut State,
    method: &str,
    token: Option<&str>,
    args: &Value,
    ws: SocketAddr,
    consumer: &str,
) -> (u16, Option<u64>, Value) {
    let answer = answer(s, method, token, args, ws, consumer);
    if method.starts_with("chat.") {
        let (status, _, v) = &answer;
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let ts = if method == "chat.postMessage" { text(&v["ts"]) } else { text(&args["ts"]) };
        s.calls.push(Call {
            method: method.to_owned(),
            channel: args["channel"].as_str().unwrap_or_default().to_owned(),
            ts,
            thread_ts: text(&args["thread_ts"]),
            text: text(&args["text"]),
            status: *status,
            error: text(&v["error"]),
        });
    }
    answer
}

/// [`api`]'s answer.
fn answer(
    s: &mut State,
    method: &str,
    token: Option<&str>,
    args: &Value,
    ws: SocketAddr,
    consumer: &str,
) -> (u16, Option<u64>, Value) {
    let refuse = |e: &str| (200, None, json!({"ok": false, "error": e}));
    let app = method == "apps.connections.open";
    let (want, refused) =
        if app { (&s.opts.app_token, &s.app_refused) } else { (&s.opts.bot_token, &s.bot_refused) };
    match token {
        None | Some("") => return refuse("not_authed"),
        Some(t) if t != want => return refuse("invalid_auth"),
        Some(_) => {}
    }
    if let Some(e) = refused {
        return refuse(&e.clone());
    }
    if let Some((n, after)) = s.floods.get(method).copied() {
        if n > 1 {
            s.floods.insert(method.to_owned(), (n - 1, after));
        } else {
            s.floods.remove(method);
        }
        return (429, Some(after), json!({"ok": false, "error": "ratelimited"}));
    }
    if matches!(method, "chat.update" | "chat.delete") {
        // Tier 3, per method (https://api.slack.com/apis/rate-limits).
        let now = Instant::now();
        let (limit, minute) = (s.opts.tier3_per_minute, Duration::from_secs(60));
        let window = s.tier3.entry(method.to_owned()).or_default();
        while window.front().is_some_and(|t| now.duration_since(*t) >= minute) {
            window.pop_front();
        }
        if window.len() >= limit {
            let after = window.front().map_or(minute, |t| minute.saturating_sub(now.duration_since(*t)));
            return (429, Some(after.as_secs().max(1)), json!({"ok": false, "error": "ratelimited"}));
        }
        window.push_back(now);
    }
    let channel = args["channel"].as_str().unwrap_or("").to_owned();
    let known_channel = !channel.is_empty() && (s.opts.channels.is_empty() || s.opts.channels.contains(&channel));
    let ts = args["ts"].as_str().unwrap_or("").to_owned();
    // The bot's own message `ts` in `channel`, not deleted.
    let own = |s: &State| s.posted.iter().position(|p| p.channel == channel && p.ts == ts && !s.deleted.contains(&ts));
    match method {
        "apps.connections.open" => {
            s.seq += 1;
            let ticket = format!("ticket-{:08x}", s.seq);
            s.tickets.insert(ticket.clone(), consumer.to_owned());
            s.stats.opens += 1;
            let base = s.opts.ws_url.clone().unwrap_or_else(|| format!("ws://{ws}"));
            (200, None, json!({"ok": true, "url": format!("{base}/link/?ticket={ticket}&app_id={APP_ID}")}))
        }
        "auth.test" => (
            200,
            None,
            json!({"ok": true, "url": "https://fake.slack.invalid/", "team": "fake", "user": "gatewarden",
                   "team_id": TEAM_ID, "user_id": s.opts.bot_user, "bot_id": BOT_ID, "is_enterprise_install": false}),
        ),
        "chat.postMessage" => {
            let text = args["text"].as_str().unwrap_or("").to_owned();
            if !known_channel {
                return refuse("channel_not_found");
            }
            if text.is_empty() {
                return refuse("no_text");
            }
            s.seq += 1;
            let ts = ts_now(s.seq);
            let thread_ts = args["thread_ts"].as_str().map(str::to_owned);
            s.posted.push(Posted { channel: channel.clone(), text: text.clone(), thread_ts: thread_ts.clone(), ts: ts.clone() });
            let mut echo = json!({"type": "message", "channel": channel, "user": s.opts.bot_user, "bot_id": BOT_ID,
                                  "text": text, "ts": ts, "event_ts": ts});
            if let Some(t) = &thread_ts {
                echo["thread_ts"] = json!(t);
            }
            push_event(s, echo.clone());
            (200, None, json!({"ok": true, "channel": channel, "ts": ts, "message": echo}))
        }
        "chat.update" => {
            let text = args["text"].as_str().unwrap_or("").to_owned();
            if !known_channel {
                return refuse("channel_not_found");
            }
            let Some(i) = own(s) else { return refuse("message_not_found") };
            if text.is_empty() {
                return refuse("no_text");
            }
            let before = s.posted[i].clone();
            let previous = s.edited.insert(ts.clone(), text.clone()).unwrap_or(before.text);
            let message = json!({"type": "message", "user": s.opts.bot_user, "bot_id": BOT_ID, "text": text, "ts": ts});
            let was = json!({"type": "message", "user": s.opts.bot_user, "text": previous, "ts": ts});
            let mut changed = json!({"type": "message", "subtype": "message_changed", "channel": channel,
                                     "hidden": true, "ts": ts_now(s.seq), "message": message,
                                     "previous_message": was});
            if let Some(t) = &before.thread_ts {
                changed["message"]["thread_ts"] = json!(t);
            }
            push_event(s, changed);
            (200, None, json!({"ok": true, "channel": channel, "ts": ts, "text": text, "message": message}))
        }
        "chat.delete" => {
            if !known_channel {
                return refuse("channel_not_found");
            }
            if own(s).is_none() {
                return refuse("message_not_found");
            }
            s.deleted.insert(ts.clone());
            push_event(
                s,
                json!({"type": "message", "subtype": "message_deleted", "channel": channel, "hidden": true,
                       "ts": ts_now(s.seq), "deleted_ts": ts}),
            );
            (200, None, json!({"ok": true, "channel": channel, "ts": ts}))
        }
        "files.getUploadURLExternal" => {
            let filename = args["filename"].as_str().unwrap_or("").to_owned();
            let length = args["length"].as_str().and_then(|l| l.parse::<u64>().ok()).or_else(|| args["length"].as_u64());
            if filename.is_empty() || length.is_none() {
                return refuse("invalid_arguments");
            }
            s.seq += 1;
            let id = format!("F{:010}", s.seq);
            s.uploads.insert(id.clone(), PendingUpload { filename, bytes: None });
            let url = format!("http://{}/upload/v1/{id}", s.http);
            (200, None, json!({"ok": true, "upload_url": url, "file_id": id}))
        }
        "files.completeUploadExternal" => {
            // `files` is a JSON array, as a string in a form.
            let files = match &args["files"] {
                Value::String(t) => serde_json::from_str::<Value>(t).unwrap_or(Value::Null),
                v => v.clone(),
            };
            let Some(list) = files.as_array().filter(|l| !l.is_empty()) else { return refuse("invalid_arguments") };
            let channel = args["channel_id"].as_str().unwrap_or("").to_owned();
            if channel.is_empty() || !(s.opts.channels.is_empty() || s.opts.channels.contains(&channel)) {
                return refuse("channel_not_found");
            }
            let thread_ts = args["thread_ts"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
            let mut done = Vec::new();
            for f in list {
                let id = f["id"].as_str().unwrap_or("");
                let Some(u) = s.uploads.get(id).filter(|u| u.bytes.is_some()) else { return refuse("file_not_found") };
                let title = f["title"].as_str().unwrap_or(&u.filename).to_owned();
                done.push(SharedFile {
                    file_id: id.to_owned(),
                    filename: u.filename.clone(),
                    title,
                    channel: channel.clone(),
                    thread_ts: thread_ts.clone(),
                    bytes: u.bytes.clone().unwrap_or_default(),
                });
            }
            s.seq += 1;
            let ts = ts_now(s.seq);
            let listed: Vec<Value> = done.iter().map(|f| json!({"id": f.file_id, "title": f.title})).collect();
            let mut echo = json!({"type": "message", "subtype": "file_share", "channel": channel, "user": s.opts.bot_user,
                                  "bot_id": BOT_ID, "text": "", "ts": ts, "event_ts": ts, "files": listed});
            if let Some(t) = &thread_ts {
                echo["thread_ts"] = json!(t);
            }
            s.shared_files.extend(done);
            push_event(s, echo);
            (200, None, json!({"ok": true, "files": listed}))
        }
        _ => (200, None, json!({"ok": false, "error": "unknown_method"})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request;

    fn call(fake: &FakeSlack, method: &str, token: &str, body: &Value) -> (u16, Option<String>, Value) {
        let auth = format!("Bearer {token}");
        let r = request(
            fake.http,
            "POST",
            &format!("/api/{method}"),
            &[("Authorization", &auth)],
            Some(body.to_string().as_bytes()),
            Duration::from_secs(5),
        )
        .unwrap();
        let retry = r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("retry-after")).map(|(_, v)| v.clone());
        (r.status, retry, r.json().unwrap())
    }

    type Ws = tungstenite::WebSocket<TcpStream>;

    fn connect(fake: &FakeSlack) -> Ws {
        let (_, _, v) = call(fake, "apps.connections.open", &fake.options().app_token, &json!({}));
        let url = v["url"].as_str().unwrap().to_owned();
        let tcp = TcpStream::connect(fake.ws).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (mut ws, _) = tungstenite::client::client(url.as_str(), tcp).unwrap();
        assert_eq!(next(&mut ws)["type"], "hello");
        ws
    }

    fn next(ws: &mut Ws) -> Value {
        loop {
            if let Message::Text(t) = ws.read().unwrap() {
                return serde_json::from_str(t.as_str()).unwrap();
            }
        }
    }

    #[test]
    fn envelopes_spread_over_connections_and_come_again_until_acked() {
        let opts = Options {
            ack_timeout: Duration::from_millis(300),
            retry_delays: vec![Duration::ZERO, Duration::ZERO],
            ..Options::default()
        };
        let fake = FakeSlack::start(opts).unwrap();
        let (mut a, mut b) = (connect(&fake), connect(&fake));
        let first = fake.user_message("C1", "U1", "one", None);
        let second = fake.user_message("C1", "U1", "two", None);
        let (ea, eb) = (next(&mut a), next(&mut b));
        let mut ids = [ea["payload"]["event_id"].as_str().unwrap(), eb["payload"]["event_id"].as_str().unwrap()];
        ids.sort_unstable();
        assert_eq!(ids, [first.as_str(), second.as_str()], "one envelope on each connection");
        assert_eq!((ea["type"].as_str(), ea["retry_attempt"].as_u64()), (Some("events_api"), Some(0)));
        // An ack on the wrong connection does not count; on the right one it does.
        a.send(Message::text(json!({"envelope_id": eb["envelope_id"]}).to_string())).unwrap();
        b.send(Message::text(json!({"envelope_id": eb["envelope_id"]}).to_string())).unwrap();
        // a's envelope is never acked: it comes again, same event, new envelope, counted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let again = 'found: loop {
            assert!(Instant::now() < deadline, "no redelivery");
            for ws in [&mut a, &mut b] {
                ws.get_ref().set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                if let Ok(Message::Text(t)) = ws.read() {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["retry_attempt"].as_u64() == Some(1) {
                        break 'found v;
                    }
                }
            }
        };
        assert_eq!(again["payload"]["event_id"], ea["payload"]["event_id"]);
        assert_ne!(again["envelope_id"], ea["envelope_id"]);
        assert_eq!(again["retry_reason"], "timeout");
        let st = fake.stats();
        assert_eq!((st.acks, st.misrouted_acks, st.max_open), (1, 1, 2), "{st:?}");
        // The retries run out: lost.
        crate::must_wait_until(Duration::from_secs(10), "the event is lost", || fake.stats().lost == 1);
    }

    #[test]
    fn web_api_tokens_rate_limits_and_disconnects() {
        let fake = FakeSlack::start(Options::default()).unwrap();
        let bot = fake.options().bot_token;
        assert_eq!(call(&fake, "auth.test", "wrong", &json!({})).2["error"], "invalid_auth");
        assert_eq!(call(&fake, "auth.test", &bot, &json!({})).2["user_id"], "UFAKEBOT");
        fake.flood(1, 7);
        let (status, retry, v) = call(&fake, "chat.postMessage", &bot, &json!({"channel": "C1", "text": "x"}));
        assert_eq!((status, retry.as_deref(), v["error"].as_str()), (429, Some("7"), Some("ratelimited")));
        let (_, _, v) = call(&fake, "chat.postMessage", &bot, &json!({"channel": "C1", "text": "x", "thread_ts": "1.0"}));
        assert_eq!(v["ok"], true);
        assert_eq!(fake.posted()[0].thread_ts.as_deref(), Some("1.0"));
        fake.revoke_bot(Some("account_inactive"));
        assert_eq!(call(&fake, "chat.postMessage", &bot, &json!({"channel": "C1", "text": "x"})).2["error"], "account_inactive");
        let mut ws = connect(&fake);
        crate::must_wait_until(Duration::from_secs(5), "the echo delivered", || fake.deliveries().len() == 1);
        // The bot's own post comes back as an event.
        let echo = next(&mut ws);
        let e = &echo["payload"]["event"];
        assert_eq!((e["bot_id"].as_str(), e["user"].as_str(), e["text"].as_str()), (Some(BOT_ID), Some("UFAKEBOT"), Some("x")));
        fake.disconnect("refresh_requested");
        let v = next(&mut ws);
        assert_eq!((v["type"].as_str(), v["reason"].as_str()), (Some("disconnect"), Some("refresh_requested")));
    }
}
