//! Integration tests for gatewarden-service (one test binary, topic modules).

/// The launchd restart ladder against a scripted model of launchd (class E scenarios).
mod launchd_model;
/// Property tests: supervise policy, parsers and quoting never panic and keep their bounds.
mod props;
/// Snapshots of every rendered definition (systemd user/system, plist, task XML).
/// Rendering is pure and identical on every host; the snapshots are checked where insta can
/// resolve its snapshot directory (under Wine it sees a Windows view of a Linux path).
#[cfg(unix)]
mod snapshots;
