//! The XMPP adapter against a real prosody (testkit::prosody, STARTTLS with a CA made here),
//! with an in-memory host: direct chats and a room both ways, our own room echo and the room's
//! history ignored, what arrives while the adapter is stopped fetched from the archive exactly
//! once, the server killed and revived, refused credentials parked, an untrusted certificate
//! refused; a run at work shown (XEP-0085 chat states, a preview corrected by XEP-0308 and
//! retracted by XEP-0424), and users' corrections and retractions not taken for prompts.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_chatproto::xmpp::{
    self as x, BareJid, Config, Connection, Element, Kind, NS_CHATSTATES, NS_CORRECT, NS_FALLBACK, NS_HINTS,
    NS_RETRACT, NS_SID, Outgoing,
};
use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::xmpp::Xmpp;
use gatewarden_platforms::{Activity, Adapter, Host, Inbound, Outgoing as OutboxEntry, Sent, State};
use gatewarden_testkit::prosody::{MUC_DOMAIN, Prosody};
use gatewarden_testkit::tls::{TestCa, Validity};

const WAIT: Duration = Duration::from_secs(15);

struct MemHost {
    inbox: Mutex<Vec<Inbound>>,
    outbox: Mutex<Vec<OutboxEntry>>,
    outcomes: Mutex<Vec<(i64, Sent)>>,
    state_dir: PathBuf,
}

impl MemHost {
    fn new(state_dir: &Path) -> Arc<MemHost> {
        Arc::new(MemHost {
            inbox: Mutex::default(),
            outbox: Mutex::default(),
            outcomes: Mutex::default(),
            state_dir: state_dir.to_owned(),
        })
    }

    fn queue(&self, seq: i64, chat: &str, text: &str) {
        let o =
            OutboxEntry { seq, chat_id: chat.into(), text: text.into(), message_id: None, created_at: String::new() };
        self.outbox.lock().unwrap().push(o);
    }

    /// A reply that answers `run` (its preview goes once it is sent).
    fn queue_reply(&self, seq: i64, chat: &str, text: &str, run: &str) {
        let o = OutboxEntry {
            seq,
            chat_id: chat.into(),
            text: text.into(),
            message_id: Some(run.into()),
            created_at: String::new(),
        };
        self.outbox.lock().unwrap().push(o);
    }

    fn texts(&self) -> Vec<String> {
        self.inbox.lock().unwrap().iter().map(|m| m.text.clone()).collect()
    }
}

impl Host for MemHost {
    fn deliver(&self, _adapter: &str, msg: Inbound) -> Result<(), String> {
        // The journal's deduplication by event id.
        let mut inbox = self.inbox.lock().unwrap();
        if !inbox.iter().any(|m| m.event_id == msg.event_id) {
            inbox.push(msg);
        }
        Ok(())
    }
    fn outbox(&self, _adapter: &str, limit: usize) -> Result<Vec<OutboxEntry>, String> {
        Ok(self.outbox.lock().unwrap().iter().take(limit).cloned().collect())
    }
    fn sent(&self, seq: i64, outcome: Sent) {
        self.outbox.lock().unwrap().retain(|o| o.seq != seq);
        self.outcomes.lock().unwrap().push((seq, outcome));
    }
    fn state_changed(&self, _adapter: &str, _state: &State) {}
    fn state_dir(&self) -> Option<PathBuf> {
        Some(self.state_dir.clone())
    }
}

#[track_caller]
fn wait(what: &str, mut f: impl FnMut() -> bool) {
    assert!(gatewarden_testkit::wait_until(WAIT, &mut f), "timed out waiting for {what}");
}

/// A server with a bot and a person, a CA the clients trust, and a room name.
struct Rig {
    server: Prosody,
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    room: String,
}

fn rig() -> Option<Rig> {
    let ca = TestCa::new("gatewarden xmpp test CA");
    let leaf = ca.leaf(&["localhost", MUC_DOMAIN], Validity::Now);
    let server = Prosody::start(&leaf.cert_pem, &leaf.key_pem)?;
    server.register("gwbot", "bot-secret");
    server.register("alice", "alice-secret");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    Some(Rig { server, dir, ca_file, room: format!("gw@{MUC_DOMAIN}") })
}

impl Rig {
    fn platform(&self) -> PlatformConfig {
        PlatformConfig {
            name: Some("xmpp".into()),
            token_env: Some("XMPP_PASSWORD".into()),
            conflict_standby_s: 5,
            ca_file: Some(self.ca_file.clone()),
            ..PlatformConfig::with(platform::Xmpp {
                server: Some(self.server.addr().to_string()),
                nick: Some("gw".into()),
                jid: Some("gwbot@localhost".into()),
                rooms: vec![self.room.clone()],
                ..platform::Xmpp::default()
            })
        }
    }

    fn adapter(&self, password: &str) -> Xmpp {
        Xmpp::new(&self.platform(), password.into()).unwrap()
    }

    /// The bot's adapter, started on a fresh in-memory host and connected.
    fn connected(&self) -> (Xmpp, Arc<MemHost>) {
        let host = MemHost::new(&self.state_dir());
        let xmpp = self.adapter("bot-secret");
        xmpp.start(host.clone()).unwrap();
        wait("connected", || xmpp.status().state() == State::Connected);
        (xmpp, host)
    }

    /// Alice, connected, present, in the room.
    fn alice(&self) -> Connection {
        let tls = gatewarden_net::ClientTls::from_ca_file(&self.ca_file).unwrap();
        let jid = BareJid::parse("alice@localhost").unwrap();
        let mut c = Connection::connect(&Config::new(self.server.addr().to_string(), jid, "alice-secret".into(), tls))
            .expect("alice connects");
        assert!(c.stream_management(), "prosody 0.12 offers XEP-0198 and the client enables it");
        c.presence().unwrap();
        c.join(&BareJid::parse(&self.room).unwrap(), "alice", WAIT).unwrap();
        c
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

fn say(c: &mut Connection, to: &str, groupchat: bool, body: &str) {
    c.send_stanza(&x::message_xml(&Outgoing { to, groupchat, body, id: &x::new_id() }).unwrap()).unwrap();
}

/// The next message bodies from `from` (bare JID or occupant JID prefix) that `c` receives.
fn bodies_from(c: &mut Connection, from: &str, n: usize) -> Vec<String> {
    let end = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "only {got:?} from {from} within {WAIT:?}");
        let Some(m) = c.next_stanza(left).unwrap() else { continue };
        if m.name == "message"
            && m.attr("from").is_some_and(|f| f.starts_with(from))
            && let Some(b) = m.child("body", x::xml::NS_CLIENT)
        {
            assert!(m.child("origin-id", NS_SID).is_some(), "every reply carries an origin-id");
            got.push(b.text.clone());
        }
    }
    got
}

/// Reads until a message from `from` with `body` arrives.
fn until_body(c: &mut Connection, from: &str, body: &str) {
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {body:?} from {from} within {WAIT:?}");
        let Some(m) = c.next_stanza(left).unwrap() else { continue };
        if m.attr("from").is_some_and(|f| f.starts_with(from))
            && m.child("body", x::xml::NS_CLIENT).is_some_and(|b| b.text == body)
        {
            return;
        }
    }
}

#[test]
fn direct_chats_and_rooms_both_ways_without_our_echo() {
    let Some(rig) = rig() else { return };
    let mut alice = rig.alice();
    // History in the room before the bot joins: never answered.
    say(&mut alice, &rig.room, true, "old news");
    let xmpp = rig.adapter("bot-secret");
    assert_eq!(xmpp.credential(), "gwbot@localhost");
    let host = MemHost::new(&rig.state_dir());
    xmpp.start(host.clone()).unwrap();
    wait("connected", || xmpp.status().state() == State::Connected);

    say(&mut alice, "gwbot@localhost", false, "hello bot");
    say(&mut alice, &rig.room, true, "hello room");
    wait("two inbound messages", || host.inbox.lock().unwrap().len() == 2);
    let inbox = host.inbox.lock().unwrap().clone();
    let direct = inbox.iter().find(|m| m.text == "hello bot").expect("the direct message");
    assert_eq!((direct.chat_id.as_str(), direct.user_id.as_str()), ("alice@localhost", "alice@localhost"));
    assert!(direct.event_id.starts_with("o:alice@localhost:"), "{direct:?}");
    let room = inbox.iter().find(|m| m.text == "hello room").expect("the room message");
    assert_eq!(
        (room.chat_id.as_str(), room.user_id.as_str()),
        (rig.room.as_str(), format!("{}/alice", rig.room).as_str())
    );

    // Replies: a chat message to alice, a groupchat message to the room (whose echo the bot
    // ignores); markup in a reply is text.
    host.queue(1, "alice@localhost", "reply <b>&</b>");
    host.queue(2, &rig.room, "to the room");
    xmpp.wake();
    assert_eq!(bodies_from(&mut alice, "gwbot@localhost", 1), vec!["reply <b>&</b>"]);
    assert_eq!(bodies_from(&mut alice, &format!("{}/gw", rig.room), 1), vec!["to the room"]);
    wait("both sent", || host.outcomes.lock().unwrap().len() == 2);
    assert!(host.outcomes.lock().unwrap().iter().all(|(_, s)| *s == Sent::Ok));
    // A marker after the echo: once it is in, the echo has been read (and ignored).
    say(&mut alice, &rig.room, true, "marker");
    wait("the marker", || host.texts().contains(&"marker".to_owned()));
    let texts = host.texts();
    assert!(!texts.iter().any(|t| t == "to the room" || t == "old news"), "echo or history answered: {texts:?}");
    assert_eq!(texts.len(), 3, "{texts:?}");

    assert!(xmpp.close(Instant::now() + Duration::from_secs(3)));
    assert_eq!(xmpp.status().state(), State::Closed);
}

#[test]
fn what_arrives_while_stopped_comes_from_the_archive_once() {
    let Some(rig) = rig() else { return };
    let mut alice = rig.alice();
    let (first, host) = rig.connected();
    say(&mut alice, "gwbot@localhost", false, "before");
    say(&mut alice, &rig.room, true, "room before");
    wait("two before the stop", || host.inbox.lock().unwrap().len() == 2);
    assert!(first.close(Instant::now() + Duration::from_secs(3)));
    let saved = rig.state_dir().join("xmpp-xmpp.json");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&saved).expect("the saved archive position").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // Stopped: three direct messages and two in the room go to the archives only.
    for i in 0..3 {
        say(&mut alice, "gwbot@localhost", false, &format!("missed {i}"));
    }
    say(&mut alice, &rig.room, true, "room missed 0");
    say(&mut alice, &rig.room, true, "room missed 1");
    // Every one archived before the successor starts: alice's own copy of the room's echo of
    // her last message, and a round trip through her server for the direct ones.
    until_body(&mut alice, &format!("{}/alice", rig.room), "room missed 1");

    // The successor: a fresh host view (a journal that remembers the first two event ids).
    let second = rig.adapter("bot-secret");
    second.start(host.clone()).unwrap();
    wait("the five missed messages", || host.inbox.lock().unwrap().len() == 7);
    let texts = host.texts();
    for t in ["missed 0", "missed 1", "missed 2", "room missed 0", "room missed 1"] {
        assert_eq!(texts.iter().filter(|x| *x == t).count(), 1, "{t}: {texts:?}");
    }
    // From the archive, with its timestamp (the lag in status).
    let missed = host.inbox.lock().unwrap().iter().find(|m| m.text == "missed 0").cloned().unwrap();
    assert!(missed.sent_at.is_some(), "{missed:?}");
    // Live again, and nothing answered twice (the counting host would show a second copy of an
    // event with another id).
    say(&mut alice, "gwbot@localhost", false, "live again");
    wait("live again", || host.texts().contains(&"live again".to_owned()));
    assert_eq!(host.inbox.lock().unwrap().len(), 8, "{:?}", host.texts());
    assert!(second.close(Instant::now() + Duration::from_secs(3)));
}

#[test]
fn a_killed_server_degrades_and_recovers_with_the_outage_from_the_archive() {
    let Some(mut rig) = rig() else { return };
    let host = MemHost::new(&rig.state_dir());
    let xmpp = rig.adapter("bot-secret");
    xmpp.start(host.clone()).unwrap();
    wait("connected", || xmpp.status().state() == State::Connected);
    rig.server.stop();
    wait("degraded", || matches!(xmpp.status().state(), State::Degraded(_)));
    rig.server.restart();
    wait("recovered", || xmpp.status().state() == State::Connected);
    let mut alice = rig.alice();
    say(&mut alice, "gwbot@localhost", false, "after the outage");
    wait("the message after the outage", || host.texts() == vec!["after the outage".to_owned()]);
    assert!(xmpp.close(Instant::now() + Duration::from_secs(3)));
}

#[test]
fn refused_credentials_park_and_an_untrusted_certificate_is_refused() {
    let Some(rig) = rig() else { return };
    let host = MemHost::new(&rig.state_dir());
    let wrong = rig.adapter("wrong password");
    wrong.start(host.clone()).unwrap();
    wait("parked", || matches!(wrong.status().state(), State::Parked(_)));
    let State::Parked(why) = wrong.status().state() else { unreachable!() };
    assert!(why.contains("not-authorized"), "{why}");
    assert!(wrong.close(Instant::now() + Duration::from_secs(1)));

    // Another CA: the stream stops at the handshake, degraded with the reason.
    let other = TestCa::new("not the server's CA");
    let mut cfg = rig.platform();
    cfg.ca_file = Some(other.write_pem(rig.dir.path(), "other.pem"));
    let untrusting = Xmpp::new(&cfg, "bot-secret".into()).unwrap();
    untrusting.start(host.clone()).unwrap();
    wait("degraded", || matches!(untrusting.status().state(), State::Degraded(_)));
    let State::Degraded(why) = untrusting.status().state() else { unreachable!() };
    assert!(why.contains("TLS") && why.to_lowercase().contains("certificate"), "{why}");
    assert!(untrusting.close(Instant::now() + Duration::from_secs(1)));
    assert!(host.inbox.lock().unwrap().is_empty());
}

/// Another client binds the bot's resource: the server closes the adapter's stream
/// (`<conflict/>`); from then on the adapter asks before binding and never pushes the other
/// session off (it stays connected, answering the adapter's pings), and it stands by. Once the
/// other session leaves, the adapter connects again.
#[test]
fn another_session_on_our_resource_means_standby_without_pushing_back() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(rig) = rig() else { return };
    let host = MemHost::new(&rig.state_dir());
    let mut cfg = rig.platform();
    cfg.conflict_standby_s = 1;
    let xmpp = Xmpp::new(&cfg, "bot-secret".into()).unwrap();
    xmpp.start(host.clone()).unwrap();
    wait("connected", || xmpp.status().state() == State::Connected);

    let tls = gatewarden_net::ClientTls::from_ca_file(&rig.ca_file).unwrap();
    let holder_cfg = Config::new(
        rig.server.addr().to_string(),
        BareJid::parse("gwbot@localhost").unwrap(),
        "bot-secret".into(),
        tls,
    );
    let mut holder = Connection::connect(&holder_cfg).expect("the other session binds the resource");
    holder.presence().unwrap();
    let (stop, kicked) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None::<String>)));
    let reader = {
        let (stop, kicked) = (Arc::clone(&stop), Arc::clone(&kicked));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Reading answers the adapter's pings.
                if let Err(e) = holder.next_stanza(Duration::from_millis(100)) {
                    *kicked.lock().unwrap() = Some(e.to_string());
                    return None;
                }
            }
            Some(holder)
        })
    };
    wait("standby", || matches!(xmpp.status().state(), State::Standby(_)));
    let State::Standby(why) = xmpp.status().state() else { unreachable!() };
    assert!(why.contains("in use"), "{why}");
    assert!(xmpp.status().snapshot().conflicts >= 2, "{:?}", xmpp.status().snapshot());
    stop.store(true, Ordering::Relaxed);
    let holder = reader.join().unwrap();
    assert_eq!(*kicked.lock().unwrap(), None, "the adapter pushed the other session off");
    holder.expect("still connected").close();
    wait("connected again", || xmpp.status().state() == State::Connected);
    assert!(xmpp.close(Instant::now() + Duration::from_secs(3)));
}

/// Kicked from the room by its owner, the adapter joins it again and keeps serving it; what was
/// said in between is answered once (live or from the room's archive).
#[test]
fn kicked_from_the_room_joins_again() {
    let Some(rig) = rig() else { return };
    // Alice made the room (her join created it): she owns it.
    let mut alice = rig.alice();
    let (xmpp, host) = rig.connected();
    say(&mut alice, &rig.room, true, "before the kick");
    wait("before the kick", || host.texts().contains(&"before the kick".to_owned()));
    let kick = format!(
        "<iq type='set' id='kick1' to='{}'><query xmlns='http://jabber.org/protocol/muc#admin'>\
         <item nick='gw' role='none'><reason>test</reason></item></query></iq>",
        rig.room
    );
    alice.send_stanza(&kick).unwrap();
    say(&mut alice, &rig.room, true, "while kicked");
    // Alice sees the bot leave (kicked: 307) and come back.
    let occupant = format!("{}/gw", rig.room);
    let (mut left, mut back) = (false, false);
    let end = Instant::now() + WAIT;
    while !(left && back) {
        assert!(Instant::now() < end, "left {left}, back {back}");
        let Some(p) = alice.next_stanza(Duration::from_millis(200)).unwrap() else { continue };
        if p.name == "presence" && p.attr("from") == Some(occupant.as_str()) {
            if p.attr("type") == Some("unavailable") {
                left = true;
            } else if left {
                back = true;
            }
        }
    }
    say(&mut alice, &rig.room, true, "after the kick");
    wait("after the kick", || host.texts().contains(&"after the kick".to_owned()));
    wait("while kicked", || host.texts().contains(&"while kicked".to_owned()));
    let texts = host.texts();
    assert_eq!(texts.iter().filter(|t| *t == "while kicked").count(), 1, "{texts:?}");
    assert_eq!(xmpp.status().state(), State::Connected);
    assert!(xmpp.close(Instant::now() + Duration::from_secs(3)));
}

fn body(m: &Element) -> Option<&str> {
    m.child("body", x::xml::NS_CLIENT).map(|b| b.text.as_str())
}

/// The messages from `from` (a bare JID or occupant JID prefix) that `c` receives, up to and
/// including the first for which `last` holds.
fn messages_until(c: &mut Connection, from: &str, last: impl Fn(&Element) -> bool) -> Vec<Element> {
    let end = Instant::now() + WAIT;
    let mut got = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "not the expected message from {from} within {WAIT:?}; got {got:#?}");
        let Some(m) = c.next_stanza(left).unwrap() else { continue };
        if m.name == "message" && m.attr("from").is_some_and(|f| f.starts_with(from)) {
            let done = last(&m);
            got.push(m);
            if done {
                return got;
            }
        }
    }
}

/// A standalone chat state (no body) named `state`.
fn is_state(m: &Element, state: &str) -> bool {
    body(m).is_none() && m.child(state, NS_CHATSTATES).is_some()
}

fn retracted(m: &Element) -> Option<&str> {
    m.child("retract", NS_RETRACT).and_then(|r| r.attr("id"))
}

/// Issue 20, typing and progress: a run in a direct chat shows `<composing/>`, a preview, an
/// XEP-0308 correction naming the preview's id, then the reply once as its own message, a
/// standalone `<active/>` and the preview retracted (XEP-0424). An abandoned run in the room
/// has its preview retracted by the room's stanza id. Alice's own correction and retraction,
/// and the room's reflections of the bot's previews, are not prompts.
#[test]
fn a_run_in_progress_composes_previews_corrects_and_retracts() {
    let Some(rig) = rig() else { return };
    let mut alice = rig.alice();
    let (xmpp, host) = rig.connected();
    let (bot, chat) = ("gwbot@localhost", "alice@localhost");

    // A direct chat, answered.
    xmpp.show(chat, "run-1", Activity::Started);
    xmpp.show(chat, "run-1", Activity::Text("Hello ".into()));
    let first = messages_until(&mut alice, bot, |m| body(m) == Some("Hello …"));
    let (preview, before) = first.split_last().unwrap();
    assert!(before.iter().any(|m| is_state(m, "composing")), "composing before the preview: {before:#?}");
    assert_eq!(preview.attr("type"), Some("chat"));
    let original = preview.attr("id").expect("the preview's id").to_owned();
    assert_eq!(preview.child("origin-id", NS_SID).and_then(|o| o.attr("id")), Some(original.as_str()));
    assert!(preview.child("replace", NS_CORRECT).is_none() && preview.child("active", NS_CHATSTATES).is_some());
    xmpp.show(chat, "run-1", Activity::Text("world".into()));
    let edits = messages_until(&mut alice, bot, |m| body(m) == Some("Hello world …"));
    let edit = edits.last().unwrap();
    assert_eq!(edit.child("replace", NS_CORRECT).and_then(|r| r.attr("id")), Some(original.as_str()));
    assert_ne!(edit.attr("id"), Some(original.as_str()), "a correction is a new message");
    xmpp.show(chat, "run-1", Activity::Text(" Again.".into()));
    let edits = messages_until(&mut alice, bot, |m| body(m) == Some("Hello world Again. …"));
    assert_eq!(
        edits.last().unwrap().child("replace", NS_CORRECT).and_then(|r| r.attr("id")),
        Some(original.as_str()),
        "every correction names the original, never the previous correction"
    );
    xmpp.show(chat, "run-1", Activity::Ended { replied: true });
    host.queue_reply(1, chat, "Hello world. Again.", "run-1");
    xmpp.wake();
    let rest = messages_until(&mut alice, bot, |m| retracted(m).is_some());
    let retraction = rest.last().unwrap();
    assert_eq!(retracted(retraction), Some(original.as_str()));
    assert_eq!(retraction.child("fallback", NS_FALLBACK).and_then(|f| f.attr("for")), Some(NS_RETRACT));
    assert!(retraction.child("store", NS_HINTS).is_some() && body(retraction).is_some_and(|b| !b.is_empty()));
    let replies: Vec<&Element> = rest.iter().filter(|m| body(m) == Some("Hello world. Again.")).collect();
    assert_eq!(replies.len(), 1, "the reply once: {rest:#?}");
    assert!(replies[0].child("replace", NS_CORRECT).is_none(), "the reply is its own message");
    assert!(replies[0].child("active", NS_CHATSTATES).is_some());
    assert!(rest.iter().any(|m| is_state(m, "active")), "typing off: {rest:#?}");
    wait("the reply sent", || host.outcomes.lock().unwrap().as_slice() == [(1, Sent::Ok)]);

    // The room: a run abandoned (cancelled by a drain) has its preview retracted at once.
    let occupant = format!("{}/gw", rig.room);
    xmpp.show(&rig.room, "run-2", Activity::Started);
    xmpp.show(&rig.room, "run-2", Activity::Text("Partial ".into()));
    let first = messages_until(&mut alice, &occupant, |m| body(m) == Some("Partial …"));
    let (preview, before) = first.split_last().unwrap();
    assert!(before.iter().any(|m| is_state(m, "composing") && m.attr("type") == Some("groupchat")), "{before:#?}");
    assert_eq!(preview.attr("type"), Some("groupchat"));
    let room_id = preview
        .children_named("stanza-id", NS_SID)
        .find(|s| s.attr("by") == Some(rig.room.as_str()))
        .and_then(|s| s.attr("id"))
        .expect("the room's stanza id")
        .to_owned();
    xmpp.show(&rig.room, "run-2", Activity::Ended { replied: false });
    let rest = messages_until(&mut alice, &occupant, |m| retracted(m).is_some());
    assert_eq!(retracted(rest.last().unwrap()), Some(room_id.as_str()), "a room's retraction names its stanza id");
    assert!(rest.iter().any(|m| is_state(m, "active")), "typing off in the room: {rest:#?}");
    assert!(!rest.iter().any(|m| body(m).is_some() && retracted(m).is_none()), "no reply: {rest:#?}");

    // Alice asks, corrects her question and retracts a room message: one prompt. The room's
    // reflections of the bot's preview and retraction were not prompts either.
    let question = x::new_id();
    let asked = Outgoing { to: bot, groupchat: false, body: "question", id: &question };
    alice.send_stanza(&x::message_xml(&asked).unwrap()).unwrap();
    let fixed = Outgoing { to: bot, groupchat: false, body: "question, fixed", id: &x::new_id() };
    alice.send_stanza(&x::stanza_xml(&fixed, Kind::Correct(&question)).unwrap()).unwrap();
    let gone = Outgoing { to: &rig.room, groupchat: true, body: "retracted", id: &x::new_id() };
    alice.send_stanza(&x::stanza_xml(&gone, Kind::Retract("some-id")).unwrap()).unwrap();
    say(&mut alice, &rig.room, true, "marker");
    wait("the marker", || host.texts().contains(&"marker".to_owned()));
    assert_eq!(host.texts(), vec!["question".to_owned(), "marker".to_owned()]);
    assert!(xmpp.close(Instant::now() + Duration::from_secs(3)));
}
