//! `gatewarden send TEXT`: a client for `POST /v1/messages`, handy for chat commands.
//!
//! `/stop` and `/restart` go through the control socket instead: over HTTP they need an admin
//! with the API token (docs/security.md), and the local owner is the one who can open the
//! owner-only socket. The gateway records the requester as `cli-send`.

use std::process::ExitCode;
use std::time::Duration;

use gatewarden_control::proto::{Op, StopReason};
use gatewarden_control::{Client, Endpoint, Requester};
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::records::read_state;
use gatewarden_runtime::commands::{Command, parse_command};
use serde_json::{Value, json};

pub fn send(home: &Home, text: &str, chat: &str, user: &str, is_async: bool) -> crate::Result<ExitCode> {
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
        Client::connect(&ep, t)
            .and_then(|mut c| c.call(op, t))
            .map_err(|e| crate::Error::msg(format!("cannot reach the gateway's control socket: {e}")))?;
        println!("{reply}");
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
    let token = gatewarden_config::Config::load(home.dir()).ok().and_then(|c| c.api_token);
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
    if let Some(reply) = body.get("reply").and_then(Value::as_str) {
        println!("{reply}");
    } else if let Some(id) = body.get("message_id").and_then(Value::as_str) {
        println!("queued as {id}");
    } else {
        eprintln!("HTTP {status}: {body}");
    }
    for n in body.get("notices").and_then(Value::as_array).into_iter().flatten() {
        eprintln!("notice: {}", n.as_str().unwrap_or_default());
    }
    if let Some(n) = body.get("notice").and_then(Value::as_str) {
        eprintln!("notice: {n}");
    }
    Ok(if (200..300).contains(&status) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
