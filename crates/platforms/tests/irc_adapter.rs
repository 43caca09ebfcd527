//! The IRC adapter against a real ngIRCd (testkit::servers), with an in-memory host: inbound
//! routing and event ids, an unsendable target refused for good, newlines as separate lines,
//! flood control on the wire, and the QUIT at close.
#![cfg(unix)]

mod support;
use support::{MemHost, wait};

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_chatproto::irc::{Config, Connection, Event};
use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::irc::{FLOOD_BURST, FLOOD_EVERY, Irc};
use gatewarden_platforms::{Adapter, Sent, State};
use gatewarden_testkit::servers::Ngircd;

const WAIT: Duration = Duration::from_secs(10);

/// The next `n` PRIVMSG texts from the bot, with the time the last one arrived.
fn bot_lines(c: &mut Connection, n: usize) -> (Vec<String>, Instant) {
    let end = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "only {got:?} within {WAIT:?}");
        if let Some(Event::Privmsg { from, text, .. }) = c.next_event(left).unwrap()
            && from == "gwbot"
        {
            got.push(text);
        }
    }
    (got, Instant::now())
}

#[test]
fn routes_inbound_refuses_bad_targets_paces_lines_and_quits() {
    let Some(s) = Ngircd::start() else { return };
    let mut alice = Connection::connect(&Config::new(s.addr().to_string(), "alice")).unwrap();
    alice.join("#gw", WAIT).unwrap();
    let cfg = PlatformConfig {
        allowed_chats: vec!["#gw".into()],
        conflict_standby_s: 5,
        ..PlatformConfig::with(platform::Irc {
            server: Some(s.addr().to_string()),
            nick: Some("gwbot".into()),
            ..platform::Irc::default()
        })
    };
    let irc = Irc::new(&cfg, None, None).unwrap();
    assert_eq!(irc.credential(), format!("{}/gwbot", s.addr()));
    let host = Arc::new(MemHost::silent());
    irc.start(host.clone()).unwrap();
    wait("connected", || irc.status().state() == State::Connected);
    wait(
        "the bot's JOIN",
        || matches!(alice.next_event(Duration::from_millis(50)), Ok(Some(Event::Join { nick, .. })) if nick == "gwbot"),
    );

    // Inbound: the channel and a private message, each with a per-connection event id.
    alice.privmsg("#gw", "in the channel").unwrap();
    alice.privmsg("gwbot", "privately").unwrap();
    wait("two inbound messages", || host.inbox.lock().unwrap().len() == 2);
    let inbox = host.inbox.lock().unwrap().clone();
    assert_eq!((inbox[0].chat_id.as_str(), inbox[0].user_id.as_str()), ("#gw", "alice"));
    assert_eq!((inbox[1].chat_id.as_str(), inbox[1].text.as_str()), ("alice", "privately"));
    assert!(inbox[0].event_id.ends_with(":1") && inbox[1].event_id.ends_with(":2"), "{inbox:?}");
    assert_eq!(inbox[0].event_id.rsplit_once(':').unwrap().0, inbox[1].event_id.rsplit_once(':').unwrap().0);

    // A target that cannot go on the wire is refused for good; a newline makes two lines.
    host.queue("bad target", "never");
    host.queue("#gw", "first line\nsecond line");
    irc.wake();
    let (lines, _) = bot_lines(&mut alice, 2);
    assert_eq!(lines, vec!["first line", "second line"]);
    wait("both outcomes", || host.outcomes.lock().unwrap().len() == 2);
    let outcomes = host.outcomes.lock().unwrap().clone();
    assert!(matches!(&outcomes[0], (1, Sent::Rejected(_))), "{outcomes:?}");
    assert_eq!(outcomes[1], (2, Sent::Ok));

    // Flood control: past the burst, one line per FLOOD_EVERY.
    std::thread::sleep(FLOOD_EVERY * FLOOD_BURST); // a full bucket
    let n = FLOOD_BURST as usize + 4;
    for i in 0..n {
        host.queue("#gw", &format!("line {i}"));
    }
    let t0 = Instant::now();
    irc.wake();
    let (lines, last) = bot_lines(&mut alice, n);
    assert_eq!(lines, (0..n).map(|i| format!("line {i}")).collect::<Vec<_>>());
    let took = last - t0;
    assert!(took >= FLOOD_EVERY * 3, "{n} lines in {took:?}: not paced");

    // Close: the outbox is empty, the bot QUITs.
    assert!(irc.close(Instant::now() + Duration::from_secs(3)));
    assert_eq!(irc.status().state(), State::Closed);
    wait(
        "the bot's QUIT",
        || matches!(alice.next_event(Duration::from_millis(50)), Ok(Some(Event::Other(m))) if m.command == "QUIT" && m.nick() == Some("gwbot")),
    );
}
