//! `[agent] hermes_home`: the hermes gateway (and so its API server) as this gateway's child,
//! for `backend = "hermes"`.
//!
//! The supervise loop of crates/hermes (`Supervise`: spawn `hermes gateway run
//! --external-supervisor`, verified ready, restart after a crash with backoff, marker-first
//! stop) runs on its own thread from start-up to the end of the drain. Never a hermes CLI
//! verb. While another process holds the home's `gateway.lock` (the previous incarnation's
//! hermes, still stopping during a restart hand-over, or a hermes the operator runs) no second
//! one is started: its API server is used until it is gone, then ours starts.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::holder::{self, Finding};
use gatewarden_hermes::start::{self, Mode};
use gatewarden_hermes::stop::StopOptions;
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_service::supervise::SupervisePolicy;

/// What a hermes child must not inherit from us: it would believe systemd supervises it, or
/// the next incarnation's sweep would take it for one of our runs.
const SCRUB: &[&str] = &[
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "XPC_SERVICE_NAME",
    "HERMES_GATEWAY_EXTERNAL_SUPERVISOR",
    "HERMES_S6_SUPERVISED_CHILD",
    crate::options::RUN_TAG,
];
/// Between two looks at a lock someone else holds, and after a parked or failed supervise.
const PAUSE: Duration = Duration::from_millis(500);
const PARKED_PAUSE: Duration = Duration::from_secs(5);
/// The longest the end of the drain waits for hermes to stop (its own stop escalates to
/// SIGKILL well within it).
const STOP_WAIT: Duration = Duration::from_secs(30);

/// A hermes home and the program that runs its gateway.
#[derive(Debug, Clone)]
pub struct Spec {
    pub home: PathBuf,
    pub program: PathBuf,
}

impl Spec {
    /// From `[agent]`: `hermes_home`, and `hermes_program` (else `GATEWARDEN_HERMES`, else
    /// `hermes` on `PATH`).
    pub fn from_config(c: &gatewarden_config::AgentConfig) -> Option<Spec> {
        if c.backend != gatewarden_config::BackendKind::Hermes {
            return None;
        }
        let home = c.hermes_home.clone()?;
        let program = start::default_hermes(c.hermes_program.clone(), |k| std::env::var_os(k));
        Some(Spec { home, program })
    }
}

/// The supervising thread; [`Child::stop`] ends it.
pub struct Child {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Child {
    pub fn start(spec: Spec) -> Option<Child> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("hermes-supervise".into()).spawn(move || supervise(&spec, &flag));
        match thread {
            Ok(t) => Some(Child { stop, thread: Some(t) }),
            Err(e) => {
                crate::error!("hermes: cannot start the supervising thread: {e}");
                None
            }
        }
    }

    /// Stops hermes (marker first, verified, SIGKILL past its budget) and waits, bounded.
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let Some(t) = self.thread.take() else { return };
        let joined = tokio::task::spawn_blocking(move || {
            let _ = t.join();
        });
        if tokio::time::timeout(STOP_WAIT, joined).await.is_err() {
            crate::warn!("hermes: still stopping after {STOP_WAIT:?}; leaving it");
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn pause(stop: &AtomicBool, d: Duration) -> bool {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.load(Ordering::SeqCst)
}

fn supervise(spec: &Spec, stop: &AtomicBool) {
    let home = HermesHome::at(&spec.home);
    let mut told_busy = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Someone else's hermes (or our predecessor's, stopping): use it, start none beside it.
        match holder::find(&home) {
            Finding::Held { identity, .. } | Finding::Unproven { identity, holds_lock: true, .. } => {
                if !told_busy {
                    crate::info!("hermes: pid {} runs in {}; using it until it stops", identity.pid, home.display());
                    told_busy = true;
                }
                if pause(stop, PAUSE) {
                    return;
                }
                continue;
            }
            Finding::Unknown(why) => {
                crate::warn!("hermes: cannot tell who holds {}: {why}", home.lock().display());
                if pause(stop, PARKED_PAUSE) {
                    return;
                }
                continue;
            }
            Finding::Free | Finding::Unproven { holds_lock: false, .. } => told_busy = false,
        }
        let (h, program) = (home.clone(), spec.program.clone());
        let sup = Supervise {
            home: home.clone(),
            command: Box::new(move || {
                let mut cmd = start::command(&h, &program, Mode::Supervised);
                for k in SCRUB {
                    cmd.env_remove(k);
                }
                cmd
            }),
            policy: SupervisePolicy::default(),
            stop: StopOptions::default(),
        };
        let end = sup.run(stop, |ev| match ev {
            Event::Spawned { pid } => crate::info!("hermes: started pid {pid} in {}", home.display()),
            Event::Ready { pid, .. } => crate::info!("hermes: pid {pid} ready"),
            Event::Exited { pid, facts, action } => {
                crate::info!("hermes: pid {pid} exited ({:?}); {:?}", facts.exit, action)
            }
        });
        match end {
            _ if stop.load(Ordering::SeqCst) => return,
            // Stopped by someone else (a planned stop): gatewarden owns it, so it runs again.
            Ok(End::StayedDown) => {}
            Ok(End::Parked { reason, .. }) => {
                crate::error!("hermes: not restarting for now: {reason}");
                if pause(stop, PARKED_PAUSE) {
                    return;
                }
            }
            Err(e) => {
                crate::error!("hermes: {e}");
                if pause(stop, PARKED_PAUSE) {
                    return;
                }
            }
        }
        if pause(stop, PAUSE) {
            return;
        }
    }
}
