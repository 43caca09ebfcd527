//! `POST /v1/messages`, `GET /v1/messages/{id}`, `GET /v1/notices`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_agent::{AgentError, AgentRequest};
use gatewarden_lifecycle::records::GatewayState;
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::commands::{self, Channel, CommandOutcome, Sender};
use crate::worker::RETRY_AFTER;

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub chat_id: String,
    #[serde(default)]
    pub user_id: String,
    pub text: String,
    #[serde(default, rename = "async")]
    pub is_async: bool,
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

pub fn agent_error(e: &AgentError) -> Response {
    match e {
        AgentError::Cancelled => {
            error(StatusCode::SERVICE_UNAVAILABLE, "interrupted", "the run was interrupted by a stop or restart")
        }
        AgentError::Timeout(_) => error(StatusCode::GATEWAY_TIMEOUT, "timeout", e.to_string()),
        AgentError::Failed(_) | AgentError::Upstream { .. } => {
            error(StatusCode::BAD_GATEWAY, "agent_failed", e.to_string())
        }
    }
}

pub async fn post(State(gw): State<Arc<App>>, Json(m): Json<MessageIn>) -> Response {
    let work = &gw.work;
    // `/status` and `/help` are for everyone; `/restart`, `/stop` and `/update` need an admin
    // who came with the API token, never an anonymous caller (docs/security.md; the one rule
    // is `commands::Admins::may_run`).
    let from = Sender { channel: Channel::Http, user_id: &m.user_id };
    let cmd = match commands::decide(&m.text, from, &work.admins) {
        CommandOutcome::Message => None,
        CommandOutcome::Refused { reply, .. } => return error(StatusCode::FORBIDDEN, "forbidden", reply),
        CommandOutcome::Run(cmd) => Some(cmd),
    };
    if let Some(cmd) = cmd {
        let out = work.command(&gw, cmd, None, &m.chat_id, &m.user_id);
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
        if let Some(cause) = out.then {
            let gw = Arc::clone(&gw.gw);
            // After the reply is handed to the connection: the drain never cuts an in-flight
            // response, so the requester always sees its answer.
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                gw.send_cause(cause);
            });
        }
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
    let run_id = work.next_run_id(&gw.me.id);
    let req = AgentRequest {
        run_id: run_id.clone(),
        chat_id: m.chat_id.clone(),
        user_id: m.user_id,
        text: m.text,
        history: Vec::new(),
        platform: None,
        session_started: None,
    };
    match work.run_sync(&gw, req, None).await {
        Ok(reply) => {
            let notices = work.notices.take(gw.home.dir(), &m.chat_id);
            if notices.is_empty() {
                Json(json!({"reply": reply, "run_id": run_id, "chat_id": m.chat_id})).into_response()
            } else {
                Json(json!({"reply": reply, "run_id": run_id, "chat_id": m.chat_id, "notices": notices}))
                    .into_response()
            }
        }
        Err(e) => agent_error(&e),
    }
}

pub async fn get_one(State(gw): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match gw.work.with_journal(move |j| j.get(&id)).await {
        Ok(Some(m)) => Json(json!({
            "message_id": m.id,
            "chat_id": m.chat_id,
            "state": m.state.as_str(),
            "reply": m.reply,
            "reason": m.reason,
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
