//! The drain: active-run accounting, the phase machine
//! `starting → running → draining → stopping → stopped` (and `draining → running` when a
//! restart's drain is cancelled), published on a watch channel, and whether a drain may be
//! cancelled ([`may_cancel`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gatewarden_lifecycle::records::GatewayState;
use tokio::sync::{Notify, watch};

/// How long cancelled runs get to clean up after the drain budget is spent (the drain in
/// main_loop/draining.rs, and the HTTP server's own leftovers in http/serve.rs).
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The whole exit after the owner's SIGTERM (a container runtime, a declared supervisor:
/// `Supervisor::bare_sigterm`), from the signal to the exit: below Docker's default 10 s grace
/// (`docker stop -t`), far below Kubernetes' 30 s (`terminationGracePeriodSeconds`), so the
/// owner never has to SIGKILL a draining gateway.
pub const OWNER_STOP_BUDGET: Duration = Duration::from_secs(8);

/// How long each part of a drain may take ([`Budget::worst_case`] adds them up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Waiting for active runs (`drain_timeout`).
    pub runs: Duration,
    /// For runs cancelled after that to clean up (an exec backend's process group is killed).
    pub cancel_grace: Duration,
    /// The chat adapters' outbox flush at most; `None`: what is left of `runs`, within
    /// the platforms' own bounds (runtime/src/platforms.rs, `flush_budget`).
    pub flush: Option<Duration>,
}

impl Budget {
    /// A stop or restart asked for through gatewarden (or SIGINT): the configured drain.
    pub fn configured(drain_timeout: Duration) -> Budget {
        Budget { runs: drain_timeout, cancel_grace: CANCEL_GRACE, flush: None }
    }

    /// The owner's stop: its parts add up to [`OWNER_STOP_BUDGET`] with the HTTP wind-down
    /// (runs 3 s at most, 1 s to clean up, 2 s of outbox flush, 2 s for open connections).
    pub fn owner_stop(drain_timeout: Duration) -> Budget {
        Budget {
            runs: drain_timeout.min(Duration::from_secs(3)),
            cancel_grace: Duration::from_secs(1),
            flush: Some(Duration::from_secs(2)),
        }
    }
}

/// Whether `from → to` is a legal step. Startup may abort straight to stopping.
pub fn allowed(from: GatewayState, to: GatewayState) -> bool {
    use GatewayState::*;
    matches!(
        (from, to),
        (Starting, Running)
            | (Starting, Stopping)
            | (Running, Draining)
            | (Draining, Stopping)
            | (Draining, Running)
            | (Running, Stopping)
            | (Stopping, Stopped)
    )
}

/// What decides whether the drain under way may be cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelFacts {
    /// The drain ends in a planned restart (a stop's requester waits for the exit).
    pub restart: bool,
    /// `[cluster]`: the lease goes to a standby after the drain.
    pub cluster: bool,
    /// systemd was told `STOPPING=1`, which it cannot be told to take back.
    pub systemd: bool,
    /// A SIGTERM arrived during the drain: whoever sent it waits for the exit.
    pub terminated: bool,
}

/// Why a drain cannot be cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCancellable {
    NotARestart,
    Cluster,
    Systemd,
    Terminated,
}

impl NotCancellable {
    pub fn describe(self) -> &'static str {
        match self {
            NotCancellable::NotARestart => {
                "only a restart's drain can be cancelled; this one ends the gateway (a stop or a takeover), and its requester waits for the exit"
            }
            NotCancellable::Cluster => "a cluster member's drain hands the lease to a standby; it cannot be cancelled",
            NotCancellable::Systemd => {
                "systemd was told the unit is stopping (STOPPING=1) and cannot be told otherwise; it restarts the unit"
            }
            NotCancellable::Terminated => "a SIGTERM arrived during the drain; whoever sent it waits for the exit",
        }
    }
}

/// The one rule: a drain may be cancelled only when nobody but the restart waits for its end.
pub fn may_cancel(f: CancelFacts) -> Result<(), NotCancellable> {
    match f {
        CancelFacts { restart: false, .. } => Err(NotCancellable::NotARestart),
        CancelFacts { terminated: true, .. } => Err(NotCancellable::Terminated),
        CancelFacts { systemd: true, .. } => Err(NotCancellable::Systemd),
        CancelFacts { cluster: true, .. } => Err(NotCancellable::Cluster),
        CancelFacts { .. } => Ok(()),
    }
}

/// Counts runs in flight and wakes the drain when the count reaches zero.
#[derive(Debug, Default)]
pub struct Runs {
    active: AtomicU64,
    idle: Notify,
}

/// Held for the duration of one run; dropping it ends the run.
#[derive(Debug)]
pub struct RunGuard(Arc<Runs>);

impl Drop for RunGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Runs {
    pub fn begin(self: &Arc<Self>) -> RunGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        RunGuard(Arc::clone(self))
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Waits until no run is active, at most `timeout`. Returns whether it became idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.active() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

/// The published phase.
#[derive(Debug, Clone)]
pub struct Phase {
    tx: watch::Sender<GatewayState>,
}

impl Phase {
    pub fn new() -> Phase {
        Phase { tx: watch::Sender::new(GatewayState::Starting) }
    }

    pub fn get(&self) -> GatewayState {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<GatewayState> {
        self.tx.subscribe()
    }

    /// Moves to `to` if legal; returns whether it moved.
    pub fn advance(&self, to: GatewayState) -> bool {
        self.tx.send_if_modified(|cur| {
            if allowed(*cur, to) {
                *cur = to;
                true
            } else {
                false
            }
        })
    }
}

impl Default for Phase {
    fn default() -> Self {
        Phase::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner's stop fits its budget with every part at its longest, whatever
    /// `drain_timeout_s` says: drain, clean-up, flush, and the HTTP server's graceful stop.
    #[test]
    fn the_owners_stop_fits_dockers_grace() {
        for configured in [0, 1, 3, 30, 3600] {
            let b = Budget::owner_stop(Duration::from_secs(configured));
            let flush = b.flush.expect("a bounded flush");
            let worst = b.runs + b.cancel_grace + flush + crate::http::serve::STOP_GRACE;
            assert!(worst <= OWNER_STOP_BUDGET, "{configured} s: {worst:?}");
            assert!(b.runs <= Duration::from_secs(configured), "never longer than configured");
        }
        assert!(OWNER_STOP_BUDGET < Duration::from_secs(10), "Docker's default grace");
        assert_eq!(Budget::configured(Duration::from_secs(30)).runs, Duration::from_secs(30));
    }
    use GatewayState::*;

    #[test]
    fn only_forward_steps() {
        let p = Phase::new();
        assert!(!p.advance(Draining));
        assert!(p.advance(Running));
        assert!(!p.advance(Starting));
        assert!(p.advance(Draining));
        assert!(p.advance(Running), "a cancelled drain runs on");
        assert!(p.advance(Draining));
        assert!(p.advance(Stopping));
        assert!(!p.advance(Running));
        assert!(p.advance(Stopped));
        assert!(!p.advance(Running));
        assert_eq!(p.get(), Stopped);
    }

    #[test]
    fn only_a_restart_that_nobody_else_waits_for_is_cancelled() {
        let ok = CancelFacts { restart: true, cluster: false, systemd: false, terminated: false };
        assert_eq!(may_cancel(ok), Ok(()));
        let cases = [
            (CancelFacts { restart: false, ..ok }, NotCancellable::NotARestart),
            (CancelFacts { terminated: true, ..ok }, NotCancellable::Terminated),
            (CancelFacts { systemd: true, ..ok }, NotCancellable::Systemd),
            (CancelFacts { cluster: true, ..ok }, NotCancellable::Cluster),
        ];
        for (f, why) in cases {
            assert_eq!(may_cancel(f), Err(why), "{f:?}");
            assert!(!why.describe().is_empty());
        }
    }

    #[tokio::test]
    async fn wait_idle_wakes_on_last_run() {
        let runs = Arc::new(Runs::default());
        let g1 = runs.begin();
        let g2 = runs.begin();
        assert!(!runs.wait_idle(Duration::from_millis(20)).await);
        let r2 = Arc::clone(&runs);
        let waiter = tokio::spawn(async move { r2.wait_idle(Duration::from_secs(10)).await });
        drop(g1);
        drop(g2);
        assert!(waiter.await.unwrap());
        assert_eq!(runs.active(), 0);
    }
}
