//! `gatewarden reload`: the running gateway re-reads config.toml and the secrets it names,
//! applies what can change live and says which keys need a restart (crates/runtime
//! reload.rs). Synchronous: it returns once the gateway applied the reload or refused it, so a
//! service manager's `ExecReload=` fails when the gateway refuses.
//!
//! Exit codes (docs/protocol.md §6.2): 0 reloaded (keys that need a restart are named, and
//! the gateway runs on with their old values); 78, the exit table's fatal configuration, when
//! the configuration does not load (refused: the file, line and key are printed, nothing
//! changed); 3 when no gateway runs (the next start reads the file); 1 otherwise (no answer, a
//! gateway stopping or restarting).

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_control::proto::Op;
use gatewarden_control::{Client, ClientError, Endpoint, Requester};
use gatewarden_lifecycle::{ExitIntent, Home};
use serde_json::{Value, json};

use crate::presence::{Presence, presence};

/// The gateway answers once applied (an adapter restarted in place flushes for 2 s first; the
/// gateway itself gives up waiting on its main loop after 30 s).
const ANSWER: Duration = Duration::from_secs(35);

/// `status`'s "not running".
const NOT_RUNNING: u8 = 3;

pub fn reload(home: &Home, json: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let out = |v: Value, human: &dyn Fn()| {
        if json {
            outln!("{v}");
        } else {
            human();
        }
    };
    if !matches!(presence(&home, "reload"), Presence::Running) {
        let why = "no gateway runs here: nothing to reload (the next start reads config.toml)";
        out(json!({"ok": false, "code": "not_running", "reason": why}), &|| {
            errln!("{} : {why}", home.dir().display());
        });
        return Ok(ExitCode::from(NOT_RUNNING));
    }
    let ep = Endpoint::for_home(home.dir());
    let answer = Client::connect(&ep, Duration::from_secs(2))
        .and_then(|mut c| c.call(Op::Reload { requester: requester() }, ANSWER));
    match answer {
        Ok(r) => {
            out(json!({"ok": true, "reload": r}), &|| print_reloaded(&r));
            Ok(ExitCode::SUCCESS)
        }
        Err(ClientError::Refused { code, message }) => {
            // `reload_refused`: the configuration; `not_running`: a gateway stopping or restarting.
            let refused = code == "reload_refused";
            out(json!({"ok": false, "code": code, "reason": message}), &|| {
                errln!("reload refused: {message}");
                errln!("the gateway runs on as it was");
            });
            Ok(ExitCode::from(if refused { ExitIntent::FatalConfig.code() } else { 1 }))
        }
        Err(e) => {
            let why = e.to_string();
            out(json!({"ok": false, "code": "no_answer", "reason": why}), &|| {
                errln!("the gateway did not answer the reload: {why}");
            });
            Ok(ExitCode::from(1))
        }
    }
}

/// The operator's command line, or `systemd` when a unit's `ExecReload=` runs it (systemd sets
/// `MAINPID` for it).
fn requester() -> Requester {
    match std::env::var_os("MAINPID") {
        Some(_) => Requester::current("systemd"),
        None => Requester::cli(),
    }
}

fn print_reloaded(r: &Value) {
    let list = |k: &str| -> Vec<String> {
        r.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let (changed, restart) = (list("changed"), list("restart_needed"));
    let inc = r.get("incarnation").and_then(Value::as_str).unwrap_or("?");
    match changed.is_empty() {
        true => outln!("reloaded (incarnation {inc}): nothing to change"),
        false => outln!("reloaded (incarnation {inc}): applied {}", changed.join(", ")),
    }
    let adapters = list("adapters_restarted");
    if !adapters.is_empty() {
        outln!("chat adapters restarted with their new settings: {}", adapters.join(", "));
    }
    if !restart.is_empty() {
        let with = r.get("apply_with").and_then(Value::as_str).unwrap_or("gatewarden restart");
        outln!("needs a restart (the gateway runs on with the old values): {}; run `{with}`", restart.join(", "));
    }
    if let Some(e) = r.get("platforms_error").and_then(Value::as_str) {
        errln!("warning: a chat platform did not start again: {e}");
    }
}
