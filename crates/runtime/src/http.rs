//! The HTTP API: health, readiness and status (messages and the OpenAI endpoint build on it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use gatewarden_lifecycle::records::GatewayState;

use crate::gateway::Gateway;

pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/status", get(status))
        .with_state(gw)
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
