//! Who supervises a running hermes, and whether that supervisor is proven to revive an
//! exit 75 (the only case in which a SIGUSR1 restart is safe: unsupervised, hermes exits 75
//! and stays down).

use gatewarden_lifecycle::procfs::environ_value;
use gatewarden_lifecycle::{ProcessIdentity, platform};

/// The tag `gatewarden supervise` puts into its hermes child's environment:
/// `<supervisor pid>:<supervisor start time>`.
pub const SUPERVISOR_TAG: &str = "GATEWARDEN_HERMES_SUPERVISOR";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SupervisedBy {
    /// Our `supervise`, alive and the hermes process's parent: revives 75 at once.
    Gatewarden {
        supervisor: ProcessIdentity,
    },
    /// A systemd unit (from `INVOCATION_ID` and the cgroup).
    Systemd {
        unit: Option<String>,
    },
    Launchd,
    S6,
    /// `--external-supervisor` / `HERMES_GATEWAY_EXTERNAL_SUPERVISOR`: someone claims it.
    External,
    None,
    /// The process's environment cannot be read (another user, no `/proc`).
    Unknown,
}

impl SupervisedBy {
    /// `systemd:<unit>`, `gatewarden:<supervise pid>`, `external`, `none`, …, as `status` prints it.
    pub fn label(&self) -> String {
        match self {
            SupervisedBy::Gatewarden { supervisor } => format!("gatewarden:{}", supervisor.pid),
            SupervisedBy::Systemd { unit: Some(u) } => format!("systemd:{u}"),
            SupervisedBy::Systemd { unit: None } => "systemd".into(),
            SupervisedBy::Launchd => "launchd".into(),
            SupervisedBy::S6 => "s6".into(),
            SupervisedBy::External => "external".into(),
            SupervisedBy::None => "none".into(),
            SupervisedBy::Unknown => "unknown".into(),
        }
    }

    /// Whether a planned restart (exit 75) is proven to be revived. Only our own supervisor
    /// qualifies without asking a service manager: hermes's own unit revives 75 only after
    /// `RestartSec=5`, and other supervisors' policies are not visible here.
    pub fn revives_exit_75(&self) -> bool {
        matches!(self, SupervisedBy::Gatewarden { .. })
    }
}

/// Detects the supervisor of `hermes` from its environment, argv, cgroup and parent.
pub fn detect(hermes: ProcessIdentity) -> SupervisedBy {
    let parent = platform::parent_pid(hermes.pid);
    let parent_id =
        parent.and_then(|p| platform::start_time(p).map(|start_time| ProcessIdentity { pid: p, start_time }));
    classify(
        platform::environ(hermes.pid).as_deref(),
        platform::argv(hermes.pid).as_deref(),
        platform::cgroup(hermes.pid).as_deref(),
        parent_id,
    )
}

/// Pure half of [`detect`].
pub fn classify(
    environ: Option<&[u8]>,
    argv: Option<&[String]>,
    cgroup: Option<&str>,
    parent: Option<ProcessIdentity>,
) -> SupervisedBy {
    let Some(env) = environ else { return SupervisedBy::Unknown };
    let set = |k: &str| environ_value(env, k).filter(|v| !v.is_empty());
    if let Some(tag) = set(SUPERVISOR_TAG)
        && let Some(claimed) = parse_tag(tag)
        && parent == Some(claimed)
    {
        return SupervisedBy::Gatewarden { supervisor: claimed };
    }
    if set("INVOCATION_ID").is_some() {
        return SupervisedBy::Systemd { unit: cgroup.and_then(unit_from_cgroup) };
    }
    if set("HERMES_S6_SUPERVISED_CHILD").is_some() {
        return SupervisedBy::S6;
    }
    if set("XPC_SERVICE_NAME").is_some_and(|v| v != "0") {
        return SupervisedBy::Launchd;
    }
    let flag = argv.is_some_and(|a| a.iter().any(|x| x == "--external-supervisor"));
    if flag || set("HERMES_GATEWAY_EXTERNAL_SUPERVISOR").is_some() {
        return SupervisedBy::External;
    }
    SupervisedBy::None
}

pub fn render_tag(supervisor: ProcessIdentity) -> String {
    format!("{}:{}", supervisor.pid, supervisor.start_time)
}

fn parse_tag(tag: &str) -> Option<ProcessIdentity> {
    let (pid, start) = tag.split_once(':')?;
    Some(ProcessIdentity { pid: pid.parse().ok()?, start_time: start.parse().ok()? })
}

/// The last `.service` component of a cgroup v2 (`0::/user.slice/…/hermes-gateway.service`)
/// or v1 `name=systemd` line.
pub fn unit_from_cgroup(text: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.starts_with("0::") || l.contains(":name=systemd:"))
        .flat_map(|l| l.rsplit(':').next().unwrap_or("").split('/').rev())
        .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUP: ProcessIdentity = ProcessIdentity { pid: 40, start_time: 400 };

    #[test]
    fn classification_table() {
        let tag = format!("{SUPERVISOR_TAG}=40:400\0PATH=/bin\0");
        assert_eq!(classify(Some(tag.as_bytes()), None, None, Some(SUP)), SupervisedBy::Gatewarden { supervisor: SUP });
        // A tag whose supervisor is not the parent (re-parented orphan, copied env) proves nothing.
        let other = ProcessIdentity { pid: 1, start_time: 0 };
        assert_eq!(classify(Some(tag.as_bytes()), None, None, Some(other)), SupervisedBy::None);
        let cg = "0::/user.slice/user-0.slice/user@0.service/app.slice/hermes-gateway.service\n";
        assert_eq!(
            classify(Some(b"INVOCATION_ID=abc\0"), None, Some(cg), None),
            SupervisedBy::Systemd { unit: Some("hermes-gateway.service".into()) }
        );
        assert_eq!(classify(Some(b"XPC_SERVICE_NAME=0\0"), None, None, None), SupervisedBy::None);
        assert_eq!(classify(Some(b"HERMES_S6_SUPERVISED_CHILD=1\0"), None, None, None), SupervisedBy::S6);
        let argv = ["hermes".to_string(), "gateway".into(), "run".into(), "--external-supervisor".into()];
        assert_eq!(classify(Some(b""), Some(&argv), None, None), SupervisedBy::External);
        assert_eq!(classify(None, None, None, None), SupervisedBy::Unknown);
        assert!(SupervisedBy::Gatewarden { supervisor: SUP }.revives_exit_75());
        assert!(!SupervisedBy::Systemd { unit: None }.revives_exit_75());
        assert!(!SupervisedBy::External.revives_exit_75());
    }
}
