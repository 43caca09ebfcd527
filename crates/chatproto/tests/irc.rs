//! The IRC client against a real ngIRCd (testkit::servers; `scripts/setup-ngircd`).
//! Under `CI` a missing ngircd fails these tests; elsewhere they print SKIPPED and pass.
#![cfg(unix)]

use std::time::{Duration, Instant};

use gatewarden_chatproto::irc::{Config, Connection, Error, ErrorKind, Event, MAX_TEXT_BYTES};
use gatewarden_testkit::servers::Ngircd;

const WAIT: Duration = Duration::from_secs(10);

fn connect(s: &Ngircd, nick: &str) -> Connection {
    let c = Connection::connect(&Config::new(s.addr().to_string(), nick)).unwrap();
    assert_eq!(c.nick(), nick);
    c
}

fn joined(s: &Ngircd, nick: &str, channel: &str) -> Connection {
    let mut c = connect(s, nick);
    c.join(channel, WAIT).unwrap();
    c
}

/// The next PRIVMSG `c` receives within [`WAIT`] as `(from, target, text)`; other events skipped.
fn next_privmsg(c: &mut Connection) -> (String, String, String) {
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no PRIVMSG within {WAIT:?}");
        if let Some(Event::Privmsg { from, target, text, .. }) = c.next_event(left).unwrap() {
            return (from, target, text);
        }
    }
}

#[test]
fn two_clients_exchange_channel_and_private_messages() {
    let Some(s) = Ngircd::start() else { return };
    let mut a = joined(&s, "gw_alice", "#gw");
    let mut b = joined(&s, "gw_bob", "#gw");

    assert_eq!(a.privmsg("#gw", "hello from alice").unwrap(), 1);
    assert_eq!(next_privmsg(&mut b), ("gw_alice".into(), "#gw".into(), "hello from alice".into()));

    b.privmsg("gw_alice", "psst, privately").unwrap();
    assert_eq!(next_privmsg(&mut a), ("gw_bob".into(), "gw_alice".into(), "psst, privately".into()));

    // A long multi-byte message arrives as several PRIVMSGs, cut at spaces, none over the limit
    // (the server would otherwise truncate at 512 bytes and cut a char).
    let long: String = "état ünïcödé 🦀 ".repeat(60).trim_end().to_string();
    let sent = a.privmsg("#gw", &long).unwrap();
    assert!(sent >= 3, "{} bytes sent as {sent} lines", long.len());
    let mut got = Vec::new();
    for _ in 0..sent {
        let (_, _, text) = next_privmsg(&mut b);
        assert!(text.len() <= MAX_TEXT_BYTES, "{} bytes", text.len());
        got.push(text);
    }
    assert_eq!(got.join(" "), long);

    // A newline in a reply becomes two messages, never a second command.
    assert_eq!(a.privmsg("#gw", "line one\nJOIN #evil").unwrap(), 2);
    assert_eq!(next_privmsg(&mut b).2, "line one");
    assert_eq!(next_privmsg(&mut b).2, "JOIN #evil");
}

#[test]
fn nick_collision_is_a_typed_conflict_until_the_holder_leaves() {
    let Some(s) = Ngircd::start() else { return };
    let holder = connect(&s, "gw_bot");
    let e = Connection::connect(&Config::new(s.addr().to_string(), "gw_bot")).unwrap_err();
    assert!(matches!(&e, Error::NickInUse { nick } if nick == "gw_bot"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Conflict);

    // Once the holder quits, the same nick registers (the server processes the QUIT
    // asynchronously, so retry with a deadline; every failure until then must be the conflict).
    holder.quit("handing over");
    let end = Instant::now() + WAIT;
    let c = loop {
        match Connection::connect(&Config::new(s.addr().to_string(), "gw_bot")) {
            Ok(c) => break c,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
                assert!(Instant::now() < end, "nick still in use after the holder quit");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert_eq!(c.nick(), "gw_bot");
}

#[test]
fn server_killed_is_an_error_and_clients_reconnect_after_restart() {
    let Some(mut s) = Ngircd::start() else { return };
    let mut a = joined(&s, "gw_a", "#gw");
    let _b = joined(&s, "gw_b", "#gw");

    s.stop();
    let t = Instant::now();
    let e = loop {
        // Events already queued (b's JOIN) may come first; the error must follow promptly.
        match a.next_event(WAIT) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error within {WAIT:?} after the server was killed"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(t.elapsed() < WAIT, "{:?}", t.elapsed());
    let e = Connection::connect(&Config::new(s.addr().to_string(), "gw_a")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "connect to a dead server: {e}");

    s.restart();
    let mut a = joined(&s, "gw_a", "#gw");
    let mut b = joined(&s, "gw_b", "#gw");
    a.privmsg("#gw", "back online").unwrap();
    assert_eq!(next_privmsg(&mut b), ("gw_a".into(), "#gw".into(), "back online".into()));
}

#[test]
fn join_refusal_is_typed() {
    let Some(s) = Ngircd::start() else { return };
    let mut c = connect(&s, "gw_joiner");
    // ngIRCd refuses channel names without a valid prefix with 403 (no such channel).
    let e = c.join("nochannelprefix", WAIT).unwrap_err();
    assert!(matches!(&e, Error::JoinRefused { code, .. } if code == "403"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Permanent);
}
