//! Windows: the per-user local application data directory, already private to the user.

use std::path::{Path, PathBuf};

pub fn default_dir() -> PathBuf {
    std::env::var_os("LOCALAPPDATA")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("gatewarden")
        .join("creds")
}

pub fn check_private(_dir: &Path) -> Result<(), String> {
    Ok(())
}

pub fn own_parent(_dir: &Path) -> Option<&Path> {
    None
}

pub fn check_one(_dir: &Path) -> Result<(), String> {
    Ok(())
}
