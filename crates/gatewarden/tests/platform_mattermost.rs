//! Issue 34: the Mattermost adapter in real gateway processes against the in-repo fake
//! (crates/testkit/src/mattermostfake.rs): `posted` events on the v4 WebSocket, replies with
//! `POST /api/v4/posts`, and what is posted while no gateway listens read back per channel
//! from the saved positions. Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use gatewarden_testkit::mattermostfake::{FakeMattermost, Options, Post};

const TOKEN_ENV: &str = "GW_TEST_MATTERMOST_TOKEN";
const ADMIN: &str = "adminuseradminuseradmin001";
const REPLY: Duration = Duration::from_secs(20);

/// A fake with a token no other test uses (the credential lock is keyed by it).
fn fake() -> FakeMattermost {
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    FakeMattermost::start(Options { token: format!("mmtok{}x{n}", std::process::id()), ..Options::default() })
        .expect("fake Mattermost")
}

fn config(fake: &FakeMattermost, agent: &str, extra: &str) -> String {
    platform_config(
        agent,
        &format!(
            "kind = \"mattermost\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\n\
             server = \"{}\"\nadmins = [\"{ADMIN}\"]\nconflict_standby_s = 2\n{extra}",
            fake.server()
        ),
    )
}

fn spawn(home: &TempHome, sw: &Sweeper, fake: &FakeMattermost, config: &str) -> Gateway {
    spawn_platform(home, sw, config, &[(TOKEN_ENV, &fake.options().token)], None)
}

fn start_gw(home: &TempHome, sw: &Sweeper, fake: &FakeMattermost, config: &str) -> Gateway {
    ready(spawn(home, sw, fake, config))
}

fn count(posts: &[Post], channel: &str, text: &str) -> usize {
    posts.iter().filter(|p| p.channel == channel && p.message == text).count()
}

#[track_caller]
fn wait_reply(fake: &FakeMattermost, channel: &str, pred: impl Fn(&str) -> bool) -> Post {
    let ok = wait_until(REPLY, || fake.bot_posts().iter().any(|p| p.channel == channel && pred(&p.message)));
    assert!(ok, "no matching reply in {channel} within {REPLY:?}; posted: {:#?}", fake.bot_posts());
    fake.bot_posts().into_iter().rev().find(|p| p.channel == channel && pred(&p.message)).expect("the reply")
}

/// Round trip through the echo agent, in a channel and in a thread; /status; the adapter's
/// state, lag and counts in `status --json` (what the dashboard shows) and in /metrics.
#[test]
fn round_trip_threads_status_and_lag() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), fake());
    let mut g = start_gw(&home, &sw, &fake, &config(&fake, "", ""));
    wait_adapter(&home, "connected", READY);
    fake.user_post("chan1", ADMIN, "hello there", None);
    let top = wait_reply(&fake, "chan1", |t| t == "hello there");
    assert_eq!(top.root_id, "", "a top-level post is answered at the top level");
    let root = fake.user_post("chan1", ADMIN, "a thread starts", None);
    wait_reply(&fake, "chan1", |t| t == "a thread starts");
    fake.user_post("chan1", ADMIN, "in the thread", Some(&root));
    assert_eq!(wait_reply(&fake, "chan1", |t| t == "in the thread").root_id, root, "the reply stays in the thread");
    fake.user_post("chan1", ADMIN, "/status", None);
    assert!(wait_reply(&fake, "chan1", |t| t.contains("incarnation")).message.contains("running"));

    let p = platforms(&home);
    assert_eq!((p[0]["name"].as_str(), p[0]["kind"].as_str()), (Some("mattermost"), Some("mattermost")), "{p}");
    assert_eq!(p[0]["state"], "connected", "{p}");
    assert!(p[0]["received"].as_u64() >= Some(4) && p[0]["lag_s"].is_number(), "{p}");
    assert!(p[0]["lag_s"].as_f64().is_some_and(|l| (0.0..30.0).contains(&l)), "{p}");
    let metrics = http_get(g.listen(), "/metrics", Duration::from_secs(5)).unwrap().text();
    assert!(
        metrics
            .contains("gatewarden_platform_state{platform=\"mattermost\",kind=\"mattermost\",state=\"connected\"} 1"),
        "{metrics}"
    );
    let posts = fake.bot_posts();
    for text in ["hello there", "a thread starts", "in the thread"] {
        assert_eq!(count(&posts, "chan1", text), 1, "{text:?} once: {posts:#?}");
    }
    assert!(fake.stats().channel_lists >= 1, "the read-back after connect listed the channels");
    stop_cleanly(&home, &mut g);
}

/// kill -9, then posts while no gateway runs (in a channel already seen, in a direct channel
/// never seen, in a thread): the next incarnation reads them back and answers each once; a
/// `seq` gap on the WebSocket is read back too.
#[test]
fn posts_while_down_and_after_a_seq_gap_are_read_back_once() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), fake());
    let cfg = config(&fake, "", "");
    let mut g = start_gw(&home, &sw, &fake, &cfg);
    wait_adapter(&home, "connected", READY);
    let root = fake.user_post("chan2", "u1", "before", None);
    wait_reply(&fake, "chan2", |t| t == "before");
    g.kill();
    fake.user_post("chan2", "u1", "while down 1", None);
    fake.user_post("dmnew", "u2", "while down 2", None);
    fake.user_post("chan2", "u1", "while down 3", Some(&root));
    let mut g2 = start_gw(&home, &sw, &fake, &cfg);
    wait_reply(&fake, "chan2", |t| t == "while down 1");
    wait_reply(&fake, "dmnew", |t| t == "while down 2");
    assert_eq!(wait_reply(&fake, "chan2", |t| t == "while down 3").root_id, root);
    wait_adapter(&home, "connected", READY);

    fake.skip_events(1);
    fake.user_post("chan2", "u1", "lost on the socket", None);
    fake.user_post("chan2", "u1", "the next one", None);
    wait_reply(&fake, "chan2", |t| t == "lost on the socket");
    wait_reply(&fake, "chan2", |t| t == "the next one");
    assert_eq!(fake.stats().skipped, 1);
    let quiet = holds_for(Duration::from_millis(1500), || fake.bot_posts().len() == 6);
    assert!(quiet.is_ok(), "answered more than once: {:#?}", fake.bot_posts());
    stop_cleanly(&home, &mut g2);
}

/// Two homes with the same token on one server: the second gateway exits 78 naming the
/// holder's home and pid.
#[test]
fn two_homes_same_token() {
    let (a, b, sw, fake) = (TempHome::new(), TempHome::new(), Sweeper::new(), fake());
    let mut ga = start_gw(&a, &sw, &fake, &config(&fake, "", ""));
    wait_adapter(&a, "connected", READY);
    let mut gb = spawn(&b, &sw, &fake, &config(&fake, "", ""));
    refused_naming_the_holder(&mut gb, &a, &ga, "second gateway with the same Mattermost token");
    assert_eq!(fake.stats().connections, 1, "the second gateway never connected");
    stop_cleanly(&a, &mut ga);
}

/// A refused token parks the adapter with the server's reason; the gateway keeps serving.
#[test]
fn a_refused_token_parks_saying_why() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), fake());
    fake.revoke(true);
    let mut g = start_gw(&home, &sw, &fake, &config(&fake, "", ""));
    let p = wait_adapter(&home, "parked", READY);
    let reason = p[0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("401") && reason.contains("token"), "{p}");
    assert!(serving(&mut g), "a parked adapter never stops the gateway");
    assert_eq!(fake.stats().connections, 0);
    stop_cleanly(&home, &mut g);
}

/// 5 restarts in CI (GW_PLATFORM_RESTARTS in scripts/soak-platforms) under a steady inbound
/// stream: every message answered, none twice; posts made between two incarnations are read
/// back. Prints and replays its seed (GW_PLATFORM_SEED).
#[test]
fn restarts_under_a_steady_stream_lose_and_repeat_nothing() {
    let (restarts, seed) = soak::soak_params(5);
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), Arc::new(fake()));
    let _g = start_gw(&home, &sw, &fake, &config(&fake, "", ""));
    wait_adapter(&home, "connected", READY);
    let stream = {
        let say = |fake: &mut Arc<FakeMattermost>, n| fake.user_post("chan1", "u1", &format!("msg {n}"), None);
        soak::steady_stream(seed, 10, 40, Arc::clone(&fake), say)
    };
    let t0 = Instant::now();
    soak::restart_times(&home, &sw, restarts);
    let (total, _) = stream.stop();
    let total = total as usize;
    eprintln!("{restarts} restarts in {:?}, {total} messages, {:?}", t0.elapsed(), fake.stats());
    let _ = fake.wait_bot_posts(total, Duration::from_secs(40));
    let posts = fake.bot_posts();
    let (lost, dup) = soak::lost_and_duplicated(total as u32, posts.iter().map(|p| p.message.as_str()));
    assert!(lost.is_empty() && dup.is_empty(), "seed {seed}: lost {lost:?}, duplicated {dup:?}, {:?}", fake.stats());
    assert!(holds_for(Duration::from_millis(500), || fake.bot_posts().len() == total).is_ok());
    assert!(fake.stats().since_calls >= 1, "{:?}", fake.stats());
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Progress through the real binary: `backend = "openai"` against the streaming fake provider
/// (16 words, one per 250 ms), a post in a thread. `user_typing` names the channel and the
/// thread; the preview is posted in that thread, patched as the reply grows, and deleted once
/// the final text is out in the thread, once.
#[test]
fn a_streaming_run_in_a_thread_types_previews_and_ends_with_the_final_text_once() {
    let (home, sw, fake) = (TempHome::new(), Sweeper::new(), fake());
    let words: Vec<String> = (1..=16).map(|i| format!("word{i}")).collect();
    let text = format!("{}.", words.join(" "));
    let llm = FakeLlm::start(Reply::text(&text)).expect("fake provider");
    llm.set_latency(Duration::ZERO, Duration::from_millis(250));
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    // The thread's root, from before the first start: history, not answered.
    let root = fake.user_post("chan7", ADMIN, "a root", None);
    let _g = start_gw(&home, &sw, &fake, &config(&fake, &agent, ""));
    wait_adapter(&home, "connected", READY);
    fake.user_post("chan7", ADMIN, "tell me a story", Some(&root));
    wait_reply(&fake, "chan7", |t| t == text);
    let on_screen = || -> Vec<(String, String)> {
        fake.visible().into_iter().filter(|p| p.channel == "chan7").map(|p| (p.message, p.root_id)).collect()
    };
    let want = [(text.clone(), root.clone())];
    assert!(wait_until(REPLY, || on_screen() == want), "left on screen: {:?}", on_screen());

    let calls: Vec<_> = fake.calls().into_iter().filter(|c| c.status < 300).collect();
    let preview = calls
        .iter()
        .position(|c| c.method == "POST" && c.message.as_deref().is_some_and(|m| m.ends_with(" …")))
        .unwrap_or_else(|| panic!("no preview: {calls:#?}"));
    assert_eq!(calls[preview].root_id.as_deref(), Some(root.as_str()), "the preview stays in the thread");
    let id = calls[preview].post.clone();
    let final_at = calls.iter().position(|c| c.message.as_deref() == Some(text.as_str())).expect("the reply");
    assert!(preview < final_at);
    assert!(calls.iter().any(|c| c.method == "PUT" && c.post == id), "the preview grows: {calls:#?}");
    let deleted = calls.iter().position(|c| c.method == "DELETE" && c.post == id);
    assert!(deleted.is_some_and(|d| d > final_at), "deleted after the reply: {calls:#?}");
    assert_eq!(count(&fake.bot_posts(), "chan7", &text), 1, "the final text once");
    assert!(fake.typing().contains(&("chan7".to_owned(), root.clone())), "typing in the thread: {:?}", fake.typing());
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}
