//! `xmpp`: a blocking XMPP client (RFC 6120/6121) over `std::net::TcpStream`, with just what a
//! bot account needs: STARTTLS (always, verified with crates/net's rustls settings), SASL
//! SCRAM-SHA-1 (PLAIN only as a fallback, and only inside TLS), resource binding, stream
//! management acks (XEP-0198, no resumption), multi-user chat (XEP-0045), the message archive
//! (XEP-0313), stanza ids (XEP-0359), and what shows a bot at work: chat states (XEP-0085),
//! corrections (XEP-0308) and retractions (XEP-0424); files are out-of-band URLs (XEP-0066),
//! uploaded through the server's HTTP upload service (XEP-0363: [`discover_upload`],
//! [`request_slot`], both IQs a [`Writer`] sends and the reader's thread answers).
//!
//! The XML is quick-xml's ([`xml`]): the stream is cut into top-level elements, each read into
//! a small tree. Everything is bounded: the connect by its deadline, each read by the caller's
//! timeout, a silent server by the keepalive (an SM ack request or an XEP-0199 ping after
//! [`Config::ping_interval`], dead after [`Config::ping_timeout`] more).
//!
//! One [`Connection`] reads; any number of [`Writer`]s (other threads) write through it, one
//! lock per stanza.

pub mod scram;
pub mod xml;

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gatewarden_net::rustls;

use crate::wire::{Silence, Sink};

pub use xml::{Element, Frame, Framer, XmlFault, escape};

/// STARTTLS (RFC 6120 §5).
pub const NS_TLS: &str = "urn:ietf:params:xml:ns:xmpp-tls";
/// SASL (RFC 6120 §6).
pub const NS_SASL: &str = "urn:ietf:params:xml:ns:xmpp-sasl";
/// Resource binding (RFC 6120 §7).
pub const NS_BIND: &str = "urn:ietf:params:xml:ns:xmpp-bind";
/// Stanza error conditions (RFC 6120 §8.3).
pub const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";
/// Stream error conditions (RFC 6120 §4.9).
pub const NS_STREAMS: &str = "urn:ietf:params:xml:ns:xmpp-streams";
/// Stream management (XEP-0198).
pub const NS_SM: &str = "urn:xmpp:sm:3";
/// Multi-user chat, joining (XEP-0045).
pub const NS_MUC: &str = "http://jabber.org/protocol/muc";
/// Multi-user chat, occupant data (XEP-0045).
pub const NS_MUC_USER: &str = "http://jabber.org/protocol/muc#user";
/// The message archive (XEP-0313).
pub const NS_MAM: &str = "urn:xmpp:mam:2";
/// Result set paging (XEP-0059).
pub const NS_RSM: &str = "http://jabber.org/protocol/rsm";
/// Forwarded stanzas (XEP-0297).
pub const NS_FORWARD: &str = "urn:xmpp:forward:0";
/// Delayed delivery timestamps (XEP-0203).
pub const NS_DELAY: &str = "urn:xmpp:delay";
/// Stanza and origin ids (XEP-0359).
pub const NS_SID: &str = "urn:xmpp:sid:0";
/// Pings (XEP-0199).
pub const NS_PING: &str = "urn:xmpp:ping";
/// Data forms (XEP-0004).
pub const NS_DATA: &str = "jabber:x:data";
/// Chat state notifications (XEP-0085).
pub const NS_CHATSTATES: &str = "http://jabber.org/protocol/chatstates";
/// Last message correction (XEP-0308).
pub const NS_CORRECT: &str = "urn:xmpp:message-correct:0";
/// Message retraction (XEP-0424).
pub const NS_RETRACT: &str = "urn:xmpp:message-retract:1";
/// Message fastening (XEP-0422), which older retractions and moderations use.
pub const NS_FASTEN: &str = "urn:xmpp:fasten:0";
/// Fallback indication (XEP-0428).
pub const NS_FALLBACK: &str = "urn:xmpp:fallback:0";
/// Message processing hints (XEP-0334).
pub const NS_HINTS: &str = "urn:xmpp:hints";
/// Out-of-band data (XEP-0066): a file's URL.
pub const NS_OOB: &str = "jabber:x:oob";
/// HTTP file upload (XEP-0363).
pub const NS_UPLOAD: &str = "urn:xmpp:http:upload:0";
/// Service discovery (XEP-0030).
pub const NS_DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
/// Service discovery, items (XEP-0030).
pub const NS_DISCO_ITEMS: &str = "http://jabber.org/protocol/disco#items";
use xml::{NS_CLIENT, NS_STREAM};

/// What the adapter does next after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retry with backoff (network, timeouts, a closed stream, a TLS failure).
    Transient,
    /// The server refused our credentials: park.
    Rejected,
    /// Another session took our resource (`<conflict/>`): another consumer is active.
    Conflict,
    /// This request can never work (a malformed address, a refused room).
    Permanent,
}

/// A client error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Nothing came within the bound.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The server closed the stream or the socket.
    #[error("connection closed: {0}")]
    Closed(String),
    /// STARTTLS missing or refused, or the certificate not verified for `host`.
    #[error("TLS with {host}: {reason}")]
    Tls {
        /// The name verified (the JID's domain).
        host: String,
        /// Why, in crates/net's words.
        reason: String,
    },
    /// Malformed XML or an answer out of order.
    #[error("the server broke the protocol: {0}")]
    Protocol(String),
    /// SASL failed (the credentials, or no usable mechanism).
    #[error("authentication refused: {0}")]
    Rejected(String),
    /// The server ended the stream with an error (RFC 6120 §4.9).
    #[error("stream error <{condition}/>: {text}")]
    Stream {
        /// The defined condition (`conflict`, `system-shutdown`, …).
        condition: String,
        /// The server's text, cut to 200 characters.
        text: String,
    },
    /// An address or nick that cannot go on the wire.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A request answered with a stanza error.
    #[error("{what} refused: <{condition}/>")]
    Refused {
        /// The request.
        what: String,
        /// The defined condition (`item-not-found`, `forbidden`, …).
        condition: String,
    },
}

impl Error {
    /// What the adapter does next.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Rejected(_) => ErrorKind::Rejected,
            Error::Stream { condition, .. } if condition == "conflict" => ErrorKind::Conflict,
            Error::Stream { condition, .. } if condition == "not-authorized" => ErrorKind::Rejected,
            Error::InvalidInput(_) | Error::Refused { .. } => ErrorKind::Permanent,
            _ => ErrorKind::Transient,
        }
    }
}

impl From<XmlFault> for Error {
    fn from(f: XmlFault) -> Self {
        Error::Protocol(f.0)
    }
}

/// A bare JID, `local@domain`, checked: the account and the rooms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BareJid {
    /// The local part, as given.
    pub local: String,
    /// The domain, lower-cased.
    pub domain: String,
}

impl BareJid {
    /// Parses `local@domain` (no resource). Refuses spaces, controls and the characters
    /// RFC 7622 forbids in a local part.
    pub fn parse(s: &str) -> Result<BareJid, Error> {
        let bad = || Error::InvalidInput(format!("{s:?} is not a bare JID (local@domain)"));
        let (local, domain) = s.trim().split_once('@').ok_or_else(bad)?;
        let forbidden = |c: char| c.is_whitespace() || c.is_control() || "\"&'/:<>@".contains(c);
        if local.is_empty() || domain.is_empty() || local.len() > 1023 || domain.len() > 1023 {
            return Err(bad());
        }
        if local.chars().any(forbidden) || domain.chars().any(forbidden) {
            return Err(bad());
        }
        Ok(BareJid { local: local.to_owned(), domain: domain.to_ascii_lowercase() })
    }

    /// `local@domain`, the local part as given.
    pub fn as_string(&self) -> String {
        format!("{}@{}", self.local, self.domain)
    }

    /// Whether `jid` (bare or full) is this bare JID (case-insensitively: servers fold case).
    pub fn matches(&self, jid: &str) -> bool {
        bare(jid).eq_ignore_ascii_case(&self.as_string())
    }
}

impl std::fmt::Display for BareJid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.local, self.domain)
    }
}

/// The bare part of a JID (everything before the first `/`).
pub fn bare(jid: &str) -> &str {
    jid.split_once('/').map_or(jid, |(b, _)| b)
}

/// The resource of a full JID (the occupant nick of a room JID).
pub fn resource(jid: &str) -> Option<&str> {
    jid.split_once('/').map(|(_, r)| r)
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port` (no DNS SRV: the configuration names the server).
    pub addr: String,
    /// The account.
    pub jid: BareJid,
    /// Its password.
    pub password: String,
    /// The resource asked for (the server may assign another).
    pub resource: String,
    /// The trust for STARTTLS (crates/net). There is no plaintext mode.
    pub tls: gatewarden_net::ClientTls,
    /// The bound of the whole connect (TCP, STARTTLS, SASL, bind).
    pub connect_timeout: Duration,
    /// Silence before the client checks the server is alive.
    pub ping_interval: Duration,
    /// How long the check may go unanswered before the connection is dead.
    pub ping_timeout: Duration,
}

impl Config {
    /// The defaults: resource `gatewarden`, 15 s to connect, a keepalive check after 60 s of
    /// silence, dead 30 s later.
    pub fn new(addr: String, jid: BareJid, password: String, tls: gatewarden_net::ClientTls) -> Config {
        Config {
            addr,
            jid,
            password,
            resource: "gatewarden".into(),
            tls,
            connect_timeout: Duration::from_secs(15),
            ping_interval: Duration::from_secs(60),
            ping_timeout: Duration::from_secs(30),
        }
    }
}

/// Where stanzas are written (through the TLS session once STARTTLS is done), and what stream
/// management counts of them.
#[derive(Debug)]
struct Out {
    sink: Sink,
    /// Stanzas sent since stream management was enabled (XEP-0198's outbound count).
    sent: u32,
    sm: bool,
}

crate::wire::wire_errors!(Error);

fn write(out: &Mutex<Out>, data: &str, stanza: bool) -> Result<(), Error> {
    let mut s = out.lock().unwrap_or_else(|p| p.into_inner());
    s.sink.write_all(data.as_bytes()).map_err(io_error)?;
    if stanza && s.sm {
        s.sent = s.sent.wrapping_add(1);
    }
    Ok(())
}

/// A unique id for stanzas and origin-ids: a process-wide counter with the pid and start time.
pub fn new_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros())
    });
    format!("gw{start:x}.{}.{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A chat message as it goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing<'a> {
    /// The recipient: a bare JID, or a room.
    pub to: &'a str,
    /// `chat` to a person, `groupchat` to a room.
    pub groupchat: bool,
    /// The text (escaped on the way out; what XML cannot carry is dropped).
    pub body: &'a str,
    /// The message id and its XEP-0359 origin-id.
    pub id: &'a str,
}

/// What a message with a body does besides being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind<'a> {
    /// A new message (with `<active/>`: per XEP-0085 §5, a message with a body carries the
    /// sender's chat state once it uses chat states at all).
    New,
    /// A correction (XEP-0308) of the message whose `id` this is: always the ORIGINAL
    /// message's id, never a previous correction's (XEP-0308 §5), in rooms too. The body is
    /// the full new text.
    Correct(&'a str),
    /// A retraction (XEP-0424) of the message this id names (in a room, the room's stanza id
    /// for it). The body is the fallback text for clients without XEP-0424 (XEP-0428), and the
    /// store hint (XEP-0334) keeps the retraction in archives, which is how a client that was
    /// offline learns of it.
    Retract(&'a str),
    /// A file (XEP-0066 out-of-band data): its URL, which the body repeats for clients that
    /// show only bodies (what XEP-0363 uploaders send).
    Oob(&'a str),
}

/// A chat state (XEP-0085).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatState {
    /// Paying attention, not writing.
    Active,
    /// Writing a message.
    Composing,
    /// Stopped writing for now.
    Paused,
}

impl ChatState {
    /// The element name.
    pub fn name(self) -> &'static str {
        match self {
            ChatState::Active => "active",
            ChatState::Composing => "composing",
            ChatState::Paused => "paused",
        }
    }
}

fn check_recipient(to: &str) -> Result<(), Error> {
    if to.is_empty() || to.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::InvalidInput(format!("recipient {to:?}")));
    }
    Ok(())
}

fn message_type(groupchat: bool) -> &'static str {
    if groupchat { "groupchat" } else { "chat" }
}

/// The `<message>` for `m` (the body escaped, the address checked).
pub fn message_xml(m: &Outgoing<'_>) -> Result<String, Error> {
    stanza_xml(m, Kind::New)
}

/// The `<message>` for `m` as `kind` says: every id and text escaped, the address checked.
pub fn stanza_xml(m: &Outgoing<'_>, kind: Kind<'_>) -> Result<String, Error> {
    check_recipient(m.to)?;
    let extra = match kind {
        Kind::New => format!("<active xmlns='{NS_CHATSTATES}'/>"),
        Kind::Correct(original) => {
            format!("<replace xmlns='{NS_CORRECT}' id='{}'/><active xmlns='{NS_CHATSTATES}'/>", escape(original))
        }
        Kind::Retract(target) => format!(
            "<retract xmlns='{NS_RETRACT}' id='{}'/><fallback xmlns='{NS_FALLBACK}' for='{NS_RETRACT}'/>\
             <store xmlns='{NS_HINTS}'/>",
            escape(target)
        ),
        Kind::Oob(url) => {
            format!("<x xmlns='{NS_OOB}'><url>{}</url></x><active xmlns='{NS_CHATSTATES}'/>", escape(url))
        }
    };
    Ok(format!(
        "<message to='{to}' type='{kind}' id='{id}'><body>{body}</body><origin-id xmlns='{NS_SID}' id='{id}'/>{extra}</message>",
        to = escape(m.to),
        kind = message_type(m.groupchat),
        id = escape(m.id),
        body = escape(m.body)
    ))
}

/// A standalone chat state notification (XEP-0085: no body; `groupchat` to a room), not
/// to be archived (XEP-0334 `<no-store/>`).
pub fn chat_state_xml(to: &str, groupchat: bool, state: ChatState, id: &str) -> Result<String, Error> {
    check_recipient(to)?;
    Ok(format!(
        "<message to='{to}' type='{kind}' id='{id}'><{state} xmlns='{NS_CHATSTATES}'/><no-store xmlns='{NS_HINTS}'/></message>",
        to = escape(to),
        kind = message_type(groupchat),
        id = escape(id),
        state = state.name()
    ))
}

/// Whether `m` changes an earlier message rather than saying something new: a correction
/// (XEP-0308), a retraction (XEP-0424, either version), or a moderation fastened to another
/// message (XEP-0422/0425). Their bodies, if any, are fallbacks or edits, not new prompts.
pub fn amends_another(m: &Element) -> bool {
    m.child("replace", NS_CORRECT).is_some()
        || m.child("retract", NS_RETRACT).is_some()
        || m.child("apply-to", NS_FASTEN).is_some()
        || m.children_named("fallback", NS_FALLBACK)
            .any(|f| f.attr("for").is_some_and(|x| x.starts_with("urn:xmpp:message-retract")))
        || m.child("moderated", "urn:xmpp:message-moderate:1").is_some()
}

/// The URL of a message's out-of-band file (XEP-0066 `<x xmlns='jabber:x:oob'><url>`), when it
/// has one.
pub fn oob_url(m: &Element) -> Option<String> {
    let url = m.child("x", NS_OOB)?.child("url", NS_OOB)?.text.trim().to_owned();
    (!url.is_empty()).then_some(url)
}

/// A server's HTTP upload service (XEP-0363).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadService {
    /// The service's JID (`upload.example.org`).
    pub jid: String,
    /// `max-file-size` from its disco#info form, when it says one.
    pub max_size: Option<u64>,
}

/// An upload slot: where to PUT the bytes (with these headers), and the URL to share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Where the bytes go (HTTP PUT).
    pub put: String,
    /// Only `Authorization`, `Cookie` and `Expires`, without line breaks (XEP-0363 §5).
    pub headers: Vec<(String, String)>,
    /// Where anyone reads the file (the URL to share).
    pub get: String,
}

/// The JIDs a disco#items answer lists.
pub fn parse_disco_items(iq: &Element) -> Vec<String> {
    let Some(q) = iq.child("query", NS_DISCO_ITEMS) else { return Vec::new() };
    q.children_named("item", NS_DISCO_ITEMS).filter_map(|i| i.attr("jid")).map(str::to_owned).collect()
}

/// `Some(max_size)` when a disco#info answer of `jid` says it is an upload service.
pub fn parse_upload_info(jid: &str, iq: &Element) -> Option<UploadService> {
    let q = iq.child("query", NS_DISCO_INFO)?;
    if !q.children_named("feature", NS_DISCO_INFO).any(|f| f.attr("var") == Some(NS_UPLOAD)) {
        return None;
    }
    let max_size = q
        .children_named("x", NS_DATA)
        .filter(|x| {
            x.children_named("field", NS_DATA).any(|f| {
                f.attr("var") == Some("FORM_TYPE")
                    && f.child("value", NS_DATA).is_some_and(|v| v.text.trim() == NS_UPLOAD)
            })
        })
        .flat_map(|x| x.children_named("field", NS_DATA))
        .find(|f| f.attr("var") == Some("max-file-size"))
        .and_then(|f| f.child("value", NS_DATA))
        .and_then(|v| v.text.trim().parse::<u64>().ok());
    Some(UploadService { jid: jid.to_owned(), max_size })
}

/// The slot of a slot request's answer (XEP-0363 §4).
pub fn parse_slot(iq: &Element) -> Result<Slot, Error> {
    let slot = iq.child("slot", NS_UPLOAD).ok_or_else(|| Error::Protocol("upload answer without <slot>".into()))?;
    let put = slot.child("put", NS_UPLOAD).ok_or_else(|| Error::Protocol("upload slot without <put>".into()))?;
    let get = slot.child("get", NS_UPLOAD).and_then(|g| g.attr("url"));
    let (Some(put_url), Some(get)) = (put.attr("url"), get) else {
        return Err(Error::Protocol("upload slot without put and get URLs".into()));
    };
    let headers = put
        .children_named("header", NS_UPLOAD)
        .filter_map(|h| {
            let name = h.attr("name")?;
            let known = ["Authorization", "Cookie", "Expires"].iter().find(|k| k.eq_ignore_ascii_case(name))?;
            let value: String = h.text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
            Some(((*known).to_owned(), value))
        })
        .collect();
    Ok(Slot { put: put_url.to_owned(), headers, get: get.to_owned() })
}

/// Finds the upload service among the items of `domain` (the server's own host first).
pub fn discover_upload(w: &Writer, domain: &str, timeout: Duration) -> Result<Option<UploadService>, Error> {
    let info = |jid: &str| w.iq(jid, "get", &format!("<query xmlns='{NS_DISCO_INFO}'/>"), timeout);
    match info(domain) {
        Ok(answer) => {
            if let Some(s) = parse_upload_info(domain, &answer) {
                return Ok(Some(s));
            }
        }
        // A domain that does not say what it is may still list the service.
        Err(Error::Refused { .. }) => {}
        Err(e) => return Err(e),
    }
    let items = w.iq(domain, "get", &format!("<query xmlns='{NS_DISCO_ITEMS}'/>"), timeout)?;
    for jid in parse_disco_items(&items).into_iter().take(32) {
        // An item that does not answer disco#info is not the upload service.
        if let Ok(answer) = info(&jid)
            && let Some(s) = parse_upload_info(&jid, &answer)
        {
            return Ok(Some(s));
        }
    }
    Ok(None)
}

/// Requests a slot for `size` bytes named `name` of `content_type` from `service`.
pub fn request_slot(
    w: &Writer,
    service: &str,
    name: &str,
    size: u64,
    content_type: &str,
    timeout: Duration,
) -> Result<Slot, Error> {
    let payload = format!(
        "<request xmlns='{NS_UPLOAD}' filename='{}' size='{size}' content-type='{}'/>",
        escape(name),
        escape(content_type)
    );
    parse_slot(&w.iq(service, "get", &payload, timeout)?)
}

/// IQ requests a [`Writer`] sent, and their answers once the reader read them.
#[derive(Debug, Default)]
struct Iqs {
    /// Awaited ids (`None` until answered), and whether the connection is gone.
    state: Mutex<(std::collections::HashMap<String, Option<Element>>, bool)>,
    changed: Condvar,
}

impl Iqs {
    fn expect(&self, id: &str) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0.insert(id.to_owned(), None);
    }

    fn forget(&self, id: &str) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0.remove(id);
    }

    /// Keeps `e` when it answers an awaited request (`None`), else gives it back.
    fn answer(&self, e: Element) -> Option<Element> {
        if !(e.is("iq", NS_CLIENT) && matches!(e.attr("type"), Some("result" | "error"))) {
            return Some(e);
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = e.attr("id").and_then(|id| st.0.get_mut(id)) else { return Some(e) };
        *slot = Some(e);
        drop(st);
        self.changed.notify_all();
        None
    }

    fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.changed.notify_all();
    }

    /// The answer to `id`, waiting at most `timeout` (`None`: none, or the connection ended).
    fn wait(&self, id: &str, timeout: Duration) -> Option<Element> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(Some(_)) = st.0.get(id) {
                return st.0.remove(id).flatten();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if st.1 || left.is_zero() {
                st.0.remove(id);
                return None;
            }
            st = self.changed.wait_timeout(st, left).map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }
}

/// The server's count of our stanzas it has handled (XEP-0198 `<a h=…>`), shared between the
/// reader, which sees the acks, and the writers, which wait for them.
#[derive(Debug, Default)]
struct Acks {
    /// The last `h`, and whether the connection is gone (no ack will come).
    state: Mutex<(u32, bool)>,
    changed: Condvar,
}

impl Acks {
    fn set(&self, h: u32) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 = h;
        self.changed.notify_all();
    }

    /// The connection is gone: every waiter gives up.
    fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.changed.notify_all();
    }

    /// Waits until the server has handled stanza number `n` (counts wrap at 2^32); `false`
    /// at `timeout` or when the connection ends first.
    fn wait(&self, n: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // `h` has reached `n` when `h - n` (mod 2^32) is in the lower half.
            if st.0.wrapping_sub(n) < 1 << 31 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if st.1 || left.is_zero() {
                return false;
            }
            st = self.changed.wait_timeout(st, left).map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }
}

/// The sending half of a [`Connection`], for another thread.
#[derive(Debug, Clone)]
pub struct Writer {
    out: Arc<Mutex<Out>>,
    acks: Arc<Acks>,
    iqs: Arc<Iqs>,
}

impl Writer {
    /// Sends one chat message. With stream management, returns only once the server has
    /// acknowledged it (XEP-0198), so a message written into a connection that then dies is
    /// an error (sent again on the next connection), not a silent loss; `Error::Timeout` when
    /// no ack came within `ack_timeout`.
    pub fn message(&self, m: &Outgoing<'_>, ack_timeout: Duration) -> Result<(), Error> {
        self.message_as(m, Kind::New, ack_timeout)
    }

    /// [`Writer::message`] of `kind` (a file's [`Kind::Oob`]).
    pub fn message_as(&self, m: &Outgoing<'_>, kind: Kind<'_>, ack_timeout: Duration) -> Result<(), Error> {
        let xml = stanza_xml(m, kind)?;
        let n = {
            let mut s = self.out.lock().unwrap_or_else(|p| p.into_inner());
            s.sink.write_all(xml.as_bytes()).map_err(io_error)?;
            if !s.sm {
                return Ok(());
            }
            s.sent = s.sent.wrapping_add(1);
            s.sink.write_all(format!("<r xmlns='{NS_SM}'/>").as_bytes()).map_err(io_error)?;
            s.sent
        };
        if self.acks.wait(n, ack_timeout) {
            Ok(())
        } else {
            Err(Error::Closed(format!(
                "no stream management ack for a message (within {ack_timeout:?}, or before the connection ended)"
            )))
        }
    }

    /// Sends a message of `kind` without waiting for the server's ack (it is counted for
    /// stream management, and acked with the next acked message): for what is best-effort
    /// anyway, previews and their retraction, whose id must be remembered as soon as it may
    /// have reached anyone.
    pub fn post(&self, m: &Outgoing<'_>, kind: Kind<'_>) -> Result<(), Error> {
        self.write_stanza(&stanza_xml(m, kind)?)
    }

    /// Sends a standalone chat state (XEP-0085) without waiting for an ack.
    pub fn chat_state(&self, to: &str, groupchat: bool, state: ChatState) -> Result<(), Error> {
        self.write_stanza(&chat_state_xml(to, groupchat, state, &new_id())?)
    }

    fn write_stanza(&self, xml: &str) -> Result<(), Error> {
        write(&self.out, xml, true)
    }

    /// Sends an IQ `kind` to `to` and waits at most `timeout` for its answer, which the
    /// reader's thread reads ([`Connection::next_stanza`] must be running).
    pub fn iq(&self, to: &str, kind: &str, payload: &str, timeout: Duration) -> Result<Element, Error> {
        check_recipient(to)?;
        let id = new_id();
        self.iqs.expect(&id);
        let sent =
            self.write_stanza(&format!("<iq type='{}' id='{id}' to='{}'>{payload}</iq>", escape(kind), escape(to)));
        if let Err(e) = sent {
            self.iqs.forget(&id);
            return Err(e);
        }
        match self.iqs.wait(&id, timeout) {
            Some(e) if e.attr("type") == Some("result") => Ok(e),
            Some(e) => Err(Error::Refused { what: format!("IQ {kind} to {to}"), condition: error_condition(&e) }),
            None => Err(Error::Timeout(format!("no answer to an IQ {kind} to {to} within {timeout:?}"))),
        }
    }

    /// Closes the socket: the reader's next read fails, so it reconnects.
    pub fn shutdown(&self) {
        let s = self.out.lock().unwrap_or_else(|p| p.into_inner());
        s.sink.shutdown();
    }
}

/// One archived message from a MAM query.
#[derive(Debug, Clone)]
pub struct Archived {
    /// The archive's id for it (`<result id=…>`), the position to resume after.
    pub archive_id: String,
    /// The forwarded `<message>`.
    pub message: Element,
    /// The archive's timestamp (`<delay stamp=…>`), as sent.
    pub stamp: Option<String>,
}

/// One page of a MAM query.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The messages, oldest first.
    pub items: Vec<Archived>,
    /// The server said this is the end (`<fin complete='true'>`).
    pub complete: bool,
    /// The last id of the page (`<set><last>`), when the page had any.
    pub last: Option<String>,
}

/// Where a MAM query starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// After this archive id.
    After(String),
    /// From this instant (XEP-0082 date-time), for an archive with no saved id.
    Start(String),
    /// From the beginning of the archive.
    Beginning,
}

/// A bound XMPP session.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    out: Arc<Mutex<Out>>,
    acks: Arc<Acks>,
    iqs: Arc<Iqs>,
    framer: Framer,
    /// Stanzas read while waiting for something else (a join's presence, an IQ result).
    pending: VecDeque<Element>,
    /// The full JID the server bound.
    jid: String,
    domain: String,
    /// XEP-0198: stanzas handled since `<enabled/>` (`None`: not enabled).
    handled: Option<u32>,
    keepalive: crate::wire::Keepalive,
}

impl Connection {
    /// Connects, secures (STARTTLS), authenticates, binds and enables stream management when
    /// offered; returns before any presence is sent.
    pub fn connect(cfg: &Config) -> Result<Connection, Error> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let stream = crate::wire::connect_any(&cfg.addr, cfg.connect_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(cfg.connect_timeout.max(Duration::from_secs(1))))?;
        let sink = Out { sink: Sink { sock: stream.try_clone()?, tls: None }, sent: 0, sm: false };
        let mut c = Connection {
            stream,
            tls: None,
            out: Arc::new(Mutex::new(sink)),
            acks: Arc::default(),
            iqs: Arc::default(),
            framer: Framer::default(),
            pending: VecDeque::new(),
            jid: String::new(),
            domain: cfg.jid.domain.clone(),
            handled: None,
            keepalive: crate::wire::Keepalive::new(cfg.ping_interval, cfg.ping_timeout),
        };
        // 1. Plain stream: STARTTLS is required (no plaintext mode at all).
        let features = c.open_stream(deadline)?;
        if features.child("starttls", NS_TLS).is_none() {
            return Err(Error::Tls {
                host: cfg.addr.clone(),
                reason: "the server does not offer STARTTLS, and this client never talks in plaintext".into(),
            });
        }
        c.send_nonza(&format!("<starttls xmlns='{NS_TLS}'/>"))?;
        let answer = c.read_element(deadline)?;
        if !answer.is("proceed", NS_TLS) {
            return Err(Error::Tls { host: cfg.addr.clone(), reason: format!("STARTTLS answered <{}/>", answer.name) });
        }
        if c.framer.pending() != 0 {
            return Err(Error::Protocol("data after <proceed/> before the TLS handshake".into()));
        }
        // RFC 6120 §13.7.2.1: the certificate must name the JID's domain, whatever address the
        // configuration connects to.
        let domain = &cfg.jid.domain;
        let tls = Arc::new(Mutex::new(crate::wire::handshake(&mut c.stream, domain, domain, &cfg.tls, deadline)?));
        c.tls = Some(Arc::clone(&tls));
        c.out.lock().unwrap_or_else(|p| p.into_inner()).sink.tls = Some(tls);
        c.framer.restart();
        // 2. Secured stream: SASL.
        let features = c.open_stream(deadline)?;
        let mechanisms: Vec<String> = features
            .child("mechanisms", NS_SASL)
            .map(|m| m.children_named("mechanism", NS_SASL).map(|x| x.text.trim().to_owned()).collect())
            .unwrap_or_default();
        c.authenticate(cfg, &mechanisms, deadline)?;
        c.framer.restart();
        // 3. Authenticated stream: bind, then stream management.
        let features = c.open_stream(deadline)?;
        if features.child("bind", NS_BIND).is_none() {
            return Err(Error::Protocol("no resource binding offered".into()));
        }
        let bind = format!("<bind xmlns='{NS_BIND}'><resource>{}</resource></bind>", escape(&cfg.resource));
        let result = c.iq(None, "set", &bind, deadline)?;
        let jid = result.child("bind", NS_BIND).and_then(|b| b.child("jid", NS_BIND)).map(|j| j.text.trim().to_owned());
        c.jid = jid.filter(|j| cfg.jid.matches(j)).ok_or_else(|| Error::Protocol("bound to another JID".into()))?;
        if features.child("sm", NS_SM).is_some() {
            c.send_nonza(&format!("<enable xmlns='{NS_SM}'/>"))?;
            loop {
                let e = c.read_element(deadline)?;
                if e.is("enabled", NS_SM) {
                    c.handled = Some(0);
                    let mut out = c.out.lock().unwrap_or_else(|p| p.into_inner());
                    out.sm = true;
                    out.sent = 0;
                    break;
                }
                if e.is("failed", NS_SM) {
                    break;
                }
                c.pending.push_back(e);
            }
        }
        Ok(c)
    }

    /// The full JID the server bound.
    pub fn jid(&self) -> &str {
        &self.jid
    }

    /// Whether XEP-0198 stream management is on.
    pub fn stream_management(&self) -> bool {
        self.handled.is_some()
    }

    /// A handle that sends on this connection from another thread.
    pub fn writer(&self) -> Writer {
        Writer { out: Arc::clone(&self.out), acks: Arc::clone(&self.acks), iqs: Arc::clone(&self.iqs) }
    }

    /// Sends one stanza (counted for stream management).
    pub fn send_stanza(&mut self, xml: &str) -> Result<(), Error> {
        write(&self.out, xml, true)
    }

    fn send_nonza(&mut self, xml: &str) -> Result<(), Error> {
        write(&self.out, xml, false)
    }

    /// Sends the initial presence (available, no priority games).
    pub fn presence(&mut self) -> Result<(), Error> {
        self.send_stanza("<presence/>")
    }

    /// Joins `room` as `nick` without history (the archive is the history), waiting for our
    /// own presence (status 110) or the room's refusal.
    pub fn join(&mut self, room: &BareJid, nick: &str, timeout: Duration) -> Result<(), Error> {
        if nick.is_empty() || nick.chars().any(char::is_control) {
            return Err(Error::InvalidInput(format!("room nick {nick:?}")));
        }
        let occupant = format!("{room}/{nick}");
        self.send_stanza(&format!(
            "<presence to='{}'><x xmlns='{NS_MUC}'><history maxstanzas='0'/></x></presence>",
            escape(&occupant)
        ))?;
        let deadline = Instant::now() + timeout;
        let mut held = Vec::new();
        let outcome = loop {
            let Some(e) = self.read_stanza(deadline)? else {
                break Err(Error::Timeout(format!("no answer to joining {room} within {timeout:?}")));
            };
            let from = e.attr("from").unwrap_or_default();
            if e.is("presence", NS_CLIENT) && room.matches(from) {
                if e.attr("type") == Some("error") {
                    break Err(Error::Refused { what: format!("joining {room}"), condition: error_condition(&e) });
                }
                let own = e
                    .child("x", NS_MUC_USER)
                    .is_some_and(|x| x.children_named("status", NS_MUC_USER).any(|s| s.attr("code") == Some("110")));
                if own {
                    break Ok(());
                }
                // Other occupants' presence: not chat.
                continue;
            }
            held.push(e);
        };
        for e in held.into_iter().rev() {
            self.pending.push_front(e);
        }
        outcome
    }

    /// One page of `archive`'s messages (`None`: the account's own archive), oldest first,
    /// at most `max`.
    pub fn mam_page(
        &mut self,
        archive: Option<&BareJid>,
        from: &Since,
        max: u32,
        timeout: Duration,
    ) -> Result<Page, Error> {
        let qid = new_id();
        let start_field = match from {
            Since::Start(t) => format!("<field var='start'><value>{}</value></field>", escape(t)),
            _ => String::new(),
        };
        let after = match from {
            Since::After(id) => format!("<after>{}</after>", escape(id)),
            _ => String::new(),
        };
        let query = format!(
            "<query xmlns='{NS_MAM}' queryid='{qid}'><x xmlns='{NS_DATA}' type='submit'>\
             <field var='FORM_TYPE' type='hidden'><value>{NS_MAM}</value></field>{start_field}</x>\
             <set xmlns='{NS_RSM}'><max>{max}</max>{after}</set></query>"
        );
        self.mam(archive, &qid, &query, timeout)
    }

    /// The archive's newest id (`None`: the archive is empty): where a first start begins.
    pub fn mam_newest(&mut self, archive: Option<&BareJid>, timeout: Duration) -> Result<Option<String>, Error> {
        let qid = new_id();
        let query = format!(
            "<query xmlns='{NS_MAM}' queryid='{qid}'><x xmlns='{NS_DATA}' type='submit'>\
             <field var='FORM_TYPE' type='hidden'><value>{NS_MAM}</value></field></x>\
             <set xmlns='{NS_RSM}'><max>1</max><before/></set></query>"
        );
        let page = self.mam(archive, &qid, &query, timeout)?;
        Ok(page.items.last().map(|a| a.archive_id.clone()).or(page.last))
    }

    fn mam(&mut self, archive: Option<&BareJid>, qid: &str, query: &str, timeout: Duration) -> Result<Page, Error> {
        let deadline = Instant::now() + timeout;
        let iq_id = new_id();
        let to = archive.map(|a| format!(" to='{}'", escape(&a.as_string()))).unwrap_or_default();
        self.send_stanza(&format!("<iq type='set' id='{iq_id}'{to}>{query}</iq>"))?;
        let expected_from = archive.map(BareJid::as_string);
        let mut page = Page::default();
        let mut held = Vec::new();
        let outcome = loop {
            let Some(e) = self.read_stanza(deadline)? else {
                break Err(Error::Timeout(format!("no archive answer within {timeout:?}")));
            };
            let from = e.attr("from").unwrap_or_default();
            // Results come only from the archive asked (our own account: no `from`, or our JID).
            let from_archive = match &expected_from {
                Some(a) => bare(from).eq_ignore_ascii_case(a),
                None => from.is_empty() || bare(from).eq_ignore_ascii_case(bare(&self.jid)),
            };
            let result = e.child("result", NS_MAM).filter(|r| r.attr("queryid") == Some(qid));
            if let Some(r) = result.filter(|_| e.is("message", NS_CLIENT) && from_archive) {
                let fwd = r.child("forwarded", NS_FORWARD);
                let msg = fwd.and_then(|f| f.child("message", NS_CLIENT));
                if let (Some(id), Some(msg)) = (r.attr("id"), msg) {
                    let stamp = fwd.and_then(|f| f.child("delay", NS_DELAY)).and_then(|d| d.attr("stamp"));
                    page.items.push(Archived {
                        archive_id: id.to_owned(),
                        message: msg.clone(),
                        stamp: stamp.map(str::to_owned),
                    });
                }
                continue;
            }
            if e.is("iq", NS_CLIENT) && e.attr("id") == Some(iq_id.as_str()) && from_archive {
                match e.attr("type") {
                    Some("result") => {
                        let fin = e.child("fin", NS_MAM);
                        page.complete = fin.and_then(|f| f.attr("complete")).is_some_and(|c| c == "true" || c == "1");
                        page.last = fin
                            .and_then(|f| f.child("set", NS_RSM))
                            .and_then(|s| s.child("last", NS_RSM))
                            .map(|l| l.text.trim().to_owned());
                        break Ok(());
                    }
                    _ => {
                        let condition = error_condition(&e);
                        break Err(Error::Refused { what: "the archive query".into(), condition });
                    }
                }
            }
            held.push(e);
        };
        for e in held.into_iter().rev() {
            self.pending.push_front(e);
        }
        outcome.map(|()| page)
    }

    /// The next stanza (message, presence, IQ), waiting at most `timeout`; `Ok(None)` when
    /// nothing came. Answers stream management's ack requests and pings, refuses other IQs it
    /// does not handle, and keeps the connection alive.
    pub fn next_stanza(&mut self, timeout: Duration) -> Result<Option<Element>, Error> {
        while let Some(e) = self.pending.pop_front() {
            // A writer's IQ answered while a query of ours waited.
            if let Some(e) = self.iqs.answer(e) {
                return Ok(Some(e));
            }
        }
        self.read_stanza(Instant::now() + timeout)
    }

    /// Closes the stream politely (best effort) and the socket. With stream management, the
    /// last ack goes first: the server then holds nothing of ours as unacknowledged (which it
    /// could bounce to the senders).
    pub fn close(mut self) {
        if let Some(a) = self.ack_xml() {
            let _ = self.send_nonza(&a);
        }
        let _ = self.send_nonza("<presence type='unavailable'/></stream:stream>");
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    fn ack_xml(&self) -> Option<String> {
        self.handled.map(|h| format!("<a xmlns='{NS_SM}' h='{h}'/>"))
    }

    /// Reads stanzas until one for the caller arrives.
    fn read_stanza(&mut self, deadline: Instant) -> Result<Option<Element>, Error> {
        loop {
            let Some(e) = self.read_frame(deadline)? else { return Ok(None) };
            if e.ns == NS_SM {
                // An ack request is answered; acks of what we sent are the liveness answer to
                // our own request (any data resets the keepalive).
                if e.name == "r"
                    && let Some(a) = self.ack_xml()
                {
                    self.send_nonza(&a)?;
                }
                if e.name == "a"
                    && let Some(h) = e.attr("h").and_then(|h| h.parse::<u32>().ok())
                {
                    self.acks.set(h);
                }
                continue;
            }
            if e.ns != NS_CLIENT {
                continue;
            }
            if let Some(h) = self.handled.as_mut() {
                *h = h.wrapping_add(1);
            }
            if e.name == "iq" {
                match e.attr("type") {
                    Some("get") | Some("set") => {
                        self.answer_iq(&e)?;
                        continue;
                    }
                    // Our keepalive ping's answer.
                    _ if e.attr("id").is_some_and(|id| id.starts_with("ping-")) => continue,
                    _ => {}
                }
                // A writer's IQ (an upload slot): its answer goes to the writer.
                let Some(e) = self.iqs.answer(e) else { continue };
                return Ok(Some(e));
            }
            return Ok(Some(e));
        }
    }

    /// Answers an IQ request: pings, and `service-unavailable` for everything else (RFC 6120
    /// §8.4: an IQ request must be answered).
    fn answer_iq(&mut self, e: &Element) -> Result<(), Error> {
        let id = escape(e.attr("id").unwrap_or_default());
        let to = e.attr("from").map(|f| format!(" to='{}'", escape(f))).unwrap_or_default();
        let ping = e.attr("type") == Some("get") && e.child("ping", NS_PING).is_some();
        let xml = if ping {
            format!("<iq type='result' id='{id}'{to}/>")
        } else {
            format!(
                "<iq type='error' id='{id}'{to}><error type='cancel'><service-unavailable xmlns='{NS_STANZAS}'/></error></iq>"
            )
        };
        self.send_stanza(&xml)
    }

    /// Sends an IQ and waits for its answer; other stanzas are kept for later.
    fn iq(&mut self, to: Option<&str>, kind: &str, payload: &str, deadline: Instant) -> Result<Element, Error> {
        let id = new_id();
        let to_attr = to.map(|t| format!(" to='{}'", escape(t))).unwrap_or_default();
        self.send_stanza(&format!("<iq type='{kind}' id='{id}'{to_attr}>{payload}</iq>"))?;
        loop {
            let e = self.read_element(deadline)?;
            if e.is("iq", NS_CLIENT) && e.attr("id") == Some(id.as_str()) {
                return match e.attr("type") {
                    Some("result") => Ok(e),
                    _ => Err(Error::Refused { what: format!("IQ {kind}"), condition: error_condition(&e) }),
                };
            }
            self.pending.push_back(e);
        }
    }

    /// Opens a stream and returns the server's features.
    fn open_stream(&mut self, deadline: Instant) -> Result<Element, Error> {
        self.send_nonza(&format!(
            "<?xml version='1.0'?><stream:stream to='{}' version='1.0' xmlns='{NS_CLIENT}' xmlns:stream='{NS_STREAM}'>",
            escape(&self.domain)
        ))?;
        let mut opened = false;
        loop {
            match self.next_frame(deadline)? {
                None => return Err(Error::Timeout("no stream features from the server".into())),
                Some(Frame::Open(_)) => opened = true,
                Some(Frame::Element(e)) if opened && e.is("features", NS_STREAM) => return Ok(e),
                Some(Frame::Element(e)) if e.is("error", NS_STREAM) => return Err(stream_error(&e)),
                Some(Frame::Element(e)) => {
                    return Err(Error::Protocol(format!("expected stream features, got <{}>", e.name)));
                }
                Some(Frame::Close) => return Err(Error::Closed("the server closed the stream".into())),
            }
        }
    }

    fn authenticate(&mut self, cfg: &Config, mechanisms: &[String], deadline: Instant) -> Result<(), Error> {
        let has = |m: &str| mechanisms.iter().any(|x| x.eq_ignore_ascii_case(m));
        if has("SCRAM-SHA-1") {
            let mut nonce = [0u8; 18];
            getrandom::fill(&mut nonce).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
            let mut s = scram::Scram::new(&cfg.jid.local, &cfg.password, &scram::encode_payload(&nonce));
            self.send_nonza(&format!(
                "<auth xmlns='{NS_SASL}' mechanism='SCRAM-SHA-1'>{}</auth>",
                scram::encode_payload(s.client_first().as_bytes())
            ))?;
            let first = self.sasl_step(deadline)?;
            let SaslStep::Challenge(first) = first else {
                return Err(Error::Protocol("SCRAM: success before the proof".into()));
            };
            let answer = s.client_final(&first).map_err(|e| Error::Protocol(e.to_string()))?;
            self.send_nonza(&format!(
                "<response xmlns='{NS_SASL}'>{}</response>",
                scram::encode_payload(answer.as_bytes())
            ))?;
            let last = match self.sasl_step(deadline)? {
                SaslStep::Success(data) => data,
                // Some servers send the signature as a challenge, then success.
                SaslStep::Challenge(data) => {
                    self.send_nonza(&format!("<response xmlns='{NS_SASL}'/>"))?;
                    match self.sasl_step(deadline)? {
                        SaslStep::Success(_) => data,
                        SaslStep::Challenge(_) => return Err(Error::Protocol("SCRAM: a third challenge".into())),
                    }
                }
            };
            // A server that cannot prove it knows the password is not the server.
            return s.verify(&last).map_err(|e| Error::Protocol(e.to_string()));
        }
        if has("PLAIN") && self.tls.is_some() {
            let token = format!("\0{}\0{}", cfg.jid.local, cfg.password);
            self.send_nonza(&format!(
                "<auth xmlns='{NS_SASL}' mechanism='PLAIN'>{}</auth>",
                scram::encode_payload(token.as_bytes())
            ))?;
            return match self.sasl_step(deadline)? {
                SaslStep::Success(_) => Ok(()),
                SaslStep::Challenge(_) => Err(Error::Protocol("PLAIN: a challenge".into())),
            };
        }
        Err(Error::Rejected(format!(
            "no usable SASL mechanism (offered: {}; this client does SCRAM-SHA-1 and PLAIN over TLS)",
            mechanisms.join(", ")
        )))
    }

    fn sasl_step(&mut self, deadline: Instant) -> Result<SaslStep, Error> {
        let e = self.read_element(deadline)?;
        let payload = || scram::decode_payload(&e.text).map_err(|err| Error::Protocol(err.to_string()));
        match (e.ns.as_str(), e.name.as_str()) {
            (NS_SASL, "challenge") => Ok(SaslStep::Challenge(payload()?)),
            (NS_SASL, "success") => Ok(SaslStep::Success(payload()?)),
            (NS_SASL, "failure") => {
                let condition = e.children.first().map_or("failure", |c| c.name.as_str()).to_owned();
                let text = e.children.iter().find(|c| c.name == "text").map(|t| t.text.clone()).unwrap_or_default();
                Err(Error::Rejected(format!("SASL <{condition}/> {text}").trim_end().to_owned()))
            }
            _ => Err(Error::Protocol(format!("unexpected <{}> during SASL", e.name))),
        }
    }

    /// The next top-level element (during set-up; a stream error is an error).
    fn read_element(&mut self, deadline: Instant) -> Result<Element, Error> {
        self.read_frame(deadline)?.ok_or_else(|| Error::Timeout("the server did not answer".into()))
    }

    fn read_frame(&mut self, deadline: Instant) -> Result<Option<Element>, Error> {
        match self.next_frame(deadline)? {
            None => Ok(None),
            Some(Frame::Element(e)) if e.is("error", NS_STREAM) => Err(stream_error(&e)),
            Some(Frame::Element(e)) => Ok(Some(e)),
            Some(Frame::Open(_)) => Err(Error::Protocol("a second stream header".into())),
            Some(Frame::Close) => Err(Error::Closed("the server closed the stream".into())),
        }
    }

    /// Reads until a frame is complete (`Ok(None)` at `deadline`), keeping the connection
    /// alive: after [`Config::ping_interval`] of silence an ack request (or a ping) goes out,
    /// and silence past [`Config::ping_timeout`] more is a dead connection.
    fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>, Error> {
        loop {
            if let Some(f) = self.framer.next_frame()? {
                return Ok(Some(f));
            }
            let now = Instant::now();
            match self.keepalive.check(now) {
                Silence::Dead(silent) => return Err(Error::Timeout(format!("no data from the server for {silent:?}"))),
                // Before binding there is nothing to ask the server (the handshake's own deadlines hold).
                Silence::Probe if !self.jid.is_empty() => {
                    if self.handled.is_some() {
                        self.send_nonza(&format!("<r xmlns='{NS_SM}'/>"))?;
                    } else {
                        let id = format!("ping-{}", new_id());
                        let domain = escape(&self.domain);
                        self.send_stanza(&format!(
                            "<iq type='get' id='{id}' to='{domain}'><ping xmlns='{NS_PING}'/></iq>"
                        ))?;
                    }
                    self.keepalive.probed();
                }
                Silence::Probe | Silence::Fine => {}
            }
            if now >= deadline {
                return Ok(None);
            }
            let mut chunk = [0u8; 8192];
            let read = crate::wire::read_before(
                &mut self.stream,
                self.tls.as_ref(),
                &mut self.keepalive,
                deadline,
                &mut chunk,
            );
            match read.map_err(io_error)? {
                Some(0) => return Err(Error::Closed("the server closed the connection".into())),
                Some(n) => self.framer.push(&chunk[..n]),
                None => {}
            }
        }
    }
}

/// Whether another session holds `cfg.resource` on the account, asked without taking it: a
/// second stream binds a throwaway resource (sending no presence, so no chat is routed to it)
/// and pings the full JID (XEP-0199). An answer from there means a live session (ours answers
/// pings); the server's `service-unavailable` or `recipient-unavailable`, or no answer at all
/// within `timeout` (a dead stream the server still holds), means free. Binding the resource
/// itself would close the other session's stream (RFC 6120 §7.7.2.2): this is how a consumer
/// that was pushed off the account stays off without pushing back.
pub fn resource_in_use(cfg: &Config, timeout: Duration) -> Result<bool, Error> {
    let mut probe = cfg.clone();
    probe.resource = format!("{}-probe-{}", cfg.resource, new_id());
    let mut c = Connection::connect(&probe)?;
    let full = format!("{}/{}", cfg.jid, cfg.resource);
    let ping = format!("<ping xmlns='{NS_PING}'/>");
    let answer = c.iq(Some(&full), "get", &ping, Instant::now() + timeout);
    c.close();
    match answer {
        Ok(_) => Ok(true),
        Err(Error::Refused { condition, .. }) => {
            Ok(!matches!(condition.as_str(), "service-unavailable" | "recipient-unavailable" | "item-not-found"))
        }
        Err(Error::Timeout(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Drop for Connection {
    /// The reader is gone: a writer waiting for an ack on this connection stops waiting.
    fn drop(&mut self) {
        self.acks.end();
        self.iqs.end();
    }
}

enum SaslStep {
    Challenge(String),
    Success(String),
}

/// The defined condition of a stanza error (`<error><item-not-found/>…`).
pub fn error_condition(e: &Element) -> String {
    e.child("error", NS_CLIENT)
        .and_then(|err| err.children.iter().find(|c| c.ns == NS_STANZAS && c.name != "text"))
        .map_or_else(|| "undefined-condition".to_owned(), |c| c.name.clone())
}

fn stream_error(e: &Element) -> Error {
    let condition = e.children.iter().find(|c| c.ns == NS_STREAMS && c.name != "text");
    let text = e.children.iter().find(|c| c.ns == NS_STREAMS && c.name == "text");
    Error::Stream {
        condition: condition.map_or_else(|| "undefined-condition".to_owned(), |c| c.name.clone()),
        text: text.map(|t| t.text.chars().take(200).collect()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(xml: &str) -> Element {
        xml::parse_element(xml).unwrap()
    }

    /// XEP-0066 in, XEP-0363 disco, slot and the OOB message out.
    #[test]
    fn oob_and_http_upload_parse() {
        let m = el("<message xmlns='jabber:client'><body>https://h/f.png</body>\
                    <x xmlns='jabber:x:oob'><url> https://h/f.png </url></x></message>");
        assert_eq!(oob_url(&m).as_deref(), Some("https://h/f.png"));
        assert_eq!(oob_url(&el("<message xmlns='jabber:client'><body>hi</body></message>")), None);
        assert_eq!(oob_url(&el("<message xmlns='jabber:client'><x xmlns='jabber:x:oob'><url/></x></message>")), None);

        let items =
            el("<iq xmlns='jabber:client' type='result'><query xmlns='http://jabber.org/protocol/disco#items'>\
                        <item jid='conference.h'/><item jid='upload.h'/><item/></query></iq>");
        assert_eq!(parse_disco_items(&items), ["conference.h", "upload.h"]);
        let info = el("<iq xmlns='jabber:client' type='result'><query xmlns='http://jabber.org/protocol/disco#info'>\
                       <feature var='urn:xmpp:http:upload:0'/><x xmlns='jabber:x:data' type='result'>\
                       <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:http:upload:0</value></field>\
                       <field var='max-file-size'><value>1048576</value></field></x></query></iq>");
        assert_eq!(
            parse_upload_info("upload.h", &info),
            Some(UploadService { jid: "upload.h".into(), max_size: Some(1 << 20) })
        );
        let muc = el("<iq xmlns='jabber:client' type='result'><query xmlns='http://jabber.org/protocol/disco#info'>\
                      <feature var='http://jabber.org/protocol/muc'/></query></iq>");
        assert_eq!(parse_upload_info("conference.h", &muc), None);

        let slot = el("<iq xmlns='jabber:client' type='result'><slot xmlns='urn:xmpp:http:upload:0'>\
                       <put url='https://h/up/1'><header name='authorization'>Bearer x\ny</header>\
                       <header name='X-Evil'>no</header></put><get url='https://h/f/1'/></slot></iq>");
        let s = parse_slot(&slot).unwrap();
        assert_eq!((s.put.as_str(), s.get.as_str()), ("https://h/up/1", "https://h/f/1"));
        assert_eq!(s.headers, [("Authorization".to_owned(), "Bearer xy".to_owned())]);
        assert!(parse_slot(&el("<iq xmlns='jabber:client' type='result'/>")).is_err());

        let out = Outgoing { to: "a@h", groupchat: false, body: "https://h/f/1?a=1&b", id: "i1" };
        let xml = stanza_xml(&out, Kind::Oob("https://h/f/1?a=1&b")).unwrap();
        assert!(xml.contains("<x xmlns='jabber:x:oob'><url>https://h/f/1?a=1&amp;b</url></x>"), "{xml}");
        assert_eq!(
            oob_url(&el(&xml.replace("<message ", "<message xmlns='jabber:client' "))).as_deref(),
            Some("https://h/f/1?a=1&b")
        );
    }

    /// A writer's IQ answer is taken for it; other stanzas pass.
    #[test]
    fn writer_iq_answers_are_routed() {
        let iqs = Iqs::default();
        iqs.expect("q1");
        let other = el("<iq xmlns='jabber:client' type='result' id='zz'/>");
        assert!(iqs.answer(other).is_some());
        assert!(iqs.answer(el("<message xmlns='jabber:client' id='q1'/>")).is_some());
        assert!(iqs.answer(el("<iq xmlns='jabber:client' type='result' id='q1'/>")).is_none());
        assert_eq!(
            iqs.wait("q1", Duration::from_millis(10)).and_then(|e| e.attr("id").map(str::to_owned)).as_deref(),
            Some("q1")
        );
        iqs.expect("q2");
        assert!(iqs.wait("q2", Duration::from_millis(10)).is_none(), "times out");
        iqs.expect("q3");
        iqs.end();
        assert!(iqs.wait("q3", Duration::from_secs(5)).is_none(), "the connection ended");
    }

    #[test]
    fn jids_are_checked() {
        let j = BareJid::parse("Bot@Example.ORG").unwrap();
        assert_eq!(j.to_string(), "Bot@example.org");
        assert!(j.matches("bot@example.org/res"));
        for bad in ["bot", "@x", "bot@", "a b@x", "a@b/c", "a'@b", "a<@b"] {
            assert!(BareJid::parse(bad).is_err(), "{bad}");
        }
        assert_eq!((bare("a@b/c/d"), resource("r@m/nick/x")), ("a@b", Some("nick/x")));
    }

    #[test]
    fn outgoing_messages_are_escaped_and_carry_an_origin_id() {
        let xml = message_xml(&Outgoing { to: "a@b'/x", groupchat: true, body: "<hi> & \u{1}bye", id: "i'1" }).unwrap();
        let e = xml::parse_element(&xml).unwrap();
        assert_eq!(e.attr("to"), Some("a@b'/x"));
        assert_eq!(e.attr("type"), Some("groupchat"));
        assert_eq!(e.child("body", NS_CLIENT).unwrap().text, "<hi> & bye");
        assert_eq!(e.child("origin-id", NS_SID).unwrap().attr("id"), Some("i'1"));
        assert!(message_xml(&Outgoing { to: "a b", groupchat: false, body: "x", id: "1" }).is_err());
    }

    #[test]
    fn corrections_retractions_and_chat_states_are_escaped_and_typed() {
        let m = Outgoing { to: "room@muc", groupchat: true, body: "new <text>", id: "c1" };
        let e = xml::parse_element(&stanza_xml(&m, Kind::Correct("o'1")).unwrap()).unwrap();
        assert_eq!(e.child("replace", NS_CORRECT).and_then(|r| r.attr("id")), Some("o'1"));
        assert_eq!((e.attr("id"), e.attr("type")), (Some("c1"), Some("groupchat")));
        assert_eq!(e.child("body", NS_CLIENT).unwrap().text, "new <text>");
        assert!(e.child("active", NS_CHATSTATES).is_some(), "a message with a body carries <active/>");
        assert!(amends_another(&e));
        let new = xml::parse_element(&message_xml(&m).unwrap()).unwrap();
        assert!(new.child("active", NS_CHATSTATES).is_some() && !amends_another(&new));
        let r = Outgoing { to: "a@b", groupchat: false, body: "(removed)", id: "r1" };
        let e = xml::parse_element(&stanza_xml(&r, Kind::Retract("o1")).unwrap()).unwrap();
        assert_eq!(e.child("retract", NS_RETRACT).and_then(|r| r.attr("id")), Some("o1"));
        assert_eq!(e.child("fallback", NS_FALLBACK).and_then(|f| f.attr("for")), Some(NS_RETRACT));
        assert!(e.child("store", NS_HINTS).is_some() && e.child("active", NS_CHATSTATES).is_none());
        assert!(amends_another(&e));
        let c = xml::parse_element(&chat_state_xml("a@b", false, ChatState::Composing, "s1").unwrap()).unwrap();
        assert!(c.child("composing", NS_CHATSTATES).is_some() && c.child("body", NS_CLIENT).is_none());
        assert_eq!(c.attr("type"), Some("chat"));
        assert!(chat_state_xml("a b", true, ChatState::Active, "s").is_err());
        assert!(stanza_xml(&Outgoing { to: "", groupchat: false, body: "x", id: "1" }, Kind::Retract("1")).is_err());
        let old = xml::parse_element(
            "<message><apply-to xmlns='urn:xmpp:fasten:0' id='x'><retract xmlns='urn:xmpp:message-retract:0'/></apply-to>\
             <body>fallback</body></message>",
        )
        .unwrap();
        assert!(amends_another(&old));
    }

    #[test]
    fn acks_are_counted_modulo_2_32_and_end_with_the_connection() {
        let a = Acks::default();
        a.set(5);
        assert!(a.wait(5, Duration::ZERO) && a.wait(1, Duration::ZERO));
        assert!(!a.wait(6, Duration::from_millis(10)), "not acked yet");
        a.set(2);
        assert!(a.wait(u32::MAX - 3, Duration::ZERO), "h wrapped past n");
        assert!(!a.wait(3, Duration::ZERO));
        let a = Arc::new(Acks::default());
        let waiter = {
            let a = Arc::clone(&a);
            std::thread::spawn(move || a.wait(1, Duration::from_secs(30)))
        };
        a.end();
        assert!(!waiter.join().unwrap(), "the end of the connection ends the wait");
    }

    #[test]
    fn stream_errors_are_typed() {
        let e = xml::parse_element(
            "<stream:error><conflict xmlns='urn:ietf:params:xml:ns:xmpp-streams'/>\
             <text xmlns='urn:ietf:params:xml:ns:xmpp-streams'>Replaced by new connection</text></stream:error>",
        )
        .unwrap();
        let err = stream_error(&e);
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert!(err.to_string().contains("Replaced"), "{err}");
        assert_eq!(Error::Rejected("x".into()).kind(), ErrorKind::Rejected);
    }
}
