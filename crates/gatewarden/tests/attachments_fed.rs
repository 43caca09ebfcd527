//! Issue 29 §1-§2 on the federated platforms: attachments in and out in real gateway processes
//! against a real Synapse (testkit::servers) and the fake provider
//! (crates/testkit/src/llmfake.rs). Under `CI` a missing server fails these tests; elsewhere
//! they print SKIPPED and pass. Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use work_common::*;

use base64::Engine;
use gatewarden_chatproto::matrix::{Client, TextMessage};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::servers::Synapse;

const MATRIX_TOKEN_ENV: &str = "GW_TEST_MATRIX_TOKEN";
const REPLY: Duration = Duration::from_secs(30);
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";

fn txn() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("t{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Alice's view of her room with the bot: what she sends, and every message of the bot's.
struct Room {
    synapse: Synapse,
    bot_token: String,
    client: Client,
    room: String,
    bot: String,
    since: Option<String>,
    said: Vec<TextMessage>,
}

impl Room {
    fn open() -> Option<Room> {
        let synapse = Synapse::start()?;
        let (bot, _alice, client, room) = matrix_room(&synapse);
        let mut r =
            Room { synapse, bot_token: bot.access_token, client, room, bot: bot.user_id, since: None, said: vec![] };
        r.poll(Duration::ZERO);
        Some(r)
    }

    fn config(&self, agent: &str, extra: &str) -> String {
        format!(
            "drain_timeout_s = 10\n{extra}\n[agent]\n{agent}\n\
             [[platform]]\nkind = \"matrix\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{MATRIX_TOKEN_ENV}\"\n\
             api_base = \"{}\"\nallowed_chats = [\"{}\"]\npoll_timeout_s = 2\n",
            self.synapse.base_url(),
            self.room
        )
    }

    fn start_gw(&self, home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
        write_config(home.path(), config);
        let mut g = builder(home)
            .env(TAG_VAR, sw.tag())
            .env(MATRIX_TOKEN_ENV, &self.bot_token)
            .env("GATEWARDEN_CREDS_DIR", creds_dir())
            .spawn();
        g.wait_ready(READY);
        wait_adapter(home, "connected", READY);
        g
    }

    /// Uploads `bytes` as alice and sends them as a `msgtype` message with `caption`.
    fn send_file(&self, msgtype: &str, name: &str, mimetype: &str, bytes: &[u8], caption: Option<&str>) {
        let mut body = bytes;
        let url = self.client.upload(name, mimetype, bytes.len() as u64, &mut body, REPLY).expect("upload");
        self.send_content(json!({
            "msgtype": msgtype, "body": caption.unwrap_or(name), "filename": name, "url": url,
            "info": {"mimetype": mimetype, "size": bytes.len()},
        }));
    }

    fn send_content(&self, content: Value) {
        self.client.send_content(&self.room, &txn(), &content).expect("send");
    }

    fn poll(&mut self, timeout: Duration) {
        if let Ok(b) = self.client.sync(self.since.as_deref(), timeout) {
            self.since = Some(b.next_batch);
            let (room, bot) = (&self.room, &self.bot);
            self.said.extend(b.messages.into_iter().filter(|m| &m.room_id == room && &m.sender == bot));
        }
    }

    #[track_caller]
    fn wait_said(&mut self, what: &str, pred: impl Fn(&TextMessage) -> bool) -> TextMessage {
        let end = Instant::now() + REPLY;
        loop {
            if let Some(m) = self.said.iter().rev().find(|m| pred(m)) {
                return m.clone();
            }
            assert!(Instant::now() < end, "no {what} within {REPLY:?}; the bot said: {:#?}", self.said);
            self.poll(Duration::from_millis(500));
        }
    }

    #[track_caller]
    fn wait_text(&mut self, pred: impl Fn(&str) -> bool) -> String {
        self.wait_said("matching reply", |m| m.media.is_none() && pred(&m.body)).body
    }
}

/// The user message's content parts the provider got last.
fn last_user_content(llm: &FakeLlm) -> Value {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default()
}

/// A photo (`m.image` with a caption) is downloaded through Synapse's authenticated media API
/// and reaches the vision provider as an `image_url` data URL; the reply comes back.
#[test]
fn matrix_photo_reaches_the_vision_provider() {
    let Some(mut r) = Room::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let mut g = r.start_gw(&home, &sw, &r.config(&agent, ""));
    r.send_file("m.image", "tiny.png", "image/png", PNG, Some("what is this"));
    r.wait_text(|t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(content[0]["text"], "what is this", "{content}");
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": url}}));
    stop_cleanly(&home, &mut g);
}

/// A file the exec backend attaches (`{"attach": path}`) goes out as one upload and one
/// `m.file` event after the reply's text; alice downloads the same bytes. A kill -9 while the
/// run is in progress loses nothing and the file still goes out once.
#[test]
fn matrix_exec_file_goes_back_once_across_a_kill_9() {
    let Some(mut r) = Room::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 120);
    let cfg = r.config(&agent, "");
    let mut g = r.start_gw(&home, &sw, &cfg);
    r.send_file("m.file", "in.pdf", "application/pdf", b"%PDF-1.4 fake", None);
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();

    let mut g2 = r.start_gw(&home, &sw, &cfg);
    r.wait_text(|t| t == "here is the report");
    let file = r.wait_said("m.file from the bot", |m| m.media.is_some());
    let media = file.media.clone().unwrap();
    assert_eq!(
        (media.msgtype.as_str(), media.name.as_str(), media.mimetype.as_deref(), media.size),
        ("m.file", "report.txt", Some("text/plain"), Some(12))
    );
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut r.client.download(media.url.as_deref().unwrap(), REPLY).unwrap(), &mut got)
        .unwrap();
    assert_eq!(got, b"report body\n");
    let end = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < end {
        r.poll(Duration::from_millis(300));
    }
    let files = r.said.iter().filter(|m| m.media.is_some()).count();
    let texts = r.said.iter().filter(|m| m.body == "here is the report").count();
    assert_eq!((files, texts), (1, 1), "sent more than once: {:#?}", r.said);
    stop_cleanly(&home, &mut g2);
}

/// A file declared past `max_file_mb` is refused unfetched, and encrypted media (`file`
/// instead of `url`) is refused: each message still runs and the room is told why.
#[test]
fn matrix_oversized_and_encrypted_files_are_refused_with_a_notice() {
    let Some(mut r) = Room::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = r.start_gw(&home, &sw, &r.config("backend = \"echo\"", "[attachments]\nmax_file_mb = 1\n"));
    let mut body: &[u8] = b"small really";
    let url = r.client.upload("big.txt", "text/plain", 12, &mut body, REPLY).unwrap();
    r.send_content(json!({"msgtype": "m.file", "body": "big.txt", "url": url,
                          "info": {"mimetype": "text/plain", "size": 5 << 20}}));
    let notice = r.wait_text(|t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    let echoed = r.wait_text(|t| t.starts_with("[attachment refused: big.txt"));
    assert!(echoed.contains("too large"), "{echoed}");
    // Nothing of the refused file reached the store.
    assert!(!home.path().join("attachments").exists() || walk_files(&home.path().join("attachments")) == 0);

    r.send_content(json!({"msgtype": "m.file", "body": "read this", "filename": "secret.pdf",
                          "file": {"url": "mxc://elsewhere/x", "v": "v2"}}));
    let notice = r.wait_text(|t| t.starts_with("attachment refused") && t.contains("secret.pdf"));
    assert!(notice.contains("encrypted"), "{notice}");
    r.wait_text(|t| t.starts_with("read this\n[attachment refused: secret.pdf"));
    stop_cleanly(&home, &mut g);
}

/// Files in the store outside its per-event records.
fn walk_files(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name() == "events" {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            n += walk_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

// XMPP: XEP-0066 in, XEP-0363 out, against a real prosody with `http_file_share`
// (crates/testkit/src/prosody.rs; its files are served over loopback http, hence
// `http_files_on_loopback`).

mod xmpp {
    use super::*;
    use gatewarden_chatproto::xmpp::{self as x, BareJid, Config, Connection, Kind, Outgoing};
    use gatewarden_testkit::prosody::{DOMAIN, Prosody};
    use gatewarden_testkit::tls::{TestCa, Validity};
    use std::path::PathBuf;

    const PASSWORD_ENV: &str = "GW_TEST_XMPP_PASSWORD";
    const BOT: &str = "gwbot@localhost";

    /// Prosody with the bot and alice; alice's connection; what the bot said to her.
    pub struct Chat {
        server: Prosody,
        _dir: tempfile::TempDir,
        ca_file: PathBuf,
        conn: Connection,
        /// `(body, out-of-band URL)` of each bot message.
        said: Vec<(String, Option<String>)>,
    }

    impl Chat {
        pub fn open() -> Option<Chat> {
            let ca = TestCa::new("gatewarden xmpp files test CA");
            let leaf = ca.leaf(&[DOMAIN, gatewarden_testkit::prosody::MUC_DOMAIN], Validity::Now);
            let server = Prosody::start(&leaf.cert_pem, &leaf.key_pem)?;
            for (u, p) in [("gwbot", "pw-gwbot"), ("alice", "pw-alice")] {
                server.register(u, p);
            }
            let dir = tempfile::tempdir().unwrap();
            let ca_file = ca.write_pem(dir.path(), "ca.pem");
            let tls = gatewarden_net::ClientTls::from_ca_file(&ca_file).unwrap();
            let cfg = Config::new(
                server.addr().to_string(),
                BareJid::parse("alice@localhost").unwrap(),
                "pw-alice".into(),
                tls,
            );
            let mut conn = Connection::connect(&cfg).expect("alice connects");
            conn.presence().unwrap();
            Some(Chat { server, _dir: dir, ca_file, conn, said: Vec::new() })
        }

        pub fn config(&self, agent: &str, extra: &str) -> String {
            format!(
                "drain_timeout_s = 10\n{extra}\n[agent]\n{agent}\n\
                 [[platform]]\nkind = \"xmpp\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{PASSWORD_ENV}\"\n\
                 jid = \"{BOT}\"\nserver = \"{}\"\nca_file = \"{}\"\nhttp_files_on_loopback = true\n",
                self.server.addr(),
                self.ca_file.to_string_lossy(),
            )
        }

        pub fn start_gw(&self, home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
            write_config(home.path(), config);
            let mut g = builder(home)
                .env(TAG_VAR, sw.tag())
                .env(PASSWORD_ENV, "pw-gwbot")
                .env("GATEWARDEN_CREDS_DIR", creds_dir())
                .spawn();
            g.wait_ready(READY);
            wait_adapter(home, "connected", READY);
            g
        }

        fn poll(&mut self, timeout: Duration) {
            if let Ok(Some(m)) = self.conn.next_stanza(timeout)
                && m.name == "message"
                && x::bare(m.attr("from").unwrap_or_default()).eq_ignore_ascii_case(BOT)
                && let Some(body) = m.child("body", x::xml::NS_CLIENT).map(|b| b.text.clone())
            {
                self.said.push((body, x::oob_url(&m)));
            }
        }

        /// Uploads `bytes` as alice through the server's XEP-0363 service; the GET URL. The
        /// slot IQ is answered through this connection's reads, so they go on meanwhile.
        pub fn upload(&mut self, name: &str, kind: &str, bytes: &[u8]) -> String {
            let w = self.conn.writer();
            let (name2, kind2, size) = (name.to_owned(), kind.to_owned(), bytes.len() as u64);
            let t = std::thread::spawn(move || {
                let service = x::discover_upload(&w, DOMAIN, REPLY)?.expect("prosody offers http_file_share");
                x::request_slot(&w, &service.jid, &name2, size, &kind2, REPLY)
            });
            let end = Instant::now() + REPLY;
            while !t.is_finished() {
                assert!(Instant::now() < end, "no upload slot within {REPLY:?}");
                self.poll(Duration::from_millis(100));
            }
            let slot = t.join().unwrap().expect("upload slot");
            let (addr, path) = split_url(&slot.put);
            let headers: Vec<(&str, &str)> = slot.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut headers = headers;
            headers.push(("Content-Type", kind));
            let r = http_request(addr, "PUT", &path, &headers, Some(bytes), REPLY).expect("PUT");
            assert!(matches!(r.status, 200 | 201), "PUT {}: {} {}", slot.put, r.status, r.text());
            slot.get
        }

        /// Sends `url` as an XEP-0066 file with `body` (the URL itself when no caption).
        pub fn send_file(&mut self, url: &str, caption: Option<&str>) {
            let out = Outgoing { to: BOT, groupchat: false, body: caption.unwrap_or(url), id: &x::new_id() };
            self.conn.send_stanza(&x::stanza_xml(&out, Kind::Oob(url)).unwrap()).unwrap();
        }

        pub fn say(&mut self, text: &str) {
            let out = Outgoing { to: BOT, groupchat: false, body: text, id: &x::new_id() };
            self.conn.send_stanza(&x::message_xml(&out).unwrap()).unwrap();
        }

        #[track_caller]
        pub fn wait_said(&mut self, pred: impl Fn(&(String, Option<String>)) -> bool) -> (String, Option<String>) {
            let end = Instant::now() + REPLY;
            loop {
                if let Some(m) = self.said.iter().rev().find(|m| pred(m)) {
                    return m.clone();
                }
                assert!(Instant::now() < end, "no matching message within {REPLY:?}; the bot said: {:#?}", self.said);
                self.poll(Duration::from_millis(300));
            }
        }

        #[track_caller]
        pub fn wait_text(&mut self, pred: impl Fn(&str) -> bool) -> String {
            self.wait_said(|(b, u)| u.is_none() && pred(b)).0
        }

        pub fn quiet_for(&mut self, d: Duration) {
            let end = Instant::now() + d;
            while Instant::now() < end {
                self.poll(Duration::from_millis(200));
            }
        }

        pub fn said(&self) -> &[(String, Option<String>)] {
            &self.said
        }
    }

    /// `http://127.0.0.1:port/path` → the address and the path.
    pub fn split_url(url: &str) -> (std::net::SocketAddr, String) {
        let rest = url.strip_prefix("http://").expect("the test server's loopback http");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        (authority.parse().expect("an ip:port"), format!("/{path}"))
    }
}

/// A photo sent as XEP-0066 (uploaded by alice through prosody's XEP-0363 service) reaches the
/// vision provider as an `image_url` data URL with the caption; the reply comes back.
#[test]
fn xmpp_photo_reaches_the_vision_provider() {
    let Some(mut c) = xmpp::Chat::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let mut g = c.start_gw(&home, &sw, &c.config(&agent, ""));
    let url = c.upload("tiny.png", "image/png", PNG);
    c.send_file(&url, Some("what is this"));
    c.wait_text(|t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(content[0]["text"], "what is this", "{content}");
    let data = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": data}}));
    stop_cleanly(&home, &mut g);
}

/// A file the exec backend attaches goes out through XEP-0363 once: one message whose body
/// and out-of-band URL are the GET URL, serving the same bytes. A kill -9 while the run is in
/// progress loses nothing: the next incarnation runs it again and the file goes out once.
#[test]
fn xmpp_exec_file_goes_back_once_across_a_kill_9() {
    let Some(mut c) = xmpp::Chat::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 60);
    let cfg = c.config(&agent, "");
    let mut g = c.start_gw(&home, &sw, &cfg);
    c.say("the report please");
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    let mut g = c.start_gw(&home, &sw, &cfg);
    c.wait_text(|t| t == "here is the report");
    let (body, url) = c.wait_said(|(_, u)| u.is_some());
    let url = url.unwrap();
    assert_eq!(body, url, "the body repeats the URL for clients without XEP-0066");
    assert!(url.ends_with("/report.txt"), "{url}");
    let (addr, path) = xmpp::split_url(&url);
    let got = http_get(addr, &path, REPLY).unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, &b"report body\n"[..]));
    c.quiet_for(Duration::from_millis(2000));
    let files = c.said().iter().filter(|(_, u)| u.is_some()).count();
    let texts = c.said().iter().filter(|(b, _)| b == "here is the report").count();
    assert_eq!((files, texts), (1, 1), "sent more than once: {:#?}", c.said());
    stop_cleanly(&home, &mut g);
}

/// A file past `max_file_mb` (OOB declares no size: refused while downloading) and an http URL
/// to a host that is not loopback (never fetched): each message still runs and the chat is
/// told why.
#[test]
fn xmpp_oversized_and_plain_http_files_are_refused_with_a_notice() {
    let Some(mut c) = xmpp::Chat::open() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = c.start_gw(&home, &sw, &c.config("backend = \"echo\"", "[attachments]\nmax_file_mb = 1\n"));
    let big = vec![b'a'; 3 << 19];
    let url = c.upload("big.txt", "text/plain", &big);
    c.send_file(&url, Some("too big"));
    let notice = c.wait_text(|t| t.starts_with("attachment refused") && t.contains("big.txt"));
    assert!(notice.contains("too large"), "{notice}");
    c.wait_text(|t| t.starts_with("too big\n[attachment refused: big.txt"));

    c.send_file("http://files.example.org/cat.png", Some("look"));
    let notice = c.wait_text(|t| t.starts_with("attachment refused") && t.contains("cat.png"));
    assert!(notice.contains("only https"), "{notice}");
    c.wait_text(|t| t.starts_with("look\n[attachment refused: cat.png"));
    stop_cleanly(&home, &mut g);
}
