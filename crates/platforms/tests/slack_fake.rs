//! The Slack adapter against the fake Slack (crates/testkit/src/slackfake.rs), with an
//! in-memory host: acknowledgement only after the commit, redelivery journaled once, threads,
//! filters, refresh without a gap over several connections, rate limits, a fake killed and
//! revived, refused tokens and `link_disabled`, and a run shown at work (a preview in the
//! thread, edited then deleted; rate-limited preview calls).
#![cfg(unix)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::slack::Slack;
use gatewarden_platforms::{Activity, Adapter, ChatKind, Host, Sent, State};
use gatewarden_testkit::slackfake::{Call, FakeSlack, Options};
use serde_json::json;
use support::{MemHost, wait_for as wait};

fn config(base: &str) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ..PlatformConfig::with(platform::Slack {
            api_base: Some(base.into()),
            bot_token_env: Some("UNUSED_TOO".into()),
            ..platform::Slack::default()
        })
    }
}

/// Quick acknowledgement timeouts and retries, so a redelivery comes within a second.
fn quick() -> Options {
    Options {
        ack_timeout: Duration::from_millis(500),
        retry_delays: vec![Duration::ZERO; 20],
        disconnect_grace: Duration::from_secs(30),
        ..Options::default()
    }
}

fn start(fake: &FakeSlack, cfg: PlatformConfig) -> (Arc<Slack>, Arc<MemHost>) {
    let host = Arc::new(MemHost::echoing());
    let o = fake.options();
    let s = Arc::new(Slack::new(&cfg, o.app_token, o.bot_token).unwrap());
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait("connected", Duration::from_secs(10), || s.status().state() == State::Connected);
    (s, host)
}

fn texts(fake: &FakeSlack) -> Vec<String> {
    fake.posted().into_iter().map(|p| p.text).collect()
}

#[test]
fn round_trip_threads_and_what_is_not_answered() {
    // Slack's own 3 s: no redelivery is expected, even on a loaded machine.
    let fake = FakeSlack::start(Options { ack_timeout: Duration::from_secs(3), ..quick() }).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    assert_eq!(s.credential(), fake.options().app_token, "the credential is the app-level token");
    fake.user_message("C1", "U1", "hi <you> & me", None);
    let p = fake.wait_posted(1, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (p[0].channel.as_str(), p[0].text.as_str(), p[0].thread_ts.as_deref()),
        ("C1", "echo: hi &lt;you&gt; &amp; me", None)
    );
    // A thread stays a thread.
    fake.user_message("C1", "U2", "in a thread", Some("1700000000.000100"));
    let p = fake.wait_posted(2, Duration::from_secs(10)).unwrap();
    assert_eq!((p[1].text.as_str(), p[1].thread_ts.as_deref()), ("echo: in a thread", Some("1700000000.000100")));
    assert_eq!(host.inbox.lock().unwrap()[1].chat_id, "C1/1700000000.000100");
    // An edit, a join, another bot and a reaction: acknowledged, not answered.
    fake.event(json!({"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "3.0",
                      "message": {"type": "message", "user": "U1", "text": "edited"}}));
    fake.event(json!({"type": "message", "subtype": "channel_join", "channel": "C1", "user": "U3", "text": "joined", "ts": "4.0"}));
    fake.event(json!({"type": "message", "subtype": "bot_message", "bot_id": "B2", "channel": "C1", "text": "beep", "ts": "5.0"}));
    fake.event(
        json!({"type": "reaction_added", "user": "U1", "reaction": "+1", "item": {"channel": "C1", "ts": "1.0"}}),
    );
    // One message seen as `message` and as `app_mention`: one journal entry, one reply.
    for ty in ["message", "app_mention"] {
        fake.event(json!({"type": ty, "channel": "C1", "user": "U1", "text": "<@UFAKEBOT> once", "ts": "6.0", "client_msg_id": "m-once"}));
    }
    fake.user_message("C1", "U1", "last", None);
    fake.wait_posted(4, Duration::from_secs(10)).unwrap();
    wait("every envelope acknowledged", Duration::from_secs(10), || fake.stats().pending == 0);
    assert_eq!(
        texts(&fake),
        ["echo: hi &lt;you&gt; &amp; me", "echo: in a thread", "echo: &lt;@UFAKEBOT&gt; once", "echo: last"]
    );
    let st = fake.stats();
    assert_eq!((st.redeliveries, st.misrouted_acks, st.lost), (0, 0, 0), "{st:?}");
    assert_eq!(host.inbox.lock().unwrap().len(), 4, "our own posts came back as events and were not answered");
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
}

#[test]
fn acknowledged_only_after_the_commit_and_a_redelivery_is_journaled_once() {
    let fake = FakeSlack::start(quick()).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    *host.refuse.lock().unwrap() = true;
    let ev = fake.user_message("C1", "U1", "first", None);
    // Not journaled: not acknowledged, so Slack sends it again (same event id, new envelope).
    wait("a redelivery", Duration::from_secs(10), || {
        fake.deliveries().iter().any(|d| d.event_id == ev && d.retry_attempt >= 2)
    });
    assert_eq!(fake.stats().acks, 0, "an uncommitted message must not be acknowledged");
    assert!(matches!(s.status().state(), State::Degraded(_)));
    *host.refuse.lock().unwrap() = false;
    fake.wait_posted(1, Duration::from_secs(10)).unwrap();
    wait("acknowledged", Duration::from_secs(10), || fake.stats().pending == 0);
    // Slack delivers the acknowledged event again (its retry raced our ack): journaled once.
    assert!(fake.replay(&ev));
    wait("the replay acknowledged", Duration::from_secs(10), || fake.stats().pending == 0);
    assert_eq!(host.inbox.lock().unwrap().len(), 1, "the replay mapped to the same journal key");
    assert_eq!(texts(&fake), ["echo: first"]);
    s.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn refresh_opens_the_new_connection_before_closing_the_old_and_loses_nothing() {
    let fake = FakeSlack::start(quick()).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    let mut sent = 0;
    for reason in ["refresh_requested", "warning"] {
        let before = fake.stats();
        for i in 0..10 {
            fake.user_message("C1", "U1", &format!("{reason} {i}"), None);
            sent += 1;
            if i == 3 {
                fake.disconnect(reason);
            }
            std::thread::sleep(Duration::from_millis(20)); // a steady stream, not a sync point
        }
        wait("a new connection", Duration::from_secs(10), || fake.stats().opens == before.opens + 1);
        // The old one is closed by the adapter, long before the fake's 30 s grace would.
        wait("the old connection closed by the adapter", Duration::from_secs(10), || {
            fake.stats().closed_by_app == before.closed_by_app + 1
        });
    }
    wait("every message answered", Duration::from_secs(20), || host.inbox.lock().unwrap().len() == sent);
    fake.wait_posted(sent, Duration::from_secs(20)).unwrap();
    let st = fake.stats();
    assert_eq!(st.max_open, 2, "the new connection was open before the old one closed: {st:?}");
    assert_eq!((st.lost, st.misrouted_acks, st.open_now), (0, 0, 1), "{st:?}");
    let conns: std::collections::BTreeSet<u64> = fake.deliveries().iter().map(|d| d.conn).collect();
    assert_eq!(conns.len(), 3, "envelopes came over all three connections: {conns:?}");
    assert_eq!(s.status().state(), State::Connected);
    s.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn rate_limits_are_waited_out_and_a_dead_fake_is_survived() {
    let fake = FakeSlack::start(quick()).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    fake.flood(2, 1);
    fake.user_message("C1", "U1", "flooded", None);
    fake.wait_posted(1, Duration::from_secs(10)).unwrap();
    fake.kill();
    wait("degraded", Duration::from_secs(10), || matches!(s.status().state(), State::Degraded(_)));
    fake.user_message("C1", "U1", "while dead", None);
    fake.revive().unwrap();
    fake.wait_posted(2, Duration::from_secs(30)).unwrap();
    wait("connected", Duration::from_secs(10), || s.status().state() == State::Connected);
    assert_eq!(texts(&fake), ["echo: flooded", "echo: while dead"]);
    assert_eq!(host.inbox.lock().unwrap().len(), 2);
    s.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn refused_tokens_and_link_disabled_park_the_adapter() {
    for (what, app, bot) in [
        ("bot token", None, Some("account_inactive")),
        ("app-level token", Some("invalid_auth"), None),
        ("app-level token", Some("token_revoked"), None),
    ] {
        let fake = FakeSlack::start(quick()).unwrap();
        fake.revoke_app(app);
        fake.revoke_bot(bot);
        let o = fake.options();
        let s = Slack::new(&config(&fake.api_base()), o.app_token, o.bot_token).unwrap();
        s.start(Arc::new(MemHost::echoing())).unwrap();
        wait("parked", Duration::from_secs(10), || matches!(s.status().state(), State::Parked(_)));
        let why = s.status().state().reason().unwrap_or_default().to_owned();
        assert!(why.contains(what) && why.contains(app.or(bot).unwrap()), "{why}");
        s.close(Instant::now() + Duration::from_secs(2));
    }
    let fake = FakeSlack::start(quick()).unwrap();
    let (s, _host) = start(&fake, config(&fake.api_base()));
    fake.disconnect("link_disabled");
    wait("parked", Duration::from_secs(10), || matches!(s.status().state(), State::Parked(_)));
    assert!(s.status().state().reason().unwrap_or_default().contains("link_disabled"));
    s.close(Instant::now() + Duration::from_secs(2));
}

#[test]
fn a_refused_post_is_not_retried_and_a_refused_bot_token_parks() {
    let fake = FakeSlack::start(Options { channels: vec!["C1".into()], ..quick() }).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    let seq = host.queue("C404", "nowhere");
    s.wake();
    wait("the outcome", Duration::from_secs(10), || host.outcomes.lock().unwrap().iter().any(|(q, _)| *q == seq));
    let outcome = host.outcomes.lock().unwrap()[0].1.clone();
    assert!(matches!(&outcome, Sent::Rejected(why) if why.contains("channel_not_found")), "{outcome:?}");
    fake.revoke_bot(Some("token_revoked"));
    host.queue("C1", "refused");
    s.wake();
    wait("parked", Duration::from_secs(10), || matches!(s.status().state(), State::Parked(_)));
    let why = s.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("bot token") && why.contains("token_revoked"), "{why}");
    assert!(fake.posted().is_empty());
    s.close(Instant::now() + Duration::from_secs(2));
}

/// Every channel's message reaches the host, marked `listed` as allowed_chats says (the
/// gateway's access policy decides; crates/runtime/src/access/), and a start after close works.
#[test]
fn channels_are_marked_as_allowed_chats_says_and_start_after_close_works() {
    let fake = FakeSlack::start(quick()).unwrap();
    let mut cfg = config(&fake.api_base());
    cfg.allowed_chats = vec!["C1".into()];
    let (s, host) = start(&fake, cfg);
    fake.user_message("C2", "U1", "elsewhere", None);
    fake.user_message("C1", "U1", "in a thread here", Some("9.0"));
    fake.wait_posted(2, Duration::from_secs(10)).unwrap();
    wait("both acknowledged", Duration::from_secs(10), || fake.stats().pending == 0);
    {
        let inbox = host.inbox.lock().unwrap();
        let listed: Vec<(&str, bool)> = inbox.iter().map(|m| (m.text.as_str(), m.listed)).collect();
        assert_eq!(listed, [("elsewhere", false), ("in a thread here", true)]);
        assert!(inbox.iter().all(|m| m.chat == ChatKind::Group && !m.addressed), "{inbox:?}");
    }
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
    // Closed: what arrives now waits unacknowledged for the next start.
    fake.user_message("C1", "U1", "after close", None);
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    fake.wait_posted(3, Duration::from_secs(10)).unwrap();
    assert_eq!(texts(&fake)[2], "echo: after close");
    assert_eq!(host.inbox.lock().unwrap().len(), 3);
    s.close(Instant::now() + Duration::from_secs(3));
}

/// Waits for a `chat.*` call that `pred` picks (any outcome); all calls so far.
#[track_caller]
fn saw(fake: &FakeSlack, what: &str, pred: impl Fn(&Call) -> bool) -> Vec<Call> {
    match fake.wait_calls(Duration::from_secs(15), |cs| cs.iter().any(&pred)) {
        Ok(c) => c,
        Err(c) => panic!("no {what} among {c:#?}"),
    }
}

fn ok(method: &'static str, channel: &'static str, text: &'static str) -> impl Fn(&Call) -> bool {
    move |c| {
        c.method == method
            && c.channel == channel
            && c.status == 200
            && c.error.is_none()
            && c.text.as_deref() == Some(text)
    }
}

/// The `ts` of the message posted to `channel` with `text`.
fn posted_ts(fake: &FakeSlack, channel: &'static str, text: &'static str) -> String {
    let c = fake.calls().into_iter().find(ok("chat.postMessage", channel, text));
    c.and_then(|c| c.ts).unwrap_or_else(|| panic!("no {text:?} posted"))
}

fn deleted(channel: &'static str, ts: &str) -> impl Fn(&Call) -> bool {
    let ts = ts.to_owned();
    move |c| c.method == "chat.delete" && c.channel == channel && c.error.is_none() && c.ts.as_deref() == Some(&ts)
}

/// Issue 20, "typing and progress": Slack gives bots no typing indicator, so a streaming run
/// shows a preview, posted in the run's thread, updated as it grows, and deleted once the reply
/// is out as its own message in the same thread; an abandoned run's preview is deleted and
/// nothing replaces it.
#[test]
fn a_streaming_run_in_a_thread_previews_edits_and_is_replaced_by_the_reply() {
    const THREAD: &str = "1700000000.000100";
    let fake = FakeSlack::start(quick()).unwrap();
    let (s, host) = start(&fake, config(&fake.api_base()));
    let chat = format!("C1/{THREAD}");
    s.show(&chat, "run-1", Activity::Started);
    s.show(&chat, "run-1", Activity::Text("Hello ".into()));
    saw(&fake, "a preview", ok("chat.postMessage", "C1", "Hello …"));
    s.show(&chat, "run-1", Activity::Text("world".into()));
    saw(&fake, "an update", ok("chat.update", "C1", "Hello world …"));
    s.show(&chat, "run-1", Activity::Ended { replied: true });
    host.queue_reply(&chat, "Hello world.", Some("run-1"));
    s.wake();
    let preview = posted_ts(&fake, "C1", "Hello …");
    saw(&fake, "the preview deleted", deleted("C1", &preview));
    let reply = posted_ts(&fake, "C1", "Hello world.");
    assert_ne!(reply, preview, "the reply is a message of its own");
    type Step = (String, Option<String>, Option<String>, Option<String>);
    let steps: Vec<Step> =
        fake.calls().into_iter().filter(|c| c.channel == "C1").map(|c| (c.method, c.ts, c.thread_ts, c.text)).collect();
    let step = |m: &str, ts: &str, thread: Option<&str>, text: Option<&str>| {
        (m.to_owned(), Some(ts.to_owned()), thread.map(str::to_owned), text.map(str::to_owned))
    };
    assert_eq!(
        steps,
        [
            step("chat.postMessage", &preview, Some(THREAD), Some("Hello …")),
            step("chat.update", &preview, None, Some("Hello world …")),
            step("chat.postMessage", &reply, Some(THREAD), Some("Hello world.")),
            step("chat.delete", &preview, None, None),
        ],
        "post in the thread, update, reply in the thread, delete"
    );

    // An abandoned run (cancelled by a drain), at the top level of another channel.
    s.show("C2", "run-2", Activity::Started);
    s.show("C2", "run-2", Activity::Text("Thinking".into()));
    saw(&fake, "a preview in C2", ok("chat.postMessage", "C2", "Thinking …"));
    s.show("C2", "run-2", Activity::Ended { replied: false });
    let abandoned = posted_ts(&fake, "C2", "Thinking …");
    saw(&fake, "the abandoned preview deleted", deleted("C2", &abandoned));
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
    let visible: Vec<(String, String, Option<String>)> =
        fake.visible().into_iter().map(|p| (p.channel, p.text, p.thread_ts)).collect();
    assert_eq!(
        visible,
        [("C1".to_owned(), "Hello world.".to_owned(), Some(THREAD.to_owned()))],
        "the final text, once"
    );
    assert!(fake.calls().iter().all(|c| c.status == 200 && c.error.is_none()), "{:#?}", fake.calls());
}

/// A preview post answered 429 and an update limited for a minute never hold up the reply nor
/// send it twice; the preview the limit kept on screen is listed in the home, and the
/// successor deletes it.
#[test]
fn rate_limited_previews_never_hold_up_or_double_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSlack::start(quick()).unwrap();
    fake.flood(1, 1);
    fake.flood_method("chat.update", 1, 60);
    let host = Arc::new(MemHost::echoing());
    *host.state_dir.lock().unwrap() = Some(dir.path().to_owned());
    let o = fake.options();
    let s = Slack::new(&config(&fake.api_base()), o.app_token.clone(), o.bot_token.clone()).unwrap();
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait("connected", Duration::from_secs(10), || s.status().state() == State::Connected);

    s.show("C1", "run-1", Activity::Started);
    s.show("C1", "run-1", Activity::Text("Hello ".into()));
    saw(&fake, "the rate-limited preview", |c| c.method == "chat.postMessage" && c.status == 429);
    saw(&fake, "the preview, after its Retry-After", ok("chat.postMessage", "C1", "Hello …"));
    s.show("C1", "run-1", Activity::Text("world".into()));
    saw(&fake, "the rate-limited update", |c| c.method == "chat.update" && c.status == 429);
    s.show("C1", "run-1", Activity::Ended { replied: true });
    let seq = host.queue_reply("C1", "Hello world.", Some("run-1"));
    s.wake();
    // Well inside chat.update's minute: the outbox is not held by the previews' limit.
    saw(&fake, "the reply", ok("chat.postMessage", "C1", "Hello world."));
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
    assert!(host.outcomes.lock().unwrap().contains(&(seq, Sent::Ok)));
    let preview = posted_ts(&fake, "C1", "Hello …");
    let texts: Vec<String> = fake.visible().into_iter().map(|p| p.text).collect();
    assert_eq!(texts, ["Hello …", "Hello world."], "the preview waits out the limit");
    let listed = std::fs::read_to_string(dir.path().join("previews-slack.json")).unwrap();
    assert!(listed.contains(&preview), "{listed}");

    let s = Slack::new(&config(&fake.api_base()), o.app_token, o.bot_token).unwrap();
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    saw(&fake, "the leftover preview deleted by the successor", deleted("C1", &preview));
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
    let texts: Vec<String> = fake.visible().into_iter().map(|p| p.text).collect();
    assert_eq!(texts, ["Hello world."]);
    let updates = fake.calls().iter().filter(|c| c.method == "chat.update").count();
    assert_eq!(updates, 1, "the held chat was not updated again (nor retried in a loop)");
    assert_eq!(fake.calls().iter().filter(|c| c.text.as_deref() == Some("Hello world.")).count(), 1, "the reply once");
}
