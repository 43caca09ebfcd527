//! The typed description of one installed gateway service, and the timing arithmetic every
//! manager definition derives from it.
//!
//! A [`ServiceSpec`] is manager-neutral: the systemd unit, the LaunchAgent plist and the
//! Windows task/service are all rendered from it, and doctor compares installed definitions
//! against a fresh rendering. Rendering validates the spec first
//! ([`ServiceSpec::validate_unix`], [`ServiceSpec::validate_windows`]) so a bad path or
//! argument is a typed [`SpecError`], never a malformed file.
//!
//! Paths are checked as *strings* for the target manager's notion of "absolute" (a leading `/`
//! for systemd and launchd, a drive or UNC prefix for Windows) instead of
//! [`Path::is_absolute`], so rendering a Linux unit gives the same answer on every host and
//! the tests pass on every platform.

use std::path::{Path, PathBuf};

use crate::naming::ServiceNames;

/// Grace after the drain budget for the final stop (close listeners, flush, exit).
pub const STOP_GRACE_S: u64 = 30;
/// Reserve on top of the cron floor, as hermes' `resolve_systemd_timeout_stop_sec`.
pub const CRON_RESERVE_S: u64 = 10;
/// The runtime's in-process shutdown watchdog fires at `drain + SHUTDOWN_WATCHDOG_EXTRA_S`.
pub const SHUTDOWN_WATCHDOG_EXTRA_S: u64 = 60;
/// Headroom above the shutdown watchdog so the manager never kills first.
pub const WATCHDOG_HEADROOM_S: u64 = 10;

/// How long a service manager must allow a stop to take before it kills the process.
///
/// `max(max(drain, cron_floor + 10) + 30, drain + 60 + 10, watchdog)`: the first term is
/// hermes' drain-plus-grace budget, the second covers the in-process shutdown watchdog (so the
/// process, not the manager, decides when a drain has wedged), the third keeps the stop timeout
/// at least as long as the systemd `WatchdogSec=` deadline. Saturating: never panics.
///
/// With the hermes defaults (`drain = 0`, `cron_floor = 30`) this is 70, hermes' default.
#[must_use]
pub fn stop_timeout_s(drain_timeout_s: u64, cron_floor_s: u64, watchdog_s: u64) -> u64 {
    let drain_budget = drain_timeout_s.max(cron_floor_s.saturating_add(CRON_RESERVE_S)).saturating_add(STOP_GRACE_S);
    let shutdown_watchdog =
        drain_timeout_s.saturating_add(SHUTDOWN_WATCHDOG_EXTRA_S).saturating_add(WATCHDOG_HEADROOM_S);
    drain_budget.max(shutdown_watchdog).max(watchdog_s)
}

/// Which service manager instance owns the definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The user's own manager (`systemctl --user`, a LaunchAgent, a per-user task).
    User,
    /// The system manager (`/etc/systemd/system`, a Windows SCM service).
    System,
}

/// Everything needed to render and check a gateway service definition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceSpec {
    /// Absolute path of the `gatewarden` executable.
    pub exe: PathBuf,
    /// Canonical (absolute, symlink-resolved) home.
    pub home: PathBuf,
    /// Whether `home` is the per-OS default home (selects the bare service names).
    pub is_default_home: bool,
    /// Extra arguments appended after `--home <home>`.
    pub extra_args: Vec<String>,
    /// The gateway's drain budget in seconds.
    pub drain_timeout_s: u64,
    /// Minimum drain for running cron work, in seconds (hermes' `cron_drain_timeout`).
    pub cron_floor_s: u64,
    /// Which manager owns the definition.
    pub scope: Scope,
    /// Account the system-scope service runs as (`User=`); ignored for user scope.
    pub run_as_user: Option<String>,
    /// systemd `RestartSec=` in milliseconds; `None` is the generator's choice
    /// (crates/service/src/systemd/render.rs: 0 where the crash-backoff helper holds the whole
    /// ladder, 100 ms under `RestartSteps=`). Short on purpose: a planned restart (exit 75)
    /// should be back at once (class G2: a long backoff hides the gap).
    pub restart_sec_ms: Option<u64>,
    /// systemd `WatchdogSec=` in seconds; 0 omits the directive.
    pub watchdog_s: u64,
    /// `StartLimitIntervalSec=`, seconds. 0 (the default): systemd never stops restarting a
    /// crashing gateway; the brake is a growing delay instead (see `restart_steps`), so a
    /// crash loop ends by itself once its cause is gone (issue 22: a unit that hit its start
    /// limit stayed down for good, silently).
    pub start_limit_interval_s: u64,
    /// Crash-loop brake burst (`StartLimitBurst=`).
    pub start_limit_burst: u32,
    /// systemd ≥ 254: the growing delay is systemd's own (`RestartSteps=`/`RestartMaxDelaySec=`).
    /// Older systemd: `ExecStopPost=` runs `gatewarden crash-backoff`, which waits the same
    /// growing delay after an unplanned exit (read from the ledger) before systemd's restart.
    pub restart_steps: bool,
    /// launchd `ThrottleInterval` in seconds (minimum time between spawns of the job).
    pub throttle_interval_s: u64,
    /// The last known good binary (`<home>/releases/good/`), run by systemd's `ExecStopPost=`
    /// as `update --after-exit`: a release that dies before it runs a line of our code cannot
    /// revert itself, this copy can. `None` omits the directive.
    pub revert_exe: Option<PathBuf>,
    /// systemd credentials, `(id, absolute path)`: one `LoadCredential=<id>:<path>` each, so the
    /// gateway reads systemd's copy in `$CREDENTIALS_DIRECTORY` (crates/config/src/secrets.rs;
    /// every `*_file` of config.toml). launchd and Windows read the files themselves.
    pub credentials: Vec<(String, PathBuf)>,
}

/// Why a spec cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A path is not valid UTF-8; service definitions are text.
    #[error("{what} is not valid UTF-8: {path:?}")]
    NonUtf8Path {
        /// Which field.
        what: &'static str,
        /// The offending path.
        path: PathBuf,
    },
    /// A path is not absolute for the target manager.
    #[error("{what} must be an absolute path, got {path:?}")]
    NotAbsolute {
        /// Which field.
        what: &'static str,
        /// The offending path.
        path: String,
    },
    /// A value contains a control character (newline, NUL, …) that no definition format can
    /// carry safely.
    #[error("{what} contains a control character: {value:?}")]
    ControlCharacter {
        /// Which field.
        what: &'static str,
        /// The offending value.
        value: String,
    },
    /// The `User=` name is not a plausible account name.
    #[error("run-as user {0:?} is not a valid account name")]
    InvalidUser(String),
    /// A system unit without `User=` would run as root whoever owns the home ([`run_as_for`]).
    #[error(
        "a system unit must name the user it runs as, and the home's owner is not known (create the home first, or give --run-as USER)"
    )]
    NoUser,
    /// A credential name systemd would not accept (letters, digits, `-`, `_`, `.`).
    #[error("credential name {0:?} is not a valid file name")]
    InvalidCredential(String),
    /// A numeric setting is out of range.
    #[error("{what} is out of range: {value}")]
    OutOfRange {
        /// Which field.
        what: &'static str,
        /// The value given.
        value: u64,
    },
}

impl ServiceSpec {
    /// A spec with the documented defaults: user scope, 30 s drain, the generator's restart delay,
    /// 30 s watchdog, at most 5 starts in 60 s, 10 s launchd throttle.
    #[must_use]
    pub fn new(exe: impl Into<PathBuf>, home: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            home: home.into(),
            is_default_home: false,
            extra_args: Vec::new(),
            drain_timeout_s: 30,
            cron_floor_s: 0,
            scope: Scope::User,
            run_as_user: None,
            restart_sec_ms: None,
            watchdog_s: 30,
            start_limit_interval_s: 0,
            start_limit_burst: 5,
            restart_steps: false,
            throttle_interval_s: 10,
            revert_exe: None,
            credentials: Vec::new(),
        }
    }

    /// The manager-visible names for this spec's home.
    #[must_use]
    pub fn names(&self) -> ServiceNames {
        ServiceNames::new(&self.home, self.is_default_home)
    }

    /// [`stop_timeout_s`] for this spec.
    #[must_use]
    pub fn stop_timeout_s(&self) -> u64 {
        stop_timeout_s(self.drain_timeout_s, self.cron_floor_s, self.watchdog_s)
    }

    /// Checks for a Unix manager (systemd, launchd): absolute `/` paths, UTF-8, no control
    /// characters anywhere, a plausible `User=`, credential names systemd accepts.
    pub fn validate_unix(&self) -> Result<(), SpecError> {
        let exe = utf8("exe", &self.exe)?;
        let home = utf8("home", &self.home)?;
        let mut paths = vec![("exe", exe), ("home", home)];
        for (id, path) in &self.credentials {
            let ok = !id.is_empty()
                && id.len() <= 255
                && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && id != "."
                && id != "..";
            if !ok {
                return Err(SpecError::InvalidCredential(id.clone()));
            }
            paths.push(("credential file", utf8("credential file", path)?));
        }
        for (what, p) in paths {
            if !p.starts_with('/') {
                return Err(SpecError::NotAbsolute { what, path: p.to_owned() });
            }
            no_control(what, p)?;
        }
        self.validate_common(exe, home)
    }

    /// Checks for Windows: drive (`C:\`) or UNC (`\\server\share`) paths, UTF-8, no control
    /// characters.
    pub fn validate_windows(&self) -> Result<(), SpecError> {
        let exe = utf8("exe", &self.exe)?;
        let home = utf8("home", &self.home)?;
        for (what, p) in [("exe", exe), ("home", home)] {
            if !is_windows_absolute(p) {
                return Err(SpecError::NotAbsolute { what, path: p.to_owned() });
            }
        }
        self.validate_common(exe, home)
    }

    fn validate_common(&self, exe: &str, home: &str) -> Result<(), SpecError> {
        no_control("exe", exe)?;
        no_control("home", home)?;
        for a in &self.extra_args {
            no_control("extra argument", a)?;
        }
        if let Some(u) = &self.run_as_user {
            let ok = !u.is_empty()
                && u.len() <= 256
                && u.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '\\' | '$'))
                && !u.starts_with('-');
            if !ok {
                return Err(SpecError::InvalidUser(u.clone()));
            }
        }
        if self.start_limit_burst == 0 {
            return Err(SpecError::OutOfRange { what: "start_limit_burst", value: 0 });
        }
        // launchd and Task Scheduler store these as 32-bit integers.
        if self.stop_timeout_s() > u64::from(u32::MAX / 1000) {
            return Err(SpecError::OutOfRange { what: "drain_timeout_s", value: self.drain_timeout_s });
        }
        Ok(())
    }
}

/// Whom a unit for a home owned by `owner` (uid, gid) runs as, installed by `me` in `scope`:
/// the one rule of native and hermes units (crates/hermes/src/unit.rs). `Ok(None)`: as the
/// user manager's own user. `Ok(Some(..))`: as the owner, always for a system unit (one
/// without `User=` runs as root whoever owns the home; root's home gets `User=0`, said). `Err`
/// when the scope cannot run as the owner (a user manager runs everything as its user) or the
/// owner is not known.
pub fn run_as_for(scope: Scope, owner: Option<(u32, u32)>, me: Option<u32>) -> Result<Option<(u32, u32)>, String> {
    let Some((uid, gid)) = owner else {
        return match scope {
            Scope::System => {
                Err("the home's owner is not known, and a system unit must name the user it runs as".into())
            }
            Scope::User => Ok(None),
        };
    };
    match scope {
        Scope::System => Ok(Some((uid, gid))),
        Scope::User if me.is_none_or(|me| me == uid) => Ok(None),
        Scope::User => Err(format!(
            "the home belongs to uid {uid}, and a user unit of uid {} would run as that user against it; \
             install it as the home's owner, or with --system (then it runs as uid {uid})",
            me.unwrap_or_default()
        )),
    }
}

/// `path` as UTF-8 or a typed error.
pub(crate) fn utf8<'a>(what: &'static str, path: &'a Path) -> Result<&'a str, SpecError> {
    path.to_str().ok_or_else(|| SpecError::NonUtf8Path { what, path: path.to_owned() })
}

fn no_control(what: &'static str, value: &str) -> Result<(), SpecError> {
    if value.chars().any(char::is_control) {
        return Err(SpecError::ControlCharacter { what, value: value.to_owned() });
    }
    Ok(())
}

/// `C:\…`, `C:/…` or `\\server\…`.
pub(crate) fn is_windows_absolute(p: &str) -> bool {
    let b = p.as_bytes();
    let drive = b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && matches!(b[2], b'\\' | b'/');
    drive || p.starts_with(r"\\")
}

/// Joins a child onto a Unix path string without going through the host's [`Path`] rules.
pub(crate) fn unix_join(base: &str, child: &str) -> String {
    format!("{}/{child}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_system_unit_runs_as_the_homes_owner_root_included() {
        assert_eq!(run_as_for(Scope::System, Some((1001, 1002)), Some(0)), Ok(Some((1001, 1002))));
        assert_eq!(run_as_for(Scope::System, Some((0, 0)), Some(0)), Ok(Some((0, 0))), "User=0, said");
        assert!(run_as_for(Scope::System, None, Some(0)).is_err(), "never a system unit without User=");
        assert_eq!(run_as_for(Scope::User, Some((1001, 1002)), Some(1001)), Ok(None));
        assert!(run_as_for(Scope::User, Some((1001, 1002)), Some(0)).unwrap_err().contains("--system"));
    }

    #[test]
    fn stop_timeout_follows_hermes_arithmetic() {
        // hermes default: drain 0, cron floor 30 -> 70.
        assert_eq!(stop_timeout_s(0, 30, 0), 70);
        // Large drain: drain + 70 dominates max(drain, cron+10) + 30.
        assert_eq!(stop_timeout_s(180, 30, 0), 250);
        // Huge cron floor dominates.
        assert_eq!(stop_timeout_s(0, 100, 0), 140);
        // WatchdogSec dominates when absurdly long.
        assert_eq!(stop_timeout_s(0, 0, 600), 600);
        // Saturates instead of overflowing.
        assert_eq!(stop_timeout_s(u64::MAX, u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn stop_timeout_always_covers_drain_grace_and_watchdog() {
        for drain in [0, 1, 29, 30, 31, 120, 3600] {
            for cron in [0, 5, 30, 600] {
                let t = stop_timeout_s(drain, cron, 30);
                assert!(t >= drain + STOP_GRACE_S);
                assert!(t >= drain + SHUTDOWN_WATCHDOG_EXTRA_S + WATCHDOG_HEADROOM_S);
                assert!(t >= cron + CRON_RESERVE_S + STOP_GRACE_S);
                assert!(t >= 30);
            }
        }
    }

    #[test]
    fn validation_rejects_bad_input_with_typed_errors() {
        let good = ServiceSpec::new("/usr/bin/gatewarden", "/home/a/gw");
        assert_eq!(good.validate_unix(), Ok(()));

        let rel = ServiceSpec::new("gatewarden", "/home/a/gw");
        assert!(matches!(rel.validate_unix(), Err(SpecError::NotAbsolute { what: "exe", .. })));

        let mut nl = good.clone();
        nl.extra_args.push("a\nb".into());
        assert!(matches!(nl.validate_unix(), Err(SpecError::ControlCharacter { .. })));

        let mut user = good.clone();
        user.run_as_user = Some("bob; rm".into());
        assert!(matches!(user.validate_unix(), Err(SpecError::InvalidUser(_))));

        let mut huge = good.clone();
        huge.drain_timeout_s = u64::MAX;
        assert!(matches!(huge.validate_unix(), Err(SpecError::OutOfRange { .. })));

        let win = ServiceSpec::new(r"C:\gw\gatewarden.exe", r"C:\Users\a\AppData\Local\gatewarden");
        assert_eq!(win.validate_windows(), Ok(()));
        assert!(win.validate_unix().is_err());
        assert!(good.validate_windows().is_err());
        assert!(is_windows_absolute(r"\\srv\share\gw"));
    }

    #[test]
    fn unix_join_never_doubles_slashes() {
        assert_eq!(unix_join("/h/", "logs"), "/h/logs");
        assert_eq!(unix_join("/h", "logs"), "/h/logs");
    }
}
