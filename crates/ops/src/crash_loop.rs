//! A crash loop as `status` and `doctor` name it, read from the end of the ledger: the crash
//! run (gatewarden-lifecycle `crashes`) and the delay `crash-backoff` or `supervise` recorded
//! (`crash_backoff` lines).

use std::time::SystemTime;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::crashes::crash_run;
use gatewarden_lifecycle::ledger::{self, Line};

/// Ledger lines read back: more than any crash run worth a delay.
const TAIL: usize = 400;

/// A crash loop as `status` and `doctor` name it (two or more crashes in a row).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CrashLoop {
    pub crashes: u32,
    pub since: Option<String>,
    /// How the newest crash ended: systemd's words when its `crash-backoff` recorded them
    /// ("killed by SIGKILL"), else the ledger's.
    pub last_exit: String,
    /// The delay `crash-backoff` chose after the newest crash, in ms.
    pub delay_ms: Option<u64>,
}

impl CrashLoop {
    pub fn sentence(&self) -> String {
        let since = self.since.as_deref().map(|s| format!(" since {s}")).unwrap_or_default();
        let delay =
            self.delay_ms.map(|d| format!("; next restart after {:.1} s", d as f64 / 1000.0)).unwrap_or_default();
        format!("{} crashes in a row{since}; last exit: {}{delay}", self.crashes, self.last_exit)
    }
}

/// The ledger's events, oldest first (at most [`TAIL`]).
pub(crate) fn events(home: &Home) -> Vec<serde_json::Map<String, serde_json::Value>> {
    match ledger::read_tail(&home.ledger(), Some(TAIL)).ok() {
        Some(lines) => lines
            .into_iter()
            .filter_map(|l| match l {
                Line::Event(m) => Some(m),
                Line::Garbage(_) => None,
            })
            .collect(),
        None => Vec::new(),
    }
}

/// The crash loop at the end of the ledger, if any (`running_now`: a gateway holds the lock,
/// so the newest incarnation is alive, not crashed).
pub fn crash_loop(home: &Home, running_now: bool) -> Option<CrashLoop> {
    let events = events(home);
    let run = crash_run(&events, SystemTime::now(), running_now);
    if run.crashes < 2 {
        return None;
    }
    // systemd's description of the newest exit, when crash-backoff ran after it.
    let newest_start = events.iter().rposition(|e| e.get("event").and_then(|v| v.as_str()) == Some("started"));
    let backoff = events
        .iter()
        .enumerate()
        .rev()
        .find(|(_, e)| e.get("event").and_then(|v| v.as_str()) == Some("crash_backoff"))
        .filter(|(i, _)| running_now || newest_start.is_none_or(|s| *i > s))
        .map(|(_, e)| e);
    let last_exit = backoff
        .and_then(|e| e.get("exit").and_then(|v| v.as_str()).map(str::to_owned))
        .or_else(|| run.last.as_ref().map(|l| l.describe()))
        .unwrap_or_default();
    let delay_ms = backoff.and_then(|e| e.get("delay_ms").and_then(serde_json::Value::as_u64));
    Some(CrashLoop { crashes: run.crashes, since: run.since, last_exit, delay_ms })
}
