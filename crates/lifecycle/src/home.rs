//! Where state lives, and the names of its files.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::marker::MarkerKind;
use crate::platform::{self, DirFacts};

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

    /// Creates the home if missing (0700 on Unix), checks that it is safe to use, and returns
    /// its canonical form. An existing directory's mode is never changed: a home owned by
    /// another user, or writable by group or others, is refused ([`HomeError::Insecure`]).
    pub fn ensure(&self) -> Result<Home, HomeError> {
        platform::create_private_dir(&self.dir)
            .map_err(|source| HomeError::Unusable { dir: self.dir.clone(), source })?;
        let dir =
            platform::canonical(&self.dir).map_err(|source| HomeError::Unusable { dir: self.dir.clone(), source })?;
        let home = Home { dir };
        home.check()?;
        Ok(home)
    }

    /// Refuses a home another user could tamper with (see [`insecurity`]).
    pub fn check(&self) -> Result<(), HomeError> {
        match platform::dir_facts(&self.dir, true) {
            Ok(Some(facts)) => match insecurity(&facts) {
                Some(why) => Err(HomeError::Insecure { dir: self.dir.clone(), why }),
                None => Ok(()),
            },
            Ok(None) => Ok(()),
            Err(source) => Err(HomeError::Unusable { dir: self.dir.clone(), source }),
        }
    }

    /// The canonical path when the home exists, else the path as given.
    pub fn canonical_string(&self) -> String {
        platform::canonical(&self.dir).unwrap_or_else(|_| self.dir.clone()).to_string_lossy().into_owned()
    }

    /// Whether a home path recorded in a file names this home (compared as written, then
    /// canonically).
    pub fn is(&self, recorded: &str) -> bool {
        let p = Path::new(recorded);
        p == self.dir || platform::canonical(p).is_ok_and(|c| c == self.dir)
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
    /// Scratch space of each incarnation's runs (`runs/<incarnation>/`: the exec backend's
    /// history files), private like the home.
    pub fn runs_dir(&self) -> PathBuf {
        self.dir.join("runs")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    /// Where this home's configuration is read: `GATEWARDEN_CONFIG` (which `--config` sets
    /// for the CLI and everything it starts), else `<home>/config.toml` ([`config_path_with`]).
    pub fn config_file(&self) -> PathBuf {
        config_path_with(&self.dir, |k| std::env::var_os(k))
    }
}

/// The variable naming the configuration file instead of `<home>/config.toml`; `--config PATH`
/// sets it (crates/gatewarden/src/main.rs), so every process the CLI starts reads the same file.
pub const CONFIG_ENV: &str = "GATEWARDEN_CONFIG";

/// The prefix of `/update`'s outcome notices in the home, `<prefix><pid>.json`: written by
/// `gatewarden update --chat` (crates/ops), relayed by the gateway (crates/runtime/src/notices.rs).
pub const UPDATE_NOTIFY_PREFIX: &str = ".update_notify.";

/// Pure: where the configuration of the home at `dir` is read, the environment injected.
/// `GATEWARDEN_CONFIG` when set and not empty, else `<dir>/config.toml`. The only place that
/// decides it: the config crate's loader and every message naming the file go through it.
pub fn config_path_with(dir: &Path, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    match env(CONFIG_ENV).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => dir.join("config.toml"),
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HomeError {
    #[error("cannot find a home directory: set --home or GATEWARDEN_HOME")]
    NoDefault,
    #[error("home {} is not usable: {source}", dir.display())]
    Unusable { dir: PathBuf, source: io::Error },
    #[error(
        "refusing home {}: {why}; a gateway home must be a directory owned by the user running gatewarden and not writable by group or others",
        dir.display()
    )]
    Insecure { dir: PathBuf, why: String },
}

/// Why a directory is not safe as a home, or `None`. Pure. Another user who can write to the
/// home (or owns it) can plant `gateway.lock` or a marker that the gateway then obeys.
pub fn insecurity(f: &DirFacts) -> Option<String> {
    if !f.is_dir {
        return Some("it is not a directory".into());
    }
    if f.owner != f.me {
        return Some(format!("it is owned by uid {}, not by uid {}", f.owner, f.me));
    }
    if f.mode & 0o022 != 0 {
        return Some(format!("it is writable by group or others (mode {:o})", f.mode));
    }
    None
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
    fn the_config_is_the_variable_s_file_else_the_home_s() {
        assert_eq!(config_path_with(Path::new("/h"), env(&[])), PathBuf::from("/h/config.toml"));
        assert_eq!(config_path_with(Path::new("/h"), env(&[(CONFIG_ENV, "")])), PathBuf::from("/h/config.toml"));
        assert_eq!(
            config_path_with(Path::new("/h"), env(&[(CONFIG_ENV, "/etc/gw.toml")])),
            PathBuf::from("/etc/gw.toml")
        );
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
    fn ensure_creates_private_dir_and_never_changes_an_existing_mode() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let h = Home::at(dir.path().join("a/b")).ensure().unwrap();
        assert_eq!(mode(h.dir()), 0o700);
        let blocked = Home::at(dir.path().join("file/x"));
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert!(matches!(blocked.ensure(), Err(HomeError::Unusable { .. })));

        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        Home::at(&open).ensure().unwrap();
        assert_eq!(mode(&open), 0o755, "a safe existing mode is left alone");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = Home::at(&open).ensure().unwrap_err();
        assert!(matches!(&e, HomeError::Insecure { why, .. } if why.contains("1777")), "{e}");
        assert_eq!(mode(&open), 0o1777, "a refused home is not chmodded either");
    }

    #[test]
    fn insecurity_policy() {
        let f = DirFacts { is_dir: true, is_link: false, owner: 5, me: 5, mode: 0o750 };
        assert_eq!(insecurity(&f), None);
        assert!(insecurity(&DirFacts { owner: 6, ..f }).is_some_and(|w| w.contains("uid 6")));
        assert!(insecurity(&DirFacts { mode: 0o770, ..f }).is_some());
        assert!(insecurity(&DirFacts { mode: 0o1777, ..f }).is_some());
        assert!(insecurity(&DirFacts { is_dir: false, ..f }).is_some());
    }
}
