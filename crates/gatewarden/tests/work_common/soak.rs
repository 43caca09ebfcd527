//! The platform restart soaks' shared parts (platform_*.rs `restarts_under_a_steady_stream_…`):
//! their parameters, a seeded steady stream of `msg N` messages, the restarts, and the count
//! of what was lost or answered twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::*;
use gatewarden_testkit::sweep::Sweeper;

/// `GW_PLATFORM_RESTARTS` (else `default_restarts`; CI runs the short form, scripts/soak-platforms
/// the long one) and the stream's seed, `GW_PLATFORM_SEED` (else the clock), printed for replay.
pub fn soak_params(default_restarts: u32) -> (u32, u64) {
    let restarts = std::env::var("GW_PLATFORM_RESTARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(default_restarts);
    let seed: u64 = std::env::var("GW_PLATFORM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {seed} (replay with GW_PLATFORM_SEED={seed}), {restarts} restarts");
    (restarts, seed)
}

/// A steady inbound stream on its own thread: `send(&mut sender, n)` for n = 0, 1, …, with
/// `min_ms` plus a seeded 0..`spread_ms` between messages (xorshift), until
/// [`SteadyStream::stop`] hands the sender back.
pub struct SteadyStream<S> {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU32>,
    thread: JoinHandle<S>,
}

pub fn steady_stream<S: Send + 'static, R>(
    seed: u64,
    min_ms: u64,
    spread_ms: u64,
    mut sender: S,
    send: impl Fn(&mut S, u32) -> R + Send + 'static,
) -> SteadyStream<S> {
    let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU32::new(0)));
    let thread = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        std::thread::spawn(move || {
            let mut x = seed | 1;
            while !stop.load(Ordering::Relaxed) {
                // What a send returns (a message id) is not the stream's concern.
                let _ = send(&mut sender, sent.fetch_add(1, Ordering::Relaxed));
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::thread::sleep(Duration::from_millis(min_ms + x % spread_ms));
            }
            sender
        })
    };
    SteadyStream { stop, sent, thread }
}

impl<S> SteadyStream<S> {
    /// How many were sent so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Ends the stream: how many were sent, and the sender back.
    pub fn stop(self) -> (u32, S) {
        self.stop.store(true, Ordering::Relaxed);
        let sender = self.thread.join().expect("the stream's thread");
        (self.sent.load(Ordering::Relaxed), sender)
    }
}

/// `count` restarts through the CLI, each of which must succeed.
pub fn restart_times(home: &TempHome, sw: &Sweeper, count: u32) {
    for i in 0..count {
        let out = crate::work_common::cli_tagged(home, sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
        assert!(out.code == Some(0), "restart {i} failed: {out:#?}");
    }
}

/// Of `msg 0` … `msg {total - 1}`: those never among the replies `texts`, and the texts
/// answered more than once.
pub fn lost_and_duplicated<'a>(
    total: u32,
    texts: impl IntoIterator<Item = &'a str>,
) -> (Vec<u32>, Vec<(String, usize)>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for t in texts {
        *seen.entry(t).or_default() += 1;
    }
    let lost = (0..total).filter(|n| !seen.contains_key(format!("msg {n}").as_str())).collect();
    let mut dup: Vec<(String, usize)> =
        seen.into_iter().filter(|(_, c)| *c > 1).map(|(t, c)| (t.to_owned(), c)).collect();
    dup.sort();
    (lost, dup)
}
