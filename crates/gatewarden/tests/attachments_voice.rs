//! Issue 29 §1 "Voice and audio": `[agent.transcription]` in real gateway processes against
//! the fake Bot API (crates/telegram-fake) and the fake provider's `/v1/audio/transcriptions`
//! (crates/testkit/src/llmfake.rs). Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Media, Options};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const KEY_ENV: &str = "GW_TEST_VOICE_KEY";
const KEY: &str = "sk-voice-0123";
const REPLY: Duration = Duration::from_secs(20);
/// An Ogg page's magic, then words the fake provider "hears" (its printable runs).
const VOICE: &[u8] = b"OggS\0\x02\0\0\0\0please call me back\0\x01\x02";
const HEARD: &str = "please call me back";

fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:voice-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).expect("fake Bot API")
}

/// `[agent]` (with `agent`'s keys), then `transcription` (the `[agent.transcription]` table and
/// what follows it), then the Telegram platform.
fn config(fake: &FakeTelegram, agent: &str, transcription: &str) -> String {
    format!(
        "drain_timeout_s = 10\n[agent]\n{agent}\n{transcription}\n\
         [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\n\
         poll_timeout_s = 2\n",
        fake.base_url()
    )
}

fn one_provider(llm: &FakeLlm) -> String {
    format!(
        "[agent.transcription]\nbase_url = \"{}\"\napi_key_env = \"{KEY_ENV}\"\nlanguage = \"en\"\n",
        llm.base_url()
    )
}

fn start_gw(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    write_config(home.path(), config);
    let mut g = builder(home)
        .env(TAG_VAR, sw.tag())
        .env(TOKEN_ENV, token)
        .env(KEY_ENV, KEY)
        .env("GATEWARDEN_CREDS_DIR", creds_dir())
        .spawn();
    g.wait_ready(READY);
    g
}

#[track_caller]
fn wait_reply(fake: &FakeTelegram, token: &str, chat: i64, pred: impl Fn(&str) -> bool) -> String {
    let got = fake.wait_sent(token, REPLY, |s| s.iter().any(|m| m.chat_id == json!(chat) && pred(&m.text)));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply in chat {chat} within {REPLY:?}; sent: {s:#?}"));
    sent.into_iter().rev().find(|m| m.chat_id == json!(chat) && pred(&m.text)).map(|m| m.text).unwrap_or_default()
}

fn voice_note() -> Media {
    Media { kind: "voice".into(), bytes: VOICE.to_vec(), mime_type: Some("audio/ogg".into()), ..Media::default() }
}

/// The text of the user message the provider's chat completion got last (a plain string, or
/// the text part of content parts).
fn last_user_text(llm: &FakeLlm) -> String {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    let content = body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default();
    match content {
        serde_json::Value::String(s) => s,
        parts => parts[0]["text"].as_str().unwrap_or_default().to_owned(),
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A Telegram voice note is sent to the transcription provider (multipart: the stored file,
/// the model, the language, `response_format=json`, the key) and its transcript, not the file,
/// reaches the openai agent; the reply comes back. The transcript is cached beside the stored
/// file, 0600.
#[test]
fn a_voice_note_is_transcribed_and_the_transcript_reaches_the_agent() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::text("I will call you back")).unwrap();
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &agent, &one_provider(&llm)));
    fake.inject_media(&tok, 21, 1, voice_note());
    wait_reply(&fake, &tok, 21, |t| t == "I will call you back");

    let calls = llm.transcriptions();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let c = &calls[0];
    assert_eq!(
        (c.model.as_deref(), c.language.as_deref(), c.response_format.as_deref(), c.status),
        (Some("whisper-1"), Some("en"), Some("json"), 200)
    );
    assert_eq!((c.file_name.as_deref(), c.file_type.as_deref()), (Some("voice.ogg"), Some("audio/ogg")));
    assert_eq!(c.file_size, Some(VOICE.len()), "the stored file, whole");
    assert_eq!(c.authorization.as_deref(), Some(format!("Bearer {KEY}").as_str()));
    let text = last_user_text(&llm);
    assert_eq!(text, format!("[voice transcript of voice.ogg: {HEARD}]"), "the transcript instead of the file");
    let cached = home.path().join("attachments/transcripts").join(sha256(VOICE));
    assert_eq!(std::fs::read_to_string(&cached).unwrap(), HEARD);
    assert_eq!(std::fs::metadata(&cached).unwrap().permissions().mode() & 0o777, 0o600);
    stop_cleanly(&home, &mut g);
}

/// A kill -9 after the transcript and before the reply: the next incarnation re-runs the
/// message with the cached transcript; the provider transcribed it once, the file was
/// downloaded once, and the reply comes back.
#[test]
fn a_restart_after_the_transcript_does_not_transcribe_twice() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::text("noted")).unwrap();
    llm.then([Reply::held(Reply::text("never sent"))]);
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let cfg = config(&fake, &agent, &one_provider(&llm));
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    fake.inject_media(&tok, 22, 1, voice_note());
    must_wait_until(REPLY, "the run asked the provider after the transcript", || llm.holding() == 1);
    assert_eq!(llm.transcriptions().len(), 1);
    g.kill();

    let mut g2 = start_gw(&home, &sw, &tok, &cfg);
    wait_reply(&fake, &tok, 22, |t| t == "noted");
    assert!(last_user_text(&llm).contains(HEARD), "{}", last_user_text(&llm));
    assert_eq!(llm.transcriptions().len(), 1, "transcribed once: {:#?}", llm.transcriptions());
    assert_eq!(fake.downloads(&tok).len(), 1, "downloaded once: {:?}", fake.downloads(&tok));
    stop_cleanly(&home, &mut g2);
}

/// The provider failing: the message still runs, the file named as without transcription and
/// a short reason beside it; the reply comes back.
#[test]
fn a_failing_provider_names_the_file_and_the_reason_and_the_run_goes_on() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::text("sorry, I could not hear it")).unwrap();
    llm.fail_transcriptions(Some(500));
    let agent =
        format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60\nretries = 0", llm.base_url());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &agent, &one_provider(&llm)));
    fake.inject_media(&tok, 23, 1, Media { caption: Some("listen".into()), ..voice_note() });
    wait_reply(&fake, &tok, 23, |t| t == "sorry, I could not hear it");
    let text = last_user_text(&llm);
    assert!(text.starts_with("listen\n"), "{text}");
    assert!(text.contains("[voice not transcribed: voice.ogg: the provider failed: HTTP 500]"), "{text}");
    // The provider's words and address are the operator's (the log), not the agent's.
    assert!(!text.contains("fake provider") && !text.contains(&llm.addr().to_string()), "{text}");
    assert!(text.contains(&format!("[file: voice.ogg, audio/ogg, {} bytes]", VOICE.len())), "{text}");
    assert_eq!(llm.transcriptions().len(), 1, "retries = 0: {:#?}", llm.transcriptions());
    assert!(!home.path().join("attachments/transcripts").join(sha256(VOICE)).exists(), "a failure is not cached");
    stop_cleanly(&home, &mut g);
}

/// Failover, as for `[[agent.provider]]`: a provider refusing the key (401) is left for the
/// next one, which transcribes; the exec backend gets the transcript on stdin, as text, and no
/// file for it.
#[test]
fn the_next_provider_transcribes_when_the_first_refuses_and_exec_gets_the_text() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let (bad, good) = (FakeLlm::start(Reply::text("-")).unwrap(), FakeLlm::start(Reply::text("-")).unwrap());
    bad.fail_transcriptions(Some(401));
    good.set_transcript("the meeting moved to noon");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ncat > {d}/stdin.txt\nprintf '%s' \"$GATEWARDEN_ATTACHMENTS\" > {d}/env.json\necho heard\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = format!("backend = \"exec\"\ncommand = [\"{}\"]\ntimeout_s = 60", script.display());
    let transcription = format!(
        "[agent.transcription]\n\
         [[agent.transcription.provider]]\nname = \"first\"\nbase_url = \"{}\"\nmodel = \"w1\"\napi_key_env = \"{KEY_ENV}\"\n\
         [[agent.transcription.provider]]\nname = \"second\"\nbase_url = \"{}\"\nmodel = \"w2\"\n",
        bad.base_url(),
        good.base_url()
    );
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &agent, &transcription));
    fake.inject_media(&tok, 24, 1, voice_note());
    wait_reply(&fake, &tok, 24, |t| t == "heard");
    let (b, o) = (bad.transcriptions(), good.transcriptions());
    assert_eq!((b.len(), b[0].status, b[0].model.as_deref()), (1, 401, Some("w1")), "{b:#?}");
    assert_eq!((o.len(), o[0].status, o[0].model.as_deref()), (1, 200, Some("w2")), "{o:#?}");
    assert_eq!(o[0].authorization, None, "the second provider names no key");
    let stdin = std::fs::read_to_string(dir.path().join("stdin.txt")).unwrap();
    assert_eq!(stdin, "[voice transcript of voice.ogg: the meeting moved to noon]");
    assert_eq!(std::fs::read_to_string(dir.path().join("env.json")).unwrap(), "[]");
    stop_cleanly(&home, &mut g);
}

/// A transcription key named but found nowhere: `gatewarden check` fails naming it, as for
/// every other secret.
#[test]
fn check_names_a_missing_transcription_key() {
    let home = TempHome::new();
    write_config(
        home.path(),
        "[agent]\nbackend = \"echo\"\n[agent.transcription]\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"GW_TEST_VOICE_UNSET\"\n",
    );
    let out = run_cli(&home, &["check"]);
    assert_cli(&out, 1, "check without the transcription key");
    let fails: Vec<&str> = out.stdout.lines().filter(|l| l.contains("FAIL secrets")).collect();
    assert_eq!(fails.len(), 1, "{out:#?}");
    assert!(
        fails[0].contains("[agent.transcription] api_key: GW_TEST_VOICE_UNSET (api_key_env) is set in neither"),
        "{}",
        fails[0]
    );
}
