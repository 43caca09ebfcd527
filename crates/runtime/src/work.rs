//! Messages in, agent runs out: the engine behind `/v1/messages` and the OpenAI endpoint.
//!
//! - Sync messages run at once (never journaled: the caller holds the connection and gets
//!   the reply or an error) and count as active runs, so the drain waits for them.
//! - Async messages are journaled durably before the 202, run by a bounded worker pool,
//!   and finish as done or failed. A run cut short by a stop, restart or crash is left
//!   `running` in the journal so the next incarnation re-runs it once.
//! - Messages from chat platforms (crates/runtime/src/platforms.rs) are async messages keyed by
//!   their platform event id; their replies leave through the journal's outbox.
//! - Chat commands (`/status`, `/restart`, `/stop`, `/update`, `/help`, `/new`) are answered
//!   immediately, are never counted as runs (the drain never waits on its own requester) and
//!   are journaled as finished commands, never replayed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatewarden_agent::{Agent, AgentError, AgentReply, AgentRequest, Turn};
use gatewarden_control::Requester;
use gatewarden_journal::{JournalError, Store};
use gatewarden_journal::{Kind, NewMessage};
use gatewarden_lifecycle::{fsio, timefmt};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::{Cause, ControlKind};

/// Async runs in flight at once.
const ASYNC_CONCURRENCY: usize = 64;
/// How often the journal's retention bounds are applied (and once at start).
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// `/update`'s outcome notices: `gatewarden update --chat` leaves `<prefix><pid>.json`
/// (`{chat_id, platform?, text}`) in the home; whichever incarnation is asked for that HTTP
/// chat's notices, or relays platform notices to the outbox, claims it with one rename, so it
/// is delivered exactly once.
pub const UPDATE_NOTIFY_PREFIX: &str = ".update_notify.";
/// How often an incarnation with chat platforms looks for `/update` notices to relay.
const NOTICE_POLL: Duration = Duration::from_millis(500);
/// The file a `/restart` leaves for the next incarnation's "back online" notice.
pub const RESTART_NOTIFY_FILE: &str = ".restart_notify.json";

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

    /// `{"at", "reason"}` of the last failed run, or null.
    pub fn last_failure_json(&self) -> serde_json::Value {
        match &*self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((at, why)) => serde_json::json!({"at": gatewarden_lifecycle::timefmt::format(*at), "reason": why}),
            None => serde_json::Value::Null,
        }
    }
}

/// A parsed chat command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Status,
    Restart,
    Stop,
    Help,
    /// Start a fresh conversation in this chat.
    New,
    Update,
}

impl Command {
    /// What the user typed, for replies.
    pub fn name(self) -> &'static str {
        match self {
            Command::Status => "/status",
            Command::Restart => "/restart",
            Command::Stop => "/stop",
            Command::Help => "/help",
            Command::New => "/new",
            Command::Update => "/update",
        }
    }

    /// Whether only an admin may run it (see [`Work::may_run`]).
    pub fn needs_admin(self) -> bool {
        matches!(self, Command::Restart | Command::Stop | Command::Update)
    }
}

/// `/restart`, `/restart@botname` and `/restart now` are commands; `/unknown` and text that
/// merely mentions `/restart` are ordinary messages.
pub fn parse_command(text: &str) -> Option<Command> {
    let word = text.split_whitespace().next()?;
    let name = word.strip_prefix('/')?.split('@').next()?;
    Some(match name.to_ascii_lowercase().as_str() {
        "status" => Command::Status,
        "restart" => Command::Restart,
        "stop" => Command::Stop,
        "help" => Command::Help,
        "new" => Command::New,
        "update" => Command::Update,
        _ => return None,
    })
}

/// What a command does beyond its reply.
pub struct CommandOutcome {
    pub reply: String,
    pub then: Option<Cause>,
}

pub struct Work {
    pub agent: Box<dyn Agent>,
    /// The home's SQLite journal, or the cluster's PostgreSQL one (`[cluster]`; lib.rs).
    pub journal: Arc<dyn Store>,
    pub admins: Vec<String>,
    pub api_token: Option<String>,
    /// The listener's limits and accepted `Host` names.
    pub http: gatewarden_config::HttpConfig,
    /// Retention of finished journal rows.
    pub retention: gatewarden_config::JournalConfig,
    pub model: String,
    pub metrics: Metrics,
    /// Cancelled when the drain budget runs out.
    pub cancel: CancellationToken,
    noticed: Mutex<HashSet<String>>,
    notices: Mutex<HashMap<String, Vec<String>>>,
    queue: mpsc::UnboundedSender<String>,
    queue_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    causes: Mutex<Option<mpsc::UnboundedSender<Cause>>>,
    run_counter: AtomicU64,
    /// Whether `Host` headers are checked: always on a loopback listener (DNS rebinding), and
    /// on another listener once `[http] allowed_hosts` names its public names.
    host_check: bool,
    /// Set when the main loop decides how this incarnation ends: a restart comes back, a stop
    /// does not, and the notice says which.
    restarting: std::sync::atomic::AtomicBool,
    platforms: std::sync::OnceLock<Arc<crate::platforms::Platforms>>,
    /// `[agent] history_turns`.
    pub history_turns: usize,
    /// `[agent] history_chars`.
    pub history_chars: usize,
    /// `[update] source`: what `/update` installs.
    update_source: Option<String>,
    /// The home, known from the first command or boot notice (for `/update`'s notices).
    home: std::sync::OnceLock<std::path::PathBuf>,
    /// Platform chats told that their queue is full (`platform\0chat`): told once while it
    /// stays full, so a flood past the cap cannot grow the outbox with notices instead.
    full_told: Mutex<HashSet<String>>,
}

impl Work {
    pub fn new(
        agent: Box<dyn Agent>,
        journal: Arc<dyn Store>,
        config: &gatewarden_config::Config,
        loopback: bool,
    ) -> Work {
        let (queue, rx) = mpsc::unbounded_channel();
        Work {
            model: format!("gatewarden-{}", agent.name()),
            agent,
            journal,
            admins: config.admins.clone(),
            api_token: config.api_token.clone(),
            http: config.http.clone(),
            retention: config.journal.clone(),
            host_check: loopback || !config.http.allowed_hosts.is_empty(),
            metrics: Metrics::default(),
            cancel: CancellationToken::new(),
            noticed: Mutex::new(HashSet::new()),
            notices: Mutex::new(HashMap::new()),
            queue,
            queue_rx: Mutex::new(Some(rx)),
            causes: Mutex::new(None),
            run_counter: AtomicU64::new(0),
            restarting: std::sync::atomic::AtomicBool::new(true),
            platforms: std::sync::OnceLock::new(),
            history_turns: config.agent.history_turns,
            history_chars: config.agent.history_chars,
            update_source: config.update.source.clone(),
            home: std::sync::OnceLock::new(),
            full_told: Mutex::new(HashSet::new()),
        }
    }

    /// Why a new message of `(platform, chat)` is refused: past the `[journal]` queue caps
    /// (`None`: take it). Blocking (the journal), like the callers' other journal steps.
    pub fn queue_refusal(&self, platform: Option<&str>, chat: &str) -> Result<Option<String>, JournalError> {
        let (mine, all) = self.journal.queued(platform, chat)?;
        Ok(self.retention.queue_refusal(mine, all))
    }

    /// Records whether a platform chat's queue is full; `true` when it just became full (tell
    /// it once).
    pub fn note_full(&self, platform: &str, chat: &str, full: bool) -> bool {
        let key = format!("{platform}\0{chat}");
        let mut told = self.full_told.lock().unwrap_or_else(|p| p.into_inner());
        if full {
            told.insert(key)
        } else {
            told.remove(&key);
            false
        }
    }

    /// Attaches the chat platform adapters (once, at start-up).
    pub fn set_platforms(&self, p: Arc<crate::platforms::Platforms>) {
        let _ = self.platforms.set(p);
    }

    /// The chat platform adapters (none unless configured).
    pub fn platforms(&self) -> &Arc<crate::platforms::Platforms> {
        static NONE: std::sync::OnceLock<Arc<crate::platforms::Platforms>> = std::sync::OnceLock::new();
        self.platforms.get().unwrap_or_else(|| NONE.get_or_init(Default::default))
    }

    /// Queues a journaled message id for the async worker.
    pub fn enqueue(&self, id: String) {
        let _ = self.queue.send(id);
    }

    /// Connects chat commands to the main loop.
    pub fn set_causes(&self, tx: mpsc::UnboundedSender<Cause>) {
        if let Ok(mut g) = self.causes.lock() {
            *g = Some(tx);
        }
    }

    /// Whether `user_id`, as authenticated by its channel, may run admin commands (`/restart`,
    /// `/stop`): only a listed admin.
    pub fn may_command(&self, user_id: &str) -> bool {
        self.admins.iter().any(|a| a == user_id)
    }

    /// The HTTP form of [`Work::may_command`]: a user id in a request body is only an identity
    /// when the request carried the API token, so without a token nobody is an admin over HTTP
    /// (the local owner uses the control socket: `gatewarden stop`, `gatewarden send /stop`).
    pub fn may_command_http(&self, user_id: &str) -> bool {
        self.api_token.is_some() && self.may_command(user_id)
    }

    /// The one rule for who may run which command: `/restart`, `/stop` and `/update` need an
    /// admin of the channel the command came through — a chat platform's `[[platform]] admins`
    /// (its identities are the platform's), or over HTTP a top-level `admins` entry that came
    /// with the API token. Everything else is for everyone.
    pub fn may_run(&self, cmd: Command, platform: Option<&str>, user_id: &str) -> bool {
        !cmd.needs_admin()
            || match platform {
                Some(p) => self.platforms().is_admin(p, user_id),
                None => self.may_command_http(user_id),
            }
    }

    /// Whether a request's `Host` header names this gateway: a loopback name, the bound
    /// address, or one of `[http] allowed_hosts` (a configured name without a port matches
    /// every port).
    pub fn host_allowed(&self, host: &str, bound: Option<&str>) -> bool {
        if !self.host_check {
            return true;
        }
        let host = host.trim().to_ascii_lowercase();
        let name = host_name(&host);
        if matches!(name, "localhost" | "127.0.0.1" | "[::1]") {
            return true;
        }
        if let Some(b) = bound.and_then(|b| b.parse::<std::net::SocketAddr>().ok())
            && !b.ip().is_unspecified()
            && name == host_name(&b.to_string())
        {
            return true;
        }
        self.http.allowed_hosts.iter().any(|a| {
            let a = a.to_ascii_lowercase();
            if host_name(&a) == a { a == name } else { a == host }
        })
    }

    pub fn next_run_id(&self, incarnation: &str) -> String {
        format!("run-{incarnation}-{}", self.run_counter.fetch_add(1, Ordering::Relaxed))
    }

    /// Records whether this drain ends in a restart (the default) or a stop.
    pub fn set_restarting(&self, restarting: bool) {
        self.restarting.store(restarting, Ordering::Relaxed);
    }

    /// The first drain notice for `chat` in this drain, `None` afterwards.
    pub fn restarting_notice(&self, chat: &str) -> Option<String> {
        let first = self.noticed.lock().map(|mut s| s.insert(chat.to_owned())).unwrap_or(false);
        first.then(|| {
            if self.restarting.load(Ordering::Relaxed) {
                "the gateway is restarting; send your message again in a moment".to_string()
            } else {
                "the gateway is stopping; your message was not processed".to_string()
            }
        })
    }

    pub fn push_notice(&self, chat: &str, text: String) {
        if let Ok(mut n) = self.notices.lock() {
            n.entry(chat.to_owned()).or_default().push(text);
        }
    }

    pub fn take_notices(&self, chat: &str) -> Vec<String> {
        let mut out = self.notices.lock().ok().and_then(|mut n| n.remove(chat)).unwrap_or_default();
        if let Some(home) = self.home.get() {
            for n in claim_update_notices(home, |n| n.platform.is_none() && n.chat == chat) {
                n.done();
                out.push(n.text);
            }
        }
        out
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
        gw: &crate::gateway::Gateway,
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
        gw: &crate::gateway::Gateway,
        req: AgentRequest,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<String, AgentError> {
        self.run_reply(gw, req, chunks).await.map(|r| r.text)
    }

    /// [`Work::run_sync`] with the whole reply (its usage too). Provider state changes the run
    /// caused (openai failover) go to the ledger.
    pub async fn run_reply(
        self: &Arc<Self>,
        gw: &crate::gateway::Gateway,
        req: AgentRequest,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        let _run = gw.runs.begin();
        let token = self.cancel.child_token();
        let _cancel_on_drop = token.clone().drop_guard();
        let me = Arc::clone(self);
        let handle = tokio::spawn(async move {
            match chunks {
                Some(tx) => me.agent.run_streaming(req, token, tx).await,
                None => me.agent.run(req, token).await,
            }
        });
        let r = handle.await.unwrap_or_else(|e| Err(AgentError::Failed(format!("run panicked: {e}"))));
        self.metrics.count(&r);
        if let Ok(AgentReply { usage: Some(u), .. }) = &r {
            self.metrics.prompt_tokens.fetch_add(u.prompt_tokens, Ordering::Relaxed);
            self.metrics.completion_tokens.fetch_add(u.completion_tokens, Ordering::Relaxed);
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

    /// Handles a chat command from the HTTP API.
    pub fn command(&self, gw: &crate::gateway::Gateway, cmd: Command, chat_id: &str, user_id: &str) -> CommandOutcome {
        self.command_from(gw, cmd, None, chat_id, user_id)
    }

    /// Handles a chat command; `platform` is the adapter it came through (`None`: HTTP).
    pub fn command_from(
        &self,
        gw: &crate::gateway::Gateway,
        cmd: Command,
        platform: Option<&str>,
        chat_id: &str,
        user_id: &str,
    ) -> CommandOutcome {
        if !self.may_run(cmd, platform, user_id) {
            let reply = match platform {
                Some(_) => format!("{} is for this platform's admins ([[platform]] admins in config.toml)", cmd.name()),
                None => format!("{} is for the admins listed in config.toml", cmd.name()),
            };
            return CommandOutcome { reply, then: None };
        }
        let requester = Requester {
            pid: std::process::id(),
            argv: vec![format!("chat:{chat_id}"), format!("user:{user_id}")],
            channel: "chat".into(),
        };
        match cmd {
            Command::Help => CommandOutcome {
                reply: "commands: /status, /new (fresh conversation), /restart (admins), /stop (admins), /update (admins), /help".into(),
                then: None,
            },
            Command::New => {
                let reply = match platform.map(|p| self.journal.new_session(p, chat_id)) {
                    Some(Err(e)) => format!("cannot start a new conversation: {e}"),
                    // The HTTP API keeps no history: each /v1/chat/completions call brings its own.
                    _ => "new conversation: earlier messages are forgotten".into(),
                };
                CommandOutcome { reply, then: None }
            }
            Command::Status => {
                let s = gw.status();
                CommandOutcome {
                    reply: format!(
                        "gatewarden {} · incarnation {} · {} · {} active run(s) · up {:.0}s",
                        s.version.unwrap_or_default(),
                        s.incarnation.unwrap_or_default(),
                        s.state.unwrap_or_default(),
                        s.active_runs.unwrap_or(0),
                        s.uptime_s.unwrap_or(0.0)
                    ),
                    then: None,
                }
            }
            // Already leaving (a drain for a stop or a restart): the main loop no longer takes
            // requests, so the reply says what happens instead, and the ledger has it (issue 22,
            // item 7: "restarting…" was answered, and nothing was recorded or done).
            Command::Restart if gw.phase.get() != gatewarden_lifecycle::records::GatewayState::Running => {
                let joined = if self.restarting.load(Ordering::Relaxed) { "restart" } else { "stop" };
                let who = json!({"pid": requester.pid, "argv": requester.argv, "channel": requester.channel});
                gw.record("restart_requested", json!({"requester": who, "reason": "restart", "joined": joined}));
                let reply = match joined {
                    "restart" => "a restart is already under way",
                    _ => "the gateway is stopping; it will not restart (start it again with `gatewarden start`)",
                };
                CommandOutcome { reply: reply.into(), then: None }
            }
            Command::Restart => {
                let note = json!({"chat_id": chat_id, "user_id": user_id, "platform": platform, "requested_at": timefmt::now(), "incarnation": gw.me.id});
                if let Err(e) = fsio::write_json(&gw.home.dir().join(RESTART_NOTIFY_FILE), &note) {
                    crate::warn!("cannot record the restart requester: {e}");
                }
                CommandOutcome {
                    reply: "restarting…".into(),
                    then: Some(Cause::Control { kind: ControlKind::Restart, requester }),
                }
            }
            Command::Stop => {
                crate::record_operator_stop(gw, &requester.channel);
                CommandOutcome { reply: "stopping…".into(), then: Some(Cause::Control { kind: ControlKind::Stop, requester }) }
            }
            Command::Update => CommandOutcome { reply: self.start_update(gw, platform, chat_id, user_id), then: None },
        }
    }

    /// `/update`: a detached `gatewarden update --from <[update] source> --chat <chat>`. It
    /// restarts us through the restart ladder like `/restart` (never a run, so the drain does
    /// not wait on it) and leaves exactly one outcome notice for this chat: an HTTP chat
    /// collects it with its notices, a platform chat gets it through the outbox
    /// ([`Work::relay_update_notices`]). The caller checked [`Work::may_run`].
    fn start_update(
        &self,
        gw: &crate::gateway::Gateway,
        platform: Option<&str>,
        chat_id: &str,
        user_id: &str,
    ) -> String {
        let _ = self.home.set(gw.home.dir().to_path_buf());
        let Some(source) = &self.update_source else {
            return "no release to install: set [update] source in config.toml".into();
        };
        let Ok(exe) = gatewarden_lifecycle::platform::spawn::self_exe() else {
            return "cannot locate the gatewarden executable".into();
        };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--home").arg(gw.home.dir()).args(["update", "--from", source, "--chat", chat_id]);
        if let Some(p) = platform {
            cmd.args(["--chat-platform", p]);
        }
        // Not one of our runs: the next incarnation's sweep must not kill it.
        cmd.env_remove(crate::RUN_TAG);
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        gatewarden_lifecycle::platform::spawn::detach(&mut cmd, None);
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

    /// Hands a command's follow-up to the main loop (after its reply is on its way).
    pub fn send_cause(&self, cause: Cause) {
        if let Some(tx) = self.causes.lock().ok().and_then(|g| g.clone()) {
            let _ = tx.send(cause);
        }
    }

    /// `/update`'s outcome notices for platform chats: the updater leaves them in the home
    /// while some incarnation (the new one, or the old one after a rollback) runs, so every
    /// incarnation with platforms looks for them every [`NOTICE_POLL`] and queues each one,
    /// claimed by one rename, in the outbox (which survives a restart).
    fn relay_update_notices(&self) {
        let (Some(home), false) = (self.home.get().cloned(), self.platforms().is_empty()) else { return };
        let (journal, platforms) = (Arc::clone(&self.journal), Arc::clone(self.platforms()));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(NOTICE_POLL);
            loop {
                tick.tick().await;
                let (home, journal, platforms) = (home.clone(), Arc::clone(&journal), Arc::clone(&platforms));
                let _ = tokio::task::spawn_blocking(move || {
                    for n in claim_update_notices(&home, |n| n.platform.is_some()) {
                        let p = n.platform.clone().unwrap_or_default();
                        // Durable in the outbox before the file goes; a journal error puts it
                        // back for the next look.
                        match journal.enqueue(&p, &n.chat, &n.text) {
                            Ok(_) => {
                                n.done();
                                platforms.wake(&p);
                            }
                            Err(e) => {
                                crate::warn!("cannot queue the /update notice for {p}: {e}");
                                n.unclaim();
                            }
                        }
                    }
                })
                .await;
            }
        });
    }

    /// At boot: turn a predecessor's `/restart` record into one "back online" notice, and
    /// start relaying `/update` notices to platform chats.
    pub fn restart_notice(&self, gw: &crate::gateway::Gateway) {
        let _ = self.home.set(gw.home.dir().to_path_buf());
        self.relay_update_notices();
        let path = gw.home.dir().join(RESTART_NOTIFY_FILE);
        let Some(v) = fsio::read_json::<Value>(&path).ok() else {
            let _ = fsio::remove_if_exists(&path);
            return;
        };
        if v.get("incarnation").and_then(Value::as_str) == Some(gw.me.id.as_str()) {
            return; // our own, written just now
        }
        let _ = fsio::remove_if_exists(&path);
        if let Some(chat) = v.get("chat_id").and_then(Value::as_str) {
            let text = format!("back online: gatewarden {}, incarnation {}", gatewarden_lifecycle::VERSION, gw.me.id);
            match v.get("platform").and_then(Value::as_str) {
                // Asked from a chat platform: the notice goes to that chat, through the outbox.
                Some(p) => match self.journal.enqueue(p, chat, &text) {
                    Ok(_) => self.platforms().wake(p),
                    Err(e) => crate::warn!("cannot queue the back-online notice for {p}: {e}"),
                },
                None => self.push_notice(chat, text),
            }
        }
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
    pub fn start_worker(self: &Arc<Self>, gw: Arc<crate::gateway::Gateway>) {
        self.start_pruning();
        let Some(mut rx) = self.queue_rx.lock().ok().and_then(|mut g| g.take()) else { return };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.recover_into_queue(&gw).await;
            let slots = Arc::new(Semaphore::new(ASYNC_CONCURRENCY));
            while let Some(id) = rx.recv().await {
                if gw.phase.get() != gatewarden_lifecycle::records::GatewayState::Running || !gw.is_active() {
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
    pub fn resume_queued(self: &Arc<Self>, gw: Arc<crate::gateway::Gateway>) {
        let me = Arc::clone(self);
        tokio::spawn(async move { me.recover_into_queue(&gw).await });
    }

    /// Recovers interrupted runs and queues every queued id. A failure is retried while this
    /// gateway may still run work: on the cluster's store a transient error at promotion would
    /// otherwise leave the messages an earlier active accepted unrun for this whole term.
    async fn recover_into_queue(self: &Arc<Self>, gw: &crate::gateway::Gateway) {
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
            let running = gw.phase.get() == gatewarden_lifecycle::records::GatewayState::Running;
            if !running || !gw.is_active() {
                return;
            }
        }
    }

    async fn run_async(self: &Arc<Self>, gw: &crate::gateway::Gateway, id: String) {
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
        let req = AgentRequest {
            run_id: msg.id.clone(),
            chat_id: msg.chat_id.clone(),
            user_id: msg.user_id.clone(),
            text: msg.text.clone(),
            history,
        };
        let r = self.run_reply(gw, req, None).await;
        if matches!(r, Err(AgentError::Cancelled)) {
            // Interrupted by the drain: stays `running` for the next incarnation to re-run once.
            return;
        }
        let inc = gw.me.id.clone();
        let outcome = r.map_err(|e| e.to_string());
        let done = self
            .journal_step(gw, move |j| match &outcome {
                Ok(reply) => j.complete_with_usage(
                    &id,
                    &inc,
                    &reply.text,
                    reply.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
                ),
                Err(e) => j.fail(&id, &inc, e),
            })
            .await;
        if let Err(e) = done {
            crate::error!("journal update failed: {e}");
        }
        if let Some(p) = &msg.platform {
            self.platforms().wake(p);
        }
    }

    /// Ends the drain's patience: every active run is cancelled.
    pub fn cancel_all(&self) {
        self.cancel.cancel();
    }

    pub fn reset_notices_for_drain(&self) {
        if let Ok(mut s) = self.noticed.lock() {
            s.clear();
        }
    }
}

/// The name part of a `Host` value (`name[:port]` or `[v6][:port]`), brackets kept.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Constant-time comparison for bearer tokens (the length is not secret).
pub fn token_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a client should wait before retrying during a drain.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// One claimed `/update` outcome notice (`.update_notify.<pid>.json`, written by
/// `cmd/update.rs`).
struct UpdateNotice {
    /// The adapter whose chat asked; `None` for an HTTP chat.
    platform: Option<String>,
    chat: String,
    text: String,
    /// Where it was, and where it is while claimed (no other claimer looks there).
    path: std::path::PathBuf,
    claimed: std::path::PathBuf,
}

impl UpdateNotice {
    /// Delivered (or durably queued): the file goes.
    fn done(&self) {
        let _ = std::fs::remove_file(&self.claimed);
    }

    /// Not delivered: back where the next look finds it.
    fn unclaim(&self) {
        let _ = std::fs::rename(&self.claimed, &self.path);
    }
}

/// Claims (renames away) the `/update` outcome notices that `want` picks; the caller removes
/// each once it is delivered ([`UpdateNotice::done`]).
fn claim_update_notices(home: &std::path::Path, want: impl Fn(&UpdateNotice) -> bool) -> Vec<UpdateNotice> {
    let Ok(dir) = std::fs::read_dir(home) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(UPDATE_NOTIFY_PREFIX) || !name.ends_with(".json") {
            continue;
        }
        let Some(v) = fsio::read_json::<Value>(&entry.path()).ok() else { continue };
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let n = UpdateNotice {
            platform: field("platform"),
            chat: field("chat_id").unwrap_or_default(),
            text: field("text").unwrap_or_default(),
            path: entry.path(),
            claimed: home.join(format!(".claimed{name}")),
        };
        if want(&n) && std::fs::rename(&n.path, &n.claimed).is_ok() {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP chats collect only their own notices, the platform relay only platform ones; a
    /// claimed notice is seen by nobody else, and an undelivered one comes back.
    #[test]
    fn update_notices_are_claimed_by_their_transport_once() {
        let home = tempfile::tempdir().unwrap();
        let write = |pid: u32, v: Value| {
            fsio::write_json(&home.path().join(format!("{UPDATE_NOTIFY_PREFIX}{pid}.json")), &v).unwrap();
        };
        write(1, json!({"chat_id": "A", "text": "http A"}));
        write(2, json!({"chat_id": "7", "platform": "telegram", "text": "tg 7"}));
        write(3, json!({"chat_id": "B", "platform": null, "text": "http B"}));
        let http_a = claim_update_notices(home.path(), |n| n.platform.is_none() && n.chat == "A");
        assert_eq!(http_a.iter().map(|n| n.text.as_str()).collect::<Vec<_>>(), ["http A"]);
        http_a[0].done();
        let relay = claim_update_notices(home.path(), |n| n.platform.is_some());
        assert_eq!(relay.len(), 1);
        assert_eq!((relay[0].platform.as_deref(), relay[0].chat.as_str()), (Some("telegram"), "7"));
        assert!(claim_update_notices(home.path(), |n| n.platform.is_some()).is_empty(), "claimed once");
        relay[0].unclaim();
        let again = claim_update_notices(home.path(), |n| n.platform.is_some());
        assert_eq!(again.len(), 1, "an undelivered notice comes back");
        again[0].done();
        assert!(claim_update_notices(home.path(), |n| n.platform.is_some()).is_empty());
        let left: Vec<String> =
            std::fs::read_dir(home.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(left, [format!("{UPDATE_NOTIFY_PREFIX}3.json")], "only chat B's notice is left");
    }

    #[test]
    fn commands_are_recognised_only_at_the_start() {
        assert_eq!(parse_command("/restart"), Some(Command::Restart));
        assert_eq!(parse_command("  /RESTART now"), Some(Command::Restart));
        assert_eq!(parse_command("/stop@gatewarden_bot"), Some(Command::Stop));
        assert_eq!(parse_command("/status"), Some(Command::Status));
        assert_eq!(parse_command("/help"), Some(Command::Help));
        assert_eq!(parse_command("/new"), Some(Command::New));
        assert_eq!(parse_command("please /restart"), None);
        assert_eq!(parse_command("/unknown"), None);
        assert_eq!(parse_command(""), None);
    }

    #[test]
    fn host_names() {
        assert_eq!(host_name("localhost:7878"), "localhost");
        assert_eq!(host_name("[::1]:7878"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("evil.example"), "evil.example");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn token_comparison() {
        assert!(token_eq(b"secret", b"secret"));
        assert!(!token_eq(b"secret", b"secreT"));
        assert!(!token_eq(b"secret", b"secret2"));
        assert!(!token_eq(b"", b"x"));
    }
}
