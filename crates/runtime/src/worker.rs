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
use std::sync::{Arc, Mutex, RwLock};
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

use crate::access::pairing::Keeper;
use crate::access::{Admit, Gate, Policies};
use crate::cause::{Asker, ControlKind};
use crate::commands::{self, Admins, Channel, Command, CommandOutcome, Sender};
use crate::gateway::{Gateway, RestartAnswer};
use crate::intake::{Intake, Wake};
use crate::notices::{self, Notices};
use gatewarden_agent::backend::delivery::{self, Delivery};
use gatewarden_platforms::Activity;
use gatewarden_platforms::skeleton::progress::PREVIEW_AFTER;

/// Where a run streams its reply: the chunks, and how far they got towards the caller (the
/// consumer [`Delivery::take`]s each chunk and [`Delivery::reach`]es before showing it).
pub type Stream = (mpsc::Sender<String>, Delivery);

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
    /// When the last run failed, why, and its reference (the message or run id a chat or
    /// caller was given).
    pub last_failure: Mutex<Option<(std::time::SystemTime, String, String)>>,
    /// Tokens the upstream reported (openai), this incarnation.
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// The same per `(platform, chat)` (`None`: the HTTP API), with the runs that reported
    /// them; at most [`MAX_USAGE_CHATS`] chats, the rest counted together.
    pub chat_usage: Mutex<std::collections::BTreeMap<(Option<String>, String), ChatUsage>>,
    /// Runs that failed (not cancelled) since the last that succeeded: `doctor`'s
    /// `runs-failing`, `status`'s agent line.
    pub failures_in_a_row: AtomicU64,
    /// Runs finished in the last minute (`top`'s messages per minute).
    pub finished: Mutex<PerMinute>,
}

/// Events counted per second over the last minute: 60 buckets, each stamped with its second,
/// so a bucket from a minute ago is never counted again. Pure; the clock is the caller's.
#[derive(Debug)]
pub struct PerMinute {
    buckets: [(u64, u32); 60],
}

impl Default for PerMinute {
    fn default() -> PerMinute {
        PerMinute { buckets: [(0, 0); 60] }
    }
}

impl PerMinute {
    /// One event at `second` (seconds on any monotonic scale).
    pub fn note(&mut self, second: u64) {
        let b = &mut self.buckets[(second % 60) as usize];
        if b.0 != second {
            *b = (second, 0);
        }
        b.1 = b.1.saturating_add(1);
    }

    /// Events in the minute up to and including `second`.
    pub fn last_minute(&self, second: u64) -> u64 {
        self.buckets.iter().filter(|(s, _)| *s <= second && second - *s < 60).map(|(_, n)| u64::from(*n)).sum()
    }
}

/// Seconds since this process first asked: the clock of [`PerMinute`].
pub fn uptime_second() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_secs()
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
    pub fn count<T>(&self, r: &Result<T, AgentError>, reference: &str) {
        let c = match r {
            Ok(_) => &self.ok,
            Err(AgentError::Cancelled) => &self.cancelled,
            Err(AgentError::Timeout(_)) => &self.timeout,
            Err(_) => &self.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.finished.lock().unwrap_or_else(|p| p.into_inner()).note(uptime_second());
        match r {
            Ok(_) => self.failures_in_a_row.store(0, Ordering::Relaxed),
            Err(AgentError::Cancelled) => {}
            Err(e) => {
                self.failures_in_a_row.fetch_add(1, Ordering::Relaxed);
                *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((std::time::SystemTime::now(), e.to_string(), reference.to_owned()));
            }
        }
    }

    /// `status`'s run counts: by outcome this incarnation, failed in a row, finished in the
    /// last minute.
    pub fn runs_json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let minute = self.finished.lock().unwrap_or_else(|p| p.into_inner()).last_minute(uptime_second());
        serde_json::json!({"ok": n(&self.ok), "failed": n(&self.failed), "timeout": n(&self.timeout),
            "cancelled": n(&self.cancelled), "failures_in_a_row": n(&self.failures_in_a_row),
            "last_minute": minute})
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

    /// `{"at", "reason", "reference"}` of the last failed run, or null.
    pub fn last_failure_json(&self) -> serde_json::Value {
        match &*self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((at, why, reference)) => serde_json::json!({
                "at": gatewarden_lifecycle::timefmt::format(*at), "reason": why, "reference": reference,
            }),
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

/// A carried-out command: the reply, and for a restart taken on over HTTP, where its verdict
/// comes (restart.rs: `Ok` carried out, `Err` refused while this incarnation serves on).
pub struct CommandReply {
    pub reply: String,
    pub verdict: Option<tokio::sync::oneshot::Receiver<Result<String, String>>>,
}

/// What a reload replaces (reload.rs), swapped whole: a run or a command reads one consistent
/// set through [`Work::live`], and a run in flight keeps the agent it started with.
#[derive(Clone)]
pub struct Live {
    pub agent: Arc<dyn Agent>,
    /// Who may run the admin commands (commands.rs).
    pub admins: Admins,
    /// `[journal]`: retention of finished rows and the queue caps.
    pub retention: gatewarden_config::JournalConfig,
    /// `[agent] history_turns`, `history_chars`.
    pub history_turns: usize,
    pub history_chars: usize,
    /// `[update] source`: what `/update` installs.
    pub update_source: Option<String>,
    /// `[telemetry] otlp_endpoint`: finished messages' traces go out as OTLP spans.
    pub telemetry: Option<Arc<gatewarden_telemetry::Exporter>>,
    /// `[agent] failure_text` and `failure_reasons_for_admins`: what a failed run's chat or
    /// caller is told ([`Work::failure_notice`]).
    pub failure_text: String,
    pub failure_reasons_for_admins: bool,
}

impl Live {
    /// The settings of `config`, with `admins` (top level and per platform) and `telemetry`
    /// given.
    pub fn new(
        agent: Arc<dyn Agent>,
        config: &gatewarden_config::Config,
        admins: Admins,
        telemetry: Option<Arc<gatewarden_telemetry::Exporter>>,
    ) -> Live {
        Live {
            agent,
            admins,
            retention: config.journal.clone(),
            history_turns: config.agent.history_turns,
            history_chars: config.agent.history_chars,
            update_source: config.update.source.clone(),
            telemetry,
            failure_text: config.agent.failure_text.clone(),
            failure_reasons_for_admins: config.agent.failure_reasons_for_admins,
        }
    }
}

pub struct Work {
    /// The home's SQLite journal, or the cluster's PostgreSQL one (`[cluster]`; lib.rs).
    pub journal: Arc<dyn Store>,
    /// What a reload may change ([`Live`]).
    live: RwLock<Arc<Live>>,
    pub api_token: Option<String>,
    /// The listener's limits and accepted `Host` names.
    pub http: gatewarden_config::HttpConfig,
    /// Whether `Host` headers are checked: always on a loopback listener (DNS rebinding), and
    /// on another listener once `[http] allowed_hosts` names its public names.
    pub host_check: bool,
    pub metrics: Metrics,
    pub notices: Notices,
    /// Cancelled when the drain budget runs out.
    pub cancel: CancellationToken,
    /// Outboxes with something new: the platform host sends it.
    pub wake: Wake,
    queue: mpsc::UnboundedSender<String>,
    queue_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    run_counter: AtomicU64,
    /// Platform chats told that their queue is full (`platform\0chat`): told once while it
    /// stays full, so a flood past the cap cannot grow the outbox with notices instead.
    full_told: Mutex<HashSet<String>>,
    /// `[agent] hermes_home`: the hermes gateway this gateway runs (hermes.rs).
    pub hermes: Option<crate::hermes::Spec>,
    /// Async runs in flight by chat (`platform\0chat`, `""` for the HTTP API), for `/cancel`.
    chat_runs: Mutex<HashMap<String, Vec<(String, CancellationToken)>>>,
    /// Runs a chat `/cancel` stopped: they fail instead of waiting for the next incarnation.
    cancelled_by_chat: Mutex<HashSet<String>>,
    /// Wakes the retention task now (a reload changed `[journal]`).
    pub prune_soon: tokio::sync::Notify,
    /// Told every waiter when [`Live`] was replaced (the OTLP metrics task).
    pub reloaded: tokio::sync::Notify,
    /// Who may reach the agent from a chat platform, and the pairing book (access/).
    pub gate: Arc<Gate>,
}

/// Who made a pairing decision, for the ledger: the channel (`cli`, `dashboard`, `chat`,
/// `control`) and who on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedBy {
    pub channel: String,
    pub who: String,
}

impl DecidedBy {
    fn text(&self) -> String {
        format!("{} ({})", self.channel, self.who)
    }
}

/// Why a run a chat cancelled failed.
pub const REASON_CANCELLED: &str = "cancelled (/cancel)";

fn chat_key(platform: Option<&str>, chat: &str) -> String {
    format!("{}\0{chat}", platform.unwrap_or(""))
}

impl Work {
    pub fn new(
        agent: Box<dyn Agent>,
        journal: Arc<dyn Store>,
        config: &gatewarden_config::Config,
        api_token: Option<gatewarden_config::Secret>,
        loopback: bool,
        platform_admins: std::collections::BTreeMap<String, Vec<String>>,
        wake: Wake,
    ) -> Work {
        let (queue, rx) = mpsc::unbounded_channel();
        let admins = Admins { http: config.admins.clone(), api_token: api_token.is_some(), platforms: platform_admins };
        let journal_for_gate = Arc::clone(&journal);
        Work {
            live: RwLock::new(Arc::new(Live::new(Arc::from(agent), config, admins, None))),
            journal,
            api_token: api_token.map(|t| t.expose().to_owned()),
            http: config.http.clone(),
            host_check: loopback || !config.http.allowed_hosts.is_empty(),
            metrics: Metrics::default(),
            notices: Notices::default(),
            cancel: CancellationToken::new(),
            wake,
            queue,
            queue_rx: Mutex::new(Some(rx)),
            run_counter: AtomicU64::new(0),
            full_told: Mutex::new(HashSet::new()),
            hermes: None,
            chat_runs: Mutex::new(HashMap::new()),
            cancelled_by_chat: Mutex::new(HashSet::new()),
            prune_soon: tokio::sync::Notify::new(),
            reloaded: tokio::sync::Notify::new(),
            // Replaced by `with_gate` in a gateway (lib.rs `prepare`); this one writes nothing.
            gate: Arc::new(Gate::new(Policies::new(config), Keeper::store(Arc::clone(&journal_for_gate)))),
        }
    }

    /// The access gate: the live policies and where the pairing book is kept.
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Work {
        self.gate = gate;
        self
    }

    /// The settings a reload may replace, as they are now.
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces them (reload.rs): what starts from now on uses `live`.
    pub fn set_live(&self, live: Live) {
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(live);
        self.reloaded.notify_waiters();
    }

    /// The exporter of `[telemetry]`, set once at start (prepare in lib.rs).
    pub fn set_telemetry(&self, x: Arc<gatewarden_telemetry::Exporter>) {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        let mut next = Live::clone(&live);
        next.telemetry = Some(x);
        *live = Arc::new(next);
    }

    /// The model name `/v1/models` and completions report: the backend's.
    pub fn model(&self) -> String {
        format!("gatewarden-{}", self.live().agent.name())
    }

    /// What the chat or caller of message `id` (sent by `user_id` through `platform`, `None`:
    /// the HTTP API) is told about its failure for `reason` (issue 27 §5): the configured text
    /// and the reference `gatewarden trace` takes. The reason itself only for an admin of that
    /// channel when `failure_reasons_for_admins` is on, or when it is about the gateway's own
    /// handling of the message (interrupted twice, `/cancel`); the operator has it whole in
    /// the trace, the journal, `status` and the log.
    pub fn failure_notice(&self, platform: Option<&str>, user_id: &str, id: &str, reason: &str) -> String {
        let channel = platform.map_or(Channel::Http, Channel::Platform);
        let live = self.live();
        let admin = live.failure_reasons_for_admins && live.admins.is_admin(Sender { channel, user_id });
        let public = reason == gatewarden_journal::REASON_INTERRUPTED_TWICE || reason == REASON_CANCELLED;
        gatewarden_journal::failure_notice_for(&live.failure_text, id, (admin || public).then_some(reason))
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
        Ok(self.live().retention.queue_refusal(mine, all))
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
    pub fn update_source(&self) -> Option<String> {
        self.live().update_source.clone()
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
        chunks: Option<Stream>,
    ) -> Result<String, AgentError> {
        self.run_reply(gw, req, chunks).await.map(|r| r.text)
    }

    /// [`Self::run_sync`] with the whole reply (its usage too). Provider state changes the run
    /// caused (openai failover) go to the ledger.
    pub async fn run_reply(
        self: &Arc<Self>,
        gw: &Gateway,
        req: AgentRequest,
        chunks: Option<Stream>,
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
        chunks: Option<Stream>,
        notes: Option<RunNotes>,
        token: CancellationToken,
    ) -> Result<gatewarden_agent::AgentReply, AgentError> {
        let _run = gw.runs.begin();
        let chat = req.chat_id.clone();
        let reference = req.run_id.clone();
        let _cancel_on_drop = token.clone().drop_guard();
        // The agent as it is now: a reload during the run does not change it under the run.
        let agent = Arc::clone(&self.live().agent);
        let ran = Arc::clone(&agent);
        // The agent's task stays in the caller's span (a message's id and platform in its logs).
        let span = tracing::Span::current();
        let handle = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let run = async {
                    match chunks {
                        Some((tx, d)) => delivery::scope(d, agent.run_streaming(req, token, tx)).await,
                        None => agent.run(req, token).await,
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
        self.metrics.count(&r, &reference);
        if let Ok(gatewarden_agent::AgentReply { usage: Some(u), .. }) = &r {
            self.metrics.prompt_tokens.fetch_add(u.prompt_tokens, Ordering::Relaxed);
            self.metrics.completion_tokens.fetch_add(u.completion_tokens, Ordering::Relaxed);
            self.metrics.add_chat_usage(platform, &chat, *u);
        }
        for ev in ran.take_provider_events() {
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
        text: &str,
        platform: Option<&str>,
        chat_id: &str,
        user_id: &str,
    ) -> CommandReply {
        let requester = Requester {
            pid: std::process::id(),
            argv: vec![format!("chat:{chat_id}"), format!("user:{user_id}")],
            channel: "chat".into(),
        };
        let reply = |reply: String| CommandReply { reply, verdict: None };
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
            // The gateway decides the answer (issue 30, item 2): taken on, joined to a restart
            // under way, or refused because a stop is under way; the ledger has each. One taken
            // on is told the verdict once the next incarnation is proven (restart.rs): a
            // platform chat hears of a refusal through its outbox; an HTTP caller waits for it
            // (http/messages.rs).
            Command::Restart => {
                let (asker, verdict) = match platform {
                    Some(p) => (Asker::Chat { platform: p.to_owned(), chat_id: chat_id.to_owned() }, None),
                    None => {
                        let (asker, verdict) = Asker::waiting();
                        (asker, Some(verdict))
                    }
                };
                let answer = gw.request_restart(&requester, asker, || {
                    notices::record_restart_requester(gw.home.dir(), chat_id, user_id, platform, &gw.me.id);
                });
                let verdict = verdict.filter(|_| answer == RestartAnswer::Accepted);
                CommandReply { reply: answer.reply(), verdict }
            }
            Command::Stop => match gw.request_stop(ControlKind::Stop, &requester) {
                Ok(()) => reply("stopping…".into()),
                Err(warning) => reply(format!("stopping… (warning: {warning})")),
            },
            Command::Update => reply(self.start_update(gw, platform, chat_id, user_id)),
            Command::Cancel => reply(self.cancel_chat(platform, chat_id)),
            Command::Approve | Command::Deny => {
                reply(self.answer_approval(platform, chat_id, user_id, cmd == Command::Approve))
            }
            Command::Pair | Command::Revoke => {
                let Some(p) = platform else {
                    return reply(
                        "pairing decisions are made on the chat platform, or with `gatewarden pairing approve PLATFORM CODE`"
                            .into(),
                    );
                };
                let by = DecidedBy { channel: "chat".into(), who: format!("{p} {user_id}") };
                let Some(arg) = commands::argument(text) else {
                    return reply(format!("{} needs an argument: /approve CODE or /revoke USER", cmd.name()));
                };
                reply(match cmd {
                    Command::Pair => match self.approve_pairing(gw, p, arg, &by) {
                        Ok(user) => format!("approved {user}: their messages reach the agent now"),
                        Err(e) => e,
                    },
                    _ => match self.revoke_pairing(gw, p, arg, &by) {
                        Ok(()) => format!("revoked {arg}: their messages no longer reach the agent"),
                        Err(e) => e,
                    },
                })
            }
        }
    }

    /// Approves the sender holding `code` on `platform` (at once: the next message is
    /// delivered), records `pairing_approved` and tells the sender through the outbox.
    /// Blocking (the book, the journal). Returns the sender's id.
    pub fn approve_pairing(&self, gw: &Gateway, platform: &str, code: &str, by: &DecidedBy) -> Result<String, String> {
        let p =
            self.gate.approve(platform, code, &by.text(), std::time::SystemTime::now()).map_err(|e| e.to_string())?;
        gw.record(
            "pairing_approved",
            json!({"platform": platform, "sender": p.user, "code": p.code, "channel": by.channel, "by": by.who}),
        );
        crate::info!("[[platform]] {platform}: {} approved by {}", p.user, by.text());
        match self.journal.enqueue(platform, &p.chat, crate::access::WELCOME) {
            Ok(_) => self.wake.wake(platform),
            Err(e) => crate::warn!("cannot tell {} they are approved: {e}", p.user),
        }
        Ok(p.user)
    }

    /// Takes `user`'s approval on `platform` back (at once), and records `pairing_revoked`.
    pub fn revoke_pairing(&self, gw: &Gateway, platform: &str, user: &str, by: &DecidedBy) -> Result<(), String> {
        self.gate.revoke(platform, user).map_err(|e| e.to_string())?;
        gw.record(
            "pairing_revoked",
            json!({"platform": platform, "sender": user, "channel": by.channel, "by": by.who}),
        );
        crate::info!("[[platform]] {platform}: {user} revoked by {}", by.text());
        Ok(())
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
        let live = self.live();
        let (Some(approvals), Some(p)) = (live.agent.approvals(), platform) else {
            return "nothing waits for an approval here".into();
        };
        let Some(pending) = approvals.pending(p, chat_id) else {
            return "nothing waits for an approval here".into();
        };
        let from = Sender { channel: Channel::Platform(p), user_id };
        if !live.admins.may_answer(from, &pending.user_id) {
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
        let Some(mut rx) = self.live().agent.approvals().and_then(|a| a.take_questions()) else { return };
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
        let Some(source) = self.update_source() else {
            return "no release to install: set [update] source in config.toml".into();
        };
        let Ok(exe) = spawn::self_exe() else { return "cannot locate the gatewarden executable".into() };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--home").arg(gw.home.dir()).args(["update", "--from", &source, "--chat", chat_id]);
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

    /// Applies `[journal]` retention at start, every [`PRUNE_EVERY`] and at once after a reload
    /// changed it ([`Work::prune_soon`]), off the async workers, with the bounds as they are
    /// then; unfinished messages are never pruned (`Journal::prune`).
    pub fn start_pruning(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = me.prune_soon.notified() => {}
                }
                let retention = me.live().retention.clone();
                let (age, bytes) = (retention.max_age(), retention.max_bytes());
                if age.is_none() && bytes.is_none() {
                    continue;
                }
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
        let live = self.live();
        let history = if msg.platform.is_some() && live.history_turns > 0 {
            let (id, turns, chars) = (msg.id.clone(), live.history_turns, live.history_chars);
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
        steps.push(TraceEvent::at(Step::BackendCalled, std::time::SystemTime::now()).subject(live.agent.name()));
        drop(live);
        let notes = RunNotes::default();
        // The run always streams: into the chat (typing, a growing preview) or into nothing, so
        // that its first token is known for the trace; the reply is the whole answer either way.
        let reach = Delivery::default();
        let shown = msg.platform.as_ref().map(|p| Shown::start(&self.wake, p, &msg.chat_id, &msg.id, &reach));
        let (tx, mut rx) = mpsc::channel::<String>(64);
        let chunks = shown.as_ref().map_or(tx, |s| s.chunks.clone());
        let drain = async move { while rx.recv().await.is_some() {} };
        let run = self.run_traced(gw, msg.platform.as_deref(), req, Some((chunks, reach)), Some(notes.clone()), token);
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
            Err(AgentError::Cancelled) if by_chat => Err(AgentError::Failed(REASON_CANCELLED.into())),
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
        let notice = match &outcome {
            Err(e) => {
                // In the message's span: the line carries its id and platform.
                crate::warn!("message failed: {e}");
                self.failure_notice(msg.platform.as_deref(), &msg.user_id, &id, e)
            }
            Ok(_) => String::new(),
        };
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
                Err(e) => j.fail_traced(&id2, &inc, e, &notice, steps.steps()),
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
        let Some(exporter) = self.live().telemetry.clone() else { return };
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
    /// The deltas are held back until a preview could show them (the adapter previews a reply
    /// only [`PREVIEW_AFTER`] after its start): until then none of the reply has reached the
    /// chat, so a provider that fails meanwhile is failed over and its pieces dropped
    /// (`reach`, crates/agent/src/backend/delivery.rs; issue 27 §6).
    fn start(wake: &Wake, platform: &str, chat: &str, run: &str, reach: &Delivery) -> Shown {
        wake.show(platform, chat, run, Activity::Started);
        let (chunks, mut rx) = mpsc::channel::<String>(64);
        let at = (platform.to_owned(), chat.to_owned(), run.to_owned());
        let (w, (p, c, r), reach) = (wake.clone(), at.clone(), reach.clone());
        let forward = tokio::spawn(async move {
            let show_at = tokio::time::Instant::now() + PREVIEW_AFTER;
            // Taken but not shown yet, with the epoch they were taken in; `None` once shown.
            let mut held: Option<(u64, String)> = Some((0, String::new()));
            loop {
                let waiting = held.as_ref().is_some_and(|(_, t)| !t.is_empty());
                let delta = tokio::select! {
                    d = rx.recv() => match d {
                        Some(d) => Some(d),
                        None => break,
                    },
                    () = tokio::time::sleep_until(show_at), if waiting => None,
                };
                let now_due = tokio::time::Instant::now() >= show_at;
                match (&mut held, delta) {
                    (None, Some(d)) => {
                        if reach.take().is_some_and(|e| reach.reach(e)) {
                            w.show(&p, &c, &r, Activity::Text(d));
                        }
                    }
                    (Some((epoch, text)), d) => {
                        if let Some(d) = d {
                            let Some(e) = reach.take() else { continue };
                            if e != *epoch {
                                // Retracted: what was held belongs to a provider given up on.
                                text.clear();
                                *epoch = e;
                            }
                            text.push_str(&d);
                        }
                        if now_due && !text.is_empty() {
                            if reach.reach(*epoch) {
                                w.show(&p, &c, &r, Activity::Text(std::mem::take(text)));
                                held = None;
                            } else {
                                text.clear();
                            }
                        }
                    }
                    (None, None) => {}
                }
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
        // Before anything is journaled: a message the access policy does not deliver leaves
        // nothing but, for a stranger's direct message, a pairing code (access/).
        match self.gate.admit(adapter, &m, std::time::SystemTime::now()) {
            Admit::Deliver => {}
            Admit::Drop => return Ok(()),
            Admit::Reply { text, requested } => {
                // The reply leaves through the outbox, like every reply.
                j.enqueue(adapter, &m.chat_id, &text).map_err(|e| e.to_string())?;
                self.wake.wake(adapter);
                if let Some(fields) = requested {
                    gw.record("pairing_requested", fields);
                }
                return Ok(());
            }
        }
        let msg = NewMessage {
            chat_id: m.chat_id.clone(),
            user_id: m.user_id.clone(),
            text: m.text.clone(),
            kind: Kind::Async,
        };
        let from = Sender { channel: Channel::Platform(adapter), user_id: &m.user_id };
        let out = match commands::decide(&m.text, from, &self.live().admins) {
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
            CommandOutcome::Refused { reply, .. } => CommandReply { reply, verdict: None },
            CommandOutcome::Run(cmd) => self.command(gw, cmd, &m.text, Some(adapter), &m.chat_id, &m.user_id),
        };
        j.accept_inbound_command(adapter, &m.event_id, &msg, &out.reply).map_err(|e| e.to_string())?;
        self.wake.wake(adapter);
        Ok(())
    }

    fn journal(&self) -> &Arc<dyn Store> {
        &self.journal
    }

    /// Exports the outbox span of the message's trace (its other spans went at its finish).
    fn answered(&self, message_id: &str) {
        let Some(exporter) = self.live().telemetry.clone() else { return };
        match (self.journal.get(message_id), self.journal.trace(message_id)) {
            (Ok(Some(msg)), Ok(events)) => exporter.outbox(&msg, &events),
            (Ok(None), _) => {}
            (Err(e), _) | (_, Err(e)) => crate::warn!("cannot read the trace of {message_id} for export: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_of_events_and_no_more() {
        let mut m = PerMinute::default();
        m.note(10);
        m.note(10);
        m.note(30);
        assert_eq!(m.last_minute(30), 3);
        assert_eq!(m.last_minute(69), 3);
        // Second 10 is a minute old at 70; its bucket is reused by second 70.
        assert_eq!(m.last_minute(70), 1);
        m.note(70);
        assert_eq!(m.last_minute(70), 2);
        assert_eq!(m.last_minute(200), 0);
    }

    #[test]
    fn failures_in_a_row_end_with_a_success_and_ignore_cancels() {
        let m = Metrics::default();
        let fail: Result<(), AgentError> = Err(AgentError::Failed("boom".into()));
        m.count(&fail, "r1");
        m.count(&fail, "r1");
        m.count(&Err::<(), _>(AgentError::Cancelled), "r2");
        assert_eq!(m.runs_json()["failures_in_a_row"], 2);
        assert_eq!(m.runs_json()["last_minute"], 3);
        m.count(&Ok(()), "r3");
        assert_eq!(m.runs_json()["failures_in_a_row"], 0);
        assert_eq!(m.runs_json()["failed"], 2);
    }
}
