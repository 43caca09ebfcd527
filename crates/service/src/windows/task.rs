//! The per-user Task Scheduler definition (no admin rights needed).
//!
//! The task starts `gatewarden supervise --home H` at the user's logon, with least privilege,
//! no execution time limit (`PT0S`), `IgnoreNew` so a second trigger never starts a second
//! supervisor, and restart-on-failure as a backstop should the supervisor itself crash. The
//! supervisor waits on the gateway and owns the restart policy (class I invariant 4: a
//! launcher that does not wait, like hermes' async VBS wrapper, can never see a crash).

use super::quote_windows_arg;
use crate::finding::{Finding, FindingId, FixAction, Manager, Severity};
use crate::launchd::SUPERVISE_VERB;
use crate::spec::{ServiceSpec, SpecError, utf8};

/// Escapes text for XML element content and attribute values.
#[must_use]
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

/// Undoes [`xml_escape`] (and numeric character references), tolerantly.
#[must_use]
pub fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';').filter(|e| *e <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let ent = &rest[1..end];
        let decoded = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The task's command line: `(command, arguments)`.
pub fn task_command(spec: &ServiceSpec) -> Result<(String, String), SpecError> {
    spec.validate_windows()?;
    let exe = utf8("exe", &spec.exe)?;
    let home = utf8("home", &spec.home)?;
    let mut args = vec![SUPERVISE_VERB, "--home", home];
    args.extend(spec.extra_args.iter().map(String::as_str));
    let joined = args.iter().map(|a| quote_windows_arg(a)).collect::<Vec<_>>().join(" ");
    Ok((exe.to_owned(), joined))
}

/// Renders the Task Scheduler XML for `spec`, running as `user_id` (`DOMAIN\user` or a SID).
///
/// The declaration says UTF-16 because `schtasks /Create /XML` expects the file in that
/// encoding; write it with [`task_xml_utf16le`].
pub fn render_task_xml(spec: &ServiceSpec, user_id: &str) -> Result<String, SpecError> {
    let (command, arguments) = task_command(spec)?;
    if user_id.is_empty() || user_id.chars().any(char::is_control) {
        return Err(SpecError::InvalidUser(user_id.to_owned()));
    }
    let home = utf8("home", &spec.home)?;
    let name = spec.names().windows_name();
    let user = xml_escape(user_id);
    Ok(format!(
        r#"<?xml version="1.0" encoding="UTF-16"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>gatewarden agent gateway ({home_x})</Description>
    <URI>\{name}</URI>
  </RegistrationInfo>
  <Triggers>
    <LogonTrigger>
      <Enabled>true</Enabled>
      <UserId>{user}</UserId>
    </LogonTrigger>
  </Triggers>
  <Principals>
    <Principal id="Author">
      <UserId>{user}</UserId>
      <LogonType>InteractiveToken</LogonType>
      <RunLevel>LeastPrivilege</RunLevel>
    </Principal>
  </Principals>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <AllowHardTerminate>true</AllowHardTerminate>
    <StartWhenAvailable>true</StartWhenAvailable>
    <RunOnlyIfNetworkAvailable>false</RunOnlyIfNetworkAvailable>
    <IdleSettings>
      <StopOnIdleEnd>false</StopOnIdleEnd>
      <RestartOnIdle>false</RestartOnIdle>
    </IdleSettings>
    <AllowStartOnDemand>true</AllowStartOnDemand>
    <Enabled>true</Enabled>
    <Hidden>false</Hidden>
    <RunOnlyIfIdle>false</RunOnlyIfIdle>
    <WakeToRun>false</WakeToRun>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <Priority>7</Priority>
    <RestartOnFailure>
      <Interval>PT1M</Interval>
      <Count>3</Count>
    </RestartOnFailure>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>{command}</Command>
      <Arguments>{arguments}</Arguments>
    </Exec>
  </Actions>
</Task>
"#,
        home_x = xml_escape(home),
        name = xml_escape(&name),
        command = xml_escape(&command),
        arguments = xml_escape(&arguments),
    ))
}

/// UTF-16LE bytes with a BOM, the encoding `schtasks /Create /XML` reads.
#[must_use]
pub fn task_xml_utf16le(xml: &str) -> Vec<u8> {
    let mut out = vec![0xFF, 0xFE];
    out.extend(xml.encode_utf16().flat_map(u16::to_le_bytes));
    out
}

/// Decodes task XML as exported by `schtasks /Query /XML` (UTF-16LE/BE with BOM, or UTF-8),
/// lossily.
#[must_use]
pub fn decode_task_xml(bytes: &[u8]) -> String {
    let utf16 = |b: &[u8], le: bool| {
        let units: Vec<u16> = b
            .chunks_exact(2)
            .map(|c| if le { u16::from_le_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], c[1]]) })
            .collect();
        String::from_utf16_lossy(&units)
    };
    match bytes {
        [0xFF, 0xFE, rest @ ..] => utf16(rest, true),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, false),
        [0xEF, 0xBB, 0xBF, rest @ ..] => String::from_utf8_lossy(rest).into_owned(),
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// The unescaped text of the first `<tag>…</tag>` element (attributes allowed), if any.
#[must_use]
pub fn element_text(xml: &str, tag: &str) -> Option<String> {
    let open_plain = format!("<{tag}>");
    let open_attr = format!("<{tag} ");
    let start = xml.find(&open_plain).or_else(|| xml.find(&open_attr))?;
    let body_start = start + xml[start..].find('>')? + 1;
    let close = format!("</{tag}>");
    let len = xml[body_start..].find(&close)?;
    Some(xml_unescape(xml[body_start..body_start + len].trim()))
}

/// Settings compared by [`drift`]: `(tag, why it matters, severity)`.
const CHECKED: &[(&str, &str, Severity)] = &[
    ("MultipleInstancesPolicy", "a second trigger could start a second supervisor", Severity::Error),
    ("ExecutionTimeLimit", "Task Scheduler would kill the gateway after the limit", Severity::Error),
    ("RunLevel", "the task should run with least privilege", Severity::Warning),
    ("LogonType", "the task should run in the user's session without a stored password", Severity::Warning),
    ("DisallowStartIfOnBatteries", "the gateway would not start on battery", Severity::Warning),
    ("StopIfGoingOnBatteries", "the gateway would be stopped on battery", Severity::Warning),
    ("Enabled", "the task would not run", Severity::Warning),
];

/// Compares installed task XML (already decoded) with the expected rendering.
#[must_use]
pub fn drift(installed: &str, expected: &str) -> Vec<Finding> {
    let refresh = || FixAction::RefreshDefinition { manager: Manager::WindowsTask };
    let mut out = Vec::new();
    if !installed.contains("<Task") {
        out.push(Finding::new(
            FindingId::DefinitionUnreadable,
            Severity::Error,
            "task",
            "the installed task definition is not Task Scheduler XML",
            refresh(),
        ));
        return out;
    }
    let (ic, ec) = (element_text(installed, "Command"), element_text(expected, "Command"));
    if !eq_path(ic.as_deref(), ec.as_deref()) {
        out.push(Finding::new(
            FindingId::WrongBinary,
            Severity::Error,
            "Actions.Exec.Command",
            format!("the task runs {ic:?}, but this gatewarden is {ec:?}"),
            refresh(),
        ));
    }
    let (ia, ea) = (element_text(installed, "Arguments"), element_text(expected, "Arguments"));
    if ia != ea {
        out.push(Finding::new(
            FindingId::DirectiveDiffers,
            Severity::Error,
            "Actions.Exec.Arguments",
            format!("the task passes {ia:?}, expected {ea:?}"),
            refresh(),
        ));
    }
    for (tag, why, sev) in CHECKED {
        let (i, e) = (element_text(installed, tag), element_text(expected, tag));
        if i != e {
            let (id, what) = match &i {
                None => (FindingId::DirectiveMissing, format!("`{tag}` is missing")),
                Some(v) => (FindingId::DirectiveDiffers, format!("`{tag}` is {v:?}")),
            };
            out.push(Finding::new(
                id,
                *sev,
                format!("Settings.{tag}"),
                format!("{what}, expected {:?}: {why}", e.unwrap_or_default()),
                refresh(),
            ));
        }
    }
    out
}

/// Windows paths compare case-insensitively.
fn eq_path(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b) || a.to_lowercase() == b.to_lowercase(),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        ServiceSpec::new(r"C:\Program Files\gatewarden\gatewarden.exe", r"C:\Users\a&b\AppData\Local\gatewarden")
    }

    #[test]
    fn xml_is_escaped_and_parses_back() {
        let xml = render_task_xml(&spec(), r"DOM\a<b>").unwrap();
        assert!(xml.contains(r"<UserId>DOM\a&lt;b&gt;</UserId>"));
        assert!(xml.contains("a&amp;b"));
        assert_eq!(element_text(&xml, "UserId").as_deref(), Some(r"DOM\a<b>"));
        assert_eq!(element_text(&xml, "RunLevel").as_deref(), Some("LeastPrivilege"));
        assert_eq!(element_text(&xml, "MultipleInstancesPolicy").as_deref(), Some("IgnoreNew"));
        assert_eq!(element_text(&xml, "ExecutionTimeLimit").as_deref(), Some("PT0S"));
        assert_eq!(
            element_text(&xml, "Arguments").as_deref(),
            Some(r"supervise --home C:\Users\a&b\AppData\Local\gatewarden")
        );
        assert_eq!(element_text(&xml, "Exec").map(|s| s.contains("<Command>")), Some(true));
    }

    #[test]
    fn utf16_round_trip() {
        let xml = render_task_xml(&spec(), "a").unwrap();
        let bytes = task_xml_utf16le(&xml);
        assert_eq!(&bytes[..2], &[0xFF, 0xFE]);
        assert_eq!(decode_task_xml(&bytes), xml);
        assert_eq!(decode_task_xml(xml.as_bytes()), xml);
        assert_eq!(decode_task_xml(&[0xFF, 0xFE, 0x41]), "");
    }

    #[test]
    fn drift_names_settings() {
        let exp = render_task_xml(&spec(), "a").unwrap();
        assert_eq!(drift(&exp, &exp), vec![]);
        let upper = exp.replace(r"C:\Program Files", r"c:\PROGRAM FILES");
        assert_eq!(drift(&upper, &exp), vec![]);
        let bad = exp
            .replace("<ExecutionTimeLimit>PT0S</ExecutionTimeLimit>", "<ExecutionTimeLimit>PT72H</ExecutionTimeLimit>")
            .replace("<MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>", "")
            .replace(r"C:\Program Files\gatewarden", r"D:\old");
        let f = drift(&bad, &exp);
        let ids: Vec<_> = f.iter().map(|f| (f.id, f.subject.as_str())).collect();
        assert_eq!(
            ids,
            [
                (FindingId::WrongBinary, "Actions.Exec.Command"),
                (FindingId::DirectiveMissing, "Settings.MultipleInstancesPolicy"),
                (FindingId::DirectiveDiffers, "Settings.ExecutionTimeLimit"),
            ]
        );
        assert_eq!(drift("garbage", &exp)[0].id, FindingId::DefinitionUnreadable);
    }

    #[test]
    fn unescape_is_tolerant() {
        assert_eq!(xml_unescape("a &amp; b &#x41;&#66; &bogus; & &"), "a & b AB &bogus; & &");
    }

    #[test]
    fn bad_user_or_paths_are_errors() {
        assert!(render_task_xml(&spec(), "").is_err());
        assert!(render_task_xml(&ServiceSpec::new("/usr/bin/gw", r"C:\h"), "a").is_err());
    }
}
