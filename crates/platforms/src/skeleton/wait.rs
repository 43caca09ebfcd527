//! An adapter's threads: the flags they wait on (with an interruptible sleep), how they are
//! started, and how a close waits for them.

use std::sync::{Arc, Condvar, Mutex, mpsc};

use crate::AdapterError;
use std::time::{Duration, Instant};

/// Flags an adapter's threads wait on: `stop` ends intake, `close` ends sending, `wake` says
/// the outbox has something, `kick` asks the receiver to reconnect, `hangup` (set once the
/// sender is done) ends a receive side that listens through the drain, `show` says a run's
/// activity came in (progress.rs).
#[derive(Debug, Default)]
pub struct Flags {
    m: Mutex<Bits>,
    cv: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Bits {
    pub stop: bool,
    pub close: bool,
    pub wake: bool,
    pub kick: bool,
    pub hangup: bool,
    pub show: bool,
}

impl Flags {
    fn lock(&self) -> std::sync::MutexGuard<'_, Bits> {
        self.m.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn update(&self, f: impl FnOnce(&mut Bits)) {
        f(&mut self.lock());
        self.cv.notify_all();
    }

    pub fn get(&self) -> Bits {
        *self.lock()
    }

    /// Takes the `wake` flag.
    pub fn take_wake(&self) -> bool {
        std::mem::take(&mut self.lock().wake)
    }

    /// Takes the `show` flag.
    pub fn take_show(&self) -> bool {
        std::mem::take(&mut self.lock().show)
    }

    /// Takes the `kick` flag.
    pub fn take_kick(&self) -> bool {
        std::mem::take(&mut self.lock().kick)
    }

    /// Sleeps up to `d`, returning early when `until` holds. Returns the flags at wake-up.
    pub fn sleep(&self, d: Duration, until: impl Fn(&Bits) -> bool) -> Bits {
        let deadline = Instant::now() + d;
        let mut g = self.lock();
        loop {
            if until(&g) {
                return *g;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return *g;
            }
            g = self.cv.wait_timeout(g, left).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// Starts one of adapter `name`'s threads; the receiver hears `()` when it has ended.
pub fn spawn(name: &str, what: &str, f: impl FnOnce() + Send + 'static) -> Result<mpsc::Receiver<()>, AdapterError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("gw-{name}-{what}"))
        .spawn(move || {
            f();
            let _ = tx.send(());
        })
        .map_err(|e| AdapterError::Start { name: name.to_owned(), message: format!("cannot start a thread: {e}") })?;
    Ok(rx)
}

/// An adapter's receiver and sender threads while started, with what they share.
pub struct Running<S> {
    pub shared: Arc<S>,
    pub recv_done: mpsc::Receiver<()>,
    pub send_done: mpsc::Receiver<()>,
}

/// Where an adapter keeps its [`Running`] threads: empty before `start` and after `close`.
pub struct Slot<S>(Mutex<Option<Running<S>>>);

impl<S> Default for Slot<S> {
    fn default() -> Self {
        Slot(Mutex::new(None))
    }
}

impl<S: AsRef<Flags>> Slot<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running<S>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, r: Running<S>) {
        *self.lock() = Some(r);
    }

    pub fn take(&self) -> Option<Running<S>> {
        self.lock().take()
    }

    /// Sets flags for the running threads (nothing when not started).
    pub fn signal(&self, f: impl FnOnce(&mut Bits)) {
        if let Some(r) = self.lock().as_ref() {
            r.shared.as_ref().as_ref().update(f);
        }
    }

    /// What the running threads share (`None` when not started).
    pub fn shared(&self) -> Option<Arc<S>> {
        self.lock().as_ref().map(|r| Arc::clone(&r.shared))
    }
}

/// Close, step 1: record the deadline the sender flushes against, then stop intake and sending.
pub fn begin_close(flags: &Flags, close_deadline: &Mutex<Option<Instant>>, deadline: Instant) {
    *close_deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
    flags.update(|b| {
        b.stop = true;
        b.close = true;
    });
}

/// Waits for a thread started by [`spawn`] until `deadline` plus `grace`; whether it ended.
pub fn ended_by(done: &mpsc::Receiver<()>, deadline: Instant, grace: Duration) -> bool {
    let left = deadline.saturating_duration_since(Instant::now()) + grace;
    !matches!(done.recv_timeout(left), Err(mpsc::RecvTimeoutError::Timeout))
}
