//! Where state lives, and the names of its files.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::marker::MarkerKind;
use crate::platform;

/// A gateway home: a directory with the lock, records, markers, ledger and socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    dir: PathBuf,
}

impl Home {
    /// `--home`, else `GATEWARDEN_HOME`, else the per-OS default.
    pub fn resolve(flag: Option<PathBuf>) -> Result<Home, HomeError> {
        resolve_with(flag, |k| std::env::var_os(k)).map(|dir| Home { dir })
    }

    /// A home at an explicit directory.
    pub fn at(dir: impl Into<PathBuf>) -> Home {
        Home { dir: dir.into() }
    }

    /// The canonical form when the directory exists (so a relative `--home` finds the same
    /// control endpoint as the gateway), else unchanged.
    pub fn canonicalized(&self) -> Home {
        Home { dir: platform::canonical(&self.dir).unwrap_or_else(|_| self.dir.clone()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the home (0700 on Unix) and returns its canonical form.
    pub fn ensure(&self) -> Result<Home, HomeError> {
        platform::create_private_dir(&self.dir)
            .map_err(|source| HomeError::Unusable { dir: self.dir.clone(), source })?;
        let dir =
            platform::canonical(&self.dir).map_err(|source| HomeError::Unusable { dir: self.dir.clone(), source })?;
        Ok(Home { dir })
    }

    /// The canonical path when the home exists, else the path as given.
    pub fn canonical_string(&self) -> String {
        platform::canonical(&self.dir).unwrap_or_else(|_| self.dir.clone()).to_string_lossy().into_owned()
    }

    pub fn lock(&self) -> PathBuf {
        self.dir.join("gateway.lock")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("gateway.pid")
    }
    pub fn state_file(&self) -> PathBuf {
        self.dir.join("gateway_state.json")
    }
    pub fn marker(&self, kind: MarkerKind) -> PathBuf {
        self.dir.join(kind.file_name())
    }
    pub fn ledger(&self) -> PathBuf {
        self.dir.join("lifecycle.jsonl")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HomeError {
    #[error("cannot find a home directory: set --home or GATEWARDEN_HOME")]
    NoDefault,
    #[error("home {} is not usable: {source}", dir.display())]
    Unusable { dir: PathBuf, source: io::Error },
}

/// Pure resolution, with the environment injected.
pub fn resolve_with(flag: Option<PathBuf>, env: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, HomeError> {
    let nonempty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = flag.filter(|p| !p.as_os_str().is_empty()) {
        return Ok(p);
    }
    if let Some(p) = nonempty("GATEWARDEN_HOME") {
        return Ok(p);
    }
    let home = || nonempty("HOME");
    let dir = if cfg!(windows) {
        nonempty("LOCALAPPDATA").map(|p| p.join("gatewarden"))
    } else if cfg!(target_os = "macos") {
        home().map(|h| h.join("Library/Application Support/gatewarden"))
    } else {
        nonempty("XDG_STATE_HOME")
            .filter(|p| p.is_absolute())
            .map(|p| p.join("gatewarden"))
            .or_else(|| home().map(|h| h.join(".local/state/gatewarden")))
    };
    dir.ok_or(HomeError::NoDefault)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn precedence() {
        assert_eq!(resolve_with(Some("/f".into()), env(&[("GATEWARDEN_HOME", "/e")])).unwrap(), PathBuf::from("/f"));
        assert_eq!(resolve_with(None, env(&[("GATEWARDEN_HOME", "/e")])).unwrap(), PathBuf::from("/e"));
        assert!(matches!(resolve_with(None, env(&[])), Err(HomeError::NoDefault)));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_defaults() {
        assert_eq!(
            resolve_with(None, env(&[("HOME", "/home/a"), ("XDG_STATE_HOME", "/s")])).unwrap(),
            PathBuf::from("/s/gatewarden")
        );
        assert_eq!(
            resolve_with(None, env(&[("HOME", "/home/a"), ("XDG_STATE_HOME", "relative")])).unwrap(),
            PathBuf::from("/home/a/.local/state/gatewarden")
        );
    }

    #[cfg(unix)]
    #[test]
    fn ensure_creates_private_dir() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let h = Home::at(dir.path().join("a/b")).ensure().unwrap();
        assert_eq!(std::fs::metadata(h.dir()).unwrap().permissions().mode() & 0o777, 0o700);
        let blocked = Home::at(dir.path().join("file/x"));
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert!(matches!(blocked.ensure(), Err(HomeError::Unusable { .. })));
    }
}
