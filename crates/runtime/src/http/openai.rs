//! `POST /v1/chat/completions` (OpenAI-compatible, plain and `stream: true` SSE) and
//! `GET /v1/models`, so the official SDKs and chat UIs can use the gateway as their endpoint.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_agent::backend::delivery::Delivery;
use gatewarden_agent::{AgentRequest, Turn};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::messages::{agent_error, error, unavailable};
use crate::app::App;

#[derive(Debug, Deserialize)]
pub struct CompletionIn {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub user: Option<String>,
    /// `{"include_usage": true}`: a last chunk with the usage, when the upstream reported it.
    #[serde(default)]
    pub stream_options: Option<Value>,
}

/// An OpenAI `usage` object; zeros when the backend reported none.
fn usage_json(u: Option<gatewarden_agent::Usage>) -> Value {
    let u = u.unwrap_or_default();
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens)})
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Value,
}

/// `content` is a string or a list of parts (`{"type":"text","text":…}`); only text counts.
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub async fn models(State(gw): State<Arc<App>>) -> Response {
    Json(json!({"object": "list", "data": [{"id": gw.work.model(), "object": "model", "created": 0, "owned_by": "gatewarden"}]}))
        .into_response()
}

pub async fn completions(State(gw): State<Arc<App>>, Json(body): Json<CompletionIn>) -> Response {
    let Some(last_at) = body.messages.iter().rposition(|m| m.role == "user") else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "no message with role \"user\"");
    };
    let text = text_of(&body.messages[last_at].content);
    // The caller's whole conversation goes through: everything before its last user message is
    // history (system prompts included), in order.
    let history: Vec<Turn> = body.messages[..last_at].iter().map(|m| Turn::new(&m.role, text_of(&m.content))).collect();
    let chat = body.user.clone().unwrap_or_else(|| "openai".into());
    if !gw.accepts_work() {
        return unavailable(&gw, &chat);
    }
    let model = body.model.clone().unwrap_or_else(|| gw.work.model());
    let run_id = gw.work.next_run_id(&gw.me.id);
    let id = format!("chatcmpl-{run_id}");
    let req = AgentRequest::new(run_id.clone(), chat.clone(), chat.clone(), text, history);
    if !body.stream {
        return match gw.work.run_reply(&gw, req, None).await {
            Ok(reply) => Json(json!({
                "id": id,
                "object": "chat.completion",
                "created": now_s(),
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": "stop"}],
                "usage": usage_json(reply.usage),
            }))
            .into_response(),
            Err(e) => agent_error(&gw.work, &chat, &run_id, &e),
        };
    }
    let (tx, rx) = mpsc::channel::<String>(64);
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    let created = now_s();
    let include_usage = body.stream_options.as_ref().and_then(|o| o.get("include_usage")) == Some(&Value::Bool(true));
    let usage_chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |u: gatewarden_agent::Usage| {
            let v = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": usage_json(Some(u))});
            Bytes::from(format!("data: {v}\n\n"))
        }
    };
    let chunk = move |delta: Value, finish: Value| {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        Bytes::from(format!("data: {v}\n\n"))
    };
    let gw2 = Arc::clone(&gw);
    let reach = Delivery::default();
    tokio::spawn(async move {
        let forward = {
            let out_tx = out_tx.clone();
            let chunk = chunk.clone();
            let reach = reach.clone();
            async move {
                let mut rx = rx;
                let _ = out_tx.send(chunk(json!({"role": "assistant", "content": ""}), Value::Null)).await;
                while let Some(piece) = rx.recv().await {
                    // Pieces of a provider given up on before anything reached the caller are
                    // dropped; the first one passed on ends failover (issue 27 §6).
                    if reach.take().is_some_and(|e| reach.reach(e)) {
                        let _ = out_tx.send(chunk(json!({"content": piece}), Value::Null)).await;
                    }
                }
            }
        };
        let run = gw2.work.run_reply(&gw2, req, Some((tx, reach)));
        let (result, ()) = tokio::join!(run, forward);
        match result {
            Ok(reply) => {
                let _ = out_tx.send(chunk(json!({}), json!("stop"))).await;
                if let Some(u) = reply.usage.filter(|_| include_usage) {
                    let _ = out_tx.send(usage_chunk(u)).await;
                }
            }
            Err(e) => {
                // What the caller may read (issue 27 §5); the reason is the operator's.
                crate::warn!("run {run_id} failed: {e}");
                let notice = gw2.work.failure_notice(None, &chat, &run_id, &e.to_string());
                let err = json!({"error": {"message": notice, "type": "agent_failed", "reference": run_id}});
                let _ = out_tx.send(Bytes::from(format!("data: {err}\n\n"))).await;
            }
        }
        let _ = out_tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(gatewarden_dashboard::web::ReceiverStream(out_rx)),
    )
        .into_response()
}
