//! The Mattermost adapter against the in-repo fake (crates/testkit/src/mattermostfake.rs) with
//! the in-memory host: a refused journal commit loses nothing (the WebSocket does not send a
//! post again, the read-back does), a channel the server will not let the bot read back is
//! named as a gap, and long read-backs page.

#![cfg(unix)]

mod support;
use support::{MemHost, wait_for};

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::mattermost::Mattermost;
use gatewarden_platforms::{Adapter, Host, State};
use gatewarden_testkit::mattermostfake::{FakeMattermost, Options};

fn start(fake: &FakeMattermost, host: &Arc<MemHost>) -> Arc<Mattermost> {
    let cfg = PlatformConfig {
        token_env: Some("UNUSED".into()),
        ..PlatformConfig::with(platform::Mattermost { server: Some(fake.server()) })
    };
    let m = Arc::new(Mattermost::new(&cfg, fake.options().token).unwrap());
    m.start(Arc::clone(host) as Arc<dyn Host>).unwrap();
    wait_for("connected", Duration::from_secs(10), || m.status().state() == State::Connected);
    // The read-back after the connect is done: what follows comes on the WebSocket.
    wait_for("the first read-back", Duration::from_secs(10), || fake.stats().channel_lists >= 1);
    m
}

fn echoes(fake: &FakeMattermost, text: &str) -> usize {
    fake.bot_posts().iter().filter(|p| p.message == format!("echo: {text}")).count()
}

#[test]
fn a_refused_commit_is_read_back_and_journaled_once() {
    let fake = FakeMattermost::start(Options::default()).unwrap();
    let host = Arc::new(MemHost::echoing());
    let m = start(&fake, &host);
    *host.refuse.lock().unwrap() = true;
    fake.user_post("chan1", "u1", "keep me", None);
    wait_for("degraded", Duration::from_secs(10), || {
        host.states.lock().unwrap().iter().any(|s| s.reason().is_some_and(|r| r.contains("cannot journal")))
    });
    let lists = fake.stats().channel_lists;
    *host.refuse.lock().unwrap() = false;
    wait_for("answered", Duration::from_secs(10), || echoes(&fake, "keep me") == 1);
    assert!(fake.stats().channel_lists > lists, "read back: {:?}", fake.stats());
    wait_for("connected", Duration::from_secs(10), || m.status().state() == State::Connected);
    fake.user_post("chan1", "u1", "and then", None);
    wait_for("answered", Duration::from_secs(10), || echoes(&fake, "and then") == 1);
    assert_eq!(echoes(&fake, "keep me"), 1);
    m.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn a_channel_that_cannot_be_read_back_is_a_gap_and_the_others_are_read() {
    let opts = Options { since_limit: 3, ..Options::default() };
    let fake = FakeMattermost::start(opts).unwrap();
    let host = Arc::new(MemHost::echoing());
    let m = start(&fake, &host);
    fake.forbid("secret");
    // Dropped on the WebSocket: only a read-back finds them, 8 in chan2 over pages of 3; the
    // next event's `seq` shows the gap.
    fake.skip_events(9);
    fake.user_post("secret", "u1", "unreadable", None);
    for i in 0..8 {
        fake.user_post("chan2", "u1", &format!("paged {i}"), None);
    }
    fake.user_post("chan2", "u1", "the gap shows", None);
    wait_for("gap", Duration::from_secs(10), || {
        host.states.lock().unwrap().iter().any(|s| s.reason().is_some_and(|r| r.contains("not read back from secret")))
    });
    for i in 0..8 {
        let t = format!("paged {i}");
        wait_for(&t, Duration::from_secs(10), || echoes(&fake, &t) == 1);
    }
    assert_eq!(echoes(&fake, "unreadable"), 0);
    fake.user_post("chan2", "u1", "after", None);
    wait_for("after", Duration::from_secs(10), || echoes(&fake, "after") == 1);
    wait_for("connected again", Duration::from_secs(10), || m.status().state() == State::Connected);
    assert!(fake.stats().since_calls >= 4, "paged: {:?}", fake.stats());
    m.close(Instant::now() + Duration::from_secs(3));
}
