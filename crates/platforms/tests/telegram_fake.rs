//! The Telegram adapter against the fake Bot API, with an in-memory host: commit-before-confirm,
//! conflicts, flood control, a server that dies and comes back, rejected credentials.

mod support;
use support::{MemHost, wait_for};

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::telegram::Telegram;
use gatewarden_platforms::{Activity, Adapter, Host, Outgoing, State};
use gatewarden_telegram_fake::{FakeTelegram, Options};

const TOKEN: &str = "123456:test-token";

fn config(base: &str, conflict_s: u64) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: conflict_s,
        ..PlatformConfig::with(platform::Telegram {
            api_base: Some(base.into()),
            poll_timeout_s: 2,
            ..platform::Telegram::default()
        })
    }
}

fn start(fake: &FakeTelegram, conflict_s: u64) -> (Arc<Telegram>, Arc<MemHost>) {
    let host = Arc::new(MemHost::echoing());
    let t = Arc::new(Telegram::new(&config(&fake.base_url(), conflict_s), TOKEN.into()).unwrap());
    t.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    (t, host)
}

#[test]
fn round_trip_and_offset_confirmed_only_after_commit() {
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(300), ..Options::default() }).unwrap();
    let (t, host) = start(&fake, 30);
    wait_for("connected", Duration::from_secs(5), || t.status().state() == State::Connected);
    fake.inject(TOKEN, 7, 42, "hi");
    let sent = fake.wait_sent(TOKEN, Duration::from_secs(5), |s| !s.is_empty()).unwrap();
    assert_eq!(sent[0].text, "echo: hi");
    assert_eq!(sent[0].chat_id, serde_json::json!(7));

    // A commit that fails leaves the update unconfirmed on the server…
    *host.refuse.lock().unwrap() = true;
    fake.inject(TOKEN, 7, 42, "second");
    wait_for("degraded", Duration::from_secs(5), || matches!(t.status().state(), State::Degraded(_)));
    assert_eq!(fake.stats(TOKEN).pending, 1, "an uncommitted update must not be confirmed");
    // …and it is delivered once the journal works again.
    *host.refuse.lock().unwrap() = false;
    fake.wait_sent(TOKEN, Duration::from_secs(10), |s| s.iter().any(|m| m.text == "echo: second")).unwrap();
    wait_for("connected again", Duration::from_secs(5), || t.status().state() == State::Connected);

    // Drain: intake stops at once (our own long poll is ended), then the outbox flushes.
    let t0 = Instant::now();
    t.stop_intake();
    assert!(t.close(Instant::now() + Duration::from_secs(3)));
    assert!(t0.elapsed() < Duration::from_secs(2), "stop took {:?}", t0.elapsed());
    assert_eq!(fake.stats(TOKEN).pending, 0, "the committed offset was confirmed on the way out");
    assert_eq!(host.inbox.lock().unwrap().len(), 2);
}

#[test]
fn persistent_conflict_means_standby_and_recovery_after() {
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(200), ..Options::default() }).unwrap();
    fake.set_webhook(TOKEN, Some("https://example.invalid/hook"));
    let (t, _host) = start(&fake, 1);
    wait_for("standby", Duration::from_secs(10), || matches!(t.status().state(), State::Standby(_)));
    let reason = t.status().state().reason().unwrap_or_default().to_owned();
    assert!(reason.contains("another consumer is active") && reason.contains("webhook"), "{reason}");
    // The adapter never deleted the webhook nor dropped updates.
    fake.inject(TOKEN, 1, 1, "queued while standing by");
    assert_eq!(fake.stats(TOKEN).pending, 1);
    fake.set_webhook(TOKEN, None);
    fake.wait_sent(TOKEN, Duration::from_secs(10), |s| s.iter().any(|m| m.text == "echo: queued while standing by"))
        .unwrap();
    assert_eq!(t.status().state(), State::Connected);
    t.close(Instant::now() + Duration::from_secs(2));
}

#[test]
fn flood_control_and_server_death_are_survived() {
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(200), ..Options::default() }).unwrap();
    let (t, _host) = start(&fake, 30);
    wait_for("connected", Duration::from_secs(5), || t.status().state() == State::Connected);
    fake.kill();
    wait_for("degraded", Duration::from_secs(10), || matches!(t.status().state(), State::Degraded(_)));
    fake.inject(TOKEN, 3, 3, "while down");
    fake.revive().unwrap();
    fake.wait_sent(TOKEN, Duration::from_secs(20), |s| s.iter().any(|m| m.text == "echo: while down")).unwrap();
    // 429 with retry_after: the send waits and goes through once.
    fake.flood(TOKEN, 1, 1);
    fake.inject(TOKEN, 3, 3, "flooded");
    fake.wait_sent(TOKEN, Duration::from_secs(10), |s| s.iter().any(|m| m.text == "echo: flooded")).unwrap();
    assert_eq!(fake.sent(TOKEN).iter().filter(|m| m.text == "echo: flooded").count(), 1);
    t.close(Instant::now() + Duration::from_secs(2));
}

#[test]
fn rejected_credentials_park_the_adapter() {
    let fake = FakeTelegram::start(Options::default()).unwrap();
    fake.revoke(TOKEN);
    let (t, _host) = start(&fake, 30);
    wait_for("parked", Duration::from_secs(5), || matches!(t.status().state(), State::Parked(_)));
    assert!(t.status().state().reason().unwrap_or_default().contains("Unauthorized"));
    t.close(Instant::now() + Duration::from_secs(1));
}

/// A cluster active's receive budget bounds every long poll; without budget the adapter does
/// not poll, and its stop does not send the terminating poll (a successor may be polling);
/// `start` after `close` starts afresh and receives again.
#[test]
fn polls_follow_the_receive_budget_and_start_after_close_works() {
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(300), ..Options::default() }).unwrap();
    let host = Arc::new(MemHost::echoing());
    *host.budget.lock().unwrap() = Some(Duration::from_millis(1500));
    let cfg = config(&format!("{}/c/a", fake.base_url()), 30);
    let t = Arc::new(Telegram::new(&cfg, TOKEN.into()).unwrap());
    t.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait_for("three polls", Duration::from_secs(10), || fake.polls(TOKEN).len() >= 3);
    let polls = fake.polls(TOKEN);
    assert!(polls.iter().all(|p| p.consumer == "a" && p.timeout_s == 1), "{polls:#?}");

    // Under a second left: no poll at all.
    *host.budget.lock().unwrap() = Some(Duration::from_millis(300));
    wait_for("the last budgeted poll ends", Duration::from_secs(5), || {
        fake.polls(TOKEN).iter().all(|p| p.end.is_some())
    });
    let before = fake.polls(TOKEN).len();
    fake.inject(TOKEN, 7, 42, "held back");
    // An observation window for an absence: three would-be polls long.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(fake.polls(TOKEN).len(), before, "polled without budget");
    assert!(host.inbox.lock().unwrap().is_empty());

    // Stopping without budget (demoted) sends no terminating getUpdates either.
    *host.budget.lock().unwrap() = Some(Duration::ZERO);
    t.stop_intake();
    assert!(t.close(Instant::now() + Duration::from_secs(3)));
    assert_eq!(fake.polls(TOKEN).len(), before, "a stop without budget must not poll");
    assert_eq!(t.status().state(), State::Closed);

    // Started again (a new promotion): new threads, and the message arrives.
    *host.budget.lock().unwrap() = None;
    t.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    fake.wait_sent(TOKEN, Duration::from_secs(10), |s| s.iter().any(|m| m.text == "echo: held back")).unwrap();
    wait_for("connected", Duration::from_secs(5), || t.status().state() == State::Connected);
    assert!(fake.polls(TOKEN).iter().skip(before).any(|p| p.timeout_s == 2), "unbudgeted polls use poll_timeout_s");
    t.stop_intake();
    assert!(t.close(Instant::now() + Duration::from_secs(3)));
    assert_eq!(fake.stats(TOKEN).pending, 0, "the stop with budget confirmed the offset");
}

/// A 429 on a preview edit holds the chat for its `retry_after`: the edit is not retried in a
/// loop, the next one (with the newer text) comes once the wait is over; an edit that changes
/// nothing never reaches the API; the reply then replaces the preview.
#[test]
fn a_flooded_preview_edit_is_waited_out_not_retried() {
    let fake = FakeTelegram::start(Options::default()).unwrap();
    let host = Arc::new(MemHost::silent());
    let a = Telegram::new(&config(&fake.base_url(), 30), TOKEN.into()).unwrap();
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait_for("connected", Duration::from_secs(10), || a.status().state() == State::Connected);
    a.show("5", "run", Activity::Started);
    a.show("5", "run", Activity::Text("one".into()));
    wait_for("a preview", Duration::from_secs(10), || fake.sent(TOKEN).len() == 1);
    fake.flood_method(TOKEN, "editMessageText", 3, 1);
    a.show("5", "run", Activity::Text(" two".into()));
    wait_for("the flooded edit", Duration::from_secs(10), || fake.calls(TOKEN, "editMessageText").len() == 1);
    a.show("5", "run", Activity::Text(" three".into()));
    wait_for("the edit after the wait", Duration::from_secs(10), || fake.edits(TOKEN).len() == 1);
    let calls = fake.calls(TOKEN, "editMessageText");
    assert_eq!(calls.len(), 2, "one flooded call, one after the wait: {calls:?}");
    assert!(calls[1].duration_since(calls[0]) >= Duration::from_millis(2900), "retry_after honoured: {calls:?}");
    assert_eq!(fake.edits(TOKEN)[0].text, "one two three …", "the newest text, not the refused one");

    a.show("5", "run", Activity::Ended { replied: true });
    host.outbox.lock().unwrap().push(Outgoing {
        seq: 100,
        chat_id: "5".into(),
        text: "one two three.".into(),
        message_id: Some("run".into()),
        created_at: String::new(),
    });
    a.wake();
    let only_reply = || fake.visible(TOKEN).iter().map(|m| m.text.clone()).collect::<Vec<_>>() == ["one two three."];
    wait_for("the reply, the preview deleted", Duration::from_secs(10), only_reply);
    assert!(fake.actions(TOKEN).iter().all(|x| x.action == "typing") && !fake.actions(TOKEN).is_empty());
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}
