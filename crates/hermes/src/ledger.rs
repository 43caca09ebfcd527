//! Our ledger of the actions we take on a hermes home: `<home>/gatewarden/actions.jsonl`,
//! never one of hermes's files. Best effort: an action is not refused because its ledger
//! line could not be written.

use gatewarden_lifecycle::ledger::{Ledger, Writer};
use serde_json::Value;

use crate::home::HermesHome;

/// Appends one event (`stop.marker`, `stop.signal`, `restart.done`, …).
pub fn record(home: &HermesHome, event: &str, fields: Value) {
    let dir = home.ours_dir();
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let _ = Ledger::new(home.actions_ledger(), Writer::current()).append(event, fields);
}
