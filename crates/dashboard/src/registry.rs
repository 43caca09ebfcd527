//! The per-user registry of gateway homes, for the fleet page: each gateway registers its home
//! at start, and the fleet lists every home registered, running or not (a home whose gateway
//! is down still shows its last state and why it ended).
//!
//! One small file per home in `<config dir>/gatewarden/homes/` (`$XDG_CONFIG_HOME`, else
//! `~/.config`, else `%APPDATA%`), named by a hash of the home's path: registrations never rewrite a shared file,
//! so two gateways starting at once cannot lose each other's entry. The directory is created
//! private and must be ours and a real directory; entries are written with the home's own
//! atomic write (crates/lifecycle/src/fsio.rs: 0600, never through a link), read through
//! `read_capped` (no links, no FIFOs, small), and validated: an entry that does not name an
//! absolute path whose hash is its file name is skipped and reported.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::{home, platform, timefmt};
use serde::{Deserialize, Serialize};

/// An entry is a few hundred bytes; anything bigger is not one.
const MAX_ENTRY_BYTES: u64 = 8 << 10;
/// Homes listed at most: a planted directory of a million files costs a bounded scan.
pub const MAX_HOMES: usize = 256;
const MAX_PATH_CHARS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The home's canonical path.
    pub home: String,
    /// When it last registered (a gateway start).
    #[serde(default)]
    pub registered_at: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("no config directory: none of XDG_CONFIG_HOME, HOME, APPDATA is set")]
    NoDir,
    #[error("registry directory {}: {why}", dir.display())]
    Insecure { dir: PathBuf, why: String },
    #[error("home {0:?} cannot be registered: {1}")]
    BadHome(String, &'static str),
    #[error("registry {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// `<config>/gatewarden/homes`, from the environment (injected, so the rule is testable).
pub fn dir_with(env: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, RegistryError> {
    let nonempty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from).filter(|p| p.is_absolute());
    // APPDATA: Windows has neither of the others by default.
    let base = nonempty("XDG_CONFIG_HOME")
        .or_else(|| nonempty("HOME").map(|h| h.join(".config")))
        .or_else(|| nonempty("APPDATA"))
        .ok_or(RegistryError::NoDir)?;
    Ok(base.join("gatewarden").join("homes"))
}

/// Overrides the registry's directory; `none` turns registration off (the test suites set
/// it so that their gateways never join the developer's own fleet).
pub const DIR_ENV: &str = "GATEWARDEN_REGISTRY";

/// The registry directory, or `None` when [`DIR_ENV`] is `none`.
pub fn dir() -> Result<Option<PathBuf>, RegistryError> {
    match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
        Some(v) if v == "none" => Ok(None),
        Some(v) if Path::new(&v).is_absolute() => Ok(Some(PathBuf::from(v))),
        Some(_) => Err(RegistryError::Insecure { dir: PathBuf::from("."), why: format!("{DIR_ENV} must be absolute") }),
        None => dir_with(|k| std::env::var_os(k)).map(Some),
    }
}

/// The entry's file name: FNV-1a of the path, so it is stable across builds and processes.
pub fn file_name(home: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in home.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.json")
}

/// Why `home` cannot be an entry, or `None`. Pure.
pub fn invalid(home: &str) -> Option<&'static str> {
    if !Path::new(home).is_absolute() {
        return Some("not an absolute path");
    }
    if home.chars().count() > MAX_PATH_CHARS {
        return Some("path too long");
    }
    if home.chars().any(char::is_control) {
        return Some("control characters in the path");
    }
    None
}

/// Validates one entry file's bytes against its file name. Pure.
pub fn parse_entry(name: &str, bytes: &[u8]) -> Result<Entry, String> {
    let v = fsio::parse_json_value(bytes)?;
    let e: Entry = serde_json::from_value(v).map_err(|e| e.to_string())?;
    if let Some(why) = invalid(&e.home) {
        return Err(why.to_owned());
    }
    if file_name(&e.home) != name {
        return Err("its file name is not its home's (copied or planted)".to_owned());
    }
    Ok(e)
}

/// The registry directory, created private when missing; refused when it is a link, not a
/// directory, not ours, or writable by others (the home's own rule, crates/lifecycle/src/home.rs).
fn ensure_dir(dir: &Path) -> Result<(), RegistryError> {
    platform::create_private_dir(dir).map_err(|source| RegistryError::Io { path: dir.to_owned(), source })?;
    check_dir(dir)
}

fn check_dir(dir: &Path) -> Result<(), RegistryError> {
    match platform::dir_facts(dir, false) {
        Ok(Some(f)) if f.is_link => {
            Err(RegistryError::Insecure { dir: dir.to_owned(), why: "it is a symbolic link".into() })
        }
        Ok(Some(f)) => match home::insecurity(&f) {
            Some(why) => Err(RegistryError::Insecure { dir: dir.to_owned(), why }),
            None => Ok(()),
        },
        Ok(None) => Ok(()),
        Err(source) => Err(RegistryError::Io { path: dir.to_owned(), source }),
    }
}

/// Registers `home` (a gateway at start). Idempotent: the entry is rewritten in place.
pub fn register(dir: &Path, home: &str, version: Option<&str>) -> Result<PathBuf, RegistryError> {
    if let Some(why) = invalid(home) {
        return Err(RegistryError::BadHome(home.to_owned(), why));
    }
    ensure_dir(dir)?;
    let path = dir.join(file_name(home));
    let e = Entry { home: home.to_owned(), registered_at: Some(timefmt::now()), version: version.map(str::to_owned) };
    fsio::write_json(&path, &e).map_err(|source| RegistryError::Io { path: path.clone(), source })?;
    Ok(path)
}

/// Removes `home`'s entry (a home deleted for good); a missing one is fine.
pub fn unregister(dir: &Path, home: &str) -> Result<bool, RegistryError> {
    let path = dir.join(file_name(home));
    fsio::remove_if_exists(&path).map_err(|source| RegistryError::Io { path, source })
}

/// What a listing found: the valid entries (sorted by home) and, per skipped file, why.
#[derive(Debug, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    pub skipped: Vec<(String, String)>,
}

/// Every registered home (none when the directory does not exist yet).
pub fn list(dir: &Path) -> Result<Listing, RegistryError> {
    let mut out = Listing::default();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(source) => return Err(RegistryError::Io { path: dir.to_owned(), source }),
    };
    check_dir(dir)?;
    for ent in rd.flatten().take(MAX_HOMES * 4) {
        let name = ent.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.starts_with('.') {
            continue;
        }
        match fsio::read_capped(&ent.path(), MAX_ENTRY_BYTES) {
            ReadOutcome::Ok(bytes) => match parse_entry(&name, &bytes) {
                Ok(e) if out.entries.len() < MAX_HOMES => out.entries.push(e),
                Ok(_) => out.skipped.push((name, format!("more than {MAX_HOMES} homes"))),
                Err(why) => out.skipped.push((name, why)),
            },
            other => out.skipped.push((name, other.describe())),
        }
    }
    out.entries.sort_by(|a, b| a.home.cmp(&b.home));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_from_the_environment() {
        // Absolute on every OS (the Windows tests run under Wine).
        let abs = std::env::temp_dir();
        let (x, h, appdata) = (abs.join("x"), abs.join("h"), abs.join("appdata"));
        let env = |pairs: Vec<(&'static str, OsString)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let homes = |base: PathBuf| base.join("gatewarden").join("homes");
        assert_eq!(
            dir_with(env(vec![("XDG_CONFIG_HOME", x.clone().into()), ("HOME", h.clone().into())])).unwrap(),
            homes(x)
        );
        assert_eq!(
            dir_with(env(vec![("XDG_CONFIG_HOME", "rel".into()), ("HOME", h.clone().into())])).unwrap(),
            homes(h.join(".config"))
        );
        assert!(dir_with(env(vec![("XDG_CONFIG_HOME", "".into())])).is_err());
        assert_eq!(dir_with(env(vec![("APPDATA", appdata.clone().into())])).unwrap(), homes(appdata));
    }

    #[test]
    fn entries_are_validated() {
        let home = std::env::temp_dir().join("srv").join("gw").to_string_lossy().into_owned();
        let good = serde_json::json!({"home": home, "registered_at": "2026-12-01T10:00:00+00:00"}).to_string();
        assert_eq!(parse_entry(&file_name(&home), good.as_bytes()).unwrap().home, home);
        assert!(parse_entry("0000000000000000.json", good.as_bytes()).unwrap_err().contains("file name"));
        let rel = br#"{"home":"gw"}"#;
        assert!(parse_entry(&file_name("gw"), rel).unwrap_err().contains("absolute"));
        let evil = format!("{home}\u{1b}[2J");
        let ctl = serde_json::json!({"home": evil}).to_string();
        assert!(parse_entry(&file_name(&evil), ctl.as_bytes()).unwrap_err().contains("control"));
        assert!(parse_entry("x.json", b"\xff").is_err());
        assert_ne!(file_name("/a"), file_name("/b"));
        assert_eq!(file_name("/a"), file_name("/a"));
    }

    #[cfg(unix)]
    #[test]
    fn register_list_and_hostile_files() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("cfg/gatewarden/homes");
        let p = register(&dir, "/srv/one", Some("0.1.0")).unwrap();
        register(&dir, "/srv/two", None).unwrap();
        register(&dir, "/srv/one", Some("0.2.0")).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(register(&dir, "relative", None).is_err());
        // A link, a FIFO and a planted copy are skipped, with the reason.
        std::os::unix::fs::symlink("/etc/passwd", dir.join(file_name("/etc"))).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(dir.join("fifo.json")).status().unwrap().success());
        std::fs::copy(&p, dir.join("0000000000000000.json")).unwrap();
        let l = list(&dir).unwrap();
        let homes: Vec<(&str, Option<&str>)> =
            l.entries.iter().map(|e| (e.home.as_str(), e.version.as_deref())).collect();
        assert_eq!(homes, [("/srv/one", Some("0.2.0")), ("/srv/two", None)]);
        assert_eq!(l.skipped.len(), 3, "{:?}", l.skipped);
        assert!(unregister(&dir, "/srv/two").unwrap());
        assert_eq!(list(&dir).unwrap().entries.len(), 1);
        // The directory itself must not be a link.
        let link = t.path().join("linked");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(list(&link), Err(RegistryError::Insecure { .. })));
        assert!(matches!(
            register(&link, "/srv/x", None),
            Err(RegistryError::Insecure { .. }) | Err(RegistryError::Io { .. })
        ));
        // Nor writable by others.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(list(&dir), Err(RegistryError::Insecure { .. })));
        assert!(list(&t.path().join("none")).unwrap().entries.is_empty());
    }
}
