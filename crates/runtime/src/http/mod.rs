//! The HTTP API. Health and readiness are open (they are probes); everything under `/v1` and
//! `/metrics` requires the bearer token when one is configured.

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
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), auth));
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).merge(api).with_state(gw)
}

async fn auth(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let Some(token) = gw.work.api_token.as_deref() else { return next.run(req).await };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
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

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    match gw.phase.get() {
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
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("cannot listen on {addr}: {e}")),
        }
    }
}
