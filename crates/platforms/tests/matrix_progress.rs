//! Issue 17 §3 on a real Synapse (testkit::servers; `scripts/setup-synapse`): the Matrix
//! adapter shows a run at work. Another user of the room sees the bot's typing notice while
//! the run is in progress and not after; a preview message, then an `m.replace` edit of it as
//! the reply grows; then the reply as its own message and the preview redacted. Under `CI` a
//! missing Synapse fails this test; elsewhere it prints SKIPPED and passes.
#![cfg(target_os = "linux")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_chatproto::matrix::{Client, encode_segment};
use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::{Activity, Adapter, Host, State};
use gatewarden_testkit::servers::Synapse;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// One raw client-server call as `token` (the typed client has no ephemeral events).
fn get(base: &str, token: &str, path: &str) -> Value {
    let mut r = ureq::get(format!("{base}{path}"))
        .header("Authorization", format!("Bearer {token}"))
        .config()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    r.body_mut().read_json().unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

#[track_caller]
fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Who is typing in `room`, as one sync since `since` shows it (`None`: no news).
fn typing(base: &str, token: &str, room: &str, since: &mut Option<String>) -> Option<Vec<String>> {
    let filter = encode_segment(r#"{"room":{"timeline":{"limit":0},"state":{"types":[]}},"presence":{"types":[]}}"#);
    let q = since.as_ref().map_or(String::new(), |s| format!("&since={}", encode_segment(s)));
    let v = get(base, token, &format!("/_matrix/client/v3/sync?timeout=500&filter={filter}{q}"));
    *since = v["next_batch"].as_str().map(str::to_owned);
    let events = v["rooms"]["join"][room]["ephemeral"]["events"].as_array()?.clone();
    events.iter().rev().find(|e| e["type"] == "m.typing").map(|e| {
        e["content"]["user_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u.as_str().map(str::to_owned))
            .collect()
    })
}

/// The bot's events in `room`, oldest first.
fn bot_events(base: &str, token: &str, room: &str, bot: &str) -> Vec<Value> {
    let v = get(base, token, &format!("/_matrix/client/v3/rooms/{}/messages?dir=b&limit=100", encode_segment(room)));
    let mut out: Vec<Value> =
        v["chunk"].as_array().into_iter().flatten().filter(|e| e["sender"] == bot).cloned().collect();
    out.reverse();
    out
}

#[test]
fn a_run_in_progress_types_edits_and_is_replaced_by_the_reply() {
    let Some(synapse) = Synapse::start() else { return };
    let base = synapse.base_url();
    let bot = synapse.register("gwbot", "pw-gwbot");
    let alice = synapse.register("alice", "pw-alice");
    let mut client = Client::new(&base, WAIT).unwrap();
    client.set_access_token(alice.access_token.clone());
    client.whoami().unwrap();
    let room = client.create_room(&[&bot.user_id]).unwrap();
    let cfg = PlatformConfig {
        name: Some("mx".into()),
        allowed_chats: vec![room.clone()],
        conflict_standby_s: 30,
        ..PlatformConfig::with(platform::Matrix {
            api_base: Some(base.clone()),
            poll_timeout_s: 1,
            ..platform::Matrix::default()
        })
    };
    let host = Arc::new(support::MemHost::silent());
    let a = gatewarden_platforms::matrix::Matrix::new(&cfg, bot.access_token.clone()).unwrap();
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait("connected", || a.status().state() == State::Connected);
    let mut since = None;
    let _ = typing(&base, &alice.access_token, &room, &mut since);

    a.show(&room, "run-1", Activity::Started);
    a.show(&room, "run-1", Activity::Text("Hello ".into()));
    wait("the bot typing", || {
        typing(&base, &alice.access_token, &room, &mut since).is_some_and(|u| u.contains(&bot.user_id))
    });
    let events = || bot_events(&base, &alice.access_token, &room, &bot.user_id);
    wait("a preview", || events().iter().any(|e| e["content"]["body"] == "Hello …"));
    a.show(&room, "run-1", Activity::Text("world".into()));
    wait("an m.replace edit", || {
        events().iter().any(|e| {
            e["content"]["m.new_content"]["body"] == "Hello world …"
                && e["content"]["m.relates_to"]["rel_type"] == "m.replace"
        })
    });
    let preview_id = events().iter().find(|e| e["content"]["body"] == "Hello …").map(|e| e["event_id"].clone());
    let preview_id = preview_id.and_then(|v| v.as_str().map(str::to_owned)).expect("the preview's event id");

    a.show(&room, "run-1", Activity::Ended { replied: true });
    host.queue_reply(&room, "Hello world.", Some("run-1"));
    a.wake();
    wait("the reply, and the preview redacted", || {
        let ev = events();
        let replied = ev.iter().any(|e| e["content"]["body"] == "Hello world.");
        let redacted = ev.iter().any(|e| e["event_id"] == preview_id.as_str() && e["content"] == serde_json::json!({}));
        replied && redacted
    });
    wait("typing off", || {
        typing(&base, &alice.access_token, &room, &mut since).is_some_and(|u| !u.contains(&bot.user_id))
    });
    assert_eq!(events().iter().filter(|e| e["content"]["body"] == "Hello world.").count(), 1, "the reply once");
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}
