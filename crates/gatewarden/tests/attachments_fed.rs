//! Issue 29 §1-§2 on the federated platforms: attachments in and out in real gateway processes
//! against a real Synapse (testkit::servers) and the fake provider
//! (crates/testkit/src/llmfake.rs). Under `CI` a missing server fails these tests; elsewhere
//! they print SKIPPED and pass. Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::PermissionsExt;
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
    let d = dir.path().display();
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\n\
             if [ ! -e {d}/first ]; then : > {d}/first; exec sleep 60; fi\n\
             printf 'report body\\n' > {d}/report.txt\necho 'here is the report'\necho '{{\"attach\": \"{d}/report.txt\"}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = format!("backend = \"exec\"\ncommand = [\"{}\"]\ntimeout_s = 120", script.display());
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
