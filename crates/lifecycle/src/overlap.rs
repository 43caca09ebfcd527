//! Pure decisions for verbs that overlap in one home (issue 22, item 7): an executable swap
//! (`update`, `update --rollback`) that meets a restart already under way, and a `start` that
//! meets a gateway on its way out.
//!
//! A restart's next incarnation runs the file that was at the executable's path when it was
//! spawned. One spawned before a swap runs the replaced file, whatever the swap put there; the
//! swap must come after such a restart, and an incarnation that predates the swap is restarted
//! once more onto the new file.

use std::time::Duration;

/// How much later than the swap a process may enter `main` and still have been executed from
/// the replaced file (loading a large executable takes a moment). A process that started
/// after the swap but inside this margin costs one more restart, never a wrong verdict.
pub const SWAP_MARGIN: Duration = Duration::from_millis(50);

/// Whether a restart or start is under way, so a swap now could be joined by an incarnation of
/// the old file: the gateway answers in a state other than `running` (starting, draining,
/// stopping), or an operator's start or restart is still being carried out
/// (`desired::in_flight_alive`). A home where nothing answers is quiet: nothing to join.
pub fn restart_under_way(state: Option<&str>, in_flight_alive: bool) -> bool {
    in_flight_alive || state.is_some_and(|s| s != "running")
}

/// Whether a gateway that answers in `state` is leaving (draining or stopping, for a stop or a
/// restart): not "already running" for a `start`, which waits for it to go or to hand over.
pub fn leaving(state: Option<&str>) -> bool {
    matches!(state, Some("draining" | "stopping" | "stopped"))
}

/// Whether the incarnation a restart ended with began before the swap `since_swap` ago (its
/// `uptime_s`, from `status`), so it may run the replaced file, and does not report the version
/// the swap installed (`want`). Then it gets one more restart.
pub fn predates_swap(uptime_s: Option<f64>, since_swap: Duration, version: Option<&str>, want: &str) -> bool {
    let began_before = uptime_s.is_some_and(|up| up + SWAP_MARGIN.as_secs_f64() >= since_swap.as_secs_f64());
    began_before && version != Some(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_under_way_until_the_gateway_runs_and_no_request_is_in_flight() {
        assert!(!restart_under_way(Some("running"), false));
        assert!(!restart_under_way(None, false), "nothing answers: nothing to join");
        for s in ["starting", "draining", "stopping"] {
            assert!(restart_under_way(Some(s), false), "{s}");
        }
        assert!(restart_under_way(Some("running"), true), "a restart CLI has not asked yet");
    }

    #[test]
    fn a_draining_or_stopping_gateway_is_leaving() {
        for s in ["draining", "stopping", "stopped"] {
            assert!(leaving(Some(s)), "{s}");
        }
        for s in [Some("running"), Some("starting"), None] {
            assert!(!leaving(s), "{s:?}");
        }
    }

    #[test]
    fn only_an_incarnation_from_before_the_swap_that_runs_another_version_is_restarted_again() {
        let s = Duration::from_secs;
        // Spawned before the swap (up 5 s, swapped 2 s ago), the old version: restart again.
        assert!(predates_swap(Some(5.0), s(2), Some("0.1.0"), "9.9.9"));
        // Started after the swap: a verdict on the release, not a stale incarnation.
        assert!(!predates_swap(Some(1.0), s(2), Some("0.1.0"), "9.9.9"));
        // Already the wanted version, or no uptime: nothing to do / nothing known.
        assert!(!predates_swap(Some(5.0), s(2), Some("9.9.9"), "9.9.9"));
        assert!(!predates_swap(None, s(2), Some("0.1.0"), "9.9.9"));
        // Inside the margin counts as before: at worst one more restart.
        assert!(predates_swap(Some(1.98), s(2), Some("0.1.0"), "9.9.9"));
    }
}
