//! What the IRC and XMPP clients share below their protocols: a connection within a deadline,
//! the TLS handshake as crates/net configures it, and reads and writes through a TLS session
//! that a reader and a writer thread share. Each protocol maps [`WireError`] into its own error.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_net::rustls;

/// A TLS session, locked by whichever side reads or writes the socket.
pub(crate) type Session = Arc<Mutex<rustls::ClientConnection>>;

/// Why a connection or a handshake failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// A malformed address: permanent.
    InvalidInput(String),
    Timeout(String),
    /// The handshake failed, in crates/net's words; `host` as the protocol names it.
    Tls {
        host: String,
        reason: String,
    },
    /// A socket error, for the protocol to classify.
    Io(std::io::Error),
}

/// Where a client writes: the socket, through the TLS session when there is one.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) sock: TcpStream,
    pub(crate) tls: Option<Session>,
}

impl Sink {
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        write_all(&mut self.sock, self.tls.as_ref(), bytes)
    }

    /// Closes the socket both ways: the reader's next read fails.
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Maps [`WireError`] and socket errors onto a protocol's error `$error`, which has the
/// variants `InvalidInput`, `Timeout`, `Tls { host, reason }`, `Closed` and `Io`: defines
/// `From<WireError>` and `io_error` in the calling module.
macro_rules! wire_errors {
    ($error:ident) => {
        impl From<crate::wire::WireError> for $error {
            fn from(e: crate::wire::WireError) -> $error {
                use crate::wire::WireError as W;
                match e {
                    W::InvalidInput(s) => $error::InvalidInput(s),
                    W::Timeout(s) => $error::Timeout(s),
                    W::Tls { host, reason } => $error::Tls { host, reason },
                    W::Io(e) => io_error(e),
                }
            }
        }

        /// A socket error: a timeout, a closed connection, or another I/O error.
        fn io_error(e: std::io::Error) -> $error {
            use std::io::ErrorKind as K;
            match e.kind() {
                K::WouldBlock | K::TimedOut => $error::Timeout(format!("socket: {e}")),
                K::UnexpectedEof | K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted => {
                    $error::Closed(e.to_string())
                }
                _ => $error::Io(e),
            }
        }
    };
}
pub(crate) use wire_errors;

/// Connects to the first address of `addr` that answers within `timeout` (overall).
pub(crate) fn connect_any(addr: &str, timeout: Duration) -> Result<TcpStream, WireError> {
    // A malformed address is permanent; a failed name lookup may heal.
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| match e.kind() {
            IoKind::InvalidInput => WireError::InvalidInput(format!("address {addr:?}: {e}")),
            _ => WireError::Io(e),
        })?
        .collect();
    let deadline = Instant::now() + timeout;
    let mut last = None;
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| WireError::Timeout(format!("connecting to {addr}")), WireError::Io))
}

/// The TLS handshake on `sock`, bounded by `deadline`, verifying `host` as crates/net configures
/// it; failures name `label` (the address or domain the protocol speaks of).
pub(crate) fn handshake(
    sock: &mut TcpStream,
    host: &str,
    label: &str,
    settings: &gatewarden_net::ClientTls,
    deadline: Instant,
) -> Result<rustls::ClientConnection, WireError> {
    let tls_error = |reason: String| WireError::Tls { host: label.to_owned(), reason };
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| tls_error(format!("{host:?} is not a host name or address")))?;
    let config = settings.rustls_config().map_err(|e| tls_error(e.to_string()))?;
    let mut conn = rustls::ClientConnection::new(config, name).map_err(|e| tls_error(e.to_string()))?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    sock.set_read_timeout(Some(left)).map_err(WireError::Io)?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(sock) {
            return Err(match gatewarden_net::io_tls_reason(&e) {
                Some(reason) => tls_error(reason),
                None if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                    WireError::Timeout(format!("TLS handshake with {label}"))
                }
                None if e.kind() == IoKind::UnexpectedEof => {
                    tls_error("the server closed the connection during the handshake (no TLS on this port?)".into())
                }
                None => WireError::Io(e),
            });
        }
    }
    Ok(conn)
}

/// Writes `bytes` to the socket, through the session when there is one. Every socket write
/// happens under the session's lock (the reader's too), so records never interleave.
pub(crate) fn write_all(sock: &mut TcpStream, tls: Option<&Session>, bytes: &[u8]) -> std::io::Result<()> {
    let Some(tls) = tls else { return sock.write_all(bytes) };
    let mut conn = tls.lock().unwrap_or_else(|p| p.into_inner());
    conn.writer().write_all(bytes)?;
    while conn.wants_write() {
        conn.write_tls(sock)?;
    }
    Ok(())
}

/// Reads what arrived: the socket's bytes, or with a session the plaintext they decrypt to.
/// `Ok(0)` is the end of the stream; a read timeout surfaces as `WouldBlock`/`TimedOut`.
pub(crate) fn read_some(sock: &mut TcpStream, tls: Option<&Session>, buf: &mut [u8]) -> std::io::Result<usize> {
    let Some(tls) = tls else { return sock.read(buf) };
    loop {
        {
            let mut conn = tls.lock().unwrap_or_else(|p| p.into_inner());
            match conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == IoKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let mut raw = [0u8; 8192];
        let n = sock.read(&mut raw)?;
        if n == 0 {
            return Ok(0);
        }
        let mut conn = tls.lock().unwrap_or_else(|p| p.into_inner());
        let mut rest = &raw[..n];
        while !rest.is_empty() {
            conn.read_tls(&mut rest)?;
            conn.process_new_packets().map_err(|e| std::io::Error::new(IoKind::InvalidData, e))?;
        }
        // Post-handshake records we owe the server (a key update's answer, an alert).
        while conn.wants_write() {
            conn.write_tls(sock)?;
        }
    }
}

/// The silence rule both clients keep: after `interval` without data, probe once (IRC's
/// `PING`, an XMPP ping or ack request); after `interval + timeout` without data the
/// connection is dead. Any data answers the probe.
#[derive(Debug)]
pub(crate) struct Keepalive {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    last_rx: Instant,
    probed: bool,
}

/// What the silence so far asks for.
pub(crate) enum Silence {
    /// Nothing to do yet.
    Fine,
    /// Time to probe (not probed yet).
    Probe,
    /// Dead: silent this long.
    Dead(Duration),
}

impl Keepalive {
    pub(crate) fn new(interval: Duration, timeout: Duration) -> Keepalive {
        Keepalive { interval, timeout, last_rx: Instant::now(), probed: false }
    }

    pub(crate) fn check(&self, now: Instant) -> Silence {
        let silent = now.saturating_duration_since(self.last_rx);
        if silent >= self.interval + self.timeout {
            Silence::Dead(silent)
        } else if silent >= self.interval && !self.probed {
            Silence::Probe
        } else {
            Silence::Fine
        }
    }

    pub(crate) fn probed(&mut self) {
        self.probed = true;
    }

    /// When the next step is due: the probe, or once probed, the end of patience.
    fn next_at(&self) -> Instant {
        self.last_rx + self.interval + if self.probed { self.timeout } else { Duration::ZERO }
    }
}

/// One read of a client's loop, waiting until `deadline` or the keepalive's next step,
/// whichever comes first: `Some(n)` bytes (`Some(0)`: the end of the stream), `None` when
/// nothing came in that time.
pub(crate) fn read_before(
    sock: &mut TcpStream,
    tls: Option<&Session>,
    keepalive: &mut Keepalive,
    deadline: Instant,
    buf: &mut [u8],
) -> std::io::Result<Option<usize>> {
    let wait =
        deadline.min(keepalive.next_at()).saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    sock.set_read_timeout(Some(wait))?;
    match read_some(sock, tls, buf) {
        Ok(0) => Ok(Some(0)),
        Ok(n) => {
            keepalive.last_rx = Instant::now();
            keepalive.probed = false;
            Ok(Some(n))
        }
        Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut | IoKind::Interrupted) => Ok(None),
        Err(e) => Err(e),
    }
}
