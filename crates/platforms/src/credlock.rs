//! One credential, one gateway on this host: a lock keyed by `(platform, sha256(credential))`.
//!
//! The lock file lives in a per-user runtime directory shared by every home
//! (`$XDG_RUNTIME_DIR/gatewarden/creds/`, else `/tmp/gatewarden-<uid>/creds/`; created 0700 and
//! refused unless owned by this user), so two homes configured with the same bot token cannot
//! both poll it. It is the OS lock of `gateway.lock` (crates/lifecycle/src/lock.rs): the kernel
//! releases it when the holder dies, so a dead holder never blocks. Who holds it is written to a
//! sidecar `.owner.json` (readable on every OS while the lock is held), for the refusal message.

use std::path::{Path, PathBuf};

use gatewarden_lifecycle::{InstanceLock, LockError, fsio};
use serde::{Deserialize, Serialize};

#[cfg_attr(unix, path = "credlock/unix.rs")]
#[cfg_attr(windows, path = "credlock/windows.rs")]
mod os;

/// Overrides the lock directory (tests that must not share the per-user one).
pub const DIR_ENV: &str = "GATEWARDEN_CREDS_DIR";

/// Who holds a credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub home: String,
    pub pid: u32,
    #[serde(default)]
    pub incarnation: Option<String>,
    #[serde(default)]
    pub adapter: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the gateway in {} (pid {})", self.home, self.pid)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredLockError {
    /// A live gateway holds this credential.
    #[error("this {platform} credential is in use by {}", holder.as_ref().map_or_else(|| "another gateway (its owner record is not readable)".to_owned(), |h| h.to_string()))]
    Held { platform: String, holder: Option<Holder> },
    #[error("credential lock directory {}: {message}", path.display())]
    Dir { path: PathBuf, message: String },
    #[error("credential lock {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A held credential lock; dropping it releases the credential.
#[derive(Debug)]
pub struct CredLock {
    _lock: InstanceLock,
    owner: PathBuf,
    pid: u32,
}

impl Drop for CredLock {
    fn drop(&mut self) {
        // Only our own record: a successor may already have written its own.
        if fsio::read_json::<Holder>(&self.owner).ok().is_some_and(|h| h.pid == self.pid) {
            let _ = std::fs::remove_file(&self.owner);
        }
    }
}

/// The directory holding credential locks, created private and checked.
pub fn lock_dir() -> Result<PathBuf, CredLockError> {
    let dir = match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => os::default_dir(),
    };
    let refused = |d: &Path, message: String| CredLockError::Dir { path: d.to_path_buf(), message };
    // Another user may have made `/tmp/gatewarden-<uid>` first: check it before creating
    // `creds/` inside it.
    if let Some(parent) = os::own_parent(&dir) {
        gatewarden_lifecycle::platform::create_private_dir(parent).map_err(|e| refused(parent, e.to_string()))?;
        os::check_one(parent).map_err(|m| refused(parent, m))?;
    }
    gatewarden_lifecycle::platform::create_private_dir(&dir).map_err(|e| refused(&dir, e.to_string()))?;
    os::check_private(&dir).map_err(|m| refused(&dir, m))?;
    Ok(dir)
}

/// The lock file's name: the platform and the first 32 hex digits of the credential's SHA-256.
pub fn lock_name(platform: &str, credential: &str) -> String {
    let digest = crate::sha256_hex(credential.as_bytes());
    format!("{platform}-{}.lock", &digest[..32])
}

/// Takes the lock for `(platform, credential)` in `dir` once, recording `me` as the holder.
pub fn acquire_in(dir: &Path, platform: &str, credential: &str, me: &Holder) -> Result<CredLock, CredLockError> {
    let path = dir.join(lock_name(platform, credential));
    let owner = path.with_extension("owner.json");
    match InstanceLock::try_acquire(&path) {
        Ok(lock) => {
            fsio::write_json(&owner, me).map_err(|e| CredLockError::Io { path: owner.clone(), source: e })?;
            Ok(CredLock { _lock: lock, owner, pid: me.pid })
        }
        Err(LockError::Held { .. }) => {
            Err(CredLockError::Held { platform: platform.to_owned(), holder: fsio::read_json::<Holder>(&owner).ok() })
        }
        Err(LockError::Io { path, source }) => Err(CredLockError::Io { path, source }),
        Err(e) => Err(CredLockError::Io { path, source: std::io::Error::other(e.to_string()) }),
    }
}

/// [`acquire_in`] the per-user directory.
pub fn acquire(platform: &str, credential: &str, me: &Holder) -> Result<CredLock, CredLockError> {
    acquire_in(&lock_dir()?, platform, credential, me)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(home: &str, pid: u32) -> Holder {
        Holder { home: home.into(), pid, incarnation: None, adapter: Some("telegram".into()) }
    }

    #[test]
    fn second_taker_is_refused_with_the_holder_named_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let a = acquire_in(dir.path(), "telegram", "123:abc", &me("/h/a", std::process::id())).unwrap();
        let err = acquire_in(dir.path(), "telegram", "123:abc", &me("/h/b", 2)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/h/a") && text.contains(&std::process::id().to_string()), "{text}");
        // Another token, or the same token on another platform, is another lock.
        let _c = acquire_in(dir.path(), "telegram", "999:zzz", &me("/h/b", 2)).unwrap();
        let _d = acquire_in(dir.path(), "matrix", "123:abc", &me("/h/b", 2)).unwrap();
        drop(a);
        let _b = acquire_in(dir.path(), "telegram", "123:abc", &me("/h/b", 2)).unwrap();
        // The token itself is never written anywhere.
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            assert!(!e.file_name().to_string_lossy().contains("abc"));
            assert!(!std::fs::read_to_string(e.path()).unwrap_or_default().contains("123:abc"));
        }
    }

    #[test]
    fn lock_names_are_stable_and_hide_the_token() {
        assert_eq!(lock_name("telegram", "abc"), "telegram-ba7816bf8f01cfea414140de5dae2223.lock");
    }
}
