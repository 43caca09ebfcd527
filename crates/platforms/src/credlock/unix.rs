//! Unix: the runtime directory, and the private-directory check.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(d) => d.join("gatewarden").join("creds"),
        None => std::env::temp_dir().join(format!("gatewarden-{}", rustix::process::getuid().as_raw())).join("creds"),
    }
}

/// `dir` and its parent must be ours and closed to others: a directory another user created
/// first in /tmp could otherwise hold (or fake) our locks.
pub fn check_private(dir: &Path) -> Result<(), String> {
    let uid = rustix::process::getuid().as_raw();
    // The parent too when it is ours (`gatewarden-<uid>`, `gatewarden`), not /tmp itself.
    let parent = dir.parent().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("gatewarden")));
    for d in [Some(dir), parent].into_iter().flatten() {
        let meta = std::fs::symlink_metadata(d).map_err(|e| e.to_string())?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", d.display()));
        }
        if meta.uid() != uid {
            return Err(format!("{} is owned by uid {}, not by this user (uid {uid})", d.display(), meta.uid()));
        }
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "{} is writable by other users (mode {:o})",
                d.display(),
                meta.permissions().mode() & 0o777
            ));
        }
    }
    Ok(())
}
