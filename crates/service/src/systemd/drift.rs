//! Drift between an installed unit and the generator's output (class D invariant 4).
//!
//! Installed units lag the generator (hermes #43475 ran a six-day-old plist; operators keep
//! units with `Restart=on-failure` but no `RestartForceExitStatus=75`). [`drift`] compares the
//! *effective* settings, not the text: whitespace, order, quoting style and comments do not
//! matter, time spans compare by value, list settings compare by membership, and a longer
//! `TimeoutStopSec=` than required is fine. Every finding names the directive.

use std::collections::BTreeSet;

use super::syntax::{TimeSpan, parse_timespan, split_words};
use super::unit_file::{ParsedUnit, is_list_key, parse_unit};
use crate::finding::{Finding, FindingId, FixAction, Manager, Severity};

/// Settings we render but do not compare (cosmetic, or derived from the home path).
const IGNORED: &[&str] = &["Description"];

/// Why a directive matters, for the message; `None` for the plain ones.
fn why(key: &str) -> Option<&'static str> {
    Some(match key {
        "RestartForceExitStatus" => "a planned restart (exit 75) would not be revived",
        "SuccessExitStatus" => "every planned restart (exit 75) would mark the unit failed and fire OnFailure= alerts",
        "RestartPreventExitStatus" => "a fatal-configuration exit (78) would be restarted in a loop",
        "Restart" => "exit codes would not map to revive / stay down as documented",
        "Type" | "NotifyAccess" => "readiness notifications would be ignored or rejected",
        "TimeoutStopSec" => "systemd would SIGKILL the gateway in the middle of its drain",
        "KillMode" => "stop would not give the main process its drain",
        "StartLimitIntervalSec" | "StartLimitBurst" => "the crash-loop brake would differ",
        "WatchdogSec" => "the liveness watchdog would differ",
        "LoadCredential" => "the gateway would not receive a secret config.toml names by *_file",
        "ExecReload" => "`systemctl reload` would not reload the configuration (`gatewarden reload` still does)",
        _ => return None,
    })
}

fn severity(key: &str) -> Severity {
    match key {
        "ExecStart"
        | "Type"
        | "NotifyAccess"
        | "Restart"
        | "RestartForceExitStatus"
        | "SuccessExitStatus"
        | "RestartPreventExitStatus"
        | "TimeoutStopSec"
        | "User"
        | "LoadCredential"
        | "Environment" => Severity::Error,
        _ => Severity::Warning,
    }
}

fn refresh() -> FixAction {
    FixAction::RefreshDefinition { manager: Manager::Systemd }
}

fn message(base: String, key: &str) -> String {
    match why(key) {
        Some(w) => format!("{base}: {w}"),
        None => base,
    }
}

/// Compares `installed` unit text (or `systemctl cat` output) against the `expected`
/// rendering and returns one finding per directive that is missing or different.
#[must_use]
pub fn drift(installed: &str, expected: &str) -> Vec<Finding> {
    let inst = parse_unit(installed);
    let exp = parse_unit(expected);
    let mut out = Vec::new();
    for (section, key) in exp.keys() {
        if IGNORED.contains(&key) {
            continue;
        }
        let subject = format!("{section}.{key}");
        if key == "Environment" {
            env_drift(&inst, &exp, section, &subject, &mut out);
        } else if is_list_key(key) {
            list_drift(&inst, &exp, section, key, &subject, &mut out);
        } else {
            scalar_drift(&inst, &exp, section, key, &subject, &mut out);
        }
    }
    out
}

fn missing(subject: &str, key: &str, expected_value: &str) -> Finding {
    Finding::new(
        FindingId::DirectiveMissing,
        severity(key),
        subject,
        message(format!("missing `{key}={expected_value}`"), key),
        refresh(),
    )
}

fn scalar_drift(inst: &ParsedUnit, exp: &ParsedUnit, section: &str, key: &str, subject: &str, out: &mut Vec<Finding>) {
    let Some(want) = exp.get(section, key) else {
        return;
    };
    let Some(have) = inst.get(section, key) else {
        out.push(missing(subject, key, want));
        return;
    };
    match key {
        "ExecStart" => exec_drift(have, want, subject, out),
        "TimeoutStopSec" => {
            let (h, w) = (parse_timespan(have), parse_timespan(want));
            let short = match (h, w) {
                (Some(h), Some(w)) => h < w,
                // Unparseable installed value: systemd would reject it and use its default.
                (None, Some(_)) => true,
                _ => false,
            };
            if short {
                out.push(Finding::new(
                    FindingId::StopTimeoutTooShort,
                    Severity::Error,
                    subject,
                    message(format!("`TimeoutStopSec={have}` is below the required {want} s (drain + grace)"), key),
                    refresh(),
                ));
            }
        }
        "RestartSec" | "WatchdogSec" | "StartLimitIntervalSec" => {
            let same = match (parse_timespan(have), parse_timespan(want)) {
                (Some(h), Some(w)) => h == w,
                _ => normalize(have) == normalize(want),
            };
            if !same {
                out.push(differs(subject, key, have, want));
            }
        }
        _ => {
            if normalize(have) != normalize(want) {
                out.push(differs(subject, key, have, want));
            }
        }
    }
}

fn differs(subject: &str, key: &str, have: &str, want: &str) -> Finding {
    Finding::new(
        FindingId::DirectiveDiffers,
        severity(key),
        subject,
        message(format!("`{key}={have}`, expected `{key}={want}`"), key),
        refresh(),
    )
}

fn exec_drift(have: &str, want: &str, subject: &str, out: &mut Vec<Finding>) {
    let (h, w) = (split_words(have), split_words(want));
    let (hb, wb) = (h.first().map_or("", String::as_str), w.first().map_or("", String::as_str));
    if hb != wb {
        out.push(Finding::new(
            FindingId::WrongBinary,
            Severity::Error,
            subject,
            format!("the unit runs `{hb}`, but this gatewarden is `{wb}`"),
            refresh(),
        ));
    }
    let home_of = |words: &[String]| words.windows(2).find(|p| p[0] == "--home").map(|p| p[1].clone());
    let (hh, wh) = (home_of(&h), home_of(&w));
    if hh != wh {
        out.push(Finding::new(
            FindingId::WrongHome,
            Severity::Error,
            subject,
            format!(
                "the unit serves home {}, expected {}",
                hh.as_deref().unwrap_or("(none)"),
                wh.as_deref().unwrap_or("(none)")
            ),
            refresh(),
        ));
    }
    if h.get(1..) != w.get(1..) && hh == wh {
        out.push(Finding::new(
            FindingId::DirectiveDiffers,
            Severity::Error,
            subject,
            format!("the unit runs `{}`, expected `{}`", h.join(" "), w.join(" ")),
            refresh(),
        ));
    }
}

fn tokens<'a>(values: &[&'a str]) -> BTreeSet<&'a str> {
    values.iter().flat_map(|v| v.split_whitespace()).collect()
}

fn list_drift(inst: &ParsedUnit, exp: &ParsedUnit, section: &str, key: &str, subject: &str, out: &mut Vec<Finding>) {
    let Some(want) = exp.get_list(section, key) else {
        return;
    };
    let want_set = tokens(&want);
    let Some(have) = inst.get_list(section, key) else {
        out.push(missing(subject, key, &want.join(" ")));
        return;
    };
    let have_set = tokens(&have);
    let lacking: Vec<&str> = want_set.difference(&have_set).copied().collect();
    if !lacking.is_empty() {
        out.push(Finding::new(
            FindingId::DirectiveMissing,
            severity(key),
            subject,
            message(format!("`{key}=` lacks {}", lacking.join(" ")), key),
            refresh(),
        ));
    }
}

fn assignments(values: &[&str]) -> Vec<(String, String)> {
    values
        .iter()
        .flat_map(|v| split_words(v))
        .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

fn env_drift(inst: &ParsedUnit, exp: &ParsedUnit, section: &str, subject: &str, out: &mut Vec<Finding>) {
    let want = assignments(&exp.get_list(section, "Environment").unwrap_or_default());
    let have = assignments(&inst.get_list(section, "Environment").unwrap_or_default());
    for (name, value) in want {
        // Later assignments of a variable override earlier ones.
        match have.iter().rev().find(|(n, _)| *n == name) {
            None => out.push(Finding::new(
                FindingId::DirectiveMissing,
                Severity::Error,
                format!("{subject}.{name}"),
                format!("missing `Environment={name}={value}`"),
                refresh(),
            )),
            Some((_, v)) if *v != value => out.push(Finding::new(
                if name == "GATEWARDEN_HOME" { FindingId::WrongHome } else { FindingId::DirectiveDiffers },
                Severity::Error,
                format!("{subject}.{name}"),
                format!("`{name}={v}`, expected `{name}={value}`"),
                refresh(),
            )),
            Some(_) => {}
        }
    }
}

fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Extracts the binary path `ExecStart=` launches (after undoing quoting), for status output.
#[must_use]
pub fn exec_start_binary(unit_text: &str) -> Option<String> {
    let u = parse_unit(unit_text);
    split_words(u.get("Service", "ExecStart")?).into_iter().next()
}

/// The effective `TimeoutStopSec=` of a unit, if set and parseable.
#[must_use]
pub fn timeout_stop(unit_text: &str) -> Option<TimeSpan> {
    parse_timespan(parse_unit(unit_text).get("Service", "TimeoutStopSec")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ServiceSpec;
    use crate::systemd::render_unit;

    fn expected() -> String {
        render_unit(&ServiceSpec::new("/usr/bin/gatewarden", "/home/a/gw")).unwrap()
    }

    fn ids(f: &[Finding]) -> Vec<(FindingId, &str)> {
        f.iter().map(|f| (f.id, f.subject.as_str())).collect()
    }

    #[test]
    fn identical_unit_has_no_drift() {
        assert_eq!(drift(&expected(), &expected()), vec![]);
    }

    #[test]
    fn reformatted_unit_has_no_drift() {
        let e = expected()
            .replace("RestartSec=100ms", "RestartSec = 0.1s")
            .replace("TimeoutStopSec=100", "TimeoutStopSec=1min 40s")
            .replace("ExecStart=/usr/bin/gatewarden", "# comment\nExecStart=\"/usr/bin/gatewarden\"");
        assert_eq!(drift(&e, &expected()), vec![]);
    }

    #[test]
    fn missing_force_restart_is_named() {
        let inst = expected().replace("RestartForceExitStatus=75\n", "");
        let f = drift(&inst, &expected());
        assert_eq!(ids(&f), [(FindingId::DirectiveMissing, "Service.RestartForceExitStatus")]);
        assert_eq!(f[0].severity, Severity::Error);
        assert!(f[0].message.contains("RestartForceExitStatus=75"), "{}", f[0].message);
    }

    #[test]
    fn a_unit_from_before_reload_is_drift() {
        let inst = expected().replace("ExecReload=/usr/bin/gatewarden --home /home/a/gw reload\n", "");
        let f = drift(&inst, &expected());
        assert_eq!(ids(&f), [(FindingId::DirectiveMissing, "Service.ExecReload")]);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(f[0].message.contains("systemctl reload"), "{}", f[0].message);
    }

    #[test]
    fn success_exit_status_list_lacking_75() {
        let inst = expected().replace("SuccessExitStatus=75", "SuccessExitStatus=0 SIGTERM");
        let f = drift(&inst, &expected());
        assert_eq!(ids(&f), [(FindingId::DirectiveMissing, "Service.SuccessExitStatus")]);
        assert!(f[0].message.contains("lacks 75"));
    }

    #[test]
    fn extra_exit_statuses_are_fine() {
        let inst = expected().replace("SuccessExitStatus=75", "SuccessExitStatus=75 143");
        assert_eq!(drift(&inst, &expected()), vec![]);
    }

    #[test]
    fn short_timeout_is_flagged_and_longer_is_fine() {
        let short = expected().replace("TimeoutStopSec=100", "TimeoutStopSec=20");
        let f = drift(&short, &expected());
        assert_eq!(ids(&f), [(FindingId::StopTimeoutTooShort, "Service.TimeoutStopSec")]);
        let long = expected().replace("TimeoutStopSec=100", "TimeoutStopSec=infinity");
        assert_eq!(drift(&long, &expected()), vec![]);
        let junk = expected().replace("TimeoutStopSec=100", "TimeoutStopSec=soon");
        assert_eq!(drift(&junk, &expected()).len(), 1);
    }

    #[test]
    fn wrong_binary_and_home_are_named() {
        let inst = expected()
            .replace("ExecStart=/usr/bin/gatewarden", "ExecStart=/opt/old/gatewarden")
            .replace("--home /home/a/gw", "--home /home/b/gw")
            .replace("GATEWARDEN_HOME=/home/a/gw", "GATEWARDEN_HOME=/home/b/gw");
        let f = drift(&inst, &expected());
        assert_eq!(
            ids(&f),
            [
                (FindingId::WrongBinary, "Service.ExecStart"),
                (FindingId::WrongHome, "Service.ExecStart"),
                // So do the reload and the crash-backoff helper.
                (FindingId::DirectiveDiffers, "Service.ExecReload"),
                (FindingId::DirectiveMissing, "Service.ExecStopPost"),
                (FindingId::WrongHome, "Service.Environment.GATEWARDEN_HOME"),
            ]
        );
    }

    #[test]
    fn replace_flag_in_exec_start_is_drift() {
        let inst = expected().replace("run --home /home/a/gw", "run --home /home/a/gw --replace");
        let f = drift(&inst, &expected());
        assert_eq!(ids(&f), [(FindingId::DirectiveDiffers, "Service.ExecStart")]);
    }

    #[test]
    fn drop_in_override_counts() {
        // `systemctl cat` output: main file, then a drop-in lowering the timeout.
        let cat = format!(
            "# /home/a/.config/systemd/user/gatewarden.service\n{}\n# override.conf\n[Service]\nTimeoutStopSec=5\nRestart=always\n",
            expected()
        );
        let f = drift(&cat, &expected());
        assert_eq!(
            ids(&f),
            [
                (FindingId::DirectiveDiffers, "Service.Restart"),
                (FindingId::StopTimeoutTooShort, "Service.TimeoutStopSec"),
            ]
        );
    }

    #[test]
    fn empty_installed_unit_reports_everything_missing() {
        let f = drift("", &expected());
        assert!(f.len() > 10);
        assert!(f.iter().all(|f| f.id == FindingId::DirectiveMissing));
    }

    #[test]
    fn helpers_extract_binary_and_timeout() {
        assert_eq!(exec_start_binary(&expected()).as_deref(), Some("/usr/bin/gatewarden"));
        assert_eq!(timeout_stop(&expected()), Some(TimeSpan::Finite(std::time::Duration::from_secs(100))));
        assert_eq!(exec_start_binary("garbage"), None);
    }
}
