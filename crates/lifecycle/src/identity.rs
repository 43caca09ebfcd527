//! Process identity: `(pid, start_time)`, the PID-reuse guard.

use serde::{Deserialize, Serialize};

use crate::liveness::Liveness;

/// A process incarnation. Two identities are the same process only if both fields are equal;
/// the start time's unit is per OS (see docs/protocol.md §2) and is never converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
}

/// What a re-check of a recorded identity found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityCheck {
    /// The same process is alive.
    Same,
    /// Nothing with that pid is alive (or it is a zombie).
    Gone,
    /// The pid is alive but is another process (recycled pid).
    Different { start_time: u64 },
    /// The pid is alive but its start time cannot be read: never signal it.
    Unverifiable(String),
}

// `current()` and `check()` ask the OS: they live with the facade (crates/lifecycle/src/platform),
// so this module stays pure and the facade may name its types without a circle.

/// Pure half of [`ProcessIdentity::check`].
pub fn check_against(id: &ProcessIdentity, live: Liveness) -> IdentityCheck {
    match live {
        Liveness::Dead => IdentityCheck::Gone,
        Liveness::Alive { start_time: Some(t) } if t == id.start_time => IdentityCheck::Same,
        Liveness::Alive { start_time: Some(t) } => IdentityCheck::Different { start_time: t },
        Liveness::Alive { start_time: None } => {
            IdentityCheck::Unverifiable("the process is alive but its start time is unreadable".into())
        }
        Liveness::Unknown { reason } => IdentityCheck::Unverifiable(reason),
    }
}

impl std::fmt::Display for ProcessIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} (start {})", self.pid, self.start_time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_identity_is_alive_and_same() {
        let me = ProcessIdentity::current().expect("own start time");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.check(), IdentityCheck::Same);
    }

    #[test]
    fn check_maps_every_liveness() {
        let id = ProcessIdentity { pid: 10, start_time: 5 };
        assert_eq!(check_against(&id, Liveness::Dead), IdentityCheck::Gone);
        assert_eq!(check_against(&id, Liveness::Alive { start_time: Some(5) }), IdentityCheck::Same);
        assert_eq!(
            check_against(&id, Liveness::Alive { start_time: Some(6) }),
            IdentityCheck::Different { start_time: 6 }
        );
        assert!(matches!(check_against(&id, Liveness::Alive { start_time: None }), IdentityCheck::Unverifiable(_)));
        assert!(matches!(check_against(&id, Liveness::Unknown { reason: "x".into() }), IdentityCheck::Unverifiable(_)));
    }
}
