//! Issue 10: the Telegram adapter in real gateway processes against the in-repo fake Bot API
//! (crates/telegram-fake). Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_lifecycle::desired;
use gatewarden_telegram_fake::{FakeTelegram, Options, SentMessage};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const ADMIN: i64 = 42;
const REPLY: Duration = Duration::from_secs(15);

/// A token no other test uses (the credential lock is keyed by it).
fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:tok-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).expect("fake Bot API")
}

fn config(fake: &FakeTelegram, agent: &str, extra: &str) -> String {
    config_at(&fake.base_url(), agent, extra)
}

/// [`config`] with the Bot API at `api_base` (the fake behind a TLS front).
fn config_at(api_base: &str, agent: &str, extra: &str) -> String {
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    format!(
        "drain_timeout_s = 10\n[agent]\n{backend}\n{agent}\n\
         [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{api_base}\"\nadmins = [\"{ADMIN}\"]\n\
         poll_timeout_s = 2\nconflict_standby_s = 2\n{extra}"
    )
}

fn spawn(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    write_config(home.path(), config);
    builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, token).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn()
}

fn start_gw(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
    let mut g = spawn(home, sw, token, config);
    g.wait_ready(READY);
    g
}

fn count(sent: &[SentMessage], chat: i64, text: &str) -> usize {
    sent.iter().filter(|m| m.chat_id == json!(chat) && m.text == text).count()
}

#[track_caller]
fn wait_reply(fake: &FakeTelegram, token: &str, chat: i64, pred: impl Fn(&str) -> bool) -> String {
    let got = fake.wait_sent(token, REPLY, |s| s.iter().any(|m| m.chat_id == json!(chat) && pred(&m.text)));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply in chat {chat} within {REPLY:?}; sent: {s:#?}"));
    sent.into_iter().rev().find(|m| m.chat_id == json!(chat) && pred(&m.text)).map(|m| m.text).unwrap_or_default()
}

/// Round trip through the echo agent; /status, /help and /new; a non-admin's /restart is
/// refused; an admin's /restart is answered, the successor says "back online" in that same
/// chat, once; status and /metrics show the adapter.
#[test]
fn round_trip_commands_and_restart_notice() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    fake.inject(&tok, 7, ADMIN, "hello there");
    wait_reply(&fake, &tok, 7, |t| t == "hello there");
    fake.inject(&tok, 7, ADMIN, "/status");
    assert!(wait_reply(&fake, &tok, 7, |t| t.contains("incarnation")).contains("running"));
    fake.inject(&tok, 7, ADMIN, "/help");
    assert!(wait_reply(&fake, &tok, 7, |t| t.starts_with("commands:")).contains("/new"));

    wait_adapter(&home, "connected", READY);
    let p = platforms(&home);
    assert_eq!((p[0]["name"].as_str(), p[0]["kind"].as_str()), (Some("telegram"), Some("telegram")), "{p}");
    assert!(p[0]["last_progress"].is_string() && p[0]["received"].as_u64() >= Some(3), "{p}");
    let human = run_cli(&home, &["status"]).stdout;
    assert!(human.contains("platform:    telegram (telegram) connected"), "{human}");
    let metrics = http_get(g.listen(), "/metrics", Duration::from_secs(5)).unwrap().text();
    assert!(
        metrics.contains("gatewarden_platform_state{platform=\"telegram\",kind=\"telegram\",state=\"connected\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("gatewarden_platform_outbox{platform=\"telegram\",state=\"sent\"}"), "{metrics}");

    fake.inject(&tok, 8, 99, "/restart");
    assert!(wait_reply(&fake, &tok, 8, |t| t.contains("admins")).contains("/restart"));
    assert!(g.alive(), "a non-admin's /restart must not restart");

    let old = g.pid();
    fake.inject(&tok, 7, ADMIN, "/restart");
    wait_reply(&fake, &tok, 7, |t| t == "restarting…");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "chat /restart (unsupervised: successor started)");
    let (_, inc2, _) = wait_new_ready(home.path(), &[old], READY).expect("successor ready");
    let notice = wait_reply(&fake, &tok, 7, |t| t.contains("back online"));
    assert!(notice.contains(&inc2), "the notice names the new incarnation {inc2}: {notice}");
    fake.inject(&tok, 7, ADMIN, "after the restart");
    wait_reply(&fake, &tok, 7, |t| t == "after the restart");
    let sent = fake.sent(&tok);
    for text in ["hello there", "restarting…", "after the restart", notice.as_str()] {
        assert_eq!(count(&sent, 7, text), 1, "{text:?} sent once: {sent:#?}");
    }
    assert_eq!(count(&sent, 8, "back online"), 0);
    let out = run_cli(&home, &["stop"]);
    assert_cli(&out, 0, "stop");
}

/// Issue 27 §1, the chat route: an admin's `/restart` while config.toml does not load. The chat
/// is answered "restarting…", then told why the restart was refused (the file, line and key);
/// the gateway keeps its incarnation and its poll (messages after it are answered by it), the
/// ledger says `restart_refused` with the chat as requester, and an HTTP client calling
/// throughout got every answer from the same incarnation. No "back online" follows.
#[test]
fn a_chat_restart_with_a_config_that_does_not_load_is_refused_in_the_chat() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let good = config(&fake, "", "");
    let mut g = start_gw(&home, &sw, &tok, &good);
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    wait_adapter(&home, "connected", READY);
    let caller = gatewarden_testkit::api::Caller::start(Api::new(g.listen()));
    write_config(home.path(), &format!("bogus_key = 1\n{good}"));

    fake.inject(&tok, 7, ADMIN, "/restart");
    wait_reply(&fake, &tok, 7, |t| t == "restarting…");
    let why = wait_reply(&fake, &tok, 7, |t| t.starts_with("restart refused"));
    assert!(why.contains("config.toml:1: unknown key 'bogus_key'") && why.contains(&inc), "{why}");
    let refused = wait_events(&home, "restart_refused", 1, READY);
    assert_eq!(refused[0]["requester"]["channel"], json!("chat"), "{}", refused[0]);
    assert!(refused[0]["requester"]["argv"].to_string().contains("chat:7"), "{}", refused[0]);

    fake.inject(&tok, 7, ADMIN, "still here?");
    wait_reply(&fake, &tok, 7, |t| t == "still here?");
    caller.finish().assert_only(&inc, "during the refused chat restart");
    assert!(g.alive(), "{}", g.diag());
    for e in ["drained", "exited", "restart_backstop"] {
        assert!(home.events(e).is_empty(), "{e}: the refused restart touched the gateway:\n{}", home.ledger_text());
    }
    let sent = fake.sent(&tok);
    assert_eq!(count(&sent, 7, "restarting…"), 1, "{sent:#?}");
    assert!(!sent.iter().any(|m| m.text.contains("back online")), "{sent:#?}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Mid-conversation restart: a run is in flight and more messages arrive during the drain.
/// Every message is answered exactly once (the later ones by the successor), and the old poll
/// was ended by its owner, so the successor's first poll meets no 409.
#[test]
fn restart_mid_conversation_loses_and_repeats_nothing() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let g = start_gw(&home, &sw, &tok, &config(&fake, "delay_ms = 1500", ""));
    fake.inject(&tok, 5, 1, "m1");
    wait_active(g.listen(), 1);
    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
    wait_until(Duration::from_secs(5), || home.state().as_deref() == Some("draining"));
    fake.inject(&tok, 5, 1, "m2");
    fake.inject(&tok, 5, 1, "m3");
    let out = restart.join().unwrap();
    assert_cli(&out, 0, "restart");
    for m in ["m1", "m2", "m3"] {
        wait_reply(&fake, &tok, 5, |t| t == m);
    }
    let quiet = holds_for(Duration::from_millis(500), || fake.sent(&tok).len() == 3);
    assert!(quiet.is_ok(), "duplicates: {:#?}", fake.sent(&tok));
    let p = platforms(&home);
    assert_eq!(p[0]["conflicts"], json!(0), "the successor met a 409: {p}");
    assert_eq!(p[0]["state"], json!("connected"), "{p}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Issue 21, cancel drain: a restart's drain cancelled while a chat's run holds it. The adapter,
/// whose intake the drain stopped first, is started again by the same incarnation: the held
/// run's reply, a message sent during the drain and one sent after the cancel are each
/// answered once, and nothing else started.
#[test]
fn a_cancelled_restart_drain_restarts_the_adapter_and_loses_nothing() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let gate = home.scratch("gate", "");
    let g = start_gw(&home, &sw, &tok, &config(&fake, &gated_exec_agent(&gate), ""));
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    fake.inject(&tok, 5, 1, "m1");
    wait_active(g.listen(), 1);
    assert_cli(&cli_tagged(&home, &sw, &["send", "/restart"], READY), 0, "send /restart");
    wait_state(&home, "draining", READY);
    fake.inject(&tok, 5, 1, "m2");
    cancel_keeps(&home, &inc, |a| run_cli(&home, a));
    wait_adapter(&home, "connected", READY);
    std::fs::write(&gate, b"").unwrap();
    fake.inject(&tok, 5, 1, "m3");
    for m in ["m1", "m2", "m3"] {
        wait_reply(&fake, &tok, 5, |t| t == m);
    }
    let quiet = holds_for(Duration::from_millis(500), || fake.sent(&tok).len() == 3);
    assert!(quiet.is_ok(), "duplicates: {:#?}", fake.sent(&tok));
    assert_eq!(home.events("started").len(), 1, "nothing else started:\n{}", home.ledger_text());
    assert_eq!(run_cli(&home, &["status", "--json"]).json()["incarnation"].as_str(), Some(inc.as_str()));
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Issue 27 §2: SIGHUP and `gatewarden reload` change `[[platform]] admins` (a chat command
/// refused, then allowed, then refused again) and `allowed_chats` (the adapter restarted in
/// place on its credential lock, no 409) in the running incarnation.
#[test]
fn sighup_and_reload_change_admins_and_allowed_chats_in_place() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let cfg = |admins: &str, allowed: &str| {
        config(&fake, "", &format!("allowed_chats = [{allowed}]\n"))
            .replace(&format!("admins = [\"{ADMIN}\"]"), &format!("admins = [{admins}]"))
    };
    let mut g = start_gw(&home, &sw, &tok, &cfg("\"42\"", "\"7\""));
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let refused = |n: usize| {
        fake.inject(&tok, 7, 99, "/update");
        fake.wait_sent(&tok, REPLY, |s| {
            s.iter().filter(|m| m.chat_id == json!(7) && m.text.contains("admins")).count() >= n
        })
        .unwrap_or_else(|s| panic!("/update of a non-admin not refused ({n}); sent: {s:#?}"));
    };
    refused(1);
    // allowed_chats governs groups (README "Access"): 8 is a group not yet allowed.
    fake.inject_group(&tok, 8, 1, "outside", None);
    fake.inject_group(&tok, 7, 1, "inside", None);
    wait_reply(&fake, &tok, 7, |t| t == "inside");
    assert!(holds_for(Duration::from_millis(500), || count(&fake.sent(&tok), 8, "outside") == 0).is_ok());

    write_config(home.path(), &cfg("\"42\", \"99\"", "\"7\", \"8\""));
    let before = home.events("reload").len();
    g.signal(sig::SIGHUP);
    let ev = wait_events(&home, "reload", before + 1, READY).swap_remove(before);
    assert_eq!(ev["changed"], json!(["platform[telegram].admins", "platform[telegram].allowed_chats"]), "{ev}");
    assert_eq!(ev["adapters_restarted"], json!(["telegram"]), "{ev}");
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 7, 99, "/update");
    assert!(wait_reply(&fake, &tok, 7, |t| t.contains("no release to install")).contains("[update] source"));
    fake.inject_group(&tok, 8, 1, "now served", None);
    wait_reply(&fake, &tok, 8, |t| t == "now served");

    write_config(home.path(), &cfg("\"42\"", "\"7\", \"8\""));
    let out = run_cli(&home, &["reload"]);
    assert_cli(&out, 0, "reload");
    assert!(out.stdout.contains("applied platform[telegram].admins"), "{out:#?}");
    let ev = home.events("reload").pop().expect("reload");
    assert_eq!(ev["adapters_restarted"], json!([]), "admins alone restart no adapter: {ev}");
    refused(2);

    assert_eq!(run_cli(&home, &["status", "--json"]).json()["incarnation"].as_str(), Some(inc.as_str()));
    assert_eq!(home.events("started").len(), 1, "{}", home.ledger_text());
    assert_eq!(platforms(&home)[0]["conflicts"], json!(0), "the restarted adapter met a 409");
    stop_cleanly(&home, &mut g);
}

/// The Bot API dies and comes back: degraded in between, then connected, and the message sent
/// meanwhile is answered once.
#[test]
fn bot_api_killed_and_revived() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&home, "connected", READY);
    fake.kill();
    wait_adapter(&home, "degraded", Duration::from_secs(15));
    assert!(serving(&mut g), "a degraded adapter never stops the gateway");
    fake.inject(&tok, 9, 1, "sent while the API was down");
    fake.revive().unwrap();
    wait_reply(&fake, &tok, 9, |t| t == "sent while the API was down");
    wait_adapter(&home, "connected", Duration::from_secs(10));
    assert!(home.events("platform_state").iter().any(|e| e["state"] == "degraded"), "{}", home.ledger_text());
    assert_eq!(count(&fake.sent(&tok), 9, "sent while the API was down"), 1);
    stop_cleanly(&home, &mut g);
}

/// kill -9 while the agent runs: the next incarnation answers the message exactly once (the
/// journal re-runs it; the redelivered update is deduplicated).
#[test]
fn kill_9_mid_run_is_answered_once_by_the_next_incarnation() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let cfg = config(&fake, "delay_ms = 1000", "");
    let mut g = start_gw(&home, &sw, &tok, &cfg);
    fake.inject(&tok, 3, 1, "survive me");
    wait_active(g.listen(), 1);
    g.kill();
    assert!(fake.sent(&tok).is_empty());
    let mut g2 = start_gw(&home, &sw, &tok, &cfg);
    wait_reply(&fake, &tok, 3, |t| t == "survive me");
    let quiet = holds_for(Duration::from_millis(1500), || fake.sent(&tok).len() == 1);
    assert!(quiet.is_ok(), "answered more than once: {:#?}", fake.sent(&tok));
    stop_cleanly(&home, &mut g2);
}

/// Two homes with the same token: the second gateway exits 78 naming the holder's home and pid;
/// with a second adapter it runs and parks the shared one, and status says why.
#[test]
fn two_homes_same_token() {
    let (a, b, c, sw, fake, tok) = (TempHome::new(), TempHome::new(), TempHome::new(), Sweeper::new(), fake(), token());
    let mut ga = start_gw(&a, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&a, "connected", READY);

    let mut gb = spawn(&b, &sw, &tok, &config(&fake, "", ""));
    refused_naming_the_holder(&mut gb, &a, &ga, "second gateway with the same (only) token");

    let other = token();
    let two = format!(
        "{}\n[[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\nname = \"second\"\ntoken_env = \"GW_OTHER_TOKEN\"\napi_base = \"{}\"\n",
        config(&fake, "", ""),
        fake.base_url()
    );
    write_config(c.path(), &two);
    let mut gc = builder(&c)
        .env(TAG_VAR, sw.tag())
        .env(TOKEN_ENV, &tok)
        .env("GW_OTHER_TOKEN", &other)
        .env("GATEWARDEN_CREDS_DIR", creds_dir())
        .spawn();
    gc.wait_ready(READY);
    let p = platforms(&c);
    assert_eq!(p[0]["state"], json!("parked"), "{p}");
    assert!(p[0]["reason"].as_str().is_some_and(|r| r.contains(&ga.pid().to_string())), "{p}");
    wait_until(READY, || platforms(&c)[1]["state"] == "connected");
    assert_eq!(platforms(&c)[1]["state"], json!("connected"));
    // Only the holder answers.
    fake.inject(&tok, 11, 1, "who answers");
    wait_reply(&fake, &tok, 11, |t| t == "who answers");
    assert!(holds_for(Duration::from_millis(500), || fake.sent(&tok).len() == 1).is_ok());
    stop_cleanly(&c, &mut gc);
    stop_cleanly(&a, &mut ga);
    // A dead holder never blocks: B starts now.
    let mut gb2 = start_gw(&b, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&b, "connected", READY);
    stop_cleanly(&b, &mut gb2);
}

/// An outside poller with the same token makes the adapter stand by ("another consumer is
/// active") without fighting or dropping updates; once it goes, the adapter takes over.
#[test]
fn outside_poller_means_standby_then_recovery() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, "", ""));
    wait_adapter(&home, "connected", READY);
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, url) = (Arc::clone(&stop), format!("{}/bot{tok}/getUpdates?timeout=1", fake.base_url()));
        let addr = fake.addr();
        std::thread::spawn(move || {
            let path = url.trim_start_matches(&format!("http://{addr}")).to_owned();
            while !stop.load(Ordering::Relaxed) {
                let _ = http_get(addr, &path, Duration::from_secs(5));
            }
        })
    };
    wait_adapter(&home, "standby", Duration::from_secs(20));
    let p = platforms(&home);
    assert!(p[0]["reason"].as_str().is_some_and(|r| r.contains("another consumer is active")), "{p}");
    fake.inject(&tok, 4, 1, "queued during the conflict");
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    wait_reply(&fake, &tok, 4, |t| t == "queued during the conflict");
    wait_adapter(&home, "connected", Duration::from_secs(10));
    stop_cleanly(&home, &mut g);
}

/// 15 restarts in CI, 50 in scripts/soak-platforms (GW_PLATFORM_RESTARTS), under a steady inbound stream: every message answered,
/// none twice. Prints and replays its seed (GW_PLATFORM_SEED) for the stream's pacing.
#[test]
fn restarts_under_a_steady_stream_lose_and_repeat_nothing() {
    let fake = Arc::new(fake());
    steady_stream_under_restarts(&fake, &fake.base_url(), "", 15);
}

/// The same over TLS (issue 16): the fake behind a TLS front with a test CA's certificate,
/// reached with `ca_file`; every incarnation handshakes. 5 restarts in CI (each is a new TLS
/// session, the plain test above covers the restart logic at length), GW_PLATFORM_RESTARTS
/// in scripts/soak-platforms.
#[test]
fn restarts_under_a_steady_stream_lose_and_repeat_nothing_over_tls() {
    use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let fake = Arc::new(fake());
    let front = TlsFront::start(fake.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let base = format!("https://localhost:{}", front.addr().port());
    let extra = format!("ca_file = \"{}\"\n", ca_file.to_string_lossy().replace('\\', "\\\\"));
    let restarts = steady_stream_under_restarts(&fake, &base, &extra, 5);
    assert!(front.handshakes() > u64::from(restarts), "{} handshakes for {restarts} restarts", front.handshakes());
}

/// A gateway with a Telegram adapter at `api_base` (`extra` in its table), restarted
/// `GW_PLATFORM_RESTARTS` times (else `default_restarts`) under a steady inbound stream:
/// every message answered, none twice. Returns the number of restarts.
fn steady_stream_under_restarts(fake: &Arc<FakeTelegram>, api_base: &str, extra: &str, default_restarts: u32) -> u32 {
    let (restarts, seed) = soak::soak_params(default_restarts);
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let _g = start_gw(&home, &sw, &tok, &config_at(api_base, "", extra));
    let stream = {
        let sender = (Arc::clone(fake), tok.clone());
        soak::steady_stream(seed, 10, 40, sender, |(fake, tok), n| fake.inject(tok, 1, 1, &format!("msg {n}")))
    };
    let t0 = Instant::now();
    soak::restart_times(&home, &sw, restarts);
    let (total, _) = stream.stop();
    let st = fake.stats(&tok);
    eprintln!(
        "{restarts} restarts in {:?}, {total} messages, longest polling gap {} ms",
        t0.elapsed(),
        st.max_poll_gap_ms
    );
    let done = fake.wait_sent(&tok, Duration::from_secs(30), |s| s.len() >= total as usize);
    let sent = done.unwrap_or_else(|s| s);
    let (lost, dup) = soak::lost_and_duplicated(total, sent.iter().map(|m| m.text.as_str()));
    assert!(lost.is_empty() && dup.is_empty(), "seed {seed}: lost {lost:?}, duplicated {dup:?}");
    assert!(holds_for(Duration::from_millis(500), || fake.sent(&tok).len() == total as usize).is_ok());
    let out = run_cli(&home, &["stop"]);
    assert_cli(&out, 0, "stop");
    restarts
}

/// Conversations: each run gets its chat's earlier turns (exec: a JSON file named by
/// GATEWARDEN_HISTORY_FILE), per chat, across a restart; `/new` starts afresh.
/// `/v1/chat/completions` passes the caller's whole `messages` array through.
#[test]
fn conversations_remember_per_chat_across_restarts_and_new_forgets() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let agent = "backend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"cat \\\"$GATEWARDEN_HISTORY_FILE\\\"\"]\nhistory_turns = 2";
    let g = start_gw(&home, &sw, &tok, &config(&fake, agent, ""));
    let history = |chat: i64, text: &str| -> Value {
        let before = fake.sent(&tok).len();
        fake.inject(&tok, chat, 1, text);
        let sent = fake
            .wait_sent(&tok, REPLY, |s| s.len() > before)
            .unwrap_or_else(|s| panic!("no reply to {text:?}: {s:#?}"));
        let reply = &sent[before].text;
        serde_json::from_str(reply).unwrap_or_else(|e| panic!("reply to {text:?} is not JSON ({e}): {reply}"))
    };
    assert_eq!(history(1, "one"), json!([]));
    let h = history(1, "two");
    assert_eq!(h, json!([{"role": "user", "content": "one"}, {"role": "assistant", "content": "[]"}]));
    assert_eq!(history(2, "elsewhere"), json!([]), "another chat has its own conversation");

    // Sessions survive a restart.
    let old = g.pid();
    assert_cli(&cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40)), 0, "restart");
    wait_new_ready(home.path(), &[old], READY).expect("successor");
    let h = history(1, "three");
    let users: Vec<&str> =
        h.as_array().unwrap().iter().filter(|t| t["role"] == "user").filter_map(|t| t["content"].as_str()).collect();
    assert_eq!(users, vec!["one", "two"], "history_turns = 2 keeps the last two turns: {h}");

    fake.inject(&tok, 1, 1, "/new");
    wait_reply(&fake, &tok, 1, |t| t.starts_with("new conversation"));
    assert_eq!(history(1, "four"), json!([]), "/new forgets");

    // The OpenAI-compatible endpoint: the caller's conversation goes through whole.
    let addr = wait_new_ready(home.path(), &[old], READY).expect("running").2;
    let body = json!({"model": "x", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]});
    let r = Api::new(addr).post_json("/v1/chat/completions", &body).unwrap();
    let content = r.json().unwrap()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    let passed: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_eq!(
        passed,
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    );
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// `[agent]` lines for the openai backend with a `primary` and a `fallback` provider.
fn openai_agent(primary: &str, fallback: &str, extra: &str) -> String {
    format!(
        "backend = \"openai\"\nretries = 1\nbackoff_ms = 10\ntimeout_s = 30\n{extra}\n\
         [[agent.provider]]\nname = \"primary\"\nbase_url = \"{primary}\"\nmodel = \"p\"\n\
         [[agent.provider]]\nname = \"fallback\"\nbase_url = \"{fallback}\"\nmodel = \"f\"\n"
    )
}

/// Issue 27 §6 in a chat: a provider that drops the connection 0.3 s into its stream, before
/// the chat was shown anything (a preview comes only after 2 s), is failed over: the chat gets
/// the fallback's whole answer, never "sorry, that failed", and no preview of the broken one.
#[test]
fn a_provider_dropping_before_the_chat_saw_anything_is_failed_over() {
    use gatewarden_testkit::llmfake::{FakeLlm, Reply};
    let primary = FakeLlm::start(Reply::broken("half an answer from the primary")).unwrap();
    primary.set_latency(Duration::ZERO, Duration::from_millis(60));
    let fallback = FakeLlm::start(Reply::text("the whole answer")).unwrap();
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let agent = openai_agent(&primary.base_url(), &fallback.base_url(), "");
    let _g = start_gw(&home, &sw, &tok, &config(&fake, &agent, ""));
    fake.inject(&tok, 7, ADMIN, "a question");
    let reply = wait_reply(&fake, &tok, 7, |t| t.contains("answer") || t.contains("sorry"));
    assert_eq!(reply, "the whole answer");
    assert_eq!(primary.requests(), 2, "retried like a refused connection, then failed over");
    let shown: Vec<String> =
        fake.sent(&tok).into_iter().map(|m| m.text).chain(fake.edits(&tok).into_iter().map(|e| e.text)).collect();
    assert!(!shown.iter().any(|t| t.contains("primary") || t.contains("sorry")), "{shown:#?}");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!(st["providers"][0]["failures"], json!(2), "{st:#}");
}

/// Issue 27 §5: a failed run tells the chat the configured failure text and a reference, never
/// the reason (here the provider's address, which refused the connection); the operator finds
/// the whole reason under that reference in `trace`, in `status` and in the log. An admin of
/// the platform gets the reason in their own chat when `failure_reasons_for_admins` is on;
/// other users still do not.
#[test]
fn a_failed_run_tells_the_chat_a_short_text_and_the_operator_the_reason() {
    let detail = format!("127.0.0.1:{}", api::free_port());
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let agent = format!(
        "backend = \"openai\"\nbase_url = \"http://{detail}/v1\"\nmodel = \"m\"\nretries = 0\n\
         failure_text = \"the assistant is unavailable\"\n"
    );
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &agent, ""));
    fake.inject(&tok, 8, 99, "hello");
    let told = wait_reply(&fake, &tok, 8, |t| t.starts_with("the assistant is unavailable"));
    let reference = told.strip_prefix("the assistant is unavailable (ref ").and_then(|r| r.strip_suffix(')'));
    let reference = reference.unwrap_or_else(|| panic!("not the text and a reference: {told:?}")).to_owned();
    assert!(!told.contains(&detail) && !told.contains("connect"), "{told}");
    let trace = run_cli(&home, &["trace", &reference]);
    assert_cli(&trace, 0, "trace of the reference");
    assert!(trace.stdout.contains(&detail) && trace.stdout.contains("cannot connect"), "{}", trace.stdout);
    let st = run_cli(&home, &["status", "--json"]).json();
    let last = &st["agent"]["last_failure"];
    assert!(last["reason"].as_str().is_some_and(|r| r.contains(&detail)), "{st:#}");
    assert_eq!(last["reference"], json!(reference), "{st:#}");
    stop_cleanly(&home, &mut g);
    assert!(g.stderr().contains(&detail), "the log has the reason");

    // Opted in: the admin sees the reason in their chat, the others do not.
    let agent = format!("{agent}failure_reasons_for_admins = true\n");
    let _g = start_gw(&home, &sw, &tok, &config(&fake, &agent, ""));
    fake.inject(&tok, 7, ADMIN, "hello");
    let admin = wait_reply(&fake, &tok, 7, |t| t.starts_with("the assistant is unavailable"));
    assert!(admin.contains(&detail) && admin.contains("(ref "), "{admin}");
    fake.inject(&tok, 9, 99, "hello again");
    let other = wait_reply(&fake, &tok, 9, |t| t.starts_with("the assistant is unavailable"));
    assert!(!other.contains(&detail), "{other}");
}

/// Issue 30, item 2, from a chat platform: a `/restart` that reaches the gateway after the
/// operator's `stop` was recorded (and before the stop's request did) is answered in the chat
/// that it will not happen, naming the stop, and is in the ledger; the gateway stops and stays
/// down.
/// (Before: "restarting…", and the restart was then refused by the recorded stop.)
#[test]
fn a_chat_restart_after_a_recorded_stop_is_refused_naming_it() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let gate = home.scratch("gate", "");
    let mut g = start_gw(&home, &sw, &tok, &config(&fake, &gated_exec_agent(&gate), ""));
    fake.inject(&tok, 5, 1, "held");
    wait_active(g.listen(), 1);
    // The window between `stop` recording its intent and its request reaching the gateway,
    // held open deterministically: this process records the stop as `stop` does (a `stop`
    // held by SIGSTOP after its record may already have sent its request, and a draining
    // gateway reads no more chat updates). The overlap soak covers the real `stop`'s timing.
    let stopper = std::process::id();
    desired::record(home.path(), desired::Want::Stopped, "cli stop", true).unwrap();
    fake.inject(&tok, 7, ADMIN, "/restart");
    let reply = wait_reply(&fake, &tok, 7, |_| true);
    assert!(reply.starts_with("not restarting: the gateway is stopping"), "{reply}");
    assert!(reply.contains(&format!("pid {stopper}")), "{reply}");
    std::fs::write(&gate, b"").unwrap();
    assert_cli(&run_cli(&home, &["stop", "--timeout", "30"]), 0, "stop");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "stopped");
    let asked = home.events("restart_requested");
    assert_eq!(asked.len(), 1, "{}", home.ledger_text());
    assert_eq!((asked[0]["joined"].as_str(), asked[0]["requester"]["channel"].as_str()), (Some("stop"), Some("chat")));
    assert_eq!(asked[0]["stop_requester"]["pid"], json!(stopper), "{}", asked[0]);
    assert!(home.events("successor_started").is_empty(), "{}", home.ledger_text());
    assert!(!home.lock_held());
}
