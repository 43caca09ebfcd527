//! The Matrix client against a real Synapse (testkit::servers; `scripts/setup-synapse`).
//! Under `CI` a missing Synapse venv fails these tests; elsewhere they print SKIPPED and pass.
//! A Synapse start costs ~4 s (more on a loaded machine), and nextest runs each test in its own
//! process, so one test runs every scenario on one server, each with its own users and room.
#![cfg(unix)]

use std::time::{Duration, Instant};

use gatewarden_chatproto::matrix::{Client, ErrorKind, SyncBatch, TextMessage};
use gatewarden_testkit::servers::{MatrixUser, Synapse};

const CALL: Duration = Duration::from_secs(20);
/// Bound for "the message arrives" (a round trip measured 0.77 s on Synapse).
const ARRIVES: Duration = Duration::from_secs(30);

fn login(s: &Synapse, u: &MatrixUser, device: &str) -> Client {
    let mut c = Client::new(&s.base_url(), CALL).unwrap();
    let session = c.login_password(&u.localpart, &u.password, Some(device)).unwrap();
    assert_eq!(session.user_id, u.user_id);
    assert_eq!(session.device_id.as_deref(), Some(device));
    c
}

/// Syncs from `since` until `done(all messages so far)` holds; returns them and the last token.
/// Transient errors (a restarting server) are retried until the deadline.
fn sync_until(
    c: &Client,
    since: &str,
    deadline: Duration,
    done: impl Fn(&[TextMessage]) -> bool,
) -> (Vec<TextMessage>, String) {
    let end = Instant::now() + deadline;
    let mut since = since.to_string();
    let mut got = Vec::new();
    while !done(&got) {
        assert!(Instant::now() < end, "not done after {deadline:?}; got {got:?}");
        match c.sync(Some(&since), Duration::from_secs(2)) {
            Ok(SyncBatch { next_batch, messages, .. }) => {
                got.extend(messages);
                since = next_batch;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                // Back off a little so a restarting server is not hammered.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    (got, since)
}

/// alice and bob in a fresh private room, and bob's since token after joining.
struct Room {
    alice_user: MatrixUser,
    alice: Client,
    bob: Client,
    room: String,
    since: String,
}

fn two_users_in_a_room(s: &Synapse, alice: &str, bob: &str) -> Room {
    let (ua, ub) = (s.register(alice, "alice-pw"), s.register(bob, "bob-pw"));
    let alice = login(s, &ua, "ALICEDEV");
    // bob uses the token from his registration, as an adapter configured with a token would.
    let mut bob = Client::new(&s.base_url(), CALL).unwrap();
    bob.set_access_token(ub.access_token.clone());
    assert_eq!(bob.whoami().unwrap().user_id, ub.user_id);

    let room = alice.create_room(&[&ub.user_id]).unwrap();
    let first = bob.sync(None, Duration::ZERO).unwrap();
    assert!(first.invites.contains(&room), "bob's invite to {room} not in {first:?}");
    assert_eq!(bob.join(&room).unwrap(), room);
    // An adapter starting fresh keeps the token and ignores history.
    let since = bob.sync(None, Duration::ZERO).unwrap().next_batch;
    Room { alice_user: ua, alice, bob, room, since }
}

#[test]
fn matrix_client_against_synapse() {
    let Some(mut s) = Synapse::start() else { return };
    eprintln!("scenario: round trip, idempotent resend, rejected credentials");
    round_trip_idempotent_resend_and_rejected_credentials(&s);
    eprintln!("scenario: server stopped is transient, sync resumes after restart");
    server_stopped_is_transient_and_sync_resumes_after_restart(&mut s);
}

fn round_trip_idempotent_resend_and_rejected_credentials(s: &Synapse) {
    let Room { alice_user, alice, bob, room, since } = two_users_in_a_room(s, "alice", "bob");

    // Round trip: alice sends, bob's long-poll returns it.
    let t0 = Instant::now();
    let ev = alice.send_text(&room, "txn-1", "hello bob").unwrap();
    let (got, since) = sync_until(&bob, &since, ARRIVES, |m| m.iter().any(|m| m.event_id == ev));
    eprintln!("matrix send -> sync round trip: {:?}", t0.elapsed());
    let m = got.iter().find(|m| m.event_id == ev).unwrap();
    assert_eq!(
        (m.room_id.as_str(), m.sender.as_str(), m.body.as_str()),
        (room.as_str(), "@alice:localhost", "hello bob")
    );

    // Resending txn-1 (same device, and again after a fresh login on the same device) returns the
    // same event and delivers nothing new; a marker sent after it proves bob has caught up.
    assert_eq!(alice.send_text(&room, "txn-1", "hello bob").unwrap(), ev);
    let alice2 = login(s, &alice_user, "ALICEDEV");
    assert_eq!(alice2.send_text(&room, "txn-1", "hello bob").unwrap(), ev);
    let marker = alice.send_text(&room, "txn-2", "marker").unwrap();
    assert_ne!(marker, ev);
    let (got, since) = sync_until(&bob, &since, ARRIVES, |m| m.iter().any(|m| m.event_id == marker));
    assert!(got.iter().all(|m| m.event_id != ev && m.body != "hello bob"), "resend delivered again: {got:?}");

    // Own messages are filtered: bob's reply reaches alice but not bob's own sync.
    let alice_since = alice.sync(None, Duration::ZERO).unwrap().next_batch;
    let reply = bob.send_text(&room, "bob-1", "hi alice").unwrap();
    let (got, _) = sync_until(&alice, &alice_since, ARRIVES, |m| m.iter().any(|m| m.event_id == reply));
    assert!(got.iter().all(|m| m.sender == "@bob:localhost"), "{got:?}");
    let own = bob.sync(Some(&since), Duration::from_millis(500)).unwrap();
    assert!(own.messages.iter().all(|m| m.event_id != reply), "own echo returned: {own:?}");

    // A long-poll with nothing to deliver returns empty after about its timeout.
    let t = Instant::now();
    let idle = bob.sync(Some(&own.next_batch), Duration::from_secs(1)).unwrap();
    assert!(idle.messages.is_empty(), "{idle:?}");
    assert!(t.elapsed() >= Duration::from_millis(800) && t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // Credentials: a wrong password and an unknown token are rejections, not transient errors.
    let mut bad = Client::new(&s.base_url(), CALL).unwrap();
    let e = bad.login_password("alice", "wrong", None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
    bad.set_access_token("syt_not_a_token");
    let e = bad.whoami().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");

    // Joining a room one was not invited to is a permanent refusal.
    let carol = login(s, &s.register("carol", "carol-pw"), "CAROLDEV");
    let e = carol.join(&room).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

    // Rate limiting: with 1 message per second (burst 1), quick sends soon get a real 429
    // M_LIMIT_EXCEEDED carrying the server's wait; after that wait the same txn id goes through.
    s.limit_messages("@bob:localhost", 1, 1);
    let limited = (0..20)
        .find_map(|i| match bob.send_text(&room, &format!("flood-{i}"), "flood") {
            Ok(_) => None,
            Err(e) => Some((i, e)),
        })
        .map(|(i, e)| {
            assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
            (i, e.retry_after())
        });
    let Some((i, Some(wait))) = limited else { panic!("no 429 with retry_after in 20 quick sends: {limited:?}") };
    // The margin: each send must take under the limit's second for a 429 to come at all.
    eprintln!("matrix: a 429 after {i} quick sends");
    assert!(wait <= Duration::from_secs(5), "{wait:?}");
    let end = Instant::now() + ARRIVES;
    let mut wait = wait;
    loop {
        // Waiting is what the server asked for, not synchronisation.
        std::thread::sleep(wait);
        match bob.send_text(&room, &format!("flood-{i}"), "flood") {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
                assert!(Instant::now() < end, "still limited: {e}");
                wait = e.retry_after().unwrap_or(Duration::from_millis(200));
            }
        }
    }
}

fn server_stopped_is_transient_and_sync_resumes_after_restart(s: &mut Synapse) {
    let Room { alice, bob, room, since, .. } = two_users_in_a_room(s, "alice2", "bob2");
    let before = alice.send_text(&room, "txn-a", "before the outage").unwrap();
    let (_, since) = sync_until(&bob, &since, ARRIVES, |m| m.iter().any(|m| m.event_id == before));

    // A long-poll in flight (or about to start) when the server dies ends with a transient error,
    // well before its own 30 s timeout.
    let poller = bob.clone();
    let token = since.clone();
    let inflight = std::thread::spawn(move || {
        let t = Instant::now();
        (poller.sync(Some(&token), Duration::from_secs(30)), t.elapsed())
    });
    s.stop();
    let (res, took) = inflight.join().unwrap();
    let e = res.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(took < Duration::from_secs(15), "in-flight sync took {took:?} to fail");
    let e = alice.send_text(&room, "txn-b", "during the outage").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");

    // Back up: the same clients, tokens and since token work again; the send that failed during
    // the outage is retried with its transaction id and delivered exactly once.
    s.restart();
    let end = Instant::now() + ARRIVES;
    let sent = loop {
        match alice.send_text(&room, "txn-b", "during the outage") {
            Ok(ev) => break ev,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
                assert!(Instant::now() < end, "send still failing after restart: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(alice.send_text(&room, "txn-b", "during the outage").unwrap(), sent);
    let after = alice.send_text(&room, "txn-c", "after the outage").unwrap();
    let (got, _) = sync_until(&bob, &since, ARRIVES, |m| m.iter().any(|m| m.event_id == after));
    let bodies: Vec<&str> = got.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["during the outage", "after the outage"], "{got:?}");
}
