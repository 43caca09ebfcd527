//! The gatewarden gateway process.
//!
//! [`run`] is the whole life of one incarnation: claim the home (the OS lock, or a verified
//! takeover), publish records, build the async runtime, install the signal handlers, bind the
//! listener, and [`serve`]. [`serve`] is everything after that — HTTP and the control channel,
//! the main loop that classifies each shutdown cause, the drain, the exit records — on a
//! listener and a signal source it is given, so a test drives a whole gateway in one process
//! ([`prepare`] builds one from a home). The binary maps the reported [`ExitIntent`] to the
//! process exit code through the one table in `gatewarden_lifecycle::exit`.

pub mod access;
pub mod app;
pub mod cause;
pub mod cluster;
pub mod commands;
pub mod control;
pub mod drain;
pub mod gateway;
pub mod hermes;
pub mod http;
pub mod intake;
pub mod log;
pub mod notices;
pub mod options;
pub mod platforms;
pub mod reload;
pub mod restart;
pub mod sdnotify;
pub mod settings;
pub mod signals;
pub mod startable;
pub mod takeover;
pub mod watch;
pub mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::{Endpoint, Requester, Response};
use gatewarden_lifecycle::heal::heal_stale;
use gatewarden_lifecycle::marker::{self, MarkerKind, Verdict};
use gatewarden_lifecycle::probe::probe_u32;
use gatewarden_lifecycle::records::{GatewayState, read_pid_record};
use gatewarden_lifecycle::supervisor::{BareTerm, Detection};
use gatewarden_lifecycle::{ExitIntent, Home, InstanceLock, LockError, Supervisor};
use serde_json::json;
use tokio::sync::mpsc;

pub use crate::app::App;
pub use crate::cause::{Cause, ControlKind, Outcome, Reexec};
use crate::gateway::{Gateway, Incarnation};
use crate::options::run_tag;
pub use crate::options::{ClusterSettings, RUN_TAG, ResolvedOptions, RunOptions};
use crate::signals::{Action, Shutdown, SignalKind, Signals};

/// How long a starting gateway waits out lock probes by `status`/`stop` before deciding that
/// another instance runs.
const LOCK_PATIENCE: Duration = Duration::from_millis(300);
/// How long to retry binding a listen address that is in use.
const BIND_PATIENCE: Duration = Duration::from_secs(5);
/// How much longer than the drain budget a successor waits for its predecessor's lock.
const SUCCESSOR_GRACE: Duration = Duration::from_secs(30);
/// How often a waiting successor looks whether its restart was cancelled.
const SUCCESSOR_LOOK: Duration = Duration::from_millis(200);

/// As PID 1: how long a zombie child stays unreaped before it counts as an orphan nobody waits
/// for (our own waiters collect theirs within a second).
const ORPHAN_GRACE: Duration = Duration::from_secs(3);

/// Runs one incarnation to its end. Never panics on bad state; every failure is an outcome.
pub fn run(opts: RunOptions, started_at: SystemTime, started: Instant) -> Outcome {
    // A restart's preflight only answers and exits (restart.rs).
    if opts.preflight {
        return preflight(&opts);
    }
    // First thing, and without a runtime: from here on a SIGHUP is a reload and every signal is
    // recorded, none ends the process by its default action (README, "Signals").
    let mut signals = Signals::install();
    let home = match opts.home.ensure() {
        Ok(h) => h,
        Err(e) => {
            if opts.successor {
                restart::say(Err(&e.to_string()));
            }
            return Outcome::new(ExitIntent::FatalConfig, e.to_string());
        }
    };
    let me = Incarnation::current(started_at, started);
    let detection = Supervisor::detect(opts.supervisor);
    let supervisor = detection.supervisor;
    // A container's init: orphans re-parented to us are ours to reap (the exec backend's
    // leftovers, a hermes child after a re-exec, a detached updater).
    if gatewarden_lifecycle::platform::spawn::is_pid1() {
        gatewarden_lifecycle::platform::spawn::reap_orphans(ORPHAN_GRACE);
    }
    let successor = opts.successor;
    let (app, opts) = match prepare(&home, opts, me.clone(), detection) {
        Ok(w) => w,
        // A successor's refusal is its predecessor's to record (`restart_refused`): that one
        // keeps serving, and no start was attempted.
        Err(o) if successor => {
            restart::say(Err(&o.reason));
            return o;
        }
        Err(o) => return refused(&home, &me, supervisor, o),
    };
    if successor {
        // Everything is ready but the lock: the predecessor may begin its drain.
        restart::say(Ok(()));
    }
    let gw = Arc::clone(&app.gw);

    let mut lock = match claim(&gw, &opts, signals.as_mut().ok()) {
        Ok(l) => l,
        Err(o) => return refused(&home, &me, supervisor, o),
    };
    // With the lock held, so a stop recorded before this line is seen and one recorded after
    // it finds this process as the holder to stop.
    if let Err(o) = obey_desired(&gw, &opts, true) {
        return o;
    }
    let healed = heal_stale(&home, &lock, "run", Some(&gw.self_identity()), &[]);
    if !healed.is_empty() {
        info!("cleaned stale state: {}", healed.join(", "));
    }
    sweep_orphan_runs(&gw);
    sweep_run_scratch(&gw.home, None);
    if let Err(e) = gw.publish_pid_record(&mut lock) {
        return Outcome::new(ExitIntent::FatalConfig, e);
    }
    gw.write_state();
    gw.record(
        "started",
        json!({"argv": gw.me.argv, "home": gw.home_str, "supervisor": supervisor.as_str(), "version": gatewarden_lifecycle::VERSION}),
    );
    info!(
        "gateway {} starting in {} (pid {}, supervisor {}: {})",
        gw.me.id,
        gw.home_str,
        gw.me.pid,
        supervisor.as_str(),
        gw.supervisor_evidence
    );

    let outcome = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => {
            let o = rt.block_on(listen_and_serve(app, signals, &opts));
            // Runs still being dropped (the runtime is not waited for) cannot remove their
            // scratch files: this incarnation's folder goes here, under the lock.
            sweep_run_scratch(&gw.home, Some(&gw.me.id));
            drop(lock);
            // Connections close here, after the lock is released: a client waiting for EOF
            // then finds the lock free.
            rt.shutdown_background();
            return o;
        }
        Err(e) => Outcome::new(ExitIntent::FatalConfig, format!("cannot start the async runtime: {e}")),
    };
    gw.advance(GatewayState::Stopping);
    end(&gw, outcome)
}

/// `run --preflight`: could the next incarnation start here now, with these arguments, in
/// this environment? The dry run of [`startable::startable`], said on stdout (restart.rs);
/// exit 0 or 78. Writes nothing, takes no lock.
fn preflight(opts: &RunOptions) -> Outcome {
    let overrides = startable::Overrides {
        settings: settings::Overrides { listen: opts.listen.clone(), drain_timeout: opts.drain_timeout },
        inherit_listener: None,
        incarnation: String::new(),
    };
    match startable::startable(&opts.home.canonicalized(), &overrides, &startable::Purpose::Preflight) {
        Ok(_) => {
            restart::say(Ok(()));
            Outcome::new(ExitIntent::PlannedStop, "preflight: a gateway can start")
        }
        Err(e) => {
            restart::say(Err(&e.reason));
            Outcome::new(ExitIntent::FatalConfig, e.reason)
        }
    }
}

/// `run`'s part inside the runtime: the signal handlers and the listener, then [`serve`].
async fn listen_and_serve(app: Arc<App>, signals: std::io::Result<Signals>, opts: &ResolvedOptions) -> Outcome {
    let gw = &app.gw;
    // Installed first thing in `run`, so a signal during start-up is classified, not fatal.
    let signals = match signals {
        Ok(s) => s,
        Err(e) => return end(gw, startup_failed(gw, format!("cannot install signal handlers: {e}"))),
    };
    // A successor adopted its inherited listener while it prepared (startable.rs).
    let adopted = opts.adopted.lock().unwrap_or_else(|p| p.into_inner()).take();
    let bound = match adopted {
        Some(l) => Ok(l),
        None => tokio::task::block_in_place(|| http::bind(&opts.listen, BIND_PATIENCE)),
    };
    let std_listener = match bound {
        Ok(l) => l,
        Err(e) => return end(gw, startup_failed(gw, e)),
    };
    // Kept for a successor: while it holds a copy, the socket (and its backlog) outlives us.
    if let Ok(dup) = std_listener.try_clone() {
        gw.keep_listener(dup);
    }
    let listener = match tokio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => return end(gw, startup_failed(gw, format!("cannot listen on {}: {e}", opts.listen))),
    };
    serve(app, listener, signals, opts).await
}

/// A start-up refusal, recorded before it is returned (`gateway::record_refusal`).
fn refused(home: &Home, me: &Incarnation, supervisor: Supervisor, o: Outcome) -> Outcome {
    gateway::record_refusal(home, me, supervisor, i32::from(o.intent.code()), &o.reason);
    o
}

/// Kills what agent runs of a dead incarnation of this home left behind (a kill -9 of the
/// gateway does not reach its runs' process groups). Called with the lock held, so every other
/// incarnation of this home is dead; before the journal is recovered, so a re-run never races
/// its predecessor.
fn sweep_orphan_runs(gw: &Gateway) {
    let mine = run_tag(&gw.home, &gw.me.id);
    let prefix = mine.split(':').next().unwrap_or_default().to_owned() + ":";
    let killed = gatewarden_lifecycle::platform::kill_tagged(RUN_TAG, &|v| v.starts_with(&prefix) && v != mine);
    if !killed.is_empty() {
        warn!("killed {} process(es) left by agent runs of a previous incarnation: {killed:?}", killed.len());
        gw.record("orphan_runs_killed", json!({"pids": killed}));
    }
}

/// Removes the runs' scratch folders (`<home>/runs/<incarnation>/`, the exec backend's history
/// files): of `only` that incarnation (this one, at its end), else of every incarnation but a
/// live one (at start, with the lock held: what a killed predecessor left). Never through a
/// link (`remove_dir_all` does not follow them).
fn sweep_run_scratch(home: &Home, only: Option<&str>) {
    let runs = home.runs_dir();
    let Ok(entries) = std::fs::read_dir(&runs) else { return };
    for e in entries.flatten() {
        if only.is_some_and(|id| e.file_name() != id) {
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(e.path()) {
            warn!("cannot remove {}: {err}", e.path().display());
        }
    }
}

/// Builds the gateway of `home` as incarnation `me`, not yet started, from what the one answer
/// to "could a gateway start here now" proved loadable ([`startable::startable`]: config.toml
/// with the command line's overrides, the exposure rule, the secrets, the agent, the chat
/// adapters, the journal, telemetry, and a successor's inherited listener). Every failure is fatal
/// configuration (78). Takes no lock and writes no record: [`run`] does that, a test need not.
pub fn prepare(
    home: &Home,
    mut opts: RunOptions,
    me: Incarnation,
    detection: Detection,
) -> Result<(Arc<App>, ResolvedOptions), Outcome> {
    let overrides = settings::Overrides { listen: opts.listen.clone(), drain_timeout: opts.drain_timeout };
    let ask = startable::Overrides {
        settings: overrides.clone(),
        inherit_listener: opts.inherit_listener.clone(),
        incarnation: me.id.clone(),
    };
    let startable::Startable { settings, cluster, journal, telemetry, listener, .. } =
        startable::startable(home, &ask, &startable::Purpose::Run)
            .map_err(|e| Outcome::new(ExitIntent::FatalConfig, e.reason))?;
    let settings::Settings { config, secrets, agent, platforms } = settings;
    log::set_level(config.log_level);
    let journal = journal.ok_or_else(|| Outcome::new(ExitIntent::FatalConfig, "no journal was opened"))?;
    let platforms = Arc::new(platforms);
    let (wake, wakes) = intake::Wake::channel();
    let admins = commands::platform_admins(&config);
    // The pairing book lives where a successor reads it: the home's file, or with `[cluster]`
    // the shared store, which a standby promoted on another host reads (access/pairing.rs).
    let book = match &cluster {
        Some(_) => access::pairing::Keeper::store(Arc::clone(&journal)),
        None => {
            let book = access::pairing::Keeper::home(home.dir());
            // A damaged book is named now; the gateway still starts (its strangers pair anew,
            // and nothing is written over the file until it reads again).
            if let Err(e) = book.refresh() {
                error!("cannot read the pairing book: {e}");
            }
            book
        }
    };
    let gate = Arc::new(access::Gate::new(access::Policies::new(&config), book));
    let work = Arc::new(
        // The API token as resolved (written in config.toml, or from its variable or file).
        worker::Work::new(agent, journal, &config, secrets.api_token(), config.is_loopback_listen(), admins, wake)
            .with_hermes(hermes::Spec::from_config(&config.agent, home.dir()))
            .with_gate(gate),
    );
    work.metrics.seed_from_ledger(&home.ledger());
    if let Some(x) = telemetry {
        work.set_telemetry(Arc::new(x));
    }
    opts.listen = Some(config.listen.to_string());
    let drain_timeout = config.drain_timeout();
    let ep = Endpoint::for_home(home.dir());
    let gw = Arc::new(Gateway::new(home.clone(), me, detection, ep.display()));
    gw.set_drain_budget(drain_timeout);
    let app = Arc::new(App::new(gw, work, platforms, wakes));
    app.set_secrets(&secrets);
    // An inherited listener was adopted while the gateway prepared (startable.rs).
    let adopted = std::sync::Mutex::new(listener);
    let listen = config.listen.to_string();
    let resolved = ResolvedOptions { listen, drain_timeout, cluster, exe: None, adopted, opts };
    app.reload.begin(config, overrides);
    Ok((app, resolved))
}

/// The desired state (`gatewarden_lifecycle::desired`), with the lock held. A foreground `run`
/// without a sequence is the operator's own start and records `run` (on the `first` check);
/// everything else — `start`'s child, a successor, a systemd or launchd launch — carries out an
/// earlier request and exits before it is ready (planned stop, exit 0: no manager retries it)
/// when the operator stopped the gateway since.
fn obey_desired(gw: &Gateway, opts: &ResolvedOptions, first: bool) -> Result<(), Outcome> {
    use gatewarden_lifecycle::desired::{self, Starter, Want};
    // `external` (s6, runit, PM2) is started by the operator's own tooling, which `gatewarden
    // start` cannot drive; `supervise` passes a sequence. systemd and launchd obey.
    let operator = opts.desired_seq.is_none()
        && !opts.successor
        && matches!(gw.supervisor, Supervisor::None | Supervisor::Container | Supervisor::External);
    if operator && first {
        if let Err(e) = desired::record(gw.home.dir(), Want::Run, "cli run", false) {
            warn!("cannot record the desired state: {e}");
        }
        return Ok(());
    }
    let starter = opts.desired_seq.map_or(Starter::Resume, |basis| Starter::Carry { basis });
    desired::check(gw.home.dir(), starter).map(|_| ()).map_err(|r| not_starting(gw, opts, &r))
}

/// A start the desired state refused: recorded, told to systemd, and a clean exit.
fn not_starting(gw: &Gateway, opts: &ResolvedOptions, r: &gatewarden_lifecycle::desired::Refusal) -> Outcome {
    let by = match (opts.successor, opts.desired_seq) {
        (true, _) => "successor",
        (false, Some(_)) => "start",
        (false, None) => gw.supervisor.as_str(),
    };
    let mut v = r.json();
    v["by"] = json!(by);
    v["basis"] = json!(opts.desired_seq);
    gw.record("start_prevented", v);
    info!("not starting: {}", r.describe());
    // Under systemd a main process that exits before READY=1 is a failed start ("protocol"),
    // which Restart=on-failure repeats: this start ends cleanly instead, and says why.
    gw.notifier.send(&format!("READY=1\nSTATUS=not starting: {}", r.describe()));
    Outcome::new(ExitIntent::PlannedStop, format!("start prevented: {}", r.describe()))
}

/// Takes the lock, or the home from its current holder with `--replace`.
fn claim(gw: &Gateway, opts: &ResolvedOptions, signals: Option<&mut Signals>) -> Result<InstanceLock, Outcome> {
    let home = &gw.home;
    let acquired = match opts.successor {
        true => await_predecessor(gw, opts, opts.drain_timeout + SUCCESSOR_GRACE, signals)?,
        false => InstanceLock::acquire(&home.lock(), LOCK_PATIENCE),
    };
    match acquired {
        Ok(l) => Ok(l),
        Err(LockError::Held { .. }) if opts.replace => takeover::take_over(home, opts.takeover_timeout, &gw.ledger)
            .map_err(|e| Outcome::new(ExitIntent::FatalConfig, e)),
        Err(LockError::Held { .. }) => Err(Outcome::new(ExitIntent::FatalConfig, describe_holder(home))),
        Err(e) => Err(Outcome::new(ExitIntent::FatalConfig, e.to_string())),
    }
}

/// A successor waits for its predecessor's lock through the drain, looking at the desired state
/// between tries: a drain cancelled since the restart's sequence (`--desired-seq`;
/// `desired::Refusal::Cancelled`) keeps the predecessor, and this process stands down at once
/// instead of waiting out its patience. A stop or restart signal sent to it meanwhile ends the
/// wait (unexpected, as during any start-up).
fn await_predecessor(
    gw: &Gateway,
    opts: &ResolvedOptions,
    patience: Duration,
    mut signals: Option<&mut Signals>,
) -> Result<Result<InstanceLock, LockError>, Outcome> {
    use gatewarden_lifecycle::desired::{self, Refusal, Starter};
    let deadline = std::time::Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match InstanceLock::acquire(&gw.home.lock(), left.min(SUCCESSOR_LOOK)) {
            Err(LockError::Held { .. }) if !left.is_zero() => {}
            other => return Ok(other),
        }
        if let Some(basis) = opts.desired_seq
            && let Err(r @ Refusal::Cancelled(_)) = desired::check(gw.home.dir(), Starter::Carry { basis })
        {
            return Err(not_starting(gw, opts, &r));
        }
        if let Some(sig) = signals.as_deref_mut().and_then(Signals::take_ending) {
            let why = format!("{} while waiting for the predecessor's lock", sig.describe());
            return Err(Outcome::new(ExitIntent::Unexpected, why));
        }
    }
}

fn describe_holder(home: &Home) -> String {
    let who = match read_pid_record(&home.pid_file()).ok() {
        Some(r) => format!(
            "pid {}{}{}",
            r.pid,
            r.start_time.map(|t| format!(", start {t}")).unwrap_or_default(),
            r.started_at.map(|t| format!(", started {t}")).unwrap_or_default()
        ),
        None => "a process whose gateway.pid is not readable yet".into(),
    };
    format!(
        "another gateway already runs in {} ({who}); use `gatewarden stop` first or `gatewarden run --replace`",
        home.dir().display()
    )
}

/// Serves one prepared gateway ([`prepare`]) on `listener` until a classified cause ends it,
/// drains, and writes the exit records (the home lock, if any, is the caller's to release
/// after this returns). Every OS signal comes from `shutdown` (the installed handlers in
/// [`run`]; a channel in a test). Binds the control endpoint of the gateway's home.
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

pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    mut shutdown: impl Shutdown,
    opts: &ResolvedOptions,
) -> Outcome {
    let o = serve_until_classified(&app, listener, &mut shutdown, opts).await;
    end(&app.gw, o)
}

async fn serve_until_classified(
    app: &Arc<App>,
    listener: tokio::net::TcpListener,
    signals: &mut impl Shutdown,
    opts: &ResolvedOptions,
) -> Outcome {
    let gw = &app.gw;
    let (tx, mut rx) = mpsc::unbounded_channel::<Cause>();
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| opts.listen.clone());
    gw.set_listen(addr.clone());
    gw.set_causes(tx.clone());
    app.follow_wakes();
    // `[agent] hermes_home`: hermes's API server is ours to run until the drain is over.
    let hermes_child = app.work.hermes.clone().and_then(hermes::Child::start);
    if let Err(e) = control::bind(&Endpoint::for_home(gw.home.dir()), Arc::clone(app), tx.clone()) {
        return startup_failed(gw, e);
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

    // A signal that arrived during start-up ends it as unexpected, whatever markers say (D1,
    // #103191); a SIGHUP is a reload once running (the file may have changed after it was
    // read), and the signals that are only recorded are recorded.
    let mut reload_when_ready = None;
    loop {
        let early = tokio::select! { biased; s = signals.recv() => Some(s), () = std::future::ready(()) => None };
        let Some(sig) = early else { break };
        match sig.kind.action() {
            Action::Reload => reload_when_ready = Some(sig),
            Action::Ignore => ignored(gw, &sig),
            Action::End | Action::Restart => {
                // A stop the operator recorded since this start was asked for sent it (a `stop`
                // right after a `start`): this start is prevented, with that stop's requester,
                // not a crash.
                if let Err(o) = obey_desired(gw, opts, false) {
                    return prevented(gw, o);
                }
                return startup_failed_with(gw, ExitIntent::Unexpected, format!("{} during start-up", sig.describe()));
            }
        }
    }
    // Chat platforms: after the lock is held, before `running` (each behind its credential lock);
    // with `[cluster]` on promotion only (platforms.rs).
    let platforms = Arc::clone(&app.platforms);
    if opts.cluster.is_some() {
        platforms.standby_all(gw);
    } else {
        let started = {
            let gw = Arc::clone(gw);
            let p = Arc::clone(&platforms);
            tokio::task::spawn_blocking(move || p.start(&gw)).await
        };
        match started {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return startup_failed(gw, e),
            Err(e) => return startup_failed(gw, format!("cannot start the chat platform adapters: {e}")),
        }
    }
    // Again just before `running`: a stop recorded during the start-up wins without a signal.
    if let Err(o) = obey_desired(gw, opts, false) {
        return prevented(gw, o);
    }
    // Queued before `running`: the first reply after a restart must already carry the notice.
    app.work.boot_notices(gw, !platforms.is_empty());
    gw.become_ready(json!({"listen": addr, "control": gw.control}));
    platforms.watchdog(Arc::clone(gw));
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
    match &opts.cluster {
        // The worker starts when this gateway becomes the active (cluster.rs).
        Some(c) => {
            if let Err(e) = cluster::start(app, c) {
                return startup_failed(gw, e);
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

    let decision = loop {
        let decision = loop {
            let cause = tokio::select! {
                s = signals.recv() => Cause::Signal(s),
                Some(c) = rx.recv() => c,
            };
            let Some(cause) = in_place(app, cause).await else { continue };
            match classify(gw, cause, &tx) {
                Classified::Keep => {}
                Classified::Exit(o) => {
                    gw.commit(&o);
                    break o;
                }
                Classified::Restart(ask) => {
                    // Nothing stops before the next incarnation is proven to run (restart.rs).
                    match restart::begin(app, opts, ask).await {
                        Some(o) => {
                            gw.commit(&o);
                            break o;
                        }
                        // Refused, or it could not start: the next request is taken on afresh.
                        None => gw.stand_down(),
                    }
                }
            }
        };
        app.work.notices.set_restarting(decision.intent == ExitIntent::PlannedRestart);
        info!("stopping: {}", decision.reason);
        let budget = match decision.owner_stop {
            true => drain::Budget::owner_stop(opts.drain_timeout),
            false => drain::Budget::configured(opts.drain_timeout),
        };
        match drain(app, signals, &mut rx, opts, decision.intent, budget).await {
            Drained::Over => break decision,
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
    };
    // Restart requests taken on before the decision whose causes the drain did not read.
    while let Ok(c) = rx.try_recv() {
        if let Cause::Control { kind: ControlKind::Restart, requester, asker } = c {
            let answer = gw.record_superseded_restart(&requester);
            app.tell(asker, Ok(answer.reply()));
        }
    }
    if let Some(h) = hermes_child {
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
    decision
}

/// What the main loop does with a cause.
enum Classified {
    Keep,
    Exit(Outcome),
    /// A restart someone asked for; [`restart::begin`] proves the next incarnation first.
    Restart(restart::Ask),
}

/// Maps a cause to an exit decision, a restart to attempt, or nothing (keep running).
fn classify(gw: &Gateway, cause: Cause, tx: &mpsc::UnboundedSender<Cause>) -> Classified {
    let me = gw.self_identity();
    let exit = Classified::Exit;
    match cause {
        Cause::Signal(sig) => match sig.kind {
            SignalKind::Terminate => {
                if let Some(m) = marker::consume(gw.home.dir(), MarkerKind::Takeover, &me, probe_u32) {
                    stop_requested(gw, Some(&m), Some(&sig), "signal", "takeover");
                    return exit(Outcome::new(ExitIntent::Takeover, format!("replaced by {} (SIGTERM)", m.writer())));
                }
                if let Some(m) = marker::consume(gw.home.dir(), MarkerKind::PlannedStop, &me, probe_u32) {
                    stop_requested(gw, Some(&m), Some(&sig), "signal", "stop");
                    return exit(Outcome::new(
                        ExitIntent::PlannedStop,
                        format!("planned stop requested by {} (SIGTERM)", m.writer()),
                    ));
                }
                // The sender against our parent, read now: the owner's stop comes from the owner.
                let parent = gatewarden_lifecycle::platform::parent_pid(std::process::id());
                match gw.supervisor.bare_sigterm(sig.term_sender(parent)) {
                    // The container runtime's stop (or a declared supervisor's): planned, drained
                    // within the owner's grace, and not the operator's durable `stopped`.
                    BareTerm::OwnerStop { by } => {
                        let mut fields = json!({"requester": sig.requester(), "reason": "owner_stop", "by": by});
                        fields["signal"] = sig.requester();
                        gw.record("stop_requested", fields);
                        let mut o =
                            Outcome::new(ExitIntent::PlannedStop, format!("stopped by the {by} ({})", sig.describe()));
                        o.owner_stop = true;
                        exit(o)
                    }
                    BareTerm::Unexpected => exit(unannounced(
                        gw,
                        &sig,
                        "no planned-stop marker names this gateway, and its owner did not send it",
                    )),
                }
            }
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
            // Handled before classification ([`in_place`]).
            SignalKind::Reload | SignalKind::User2 | SignalKind::Pipe => Classified::Keep,
        },
        Cause::Reload { reply, .. } => {
            // Handled before classification; answered in case one gets here.
            if let Some(r) = reply {
                let _ = r.send(Response::err("not_running", "the gateway is not running"));
            }
            Classified::Keep
        }
        Cause::Control { kind, requester, asker } => {
            let who = requester.describe();
            exit(match kind {
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
        Cause::Fatal(reason) => {
            error!("{reason}");
            exit(Outcome::new(ExitIntent::FatalConfig, reason))
        }
        Cause::CancelDrain { reply, .. } => {
            let _ =
                reply.send(Response::err("not_draining", "nothing to cancel: the gateway is running, not draining"));
            Classified::Keep
        }
        Cause::MarkerChanged => {
            for (kind, intent) in
                [(MarkerKind::Takeover, ExitIntent::Takeover), (MarkerKind::PlannedStop, ExitIntent::PlannedStop)]
            {
                match marker::probe(gw.home.dir(), kind, Some(&me), probe_u32) {
                    Verdict::ForSelf(_) => {
                        if let Some(m) = marker::consume(gw.home.dir(), kind, &me, probe_u32) {
                            let reason = if kind == MarkerKind::Takeover { "takeover" } else { "stop" };
                            stop_requested(gw, Some(&m), None, "marker", reason);
                            return exit(Outcome::new(
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
    }
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

/// How a drain ended.
enum Drained {
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
async fn drain(
    app: &App,
    signals: &mut impl Shutdown,
    rx: &mut mpsc::UnboundedReceiver<Cause>,
    opts: &ResolvedOptions,
    intent: ExitIntent,
    budget: drain::Budget,
) -> Drained {
    let gw = &app.gw;
    let timeout = budget.runs;
    app.work.notices.reset_for_drain();
    // Chat platforms stop receiving first: what arrives from now on stays with the platform for
    // the successor (no poll of ours lingers to fight its first one).
    let platforms = Arc::clone(&app.platforms);
    if !platforms.is_empty() {
        let p = Arc::clone(&platforms);
        let _ = tokio::task::spawn_blocking(move || p.stop_intake()).await;
    }
    if !gw.advance(GatewayState::Draining) {
        return Drained::Over;
    }
    let t0 = std::time::Instant::now();
    let at_start = gw.runs.active();
    gw.set_drain(at_start, SystemTime::now() + timeout);
    let runs = Arc::clone(&gw.runs);
    let extend = {
        let n = gw.notifier.clone();
        let until = tokio::time::Instant::now() + timeout;
        async move {
            // Keep systemd's stop timeout ahead of the drain budget.
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                n.send(&format!("EXTEND_TIMEOUT_USEC={}", (left + Duration::from_secs(15)).as_micros()));
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    let mut facts = drain::CancelFacts {
        restart: intent == ExitIntent::PlannedRestart,
        cluster: opts.cluster.is_some(),
        systemd: gw.notifier.enabled(),
        terminated: false,
    };
    let mut deferred = Vec::new();
    let idle = runs.wait_idle(timeout);
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
                    return Drained::Cancelled { requester, reply, deferred };
                }
            },
            idle = &mut idle => {
                if !idle {
                    warn!("drain timed out after {timeout:?} with {} active run(s)", gw.runs.active());
                }
                break;
            }
            sig = signals.recv() => match sig.kind {
                SignalKind::Interrupt => {
                    warn!("second interrupt: not waiting for {} active run(s)", gw.runs.active());
                    break;
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
                        Ok(()) => return Drained::Cancelled { requester, reply, deferred },
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
                    app.tell(asker, Ok(answer.reply()));
                }
                other => deferred.push(other),
            },
        }
    }
    let interrupted = gw.runs.active();
    if interrupted > 0 {
        // Cancelled runs clean up (an exec backend kills its process group) before we go on;
        // interrupted async runs stay `running` in the journal for the next incarnation.
        app.work.cancel_all();
        if !gw.runs.wait_idle(budget.cancel_grace).await {
            warn!("{} run(s) did not finish cleaning up within {:?}", gw.runs.active(), budget.cancel_grace);
        }
    }
    if !platforms.is_empty() {
        // Replies of the runs that finished go out; what does not make it stays in the outbox.
        let flush = platforms::Platforms::flush_budget(timeout.saturating_sub(t0.elapsed()));
        let deadline = std::time::Instant::now() + budget.flush.map_or(flush, |cap| flush.min(cap));
        let _ = tokio::task::spawn_blocking(move || platforms.close(deadline)).await;
    }
    gw.record(
        "drained",
        json!({"duration_ms": t0.elapsed().as_millis() as u64, "runs_at_start": at_start, "interrupted": interrupted}),
    );
    Drained::Over
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
async fn run_on(app: &Arc<App>, requester: Requester, reply: tokio::sync::oneshot::Sender<Response>) {
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

fn startup_failed(gw: &Gateway, reason: String) -> Outcome {
    startup_failed_with(gw, ExitIntent::FatalConfig, reason)
}

/// A start the desired state prevented once it had begun (`start_prevented` is recorded by
/// [`not_starting`]): a planned stop, not a refusal.
fn prevented(gw: &Gateway, o: Outcome) -> Outcome {
    gw.advance(GatewayState::Stopping);
    o
}

fn startup_failed_with(gw: &Gateway, intent: ExitIntent, reason: String) -> Outcome {
    gw.record("start_refused", json!({"code": intent.code(), "reason": reason}));
    gw.advance(GatewayState::Stopping);
    Outcome::new(intent, reason)
}

/// The exit funnel: final state, ledger, records, control endpoint, intake
/// (`Gateway::finish`); the caller releases the lock after this.
fn end(gw: &Gateway, o: Outcome) -> Outcome {
    gw.finish(&o, || control::unbind(&Endpoint::for_home(gw.home.dir())));
    o
}
