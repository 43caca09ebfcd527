//! The dashboard on the gateway's own listener (crates/dashboard renders, this file serves):
//!
//! - `GET /ui`: the page, from one [`snapshot`] (the status report, the home's files, the
//!   journal, the drain, the log tail);
//! - `GET /ui/events`: the page's fragments over SSE, only those that changed, until the
//!   gateway leaves `draining` (then the stream ends and the browser reconnects to the next
//!   incarnation, which sends every fragment anew);
//! - `POST /ui/login` (the `api_token`, once, for an `HttpOnly; SameSite=Strict` session
//!   cookie), `POST /ui/logout`, `POST /ui/action/{verb}`.
//!
//! The router's `Host` check (mod.rs) runs first, as for every route. Every POST passes
//! `auth::Policy::check_origin` (Host and Origin), an action also the session and its CSRF
//! token. Lifecycle actions run the CLI's own verb (`actions::launch`: `gatewarden restart`
//! exits 0 only when a new incarnation is ready), recorded in the ledger as `channel:
//! dashboard`; a retry and a `/new` go through the journal here. Reading is open on a loopback
//! listener; elsewhere the page needs a session too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_dashboard::actions::{self, Action};
use gatewarden_dashboard::auth::{self, CSRF_FIELD, Policy, Post, Refusal};
use gatewarden_dashboard::snapshot::{
    Conversation, DrainView, Finding, LogLine, MessageState, MessageView, QueueCounts, RunView, Snapshot,
};
use gatewarden_dashboard::{Viewer, gather, live, render, sse};
use gatewarden_journal::{Message, State as MsgState};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::timefmt;
use serde_json::json;
use tokio::sync::mpsc;

use crate::app::App;

/// Event streams open at once; past it a new one is refused (each costs a snapshot a tick).
const MAX_STREAMS: usize = 16;
static STREAMS: AtomicUsize = AtomicUsize::new(0);
/// How often a stream looks for changes (the phase wakes it at once).
const TICK: Duration = Duration::from_secs(1);
/// A quiet stream sends a comment this often, so a closed client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);
/// How soon a browser reconnects a stream that ended (a restart's).
const RETRY_MS: u32 = 300;
/// Messages and chats listed at most.
const MESSAGES: usize = 50;
const CHATS: usize = 10;
const TURNS: usize = 3;
const TEXT_CHARS: usize = 160;

pub fn routes() -> axum::Router<Arc<App>> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/ui", get(page))
        .route("/ui/events", get(events))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/action/{verb}", post(action))
}

fn policy(gw: &App) -> Policy {
    Policy {
        api_token: gw.work.api_token.clone(),
        bound: gw.listen().map(str::to_owned),
        allowed_hosts: gw.work.http.allowed_hosts.clone(),
    }
}

fn now_us() -> i128 {
    timefmt::to_micros(SystemTime::now())
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Who is asking: their session's CSRF token when logged in.
fn viewer(gw: &App, headers: &HeaderMap) -> Viewer {
    let csrf = gw
        .ui_sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .find(header_str(headers, header::COOKIE), now_us())
        .map(|s| s.csrf.clone());
    Viewer {
        actions_configured: gw.work.api_token.is_some(),
        csrf,
        events_path: "/ui/events".into(),
        base: String::new(),
    }
}

/// Reading is open on a loopback listener; on any other, only to a logged-in session.
fn may_read(gw: &App, v: &Viewer) -> bool {
    let loopback =
        gw.listen().and_then(|l| l.parse::<std::net::SocketAddr>().ok()).is_some_and(|a| a.ip().is_loopback());
    loopback || v.csrf.is_some()
}

/// A dashboard page with its security headers (the fleet server's pages too, crates/ops
/// dashboard.rs).
pub fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    for (k, v) in render::security_headers() {
        r.headers_mut().insert(k, HeaderValue::from_static(v));
    }
    r
}

/// A refused request, as a page that says why: 421 for a foreign Host, 403 otherwise.
pub fn refused(what: &str, e: &Refusal) -> Response {
    let status = match e {
        Refusal::Host(_) => StatusCode::MISDIRECTED_REQUEST,
        Refusal::Random(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::FORBIDDEN,
    };
    html(status, render::outcome(what, Err(&e.to_string())))
}

fn see_ui(cookie: Option<String>) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(header::LOCATION, HeaderValue::from_static("/ui"));
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

async fn page(State(gw): State<Arc<App>>, headers: HeaderMap) -> Response {
    let v = viewer(&gw, &headers);
    if !may_read(&gw, &v) {
        let login = Viewer { actions_configured: true, csrf: None, events_path: String::new(), base: String::new() };
        return html(StatusCode::OK, render::page(&Snapshot::default(), &login));
    }
    let s = snapshot(Arc::clone(&gw)).await;
    html(StatusCode::OK, render::page(&s, &v))
}

/// Everything the page shows, gathered off the async threads (files and the journal).
pub async fn snapshot(gw: Arc<App>) -> Snapshot {
    tokio::task::spawn_blocking(move || snapshot_now(&gw)).await.unwrap_or_default()
}

fn snapshot_now(gw: &App) -> Snapshot {
    let now = SystemTime::now();
    let mut s = gather::from_home(&gw.home, gw.status(), now);
    let recent = crate::log::recent();
    if !recent.is_empty() {
        s.log_tail = recent.into_iter().map(|(level, text)| LogLine { level: level.into(), text }).collect();
    }
    if let Some((at_start, deadline)) = gw.drain_info() {
        s.drain = Some(DrainView {
            runs_at_start: at_start,
            remaining: gw.runs.active(),
            deadline_us: Some(timefmt::to_micros(deadline)),
        });
    }
    s.update = Some(gather::update_view(&gw.home, gatewarden_lifecycle::VERSION));
    s.update_source = gw.work.update_source().map(str::to_owned);
    s.outcome = actions::read(&gw.home);
    s.doctor = doctor_findings(gw);
    let j = &gw.work.journal;
    if let Ok(c) = j.counts() {
        let unfinished =
            j.recent(&[MsgState::Queued, MsgState::Running, MsgState::Failed], MESSAGES).unwrap_or_default();
        let given_up = unfinished.iter().filter(|m| given_up(m)).count() as u64;
        s.queue = Some(QueueCounts {
            queued: c.queued,
            running: c.running,
            failed: c.failed.saturating_sub(given_up),
            given_up,
        });
        let backend = gw.work.agent.name().to_owned();
        s.runs = unfinished
            .iter()
            .filter(|m| m.state == MsgState::Running)
            .map(|m| RunView {
                id: m.id.clone(),
                chat: chat_of(m),
                backend: backend.clone(),
                elapsed_s: timefmt::parse(&m.updated_at)
                    .and_then(|t| now.duration_since(t).ok())
                    .map_or(f64::NAN, |d| d.as_secs_f64()),
                streaming: false,
            })
            .collect();
        s.messages =
            unfinished.iter().map(|m| MessageView { trace: trace_of(j.as_ref(), &m.id), ..message_view(m) }).collect();
        s.conversations = conversations(&j.recent(&[MsgState::Done], 200).unwrap_or_default());
    }
    s
}

/// How often the doctor's findings are refreshed while a page is open, and how long one run
/// of it may take.
const DOCTOR_EVERY: Duration = Duration::from_secs(60);
const DOCTOR_TIMEOUT: Duration = Duration::from_secs(10);
static DOCTOR: std::sync::Mutex<Option<(std::time::Instant, Vec<Finding>)>> = std::sync::Mutex::new(None);
static DOCTOR_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The doctor's findings, from `gatewarden doctor --json` (the CLI's own checks, run beside the
/// gateway rather than inside it: they look at the service manager and the home from outside),
/// refreshed in the background at most every [`DOCTOR_EVERY`]; the last ones meanwhile.
fn doctor_findings(gw: &App) -> Vec<Finding> {
    let cached = DOCTOR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let stale = cached.as_ref().is_none_or(|(at, _)| at.elapsed() >= DOCTOR_EVERY);
    if stale && !DOCTOR_RUNNING.swap(true, Ordering::AcqRel) {
        let home = gw.home.dir().to_path_buf();
        std::thread::spawn(move || {
            let found = run_doctor(&home);
            *DOCTOR.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::time::Instant::now(), found));
            DOCTOR_RUNNING.store(false, Ordering::Release);
        });
    }
    cached.map(|(_, f)| f).unwrap_or_default()
}

fn run_doctor(home: &std::path::Path) -> Vec<Finding> {
    use std::io::Read;
    let fail = |why: String| vec![Finding { severity: "warn".into(), code: "doctor".into(), message: why }];
    let exe = match gatewarden_lifecycle::platform::spawn::self_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("cannot run the doctor: {e}")),
    };
    let mut child = match std::process::Command::new(exe)
        .arg("--home")
        .arg(home)
        .args(["doctor", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot run the doctor: {e}")),
    };
    let deadline = std::time::Instant::now() + DOCTOR_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return fail(format!("the doctor did not finish within {DOCTOR_TIMEOUT:?}"));
            }
        }
    }
    let mut out = Vec::new();
    if let Some(o) = child.stdout.as_mut() {
        let _ = o.take(1 << 20).read_to_end(&mut out);
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out) else {
        return fail("the doctor's answer was not JSON".into());
    };
    let s = |i: &serde_json::Value, k: &str| i.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    v.get("findings")
        .and_then(|f| f.as_array())
        .into_iter()
        .flatten()
        .map(|i| Finding {
            severity: s(i, "severity"),
            code: s(i, "id"),
            message: format!("{}: {}", s(i, "subject"), s(i, "message")),
        })
        .collect()
}

fn given_up(m: &Message) -> bool {
    m.state == MsgState::Failed && m.reason.as_deref() == Some(gatewarden_journal::REASON_INTERRUPTED_TWICE)
}

fn chat_of(m: &Message) -> String {
    match &m.platform {
        Some(p) => format!("{p}:{}", m.chat_id),
        None => m.chat_id.clone(),
    }
}

fn short(t: &str) -> String {
    let mut out: String = t.chars().take(TEXT_CHARS).collect();
    if t.chars().count() > TEXT_CHARS {
        out.push('…');
    }
    out
}

fn message_view(m: &Message) -> MessageView {
    let state = match m.state {
        MsgState::Queued => MessageState::Queued,
        MsgState::Running => MessageState::Running,
        _ if given_up(m) => MessageState::GivenUp,
        _ => MessageState::Failed,
    };
    MessageView {
        id: m.id.clone(),
        chat: chat_of(m),
        state,
        text: short(&m.text),
        reason: m.reason.as_deref().map(short),
        attempts: m.attempts,
        updated_at: m.updated_at.clone(),
        trace: Vec::new(),
    }
}

/// A listed message's trace from the journal (received, journaled, claimed, backend called,
/// providers tried, first token, done or failed, outbox sent; crates/journal/src/trace.rs), as
/// `gatewarden trace` reads it; the page renders it under the message. Unreadable: none.
fn trace_of(j: &dyn gatewarden_journal::Store, id: &str) -> Vec<gatewarden_dashboard::snapshot::TraceStep> {
    let events = j.trace(id).unwrap_or_default();
    events
        .into_iter()
        .map(|e| {
            let parts: Vec<String> =
                [e.subject, e.outcome, e.elapsed_ms.map(|ms| format!("{ms} ms"))].into_iter().flatten().collect();
            gatewarden_dashboard::snapshot::TraceStep {
                at: e.at,
                step: e.step.as_str().to_owned(),
                detail: (!parts.is_empty()).then(|| parts.join(", ")),
            }
        })
        .collect()
}

/// Platform chats (the ones with history and `/new`), most recent first, each with its last
/// turns oldest first. `done` is newest first.
fn conversations(done: &[Message]) -> Vec<Conversation> {
    let mut out: Vec<Conversation> = Vec::new();
    for m in done.iter().filter(|m| !m.is_command) {
        let Some(p) = &m.platform else { continue };
        let turn = (short(&m.text), m.reply.as_deref().map(short));
        let full = out.len() >= CHATS;
        match out.iter_mut().find(|c| c.platform.as_deref() == Some(p.as_str()) && c.chat == m.chat_id) {
            Some(c) if c.turns.len() < TURNS => c.turns.insert(0, turn),
            Some(_) => {}
            None if !full => out.push(Conversation {
                platform: Some(p.clone()),
                chat: m.chat_id.clone(),
                turns: vec![turn],
                last_at: m.updated_at.clone(),
            }),
            None => {}
        }
    }
    out
}

/// Ends a stream's count when its task ends, however it ends.
struct StreamSlot;

impl Drop for StreamSlot {
    fn drop(&mut self) {
        STREAMS.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn events(State(gw): State<Arc<App>>, headers: HeaderMap) -> Response {
    let v = viewer(&gw, &headers);
    if !may_read(&gw, &v) {
        return refused("events", &Refusal::NoSession);
    }
    if STREAMS.fetch_add(1, Ordering::AcqRel) >= MAX_STREAMS {
        STREAMS.fetch_sub(1, Ordering::AcqRel);
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, "too many dashboard streams\n").into_response();
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return r;
    }
    let slot = StreamSlot;
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let _slot = slot;
        let mut live = live::Live::for_viewer(v);
        let mut phase = gw.phase.subscribe();
        if tx.send(Bytes::from(sse::retry(RETRY_MS))).await.is_err() {
            return;
        }
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            let s = snapshot(Arc::clone(&gw)).await;
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
            // Past draining the server winds down: end the stream so the browser reconnects
            // to whoever serves next.
            if matches!(gw.phase.get(), GatewayState::Stopping | GatewayState::Stopped) {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                _ = phase.changed() => {}
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-store")],
        Body::from_stream(super::openai::ReceiverStream(rx)),
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

async fn login(State(gw): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let given = auth::form_value(&form, "token").unwrap_or_default();
    let p = policy(&gw);
    let res = p
        .check_origin(&post_facts(&headers, None))
        .and_then(|()| gw.ui_sessions.lock().unwrap_or_else(|e| e.into_inner()).login(&p, &given, now_us()));
    match res {
        Ok(s) => see_ui(Some(auth::set_cookie(&s))),
        Err(e) => refused("login", &e),
    }
}

async fn logout(State(gw): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let p = policy(&gw);
    let mut sessions = gw.ui_sessions.lock().unwrap_or_else(|e| e.into_inner());
    let id = match sessions.check_action(&p, &post_facts(&headers, csrf.as_deref()), now_us()) {
        Ok(s) => s.id.clone(),
        Err(e) => return refused("logout", &e),
    };
    sessions.logout(&id);
    see_ui(Some(format!("{}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0", auth::COOKIE)))
}

async fn action(State(gw): State<Arc<App>>, Path(verb): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body).into_owned();
    let csrf = auth::form_value(&form, CSRF_FIELD);
    let checked = gw
        .ui_sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .check_action(&policy(&gw), &post_facts(&headers, csrf.as_deref()), now_us())
        .map(|_| ());
    if let Err(e) = checked {
        return refused(&verb, &e);
    }
    let act = match Action::parse(&verb, |k| auth::form_value(&form, k)) {
        Ok(a) => a,
        Err(why) => return html(StatusCode::BAD_REQUEST, render::outcome(&verb, Err(&why))),
    };
    match carry_out(&gw, &act).await {
        Ok(()) => see_ui(None),
        Err(why) => html(StatusCode::CONFLICT, render::outcome(act.verb(), Err(&why))),
    }
}

/// One checked action: a lifecycle verb through the CLI, a retry or `/new` through the journal.
async fn carry_out(gw: &Arc<App>, act: &Action) -> Result<(), String> {
    let me = Some(gw.me.id.clone());
    match act.cli_args(gw.work.update_source())? {
        Some(args) => {
            let exe = gatewarden_lifecycle::platform::spawn::self_exe().map_err(|e| format!("no executable: {e}"))?;
            actions::launch(&gw.home, &exe, act.verb(), &args, me).map_err(|e| format!("cannot run it: {e}"))?;
            Ok(())
        }
        None => {
            let said = match act {
                Action::Retry { id } => retry(gw, id).await?,
                Action::NewConversation { platform, chat } => {
                    let (p, c) = (platform.clone(), chat.clone());
                    gw.work.with_journal(move |j| j.new_session(&p, &c)).await.map_err(|e| e.to_string())?;
                    format!("a new conversation starts in {platform}:{chat}")
                }
                _ => return Err("not an action of this page".into()),
            };
            gw.record(
                "dashboard_action",
                json!({"verb": act.verb(), "said": said, "requester": dashboard_requester()}),
            );
            actions::record_done(&gw.home, act.verb(), me, said).map_err(|e| e.to_string())
        }
    }
}

fn dashboard_requester() -> serde_json::Value {
    json!({"pid": std::process::id(), "argv": [], "channel": "dashboard"})
}

/// Queues a copy of a failed message: the same chat, user and text, through the same path a
/// new one takes (a platform's copy keeps its platform, so the reply goes to the chat).
async fn retry(gw: &Arc<App>, id: &str) -> Result<String, String> {
    let key = id.to_owned();
    let m = gw.work.with_journal(move |j| j.get(&key)).await.map_err(|e| e.to_string())?;
    let m = m.ok_or_else(|| format!("no message {id}"))?;
    if m.state != MsgState::Failed {
        return Err(format!("message {id} is {}, not failed", m.state.as_str()));
    }
    let new = gatewarden_journal::NewMessage {
        chat_id: m.chat_id.clone(),
        user_id: m.user_id.clone(),
        text: m.text.clone(),
        kind: gatewarden_journal::Kind::Async,
    };
    let new_id = match m.platform.clone() {
        Some(p) => {
            let event = format!("dashboard-retry:{id}:{}", timefmt::now());
            gw.work
                .with_journal(move |j| j.accept_inbound(&p, &event, &new))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "already retried".to_owned())?
        }
        None => gw.work.with_journal(move |j| j.accept(&new)).await.map_err(|e| e.to_string())?,
    };
    gw.work.enqueue(new_id.clone());
    Ok(format!("message {id} queued again as {new_id}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_journal::Kind;

    fn msg(id: &str, platform: Option<&str>, chat: &str, state: MsgState, reason: Option<&str>) -> Message {
        Message {
            id: id.into(),
            chat_id: chat.into(),
            user_id: "u".into(),
            text: format!("q{id}"),
            kind: Kind::Async,
            state,
            reply: (state == MsgState::Done).then(|| format!("a{id}")),
            reason: reason.map(str::to_owned),
            attempts: 1,
            incarnation: None,
            is_command: false,
            platform: platform.map(str::to_owned),
            created_at: String::new(),
            updated_at: format!("t{id}"),
        }
    }

    #[test]
    fn conversations_are_platform_chats_newest_first_with_their_last_turns_in_order() {
        // Newest first, as `Store::recent` returns them.
        let done: Vec<Message> = vec![
            msg("5", Some("tg"), "1", MsgState::Done, None),
            msg("4", Some("tg"), "2", MsgState::Done, None),
            msg("3", Some("tg"), "1", MsgState::Done, None),
            msg("2", None, "http-chat", MsgState::Done, None),
            msg("1", Some("tg"), "1", MsgState::Done, None),
            msg("0", Some("tg"), "1", MsgState::Done, None),
        ];
        let c = conversations(&done);
        let chats: Vec<&str> = c.iter().map(|c| c.chat.as_str()).collect();
        assert_eq!(chats, ["1", "2"], "platform chats only, the most recent first");
        let turns: Vec<&str> = c[0].turns.iter().map(|(q, _)| q.as_str()).collect();
        assert_eq!(turns, ["q1", "q3", "q5"], "the last {TURNS}, oldest first");
        assert_eq!(c[0].turns[2].1.as_deref(), Some("a5"));
        assert_eq!(c[0].last_at, "t5");
    }

    #[test]
    fn a_message_interrupted_twice_is_given_up_not_failed() {
        let gave_up = msg("1", None, "c", MsgState::Failed, Some(gatewarden_journal::REASON_INTERRUPTED_TWICE));
        assert_eq!(message_view(&gave_up).state, MessageState::GivenUp);
        let failed = msg("2", Some("tg"), "c", MsgState::Failed, Some("agent failed"));
        let v = message_view(&failed);
        assert_eq!((v.state, v.chat.as_str()), (MessageState::Failed, "tg:c"));
        let long = Message { text: "x".repeat(1000), ..failed };
        assert_eq!(message_view(&long).text.chars().count(), TEXT_CHARS + 1, "shortened, with an ellipsis");
    }
}
