//! Lenient, read-only readers for hermes's files. Every reader is total: damaged or foreign
//! content is a [`ReadOutcome::Unreadable`] (or a skipped line), never a panic.

use std::path::Path;
use std::time::SystemTime;

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::records::read_pid_record;
use gatewarden_lifecycle::timefmt;
use serde_json::{Map, Value};

use crate::home::HermesHome;

/// `gateway_state.json` as hermes 0.19 writes it (`gateway/status.py` `write_runtime_status`).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct HermesState {
    pub pid: Option<u32>,
    pub start_time: Option<u64>,
    pub gateway_state: Option<String>,
    pub exit_reason: Option<String>,
    pub restart_requested: Option<bool>,
    pub active_agents: Option<u64>,
    /// Per adapter: `{"state", "error_code", "error_message", "updated_at"}`.
    pub platforms: Map<String, Value>,
    pub served_profiles: Option<Vec<String>>,
    pub updated_at: Option<String>,
}

impl HermesState {
    /// Whether the record describes exactly this process (hermes rewrites it per incarnation;
    /// a record of a predecessor must never describe the current holder).
    pub fn names(&self, id: ProcessIdentity) -> bool {
        self.pid == Some(id.pid) && self.start_time.is_none_or(|t| t == id.start_time)
    }

    /// hermes's "ready": `running`, or `degraded` (started with every platform retrying).
    pub fn is_ready_state(&self) -> bool {
        matches!(self.gateway_state.as_deref(), Some("running" | "degraded"))
    }

    /// Parses the JSON value leniently: fields of the wrong type are left out.
    pub fn from_value(v: &Value) -> Option<HermesState> {
        let o = v.as_object()?;
        let s = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(HermesState {
            pid: o.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()),
            start_time: o.get("start_time").and_then(Value::as_u64),
            gateway_state: s("gateway_state"),
            exit_reason: s("exit_reason"),
            restart_requested: o.get("restart_requested").and_then(Value::as_bool),
            active_agents: o.get("active_agents").and_then(active_agents),
            platforms: o.get("platforms").and_then(Value::as_object).cloned().unwrap_or_default(),
            served_profiles: o
                .get("served_profiles")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect()),
            updated_at: s("updated_at"),
        })
    }
}

/// hermes's `parse_active_agents` accepts an int, a numeric string or a list of agents.
fn active_agents(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Array(a) => Some(a.len() as u64),
        _ => None,
    }
}

pub fn read_state(home: &HermesHome) -> ReadOutcome<HermesState> {
    match fsio::read_json::<Value>(&home.state_file()) {
        ReadOutcome::Ok(v) => match HermesState::from_value(&v) {
            Some(s) => ReadOutcome::Ok(s),
            None => ReadOutcome::Unreadable("not a JSON object".into()),
        },
        ReadOutcome::Missing => ReadOutcome::Missing,
        ReadOutcome::Unreadable(why) => ReadOutcome::Unreadable(why),
        ReadOutcome::Transient(why) => ReadOutcome::Transient(why),
    }
}

/// The identity hermes recorded: `gateway.pid`, else the copy in `gateway.lock` (hermes
/// writes the lock record before the pid file, as its own `get_running_pid` knows).
pub fn recorded_identity(home: &HermesHome) -> Option<ProcessIdentity> {
    read_pid_record(&home.pid_file())
        .ok()
        .and_then(|r| r.identity())
        .or_else(|| read_pid_record(&home.lock()).ok().and_then(|r| r.identity()))
}

/// `state/gateway.heartbeat`: only the fields we use. Its `start_time` is an epoch float,
/// not the clock-tick value of `gateway.pid`, so it is not an identity.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Heartbeat {
    pub pid: Option<u32>,
    pub updated_at: Option<String>,
}

impl Heartbeat {
    /// Seconds since the last beat, when the timestamp parses.
    pub fn age_s(&self, now: SystemTime) -> Option<f64> {
        let t = timefmt::parse(self.updated_at.as_deref()?)?;
        Some(now.duration_since(t).map(|d| d.as_secs_f64()).unwrap_or(0.0))
    }
}

pub fn read_heartbeat(home: &HermesHome) -> Option<Heartbeat> {
    // `state/` is a folder the home's owner controls: reached without following links.
    let f = home.open_read(crate::home::HEARTBEAT).ok()??;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, fsio::MAX_RECORD_BYTES), &mut bytes).ok()?;
    let v = fsio::parse_json_value(&bytes).ok()?;
    Some(Heartbeat {
        pid: v.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()),
        updated_at: v.get("updated_at").and_then(Value::as_str).map(str::to_owned),
    })
}

/// `gateway-starts.log`: one epoch float per line (hermes's respawn-storm ledger).
pub fn read_starts(path: &Path) -> Vec<f64> {
    match fsio::read_bytes(path) {
        ReadOutcome::Ok(bytes) => parse_starts(&String::from_utf8_lossy(&bytes)),
        _ => Vec::new(),
    }
}

pub fn parse_starts(text: &str) -> Vec<f64> {
    text.lines().filter_map(|l| l.trim().parse::<f64>().ok()).filter(|t| t.is_finite()).collect()
}

/// Starts within `window_s` seconds before `now` (epoch seconds).
pub fn starts_within(starts: &[f64], now: f64, window_s: f64) -> usize {
    starts.iter().filter(|t| now - **t <= window_s && **t <= now + 5.0).count()
}

/// hermes sleeps before a start once more than this many starts fall in its 120 s window.
pub const STORM_MAX_STARTS: usize = 5;
pub const STORM_WINDOW_S: f64 = 120.0;

/// The last `n` JSON lines of a log in the home (`rel`: hermes's exit diagnostics, our
/// ledger), oldest first, read through [`HermesHome::open_read`] (no links, no FIFOs, owner
/// checked). Lines that are not JSON objects are skipped; a file that cannot be read safely
/// reads as empty.
pub fn read_json_lines(home: &HermesHome, rel: &str, n: usize) -> Vec<Map<String, Value>> {
    let Ok(Some(f)) = home.open_read(rel) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    // Tail only: these logs are append-only and may be large.
    let Ok(lines) = gatewarden_lifecycle::ledger::tail_lines(f, len, Some(n)) else { return Vec::new() };
    lines
        .into_iter()
        .filter_map(|l| match l {
            gatewarden_lifecycle::ledger::Line::Event(m) => Some(m),
            gatewarden_lifecycle::ledger::Line::Garbage(_) => None,
        })
        .collect()
}

/// Epoch seconds of `t`.
pub fn epoch_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_measured_state_record() {
        let raw = br#"{"pid":6583,"kind":"hermes-gateway","argv":["h"],"start_time":438219,"gateway_state":"running","exit_reason":null,"restart_requested":false,"active_agents":2,"platforms":{"whatsapp":{"state":"fatal","error_code":"whatsapp_bridge_missing"}},"served_profiles":["default","p2"],"updated_at":"2026-11-30T15:25:50.822671+00:00"}"#;
        let v: Value = serde_json::from_slice(raw).unwrap();
        let s = HermesState::from_value(&v).unwrap();
        assert!(s.names(ProcessIdentity { pid: 6583, start_time: 438_219 }));
        assert!(!s.names(ProcessIdentity { pid: 6583, start_time: 1 }));
        assert!(s.is_ready_state());
        assert_eq!(s.active_agents, Some(2));
        assert_eq!(s.platforms["whatsapp"]["state"], "fatal");
        assert_eq!(s.served_profiles.as_deref(), Some(&["default".to_string(), "p2".to_string()][..]));
        // Wrong types are dropped, not fatal.
        let odd: Value =
            serde_json::json!({"pid": -3, "gateway_state": 7, "active_agents": ["a", "b"], "platforms": []});
        let s = HermesState::from_value(&odd).unwrap();
        assert_eq!((s.pid, s.gateway_state, s.active_agents), (None, None, Some(2)));
        assert!(HermesState::from_value(&Value::Null).is_none());
    }

    #[test]
    fn starts_log_and_window() {
        let starts = parse_starts("1000.5\n\ngarbage\n1100.25\nnan\n1190\n");
        assert_eq!(starts, vec![1000.5, 1100.25, 1190.0]);
        assert_eq!(starts_within(&starts, 1200.0, 120.0), 2);
    }

    #[test]
    fn json_lines_tail_skips_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let home = HermesHome::at(dir.path());
        std::fs::create_dir(dir.path().join("logs")).unwrap();
        std::fs::write(
            dir.path().join("logs/x.log"),
            "{\"tag\":\"a\"}\nnot json\n[1]\n{\"tag\":\"b\"}\n{\"tag\":\"c\"}\n",
        )
        .unwrap();
        let tags: Vec<_> = read_json_lines(&home, "logs/x.log", 2).iter().map(|m| m["tag"].clone()).collect();
        assert_eq!(tags, vec!["b", "c"]);
        assert!(read_json_lines(&home, "logs/missing", 5).is_empty());
        assert!(read_json_lines(&home, "nope/missing", 5).is_empty());
    }
}
