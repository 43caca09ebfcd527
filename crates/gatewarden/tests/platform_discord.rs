//! Issue 20: the Discord adapter in real gateway processes against the in-repo fake Discord
//! (crates/discord-fake: Gateway v10 and REST). Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_discord_fake::{FakeDiscord, Options, Route, SentMessage};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_DISCORD_TOKEN";
const ADMIN: &str = "42";
const REPLY: Duration = Duration::from_secs(15);

/// A token no other test uses (the credential lock is keyed by it).
fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("discord.{}.{:04}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A fake for `token`, heartbeats every 500 ms (so heartbeats happen in every test), and a
/// channel bucket roomy enough for a steady stream's replies in one channel (the default, 5
/// per 5 s, would make the replies, not the restarts, the bottleneck).
fn fake(token: &str) -> FakeDiscord {
    let opts = Options {
        token: token.to_owned(),
        heartbeat_interval: Duration::from_millis(500),
        bucket_limit: 100,
        bucket_window: Duration::from_secs(1),
        ..Options::default()
    };
    FakeDiscord::start(opts).expect("fake Discord")
}

fn config(fake: &FakeDiscord, agent: &str, extra: &str) -> String {
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    format!(
        "drain_timeout_s = 10\n[agent]\n{backend}\n{agent}\n\
         [[platform]]\nkind = \"discord\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nadmins = [\"{ADMIN}\"]\n\
         conflict_standby_s = 2\n{extra}",
        fake.api_base()
    )
}

fn spawn(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    write_config(home.path(), config);
    builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, token).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn()
}

/// A ready gateway whose adapter is connected: Discord delivers only to a live session, so a
/// message sent before the first IDENTIFY would reach nobody (as on Discord).
fn start_gw(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    let mut g = spawn(home, sw, token, config);
    g.wait_ready(READY);
    if !config.contains("message_content") {
        wait_until(READY, || platforms(home)[0]["state"] != "connecting");
    }
    g
}

fn count(sent: &[SentMessage], channel: &str, text: &str) -> usize {
    sent.iter().filter(|m| m.channel_id == channel && m.content == text).count()
}

#[track_caller]
fn wait_reply(fake: &FakeDiscord, channel: &str, pred: impl Fn(&str) -> bool) -> String {
    let got = fake.wait_sent(REPLY, |s| s.iter().any(|m| m.channel_id == channel && pred(&m.content)));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply in channel {channel} within {REPLY:?}; sent: {s:#?}"));
    sent.into_iter().rev().find(|m| m.channel_id == channel && pred(&m.content)).map(|m| m.content).unwrap_or_default()
}

/// Round trip through the echo agent; /status and /new; a non-admin's /restart is refused;
/// an admin's /restart is answered, and the successor RESUMEs (no second IDENTIFY) and says
/// "back online" once; status and /metrics show the adapter.
#[test]
fn round_trip_commands_and_restart_resumes() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    fake.message("7", ADMIN, "hello there");
    wait_reply(&fake, "7", |t| t == "hello there");
    fake.message("7", ADMIN, "/status");
    assert!(wait_reply(&fake, "7", |t| t.contains("incarnation")).contains("running"));
    fake.message("7", ADMIN, "/new");
    wait_reply(&fake, "7", |t| t.starts_with("new conversation"));

    wait_adapter(&home, "connected", READY);
    let p = platforms(&home);
    assert_eq!((p[0]["name"].as_str(), p[0]["kind"].as_str()), (Some("discord"), Some("discord")), "{p}");
    assert!(p[0]["received"].as_u64() >= Some(3) && p[0]["lag_s"].is_number(), "{p}");
    let metrics = http_get(g.listen(), "/metrics", Duration::from_secs(5)).unwrap().text();
    assert!(
        metrics.contains("gatewarden_platform_state{platform=\"discord\",kind=\"discord\",state=\"connected\"} 1"),
        "{metrics}"
    );

    fake.message("8", "99", "/restart");
    assert!(wait_reply(&fake, "8", |t| t.contains("admins")).contains("/restart"));
    assert!(g.alive(), "a non-admin's /restart must not restart");

    let old = g.pid();
    fake.message("7", ADMIN, "/restart");
    wait_reply(&fake, "7", |t| t == "restarting…");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "chat /restart (unsupervised: successor started)");
    let (_, inc2, _) = wait_new_ready(home.path(), &[old], READY).expect("successor ready");
    let notice = wait_reply(&fake, "7", |t| t.contains("back online"));
    assert!(notice.contains(&inc2), "{notice}");
    fake.message("7", ADMIN, "after the restart");
    wait_reply(&fake, "7", |t| t == "after the restart");
    let sent = fake.sent();
    for text in ["hello there", "restarting…", "after the restart", notice.as_str()] {
        assert_eq!(count(&sent, "7", text), 1, "{text:?} sent once: {sent:#?}");
    }
    let st = fake.stats();
    assert_eq!(st.identifies, 1, "the successor resumed the session: {st:?}");
    assert!(st.resumed >= 1, "{st:?}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Mid-conversation restart: a run is in flight and more messages arrive during the drain.
/// Every message is answered exactly once, the later ones by the successor after its RESUME.
#[test]
fn restart_mid_conversation_loses_and_repeats_nothing() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let g = start_gw(&home, &sw, &tok, &config(&fake, "delay_ms = 1500", ""));
    fake.message("5", "1", "m1");
    wait_active(g.listen(), 1);
    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
    wait_until(Duration::from_secs(5), || home.state().as_deref() == Some("draining"));
    fake.message("5", "1", "m2");
    fake.message("5", "1", "m3");
    assert_cli(&restart.join().unwrap(), 0, "restart");
    for m in ["m1", "m2", "m3"] {
        wait_reply(&fake, "5", |t| t == m);
    }
    let quiet = holds_for(Duration::from_millis(500), || fake.sent().len() == 3);
    assert!(quiet.is_ok(), "duplicates: {:#?}", fake.sent());
    assert_eq!(fake.stats().identifies, 1);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// The fake dies and comes back: degraded in between, then connected; the message sent
/// meanwhile is replayed by the RESUME and answered once.
#[test]
fn discord_killed_and_revived() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&home, "connected", READY);
    fake.kill();
    wait_adapter(&home, "degraded", Duration::from_secs(15));
    assert!(serving(&mut g), "a degraded adapter never stops the gateway");
    fake.message("9", "1", "sent while Discord was down");
    fake.revive().unwrap();
    wait_reply(&fake, "9", |t| t == "sent while Discord was down");
    wait_adapter(&home, "connected", Duration::from_secs(10));
    assert!(home.events("platform_state").iter().any(|e| e["state"] == "degraded"), "{}", home.ledger_text());
    assert_eq!(count(&fake.sent(), "9", "sent while Discord was down"), 1);
    stop_cleanly(&home, &mut g);
}

/// kill -9 while the agent runs: the next incarnation RESUMEs from the saved `seq` (the
/// message is replayed and deduplicated) and the journal's run answers it exactly once.
#[test]
fn kill_9_mid_run_is_answered_once_by_the_next_incarnation() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let cfg = config(&fake, "delay_ms = 1000", "");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    fake.message("3", "1", "survive me");
    wait_active(g.listen(), 1);
    g.kill();
    // Sent while no gateway ran: replayed by the successor's RESUME.
    fake.message("3", "1", "while dead");
    assert!(fake.sent().is_empty());
    let mut g2 = start_gw(&home, &sw, &tok, &cfg);
    wait_reply(&fake, "3", |t| t == "survive me");
    wait_reply(&fake, "3", |t| t == "while dead");
    let quiet = holds_for(Duration::from_millis(1500), || fake.sent().len() == 2);
    assert!(quiet.is_ok(), "answered more than once: {:#?}", fake.sent());
    assert_eq!(fake.stats().identifies, 1, "resumed after the kill -9: {:?}", fake.stats());
    stop_cleanly(&home, &mut g2);
}

/// Two homes with the same token: the second gateway exits 78 naming the holder's home and pid
/// (Discord itself would deliver every event to both); once the holder is gone it starts.
#[test]
fn two_homes_same_token() {
    let (a, b, sw, tok) = (TempHome::new(), TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let mut ga = start_gw(&a, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&a, "connected", READY);
    let mut gb = spawn(&b, &sw, &tok, &config(&fake, "", ""));
    refused_naming_the_holder(&mut gb, &a, &ga, "second gateway with the same (only) token");
    assert_eq!(fake.stats().identifies, 1, "the refused gateway never connected");
    fake.message("11", "1", "who answers");
    wait_reply(&fake, "11", |t| t == "who answers");
    assert!(holds_for(Duration::from_millis(500), || fake.sent().len() == 1).is_ok());
    stop_cleanly(&a, &mut ga);
    let mut gb2 = start_gw(&b, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&b, "connected", READY);
    stop_cleanly(&b, &mut gb2);
}

/// The privileged message-content intent not enabled for the bot: the adapter parks, naming
/// 4014 and what to enable; the gateway keeps serving.
#[test]
fn disallowed_intents_park_the_adapter_saying_why() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let opts = Options { token: tok.clone(), message_content_enabled: false, ..Options::default() };
    let fake = FakeDiscord::start(opts).unwrap();
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    let p = wait_adapter(&home, "parked", READY);
    assert!(p[0]["reason"].as_str().is_some_and(|r| r.contains("4014") && r.contains("Message Content Intent")), "{p}");
    assert!(serving(&mut g));
    stop_cleanly(&home, &mut g);
}

/// 10 restarts in CI (GW_PLATFORM_RESTARTS for more) under a steady inbound stream: every
/// message answered, none twice; every successor RESUMEs. Prints and replays its seed
/// (GW_PLATFORM_SEED).
#[test]
fn restarts_under_a_steady_stream_lose_and_repeat_nothing() {
    let (restarts, seed) = soak::soak_params(10);
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = Arc::new(fake(&tok));
    let _g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    let stream =
        { soak::steady_stream(seed, 10, 40, Arc::clone(&fake), |fake, n| fake.message("1", "1", &format!("msg {n}"))) };
    let t0 = Instant::now();
    soak::restart_times(&home, &sw, restarts);
    let (total, _) = stream.stop();
    eprintln!("{restarts} restarts in {:?}, {total} messages", t0.elapsed());
    let sent = fake.wait_sent(Duration::from_secs(30), |s| s.len() >= total as usize).unwrap_or_else(|s| s);
    let (lost, dup) = soak::lost_and_duplicated(total, sent.iter().map(|m| m.content.as_str()));
    let st = fake.stats();
    assert!(
        lost.is_empty() && dup.is_empty(),
        "seed {seed}: {} lost (first {:?}), duplicated {dup:?}; {st:?}; {}; other replies: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)],
        platforms(&home),
        sent.iter().filter(|m| !m.content.starts_with("msg ")).take(5).collect::<Vec<_>>(),
    );
    assert!(holds_for(Duration::from_millis(500), || fake.sent().len() == total as usize).is_ok());
    assert_eq!(st.identifies, 1, "every successor resumed: {st:?}");
    assert!(st.resumed >= u64::from(restarts), "{st:?}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Issue 20, typing and progress through the real binary: `backend = "openai"` against the
/// streaming fake provider (16 words, one per 250 ms). The channel shows typing from the start,
/// a preview message edited as the reply grows, then the final text as its own message, once,
/// and the preview deleted.
#[test]
fn a_streaming_run_types_previews_and_ends_with_the_final_text_once() {
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let fake = fake(&tok);
    let words: Vec<String> = (1..=16).map(|i| format!("word{i}")).collect();
    let text = format!("{}.", words.join(" "));
    let llm = FakeLlm::start(Reply::text(&text)).expect("fake provider");
    llm.set_latency(Duration::ZERO, Duration::from_millis(250));
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    let _g = start_gw(&home, &sw, &tok, &config(&fake, &agent, ""));
    fake.message("7", ADMIN, "tell me a story");
    wait_reply(&fake, "7", |t| t == text);
    let on_screen = || -> Vec<String> {
        fake.sent().into_iter().filter(|m| m.channel_id == "7" && !m.deleted).map(|m| m.content).collect()
    };
    assert!(wait_until(REPLY, || on_screen() == [text.clone()]), "left on screen: {:?}", on_screen());

    let calls: Vec<_> = fake.calls().into_iter().filter(|c| c.channel == "7" && c.status < 300).collect();
    let final_at = calls.iter().position(|c| c.content.as_deref() == Some(text.as_str())).expect("the reply");
    let first_typing = calls.iter().position(|c| c.route == Route::Typing).expect("typing");
    let preview = calls
        .iter()
        .position(|c| c.route == Route::CreateMessage && c.content.as_deref().is_some_and(|t| t.ends_with(" …")))
        .unwrap_or_else(|| panic!("no preview: {calls:#?}"));
    assert!(first_typing < preview && preview < final_at, "typing, preview, reply: {calls:#?}");
    let id = calls[preview].message.clone();
    let edits = calls.iter().filter(|c| c.route == Route::EditMessage && c.message == id).count();
    assert!(edits >= 1, "the preview grows: {calls:#?}");
    let deleted = calls.iter().position(|c| c.route == Route::DeleteMessage && c.message == id);
    assert!(deleted.is_some_and(|d| d > final_at), "deleted after the reply: {calls:#?}");
    assert_eq!(count(&fake.sent(), "7", &text), 1, "the final text once");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Closed by default on Discord (issue 37): a stranger's direct message gets a pairing code and
/// the provider sees nothing; approved, the next one reaches the agent. In a guild channel
/// allowed_chats names, a message without a mention starts no run; a mention or a reply to the
/// bot does; a stranger there gets no code.
#[test]
fn a_stranger_pairs_and_a_guild_needs_a_mention() {
    let tok = token();
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), fake(&tok));
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"", llm.base_url());
    let cfg = config(&fake, &agent, "allowed_chats = [\"500\"]\n")
        .replace("access = \"open\"\nrequire_mention = false\n", "");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    fake.message("600", "7", "a stranger's secret");
    let reply = wait_reply(&fake, "600", |t| t.contains("pairing code"));
    assert!(reply.contains("gatewarden pairing approve discord "), "{reply}");
    let code: String = reply.split("pairing code is ").nth(1).unwrap_or_default().chars().take(8).collect();

    fake.guild_message("1", "500", ADMIN, "no mention", false, None);
    fake.guild_message("1", "500", "7", "a stranger in the guild", true, None);
    fake.guild_message("1", "500", ADMIN, "mentioned", true, None);
    let answer = wait_reply(&fake, "500", |t| t.starts_with("echo:"));
    let id = fake.sent().into_iter().find(|m| m.content == answer).map(|m| m.id).unwrap();
    fake.guild_message("1", "500", ADMIN, "a reply", false, Some(&id));
    wait_reply(&fake, "500", |t| t == "echo: a reply");
    let quiet = holds_for(Duration::from_millis(1500), || llm.requests() == 2);
    assert!(quiet.is_ok(), "only the mention and the reply ran ({} requests)", llm.requests());
    assert!(fake.sent().iter().filter(|m| m.channel_id == "500").all(|m| !m.content.contains("pairing")));

    assert_cli(&run_cli(&home, &["pairing", "approve", "discord", &code]), 0, "pairing approve");
    fake.message("600", "7", "approved now");
    wait_reply(&fake, "600", |t| t == "echo: approved now");
    assert_eq!(llm.requests(), 3);
    stop_cleanly(&home, &mut g);
}
