//! The control server: one handler per request, one dispatch `match` (docs/protocol.md §3).
//! The transport (Unix socket or named pipe) lives in the per-OS file; this file is the table
//! of contents.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod transport;

use std::sync::Arc;

use gatewarden_control::proto::Hello;
use gatewarden_control::{MAX_LINE, Op, PROTOCOL_VERSION, Request, Response, StopReason};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::UnboundedSender;

pub use transport::{bind, unbind};

use crate::app::App;
use crate::cause::{Cause, ControlKind};

/// How long a cancel request waits for the main loop's answer (the platforms restart first).
const CANCEL_ANSWER: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves one connection until the peer closes it or the process exits.
pub(crate) async fn serve_conn<S>(stream: S, gw: Arc<App>, tx: UnboundedSender<Cause>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::new(r);
    let hello = Hello::new(gatewarden_lifecycle::VERSION, gw.me.pid, &gw.me.id);
    if send(&mut w, &hello).await.is_err() {
        return;
    }
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match tokio::io::AsyncReadExt::take(&mut r, MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await {
            Ok(n) => n,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        if line.len() > MAX_LINE {
            let _ = send(&mut w, &Response::err("too_large", "request line longer than 64 KiB")).await;
            return;
        }
        let (resp, after) = match serde_json::from_slice::<Request>(&line) {
            Ok(req) if req.v != PROTOCOL_VERSION => (
                Response::err(
                    "version",
                    format!("this gateway speaks control protocol {PROTOCOL_VERSION}, not {}", req.v),
                ),
                None,
            ),
            Ok(req) => handle(&gw, &tx, req.op).await,
            Err(e) => (Response::err("bad_request", e.to_string()), None),
        };
        // Reply first, then act: the caller always sees the acknowledgement.
        if send(&mut w, &resp).await.is_err() {
            return;
        }
        if let Some(cause) = after {
            let _ = tx.send(cause);
        }
    }
}

/// The dispatch table. Returns the response and, for lifecycle requests, the cause to hand
/// to the main loop once the response is on its way (`cancel_drain` is answered by the main
/// loop itself, through `tx`).
async fn handle(gw: &App, tx: &UnboundedSender<Cause>, op: Op) -> (Response, Option<Cause>) {
    match op {
        Op::Ping => (Response::ok(json!({"pong": true})), None),
        Op::Status => (Response::ok(serde_json::to_value(gw.status()).unwrap_or_default()), None),
        Op::Stop { requester, reason } => {
            if reason == StopReason::Stop {
                gw.record_operator_stop(&requester.channel);
            }
            let kind = match reason {
                StopReason::Stop => ControlKind::Stop,
                StopReason::Takeover => ControlKind::Takeover,
            };
            (Response::ok(json!({"accepted": true, "state": "draining"})), Some(Cause::Control { kind, requester }))
        }
        Op::Restart { requester } => (
            Response::ok(json!({"accepted": true, "state": "draining"})),
            Some(Cause::Control { kind: ControlKind::Restart, requester }),
        ),
        Op::CancelDrain { requester } => (cancel_drain(tx, requester).await, None),
    }
}

/// The one request answered after the main loop acted: whether the drain was cancelled.
async fn cancel_drain(tx: &UnboundedSender<Cause>, requester: gatewarden_control::Requester) -> Response {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if tx.send(Cause::CancelDrain { requester, reply }).is_err() {
        return Response::err("too_late", "the gateway is exiting");
    }
    match tokio::time::timeout(CANCEL_ANSWER, answer).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Response::err("too_late", "the drain is over: the gateway is exiting"),
        Err(_) => Response::err("too_late", "no answer: the drain is past the point where it can be cancelled"),
    }
}

async fn send<W: AsyncWrite + Unpin, T: serde::Serialize>(w: &mut W, msg: &T) -> std::io::Result<()> {
    let bytes = gatewarden_control::framing::encode(msg)?;
    w.write_all(&bytes).await?;
    w.flush().await
}
