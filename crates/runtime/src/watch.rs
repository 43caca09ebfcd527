//! Event-driven marker watch: the home directory is watched (inotify, kqueue/FSEvents,
//! ReadDirectoryChangesW) and every change to a marker file wakes the main loop, which then
//! runs the read-only marker probe. If the OS watch cannot be set up, a 1 s poll takes over.

use std::path::Path;
use std::time::Duration;

use gatewarden_lifecycle::marker::MarkerKind;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use crate::cause::Cause;

/// Keeps the OS watch alive; dropping it stops watching.
pub enum MarkerWatch {
    Os(#[allow(dead_code)] notify::RecommendedWatcher),
    Poll(tokio::task::JoinHandle<()>),
}

impl Drop for MarkerWatch {
    fn drop(&mut self) {
        if let MarkerWatch::Poll(h) = self {
            h.abort();
        }
    }
}

fn is_marker(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == MarkerKind::PlannedStop.file_name() || n == MarkerKind::Takeover.file_name())
}

pub fn start(home: &Path, tx: UnboundedSender<Cause>) -> MarkerWatch {
    let os_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res
            && ev.paths.iter().any(|p| is_marker(p))
        {
            let _ = os_tx.send(Cause::MarkerChanged);
        }
    })
    .and_then(|mut w| w.watch(home, RecursiveMode::NonRecursive).map(|()| w));
    match watcher {
        Ok(w) => MarkerWatch::Os(w),
        Err(e) => {
            crate::warn!("cannot watch {} for stop markers ({e}); polling every second instead", home.display());
            MarkerWatch::Poll(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    if tx.send(Cause::MarkerChanged).is_err() {
                        return;
                    }
                }
            }))
        }
    }
}

/// How long to wait before looking again at a marker that could not be read for lack of
/// resources (see `Verdict::Retry` in crates/lifecycle/src/marker.rs).
const RECHECK_AFTER: Duration = Duration::from_millis(250);

/// Wakes the main loop again shortly, to re-probe a marker kept after a transient error.
pub fn recheck_later(tx: &UnboundedSender<Cause>) {
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(RECHECK_AFTER).await;
        let _ = tx.send(Cause::MarkerChanged);
    });
}
