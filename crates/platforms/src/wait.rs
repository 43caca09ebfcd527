//! A stop flag with an interruptible sleep, shared by an adapter's threads.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Flags an adapter's threads wait on: `stop` ends intake, `close` ends sending, `wake` says
/// the outbox has something, `kick` asks the receiver to reconnect.
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
