//! The IMAP side of the email adapter: one TLS session (implicit TLS or STARTTLS, verified with
//! crates/net's rustls settings), `SELECT INBOX`, `UID FETCH` past a position, and IDLE (RFC
//! 2177) to wait for new mail, polling only where the server lacks IDLE.
//!
//! async-imap is async: the session lives on a current-thread tokio runtime owned by the
//! adapter's receive thread, and every call here blocks on it, bounded by [`OP_TIMEOUT`] (IDLE
//! by the wait it is given).

use std::sync::Arc;
use std::time::Duration;

use async_imap::extensions::idle::IdleResponse;
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

/// Bound on connecting, the handshake and every command.
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages fetched per receive at most; the rest wait for the next one.
pub const FETCH_BATCH: usize = 32;
/// Bytes of messages one receive keeps at most (past the first message): a batch of large
/// mails with attachments stays within memory bounds.
pub const FETCH_BATCH_BYTES: usize = 16 << 20;

type Tls = TlsStream<TcpStream>;

/// How the IMAP connection is secured (always TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// TLS from the first byte (`imaps://`, port 993).
    Implicit,
    /// Plain greeting, then `STARTTLS` before anything else (`imap://`, port 143).
    StartTls,
}

/// Why an IMAP step failed, typed by what the adapter does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImapError {
    /// The server refused the login: retrying cannot help.
    Rejected(String),
    /// Anything else (unreachable, TLS, a dropped connection, a timeout): reconnect.
    Lost(String),
}

impl std::fmt::Display for ImapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImapError::Rejected(s) | ImapError::Lost(s) => f.write_str(s),
        }
    }
}

fn lost(what: &str, e: impl std::fmt::Display) -> ImapError {
    ImapError::Lost(format!("{what}: {e}"))
}

/// Runs `fut` on `rt` within `limit`.
fn bounded<T>(
    rt: &tokio::runtime::Runtime,
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, ImapError>>,
) -> Result<T, ImapError> {
    rt.block_on(async { tokio::time::timeout(limit, fut).await.map_err(|_| lost(what, "timed out"))? })
}

/// What `SELECT INBOX` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selected {
    pub uid_validity: u32,
    /// The next UID the server will assign (1 when it does not say: everything is new).
    pub uid_next: u32,
}

/// One fetched message: its UID, its size, and its bytes (at most the size bound).
#[derive(Debug, Clone)]
pub struct Fetched {
    pub uid: u32,
    pub size: u32,
    pub raw: Vec<u8>,
}

/// One logged-in, selected IMAP session.
pub struct Session {
    rt: tokio::runtime::Runtime,
    session: Option<async_imap::Session<Tls>>,
    idle: bool,
}

/// Connects, logs in and selects INBOX.
pub fn connect(
    host: &str,
    port: u16,
    security: Security,
    tls: Arc<ClientConfig>,
    user: &str,
    password: &str,
) -> Result<(Session, Selected), ImapError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| lost("cannot start the IMAP runtime", e))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| ImapError::Rejected(format!("{host}: {e}")))?;
    let addr = format!("{host}:{port}");
    let fut = async {
        let tcp = TcpStream::connect(&addr).await.map_err(|e| lost(&addr, e))?;
        let connector = TlsConnector::from(tls);
        let stream = match security {
            Security::Implicit => connector.connect(name, tcp).await.map_err(|e| lost(&addr, tls_words(&e)))?,
            Security::StartTls => {
                let mut plain = async_imap::Client::new(tcp);
                plain.read_response().await.map_err(|e| lost("greeting", e))?.ok_or_else(|| lost(&addr, "closed"))?;
                plain.run_command_and_check_ok("STARTTLS", None).await.map_err(|e| lost("STARTTLS", e))?;
                connector.connect(name, plain.into_inner()).await.map_err(|e| lost(&addr, tls_words(&e)))?
            }
        };
        let mut client = async_imap::Client::new(stream);
        if security == Security::Implicit {
            client.read_response().await.map_err(|e| lost("greeting", e))?.ok_or_else(|| lost(&addr, "closed"))?;
        }
        let mut session = client.login(user, password).await.map_err(|(e, _)| match e {
            // RFC 5530: `[UNAVAILABLE]` is the server's own trouble, retried; any other NO is
            // the credentials.
            async_imap::error::Error::No(why) if !why.contains("UNAVAILABLE") => {
                ImapError::Rejected(format!("IMAP login as {user} refused: {why}"))
            }
            other => lost("login", other),
        })?;
        let caps = session.capabilities().await.map_err(|e| lost("CAPABILITY", e))?;
        let idle = caps.has_str("IDLE");
        let mb = session.select("INBOX").await.map_err(|e| lost("SELECT INBOX", e))?;
        let Some(uid_validity) = mb.uid_validity else {
            return Err(lost("SELECT INBOX", "the server sent no UIDVALIDITY"));
        };
        let selected = Selected { uid_validity, uid_next: mb.uid_next.unwrap_or(1).max(1) };
        Ok((session, idle, selected))
    };
    let (session, idle, selected) = bounded(&rt, "IMAP connect", OP_TIMEOUT, fut)?;
    Ok((Session { rt, session: Some(session), idle }, selected))
}

/// A rustls handshake error in words (an unknown CA, a wrong name, an expired certificate).
fn tls_words(e: &std::io::Error) -> String {
    gatewarden_net::io_tls_reason(e).unwrap_or_else(|| e.to_string())
}

impl Session {
    /// Whether the server offers IDLE.
    pub fn has_idle(&self) -> bool {
        self.idle
    }

    fn live(&mut self) -> Result<&mut async_imap::Session<Tls>, ImapError> {
        self.session.as_mut().ok_or_else(|| ImapError::Lost("not connected".into()))
    }

    /// The messages with a UID above `after` (at most [`FETCH_BATCH`], and no more once
    /// [`FETCH_BATCH_BYTES`] are kept; oldest first), each read up to `max_bytes`
    /// (`BODY.PEEK[]<0.max>`: the server cuts it; nothing is marked seen).
    pub fn fetch_after(&mut self, after: u32, max_bytes: u32) -> Result<Vec<Fetched>, ImapError> {
        let first = after.saturating_add(1);
        let query = format!("(UID RFC822.SIZE BODY.PEEK[]<0.{max_bytes}>)");
        // `n:*` names the last message even when its UID is below n (RFC 3501 6.4.8): filtered.
        let set = format!("{first}:*");
        let mut out: Vec<Fetched> = Vec::new();
        let (mut kept, mut left_out) = (0usize, u32::MAX);
        let rt = &self.rt;
        let session = self.session.as_mut().ok_or_else(|| ImapError::Lost("not connected".into()))?;
        let fut = async {
            let mut stream = session.uid_fetch(&set, &query).await.map_err(|e| lost("UID FETCH", e))?;
            while let Some(item) = stream.next().await {
                let f = item.map_err(|e| lost("UID FETCH", e))?;
                let Some(uid) = f.uid.filter(|u| *u > after) else { continue };
                if out.len() >= FETCH_BATCH || kept >= FETCH_BATCH_BYTES {
                    // Full: the lowest UIDs are the ones kept (a server may answer out of
                    // order), so the highest kept one makes room for a lower one.
                    let highest = (0..out.len()).max_by_key(|&i| out[i].uid).filter(|&i| out[i].uid > uid);
                    let Some(i) = highest else {
                        left_out = left_out.min(uid);
                        continue;
                    };
                    let gone = out.swap_remove(i);
                    kept -= gone.raw.len();
                    left_out = left_out.min(gone.uid);
                }
                let raw = f.body().map(<[u8]>::to_vec).unwrap_or_default();
                kept += raw.len();
                out.push(Fetched { uid, size: f.size.unwrap_or(0), raw });
            }
            Ok(())
        };
        bounded(rt, "UID FETCH", OP_TIMEOUT, fut)?;
        out.sort_by_key(|f| f.uid);
        // The position moves past the last message kept: the batch ends before the first one
        // left out, which the next receive fetches (the lowest UID is always kept).
        out.retain(|f| f.uid < left_out);
        Ok(out)
    }

    /// Waits up to `wait` for the server to announce a change (IDLE), returning early when
    /// `stop` turns true (checked every 100 ms). Without IDLE, a `NOOP` after the wait.
    pub fn wait_for_mail(&mut self, wait: Duration, stop: &dyn Fn() -> bool) -> Result<(), ImapError> {
        let check = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if stop() {
                    break;
                }
            }
        };
        if !self.idle {
            self.rt.block_on(async {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = check => {}
                }
            });
            let rt = &self.rt;
            let s = self.session.as_mut().ok_or_else(|| ImapError::Lost("not connected".into()))?;
            return bounded(rt, "NOOP", OP_TIMEOUT, async { s.noop().await.map_err(|e| lost("NOOP", e)) });
        }
        let session = self.session.take().ok_or_else(|| ImapError::Lost("not connected".into()))?;
        let rt = &self.rt;
        let back = rt.block_on(async {
            let mut idle = session.idle();
            tokio::time::timeout(OP_TIMEOUT, idle.init())
                .await
                .map_err(|_| lost("IDLE", "timed out"))?
                .map_err(|e| lost("IDLE", e))?;
            {
                let (fut, _interrupt) = idle.wait_with_timeout(wait);
                tokio::select! {
                    r = fut => match r {
                        Ok(IdleResponse::NewData(_) | IdleResponse::Timeout | IdleResponse::ManualInterrupt) => {}
                        Err(e) => return Err(lost("IDLE", e)),
                    },
                    _ = check => {}
                }
            }
            tokio::time::timeout(OP_TIMEOUT, idle.done())
                .await
                .map_err(|_| lost("IDLE DONE", "timed out"))?
                .map_err(|e| lost("IDLE DONE", e))
        })?;
        self.session = Some(back);
        Ok(())
    }

    /// `LOGOUT`, bounded; errors are ignored (the connection is going anyway).
    pub fn logout(&mut self) {
        if let Some(mut s) = self.session.take() {
            let _ = self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), s.logout()).await });
        }
    }

    /// Whether the session is still usable.
    pub fn is_live(&mut self) -> bool {
        self.live().is_ok()
    }
}
