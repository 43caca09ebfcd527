//! Issue 29 §1-§2 on WhatsApp, Signal and Mattermost: attachments in and out, in real gateway
//! processes against the in-repo fakes (crates/testkit/src/{whatsapp,signal,mattermost}fake.rs)
//! and the fake provider (crates/testkit/src/llmfake.rs). Per platform: a photo reaches the
//! vision provider as an `image_url` data URL and the reply comes back; a file the exec backend
//! attaches (`{"attach": path}`) goes out through the native upload exactly once; a refused
//! file (mistyped or too large) is named to the chat and the message still runs. Loopback
//! only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use base64::Engine;
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::mattermostfake::FakeMattermost;
use gatewarden_testkit::signalfake::FakeSignal;
use gatewarden_testkit::whatsappfake::FakeWhatsapp;

const REPLY: Duration = Duration::from_secs(20);
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";
const ZIP: &[u8] = b"PK\x03\x04zip inside, not a picture";
const ADMIN_WA: &str = "15550002222";
const ADMIN_SIGNAL: &str = "+4917000000029";
const ADMIN_MM: &str = "adminuseradminuseradmin029";
const WA_TOKEN: &str = "GW_TEST_WAP_TOKEN";
const WA_SECRET: &str = "GW_TEST_WAP_SECRET";
const WA_VERIFY: &str = "GW_TEST_WAP_VERIFY";
const MM_TOKEN: &str = "GW_TEST_MMP_TOKEN";

fn n() -> u32 {
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

fn vision(llm: &FakeLlm) -> String {
    format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url())
}

/// The user message's content parts the provider got last.
fn last_user_content(llm: &FakeLlm) -> Value {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default()
}

/// The caption and then the photo as a data URL: what a vision model reads.
#[track_caller]
fn assert_vision_parts(llm: &FakeLlm, caption: &str) {
    let content = last_user_content(llm);
    assert_eq!((content[0]["type"].as_str(), content[0]["text"].as_str()), (Some("text"), Some(caption)), "{content}");
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": url}}));
}

fn spawn(home: &TempHome, sw: &Sweeper, config: &str, env: &[(&str, String)]) -> Gateway {
    write_config(home.path(), config);
    let mut b = builder(home).env(TAG_VAR, sw.tag()).env("GATEWARDEN_CREDS_DIR", creds_dir());
    for (k, v) in env {
        b = b.env(k, v);
    }
    let mut g = b.spawn();
    g.wait_ready(READY);
    g
}

// ---- WhatsApp ----

fn wa_fake() -> FakeWhatsapp {
    let o = gatewarden_testkit::whatsappfake::Options {
        phone_number_id: format!("29{}{:04}", std::process::id(), n()),
        ..Default::default()
    };
    FakeWhatsapp::start(o).expect("fake WhatsApp")
}

fn wa_start(home: &TempHome, sw: &Sweeper, fake: &FakeWhatsapp, agent: &str) -> Gateway {
    let o = fake.options();
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    let config = format!(
        "drain_timeout_s = 10\n[agent]\n{backend}\n{agent}\n\
         [[platform]]\nkind = \"whatsapp\"\naccess = \"open\"\ntoken_env = \"{WA_TOKEN}\"\n\
         app_secret_env = \"{WA_SECRET}\"\nverify_token_env = \"{WA_VERIFY}\"\n\
         phone_number_id = \"{}\"\napi_base = \"{}\"\napi_version = \"{}\"\nadmins = [\"{ADMIN_WA}\"]\n",
        o.phone_number_id,
        fake.api_base(),
        o.version
    );
    let env = [(WA_TOKEN, o.token.clone()), (WA_SECRET, o.app_secret.clone()), (WA_VERIFY, o.verify_token.clone())];
    let g = spawn(home, sw, &config, &env);
    fake.set_webhook(&format!("http://{}/hooks/whatsapp/whatsapp", g.listen()));
    g
}

#[track_caller]
fn wa_reply(fake: &FakeWhatsapp, to: &str, pred: impl Fn(&str) -> bool) -> String {
    let ok = wait_until(REPLY, || fake.posted().iter().any(|p| p.to == to && pred(&p.text)));
    assert!(ok, "no matching reply to {to} within {REPLY:?}; posted: {:#?}", fake.posted());
    fake.posted().into_iter().rev().find(|p| p.to == to && pred(&p.text)).map(|p| p.text).unwrap_or_default()
}

/// A WhatsApp image (media node, then its URL, both with the bearer) reaches the vision
/// provider with its caption, and the reply comes back; it was downloaded once.
#[test]
fn whatsapp_photo_reaches_the_vision_provider() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), wa_fake());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let mut g = wa_start(&home, &sw, &fake, &vision(&llm));
    fake.media_message(ADMIN_WA, "image", "image/png", PNG, json!({"caption": "what is this"}));
    wa_reply(&fake, ADMIN_WA, |t| t == "a tiny picture");
    assert_vision_parts(&llm, "what is this");
    assert_eq!(fake.downloads().len(), 1, "{:?}", fake.downloads());
    stop_cleanly(&home, &mut g);
}

/// The exec backend's attached file goes out as one media upload and one `document` message
/// naming it, after the reply's text; a zip sent as an image is refused with a notice and the
/// message (a file alone) still runs.
#[test]
fn whatsapp_file_back_once_and_a_mistyped_image_refused() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), wa_fake());
    let dir = tempfile::tempdir().unwrap();
    let mut g = wa_start(&home, &sw, &fake, &attaching_agent(dir.path(), false, 120));
    fake.message(ADMIN_WA, "make a report");
    wa_reply(&fake, ADMIN_WA, |t| t == "here is the report");
    must_wait_until(REPLY, "the file was sent", || !fake.media_sent().is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || fake.uploads().len() == 1 && fake.media_sent().len() == 1);
    assert!(quiet.is_ok(), "sent more than once: {:#?} {:#?}", fake.uploads(), fake.media_sent());
    let (up, sent) = (&fake.uploads()[0], &fake.media_sent()[0]);
    assert_eq!(
        (up.kind.as_str(), up.file_name.as_str(), up.bytes.as_slice()),
        ("text/plain", "report.txt", &b"report body\n"[..])
    );
    assert_eq!(
        (sent.to.as_str(), sent.kind.as_str(), sent.media_id.as_str(), sent.filename.as_deref()),
        (ADMIN_WA, "document", up.id.as_str(), Some("report.txt"))
    );
    stop_cleanly(&home, &mut g);

    let mut g = wa_start(&home, &sw, &fake, "");
    fake.media_message(ADMIN_WA, "image", "image/jpeg", ZIP, json!({}));
    let notice = wa_reply(&fake, ADMIN_WA, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("image.jpg") && notice.contains("application/zip"), "{notice}");
    wa_reply(&fake, ADMIN_WA, |t| t.starts_with("[attachment refused: image.jpg"));
    stop_cleanly(&home, &mut g);
}

/// A kill -9 while the run of a message with a file is in progress loses nothing: the next
/// incarnation runs it again with the stored file (downloaded once, Meta does not redeliver a
/// notification answered 200) and the file it attaches goes out once.
#[test]
fn whatsapp_kill_9_between_download_and_reply() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), wa_fake());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 120);
    let mut g = wa_start(&home, &sw, &fake, &agent);
    fake.media_message(ADMIN_WA, "document", "application/pdf", b"%PDF-1.4 fake", json!({"filename": "in.pdf"}));
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(fake.uploads().is_empty() && fake.posted().is_empty(), "nothing sent before the kill");
    let mut g2 = wa_start(&home, &sw, &fake, &agent);
    wa_reply(&fake, ADMIN_WA, |t| t == "here is the report");
    must_wait_until(REPLY, "the file was sent", || !fake.media_sent().is_empty());
    let once = || fake.uploads().len() == 1 && fake.media_sent().len() == 1 && fake.posted().len() == 1;
    assert!(holds_for(Duration::from_millis(1500), once).is_ok(), "{:#?} {:#?}", fake.posted(), fake.media_sent());
    assert_eq!(fake.downloads().len(), 1, "downloaded once: {:?}", fake.downloads());
    stop_cleanly(&home, &mut g2);
}

// ---- Signal ----

fn signal_fake() -> FakeSignal {
    let account = format!("+49152{:05}{:03}", std::process::id() % 100_000, n() % 1000);
    let o = gatewarden_testkit::signalfake::Options { accounts: vec![account], ..Default::default() };
    FakeSignal::start(o).expect("fake signal-cli")
}

fn signal_start(home: &TempHome, sw: &Sweeper, fake: &FakeSignal, agent: &str, extra: &str) -> Gateway {
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    let config = format!(
        "drain_timeout_s = 10\n{extra}\n[agent]\n{backend}\n{agent}\n\
         [[platform]]\nkind = \"signal\"\naccess = \"open\"\nrequire_mention = false\naccount = \"{}\"\n\
         api_base = \"{}\"\nadmins = [\"{ADMIN_SIGNAL}\"]\n",
        fake.account(),
        fake.base_url()
    );
    spawn(home, sw, &config, &[])
}

#[track_caller]
fn signal_reply(fake: &FakeSignal, pred: impl Fn(&str) -> bool) -> String {
    let is = |s: &gatewarden_testkit::signalfake::Sent| s.recipient.as_deref() == Some(ADMIN_SIGNAL) && pred(&s.text);
    let got = fake.wait_sent(REPLY, |all| all.iter().any(is));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply within {REPLY:?}; sent: {s:#?}"));
    sent.into_iter().rev().find(|s| is(s)).map(|s| s.text).unwrap_or_default()
}

/// A Signal photo, fetched with `getAttachment`, reaches the vision provider.
#[test]
fn signal_photo_reaches_the_vision_provider() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), signal_fake());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let mut g = signal_start(&home, &sw, &fake, &vision(&llm), "");
    fake.message_files(ADMIN_SIGNAL, "what is this", &[("image/png", "p.png", PNG)]);
    signal_reply(&fake, |t| t == "a tiny picture");
    assert_vision_parts(&llm, "what is this");
    assert_eq!(fake.fetches().len(), 1, "{:?}", fake.fetches());
    stop_cleanly(&home, &mut g);
}

/// The exec backend's attached file goes out as one `send` with its data URI; a file past
/// `max_file_mb` is refused on its declared size (never fetched) with a notice, and the
/// message still runs.
#[test]
fn signal_file_back_once_and_an_oversized_file_refused() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), signal_fake());
    let dir = tempfile::tempdir().unwrap();
    let mut g = signal_start(&home, &sw, &fake, &attaching_agent(dir.path(), false, 120), "");
    fake.message(ADMIN_SIGNAL, "make a report");
    signal_reply(&fake, |t| t == "here is the report");
    let with_files = |f: &FakeSignal| f.sent().into_iter().filter(|s| !s.files.is_empty()).collect::<Vec<_>>();
    must_wait_until(REPLY, "the file was sent", || !with_files(&fake).is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || with_files(&fake).len() == 1);
    assert!(quiet.is_ok(), "sent more than once: {:#?}", fake.sent());
    let sent = &with_files(&fake)[0];
    assert_eq!(sent.recipient.as_deref(), Some(ADMIN_SIGNAL));
    assert_eq!(sent.files, [("text/plain".to_owned(), "report.txt".to_owned(), b"report body\n".to_vec())]);
    stop_cleanly(&home, &mut g);

    let mut g = signal_start(&home, &sw, &fake, "", "[attachments]\nmax_file_mb = 1\n");
    let big = vec![b'a'; (1 << 20) + 10];
    fake.message_files(ADMIN_SIGNAL, "", &[("text/plain", "big.txt", &big)]);
    let notice = signal_reply(&fake, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    signal_reply(&fake, |t| t.starts_with("[attachment refused: big.txt"));
    assert!(fake.fetches().is_empty(), "a file declared too large is not fetched: {:?}", fake.fetches());
    stop_cleanly(&home, &mut g);
}

/// An attachment whose declared size lies is still bounded: `getAttachment`'s answer is read
/// only up to the base64 of `max_file_mb` before it is decoded, and the file is refused with a
/// notice.
#[test]
fn signal_an_answer_past_the_bound_is_refused_unread() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), signal_fake());
    let mut g = signal_start(&home, &sw, &fake, "", "[attachments]\nmax_file_mb = 1\n");
    fake.attachment("liar.bin", &vec![b'a'; 3 << 20]);
    let lie =
        json!({"attachments": [{"contentType": "text/plain", "filename": "liar.txt", "id": "liar.bin", "size": 10}]});
    fake.message_with(ADMIN_SIGNAL, "read this", None, lie);
    let notice = signal_reply(&fake, |t| t.starts_with("attachment refused"));
    // The adapter refused the answer itself (the store's own cap would say "a file").
    assert!(notice.contains("liar.txt") && notice.contains("cannot download it: too large"), "{notice}");
    signal_reply(&fake, |t| t.starts_with("read this\n[attachment refused: liar.txt"));
    stop_cleanly(&home, &mut g);
}

// ---- Mattermost ----

fn mm_fake() -> FakeMattermost {
    let o = gatewarden_testkit::mattermostfake::Options {
        token: format!("mmpush{}x{}", std::process::id(), n()),
        ..Default::default()
    };
    FakeMattermost::start(o).expect("fake Mattermost")
}

fn mm_start(home: &TempHome, sw: &Sweeper, fake: &FakeMattermost, agent: &str) -> Gateway {
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    let config = format!(
        "drain_timeout_s = 10\n[agent]\n{backend}\n{agent}\n\
         [[platform]]\nkind = \"mattermost\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{MM_TOKEN}\"\n\
         server = \"{}\"\nadmins = [\"{ADMIN_MM}\"]\n",
        fake.server()
    );
    let g = spawn(home, sw, &config, &[(MM_TOKEN, fake.options().token)]);
    wait_adapter(home, "connected", READY);
    g
}

#[track_caller]
fn mm_reply(fake: &FakeMattermost, channel: &str, pred: impl Fn(&str) -> bool) -> String {
    let ok = wait_until(REPLY, || fake.bot_posts().iter().any(|p| p.channel == channel && pred(&p.message)));
    assert!(ok, "no matching reply in {channel} within {REPLY:?}; posted: {:#?}", fake.bot_posts());
    fake.bot_posts().into_iter().rev().find(|p| p.channel == channel && pred(&p.message)).map(|p| p.message).unwrap()
}

/// A kill -9 while the run of a post with a file is in progress loses nothing: the next
/// incarnation runs it again with the stored file (downloaded once) and the file it attaches
/// is uploaded and posted once.
#[test]
fn mattermost_kill_9_between_download_and_reply() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), mm_fake());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 120);
    let mut g = mm_start(&home, &sw, &fake, &agent);
    fake.user_post_files("chan4", ADMIN_MM, "", &[("in.pdf", "application/pdf", b"%PDF-1.4 fake")]);
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(fake.uploads().is_empty() && fake.bot_posts().is_empty(), "nothing sent before the kill");
    let mut g2 = mm_start(&home, &sw, &fake, &agent);
    mm_reply(&fake, "chan4", |t| t == "here is the report");
    must_wait_until(REPLY, "the file was posted", || !fake.uploads().is_empty());
    let once = || fake.uploads().len() == 1 && fake.bot_posts().len() == 2;
    assert!(holds_for(Duration::from_millis(1500), once).is_ok(), "{:#?} {:#?}", fake.uploads(), fake.bot_posts());
    assert_eq!(fake.file_downloads().len(), 1, "downloaded once: {:?}", fake.file_downloads());
    stop_cleanly(&home, &mut g2);
}

/// A Mattermost post's image (`GET /files/{id}`) reaches the vision provider.
#[test]
fn mattermost_photo_reaches_the_vision_provider() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), mm_fake());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let mut g = mm_start(&home, &sw, &fake, &vision(&llm));
    fake.user_post_files("chan1", ADMIN_MM, "what is this", &[("p.png", "image/png", PNG)]);
    mm_reply(&fake, "chan1", |t| t == "a tiny picture");
    assert_vision_parts(&llm, "what is this");
    assert_eq!(fake.file_downloads().len(), 1, "{:?}", fake.file_downloads());
    stop_cleanly(&home, &mut g);
}

/// The exec backend's attached file goes out as one `POST /files` and one post naming its
/// file id; a zip declared as a PNG is refused with a notice and the post (files only) still
/// runs.
#[test]
fn mattermost_file_back_once_and_a_mistyped_image_refused() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), mm_fake());
    let dir = tempfile::tempdir().unwrap();
    let mut g = mm_start(&home, &sw, &fake, &attaching_agent(dir.path(), false, 120));
    fake.user_post("chan2", ADMIN_MM, "make a report", None);
    mm_reply(&fake, "chan2", |t| t == "here is the report");
    let with_files =
        |f: &FakeMattermost| f.bot_posts().into_iter().filter(|p| !p.file_ids.is_empty()).collect::<Vec<_>>();
    must_wait_until(REPLY, "the file was posted", || !with_files(&fake).is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || fake.uploads().len() == 1 && with_files(&fake).len() == 1);
    assert!(quiet.is_ok(), "sent more than once: {:#?} {:#?}", fake.uploads(), with_files(&fake));
    let up = &fake.uploads()[0];
    assert_eq!(
        (up.channel.as_str(), up.name.as_str(), up.mime_type.as_str(), up.bytes.as_slice()),
        ("chan2", "report.txt", "text/plain", &b"report body\n"[..])
    );
    assert_eq!(with_files(&fake)[0].file_ids, std::slice::from_ref(&up.id));
    stop_cleanly(&home, &mut g);

    let mut g = mm_start(&home, &sw, &fake, "");
    fake.user_post_files("chan3", ADMIN_MM, "", &[("shot.png", "image/png", ZIP)]);
    let notice = mm_reply(&fake, "chan3", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("shot.png") && notice.contains("application/zip"), "{notice}");
    mm_reply(&fake, "chan3", |t| t.starts_with("[attachment refused: shot.png"));
    stop_cleanly(&home, &mut g);
}
