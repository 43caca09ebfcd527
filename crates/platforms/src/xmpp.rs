//! XMPP adapter: one account (crates/chatproto/src/xmpp), direct chats and multi-user chat
//! rooms, with the server's message archive as the position.
//!
//! - **Configuration.** `jid = "bot@example.org"` (the account; `token_env` names its
//!   password), `server = "host:port"` (default: the JID's domain, port 5222; no DNS SRV
//!   lookup), `rooms` (room JIDs to join), `nick` (the nick in rooms; default the JID's local
//!   part), `allowed_chats` (bare JIDs whose direct messages are `listed`: the access policy,
//!   crates/runtime/src/access/, decides who is served),
//!   `ca_file`. The stream is always STARTTLS, verified for the JID's domain with crates/net's
//!   settings; SASL is SCRAM-SHA-1, or PLAIN inside TLS where that is all the server offers.
//! - **One consumer per account.** The credential lock is keyed by the bare JID (lower-cased).
//!   On the wire, a second session binding our resource makes the server close our stream with
//!   `<conflict/>`: that is [`Failure::Conflict`]. From then on each connect first asks whether
//!   the resource is in use ([`x::resource_in_use`], a ping from a throwaway resource) and binds
//!   only when it is free: the adapter never pushes the other consumer off, and past
//!   `conflict_standby_s` it stands by.
//! - **Nothing lost across a restart (XEP-0313).** The position is, per archive (the account's
//!   own, and each room's), the archive id (`<stanza-id by=…>`, XEP-0359) of the last message
//!   journaled, saved in `<home>/platforms/xmpp-<name>.json` only after the journal commit
//!   ([`Receiver::confirm`]). Each connect (a start, a restart, a reconnect after an outage)
//!   first pages through every archive after its saved id, then reads live. A first start with
//!   no saved id begins at the archive's newest message (or, in a cluster, at the host's
//!   fresh-start window), so history is never answered.
//! - **Deduplicated (XEP-0359).** A message's event id is its sender's `origin-id` (scoped by
//!   chat and sender), else the archive's stanza id, so the live copy, the archived copy and a
//!   sender's retransmission journal once. A message with neither (a server without MAM) gets a
//!   per-connection id and is at most once.
//! - **Rooms.** Joined without history (`maxstanzas='0'`; the archive is the history); our own
//!   reflected messages (our nick), the subject and delayed history are ignored.
//! - **Stream management (XEP-0198)** is enabled where offered: the server's ack requests are
//!   answered, and an ack request is the keepalive (else an XEP-0199 ping). No resumption: the
//!   archive is what bridges a new stream.
//! - **The agent at work** (skeleton/progress.rs). Typing is XEP-0085: one standalone
//!   `<composing/>` when a run starts (not the skeleton's 4 s refresh: XEP-0085's business
//!   rules forbid repeating a standalone notification), `<active/>` when no run is left; every message with a body carries
//!   `<active/>`. In rooms these go to the room, `groupchat`. A preview is a message with a
//!   fresh id (= its origin-id); each edit is an XEP-0308 correction, a new message whose
//!   `<replace id>` is always the ORIGINAL preview's id. Once the reply is sent (or the run is
//!   abandoned) the preview is retracted (XEP-0424, with a fallback body and the store hint):
//!   retraction rather than correcting it into a note, because the reply is its own message
//!   and a note would stay above every reply, while the clients that show corrections in
//!   place mostly honour retractions too (without XEP-0424 a client shows the fallback line). In a room the
//!   retraction names the room's stanza id for the preview (read from its reflection, waited
//!   for at most 2 s), else its origin id (a room that assigns none, a
//!   crash's leftover).
//!   Previews and retractions are written without waiting for the ack: best-effort, and their
//!   id is kept from the moment they may have reached anyone.
//! - **Edits are not prompts.** A user's correction (XEP-0308), retraction (XEP-0424) or a
//!   moderation is not journaled (the position moves past it): the original message was the
//!   prompt, answered once; its edit is not answered again. Our own previews, corrections and
//!   retractions, reflected by rooms, are ignored like every reflection of ours.
//! - **Files (issue 29).** In: XEP-0066 out-of-band URLs (`<x xmlns='jabber:x:oob'><url>`;
//!   a body that only repeats the URL is no text), fetched over https with crates/net's TLS
//!   and proxy settings, no redirects followed; plain http only to a loopback host and only
//!   with `http_files_on_loopback = true` (a test server). The sender's URL is fetched by the
//!   gateway, so only for messages the access policy admits. Out: XEP-0363 HTTP upload: the
//!   upload service found by disco (the domain, then its items; cached), a slot requested
//!   (an IQ the reader's thread answers), the bytes PUT, then a message whose body is the GET
//!   URL with the same URL as out-of-band data. No idempotency key: a resend after a crash
//!   uploads again and sends the link once more (worst case one duplicate, as for text). A
//!   server without an upload service, or a file over its `max-file-size`, gets the file
//!   named in a text piece instead.
//! - **At least once outbound.** Each piece carries a fresh `origin-id`. With stream management
//!   a piece counts as sent only once the server acknowledged it (XEP-0198 `<a h>`): a piece
//!   written into a dying connection is sent again on the next one, never silently lost. An
//!   entry is marked sent after its last piece, so a crash in between sends it again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gatewarden_chatproto::xmpp::{
    self as x, BareJid, ChatState, Config, Connection, Element, ErrorKind, Kind, NS_DELAY, NS_MAM, NS_SID, Outgoing,
    Since, Writer,
};
use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Xmpp as Settings;
use gatewarden_lifecycle::fsio;
use serde::{Deserialize, Serialize};

use crate::attachments::Attachment;
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// XEP-0461 (Message Replies).
const NS_REPLY: &str = "urn:xmpp:reply:0";

/// How long one live read waits before the receive loop looks at its flags again.
const READ_SLICE: Duration = Duration::from_millis(250);
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a sent message may wait for the server's stream management ack before the
/// connection is taken for dead (and the message sent again on the next one): longer than the
/// skeleton's longest backoff (15 s), during which the read side, which sees the acks, pauses.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the resource probe waits for an answer from the other session.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// One archive page's bound.
const MAM_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages per archive page.
const MAM_PAGE: u32 = 50;
/// A reply piece: XMPP has no hard limit below the server's stanza limit (prosody: 256 KiB).
pub const MAX_TEXT_CHARS: usize = 10_000;
/// The fallback body of a preview's retraction (XEP-0428), for clients without XEP-0424.
pub const RETRACTED: &str = "(preview removed)";
/// Chats whose chat state is remembered, and room previews awaiting their stanza id: past it
/// the oldest are forgotten (a state is then sent again; a retraction names the origin id).
const MAX_TRACKED: usize = 1024;
/// How long a room preview's retraction waits for the preview's reflection (its stanza id).
const REFLECTION_WAIT: Duration = Duration::from_secs(2);
/// The default client port (RFC 6120 §14.7).
pub const DEFAULT_PORT: u16 = 5222;
/// Bound on each IQ of an upload (disco, slot).
const UPLOAD_IQ_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on one file's PUT.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// How files travel over HTTP (module notes): the agent, and whether loopback http is allowed.
#[derive(Clone)]
struct Files {
    http: ureq::Agent,
    http_on_loopback: bool,
}

impl Files {
    fn new(ca_file: Option<&Path>, http_on_loopback: bool) -> Result<Files, String> {
        let out = gatewarden_net::Outbound::new(ca_file, None).map_err(|e| e.to_string())?;
        let http = gatewarden_net::http_config(&out).http_status_as_error(false).max_redirects(0).build().new_agent();
        Ok(Files { http, http_on_loopback })
    }

    /// Checks `url` against the module's rule: https, or http to a loopback host when allowed.
    fn check(&self, url: &str) -> Result<(), String> {
        file_url_ok(url, self.http_on_loopback)
    }
}

/// Whether a file URL may be fetched or PUT: `https://`, or `http://` to a loopback host
/// (`localhost`, 127.0.0.0/8, `[::1]`) when `http_on_loopback`.
fn file_url_ok(url: &str, http_on_loopback: bool) -> Result<(), String> {
    let refused =
        || Err(format!("only https file URLs are fetched, not {}", url.split(['?', '#']).next().unwrap_or("")));
    let Ok(u) = url::Url::parse(url) else { return refused() };
    let loopback = match u.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    let user_info = !u.username().is_empty() || u.password().is_some();
    match u.scheme() {
        "https" => Ok(()),
        "http" if http_on_loopback && loopback && !user_info => Ok(()),
        _ => refused(),
    }
}

/// A file's name from its URL: the last path segment, else `file`.
fn url_file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let after_host = path.splitn(4, '/').nth(3).unwrap_or_default();
    let name = after_host.rsplit('/').next().unwrap_or_default();
    let clean: String = name.chars().filter(|c| !c.is_control() && !matches!(c, '"' | '\\')).take(128).collect();
    if clean.is_empty() { "file".to_owned() } else { clean }
}

/// The XMPP adapter.
pub type Xmpp = Skeleton<Proto>;

/// The XMPP protocol.
pub struct Proto {
    name: String,
    cfg: Config,
    rooms: Vec<BareJid>,
    nick: String,
    allowed: Vec<String>,
    /// The bare JID, lower-cased: what two consumers must not share.
    credential: String,
    files: Files,
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig, password: String) -> Result<Xmpp, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let name = cfg.adapter_name();
        let err = |message: String| AdapterError::Start { name: name.clone(), message };
        let jid = BareJid::parse(s.jid.as_deref().unwrap_or_default()).map_err(|e| err(format!("jid: {e}")))?;
        let rooms = s
            .rooms
            .iter()
            .map(|r| BareJid::parse(r).map_err(|e| err(format!("rooms: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = gatewarden_net::ClientTls::new(cfg.ca_file.as_deref()).map_err(|e| err(e.to_string()))?;
        let addr = match s.server.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => s.to_owned(),
            _ => format!("{}:{DEFAULT_PORT}", jid.domain),
        };
        let nick = s.nick.clone().unwrap_or_else(|| jid.local.clone());
        let files = Files::new(cfg.ca_file.as_deref(), s.http_files_on_loopback).map_err(err)?;
        let proto = Proto {
            files,
            name: name.clone(),
            credential: jid.as_string().to_lowercase(),
            cfg: Config::new(addr, jid, password, tls),
            rooms,
            nick,
            allowed: cfg.allowed_chats.iter().map(|c| c.trim().to_lowercase()).collect(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

/// The live connection's write side, shared by the two halves (`None` while disconnected).
type WriterSlot = Arc<Mutex<Option<Writer>>>;

/// Room previews (`(room, origin id)`) and the room's stanza id for each once its reflection
/// was read: what an XEP-0424 retraction in a room names. The sender adds, the reader fills.
#[derive(Debug, Default)]
pub struct RoomIds {
    order: std::collections::VecDeque<(String, String)>,
    ids: BTreeMap<(String, String), Option<String>>,
}

impl RoomIds {
    /// A preview `origin` was posted in `room`.
    pub fn expect(&mut self, room: &str, origin: &str) {
        let key = (room.to_lowercase(), origin.to_owned());
        if self.ids.contains_key(&key) {
            return;
        }
        while self.order.len() >= MAX_TRACKED {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        self.order.push_back(key.clone());
        self.ids.insert(key, None);
    }

    /// The reflection of `origin` in `room` was read, with the room's stanza id `id` (`None`:
    /// a room that assigns none, where the origin id is all there is).
    pub fn reflected(&mut self, room: &str, origin: &str, id: Option<&str>) {
        if let Some(slot) = self.ids.get_mut(&(room.to_lowercase(), origin.to_owned())) {
            *slot = Some(id.unwrap_or(origin).to_owned());
        }
    }

    /// What a retraction of `origin` in `room` names; forgets it.
    pub fn take(&mut self, room: &str, origin: &str) -> String {
        let key = (room.to_lowercase(), origin.to_owned());
        self.order.retain(|k| *k != key);
        self.ids.remove(&key).flatten().unwrap_or_else(|| origin.to_owned())
    }

    /// Whether the stanza id of an expected preview is still to come.
    fn awaited(&self, room: &str, origin: &str) -> bool {
        matches!(self.ids.get(&(room.to_lowercase(), origin.to_owned())), Some(None))
    }
}

/// [`RoomIds`] between the two halves: the reader notifies when it fills one.
#[derive(Debug, Default)]
struct SharedIds {
    ids: Mutex<RoomIds>,
    filled: std::sync::Condvar,
}

type SharedRoomIds = Arc<SharedIds>;

impl SharedIds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoomIds> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reflected(&self, room: &str, origin: &str, id: Option<&str>) {
        self.lock().reflected(room, origin, id);
        self.filled.notify_all();
    }

    /// [`RoomIds::take`], once the reflection of a preview we posted was read or `timeout`
    /// passed (a retraction right after the preview would otherwise race its reflection).
    fn take_within(&self, room: &str, origin: &str, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        let mut ids = self.lock();
        while ids.awaited(room, origin) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            ids = self.filled.wait_timeout(ids, left).map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        ids.take(room, origin)
    }
}

/// Our own message reflected by a room: `(room, origin id, the room's stanza id if any)`.
pub fn own_reflection(m: &Element, rooms: &[String], nick: &str) -> Option<(String, String, Option<String>)> {
    let from = m.attr("from")?;
    let room = x::bare(from).to_lowercase();
    if m.attr("type") != Some("groupchat") || x::resource(from) != Some(nick) || !rooms.contains(&room) {
        return None;
    }
    let origin = m.child("origin-id", NS_SID).and_then(|o| o.attr("id"))?;
    let sid = m
        .children_named("stanza-id", NS_SID)
        .find(|s| s.attr("by").is_some_and(|by| by.eq_ignore_ascii_case(&room)))
        .and_then(|s| s.attr("id"));
    Some((room, origin.to_owned(), sid.map(str::to_owned)))
}

fn set_writer(slot: &WriterSlot, w: Option<Writer>) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = w;
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Xmpp, AdapterError> {
        Xmpp::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 16,
        pace: None,
        // An archive page is one request: give it a second at least.
        min_receive: Duration::from_secs(1),
        // The archive keeps what was not confirmed; an unconfirmed batch is returned again.
        redelivers: true,
        // The stream stays up until `close` has flushed the outbox: replies go out during the
        // drain (their acks arrive on the read side), and what arrives meanwhile is journaled
        // for the successor (or read back from the archive by it).
        listens_through_drain: true,
        connected_after_receive: false,
        close_grace: Duration::from_secs(2),
    };
    type Receiver = Reader;
    type Sender = Talker;

    fn credential(&self) -> &str {
        &self.credential
    }

    /// The client declares a silent connection dead after 90 s; the watchdog backs that up.
    fn watchdog_after(&self) -> Duration {
        Duration::from_secs(150)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(Reader, Talker), String> {
        let path = host.state_dir().map(|d| d.join(format!("xmpp-{}.json", self.name)));
        let cursors = load(path.as_deref());
        let writer: WriterSlot = Arc::default();
        let room_ids: SharedRoomIds = Arc::default();
        let reader = Reader {
            files: self.files.clone(),
            room_ids: Arc::clone(&room_ids),
            cfg: self.cfg.clone(),
            rooms: self.rooms.clone(),
            nick: self.nick.clone(),
            allowed: self.allowed.clone(),
            writer: Arc::clone(&writer),
            path,
            cursors,
            live: None,
            catchup: Vec::new(),
            unconfirmed: None,
            pushed_off: false,
        };
        let rooms = self.rooms.iter().map(|r| r.as_string().to_lowercase()).collect();
        let talker = Talker {
            writer,
            rooms,
            room_ids,
            states: BTreeMap::new(),
            files: self.files.clone(),
            domain: self.cfg.jid.domain.clone(),
            upload: None,
        };
        Ok((reader, talker))
    }
}

/// The saved positions: per archive (lower-cased bare JID), the archive id after which to
/// resume (`None`: from the archive's beginning, it was empty at the first start).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursors {
    pub after: BTreeMap<String, Option<String>>,
}

fn load(path: Option<&Path>) -> Cursors {
    path.and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save(path: &Path, c: &Cursors) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        gatewarden_lifecycle::platform::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fsio::write_json(path, c).map_err(|e| format!("{}: {e}", path.display()))
}

/// A batch returned but not confirmed yet: the same again until it is.
#[derive(Debug, Clone)]
struct Unconfirmed {
    messages: Vec<Inbound>,
    /// Where each archive's position goes once the batch is journaled.
    moves: Vec<(String, String)>,
}

/// The live connection, its id (for messages without stanza ids) and its counter.
struct Live {
    conn: Connection,
    id: String,
    n: u64,
}

/// The receive side: owns the connection.
pub struct Reader {
    files: Files,
    cfg: Config,
    rooms: Vec<BareJid>,
    nick: String,
    allowed: Vec<String>,
    writer: WriterSlot,
    /// Where our room previews' stanza ids go (for their retraction).
    room_ids: SharedRoomIds,
    path: Option<PathBuf>,
    cursors: Cursors,
    live: Option<Live>,
    /// Archives still to page through after the connect, with where each page starts.
    catchup: Vec<(Option<BareJid>, Since)>,
    unconfirmed: Option<Unconfirmed>,
    /// Another session pushed us off: ask before binding again (never push back).
    pushed_off: bool,
}

/// A client error as the skeleton's failure.
fn failure(what: &str, e: &x::Error) -> Failure {
    match e.kind() {
        ErrorKind::Conflict => Failure::Conflict(format!("another session took this account's resource: {e}")),
        ErrorKind::Rejected => Failure::Rejected(e.to_string()),
        ErrorKind::Transient | ErrorKind::Permanent => Failure::Down(format!("{what}: {e}")),
    }
}

/// What one `<message>` is to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The message to journal, when it is one we serve.
    pub inbound: Option<Inbound>,
    /// The archive and its id for this message, when the archive vouches for it.
    pub archived: Option<(String, String)>,
}

/// Reads one message stanza (live, or forwarded by an archive whose id is `archive_id`).
/// `own` is our bare JID, `rooms` the joined rooms (lower-cased), `nick` our nick in them,
/// `allowed` the bare JIDs allowed_chats names (direct chats). Total on hostile input.
pub fn classify(
    m: &Element,
    own: &BareJid,
    rooms: &[String],
    nick: &str,
    allowed: &[String],
    archive_id: Option<&str>,
    fallback_id: impl FnOnce() -> String,
) -> Seen {
    classify_at(m, own, rooms, nick, allowed, archive_id.map(|id| (id, None)), fallback_id)
}

/// [`classify`] with the archive's timestamp (`<delay stamp>`, XEP-0203) as the sent time.
pub fn classify_at(
    m: &Element,
    own: &BareJid,
    rooms: &[String],
    nick: &str,
    allowed: &[String],
    archived_as: Option<(&str, Option<&str>)>,
    fallback_id: impl FnOnce() -> String,
) -> Seen {
    let archive_id = archived_as.map(|(id, _)| id);
    let sent_at = archived_as.and_then(|(_, stamp)| stamp).and_then(gatewarden_lifecycle::timefmt::parse);
    let from = m.attr("from").unwrap_or_default();
    let from_bare = x::bare(from).to_lowercase();
    let kind = m.attr("type").unwrap_or("normal");
    let room = rooms.iter().find(|r| **r == from_bare).cloned();
    // The archive that vouches for this message: the room's for groupchat, ours otherwise.
    let archive = match (&room, kind) {
        (Some(r), "groupchat") => Some(r.clone()),
        (None, "chat" | "normal") => Some(own.as_string().to_lowercase()),
        _ => None,
    };
    let stanza_id = archive.as_ref().and_then(|a| {
        archive_id.map(str::to_owned).or_else(|| {
            m.children_named("stanza-id", NS_SID)
                .find(|s| s.attr("by").is_some_and(|by| by.eq_ignore_ascii_case(a)))
                .and_then(|s| s.attr("id"))
                .map(str::to_owned)
        })
    });
    let archived = archive.clone().zip(stanza_id.clone());
    let none = Seen { inbound: None, archived: archived.clone() };
    let oob = x::oob_url(m);
    let body = m.child("body", x::xml::NS_CLIENT).map(|b| b.text.clone());
    // A file's body that only repeats its URL is no text (what XEP-0363 uploaders send).
    let body = match (body, &oob) {
        (Some(b), Some(u)) if b.trim() == u => String::new(),
        (Some(b), _) => b,
        (None, Some(_)) => String::new(),
        (None, None) => return none,
    };
    // An edit or retraction of an earlier message: not a new prompt (module notes).
    if (body.trim().is_empty() && oob.is_none()) || x::amends_another(m) {
        return none;
    }
    // Every message goes to the host; the access policy (crates/runtime/src/access/) decides.
    // A room is a group, listed (`rooms` names it) and addressed when the body names our nick
    // or it replies to our message (XEP-0461 `<reply to='room/nick'/>`); a direct chat is
    // listed when allowed_chats names its bare JID.
    let (chat, user, chat_kind, listed, addressed) = match (&room, kind) {
        (Some(r), "groupchat") => {
            let Some(who) = x::resource(from).filter(|n| !n.is_empty()) else { return none };
            // Our own reflection, or history the room replays (delayed, stamped by the room).
            let history = archive_id.is_none() && m.child("delay", NS_DELAY).is_some();
            if who == nick || history {
                return none;
            }
            let replied = m
                .children_named("reply", NS_REPLY)
                .any(|rp| rp.attr("to").and_then(x::resource).is_some_and(|to| to == nick));
            let addressed = replied || crate::names_word(&body, nick);
            (r.clone(), format!("{r}/{who}"), ChatKind::Group, true, addressed)
        }
        (None, "chat" | "normal") => {
            if own.matches(from) || from_bare.is_empty() || !from_bare.contains('@') {
                return none;
            }
            let listed = allowed.contains(&from_bare);
            (from_bare.clone(), from_bare.clone(), ChatKind::Direct, listed, true)
        }
        _ => return none,
    };
    let origin = m.child("origin-id", NS_SID).and_then(|o| o.attr("id")).filter(|id| !id.is_empty());
    let event_id = match (origin, &stanza_id) {
        (Some(o), _) => format!("o:{chat}:{user}:{o}"),
        (None, Some(s)) => format!("s:{}:{s}", archive.as_deref().unwrap_or_default()),
        (None, None) => fallback_id(),
    };
    let inbound = Inbound {
        event_id,
        chat_id: chat,
        user_id: user,
        text: body,
        sent_at,
        chat: chat_kind,
        listed,
        addressed,
        attachments: oob
            .map(|url| Attachment { name: url_file_name(&url), fetch: url, ..Attachment::default() })
            .into_iter()
            .collect(),
    };
    Seen { inbound: Some(inbound), archived }
}

/// A connection id unique across restarts: the connect time (µs) and the pid.
fn connection_id(now: SystemTime) -> String {
    let us = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("c{us:x}.{}", std::process::id())
}

impl Reader {
    fn lost(&mut self, why: String) -> Failure {
        self.live = None;
        set_writer(&self.writer, None);
        Failure::Lost(format!("connection lost: {why}"))
    }

    /// The room we were just removed from, when `p` is our own unavailable presence there
    /// (status 110: it is about us).
    fn removed_from(&self, p: &Element) -> Option<BareJid> {
        if p.name != "presence" || p.attr("type") != Some("unavailable") {
            return None;
        }
        let from = p.attr("from")?;
        let room = self.rooms.iter().find(|r| r.matches(from))?;
        let own = p
            .child("x", x::NS_MUC_USER)
            .is_some_and(|x| x.children_named("status", x::NS_MUC_USER).any(|s| s.attr("code") == Some("110")));
        (own && x::resource(from) == Some(self.nick.as_str())).then(|| room.clone())
    }

    fn room_keys(&self) -> Vec<String> {
        self.rooms.iter().map(|r| r.as_string().to_lowercase()).collect()
    }

    fn key(&self, archive: Option<&BareJid>) -> String {
        archive.unwrap_or(&self.cfg.jid).as_string().to_lowercase()
    }

    /// Where each archive's catch-up starts; an archive with no saved position gets one now
    /// (its newest id, or the host's fresh-start window), saved at once: nothing before it
    /// is ever delivered.
    fn plan_catchup(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        let mut plan = Vec::new();
        let mut fresh = false;
        let archives: Vec<Option<BareJid>> =
            std::iter::once(None).chain(self.rooms.iter().cloned().map(Some)).collect();
        for a in archives {
            let key = self.key(a.as_ref());
            let since = match self.cursors.after.get(&key) {
                Some(Some(id)) => Since::After(id.clone()),
                Some(None) => Since::Beginning,
                None => match ctx.host().fresh_start_window() {
                    Some(w) => {
                        let t = SystemTime::now().checked_sub(w).unwrap_or(SystemTime::UNIX_EPOCH);
                        Since::Start(gatewarden_lifecycle::timefmt::format(t))
                    }
                    None => {
                        let Some(l) = self.live.as_mut() else { return Err(self.lost("not connected".into())) };
                        let newest = l.conn.mam_newest(a.as_ref(), MAM_TIMEOUT);
                        let newest = match newest {
                            Ok(n) => n,
                            Err(e) if e.kind() == ErrorKind::Transient => return Err(self.lost(e.to_string())),
                            Err(e) => return Err(failure("the archive", &e)),
                        };
                        self.cursors.after.insert(key, newest);
                        fresh = true;
                        continue;
                    }
                },
            };
            plan.push((a, since));
        }
        if fresh && let Some(p) = &self.path {
            save(p, &self.cursors).map_err(|e| Failure::Down(format!("cannot save the archive position: {e}")))?;
        }
        self.catchup = plan;
        Ok(())
    }

    /// One page of the first archive still to catch up.
    fn catchup_page(&mut self, budget: Option<Duration>) -> Result<Batch, Failure> {
        let timeout = budget.map_or(MAM_TIMEOUT, |b| b.min(MAM_TIMEOUT));
        let Some((archive, since)) = self.catchup.first().cloned() else { return Ok(Batch::default()) };
        let key = self.key(archive.as_ref());
        let Some(l) = self.live.as_mut() else { return Err(self.lost("not connected".into())) };
        let page = match l.conn.mam_page(archive.as_ref(), &since, MAM_PAGE, timeout) {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::Transient => return Err(self.lost(e.to_string())),
            // The archive refuses (an unknown id after a server reset, no MAM): reading live
            // only, and said so.
            Err(e) => {
                self.catchup.remove(0);
                self.cursors.after.remove(&key);
                return Ok(Batch {
                    messages: Vec::new(),
                    gap: Some(format!("cannot read {key}'s archive ({e}); messages missed meanwhile are not answered")),
                });
            }
        };
        let (rooms, own) = (self.room_keys(), self.cfg.jid.clone());
        let mut out = Unconfirmed { messages: Vec::new(), moves: Vec::new() };
        for item in &page.items {
            let l = self.live.as_mut().ok_or_else(|| Failure::Lost("not connected".into()))?;
            let archived_as = Some((item.archive_id.as_str(), item.stamp.as_deref()));
            let seen = classify_at(&item.message, &own, &rooms, &self.nick, &self.allowed, archived_as, || {
                l.n += 1;
                format!("{}:{}", l.id, l.n)
            });
            out.messages.extend(seen.inbound);
        }
        let last = page.items.last().map(|i| i.archive_id.clone()).or(page.last.clone());
        if let Some(id) = &last {
            out.moves.push((key, id.clone()));
        }
        match (page.complete || page.items.is_empty(), last) {
            (false, Some(id)) => self.catchup[0].1 = Since::After(id),
            _ => {
                self.catchup.remove(0);
            }
        }
        self.unconfirmed = Some(out.clone());
        Ok(Batch { messages: out.messages, gap: None })
    }
}

impl skeleton::Receiver for Reader {
    fn connect(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        self.unconfirmed = None;
        if self.pushed_off {
            match x::resource_in_use(&self.cfg, PROBE_TIMEOUT) {
                Ok(false) => {}
                Ok(true) => {
                    return Err(Failure::Conflict(format!(
                        "{}/{} is in use by another session",
                        self.cfg.jid, self.cfg.resource
                    )));
                }
                Err(e) => return Err(failure(&format!("connecting to {}", self.cfg.addr), &e)),
            }
        }
        let connected = Connection::connect(&self.cfg).and_then(|mut c| {
            c.presence()?;
            for room in &self.rooms {
                c.join(room, &self.nick, JOIN_TIMEOUT)?;
            }
            Ok(c)
        });
        match connected {
            Ok(conn) => {
                self.pushed_off = false;
                set_writer(&self.writer, Some(conn.writer()));
                self.live = Some(Live { conn, id: connection_id(SystemTime::now()), n: 0 });
                self.plan_catchup(ctx)
            }
            Err(e) => {
                self.pushed_off |= e.kind() == ErrorKind::Conflict;
                Err(failure(&format!("connecting to {}", self.cfg.addr), &e))
            }
        }
    }

    fn receive(&mut self, _ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        if let Some(u) = &self.unconfirmed {
            // Not journaled last time: the same messages again (the journal deduplicates).
            return Ok(Batch { messages: u.messages.clone(), gap: None });
        }
        if !self.catchup.is_empty() {
            return self.catchup_page(budget);
        }
        let slice = budget.map_or(READ_SLICE, |b| b.min(READ_SLICE));
        let (rooms, own) = (self.room_keys(), self.cfg.jid.clone());
        let Some(l) = self.live.as_mut() else { return Err(self.lost("not connected".into())) };
        let stanza = match l.conn.next_stanza(slice) {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::Conflict => {
                let f = failure("reading", &e);
                self.pushed_off = true;
                self.live = None;
                set_writer(&self.writer, None);
                return Err(f);
            }
            Err(e) => return Err(self.lost(e.to_string())),
        };
        if let Some(room) = stanza.as_ref().and_then(|p| self.removed_from(p)) {
            // Kicked, or the room restarted: join again (a ban makes that fail, and the
            // reconnect loop reports why). What was said meanwhile is in the room's archive.
            let l = self.live.as_mut().ok_or_else(|| Failure::Lost("not connected".into()))?;
            if let Err(e) = l.conn.join(&room, &self.nick, JOIN_TIMEOUT) {
                return Err(self.lost(format!("removed from {room}, cannot join again: {e}")));
            }
            let key = room.as_string().to_lowercase();
            let since = match self.cursors.after.get(&key) {
                Some(Some(id)) => Since::After(id.clone()),
                _ => return Ok(Batch::default()),
            };
            self.catchup.push((Some(room), since));
            return Ok(Batch::default());
        }
        let Some(m) = stanza.filter(|s| s.name == "message" && s.attr("type") != Some("error")) else {
            return Ok(Batch::default());
        };
        // A MAM result outside a query (a late page): not live chat.
        if m.child("result", NS_MAM).is_some() {
            return Ok(Batch::default());
        }
        if let Some((room, origin, sid)) = own_reflection(&m, &rooms, &self.nick) {
            self.room_ids.reflected(&room, &origin, sid.as_deref());
        }
        let Some(l) = self.live.as_mut() else { return Err(self.lost("not connected".into())) };
        let seen = classify(&m, &own, &rooms, &self.nick, &self.allowed, None, || {
            l.n += 1;
            format!("{}:{}", l.id, l.n)
        });
        let u =
            Unconfirmed { messages: seen.inbound.into_iter().collect(), moves: seen.archived.into_iter().collect() };
        let batch = Batch { messages: u.messages.clone(), gap: None };
        if !u.moves.is_empty() || !u.messages.is_empty() {
            self.unconfirmed = Some(u);
        }
        Ok(batch)
    }

    /// Moves each archive's position past the journaled batch and saves it.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let Some(u) = self.unconfirmed.take() else { return Ok(()) };
        if u.moves.is_empty() {
            return Ok(());
        }
        for (archive, id) in u.moves {
            self.cursors.after.insert(archive, Some(id));
        }
        match &self.path {
            // Not fatal: the next start reads from an older position and deduplicates.
            Some(p) => save(p, &self.cursors).map_err(|e| format!("cannot save the archive position: {e}")),
            None => Ok(()),
        }
    }

    /// An XEP-0066 URL, under the module's rule (https; loopback http only when configured).
    fn fetch(
        &mut self,
        _ctx: &Ctx,
        a: &Attachment,
        timeout: Duration,
    ) -> Result<Box<dyn std::io::Read + Send>, String> {
        self.files.check(&a.fetch)?;
        crate::filexfer::download(&self.files.http, &a.fetch, None, timeout)
    }

    fn disconnect(&mut self) {
        set_writer(&self.writer, None);
        if let Some(l) = self.live.take() {
            l.conn.close();
        }
    }

    /// Leaves, after `close` flushed the outbox: what arrives after this is in the archive for
    /// the successor.
    fn hang_up(&mut self) -> Vec<Inbound> {
        self.disconnect();
        Vec::new()
    }
}

/// The send side: messages through the live connection's [`Writer`].
pub struct Talker {
    writer: WriterSlot,
    /// Joined rooms (lower-cased): a reply there is `groupchat`.
    rooms: Vec<String>,
    room_ids: SharedRoomIds,
    /// The standalone chat state last sent per chat (lower-cased), so none is repeated
    /// (XEP-0085). The `<active/>` that messages with a body carry is not counted: the
    /// run's `<composing/>` is followed by one standalone `<active/>` when it ends.
    states: BTreeMap<String, ChatState>,
    files: Files,
    /// The account's domain, where the upload service is looked for.
    domain: String,
    /// The upload service once discovered (`Some(None)`: the server has none).
    upload: Option<Option<x::UploadService>>,
}

/// A client error while sending, as the skeleton's.
fn send_error(e: &x::Error) -> SendError {
    match e.kind() {
        ErrorKind::Permanent => SendError::Rejected(e.to_string()),
        _ => SendError::Lost(e.to_string()),
    }
}

/// A failed upload IQ: a refusal (`not-acceptable`, `file-too-large`) is final, the rest is
/// tried again.
fn upload_error(e: &x::Error) -> SendError {
    match e {
        x::Error::Refused { .. } => SendError::Rejected(e.to_string()),
        _ => SendError::Failed(e.to_string()),
    }
}

impl Talker {
    fn writer(&self) -> Option<Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn groupchat(&self, to: &str) -> bool {
        self.rooms.iter().any(|r| r.eq_ignore_ascii_case(to))
    }

    /// Records `state` as sent in `chat`; `false` when it already was.
    fn state_changes(&mut self, chat: &str, state: ChatState) -> bool {
        let key = chat.trim().to_lowercase();
        if self.states.get(&key) == Some(&state) {
            return false;
        }
        if self.states.len() >= MAX_TRACKED && !self.states.contains_key(&key) {
            // Forget the idle ones first; a forgotten chat gets its next state again.
            self.states.retain(|_, s| *s != ChatState::Active);
            if self.states.len() >= MAX_TRACKED {
                self.states.clear();
            }
        }
        self.states.insert(key, state);
        true
    }

    /// Posts a best-effort message of `kind` (no ack wait).
    fn post(&mut self, chat: &str, body: &str, id: &str, kind: Kind<'_>) -> Result<(), SendError> {
        let Some(w) = self.writer() else { return Err(SendError::Lost("not connected".into())) };
        let to = chat.trim();
        let groupchat = self.groupchat(to);
        w.post(&Outgoing { to, groupchat, body, id }, kind).map_err(|e| send_error(&e))
    }
}

impl skeleton::Sender for Talker {
    fn ready(&self) -> bool {
        self.writer().is_some()
    }

    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        let Some(w) = self.writer() else { return Err(SendError::Lost("not connected".into())) };
        let to = chat.trim();
        let groupchat = self.groupchat(to);
        let id = x::new_id();
        match w.message(&Outgoing { to, groupchat, body: piece, id: &id }, ACK_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Permanent => Err(SendError::Rejected(e.to_string())),
            Err(e) => {
                // The receive side sees the closed socket, reports it and reconnects.
                w.shutdown();
                Err(SendError::Lost(e.to_string()))
            }
        }
    }

    /// XEP-0363 (module notes): a slot, the PUT, then the GET URL as body and out-of-band data.
    fn send_file(&mut self, chat: &str, file: &OutFile, id: PieceId) -> Result<(), SendError> {
        let Some(w) = self.writer() else { return Err(SendError::Lost("not connected".into())) };
        let service = match &self.upload {
            Some(s) => s.clone(),
            None => {
                let found = x::discover_upload(&w, &self.domain, UPLOAD_IQ_TIMEOUT).map_err(|e| upload_error(&e))?;
                self.upload = Some(found.clone());
                found
            }
        };
        let Some(service) = service else {
            let text =
                format!("[file: {}, {}, {} bytes; the server offers no HTTP upload]", file.name, file.kind, file.size);
            return self.send(chat, &text, id);
        };
        if service.max_size.is_some_and(|max| file.size > max) {
            let text =
                format!("[file: {}, {}, {} bytes; over the server's upload limit]", file.name, file.kind, file.size);
            return self.send(chat, &text, id);
        }
        let Some((opened, size)) = fsio::open_regular(&file.path).ok() else {
            return Err(SendError::Rejected(format!("the stored file {} is gone", file.name)));
        };
        let slot = x::request_slot(&w, &service.jid, &file.name, size, &file.kind, UPLOAD_IQ_TIMEOUT)
            .map_err(|e| upload_error(&e))?;
        for url in [&slot.put, &slot.get] {
            self.files.check(url).map_err(SendError::Rejected)?;
        }
        let mut put = self
            .files
            .http
            .put(&slot.put)
            .header("Content-Type", &file.kind)
            .header("Content-Length", size.to_string());
        for (k, v) in &slot.headers {
            put = put.header(k, v);
        }
        let mut body = opened;
        let response = put
            .config()
            .timeout_global(Some(UPLOAD_TIMEOUT))
            .build()
            .send(ureq::SendBody::from_reader(&mut body))
            .map_err(|e| SendError::Failed(gatewarden_net::describe(&e, &slot.put)))?;
        match response.status().as_u16() {
            200 | 201 => {}
            413 => return Err(SendError::Rejected(format!("the upload service refused {} as too large", file.name))),
            s @ (400..500) => return Err(SendError::Rejected(format!("the upload service answered HTTP {s}"))),
            s => return Err(SendError::Failed(format!("the upload service answered HTTP {s}"))),
        }
        let to = chat.trim();
        let msg_id = x::new_id();
        let out = x::Outgoing { to, groupchat: self.groupchat(to), body: &slot.get, id: &msg_id };
        match w.message_as(&out, x::Kind::Oob(&slot.get), ACK_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Permanent => Err(SendError::Rejected(e.to_string())),
            Err(e) => {
                w.shutdown();
                Err(SendError::Lost(e.to_string()))
            }
        }
    }

    /// XEP-0085: `<composing/>` once when a run starts (the skeleton's refreshes are not
    /// repeated on the wire), `<active/>` once it ends.
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        let state = if on { ChatState::Composing } else { ChatState::Active };
        let to = chat.trim();
        let previous = self.states.get(&to.to_lowercase()).copied();
        // No run shown yet in this chat: nothing to turn off.
        if !on && previous.is_none() {
            return Ok(());
        }
        if !self.state_changes(to, state) {
            return Ok(());
        }
        let Some(w) = self.writer() else {
            self.forget_state(to, previous);
            return Err(SendError::Lost("not connected".into()));
        };
        let r = w.chat_state(to, self.groupchat(to), state).map_err(|e| send_error(&e));
        if r.is_err() {
            // Not sent: the next call tries again.
            self.forget_state(to, previous);
        }
        r
    }

    /// A new message the first time, then XEP-0308 corrections naming the original's id.
    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let id = x::new_id();
        match shown {
            None => {
                // Expected before it is posted: the reflection may be read at once.
                let room = self.groupchat(chat.trim());
                if room {
                    self.room_ids.lock().expect(chat.trim(), &id);
                }
                let r = self.post(chat, text, &id, Kind::New);
                if room && r.is_err() {
                    self.room_ids.lock().take(chat.trim(), &id);
                }
                r.map(|()| Some(id))
            }
            Some(original) => {
                self.post(chat, text, &id, Kind::Correct(original))?;
                Ok(Some(original.to_owned()))
            }
        }
    }

    /// An XEP-0424 retraction (module notes); a refused one counts as done.
    fn unpreview(&mut self, chat: &str, shown: &str) -> Result<(), SendError> {
        let to = chat.trim();
        let target =
            if self.groupchat(to) { self.room_ids.take_within(to, shown, REFLECTION_WAIT) } else { shown.to_owned() };
        match self.post(to, RETRACTED, &x::new_id(), Kind::Retract(&target)) {
            Err(SendError::Rejected(_)) => Ok(()),
            r => r,
        }
    }
}

impl Talker {
    fn forget_state(&mut self, chat: &str, previous: Option<ChatState>) {
        let key = chat.to_lowercase();
        match previous {
            Some(s) => self.states.insert(key, s),
            None => self.states.remove(&key),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_chatproto::xmpp::xml::parse_element;

    fn seen(xml: &str, archive_id: Option<&str>) -> Seen {
        let own = BareJid::parse("bot@example.org").unwrap();
        let rooms = vec!["room@muc.example.org".to_owned()];
        let m = parse_element(xml).unwrap();
        classify(&m, &own, &rooms, "gw", &[], archive_id, || "c1:1".into())
    }

    /// XEP-0066: the URL is the attachment; a body that repeats it is no text; a caption stays.
    #[test]
    fn xmpp_oob_urls_become_attachments() {
        let i = seen(
            "<message from='alice@example.org/phone' type='chat'><body>https://up.example.org/f/a%20b.png</body>\
             <x xmlns='jabber:x:oob'><url>https://up.example.org/f/a%20b.png</url></x></message>",
            None,
        )
        .inbound
        .unwrap();
        assert_eq!(i.text, "");
        assert_eq!(i.attachments.len(), 1);
        let a = &i.attachments[0];
        assert_eq!(
            (a.name.as_str(), a.fetch.as_str(), a.size),
            ("a%20b.png", "https://up.example.org/f/a%20b.png", None)
        );
        let i = seen(
            "<message from='alice@example.org/phone' type='chat'><body>what is this</body>\
             <x xmlns='jabber:x:oob'><url>https://h/x</url></x></message>",
            None,
        )
        .inbound
        .unwrap();
        assert_eq!((i.text.as_str(), i.attachments[0].name.as_str()), ("what is this", "x"));
        let bare = seen(
            "<message from='alice@example.org/p' type='chat'><x xmlns='jabber:x:oob'><url>https://h/</url></x></message>",
            None,
        );
        assert_eq!(bare.inbound.unwrap().attachments[0].name, "file");
        assert!(
            seen("<message from='alice@example.org/p' type='chat'><body>hi</body></message>", None)
                .inbound
                .unwrap()
                .attachments
                .is_empty()
        );
    }

    #[test]
    fn xmpp_file_urls_are_https_or_explicit_loopback_http() {
        assert!(file_url_ok("https://h/f", false).is_ok());
        assert!(file_url_ok("HTTPS://h/f", false).is_ok());
        for bad in ["http://127.0.0.1:5280/f", "ftp://h/f", "file:///etc/passwd", "h/f"] {
            assert!(file_url_ok(bad, false).is_err(), "{bad}");
        }
        for ok in ["http://127.0.0.1:5280/f", "http://localhost/f", "http://[::1]:80/f", "http://127.1.2.3/f?x=1"] {
            assert!(file_url_ok(ok, true).is_ok(), "{ok}");
        }
        for bad in
            ["http://example.org/f", "http://127.0.0.1@evil.org/f", "http://10.0.0.1/f", "http://localhost.evil.org/"]
        {
            assert!(file_url_ok(bad, true).is_err(), "{bad}");
        }
        let e = file_url_ok("http://h/f?token=secret", false).unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn direct_messages_use_origin_ids_and_trusted_stanza_ids() {
        let s = seen(
            "<message from='Alice@example.org/phone' type='chat'><body>hi</body>\
             <origin-id xmlns='urn:xmpp:sid:0' id='o1'/>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='evil@example.org' id='E'/>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='bot@example.org' id='S1'/></message>",
            None,
        );
        let i = s.inbound.unwrap();
        assert_eq!((i.chat_id.as_str(), i.user_id.as_str()), ("alice@example.org", "alice@example.org"));
        assert_eq!(i.event_id, "o:alice@example.org:alice@example.org:o1");
        assert_eq!(s.archived, Some(("bot@example.org".into(), "S1".into())), "only the stanza-id by our archive");
        // The same message from the archive: the same event id.
        let a = seen(
            "<message from='alice@example.org/phone' type='chat'><body>hi</body>\
             <origin-id xmlns='urn:xmpp:sid:0' id='o1'/></message>",
            Some("S1"),
        );
        assert_eq!(a.inbound.unwrap().event_id, i.event_id);
        // No origin-id: the archive id; neither: the connection's counter.
        let b = seen("<message from='a@example.org' type='chat'><body>x</body></message>", Some("S2"));
        assert_eq!(b.inbound.unwrap().event_id, "s:bot@example.org:S2");
        let c = seen("<message from='a@example.org' type='chat'><body>x</body></message>", None);
        assert_eq!((c.inbound.unwrap().event_id.as_str(), c.archived), ("c1:1", None));
    }

    #[test]
    fn rooms_ignore_our_reflection_history_and_subjects() {
        let live = seen(
            "<message from='room@muc.example.org/alice' type='groupchat'><body>hello</body>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='room@muc.example.org' id='R1'/></message>",
            None,
        );
        let i = live.inbound.unwrap();
        assert_eq!((i.chat_id.as_str(), i.user_id.as_str()), ("room@muc.example.org", "room@muc.example.org/alice"));
        assert_eq!(i.event_id, "s:room@muc.example.org:R1");
        let own = seen(
            "<message from='room@muc.example.org/gw' type='groupchat'><body>reply</body>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='room@muc.example.org' id='R2'/></message>",
            None,
        );
        assert_eq!(own.inbound, None);
        assert_eq!(own.archived, Some(("room@muc.example.org".into(), "R2".into())), "still moves the position");
        let history = seen(
            "<message from='room@muc.example.org/alice' type='groupchat'><body>old</body>\
             <delay xmlns='urn:xmpp:delay' stamp='2020-01-01T00:00:00Z'/></message>",
            None,
        );
        assert_eq!(history.inbound, None);
        let subject =
            seen("<message from='room@muc.example.org' type='groupchat'><subject>t</subject></message>", None);
        assert_eq!(subject.inbound, None);
        // A groupchat from a room we did not join, our own direct message, an error: ignored.
        assert_eq!(seen("<message from='other@muc/x' type='groupchat'><body>x</body></message>", None).inbound, None);
        assert_eq!(seen("<message from='bot@example.org/r' type='chat'><body>x</body></message>", None).inbound, None);
        assert_eq!(seen("<message from='a@example.org' type='headline'><body>x</body></message>", None).inbound, None);
    }

    #[test]
    fn edits_retractions_and_chat_states_are_not_prompts() {
        let correction = seen(
            "<message from='alice@example.org/phone' type='chat'><body>fixed</body>\
             <replace xmlns='urn:xmpp:message-correct:0' id='o1'/>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='bot@example.org' id='S3'/></message>",
            None,
        );
        assert_eq!(correction.inbound, None);
        assert_eq!(correction.archived, Some(("bot@example.org".into(), "S3".into())), "the position moves past it");
        let retraction = seen(
            "<message from='room@muc.example.org/alice' type='groupchat'><body>retracted</body>\
             <retract xmlns='urn:xmpp:message-retract:1' id='R1'/>\
             <fallback xmlns='urn:xmpp:fallback:0' for='urn:xmpp:message-retract:1'/></message>",
            None,
        );
        assert_eq!(retraction.inbound, None);
        let composing = seen(
            "<message from='alice@example.org/phone' type='chat'>\
             <composing xmlns='http://jabber.org/protocol/chatstates'/></message>",
            None,
        );
        assert_eq!(composing.inbound, None);
        // Our own preview reflected by the room: ignored, its stanza id read for the retraction.
        let m = parse_element(
            "<message from='room@muc.example.org/gw' type='groupchat'><body>Hel …</body>\
             <origin-id xmlns='urn:xmpp:sid:0' id='P1'/>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='room@muc.example.org' id='R9'/></message>",
        )
        .unwrap();
        let rooms = vec!["room@muc.example.org".to_owned()];
        let r9 = Some("R9".to_owned());
        assert_eq!(own_reflection(&m, &rooms, "gw"), Some(("room@muc.example.org".into(), "P1".into(), r9)));
        assert_eq!(own_reflection(&m, &rooms, "alice"), None, "someone else's message");
        let mut ids = RoomIds::default();
        ids.reflected("room@muc.example.org", "P1", Some("R9"));
        assert_eq!(ids.take("room@muc.example.org", "P1"), "P1", "only previews we expect are filled");
        ids.expect("Room@muc.example.org", "P1");
        assert!(ids.awaited("room@muc.example.org", "P1"));
        ids.reflected("room@muc.example.org", "P1", Some("R9"));
        assert!(!ids.awaited("room@muc.example.org", "P1"));
        assert_eq!(ids.take("room@muc.example.org", "P1"), "R9");
        // A room without stanza ids: the reflection ends the wait, the origin id is named.
        ids.expect("room@muc.example.org", "P2");
        ids.reflected("room@muc.example.org", "P2", None);
        assert!(!ids.awaited("room@muc.example.org", "P2"));
        assert_eq!(ids.take("room@muc.example.org", "P2"), "P2");
        assert_eq!(ids.take("room@muc.example.org", "P1"), "P1", "taken once");
        for i in 0..MAX_TRACKED + 10 {
            ids.expect("r@m", &i.to_string());
        }
        assert_eq!((ids.order.len(), ids.ids.len()), (MAX_TRACKED, MAX_TRACKED), "bounded");
    }

    #[test]
    fn chat_states_are_sent_once_per_change() {
        let mut t = Talker {
            writer: Arc::default(),
            rooms: Vec::new(),
            room_ids: Arc::default(),
            states: BTreeMap::new(),
            files: Files::new(None, false).unwrap(),
            domain: "example.org".into(),
            upload: None,
        };
        use skeleton::Sender as _;
        // Not connected: an error, and the state is not recorded as sent.
        assert!(matches!(t.typing("a@b", true), Err(SendError::Lost(_))));
        assert!(t.states.is_empty());
        // Off before anything was on: nothing to send.
        assert_eq!(t.typing("a@b", false), Ok(()));
        assert!(t.state_changes("a@b", ChatState::Composing));
        assert!(!t.state_changes("A@b", ChatState::Composing), "a refresh repeats nothing");
        assert!(t.state_changes("a@b", ChatState::Active));
        for i in 0..MAX_TRACKED + 5 {
            t.state_changes(&format!("u{i}@b"), ChatState::Composing);
        }
        assert!(t.states.len() <= MAX_TRACKED);
    }

    /// A direct message is listed when allowed_chats names its bare JID (the policy decides the
    /// rest); a room message is a listed group's, addressed by our nick or a reply to us.
    #[test]
    fn chat_kinds_listing_and_mentions() {
        let own = BareJid::parse("bot@example.org").unwrap();
        let allowed = vec!["alice@example.org".to_owned()];
        let seen = |xml: &str| {
            let m = parse_element(xml).unwrap();
            let rooms = ["ops@muc.example.org".to_owned()];
            classify(&m, &own, &rooms, "gw", &allowed, None, || "c".into()).inbound.unwrap()
        };
        let mallory = seen("<message from='mallory@example.org/x' type='chat'><body>x</body></message>");
        assert_eq!((mallory.chat, mallory.listed), (ChatKind::Direct, false));
        assert!(seen("<message from='Alice@example.org/x' type='chat'><body>x</body></message>").listed);
        let room = seen("<message from='ops@muc.example.org/carol' type='groupchat'><body>hi all</body></message>");
        assert_eq!((room.chat, room.listed, room.addressed), (ChatKind::Group, true, false));
        assert!(
            seen("<message from='ops@muc.example.org/carol' type='groupchat'><body>GW: hi</body></message>").addressed
        );
        let reply = "<message from='ops@muc.example.org/carol' type='groupchat'><body>yes</body>\
                     <reply xmlns='urn:xmpp:reply:0' to='ops@muc.example.org/gw' id='1'/></message>";
        assert!(seen(reply).addressed);
    }
}
