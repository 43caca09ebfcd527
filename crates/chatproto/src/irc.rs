//! `irc`: a blocking IRC client over `std::net::TcpStream`, and a total line parser.
//!
//! What it covers: registration (`PASS`, `NICK`, `USER`, done at `001 RPL_WELCOME`), PING/PONG
//! both ways, `JOIN` (confirmed by the server's echo), `PRIVMSG` in and out, and `QUIT`.
//!
//! * **Conflict.** `433 ERR_NICKNAMEINUSE` during registration is [`Error::NickInUse`]
//!   ([`ErrorKind::Conflict`]): on a gateway's own nick it means another consumer is active, and
//!   the adapter stands by instead of fighting with another nick.
//! * **Never hangs.** Connect, registration and join have deadlines; [`Connection::next_event`]
//!   waits at most its timeout. A silent server gets a `PING` after `ping_interval`, and a
//!   connection with no traffic for `ping_interval + ping_timeout` fails with [`Error::Timeout`].
//! * **Line discipline.** Incoming lines are cut at [`MAX_LINE_BYTES`] (the rest of an overlong
//!   line is dropped) and decoded as lossy UTF-8. Outgoing text never carries CR, LF or NUL
//!   (a newline in a reply becomes separate messages, so a message cannot inject commands), and
//!   is split at [`MAX_TEXT_BYTES`] on char boundaries (preferring a space) so the server's relayed
//!   line, prefix included, stays under IRC's 512 bytes.
//! * **Reconnect-safe.** A [`Connection`] owns its socket and nothing global: after any error,
//!   drop it and [`Connection::connect`] again.
//!
//! Why std and not tokio or the `irc` crate: an adapter runs one connection on a dedicated thread,
//! the same shape as the Matrix client over blocking ureq, and the protocol subset above is small.
//! Socket read timeouts give every wait a bound without a runtime. The `irc` crate would bring
//! tokio, its own config format and about 96 crates with TLS. TLS is not covered yet: the tests
//! use a loopback ngIRCd, and a TLS stream can later wrap the same line loop.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_net::rustls;

use crate::wire::{Silence, Sink};

/// Longest incoming line kept (IRCv3 allows 8191 bytes of tags plus the 512-byte message).
pub const MAX_LINE_BYTES: usize = 8704;
/// Longest outgoing line, CRLF excluded (RFC 1459: 512 with CRLF).
pub const MAX_OUT_BYTES: usize = 510;
/// Text bytes per outgoing `PRIVMSG`: leaves room for the `:nick!user@host` prefix the server
/// adds when it relays the line.
pub const MAX_TEXT_BYTES: usize = 400;

/// What the caller should do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Another client holds our nick: stand by and retry later; never take another nick.
    Conflict,
    /// The server refused our password or nick syntax: park with the reason.
    Rejected,
    /// Connection failed, closed, reset or timed out: reconnect with backoff.
    Transient,
    /// The call itself is wrong (bad target, bad channel): retrying cannot help.
    Permanent,
}

/// An IRC client error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `433 ERR_NICKNAMEINUSE`.
    #[error("irc: nick {nick:?} is already in use (433)")]
    NickInUse {
        /// The nick we asked for.
        nick: String,
    },
    /// `431`/`432`: the server will not accept this nick at all.
    #[error("irc: nick {nick:?} refused ({code}): {message}")]
    NickRefused {
        /// The nick we asked for.
        nick: String,
        /// The numeric.
        code: String,
        /// The server's text.
        message: String,
    },
    /// `464 ERR_PASSWDMISMATCH`, `465 ERR_YOUREBANNEDCREEP`.
    #[error("irc: credentials rejected ({code}): {message}")]
    Rejected {
        /// The numeric.
        code: String,
        /// The server's text.
        message: String,
    },
    /// A `JOIN` refused (`403`, `405`, `471`, `473`, `474`, `475`, ...).
    #[error("irc: cannot join {channel} ({code}): {message}")]
    JoinRefused {
        /// The channel.
        channel: String,
        /// The numeric.
        code: String,
        /// The server's text.
        message: String,
    },
    /// The server closed the connection (EOF or an `ERROR` line).
    #[error("irc: connection closed: {0}")]
    Closed(String),
    /// A deadline passed (connect, registration, join, or a dead connection).
    #[error("irc: timed out: {0}")]
    Timeout(String),
    /// The TLS handshake failed: the certificate did not verify (unknown issuer, wrong host
    /// name, expired) or the server does not speak TLS on this port.
    #[error("irc: TLS with {host} failed: {reason}")]
    Tls {
        /// `host:port`.
        host: String,
        /// The problem in words (crates/net).
        reason: String,
    },
    /// Any other socket error (refused, reset, ...).
    #[error("irc: i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// An argument that cannot go on the wire (empty, or with spaces or control characters).
    #[error("irc: invalid input: {0}")]
    InvalidInput(String),
}

impl Error {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NickInUse { .. } => ErrorKind::Conflict,
            Error::NickRefused { .. } | Error::Rejected { .. } => ErrorKind::Rejected,
            // A certificate may be fixed on the server side: retried with backoff like any
            // connection failure, and reported with its reason meanwhile.
            Error::Closed(_) | Error::Timeout(_) | Error::Io(_) | Error::Tls { .. } => ErrorKind::Transient,
            Error::JoinRefused { .. } | Error::InvalidInput(_) => ErrorKind::Permanent,
        }
    }
}

/// One parsed IRC line: `[@tags] [:prefix] COMMAND [params...] [:trailing]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The raw IRCv3 tags (without `@`), if any.
    pub tags: Option<String>,
    /// The source (`nick!user@host` or a server name), without `:`.
    pub prefix: Option<String>,
    /// The command or three-digit numeric, as sent.
    pub command: String,
    /// The parameters; a trailing parameter is the last element.
    pub params: Vec<String>,
}

/// Why a line is not an IRC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Nothing but whitespace, tags or a prefix.
    #[error("no command")]
    NoCommand,
}

impl Message {
    /// Parses one line (a trailing CR/LF is ignored). Total: any input gives a message or a
    /// [`ParseError`].
    pub fn parse(line: &str) -> Result<Message, ParseError> {
        let mut rest = line.trim_end_matches(['\r', '\n']).trim_start_matches(' ');
        let mut tags = None;
        if let Some(r) = rest.strip_prefix('@') {
            let (t, r) = r.split_once(' ').unwrap_or((r, ""));
            tags = Some(t.to_string());
            rest = r.trim_start_matches(' ');
        }
        let mut prefix = None;
        if let Some(r) = rest.strip_prefix(':') {
            let (p, r) = r.split_once(' ').unwrap_or((r, ""));
            prefix = Some(p.to_string());
            rest = r.trim_start_matches(' ');
        }
        let (command, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
        if command.is_empty() {
            return Err(ParseError::NoCommand);
        }
        let mut params = Vec::new();
        loop {
            rest = rest.trim_start_matches(' ');
            if rest.is_empty() {
                break;
            }
            if let Some(trailing) = rest.strip_prefix(':') {
                params.push(trailing.to_string());
                break;
            }
            let (p, r) = rest.split_once(' ').unwrap_or((rest, ""));
            params.push(p.to_string());
            rest = r;
        }
        Ok(Message { tags, prefix, command: command.to_string(), params })
    }

    /// The nick part of the prefix (`nick` of `nick!user@host`).
    pub fn nick(&self) -> Option<&str> {
        let p = self.prefix.as_deref()?;
        Some(p.split(['!', '@']).next().unwrap_or(p))
    }

    /// The raw value of IRCv3 tag `key` (`Some("")` for a tag without a value).
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.as_deref()?.split(';').find_map(|t| {
            let (k, v) = t.split_once('=').unwrap_or((t, ""));
            (k == key).then_some(v)
        })
    }

    /// Parameter `i`, or `""`.
    pub fn param(&self, i: usize) -> &str {
        self.params.get(i).map_or("", String::as_str)
    }

    /// The last parameter (the human-readable text of numerics), or `""`.
    pub fn last(&self) -> &str {
        self.params.last().map_or("", String::as_str)
    }
}

/// What [`Connection::next_event`] returns. PINGs are answered internally and never appear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A `PRIVMSG` (CTCP requests other than `ACTION` are [`Event::Other`]).
    Privmsg {
        /// Sender's nick.
        from: String,
        /// A channel, or our nick for a private message.
        target: String,
        /// The text (lossy UTF-8).
        text: String,
        /// The IRCv3 `msgid` tag, when the server sends one (a server-assigned unique id).
        msgid: Option<String>,
    },
    /// Someone (possibly us) joined a channel.
    Join {
        /// Who joined.
        nick: String,
        /// Where.
        channel: String,
    },
    /// Anything else (NOTICE, numerics, PART, QUIT, MODE, ...).
    Other(Message),
}

/// How to connect and register.
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port`.
    pub addr: String,
    /// The nick to register; never changed on collision.
    pub nick: String,
    /// The `USER` name.
    pub user: String,
    /// The `USER` real name.
    pub realname: String,
    /// Server password (`PASS`), if any.
    pub password: Option<String>,
    /// TLS with these settings (crates/net; SNI and verification against the server's host
    /// name); `None`: plain TCP.
    pub tls: Option<gatewarden_net::ClientTls>,
    /// SASL PLAIN as this account (`(account, password)`) before registration ends: the
    /// server's services then know the bot as that account. A server without SASL, or one
    /// that refuses the credentials, fails the connection as [`Error::Rejected`].
    pub sasl: Option<(String, String)>,
    /// Bound on TCP connect plus registration.
    pub connect_timeout: Duration,
    /// Silence after which we PING the server.
    pub ping_interval: Duration,
    /// How long after `ping_interval` a silent connection is declared dead.
    pub ping_timeout: Duration,
}

impl Config {
    /// Defaults: user and real name from the nick, 10 s to connect, PING after 60 s of silence,
    /// dead after 30 s more.
    pub fn new(addr: impl Into<String>, nick: impl Into<String>) -> Config {
        let nick = nick.into();
        Config {
            addr: addr.into(),
            user: nick.clone(),
            realname: "gatewarden".into(),
            nick,
            password: None,
            tls: None,
            sasl: None,
            connect_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(60),
            ping_timeout: Duration::from_secs(30),
        }
    }
}

/// A registered IRC connection.
#[derive(Debug)]
pub struct Connection {
    /// Read side (only [`Connection`] reads): the socket's raw bytes.
    stream: TcpStream,
    /// The TLS session, when there is one: the reader feeds it what `stream` receives, the
    /// writers encrypt through it (each holds the lock only for one record's worth of work, so
    /// reading never blocks writing).
    tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// Write side, shared with every [`Writer`]: one lock per line, so lines never interleave.
    out: Arc<Mutex<Sink>>,
    /// Bytes received but not yet cut into lines.
    buf: Vec<u8>,
    /// Bytes of the unfinished line at the end of `buf`.
    line_len: usize,
    /// Inside an overlong line: drop bytes until the next LF.
    discarding: bool,
    /// Events read while waiting for something else (a JOIN echo).
    pending: VecDeque<Event>,
    nick: String,
    keepalive: crate::wire::Keepalive,
}

impl Connection {
    /// Connects and registers; returns once the server sent `001`.
    pub fn connect(cfg: &Config) -> Result<Connection, Error> {
        for (what, v) in [("nick", &cfg.nick), ("user", &cfg.user)] {
            if !is_word(v) {
                return Err(Error::InvalidInput(format!("{what} {v:?} must be non-empty without spaces or controls")));
            }
        }
        let deadline = Instant::now() + cfg.connect_timeout;
        let mut stream = crate::wire::connect_any(&cfg.addr, cfg.connect_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(cfg.connect_timeout.max(Duration::from_secs(1))))?;
        let tls = match &cfg.tls {
            Some(settings) => {
                let host = cfg.addr.rsplit_once(':').map_or(cfg.addr.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Some(Arc::new(Mutex::new(crate::wire::handshake(&mut stream, host, &cfg.addr, settings, deadline)?)))
            }
            None => None,
        };
        let out = Arc::new(Mutex::new(Sink { sock: stream.try_clone()?, tls: tls.clone() }));
        let mut c = Connection {
            stream,
            tls,
            out,
            buf: Vec::new(),
            line_len: 0,
            discarding: false,
            pending: VecDeque::new(),
            nick: cfg.nick.clone(),
            keepalive: crate::wire::Keepalive::new(cfg.ping_interval, cfg.ping_timeout),
        };
        if cfg.sasl.is_some() {
            // Registration waits for `CAP END` (IRCv3 capability negotiation).
            c.send_raw("CAP REQ :sasl")?;
        }
        if let Some(p) = &cfg.password {
            c.send_raw(&format!("PASS {}", trailing(p)?))?;
        }
        c.send_raw(&format!("NICK {}", cfg.nick))?;
        c.send_raw(&format!("USER {} 0 * {}", cfg.user, trailing(&cfg.realname)?))?;
        let mut sasl_done = cfg.sasl.is_none();
        loop {
            let Some(m) = c.read_message(deadline)? else {
                return Err(Error::Timeout(format!(
                    "no 001 welcome from {} within {:?}",
                    cfg.addr, cfg.connect_timeout
                )));
            };
            if let Some((account, password)) = cfg.sasl.as_ref().filter(|_| !sasl_done) {
                let no_sasl = |why: &str| Error::Rejected { code: "SASL".into(), message: why.to_owned() };
                let cap_reply = m.command == "CAP" && m.param(2).split(' ').any(|c| c == "sasl");
                match m.command.as_str() {
                    "CAP" if cap_reply && m.param(1) == "ACK" => c.send_raw("AUTHENTICATE PLAIN")?,
                    "CAP" if cap_reply && m.param(1) == "NAK" => {
                        return Err(no_sasl("the server does not offer SASL (CAP NAK)"));
                    }
                    "AUTHENTICATE" if m.param(0) == "+" => {
                        let token = base64(format!("{account}\0{account}\0{password}").as_bytes());
                        if token.len() >= 400 {
                            return Err(Error::InvalidInput("SASL account and password too long".into()));
                        }
                        c.send_raw(&format!("AUTHENTICATE {token}"))?;
                    }
                    "903" => {
                        sasl_done = true;
                        c.send_raw("CAP END")?;
                    }
                    "902" | "904" | "905" | "906" | "908" => {
                        // The text names the account, never the password.
                        return Err(Error::Rejected { code: m.command.clone(), message: m.last().to_string() });
                    }
                    // A server that registers us without negotiating has no SASL.
                    "001" | "421" => return Err(no_sasl("the server does not support SASL (no CAP negotiation)")),
                    _ => {}
                }
                continue;
            }
            match m.command.as_str() {
                "001" => {
                    // The server may have normalised the nick (case, truncation).
                    if !m.param(0).is_empty() {
                        c.nick = m.param(0).to_string();
                    }
                    return Ok(c);
                }
                "433" => return Err(Error::NickInUse { nick: cfg.nick.clone() }),
                "431" | "432" => {
                    return Err(Error::NickRefused {
                        nick: cfg.nick.clone(),
                        code: m.command.clone(),
                        message: m.last().to_string(),
                    });
                }
                "464" | "465" => {
                    return Err(Error::Rejected { code: m.command.clone(), message: m.last().to_string() });
                }
                _ => {}
            }
        }
    }

    /// Our nick as the server confirmed it.
    pub fn nick(&self) -> &str {
        &self.nick
    }

    /// Joins `channel` and waits (up to `timeout`) for the server's echo of our JOIN, so
    /// messages sent to the channel afterwards reach us. Other events read meanwhile are kept for
    /// [`Connection::next_event`].
    pub fn join(&mut self, channel: &str, timeout: Duration) -> Result<(), Error> {
        if !is_word(channel) || channel.contains(',') {
            return Err(Error::InvalidInput(format!("channel {channel:?}")));
        }
        self.send_raw(&format!("JOIN {channel}"))?;
        let deadline = Instant::now() + timeout;
        loop {
            let Some(m) = self.read_message(deadline)? else {
                return Err(Error::Timeout(format!("no JOIN echo for {channel} within {timeout:?}")));
            };
            let code = m.command.as_str();
            let refused = matches!(code, "403" | "405" | "437" | "471" | "473" | "474" | "475" | "476" | "477");
            if refused && m.param(1).eq_ignore_ascii_case(channel) {
                return Err(Error::JoinRefused {
                    channel: channel.to_string(),
                    code: m.command.clone(),
                    message: m.last().to_string(),
                });
            }
            let Some(ev) = Self::to_event(m) else { continue };
            let ours = matches!(&ev, Event::Join { nick, channel: c }
                if nick.eq_ignore_ascii_case(&self.nick) && c.eq_ignore_ascii_case(channel));
            if ours {
                return Ok(());
            }
            self.pending.push_back(ev);
        }
    }

    /// Sends `text` to `target` (a channel or a nick). Newlines split it into separate messages,
    /// each split further at [`MAX_TEXT_BYTES`]; empty lines are skipped. Returns the number of
    /// `PRIVMSG` lines sent.
    pub fn privmsg(&mut self, target: &str, text: &str) -> Result<usize, Error> {
        privmsg(&self.out, target, text)
    }

    /// A handle that sends on this connection from another thread (its lines and ours, PONGs
    /// included, never interleave). It fails once the connection is gone.
    pub fn writer(&self) -> Writer {
        Writer { out: Arc::clone(&self.out) }
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` when nothing arrived in time.
    /// Answers the server's PINGs and keeps the connection alive with our own.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(Some(ev));
        }
        let deadline = Instant::now() + timeout;
        while let Some(m) = self.read_message(deadline)? {
            if let Some(ev) = Self::to_event(m) {
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }

    /// Sends `QUIT` and closes the connection (best effort: the socket closes either way).
    pub fn quit(mut self, message: &str) {
        let msg = trailing(message).unwrap_or_else(|_| ":bye".into());
        let _ = self.send_raw(&format!("QUIT {msg}"));
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Sends one raw line (CRLF appended). Refuses CR, LF and NUL and lines over
    /// [`MAX_OUT_BYTES`].
    pub fn send_raw(&mut self, line: &str) -> Result<(), Error> {
        write_line(&self.out, line)
    }

    /// Filters a message into an event; `None` for what is handled here (PING, PONG).
    fn to_event(m: Message) -> Option<Event> {
        match m.command.as_str() {
            "PING" | "PONG" => None,
            "PRIVMSG" if m.params.len() >= 2 => {
                let text = m.last();
                let ctcp = text.starts_with('\u{1}') && !text.starts_with("\u{1}ACTION ");
                if ctcp {
                    return Some(Event::Other(m));
                }
                Some(Event::Privmsg {
                    from: m.nick().unwrap_or_default().to_string(),
                    target: m.param(0).to_string(),
                    text: text.to_string(),
                    msgid: m.tag("msgid").filter(|v| !v.is_empty()).map(str::to_string),
                })
            }
            "JOIN" if !m.params.is_empty() => {
                Some(Event::Join { nick: m.nick().unwrap_or_default().to_string(), channel: m.param(0).to_string() })
            }
            _ => Some(Event::Other(m)),
        }
    }

    /// Reads until one message arrives (`Ok(None)` at `deadline`). Answers PING, handles
    /// `ERROR`, and runs the keepalive.
    fn read_message(&mut self, deadline: Instant) -> Result<Option<Message>, Error> {
        loop {
            while let Some(line) = self.take_line() {
                let Ok(m) = Message::parse(&line) else { continue };
                match m.command.as_str() {
                    "PING" => {
                        let token = trailing(m.last()).unwrap_or_else(|_| ":x".into());
                        self.send_raw(&format!("PONG {token}"))?;
                    }
                    "ERROR" => return Err(Error::Closed(format!("server said: {}", m.last()))),
                    _ => {}
                }
                return Ok(Some(m));
            }
            let now = Instant::now();
            match self.keepalive.check(now) {
                Silence::Dead(silent) => return Err(Error::Timeout(format!("no data from the server for {silent:?}"))),
                Silence::Probe => {
                    self.send_raw("PING :gatewarden")?;
                    self.keepalive.probed();
                }
                Silence::Fine => {}
            }
            if now >= deadline {
                return Ok(None);
            }
            let mut chunk = [0u8; 4096];
            let read = crate::wire::read_before(
                &mut self.stream,
                self.tls.as_ref(),
                &mut self.keepalive,
                deadline,
                &mut chunk,
            );
            match read.map_err(io_error)? {
                Some(0) => return Err(Error::Closed("server closed the connection".into())),
                Some(n) => self.push_bytes(&chunk[..n]),
                None => {}
            }
        }
    }

    /// Appends received bytes, dropping the part of any line beyond [`MAX_LINE_BYTES`].
    fn push_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.buf.push(b);
                self.line_len = 0;
                self.discarding = false;
            } else if self.discarding || self.line_len >= MAX_LINE_BYTES {
                self.discarding = true;
            } else {
                self.buf.push(b);
                self.line_len += 1;
            }
        }
    }

    /// Cuts the next complete line off the buffer (lossy UTF-8, CR/LF stripped, empty skipped).
    fn take_line(&mut self) -> Option<String> {
        loop {
            let i = self.buf.iter().position(|&b| b == b'\n')?;
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let s = String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']).to_string();
            if !s.is_empty() {
                return Some(s);
            }
        }
    }
}

crate::wire::wire_errors!(Error);

/// The sending half of a [`Connection`], for a thread other than the reader's.
#[derive(Debug, Clone)]
pub struct Writer {
    out: Arc<Mutex<Sink>>,
}

impl Writer {
    /// As [`Connection::privmsg`].
    pub fn privmsg(&self, target: &str, text: &str) -> Result<usize, Error> {
        privmsg(&self.out, target, text)
    }

    /// As [`Connection::send_raw`].
    pub fn send_raw(&self, line: &str) -> Result<(), Error> {
        write_line(&self.out, line)
    }

    /// Closes the socket: the reader's next read fails, so it reconnects.
    pub fn shutdown(&self) {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
    }
}

fn privmsg(out: &Mutex<Sink>, target: &str, text: &str) -> Result<usize, Error> {
    if !is_word(target) || target.contains(',') {
        return Err(Error::InvalidInput(format!("target {target:?}")));
    }
    let mut sent = 0;
    for line in text.split('\n') {
        let line: String = line.chars().filter(|c| !matches!(c, '\r' | '\0')).collect();
        // Servers strip trailing spaces; an all-space line would be an empty PRIVMSG (412).
        for chunk in split_text(line.trim_end(), MAX_TEXT_BYTES) {
            write_line(out, &format!("PRIVMSG {target} :{chunk}"))?;
            sent += 1;
        }
    }
    Ok(sent)
}

fn write_line(out: &Mutex<Sink>, line: &str) -> Result<(), Error> {
    if line.contains(['\r', '\n', '\0']) {
        return Err(Error::InvalidInput("line contains CR, LF or NUL".into()));
    }
    if line.len() > MAX_OUT_BYTES {
        return Err(Error::InvalidInput(format!("line of {} bytes (max {MAX_OUT_BYTES})", line.len())));
    }
    let mut bytes = Vec::with_capacity(line.len() + 2);
    bytes.extend_from_slice(line.as_bytes());
    bytes.extend_from_slice(b"\r\n");
    let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
    out.write_all(&bytes).map_err(io_error)
}

/// Standard base64 with padding (RFC 4648), for SASL's one token.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A middle parameter: non-empty, no space, no control characters, no leading `:`.
fn is_word(s: &str) -> bool {
    !s.is_empty() && !s.starts_with(':') && !s.contains(|c: char| c == ' ' || c.is_control())
}

/// `:text` for a trailing parameter, refusing CR, LF and NUL.
fn trailing(s: &str) -> Result<String, Error> {
    if s.contains(['\r', '\n', '\0']) {
        return Err(Error::InvalidInput("text contains CR, LF or NUL".into()));
    }
    Ok(format!(":{s}"))
}

/// Splits `text` into pieces of at most `max` bytes on char boundaries. Where a space lies in the
/// second half of a piece, the cut is made there and that one space is dropped: each piece is a
/// line of its own for the reader, and servers strip trailing spaces anyway. No piece is empty;
/// a single char wider than `max` becomes its own piece.
pub fn split_text(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if rest.len() <= max {
            out.push(rest);
            break;
        }
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        match rest[..cut].rfind(' ') {
            // `sp > cut / 2` keeps the piece non-empty and the split from getting too short.
            Some(sp) if sp > cut / 2 => {
                out.push(&rest[..sp]);
                rest = &rest[sp + 1..];
            }
            _ => {
                out.push(&rest[..cut]);
                rest = &rest[cut..];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::ErrorKind as IoKind;
    use std::io::{Read, Write};

    #[test]
    fn parses_the_usual_shapes() {
        let m = Message::parse(":alice!~a@127.0.0.1 PRIVMSG #room :hello there\r\n").unwrap();
        assert_eq!(m.prefix.as_deref(), Some("alice!~a@127.0.0.1"));
        assert_eq!(m.nick(), Some("alice"));
        assert_eq!((m.command.as_str(), m.params.clone()), ("PRIVMSG", vec!["#room".into(), "hello there".into()]));

        let m = Message::parse("PING :irc.example").unwrap();
        assert_eq!((m.prefix.as_deref(), m.command.as_str(), m.last()), (None, "PING", "irc.example"));

        let m = Message::parse("@time=2024-01-01T00:00:00Z;id=1 :srv 433 * bot :Nickname already in use").unwrap();
        assert_eq!(m.tags.as_deref(), Some("time=2024-01-01T00:00:00Z;id=1"));
        assert_eq!((m.tag("id"), m.tag("time"), m.tag("msgid")), (Some("1"), Some("2024-01-01T00:00:00Z"), None));
        assert_eq!((m.command.as_str(), m.param(1), m.last()), ("433", "bot", "Nickname already in use"));

        // Empty trailing, repeated spaces, no params.
        let m = Message::parse(":n!u@h PRIVMSG  #c  :").unwrap();
        assert_eq!(m.params, vec!["#c".to_string(), String::new()]);
        assert_eq!(Message::parse("QUIT").unwrap().params, Vec::<String>::new());

        assert_eq!(Message::parse(""), Err(ParseError::NoCommand));
        assert_eq!(Message::parse(":prefix-only"), Err(ParseError::NoCommand));
        assert_eq!(Message::parse("@tags-only"), Err(ParseError::NoCommand));
    }

    #[test]
    fn splits_on_char_boundaries_preferring_spaces() {
        assert_eq!(split_text("", 400), Vec::<&str>::new());
        assert_eq!(split_text("short", 400), vec!["short"]);
        assert_eq!(split_text("aaaa bbbb", 6), vec!["aaaa", "bbbb"]);
        // No space in the second half: a hard cut, nothing dropped.
        assert_eq!(split_text("a bbbbbbb", 6), vec!["a bbbb", "bbb"]);
        // "é" is 2 bytes: a cut at 3 would split one.
        assert_eq!(split_text("ééé", 3), vec!["é", "é", "é"]);
        // A char wider than the limit still makes progress.
        assert_eq!(split_text("🦀x", 2), vec!["🦀", "x"]);
        let long = "word ".repeat(200);
        let parts = split_text(long.trim_end(), MAX_TEXT_BYTES);
        assert!(parts.iter().all(|p| p.len() <= MAX_TEXT_BYTES && p.ends_with("word")), "{parts:?}");
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(i.as_bytes()), o);
        }
        assert_eq!(base64(b"gw\0gw\0pw"), "Z3cAZ3cAcHc=");
    }

    /// A server that speaks CAP/SASL the way Libera and Solanum do; `accept` decides 903 or 904.
    fn sasl_server(accept: bool) -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<String>>) {
        use std::io::BufRead;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut seen = Vec::new();
            for line in std::io::BufReader::new(s).lines() {
                let Ok(line) = line else { break };
                let reply: &[u8] = match line.as_str() {
                    "CAP REQ :sasl" => b":srv CAP * ACK :sasl\r\n",
                    "AUTHENTICATE PLAIN" => b"AUTHENTICATE +\r\n",
                    l if l.starts_with("AUTHENTICATE ") && accept => b":srv 900 gw gw!gw@h gw :You are now logged in as gw\r\n:srv 903 gw :SASL authentication successful\r\n",
                    l if l.starts_with("AUTHENTICATE ") => b":srv 904 gw :SASL authentication failed\r\n",
                    "CAP END" => b":srv 001 gw :Welcome\r\n",
                    _ => b"",
                };
                seen.push(line);
                if w.write_all(reply).is_err() {
                    break;
                }
                if reply.starts_with(b":srv 001") || reply.starts_with(b":srv 904") {
                    break;
                }
            }
            seen
        });
        (addr, t)
    }

    #[test]
    fn sasl_plain_authenticates_before_registration_ends() {
        let (addr, server) = sasl_server(true);
        let mut cfg = Config::new(addr.to_string(), "gw");
        cfg.sasl = Some(("gw".into(), "pw".into()));
        let c = Connection::connect(&cfg).unwrap();
        assert_eq!(c.nick(), "gw");
        drop(c);
        let seen = server.join().unwrap();
        assert_eq!(seen.first().map(String::as_str), Some("CAP REQ :sasl"), "{seen:?}");
        assert!(seen.contains(&"AUTHENTICATE Z3cAZ3cAcHc=".to_owned()), "{seen:?}");
        assert_eq!(seen.last().map(String::as_str), Some("CAP END"), "{seen:?}");

        let (addr, server) = sasl_server(false);
        let mut cfg = Config::new(addr.to_string(), "gw");
        cfg.sasl = Some(("gw".into(), "wrong".into()));
        let e = Connection::connect(&cfg).unwrap_err();
        assert!(matches!(&e, Error::Rejected { code, .. } if code == "904"), "{e}");
        assert_eq!(e.kind(), ErrorKind::Rejected);
        assert!(!e.to_string().contains("wrong"));
        server.join().unwrap();
    }

    fn conn_pair() -> (Connection, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let c = Connection {
            out: Arc::new(Mutex::new(Sink { sock: client.try_clone().unwrap(), tls: None })),
            stream: client,
            tls: None,
            buf: Vec::new(),
            line_len: 0,
            discarding: false,
            pending: VecDeque::new(),
            nick: "bot".into(),
            keepalive: crate::wire::Keepalive::new(Duration::from_secs(60), Duration::from_secs(30)),
        };
        (c, server)
    }

    #[test]
    fn overlong_lines_are_cut_and_the_next_line_survives() {
        let (mut c, _server) = conn_pair();
        let mut bytes = b":x PRIVMSG #c :".to_vec();
        bytes.extend(std::iter::repeat_n(b'a', MAX_LINE_BYTES * 2));
        bytes.extend_from_slice(b"\r\n:y PRIVMSG #c :next\r\n");
        // Feed in awkward chunk sizes.
        for chunk in bytes.chunks(977) {
            c.push_bytes(chunk);
        }
        let first = c.take_line().unwrap();
        assert_eq!(first.len(), MAX_LINE_BYTES);
        assert_eq!(c.take_line().as_deref(), Some(":y PRIVMSG #c :next"));
        assert_eq!(c.take_line(), None);
    }

    #[test]
    fn answers_ping_decodes_lossy_and_reports_error_lines() {
        let (mut c, mut server) = conn_pair();
        server
            .write_all(b"@msgid=Ab1;time=x :b!u@h PRIVMSG #c :tagged\r\nPING :token1\r\n:a!u@h PRIVMSG #c :caf\xe9\r\nERROR :Closing link\r\n")
            .unwrap();
        let ev = c.next_event(Duration::from_secs(5)).unwrap().unwrap();
        let want =
            Event::Privmsg { from: "b".into(), target: "#c".into(), text: "tagged".into(), msgid: Some("Ab1".into()) };
        assert_eq!(ev, want);
        let ev = c.next_event(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(
            ev,
            Event::Privmsg { from: "a".into(), target: "#c".into(), text: "caf\u{fffd}".into(), msgid: None }
        );
        let mut got = [0u8; 64];
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = server.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"PONG :token1\r\n");
        let e = c.next_event(Duration::from_secs(5)).unwrap_err();
        assert!(matches!(&e, Error::Closed(m) if m.contains("Closing link")), "{e}");
    }

    #[test]
    fn a_writer_sends_from_another_thread_and_its_shutdown_ends_the_reader() {
        let (mut c, mut server) = conn_pair();
        let w = c.writer();
        std::thread::spawn(move || w.privmsg("#c", "from the side").unwrap()).join().unwrap();
        let mut got = [0u8; 64];
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = server.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"PRIVMSG #c :from the side\r\n");
        assert!(matches!(c.writer().send_raw("A\r\nB"), Err(Error::InvalidInput(_))));
        c.writer().shutdown();
        let e = c.next_event(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    }

    #[test]
    fn a_silent_server_is_pinged_then_declared_dead() {
        let (mut c, mut server) = conn_pair();
        c.keepalive.interval = Duration::from_millis(50);
        c.keepalive.timeout = Duration::from_millis(100);
        let started = Instant::now();
        let e = c.next_event(Duration::from_secs(10)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let mut got = [0u8; 64];
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = server.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"PING :gatewarden\r\n");
    }

    #[test]
    fn outgoing_text_cannot_inject_commands() {
        let (mut c, mut server) = conn_pair();
        assert_eq!(c.privmsg("#c", "one\r\nQUIT :x\n\ntwo\0").unwrap(), 3);
        assert!(matches!(c.privmsg("#c d", "x"), Err(Error::InvalidInput(_))));
        assert!(matches!(c.privmsg("", "x"), Err(Error::InvalidInput(_))));
        assert!(matches!(c.send_raw("PRIVMSG #c :a\rb"), Err(Error::InvalidInput(_))));
        drop(c);
        let mut got = String::new();
        server.read_to_string(&mut got).unwrap();
        assert_eq!(got, "PRIVMSG #c :one\r\nPRIVMSG #c :QUIT :x\r\nPRIVMSG #c :two\r\n");
    }

    #[test]
    fn registration_against_a_silent_server_times_out() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut cfg = Config::new(l.local_addr().unwrap().to_string(), "bot");
        cfg.connect_timeout = Duration::from_millis(300);
        let started = Instant::now();
        let e = Connection::connect(&cfg).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(matches!(Connection::connect(&Config::new("127.0.0.1:1", "a b")), Err(Error::InvalidInput(_))));
        let e = Connection::connect(&Config::new("no-port-here", "bot")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    }

    #[test]
    fn error_kinds() {
        assert_eq!(Error::NickInUse { nick: "b".into() }.kind(), ErrorKind::Conflict);
        assert_eq!(Error::Rejected { code: "464".into(), message: String::new() }.kind(), ErrorKind::Rejected);
        assert_eq!(Error::Closed("x".into()).kind(), ErrorKind::Transient);
        assert_eq!(io_error(std::io::Error::from(IoKind::ConnectionReset)).kind(), ErrorKind::Transient);
        assert_eq!(io_error(std::io::Error::from(IoKind::ConnectionRefused)).kind(), ErrorKind::Transient);
    }

    fn word() -> impl Strategy<Value = String> {
        "[A-Za-z0-9#&!@.*_\\-\\[\\]]{1,12}".prop_filter("no leading colon", |s| !s.starts_with(':'))
    }

    proptest! {
        #[test]
        fn parse_is_total(line in ".{0,300}") {
            if let Ok(m) = Message::parse(&line) {
                prop_assert!(!m.command.is_empty());
            }
        }

        #[test]
        fn parse_inverts_formatting(prefix in proptest::option::of(word()), command in "[A-Z]{1,8}|[0-9]{3}",
                                    middle in proptest::collection::vec(word(), 0..5), trailing in proptest::option::of("[^\r\n\0]{0,40}")) {
            let mut line = String::new();
            if let Some(p) = &prefix {
                line.push_str(&format!(":{p} "));
            }
            line.push_str(&command);
            for w in &middle {
                line.push_str(&format!(" {w}"));
            }
            if let Some(t) = &trailing {
                line.push_str(&format!(" :{t}"));
            }
            let m = Message::parse(&line).unwrap();
            let mut params = middle.clone();
            params.extend(trailing.clone());
            prop_assert_eq!(m.prefix, prefix);
            prop_assert_eq!(m.command, command);
            prop_assert_eq!(m.params, params);
        }

        #[test]
        fn split_text_preserves_content_and_bounds(text in ".{0,600}", max in 1usize..500) {
            let parts = split_text(&text, max);
            // The pieces rebuild the text with at most one dropped space between two of them.
            let mut rest = text.as_str();
            for p in &parts {
                rest = match rest.strip_prefix(*p) {
                    Some(r) => r,
                    None => rest.strip_prefix(' ').and_then(|r| r.strip_prefix(*p)).unwrap_or_else(|| panic!("{p:?} not next in {rest:?}")),
                };
            }
            prop_assert_eq!(rest, "");
            for p in &parts {
                prop_assert!(!p.is_empty());
                prop_assert!(p.len() <= max || p.chars().count() == 1, "{} bytes > {}", p.len(), max);
            }
        }

        #[test]
        fn framing_survives_any_chunking(lines in proptest::collection::vec("[^\r\n]{0,50}", 1..8), cut in 1usize..64) {
            let (mut c, _server) = conn_pair();
            let wire: String = lines.iter().map(|l| format!("{l}\r\n")).collect();
            for chunk in wire.as_bytes().chunks(cut) {
                c.push_bytes(chunk);
            }
            let mut got = Vec::new();
            while let Some(l) = c.take_line() {
                got.push(l);
            }
            let want: Vec<String> = lines.into_iter().filter(|l| !l.is_empty()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
