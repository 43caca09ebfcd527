//! Issue 29 §1-§2 on Discord and Slack: attachments in and out, in real gateway processes
//! against the in-repo fakes (crates/discord-fake: the CDN and multipart Create Message;
//! crates/testkit/src/slackfake.rs: `files.slack.com` and the external upload) and the fake
//! provider (crates/testkit/src/llmfake.rs). Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use base64::Engine;
use gatewarden_discord_fake::{FakeDiscord, FakeFile};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::slackfake::{FakeSlack, SlackFile};

const REPLY: Duration = Duration::from_secs(20);
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";
const DISCORD_ENV: &str = "GW_TEST_DISCORD_TOKEN";
const APP_ENV: &str = "GW_TEST_SLACK_APP_TOKEN";
const BOT_ENV: &str = "GW_TEST_SLACK_BOT_TOKEN";

fn n() -> u32 {
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

fn openai(llm: &FakeLlm) -> String {
    format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url())
}

/// The user message's content parts the provider got last.
fn last_user_content(llm: &FakeLlm) -> Value {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default()
}

fn png_data_url() -> String {
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG))
}

// ---------------------------------------------------------------------------------------------
// Discord.

mod discord {
    use super::*;

    pub fn fake() -> (FakeDiscord, String) {
        let token = format!("discord-files.{}.{:04}", std::process::id(), n());
        let opts = gatewarden_discord_fake::Options {
            token: token.clone(),
            heartbeat_interval: Duration::from_millis(500),
            bucket_limit: 100,
            bucket_window: Duration::from_secs(1),
            ..gatewarden_discord_fake::Options::default()
        };
        (FakeDiscord::start(opts).expect("fake Discord"), token)
    }

    pub fn start(home: &TempHome, sw: &Sweeper, fake: &FakeDiscord, token: &str, agent: &str, extra: &str) -> Gateway {
        let config = format!(
            "drain_timeout_s = 10\n{extra}\n[agent]\n{agent}\n\
             [[platform]]\nkind = \"discord\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{DISCORD_ENV}\"\napi_base = \"{}\"\n",
            fake.api_base()
        );
        write_config(home.path(), &config);
        let mut g = builder(home)
            .env(TAG_VAR, sw.tag())
            .env(DISCORD_ENV, token)
            .env("GATEWARDEN_CREDS_DIR", creds_dir())
            .spawn();
        g.wait_ready(READY);
        // Discord delivers only to a live session.
        must_wait_until(READY, "the Discord adapter connected", || platforms(home)[0]["state"] == "connected");
        g
    }

    #[track_caller]
    pub fn wait_reply(fake: &FakeDiscord, channel: &str, pred: impl Fn(&str) -> bool) -> String {
        let got = fake.wait_sent(REPLY, |s| s.iter().any(|m| m.channel_id == channel && pred(&m.content)));
        let sent = got.unwrap_or_else(|s| panic!("no matching reply in {channel} within {REPLY:?}; sent: {s:#?}"));
        sent.into_iter()
            .rev()
            .find(|m| m.channel_id == channel && pred(&m.content))
            .map(|m| m.content)
            .unwrap_or_default()
    }
}

/// A photo attached on Discord reaches the vision provider as an `image_url` part with the
/// message's text, and the reply comes back; the CDN download carried no token.
#[test]
fn discord_a_photo_reaches_the_vision_provider() {
    let (home, sw, (fake, token)) = (TempHome::new(), Sweeper::new(), discord::fake());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let mut g = discord::start(&home, &sw, &fake, &token, &openai(&llm), "");
    let photo = FakeFile {
        filename: "cat.png".into(),
        content_type: Some("image/png".into()),
        bytes: PNG.to_vec(),
        declared_size: None,
    };
    fake.message_with_files("5001", "7", "what is this", vec![photo]);
    discord::wait_reply(&fake, "5001", |t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(content[0]["text"], "what is this", "{content}");
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": png_data_url()}}));
    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert!(!downloads[0].authorization, "the bot token never goes to the CDN: {downloads:?}");
    stop_cleanly(&home, &mut g);
}

/// A file the exec backend attaches goes out as one multipart Create Message (`files[0]`),
/// after the reply's text, exactly once, with an enforced nonce; a message that is only a
/// file (no text) is delivered and run. A kill -9 while its run is in progress loses nothing:
/// the next incarnation runs it again with the stored file (downloaded once).
#[test]
fn discord_a_file_from_exec_is_uploaded_once_across_a_kill_9() {
    let (home, sw, (fake, token)) = (TempHome::new(), Sweeper::new(), discord::fake());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 60);
    let mut g = discord::start(&home, &sw, &fake, &token, &agent, "");
    let doc = FakeFile {
        filename: "in.txt".into(),
        content_type: Some("text/plain".into()),
        bytes: b"data\n".to_vec(),
        ..FakeFile::default()
    };
    fake.message_with_files("5002", "7", "", vec![doc]);
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(fake.uploads().is_empty(), "nothing uploaded before the kill");
    let mut g = discord::start(&home, &sw, &fake, &token, &agent, "");
    discord::wait_reply(&fake, "5002", |t| t == "here is the report");
    must_wait_until(REPLY, "the file was uploaded", || !fake.uploads().is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || fake.uploads().len() == 1);
    assert!(quiet.is_ok(), "uploaded more than once: {:#?}", fake.uploads());
    let u = &fake.uploads()[0];
    assert_eq!(
        (u.channel_id.as_str(), u.filename.as_str(), u.bytes.as_slice()),
        ("5002", "report.txt", &b"report body\n"[..])
    );
    assert!(u.nonce.as_deref().is_some_and(|n| !n.is_empty()), "an enforced nonce: {u:?}");
    let texts = fake.sent().iter().filter(|m| m.channel_id == "5002" && m.content == "here is the report").count();
    assert_eq!(texts, 1);
    assert_eq!(fake.downloads().len(), 1, "downloaded once: {:?}", fake.downloads());
    stop_cleanly(&home, &mut g);
}

/// A file declared past `max_file_mb` (never downloaded) and a zip declared as a PNG: each
/// message still runs (the echo shows the refusal) and the chat is told why.
#[test]
fn discord_oversized_and_mistyped_files_are_refused_with_a_notice() {
    let (home, sw, (fake, token)) = (TempHome::new(), Sweeper::new(), discord::fake());
    let mut g = discord::start(&home, &sw, &fake, &token, "backend = \"echo\"", "[attachments]\nmax_file_mb = 1\n");
    let big = FakeFile {
        filename: "big.txt".into(),
        bytes: b"small really".to_vec(),
        declared_size: Some(5 << 20),
        ..FakeFile::default()
    };
    fake.message_with_files("5003", "7", "", vec![big]);
    let notice = discord::wait_reply(&fake, "5003", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    let echoed = discord::wait_reply(&fake, "5003", |t| t.starts_with("[attachment refused: big.txt"));
    assert!(echoed.contains("too large"), "{echoed}");
    assert!(fake.downloads().is_empty(), "a file declared too large is not downloaded: {:?}", fake.downloads());

    let zip = FakeFile {
        filename: "pic.png".into(),
        content_type: Some("image/png".into()),
        bytes: b"PK\x03\x04zip inside".to_vec(),
        ..FakeFile::default()
    };
    fake.message_with_files("5004", "7", "look", vec![zip]);
    let notice = discord::wait_reply(&fake, "5004", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("application/zip"), "{notice}");
    discord::wait_reply(&fake, "5004", |t| t.starts_with("look\n[attachment refused: pic.png"));
    stop_cleanly(&home, &mut g);
}

/// A reply's file past Discord's upload limit (413, code 40005) is rejected, not retried: the
/// reply's text is out once and the next reply goes out too.
#[test]
fn discord_a_file_past_the_upload_limit_is_rejected_once() {
    let token = format!("discord-files.{}.{:04}", std::process::id(), n());
    let opts = gatewarden_discord_fake::Options {
        token: token.clone(),
        heartbeat_interval: Duration::from_millis(500),
        bucket_limit: 100,
        bucket_window: Duration::from_secs(1),
        max_upload: 4,
        ..gatewarden_discord_fake::Options::default()
    };
    let fake = FakeDiscord::start(opts).expect("fake Discord");
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("first"), b"").unwrap();
    let mut g = discord::start(&home, &sw, &fake, &token, &attaching_agent(dir.path(), true, 60), "");
    let too_large = |c: &gatewarden_discord_fake::RestCall| c.channel == "5005" && c.status == 413;
    fake.message("5005", "7", "report");
    discord::wait_reply(&fake, "5005", |t| t == "here is the report");
    let refused = fake.wait_calls(REPLY, |c| c.iter().any(too_large));
    assert!(refused.is_ok(), "no 413: {:#?}", fake.calls());
    fake.message("5005", "7", "again");
    must_wait_until(REPLY, "the next reply went out", || {
        fake.sent().iter().filter(|m| m.channel_id == "5005" && m.content == "here is the report").count() == 2
    });
    must_wait_until(REPLY, "the next file was tried", || fake.calls().iter().filter(|c| too_large(c)).count() == 2);
    let quiet = holds_for(Duration::from_millis(1500), || fake.calls().iter().filter(|c| too_large(c)).count() == 2);
    assert!(quiet.is_ok(), "each reply's file tried once: {:#?}", fake.calls());
    assert!(fake.uploads().is_empty());
    stop_cleanly(&home, &mut g);
}

// ---------------------------------------------------------------------------------------------
// Slack.

mod slack {
    use super::*;

    pub fn fake() -> FakeSlack {
        FakeSlack::start(gatewarden_testkit::slackfake::Options {
            app_token: format!("xapp-1-F{}-{}-files", std::process::id(), n()),
            retry_delays: vec![Duration::ZERO, Duration::from_secs(2), Duration::from_secs(5)],
            ..gatewarden_testkit::slackfake::Options::default()
        })
        .expect("fake Slack")
    }

    pub fn start(home: &TempHome, sw: &Sweeper, fake: &FakeSlack, agent: &str, extra: &str) -> Gateway {
        let config = format!(
            "drain_timeout_s = 10\n{extra}\n[agent]\n{agent}\n\
             [[platform]]\nkind = \"slack\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{APP_ENV}\"\nbot_token_env = \"{BOT_ENV}\"\n\
             api_base = \"{}\"\n",
            fake.api_base()
        );
        write_config(home.path(), &config);
        let o = fake.options();
        let mut g = builder(home)
            .env(TAG_VAR, sw.tag())
            .env(APP_ENV, &o.app_token)
            .env(BOT_ENV, &o.bot_token)
            .env("GATEWARDEN_CREDS_DIR", creds_dir())
            .spawn();
        g.wait_ready(READY);
        g
    }

    #[track_caller]
    pub fn wait_reply(fake: &FakeSlack, channel: &str, pred: impl Fn(&str) -> bool) -> String {
        let ok = wait_until(REPLY, || fake.posted().iter().any(|p| p.channel == channel && pred(&p.text)));
        assert!(ok, "no matching reply in {channel} within {REPLY:?}; posted: {:#?}", fake.posted());
        fake.posted()
            .into_iter()
            .rev()
            .find(|p| p.channel == channel && pred(&p.text))
            .map(|p| p.text)
            .unwrap_or_default()
    }
}

/// A photo shared on Slack reaches the vision provider as an `image_url` part with the
/// comment, and the reply comes back; the download carried the bot token.
#[test]
fn slack_a_photo_reaches_the_vision_provider() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), slack::fake());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let mut g = slack::start(&home, &sw, &fake, &openai(&llm), "");
    let photo = SlackFile {
        name: "cat.png".into(),
        mimetype: Some("image/png".into()),
        bytes: PNG.to_vec(),
        ..SlackFile::default()
    };
    fake.user_files("C100", "U1", "what is this", vec![photo]);
    slack::wait_reply(&fake, "C100", |t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(content[0]["text"], "what is this", "{content}");
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": png_data_url()}}));
    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert!(downloads[0].with_bot_token && downloads[0].status == 200, "{downloads:?}");
    stop_cleanly(&home, &mut g);
}

/// A file the exec backend attaches goes out through the external upload into the thread
/// the message came from, exactly once, after the reply's text, across a kill -9 during the
/// run.
#[test]
fn slack_a_file_from_exec_is_uploaded_once_into_the_thread_across_a_kill_9() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), slack::fake());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 60);
    let mut g = slack::start(&home, &sw, &fake, &agent, "");
    fake.user_message("C200", "U1", "the report please", Some("1700000000.000100"));
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(fake.shared_files().is_empty() && fake.posted().is_empty(), "nothing sent before the kill");
    let mut g = slack::start(&home, &sw, &fake, &agent, "");
    slack::wait_reply(&fake, "C200", |t| t == "here is the report");
    must_wait_until(REPLY, "the file was shared", || !fake.shared_files().is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || fake.shared_files().len() == 1);
    assert!(quiet.is_ok(), "shared more than once: {:#?}", fake.shared_files());
    let f = &fake.shared_files()[0];
    assert_eq!(
        (f.channel.as_str(), f.thread_ts.as_deref(), f.filename.as_str(), f.bytes.as_slice()),
        ("C200", Some("1700000000.000100"), "report.txt", &b"report body\n"[..])
    );
    assert_eq!(fake.uploads_begun(), 1);
    stop_cleanly(&home, &mut g);
}

/// A file declared past `max_file_mb` (never downloaded) and a zip declared as a PNG: each
/// message still runs (the echo shows the refusal) and the chat is told why; a message that
/// is only a file (no comment) is delivered.
#[test]
fn slack_oversized_and_mistyped_files_are_refused_with_a_notice() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), slack::fake());
    let mut g = slack::start(&home, &sw, &fake, "backend = \"echo\"", "[attachments]\nmax_file_mb = 1\n");
    let big = SlackFile {
        name: "big.txt".into(),
        mimetype: Some("text/plain".into()),
        bytes: b"small really".to_vec(),
        declared_size: Some(5 << 20),
    };
    fake.user_files("C300", "U1", "", vec![big]);
    let notice = slack::wait_reply(&fake, "C300", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    let echoed = slack::wait_reply(&fake, "C300", |t| t.starts_with("[attachment refused: big.txt"));
    assert!(echoed.contains("too large"), "{echoed}");
    assert!(fake.downloads().is_empty(), "a file declared too large is not downloaded: {:?}", fake.downloads());

    let zip = SlackFile {
        name: "pic.png".into(),
        mimetype: Some("image/png".into()),
        bytes: b"PK\x03\x04zip inside".to_vec(),
        ..SlackFile::default()
    };
    fake.user_files("C301", "U1", "look", vec![zip]);
    let notice = slack::wait_reply(&fake, "C301", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("application/zip"), "{notice}");
    slack::wait_reply(&fake, "C301", |t| t.starts_with("look\n[attachment refused: pic.png"));
    stop_cleanly(&home, &mut g);
}
