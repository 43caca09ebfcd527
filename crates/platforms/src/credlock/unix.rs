//! Unix: the runtime directory, and the private-directory check.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(d) => d.join("gatewarden").join("creds"),
        None => std::env::temp_dir().join(format!("gatewarden-{}", rustix::process::getuid().as_raw())).join("creds"),
    }
}

/// The folder above `dir` when it is ours by name (`gatewarden-<uid>`, `gatewarden`), not
/// /tmp itself: it is made and checked before anything is created inside it.
pub fn own_parent(dir: &Path) -> Option<&Path> {
    dir.parent().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("gatewarden")))
}

/// `dir` and its parent (when [`own_parent`]) must be ours and closed to others: a directory
/// another user created first in /tmp could otherwise hold (or fake) our locks.
pub fn check_private(dir: &Path) -> Result<(), String> {
    [Some(dir), own_parent(dir)].into_iter().flatten().try_for_each(check_one)
}

/// One folder: a directory (not a link), ours, not writable by group or others.
pub fn check_one(d: &Path) -> Result<(), String> {
    let uid = rustix::process::getuid().as_raw();
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
    Ok(())
}
