//! The executable on disk: the staged release written beside the home's other releases, and
//! the one-rename swap of a release over the executable (either way).

use std::path::{Path, PathBuf};

use gatewarden_lifecycle::Home;

use crate::release::{RELEASES, release_path, write_executable};

/// Writes `bytes` (a verified release) under `<home>/releases/<version>-<sha12>/`, its version
/// being what the written binary itself prints: (path, version).
pub(super) fn stage(home: &Home, bytes: &[u8], sha: &str) -> Result<(PathBuf, String), String> {
    let dir = home.dir().join(RELEASES);
    gatewarden_lifecycle::platform::create_private_dir(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".incoming-{}", std::process::id()));
    write_executable(&tmp, bytes).map_err(|e| format!("cannot stage {}: {e}", tmp.display()))?;
    let version = match super::run::release_version(&tmp) {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let path = release_path(home, &version, sha);
    if let Some(parent) = path.parent() {
        gatewarden_lifecycle::platform::create_private_dir(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| format!("cannot stage {}: {e}", path.display()))?;
    Ok((path, version))
}

/// Puts a copy of `release` at `target` with one rename in the target's directory. Windows
/// refuses to replace a running executable but lets it be renamed: it is moved aside first.
pub(super) fn swap_in(release: &Path, target: &Path) -> std::io::Result<()> {
    let dir = target.parent().ok_or_else(|| std::io::Error::other("the executable has no directory"))?;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.update-{}", std::process::id()));
    std::fs::copy(release, &tmp)?;
    // Written before it is renamed into place; Windows flushes only through a handle that may
    // write (FlushFileBuffers), so the copy is opened for writing to sync it.
    std::fs::OpenOptions::new().write(true).open(&tmp)?.sync_all()?;
    crate::os::proc::make_executable(&tmp)?;
    match std::fs::rename(&tmp, target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let aside = dir.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(target, &aside)?;
            std::fs::rename(&tmp, target)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Refuses binaries a package manager owns (axoupdater's rule): its next upgrade would undo
/// ours, or fail on the changed file. Returns what to run instead.
pub fn package_manager_owner(exe: &Path) -> Option<String> {
    let p = exe.to_string_lossy();
    let (who, instead) = if p.starts_with("/nix/store/") {
        ("Nix", "update it through your Nix configuration (nix profile upgrade / nixos-rebuild)")
    } else if p.starts_with("/opt/homebrew/") || p.contains("/Cellar/") || p.starts_with("/home/linuxbrew/") {
        ("Homebrew", "brew upgrade gatewarden")
    } else if p.starts_with("/snap/") {
        ("snap", "snap refresh gatewarden")
    } else if ["/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"].iter().any(|d| p.starts_with(d)) {
        ("the system package manager", "apt upgrade gatewarden (or dnf/pacman upgrade)")
    } else {
        return None;
    };
    Some(format!("{} is installed by {who}; update it with: {instead}", exe.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_managers_are_named() {
        assert!(package_manager_owner(Path::new("/usr/bin/gatewarden")).unwrap().contains("apt upgrade"));
        assert!(package_manager_owner(Path::new("/nix/store/abc-gatewarden/bin/gatewarden")).unwrap().contains("Nix"));
        assert!(package_manager_owner(Path::new("/opt/homebrew/bin/gatewarden")).unwrap().contains("brew upgrade"));
        assert!(package_manager_owner(Path::new("/home/a/.local/bin/gatewarden")).is_none());
        assert!(package_manager_owner(Path::new("/usr/local/bin/gatewarden")).is_none());
    }

    #[test]
    fn a_swap_replaces_the_file_in_one_rename_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("gw-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (release, target) = (dir.join("release"), dir.join("gatewarden"));
        std::fs::write(&release, b"new").unwrap();
        std::fs::write(&target, b"old").unwrap();
        swap_in(&release, &target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary is left behind");
        assert!(swap_in(&dir.join("missing"), &target).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"new", "a failed swap leaves the file as it was");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
