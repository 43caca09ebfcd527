//! Rendering, reading and drift-checking the LaunchAgent plist.

use std::collections::BTreeMap;
use std::io::Cursor;

use super::{LaunchdError, SUPERVISE_VERB};
use crate::finding::{Finding, FindingId, FixAction, Manager, Severity};
use crate::spec::{ServiceSpec, unix_join, utf8};

/// `KeepAlive`: a bool, or a dictionary of conditions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum KeepAlive {
    /// `<true/>` / `<false/>`.
    Always(bool),
    /// `<dict>…</dict>`.
    Conditions(KeepAliveConditions),
}

/// The `KeepAlive` dictionary keys we use or recognise.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeepAliveConditions {
    /// `false`: relaunch only after a non-zero exit (or a signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub successful_exit: Option<bool>,
    /// `true`: relaunch only after a crash (signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crashed: Option<bool>,
}

/// The LaunchAgent, as we write it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LaunchAgent {
    /// Job label.
    pub label: String,
    /// `gatewarden supervise --home H …`.
    pub program_arguments: Vec<String>,
    /// Start when loaded (login, bootstrap).
    pub run_at_load: bool,
    /// Revival policy, see the module docs of [`super`].
    pub keep_alive: KeepAlive,
    /// Minimum seconds between spawns.
    pub throttle_interval: u64,
    /// Seconds between SIGTERM and SIGKILL on stop.
    pub exit_time_out: u64,
    /// launchd-captured stdout.
    pub standard_out_path: String,
    /// launchd-captured stderr.
    pub standard_error_path: String,
    /// `GATEWARDEN_HOME`.
    pub environment_variables: BTreeMap<String, String>,
}

/// Builds the typed LaunchAgent for `spec`.
pub fn launch_agent(spec: &ServiceSpec) -> Result<LaunchAgent, LaunchdError> {
    spec.validate_unix()?;
    let exe = utf8("exe", &spec.exe)?;
    let home = utf8("home", &spec.home)?;
    let logs = unix_join(home, "logs");
    let mut program_arguments = vec![exe.to_owned(), SUPERVISE_VERB.to_owned(), "--home".to_owned(), home.to_owned()];
    program_arguments.extend(spec.extra_args.iter().cloned());
    Ok(LaunchAgent {
        label: spec.names().launchd_label(),
        program_arguments,
        run_at_load: true,
        keep_alive: KeepAlive::Conditions(KeepAliveConditions { successful_exit: Some(false), crashed: None }),
        throttle_interval: spec.throttle_interval_s,
        exit_time_out: spec.stop_timeout_s(),
        standard_out_path: unix_join(&logs, "launchd.stdout.log"),
        standard_error_path: unix_join(&logs, "launchd.stderr.log"),
        environment_variables: BTreeMap::from([("GATEWARDEN_HOME".to_owned(), home.to_owned())]),
    })
}

/// Renders the plist as XML. The installer must create `<home>/logs` first: launchd does not
/// create missing directories for `StandardOutPath`.
pub fn render_plist(spec: &ServiceSpec) -> Result<String, LaunchdError> {
    let agent = launch_agent(spec)?;
    let mut buf = Vec::new();
    plist::to_writer_xml(&mut buf, &agent).map_err(LaunchdError::Plist)?;
    String::from_utf8(buf).map_err(|_| LaunchdError::NotUtf8)
}

/// Parses a plist (XML or binary) into a generic value, tolerating unknown keys.
pub fn parse_plist(bytes: &[u8]) -> Result<plist::Dictionary, LaunchdError> {
    plist::Value::from_reader(Cursor::new(bytes))
        .map_err(LaunchdError::Plist)?
        .into_dictionary()
        .ok_or(LaunchdError::NotADictionary)
}

/// `~/Library/LaunchAgents/<label>.plist` for a user home directory.
#[must_use]
pub fn plist_path(user_home: &str, label: &str) -> String {
    format!("{}/Library/LaunchAgents/{label}.plist", user_home.trim_end_matches('/'))
}

fn refresh() -> FixAction {
    FixAction::RefreshDefinition { manager: Manager::Launchd }
}

/// The revival policy an installed plist declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstalledPolicy {
    /// Ours: `gatewarden supervise` under `KeepAlive = {SuccessfulExit = false}`.
    Supervised,
    /// `KeepAlive = true`: every exit respawns; exit 78 loops; stop needs bootout.
    KeepAliveAlways,
    /// `SuccessfulExit = false` around the gateway itself: 78 loops, 75 is throttled.
    SuccessfulExitDirect,
    /// No KeepAlive at all: nothing is revived.
    NoKeepAlive,
    /// Something else.
    Other(String),
}

/// Classifies the installed plist's revival policy.
#[must_use]
pub fn installed_policy(dict: &plist::Dictionary) -> InstalledPolicy {
    let supervised = program_arguments(dict).get(1).map(String::as_str) == Some(SUPERVISE_VERB);
    match dict.get("KeepAlive") {
        None => InstalledPolicy::NoKeepAlive,
        Some(v) if v.as_boolean() == Some(true) => InstalledPolicy::KeepAliveAlways,
        Some(v) if v.as_boolean() == Some(false) => InstalledPolicy::NoKeepAlive,
        Some(v) => {
            let se = v.as_dictionary().and_then(|d| d.get("SuccessfulExit")).and_then(plist::Value::as_boolean);
            match (se, supervised) {
                (Some(false), true) => InstalledPolicy::Supervised,
                (Some(false), false) => InstalledPolicy::SuccessfulExitDirect,
                _ => InstalledPolicy::Other(format!("{v:?}")),
            }
        }
    }
}

fn program_arguments(dict: &plist::Dictionary) -> Vec<String> {
    dict.get("ProgramArguments")
        .and_then(plist::Value::as_array)
        .map(|a| a.iter().map(|v| v.as_string().unwrap_or("").to_owned()).collect())
        .unwrap_or_default()
}

fn uint(dict: &plist::Dictionary, key: &str) -> Option<u64> {
    dict.get(key)
        .and_then(|v| v.as_unsigned_integer().or_else(|| v.as_signed_integer().and_then(|i| u64::try_from(i).ok())))
}

/// Compares an installed plist (XML or binary bytes) with the expected agent.
#[must_use]
pub fn drift(installed: &[u8], expected: &LaunchAgent) -> Vec<Finding> {
    let dict = match parse_plist(installed) {
        Ok(d) => d,
        Err(e) => {
            return vec![Finding::new(
                FindingId::DefinitionUnreadable,
                Severity::Error,
                "plist",
                format!("the installed plist cannot be read: {e}"),
                refresh(),
            )];
        }
    };
    let mut out = Vec::new();
    let mut push = |id, sev, subject: &str, msg: String| {
        out.push(Finding::new(id, sev, subject, msg, refresh()));
    };

    let label = dict.get("Label").and_then(plist::Value::as_string);
    if label != Some(expected.label.as_str()) {
        push(
            FindingId::DirectiveDiffers,
            Severity::Error,
            "Label",
            format!("label is {label:?}, expected {:?}", expected.label),
        );
    }

    let args = program_arguments(&dict);
    let (have_bin, want_bin) = (args.first().map_or("", String::as_str), expected.program_arguments[0].as_str());
    if have_bin != want_bin {
        push(
            FindingId::WrongBinary,
            Severity::Error,
            "ProgramArguments",
            format!("the job runs `{have_bin}`, but this gatewarden is `{want_bin}`"),
        );
    }
    let home_of = |a: &[String]| a.windows(2).find(|p| p[0] == "--home").map(|p| p[1].clone());
    if home_of(&args) != home_of(&expected.program_arguments) {
        push(
            FindingId::WrongHome,
            Severity::Error,
            "ProgramArguments",
            format!("the job serves home {:?}, expected {:?}", home_of(&args), home_of(&expected.program_arguments)),
        );
    }

    match installed_policy(&dict) {
        InstalledPolicy::Supervised => {
            if args.get(1..) != expected.program_arguments.get(1..)
                && home_of(&args) == home_of(&expected.program_arguments)
            {
                push(
                    FindingId::DirectiveDiffers,
                    Severity::Warning,
                    "ProgramArguments",
                    format!("arguments are {:?}, expected {:?}", &args, expected.program_arguments),
                );
            }
        }
        InstalledPolicy::KeepAliveAlways => push(
            FindingId::OldKeepAlivePolicy,
            Severity::Error,
            "KeepAlive",
            "`KeepAlive = true`: a fatal-configuration exit (78) respawns in a loop and a stop \
             needs bootout (which strands the label)"
                .into(),
        ),
        InstalledPolicy::SuccessfulExitDirect => push(
            FindingId::OldKeepAlivePolicy,
            Severity::Error,
            "KeepAlive",
            "the gateway runs directly under `SuccessfulExit = false`: exit 78 respawns in a \
             loop and planned restarts wait out ThrottleInterval; it must run under \
             `gatewarden supervise`"
                .into(),
        ),
        InstalledPolicy::NoKeepAlive => push(
            FindingId::OldKeepAlivePolicy,
            Severity::Error,
            "KeepAlive",
            "no KeepAlive: nothing revives the job if it crashes".into(),
        ),
        InstalledPolicy::Other(v) => push(
            FindingId::OldKeepAlivePolicy,
            Severity::Error,
            "KeepAlive",
            format!(
                "unrecognised KeepAlive policy {v}; expected {{SuccessfulExit = false}} around `gatewarden supervise`"
            ),
        ),
    }

    if dict.get("RunAtLoad").and_then(plist::Value::as_boolean) != Some(true) {
        push(
            FindingId::DirectiveMissing,
            Severity::Warning,
            "RunAtLoad",
            "`RunAtLoad` is not true: the gateway will not start at login".into(),
        );
    }
    // launchd's default ExitTimeOut is 20 s.
    let exit_timeout = uint(&dict, "ExitTimeOut").unwrap_or(20);
    if exit_timeout < expected.exit_time_out {
        push(
            FindingId::StopTimeoutTooShort,
            Severity::Error,
            "ExitTimeOut",
            format!(
                "`ExitTimeOut` is {exit_timeout} s, below the required {} s: launchd would \
                 SIGKILL the gateway in the middle of its drain",
                expected.exit_time_out
            ),
        );
    }
    // launchd's default ThrottleInterval is 10 s.
    let throttle = uint(&dict, "ThrottleInterval").unwrap_or(10);
    if throttle != expected.throttle_interval {
        push(
            FindingId::DirectiveDiffers,
            Severity::Warning,
            "ThrottleInterval",
            format!("`ThrottleInterval` is {throttle} s, expected {} s", expected.throttle_interval),
        );
    }
    let env_home = dict
        .get("EnvironmentVariables")
        .and_then(plist::Value::as_dictionary)
        .and_then(|d| d.get("GATEWARDEN_HOME"))
        .and_then(plist::Value::as_string);
    let want_home = expected.environment_variables.get("GATEWARDEN_HOME").map(String::as_str);
    if env_home != want_home {
        push(
            if env_home.is_none() { FindingId::DirectiveMissing } else { FindingId::WrongHome },
            Severity::Error,
            "EnvironmentVariables.GATEWARDEN_HOME",
            format!("GATEWARDEN_HOME is {env_home:?}, expected {want_home:?}"),
        );
    }
    for (key, want) in
        [("StandardOutPath", &expected.standard_out_path), ("StandardErrorPath", &expected.standard_error_path)]
    {
        let have = dict.get(key).and_then(plist::Value::as_string);
        if have != Some(want.as_str()) {
            push(FindingId::DirectiveDiffers, Severity::Info, key, format!("`{key}` is {have:?}, expected {want:?}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        ServiceSpec::new("/usr/local/bin/gatewarden", "/Users/alice/Library/Application Support/gatewarden")
    }

    #[test]
    fn rendered_plist_parses_back_to_the_same_agent() {
        let xml = render_plist(&spec()).unwrap();
        let back: LaunchAgent = plist::from_bytes(xml.as_bytes()).unwrap();
        assert_eq!(back, launch_agent(&spec()).unwrap());
        assert_eq!(
            back.keep_alive,
            KeepAlive::Conditions(KeepAliveConditions { successful_exit: Some(false), crashed: None })
        );
        assert_eq!(back.program_arguments[1], "supervise");
        assert_eq!(back.exit_time_out, 100);
        assert!(back.exit_time_out >= spec().drain_timeout_s + crate::spec::STOP_GRACE_S);
        assert_eq!(
            back.standard_error_path,
            "/Users/alice/Library/Application Support/gatewarden/logs/launchd.stderr.log"
        );
    }

    #[test]
    fn no_drift_against_itself() {
        let xml = render_plist(&spec()).unwrap();
        assert_eq!(drift(xml.as_bytes(), &launch_agent(&spec()).unwrap()), vec![]);
        assert_eq!(installed_policy(&parse_plist(xml.as_bytes()).unwrap()), InstalledPolicy::Supervised);
    }

    #[test]
    fn keepalive_true_plist_is_old_policy() {
        let agent = launch_agent(&spec()).unwrap();
        let mut old = agent.clone();
        old.keep_alive = KeepAlive::Always(true);
        old.program_arguments[1] = "run".into();
        old.exit_time_out = 25;
        let mut buf = Vec::new();
        plist::to_writer_binary(&mut buf, &old).unwrap();
        let f = drift(&buf, &agent);
        let ids: Vec<_> = f.iter().map(|f| (f.id, f.subject.as_str())).collect();
        assert_eq!(
            ids,
            [(FindingId::OldKeepAlivePolicy, "KeepAlive"), (FindingId::StopTimeoutTooShort, "ExitTimeOut"),]
        );
    }

    #[test]
    fn successful_exit_direct_is_old_policy() {
        let agent = launch_agent(&spec()).unwrap();
        let mut old = agent.clone();
        old.program_arguments[1] = "run".into();
        let mut buf = Vec::new();
        plist::to_writer_xml(&mut buf, &old).unwrap();
        let dict = parse_plist(&buf).unwrap();
        assert_eq!(installed_policy(&dict), InstalledPolicy::SuccessfulExitDirect);
    }

    #[test]
    fn garbage_is_unreadable_not_a_panic() {
        let agent = launch_agent(&spec()).unwrap();
        for junk in [&b""[..], b"<plist>", b"\x00\x01bplist00", b"<?xml version=\"1.0\"?><plist><array/></plist>"] {
            let f = drift(junk, &agent);
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].id, FindingId::DefinitionUnreadable);
        }
    }

    #[test]
    fn wrong_binary_is_named() {
        let agent = launch_agent(&spec()).unwrap();
        let mut other = agent.clone();
        other.program_arguments[0] = "/opt/old/gatewarden".into();
        let mut buf = Vec::new();
        plist::to_writer_xml(&mut buf, &other).unwrap();
        let f = drift(&buf, &agent);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, FindingId::WrongBinary);
    }

    #[test]
    fn plist_path_is_in_launch_agents() {
        assert_eq!(plist_path("/Users/a/", "x"), "/Users/a/Library/LaunchAgents/x.plist");
    }
}
