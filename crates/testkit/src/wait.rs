use std::time::{Duration, Instant};

/// Polls `cond` (every ~5 ms, backing off to 25 ms) until it returns true or `timeout` elapses.
/// Returns whether it became true. The condition is always evaluated at least once, and once
/// more after the deadline, so a slow last poll cannot lose a true result.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return cond();
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// [`wait_until`] that panics with `what` on timeout.
#[track_caller]
pub fn must_wait_until(timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
    if !wait_until(timeout, cond) {
        panic!("timed out after {timeout:?} waiting for: {what}");
    }
}

/// Checks that `cond` stays true for the whole `duration` (polled every ~20 ms). Returns
/// `Err(elapsed)` at the first poll where it is false. Used for "keeps running" assertions;
/// prefer pairing it with a positive event (marker removed, ledger entry) so the absence check
/// is anchored to something the gateway demonstrably did.
pub fn holds_for(duration: Duration, mut cond: impl FnMut() -> bool) -> Result<(), Duration> {
    let start = Instant::now();
    loop {
        if !cond() {
            return Err(start.elapsed());
        }
        if start.elapsed() >= duration {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
