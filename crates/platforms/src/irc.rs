//! IRC adapter: one registered connection (crates/chatproto/src/irc.rs), channels joined from
//! `allowed_chats`, PRIVMSG in and out.
//!
//! - **Configuration.** `server = "host:port"`, `nick`; `allowed_chats` holds the channels to
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
//! One OS thread per adapter: it reads with a short timeout and flushes the outbox between
//! reads (one socket, one writer: a PONG never interleaves with a PRIVMSG).

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_agent::config::PlatformConfig;
use gatewarden_chatproto::irc::{Config, Connection, Error as IrcError, ErrorKind, Event, MAX_TEXT_BYTES, split_text};

use crate::wait::Flags;
use crate::{Adapter, AdapterError, Host, Inbound, Sent, State, Status};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// How long one read waits before the outbox is looked at again.
const READ_SLICE: Duration = Duration::from_millis(50);
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
    /// `server/nick`: what two consumers must not share.
    credential: String,
    allowed: Vec<String>,
    conflict_bound: Duration,
    status: Arc<Status>,
    run: Mutex<Option<Run>>,
}

struct Run {
    shared: Arc<Shared>,
    done: mpsc::Receiver<()>,
}

struct Shared {
    flags: Flags,
    close_deadline: Mutex<Option<Instant>>,
}

impl Irc {
    pub fn new(cfg: &PlatformConfig, password: Option<String>) -> Result<Irc, AdapterError> {
        let name = cfg.adapter_name();
        let (Some(server), Some(nick)) = (cfg.server.clone(), cfg.nick.clone()) else {
            return Err(AdapterError::Start { name, message: "irc needs server and nick".into() });
        };
        let server = server.trim().to_owned();
        Ok(Irc {
            credential: format!("{}/{}", server.to_ascii_lowercase(), nick.to_ascii_lowercase()),
            name,
            server,
            nick,
            password,
            allowed: cfg.allowed_chats.clone(),
            conflict_bound: Duration::from_secs(cfg.conflict_standby_s),
            status: Arc::new(Status::default()),
            run: Mutex::new(None),
        })
    }

    fn with_run(&self, f: impl FnOnce(&Run)) {
        if let Some(r) = self.run.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            f(r);
        }
    }
}

struct Worker {
    name: String,
    cfg: Config,
    channels: Vec<String>,
    /// Nicks whose private messages are served (empty: anyone's).
    nicks: Vec<String>,
    conflict_bound: Duration,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
    bucket: Bucket,
}

impl Worker {
    fn set(&self, s: State) {
        if self.status.set(s.clone()) {
            self.host.state_changed(&self.name, &s);
        }
    }

    fn pause(&self, d: Duration) {
        self.shared.flags.sleep(d, |b| b.close || b.kick);
    }

    fn close_deadline(&self) -> Option<Instant> {
        *self.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(mut self) {
        let mut conn: Option<(Connection, String, u64)> = None;
        let mut backoff = BACKOFF_MIN;
        let mut conflict_since: Option<Instant> = None;
        let mut last_flush = Instant::now();
        loop {
            let flags = self.shared.flags.get();
            if flags.close {
                // Flush what the outbox holds while connected and before the deadline, then go.
                if let Some((mut c, cid, mut n)) = conn.take() {
                    let deadline = self.close_deadline().unwrap_or_else(Instant::now);
                    while Instant::now() < deadline {
                        match self.flush(&mut c, Some(deadline)) {
                            Ok(true) | Err(_) => break,
                            Ok(false) => {}
                        }
                    }
                    // QUIT, then read until the server closes: what it relayed to us before it
                    // handled the QUIT is journaled (the successor runs it), not dropped.
                    if c.send_raw("QUIT :gatewarden: restarting or stopping").is_ok() {
                        let end = Instant::now() + QUIT_DRAIN;
                        loop {
                            let left = end.saturating_duration_since(Instant::now());
                            match c.next_event(left) {
                                Ok(Some(Event::Privmsg { from, target, text, msgid })) => {
                                    n += 1;
                                    let own = c.nick().to_owned();
                                    self.inbound(&own, event_id(msgid.as_deref(), &cid, n), from, target, text);
                                }
                                Ok(Some(_)) if !left.is_zero() => {}
                                _ => break,
                            }
                        }
                    }
                }
                return;
            }
            if self.shared.flags.take_kick()
                && let Some((c, _, _)) = conn.take()
            {
                c.quit("gatewarden: reconnecting");
                self.set(State::Connecting);
            }
            let Some((c, cid, n)) = conn.as_mut() else {
                if flags.stop {
                    // Draining without a connection: the successor connects.
                    self.pause(Duration::from_secs(1));
                    continue;
                }
                match self.connect() {
                    Ok(c) => {
                        conn = Some((c, connection_id(SystemTime::now()), 0));
                        backoff = BACKOFF_MIN;
                        conflict_since = None;
                        self.status.progress();
                        self.set(State::Connected);
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
                            while !self.shared.flags.get().close {
                                self.shared.flags.sleep(Duration::from_secs(3600), |b| b.close);
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
            // A wake, or once a second for entries queued without one.
            if self.shared.flags.take_wake() || last_flush.elapsed() >= Duration::from_secs(1) {
                last_flush = Instant::now();
                match self.flush(c, None) {
                    Ok(true) => {}
                    // More may wait: next round.
                    Ok(false) => self.shared.flags.update(|b| b.wake = true),
                    Err(e) => {
                        self.lost(&mut conn, &e, &mut backoff);
                        continue;
                    }
                }
            }
            match c.next_event(READ_SLICE) {
                Ok(ev) => {
                    // No error means the connection answered within its keepalive bound.
                    self.status.progress();
                    match ev {
                        Some(Event::Privmsg { from, target, text, msgid }) => {
                            *n += 1;
                            let id = event_id(msgid.as_deref(), cid, *n);
                            let own = c.nick().to_owned();
                            self.inbound(&own, id, from, target, text);
                        }
                        // Kicked from a served channel: join it again (a ban makes that fail,
                        // and the reconnect loop reports why).
                        Some(Event::Other(m)) if m.command == "KICK" && m.param(1).eq_ignore_ascii_case(c.nick()) => {
                            let channel = m.param(0).to_owned();
                            if let Err(e) = c.join(&channel, JOIN_TIMEOUT) {
                                self.lost(
                                    &mut conn,
                                    &format!("kicked from {channel}, cannot rejoin: {e}"),
                                    &mut backoff,
                                );
                            }
                        }
                        _ => {}
                    }
                }
                Err(e) => {
                    self.lost(&mut conn, &e.to_string(), &mut backoff);
                }
            }
        }
    }

    fn lost(&self, conn: &mut Option<(Connection, String, u64)>, e: &str, backoff: &mut Duration) {
        *conn = None;
        self.set(State::Degraded(format!("connection lost: {e}")));
        self.pause(*backoff);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }

    fn connect(&self) -> Result<Connection, IrcError> {
        let mut c = Connection::connect(&self.cfg)?;
        for ch in &self.channels {
            c.join(ch, JOIN_TIMEOUT)?;
        }
        // Whatever waits in the outbox (a predecessor's replies) goes out now.
        self.shared.flags.update(|b| b.wake = true);
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
                Err(_) => self.pause(Duration::from_millis(100 << i)),
            }
        }
    }

    /// Sends one batch of the outbox. `Ok(true)` when it was empty.
    fn flush(&mut self, c: &mut Connection, deadline: Option<Instant>) -> Result<bool, String> {
        let batch = self.host.outbox(&self.name, 16)?;
        if batch.is_empty() {
            return Ok(true);
        }
        for item in batch {
            let target = item.chat_id.trim();
            for line in reply_lines(&item.text) {
                let wait = self.bucket.take(Instant::now());
                if deadline.is_some_and(|d| Instant::now() + wait >= d) {
                    return Err("flood control past the drain deadline".into());
                }
                if !wait.is_zero() {
                    self.shared.flags.sleep(wait, |_| false);
                }
                match c.privmsg(target, &line) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Permanent => {
                        self.host.sent(item.seq, Sent::Rejected(e.to_string()));
                        break;
                    }
                    Err(e) => return Err(e.to_string()),
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
        let shared = Arc::new(Shared { flags: Flags::default(), close_deadline: Mutex::new(None) });
        let (channels, nicks) = self.allowed.iter().cloned().partition(|c| is_channel(c));
        let w = Worker {
            name: self.name.clone(),
            cfg,
            channels,
            nicks,
            conflict_bound: self.conflict_bound,
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host,
            bucket: Bucket::new(Instant::now()),
        };
        let (tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("gw-{}-irc", self.name))
            .spawn(move || {
                w.run();
                let _ = tx.send(());
            })
            .map_err(|e| AdapterError::Start {
                name: self.name.clone(),
                message: format!("cannot start a thread: {e}"),
            })?;
        *self.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(Run { shared, done });
        Ok(())
    }

    fn wake(&self) {
        self.with_run(|r| r.shared.flags.update(|b| b.wake = true));
    }

    fn reconnect(&self) {
        self.with_run(|r| r.shared.flags.update(|b| b.kick = true));
    }

    /// IRC keeps nothing for a successor: the connection keeps listening (and journaling) until
    /// [`Adapter::close`]; it only stops reconnecting.
    fn stop_intake(&self) {
        self.with_run(|r| r.shared.flags.update(|b| b.stop = true));
    }

    fn close(&self, deadline: Instant) -> bool {
        let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut all = true;
        if let Some(r) = run {
            *r.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
            r.shared.flags.update(|b| {
                b.stop = true;
                b.close = true;
            });
            let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(500);
            all = !matches!(r.done.recv_timeout(left), Err(mpsc::RecvTimeoutError::Timeout));
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
