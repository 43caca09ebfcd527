//! `gatewarden pairing list|approve|revoke`: the owner's decisions about who reaches the agent
//! (README "Access"). With a gateway running, the decision goes through the control socket and
//! takes effect at once (the gateway writes the book, tells an approved sender, and records
//! the ledger line). With none, the home's `pairing.json` is changed directly, under its lock,
//! and the ledger line is written here; the next gateway reads it. With `[cluster]` the book
//! lives in the cluster's store, so a gateway must run (a standby names the active).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

pub use gatewarden_control::PairingRequest;
use gatewarden_control::{Client, ClientError, Endpoint, Op, Requester};
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_runtime::access::{self, Policy, pairing::Keeper};
use serde_json::{Value, json};

use crate::presence::{Presence, presence};

/// The gateway answers after one write of the book (and, with `[cluster]`, one of the store).
const ANSWER: Duration = Duration::from_secs(15);

pub fn pairing(home: &Home, request: PairingRequest, as_json: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let config = gatewarden_config::Config::load(home.dir()).map_err(crate::Error::msg)?;
    let answer = match presence(&home, "pairing") {
        Presence::Running => live(&home, &request),
        Presence::NotRunning { .. } if config.cluster.is_some() => Err(
            "with [cluster] the pairing book is the cluster's (in its store): run this where a gateway of the cluster runs"
                .to_owned(),
        ),
        Presence::NotRunning { .. } => offline(&home, &config, &request),
        Presence::Unknown(why) => Err(format!("cannot tell whether a gateway runs in {}: {why}", home.dir().display())),
    };
    let result = match answer {
        Ok(v) => v,
        Err(why) => {
            if as_json {
                outln!("{}", json!({"ok": false, "error": why}));
            } else {
                errln!("{why}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    if as_json {
        outln!("{}", json!({"ok": true, "result": result}));
        return Ok(ExitCode::SUCCESS);
    }
    match request {
        PairingRequest::List => out!("{}", human_list(&result)),
        PairingRequest::Approve { .. } => {
            let who = result["sender"].as_str().unwrap_or("?");
            let on = result["platform"].as_str().unwrap_or("?");
            match result["running"].as_bool() {
                Some(false) => outln!(
                    "approved {who} on {on}; no gateway runs here: it takes effect when one starts (they are not told)"
                ),
                _ => outln!("approved {who} on {on}: their messages reach the agent now (they were told)"),
            }
        }
        PairingRequest::Revoke { .. } => {
            let who = result["sender"].as_str().unwrap_or("?");
            outln!(
                "revoked {who} on {}: their messages no longer reach the agent",
                result["platform"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Through the running gateway: decided at once.
fn live(home: &Home, request: &PairingRequest) -> Result<Value, String> {
    let op = Op::Pairing { requester: Requester::cli(), request: request.clone() };
    Client::connect(&Endpoint::for_home(home.dir()), Duration::from_secs(2))
        .and_then(|mut c| c.call(op, ANSWER))
        .map_err(|e| match e {
            ClientError::Refused { message, .. } => message,
            e => e.to_string(),
        })
}

/// No gateway runs: the home's book, changed under its lock; the ledger line written here.
fn offline(home: &Home, config: &gatewarden_config::Config, request: &PairingRequest) -> Result<Value, String> {
    let book = Keeper::load(home.dir())?;
    let policies: Vec<(String, Policy)> = config.platform.iter().map(|p| (p.adapter_name(), Policy::of(p))).collect();
    let resolve = |given: &str| access::resolve(policies.iter().map(|(n, p)| (n.as_str(), p.kind.as_str())), given);
    let requester = Requester::cli();
    let by = format!("{} (pid {})", requester.channel, requester.pid);
    let ledger = Ledger::new(home.ledger(), Writer::current());
    let now = SystemTime::now();
    match request {
        PairingRequest::List => Ok(json!({
            "platforms": book.read(|b| policies.iter().map(|(n, p)| access::platform_json(n, p, b.of(n), now)).collect::<Vec<_>>()),
            "running": false,
        })),
        PairingRequest::Approve { platform, code } => {
            let name = resolve(platform)?;
            let p = book
                .update(|b| {
                    let r = b.of_mut(&name).approve(&name, code, &by, now);
                    let changed = r.is_ok();
                    (r, changed)
                })?
                .map_err(|e| e.to_string())?;
            let fields = json!({"platform": name, "sender": p.user, "code": p.code, "channel": requester.channel, "by": format!("pid {}", requester.pid)});
            let _ = ledger.append("pairing_approved", fields);
            Ok(json!({"platform": name, "sender": p.user, "approved": true, "running": false}))
        }
        PairingRequest::Revoke { platform, user } => {
            let name = resolve(platform)?;
            let fold = policies.iter().find(|(n, _)| *n == name).is_some_and(|(_, p)| p.fold);
            book.update(|b| {
                let r = b.of_mut(&name).revoke(fold, &name, user);
                let changed = r.is_ok();
                (r, changed)
            })?
            .map_err(|e| e.to_string())?;
            let fields = json!({"platform": name, "sender": user, "channel": requester.channel, "by": format!("pid {}", requester.pid)});
            let _ = ledger.append("pairing_revoked", fields);
            Ok(json!({"platform": name, "sender": user, "revoked": true, "running": false}))
        }
    }
}

/// `pairing list` for a person.
fn human_list(v: &Value) -> String {
    let mut out = String::new();
    let platforms = v["platforms"].as_array().map(Vec::as_slice).unwrap_or_default();
    if platforms.is_empty() {
        out.push_str("no [[platform]] in this home\n");
    }
    let s = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    for p in platforms {
        let access = s(&p["access"]);
        let why = match (access.as_str(), p["explicit"].as_bool()) {
            ("open", _) => " — anyone who finds the bot reaches the agent".to_owned(),
            (_, Some(false)) => " (the default: no `access` key)".to_owned(),
            _ => String::new(),
        };
        out.push_str(&format!("{} ({}): access {access}{why}\n", s(&p["name"]), s(&p["kind"])));
        let pending = p["pending"].as_array().map(Vec::as_slice).unwrap_or_default();
        if pending.is_empty() {
            out.push_str("  no pending code\n");
        }
        for q in pending {
            out.push_str(&format!(
                "  pending  {}  from {} (chat {}), valid until {}\n",
                s(&q["code"]),
                s(&q["user"]),
                s(&q["chat"]),
                s(&q["expires_at"])
            ));
        }
        for a in p["approved"].as_array().map(Vec::as_slice).unwrap_or_default() {
            out.push_str(&format!("  approved {}  since {} by {}\n", s(&a["user"]), s(&a["approved_at"]), s(&a["by"])));
        }
        if let Some(n) = p["refused"]["pairing_full"].as_u64().filter(|n| *n > 0) {
            out.push_str(&format!(
                "  {n} message(s) from new senders got no code: {} codes were pending\n",
                access::pairing::MAX_PENDING
            ));
        }
    }
    if v["running"] == Value::Bool(false) {
        out.push_str("(no gateway runs here: this is the home's pairing.json)\n");
    }
    out
}
