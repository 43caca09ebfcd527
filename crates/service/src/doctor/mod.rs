//! Diagnostics: typed findings and pure checks.
//!
//! Every check takes facts the caller already gathered (file contents, parsed status, probe
//! results) and returns [`Finding`]s, so the CLI does the I/O and the policy stays testable.
//! The definition checks delegate to each manager's drift detector, so `doctor`, `start` and
//! `status` report the same thing (class D invariant 4, class E invariant 1).

// The vocabulary lives in its own module (crate::finding), shared with the managers' drift
// detectors, so that doctor -> systemd/launchd/windows is the only direction between them.
pub use crate::finding::{Finding, FindingId, FixAction, Manager, Severity};

use crate::launchd::LaunchAgent;
use crate::spec::{Scope, stop_timeout_s};
use crate::supervise::{ParkKind, ParkedStateRead};
use crate::systemd::{TimeSpan, UnitResult, UnitStatus};

fn not_installed(manager: Manager, what: &str) -> Finding {
    Finding::new(
        FindingId::NotInstalled,
        Severity::Info,
        what,
        format!("no {what} is installed for this home"),
        FixAction::RefreshDefinition { manager },
    )
}

/// Checks an installed systemd unit (`None` = no unit file) against the expected rendering.
/// Pass `systemctl cat` output to include drop-ins.
#[must_use]
pub fn check_systemd_unit(installed: Option<&str>, expected: &str) -> Vec<Finding> {
    match installed {
        None => vec![not_installed(Manager::Systemd, "systemd unit")],
        Some(text) => crate::systemd::drift(text, expected),
    }
}

/// Checks an installed LaunchAgent plist (`None` = no file).
#[must_use]
pub fn check_launchd_plist(installed: Option<&[u8]>, expected: &LaunchAgent) -> Vec<Finding> {
    match installed {
        None => vec![not_installed(Manager::Launchd, "LaunchAgent")],
        Some(bytes) => crate::launchd::drift(bytes, expected),
    }
}

/// Checks an installed scheduled task (`None` = no task; raw bytes from `schtasks /Query /XML`).
#[must_use]
pub fn check_task(installed: Option<&[u8]>, expected: &str) -> Vec<Finding> {
    match installed {
        None => vec![not_installed(Manager::WindowsTask, "scheduled task")],
        Some(bytes) => crate::windows::drift(&crate::windows::decode_task_xml(bytes), expected),
    }
}

/// Checks an installed stop timeout (`TimeoutStopSec=`, `ExitTimeOut`) against the drain
/// budget directly: shorter than the drain is always an error, whatever the generator says.
#[must_use]
pub fn check_stop_timeout(
    manager: Manager,
    subject: &str,
    installed: Option<TimeSpan>,
    drain_timeout_s: u64,
    cron_floor_s: u64,
) -> Vec<Finding> {
    let required = stop_timeout_s(drain_timeout_s, cron_floor_s, 0);
    let have_s = match installed {
        Some(TimeSpan::Infinity) => return vec![],
        Some(TimeSpan::Finite(d)) => d.as_secs(),
        // systemd's default TimeoutStopSec is 90 s.
        None => 90,
    };
    if have_s >= required {
        return vec![];
    }
    let severity = if have_s < drain_timeout_s { Severity::Error } else { Severity::Warning };
    vec![Finding::new(
        FindingId::StopTimeoutTooShort,
        severity,
        subject,
        format!(
            "stop timeout is {have_s} s; the drain budget is {drain_timeout_s} s and the required \
             timeout is {required} s: the manager would kill the gateway mid-drain"
        ),
        FixAction::RefreshDefinition { manager },
    )]
}

/// What systemd says about loading an installed unit: `systemctl show -p
/// LoadState,LoadError,NeedDaemonReload,UnitFileState`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitLoad {
    /// `loaded`, `not-found`, `bad-setting`, `error`, `masked`.
    pub load_state: String,
    /// Why it is not loaded (systemd's words), when it says.
    pub load_error: String,
    /// The file changed on disk since the last `daemon-reload`.
    pub need_daemon_reload: bool,
    /// `enabled`, `disabled`, `linked`, …
    pub unit_file_state: String,
}

impl UnitLoad {
    /// From `systemctl show` lines (`Key=Value`); total.
    #[must_use]
    pub fn parse(text: &str) -> UnitLoad {
        let mut u = UnitLoad::default();
        for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
            match k.trim() {
                "LoadState" => u.load_state = v.trim().to_owned(),
                "LoadError" => u.load_error = v.trim().to_owned(),
                "NeedDaemonReload" => u.need_daemon_reload = v.trim() == "yes",
                "UnitFileState" => u.unit_file_state = v.trim().to_owned(),
                _ => {}
            }
        }
        u
    }
}

/// Checks that an installed systemd unit is what the manager runs: the manager answers
/// (`load` is `Err` with its words otherwise), the unit is loaded from the file on disk, and it
/// is enabled (issue 27 §4: a failed install left a unit on disk that systemd never loaded,
/// and doctor found nothing).
#[must_use]
pub fn check_systemd_load(load: Result<&UnitLoad, &str>, unit: &str, scope: Scope) -> Vec<Finding> {
    let refresh = || FixAction::RefreshDefinition { manager: Manager::Systemd };
    let load = match load {
        Ok(l) => l,
        Err(why) => {
            let user = if scope == Scope::User { " --user" } else { "" };
            return vec![Finding::new(
                FindingId::ManagerUnreachable,
                Severity::Error,
                unit,
                format!(
                    "the systemd manager does not answer ({why}): {unit} can be neither started nor stopped                      through it"
                ),
                FixAction::Manual {
                    hint: format!(
                        "make `systemctl{user} status` work (a user manager needs a session or lingering, and                          XDG_RUNTIME_DIR set), then run doctor again"
                    ),
                },
            )];
        }
    };
    let mut out = Vec::new();
    if load.load_state != "loaded" {
        let error = if load.load_error.is_empty() { String::new() } else { format!(": {}", load.load_error) };
        out.push(Finding::new(
            FindingId::DefinitionNotLoaded,
            Severity::Error,
            unit,
            format!(
                "the unit file is installed but systemd has not loaded it (LoadState={}{error}): starting it                  fails; a `service install` did not finish",
                if load.load_state.is_empty() { "?" } else { &load.load_state }
            ),
            refresh(),
        ));
    } else if load.need_daemon_reload {
        out.push(Finding::new(
            FindingId::DefinitionNotLoaded,
            Severity::Error,
            unit,
            "the unit file changed on disk but systemd still has the old one (NeedDaemonReload=yes)",
            refresh(),
        ));
    }
    if load.load_state == "loaded" && !matches!(load.unit_file_state.as_str(), "enabled" | "enabled-runtime") {
        // Every install enables it (`--no-start` too): a disabled unit is one whose install
        // did not finish (systemd loads a unit file on demand, so this is what a failed
        // `daemon-reload` leaves), or one disabled by hand.
        out.push(Finding::new(
            FindingId::DefinitionNotEnabled,
            Severity::Error,
            unit,
            format!(
                "the unit is not enabled (UnitFileState={}): it will not start at {}; a `service install` \
                 did not finish, or it was disabled by hand",
                if load.unit_file_state.is_empty() { "?" } else { &load.unit_file_state },
                if scope == Scope::User { "login" } else { "boot" }
            ),
            refresh(),
        ));
    }
    out
}

/// Checks that an installed LaunchAgent is loaded: `Ok(loaded)` from `launchctl print`, `Err`
/// with its words when launchd does not answer.
#[must_use]
pub fn check_launchd_loaded(loaded: Result<bool, &str>, label: &str) -> Vec<Finding> {
    match loaded {
        Ok(true) => vec![],
        Ok(false) => vec![Finding::new(
            FindingId::DefinitionNotLoaded,
            Severity::Warning,
            label,
            "the plist is installed but launchd has not loaded it: nothing starts it at login until              `gatewarden start` (or a `service install` that did not finish)",
            FixAction::RefreshDefinition { manager: Manager::Launchd },
        )],
        Err(why) => vec![Finding::new(
            FindingId::ManagerUnreachable,
            Severity::Error,
            label,
            format!("launchd does not answer ({why}): the job can be neither started nor stopped through it"),
            FixAction::Manual { hint: "run it from the user's GUI session (launchctl print gui/$UID)".into() },
        )],
    }
}

/// Checks `systemctl show` status for a tripped start-rate limit.
#[must_use]
pub fn check_systemd_status(status: &UnitStatus, unit: &str, scope: Scope) -> Vec<Finding> {
    if status.result != Some(UnitResult::StartLimitHit) {
        return vec![];
    }
    let mut argv = vec!["systemctl".to_owned()];
    if scope == Scope::User {
        argv.push("--user".to_owned());
    }
    argv.extend(["reset-failed".to_owned(), unit.to_owned()]);
    vec![Finding::new(
        FindingId::StartLimitHit,
        Severity::Error,
        unit,
        format!(
            "systemd stopped restarting {unit} after too many starts in a short time \
             (last exit status {}); fix the cause in the log, then reset it",
            status.exec_main_status.map_or_else(|| "unknown".to_owned(), |c| c.to_string())
        ),
        FixAction::Run { argv },
    )]
}

/// Reports a parked supervisor (`supervise_state.json`).
#[must_use]
pub fn check_parked(state: &ParkedStateRead, exe: &str, home: &str) -> Vec<Finding> {
    match state {
        ParkedStateRead::Missing => vec![],
        ParkedStateRead::Unreadable(why) => vec![Finding::new(
            FindingId::ParkedStateUnreadable,
            Severity::Warning,
            crate::supervise::PARKED_STATE_FILE,
            format!("the supervisor's state file cannot be read: {why}"),
            FixAction::Manual { hint: "remove it; `gatewarden start` writes a fresh one if needed".into() },
        )],
        ParkedStateRead::Parked(s) => {
            let id = match s.kind {
                ParkKind::CrashLoop => FindingId::ParkedCrashLoop,
                ParkKind::FatalConfig => FindingId::ParkedFatalConfig,
            };
            vec![Finding::new(
                id,
                Severity::Error,
                crate::supervise::PARKED_STATE_FILE,
                format!("the supervisor parked the gateway at {}: {}", s.parked_at, s.reason),
                FixAction::Run { argv: vec![exe.to_owned(), "start".to_owned(), "--home".to_owned(), home.to_owned()] },
            )]
        }
    }
}

/// Reports that a user-scope systemd service will stop at logout (`lingering = Some(false)`).
#[must_use]
pub fn check_linger(user: &str, lingering: Option<bool>) -> Vec<Finding> {
    if lingering != Some(false) {
        return vec![];
    }
    vec![Finding::new(
        FindingId::LingerDisabled,
        Severity::Warning,
        "linger",
        crate::systemd::linger_hint(user),
        FixAction::Run { argv: vec!["loginctl".into(), "enable-linger".into(), user.into()] },
    )]
}

/// File-system facts about the home, gathered by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HomeFacts {
    /// The path exists.
    pub exists: bool,
    /// It is a directory.
    pub is_dir: bool,
    /// We can create files in it.
    pub writable: bool,
    /// Unix permission bits, if known.
    pub mode: Option<u32>,
    /// The owner's uid, when it is not ours (`None`: ours, or unknown).
    pub foreign_owner: Option<u32>,
}

/// Checks the home directory. A missing home is fine (`run` creates it).
#[must_use]
pub fn check_home(home: &str, f: &HomeFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    if f.exists && (!f.is_dir || !f.writable) {
        out.push(Finding::new(
            FindingId::HomeUnusable,
            Severity::Error,
            home,
            if f.is_dir { "the home is not writable" } else { "the home exists but is not a directory" },
            FixAction::Manual { hint: "fix the path or its permissions, or choose another --home".into() },
        ));
    }
    // Never an automatic chmod of a directory others share or own (`--home /tmp` must not
    // narrow /tmp for everyone): `run` refuses those homes, and the fix is another home.
    if let Some(uid) = f.foreign_owner.filter(|_| f.exists && f.is_dir) {
        out.push(Finding::new(
            FindingId::HomeUnusable,
            Severity::Error,
            home,
            format!("the home belongs to another user (uid {uid}); `run` refuses it (exit 78)"),
            FixAction::Manual { hint: "choose a home you own (--home or GATEWARDEN_HOME)".into() },
        ));
    } else if let Some(mode) = f.mode.filter(|m| f.exists && f.is_dir && m & 0o022 != 0) {
        out.push(Finding::new(
            FindingId::HomeUnusable,
            Severity::Error,
            home,
            format!(
                "other users can write to the home (mode {:o}); `run` refuses it (exit 78): they could plant files the gateway trusts",
                mode & 0o7777
            ),
            FixAction::Manual {
                hint: "choose a private home; if this directory is yours alone, `chmod 700` it (never a shared one such as /tmp)".into(),
            },
        ));
    } else if let Some(mode) = f.mode.filter(|m| f.exists && f.is_dir && m & 0o077 != 0) {
        out.push(Finding::new(
            FindingId::HomePermissions,
            Severity::Warning,
            home,
            format!("the home is readable by other users (mode {:o}); it should be 0700", mode & 0o7777),
            FixAction::Run { argv: vec!["chmod".into(), "700".into(), home.into()] },
        ));
    }
    out
}

/// Facts about the configured listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    /// `host:port`.
    pub addr: String,
    /// Binding it failed with "address in use".
    pub in_use: bool,
    /// The holder is this home's own running gateway.
    pub held_by_own_gateway: bool,
}

/// Checks the listen address: taken by someone else means `run` exits 78.
#[must_use]
pub fn check_port(f: &PortFacts) -> Vec<Finding> {
    if !f.in_use || f.held_by_own_gateway {
        return vec![];
    }
    vec![Finding::new(
        FindingId::PortInUse,
        Severity::Error,
        f.addr.clone(),
        format!("{} is in use by another process; the gateway would exit 78 (fatal configuration)", f.addr),
        FixAction::Manual { hint: "stop the other process or configure another listen address".into() },
    )]
}

/// Orders findings most severe first, keeping the original order within a severity.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::{ChildExit, ParkedState};
    use std::time::Duration;

    #[test]
    fn not_installed_is_info() {
        let f = check_systemd_unit(None, "");
        assert_eq!(f[0].id, FindingId::NotInstalled);
        assert_eq!(f[0].severity, Severity::Info);
        assert_eq!(check_task(None, "")[0].id, FindingId::NotInstalled);
    }

    #[test]
    fn stop_timeout_below_drain_is_an_error() {
        let f = check_stop_timeout(
            Manager::Systemd,
            "Service.TimeoutStopSec",
            Some(TimeSpan::Finite(Duration::from_secs(20))),
            30,
            0,
        );
        assert_eq!(f[0].id, FindingId::StopTimeoutTooShort);
        assert_eq!(f[0].severity, Severity::Error);
        let f = check_stop_timeout(
            Manager::Systemd,
            "Service.TimeoutStopSec",
            Some(TimeSpan::Finite(Duration::from_secs(60))),
            30,
            0,
        );
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(
            check_stop_timeout(Manager::Systemd, "x", Some(TimeSpan::Finite(Duration::from_secs(100))), 30, 0)
                .is_empty()
        );
        assert!(check_stop_timeout(Manager::Systemd, "x", Some(TimeSpan::Infinity), 30, 0).is_empty());
        // Unset means systemd's 90 s default.
        assert!(check_stop_timeout(Manager::Systemd, "x", None, 0, 0).is_empty());
        assert_eq!(check_stop_timeout(Manager::Systemd, "x", None, 60, 0).len(), 1);
    }

    #[test]
    fn start_limit_hit_names_reset_command() {
        let st = crate::systemd::parse_show("Result=start-limit-hit\nExecMainStatus=1\n");
        let f = check_systemd_status(&st, "gatewarden.service", Scope::User);
        assert_eq!(
            f[0].fix,
            FixAction::Run {
                argv: vec!["systemctl".into(), "--user".into(), "reset-failed".into(), "gatewarden.service".into()]
            }
        );
        let ok = crate::systemd::parse_show("Result=success\n");
        assert!(check_systemd_status(&ok, "u", Scope::System).is_empty());
    }

    #[test]
    fn parked_states_are_reported() {
        let s = ParkedState::new(ParkKind::CrashLoop, "crash loop: 5 restarts", ChildExit::Code(1), 5, 9, "/h");
        let f = check_parked(&ParkedStateRead::Parked(s), "/bin/gw", "/h");
        assert_eq!(f[0].id, FindingId::ParkedCrashLoop);
        assert!(f[0].message.contains("crash loop: 5 restarts"));
        let s = ParkedState::new(ParkKind::FatalConfig, "78", ChildExit::Code(78), 0, 9, "/h");
        assert_eq!(check_parked(&ParkedStateRead::Parked(s), "gw", "/h")[0].id, FindingId::ParkedFatalConfig);
        assert!(check_parked(&ParkedStateRead::Missing, "gw", "/h").is_empty());
        assert_eq!(
            check_parked(&ParkedStateRead::Unreadable("x".into()), "gw", "/h")[0].id,
            FindingId::ParkedStateUnreadable
        );
    }

    #[test]
    fn home_port_and_linger_checks() {
        assert!(check_home("/h", &HomeFacts::default()).is_empty());
        let f = check_home(
            "/h",
            &HomeFacts { exists: true, is_dir: true, writable: true, mode: Some(0o40755), foreign_owner: None },
        );
        assert_eq!(f[0].id, FindingId::HomePermissions);
        assert!(f[0].message.contains("755"));
        let f = check_home(
            "/h",
            &HomeFacts { exists: true, is_dir: false, writable: true, mode: None, foreign_owner: None },
        );
        assert_eq!(f[0].id, FindingId::HomeUnusable);
        assert!(
            check_home(
                "/h",
                &HomeFacts { exists: true, is_dir: true, writable: true, mode: Some(0o700), foreign_owner: None }
            )
            .is_empty()
        );
        // A shared or foreign directory is an error with no automatic chmod (never narrow /tmp).
        let tmp = HomeFacts { exists: true, is_dir: true, writable: true, mode: Some(0o41777), foreign_owner: None };
        let f = check_home("/tmp", &tmp);
        assert_eq!((f[0].id, f[0].severity), (FindingId::HomeUnusable, Severity::Error));
        assert!(matches!(f[0].fix, FixAction::Manual { .. }), "{:?}", f[0].fix);
        let foreign = HomeFacts { foreign_owner: Some(1001), mode: Some(0o40700), ..tmp };
        let f = check_home("/srv/x", &foreign);
        assert!(f[0].message.contains("uid 1001") && matches!(f[0].fix, FixAction::Manual { .. }));

        let mine = PortFacts { addr: "127.0.0.1:7878".into(), in_use: true, held_by_own_gateway: true };
        assert!(check_port(&mine).is_empty());
        let theirs = PortFacts { held_by_own_gateway: false, ..mine };
        assert_eq!(check_port(&theirs)[0].id, FindingId::PortInUse);

        assert_eq!(check_linger("alice", Some(false))[0].id, FindingId::LingerDisabled);
        assert!(check_linger("alice", None).is_empty());
    }

    #[test]
    fn sorting_puts_errors_first_and_findings_serialize() {
        let mut v = vec![
            Finding::new(FindingId::NotInstalled, Severity::Info, "a", "m", FixAction::None),
            Finding::new(FindingId::WrongBinary, Severity::Error, "b", "m", FixAction::None),
            Finding::new(FindingId::LingerDisabled, Severity::Warning, "c", "m", FixAction::None),
        ];
        sort_findings(&mut v);
        let subjects: Vec<_> = v.iter().map(|f| f.subject.as_str()).collect();
        assert_eq!(subjects, ["b", "c", "a"]);
        let json = serde_json::to_value(&v[0]).unwrap();
        assert_eq!(json["id"], "wrong-binary");
        assert_eq!(json["severity"], "error");
        assert_eq!(json["fix"]["kind"], "none");
        assert_eq!(v[0].to_string(), "error[wrong-binary] b: m");
        for id in [FindingId::OldKeepAlivePolicy, FindingId::ParkedStateUnreadable, FindingId::StopTimeoutTooShort] {
            assert_eq!(serde_json::to_value(id).unwrap(), id.as_str());
        }
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;

    fn ids(f: &[Finding]) -> Vec<FindingId> {
        f.iter().map(|f| f.id).collect()
    }

    #[test]
    fn a_unit_systemd_never_loaded_or_enabled_is_a_finding() {
        let ok = UnitLoad::parse("LoadState=loaded\nNeedDaemonReload=no\nUnitFileState=enabled\nLoadError=\n");
        assert!(check_systemd_load(Ok(&ok), "gw.service", Scope::User).is_empty());
        let not_found = UnitLoad::parse(
            "LoadState=not-found\nLoadError=org.freedesktop.systemd1.NoSuchUnit \"Unit gw.service not found.\"\n",
        );
        let f = check_systemd_load(Ok(&not_found), "gw.service", Scope::User);
        assert_eq!(ids(&f), [FindingId::DefinitionNotLoaded]);
        assert!(f[0].message.contains("not found") && f[0].severity == Severity::Error, "{f:?}");
        let stale = UnitLoad { need_daemon_reload: true, ..ok.clone() };
        assert_eq!(ids(&check_systemd_load(Ok(&stale), "gw.service", Scope::User)), [FindingId::DefinitionNotLoaded]);
        let disabled = UnitLoad { unit_file_state: "disabled".into(), ..ok };
        let f = check_systemd_load(Ok(&disabled), "gw.service", Scope::System);
        assert_eq!(ids(&f), [FindingId::DefinitionNotEnabled]);
        assert!(f[0].message.contains("boot"), "{f:?}");
        let f = check_systemd_load(Err("Failed to connect to bus"), "gw.service", Scope::User);
        assert_eq!(ids(&f), [FindingId::ManagerUnreachable]);
        assert!(f[0].message.contains("Failed to connect to bus"), "{f:?}");
    }

    #[test]
    fn a_plist_launchd_has_not_loaded_is_a_finding() {
        assert!(check_launchd_loaded(Ok(true), "l").is_empty());
        assert_eq!(ids(&check_launchd_loaded(Ok(false), "l")), [FindingId::DefinitionNotLoaded]);
        assert_eq!(ids(&check_launchd_loaded(Err("EIO"), "l")), [FindingId::ManagerUnreachable]);
    }
}
