//! The control server: one handler per request, one dispatch `match` (docs/protocol.md §3).
//! The transport (Unix socket or named pipe) lives in the per-OS file; this file is the table
//! of contents.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod transport;

use std::sync::Arc;

use gatewarden_control::proto::Hello;
use gatewarden_control::{MAX_LINE, Op, PROTOCOL_VERSION, PairingRequest, Request, Requester, Response, StopReason};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::UnboundedSender;

pub use transport::{bind, unbind};

use crate::app::App;
use crate::cause::RestartAnswer;
use crate::cause::{Asker, Cause, ControlKind};
use crate::worker::DecidedBy;

/// How long a cancel or reload request waits for the main loop's answer (the platforms
/// restart first).
const MAIN_LOOP_ANSWER: std::time::Duration = std::time::Duration::from_secs(30);

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
        let resp = match serde_json::from_slice::<Request>(&line) {
            Ok(req) if req.v != PROTOCOL_VERSION => Response::err(
                "version",
                format!("this gateway speaks control protocol {PROTOCOL_VERSION}, not {}", req.v),
            ),
            Ok(req) => handle(&gw, &tx, req.op).await,
            Err(e) => Response::err("bad_request", e.to_string()),
        };
        if send(&mut w, &resp).await.is_err() {
            return;
        }
    }
}

/// The dispatch table. Lifecycle requests reach the main loop through the gateway, which
/// decides their answer (`cancel_drain` and `reload` are answered by the main loop itself,
/// through `tx`).
async fn handle(gw: &App, tx: &UnboundedSender<Cause>, op: Op) -> Response {
    match op {
        Op::Ping => Response::ok(json!({"pong": true})),
        Op::Status => Response::ok(serde_json::to_value(gw.status_with_journal().await).unwrap_or_default()),
        // Answered once the gateway has taken the request on (`Gateway::request_stop`,
        // `Gateway::request_restart`); the connection then stays open until the process exits.
        Op::Stop { requester, reason } => {
            let kind = match reason {
                StopReason::Stop => ControlKind::Stop,
                StopReason::Takeover => ControlKind::Takeover,
            };
            match gw.request_stop(kind, &requester) {
                Ok(()) => Response::ok(json!({"accepted": true, "state": "draining"})),
                Err(warning) => Response::ok(json!({"accepted": true, "state": "draining", "warning": warning})),
            }
        }
        Op::Restart { requester } => restart(gw, requester).await,
        Op::CancelDrain { requester } => {
            let gone = Response::err("too_late", "the drain is over: the gateway is exiting");
            let silent = Response::err("too_late", "no answer: the drain is past the point where it can be cancelled");
            answered(tx, |reply| Cause::CancelDrain { requester, reply }, gone, silent).await
        }
        Op::Reload { requester } => {
            let requester = serde_json::to_value(&requester).unwrap_or_default();
            let gone = Response::err("not_running", "the gateway is exiting; the next start reads the configuration");
            let silent = Response::err("no_answer", "no answer from the gateway's main loop within 30 s");
            answered(tx, |reply| Cause::Reload { requester, reply: Some(reply) }, gone, silent).await
        }
        Op::Pairing { requester, request } => pairing(gw, requester, request).await,
    }
}

/// A restart is answered as the gateway takes it ([`crate::gateway::Gateway::request_restart`]):
/// joined to a restart under way, or refused naming the stop under way, at once; one taken on
/// once the main loop knows whether the next incarnation can run (restart.rs): `accepted`, or
/// `restart_refused` with why, while this one keeps serving.
async fn restart(gw: &App, requester: gatewarden_control::Requester) -> Response {
    let accepted = || Response::ok(json!({"accepted": true, "state": "draining"}));
    let (asker, verdict) = Asker::waiting();
    let answer = match gw.request_restart(&requester, asker, || {}) {
        RestartAnswer::Accepted => match tokio::time::timeout(crate::restart::VERDICT_PATIENCE, verdict).await {
            Ok(Ok(Ok(answer))) => answer,
            Ok(Ok(Err(why))) => return Response::err(gatewarden_control::proto::RESTART_REFUSED, why),
            // Dropped unanswered (the gateway is exiting) or slow: it goes with what the drain does.
            Ok(Err(_)) | Err(_) => RestartAnswer::Accepted,
        },
        a => a,
    };
    match answer {
        RestartAnswer::Accepted => accepted(),
        RestartAnswer::Joined => Response::ok(json!({"accepted": true, "joined": "restart", "state": "draining"})),
        a @ RestartAnswer::Refused(_) => Response::err("stopping", a.reply()),
    }
}

/// The pairing book (access/): listed, or a decision taken at once. A cluster standby decides
/// nothing (the active keeps the book): it names the active.
async fn pairing(app: &App, requester: Requester, request: PairingRequest) -> Response {
    if app.gw.cluster.get().is_some() && !app.gw.is_active() {
        return Response::err("standby", crate::cluster::standby_words(&app.gw));
    }
    let (work, gw) = (Arc::clone(&app.work), Arc::clone(&app.gw));
    let by = DecidedBy { channel: requester.channel.clone(), who: format!("pid {}", requester.pid) };
    let names: Vec<(String, String)> =
        work.gate.policies.get().iter().map(|(n, p)| (n.clone(), p.kind.as_str().to_owned())).collect();
    let resolve = |given: &str| crate::access::resolve(names.iter().map(|(n, k)| (n.as_str(), k.as_str())), given);
    let job: Box<dyn FnOnce() -> Response + Send> = match request {
        PairingRequest::List => Box::new(move || Response::ok(pairing_list(&work))),
        PairingRequest::Approve { platform, code } => match resolve(&platform) {
            Err(e) => return Response::err("unknown_platform", e),
            Ok(name) => Box::new(move || match work.approve_pairing(&gw, &name, &code, &by) {
                Ok(user) => Response::ok(json!({"platform": name, "sender": user, "approved": true})),
                Err(e) => Response::err("refused", e),
            }),
        },
        PairingRequest::Revoke { platform, user } => match resolve(&platform) {
            Err(e) => return Response::err("unknown_platform", e),
            Ok(name) => Box::new(move || match work.revoke_pairing(&gw, &name, &user, &by) {
                Ok(()) => Response::ok(json!({"platform": name, "sender": user, "revoked": true})),
                Err(e) => Response::err("refused", e),
            }),
        },
    };
    // The book is a file (or the cluster's store): off the async workers.
    tokio::task::spawn_blocking(job).await.unwrap_or_else(|e| Response::err("failed", e.to_string()))
}

/// `pairing list`'s answer: every platform's access and book, with what it refused since start.
pub(crate) fn pairing_list(work: &crate::worker::Work) -> serde_json::Value {
    let mut platforms = work.gate.report(std::time::SystemTime::now());
    for p in &mut platforms {
        p["refused"] = work.gate.refused_json(p["name"].as_str().unwrap_or_default());
    }
    json!({"platforms": platforms, "running": true})
}

/// A request answered after the main loop acted on it (a cancelled drain, a reload): `gone`
/// when the main loop dropped it (exiting), `silent` when it did not answer in time.
async fn answered(
    tx: &UnboundedSender<Cause>,
    cause: impl FnOnce(tokio::sync::oneshot::Sender<Response>) -> Cause,
    gone: Response,
    silent: Response,
) -> Response {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if tx.send(cause(reply)).is_err() {
        return gone;
    }
    match tokio::time::timeout(MAIN_LOOP_ANSWER, answer).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => gone,
        Err(_) => silent,
    }
}

async fn send<W: AsyncWrite + Unpin, T: serde::Serialize>(w: &mut W, msg: &T) -> std::io::Result<()> {
    let bytes = gatewarden_control::framing::encode(msg)?;
    w.write_all(&bytes).await?;
    w.flush().await
}
