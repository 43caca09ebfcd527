//! Issue 29 §1-§2: attachments in and out, in real gateway processes against the fake Bot API
//! (crates/telegram-fake) and the fake provider (crates/testkit/src/llmfake.rs). Loopback
//! only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use base64::Engine;
use gatewarden_telegram_fake::{FakeTelegram, Media, Options};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const REPLY: Duration = Duration::from_secs(20);
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";

fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:att-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).expect("fake Bot API")
}

fn config(fake: &FakeTelegram, agent: &str, extra: &str) -> String {
    format!(
        "drain_timeout_s = 10\n{extra}\n[agent]\n{agent}\n\
         [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\n\
         poll_timeout_s = 2\n",
        fake.base_url()
    )
}

fn start_gw(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    write_config(home.path(), config);
    let mut g =
        builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, token).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn();
    g.wait_ready(READY);
    g
}

#[track_caller]
fn wait_reply(fake: &FakeTelegram, token: &str, chat: i64, pred: impl Fn(&str) -> bool) -> String {
    let got = fake.wait_sent(token, REPLY, |s| s.iter().any(|m| m.chat_id == json!(chat) && pred(&m.text)));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply in chat {chat} within {REPLY:?}; sent: {s:#?}"));
    sent.into_iter().rev().find(|m| m.chat_id == json!(chat) && pred(&m.text)).map(|m| m.text).unwrap_or_default()
}

fn media(kind: &str, bytes: &[u8]) -> Media {
    Media { kind: kind.into(), bytes: bytes.to_vec(), ..Media::default() }
}

/// The user message's content parts the provider got last.
fn last_user_content(llm: &FakeLlm) -> serde_json::Value {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default()
}

/// A photo reaches the vision provider as an `image_url` part (a data URL of its bytes) with
/// the caption as text, and the reply comes back; a text document is inlined as text. The
/// stored file is 0600 under `<home>/attachments/ab/…`, named by its sha256.
#[test]
fn a_photo_reaches_the_vision_provider_and_a_text_file_is_inlined() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &agent, ""));
    fake.inject_media(&tok, 5, 1, Media { caption: Some("what is this".into()), ..media("photo", PNG) });
    wait_reply(&fake, &tok, 5, |t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(content[0]["type"], "text", "{content}");
    assert_eq!(content[0]["text"], "what is this", "{content}");
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": url}}));
    // Only the largest size was downloaded.
    assert_eq!(fake.downloads(&tok).len(), 1, "{:?}", fake.downloads(&tok));

    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(PNG).iter().map(|b| format!("{b:02x}")).collect()
    };
    let stored = home.path().join("attachments").join(&sha[..2]).join(&sha[2..]);
    assert_eq!(std::fs::read(&stored).unwrap(), PNG);
    assert_eq!(std::fs::metadata(&stored).unwrap().permissions().mode() & 0o777, 0o600);

    let doc = Media {
        file_name: Some("notes.txt".into()),
        mime_type: Some("text/plain".into()),
        caption: Some("summarise".into()),
        ..media("document", b"line one\nline two\n")
    };
    fake.inject_media(&tok, 5, 1, doc);
    must_wait_until(REPLY, "the provider asked about the document", || llm.seen().len() >= 2);
    let content = last_user_content(&llm);
    let text = content[0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("summarise\n[file: notes.txt, text/plain]\nline one\nline two"), "{content}");
    stop_cleanly(&home, &mut g);
}

/// The exec convention both ways: the command finds the message's files in
/// `GATEWARDEN_ATTACHMENTS` and attaches one with a `{"attach": path}` line; it arrives as one
/// `sendDocument` after the reply's text. A kill -9 while that run is in progress loses
/// nothing: the next incarnation re-runs it with the stored file (downloaded once) and the file
/// goes out once.
#[test]
fn exec_reads_the_files_and_sends_one_back_once_across_a_kill_9() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 120);
    let cfg = config(&fake, &agent, "");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    let doc = Media {
        file_name: Some("in.pdf".into()),
        mime_type: Some("application/pdf".into()),
        ..media("document", b"%PDF-1.4 fake")
    };
    fake.inject_media(&tok, 9, 1, doc);
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(fake.files(&tok).is_empty() && fake.sent(&tok).is_empty(), "nothing sent before the kill");

    let mut g2 = start_gw(&home, &sw, &tok, &cfg);
    wait_reply(&fake, &tok, 9, |t| t == "here is the report");
    must_wait_until(REPLY, "the file was sent", || !fake.files(&tok).is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || fake.files(&tok).len() == 1 && fake.sent(&tok).len() == 1);
    assert!(quiet.is_ok(), "sent more than once: {:#?} {:#?}", fake.sent(&tok), fake.files(&tok));
    let f = &fake.files(&tok)[0];
    assert_eq!(
        (f.method.as_str(), f.file_name.as_str(), f.bytes.as_slice()),
        ("sendDocument", "report.txt", &b"report body\n"[..])
    );
    assert_eq!(f.chat_id, json!(9));
    assert_eq!(fake.downloads(&tok).len(), 1, "downloaded once: {:?}", fake.downloads(&tok));
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("env.json")).unwrap()).unwrap();
    assert_eq!(
        (env[0]["name"].as_str(), env[0]["type"].as_str(), env[0]["size"].as_u64()),
        (Some("in.pdf"), Some("application/pdf"), Some(13)),
        "{env}"
    );
    let path = env[0]["path"].as_str().unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"%PDF-1.4 fake");
    stop_cleanly(&home, &mut g2);
}

/// A file past `max_file_mb` (refused on its declared size, never downloaded), a zip declared
/// as a JPEG photo, and a download that stalls past `stall_s`: each message is still journaled
/// and answered (its text names the refusal), and the chat is told why.
#[test]
fn oversized_mistyped_and_stalled_files_are_refused_with_a_notice() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let cfg = config(&fake, "backend = \"echo\"", "[attachments]\nmax_file_mb = 1\nstall_s = 2\n");
    let mut g = start_gw(&home, &sw, &tok, &cfg);

    let big =
        Media { file_name: Some("big.txt".into()), declared_size: Some(5 << 20), ..media("document", b"small really") };
    fake.inject_media(&tok, 11, 1, big);
    let notice = wait_reply(&fake, &tok, 11, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    let echoed = wait_reply(&fake, &tok, 11, |t| t.starts_with("[attachment refused: big.txt"));
    assert!(echoed.contains("too large"), "{echoed}");
    assert!(fake.downloads(&tok).is_empty(), "a file declared too large is not downloaded");

    fake.inject_media(&tok, 12, 1, Media { caption: Some("look".into()), ..media("photo", b"PK\x03\x04zip inside") });
    let notice = wait_reply(&fake, &tok, 12, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("application/zip"), "{notice}");
    wait_reply(&fake, &tok, 12, |t| t.starts_with("look\n[attachment refused: photo.jpg"));

    let stall =
        Media { file_name: Some("slow.txt".into()), stall: true, ..media("document", b"the first bytes and more") };
    fake.inject_media(&tok, 13, 1, stall);
    let notice = wait_reply(&fake, &tok, 13, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("stalled"), "{notice}");
    // Nothing of the refused files is in the store.
    let stored: Vec<_> = walk(&home.path().join("attachments"));
    assert!(stored.iter().all(|p| p.starts_with(home.path().join("attachments/events"))), "{stored:?}");
    stop_cleanly(&home, &mut g);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// A stranger's file is not fetched: the access policy is asked (deciding nothing) before the
/// download, and the stranger gets the pairing code, as for text.
#[test]
fn a_strangers_file_is_not_downloaded() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let cfg = config(&fake, "backend = \"echo\"", "").replace("access = \"open\"", "access = \"pairing\"");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    fake.inject_media(&tok, 21, 21, media("photo", PNG));
    let code = wait_reply(&fake, &tok, 21, |_| true);
    assert!(code.to_lowercase().contains("pair"), "{code}");
    assert!(fake.downloads(&tok).is_empty(), "{:?}", fake.downloads(&tok));
    stop_cleanly(&home, &mut g);
}

/// The gateway's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the gateway's /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Memory stays bounded by the stream, not the file: an 18 MB document is stored, and one that
/// declares 1 KB but is just under the Bot API's 20 MiB is cut at `max_file_mb` (19 MiB)
/// mid-download; neither raises the gateway's peak resident memory by more than a few MB
/// (each would by 18-20 MB if it were held whole).
#[test]
fn big_files_stream_to_disk_and_memory_stays_bounded() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let cfg = config(&fake, "backend = \"echo\"", "[attachments]\nmax_file_mb = 19\n");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    // Warm: the download path, the store and the journal have run once.
    fake.inject_media(&tok, 21, 1, Media { caption: Some("warm".into()), ..media("photo", PNG) });
    wait_reply(&fake, &tok, 21, |t| t == "warm");
    let base = peak_kib(g.pid());

    let mut big = b"%PDF-1.4\n".to_vec();
    big.resize(18 * 1000 * 1000, b'x');
    let doc = Media {
        file_name: Some("big.pdf".into()),
        mime_type: Some("application/pdf".into()),
        caption: Some("big one".into()),
        ..media("document", &big)
    };
    fake.inject_media(&tok, 22, 1, doc);
    // The echo backend answers the text; the file went to the store (below), not refused.
    wait_reply(&fake, &tok, 22, |t| t == "big one");
    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&big).iter().map(|b| format!("{b:02x}")).collect()
    };
    let stored = home.path().join("attachments").join(&sha[..2]).join(&sha[2..]);
    assert_eq!(std::fs::metadata(&stored).map(|m| m.len()).ok(), Some(big.len() as u64));

    let liar = Media {
        file_name: Some("liar.pdf".into()),
        mime_type: Some("application/pdf".into()),
        caption: Some("small, it says".into()),
        declared_size: Some(1000),
        ..media("document", &{
            let mut b = big.clone();
            b.resize((20 << 20) - 1, b'y');
            b
        })
    };
    fake.inject_media(&tok, 23, 1, liar);
    let notice = wait_reply(&fake, &tok, 23, |t| t.starts_with("attachment refused"));
    assert!(notice.contains("liar.pdf") && notice.contains("too large"), "{notice}");

    let grew = peak_kib(g.pid()).saturating_sub(base);
    assert!(grew < 8 * 1024, "the peak grew by {grew} KiB for 18-20 MB files: held in memory, not streamed");
    stop_cleanly(&home, &mut g);
}
