//! IRC adapter: one registered connection (crates/chatproto/src/irc.rs), channels joined from
//! `allowed_chats`, PRIVMSG in and out.
//!
//! - **Configuration.** `server = "host:port"` (or `host`: port 6697 with `tls = true`, else
//!   6667), `tls` (verified with crates/net's settings and `ca_file`; a certificate failure is
//!   `degraded` and retried like any connection failure), `nick`; `allowed_chats` holds the channels to
//!   join (`#name`) and the nicks whose private messages are served (`listed`: the access
//!   policy, crates/runtime/src/access/, decides the rest; IRC defaults to `allowlist`, since a
//!   nick is anyone's who takes it on a network without nick registration). `token_env`, optional, names the server password sent as `PASS`
//!   (many networks hand it to NickServ).
//! - **One consumer per nick.** The credential lock is keyed by `server/nick` (lower-cased),
//!   not by the password: two gateways on one host conflict when they would use the same nick on
//!   the same server. On the wire, `433` (nick in use) is retried with backoff; when it persists
//!   past `conflict_standby_s` the adapter stands by ("another consumer is active: nick … in
//!   use"), retrying the nick once per bound. It never takes another nick and never fights.
//! - **At most once inbound.** IRC has no event ids and no redelivery: a message is delivered
//!   only while the connection is up. Its event id is the IRCv3 `msgid` tag when the server sends
//!   one, else `<connection id>:<counter>` (the connection id is the connect time and the pid),
//!   unique across restarts. What arrives while no incarnation is connected (the gap of a
//!   restart, a server outage) is not seen. To narrow the restart gap, the connection keeps
//!   listening through the drain (the messages are journaled and run by the successor), quits
//!   only at [`Adapter::close`] after the outbox is flushed, and reads on until the server
//!   closes it, so nothing relayed before the `QUIT` is dropped.
//! - **At least once outbound.** An entry is marked sent after all its lines went out: a crash in
//!   between sends it once more (worst case one duplicate).
//! - **Flood control.** Lines leave through the skeleton's token bucket (a burst of
//!   [`FLOOD_BURST`], then one per [`FLOOD_EVERY`]), below common servers' flood limits.
//! - **Liveness.** The client answers PINGs and pings a silent server; a dead connection is an
//!   error, then `degraded` and a reconnect with backoff.
//!
//! The loops, states, pacing and drain are the skeleton's (crates/platforms/src/skeleton); this
//! module is the protocol ([`Proto`]): a receive side that owns the connection (connect, join,
//! read, PONG, `QUIT`) and a send side that writes through the connection's [`Writer`] (one
//! lock per line: a PONG never interleaves with a PRIVMSG), so a reply never waits for a read
//! to time out.
//!
//! [`Adapter::close`]: crate::Adapter::close

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gatewarden_chatproto::irc::{Config, Connection, ErrorKind, Event, MAX_TEXT_BYTES, Writer};
use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Irc as Settings;

use crate::skeleton::{self, Batch, Ctx, Failure, Limits, Pace, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound, names_word};

/// How long one read waits before the receive loop looks at its flags (reconnect, quit) again.
const READ_SLICE: Duration = Duration::from_millis(250);
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines sent back to back before flood control paces them.
pub const FLOOD_BURST: u32 = 5;
/// The pace after a burst.
pub const FLOOD_EVERY: Duration = Duration::from_millis(500);
/// How long the connection is read after our QUIT, for what the server relayed before it.
const QUIT_DRAIN: Duration = Duration::from_secs(2);

/// The event id of one inbound message: the server's `msgid`, else a per-connection counter.
pub fn event_id(msgid: Option<&str>, connection: &str, n: u64) -> String {
    match msgid {
        Some(id) if !id.is_empty() => format!("msgid:{id}"),
        _ => format!("{connection}:{n}"),
    }
}

/// A connection id unique across restarts: the connect time (µs) and the pid.
fn connection_id(now: SystemTime) -> String {
    let us = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("c{us:x}.{}", std::process::id())
}

fn is_channel(s: &str) -> bool {
    s.starts_with(['#', '&', '+', '!'])
}

/// The lines one reply is sent as: a newline starts a new message, long ones are split.
pub fn reply_lines(text: &str) -> Vec<String> {
    skeleton::pieces(text, &Proto::LIMITS)
}

/// The IRC adapter.
pub type Irc = Skeleton<Proto>;

/// The IRC protocol.
pub struct Proto {
    server: String,
    nick: String,
    password: Option<String>,
    /// `tls = true`: the TLS settings (crates/net; `ca_file`), else plain TCP.
    tls: Option<gatewarden_net::ClientTls>,
    /// SASL PLAIN: the account (the nick) and its password (`sasl_password_env` / `_file`).
    sasl: Option<(String, String)>,
    /// `server/nick`: what two consumers must not share.
    credential: String,
    allowed: Vec<String>,
}

impl Skeleton<Proto> {
    /// `password`: the server's (`PASS`); `sasl_password`: SASL PLAIN's as the account named
    /// `nick` (both resolved by crates/config/src/secrets.rs).
    pub fn new(
        cfg: &PlatformConfig,
        password: Option<String>,
        sasl_password: Option<String>,
    ) -> Result<Irc, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let name = cfg.adapter_name();
        let (Some(server), Some(nick)) = (s.addr(), s.nick.clone()) else {
            return Err(AdapterError::Start { name, message: "irc needs server and nick".into() });
        };
        let tls = match s.tls {
            true => Some(
                gatewarden_net::ClientTls::new(cfg.ca_file.as_deref())
                    .map_err(|e| AdapterError::Start { name: name.clone(), message: e.to_string() })?,
            ),
            false => None,
        };
        let sasl = sasl_password.map(|p| (nick.clone(), p));
        let proto = Proto {
            tls,
            sasl,
            credential: format!("{}/{}", server.to_ascii_lowercase(), nick.to_ascii_lowercase()),
            server,
            nick,
            password,
            allowed: cfg.allowed_chats.clone(),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

/// The live connection's write side, shared by the two halves (`None` while disconnected).
type WriterSlot = Arc<Mutex<Option<Writer>>>;

fn set_writer(slot: &WriterSlot, w: Option<Writer>) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = w;
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Irc, AdapterError> {
        // The server password is optional.
        Irc::new(
            cfg,
            creds.optional(gatewarden_config::secrets::PlatformSecret::Token)?,
            creds.optional(gatewarden_config::secrets::PlatformSecret::SaslPassword)?,
        )
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Bytes(MAX_TEXT_BYTES),
        line_per_piece: true,
        batch: 16,
        pace: Some(Pace { burst: FLOOD_BURST, every: FLOOD_EVERY }),
        min_receive: Duration::ZERO,
        // No event ids, no redelivery: at most once inbound.
        redelivers: false,
        // The server keeps nothing for a successor: listen on until the replies are out.
        listens_through_drain: true,
        connected_after_receive: false,
        close_grace: Duration::from_millis(500).saturating_add(READ_SLICE).saturating_add(QUIT_DRAIN),
    };
    type Receiver = Reader;
    type Sender = Talker;

    fn credential(&self) -> &str {
        &self.credential
    }

    /// The client declares a silent connection dead after 90 s (PING after 60 s of silence,
    /// 30 s for the answer); the watchdog only backs that up.
    fn watchdog_after(&self) -> Duration {
        Duration::from_secs(150)
    }

    fn open(&self, _host: &Arc<dyn Host>) -> Result<(Reader, Talker), String> {
        let mut cfg = Config::new(self.server.clone(), self.nick.clone());
        cfg.password = self.password.clone();
        cfg.tls = self.tls.clone();
        cfg.sasl = self.sasl.clone();
        let writer: WriterSlot = Arc::default();
        let (channels, nicks) = self.allowed.iter().cloned().partition(|c| is_channel(c));
        let reader = Reader { cfg, channels, nicks, writer: Arc::clone(&writer), live: None };
        Ok((reader, Talker { writer }))
    }
}

/// The receive side: owns the connection (connect, join, read, `QUIT`).
pub struct Reader {
    cfg: Config,
    channels: Vec<String>,
    /// Nicks `allowed_chats` names (their private messages are `listed`).
    nicks: Vec<String>,
    writer: WriterSlot,
    live: Option<Live>,
}

/// The live connection, its id (for event ids) and its message counter.
struct Live {
    conn: Connection,
    id: String,
    n: u64,
}

impl Reader {
    /// Drops the connection after an error (the socket is gone or unusable).
    fn lost(&mut self, why: String) -> Failure {
        self.live = None;
        set_writer(&self.writer, None);
        Failure::Lost(format!("connection lost: {why}"))
    }

    /// Routes one PRIVMSG: a channel's (a group: addressed when it names our nick, `gwbot:
    /// hi`), or a private message to us. Whether it is served is the access policy's
    /// (crates/runtime/src/access/); `listed` is what allowed_chats says (channels and nicks,
    /// case-insensitively).
    fn inbound(&self, own: &str, event_id: String, from: String, target: String, text: String) -> Option<Inbound> {
        let (chat, kind, listed, addressed) = if is_channel(&target) {
            let listed = self.channels.iter().any(|c| c.eq_ignore_ascii_case(&target));
            let addressed = names_word(&text, own);
            (target, ChatKind::Group, listed, addressed)
        } else {
            if !target.eq_ignore_ascii_case(own) {
                return None;
            }
            let listed = self.nicks.iter().any(|n| n.eq_ignore_ascii_case(&from));
            (from.clone(), ChatKind::Direct, listed, true)
        };
        Some(Inbound {
            event_id,
            chat_id: chat,
            user_id: from,
            text,
            sent_at: None,
            chat: kind,
            listed,
            addressed,
            attachments: Vec::new(),
        })
    }

    /// A PRIVMSG event on the live connection, as an inbound message we serve.
    fn privmsg(&mut self, from: String, target: String, text: String, msgid: Option<String>) -> Option<Inbound> {
        let l = self.live.as_mut()?;
        l.n += 1;
        let id = event_id(msgid.as_deref(), &l.id, l.n);
        let own = l.conn.nick().to_owned();
        self.inbound(&own, id, from, target, text)
    }
}

impl skeleton::Receiver for Reader {
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        let connected = Connection::connect(&self.cfg).and_then(|mut c| {
            for ch in &self.channels {
                c.join(ch, JOIN_TIMEOUT)?;
            }
            Ok(c)
        });
        match connected {
            Ok(conn) => {
                set_writer(&self.writer, Some(conn.writer()));
                self.live = Some(Live { conn, id: connection_id(SystemTime::now()), n: 0 });
                Ok(())
            }
            Err(e) => Err(match e.kind() {
                ErrorKind::Conflict => Failure::Conflict(format!("nick {} in use on {}", self.cfg.nick, self.cfg.addr)),
                ErrorKind::Rejected => Failure::Rejected(e.to_string()),
                ErrorKind::Transient | ErrorKind::Permanent => Failure::Down(e.to_string()),
            }),
        }
    }

    /// One read slice; no error means the connection answered within its keepalive bound.
    fn receive(&mut self, _ctx: &Ctx, _budget: Option<Duration>) -> Result<Batch, Failure> {
        let Some(l) = self.live.as_mut() else {
            return Err(self.lost("not connected".into()));
        };
        let mut batch = Batch::default();
        match l.conn.next_event(READ_SLICE) {
            Ok(Some(Event::Privmsg { from, target, text, msgid })) => {
                batch.messages.extend(self.privmsg(from, target, text, msgid));
            }
            // Kicked from a served channel: join it again (a ban makes that fail, and the
            // reconnect loop reports why).
            Ok(Some(Event::Other(m))) if m.command == "KICK" && m.param(1).eq_ignore_ascii_case(l.conn.nick()) => {
                let channel = m.param(0).to_owned();
                if let Err(e) = l.conn.join(&channel, JOIN_TIMEOUT) {
                    return Err(self.lost(format!("kicked from {channel}, cannot rejoin: {e}")));
                }
            }
            Ok(_) => {}
            Err(e) => return Err(self.lost(e.to_string())),
        }
        Ok(batch)
    }

    fn disconnect(&mut self) {
        set_writer(&self.writer, None);
        if let Some(l) = self.live.take() {
            l.conn.quit("gatewarden: reconnecting");
        }
    }

    /// `QUIT`, then reads until the server closes: what it relayed to us before it handled the
    /// `QUIT` is journaled (the successor runs it), not dropped.
    fn hang_up(&mut self) -> Vec<Inbound> {
        set_writer(&self.writer, None);
        let mut out = Vec::new();
        let Some(l) = self.live.as_mut() else { return out };
        if l.conn.send_raw("QUIT :gatewarden: restarting or stopping").is_err() {
            self.live = None;
            return out;
        }
        let end = std::time::Instant::now() + QUIT_DRAIN;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let Some(l) = self.live.as_mut() else { break };
            match l.conn.next_event(left) {
                Ok(Some(Event::Privmsg { from, target, text, msgid })) => {
                    out.extend(self.privmsg(from, target, text, msgid));
                }
                Ok(Some(_)) if !left.is_zero() => {}
                _ => break,
            }
        }
        self.live = None;
        out
    }
}

/// The send side: PRIVMSG through the live connection's [`Writer`].
pub struct Talker {
    writer: WriterSlot,
}

impl Talker {
    fn writer(&self) -> Option<Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl skeleton::Sender for Talker {
    fn ready(&self) -> bool {
        self.writer().is_some()
    }

    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        let Some(w) = self.writer() else { return Err(SendError::Lost("not connected".into())) };
        match w.privmsg(chat.trim(), piece) {
            Ok(_) => Ok(()),
            // A target that cannot go on the wire: never retried.
            Err(e) if e.kind() == ErrorKind::Permanent => Err(SendError::Rejected(e.to_string())),
            Err(e) => {
                // The receive side sees the closed socket, reports it and reconnects.
                w.shutdown();
                Err(SendError::Lost(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_prefer_msgid_and_are_unique_per_connection_and_restart() {
        assert_eq!(event_id(Some("AbC"), "c1.2", 3), "msgid:AbC");
        assert_eq!(event_id(Some(""), "c1.2", 3), "c1.2:3");
        assert_eq!(event_id(None, "c1.2", 4), "c1.2:4");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let a = connection_id(t);
        let b = connection_id(t + Duration::from_micros(1));
        assert_ne!(a, b, "a reconnect gets another id");
        assert!(a.ends_with(&format!(".{}", std::process::id())), "{a}");
    }

    #[test]
    fn replies_become_lines_without_controls() {
        assert_eq!(reply_lines("a\r\nb\n\n c \0"), vec!["a", "b", " c"]);
        assert_eq!(reply_lines(""), vec!["(empty reply)"]);
        let long = "word ".repeat(200);
        assert!(reply_lines(&long).iter().all(|l| l.len() <= MAX_TEXT_BYTES && !l.is_empty()));
        assert!(is_channel("#gw") && is_channel("&x") && !is_channel("alice"));
    }
}
