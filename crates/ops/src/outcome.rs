//! A lifecycle verb's `--json` document (docs/protocol.md §6.3): the verb's run with stdout
//! pointed at stderr, then one document with its exit code and the status it left. Above
//! `status` (it reads the status before and after), so `ui` stays below both.

use std::io::Write;
use std::process::ExitCode;

use gatewarden_lifecycle::Home;
use serde_json::{Value, json};

use crate::ui::code_of;

/// Runs a lifecycle verb; with `json`, its lines go to stderr and stdout gets one document:
/// `{"verb", "ok", "exit_code", "before": {…}, "status": <status --json>}` (plus `"error"`
/// when it failed with one). Without `json`, exactly `f()`.
pub fn outcome(
    home: &Home,
    verb: &str,
    json: bool,
    f: impl FnOnce() -> crate::Result<ExitCode>,
) -> crate::Result<ExitCode> {
    // The detached copy of `restart` writes into its first process's stderr already: the
    // first process writes the document.
    if !json || std::env::var_os(crate::env::ORCHESTRATOR_ENV).is_some() {
        return f();
    }
    let before = brief(&crate::status::report(home).1);
    let saved = gatewarden_lifecycle::platform::stdout_to_stderr();
    let result = f();
    let (code, error) = match &result {
        Ok(c) => (code_of(*c), None),
        Err(e) => (1, Some(format!("{e:#}"))),
    };
    let (_, after) = crate::status::report(home);
    let mut doc = json!({"verb": verb, "ok": code == 0, "exit_code": code, "before": before, "status": after});
    if let Some(e) = error {
        doc["error"] = json!(e);
    }
    let text = serde_json::to_string(&doc).unwrap_or_else(|_| "null".into());
    match saved {
        Ok(mut out) => {
            let _ = writeln!(out, "{text}");
        }
        // Nothing to redirect with (docs: the OS facade): the document is the last line.
        Err(_) => outln!("{text}"),
    }
    result
}

/// Who ran before a lifecycle verb: enough to tell a new incarnation from the old one.
fn brief(r: &gatewarden_control::StatusReport) -> Value {
    json!({"running": r.running, "pid": r.pid, "incarnation": r.incarnation, "state": r.state})
}
