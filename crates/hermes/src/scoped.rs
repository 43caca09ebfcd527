//! hermes-agent's scoped credential locks: a bot token a hermes gateway on this host uses is
//! not used by gatewarden too.
//!
//! Before a hermes 0.19 gateway uses a Telegram, Discord or Slack credential it creates
//! `<dir>/<scope>-<sha256(credential)[:16]>.lock` with `O_EXCL` (`gateway/status.py`
//! `acquire_scoped_lock`): a JSON record of its pid and start time (`/proc/<pid>/stat` field
//! 22 on Linux, `null` elsewhere). A record naming a live process of that start time holds the
//! credential; a dead pid, another start time, or an unreadable record is stale. These are
//! files, not OS locks: a killed holder leaves its file behind.
//!
//! gatewarden refuses a credential whose record names a live process ([`holder`]), as it
//! refuses one another gatewarden holds (crates/platforms/src/credlock.rs). It writes no
//! record of its own: hermes 0.19 calls any holder whose command line is not `… gateway run`
//! stale (its "secondary defence" against recycled pids), so a record would not keep a hermes
//! started later off the token; Telegram's own 409 on a second poller does (the adapter's
//! conflict standby).
//!
//! The directory and its files are untrusted: read without following links and size-capped,
//! never written.

use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::probe::{Liveness, probe_u32};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A record this large is not hermes's: stale.
const MAX_RECORD: u64 = 64 * 1024;

/// The scope hermes locks a platform's credential under (its `_acquire_platform_lock` calls in
/// `plugins/platforms/*/adapter.py`); `None`: hermes takes no lock for it.
pub fn scope_for(kind: &str) -> Option<&'static str> {
    match kind {
        "telegram" => Some("telegram-bot-token"),
        "discord" => Some("discord-bot-token"),
        "slack" => Some("slack-app-token"),
        _ => None,
    }
}

/// The lock directory as hermes resolves it from `env`.
pub fn lock_dir(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    set("HERMES_GATEWAY_LOCK_DIR")
        .or_else(|| set("XDG_STATE_HOME").map(|x| x.join("hermes/gateway-locks")))
        .or_else(|| set("HOME").map(|h| h.join(".local/state/hermes/gateway-locks")))
}

/// `<dir>/<scope>-<first 16 hex digits of sha256(credential)>.lock`.
pub fn lock_path(dir: &Path, scope: &str, credential: &str) -> PathBuf {
    let digest = Sha256::digest(credential.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{scope}-{hex}.lock"))
}

/// What a lock record says, judged as hermes judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A live process of the recorded start time (or one whose start time cannot be compared:
    /// held, as the cautious reading).
    Live { pid: u32 },
    /// A dead pid, another start time, or not a record at all: replaceable.
    Stale,
}

/// Judges a record's bytes against `probe` (pid → liveness).
pub fn judge(bytes: &[u8], probe: impl Fn(u32) -> Liveness) -> Record {
    fsio::parse_json_value(bytes).map_or(Record::Stale, |v| judge_value(&v, probe))
}

/// [`judge`] of a record already parsed.
pub fn judge_value(v: &Value, probe: impl Fn(u32) -> Liveness) -> Record {
    let Some(pid) = v.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()) else {
        return Record::Stale;
    };
    let recorded = v.get("start_time").and_then(Value::as_u64);
    match probe(pid) {
        Liveness::Dead => Record::Stale,
        Liveness::Alive { start_time: Some(now) } if recorded.is_some_and(|r| r != now) => Record::Stale,
        Liveness::Alive { .. } | Liveness::Unknown { .. } => Record::Live { pid },
    }
}

/// The live process a hermes lock for `(kind, credential)` in `dir` names, and the file; `None`
/// when hermes locks no such credential, or nothing live holds it.
pub fn holder(dir: &Path, kind: &str, credential: &str) -> Option<(u32, PathBuf)> {
    let path = lock_path(dir, scope_for(kind)?, credential);
    match fsio::read_capped(&path, MAX_RECORD) {
        ReadOutcome::Ok(bytes) => match judge(&bytes, probe_u32) {
            Record::Live { pid } if pid != std::process::id() => Some((pid, path)),
            _ => None,
        },
        // Missing, or not a record hermes could have written (a link, a FIFO, oversized).
        _ => None,
    }
}

/// A refusal naming the holder, for the adapter's parked state or the start's exit 78.
pub fn describe_holder(pid: u32, path: &Path) -> String {
    format!(
        "a hermes gateway (pid {pid}) uses this credential (its lock {}); stop that gateway, or remove the platform from one of them",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_hermes_hashing() {
        // hermes: _get_scope_lock_path('telegram-bot-token', 'secret'), measured
        // (the reference notes of the management work).
        let p = lock_path(Path::new("/l"), "telegram-bot-token", "secret");
        assert_eq!(p, Path::new("/l/telegram-bot-token-2bb80d537b1da3e3.lock"));
        assert_eq!(scope_for("slack"), Some("slack-app-token"));
        assert_eq!(scope_for("irc"), None);
        let env = |k: &str| (k == "XDG_STATE_HOME").then(|| "/x".into());
        assert_eq!(lock_dir(env), Some(PathBuf::from("/x/hermes/gateway-locks")));
    }

    #[test]
    fn records_are_judged_as_hermes_judges_them() {
        let alive = |t| move |_| Liveness::Alive { start_time: Some(t) };
        assert_eq!(judge(br#"{"pid": 7, "start_time": 5}"#, alive(5)), Record::Live { pid: 7 });
        assert_eq!(judge(br#"{"pid": 7, "start_time": 5}"#, alive(6)), Record::Stale, "a recycled pid");
        assert_eq!(judge(br#"{"pid": 7, "start_time": null}"#, alive(6)), Record::Live { pid: 7 });
        assert_eq!(judge(br#"{"pid": 7}"#, |_| Liveness::Dead), Record::Stale);
        for junk in [&b""[..], b"{", b"[]", br#"{"pid": "7"}"#, br#"{"pid": -1}"#] {
            assert_eq!(judge(junk, alive(5)), Record::Stale, "{junk:?}");
        }
    }

    // Unix: pid 1 (init, launchd) is a live process no test started.
    #[cfg(unix)]
    #[test]
    fn only_a_live_record_holds() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(holder(dir.path(), "telegram", "tok"), None, "no file");
        let path = lock_path(dir.path(), "telegram-bot-token", "tok");
        std::fs::write(&path, r#"{"pid": 1, "start_time": null}"#).unwrap();
        assert_eq!(holder(dir.path(), "telegram", "tok"), Some((1, path.clone())), "pid 1 lives");
        assert_eq!(holder(dir.path(), "telegram", "other"), None, "another credential");
        assert_eq!(holder(dir.path(), "irc", "tok"), None, "hermes locks no IRC credential");
        std::fs::write(&path, format!(r#"{{"pid": {}, "start_time": null}}"#, std::process::id())).unwrap();
        assert_eq!(holder(dir.path(), "telegram", "tok"), None, "our own pid is not a hermes");
        std::fs::write(&path, r#"{"pid": 2147483000, "start_time": 3}"#).unwrap();
        assert_eq!(holder(dir.path(), "telegram", "tok"), None, "a dead holder");
        assert!(describe_holder(1, &path).contains("pid 1"));
    }

    #[cfg(unix)]
    #[test]
    fn a_link_in_place_of_the_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, r#"{"pid": 1, "start_time": null}"#).unwrap();
        std::os::unix::fs::symlink(&target, lock_path(dir.path(), "telegram-bot-token", "tok")).unwrap();
        assert_eq!(holder(dir.path(), "telegram", "tok"), None);
    }
}
