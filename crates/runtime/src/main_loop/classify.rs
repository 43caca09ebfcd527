//! Each shutdown cause the main loop does not handle in place, mapped to what it means: keep
//! running, exit with an outcome, or a restart to attempt; who asked is recorded on the way.

use gatewarden_control::{Requester, Response};
use gatewarden_lifecycle::ExitIntent;
use gatewarden_lifecycle::marker::{self, MarkerKind, Verdict};
use gatewarden_lifecycle::probe::probe_u32;
use gatewarden_lifecycle::supervisor::BareTerm;
use serde_json::json;
use tokio::sync::mpsc;

use crate::cause::{self, Cause, ControlKind, Outcome};
use crate::gateway::Gateway;
use crate::signals::{self, SignalKind};
use crate::{error, info, restart, warn, watch};

/// What the main loop does with a cause.
pub(super) enum Classified {
    Keep,
    Exit(Outcome),
    /// A restart someone asked for; [`restart::begin`] proves the next incarnation first.
    Restart(restart::Ask),
}

/// Maps a cause to an exit decision, a restart to attempt, or nothing (keep running).
pub(super) fn classify(gw: &Gateway, cause: Cause, tx: &mpsc::UnboundedSender<Cause>) -> Classified {
    match cause {
        Cause::Signal(sig) => signal(gw, sig),
        Cause::Reload { reply, .. } => {
            // Handled before classification; answered in case one gets here.
            if let Some(r) = reply {
                let _ = r.send(Response::err("not_running", "the gateway is not running"));
            }
            Classified::Keep
        }
        Cause::Control { kind, requester, asker } => control(gw, kind, requester, asker),
        Cause::Fatal(reason) => {
            error!("{reason}");
            Classified::Exit(Outcome::new(ExitIntent::FatalConfig, reason))
        }
        Cause::CancelDrain { reply, .. } => {
            let _ =
                reply.send(Response::err("not_draining", "nothing to cancel: the gateway is running, not draining"));
            Classified::Keep
        }
        Cause::MarkerChanged => markers(gw, tx),
    }
}

/// A signal that ends or restarts the gateway (the others were handled in place).
fn signal(gw: &Gateway, sig: signals::Signal) -> Classified {
    let exit = Classified::Exit;
    match sig.kind {
        SignalKind::Terminate => exit(terminate(gw, &sig)),
        // Nobody's way of stopping a gateway: the sender is recorded, a manager revives it.
        SignalKind::Quit => exit(unannounced(gw, &sig, "SIGQUIT is not a way to stop a gateway")),
        SignalKind::Interrupt | SignalKind::ConsoleClose => {
            stop_requested(gw, None, Some(&sig), "signal", sig.kind.name());
            exit(Outcome::new(ExitIntent::PlannedStop, format!("planned stop: {}", sig.describe())))
        }
        SignalKind::Restart => {
            let requester = sig.requester();
            gw.record("restart_requested", json!({"requester": requester, "reason": "SIGUSR1"}));
            Classified::Restart(restart::Ask {
                why: format!("requested by {}", sig.describe()),
                channel: "signal".into(),
                requester,
                asker: cause::Asker::Nobody,
            })
        }
        // Handled before classification ([`super::in_place`]).
        SignalKind::Reload | SignalKind::User2 | SignalKind::Pipe => Classified::Keep,
    }
}

/// A SIGTERM: the takeover or stop a marker announced, else the owner's stop when the owner
/// sent it, else unexpected.
fn terminate(gw: &Gateway, sig: &signals::Signal) -> Outcome {
    let me = gw.self_identity();
    if let Some(m) = marker::consume(gw.home.dir(), MarkerKind::Takeover, &me, probe_u32) {
        stop_requested(gw, Some(&m), Some(sig), "signal", "takeover");
        return Outcome::new(ExitIntent::Takeover, format!("replaced by {} (SIGTERM)", m.writer()));
    }
    if let Some(m) = marker::consume(gw.home.dir(), MarkerKind::PlannedStop, &me, probe_u32) {
        stop_requested(gw, Some(&m), Some(sig), "signal", "stop");
        return Outcome::new(ExitIntent::PlannedStop, format!("planned stop requested by {} (SIGTERM)", m.writer()));
    }
    // The sender against our parent, read now: the owner's stop comes from the owner.
    let parent = gatewarden_lifecycle::platform::parent_pid(std::process::id());
    match gw.supervisor.bare_sigterm(sig.term_sender(parent)) {
        // The container runtime's stop (or a declared supervisor's): planned, drained within the
        // owner's grace, and not the operator's durable `stopped`.
        BareTerm::OwnerStop { by } => {
            let mut fields = json!({"requester": sig.requester(), "reason": "owner_stop", "by": by});
            fields["signal"] = sig.requester();
            gw.record("stop_requested", fields);
            let mut o = Outcome::new(ExitIntent::PlannedStop, format!("stopped by the {by} ({})", sig.describe()));
            o.owner_stop = true;
            o
        }
        BareTerm::Unexpected => {
            unannounced(gw, sig, "no planned-stop marker names this gateway, and its owner did not send it")
        }
    }
}

/// A control request (`stop`, `takeover`, `restart`), recorded with its requester.
fn control(gw: &Gateway, kind: ControlKind, requester: Requester, asker: cause::Asker) -> Classified {
    let who = requester.describe();
    Classified::Exit(match kind {
        ControlKind::Stop => {
            let mut fields = json!({"requester": requester, "reason": "stop"});
            if let Ok(Some(seq)) = gw.record_operator_stop(&requester.channel) {
                fields["want"] = json!("stopped");
                fields["seq"] = json!(seq);
            }
            gw.record("stop_requested", fields);
            Outcome::new(ExitIntent::PlannedStop, format!("planned stop requested by {who}"))
        }
        ControlKind::Takeover => {
            gw.record("stop_requested", json!({"requester": requester, "reason": "takeover"}));
            Outcome::new(ExitIntent::Takeover, format!("replaced by {who}"))
        }
        ControlKind::Restart => {
            gw.record("restart_requested", json!({"requester": requester, "reason": "restart"}));
            return Classified::Restart(restart::Ask {
                why: format!("requested by {who}"),
                channel: requester.channel.clone(),
                requester: json!(requester),
                asker,
            });
        }
    })
}

/// The marker files changed: a takeover or planned-stop marker for this gateway ends it; one
/// for nobody is removed, one that cannot be read now is looked at again.
fn markers(gw: &Gateway, tx: &mpsc::UnboundedSender<Cause>) -> Classified {
    let me = gw.self_identity();
    for (kind, intent) in
        [(MarkerKind::Takeover, ExitIntent::Takeover), (MarkerKind::PlannedStop, ExitIntent::PlannedStop)]
    {
        match marker::probe(gw.home.dir(), kind, Some(&me), probe_u32) {
            Verdict::ForSelf(_) => {
                if let Some(m) = marker::consume(gw.home.dir(), kind, &me, probe_u32) {
                    let reason = if kind == MarkerKind::Takeover { "takeover" } else { "stop" };
                    stop_requested(gw, Some(&m), None, "marker", reason);
                    return Classified::Exit(Outcome::new(
                        intent,
                        format!("{reason} requested by {} (marker)", m.writer()),
                    ));
                }
            }
            Verdict::Removed { why } => {
                gw.record("marker_removed", json!({"file": kind.file_name(), "why": why}));
                info!("removed {}: {why}", kind.file_name());
            }
            Verdict::Retry { why } => {
                // Kept, and looked at again: a resource shortage is not a bad marker.
                warn!("cannot read {} right now ({why}); retrying", kind.file_name());
                watch::recheck_later(tx);
            }
            Verdict::Absent | Verdict::ForOther(_) => {}
        }
    }
    Classified::Keep
}

/// Records who asked for a stop: the marker's writer (pid and argv, as it wrote them), or the
/// signal's sender when no marker names anyone; a signal's sender is kept as `signal` either
/// way (issue 30 §5: who sent a SIGTERM).
fn stop_requested(
    gw: &Gateway,
    marker: Option<&marker::Marker>,
    sig: Option<&signals::Signal>,
    channel: &str,
    reason: &str,
) {
    let requester = match (marker, sig) {
        (Some(m), _) => json!({"pid": m.writer_pid, "argv": m.writer_argv, "channel": channel}),
        (None, Some(s)) => s.requester(),
        (None, None) => json!({"pid": null, "argv": [], "channel": channel}),
    };
    let mut fields = json!({"requester": requester, "reason": reason});
    if let Some(s) = sig {
        fields["signal"] = s.requester();
    }
    gw.record("stop_requested", fields);
}

/// A SIGTERM no marker announced, or a SIGQUIT: drained and ended as unexpected (exit 1, a
/// manager revives it), its sender in the ledger and the log.
fn unannounced(gw: &Gateway, sig: &signals::Signal, why: &str) -> Outcome {
    let sender = sig.requester();
    gw.record(
        "stop_requested",
        json!({"requester": sender, "signal": sender, "reason": sig.kind.name(), "unexpected": true}),
    );
    warn!("{}: {why}; draining, then exit 1", sig.describe());
    Outcome::new(ExitIntent::Unexpected, format!("unexpected {}: {why}", sig.describe()))
}
