//! The drain: active-run accounting and the phase machine
//! `starting → running → draining → stopping → stopped`, published on a watch channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gatewarden_lifecycle::records::GatewayState;
use tokio::sync::{Notify, watch};

/// How long cancelled runs get to clean up after the drain budget is spent (the drain in
/// lib.rs, and the HTTP server's own leftovers in http/serve.rs).
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Whether `from → to` is a legal step. Startup may abort straight to stopping.
pub fn allowed(from: GatewayState, to: GatewayState) -> bool {
    use GatewayState::*;
    matches!(
        (from, to),
        (Starting, Running)
            | (Starting, Stopping)
            | (Running, Draining)
            | (Draining, Stopping)
            | (Running, Stopping)
            | (Stopping, Stopped)
    )
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
    use GatewayState::*;

    #[test]
    fn only_forward_steps() {
        let p = Phase::new();
        assert!(!p.advance(Draining));
        assert!(p.advance(Running));
        assert!(!p.advance(Starting));
        assert!(p.advance(Draining));
        assert!(!p.advance(Running));
        assert!(p.advance(Stopping));
        assert!(p.advance(Stopped));
        assert!(!p.advance(Running));
        assert_eq!(p.get(), Stopped);
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
