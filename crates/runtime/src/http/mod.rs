//! The HTTP API. Health and readiness are open (they are probes); everything under `/v1` and
//! `/metrics` requires the bearer token when one is configured. Every request's `Host` header
//! must name this gateway (loopback names, the bound address, `[http] allowed_hosts`), so a web
//! page cannot reach a loopback API by rebinding its own DNS name (docs/security.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use gatewarden_lifecycle::records::GatewayState;

use crate::gateway::Gateway;

mod messages;
mod metrics;
mod openai;
pub mod resources;
pub mod serve;

/// The request-body types and their pure helpers, for the fuzz targets (fuzz/fuzz_targets);
/// not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::messages::MessageIn;
    pub use super::openai::{ChatMessage, CompletionIn, text_of};
}

pub fn router(gw: Arc<Gateway>) -> Router {
    let api = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/messages", post(messages::post))
        .route("/v1/messages/{id}", get(messages::get_one))
        .route("/v1/notices", get(messages::notices))
        .route("/v1/chat/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/metrics", get(metrics::metrics))
        // The last layer runs first: authenticate before buffering a body.
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), body_deadline))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), crate::cluster::standby_gate))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), auth));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(api)
        .layer(middleware::from_fn_with_state(Arc::clone(&gw), host_check))
        .with_state(gw)
}

/// Refuses a request whose `Host` names another site (421 Misdirected Request). A request
/// without `Host` (HTTP/1.0 tools) passes: browsers always send one.
async fn host_check(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned());
    match host {
        Some(h) if !gw.work.host_allowed(&h, gw.listen()) => messages::error(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected",
            format!(
                "this gateway does not answer to Host {h:?}; add it to [http] allowed_hosts in config.toml if clients use that name"
            ),
        ),
        _ => next.run(req).await,
    }
}

/// Reads the whole request body within `[http] body_timeout_s` (408 past it) and within the
/// JSON extractor's limit (413 past it), so a slow sender cannot hold a connection and a
/// handler forever.
async fn body_deadline(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let timeout = gw.work.http.body_timeout();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(_)) => messages::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is larger than {MAX_BODY} bytes or was cut off"),
        ),
        Err(_) => {
            let mut r = messages::error(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!("the request body did not arrive within {timeout:?}"),
            );
            r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            r
        }
    }
}

/// axum's default body limit for extractors (2 MiB), enforced while buffering.
const MAX_BODY: usize = 2 * 1024 * 1024;

async fn auth(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let Some(token) = gw.work.api_token.as_deref() else { return next.run(req).await };
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).unwrap_or("");
    if crate::work::token_eq(given.as_bytes(), token.as_bytes()) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(serde_json::json!({"error": {"message": "missing or wrong bearer token", "type": "unauthorized"}})),
        )
            .into_response()
    }
}

/// The credentials of an `Authorization` value: the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer(v: &str) -> Option<&str> {
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    match gw.phase.get() {
        GatewayState::Running if !gw.is_active() => (StatusCode::SERVICE_UNAVAILABLE, "standby\n".to_string()),
        GatewayState::Running => (StatusCode::OK, "ready\n".to_string()),
        other => (StatusCode::SERVICE_UNAVAILABLE, format!("{other}\n")),
    }
}

async fn status(State(gw): State<Arc<Gateway>>) -> Json<gatewarden_control::StatusReport> {
    Json(gw.status())
}

/// Binds `addr`, retrying while it is in use for up to `patience`: during a restart the
/// predecessor may still hold the port for a moment. Never reports readiness without it.
pub fn bind(addr: &str, patience: Duration) -> Result<std::net::TcpListener, String> {
    let parsed: SocketAddr = addr.parse().map_err(|e| format!("invalid listen address {addr:?}: {e}"))?;
    let deadline = Instant::now() + patience;
    loop {
        match std::net::TcpListener::bind(parsed) {
            Ok(l) => {
                l.set_nonblocking(true).map_err(|e| format!("cannot configure {addr}: {e}"))?;
                return Ok(l);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                // A holder we can name is not going away for us: say who, at once. Only an
                // unnamed one (another user's, or an OS that does not tell) is waited out,
                // since it may be a predecessor releasing the port.
                let holders = gatewarden_lifecycle::platform::port_listeners(parsed.port());
                if !holders.is_empty() {
                    let who: Vec<String> = holders.iter().map(ToString::to_string).collect();
                    return Err(format!("cannot listen on {addr}: the port is taken by {}", who.join("; ")));
                }
                if Instant::now() >= deadline {
                    return Err(format!("cannot listen on {addr}: {e} (held by a process this user cannot inspect)"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("cannot listen on {addr}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(super::bearer("Bearer abc"), Some("abc"));
        assert_eq!(super::bearer("bearer abc"), Some("abc"));
        assert_eq!(super::bearer("BEARER  abc "), Some("abc"));
        assert_eq!(super::bearer("Basic abc"), None);
        assert_eq!(super::bearer("Bearerabc"), None);
    }
}
