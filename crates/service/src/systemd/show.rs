//! Parsing `systemctl show -p MainPID,NRestarts,ActiveState,SubState,Result,ExecMainStatus,InvocationID`.
//!
//! The output is `Key=Value` lines. Parsing is total: unknown keys are ignored, missing or
//! unparseable values become `None`/`Other`, so a newer or older systemd never breaks status.

/// The properties [`parse_show`] understands, in the form `systemctl show -p` takes.
pub const SHOW_PROPERTIES: &str = "MainPID,NRestarts,ActiveState,SubState,Result,ExecMainStatus,InvocationID";

/// `ActiveState=`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActiveState {
    /// `active`
    Active,
    /// `reloading`
    Reloading,
    /// `inactive`
    Inactive,
    /// `failed`
    Failed,
    /// `activating`
    Activating,
    /// `deactivating`
    Deactivating,
    /// Anything else (`maintenance`, `refreshing`, future states).
    Other(String),
}

impl ActiveState {
    fn parse(s: &str) -> Self {
        match s {
            "active" => Self::Active,
            "reloading" => Self::Reloading,
            "inactive" => Self::Inactive,
            "failed" => Self::Failed,
            "activating" => Self::Activating,
            "deactivating" => Self::Deactivating,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// `Result=`: why the unit last stopped or failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitResult {
    /// `success`
    Success,
    /// `exit-code`
    ExitCode,
    /// `signal`
    Signal,
    /// `core-dump`
    CoreDump,
    /// `timeout`
    Timeout,
    /// `watchdog`
    Watchdog,
    /// `start-limit-hit`: the crash-loop brake tripped.
    StartLimitHit,
    /// `oom-kill`
    OomKill,
    /// Anything else (`resources`, `protocol`, …).
    Other(String),
}

impl UnitResult {
    fn parse(s: &str) -> Self {
        match s {
            "success" => Self::Success,
            "exit-code" => Self::ExitCode,
            "signal" => Self::Signal,
            "core-dump" => Self::CoreDump,
            "timeout" => Self::Timeout,
            "watchdog" => Self::Watchdog,
            "start-limit-hit" => Self::StartLimitHit,
            "oom-kill" => Self::OomKill,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// The unit's runtime status as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnitStatus {
    /// Main process; `None` when systemd reports 0 (not running).
    pub main_pid: Option<u32>,
    /// How many times systemd restarted the unit (`Restart=`), since the last manual start.
    pub n_restarts: Option<u32>,
    /// High-level state; `None` if absent.
    pub active_state: Option<ActiveState>,
    /// Low-level state (`running`, `auto-restart`, `dead`, …).
    pub sub_state: Option<String>,
    /// Outcome of the last run.
    pub result: Option<UnitResult>,
    /// Exit status of the last main process.
    pub exec_main_status: Option<i32>,
    /// 32-hex id of the current activation; changes on every (re)start.
    pub invocation_id: Option<String>,
}

/// Parses `systemctl show` output. Never fails.
#[must_use]
pub fn parse_show(text: &str) -> UnitStatus {
    let mut s = UnitStatus {
        main_pid: None,
        n_restarts: None,
        active_state: None,
        sub_state: None,
        result: None,
        exec_main_status: None,
        invocation_id: None,
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "MainPID" => s.main_pid = v.parse().ok().filter(|p| *p != 0),
            "NRestarts" => s.n_restarts = v.parse().ok(),
            "ActiveState" if !v.is_empty() => s.active_state = Some(ActiveState::parse(v)),
            "SubState" if !v.is_empty() => s.sub_state = Some(v.to_owned()),
            "Result" if !v.is_empty() => s.result = Some(UnitResult::parse(v)),
            "ExecMainStatus" => s.exec_main_status = v.parse().ok(),
            "InvocationID" if !v.is_empty() => s.invocation_id = Some(v.to_owned()),
            _ => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_running_unit() {
        let s = parse_show(
            "MainPID=4242\nNRestarts=3\nActiveState=active\nSubState=running\nResult=success\n\
             ExecMainStatus=0\nInvocationID=0f1e2d3c4b5a69788796a5b4c3d2e1f0\n",
        );
        assert_eq!(s.main_pid, Some(4242));
        assert_eq!(s.n_restarts, Some(3));
        assert_eq!(s.active_state, Some(ActiveState::Active));
        assert_eq!(s.sub_state.as_deref(), Some("running"));
        assert_eq!(s.result, Some(UnitResult::Success));
        assert_eq!(s.exec_main_status, Some(0));
        assert_eq!(s.invocation_id.as_deref(), Some("0f1e2d3c4b5a69788796a5b4c3d2e1f0"));
    }

    #[test]
    fn parses_a_start_limited_unit() {
        let s = parse_show(
            "MainPID=0\nActiveState=failed\nSubState=failed\nResult=start-limit-hit\nExecMainStatus=1\nInvocationID=\n",
        );
        assert_eq!(s.main_pid, None);
        assert_eq!(s.result, Some(UnitResult::StartLimitHit));
        assert_eq!(s.invocation_id, None);
        assert_eq!(s.n_restarts, None);
    }

    #[test]
    fn garbage_is_tolerated() {
        let s = parse_show("\u{fffd}\u{fffd}\nMainPID=abc\nActiveState=maintenance\nnoequals\n");
        assert_eq!(s.main_pid, None);
        assert_eq!(s.active_state, Some(ActiveState::Other("maintenance".into())));
    }
}
