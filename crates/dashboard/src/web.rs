//! The dashboard's one web layer, mounted by both servers of its pages: a gateway's own
//! (`/ui`, crates/runtime/src/http/ui.rs) and the fleet's (`gatewarden dashboard`,
//! crates/ops/src/dashboard.rs). Login, logout, sessions, the login throttle, who may read,
//! the event streams and the checks before an action live here once; each server supplies a
//! [`Site`]: its snapshots, what its actions do, and where a failed login is recorded.
//!
//! - Reading ([`ReadRule`]): with a token, every page and stream needs a session (a token
//!   holder's); a gateway without `api_token` is open on loopback and shows no message text
//!   unless its operator opted in (`Snapshot::hide_text`).
//! - Logging in: the `Host`/`Origin` checks, then the client's wait ([`Throttle`]: a few free
//!   tries, then up to a minute each), then the token; each failure goes to the ledger through
//!   [`Site::login_failed`].
//! - Acting: `Host`/`Origin`, a live session and its CSRF token, then [`Site::act`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequestParts, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use gatewarden_lifecycle::timefmt;
use tokio::sync::mpsc;

use crate::actions::Action;
use crate::auth::{self, CSRF_FIELD, Failed, Policy, Post, Refusal, Sessions, Throttle};
use crate::render::{self, Viewer};
use crate::snapshot::{HomeSummary, Snapshot};
use crate::{live, sse};

/// Event streams open at once on one server; past it a new one is refused (each costs a
/// snapshot a tick).
pub const MAX_STREAMS: usize = 16;
/// How often a stream looks for changes ([`Site::changed`] wakes it sooner).
const TICK: Duration = Duration::from_secs(1);
/// A quiet stream sends a comment this often, so a closed client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);
/// How soon a browser reconnects a stream that ended (a restart's).
const RETRY_MS: u32 = 300;
/// The largest login, logout or action form read.
pub const MAX_FORM_BYTES: usize = 16 << 10;

/// One page of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// A gateway's own page (`/ui`).
    Gateway,
    /// The fleet's list of homes (`/ui/fleet`).
    Fleet,
    /// One home of the fleet, rendered from its files (`/ui/home/<key>`).
    Home(String),
}

impl Page {
    /// Where the page is, and under it its forms (`/login`, `/logout`, `/action/<verb>`) and
    /// stream (`/events`).
    pub fn base(&self) -> String {
        match self {
            Page::Gateway => "/ui".into(),
            Page::Fleet => "/ui/fleet".into(),
            Page::Home(key) => format!("/ui/home/{key}"),
        }
    }
}

/// Who may read a server's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRule {
    /// A logged-in session only (a token is configured).
    Session,
    /// Anyone the listener lets in (a loopback gateway without `api_token`); message text only
    /// when `text` (the operator's `[http] ui_show_text`).
    Open { text: bool },
}

/// The fleet page's rows, and the registry entries skipped with why.
pub type FleetRows = (Vec<HomeSummary>, Vec<(String, String)>);

/// What a server adds to the layer.
pub trait Site: Send + Sync + 'static {
    /// The page as of now; `None`: no such page (404).
    fn snapshot(self: Arc<Self>, page: Page) -> impl Future<Output = Option<Snapshot>> + Send;

    /// The fleet's rows and the registry entries skipped (only the fleet has that page).
    fn fleet(self: Arc<Self>) -> impl Future<Output = Option<FleetRows>> + Send {
        async { None }
    }

    /// Carries out an action the layer has checked (origin, session, CSRF); `Err`: why not.
    fn act(self: Arc<Self>, page: Page, act: Action) -> impl Future<Output = Result<(), String>> + Send;

    /// Records a failed login (the ledger's `dashboard_login_failed`).
    fn login_failed(self: Arc<Self>, page: Page, client: String, failed: Failed) -> impl Future<Output = ()> + Send;

    /// One stream's watch on what should make it look again at once (a gateway's phase),
    /// taken when the stream opens.
    type Wake: Send + 'static;
    fn wake(&self) -> Self::Wake;
    /// Resolves when that happened (a stream also looks every second).
    fn woken(wake: &mut Self::Wake) -> impl Future<Output = ()> + Send;

    /// Whether streams end now (a gateway past draining: the browser reconnects to whoever
    /// serves next).
    fn streams_end(&self) -> bool {
        false
    }
}

/// One server's dashboard: its site, its rules and its sessions.
pub struct Web<S> {
    site: Arc<S>,
    policy: Policy,
    read: ReadRule,
    /// Said on the fleet page (whose homes these are).
    note: Option<String>,
    sessions: Mutex<Sessions>,
    throttle: Mutex<Throttle>,
    streams: AtomicUsize,
}

impl<S: Site> Web<S> {
    /// `policy.api_token`: the token a login must give (`None`: no logins, no actions).
    pub fn new(site: Arc<S>, policy: Policy, read: ReadRule, note: Option<String>) -> Arc<Web<S>> {
        let sessions = Mutex::new(Sessions::new(policy.api_token.as_deref()));
        Arc::new(Web {
            site,
            policy,
            read,
            note,
            sessions,
            throttle: Mutex::new(Throttle::default()),
            streams: AtomicUsize::new(0),
        })
    }

    pub fn site(&self) -> &Arc<S> {
        &self.site
    }

    fn viewer(&self, page: &Page, headers: &HeaderMap) -> Viewer {
        let csrf = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .find(header_str(headers, header::COOKIE), now_us())
            .map(|s| s.csrf.clone());
        Viewer {
            actions_configured: self.policy.api_token.is_some(),
            csrf,
            events_path: format!("{}/events", page.base()),
            base: page.base(),
        }
    }

    /// `Err`: this viewer may not read; `Ok(hide)`: may, with message text left out when `hide`.
    fn may_read(&self, v: &Viewer) -> Result<bool, Refusal> {
        match self.read {
            ReadRule::Session if v.csrf.is_none() => Err(Refusal::NoSession),
            ReadRule::Session => Ok(false),
            ReadRule::Open { text } => Ok(!text && v.csrf.is_none()),
        }
    }
}

/// The routes of a gateway's own page: `/ui`, `/ui/events`, `/ui/login`, `/ui/logout`,
/// `/ui/action/{verb}`. The gateway's router puts its `Host` check and body deadline around them.
pub fn gateway_routes<S: Site, T: Clone + Send + Sync + 'static>(web: Arc<Web<S>>) -> Router<T> {
    use axum::routing::{get, post};
    Router::new()
        .route("/ui", get(|State(w): State<Arc<Web<S>>>, h: HeaderMap| page(w, Page::Gateway, h)))
        .route("/ui/events", get(|State(w): State<Arc<Web<S>>>, h: HeaderMap| events(w, Page::Gateway, h)))
        .route(
            "/ui/login",
            post(|State(w): State<Arc<Web<S>>>, c: Client, h: HeaderMap, b: Bytes| login(w, Page::Gateway, c, h, b)),
        )
        .route(
            "/ui/logout",
            post(|State(w): State<Arc<Web<S>>>, h: HeaderMap, b: Bytes| logout(w, Page::Gateway, h, b)),
        )
        .route(
            "/ui/action/{verb}",
            post(|State(w): State<Arc<Web<S>>>, Path(verb): Path<String>, h: HeaderMap, b: Bytes| {
                action(w, Page::Gateway, verb, h, b)
            }),
        )
        .with_state(web)
}

/// The fleet server's routes: `/` (to `/ui/fleet`), `/ui/fleet` and each home's
/// `/ui/home/{key}`, each with its `events`, `login`, `logout` and `action/{verb}`; behind the
/// `Host` check and a small body limit. Serve it with connect info (the throttle's client).
pub fn fleet_routes<S: Site>(web: Arc<Web<S>>) -> Router {
    use axum::routing::{get, post};
    type W<S> = State<Arc<Web<S>>>;
    Router::new()
        .route("/", get(|| async { see("/ui/fleet", None) }))
        .route("/ui/fleet", get(|State(w): W<S>, h: HeaderMap| page(w, Page::Fleet, h)))
        .route(
            "/ui/fleet/login",
            post(|State(w): W<S>, c: Client, h: HeaderMap, b: Bytes| login(w, Page::Fleet, c, h, b)),
        )
        .route("/ui/fleet/logout", post(|State(w): W<S>, h: HeaderMap, b: Bytes| logout(w, Page::Fleet, h, b)))
        .route("/ui/home/{key}", get(|State(w): W<S>, Path(k): Path<String>, h: HeaderMap| page(w, Page::Home(k), h)))
        .route(
            "/ui/home/{key}/events",
            get(|State(w): W<S>, Path(k): Path<String>, h: HeaderMap| events(w, Page::Home(k), h)),
        )
        .route(
            "/ui/home/{key}/login",
            post(|State(w): W<S>, Path(k): Path<String>, c: Client, h: HeaderMap, b: Bytes| {
                login(w, Page::Home(k), c, h, b)
            }),
        )
        .route(
            "/ui/home/{key}/logout",
            post(|State(w): W<S>, Path(k): Path<String>, h: HeaderMap, b: Bytes| logout(w, Page::Home(k), h, b)),
        )
        .route(
            "/ui/home/{key}/action/{verb}",
            post(|State(w): W<S>, Path((k, verb)): Path<(String, String)>, h: HeaderMap, b: Bytes| {
                action(w, Page::Home(k), verb, h, b)
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn_with_state(Arc::clone(&web), host_check::<S>))
        .with_state(web)
}

/// The DNS-rebinding rule of the gateway's API, for the fleet server (a gateway's router has
/// its own for every route).
async fn host_check<S: Site>(State(w): State<Arc<Web<S>>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if auth::host_allowed(host, w.policy.bound.as_deref(), &w.policy.allowed_hosts) {
        next.run(req).await
    } else {
        refused("request", &Refusal::Host(host.to_owned()))
    }
}

/// The client a login comes from (its address, the throttle's key): from the connection's
/// `ConnectInfo`, which both servers attach.
pub struct Client(pub String);

impl<T: Send + Sync> FromRequestParts<T> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &T) -> Result<Self, Self::Rejection> {
        let ip = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string());
        Ok(Client(ip.unwrap_or_else(|| "unknown".into())))
    }
}

async fn page<S: Site>(w: Arc<Web<S>>, page: Page, headers: HeaderMap) -> Response {
    let v = w.viewer(&page, &headers);
    let hide = match w.may_read(&v) {
        Ok(hide) => hide,
        Err(_) => return html(StatusCode::OK, render::login(&page.base(), &login_why(&w))),
    };
    if page == Page::Fleet {
        return match Arc::clone(&w.site).fleet().await {
            Some((rows, skipped)) => html(StatusCode::OK, render::fleet(&rows, &skipped, w.note.as_deref())),
            None => not_found(),
        };
    }
    match Arc::clone(&w.site).snapshot(page).await {
        Some(mut s) => {
            if hide {
                s.hide_text();
            }
            html(StatusCode::OK, render::page(&s, &v))
        }
        None => not_found(),
    }
}

fn login_why<S>(w: &Web<S>) -> String {
    match &w.note {
        Some(n) => format!("This page needs a session: log in with the dashboard's token. {n}"),
        None => "This page needs a session: log in with the token.".into(),
    }
}

fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, render::outcome("page", Err("no such page")))
}

/// Ends a stream's count when its task ends, however it ends.
struct Slot<S: Site>(Arc<Web<S>>);

impl<S: Site> Drop for Slot<S> {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn events<S: Site>(w: Arc<Web<S>>, page: Page, headers: HeaderMap) -> Response {
    let v = w.viewer(&page, &headers);
    let hide = match w.may_read(&v) {
        Ok(hide) => hide,
        Err(e) => return refused("events", &e),
    };
    if w.streams.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
        w.streams.fetch_sub(1, Ordering::AcqRel);
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, "too many dashboard streams\n").into_response();
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return r;
    }
    let slot = Slot(Arc::clone(&w));
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let mut wake = w.site.wake();
    tokio::spawn(async move {
        let _slot = slot;
        let mut live = live::Live::for_viewer(v);
        if tx.send(Bytes::from(sse::retry(RETRY_MS))).await.is_err() {
            return;
        }
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            let Some(mut s) = Arc::clone(&w.site).snapshot(page.clone()).await else { return };
            if hide {
                s.hide_text();
            }
            let mut out = live.update(&s);
            if out.is_empty() && quiet_since.elapsed() >= KEEPALIVE {
                out = sse::keepalive().to_owned();
            }
            if !out.is_empty() {
                quiet_since = tokio::time::Instant::now();
                if tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
            }
            if w.site.streams_end() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = S::woken(&mut wake) => {}
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-store")],
        Body::from_stream(ReceiverStream(rx)),
    )
        .into_response()
}

fn post_facts<'a>(headers: &'a HeaderMap, csrf: Option<&'a str>) -> Post<'a> {
    Post {
        host: header_str(headers, header::HOST),
        origin: header_str(headers, header::ORIGIN),
        cookie: header_str(headers, header::COOKIE),
        csrf,
    }
}

async fn login<S: Site>(
    w: Arc<Web<S>>,
    page: Page,
    Client(client): Client,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = String::from_utf8_lossy(&body);
    let given = auth::form_value(&form, "token").unwrap_or_default();
    if let Err(e) = w.policy.check_origin(&post_facts(&headers, None)) {
        return refused("login", &e);
    }
    let now = now_us();
    if let Err(wait) = w.throttle.lock().unwrap_or_else(|p| p.into_inner()).check(&client, now) {
        return refused("login", &Refusal::Throttled(wait));
    }
    let res = w.sessions.lock().unwrap_or_else(|p| p.into_inner()).login(&w.policy, &given, now);
    match res {
        Ok(s) => {
            w.throttle.lock().unwrap_or_else(|p| p.into_inner()).succeeded(&client);
            see(&page.base(), Some(auth::set_cookie(&s)))
        }
        Err(Refusal::WrongToken) => {
            let failed = w.throttle.lock().unwrap_or_else(|p| p.into_inner()).failed(&client, now);
            Arc::clone(&w.site).login_failed(page, client, failed).await;
            refused("login", &Refusal::WrongToken)
        }
        Err(e) => refused("login", &e),
    }
}

async fn logout<S: Site>(w: Arc<Web<S>>, page: Page, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let mut sessions = w.sessions.lock().unwrap_or_else(|p| p.into_inner());
    let now = now_us();
    match sessions.check_action(&w.policy, &post_facts(&headers, csrf.as_deref()), now) {
        Ok(s) => sessions.logout(&s, now),
        Err(e) => return refused("logout", &e),
    }
    see(&page.base(), Some(format!("{}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0", auth::COOKIE)))
}

async fn action<S: Site>(w: Arc<Web<S>>, page: Page, verb: String, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body).into_owned();
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let checked = w
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check_action(&w.policy, &post_facts(&headers, csrf.as_deref()), now_us())
        .map(|_| ());
    if let Err(e) = checked {
        return refused(&verb, &e);
    }
    let act = match Action::parse(&verb, |k| auth::form_value(&form, k)) {
        Ok(a) => a,
        Err(why) => return html(StatusCode::BAD_REQUEST, render::outcome(&verb, Err(&why))),
    };
    let back = page.base();
    let name = act.verb().to_owned();
    match Arc::clone(&w.site).act(page, act).await {
        Ok(()) => see(&back, None),
        Err(why) => html(StatusCode::CONFLICT, render::outcome(&name, Err(&why))),
    }
}

/// A dashboard page with its security headers.
pub fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    for (k, v) in render::security_headers() {
        r.headers_mut().insert(k, HeaderValue::from_static(v));
    }
    r
}

/// A refused request, as a page that says why: 421 for a foreign Host, 429 (with
/// `Retry-After`) for a client that must wait, 403 otherwise.
pub fn refused(what: &str, e: &Refusal) -> Response {
    let status = match e {
        Refusal::Host(_) => StatusCode::MISDIRECTED_REQUEST,
        Refusal::Random(_) => StatusCode::INTERNAL_SERVER_ERROR,
        Refusal::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::FORBIDDEN,
    };
    let mut r = html(status, render::outcome(what, Err(&e.to_string())));
    if let Refusal::Throttled(wait) = e
        && let Ok(v) = HeaderValue::from_str(&wait.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn see(to: &str, cookie: Option<String>) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn now_us() -> i128 {
    timefmt::to_micros(SystemTime::now())
}

/// An mpsc receiver as a `Stream` of body frames (an event stream's, a streamed reply's).
pub struct ReceiverStream(pub mpsc::Receiver<Bytes>);

impl futures_core::Stream for ReceiverStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}
