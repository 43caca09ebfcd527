//! The drain as the main loop runs it: active runs waited for within the budget while signals
//! and control requests keep arriving, a restart's drain cancelled on request, and the gateway
//! run on after a cancel.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::{Requester, Response};
use gatewarden_lifecycle::ExitIntent;
use gatewarden_lifecycle::records::GatewayState;
use serde_json::json;
use tokio::sync::mpsc;

use super::ignored;
use crate::app::App;
use crate::cause::{Cause, ControlKind};
use crate::gateway::Gateway;
use crate::options::ResolvedOptions;
use crate::signals::{Shutdown, SignalKind};
use crate::{drain, error, info, platforms, reload, warn};

/// How often a draining gateway looks whether its prepared successor is still alive.
const SUCCESSOR_LOOK: Duration = Duration::from_millis(200);

/// How a drain ended.
pub(super) enum Drained {
    /// The gateway goes on to exit.
    Over,
    /// A restart's drain was cancelled (`drain::may_cancel`) and recorded
    /// (`desired::record_cancel`): the gateway runs on ([`run_on`]); `deferred` are the causes
    /// that arrived meanwhile.
    Cancelled { requester: Requester, reply: tokio::sync::oneshot::Sender<Response>, deferred: Vec<Cause> },
}

/// Waits for active runs, bounded by the drain budget; a second SIGINT forces. While it waits,
/// a restart's drain may be cancelled (control `cancel_drain`): it then returns before anything
/// is closed or cancelled, and before the runs are interrupted.
pub(super) async fn drain(
    app: &App,
    signals: &mut impl Shutdown,
    rx: &mut mpsc::UnboundedReceiver<Cause>,
    opts: &ResolvedOptions,
    intent: ExitIntent,
    budget: drain::Budget,
) -> Drained {
    let gw = &app.gw;
    app.work.notices.reset_for_drain();
    // Chat platforms stop receiving first: what arrives from now on stays with the platform for
    // the successor (no poll of ours lingers to fight its first one).
    if !app.platforms.is_empty() {
        let p = Arc::clone(&app.platforms);
        let _ = tokio::task::spawn_blocking(move || p.stop_intake()).await;
    }
    if !gw.advance(GatewayState::Draining) {
        return Drained::Over;
    }
    let t0 = Instant::now();
    let at_start = gw.runs.active();
    gw.set_drain(at_start, SystemTime::now() + budget.runs);
    let facts = drain::CancelFacts {
        restart: intent == ExitIntent::PlannedRestart,
        cluster: opts.cluster.is_some(),
        systemd: gw.notifier.enabled(),
        terminated: false,
    };
    if let Some(cancelled) = wait_for_runs(app, signals, rx, facts, budget.runs).await {
        return cancelled;
    }
    let interrupted = interrupt_runs(app, budget.cancel_grace).await;
    flush_platforms(app, budget, t0).await;
    gw.record(
        "drained",
        json!({"duration_ms": t0.elapsed().as_millis() as u64, "runs_at_start": at_start, "interrupted": interrupted}),
    );
    Drained::Over
}

/// Keeps systemd's stop timeout ahead of the drain budget, `timeout` from now; pending for ever.
async fn extend_stop_timeout(gw: &Gateway, timeout: Duration) {
    let n = gw.notifier.clone();
    let until = tokio::time::Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        n.send(&format!("EXTEND_TIMEOUT_USEC={}", (left + Duration::from_secs(15)).as_micros()));
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// The drain's wait: until the runs are idle or `timeout` passes (`None`), while signals and
/// causes keep being answered; `Some`: the drain was cancelled (on request, or because the
/// prepared successor died), with the causes to decide afresh.
async fn wait_for_runs(
    app: &App,
    signals: &mut impl Shutdown,
    rx: &mut mpsc::UnboundedReceiver<Cause>,
    mut facts: drain::CancelFacts,
    timeout: Duration,
) -> Option<Drained> {
    let gw = &app.gw;
    let mut deferred = Vec::new();
    let extend = extend_stop_timeout(gw, timeout);
    let idle = gw.runs.wait_idle(timeout);
    let mut look = tokio::time::interval(SUCCESSOR_LOOK);
    tokio::pin!(extend, idle);
    loop {
        tokio::select! {
            () = &mut extend => {}
            _ = look.tick() => if let Some(why) = gw.successor_gone() {
                // The prepared successor died before taking over: nothing would replace us, so
                // the drain is cancelled and this incarnation serves on (restart.rs).
                error!("{why}; cancelling the drain");
                gw.record("restart_failed", json!({"reason": why}));
                let requester = Requester { pid: gw.me.pid, argv: vec![why.clone()], channel: "gateway".into() };
                if cancel(gw, facts, &requester, "gateway (the successor exited)").is_ok() {
                    let (reply, _) = tokio::sync::oneshot::channel();
                    return Some(Drained::Cancelled { requester, reply, deferred });
                }
            },
            idle = &mut idle => {
                if !idle {
                    warn!("drain timed out after {timeout:?} with {} active run(s)", gw.runs.active());
                }
                return None;
            }
            sig = signals.recv() => match sig.kind {
                SignalKind::Interrupt => {
                    warn!("second interrupt: not waiting for {} active run(s)", gw.runs.active());
                    return None;
                }
                SignalKind::Terminate | SignalKind::Quit => {
                    info!("{} during the drain: it goes on", sig.describe());
                    facts.terminated = true;
                }
                SignalKind::Reload => {
                    reload::refuse_draining(app, sig.requester());
                }
                SignalKind::User2 | SignalKind::Pipe => ignored(gw, &sig),
                SignalKind::Restart | SignalKind::ConsoleClose => {}
            },
            Some(cause) = rx.recv() => match cause {
                Cause::CancelDrain { requester, reply } => {
                    let by = format!("{} cancel-drain", requester.channel);
                    match cancel(gw, facts, &requester, &by) {
                        Ok(()) => return Some(Drained::Cancelled { requester, reply, deferred }),
                        Err(e) => {
                            let _ = reply.send(e);
                        }
                    }
                }
                Cause::Reload { requester, reply } => {
                    let r = reload::refuse_draining(app, requester);
                    if let Some(reply) = reply {
                        let _ = reply.send(r);
                    }
                }
                // A restart request taken on before the drain's own cause was decided (while a
                // restart was being proven, or a signal or a marker came first): told what it
                // joined, and the ledger says so. Every later request was answered as it came
                // (`Gateway::request_restart`).
                Cause::Control { kind: ControlKind::Restart, requester, asker } => {
                    let answer = gw.record_superseded_restart(&requester);
                    app.tell(asker, Ok(answer));
                }
                other => deferred.push(other),
            },
        }
    }
}

/// The runs still active when the wait ended are cancelled and given `grace` to clean up (an
/// exec backend kills its process group); interrupted async runs stay `running` in the journal
/// for the next incarnation. Returns how many were interrupted.
async fn interrupt_runs(app: &App, grace: Duration) -> u64 {
    let gw = &app.gw;
    let interrupted = gw.runs.active();
    if interrupted > 0 {
        app.work.cancel_all();
        if !gw.runs.wait_idle(grace).await {
            warn!("{} run(s) did not finish cleaning up within {grace:?}", gw.runs.active());
        }
    }
    interrupted
}

/// Replies of the runs that finished go out, within what is left of the budget since `t0`;
/// what does not make it stays in the outbox.
async fn flush_platforms(app: &App, budget: drain::Budget, t0: Instant) {
    if app.platforms.is_empty() {
        return;
    }
    let flush = platforms::Platforms::flush_budget(budget.runs.saturating_sub(t0.elapsed()));
    let deadline = Instant::now() + budget.flush.map_or(flush, |cap| flush.min(cap));
    let platforms = Arc::clone(&app.platforms);
    let _ = tokio::task::spawn_blocking(move || platforms.close(deadline)).await;
}

/// Whether the drain may be cancelled, and if so the cancel recorded in the desired state (the
/// restart's successor, backstop and ladder stand down on it): `Err` is the answer to send.
fn cancel(gw: &Gateway, facts: drain::CancelFacts, requester: &Requester, by: &str) -> Result<(), Response> {
    use gatewarden_lifecycle::desired::{self, Kept};
    if let Err(why) = drain::may_cancel(facts) {
        return Err(Response::err("not_cancellable", why.describe()));
    }
    let Some(process) = gw.me.identity() else {
        return Err(Response::err("not_cancellable", "this process cannot tell its own identity; the drain goes on"));
    };
    let kept = Kept { incarnation: gw.me.id.clone(), process };
    match desired::record_cancel(gw.home.dir(), kept, by) {
        Ok(Ok(d)) => {
            gw.record(
                "drain_cancelled",
                json!({"requester": requester, "seq": d.seq, "active_runs": gw.runs.active()}),
            );
            Ok(())
        }
        Ok(Err(stop)) => Err(Response::err(
            "not_cancellable",
            format!("a stop was recorded since by {}; the gateway stays down", stop.describe()),
        )),
        Err(e) => Err(Response::err("not_cancellable", format!("cannot record the cancel: {e}"))),
    }
}

/// After a cancelled drain: the gateway runs on as it did before the restart was asked for. It
/// keeps its listener and stops handing it over, restarts its chat adapters (their intake
/// stopped first thing in the drain; the cluster's promotion path, `Platforms::start`), takes
/// the queued messages again, and answers the requester once it is `running`.
pub(super) async fn run_on(app: &Arc<App>, requester: Requester, reply: tokio::sync::oneshot::Sender<Response>) {
    let gw = &app.gw;
    gw.stop_handing_over();
    gw.end_drain();
    app.work.notices.set_restarting(false);
    let mut platforms_error = None;
    if !app.platforms.is_empty() {
        let (p, g) = (Arc::clone(&app.platforms), Arc::clone(gw));
        let restarted = tokio::task::spawn_blocking(move || {
            p.close(Instant::now() + platforms::RESTART_FLUSH);
            p.start(&g)
        })
        .await;
        platforms_error = match restarted {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(format!("cannot restart the chat platform adapters: {e}")),
        };
    }
    gw.advance(GatewayState::Running);
    app.work.resume_queued(Arc::clone(gw));
    if let Some(e) = &platforms_error {
        error!("after the cancelled drain: {e}");
        gw.record("platform_restart_failed", json!({"reason": e}));
    }
    info!("drain cancelled by {}: incarnation {} runs on", requester.describe(), gw.me.id);
    let _ = reply.send(Response::ok(json!({
        "cancelled": true, "incarnation": gw.me.id, "pid": gw.me.pid, "state": gw.phase.get().as_str(),
        "platforms_error": platforms_error,
    })));
}
