//! Process resources the HTTP listener depends on: the descriptor limit and the allocator.
//! One file per OS, one signature each:
//! - `raise_nofile() -> Option<u64>`: raises the soft descriptor limit to the hard one and
//!   returns the limit now in force (`None`: no such limit, e.g. Windows handles);
//! - `tune_allocator()`: bounds how much freed memory the allocator keeps per thread;
//! - `release_memory()`: hands freed memory back to the OS after a burst of connections.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub use imp::{raise_nofile, release_memory, tune_allocator};

/// Descriptors kept for everything but HTTP connections: the control socket and its clients,
/// the lock, ledger, state file, markers, the journal (SQLite and its WAL), the marker watch.
pub const RESERVED_FDS: u64 = 128;

/// The connection cap: the configured one, but never more than half of what the descriptor
/// limit leaves after [`RESERVED_FDS`] (the other half covers what a connection's request may
/// open: an exec agent run's pipes, a journal call).
pub fn connection_cap(configured: usize, nofile: Option<u64>) -> usize {
    let by_fds =
        nofile.map_or(usize::MAX, |n| usize::try_from(n.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX));
    configured.min(by_fds).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_leaves_descriptors_for_the_lifecycle() {
        assert_eq!(connection_cap(512, Some(1024)), 448);
        assert_eq!(connection_cap(512, Some(1 << 20)), 512);
        assert_eq!(connection_cap(512, None), 512);
        assert_eq!(connection_cap(512, Some(64)), 1);
    }
}
