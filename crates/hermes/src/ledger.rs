//! Our ledger of the actions we take on a hermes home: `<home>/gatewarden/actions.jsonl`,
//! never one of hermes's files. Best effort: an action is not refused because its ledger
//! line could not be written. Written through the home's folder handle ([`HermesHome::open_ours`]):
//! a `gatewarden` folder or ledger planted as a link is refused, not followed.

use std::io::Write;

use gatewarden_lifecycle::ledger::{ROTATE_BYTES, Writer};
use serde_json::Value;

use crate::home::{ACTIONS_LEDGER, HermesHome};

/// Appends one event (`stop.marker`, `stop.signal`, `restart.done`, …).
pub fn record(home: &HermesHome, event: &str, fields: Value) {
    let _ = append(home, event, fields);
}

fn append(home: &HermesHome, event: &str, fields: Value) -> std::io::Result<()> {
    let line = Writer::current().render(event, fields)?;
    let dir = home.open_ours()?;
    let mut f = dir.open_append(ACTIONS_LEDGER)?;
    if f.metadata().is_ok_and(|m| m.len() > ROTATE_BYTES) {
        dir.rename(ACTIONS_LEDGER, &format!("{ACTIONS_LEDGER}.1"))?;
        f = dir.open_append(ACTIONS_LEDGER)?;
    }
    f.write_all(&line)
}
