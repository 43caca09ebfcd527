//! A fake Mattermost server on loopback: the v4 WebSocket and the REST calls the Mattermost
//! adapter (crates/platforms/src/mattermost.rs) makes, on one port as a real server serves
//! them. Each modelled behaviour, with the public documentation it follows:
//!
//! - **Authentication** (https://api.mattermost.com/#tag/authentication): REST takes
//!   `Authorization: Bearer <token>` (a bot's token or a personal access token); a missing or
//!   wrong one is HTTP 401 with the API's error body `{"id":
//!   "api.context.session_expired.app_error", "message": …, "status_code": 401}`.
//!   [`FakeMattermost::revoke`] makes the token wrong.
//! - **`GET /api/v4/users/me`** (https://api.mattermost.com/#tag/users/operation/GetUser): the
//!   token's user (`id`, `username`, `is_bot`).
//! - **The WebSocket** (https://api.mattermost.com/#tag/WebSocket): `/api/v4/websocket`; the
//!   client authenticates with `{"seq": 1, "action": "authentication_challenge", "data":
//!   {"token": …}}` (or the upgrade's `Authorization` header) and is answered `{"status": "OK",
//!   "seq_reply": 1}` (a wrong token: `"status": "FAIL"` with an `error`), then the `hello`
//!   event. Events are `{"event", "data", "broadcast", "seq"}`, `seq` counting from 0 per
//!   connection. A new post is the `posted` event, whose `data.post` is the post as a JSON
//!   string, with `channel_type` (`O`, `P`, `D`, `G`), `channel_name`, `sender_name`, `team_id`
//!   and `mentions` (a JSON string of user ids) when the post mentions someone. The action
//!   `user_typing` (`channel_id`, `parent_id`) is answered `OK` and recorded
//!   ([`FakeMattermost::typing`]). The server does not keep events for a client that is not
//!   connected: a post made meanwhile reaches the adapter only through the REST read-back.
//!   [`FakeMattermost::skip_events`] drops events on the open connections (a `seq` gap).
//! - **`GET /api/v4/users/{id}/channels`**
//!   (https://api.mattermost.com/#tag/channels/operation/GetChannelsForUser): the channels the
//!   user is a member of on all teams, each with `id`, `type`, `name`, `team_id` and
//!   `last_post_at`.
//! - **`GET /api/v4/channels/{id}/posts?since=…`**
//!   (https://api.mattermost.com/#tag/posts/operation/GetPostsForChannel): a `PostList`
//!   (`order`, newest first, and `posts` by id) of the posts modified after `since` (ms),
//!   ordered by create time and at most [`Options::since_limit`] (the server: 1,000); deleted
//!   posts come with `delete_at` set and an empty message. Without `read_channel` permission
//!   ([`FakeMattermost::forbid`]) it is 403.
//! - **`POST /api/v4/posts`** (https://api.mattermost.com/#tag/posts/operation/CreatePost):
//!   `channel_id`, `message`, `root_id`; 201 with the post, and a `posted` event to every
//!   connection (the author's own included). An unknown channel is 403, an unknown `root_id`
//!   or an empty message 400. [`FakeMattermost::flood`] answers the next posts 429 with
//!   `Retry-After` and the `X-Ratelimit-*` headers (https://api.mattermost.com/#section/Rate-limiting).
//! - **Files** (https://api.mattermost.com/#tag/files): [`FakeMattermost::user_post_files`]
//!   posts with `file_ids` and `metadata.files[]` (FileInfo: `id`, `name`, `extension`,
//!   `size`, `mime_type`); `GET /api/v4/files/{id}` serves a file's bytes (counted,
//!   [`FakeMattermost::file_downloads`]); `POST /api/v4/files` takes `multipart/form-data`
//!   with `channel_id` and `files` and answers 201 `{"file_infos": [...], "client_ids": []}`
//!   (recorded, [`FakeMattermost::uploads`]); a file past [`Options::max_upload`] is 413
//!   (`api.file.upload_file.too_large.app_error`, the server's `MaxFileSize`). A post may have
//!   an empty `message` when it has `file_ids`; an unknown file id is 400.
//! - **`PUT /api/v4/posts/{id}/patch`** (PatchPost): a new `message`, `edit_at` and
//!   `update_at`; a post that is not there (or deleted) is 404, another user's 403.
//! - **`DELETE /api/v4/posts/{id}`** (DeletePost): `{"status": "OK"}`, the post's `delete_at`
//!   set; a post not there (or deleted already) is 404.
//!
//! [`FakeMattermost::kill`] drops every connection and stops listening; [`FakeMattermost::revive`]
//! listens again on the same port with the same posts. Plain std threads, like the other fakes.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tungstenite::Message;

use gatewarden_fakewire::{form, http1};

/// The fake's team.
pub const TEAM_ID: &str = "teamfaketeamfaketeamfake01";

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The token REST and the WebSocket accept.
    pub token: String,
    /// The bot's user id and username.
    pub bot_user: String,
    pub bot_username: String,
    /// The most posts one `?since=` answer carries (the server: 1,000).
    pub since_limit: usize,
    /// The largest file `POST /files` takes (the server's `MaxFileSize`).
    pub max_upload: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: "mmfaketoken".into(),
            bot_user: "botuserbotuserbotuser00001".into(),
            bot_username: "gwbot".into(),
            since_limit: 1000,
            max_upload: 1 << 20,
        }
    }
}

/// A post as the fake keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    pub id: String,
    pub channel: String,
    pub user: String,
    pub root_id: String,
    pub message: String,
    pub create_at: i64,
    pub update_at: i64,
    pub edit_at: i64,
    pub delete_at: i64,
    /// The files it carries.
    pub file_ids: Vec<String>,
    /// Their FileInfos, as `metadata.files` shows them.
    pub files: Vec<Value>,
}

impl Post {
    fn json(&self) -> Value {
        let metadata = if self.files.is_empty() { json!({}) } else { json!({"files": self.files}) };
        json!({
            "id": self.id, "create_at": self.create_at, "update_at": self.update_at, "edit_at": self.edit_at,
            "delete_at": self.delete_at, "user_id": self.user, "channel_id": self.channel, "root_id": self.root_id,
            "original_id": "", "message": if self.delete_at > 0 { "" } else { self.message.as_str() },
            "type": "", "props": {}, "hashtags": "", "pending_post_id": "", "file_ids": self.file_ids,
            "metadata": metadata,
        })
    }
}

/// A file the server keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    pub id: String,
    pub channel: String,
    pub name: String,
    pub mime_type: String,
    pub bytes: Vec<u8>,
}

impl StoredFile {
    fn info(&self) -> Value {
        let ext = self.name.rsplit_once('.').map_or("", |(_, e)| e);
        json!({"id": self.id, "user_id": "", "post_id": "", "create_at": 1, "update_at": 1, "delete_at": 0,
               "name": self.name, "extension": ext, "size": self.bytes.len(), "mime_type": self.mime_type,
               "has_preview_image": false, "channel_id": self.channel})
    }
}

/// One REST call, as the fake answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// The post created, patched or deleted.
    pub post: Option<String>,
    pub root_id: Option<String>,
    pub message: Option<String>,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// WebSocket connections that authenticated, and those open now.
    pub connections: u64,
    pub open_now: usize,
    /// Authentication challenges refused.
    pub auth_failures: u64,
    /// `posted` events sent, and those dropped by [`FakeMattermost::skip_events`].
    pub events: u64,
    pub skipped: u64,
    /// `GET …/posts?since=` calls, and channel lists.
    pub since_calls: u64,
    pub channel_lists: u64,
}

struct Conn {
    out: VecDeque<String>,
    seq: i64,
    skip: u32,
    stream: TcpStream,
}

struct State {
    opts: Options,
    revoked: bool,
    /// Channel id -> type (`O`, `P`, `D`, `G`).
    channels: HashMap<String, String>,
    /// Channels whose posts the bot may not read (403).
    forbidden: Vec<String>,
    posts: Vec<Post>,
    conns: HashMap<u64, Conn>,
    calls: Vec<Call>,
    typing: Vec<(String, String)>,
    /// Posts answered 429 next, and the Retry-After.
    flood: (u32, u64),
    stats: Stats,
    seq: u64,
    last_ms: i64,
    files: HashMap<String, StoredFile>,
    /// Files the bot uploaded, in order.
    uploads: Vec<StoredFile>,
    /// Files served, by id.
    file_downloads: Vec<String>,
}

impl State {
    /// A strictly increasing time in ms (two posts never share a `create_at`).
    fn now_ms(&mut self) -> i64 {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        self.last_ms = now.max(self.last_ms + 1);
        self.last_ms
    }

    fn new_id(&mut self, prefix: char) -> String {
        self.seq += 1;
        format!("{prefix}{:025}", self.seq)
    }

    /// A `posted` event for `post` to every authenticated connection.
    fn broadcast(&mut self, post: &Post, sender: &str) {
        let kind = self.channels.get(&post.channel).cloned().unwrap_or_else(|| "O".into());
        let mut data = json!({
            "channel_display_name": post.channel, "channel_name": post.channel, "channel_type": kind,
            "post": post.json().to_string(), "sender_name": format!("@{sender}"), "team_id": TEAM_ID,
            "set_online": true,
        });
        let bot = self.opts.bot_user.clone();
        let named = post.message.contains(&format!("@{}", self.opts.bot_username));
        if (kind == "D" && post.user != bot) || named {
            data["mentions"] = json!(json!([bot]).to_string());
        }
        for c in self.conns.values_mut() {
            let seq = c.seq;
            c.seq += 1;
            if c.skip > 0 {
                c.skip -= 1;
                self.stats.skipped += 1;
                continue;
            }
            self.stats.events += 1;
            let ev = json!({"event": "posted", "data": data, "broadcast": {"omit_users": null, "user_id": "",
                            "channel_id": post.channel, "team_id": ""}, "seq": seq});
            c.out.push_back(ev.to_string());
        }
    }

    fn add_post(&mut self, channel: &str, user: &str, message: &str, root: &str) -> Post {
        self.add_post_files(channel, user, message, root, Vec::new())
    }

    fn add_post_files(&mut self, channel: &str, user: &str, message: &str, root: &str, file_ids: Vec<String>) -> Post {
        let files = file_ids.iter().filter_map(|id| self.files.get(id)).map(StoredFile::info).collect();
        let at = self.now_ms();
        let id = self.new_id('p');
        let post = Post {
            id,
            channel: channel.to_owned(),
            user: user.to_owned(),
            root_id: root.to_owned(),
            message: message.to_owned(),
            create_at: at,
            update_at: at,
            edit_at: 0,
            delete_at: 0,
            file_ids,
            files,
        };
        self.posts.push(post.clone());
        let sender = if user == self.opts.bot_user { self.opts.bot_username.clone() } else { user.to_owned() };
        self.broadcast(&post, &sender);
        post
    }
}

struct Shared {
    state: Mutex<State>,
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

/// The fake Mattermost (module notes).
pub struct FakeMattermost {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

const TICK: Duration = Duration::from_millis(10);

impl FakeMattermost {
    pub fn start(opts: Options) -> io::Result<FakeMattermost> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                opts,
                revoked: false,
                channels: HashMap::new(),
                forbidden: Vec::new(),
                posts: Vec::new(),
                conns: HashMap::new(),
                calls: Vec::new(),
                typing: Vec::new(),
                flood: (0, 0),
                stats: Stats::default(),
                seq: 0,
                last_ms: 0,
                files: HashMap::new(),
                uploads: Vec::new(),
                file_downloads: Vec::new(),
            }),
            life: AtomicU64::new(0),
            dropped: AtomicBool::new(false),
        });
        let fake = FakeMattermost { shared, addr };
        fake.serve(listener)?;
        Ok(fake)
    }

    fn serve(&self, listener: TcpListener) -> io::Result<()> {
        let life = self.shared.life.load(Ordering::SeqCst);
        listener.set_nonblocking(true)?;
        let s = Arc::clone(&self.shared);
        std::thread::Builder::new().name("mmfake-accept".into()).spawn(move || {
            while s.alive(life) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let s = Arc::clone(&s);
                        let _ = std::thread::Builder::new().name("mmfake-conn".into()).spawn(move || {
                            if is_websocket(&conn) { serve_ws(&s, conn, life) } else { serve_http(&s, conn) }
                        });
                    }
                    Err(_) => std::thread::sleep(TICK),
                }
            }
        })?;
        Ok(())
    }

    /// `http://127.0.0.1:<port>`, for `server`.
    pub fn server(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn options(&self) -> Options {
        self.shared.lock().opts.clone()
    }

    /// A channel of type `kind` (`O`, `P`, `D`, `G`) the bot is a member of. A channel a post
    /// names without one is made public (`O`), or direct (`D`) when its id starts with `d`.
    pub fn channel(&self, id: &str, kind: &str) {
        self.shared.lock().channels.insert(id.to_owned(), kind.to_owned());
    }

    /// A user's post in `channel` (`root`: a reply in that thread). Returns the post id.
    pub fn user_post(&self, channel: &str, user: &str, text: &str, root: Option<&str>) -> String {
        let mut s = self.shared.lock();
        let kind = if channel.starts_with('d') { "D" } else { "O" };
        s.channels.entry(channel.to_owned()).or_insert_with(|| kind.to_owned());
        s.add_post(channel, user, text, root.unwrap_or("")).id
    }

    /// A user's post in `channel` carrying `files` (name, MIME type, bytes). Returns the post id.
    pub fn user_post_files(&self, channel: &str, user: &str, text: &str, files: &[(&str, &str, &[u8])]) -> String {
        let mut s = self.shared.lock();
        let kind = if channel.starts_with('d') { "D" } else { "O" };
        s.channels.entry(channel.to_owned()).or_insert_with(|| kind.to_owned());
        let mut ids = Vec::new();
        for (name, mime, bytes) in files {
            let id = s.new_id('f');
            let f = StoredFile {
                id: id.clone(),
                channel: channel.to_owned(),
                name: (*name).to_owned(),
                mime_type: (*mime).to_owned(),
                bytes: bytes.to_vec(),
            };
            s.files.insert(id.clone(), f);
            ids.push(id);
        }
        s.add_post_files(channel, user, text, "", ids).id
    }

    /// The files the bot uploaded, in order.
    pub fn uploads(&self) -> Vec<StoredFile> {
        self.shared.lock().uploads.clone()
    }

    /// The files served by `GET /files/{id}`, by id.
    pub fn file_downloads(&self) -> Vec<String> {
        self.shared.lock().file_downloads.clone()
    }

    /// Every post, the bot's included, in creation order.
    pub fn posts(&self) -> Vec<Post> {
        self.shared.lock().posts.clone()
    }

    /// The bot's posts, as made (before edits and deletions).
    pub fn bot_posts(&self) -> Vec<Post> {
        let s = self.shared.lock();
        let bot = s.opts.bot_user.clone();
        s.calls
            .iter()
            .filter(|c| c.method == "POST" && c.status == 201)
            .filter_map(|c| s.posts.iter().find(|p| Some(&p.id) == c.post.as_ref() && p.user == bot))
            .map(|p| Post { message: c_message(&s.calls, &p.id).unwrap_or_else(|| p.message.clone()), ..p.clone() })
            .collect()
    }

    /// The bot's posts as a user sees them now: not deleted, with their last edit.
    pub fn visible(&self) -> Vec<Post> {
        let s = self.shared.lock();
        s.posts.iter().filter(|p| p.user == s.opts.bot_user && p.delete_at == 0).cloned().collect()
    }

    /// Waits until the bot made at least `n` posts, up to `timeout`.
    pub fn wait_bot_posts(&self, n: usize, timeout: Duration) -> Result<Vec<Post>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.bot_posts();
            if p.len() >= n {
                return Ok(p);
            }
            if Instant::now() >= deadline {
                return Err(format!("{} of {n} posts after {timeout:?}", p.len()));
            }
            std::thread::sleep(TICK);
        }
    }

    /// Every REST call that creates, patches or deletes a post, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Every `user_typing` action: `(channel_id, parent_id)`.
    pub fn typing(&self) -> Vec<(String, String)> {
        self.shared.lock().typing.clone()
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared.lock();
        let mut st = s.stats.clone();
        st.open_now = s.conns.len();
        st
    }

    /// The token is refused from now on (`false`: accepted again).
    pub fn revoke(&self, revoked: bool) {
        self.shared.lock().revoked = revoked;
    }

    /// The next `posts` posts are answered 429 with `Retry-After: retry_after`.
    pub fn flood(&self, posts: u32, retry_after: u64) {
        self.shared.lock().flood = (posts, retry_after);
    }

    /// Reading `channel`'s posts is answered 403 from now on (a channel whose read permission
    /// was taken away while the bot stays a member).
    pub fn forbid(&self, channel: &str) {
        self.shared.lock().forbidden.push(channel.to_owned());
    }

    /// The next `n` events of every open connection are dropped (their `seq` still counts).
    pub fn skip_events(&self, n: u32) {
        for c in self.shared.lock().conns.values_mut() {
            c.skip = n;
        }
    }

    /// Drops every connection and stops listening.
    pub fn kill(&self) {
        self.shared.life.fetch_add(1, Ordering::SeqCst);
        for (_, c) in self.shared.lock().conns.drain() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Listens again on the same port (retrying briefly while it is busy).
    pub fn revive(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline && e.kind() == io::ErrorKind::AddrInUse => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        self.serve(listener)
    }
}

/// The message a post was created with (its `POST` call).
fn c_message(calls: &[Call], id: &str) -> Option<String> {
    calls.iter().find(|c| c.method == "POST" && c.post.as_deref() == Some(id)).and_then(|c| c.message.clone())
}

impl Drop for FakeMattermost {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
        self.kill();
    }
}

/// Whether the request on `conn` is the WebSocket upgrade (its request line, peeked).
fn is_websocket(conn: &TcpStream) -> bool {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match conn.peek(&mut buf) {
            Ok(n) if n >= 30 || buf[..n].contains(&b'\n') || n == 0 => {
                return buf[..n].starts_with(b"GET /api/v4/websocket");
            }
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => return false,
        }
    }
}

fn serve_ws(shared: &Shared, stream: TcpStream, life: u64) {
    let mut header_token: Option<String> = None;
    // The error type is tungstenite's (its handshake callback), not ours to shrink.
    #[allow(clippy::result_large_err)]
    let check = |req: &tungstenite::handshake::server::Request,
                 resp: tungstenite::handshake::server::Response|
     -> Result<tungstenite::handshake::server::Response, tungstenite::handshake::server::ErrorResponse> {
        header_token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        Ok(resp)
    };
    let Ok(sock) = stream.try_clone() else { return };
    let Ok(mut ws) = tungstenite::accept_hdr(stream, check) else { return };
    let _ = sock.set_read_timeout(Some(TICK));
    let mut cid: Option<u64> = None;
    let hello = |s: &mut State, id: u64| {
        if let Some(c) = s.conns.get_mut(&id) {
            let seq = c.seq;
            c.seq += 1;
            c.out.push_back(
                json!({"event": "hello", "data": {"server_version": "10.5.0.fake", "connection_id": format!("conn{id}")},
                       "broadcast": {"omit_users": null, "user_id": s.opts.bot_user, "channel_id": "", "team_id": ""},
                       "seq": seq})
                .to_string(),
            );
        }
    };
    let register = |s: &mut State| -> Option<u64> {
        s.stats.connections += 1;
        let id = s.stats.connections;
        let handle = sock.try_clone().ok()?;
        s.conns.insert(id, Conn { out: VecDeque::new(), seq: 0, skip: 0, stream: handle });
        Some(id)
    };
    if let Some(t) = &header_token {
        let mut s = shared.lock();
        if *t == s.opts.token && !s.revoked {
            cid = register(&mut s);
            if let Some(id) = cid {
                hello(&mut s, id);
            }
        }
    }
    let mut pending: VecDeque<String> = VecDeque::new();
    loop {
        if !shared.alive(life) {
            break;
        }
        let out: Vec<String> = {
            let mut s = shared.lock();
            let mut out: Vec<String> = pending.drain(..).collect();
            if let Some(c) = cid.and_then(|id| s.conns.get_mut(&id)) {
                out.extend(c.out.drain(..));
            } else if cid.is_some() {
                break;
            }
            out
        };
        if out.into_iter().any(|m| ws.send(Message::text(m)).is_err()) {
            break;
        }
        match ws.read() {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                let seq = v["seq"].as_i64().unwrap_or(0);
                let mut s = shared.lock();
                match v["action"].as_str() {
                    Some("authentication_challenge") => {
                        let ok = v["data"]["token"].as_str() == Some(s.opts.token.as_str()) && !s.revoked;
                        if ok && cid.is_none() {
                            pending.push_back(json!({"status": "OK", "seq_reply": seq}).to_string());
                            cid = register(&mut s);
                            if let Some(id) = cid {
                                hello(&mut s, id);
                            }
                        } else if ok {
                            pending.push_back(json!({"status": "OK", "seq_reply": seq}).to_string());
                        } else {
                            s.stats.auth_failures += 1;
                            pending.push_back(
                                json!({"status": "FAIL", "seq_reply": seq, "error": {
                                    "id": "api.web_socket_router.not_authenticated.app_error",
                                    "message": "Invalid or expired session, please login again."}})
                                .to_string(),
                            );
                        }
                    }
                    Some("user_typing") if cid.is_some() => {
                        let d = &v["data"];
                        let text = |k: &str| d[k].as_str().unwrap_or("").to_owned();
                        s.typing.push((text("channel_id"), text("parent_id")));
                        pending.push_back(json!({"status": "OK", "seq_reply": seq}).to_string());
                    }
                    _ => {
                        pending.push_back(
                            json!({"status": "FAIL", "seq_reply": seq, "error": {
                                "id": "api.web_socket_router.bad_action.app_error", "message": "Invalid action."}})
                            .to_string(),
                        );
                    }
                }
            }
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    if let Some(id) = cid {
        shared.lock().conns.remove(&id);
    }
    let _ = sock.shutdown(std::net::Shutdown::Both);
}

/// One REST request (`Connection: close`).
fn serve_http(shared: &Shared, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut w) = conn.try_clone() else { return };
    let Ok(req) = http1::read_request(&mut BufReader::new(conn), 8 << 20) else { return };
    let (method, path) = (req.method.as_str(), req.target.as_str());
    let token = req.bearer();
    if method == "GET"
        && let Some(id) = path.strip_prefix("/api/v4/files/")
    {
        let mut s = shared.lock();
        let ok = token == Some(s.opts.token.as_str()) && !s.revoked;
        let Some(f) = s.files.get(id).cloned().filter(|_| ok) else {
            drop(s);
            let _ = http1::write_response(&mut w, 404, &[("Connection", "close")], b"");
            return;
        };
        s.file_downloads.push(id.to_owned());
        drop(s);
        let _ = http1::write_response(&mut w, 200, &[("Content-Type", &f.mime_type), ("Connection", "close")], &f.bytes);
        return;
    }
    let args: Value = if method == "POST" && path == "/api/v4/files" {
        // The form as JSON for api(): its fields, and each file part under "\u0000files".
        let form = form::parse(req.header("content-type").unwrap_or_default(), &req.body).unwrap_or_default();
        let mut v = json!({"\u{0}files": []});
        for p in form {
            match p.filename {
                Some(f) => {
                    if let Some(a) = v["\u{0}files"].as_array_mut() {
                        a.push(json!({"name": f, "type": p.content_type, "bytes": p.bytes}));
                    }
                }
                None => v[p.name.as_str()] = json!(String::from_utf8_lossy(&p.bytes)),
            }
        }
        v
    } else {
        serde_json::from_slice(&req.body).unwrap_or(Value::Null)
    };
    let (status, extra, answer) = api(&mut shared.lock(), method, path, token, &args);
    let mut headers = vec![("Content-Type", "application/json"), ("Connection", "close")];
    headers.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
    let _ = http1::write_response(&mut w, status, &headers, answer.to_string().as_bytes());
}

/// Extra response headers of a REST answer (a rate limit's).
type Extra = Vec<(&'static str, String)>;

/// The API's error body.
fn app_error(status: u16, id: &str, message: &str) -> (u16, Extra, Value) {
    (status, Vec::new(), json!({"id": id, "message": message, "detailed_error": "", "request_id": "fake", "status_code": status}))
}

/// One REST call: `(status, extra headers, body)`; post changes are logged.
fn api(s: &mut State, method: &str, path: &str, token: Option<&str>, args: &Value) -> (u16, Extra, Value) {
    let answer = answer(s, method, path, token, args);
    if matches!(method, "POST" | "PUT" | "DELETE") {
        let (status, _, v) = &answer;
        let id = if method == "POST" { v["id"].as_str().map(str::to_owned) } else { path.split('/').nth(4).map(str::to_owned) };
        s.calls.push(Call {
            method: method.to_owned(),
            path: path.to_owned(),
            status: *status,
            post: id.filter(|_| *status < 300),
            root_id: args["root_id"].as_str().map(str::to_owned),
            message: args["message"].as_str().map(str::to_owned),
        });
    }
    answer
}

fn answer(s: &mut State, method: &str, path: &str, token: Option<&str>, args: &Value) -> (u16, Extra, Value) {
    if token != Some(s.opts.token.as_str()) || s.revoked {
        return app_error(401, "api.context.session_expired.app_error", "Invalid or expired session, please login again.");
    }
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    let seg: Vec<&str> = route.trim_start_matches("/api/v4/").split('/').collect();
    let bot = s.opts.bot_user.clone();
    match (method, seg.as_slice()) {
        ("GET", ["users", "me"]) => (
            200,
            Vec::new(),
            json!({"id": bot, "username": s.opts.bot_username, "is_bot": true, "roles": "system_user",
                   "create_at": 1, "update_at": 1, "delete_at": 0, "locale": "en"}),
        ),
        ("GET", ["users", who, "channels"]) => {
            if *who != bot && *who != "me" {
                return app_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.");
            }
            s.stats.channel_lists += 1;
            let mut list: Vec<Value> = s
                .channels
                .iter()
                .map(|(id, kind)| {
                    let last = s.posts.iter().filter(|p| &p.channel == id).map(|p| p.create_at).max().unwrap_or(0);
                    json!({"id": id, "type": kind, "name": id, "display_name": id, "team_id":
                           if kind == "D" || kind == "G" { "" } else { TEAM_ID }, "last_post_at": last,
                           "create_at": 1, "update_at": 1, "delete_at": 0})
                })
                .collect();
            list.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            (200, Vec::new(), Value::Array(list))
        }
        ("GET", ["channels", channel, "posts"]) => {
            if !s.channels.contains_key(*channel) {
                return app_error(404, "app.channel.get.existing.app_error", "Unable to find the existing channel.");
            }
            s.stats.since_calls += 1;
            if s.forbidden.iter().any(|c| c == channel) {
                return app_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.");
            }
            let since = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("since="))
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0);
            let mut posts: Vec<&Post> =
                s.posts.iter().filter(|p| p.channel == *channel && p.update_at > since).collect();
            posts.sort_by_key(|p| p.create_at);
            posts.truncate(s.opts.since_limit);
            let order: Vec<&str> = posts.iter().rev().map(|p| p.id.as_str()).collect();
            let map: serde_json::Map<String, Value> = posts.iter().map(|p| (p.id.clone(), p.json())).collect();
            (200, Vec::new(), json!({"order": order, "posts": map, "next_post_id": "", "prev_post_id": ""}))
        }
        ("POST", ["posts"]) => {
            if s.flood.0 > 0 {
                s.flood.0 -= 1;
                let after = s.flood.1;
                let headers = vec![
                    ("Retry-After", after.to_string()),
                    ("X-Ratelimit-Limit", "10".to_owned()),
                    ("X-Ratelimit-Remaining", "0".to_owned()),
                    ("X-Ratelimit-Reset", after.to_string()),
                ];
                return (429, headers, json!("limit exceeded"));
            }
            let channel = args["channel_id"].as_str().unwrap_or("").to_owned();
            let message = args["message"].as_str().unwrap_or("").to_owned();
            let root = args["root_id"].as_str().unwrap_or("").to_owned();
            let file_ids: Vec<String> =
                args["file_ids"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
            if !s.channels.contains_key(&channel) {
                return app_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.");
            }
            if message.is_empty() && file_ids.is_empty() {
                return app_error(400, "model.post.is_valid.msg.app_error", "Invalid message.");
            }
            if file_ids.iter().any(|f| !s.files.contains_key(f)) {
                return app_error(400, "api.post.create_post.file_ids.app_error", "Invalid file_ids.");
            }
            if !root.is_empty() && !s.posts.iter().any(|p| p.id == root && p.channel == channel) {
                return app_error(400, "api.post.create_post.root_id.app_error", "Invalid RootId parameter.");
            }
            let post = s.add_post_files(&channel, &bot, &message, &root, file_ids);
            (201, Vec::new(), post.json())
        }
        ("POST", ["files"]) => {
            let channel = args["channel_id"].as_str().unwrap_or("").to_owned();
            if !s.channels.contains_key(&channel) {
                return app_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.");
            }
            let parts = args["\u{0}files"].as_array().cloned().unwrap_or_default();
            if parts.is_empty() {
                return app_error(400, "api.file.upload_file.incorrect_number_of_files.app_error", "No files.");
            }
            let mut infos = Vec::new();
            for p in parts {
                let bytes: Vec<u8> =
                    p["bytes"].as_array().into_iter().flatten().filter_map(|b| b.as_u64().map(|b| b as u8)).collect();
                if bytes.len() > s.opts.max_upload {
                    return app_error(413, "api.file.upload_file.too_large.app_error", "Unable to upload file. File is too large.");
                }
                let id = s.new_id('f');
                let f = StoredFile {
                    id: id.clone(),
                    channel: channel.clone(),
                    name: p["name"].as_str().unwrap_or("").to_owned(),
                    mime_type: p["type"].as_str().unwrap_or("").to_owned(),
                    bytes,
                };
                infos.push(f.info());
                s.files.insert(id, f.clone());
                s.uploads.push(f);
            }
            (201, Vec::new(), json!({"file_infos": infos, "client_ids": []}))
        }
        ("PUT", ["posts", id, "patch"]) => {
            let at = s.now_ms();
            let Some(p) = s.posts.iter_mut().find(|p| p.id == *id && p.delete_at == 0) else {
                return app_error(404, "app.post.get.app_error", "Unable to get the post.");
            };
            if p.user != bot {
                return app_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.");
            }
            if let Some(m) = args["message"].as_str() {
                p.message = m.to_owned();
            }
            p.edit_at = at;
            p.update_at = at;
            (200, Vec::new(), p.json())
        }
        ("DELETE", ["posts", id]) => {
            let at = s.now_ms();
            let Some(p) = s.posts.iter_mut().find(|p| p.id == *id && p.delete_at == 0) else {
                return app_error(404, "app.post.get.app_error", "Unable to get the post.");
            };
            p.delete_at = at;
            p.update_at = at;
            (200, Vec::new(), json!({"status": "OK"}))
        }
        _ => app_error(404, "api.context.404.app_error", "Sorry, we could not find the page."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request;

    fn call(fake: &FakeMattermost, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
        let auth = format!("Bearer {token}");
        let body = body.map(Value::to_string);
        let r = request(
            fake.addr,
            method,
            path,
            &[("Authorization", &auth), ("Content-Type", "application/json")],
            body.as_deref().map(str::as_bytes),
            Duration::from_secs(5),
        )
        .unwrap();
        (r.status, r.json().unwrap_or(Value::Null))
    }

    type Ws = tungstenite::WebSocket<TcpStream>;

    fn next(ws: &mut Ws) -> Value {
        loop {
            if let Message::Text(t) = ws.read().unwrap() {
                return serde_json::from_str(t.as_str()).unwrap();
            }
        }
    }

    fn connect(fake: &FakeMattermost, token: &str) -> (Ws, Value) {
        let tcp = TcpStream::connect(fake.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let url = format!("ws://{}/api/v4/websocket", fake.addr);
        let (mut ws, _) = tungstenite::client::client(url.as_str(), tcp).unwrap();
        let challenge = json!({"seq": 1, "action": "authentication_challenge", "data": {"token": token}});
        ws.send(Message::text(challenge.to_string())).unwrap();
        let reply = next(&mut ws);
        (ws, reply)
    }

    #[test]
    fn the_websocket_authenticates_says_hello_and_carries_posted_events() {
        let fake = FakeMattermost::start(Options::default()).unwrap();
        let (_bad, reply) = connect(&fake, "wrong");
        assert_eq!((reply["status"].as_str(), reply["seq_reply"].as_i64()), (Some("FAIL"), Some(1)));
        let (mut ws, reply) = connect(&fake, &fake.options().token);
        assert_eq!((reply["status"].as_str(), reply["seq_reply"].as_i64()), (Some("OK"), Some(1)));
        let hello = next(&mut ws);
        assert_eq!((hello["event"].as_str(), hello["seq"].as_i64()), (Some("hello"), Some(0)));
        fake.channel("dm1", "D");
        let id = fake.user_post("dm1", "u1", "hi", None);
        let ev = next(&mut ws);
        assert_eq!((ev["event"].as_str(), ev["seq"].as_i64()), (Some("posted"), Some(1)));
        let post: Value = serde_json::from_str(ev["data"]["post"].as_str().unwrap()).unwrap();
        assert_eq!((post["id"].as_str(), post["message"].as_str()), (Some(id.as_str()), Some("hi")));
        assert_eq!(ev["data"]["channel_type"], "D");
        assert!(ev["data"]["mentions"].as_str().unwrap().contains(&fake.options().bot_user));
        fake.skip_events(1);
        fake.user_post("dm1", "u1", "dropped", None);
        fake.user_post("dm1", "u1", "after", None);
        assert_eq!(next(&mut ws)["seq"].as_i64(), Some(3), "a seq gap");
        ws.send(Message::text(json!({"seq": 2, "action": "user_typing", "data": {"channel_id": "dm1", "parent_id": ""}}).to_string()))
            .unwrap();
        assert_eq!(next(&mut ws)["seq_reply"].as_i64(), Some(2));
        assert_eq!(fake.typing(), vec![("dm1".to_owned(), String::new())]);
    }

    /// `POST /files` past `max_upload` is 413; a post naming an unknown file id is 400; an
    /// upload then a post with its id carries the file.
    #[test]
    fn mattermost_files_upload_and_refusals() {
        let fake = FakeMattermost::start(Options { max_upload: 4, ..Options::default() }).unwrap();
        fake.channel("c1", "O");
        let tok = fake.options().token;
        let mut s = fake.shared.lock();
        let form = |bytes: &[u8]| json!({"channel_id": "c1", "\u{0}files": [{"name": "a.txt", "type": "text/plain", "bytes": bytes}]});
        assert_eq!(api(&mut s, "POST", "/api/v4/files", Some(&tok), &form(b"12345")).0, 413);
        let (st, _, v) = api(&mut s, "POST", "/api/v4/files", Some(&tok), &form(b"1234"));
        assert_eq!(st, 201);
        let id = v["file_infos"][0]["id"].as_str().unwrap().to_owned();
        let post = |ids: Value| json!({"channel_id": "c1", "message": "", "file_ids": ids});
        assert_eq!(api(&mut s, "POST", "/api/v4/posts", Some(&tok), &post(json!(["nope"]))).0, 400);
        let (st, _, p) = api(&mut s, "POST", "/api/v4/posts", Some(&tok), &post(json!([id])));
        assert_eq!((st, p["metadata"]["files"][0]["size"].as_u64()), (201, Some(4)));
        assert_eq!(api(&mut s, "POST", "/api/v4/posts", Some(&tok), &post(json!([]))).0, 400, "no message, no file");
    }

    #[test]
    fn rest_posts_patches_deletes_lists_and_limits() {
        let opts = Options { since_limit: 2, ..Options::default() };
        let fake = FakeMattermost::start(opts).unwrap();
        let tok = fake.options().token;
        assert_eq!(call(&fake, "GET", "/api/v4/users/me", "wrong", None).0, 401);
        let (st, me) = call(&fake, "GET", "/api/v4/users/me", &tok, None);
        assert_eq!((st, me["username"].as_str()), (200, Some("gwbot")));
        let first = fake.user_post("c1", "u1", "one", None);
        fake.user_post("c1", "u1", "two", None);
        fake.user_post("c1", "u1", "three", None);
        let (_, page) = call(&fake, "GET", "/api/v4/channels/c1/posts?since=0", &tok, None);
        assert_eq!(page["order"].as_array().map(Vec::len), Some(2), "limited: {page}");
        assert!(page["posts"][&first].is_object());
        let (_, list) = call(&fake, "GET", &format!("/api/v4/users/{}/channels", me["id"].as_str().unwrap()), &tok, None);
        assert_eq!(list[0]["id"], "c1");
        assert!(list[0]["last_post_at"].as_i64() > Some(0));

        let (st, p) = call(&fake, "POST", "/api/v4/posts", &tok, Some(&json!({"channel_id": "c1", "message": "re", "root_id": first})));
        assert_eq!((st, p["root_id"].as_str()), (201, Some(first.as_str())));
        let id = p["id"].as_str().unwrap().to_owned();
        assert_eq!(call(&fake, "POST", "/api/v4/posts", &tok, Some(&json!({"channel_id": "nope", "message": "x"}))).0, 403);
        assert_eq!(call(&fake, "POST", "/api/v4/posts", &tok, Some(&json!({"channel_id": "c1", "message": "x", "root_id": "zz"}))).0, 400);
        assert_eq!(call(&fake, "PUT", &format!("/api/v4/posts/{id}/patch"), &tok, Some(&json!({"message": "re2"}))).0, 200);
        assert_eq!(call(&fake, "PUT", &format!("/api/v4/posts/{first}/patch"), &tok, Some(&json!({"message": "x"}))).0, 403);
        assert_eq!(fake.visible()[0].message, "re2");
        assert_eq!(fake.bot_posts()[0].message, "re", "as made");
        assert_eq!(call(&fake, "DELETE", &format!("/api/v4/posts/{id}"), &tok, None).0, 200);
        assert_eq!(call(&fake, "DELETE", &format!("/api/v4/posts/{id}"), &tok, None).0, 404);
        assert!(fake.visible().is_empty());
        fake.flood(1, 3);
        let r = request(
            fake.addr,
            "POST",
            "/api/v4/posts",
            &[("Authorization", &format!("Bearer {tok}"))],
            Some(json!({"channel_id": "c1", "message": "x"}).to_string().as_bytes()),
            Duration::from_secs(5),
        )
        .unwrap();
        let retry = r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("retry-after")).map(|(_, v)| v.clone());
        assert_eq!((r.status, retry.as_deref()), (429, Some("3")));
        fake.revoke(true);
        assert_eq!(call(&fake, "GET", "/api/v4/users/me", &tok, None).0, 401);
    }
}
