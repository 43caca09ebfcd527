//! The main loop of one served gateway ([`serve`]): start-up on a bound listener (HTTP, the
//! control channel, the marker watch, the chat adapters, the worker), then every shutdown cause
//! handled in place or classified ([`classify`]), the drain ([`draining`]), and the wind-down
//! to the exit records. lib.rs claims the home and builds the gateway before this runs.

mod classify;
mod draining;

use std::sync::Arc;
use std::time::Duration;

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::ExitIntent;
use gatewarden_lifecycle::records::GatewayState;
use serde_json::json;
use tokio::sync::mpsc;

use self::classify::{Classified, classify};
use self::draining::{Drained, drain, run_on};
use crate::app::App;
use crate::cause::{Cause, ControlKind, Outcome};
use crate::claim::obey_desired;
use crate::gateway::Gateway;
use crate::options::ResolvedOptions;
use crate::signals::{Action, Shutdown, Signal};
use crate::{cluster, control, drain as budget, hermes, http, reload, restart, sdnotify, signals, watch};
use crate::{info, warn};

/// Serves one prepared gateway ([`prepare`](crate::prepare)) on `listener` until a classified cause ends it,
/// drains, and writes the exit records (the home lock, if any, is the caller's to release
/// after this returns). Every OS signal comes from `shutdown` (the installed handlers in
/// [`run`](crate::run); a channel in a test). Binds the control endpoint of the gateway's home.
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    mut shutdown: impl Shutdown,
    opts: &ResolvedOptions,
) -> Outcome {
    let o = serve_until_classified(&app, listener, &mut shutdown, opts).await;
    end(&app.gw, o)
}

/// What runs beside the main loop from start-up to the wind-down.
struct Services {
    /// The address the listener is bound to, as `status` shows it.
    addr: String,
    /// `[agent] hermes_home`: hermes's API server, ours to run until the drain is over.
    hermes: Option<hermes::Child>,
    /// Reports marker files as causes; dropped when the loop ends.
    _watch: watch::MarkerWatch,
    /// The HTTP server (http/serve.rs), bounded by the drain budget once it winds down.
    server: tokio::task::JoinHandle<()>,
}

/// [`serve`] up to the exit records: the services, the start-up, the loop and its drains, the
/// wind-down. Returns the decision that ended it (or the start-up's failure).
async fn serve_until_classified(
    app: &Arc<App>,
    listener: tokio::net::TcpListener,
    signals: &mut impl Shutdown,
    opts: &ResolvedOptions,
) -> Outcome {
    let (tx, mut rx) = mpsc::unbounded_channel::<Cause>();
    let services = match start_services(app, listener, opts, &tx) {
        Ok(s) => s,
        Err(o) => return o,
    };
    if let Err(o) = start_up(app, signals, opts, &tx, &services.addr).await {
        return o;
    }
    let decision = until_drained(app, signals, &mut rx, &tx, opts).await;
    wind_down(app, &mut rx, &decision, services).await;
    decision
}

/// The listener's address, the causes channel, the wake follower, hermes, the control
/// endpoint, the marker watch, systemd's watchdog and the HTTP server.
fn start_services(
    app: &Arc<App>,
    listener: tokio::net::TcpListener,
    opts: &ResolvedOptions,
    tx: &mpsc::UnboundedSender<Cause>,
) -> Result<Services, Outcome> {
    let gw = &app.gw;
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| opts.listen.clone());
    gw.set_listen(addr.clone());
    gw.set_causes(tx.clone());
    app.follow_wakes();
    // `[agent] hermes_home`: hermes's API server is ours to run until the drain is over.
    let hermes = app.work.hermes.clone().and_then(hermes::Child::start);
    if let Err(e) = control::bind(&Endpoint::for_home(gw.home.dir()), Arc::clone(app), tx.clone()) {
        return Err(startup_failed(gw, e));
    }
    let _watch = watch::start(gw.home.dir(), tx.clone());
    if let Some(every) = sdnotify::watchdog_interval() {
        let n = gw.notifier.clone();
        // Pings until the process exits: a drain is bounded, and a silent drain would be
        // mistaken for a hang.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every / 2);
            loop {
                tick.tick().await;
                n.send("WATCHDOG=1");
            }
        });
    }
    // Accepts once `running`; stops at `stopping`, or at `draining` while a successor holds our
    // listener; winds the open connections down without cutting a request (http/serve.rs).
    let server =
        tokio::spawn(http::serve::serve(listener, http::router(Arc::clone(app)), Arc::clone(app), opts.drain_timeout));
    Ok(Services { addr, hermes, _watch, server })
}

/// From the services up to `running` and the worker: early signals, the chat adapters, the
/// desired state once more, readiness, then what runs once ready.
async fn start_up(
    app: &Arc<App>,
    signals: &mut impl Shutdown,
    opts: &ResolvedOptions,
    tx: &mpsc::UnboundedSender<Cause>,
    addr: &str,
) -> Result<(), Outcome> {
    let gw = &app.gw;
    let reload_when_ready = early_signals(gw, signals, opts).await?;
    start_platforms(app, opts).await?;
    // Again just before `running`: a stop recorded during the start-up wins without a signal.
    if let Err(o) = obey_desired(gw, opts, false) {
        return Err(prevented(gw, o));
    }
    become_ready(app, opts, addr);
    match &opts.cluster {
        // The worker starts when this gateway becomes the active (cluster.rs).
        Some(c) => {
            if let Err(e) = cluster::start(app, c) {
                return Err(startup_failed(gw, e));
            }
        }
        None => app.work.start_worker(Arc::clone(gw)),
    }
    export_metrics(app);
    // A marker may have landed before the watch was set up.
    let _ = tx.send(Cause::MarkerChanged);
    if let Some(sig) = reload_when_ready {
        let _ = tx.send(Cause::Signal(sig));
    }
    // Start-up is over once the worker and the adapters have settled: its code pages (config,
    // migrations, TLS roots, clap) need not stay mapped in an idle gateway; what runs again is
    // mapped again from the page cache (README, "Memory").
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        gatewarden_lifecycle::platform::release_startup_pages();
    });
    Ok(())
}

/// The signals already pending before `running`. One that ends or restarts ends the start-up
/// as unexpected, whatever markers say (D1, #103191); a SIGHUP is a reload once running (the
/// file may have changed after it was read), returned to be sent then; the signals that are
/// only recorded are recorded.
async fn early_signals(
    gw: &Gateway,
    signals: &mut impl Shutdown,
    opts: &ResolvedOptions,
) -> Result<Option<Signal>, Outcome> {
    let mut reload_when_ready = None;
    loop {
        let early = tokio::select! { biased; s = signals.recv() => Some(s), () = std::future::ready(()) => None };
        let Some(sig) = early else { return Ok(reload_when_ready) };
        match sig.kind.action() {
            Action::Reload => reload_when_ready = Some(sig),
            Action::Ignore => ignored(gw, &sig),
            Action::End | Action::Restart => {
                // A stop the operator recorded since this start was asked for sent it (a `stop`
                // right after a `start`): this start is prevented, with that stop's requester,
                // not a crash.
                if let Err(o) = obey_desired(gw, opts, false) {
                    return Err(prevented(gw, o));
                }
                return Err(startup_failed_with(
                    gw,
                    ExitIntent::Unexpected,
                    format!("{} during start-up", sig.describe()),
                ));
            }
        }
    }
}

/// Chat platforms: after the lock is held, before `running` (each behind its credential lock);
/// with `[cluster]` on promotion only (platforms.rs).
async fn start_platforms(app: &Arc<App>, opts: &ResolvedOptions) -> Result<(), Outcome> {
    let gw = &app.gw;
    let platforms = Arc::clone(&app.platforms);
    if opts.cluster.is_some() {
        platforms.standby_all(gw);
        return Ok(());
    }
    let started = {
        let gw = Arc::clone(gw);
        tokio::task::spawn_blocking(move || platforms.start(&gw)).await
    };
    match started {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(startup_failed(gw, e)),
        Err(e) => Err(startup_failed(gw, format!("cannot start the chat platform adapters: {e}"))),
    }
}

/// `running`: the boot notices queued first, then the phase, the adapters' watchdog, the
/// dashboard's fleet, the log line and `--ready-stdout`.
fn become_ready(app: &Arc<App>, opts: &ResolvedOptions, addr: &str) {
    let gw = &app.gw;
    // Queued before `running`: the first reply after a restart must already carry the notice.
    app.work.boot_notices(gw, !app.platforms.is_empty());
    gw.become_ready(json!({"listen": addr, "control": gw.control}));
    app.platforms.watchdog(Arc::clone(gw));
    // Join the per-user fleet (`gatewarden dashboard`); a home that cannot register still serves.
    match gatewarden_dashboard::registry::dir() {
        Ok(Some(dir)) => {
            if let Err(e) =
                gatewarden_dashboard::registry::register(&dir, &gw.home_str, Some(gatewarden_lifecycle::VERSION))
            {
                warn!("not in the dashboard's fleet: {e}");
            }
        }
        Ok(None) => {}
        Err(e) => warn!("not in the dashboard's fleet: {e}"),
    }
    info!("gateway {} ready: http://{addr} (control {})", gw.me.id, gw.control);
    if opts.ready_stdout {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready {} {} {addr}", gw.me.id, gw.me.pid);
        let _ = out.flush();
    }
}

/// Decides and drains until a drain is over: a restart's drain that is cancelled runs the
/// gateway on, and the causes that arrived meanwhile are decided afresh.
async fn until_drained(
    app: &Arc<App>,
    signals: &mut impl Shutdown,
    rx: &mut mpsc::UnboundedReceiver<Cause>,
    tx: &mpsc::UnboundedSender<Cause>,
    opts: &ResolvedOptions,
) -> Outcome {
    let gw = &app.gw;
    loop {
        let decision = decide(app, signals, rx, tx, opts).await;
        app.work.notices.set_restarting(decision.intent == ExitIntent::PlannedRestart);
        info!("stopping: {}", decision.reason);
        let budget = match decision.owner_stop {
            true => budget::Budget::owner_stop(opts.drain_timeout),
            false => budget::Budget::configured(opts.drain_timeout),
        };
        match drain(app, signals, rx, opts, decision.intent, budget).await {
            Drained::Over => return decision,
            Drained::Cancelled { requester, reply, deferred } => {
                gw.stand_down();
                run_on(app, requester, reply).await;
                // What arrived during the drain is classified now, in order (a restart asked for
                // meanwhile was answered as joined to the one cancelled, and is not carried out).
                for c in deferred {
                    let _ = tx.send(c);
                }
            }
        }
    }
}

/// Handles causes until one ends this incarnation: an exit, or a restart whose next
/// incarnation is proven to run. The decision is committed ([`Gateway::commit`]).
async fn decide(
    app: &Arc<App>,
    signals: &mut impl Shutdown,
    rx: &mut mpsc::UnboundedReceiver<Cause>,
    tx: &mpsc::UnboundedSender<Cause>,
    opts: &ResolvedOptions,
) -> Outcome {
    let gw = &app.gw;
    loop {
        let cause = tokio::select! {
            s = signals.recv() => Cause::Signal(s),
            Some(c) = rx.recv() => c,
        };
        let Some(cause) = in_place(app, cause).await else { continue };
        match classify(gw, cause, tx) {
            Classified::Keep => {}
            Classified::Exit(o) => {
                gw.commit(&o);
                return o;
            }
            Classified::Restart(ask) => {
                // Nothing stops before the next incarnation is proven to run (restart.rs).
                match restart::begin(app, opts, ask).await {
                    Some(o) => {
                        gw.commit(&o);
                        return o;
                    }
                    // Refused, or it could not start: the next request is taken on afresh.
                    None => gw.stand_down(),
                }
            }
        }
    }
}

/// After the drain: restart requests nobody read are answered, hermes is left to the successor
/// or stopped, the cluster's lease handed on, and the HTTP server's wind-down awaited.
async fn wind_down(app: &Arc<App>, rx: &mut mpsc::UnboundedReceiver<Cause>, decision: &Outcome, services: Services) {
    let gw = &app.gw;
    // Restart requests taken on before the decision whose causes the drain did not read.
    while let Ok(c) = rx.try_recv() {
        if let Cause::Control { kind: ControlKind::Restart, requester, asker } = c {
            let answer = gw.record_superseded_restart(&requester);
            app.tell(asker, Ok(answer));
        }
    }
    let Services { hermes, server, .. } = services;
    if let Some(h) = hermes {
        // A restart hands hermes, warm, to the successor (its runs were stopped by the drain);
        // anything else stops it.
        match decision.intent {
            ExitIntent::PlannedRestart | ExitIntent::Takeover => h.leave(),
            _ => h.stop().await,
        }
    }
    // Drained: hand the lease to a standby now rather than at its expiry.
    cluster::release(app).await;
    gw.advance(GatewayState::Stopping);
    // Bounded inside: the rest of the drain budget plus short graces.
    let _ = server.await;
}

/// With `[telemetry]`: the numbers `/metrics` serves go out as OTLP metrics every
/// `metrics_interval_s` (crates/telemetry), rendered by the same code.
fn export_metrics(app: &Arc<App>) {
    let app = Arc::clone(app);
    tokio::spawn(async move {
        loop {
            // Armed before the exporter is read, so a reload in between is not missed.
            let reloaded = app.work.reloaded.notified();
            tokio::pin!(reloaded);
            reloaded.as_mut().enable();
            match app.work.live().telemetry.clone() {
                Some(x) => {
                    x.metrics(&http::metrics::render(&app).await);
                    tokio::select! {
                        () = tokio::time::sleep(x.metrics_interval()) => {}
                        () = reloaded => {}
                    }
                }
                None => reloaded.await,
            }
        }
    });
}

/// What the main loop handles without classifying: a reload (control `reload`, SIGHUP) and the
/// signals that are recorded and ignored. Any other cause is returned for [`classify`].
async fn in_place(app: &Arc<App>, cause: Cause) -> Option<Cause> {
    match cause {
        Cause::Reload { requester, reply } => {
            let r = reload::reload(app, requester).await;
            if let Some(reply) = reply {
                let _ = reply.send(r);
            }
            None
        }
        Cause::Signal(sig) => match sig.kind.action() {
            Action::Reload => {
                info!("{}: reloading the configuration", sig.describe());
                reload::reload(app, sig.requester()).await;
                None
            }
            Action::Ignore => {
                ignored(&app.gw, &sig);
                None
            }
            Action::End | Action::Restart => Some(Cause::Signal(sig)),
        },
        c => Some(c),
    }
}

/// A signal the gateway does not act on (SIGUSR2, a SIGPIPE another process sent): recorded
/// with its sender, so nobody has to guess what it did.
fn ignored(gw: &Gateway, sig: &signals::Signal) {
    warn!("{}: ignored (it has no meaning for a gateway)", sig.describe());
    gw.record("signal_ignored", json!({"signal": sig.kind.name(), "sender": sig.requester()}));
}

pub(crate) fn startup_failed(gw: &Gateway, reason: String) -> Outcome {
    startup_failed_with(gw, ExitIntent::FatalConfig, reason)
}

/// A start the desired state prevented once it had begun (`start_prevented` is recorded by
/// `claim::not_starting`): a planned stop, not a refusal.
pub(crate) fn prevented(gw: &Gateway, o: Outcome) -> Outcome {
    gw.advance(GatewayState::Stopping);
    o
}

pub(crate) fn startup_failed_with(gw: &Gateway, intent: ExitIntent, reason: String) -> Outcome {
    gw.record("start_refused", json!({"code": intent.code(), "reason": reason}));
    gw.advance(GatewayState::Stopping);
    Outcome::new(intent, reason)
}

/// The exit funnel: final state, ledger, records, control endpoint, intake
/// (`Gateway::finish`); the caller releases the lock after this.
pub(crate) fn end(gw: &Gateway, o: Outcome) -> Outcome {
    gw.finish(&o, || control::unbind(&Endpoint::for_home(gw.home.dir())));
    o
}
