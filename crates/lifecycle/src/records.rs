//! `gateway.pid` and `gateway_state.json`: typed, hermes-compatible, read leniently.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fsio::{self, ReadOutcome};
use crate::identity::ProcessIdentity;

/// The identity record (`gateway.pid`). Unknown fields from other writers are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidRecord {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub start_time: Option<u64>,
    #[serde(default, alias = "hermes_home", skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

impl PidRecord {
    /// The recorded identity, if the record carries a start time. Without one, the record
    /// names nobody we may signal.
    pub fn identity(&self) -> Option<ProcessIdentity> {
        self.start_time.map(|start_time| ProcessIdentity { pid: self.pid, start_time })
    }
}

/// Observable phases of a gateway, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayState {
    Starting,
    Running,
    Draining,
    Stopping,
    Stopped,
    /// Written by hermes-agent's watchdogs.
    Degraded,
    /// Written by hermes-agent on fatal startup errors.
    StartupFailed,
}

impl GatewayState {
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayState::Starting => "starting",
            GatewayState::Running => "running",
            GatewayState::Draining => "draining",
            GatewayState::Stopping => "stopping",
            GatewayState::Stopped => "stopped",
            GatewayState::Degraded => "degraded",
            GatewayState::StartupFailed => "startup_failed",
        }
    }
}

impl std::fmt::Display for GatewayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `gateway_state.json`: the identity record plus the observable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateRecord {
    #[serde(flatten)]
    pub record: PidRecord,
    pub gateway_state: GatewayState,
    #[serde(default)]
    pub exit_reason: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default, alias = "active_agents")]
    pub active_runs: u64,
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub control: Option<String>,
    #[serde(default)]
    pub supervisor: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// Reads `gateway.pid`, accepting the legacy bare-integer form.
pub fn read_pid_record(path: &Path) -> ReadOutcome<PidRecord> {
    fsio::read_bytes(path).map(|bytes| parse_pid_record(&bytes))
}

/// Pure parser behind [`read_pid_record`]; total over arbitrary bytes.
pub fn parse_pid_record(bytes: &[u8]) -> ReadOutcome<PidRecord> {
    let value = match fsio::parse_json_value(bytes) {
        Ok(v) => v,
        Err(why) => return ReadOutcome::Unreadable(why),
    };
    if let Some(n) = value.as_i64() {
        return match u32::try_from(n) {
            Ok(pid) if pid > 0 => ReadOutcome::Ok(PidRecord {
                pid,
                kind: None,
                argv: Vec::new(),
                start_time: None,
                home: None,
                incarnation: None,
                version: None,
                started_at: None,
            }),
            _ => ReadOutcome::Unreadable(format!("invalid pid {n}")),
        };
    }
    if !value.is_object() {
        return ReadOutcome::Unreadable("not a JSON object".into());
    }
    match serde_json::from_value::<PidRecord>(value) {
        Ok(r) if r.pid > 0 => ReadOutcome::Ok(r),
        Ok(r) => ReadOutcome::Unreadable(format!("invalid pid {}", r.pid)),
        Err(e) => ReadOutcome::Unreadable(format!("not a pid record ({e})")),
    }
}

/// Reads `gateway_state.json`.
pub fn read_state(path: &Path) -> ReadOutcome<StateRecord> {
    fsio::read_json(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hermes_records() {
        let hermes = br#"{"pid":4242,"kind":"hermes-gateway","argv":["/venv/bin/hermes","gateway","run"],"start_time":3921877,"hermes_home":"/home/a/.hermes"}"#;
        let r = parse_pid_record(hermes).ok().unwrap();
        assert_eq!(r.identity(), Some(ProcessIdentity { pid: 4242, start_time: 3_921_877 }));
        assert_eq!(r.home.as_deref(), Some("/home/a/.hermes"));
        assert_eq!(parse_pid_record(b"4242").ok().unwrap().pid, 4242);
        assert_eq!(parse_pid_record(b"4242").ok().unwrap().identity(), None);
    }

    #[test]
    fn rejects_bad_pids_and_garbage() {
        for bad in
            [&b"0"[..], b"-5", b"99999999999", br#"{"pid":-1}"#, br#"{"pid":"x"}"#, b"[1]", b"\xff\xfe", b"{\"pid\":"]
        {
            assert!(matches!(parse_pid_record(bad), ReadOutcome::Unreadable(_)), "{bad:?}");
        }
    }

    #[test]
    fn state_round_trip_and_hermes_alias() {
        let s = br#"{"pid":7,"start_time":1,"gateway_state":"draining","active_agents":3,"platforms":{}}"#;
        let v: StateRecord = serde_json::from_slice(s).unwrap();
        assert_eq!(v.gateway_state, GatewayState::Draining);
        assert_eq!(v.active_runs, 3);
        let again: StateRecord = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(again, v);
    }

    proptest::proptest! {
        #[test]
        fn pid_record_parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse_pid_record(&bytes);
        }

        #[test]
        fn pid_record_parser_never_panics_on_jsonish(s in r#"\{("[a-z_]{1,12}":(-?[0-9]{1,12}|"[^"]{0,8}"|null|\[\]),?){0,6}\}"#) {
            let _ = parse_pid_record(s.as_bytes());
        }
    }
}
