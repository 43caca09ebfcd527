//! Messages in, agent runs out: the engine behind `/v1/messages`, the OpenAI endpoint and the
//! chat platforms' [`Intake`].
//!
//! - Sync messages run at once (never journaled: the caller holds the connection and gets
//!   the reply or an error) and count as active runs, so the drain waits for them.
//! - Async messages are journaled durably before the 202, run by a bounded worker pool,
//!   and finish as done or failed. A run cut short by a stop, restart or crash is left
//!   `running` in the journal so the next incarnation re-runs it once.
//! - Messages from chat platforms (platforms.rs) are async messages keyed by their platform
//!   event id; their replies leave through the journal's outbox, and the platform host is
//!   woken through the [`Wake`] channel.
//! - Chat commands (`/status`, `/restart`, `/stop`, `/update`, `/help`, `/new`) are decided in
//!   commands.rs and carried out here ([`Work::command`]): answered immediately, never counted
//!   as runs (the drain never waits on its own requester) and journaled as finished commands,
//!   never replayed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatewarden_agent::backend::trace::{Note, RunNotes};
use gatewarden_agent::{Agent, AgentError, AgentRequest, Turn};
use gatewarden_control::Requester;
use gatewarden_journal::{JournalError, Kind, NewMessage, RunSteps, Step, Store, TraceEvent};
use gatewarden_lifecycle::platform::spawn;
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_platforms::Inbound;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::cause::{Cause, ControlKind};
use crate::commands::{self, Admins, Channel, Command, CommandOutcome, Sender};
use crate::gateway::Gateway;
use crate::intake::{Intake, Wake};
use crate::notices::{self, Notices};
use gatewarden_platforms::Activity;

/// Async runs in flight at once.
const ASYNC_CONCURRENCY: usize = 64;
/// How often the journal's retention bounds are applied (and once at start).
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How long a client should wait before retrying during a drain.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub timeout: AtomicU64,
    pub unavailable: AtomicU64,
    pub accepted_async: AtomicU64,
    /// From the ledger at boot: restarts and drains of earlier incarnations.
    pub restarts_before: AtomicU64,
    pub drains_before: AtomicU64,
    pub drain_ms_before: AtomicU64,
    /// The last run that failed (not cancelled) and why, for `status`: an upstream that cannot
    /// be reached (a certificate that does not verify, crates/net) shows there by name.
    pub last_failure: Mutex<Option<(std::time::SystemTime, String)>>,
    /// Tokens the upstream reported (openai), this incarnation.
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// The same per `(platform, chat)` (`None`: the HTTP API), with the runs that reported
    /// them; at most [`MAX_USAGE_CHATS`] chats, the rest counted together.
    pub chat_usage: Mutex<std::collections::BTreeMap<(Option<String>, String), ChatUsage>>,
}

/// Chats whose token usage `status --json` shows one by one.
pub const MAX_USAGE_CHATS: usize = 4096;

/// One chat's token usage this incarnation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatUsage {
    pub runs: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Metrics {
    pub fn count<T>(&self, r: &Result<T, AgentError>) {
        let c = match r {
            Ok(_) => &self.ok,
            Err(AgentError::Cancelled) => &self.cancelled,
            Err(AgentError::Timeout(_)) => &self.timeout,
            Err(_) => &self.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = r
            && !matches!(e, AgentError::Cancelled)
        {
            *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((std::time::SystemTime::now(), e.to_string()));
        }
    }

    /// Adds one run's usage to its chat's.
    pub fn add_chat_usage(&self, platform: Option<&str>, chat: &str, u: gatewarden_agent::Usage) {
        let mut m = self.chat_usage.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = (platform.map(str::to_owned), chat.to_owned());
        if m.len() >= MAX_USAGE_CHATS && !m.contains_key(&key) {
            key = (Some("*".to_owned()), "(other chats)".to_owned());
        }
        let e = m.entry(key).or_default();
        e.runs += 1;
        e.prompt_tokens = e.prompt_tokens.saturating_add(u.prompt_tokens);
        e.completion_tokens = e.completion_tokens.saturating_add(u.completion_tokens);
    }

    /// `status --json`'s `agent.usage_by_chat`: the chats that used most tokens first, at most
    /// `limit`.
    pub fn chat_usage_json(&self, limit: usize) -> serde_json::Value {
        let m = self.chat_usage.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<_> = m.iter().collect();
        rows.sort_by_key(|(_, u)| std::cmp::Reverse(u.prompt_tokens.saturating_add(u.completion_tokens)));
        serde_json::Value::Array(
            rows.into_iter()
                .take(limit)
                .map(|((p, c), u)| {
                    serde_json::json!({"platform": p, "chat_id": c, "runs": u.runs,
                        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens})
                })
                .collect(),
        )
    }

    /// `{"at", "reason"}` of the last failed run, or null.
    pub fn last_failure_json(&self) -> serde_json::Value {
        match &*self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((at, why)) => serde_json::json!({"at": gatewarden_lifecycle::timefmt::format(*at), "reason": why}),
            None => serde_json::Value::Null,
        }
    }

    /// Restart and drain totals survive restarts: they are counted from the ledger.
    pub fn seed_from_ledger(&self, ledger: &std::path::Path) {
        let Some(lines) = gatewarden_lifecycle::ledger::read_tail(ledger, Some(5000)).ok() else { return };
        for line in lines {
            if let gatewarden_lifecycle::ledger::Line::Event(e) = line {
                match e.get("event").and_then(|v| v.as_str()) {
                    Some("restart_requested") => {
                        self.restarts_before.fetch_add(1, Ordering::Relaxed);
                    }
                    Some("drained") => {
                        self.drains_before.fetch_add(1, Ordering::Relaxed);
                        let ms = e.get("duration_ms").and_then(|v| v.as_u64()).unwrap_or(0);
                        self.drain_ms_before.fetch_add(ms, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A carried-out command: the reply, and what the main loop is to do once it is on its way.
pub struct CommandReply {
    pub reply: String,
    pub then: Option<Cause>,
}

pub struct Work {
    pub agent: Box<dyn Agent>,
    /// The home's SQLite journal, or the cluster's PostgreSQL one (`[cluster]`; lib.rs).
    pub journal: Arc<dyn Store>,
    /// Who may run the admin commands (commands.rs).
    pub admins: Admins,
    pub api_token: Option<String>,
    /// The listener's limits and accepted `Host` names.
    pub http: gatewarden_config::HttpConfig,
    /// Whether `Host` headers are checked: always on a loopback listener (DNS rebinding), and
    /// on another listener once `[http] allowed_hosts` names its public names.
    pub host_check: bool,
    /// Retention of finished journal rows.
    pub retention: gatewarden_config::JournalConfig,
    pub model: String,
    pub metrics: Metrics,
    pub notices: Notices,
    /// Cancelled when the drain budget runs out.
    pub cancel: CancellationToken,
    /// Outboxes with something new: the platform host sends it.
    pub wake: Wake,
    queue: mpsc::UnboundedSender<String>,
    queue_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    run_counter: AtomicU64,
    /// `[agent] history_turns`.
    pub history_turns: usize,
    /// `[agent] history_chars`.
    pub history_chars: usize,
    /// `[update] source`: what `/update` installs.
    update_source: Option<String>,
    /// Platform chats told that their queue is full (`platform\0chat`): told once while it
    /// stays full, so a flood past the cap cannot grow the outbox with notices instead.
    full_told: Mutex<HashSet<String>>,
    /// `[telemetry] otlp_endpoint`: finished messages' traces go out as OTLP spans.
    pub telemetry: std::sync::OnceLock<Arc<gatewarden_telemetry::Exporter>>,
    /// `[agent] hermes_home`: the hermes gateway this gateway runs (hermes.rs).
    pub hermes: Option<crate::hermes::Spec>,
    /// Async runs in flight by chat (`platform\0chat`, `""` for the HTTP API), for `/cancel`.
    chat_runs: Mutex<HashMap<String, Vec<(String, CancellationToken)>>>,
    /// Runs a chat `/cancel` stopped: they fail instead of waiting for the next incarnation.
    cancelled_by_chat: Mutex<HashSet<String>>,
}

fn chat_key(platform: Option<&str>, chat: &str) -> String {
    format!("{}\0{chat}", platform.unwrap_or(""))
}

impl Work {
    pub fn new(
        agent: Box<dyn Agent>,
        journal: Arc<dyn Store>,
        config: &gatewarden_config::Config,
        loopback: bool,
        platform_admins: std::collections::BTreeMap<String, Vec<String>>,
        wake: Wake,
    ) -> Work {
        let (queue, rx) = mpsc::unbounded_channel();
        Work {
            model: format!("gatewarden-{}", agent.name()),
            agent,
            journal,
            admins: Admins {
                http: config.admins.clone(),
                api_token: config.api_token.is_some(),
                platforms: platform_admins,
            },
            api_token: config.api_token.clone(),
            http: config.http.clone(),
            retention: config.journal.clone(),
            host_check: loopback || !config.http.allowed_hosts.is_empty(),
            metrics: Metrics::default(),
            notices: Notices::default(),
            cancel: CancellationToken::new(),
            wake,
            queue,
            queue_rx: Mutex::new(Some(rx)),
            run_counter: AtomicU64::new(0),
            history_turns: config.agent.history_turns,
            history_chars: config.agent.history_chars,
            update_source: config.update.source.clone(),
            full_told: Mutex::new(HashSet::new()),
            telemetry: std::sync::OnceLock::new(),
            hermes: None,
            chat_runs: Mutex::new(HashMap::new()),
            cancelled_by_chat: Mutex::new(HashSet::new()),
        }
    }

    /// With `[agent] hermes_home`: the hermes gateway this gateway runs.
    pub fn with_hermes(mut self, spec: Option<crate::hermes::Spec>) -> Work {
        self.hermes = spec;
        self
    }

    /// Why a new message of `(platform, chat)` is refused: past the `[journal]` queue caps
    /// (`None`: take it). Blocking (the journal), like the callers' other journal steps.
    pub fn queue_refusal(&self, platform: Option<&str>, chat: &str) -> Result<Option<String>, JournalError> {
        let (mine, all) = self.journal.queued(platform, chat)?;
        Ok(self.retention.queue_refusal(mine, all))
    }

    /// Records whether a platform chat's queue is full; `true` when it just became full (tell
    /// it once).
    fn note_full(&self, platform: &str, chat: &str, full: bool) -> bool {
        let key = format!("{platform}\0{chat}");
        let mut told = self.full_told.lock().unwrap_or_else(|p| p.into_inner());
        if full {
            told.insert(key)
        } else {
            told.remove(&key);
            false
        }
    }

    /// `[update] source`: what chat `/update` (and the dashboard's Update) installs.
    pub fn update_source(&self) -> Option<&str> {
        self.update_source.as_deref()
    }

    /// Queues a journaled message id for the async worker.
    pub fn enqueue(&self, id: String) {
        let _ = self.queue.send(id);
    }

    pub fn next_run_id(&self, incarnation: &str) -> String {
        format!("run-{incarnation}-{}", self.run_counter.fetch_add(1, Ordering::Relaxed))
    }

    /// Journals an async command as already finished (one statement, so a crash can never
    /// leave it queued for replay).
    pub async fn accept_command(
        &self,
        chat_id: &str,
        user_id: &str,
        text: &str,
        reply: &str,
    ) -> Result<String, String> {
        let msg = NewMessage { chat_id: chat_id.into(), user_id: user_id.into(), text: text.into(), kind: Kind::Async };
        let reply = reply.to_owned();
        self.with_journal(move |j| j.accept_command(&msg, &reply)).await
    }

    /// Runs `f` on the journal off the async workers (SQLite blocks, and fsyncs each commit; the
    /// PostgreSQL store waits for its own thread); a failed task and a journal error both come
    /// back as the message to report.
    pub async fn with_journal<R: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<R, JournalError> + Send + 'static,
    ) -> Result<R, String> {
        let journal = Arc::clone(&self.journal);
        match tokio::task::spawn_blocking(move || f(&*journal)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// One journal step of a run (claim, read, finish). A store that failed (not a fence that
    /// refused) is retried while this gateway is still the active: a dropped connection must
    /// not leave the message queued or `running` under a run that gave up on it. The store
    /// settles a retried claim whose first answer was lost (crates/cluster/src/store.rs); once
    /// demoted, the successor recovers the run instead.
    async fn journal_step<R: Send + 'static>(
        &self,
        gw: &Gateway,
        f: impl Fn(&dyn Store) -> Result<R, JournalError> + Clone + Send + 'static,
    ) -> Result<R, JournalError> {
        let mut pause = Duration::from_millis(100);
        // A store down for longer demotes us anyway; an error that persists while the lease
        // holds is not one that waiting cures.
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (journal, step) = (Arc::clone(&self.journal), f.clone());
            let r = tokio::task::spawn_blocking(move || step(&*journal))
                .await
                .unwrap_or_else(|e| Err(JournalError::Store(e.to_string())));
            match r {
                Err(JournalError::Store(e))
                    if gw.cluster.get().is_some() && gw.is_active() && std::time::Instant::now() < give_up =>
                {
                    crate::warn!("journal: {e}; retrying in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                r => return r,
            }
        }
    }

    /// Journals an async message (durable before returning) and queues it if `run_now`.
    pub async fn accept_async(
        &self,
        chat_id: &str,
        user_id: &str,
        text: &str,
        run_now: bool,
    ) -> Result<String, String> {
        let msg = NewMessage { chat_id: chat_id.into(), user_id: user_id.into(), text: text.into(), kind: Kind::Async };
        let id = self.with_journal(move |j| j.accept(&msg)).await?;
        self.metrics.accepted_async.fetch_add(1, Ordering::Relaxed);
        if run_now {
            let _ = self.queue.send(id.clone());
        }
        Ok(id)
    }

    /// Runs one message now as a counted run. The agent runs in its own task so that a client
    /// that disconnects cannot drop it mid-cleanup; the token is cancelled instead.
    pub async fn run_sync(
        self: &Arc<Self>,
        gw: &Gateway,
        req: AgentRequest,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<String, AgentError> {
        self.run_reply(gw, req, chunks).await.map(|r| r.text)
    }

    /// [`Self::run_sync`] with the whole reply (its usage too). Provider state changes the run
    /// caused (openai failover) go to the ledger.
    pub async fn run_reply(
        self: &Arc<Self>,
        gw: &Gateway,
        req: AgentRequest,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<gatewarden_agent::AgentReply, AgentError> {
        self.run_traced(gw, None, req, chunks, None, self.cancel.child_token()).await
    }

    /// [`Self::run_reply`] for a chat of `platform` (`None`: the HTTP API), whose usage it adds
    /// to, under `token` (a child of [`Self::cancel`]), with what the backend notes for the
    /// message's trace (providers tried, first token) going to `notes`.
    async fn run_traced(
        self: &Arc<Self>,
        gw: &Gateway,
        platform: Option<&str>,
        req: AgentRequest,
        chunks: Option<mpsc::Sender<String>>,
        notes: Option<RunNotes>,
        token: CancellationToken,
    ) -> Result<gatewarden_agent::AgentReply, AgentError> {
        let _run = gw.runs.begin();
        let chat = req.chat_id.clone();
        let _cancel_on_drop = token.clone().drop_guard();
        let me = Arc::clone(self);
        // The agent's task stays in the caller's span (a message's id and platform in its logs).
        let span = tracing::Span::current();
        let handle = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let run = async {
                    match chunks {
                        Some(tx) => me.agent.run_streaming(req, token, tx).await,
                        None => me.agent.run(req, token).await,
                    }
                };
                match notes {
                    Some(n) => gatewarden_agent::backend::trace::scope(n, run).await,
                    None => run.await,
                }
            },
            span,
        ));
        let r = handle.await.unwrap_or_else(|e| Err(AgentError::Failed(format!("run panicked: {e}"))));
        self.metrics.count(&r);
        if let Ok(gatewarden_agent::AgentReply { usage: Some(u), .. }) = &r {
            self.metrics.prompt_tokens.fetch_add(u.prompt_tokens, Ordering::Relaxed);
            self.metrics.completion_tokens.fetch_add(u.completion_tokens, Ordering::Relaxed);
            self.metrics.add_chat_usage(platform, &chat, *u);
        }
        for ev in self.agent.take_provider_events() {
            let s = ev.status;
            let until = s.until.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs());
            gw.record(
                "provider_state",
                serde_json::json!({"provider": s.name, "from": ev.from, "to": s.state, "reason": s.reason, "until": until}),
            );
        }
        r
    }

    /// Carries out a command its sender may run ([`commands::decide`] said so); `platform` is
    /// the adapter it came through (`None`: HTTP).
    pub fn command(
        &self,
        gw: &Gateway,
        cmd: Command,
        platform: Option<&str>,
        chat_id: &str,
        user_id: &str,
    ) -> CommandReply {
        let requester = Requester {
            pid: std::process::id(),
            argv: vec![format!("chat:{chat_id}"), format!("user:{user_id}")],
            channel: "chat".into(),
        };
        let reply = |reply: String| CommandReply { reply, then: None };
        match cmd {
            Command::Help => reply(commands::HELP.into()),
            Command::New => reply(match platform.map(|p| self.journal.new_session(p, chat_id)) {
                Some(Err(e)) => format!("cannot start a new conversation: {e}"),
                // The HTTP API keeps no history: each /v1/chat/completions call brings its own.
                _ => "new conversation: earlier messages are forgotten".into(),
            }),
            Command::Status => {
                let s = gw.status();
                reply(format!(
                    "gatewarden {} · incarnation {} · {} · {} active run(s) · up {:.0}s",
                    s.version.unwrap_or_default(),
                    s.incarnation.unwrap_or_default(),
                    s.state.unwrap_or_default(),
                    s.active_runs.unwrap_or(0),
                    s.uptime_s.unwrap_or(0.0)
                ))
            }
            // Already leaving (a drain for a stop or a restart): the main loop no longer takes
            // requests, so the reply says what happens instead, and the ledger has it (issue 22,
            // item 7: "restarting…" was answered, and nothing was recorded or done).
            Command::Restart if gw.phase.get() != GatewayState::Running => {
                let joined = if self.notices.restarting() { "restart" } else { "stop" };
                let who = json!({"pid": requester.pid, "argv": requester.argv, "channel": requester.channel});
                gw.record("restart_requested", json!({"requester": who, "reason": "restart", "joined": joined}));
                reply(
                    match joined {
                        "restart" => "a restart is already under way",
                        _ => "the gateway is stopping; it will not restart (start it again with `gatewarden start`)",
                    }
                    .into(),
                )
            }
            Command::Restart => {
                notices::record_restart_requester(gw.home.dir(), chat_id, user_id, platform, &gw.me.id);
                CommandReply {
                    reply: "restarting…".into(),
                    then: Some(Cause::Control { kind: ControlKind::Restart, requester }),
                }
            }
            Command::Stop => {
                gw.record_operator_stop(&requester.channel);
                CommandReply {
                    reply: "stopping…".into(),
                    then: Some(Cause::Control { kind: ControlKind::Stop, requester }),
                }
            }
            Command::Update => reply(self.start_update(gw, platform, chat_id, user_id)),
            Command::Cancel => reply(self.cancel_chat(platform, chat_id)),
            Command::Approve | Command::Deny => {
                reply(self.answer_approval(platform, chat_id, user_id, cmd == Command::Approve))
            }
        }
    }

    /// `/cancel`: stops this chat's runs in flight (the hermes backend stops hermes's run);
    /// they fail with "cancelled", never re-run.
    fn cancel_chat(&self, platform: Option<&str>, chat_id: &str) -> String {
        let runs = self.chat_runs.lock().unwrap_or_else(|p| p.into_inner()).get(&chat_key(platform, chat_id)).cloned();
        let runs = runs.unwrap_or_default();
        if runs.is_empty() {
            return "nothing to cancel".into();
        }
        let mut marked = self.cancelled_by_chat.lock().unwrap_or_else(|p| p.into_inner());
        for (id, token) in &runs {
            marked.insert(id.clone());
            token.cancel();
        }
        format!("cancelling {} run(s)", runs.len())
    }

    /// `/approve`, `/deny`: answers the oldest approval the agent asks in this chat, when the
    /// sender may ([`commands::Admins::may_answer`]).
    fn answer_approval(&self, platform: Option<&str>, chat_id: &str, user_id: &str, approve: bool) -> String {
        let (Some(approvals), Some(p)) = (self.agent.approvals(), platform) else {
            return "nothing waits for an approval here".into();
        };
        let Some(pending) = approvals.pending(p, chat_id) else {
            return "nothing waits for an approval here".into();
        };
        let from = Sender { channel: Channel::Platform(p), user_id };
        if !self.admins.may_answer(from, &pending.user_id) {
            return "only the user who asked, or an admin, can answer this approval".into();
        }
        match (approvals.answer(p, chat_id, &pending.run_id, approve), approve) {
            (false, _) => "that approval is no longer waiting".into(),
            (true, true) => format!("approved: {}", pending.what),
            (true, false) => format!("denied: {}", pending.what),
        }
    }

    /// Relays the questions the agent asks (hermes approvals) to their chats through the
    /// outbox, as long as the worker runs.
    fn relay_questions(self: &Arc<Self>) {
        let Some(mut rx) = self.agent.approvals().and_then(|a| a.take_questions()) else { return };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(q) = rx.recv().await {
                let (p, c, t) = (q.platform.clone(), q.chat_id.clone(), q.text);
                match me.with_journal(move |j| j.enqueue(&p, &c, &t)).await {
                    Ok(_) => me.wake.wake(&q.platform),
                    Err(e) => crate::warn!("cannot tell chat {} the agent's question: {e}", q.chat_id),
                }
            }
        });
    }

    /// `/update`: a detached `gatewarden update --from <[update] source> --chat <chat>`. It
    /// restarts us through the restart ladder like `/restart` (never a run, so the drain does
    /// not wait on it) and leaves exactly one outcome notice for this chat: an HTTP chat
    /// collects it with its notices, a platform chat gets it through the outbox
    /// (notices.rs). The caller checked who asked ([`commands::decide`]).
    fn start_update(&self, gw: &Gateway, platform: Option<&str>, chat_id: &str, user_id: &str) -> String {
        let Some(source) = &self.update_source else {
            return "no release to install: set [update] source in config.toml".into();
        };
        let Ok(exe) = spawn::self_exe() else { return "cannot locate the gatewarden executable".into() };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--home").arg(gw.home.dir()).args(["update", "--from", source, "--chat", chat_id]);
        if let Some(p) = platform {
            cmd.args(["--chat-platform", p]);
        }
        // Not one of our runs: the next incarnation's sweep must not kill it.
        cmd.env_remove(crate::options::RUN_TAG);
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        spawn::detach(&mut cmd, None);
        match cmd.spawn() {
            Ok(child) => {
                gw.record(
                    "update_requested",
                    json!({"chat_id": chat_id, "platform": platform, "user_id": user_id, "updater_pid": child.id()}),
                );
                format!("updating from {source}…")
            }
            Err(e) => format!("cannot start the update: {e}"),
        }
    }

    /// At boot: a predecessor's `/restart` becomes one "back online" notice, and `/update`
    /// notices for platform chats are relayed from now on (notices.rs).
    pub fn boot_notices(&self, gw: &Gateway, platforms: bool) {
        if platforms {
            notices::relay_update_notices(gw.home.dir().to_path_buf(), Arc::clone(&self.journal), self.wake.clone());
        }
        notices::back_online(gw.home.dir(), &gw.me.id, &self.notices, &*self.journal, &self.wake);
    }

    /// Applies `[journal]` retention at start and every [`PRUNE_EVERY`], off the async workers;
    /// unfinished messages are never pruned (`Journal::prune`).
    pub fn start_pruning(self: &Arc<Self>) {
        let (age, bytes) = (self.retention.max_age(), self.retention.max_bytes());
        if age.is_none() && bytes.is_none() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            loop {
                tick.tick().await;
                match me.with_journal(move |j| j.prune(age, bytes)).await {
                    Ok(p) if p.by_age + p.by_size + p.outbox > 0 => crate::info!(
                        "journal retention: deleted {} finished message(s) past max_age_days, {} past max_size_mb, \
                         {} outbox entries and sessions",
                        p.by_age,
                        p.by_size,
                        p.outbox
                    ),
                    Ok(_) => {}
                    Err(e) => crate::warn!("journal retention failed: {e}"),
                }
            }
        });
    }

    /// Starts the async worker: recovers interrupted runs (once each), then runs queued ids;
    /// and the journal's retention.
    pub fn start_worker(self: &Arc<Self>, gw: Arc<Gateway>) {
        self.start_pruning();
        self.relay_questions();
        let Some(mut rx) = self.queue_rx.lock().ok().and_then(|mut g| g.take()) else { return };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.recover_into_queue(&gw).await;
            let slots = Arc::new(Semaphore::new(ASYNC_CONCURRENCY));
            while let Some(id) = rx.recv().await {
                if gw.phase.get() != GatewayState::Running || !gw.is_active() {
                    // Left queued: the next incarnation (or promotion) runs it.
                    continue;
                }
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else { return };
                let (me, gw) = (Arc::clone(&me), Arc::clone(&gw));
                tokio::spawn(async move {
                    me.run_async(&gw, id).await;
                    drop(permit);
                });
            }
        });
    }

    /// After a later promotion: queues what the journal holds again (the worker skipped it
    /// while this gateway was a standby). A row queued twice runs once: `claim` is atomic.
    pub fn resume_queued(self: &Arc<Self>, gw: Arc<Gateway>) {
        let me = Arc::clone(self);
        tokio::spawn(async move { me.recover_into_queue(&gw).await });
    }

    /// Recovers interrupted runs and queues every queued id. A failure is retried while this
    /// gateway may still run work: on the cluster's store a transient error at promotion would
    /// otherwise leave the messages an earlier active accepted unrun for this whole term.
    async fn recover_into_queue(self: &Arc<Self>, gw: &Gateway) {
        let mut pause = Duration::from_millis(200);
        loop {
            let inc = gw.me.id.clone();
            match self.with_journal(move |j| j.recover(&inc)).await {
                Ok(ids) => {
                    if !ids.is_empty() {
                        crate::info!("resuming {} journaled message(s)", ids.len());
                    }
                    for id in ids {
                        let _ = self.queue.send(id);
                    }
                    return;
                }
                Err(e) => crate::error!("journal recovery failed: {e}"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            let running = gw.phase.get() == GatewayState::Running;
            if !running || !gw.is_active() {
                return;
            }
        }
    }

    /// One async message, in a `message` span: its log lines carry its id and platform.
    async fn run_async(self: &Arc<Self>, gw: &Gateway, id: String) {
        use tracing::Instrument;
        let span = tracing::info_span!("message", message_id = %id, platform = tracing::field::Empty);
        self.run_message(gw, id).instrument(span).await;
    }

    async fn run_message(self: &Arc<Self>, gw: &Gateway, id: String) {
        let (inc, id2) = (gw.me.id.clone(), id.clone());
        match self.journal_step(gw, move |j| j.claim(&id2, &inc)).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return crate::error!("journal claim of {id} failed: {e}"),
        }
        let id2 = id.clone();
        let msg = match self.journal_step(gw, move |j| j.get(&id2)).await {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => return crate::error!("journal read of {id} failed: {e}"),
        };
        tracing::Span::current().record("platform", msg.platform.as_deref().unwrap_or("http"));
        // A chat platform's conversation: the session's last turns, within the char budget.
        let history = if msg.platform.is_some() && self.history_turns > 0 {
            let (id, turns, chars) = (msg.id.clone(), self.history_turns, self.history_chars);
            match self.with_journal(move |j| j.history(&id, turns)).await {
                Ok(pairs) => gatewarden_agent::within_budget(
                    pairs.into_iter().flat_map(|(q, a)| [Turn::new("user", q), Turn::new("assistant", a)]).collect(),
                    chars,
                ),
                Err(e) => {
                    crate::warn!("cannot read the conversation of {}: {e}; running it without history", msg.id);
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        // The conversation's start names the hermes session (backend/hermes.rs): `/new` moves it.
        let session_started = match &msg.platform {
            Some(p) => {
                let (p, c) = (p.clone(), msg.chat_id.clone());
                self.with_journal(move |j| j.session_started(&p, &c)).await.unwrap_or_else(|e| {
                    crate::warn!("cannot read the session of {}: {e}", msg.id);
                    None
                })
            }
            None => None,
        };
        let req = AgentRequest {
            run_id: msg.id.clone(),
            chat_id: msg.chat_id.clone(),
            user_id: msg.user_id.clone(),
            text: msg.text.clone(),
            history,
            platform: msg.platform.clone(),
            session_started,
        };
        let key = chat_key(msg.platform.as_deref(), &msg.chat_id);
        let token = self.cancel.child_token();
        self.chat_runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .push((id.clone(), token.clone()));
        let mut steps = RunSteps::default();
        steps.push(TraceEvent::at(Step::BackendCalled, std::time::SystemTime::now()).subject(self.agent.name()));
        let notes = RunNotes::default();
        // The run always streams: into the chat (typing, a growing preview) or into nothing, so
        // that its first token is known for the trace; the reply is the whole answer either way.
        let shown = msg.platform.as_ref().map(|p| Shown::start(&self.wake, p, &msg.chat_id, &msg.id));
        let (tx, mut rx) = mpsc::channel::<String>(64);
        let chunks = shown.as_ref().map_or(tx, |s| s.chunks.clone());
        let drain = async move { while rx.recv().await.is_some() {} };
        let run = self.run_traced(gw, msg.platform.as_deref(), req, Some(chunks), Some(notes.clone()), token);
        let (r, ()) = tokio::join!(run, drain);
        {
            let mut runs = self.chat_runs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = runs.get_mut(&key) {
                v.retain(|(i, _)| i != &id);
                if v.is_empty() {
                    runs.remove(&key);
                }
            }
        }
        let by_chat = self.cancelled_by_chat.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let r = match r {
            Err(AgentError::Cancelled) if by_chat => Err(AgentError::Failed("cancelled (/cancel)".into())),
            r => r,
        };
        let cancelled = matches!(r, Err(AgentError::Cancelled));
        if let Some(s) = shown {
            s.end(!cancelled).await;
        }
        if cancelled {
            // Interrupted by the drain: stays `running` for the next incarnation to re-run once.
            return;
        }
        for n in noted(notes.take()) {
            steps.push(n);
        }
        let inc = gw.me.id.clone();
        let outcome = r.map_err(|e| e.to_string());
        if let Err(e) = &outcome {
            // In the message's span: the line carries its id and platform.
            crate::warn!("message failed: {e}");
        }
        let id2 = id.clone();
        let done = self
            .journal_step(gw, move |j| match &outcome {
                Ok(reply) => j.complete_traced(
                    &id2,
                    &inc,
                    &reply.text,
                    reply.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
                    steps.steps(),
                ),
                Err(e) => j.fail_traced(&id2, &inc, e, steps.steps()),
            })
            .await;
        match done {
            Err(e) => crate::error!("journal update failed: {e}"),
            Ok(true) => self.export_trace(&id),
            Ok(false) => {}
        }
        if let Some(p) = &msg.platform {
            self.wake.wake(p);
        }
    }

    /// Hands a finished message's trace to the OTLP exporter, when one is configured: one read
    /// off the async workers, and the exporter's queue never blocks (it drops and counts).
    fn export_trace(self: &Arc<Self>, id: &str) {
        let Some(exporter) = self.telemetry.get().cloned() else { return };
        let (journal, id) = (Arc::clone(&self.journal), id.to_owned());
        tokio::task::spawn_blocking(move || match (journal.get(&id), journal.trace(&id)) {
            (Ok(Some(msg)), Ok(events)) => exporter.message(&msg, &events),
            (Ok(None), _) => {}
            (Err(e), _) | (_, Err(e)) => crate::warn!("cannot read the trace of {id} for export: {e}"),
        });
    }

    /// Ends the drain's patience: every active run is cancelled.
    pub fn cancel_all(&self) {
        self.cancel.cancel();
    }
}

/// A platform run's activity on its way to the chat (typing, a growing preview; crates/platforms
/// skeleton/progress.rs): the agent's text deltas are forwarded as they come, through the
/// [`Wake`] channel, so they reach the adapter before the wake for the reply.
struct Shown {
    chunks: mpsc::Sender<String>,
    forward: tokio::task::JoinHandle<()>,
    wake: Wake,
    at: (String, String, String),
}

/// How long a finished run's last deltas may take to be forwarded (a backend's streaming
/// thread can outlive a cancelled run; it is not waited for).
const FORWARD_GRACE: Duration = Duration::from_millis(500);

impl Shown {
    fn start(wake: &Wake, platform: &str, chat: &str, run: &str) -> Shown {
        wake.show(platform, chat, run, Activity::Started);
        let (chunks, mut rx) = mpsc::channel::<String>(64);
        let at = (platform.to_owned(), chat.to_owned(), run.to_owned());
        let (w, (p, c, r)) = (wake.clone(), at.clone());
        let forward = tokio::spawn(async move {
            while let Some(delta) = rx.recv().await {
                w.show(&p, &c, &r, Activity::Text(delta));
            }
        });
        Shown { chunks, forward, wake: wake.clone(), at }
    }

    /// The run ended; `replied`: its reply or failure notice is about to be queued.
    async fn end(self, replied: bool) {
        let Shown { chunks, mut forward, wake, at: (p, c, r) } = self;
        drop(chunks);
        if tokio::time::timeout(FORWARD_GRACE, &mut forward).await.is_err() {
            forward.abort();
        }
        wake.show(&p, &c, &r, Activity::Ended { replied });
    }
}

/// The backend's notes as trace steps, in the order they began.
fn noted(notes: Vec<Note>) -> Vec<TraceEvent> {
    let mut out: Vec<(std::time::SystemTime, TraceEvent)> = notes
        .into_iter()
        .map(|n| match n {
            Note::ProviderTried { provider, outcome, started, elapsed } => (
                started,
                TraceEvent::at(Step::ProviderTried, started).subject(provider).outcome(outcome).elapsed(elapsed),
            ),
            Note::FirstToken { at } => (at, TraceEvent::at(Step::FirstToken, at)),
        })
        .collect();
    out.sort_by_key(|(t, _)| *t);
    out.into_iter().map(|(_, e)| e).collect()
}

impl Intake for Work {
    fn deliver(&self, gw: &Gateway, adapter: &str, m: Inbound) -> Result<(), String> {
        let j = &self.journal;
        let msg = NewMessage {
            chat_id: m.chat_id.clone(),
            user_id: m.user_id.clone(),
            text: m.text.clone(),
            kind: Kind::Async,
        };
        let from = Sender { channel: Channel::Platform(adapter), user_id: &m.user_id };
        let out = match commands::decide(&m.text, from, &self.admins) {
            CommandOutcome::Message => {
                // Queued work is never pruned: past the queue caps the message is refused
                // (taken off the platform, not journaled) and the chat told, once while it
                // stays full. A redelivery of a message already journaled was taken: it is not
                // told otherwise.
                if let Some(why) = self.queue_refusal(Some(adapter), &m.chat_id).map_err(|e| e.to_string())? {
                    if !j.has_event(adapter, &m.event_id).map_err(|e| e.to_string())?
                        && self.note_full(adapter, &m.chat_id, true)
                    {
                        j.enqueue(adapter, &m.chat_id, &format!("not taken: {why}")).map_err(|e| e.to_string())?;
                        self.wake.wake(adapter);
                    }
                    return Ok(());
                }
                self.note_full(adapter, &m.chat_id, false);
                if let Some(id) = j.accept_inbound(adapter, &m.event_id, &msg).map_err(|e| e.to_string())? {
                    self.metrics.accepted_async.fetch_add(1, Ordering::Relaxed);
                    // Only a running gateway runs it; otherwise the next incarnation does.
                    if gw.phase.get() == GatewayState::Running {
                        self.enqueue(id);
                    }
                }
                return Ok(());
            }
            // A redelivered command was handled already: never restart twice.
            _ if j.has_event(adapter, &m.event_id).map_err(|e| e.to_string())? => return Ok(()),
            CommandOutcome::Refused { reply, .. } => CommandReply { reply, then: None },
            CommandOutcome::Run(cmd) => self.command(gw, cmd, Some(adapter), &m.chat_id, &m.user_id),
        };
        j.accept_inbound_command(adapter, &m.event_id, &msg, &out.reply).map_err(|e| e.to_string())?;
        self.wake.wake(adapter);
        if let Some(cause) = out.then {
            gw.send_cause(cause);
        }
        Ok(())
    }

    fn journal(&self) -> &Arc<dyn Store> {
        &self.journal
    }

    /// Exports the outbox span of the message's trace (its other spans went at its finish).
    fn answered(&self, message_id: &str) {
        let Some(exporter) = self.telemetry.get() else { return };
        match (self.journal.get(message_id), self.journal.trace(message_id)) {
            (Ok(Some(msg)), Ok(events)) => exporter.outbox(&msg, &events),
            (Ok(None), _) => {}
            (Err(e), _) | (_, Err(e)) => crate::warn!("cannot read the trace of {message_id} for export: {e}"),
        }
    }
}
