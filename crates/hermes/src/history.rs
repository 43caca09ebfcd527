//! `history` for a hermes home: hermes's exit diagnostics (`logs/gateway-exit-diag.log`, the
//! only per-incarnation exit history it keeps), its start ledger (`gateway-starts.log`), and
//! our own action ledger (`gatewarden/actions.jsonl`), merged in time order.

use serde::Serialize;
use serde_json::{Map, Value};

use gatewarden_lifecycle::timefmt;

use crate::files;
use crate::home::{ACTIONS_LEDGER, EXIT_DIAG_LOG, HermesHome, OURS};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// hermes's `logs/gateway-exit-diag.log`.
    ExitDiag,
    /// hermes's `gateway-starts.log`.
    Starts,
    /// Our `gatewarden/actions.jsonl`.
    Gatewarden,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Epoch seconds (for ordering); `None` when the line had no parseable time.
    pub at: Option<f64>,
    pub source: Source,
    /// `gateway.start`, `gateway.exit_clean`, `stop.signal`, …
    pub event: String,
    pub pid: Option<u64>,
    /// The rest of the line.
    pub detail: Map<String, Value>,
}

/// The last `n` entries of every source, merged oldest first.
pub fn history(home: &HermesHome, n: usize) -> Vec<Entry> {
    let mut all = Vec::new();
    let ours = format!("{OURS}/{ACTIONS_LEDGER}");
    for (rel, source, key) in [(EXIT_DIAG_LOG, Source::ExitDiag, "tag"), (ours.as_str(), Source::Gatewarden, "event")] {
        all.extend(files::read_json_lines(home, rel, n).into_iter().map(|mut m| {
            let at = m.get("ts").and_then(Value::as_str).and_then(timefmt::parse).map(files::epoch_s);
            let event = m.remove(key).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            let pid = m.get("pid").and_then(Value::as_u64);
            Entry { at, source, event, pid, detail: m }
        }));
    }
    let starts = files::read_starts(&home.starts_log());
    all.extend(starts.iter().rev().take(n).map(|t| Entry {
        at: Some(*t),
        source: Source::Starts,
        event: "start".into(),
        pid: None,
        detail: Map::new(),
    }));
    all.sort_by(|a, b| a.at.unwrap_or(0.0).total_cmp(&b.at.unwrap_or(0.0)));
    let skip = all.len().saturating_sub(n);
    all.drain(..skip);
    all
}

/// One line per entry.
pub fn render_text(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| {
            let when =
                e.at.map(|t| timefmt::format(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(t.max(0.0))))
                    .unwrap_or_else(|| "?".into());
            let src = match e.source {
                Source::ExitDiag => "hermes",
                Source::Starts => "hermes-starts",
                Source::Gatewarden => "gatewarden",
            };
            let pid = e.pid.map(|p| format!(" pid {p}")).unwrap_or_default();
            let code = e.detail.get("code").map(|c| format!(" code {c}")).unwrap_or_default();
            format!("{when}  {src:<13} {}{pid}{code}\n", e.event)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_sources_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let home = HermesHome::at(dir.path());
        std::fs::create_dir_all(home.logs_dir()).unwrap();
        std::fs::create_dir_all(home.ours_dir()).unwrap();
        std::fs::write(
            home.exit_diag_log(),
            "{\"ts\": \"2026-11-30T16:22:20.297232+00:00\", \"tag\": \"gateway.start\", \"pid\": 7}\n\
             {\"ts\": \"2026-11-30T16:22:23.123333+00:00\", \"tag\": \"gateway.exit_clean\", \"pid\": 7}\n",
        )
        .unwrap();
        std::fs::write(
            home.actions_ledger(),
            "{\"ts\":\"2026-11-30T16:22:22.000000+00:00\",\"event\":\"stop.marker\"}\n",
        )
        .unwrap();
        let h = history(&home, 10);
        let events: Vec<_> = h.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(events, ["gateway.start", "stop.marker", "gateway.exit_clean"]);
        assert!(render_text(&h).contains("gatewarden    stop.marker"));
        assert_eq!(history(&home, 1).len(), 1);
    }
}
