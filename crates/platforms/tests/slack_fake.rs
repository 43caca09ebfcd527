//! The Slack adapter against the fake Slack (crates/testkit/src/slackfake.rs), with an
//! in-memory host: acknowledgement only after the commit, redelivery journaled once, threads,
//! filters, refresh without a gap over several connections, rate limits, a fake killed and
//! revived, refused tokens and `link_disabled`.
#![cfg(unix)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, PlatformKind};
use gatewarden_platforms::slack::Slack;
use gatewarden_platforms::{Adapter, Host, Sent, State};
use gatewarden_testkit::slackfake::{FakeSlack, Options};
use serde_json::json;
use support::{MemHost, wait_for as wait};

fn config(base: &str) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        api_base: Some(base.into()),
        conflict_standby_s: 30,
        bot_token_env: Some("UNUSED_TOO".into()),
        ..PlatformConfig::new(PlatformKind::Slack)
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

#[test]
fn only_allowed_channels_are_answered_and_start_after_close_works() {
    let fake = FakeSlack::start(quick()).unwrap();
    let mut cfg = config(&fake.api_base());
    cfg.allowed_chats = vec!["C1".into()];
    let (s, host) = start(&fake, cfg);
    fake.user_message("C2", "U1", "elsewhere", None);
    fake.user_message("C1", "U1", "in a thread here", Some("9.0"));
    fake.wait_posted(1, Duration::from_secs(10)).unwrap();
    wait("both acknowledged", Duration::from_secs(10), || fake.stats().pending == 0);
    assert!(s.close(Instant::now() + Duration::from_secs(3)));
    // Closed: what arrives now waits unacknowledged for the next start.
    fake.user_message("C1", "U1", "after close", None);
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    fake.wait_posted(2, Duration::from_secs(10)).unwrap();
    assert_eq!(texts(&fake), ["echo: in a thread here", "echo: after close"]);
    assert_eq!(host.inbox.lock().unwrap().len(), 2);
    s.close(Instant::now() + Duration::from_secs(3));
}
