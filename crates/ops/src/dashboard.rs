//! `gatewarden dashboard`: one page for every gateway home of this user on the machine (the
//! per-user registry each gateway joins at start, crates/dashboard/src/registry.rs), the
//! hermes homes it was given (`--hermes-home`), the homes named with `--home-dir`, and the
//! cluster members their status reports name. A home whose gateway is down still shows its
//! last state and why it ended (its `status` report, the same one `status --json` prints).
//!
//! Each home links to its own page (`http://<listen>/ui`, served by its gateway) and to a page
//! this server renders from the home's files (`/ui/home/<key>`), which also works while the
//! gateway is down and so carries Start. Actions run the CLI's own verbs (`actions::launch`)
//! with `channel: dashboard`; they need this server's token (`GATEWARDEN_DASHBOARD_TOKEN`, else
//! a random one printed at start), exchanged once for a session cookie, and every POST is
//! checked against `Host`, `Origin` and the session's CSRF token, as on a gateway's page.
//! Loopback only: the server refuses any other listen address.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use gatewarden_control::StatusReport;
use gatewarden_dashboard::actions::{self, Action};
use gatewarden_dashboard::auth::{self, CSRF_FIELD, Policy, Post, Refusal, Sessions};
use gatewarden_dashboard::snapshot::{Finding, Snapshot};
use gatewarden_dashboard::{HomeSummary, Viewer, gather, live, registry, render, sse};
use gatewarden_lifecycle::{Home, timefmt};
use gatewarden_runtime::http::ui::{html, refused};
use serde_json::Value;
use tokio::sync::mpsc;

/// `dashboard`'s options (crates/gatewarden/src/cli.rs documents them).
#[derive(Debug, Clone, Default)]
pub struct DashboardArgs {
    pub listen: String,
    pub homes: Vec<PathBuf>,
    pub hermes_homes: Vec<PathBuf>,
}

/// The actions token's environment variable (else a random token is printed at start).
pub const TOKEN_ENV: &str = "GATEWARDEN_DASHBOARD_TOKEN";
const TICK: Duration = Duration::from_secs(1);
const DOCTOR_EVERY: Duration = Duration::from_secs(30);
const MAX_STREAMS: usize = 16;

struct Fleet {
    policy: Policy,
    sessions: Mutex<Sessions>,
    homes: Vec<PathBuf>,
    hermes_homes: Vec<PathBuf>,
    registry: Option<PathBuf>,
    doctor: Mutex<HashMap<String, (Instant, Vec<Finding>)>>,
    streams: std::sync::atomic::AtomicUsize,
}

/// One row's source.
#[derive(Debug, Clone)]
enum Source {
    Gatewarden(Home),
    Hermes(PathBuf),
}

pub fn dashboard(args: DashboardArgs) -> crate::Result<ExitCode> {
    let addr: std::net::SocketAddr =
        args.listen.parse().map_err(|e| crate::Error::msg(format!("invalid listen address {:?}: {e}", args.listen)))?;
    if !addr.ip().is_loopback() {
        return Err(crate::Error::msg(format!(
            "the fleet dashboard listens on loopback only, not {addr}: reach it through an SSH tunnel"
        )));
    }
    let token = match std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty()) {
        Some(t) => t,
        None => auth::random_token().map_err(|e| crate::Error::msg(e.to_string()))?,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::Error::msg(format!("cannot start the runtime: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| crate::Error::msg(format!("cannot listen on {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| crate::Error::msg(e.to_string()))?;
        let fleet = Arc::new(Fleet {
            policy: Policy {
                api_token: Some(token.clone()),
                bound: Some(bound.to_string()),
                allowed_hosts: Vec::new(),
            },
            sessions: Mutex::new(Sessions::default()),
            homes: args.homes,
            hermes_homes: args.hermes_homes,
            registry: registry::dir().ok().flatten(),
            doctor: Mutex::new(HashMap::new()),
            streams: std::sync::atomic::AtomicUsize::new(0),
        });
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "dashboard: http://{bound}/ui/fleet");
            if std::env::var_os(TOKEN_ENV).is_none() {
                let _ = writeln!(out, "actions token (this run only): {token}");
            }
            let _ = out.flush();
        }
        let app = router(fleet);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| crate::Error::msg(format!("dashboard server: {e}")))
    })?;
    Ok(ExitCode::SUCCESS)
}

fn router(fleet: Arc<Fleet>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/", get(|| async { see("/ui/fleet", None) }))
        .route("/ui/fleet", get(fleet_page))
        .route("/ui/home/{key}", get(home_page))
        .route("/ui/home/{key}/events", get(home_events))
        .route("/ui/home/{key}/login", post(login))
        .route("/ui/home/{key}/logout", post(logout))
        .route("/ui/home/{key}/action/{verb}", post(action))
        .layer(axum::extract::DefaultBodyLimit::max(16 << 10))
        .layer(middleware::from_fn_with_state(Arc::clone(&fleet), host_check))
        .with_state(fleet)
}

/// The DNS-rebinding rule of the gateways' own pages.
async fn host_check(State(f): State<Arc<Fleet>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if auth::host_allowed(host, f.policy.bound.as_deref(), &f.policy.allowed_hosts) {
        next.run(req).await
    } else {
        refused("request", &Refusal::Host(host.to_owned()))
    }
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

fn now_us() -> i128 {
    timefmt::to_micros(SystemTime::now())
}

impl Fleet {
    /// Every home this page lists, each once: the registry's, then `--home-dir`, then hermes.
    fn sources(&self) -> (Vec<Source>, Vec<(String, String)>) {
        let mut out: Vec<Source> = Vec::new();
        let mut skipped = Vec::new();
        let mut seen = std::collections::HashSet::new();
        if let Some(dir) = &self.registry {
            match registry::list(dir) {
                Ok(l) => {
                    skipped = l.skipped;
                    for e in l.entries {
                        if seen.insert(e.home.clone()) {
                            out.push(Source::Gatewarden(Home::at(&e.home)));
                        }
                    }
                }
                Err(e) => skipped.push((dir.display().to_string(), e.to_string())),
            }
        }
        for h in &self.homes {
            let home = Home::at(h).canonicalized();
            if seen.insert(home.dir().to_string_lossy().into_owned()) {
                out.push(Source::Gatewarden(home));
            }
        }
        for h in &self.hermes_homes {
            if seen.insert(h.to_string_lossy().into_owned()) {
                out.push(Source::Hermes(h.clone()));
            }
        }
        (out, skipped)
    }

    /// A gatewarden home this page lists, by its key (never an arbitrary path from the URL).
    fn home(&self, key: &str) -> Option<Home> {
        self.sources().0.into_iter().find_map(|s| match s {
            Source::Gatewarden(h) if render::home_key(&h.dir().to_string_lossy()) == key => Some(h),
            _ => None,
        })
    }

    fn doctor(&self, key: &str, home: &Home) -> Vec<Finding> {
        let mut cache = self.doctor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, f)) = cache.get(key)
            && at.elapsed() < DOCTOR_EVERY
        {
            return f.clone();
        }
        let f = crate::doctor::findings(home);
        cache.insert(key.to_owned(), (Instant::now(), f.clone()));
        f
    }
}

/// The fleet's rows: a status report per home, the cluster members those reports name.
fn summaries(f: &Fleet) -> (Vec<HomeSummary>, Vec<(String, String)>) {
    let (sources, skipped) = f.sources();
    let mut rows = Vec::new();
    let mut members = Vec::new();
    for s in sources {
        match s {
            Source::Gatewarden(h) => {
                let (_, r) = crate::status::report(&h);
                if let Some(m) = cluster_member(&r) {
                    members.push(m);
                }
                rows.push(HomeSummary::from_status(&r));
            }
            Source::Hermes(dir) => {
                let s = gatewarden_hermes::status::status(&gatewarden_hermes::home::HermesHome::at(&dir));
                let phase = serde_json::to_value(s.phase).ok().and_then(|v| v.as_str().map(str::to_owned));
                rows.push(HomeSummary {
                    path: s.home.clone(),
                    state: s.gateway_state.clone().or(phase).unwrap_or_else(|| "unknown".into()),
                    pid: s.pid.filter(|_| s.running),
                    version: None,
                    listen: None,
                    last_exit_code: None,
                    last_exit_reason: if s.running { None } else { s.exit_reason.clone() },
                    kind: "hermes".into(),
                });
            }
        }
    }
    for m in members {
        if !rows.iter().any(|r| r.path == m.path) {
            rows.push(m);
        }
    }
    (rows, skipped)
}

/// The active member of a cluster a standby's report names, when it is another home.
fn cluster_member(r: &StatusReport) -> Option<HomeSummary> {
    let a = r.extra.get("cluster")?.get("active")?.as_object()?;
    let s = |k: &str| a.get(k).and_then(Value::as_str).map(str::to_owned);
    let (host, home) = (s("host")?, s("home")?);
    if home == r.home {
        return None;
    }
    Some(HomeSummary {
        path: format!("{host}:{home}"),
        state: "active".into(),
        pid: a.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()),
        version: None,
        listen: s("listen"),
        last_exit_code: None,
        last_exit_reason: None,
        kind: "cluster member".into(),
    })
}

async fn fleet_page(State(f): State<Arc<Fleet>>) -> Response {
    let (rows, skipped) = tokio::task::spawn_blocking(move || summaries(&f)).await.unwrap_or_default();
    html(StatusCode::OK, render::fleet(&rows, &skipped))
}

fn viewer(f: &Fleet, key: &str, headers: &HeaderMap) -> Viewer {
    let csrf = f
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .find(headers.get(header::COOKIE).and_then(|v| v.to_str().ok()), now_us())
        .map(|s| s.csrf.clone());
    Viewer {
        actions_configured: true,
        csrf,
        events_path: format!("/ui/home/{key}/events"),
        base: format!("/ui/home/{key}"),
    }
}

/// A home's page from its files and its status report (its gateway may be down).
fn snapshot(f: &Fleet, key: &str, home: &Home) -> Snapshot {
    let (_, report) = crate::status::report(home);
    let version = report.version.clone().unwrap_or_else(|| gatewarden_lifecycle::VERSION.to_owned());
    let mut s = gather::from_home(home, report, SystemTime::now());
    s.doctor = f.doctor(key, home);
    s.update = Some(gather::update_view(home, &version));
    s.outcome = actions::read(home);
    s
}

async fn home_page(State(f): State<Arc<Fleet>>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    let v = viewer(&f, &key, &headers);
    let page = tokio::task::spawn_blocking(move || {
        let home = f.home(&key)?;
        Some(render::page(&snapshot(&f, &key, &home), &v))
    })
    .await
    .ok()
    .flatten();
    match page {
        Some(p) => html(StatusCode::OK, p),
        None => html(StatusCode::NOT_FOUND, render::outcome("page", Err("no such home in this fleet"))),
    }
}

struct Slot(Arc<Fleet>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

async fn home_events(State(f): State<Arc<Fleet>>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    use std::sync::atomic::Ordering;
    if f.streams.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
        f.streams.fetch_sub(1, Ordering::AcqRel);
        return (StatusCode::SERVICE_UNAVAILABLE, "too many dashboard streams\n").into_response();
    }
    let slot = Slot(Arc::clone(&f));
    let v = viewer(&f, &key, &headers);
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let _slot = slot;
        let mut live = live::Live::for_viewer(v);
        let mut quiet = Instant::now();
        loop {
            let (f2, k2) = (Arc::clone(&f), key.clone());
            let snap = tokio::task::spawn_blocking(move || f2.home(&k2).map(|h| snapshot(&f2, &k2, &h))).await;
            let Ok(Some(snap)) = snap else { return };
            let mut out = live.update(&snap);
            if out.is_empty() && quiet.elapsed() >= Duration::from_secs(10) {
                out = sse::keepalive().to_owned();
            }
            if !out.is_empty() {
                quiet = Instant::now();
                if tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(TICK).await;
        }
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-store")],
        Body::from_stream(ReceiverStream(rx)),
    )
        .into_response()
}

/// An mpsc receiver as a `Stream` of body frames.
struct ReceiverStream(mpsc::Receiver<Bytes>);

impl futures_core::Stream for ReceiverStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

fn post_facts<'a>(headers: &'a HeaderMap, csrf: Option<&'a str>) -> Post<'a> {
    let h = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok());
    Post { host: h(header::HOST), origin: h(header::ORIGIN), cookie: h(header::COOKIE), csrf }
}

async fn login(State(f): State<Arc<Fleet>>, Path(key): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let given = auth::form_value(&form, "token").unwrap_or_default();
    let res = f
        .policy
        .check_origin(&post_facts(&headers, None))
        .and_then(|()| f.sessions.lock().unwrap_or_else(|p| p.into_inner()).login(&f.policy, &given, now_us()));
    match res {
        // The fleet's cookie covers every home's page.
        Ok(s) => see(&format!("/ui/home/{key}"), Some(auth::set_cookie(&s))),
        Err(e) => refused("login", &e),
    }
}

async fn logout(State(f): State<Arc<Fleet>>, Path(key): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let mut sessions = f.sessions.lock().unwrap_or_else(|p| p.into_inner());
    let id = match sessions.check_action(&f.policy, &post_facts(&headers, csrf.as_deref()), now_us()) {
        Ok(s) => s.id.clone(),
        Err(e) => return refused("logout", &e),
    };
    sessions.logout(&id);
    see(&format!("/ui/home/{key}"), Some(format!("{}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0", auth::COOKIE)))
}

async fn action(
    State(f): State<Arc<Fleet>>,
    Path((key, verb)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = String::from_utf8_lossy(&body).into_owned();
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let checked = f
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check_action(&f.policy, &post_facts(&headers, csrf.as_deref()), now_us())
        .map(|_| ());
    if let Err(e) = checked {
        return refused(&verb, &e);
    }
    let act = match Action::parse(&verb, |k| auth::form_value(&form, k)) {
        Ok(a) => a,
        Err(why) => return html(StatusCode::BAD_REQUEST, render::outcome(&verb, Err(&why))),
    };
    let back = format!("/ui/home/{key}");
    let done = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let home = f.home(&key).ok_or("no such home in this fleet")?;
        let source = gatewarden_config::Config::load(home.dir()).ok().and_then(|c| c.update.source.clone());
        let args = act.cli_args(source.as_deref())?.ok_or("retry and /new are on the gateway's own page")?;
        let (_, r) = crate::status::report(&home);
        let exe = gatewarden_lifecycle::platform::spawn::self_exe().map_err(|e| format!("no executable: {e}"))?;
        actions::launch(&home, &exe, act.verb(), &args, r.incarnation).map_err(|e| format!("cannot run it: {e}"))?;
        Ok(())
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match done {
        Ok(()) => see(&back, None),
        Err(why) => html(StatusCode::CONFLICT, render::outcome(&verb, Err(&why))),
    }
}

/// `gatewarden top`: the home's snapshot as text (crates/dashboard/src/text.rs), redrawn every
/// second until interrupted; `once` prints it once.
pub fn top(home: &Home, once: bool, log_lines: usize) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    loop {
        let (_, report) = crate::status::report(&home);
        let mut s = gather::from_home(&home, report, SystemTime::now());
        s.outcome = actions::read(&home);
        let text = gatewarden_dashboard::text::text(&s, log_lines);
        if once {
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        // Clear the screen and home the cursor, then the frame.
        print!("\u{1b}[2J\u{1b}[H{text}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::thread::sleep(TICK);
    }
}
