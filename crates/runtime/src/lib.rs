//! The gatewarden gateway process.
//!
//! [`run`] is the whole life of one incarnation: claim the home (the OS lock, or a verified
//! takeover), publish records, build the async runtime, install the signal handlers, bind the
//! listener, and [`serve`]. [`serve`] is everything after that — HTTP and the control channel,
//! the main loop that classifies each shutdown cause, the drain, the exit records — on a
//! listener and a signal source it is given, so a test drives a whole gateway in one process
//! ([`prepare`] builds one from a home). The binary maps the reported [`ExitIntent`] to the
//! process exit code through the one table in `gatewarden_lifecycle::exit`.
//!
//! This file keeps the crate's surface and the order of a start; the steps live beside it:
//! `claim.rs` takes the home (the lock, the desired state, a dead incarnation's leftovers),
//! `main_loop/` is [`serve`] (start-up, classification, the drain, the wind-down), and
//! `worker/` runs the messages.

pub mod access;
pub mod app;
pub mod cause;
mod claim;
pub mod cluster;
pub mod commands;
pub mod control;
pub mod drain;
pub mod gateway;
pub mod hermes;
pub mod http;
pub mod intake;
pub mod log;
mod main_loop;
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

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::supervisor::Detection;
use gatewarden_lifecycle::{ExitIntent, Home, InstanceLock, Supervisor};

pub use crate::app::App;
pub use crate::cause::{Cause, ControlKind, Outcome, Reexec};
use crate::claim::{claim, obey_desired, publish_start, refused, sweep_run_scratch};
use crate::gateway::{Gateway, Incarnation};
pub use crate::main_loop::serve;
use crate::main_loop::{end, startup_failed};
pub use crate::options::{ClusterSettings, RUN_TAG, ResolvedOptions, RunOptions};
use crate::signals::Signals;

/// How long to retry binding a listen address that is in use.
const BIND_PATIENCE: Duration = Duration::from_secs(5);

/// As PID 1: how long a zombie child stays unreaped before it counts as an orphan nobody waits
/// for (our own waiters collect theirs within a second).
const ORPHAN_GRACE: Duration = Duration::from_secs(3);

/// Runs one incarnation to its end. Never panics on bad state; every failure is an outcome.
pub fn run(opts: RunOptions, started_at: SystemTime, started: Instant) -> Outcome {
    // A restart's preflight only answers and exits (restart.rs).
    if opts.preflight {
        return preflight(&opts);
    }
    // Before any thread exists: glibc gives each new thread its own arena until the bound is
    // set, and an arena keeps what was freed into it (README, "Benchmarks": 7 adapters held
    // four arenas when this ran inside `serve`).
    http::resources::tune_allocator();
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
    if let Err(o) = publish_start(&gw, &mut lock) {
        return o;
    }
    in_runtime(app, signals, &opts, lock)
}

/// Serves the prepared gateway on a 2-worker tokio runtime, then releases the `lock` and lets
/// the runtime go. A runtime that cannot be built ends the start here.
fn in_runtime(app: Arc<App>, signals: std::io::Result<Signals>, opts: &ResolvedOptions, lock: InstanceLock) -> Outcome {
    let gw = Arc::clone(&app.gw);
    let outcome = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => {
            let o = rt.block_on(listen_and_serve(app, signals, opts));
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
    work.set_transcriber(gatewarden_agent::Transcriber::from_config(&config.agent, &secrets));
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
