//! `POST /v1/messages`, `GET /v1/messages/{id}`, `GET /v1/notices`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_agent::{AgentError, AgentRequest};
use gatewarden_journal::{Kind, NewMessage};
use gatewarden_lifecycle::records::GatewayState;
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::cause::RestartAnswer;
use crate::commands::{self, Channel, CommandOutcome, Sender};
use crate::worker::{RETRY_AFTER, Work, http_chat};

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    /// The conversation: its earlier messages are the history (like a platform chat's). Omitted
    /// or empty: a one-shot message without history.
    #[serde(default)]
    pub chat_id: String,
    #[serde(default)]
    pub user_id: String,
    pub text: String,
    #[serde(default, rename = "async")]
    pub is_async: bool,
    /// `false`: one-shot even with a `chat_id` (no history, not kept as history). Sync only.
    #[serde(default = "yes")]
    pub history: bool,
}

fn yes() -> bool {
    true
}

impl MessageIn {
    /// Whether the message belongs to its chat's conversation; a caller error otherwise.
    fn conversation(&self) -> Result<bool, String> {
        if self.chat_id.starts_with(http_chat::RESPONSES) {
            return Err(format!("chat_id may not start with {:?}: /v1/responses keeps those", http_chat::RESPONSES));
        }
        if !self.history && self.is_async && !self.chat_id.is_empty() {
            return Err("\"history\": false is for sync messages; omit chat_id for a one-shot async message".into());
        }
        Ok(self.history && http_chat::is_conversation(&self.chat_id))
    }
}

pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": {"type": code, "message": message.into()}}))).into_response()
}

pub fn unavailable(gw: &App, chat: &str) -> Response {
    gw.work.metrics.unavailable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let notice = gw.work.notices.restarting_notice(chat);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, RETRY_AFTER.as_secs().to_string())],
        Json(json!({"error": {"type": "restarting", "message": "the gateway is restarting; retry shortly"}, "notice": notice})),
    )
        .into_response()
}

/// A failed run as its caller sees it: the configured failure text and the reference (the run
/// id, also in the log line and `status`'s `agent.last_failure`), never the operator's reason
/// (issue 27 §5; `Work::failure_notice`).
pub fn agent_error(work: &Work, user_id: &str, reference: &str, e: &AgentError) -> Response {
    match e {
        AgentError::Cancelled => {
            error(StatusCode::SERVICE_UNAVAILABLE, "interrupted", "the run was interrupted by a stop or restart")
        }
        AgentError::Timeout(_) => error(StatusCode::GATEWAY_TIMEOUT, "timeout", e.to_string()),
        AgentError::Failed(_) | AgentError::Upstream { .. } => {
            crate::warn!("run {reference} failed: {e}");
            let notice = work.failure_notice(None, user_id, reference, &e.to_string());
            (
                StatusCode::BAD_GATEWAY,
                Json(json!({"error": {"type": "agent_failed", "message": notice, "reference": reference}})),
            )
                .into_response()
        }
    }
}

pub async fn post(State(gw): State<Arc<App>>, Json(m): Json<MessageIn>) -> Response {
    let work = &gw.work;
    let conversation = match m.conversation() {
        Ok(c) => c,
        Err(why) => return error(StatusCode::BAD_REQUEST, "invalid_request", why),
    };
    // `/status` and `/help` are for everyone; `/restart`, `/stop` and `/update` need an admin
    // who came with the API token, never an anonymous caller (docs/security.md; the one rule
    // is `commands::Admins::may_run`).
    let from = Sender { channel: Channel::Http, user_id: &m.user_id };
    let cmd = match commands::decide(&m.text, from, &work.live().admins) {
        CommandOutcome::Message => None,
        CommandOutcome::Refused { reply, .. } => return error(StatusCode::FORBIDDEN, "forbidden", reply),
        CommandOutcome::Run(cmd) => Some(cmd),
    };
    if let Some(cmd) = cmd {
        let mut out = work.command(&gw, cmd, &m.text, None, &m.chat_id, &m.user_id);
        // A restart taken on is answered once the main loop knows whether the next incarnation
        // can run (restart.rs): "restarting…", or why not while this one keeps serving (one
        // joined or refused was answered already).
        if let Some(verdict) = out.verdict.take() {
            match tokio::time::timeout(crate::restart::VERDICT_PATIENCE, verdict).await {
                Ok(Ok(Err(why))) => {
                    out.reply = format!("restart refused: {why}; still running (incarnation {})", gw.me.id);
                }
                // Superseded by what the main loop decided first (a stop or a restart).
                Ok(Ok(Ok(answer))) if answer != RestartAnswer::Accepted => out.reply = answer.reply(),
                _ => {}
            }
        }
        let resp = if m.is_async {
            let id = match work.accept_command(&m.chat_id, &m.user_id, &m.text, &out.reply).await {
                Ok(id) => id,
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
            };
            (StatusCode::ACCEPTED, Json(json!({"message_id": id}))).into_response()
        } else {
            Json(json!({"reply": out.reply, "run_id": work.next_run_id(&gw.me.id), "chat_id": m.chat_id, "command": true}))
                .into_response()
        };
        return resp;
    }
    if m.is_async {
        // Journaled in any phase; only a running gateway's worker starts it (else the next
        // incarnation does).
        let running = gw.phase.get() == GatewayState::Running;
        // Queued work is never pruned: past the queue caps a new message is refused instead.
        let (w, chat) = (Arc::clone(work), m.chat_id.clone());
        match tokio::task::spawn_blocking(move || w.queue_refusal(None, &chat)).await {
            Ok(Ok(None)) => {}
            Ok(Ok(Some(why))) => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, RETRY_AFTER.as_secs().to_string())],
                    Json(json!({"error": {"type": "queue_full", "message": why}})),
                )
                    .into_response();
            }
            Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e.to_string()),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e.to_string()),
        }
        return match work.accept_async(&m.chat_id, &m.user_id, &m.text, running).await {
            Ok(id) => (StatusCode::ACCEPTED, Json(json!({"message_id": id}))).into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
        };
    }
    if !gw.accepts_work() {
        return unavailable(&gw, &m.chat_id);
    }
    // A conversation's message is journaled and run with its history; a one-shot one is run
    // as it is and kept nowhere.
    let (run_id, ran) = if conversation {
        let msg = NewMessage { chat_id: m.chat_id.clone(), user_id: m.user_id.clone(), text: m.text, kind: Kind::Sync };
        let id = match work.journal_waiting(&gw, msg).await {
            Ok(id) => id,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
        };
        match run_journaled(&gw, &id, (None, Vec::new()), None).await {
            Ok(r) => (id, r.map(|r| r.text)),
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
        }
    } else {
        let run_id = work.next_run_id(&gw.me.id);
        let req = AgentRequest::new(run_id.clone(), m.chat_id.clone(), m.user_id.clone(), m.text, Vec::new());
        (run_id, work.run_sync(&gw, req, None).await)
    };
    match ran {
        Ok(reply) => {
            let notices = work.notices.take(gw.home.dir(), &m.chat_id);
            let mut body = json!({"reply": reply, "run_id": run_id, "chat_id": m.chat_id});
            if conversation {
                // Journaled: `GET /v1/messages/{id}` shows it.
                body["message_id"] = json!(run_id);
            }
            if !notices.is_empty() {
                body["notices"] = json!(notices);
            }
            Json(body).into_response()
        }
        Err(e) => agent_error(work, &m.user_id, &run_id, &e),
    }
}

/// [`Work::run_journaled`] in its own task: a caller that goes away does not cut the run short
/// (it finishes in the journal, and is its conversation's history).
pub async fn run_journaled(
    gw: &Arc<App>,
    id: &str,
    extras: (Option<String>, Vec<gatewarden_agent::Turn>),
    chunks: Option<crate::worker::Stream>,
) -> Result<Result<gatewarden_agent::AgentReply, AgentError>, String> {
    let (gw, id) = (Arc::clone(gw), id.to_owned());
    tokio::spawn(async move { gw.work.run_journaled(&gw, &id, extras, chunks).await })
        .await
        .unwrap_or_else(|e| Err(format!("the run's task failed: {e}")))
}

pub async fn get_one(State(gw): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match gw.work.with_journal(move |j| j.get(&id)).await {
        Ok(Some(m)) => Json(json!({
            "message_id": m.id,
            "chat_id": m.chat_id,
            "state": m.state.as_str(),
            "reply": m.reply,
            // What the caller may read of why it failed (the operator's reason is in `trace`).
            "reason": m.reason.as_deref().map(|r| gw.work.failure_notice(m.platform.as_deref(), &m.user_id, &m.id, r)),
            "attempts": m.attempts,
            "command": m.is_command,
            "created_at": m.created_at,
            "updated_at": m.updated_at,
        }))
        .into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such message"),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
    }
}

#[derive(Debug, Deserialize)]
pub struct NoticeQuery {
    pub chat_id: String,
}

pub async fn notices(State(gw): State<Arc<App>>, Query(q): Query<NoticeQuery>) -> Response {
    Json(json!({"chat_id": q.chat_id, "notices": gw.work.notices.take(gw.home.dir(), &q.chat_id)})).into_response()
}
