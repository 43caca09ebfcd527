//! `gatewarden trace MESSAGE_ID`: a message's path through the gateway, from the journal (the
//! home's SQLite one, or the cluster's PostgreSQL one with `[cluster]`): received, journaled,
//! claimed, backend called, each provider tried, first token, done or failed, outbox sent
//! (crates/journal/src/trace.rs). [`lines`] is the human rendering the dashboard can reuse.

use std::process::ExitCode;
use std::sync::Arc;

use gatewarden_journal::{Journal, Message, Store, TraceEvent};
use gatewarden_lifecycle::Home;
use serde_json::{Value, json};

use crate::Context;

pub fn trace(home: &Home, id: &str, as_json: bool) -> crate::Result<ExitCode> {
    let store = open(home)?;
    let Some(msg) = store.get(id).with_context(|| format!("cannot read message {id}"))? else {
        crate::bail!("no message {id} in {} (unknown, or pruned by [journal] retention)", store.describe())
    };
    let events = store.trace(id).with_context(|| format!("cannot read the trace of {id}"))?;
    if as_json {
        outln!("{}", to_json(&msg, &events));
    } else {
        for line in lines(&msg, &events) {
            outln!("{}", crate::screen::shown(&line));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The home's journal: the cluster's store with `[cluster]`, else `<home>/journal.sqlite3`
/// (never created by a read: a home without one has no messages).
fn open(home: &Home) -> crate::Result<Arc<dyn Store>> {
    let config = gatewarden_config::Config::load(home.dir()).context("cannot read config.toml")?;
    if let Some(c) = &config.cluster {
        let password = gatewarden_config::Secrets::resolve(home.dir(), &config)
            .get(&gatewarden_config::SecretId::Cluster)
            .map_err(crate::Error::Msg)?;
        let store =
            gatewarden_cluster::PgStore::start_journal(&c.store_url(), password.as_ref().map(|p| p.expose()), &c.name)
                .map_err(|e| crate::Error::Msg(format!("[cluster] store: {e}")))?;
        return Ok(Arc::new(store));
    }
    if gatewarden_journal::check_schema(home.dir()).context("cannot open the journal")? == 0
        && !home.dir().join(gatewarden_journal::JOURNAL_FILE).exists()
    {
        crate::bail!("no journal in {} yet: no message was ever taken", home.dir().display());
    }
    Ok(Arc::new(Journal::open_in(home.dir()).context("cannot open the journal")?))
}

/// `{"id", "state", "platform", "attempts", "reason", "steps": [{step, at, subject, outcome,
/// elapsed_ms}]}`.
pub fn to_json(msg: &Message, events: &[TraceEvent]) -> Value {
    let steps: Vec<Value> = events
        .iter()
        .map(|e| {
            json!({
                "step": e.step.as_str(),
                "at": e.at,
                "subject": e.subject,
                "outcome": e.outcome,
                "elapsed_ms": e.elapsed_ms,
            })
        })
        .collect();
    json!({
        "id": msg.id,
        "state": msg.state.as_str(),
        "platform": msg.platform,
        "attempts": msg.attempts,
        "reason": msg.reason,
        "steps": steps,
    })
}

/// The trace for people: a header, then one line per step with its offset from `received`.
pub fn lines(msg: &Message, events: &[TraceEvent]) -> Vec<String> {
    let from = msg.platform.as_deref().unwrap_or("the HTTP API");
    let mut out = vec![format!(
        "message {} from {from}: {} after {} attempt(s){}",
        msg.id,
        msg.state.as_str(),
        msg.attempts,
        msg.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
    )];
    if events.is_empty() {
        out.push("  (no trace recorded: a message from before traces, or a store that keeps none)".into());
    }
    let start = events.first().and_then(TraceEvent::time);
    for e in events {
        let offset = match (start, e.time()) {
            (Some(s), Some(t)) => match t.duration_since(s) {
                Ok(d) => format!("+{:.3}s", d.as_secs_f64()),
                Err(early) => format!("-{:.3}s", early.duration().as_secs_f64()),
            },
            _ => "?".into(),
        };
        let mut line = format!("  {}  {offset:>9}  {:<14}", e.at, e.step.as_str());
        if let Some(s) = &e.subject {
            line.push_str(&format!(" {s}"));
        }
        if let Some(o) = &e.outcome {
            line.push_str(&format!(": {o}"));
        }
        if let Some(ms) = e.elapsed_ms {
            line.push_str(&format!(" ({ms} ms)"));
        }
        out.push(line.trim_end().to_owned());
    }
    out
}
