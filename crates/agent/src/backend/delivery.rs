//! Whether any of a run's reply has reached the chat or HTTP caller yet (issue 27 §6): until it
//! has, a provider failing mid-stream is retried and failed over like a refused connection, and
//! the pieces it had streamed are dropped on their way; after it, the run ends with the notice
//! (another provider's answer cannot be appended to what the caller has seen).
//!
//! One [`Delivery`] per run, shared by the backend (through a task-local [`scope`], like
//! `trace.rs`: the [`super::Agent`] trait stays as it is) and the consumer of its chunks (the
//! runtime's HTTP stream or chat preview). Chunks are counted as the backend sends them and as
//! the consumer takes them off the channel, in the same order: [`Delivery::retract`] marks every
//! chunk sent so far stale, and the consumer's [`Delivery::take`] tells it which to drop. Each
//! retract starts a new epoch; the consumer shows what it took only through
//! [`Delivery::reach`] with that chunk's epoch, which fails once a retract came in between. So
//! "reached" and "retracted" exclude each other: under one lock, whichever comes first wins.
//!
//! A run without a scope (a test calling a backend directly) has no consumer that could drop
//! stale pieces: its backend treats everything it passed on as seen.

use std::future::Future;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct State {
    /// Chunks the backend sent, and the consumer took.
    sent: u64,
    taken: u64,
    /// Chunks up to this count were sent before a retract: the consumer drops them.
    stale_until: u64,
    epoch: u64,
    /// Some of the reply reached the caller: no more retracts.
    reached: bool,
}

/// The reply's progress towards its caller (module doc).
#[derive(Debug, Clone, Default)]
pub struct Delivery(Arc<Mutex<State>>);

impl Delivery {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Backend: a chunk is being sent.
    fn sending(&self) {
        self.with(|s| s.sent += 1);
    }

    /// Backend: before starting the reply again elsewhere. `true`: nothing reached the caller,
    /// and every chunk sent so far will be dropped by the consumer; `false`: too late.
    pub fn retract(&self) -> bool {
        self.with(|s| {
            if s.reached {
                return false;
            }
            s.stale_until = s.sent;
            s.epoch += 1;
            true
        })
    }

    /// Consumer: a chunk was taken off the channel. `None`: it is stale, drop it; else the
    /// epoch to [`Delivery::reach`] with when showing it.
    pub fn take(&self) -> Option<u64> {
        self.with(|s| {
            s.taken += 1;
            (s.taken > s.stale_until).then_some(s.epoch)
        })
    }

    /// Consumer: about to show what it took in `epoch`. `false`: a retract came in between, drop
    /// it. Once this says `true`, no retract succeeds.
    pub fn reach(&self, epoch: u64) -> bool {
        self.with(|s| {
            if s.epoch != epoch {
                return false;
            }
            s.reached = true;
            true
        })
    }

    /// Whether some of the reply reached the caller.
    pub fn reached(&self) -> bool {
        self.with(|s| s.reached)
    }
}

tokio::task_local! {
    static DELIVERY: Delivery;
}

/// Runs `f` (a run) with `d` as its delivery.
pub async fn scope<F: Future>(d: Delivery, f: F) -> F::Output {
    DELIVERY.scope(d, f).await
}

/// Backend: counts a chunk sent in the current run's scope.
pub(crate) fn sending() {
    let _ = DELIVERY.try_with(Delivery::sending);
}

/// Backend: [`Delivery::retract`] for the current run; `false` outside a scope (module doc).
pub(crate) fn retract() -> bool {
    DELIVERY.try_with(Delivery::retract).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_sent_before_a_retract_are_dropped_and_a_reach_ends_retracts() {
        let d = Delivery::default();
        d.sending();
        d.sending();
        // The consumer took the first one but did not show it yet.
        let e = d.take().unwrap();
        assert!(d.retract(), "nothing reached the caller");
        assert!(!d.reach(e), "taken before the retract: stale");
        assert_eq!(d.take(), None, "sent before the retract: dropped");
        d.sending();
        let e = d.take().expect("sent after the retract");
        assert!(d.reach(e));
        assert!(d.reached());
        d.sending();
        assert!(!d.retract(), "part of the reply was shown");
        assert_eq!(d.take(), Some(e), "after a failed retract nothing is stale");
    }

    #[tokio::test]
    async fn outside_a_scope_nothing_can_be_retracted() {
        sending();
        assert!(!retract());
        let d = Delivery::default();
        assert!(scope(d.clone(), async { retract() }).await);
    }
}
