//! Messages in, agent runs out: the engine behind `/v1/messages`, the OpenAI endpoint and the
//! chat platforms' [`Intake`](crate::intake::Intake).
//!
//! - Sync messages run at once and count as active runs, so the drain waits for them. A
//!   one-shot one is never journaled (the caller holds the connection and gets the reply or an
//!   error); one of a conversation (`/v1/messages` with a `chat_id`, a stored `/v1/responses`)
//!   is journaled already running ([`Work::run_journaled`]), so it is later messages' history.
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
//!
//! `Work` is split by job: [`intake`] (how messages come in and are queued), [`run`] (one run,
//! sync or async, from claim to reply), [`commands`] (chat commands, approvals, pairing,
//! `/update`), [`housekeeping`] (boot notices, retention) and [`metrics`] (the counters).

mod commands;
mod housekeeping;
mod intake;
mod metrics;
mod run;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use gatewarden_agent::Agent;
use gatewarden_agent::backend::delivery::Delivery;
use gatewarden_journal::{JournalError, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use self::commands::{CommandReply, DecidedBy};
pub use self::metrics::{ChatUsage, MAX_USAGE_CHATS, Metrics, PerMinute, uptime_second};
pub(crate) use self::run::files_named;
pub use self::run::{REASON_CANCELLED, REASON_SYNC_INTERRUPTED};
use crate::access::pairing::Keeper;
use crate::access::{Gate, Policies};
use crate::commands::Admins;
use crate::gateway::Gateway;
use crate::intake::Wake;
use crate::notices::Notices;

/// Where a run streams its reply: the chunks, and how far they got towards the caller (the
/// consumer [`Delivery::take`]s each chunk and [`Delivery::reach`]es before showing it).
pub type Stream = (mpsc::Sender<String>, Delivery);

/// How long a client should wait before retrying during a drain.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

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
    /// `[attachments]`: the download bounds, read per message.
    pub attachments: gatewarden_config::AttachmentsConfig,
    /// `[agent.transcription]`: voice and audio files become text for every backend (run.rs);
    /// replaced with the agent (its keys are read by the same load).
    pub transcriber: Option<Arc<gatewarden_agent::Transcriber>>,
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
            attachments: config.attachments.clone(),
            // With its keys: set by the gateway's preparation ([`Work::set_transcriber`]).
            transcriber: None,
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

/// How the HTTP API's rows (no platform) name their conversation in `chat_id`.
pub mod http_chat {
    /// The `chat_id` prefix of a `/v1/responses` row: what follows is the message id of the
    /// response it continues (`previous_response_id`), empty for the first of a chain. A
    /// `/v1/messages` caller may not use it.
    pub const RESPONSES: &str = "responses:";

    /// Whether `/v1/messages` rows of `chat_id` form a conversation with history and `/new`:
    /// a one-shot call has none (`""`), and a response row continues its chain instead.
    pub fn is_conversation(chat_id: &str) -> bool {
        !chat_id.is_empty() && !chat_id.starts_with(RESPONSES)
    }

    /// For a `/v1/responses` row's `chat_id`: the message id of the response it continues
    /// (`Some("")`: none).
    pub fn continues(chat_id: &str) -> Option<&str> {
        chat_id.strip_prefix(RESPONSES)
    }
}

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

    /// `[agent.transcription]` as prepared with its keys (lib.rs `prepare`; reload.rs replaces
    /// it with the agent).
    pub fn set_transcriber(&self, t: Option<gatewarden_agent::Transcriber>) {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        let mut next = Live::clone(&live);
        next.transcriber = t.map(Arc::new);
        *live = Arc::new(next);
    }

    /// The model name `/v1/models` and completions report: the backend's.
    pub fn model(&self) -> String {
        format!("gatewarden-{}", self.live().agent.name())
    }

    /// With `[agent] hermes_home`: the hermes gateway this gateway runs.
    pub fn with_hermes(mut self, spec: Option<crate::hermes::Spec>) -> Work {
        self.hermes = spec;
        self
    }

    /// `[update] source`: what chat `/update` (and the dashboard's Update) installs.
    pub fn update_source(&self) -> Option<String> {
        self.live().update_source.clone()
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
}
