//! `[agent] hermes_home`: the hermes gateway (and so its API server) as this gateway's child,
//! for `backend = "hermes"`.
//!
//! The supervise loop of crates/hermes (`Supervise`: spawn `hermes gateway run
//! --external-supervisor`, verified ready, restart after a crash with backoff, marker-first
//! stop) runs on its own thread from start-up to the end of the drain. Never a hermes CLI
//! verb.
//!
//! - A planned restart (or takeover) leaves hermes running, warm, for the successor
//!   ([`Child::leave`]): the drain already stopped its runs, and the successor re-runs them on
//!   it. Its identity goes to `<home>/hermes-child.json`; the successor adopts the hermes it
//!   names (uses it, stops it at its own stop, starts a supervised one once it is gone).
//! - Any other end of the gateway stops hermes, marker first, verified.
//! - While another process holds the hermes home's `gateway.lock` (a hermes the operator runs)
//!   no second one is started: its API server is used until it is gone, then ours starts. That
//!   one is never stopped by us.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::holder::{self, Finding};
use gatewarden_hermes::start::{self, Mode};
use gatewarden_hermes::stop::{self, StopOptions};
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_service::supervise::SupervisePolicy;

/// Between two looks at a lock someone else holds, and after a parked or failed supervise.
const PAUSE: Duration = Duration::from_millis(500);
const PARKED_PAUSE: Duration = Duration::from_secs(5);
/// The longest the end of the drain waits for hermes to stop (its own stop escalates to
/// SIGKILL well within it).
const STOP_WAIT: Duration = Duration::from_secs(30);

/// The gatewarden home's record of the hermes a planned restart left for the successor.
pub const LEFT_RECORD: &str = "hermes-child.json";

/// A hermes home and the program that runs its gateway.
#[derive(Debug, Clone)]
pub struct Spec {
    pub home: PathBuf,
    pub program: PathBuf,
    /// `<gatewarden home>/hermes-child.json`.
    pub left: PathBuf,
}

impl Spec {
    /// From `[agent]`: `hermes_home`, and `hermes_program` (else `GATEWARDEN_HERMES`, else
    /// `hermes` on `PATH`).
    pub fn from_config(c: &gatewarden_config::AgentConfig, gw_home: &std::path::Path) -> Option<Spec> {
        if c.backend != gatewarden_config::BackendKind::Hermes {
            return None;
        }
        let home = c.hermes_home.clone()?;
        let program = start::default_hermes(c.hermes_program.clone(), |k| std::env::var_os(k));
        Some(Spec { home, program, left: gw_home.join(LEFT_RECORD) })
    }
}

/// The supervising thread; [`Child::stop`] ends it.
pub struct Child {
    spec: Spec,
    stop: Arc<AtomicBool>,
    /// Set with `stop`: end supervising, but leave hermes running (a restart).
    leave: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Child {
    pub fn start(spec: Spec) -> Option<Child> {
        let (stop, leave) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let flags = (Arc::clone(&stop), Arc::clone(&leave));
        let s2 = spec.clone();
        let thread = std::thread::Builder::new()
            .name("hermes-supervise".into())
            .spawn(move || supervise(&s2, &flags.0, &flags.1));
        match thread {
            Ok(t) => Some(Child { spec, stop, leave, thread: Some(t) }),
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

impl Child {
    /// Stops supervising and leaves hermes running for the successor (recorded for it). The
    /// process exits right after: the thread is not waited for.
    pub fn leave(self) {
        record_left(&self.spec, &HermesHome::at(&self.spec.home));
        self.leave.store(true, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Records the hermes now holding `home` as left to the successor.
fn record_left(spec: &Spec, home: &HermesHome) {
    if let Finding::Held { identity, .. } = holder::find(home) {
        let rec = serde_json::json!({"pid": identity.pid, "start_time": identity.start_time});
        match gatewarden_lifecycle::fsio::write_json(&spec.left, &rec) {
            Ok(()) => crate::info!("hermes: pid {} left running for the successor", identity.pid),
            Err(e) => crate::warn!("hermes: cannot record pid {} for the successor: {e}", identity.pid),
        }
    }
}

/// The hermes a predecessor left us, if that is who holds the lock now.
fn left_to_us(spec: &Spec, holder: ProcessIdentity) -> bool {
    let rec: Option<serde_json::Value> = gatewarden_lifecycle::fsio::read_json(&spec.left).ok();
    rec.is_some_and(|v| {
        v["pid"].as_u64() == Some(u64::from(holder.pid)) && v["start_time"].as_u64() == Some(holder.start_time)
    })
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

fn supervise(spec: &Spec, stop: &AtomicBool, leave: &AtomicBool) {
    let home = HermesHome::at(&spec.home);
    let mut told_busy = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match holder::find(&home) {
            Finding::Held { identity, .. } | Finding::Unproven { identity, holds_lock: true, .. } => {
                let ours = left_to_us(spec, identity);
                if !told_busy {
                    match ours {
                        true => crate::info!(
                            "hermes: adopting pid {}, left running by the previous incarnation",
                            identity.pid
                        ),
                        false => crate::info!(
                            "hermes: pid {} runs in {}; using it until it stops",
                            identity.pid,
                            home.display()
                        ),
                    }
                    told_busy = true;
                }
                if pause(stop, PAUSE) {
                    if ours && !leave.load(Ordering::SeqCst) {
                        let _ = stop::stop_identity(&home, identity, &StopOptions::default());
                        let _ = gatewarden_lifecycle::fsio::remove_if_exists(&spec.left);
                    }
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
            Finding::Free | Finding::Unproven { holds_lock: false, .. } => {
                if told_busy {
                    let _ = gatewarden_lifecycle::fsio::remove_if_exists(&spec.left);
                }
                told_busy = false;
            }
        }
        let (h, program) = (home.clone(), spec.program.clone());
        let sup = Supervise {
            home: home.clone(),
            command: Box::new(move || {
                let mut cmd = start::command(&h, &program, Mode::Supervised);
                // Not one of our runs: the next incarnation's sweep must not take it for one.
                cmd.env_remove(crate::options::RUN_TAG);
                cmd
            }),
            policy: SupervisePolicy::default(),
            stop: StopOptions::default(),
        };
        // `Supervise` stops its child when its flag is set: leaving hermes for a successor
        // needs a flag of its own that only a real stop sets.
        let (sup_stop, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let end = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) && !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                // Leaving (a restart): the child keeps running; the process exits soon.
                if !done.load(Ordering::SeqCst) && !leave.load(Ordering::SeqCst) {
                    sup_stop.store(true, Ordering::SeqCst);
                }
            });
            let end = sup.run(&sup_stop, |ev| match ev {
                Event::Spawned { pid } => crate::info!("hermes: started pid {pid} in {}", home.display()),
                Event::Ready { pid, .. } => crate::info!("hermes: pid {pid} ready"),
                Event::Exited { pid, facts, action } => {
                    crate::info!("hermes: pid {pid} exited ({:?}); {:?}", facts.exit, action)
                }
            });
            done.store(true, Ordering::SeqCst);
            end
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
