//! `gatewarden send TEXT`: a client for `POST /v1/messages`, handy for chat commands.
//!
//! `/stop` and `/restart` go through the control socket instead: over HTTP they need an admin
//! with the API token (docs/security.md), and the local owner is the one who can open the
//! owner-only socket. The gateway records the requester as `cli-send`.
//!
//! `--json`: one document on stdout, `{"ok", "http_status", "reply", "message_id", "notices"}`
//! (`"command"` and no `http_status` for `/stop` and `/restart`; docs/protocol.md §6.3).

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_control::proto::{Op, RESTART_REFUSED, StopReason};
use gatewarden_control::{Client, ClientError, Endpoint, Requester};
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::records::read_state;
use gatewarden_runtime::commands::{Command, parse_command};
use serde_json::{Value, json};

pub fn send(home: &Home, text: &str, chat: &str, user: &str, is_async: bool, json: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    if !matches!(crate::presence::presence(&home, "send"), crate::presence::Presence::Running) {
        crate::bail!("no gateway running in {} (start one with `gatewarden start`)", home.dir().display());
    }
    let ep = Endpoint::for_home(home.dir());
    let t = Duration::from_secs(2);
    let control = match parse_command(text) {
        Some(Command::Stop) => {
            Some((Op::Stop { requester: Requester::current("cli-send"), reason: StopReason::Stop }, "stopping…"))
        }
        Some(Command::Restart) => Some((Op::Restart { requester: Requester::current("cli-send") }, "restarting…")),
        _ => None,
    };
    if let Some((op, reply)) = control {
        let command = match op {
            Op::Stop { .. } => "stop",
            _ => "restart",
        };
        // The gateway's answer, as a chat would read it (issue 30, item 2): a restart that
        // joined one under way says so; one refused because a stop is under way exits 1; one
        // taken on is answered once the gateway knows whether the next incarnation can run.
        // A stop that could not be recorded (a full disk) goes on, and may be undone.
        let answered =
            Client::connect(&ep, t).and_then(|mut c| c.call(op, gatewarden_control::proto::VERDICT_PATIENCE));
        let answer = match answered {
            Ok(v) if v.get("joined").is_some_and(|j| j == "restart") => gatewarden_control::proto::JOINED,
            Ok(v) if v.get("warning").is_some_and(Value::is_string) => {
                let warning = v["warning"].as_str().unwrap_or_default();
                match json {
                    true => crate::ui::print_json(&json!({"ok": false, "command": command, "reply": reply,
                        "notices": [], "error": format!("warning: {warning}")})),
                    false => outln!("{reply}"),
                }
                errln!("warning: {warning}");
                return Ok(ExitCode::from(1));
            }
            Ok(_) => reply,
            Err(ClientError::Refused { code, message }) if code == RESTART_REFUSED => {
                errln!("restart refused: {message}; the running gateway keeps serving");
                if json {
                    crate::ui::print_json(&json!({"ok": false, "command": command, "reply": null,
                        "notices": [], "error": format!("restart refused: {message}")}));
                }
                return Ok(ExitCode::from(1));
            }
            Err(ClientError::Refused { message, .. }) => {
                errln!("{message}");
                if json {
                    crate::ui::print_json(&json!({"ok": false, "command": command, "reply": null,
                        "notices": [], "error": message}));
                }
                return Ok(ExitCode::from(1));
            }
            Err(e) => crate::bail!("cannot reach the gateway's control socket: {e}"),
        };
        match json {
            true => crate::ui::print_json(&json!({"ok": true, "command": command, "reply": answer, "notices": []})),
            false => outln!("{answer}"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let listen = Client::connect(&ep, t)
        .and_then(|mut c| c.status(t))
        .ok()
        .and_then(|s| s.listen)
        .or_else(|| read_state(&home.state_file()).ok().and_then(|s| s.listen))
        .ok_or_else(|| {
            crate::Error::msg(format!(
                "no gateway running in {} (start one with `gatewarden start`)",
                home.dir().display()
            ))
        })?;
    // 0.0.0.0 / [::] are where it listens, not where to connect.
    let host = listen.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]");
    // Resolved as the gateway resolves it (written in config.toml, or its variable or file).
    let token = gatewarden_config::Config::load(home.dir())
        .ok()
        .and_then(|c| gatewarden_config::Secrets::resolve(home.dir(), &c).api_token())
        .map(|t| t.expose().to_owned());
    // The gateway on loopback, never through a proxy: ureq's default reads HTTP_PROXY /
    // ALL_PROXY, which would send the API token to the proxy (or fail on a dead one).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_connect(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut req = agent.post(format!("http://{host}/v1/messages"));
    if let Some(tok) = token {
        req = req.header("Authorization", format!("Bearer {tok}"));
    }
    let mut resp = req.send_json(json!({"chat_id": chat, "user_id": user, "text": text, "async": is_async}))?;
    let status = resp.status().as_u16();
    let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
    let ok = (200..300).contains(&status);
    if json {
        let mut notices: Vec<Value> = body.get("notices").and_then(Value::as_array).cloned().unwrap_or_default();
        notices.extend(body.get("notice").cloned().filter(Value::is_string));
        let error = (!ok).then(|| body.get("error").cloned().unwrap_or_else(|| body.clone()));
        crate::ui::print_json(&json!({"ok": ok, "http_status": status, "reply": body.get("reply"),
            "message_id": body.get("message_id"), "notices": notices, "error": error}));
        return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    if let Some(reply) = body.get("reply").and_then(Value::as_str) {
        outln!("{}", crate::screen::shown(reply));
    } else if let Some(id) = body.get("message_id").and_then(Value::as_str) {
        outln!("queued as {id}");
    } else {
        errln!("HTTP {status}: {body}");
    }
    for n in body.get("notices").and_then(Value::as_array).into_iter().flatten() {
        errln!("notice: {}", n.as_str().unwrap_or_default());
    }
    if let Some(n) = body.get("notice").and_then(Value::as_str) {
        errln!("notice: {n}");
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
