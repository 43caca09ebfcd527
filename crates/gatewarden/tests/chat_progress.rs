//! Issue 17 §3 through the real binary: a chat shows the agent at work. `backend = "openai"`
//! against the streaming fake provider (crates/testkit llmfake.rs, slowed down), the Telegram
//! adapter against the fake Bot API (crates/telegram-fake): typing while the run is in
//! progress, a preview edited as the reply grows (at most once a second), the final text sent
//! once through the outbox with the preview removed, also across a `kill -9` mid-stream; and
//! the command menu, admin commands only in the admins' chats.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const ADMIN: i64 = 42;
const CHAT: i64 = 7;
const WAIT: Duration = Duration::from_secs(30);

fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:prog-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn creds_dir() -> String {
    std::env::temp_dir().join(format!("gw-creds-progress-{}", std::process::id())).to_string_lossy().into_owned()
}

/// A reply of `words` words, streamed one word per `gap` by the fake provider.
fn slow_llm(words: usize, gap: Duration) -> (FakeLlm, String) {
    let text: Vec<String> = (1..=words).map(|i| format!("word{i}")).collect();
    let text = format!("{}.", text.join(" "));
    let llm = FakeLlm::start(Reply::text(&text)).expect("fake provider");
    llm.set_latency(Duration::ZERO, gap);
    (llm, text)
}

fn start(home: &TempHome, sw: &Sweeper, fake: &FakeTelegram, llm: &FakeLlm, tok: &str) -> Gateway {
    let config = format!(
        "drain_timeout_s = 10\n[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60\n\
         [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nadmins = [\"{ADMIN}\"]\n\
         poll_timeout_s = 2\n",
        llm.base_url(),
        fake.base_url()
    );
    write_config(home.path(), &config);
    let mut g =
        builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, tok).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn();
    g.wait_ready(READY);
    g
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(500), ..Options::default() }).expect("fake Bot API")
}

/// Texts the chat shows now.
fn on_screen(fake: &FakeTelegram, tok: &str) -> Vec<String> {
    fake.visible(tok).into_iter().filter(|m| m.chat_id == json!(CHAT)).map(|m| m.text).collect()
}

/// Typing while the run is in progress (refreshed), stopped after; a preview after 2 s, edited
/// as the reply grows, each edit a longer prefix of the reply and at most one a second; then
/// the final text once, and the preview gone. The menu: everyone's commands by default, the
/// admin commands only in the admin's chat. The run's tokens show per chat in `status --json`.
#[test]
fn a_streaming_run_types_previews_and_ends_with_the_final_text_once() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let (llm, text) = slow_llm(24, Duration::from_millis(250));
    let g = start(&home, &sw, &fake, &llm, &tok);
    wait_adapter(&home, "connected", READY);

    let names = |scope: &str| -> Vec<String> {
        let v = fake.commands(&tok, scope);
        v.as_array().into_iter().flatten().filter_map(|c| c["command"].as_str().map(str::to_owned)).collect()
    };
    assert!(wait_until(WAIT, || names(&format!("chat:{ADMIN}")).len() > names("default").len()), "menus");
    let everyone = names("default");
    assert!(everyone.iter().any(|c| c == "status") && everyone.iter().any(|c| c == "new"), "{everyone:?}");
    assert!(everyone.iter().any(|c| c == "help") && everyone.iter().any(|c| c == "cancel"), "{everyone:?}");
    assert!(
        !everyone.iter().any(|c| c == "restart" || c == "stop"),
        "admin commands in the default menu: {everyone:?}"
    );
    let admin = names(&format!("chat:{ADMIN}"));
    assert!(admin.iter().any(|c| c == "restart") && admin.iter().any(|c| c == "status"), "{admin:?}");
    assert_eq!(names(&format!("chat:{CHAT}")), Vec::<String>::new(), "no menu for a non-admin's chat");

    fake.inject(&tok, CHAT, 1, "tell me a story");
    let got = fake.wait_sent(&tok, WAIT, |s| s.iter().any(|m| m.text == text));
    let sent = got.unwrap_or_else(|s| panic!("no final reply: {s:#?}\n{}", g.diag()));
    let final_id = sent.iter().find(|m| m.text == text).map(|m| m.message_id).unwrap_or_default();
    assert!(
        wait_until(WAIT, || on_screen(&fake, &tok) == [text.clone()]),
        "left on screen: {:?}",
        on_screen(&fake, &tok)
    );

    // Typing: on from the start (before the preview and the reply), refreshed during the ~6 s run.
    let actions: Vec<_> = fake.actions(&tok).into_iter().filter(|a| a.chat_id == json!(CHAT)).collect();
    assert!(actions.len() >= 2, "typing refreshed during the run: {actions:#?}");
    assert!(actions.iter().all(|a| a.action == "typing"));
    // Stopped once the reply is sent: no new typing for the chat afterwards.
    let typed = fake.actions(&tok).len();
    assert!(holds_for(Duration::from_secs(5), || fake.actions(&tok).len() == typed).is_ok(), "typing went on");

    // The preview: one message, edited as the reply grows, never the final text.
    let previews: Vec<_> = sent.iter().filter(|m| m.chat_id == json!(CHAT) && m.message_id != final_id).collect();
    assert_eq!(previews.len(), 1, "one preview message: {sent:#?}");
    let edits: Vec<_> = fake.edits(&tok).into_iter().filter(|e| e.message_id == previews[0].message_id).collect();
    assert!(edits.len() >= 2, "the preview grows: {edits:#?}");
    let mut last = previews[0].text.len();
    for e in &edits {
        let shown = e.text.strip_suffix(" …").unwrap_or_else(|| panic!("a preview ends with ' …': {:?}", e.text));
        assert!(text.starts_with(shown) && shown.len() > last - 2, "each edit a longer prefix: {edits:#?}");
        last = e.text.len();
    }
    // At most one edit a second per chat, measured at the server: the margin is the transit
    // of the earlier call.
    for w in edits.windows(2) {
        let gap = w[1].at.duration_since(w[0].at);
        assert!(gap >= Duration::from_millis(800), "edits {gap:?} apart: {edits:#?}");
    }
    // The run's tokens, as the provider reported them, per chat in `status --json`.
    let out = run_cli(&home, &["status", "--json"]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let want = json!({"platform": "telegram", "chat_id": CHAT.to_string(), "runs": 1, "prompt_tokens": 7, "completion_tokens": 3});
    assert_eq!(v["agent"]["usage_by_chat"], json!([want]), "{}", out.stdout);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// `kill -9` while the reply is being previewed: the next incarnation re-runs the message once,
/// removes the preview the dead one left, and the chat ends with the final text once. The menu
/// is not set again when it is already right.
#[test]
fn a_kill_mid_stream_leaves_the_final_text_once() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let (llm, text) = slow_llm(40, Duration::from_millis(250));
    let mut g = start(&home, &sw, &fake, &llm, &tok);
    wait_adapter(&home, "connected", READY);
    assert!(wait_until(WAIT, || fake.command_sets(&tok).len() == 2), "{:?}", fake.command_sets(&tok));
    fake.inject(&tok, CHAT, 1, "a long one");
    let preview = fake.wait_sent(&tok, WAIT, |s| s.iter().any(|m| m.text.ends_with(" …")));
    let preview = preview.unwrap_or_else(|s| panic!("no preview: {s:#?}\n{}", g.diag()));
    assert!(wait_until(WAIT, || !fake.edits(&tok).is_empty()), "no edit before the kill");
    g.kill();
    assert_eq!(on_screen(&fake, &tok).len(), 1, "the dead incarnation's preview is on screen");

    let _g2 = start(&home, &sw, &fake, &llm, &tok);
    assert!(wait_until(WAIT, || on_screen(&fake, &tok) == [text.clone()]), "on screen: {:?}", on_screen(&fake, &tok));
    let finals = fake.sent(&tok).iter().filter(|m| m.text == text).count();
    assert_eq!(finals, 1, "the final text once: {:#?}", fake.sent(&tok));
    assert!(
        !fake.visible(&tok).iter().any(|m| preview.iter().any(|p| p.message_id == m.message_id && p.text != text)),
        "the first preview was removed"
    );
    assert_eq!(llm.requests(), 2, "run once by each incarnation");
    assert_eq!(fake.command_sets(&tok).len(), 2, "the menu was right already: not set again");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}
