//! Messages. Requests carry `v` so a server can refuse a client from another protocol era.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{PROTOCOL_NAME, PROTOCOL_VERSION};

/// Sent by the server on accept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub proto: String,
    pub v: u32,
    pub version: String,
    pub pid: u32,
    pub incarnation: String,
}

impl Hello {
    pub fn new(version: &str, pid: u32, incarnation: &str) -> Hello {
        Hello {
            proto: PROTOCOL_NAME.into(),
            v: PROTOCOL_VERSION,
            version: version.into(),
            pid,
            incarnation: incarnation.into(),
        }
    }
}

/// Who asked for a stop or restart; recorded in the ledger so shutdown logs name the stopper.
/// Set to `dashboard` on a CLI command a dashboard runs for one of its buttons.
pub const REQUESTER_CHANNEL_ENV: &str = "GATEWARDEN_REQUESTER_CHANNEL";

/// The error code of a `restart` the gateway refused because the next incarnation could not
/// start (docs/protocol.md §3); the running one keeps serving.
pub const RESTART_REFUSED: &str = "restart_refused";
/// How long the next incarnation (or the preflight child) may take to prepare before a
/// restart is refused. Preparing opens files and builds objects; it contacts nothing.
pub const PREPARE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);
/// How long a requester waits for the verdict on its [`Op::Restart`]: the preparation, and a
/// margin. The gateway answers within it; a client waits that long.
pub const VERDICT_PATIENCE: std::time::Duration = PREPARE_PATIENCE.saturating_add(std::time::Duration::from_secs(5));
/// What a restart request that joined one under way is told.
pub const JOINED: &str = "joined the restart already under way";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requester {
    pub pid: u32,
    #[serde(default)]
    pub argv: Vec<String>,
    pub channel: String,
}

impl Requester {
    /// The calling process, on `channel`.
    pub fn current(channel: &str) -> Requester {
        Requester {
            pid: std::process::id(),
            argv: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            channel: channel.into(),
        }
    }

    /// The operator's command line: channel `cli`, or `dashboard` when a dashboard started
    /// this command for a button ([`REQUESTER_CHANNEL_ENV`]); the ledger then says who asked.
    pub fn cli() -> Requester {
        let dashboard = std::env::var_os(REQUESTER_CHANNEL_ENV).is_some_and(|v| v == "dashboard");
        Requester::current(if dashboard { "dashboard" } else { "cli" })
    }

    pub fn describe(&self) -> String {
        if self.argv.is_empty() {
            format!("pid {} via {}", self.pid, self.channel)
        } else {
            format!("pid {} ({}) via {}", self.pid, self.argv.join(" "), self.channel)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Stop,
    Takeover,
}

/// One request. Internally tagged by `op`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Ping,
    Status,
    Stop {
        requester: Requester,
        #[serde(default = "default_stop_reason")]
        reason: StopReason,
    },
    Restart {
        requester: Requester,
    },
    /// Cancels the drain of a planned restart: the gateway runs on (docs/protocol.md §3).
    /// Answered once it is `running` again, or with why it cannot be cancelled.
    CancelDrain {
        requester: Requester,
    },
    /// Re-reads config.toml and the secrets and applies what can change live (docs/protocol.md
    /// §3). Answered once applied, or with why the configuration was refused.
    Reload {
        requester: Requester,
    },
    /// The access policy's pairing book: list it, approve a code, revoke a sender
    /// (docs/protocol.md §3). Decided at once by the running gateway.
    Pairing {
        requester: Requester,
        request: PairingRequest,
    },
}

/// What an [`Op::Pairing`] asks. `platform` is a `[[platform]]`'s name, or its kind when the
/// home has one of that kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum PairingRequest {
    List,
    Approve { platform: String, code: String },
    Revoke { platform: String, user: String },
}

fn default_stop_reason() -> StopReason {
    StopReason::Stop
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub op: Op,
}

impl From<Op> for Request {
    fn from(op: Op) -> Request {
        Request { v: PROTOCOL_VERSION, op }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    pub fn ok(result: Value) -> Response {
        Response { ok: true, result: Some(result), error: None }
    }

    pub fn err(code: &str, message: impl Into<String>) -> Response {
        Response { ok: false, result: None, error: Some(ErrorBody { code: code.into(), message: message.into() }) }
    }
}

/// The one status shape: `status --json`, `GET /v1/status`, control `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub running: bool,
    pub pid: Option<u32>,
    pub start_time: Option<u64>,
    pub incarnation: Option<String>,
    pub version: Option<String>,
    pub state: Option<String>,
    pub home: String,
    pub listen: Option<String>,
    pub uptime_s: Option<f64>,
    pub supervisor: Option<String>,
    #[serde(default)]
    pub active_runs: Option<u64>,
    pub control: Option<String>,
    /// Each record: `ok`, `missing` or `unreadable: <why>`.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The openai backend's upstream providers, in order (absent for other backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub providers: Option<Vec<ProviderStatus>>,
    /// Extra facts (service manager state, notes) added by later layers.
    #[serde(default, flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One upstream provider in [`StatusReport::providers`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderStatus {
    pub name: String,
    /// `healthy`, `failing` or `cooling_down`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Unix seconds when a cool-down ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// HTTP requests made and failed, this incarnation.
    pub attempts: u64,
    pub failures: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_matches_the_doc() {
        let r: Request = Op::Stop {
            requester: Requester { pid: 5, argv: vec!["g".into()], channel: "cli".into() },
            reason: StopReason::Takeover,
        }
        .into();
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"v":1,"op":"stop","requester":{"pid":5,"argv":["g"],"channel":"cli"},"reason":"takeover"}"#);
        let back: Request = serde_json::from_str(r#"{"v":1,"op":"status"}"#).unwrap();
        assert_eq!(back.op, Op::Status);
        let stop: Request = serde_json::from_str(r#"{"v":1,"op":"stop","requester":{"pid":1,"channel":"x"}}"#).unwrap();
        assert!(matches!(stop.op, Op::Stop { reason: StopReason::Stop, .. }));
        assert!(serde_json::from_str::<Request>(r#"{"v":1,"op":"explode"}"#).is_err());
        let p: Request = Op::Pairing {
            requester: Requester { pid: 5, argv: vec![], channel: "cli".into() },
            request: PairingRequest::Approve { platform: "telegram".into(), code: "XKGH5N7P".into() },
        }
        .into();
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"v":1,"op":"pairing","requester":{"pid":5,"argv":[],"channel":"cli"},"request":{"action":"approve","platform":"telegram","code":"XKGH5N7P"}}"#
        );
    }
}
