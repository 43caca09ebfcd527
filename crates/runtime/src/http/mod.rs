//! The HTTP API. Health and readiness are open (they are probes); everything under `/v1` and
//! `/metrics` requires the bearer token when one is configured. Every request's `Host` header
//! must name this gateway (loopback names, the bound address, `[http] allowed_hosts`), so a web
//! page cannot reach a loopback API by rebinding its own DNS name (docs/security.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use gatewarden_lifecycle::records::GatewayState;

use crate::app::App;
use crate::worker::Work;

mod hooks;
mod messages;
pub(crate) mod metrics;
mod openai;
pub mod resources;
mod responses;
pub mod serve;
pub mod ui;

/// The request-body types and their pure helpers, for the fuzz targets (fuzz/fuzz_targets);
/// not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::messages::MessageIn;
    pub use super::openai::{ChatMessage, CompletionIn, text_of};
    pub use super::responses::{MAX_INPUT_ITEMS, parse as parse_response};
}

pub fn router(gw: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/messages", post(messages::post))
        .route("/v1/messages/{id}", get(messages::get_one))
        .route("/v1/notices", get(messages::notices))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get_one))
        .route("/v1/chat/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/metrics", get(metrics::metrics))
        // The last layer runs first: authenticate before buffering a body.
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), body_deadline))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), crate::cluster::standby_gate))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), auth));
    // The dashboard: the web layer's logins, sessions and rules (ui.rs).
    let ui = ui::routes(&gw).route_layer(middleware::from_fn_with_state(Arc::clone(&gw), body_deadline));
    // Pushed by a platform (WhatsApp's webhook): signed, checked by the adapter, not by the
    // bearer token.
    let hooks = Router::new()
        .route("/hooks/{kind}/{name}", get(hooks::hook).post(hooks::hook))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&gw), body_deadline));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(api)
        .merge(hooks)
        .merge(ui)
        .layer(middleware::from_fn_with_state(Arc::clone(&gw), host_check))
        .with_state(gw)
}

/// Refuses a request whose `Host` names another site (421 Misdirected Request). A request
/// without `Host` (HTTP/1.0 tools) passes: browsers always send one.
async fn host_check(State(gw): State<Arc<App>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned());
    match host {
        Some(h) if !host_allowed(&gw.work, &h, gw.listen()) => messages::error(
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
/// handler forever; and within the [`BODY_BUDGET`] shared by every connection (503 at once
/// past it), so many unfinished bodies cannot take the gateway's memory. The share is held
/// until the handler is done with the bytes.
async fn body_deadline(State(gw): State<Arc<App>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return close(too_large());
    }
    let timeout = gw.work.http.body_timeout();
    let mut share = BodyShare::new(&BODY_BUDGET);
    match tokio::time::timeout(timeout, read_body(body, &mut share)).await {
        Ok(Ok(bytes)) => {
            let r = next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await;
            drop(share);
            r
        }
        Ok(Err(BodyRefused::TooLarge)) => too_large(),
        Ok(Err(BodyRefused::Busy)) => {
            let mut r = messages::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many request bodies are arriving at once; retry shortly",
            );
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            close(r)
        }
        Err(_) => close(messages::error(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("the request body did not arrive within {timeout:?}"),
        )),
    }
}

fn too_large() -> Response {
    messages::error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the request body is larger than {MAX_BODY} bytes or was cut off"),
    )
}

/// The connection ends after this response (the rest of the body is never read).
fn close(mut r: Response) -> Response {
    r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    r
}

/// axum's default body limit for extractors (2 MiB), enforced while buffering.
const MAX_BODY: usize = 2 * 1024 * 1024;

/// Request-body bytes held in memory across every connection at once: 24 full bodies. 500
/// connections each holding an unfinished 2 MiB body would otherwise hold 1 GB. With each
/// connection's read buffer (at most 16 KiB, serve.rs) the bodies in flight stay within the
/// documented 64 MiB (docs/security.md; measured +52 MiB under that flood).
const BODY_BUDGET_BYTES: usize = 48 * 1024 * 1024;
static BODY_BUDGET: BodyBudget = BodyBudget::new(BODY_BUDGET_BYTES);

/// A byte budget shared by every connection's body buffer.
struct BodyBudget {
    used: AtomicUsize,
    cap: usize,
}

impl BodyBudget {
    const fn new(cap: usize) -> BodyBudget {
        BodyBudget { used: AtomicUsize::new(0), cap }
    }
}

/// One request's share of a [`BodyBudget`], given back when dropped.
struct BodyShare<'b> {
    budget: &'b BodyBudget,
    held: usize,
}

impl<'b> BodyShare<'b> {
    fn new(budget: &'b BodyBudget) -> BodyShare<'b> {
        BodyShare { budget, held: 0 }
    }

    /// Takes `n` more bytes of the budget; false (and nothing taken) when it has not that many.
    fn grow(&mut self, n: usize) -> bool {
        let cap = self.budget.cap;
        let taken = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(n).filter(|t| *t <= cap))
            .is_ok();
        if taken {
            self.held += n;
        }
        taken
    }
}

impl Drop for BodyShare<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

enum BodyRefused {
    /// Over [`MAX_BODY`], or cut off.
    TooLarge,
    /// The shared budget is spent.
    Busy,
}

/// Buffers `body` frame by frame, each byte of buffer capacity taken from `share` first.
async fn read_body(mut body: axum::body::Body, share: &mut BodyShare<'_>) -> Result<axum::body::Bytes, BodyRefused> {
    use http_body::Body as _;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await;
        let data = match frame {
            None => return Ok(buf.into()),
            Some(Err(_)) => return Err(BodyRefused::TooLarge),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue, // trailers
            },
        };
        let need = buf.len() + data.len();
        if need > MAX_BODY {
            return Err(BodyRefused::TooLarge);
        }
        if need > buf.capacity() {
            let want = need.max(buf.capacity() * 2).min(MAX_BODY);
            if !share.grow(want - buf.capacity()) {
                return Err(BodyRefused::Busy);
            }
            buf.reserve_exact(want - buf.len());
        }
        buf.extend_from_slice(&data);
    }
}

async fn auth(State(gw): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(token) = gw.work.api_token.as_deref() else { return next.run(req).await };
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).unwrap_or("");
    if gatewarden_dashboard::auth::ct_eq(given.as_bytes(), token.as_bytes()) {
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

async fn readyz(State(gw): State<Arc<App>>) -> impl IntoResponse {
    match gw.phase.get() {
        GatewayState::Running if !gw.is_active() => (StatusCode::SERVICE_UNAVAILABLE, "standby\n".to_string()),
        GatewayState::Running => (StatusCode::OK, "ready\n".to_string()),
        other => (StatusCode::SERVICE_UNAVAILABLE, format!("{other}\n")),
    }
}

async fn status(State(gw): State<Arc<App>>) -> Json<gatewarden_control::StatusReport> {
    Json(gw.status_with_journal().await)
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

/// Whether a request's `Host` header names this gateway: a loopback name, the bound address,
/// or one of `[http] allowed_hosts` (a configured name without a port matches every port).
fn host_allowed(work: &Work, host: &str, bound: Option<&str>) -> bool {
    if !work.host_check {
        return true;
    }
    gatewarden_dashboard::auth::host_allowed(host, bound, &work.http.allowed_hosts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn body_shares_never_exceed_the_budget_and_are_given_back() {
        let budget = super::BodyBudget::new(100);
        let mut a = super::BodyShare::new(&budget);
        let mut b = super::BodyShare::new(&budget);
        assert!(a.grow(60));
        assert!(!b.grow(41), "over the budget");
        assert!(b.grow(40));
        assert!(!a.grow(1));
        drop(a);
        assert!(b.grow(60), "a's share is back");
        drop(b);
        assert_eq!(budget.used.load(super::Ordering::Acquire), 0);
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(super::bearer("Bearer abc"), Some("abc"));
        assert_eq!(super::bearer("bearer abc"), Some("abc"));
        assert_eq!(super::bearer("BEARER  abc "), Some("abc"));
        assert_eq!(super::bearer("Basic abc"), None);
        assert_eq!(super::bearer("Bearerabc"), None);
    }
}
