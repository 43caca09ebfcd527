//! A blocking client with deadlines.
//!
//! Reads happen on a helper thread, one line per request, so every wait has a deadline on
//! every OS (Windows pipe handles have no read timeout) and a read never runs concurrently
//! with a write on the same handle (which synchronous Windows pipe handles serialize).

use std::io::{self, BufReader, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::framing::{decode, read_line, write_msg};
use crate::proto::{Hello, Op, Request, Response, StatusReport};
use crate::{Endpoint, PROTOCOL_NAME, PROTOCOL_VERSION, transport};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing listens at the endpoint.
    #[error("no gateway is listening at {0}")]
    NotListening(String),
    #[error("the gateway did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the gateway closed the connection")]
    Closed,
    #[error(
        "the gateway speaks control protocol {server}, this CLI speaks {PROTOCOL_VERSION}: use the matching gatewarden binary"
    )]
    VersionMismatch { server: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("the gateway refused: {message} ({code})")]
    Refused { code: String, message: String },
    /// The endpoint's folder, socket or listening process belongs to someone else: refused
    /// before reading a byte from it.
    #[error("refusing to talk to the control endpoint: {0}")]
    Untrusted(String),
    #[error("control connection failed: {0}")]
    Io(#[from] io::Error),
}

type LineResult = io::Result<Option<Vec<u8>>>;

pub struct Client {
    writer: Box<dyn Write + Send>,
    want: SyncSender<()>,
    lines: Receiver<LineResult>,
    hello: Hello,
}

impl Client {
    /// Connects and completes the versioned handshake within `timeout`.
    pub fn connect(ep: &Endpoint, timeout: Duration) -> Result<Client, ClientError> {
        let deadline = Instant::now() + timeout;
        let (r, writer) = transport::connect(ep, ep.shared_folder(), deadline).map_err(|e| {
            if let Some(u) = e.get_ref().and_then(|inner| inner.downcast_ref::<transport::Untrusted>()) {
                return ClientError::Untrusted(u.0.clone());
            }
            match e.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ClientError::NotListening(ep.display()),
                _ => ClientError::Io(e),
            }
        })?;
        let (want, want_rx) = mpsc::sync_channel::<()>(1);
        let (tx, lines) = mpsc::sync_channel::<LineResult>(1);
        std::thread::Builder::new()
            .name("control-reader".into())
            .spawn(move || {
                let mut r = BufReader::new(r);
                while want_rx.recv().is_ok() {
                    let line = read_line(&mut r);
                    let end = !matches!(line, Ok(Some(_)));
                    if tx.send(line).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(ClientError::Io)?;
        let mut c = Client { writer, want, lines, hello: Hello::new("", 0, "") };
        let line = c.next_line(deadline)?.ok_or(ClientError::Closed)?;
        let v: Value = decode(&line).map_err(|e| ClientError::Protocol(format!("bad hello: {e}")))?;
        if v.get("proto").and_then(Value::as_str) != Some(PROTOCOL_NAME) {
            return Err(ClientError::Protocol("the endpoint is not a gatewarden control endpoint".into()));
        }
        if v.get("v").and_then(Value::as_u64) != Some(u64::from(PROTOCOL_VERSION)) {
            return Err(ClientError::VersionMismatch { server: v.get("v").map(Value::to_string).unwrap_or_default() });
        }
        c.hello = serde_json::from_value(v).map_err(|e| ClientError::Protocol(format!("bad hello: {e}")))?;
        Ok(c)
    }

    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    fn next_line(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, ClientError> {
        // The reader thread may have ended (EOF/error): then the line is already decided.
        let _ = self.want.try_send(());
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => Ok(line?),
            Err(RecvTimeoutError::Timeout) => Err(ClientError::Timeout(left)),
            Err(RecvTimeoutError::Disconnected) => Err(ClientError::Closed),
        }
    }

    /// Sends one request and returns its `result`.
    pub fn call(&mut self, op: Op, timeout: Duration) -> Result<Value, ClientError> {
        let deadline = Instant::now() + timeout;
        write_msg(&mut self.writer, &Request::from(op))?;
        let line = self.next_line(deadline)?.ok_or(ClientError::Closed)?;
        let resp: Response = decode(&line).map_err(|e| ClientError::Protocol(e.to_string()))?;
        match (resp.ok, resp.result, resp.error) {
            (true, result, _) => Ok(result.unwrap_or(Value::Null)),
            (false, _, Some(e)) => Err(ClientError::Refused { code: e.code, message: e.message }),
            (false, _, None) => Err(ClientError::Protocol("error response without a body".into())),
        }
    }

    pub fn status(&mut self, timeout: Duration) -> Result<StatusReport, ClientError> {
        let v = self.call(Op::Status, timeout)?;
        serde_json::from_value(v).map_err(|e| ClientError::Protocol(format!("bad status: {e}")))
    }

    /// Waits until the server closes the connection (it does so when its process exits after
    /// an accepted stop). Returns false on timeout.
    pub fn wait_closed(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_line(deadline) {
                Ok(Some(_)) => continue,
                Ok(None) | Err(ClientError::Closed) | Err(ClientError::Io(_)) => return true,
                Err(_) => return false,
            }
        }
    }
}
