//! launchd: the LaunchAgent, its revival policy, `launchctl` access and the restart ladder.
//!
//! # KeepAlive policy
//!
//! The plist runs **`gatewarden supervise --home H`**, our own minimal supervisor, under
//! `KeepAlive = {SuccessfulExit = false}`. The supervisor runs `gatewarden run` as its child
//! and applies [`crate::supervise`]'s policy. Every exit path of the gateway:
//!
//! | gateway exit | supervisor does | supervisor exits | launchd does |
//! |---|---|---|---|
//! | 75 planned restart | restarts the child at once | — | nothing (job stays up) |
//! | 1 / signal (crash) | restarts with backoff (100 ms doubling to 30 s) | — | nothing |
//! | 0 planned stop / takeover | stops | 0 | leaves it down (`SuccessfulExit = false`) |
//! | 78 fatal configuration | records `supervise_state.json`, parks | 0 | leaves it down: no loop |
//! | crash loop (5 restarts in 60 s) | records the reason, parks | 0 | leaves it down |
//! | — (the supervisor itself crashes) | — | ≠ 0 / signal | revives the supervisor after `ThrottleInterval` |
//!
//! Why not the alternatives hermes tried (bug-classes class E):
//! - `KeepAlive = true` around the gateway: exit 78 respawns forever (E8), and a deliberate
//!   stop is only possible with `bootout`, which kills the CLI's coalition and strands the label
//!   unloaded (#27592).
//! - `SuccessfulExit = false` around the gateway: 75 revives, but through launchd's throttle,
//!   so a restart within `ThrottleInterval` of the last spawn is pended, sometimes forever
//!   (#62128); and 78 is non-zero, so it respawns in a loop. Mapping 78 to 0 in a wrapper
//!   (hermes #112079) is half of what `supervise` does.
//!
//! With the supervisor, a planned restart never touches launchd (no throttle, no coalition
//! kill), `gatewarden stop` is a control-channel stop (exit 0) that leaves the label loaded, and
//! `gatewarden start` is a plain `launchctl kickstart` (E7). launchd's own restart machinery
//! only covers the supervisor crashing, which is rare and unthrottled in practice.
//! When the job is stopped by launchd (logout, `bootout`), the supervisor receives SIGTERM and
//! must pass a planned stop to the gateway and wait; `ExitTimeOut` is therefore
//! [`crate::spec::stop_timeout_s`] (drain + grace, ≥ the shutdown watchdog).
//!
//! [`ladder`] verifies restarts that did go through launchd (the supervisor was down, an old
//! plist is installed) and escalates safely.

pub mod ladder;
pub mod launchctl;
pub mod plist;
pub mod print;

pub use ladder::{Incarnation, LadderAction, LadderConfig, LockHolder, Observation, RestartLadder};
pub use launchctl::{Launchctl, LaunchctlError, helper_label, helper_script};
pub use plist::{
    InstalledPolicy, KeepAlive, KeepAliveConditions, LaunchAgent, drift, installed_policy, launch_agent, parse_plist,
    plist_path, render_plist,
};
pub use print::{LastExit, LaunchdPrint, parse_print};

use crate::spec::SpecError;

/// The CLI verb the plist runs.
pub const SUPERVISE_VERB: &str = "supervise";

/// Why a plist could not be rendered or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchdError {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The plist could not be (de)serialized.
    #[error("plist: {0}")]
    Plist(#[source] ::plist::Error),
    /// The serializer produced non-UTF-8 XML (should not happen).
    #[error("rendered plist is not UTF-8")]
    NotUtf8,
    /// The plist's root is not a dictionary.
    #[error("plist root is not a dictionary")]
    NotADictionary,
}

/// A job in a launchd domain: `gui/<uid>/<label>` and its plist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchdTarget {
    /// The user's uid (the `gui/<uid>` domain).
    pub uid: u32,
    /// Job label.
    pub label: String,
    /// Path of the installed plist.
    pub plist_path: String,
}

impl LaunchdTarget {
    /// A target in the user's GUI domain.
    #[must_use]
    pub fn new(uid: u32, label: impl Into<String>, plist_path: impl Into<String>) -> Self {
        Self { uid, label: label.into(), plist_path: plist_path.into() }
    }

    /// `gui/<uid>`.
    #[must_use]
    pub fn domain(&self) -> String {
        format!("gui/{}", self.uid)
    }

    /// `gui/<uid>/<label>`.
    #[must_use]
    pub fn service(&self) -> String {
        format!("gui/{}/{}", self.uid, self.label)
    }
}

/// Whether `XPC_SERVICE_NAME` says we run as a launchd job. Interactive shells inherit `"0"`
/// (hermes #43888), and an empty value means nothing; both are "not launchd" (class E
/// invariant 5).
#[must_use]
pub fn is_launchd_job(xpc_service_name: Option<&str>) -> bool {
    xpc_service_name.is_some_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interactive_shell_is_not_launchd() {
        assert!(!is_launchd_job(None));
        assert!(!is_launchd_job(Some("")));
        assert!(!is_launchd_job(Some("0")));
        assert!(is_launchd_job(Some("ai.gatewarden.gateway")));
    }

    #[test]
    fn target_names() {
        let t = LaunchdTarget::new(501, "l", "/p");
        assert_eq!(t.domain(), "gui/501");
        assert_eq!(t.service(), "gui/501/l");
    }
}
