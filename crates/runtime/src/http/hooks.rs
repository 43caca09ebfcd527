//! `GET|POST /hooks/<kind>/<name>`: requests a platform pushes to one adapter (WhatsApp's
//! webhook), handed as they are to [`Adapter::hook`](gatewarden_platforms::Adapter::hook) through
//! [`Platforms::hook`](crate::platforms::Platforms::hook); the runtime knows no platform.
//!
//! No bearer token: the platform signs its requests and the adapter checks them. The body is
//! bounded like every body (`super::body_deadline`: 413 past 2 MiB, 503 when the shared budget
//! is spent); the adapter's own intake bounds what waits for a commit (503 past it). The
//! answer comes once the messages are journaled (or refused), so the handler waits on a
//! blocking thread.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_platforms::{HookAnswer, HookRequest};

use crate::app::App;

pub async fn hook(
    State(gw): State<Arc<App>>,
    Path((kind, name)): Path<(String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = HookRequest {
        post: method == Method::POST,
        query: query.unwrap_or_default(),
        headers: headers
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_owned(), v.to_owned())))
            .collect(),
        body: body.to_vec(),
    };
    let platforms = Arc::clone(&gw.platforms);
    let answer = tokio::task::spawn_blocking(move || platforms.hook(&kind, &name, &req)).await;
    let answer = match answer {
        Ok(Some(a)) => a,
        Ok(None) => HookAnswer::text(404, "no such adapter"),
        Err(e) => HookAnswer::text(500, format!("the adapter's handler failed: {e}")),
    };
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let ctype = if answer.json { "application/json" } else { "text/plain; charset=utf-8" };
    let mut r = (status, [(header::CONTENT_TYPE, ctype)], answer.body).into_response();
    if let Some(s) = answer.retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(s));
    }
    r
}
