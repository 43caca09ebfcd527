//! IRC adapter: one registered connection (crates/chatproto/src/irc.rs), channels joined from
//! `allowed_chats`, PRIVMSG in and out.
//!
//! - **Configuration.** `server = "host:port"` (or `host`: port 6697 with `tls = true`, else
//!   6667), `tls` (verified with crates/net's settings and `ca_file`; a certificate failure is
//!   `degraded` and retried like any connection failure), `nick`; `allowed_chats` holds the channels to
//!   join (`#name`) and the nicks whose private messages are served (with no nick listed, private
//!   messages from anyone are). `token_env`, optional, names the server password sent as `PASS`
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
//! - **Flood control.** Lines leave through a token bucket ([`Bucket`]: a burst of
//!   [`FLOOD_BURST`], then one per [`FLOOD_EVERY`]), below common servers' flood limits.
//! - **Liveness.** The client answers PINGs and pings a silent server; a dead connection is an
//!   error, then `degraded` and a reconnect with backoff.
//!
//! Two OS threads per adapter: a reader that owns the connection (connect, join, read, PONG,
//! reconnect, `QUIT`) and a sender that drains the outbox through the connection's
//! [`Writer`] (one lock per line: a PONG never interleaves with a PRIVMSG), so a reply never
//! waits for a read to time out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_chatproto::irc::{
    Config, Connection, Error as IrcError, ErrorKind, Event, MAX_TEXT_BYTES, Writer, split_text,
};
use gatewarden_config::PlatformConfig;

use crate::wait::{self, Flags, Running, Slot, spawn};
use crate::{Adapter, AdapterError, Host, Inbound, Sent, State, Status};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// How long one read waits before the reader looks at its flags (reconnect, quit) again.
const READ_SLICE: Duration = Duration::from_millis(250);
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines sent back to back before flood control paces them.
pub const FLOOD_BURST: u32 = 5;
/// The pace after a burst.
pub const FLOOD_EVERY: Duration = Duration::from_millis(500);
/// How long the connection is read after our QUIT, for what the server relayed before it.
const QUIT_DRAIN: Duration = Duration::from_secs(2);
/// Tries to journal one inbound message before it is given up (IRC cannot redeliver it).
const DELIVER_TRIES: u32 = 5;

/// A token bucket for outgoing lines.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(now: Instant) -> Bucket {
        Bucket { tokens: f64::from(FLOOD_BURST), at: now }
    }

    /// Takes one token: how long to wait before sending (zero when one is available).
    pub fn take(&mut self, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() / FLOOD_EVERY.as_secs_f64();
        self.tokens = (self.tokens + refill).min(f64::from(FLOOD_BURST));
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { FLOOD_EVERY.mul_f64(-self.tokens) }
    }
}

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
    let mut out = Vec::new();
    for line in text.split('\n') {
        let line: String = line.chars().filter(|c| !matches!(c, '\r' | '\0')).collect();
        out.extend(split_text(line.trim_end(), MAX_TEXT_BYTES).into_iter().map(str::to_owned));
    }
    if out.is_empty() {
        out.push("(empty reply)".to_owned());
    }
    out
}

/// The IRC adapter.
pub struct Irc {
    name: String,
    server: String,
    nick: String,
    password: Option<String>,
    /// `tls = true`: the TLS settings (crates/net; `ca_file`), else plain TCP.
    tls: Option<gatewarden_net::ClientTls>,
    /// SASL PLAIN: the account (the nick) and its password (`sasl_password_env`).
    sasl: Option<(String, String)>,
    /// `server/nick`: what two consumers must not share.
    credential: String,
    allowed: Vec<String>,
    conflict_bound: Duration,
    status: Arc<Status>,
    run: Slot<Shared>,
}

/// What the reader and the sender share.
struct Shared {
    /// `stop`: draining (no reconnect); `close`: the sender flushes then ends; `kick`: reconnect.
    flags: Flags,
    close_deadline: Mutex<Option<Instant>>,
    /// Set once the sender is done: the reader quits.
    quit: Mutex<bool>,
    /// The live connection's write side (`None` while disconnected).
    writer: Mutex<Option<Writer>>,
}

impl AsRef<Flags> for Shared {
    fn as_ref(&self) -> &Flags {
        &self.flags
    }
}

impl Shared {
    fn writer(&self) -> Option<Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_writer(&self, w: Option<Writer>) {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
    }

    fn quitting(&self) -> bool {
        *self.quit.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Irc {
    pub fn new(cfg: &PlatformConfig, password: Option<String>) -> Result<Irc, AdapterError> {
        let name = cfg.adapter_name();
        let (Some(server), Some(nick)) = (cfg.irc_addr(), cfg.nick.clone()) else {
            return Err(AdapterError::Start { name, message: "irc needs server and nick".into() });
        };
        let tls = match cfg.tls {
            true => Some(
                gatewarden_net::ClientTls::new(cfg.ca_file.as_deref())
                    .map_err(|e| AdapterError::Start { name: name.clone(), message: e.to_string() })?,
            ),
            false => None,
        };
        let sasl = match &cfg.sasl_password_env {
            None => None,
            Some(var) => match std::env::var(var).ok().filter(|p| !p.is_empty()) {
                Some(password) => Some((nick.clone(), password)),
                None => {
                    let message = format!("environment variable {var} (sasl_password_env) is not set or empty");
                    return Err(AdapterError::Start { name, message });
                }
            },
        };
        Ok(Irc {
            tls,
            sasl,
            credential: format!("{}/{}", server.to_ascii_lowercase(), nick.to_ascii_lowercase()),
            name,
            server,
            nick,
            password,
            allowed: cfg.allowed_chats.clone(),
            conflict_bound: Duration::from_secs(cfg.conflict_standby_s),
            status: Arc::new(Status::default()),
            run: Slot::default(),
        })
    }
}

/// Owns the connection: connects, joins, reads, reconnects; quits when the sender is done.
struct Reader {
    name: String,
    cfg: Config,
    channels: Vec<String>,
    /// Nicks whose private messages are served (empty: anyone's).
    nicks: Vec<String>,
    conflict_bound: Duration,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
}

/// The live connection, its id (for event ids) and its message counter.
struct Live {
    conn: Connection,
    id: String,
    n: u64,
}

impl Reader {
    fn set(&self, s: State) {
        if self.status.set(s.clone()) {
            self.host.state_changed(&self.name, &s);
        }
    }

    fn pause(&self, d: Duration) {
        self.shared.flags.sleep(d, |b| b.close || b.kick);
    }

    fn run(self) {
        let mut live: Option<Live> = None;
        let mut backoff = BACKOFF_MIN;
        let mut conflict_since: Option<Instant> = None;
        loop {
            if self.shared.quitting() {
                if let Some(l) = live.take() {
                    self.quit(l);
                }
                return;
            }
            let flags = self.shared.flags.get();
            if self.shared.flags.take_kick()
                && let Some(l) = live.take()
            {
                self.shared.set_writer(None);
                l.conn.quit("gatewarden: reconnecting");
                self.set(State::Connecting);
            }
            let Some(l) = live.as_mut() else {
                if flags.stop || flags.close {
                    // Draining without a connection: the successor connects.
                    self.shared.flags.sleep(Duration::from_millis(200), |_| false);
                    continue;
                }
                match self.connect() {
                    Ok(conn) => {
                        self.shared.set_writer(Some(conn.writer()));
                        live = Some(Live { conn, id: connection_id(SystemTime::now()), n: 0 });
                        backoff = BACKOFF_MIN;
                        conflict_since = None;
                        self.status.progress();
                        self.set(State::Connected);
                        // Whatever waits in the outbox (a predecessor's replies) goes out now.
                        self.shared.flags.update(|b| b.wake = true);
                    }
                    Err(e) => match e.kind() {
                        ErrorKind::Conflict => {
                            self.status.conflict();
                            let since = *conflict_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= self.conflict_bound {
                                self.set(State::Standby(format!(
                                    "another consumer is active: nick {} in use on {}",
                                    self.cfg.nick, self.cfg.addr
                                )));
                                // One try per bound: slow enough never to fight the holder.
                                self.pause(self.conflict_bound);
                            } else {
                                self.pause(backoff);
                                backoff = (backoff * 2).min(BACKOFF_MAX).min(self.conflict_bound);
                            }
                        }
                        ErrorKind::Rejected => {
                            // Retrying cannot help: wait for the drain.
                            self.set(State::Parked(format!("credentials rejected: {e}")));
                            while !self.shared.quitting() {
                                self.shared.flags.sleep(Duration::from_secs(1), |_| false);
                            }
                            return;
                        }
                        ErrorKind::Transient | ErrorKind::Permanent => {
                            conflict_since = None;
                            self.set(State::Degraded(e.to_string()));
                            self.pause(backoff);
                            backoff = (backoff * 2).min(BACKOFF_MAX);
                        }
                    },
                }
                continue;
            };
            match l.conn.next_event(READ_SLICE) {
                Ok(ev) => {
                    // No error means the connection answered within its keepalive bound.
                    self.status.progress();
                    match ev {
                        Some(Event::Privmsg { from, target, text, msgid }) => {
                            l.n += 1;
                            let id = event_id(msgid.as_deref(), &l.id, l.n);
                            let own = l.conn.nick().to_owned();
                            self.inbound(&own, id, from, target, text);
                        }
                        // Kicked from a served channel: join it again (a ban makes that fail,
                        // and the reconnect loop reports why).
                        Some(Event::Other(m))
                            if m.command == "KICK" && m.param(1).eq_ignore_ascii_case(l.conn.nick()) =>
                        {
                            let channel = m.param(0).to_owned();
                            if let Err(e) = l.conn.join(&channel, JOIN_TIMEOUT) {
                                self.lost(
                                    &mut live,
                                    &format!("kicked from {channel}, cannot rejoin: {e}"),
                                    &mut backoff,
                                );
                            }
                        }
                        _ => {}
                    }
                }
                Err(e) => self.lost(&mut live, &e.to_string(), &mut backoff),
            }
        }
    }

    /// `QUIT`, then reads until the server closes: what it relayed to us before it handled the
    /// `QUIT` is journaled (the successor runs it), not dropped.
    fn quit(&self, mut l: Live) {
        self.shared.set_writer(None);
        if l.conn.send_raw("QUIT :gatewarden: restarting or stopping").is_err() {
            return;
        }
        let end = Instant::now() + QUIT_DRAIN;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match l.conn.next_event(left) {
                Ok(Some(Event::Privmsg { from, target, text, msgid })) => {
                    l.n += 1;
                    let own = l.conn.nick().to_owned();
                    self.inbound(&own, event_id(msgid.as_deref(), &l.id, l.n), from, target, text);
                }
                Ok(Some(_)) if !left.is_zero() => {}
                _ => return,
            }
        }
    }

    fn lost(&self, live: &mut Option<Live>, e: &str, backoff: &mut Duration) {
        *live = None;
        self.shared.set_writer(None);
        self.set(State::Degraded(format!("connection lost: {e}")));
        self.pause(*backoff);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }

    fn connect(&self) -> Result<Connection, IrcError> {
        let mut c = Connection::connect(&self.cfg)?;
        for ch in &self.channels {
            c.join(ch, JOIN_TIMEOUT)?;
        }
        Ok(c)
    }

    /// Routes one PRIVMSG: a channel we serve, or a private message from an allowed nick.
    fn inbound(&self, own: &str, event_id: String, from: String, target: String, text: String) {
        let chat = if is_channel(&target) {
            if !self.channels.iter().any(|c| c.eq_ignore_ascii_case(&target)) {
                return;
            }
            target
        } else {
            if !target.eq_ignore_ascii_case(own)
                || !(self.nicks.is_empty() || self.nicks.iter().any(|n| n.eq_ignore_ascii_case(&from)))
            {
                return;
            }
            from.clone()
        };
        let msg = Inbound { event_id, chat_id: chat, user_id: from, text, sent_at: None };
        for i in 0..DELIVER_TRIES {
            match self.host.deliver(&self.name, msg.clone()) {
                Ok(()) => {
                    self.status.received(None);
                    return;
                }
                Err(e) if i + 1 == DELIVER_TRIES => {
                    // IRC cannot redeliver: the message is lost (at most once), and says so.
                    self.set(State::Degraded(format!("cannot journal an inbound message (lost): {e}")));
                }
                Err(_) => {
                    self.shared.flags.sleep(Duration::from_millis(100 << i), |_| false);
                }
            }
        }
    }
}

/// Why a flush stopped: `wire` when the connection failed (the reader reports and reconnects),
/// else the journal or the drain deadline.
struct FlushError {
    wire: bool,
    /// The journal's error, worth a `degraded`.
    journal: Option<String>,
}

/// Drains the outbox through the live connection's [`Writer`], paced by a [`Bucket`].
struct Sender {
    name: String,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
    bucket: Bucket,
}

impl Sender {
    fn deadline(&self) -> Option<Instant> {
        *self.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let flags = self.shared.flags.get();
            let deadline = self.deadline();
            if flags.close && deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            let Some(w) = self.shared.writer() else {
                if flags.close {
                    // No connection at the end of a drain (none is made now): the successor
                    // sends what is left.
                    return;
                }
                self.shared.flags.sleep(Duration::from_millis(200), |b| b.close);
                continue;
            };
            match self.flush(&w, deadline) {
                Ok(true) => {
                    backoff = BACKOFF_MIN;
                    if flags.close {
                        return;
                    }
                    self.shared.flags.sleep(Duration::from_secs(1), |b| b.wake || b.close);
                    self.shared.flags.take_wake();
                }
                Ok(false) => backoff = BACKOFF_MIN,
                Err(e) => {
                    if e.wire {
                        // The reader sees the closed socket, reports it and reconnects.
                        w.shutdown();
                    }
                    if let Some(why) = e.journal {
                        let state = State::Degraded(format!("cannot read the outbox: {why}"));
                        if self.status.set(state.clone()) {
                            self.host.state_changed(&self.name, &state);
                        }
                    }
                    if flags.close {
                        return;
                    }
                    self.shared.flags.sleep(backoff, |b| b.close);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Sends one batch of the outbox. `Ok(true)` when it was empty.
    fn flush(&mut self, w: &Writer, deadline: Option<Instant>) -> Result<bool, FlushError> {
        let batch = self.host.outbox(&self.name, 16).map_err(|e| FlushError { wire: false, journal: Some(e) })?;
        if batch.is_empty() {
            return Ok(true);
        }
        'items: for item in batch {
            let target = item.chat_id.trim();
            for line in reply_lines(&item.text) {
                let wait = self.bucket.take(Instant::now());
                if deadline.is_some_and(|d| Instant::now() + wait >= d) {
                    // Flood control past the drain deadline: the successor sends the rest.
                    return Err(FlushError { wire: false, journal: None });
                }
                if !wait.is_zero() {
                    self.shared.flags.sleep(wait, |_| false);
                }
                match w.privmsg(target, &line) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Permanent => {
                        // A target that cannot go on the wire: never retried.
                        self.host.sent(item.seq, Sent::Rejected(e.to_string()));
                        continue 'items;
                    }
                    Err(_) => return Err(FlushError { wire: true, journal: None }),
                }
            }
            self.status.sent();
            self.status.progress();
            self.host.sent(item.seq, Sent::Ok);
        }
        Ok(false)
    }
}

impl Adapter for Irc {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "irc"
    }

    fn credential(&self) -> &str {
        &self.credential
    }

    fn status(&self) -> &Arc<Status> {
        &self.status
    }

    fn start(&self, host: Arc<dyn Host>) -> Result<(), AdapterError> {
        self.status.set(State::Connecting);
        let mut cfg = Config::new(self.server.clone(), self.nick.clone());
        cfg.password = self.password.clone();
        cfg.tls = self.tls.clone();
        cfg.sasl = self.sasl.clone();
        let shared = Arc::new(Shared {
            flags: Flags::default(),
            close_deadline: Mutex::new(None),
            quit: Mutex::new(false),
            writer: Mutex::new(None),
        });
        let (channels, nicks) = self.allowed.iter().cloned().partition(|c| is_channel(c));
        let reader = Reader {
            name: self.name.clone(),
            cfg,
            channels,
            nicks,
            conflict_bound: self.conflict_bound,
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host: Arc::clone(&host),
        };
        let sender = Sender {
            name: self.name.clone(),
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host,
            bucket: Bucket::new(Instant::now()),
        };
        let reader_done = spawn(&self.name, "irc", move || reader.run())?;
        let sender_done = spawn(&self.name, "send", move || sender.run())?;
        self.run.set(Running { shared, recv_done: reader_done, send_done: sender_done });
        Ok(())
    }

    fn wake(&self) {
        self.run.signal(|b| b.wake = true);
    }

    fn reconnect(&self) {
        self.run.signal(|b| b.kick = true);
    }

    /// IRC keeps nothing for a successor: the connection keeps listening (and journaling) until
    /// [`Adapter::close`]; it only stops reconnecting.
    fn stop_intake(&self) {
        self.run.signal(|b| b.stop = true);
    }

    fn close(&self, deadline: Instant) -> bool {
        let run = self.run.take();
        let mut all = true;
        if let Some(r) = run {
            wait::begin_close(&r.shared.flags, &r.shared.close_deadline, deadline);
            all = wait::ended_by(&r.send_done, deadline, Duration::from_millis(200));
            // The replies are out (or the deadline passed): now the connection may go.
            *r.shared.quit.lock().unwrap_or_else(|p| p.into_inner()) = true;
            let _ = r.recv_done.recv_timeout(READ_SLICE + QUIT_DRAIN + Duration::from_millis(500));
        }
        self.status.set(State::Closed);
        all
    }

    fn watchdog_after(&self) -> Duration {
        // The client declares a silent connection dead after 90 s (PING after 60 s of silence,
        // 30 s for the answer); the watchdog only backs that up.
        Duration::from_secs(150)
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
    fn flood_control_allows_a_burst_then_paces() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        for _ in 0..FLOOD_BURST {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        assert_eq!(b.take(t0), FLOOD_EVERY);
        assert_eq!(b.take(t0), FLOOD_EVERY * 2);
        // Idle time refills up to the burst, never beyond.
        let later = t0 + FLOOD_EVERY * 100;
        let mut b = Bucket::new(later);
        for _ in 0..FLOOD_BURST {
            assert_eq!(b.take(later), Duration::ZERO);
        }
        assert!(b.take(later) > Duration::ZERO);
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
