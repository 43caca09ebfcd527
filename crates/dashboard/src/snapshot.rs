//! What a page is rendered from: plain data the gateway already has, gathered in one call.
//!
//! The core is the status report (`StatusReport`, crates/control/src/proto.rs: the same shape
//! as `status --json` and `GET /v1/status`), the ledger tail (crates/lifecycle/src/ledger.rs)
//! and the desired state (crates/lifecycle/src/desired.rs). The rest are small views of things
//! the runtime knows (runs, the journal's queue, doctor findings, the log tail); a field left
//! empty renders as a named empty state, never as a missing section.

use gatewarden_control::proto::StatusReport;
use gatewarden_lifecycle::desired::Desired;
use gatewarden_lifecycle::ledger::Line;
use gatewarden_lifecycle::records::StateRecord;
use serde_json::Value;

/// Everything one dashboard page shows about one home.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub status: StatusReport,
    /// The ledger's tail, oldest first (`ledger::read_tail`).
    pub ledger: Vec<Line>,
    pub desired: Option<Desired>,
    /// What the OS lock says, next to what the state file says.
    pub lock: LockView,
    pub state_file: Option<StateRecord>,
    /// Render time, µs since the epoch (`timefmt::to_micros`): the timeline's right edge.
    pub now_us: i128,
    pub runs: Vec<RunView>,
    pub drain: Option<DrainView>,
    pub queue: Option<QueueCounts>,
    pub doctor: Vec<Finding>,
    pub update: Option<UpdateView>,
    pub log_tail: Vec<LogLine>,
    /// The journal's messages that are not done (queued, running, failed, given up), newest
    /// first, bounded by the gatherer.
    pub messages: Vec<MessageView>,
    /// Chats with their last turns, most recent first.
    pub conversations: Vec<Conversation>,
    /// The last dashboard action and what came of it (crate::actions).
    pub outcome: Option<crate::actions::Outcome>,
    /// What chat `/update` would install (`[update] source`): the page offers Update only then.
    pub update_source: Option<String>,
    /// Message text was left out ([`Snapshot::hide_text`]); the page says so.
    pub text_hidden: bool,
    /// Who may reach the agent, per platform: its access and pairing book (the gateway's own
    /// page; crates/runtime/src/access/).
    pub access: Vec<AccessView>,
}

/// One platform's access policy and pairing book.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessView {
    pub platform: String,
    pub kind: String,
    /// `pairing`, `allowlist` or `open`.
    pub access: String,
    /// `(code, sender, chat, valid until)`.
    pub pending: Vec<(String, String, String, String)>,
    /// `(sender, approved at, by)`.
    pub approved: Vec<(String, String, String)>,
}

impl AccessView {
    /// From one platform of `pairing list`'s JSON (docs/protocol.md §3).
    pub fn from_json(v: &Value) -> AccessView {
        let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        AccessView {
            platform: s(v, "name"),
            kind: s(v, "kind"),
            access: s(v, "access"),
            pending: list("pending")
                .iter()
                .map(|q| (s(q, "code"), s(q, "user"), s(q, "chat"), s(q, "expires_at")))
                .collect(),
            approved: list("approved").iter().map(|a| (s(a, "user"), s(a, "approved_at"), s(a, "by"))).collect(),
        }
    }
}

/// The OS lock (`gateway.lock`) as a probe saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LockView {
    #[default]
    Unknown,
    Free,
    /// Held; by this pid when the holder could be named.
    Held {
        pid: Option<u32>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    pub id: String,
    pub chat: String,
    pub backend: String,
    pub elapsed_s: f64,
    pub streaming: bool,
}

/// A drain in progress: runs when it began, runs left, and its deadline (µs since the epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainView {
    pub runs_at_start: u64,
    pub remaining: u64,
    pub deadline_us: Option<i128>,
}

/// The journal's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub queued: u64,
    pub running: u64,
    pub failed: u64,
    pub given_up: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `ok`, `warn`, `fail`.
    pub severity: String,
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateView {
    pub version: String,
    /// The last transaction's phase (`committed`, `rolled_back`, `failed`) and versions.
    pub last_phase: Option<String>,
    pub last_from: Option<String>,
    pub last_to: Option<String>,
    pub blessed: Option<bool>,
}

/// Where a journaled message is, as the Messages section groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Queued,
    Running,
    Failed,
    /// Failed because it was interrupted by restarts too many times (the journal's recovery
    /// gave up on it).
    GivenUp,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Queued => "queued",
            MessageState::Running => "running",
            MessageState::Failed => "failed",
            MessageState::GivenUp => "given up",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageView {
    pub id: String,
    /// `platform:chat` or the HTTP chat id.
    pub chat: String,
    pub state: MessageState,
    /// The message's text, shortened by the gatherer.
    pub text: String,
    pub reason: Option<String>,
    pub attempts: i64,
    pub updated_at: String,
    /// The message's path through the gateway (received, journaled, claimed, backend called,
    /// …), oldest first, from the journal (crates/runtime/src/http/ui.rs `trace_of`).
    pub trace: Vec<TraceStep>,
}

/// One step of a message's trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceStep {
    pub at: String,
    pub step: String,
    pub detail: Option<String>,
}

/// One chat and its last turns (user text, reply), oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// The platform adapter's name; `None` for the HTTP API.
    pub platform: Option<String>,
    pub chat: String,
    pub turns: Vec<(String, Option<String>)>,
    pub last_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: String,
    pub text: String,
}

/// The cluster facts of a status report (`extra.cluster`, crates/cluster/src/driver.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub name: String,
    pub role: String,
    pub epoch: Option<i64>,
    /// The active's host and listen address, when one is known.
    pub active: Option<String>,
}

/// One adapter's line of `extra.platforms` (crates/runtime/src/platforms.rs `report`).
#[derive(Debug, Clone, PartialEq)]
pub struct PlatformView {
    pub name: String,
    pub kind: String,
    pub state: String,
    pub reason: Option<String>,
    pub lag_s: Option<f64>,
    pub received: u64,
    pub sent: u64,
    /// The last error the adapter saw, even after it recovered.
    pub last_error: Option<String>,
    pub since: Option<String>,
    /// Another poller seen on the same credential (Telegram's 409).
    pub conflicts: u64,
}

impl Snapshot {
    /// Leaves out what carries conversation text, for a page any local user may read (a
    /// gateway without `api_token`, crates/dashboard/src/web.rs): the messages' text, failure
    /// reasons, trace details and ids (an id reads the reply from `/v1/messages/{id}`), the
    /// runs' message ids, the chats' turns, the log tail and a dashboard action's output.
    /// Counts, states, chats and times stay.
    pub fn hide_text(&mut self) {
        const HIDDEN: &str = "(hidden)";
        for m in &mut self.messages {
            m.id = HIDDEN.into();
            m.text = HIDDEN.into();
            m.reason = m.reason.as_ref().map(|_| HIDDEN.into());
            for t in &mut m.trace {
                t.detail = None;
            }
        }
        for r in &mut self.runs {
            r.id = HIDDEN.into();
        }
        for c in &mut self.conversations {
            c.turns.clear();
        }
        self.log_tail.clear();
        if let Some(o) = &mut self.outcome {
            o.output.clear();
            o.said = o.said.as_ref().map(|_| HIDDEN.into());
        }
        self.text_hidden = true;
    }

    pub fn cluster(&self) -> Option<ClusterView> {
        let c = self.status.extra.get("cluster")?.as_object()?;
        let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
        let active = c.get("active").and_then(Value::as_object).map(|a| {
            let host = a.get("host").and_then(Value::as_str).unwrap_or("?");
            match a.get("listen").and_then(Value::as_str) {
                Some(l) => format!("{host} ({l})"),
                None => host.to_owned(),
            }
        });
        Some(ClusterView {
            name: s("name").unwrap_or_default(),
            role: s("role").unwrap_or_else(|| "unknown".into()),
            epoch: c.get("epoch").and_then(Value::as_i64),
            active,
        })
    }

    /// Who may use the platforms' credentials now: under `[cluster]` only the active, for as
    /// long as its lease lasts (`extra.cluster.lease_left_ms`); `None` without a cluster.
    pub fn credential_lease(&self) -> Option<String> {
        let c = self.cluster()?;
        let left = self.status.extra.get("cluster")?.get("lease_left_ms").and_then(Value::as_u64);
        Some(match (c.role.as_str(), left) {
            ("active", Some(ms)) => {
                format!("held by this gateway (the cluster's active), {:.1} s left", ms as f64 / 1000.0)
            }
            ("active", None) => "held by this gateway (the cluster's active)".to_owned(),
            (role, _) => format!("not held: this gateway is {role}; the active polls"),
        })
    }

    pub fn platforms(&self) -> Vec<PlatformView> {
        let Some(list) = self.status.extra.get("platforms").and_then(Value::as_array) else { return Vec::new() };
        list.iter()
            .filter_map(Value::as_object)
            .map(|p| {
                let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
                PlatformView {
                    name: s("name").unwrap_or_default(),
                    kind: s("kind").unwrap_or_default(),
                    state: s("state").unwrap_or_else(|| "unknown".into()),
                    reason: s("reason"),
                    lag_s: p.get("lag_s").and_then(Value::as_f64),
                    received: p.get("received").and_then(Value::as_u64).unwrap_or(0),
                    sent: p.get("sent").and_then(Value::as_u64).unwrap_or(0),
                    last_error: match p.get("last_error") {
                        Some(Value::String(e)) => Some(e.clone()),
                        Some(Value::Null) | None => None,
                        Some(other) => Some(other.to_string()),
                    },
                    since: s("since"),
                    conflicts: p.get("conflicts").and_then(Value::as_u64).unwrap_or(0),
                }
            })
            .collect()
    }

    /// What the status report adds in words (crates/ops/src/status.rs): a crash
    /// loop, why the gateway is unresponsive, records not yet published, the service manager's
    /// view, a note. In that order, each `(label, text)`.
    pub fn notes(&self) -> Vec<(&'static str, String)> {
        let x = &self.status.extra;
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        };
        let mut out = Vec::new();
        if let Some(s) = x.get("crash_loop").and_then(|c| c.get("sentence")).and_then(text) {
            out.push(("crash loop", s));
        }
        if let Some(s) = x.get("unresponsive").and_then(text) {
            out.push(("unresponsive", s));
        }
        if let Some(s) = x.get("records").and_then(text) {
            out.push(("records", s));
        }
        if let Some(m) = x.get("service").and_then(Value::as_object) {
            let f = |k: &str| m.get(k).and_then(text).unwrap_or_else(|| "?".into());
            out.push((
                "service",
                format!(
                    "{} {} ({}): active {}, main pid {}",
                    f("manager"),
                    f("unit"),
                    f("scope"),
                    f("active"),
                    f("main_pid")
                ),
            ));
        }
        if let Some(s) = x.get("note").and_then(text) {
            out.push(("note", s));
        }
        out
    }

    /// The supervisor's evidence (`extra.supervisor_evidence`), as text.
    pub fn supervisor_evidence(&self) -> Option<String> {
        match self.status.extra.get("supervisor_evidence")? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// When the OS lock and the state file tell different stories, both sides in words
    /// (`("OS lock: held by pid 7", "state file: stopped (pid 6)")`); `None` when they agree or
    /// either is unknown. The disagreement is the bug report, so the page shows it verbatim.
    pub fn disagreement(&self) -> Option<(String, String)> {
        let sf = self.state_file.as_ref();
        let file_says = || match sf {
            Some(s) => format!("state file: {} (pid {})", s.gateway_state, s.record.pid),
            None => "state file: none".to_owned(),
        };
        let live_state = sf.is_some_and(|s| {
            !matches!(
                s.gateway_state,
                gatewarden_lifecycle::records::GatewayState::Stopped
                    | gatewarden_lifecycle::records::GatewayState::StartupFailed
            )
        });
        match self.lock {
            LockView::Unknown => None,
            LockView::Free if live_state => Some(("OS lock: free (no gateway holds it)".into(), file_says())),
            LockView::Free => None,
            LockView::Held { pid } => {
                let lock_says = match pid {
                    Some(p) => format!("OS lock: held by pid {p}"),
                    None => "OS lock: held".to_owned(),
                };
                match (pid, sf) {
                    (_, None) => Some((lock_says, file_says())),
                    (Some(p), Some(s)) if s.record.pid != p || !live_state => Some((lock_says, file_says())),
                    (None, Some(_)) if !live_state => Some((lock_says, file_says())),
                    _ => None,
                }
            }
        }
    }
}

/// One home in the fleet page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeSummary {
    pub path: String,
    /// `running`, `stopped`, `draining`, …, or `unknown`.
    pub state: String,
    pub pid: Option<u32>,
    pub version: Option<String>,
    pub listen: Option<String>,
    pub last_exit_code: Option<i32>,
    pub last_exit_reason: Option<String>,
    /// `gatewarden` or `hermes`.
    pub kind: String,
}

impl HomeSummary {
    /// From a status report (`status --json`'s shape: a stopped home carries `last_state`,
    /// `last_exit_code` and `last_exit_reason` in `extra`).
    pub fn from_status(r: &StatusReport) -> HomeSummary {
        let extra_str = |k: &str| r.extra.get(k).and_then(Value::as_str).map(str::to_owned);
        let state = match (&r.state, r.running) {
            (Some(s), _) => s.clone(),
            (None, true) => "running".into(),
            (None, false) => "stopped".into(),
        };
        HomeSummary {
            path: r.home.clone(),
            state,
            pid: r.pid.filter(|_| r.running),
            version: r.version.clone(),
            listen: r.listen.clone().filter(|_| r.running),
            last_exit_code: r.extra.get("last_exit_code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()),
            last_exit_reason: extra_str("last_exit_reason"),
            kind: extra_str("kind").unwrap_or_else(|| "gatewarden".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_lifecycle::records::{GatewayState, PidRecord};
    use serde_json::json;

    fn state(pid: u32, s: GatewayState) -> StateRecord {
        StateRecord {
            record: PidRecord {
                pid,
                kind: None,
                argv: vec![],
                start_time: None,
                home: None,
                incarnation: None,
                version: None,
                started_at: None,
            },
            gateway_state: s,
            exit_reason: None,
            exit_code: None,
            active_runs: 0,
            listen: None,
            control: None,
            supervisor: None,
            updated_at: None,
        }
    }

    #[test]
    fn lock_and_state_file_disagreements() {
        let mut s = Snapshot { lock: LockView::Held { pid: Some(7) }, ..Snapshot::default() };
        s.state_file = Some(state(7, GatewayState::Running));
        assert_eq!(s.disagreement(), None);
        s.state_file = Some(state(6, GatewayState::Running));
        assert_eq!(s.disagreement(), Some(("OS lock: held by pid 7".into(), "state file: running (pid 6)".into())));
        s.state_file = Some(state(7, GatewayState::Stopped));
        assert!(s.disagreement().is_some());
        s.lock = LockView::Free;
        assert_eq!(s.disagreement(), None);
        s.state_file = Some(state(7, GatewayState::Draining));
        assert_eq!(s.disagreement().unwrap().0, "OS lock: free (no gateway holds it)");
        s.lock = LockView::Unknown;
        assert_eq!(s.disagreement(), None);
    }

    #[test]
    fn cluster_and_platforms_from_the_status_extras() {
        let mut s = Snapshot::default();
        assert_eq!(s.cluster(), None);
        assert!(s.platforms().is_empty());
        s.status.extra.insert(
            "cluster".into(),
            json!({"name":"c1","role":"standby","epoch":4,"active":{"host":"h2","listen":"10.0.0.2:8080"}}),
        );
        s.status.extra.insert(
            "platforms".into(),
            json!([{"name":"tg","kind":"telegram","state":"retrying","reason":"401","lag_s":1.5,"received":3,"sent":2,"last_error":"409 conflict","conflicts":1}]),
        );
        let c = s.cluster().unwrap();
        assert_eq!((c.role.as_str(), c.epoch, c.active.as_deref()), ("standby", Some(4), Some("h2 (10.0.0.2:8080)")));
        let p = &s.platforms()[0];
        assert_eq!(
            (p.name.as_str(), p.state.as_str(), p.reason.as_deref(), p.sent),
            ("tg", "retrying", Some("401"), 2)
        );
        assert_eq!((p.last_error.as_deref(), p.conflicts), (Some("409 conflict"), 1));
        assert_eq!(s.credential_lease().as_deref(), Some("not held: this gateway is standby; the active polls"));
        s.status.extra.insert("cluster".into(), json!({"name":"c1","role":"active","lease_left_ms":2500}));
        assert_eq!(s.credential_lease().as_deref(), Some("held by this gateway (the cluster's active), 2.5 s left"));
    }

    #[test]
    fn notes_from_the_status_extras() {
        let mut s = Snapshot::default();
        assert!(s.notes().is_empty());
        s.status.extra.insert("crash_loop".into(), json!({"sentence": "3 crashes in 60 s", "detail": {}}));
        s.status.extra.insert(
            "service".into(),
            json!({"manager": "systemd", "scope": "user", "unit": "gw.service", "active": true, "main_pid": 9}),
        );
        s.status.extra.insert("note".into(), json!("control endpoint not answering yet"));
        let labels: Vec<&str> = s.notes().iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, ["crash loop", "service", "note"]);
        assert_eq!(s.notes()[1].1, "systemd gw.service (user): active true, main pid 9");
    }

    #[test]
    fn a_stopped_home_keeps_its_last_exit() {
        let mut r = StatusReport { home: "/h".into(), ..StatusReport::default() };
        r.extra.insert("last_state".into(), json!("stopped"));
        r.extra.insert("last_exit_code".into(), json!(78));
        r.extra.insert("last_exit_reason".into(), json!("port taken"));
        let h = HomeSummary::from_status(&r);
        assert_eq!(
            (h.state.as_str(), h.last_exit_code, h.last_exit_reason.as_deref()),
            ("stopped", Some(78), Some("port taken"))
        );
    }
}
