//! Filling a [`Snapshot`] from a home's files: the one call the runtime (or a fleet view
//! reading homes it does not run) makes. Every read goes through the lifecycle crate's
//! hostile-file rules (no links, no FIFOs, capped sizes); a file that cannot be read leaves its
//! part of the snapshot empty, and the page says so.

use std::time::SystemTime;

use gatewarden_control::proto::StatusReport;
use gatewarden_lifecycle::lock::{self, InstanceLock, LockProbe};
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, desired, ledger, timefmt};

use crate::snapshot::{LockView, Snapshot};

/// Ledger lines read for a page: enough for the last 50 incarnations at ~20 lines each, and
/// a bounded read however big the file (`ledger::MAX_TAIL_BYTES`).
pub const LEDGER_LINES: usize = 2000;

/// The snapshot of `home` around `status` (the caller's `StatusReport`: the running gateway's
/// own, or `status --json`'s), at `now`. The runtime adds runs, queue, log tail and the rest.
pub fn from_home(home: &Home, status: StatusReport, now: SystemTime) -> Snapshot {
    Snapshot {
        status,
        ledger: ledger::read_tail(&home.ledger(), Some(LEDGER_LINES)).ok().unwrap_or_default(),
        desired: desired::read(home.dir()).ok(),
        lock: lock_view(home),
        state_file: read_state(&home.state_file()).ok(),
        now_us: timefmt::to_micros(now),
        ..Snapshot::default()
    }
}

/// What the OS lock says: the kernel's holder where it names one (Linux `/proc/locks`),
/// otherwise a probe (which holds a free lock for an instant, as `status` does).
pub fn lock_view(home: &Home) -> LockView {
    match lock::holder_pids(&home.lock()) {
        Some(pids) if !pids.is_empty() => LockView::Held { pid: pids.first().copied() },
        Some(_) => LockView::Free,
        None => match InstanceLock::probe(&home.lock()) {
            LockProbe::Held => LockView::Held { pid: None },
            LockProbe::Free(_) | LockProbe::Missing => LockView::Free,
            LockProbe::Error(_) => LockView::Unknown,
        },
    }
}
