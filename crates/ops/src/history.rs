//! `gatewarden history`: the lifecycle ledger, newest last.

use std::process::ExitCode;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::fsio::ReadOutcome;
use gatewarden_lifecycle::ledger::{Line, read_tail};
use serde_json::{Map, Value};

pub fn history(home: &Home, n: usize, as_json: bool) -> crate::Result<ExitCode> {
    let lines = match read_tail(&home.ledger(), Some(n)) {
        ReadOutcome::Ok(l) => l,
        ReadOutcome::Missing => {
            if !as_json {
                outln!("no lifecycle events in {}", home.dir().display());
            }
            return Ok(ExitCode::SUCCESS);
        }
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
            crate::bail!("cannot read {}: {why}", home.ledger().display())
        }
    };
    for line in lines {
        match (line, as_json) {
            (Line::Event(m), true) => outln!("{}", Value::Object(m)),
            (Line::Garbage(text), true) => outln!("{}", serde_json::json!({"unparseable": text})),
            (Line::Event(m), false) => outln!("{}", human(&m)),
            (Line::Garbage(text), false) => outln!("(unparseable line) {text}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn human(m: &Map<String, Value>) -> String {
    let s = |k: &str| m.get(k).map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()));
    let ts = s("ts").unwrap_or_default();
    let event = s("event").unwrap_or_else(|| "?".into());
    let pid = s("pid").unwrap_or_else(|| "?".into());
    let mut out = format!("{ts}  {event:<17} pid {pid}");
    if let Some(inc) = s("incarnation") {
        out.push_str(&format!(" [{inc}]"));
    }
    let detail: Vec<String> = m
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "ts" | "event" | "pid" | "incarnation" | "start_time" | "argv"))
        .map(|(k, v)| format!("{k}={}", v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
        .collect();
    if !detail.is_empty() {
        out.push_str("  ");
        out.push_str(&detail.join(" "));
    }
    out
}
