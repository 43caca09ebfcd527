//! The gateway's dashboard: its [`Site`] for the one web layer (crates/dashboard/src/web.rs,
//! which serves `/ui`, `/ui/events`, `/ui/login`, `/ui/logout`, `/ui/action/{verb}` with the
//! logins, sessions, throttle and checks it shares with the fleet page): what the page shows
//! ([`snapshot`]: the status report, the home's files, the journal, the drain, the log tail),
//! what an action does, and where a failed login is recorded (the ledger,
//! `dashboard_login_failed`).
//!
//! The router's `Host` check (mod.rs) runs first, as for every route. Lifecycle actions run the
//! CLI's own verb (`actions::launch`: `gatewarden restart` exits 0 only when a new incarnation
//! is ready), recorded in the ledger as `channel: dashboard`; a retry and a `/new` go through
//! the journal here. Reading needs a session when `api_token` is set; without one the page is
//! open on loopback and shows no message text unless `[http] ui_show_text` (docs/security.md).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use gatewarden_dashboard::actions::{self, Action};
use gatewarden_dashboard::auth::{Failed, Policy};
use gatewarden_dashboard::gather;
use gatewarden_dashboard::snapshot::{
    Conversation, DrainView, Finding, LogLine, MessageState, MessageView, QueueCounts, RunView, Snapshot,
};
use gatewarden_dashboard::web::{self, Page, ReadRule, Site, Web};
use gatewarden_journal::{Message, State as MsgState};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::timefmt;
use serde_json::json;

use crate::app::App;

/// Messages and chats listed at most.
const MESSAGES: usize = 50;
const CHATS: usize = 10;
const TURNS: usize = 3;
const TEXT_CHARS: usize = 160;

/// The dashboard's routes on this gateway's listener, with its rules: a session to read once
/// `api_token` is set (or off loopback), else open with message text only when the operator
/// opted in.
pub fn routes(gw: &Arc<App>) -> axum::Router<Arc<App>> {
    let policy = Policy {
        api_token: gw.work.api_token.clone(),
        bound: gw.listen().map(str::to_owned),
        allowed_hosts: gw.work.http.allowed_hosts.clone(),
    };
    let loopback =
        gw.listen().and_then(|l| l.parse::<std::net::SocketAddr>().ok()).is_some_and(|a| a.ip().is_loopback());
    let read = if policy.api_token.is_some() || !loopback {
        ReadRule::Session
    } else {
        ReadRule::Open { text: gw.work.http.ui_show_text }
    };
    web::gateway_routes(Web::new(Arc::clone(gw), policy, read, None))
}

impl Site for App {
    type Wake = tokio::sync::watch::Receiver<GatewayState>;

    async fn snapshot(self: Arc<Self>, page: Page) -> Option<Snapshot> {
        (page == Page::Gateway).then_some(())?;
        Some(snapshot(self).await)
    }

    async fn act(self: Arc<Self>, _page: Page, act: Action) -> Result<(), String> {
        carry_out(&self, &act).await
    }

    async fn login_failed(self: Arc<Self>, _page: Page, client: String, failed: Failed) {
        self.record(
            "dashboard_login_failed",
            json!({"client": client, "failures": failed.failures, "wait_s": failed.wait_s, "page": "/ui"}),
        );
    }

    fn wake(&self) -> Self::Wake {
        self.phase.subscribe()
    }

    async fn woken(wake: &mut Self::Wake) {
        if wake.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Past draining the server winds down: streams end so the browser reconnects to whoever
    /// serves next.
    fn streams_end(&self) -> bool {
        matches!(self.phase.get(), GatewayState::Stopping | GatewayState::Stopped)
    }
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
    s.update_source = gw.work.update_source();
    s.outcome = actions::read(&gw.home);
    s.doctor = doctor_findings(gw);
    s.access = gw.work.gate.report(now).iter().map(gatewarden_dashboard::snapshot::AccessView::from_json).collect();
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
        let backend = gw.work.live().agent.name().to_owned();
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

/// One checked action: a lifecycle verb through the CLI, a retry or `/new` through the journal.
async fn carry_out(gw: &Arc<App>, act: &Action) -> Result<(), String> {
    let me = Some(gw.me.id.clone());
    match act.cli_args(gw.work.update_source().as_deref())? {
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
                Action::Approve { platform, code } => {
                    let (g, p, c) = (Arc::clone(gw), platform.clone(), code.clone());
                    let user =
                        tokio::task::spawn_blocking(move || g.work.approve_pairing(&g.gw, &p, &c, &dashboard_by()))
                            .await
                            .map_err(|e| e.to_string())??;
                    format!("approved {user} on {platform}: their messages reach the agent now")
                }
                Action::Revoke { platform, user } => {
                    let (g, p, u) = (Arc::clone(gw), platform.clone(), user.clone());
                    tokio::task::spawn_blocking(move || g.work.revoke_pairing(&g.gw, &p, &u, &dashboard_by()))
                        .await
                        .map_err(|e| e.to_string())??;
                    format!("revoked {user} on {platform}: their messages no longer reach the agent")
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

/// A pairing decision made on this page (the ledger's `channel: dashboard`).
fn dashboard_by() -> crate::worker::DecidedBy {
    crate::worker::DecidedBy { channel: "dashboard".into(), who: format!("pid {}", std::process::id()) }
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
