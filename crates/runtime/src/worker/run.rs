//! One run, from the message to its reply: a sync run for an HTTP caller, and the async worker
//! that claims journaled messages, runs them with their history, shows their progress in the
//! chat, and records the outcome with its trace.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gatewarden_agent::backend::delivery::{self, Delivery};
use gatewarden_agent::backend::trace::{Note, RunNotes};
use gatewarden_agent::{AgentError, AgentReply, AgentRequest, Turn};
use gatewarden_journal::{Message, NewMessage, RunSteps, Step, TraceEvent};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_platforms::Activity;
use gatewarden_platforms::skeleton::progress::PREVIEW_AFTER;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Stream, Work, chat_key};
use crate::commands::{Channel, Sender};
use crate::gateway::Gateway;
use crate::intake::Wake;

/// Async runs in flight at once.
const ASYNC_CONCURRENCY: usize = 64;

/// Why a run a chat cancelled failed.
pub const REASON_CANCELLED: &str = "cancelled (/cancel)";

/// Why a journaled run whose caller waited ([`Work::run_journaled`]) failed when the drain
/// cancelled it: the caller was answered 503 and may send it again.
pub const REASON_SYNC_INTERRUPTED: &str = "interrupted by a stop or restart (the caller was answered 503)";

impl Work {
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

    /// Starts the async worker: recovers interrupted runs (once each), then runs queued ids;
    /// and the journal's retention.
    pub fn start_worker(self: &Arc<Self>, gw: Arc<Gateway>) {
        self.start_pruning(gatewarden_platforms::attachments::Store::in_home(gw.home.dir()));
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

    /// One journaled message: claimed for this incarnation, run with its conversation, and
    /// finished in the journal with its trace. A run the drain cancelled is left `running` for
    /// the next incarnation to re-run once.
    async fn run_message(self: &Arc<Self>, gw: &Gateway, id: String) {
        let Some(msg) = self.claim(gw, &id).await else { return };
        tracing::Span::current().record("platform", msg.platform.as_deref().unwrap_or("http"));
        let (req, mut steps) = self.request_for(gw, &msg).await;
        let notes = RunNotes::default();
        let r = self.run_in_chat(gw, &msg, req, notes.clone(), None).await;
        if matches!(r, Err(AgentError::Cancelled)) {
            // Interrupted by the drain: stays `running` for the next incarnation to re-run once.
            return;
        }
        for n in noted(notes.take()) {
            steps.push(n);
        }
        self.finish(gw, &msg, r.map_err(|e| e.to_string()), steps).await;
    }

    /// Claims message `id` for this incarnation and reads it; `None`: another run has it, it is
    /// gone, or the journal failed (logged).
    async fn claim(&self, gw: &Gateway, id: &str) -> Option<Message> {
        let (inc, id2) = (gw.me.id.clone(), id.to_owned());
        match self.journal_step(gw, move |j| j.claim(&id2, &inc)).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                crate::error!("journal claim of {id} failed: {e}");
                return None;
            }
        }
        let id2 = id.to_owned();
        match self.journal_step(gw, move |j| j.get(&id2)).await {
            Ok(m) => m,
            Err(e) => {
                crate::error!("journal read of {id} failed: {e}");
                None
            }
        }
    }

    /// The agent's request for `msg`, with its conversation and session, and the trace's first
    /// step (the backend called), under the settings as they are now.
    async fn request_for(&self, gw: &Gateway, msg: &Message) -> (AgentRequest, RunSteps) {
        let live = self.live();
        let mut history = self.history(msg, live.history_turns, live.history_chars).await;
        if msg.platform.is_some() && live.transcriber.is_some() {
            transcribed_history(gw, &mut history);
            // Within the budget as the turns now read.
            history = gatewarden_agent::within_budget(history, live.history_chars);
        }
        let session_started = self.session_started(msg).await;
        let (text, attachments) = attachments_of(gw, msg, live.transcriber.as_deref(), &self.cancel).await;
        let req = AgentRequest {
            run_id: msg.id.clone(),
            chat_id: msg.chat_id.clone(),
            user_id: msg.user_id.clone(),
            text,
            history,
            platform: msg.platform.clone(),
            session_started,
            http_conversation: msg.platform.is_none() && super::http_chat::is_conversation(&msg.chat_id),
            attachments,
        };
        let mut steps = RunSteps::default();
        steps.push(TraceEvent::at(Step::BackendCalled, std::time::SystemTime::now()).subject(live.agent.name()));
        (req, steps)
    }

    /// A chat's conversation: the session's last `turns`, within `chars`; for a `/v1/responses`
    /// row, the chain of responses it continues. None for a one-shot HTTP call, or when it
    /// cannot be read (the run goes on without it).
    async fn history(&self, msg: &Message, turns: usize, chars: usize) -> Vec<Turn> {
        if turns == 0 {
            return Vec::new();
        }
        if msg.platform.is_none() {
            if let Some(previous) = super::http_chat::continues(&msg.chat_id) {
                return match self.response_chain(previous, turns, chars).await {
                    Ok(turns) => turns,
                    Err(e) => {
                        crate::warn!("cannot read the responses {} continues: {e}; running it without history", msg.id);
                        Vec::new()
                    }
                };
            }
            if !super::http_chat::is_conversation(&msg.chat_id) {
                return Vec::new();
            }
        }
        let id = msg.id.clone();
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
    }

    /// The stored responses a `/v1/responses` call continues, from `previous` back: the last
    /// `turns` answered ones, oldest first, within `chars`. A response id that names no stored
    /// response ends the chain (the handler checks the first one before it runs).
    pub async fn response_chain(&self, previous: &str, turns: usize, chars: usize) -> Result<Vec<Turn>, String> {
        let previous = previous.to_owned();
        let pairs = self
            .with_journal(move |j| {
                let mut pairs = Vec::new();
                let mut next = Some(previous);
                // Bounded: a chain never loops (each row names an older one), and at most
                // `turns` answered rows plus as many unanswered ones are read.
                let mut reads = 0usize;
                while let Some(id) = next.take().filter(|i| !i.is_empty()) {
                    reads += 1;
                    let Some(m) = j.get(&id)? else { break };
                    let Some(prev) = super::http_chat::continues(&m.chat_id).filter(|_| m.platform.is_none()) else {
                        break;
                    };
                    if let (gatewarden_journal::State::Done, Some(reply)) = (m.state, m.reply) {
                        pairs.push((m.text, reply));
                    }
                    if pairs.len() >= turns || reads >= turns.saturating_mul(2) {
                        break;
                    }
                    next = Some(prev.to_owned());
                }
                pairs.reverse();
                Ok(pairs)
            })
            .await?;
        Ok(gatewarden_agent::within_budget(
            pairs.into_iter().flat_map(|(q, a)| [Turn::new("user", q), Turn::new("assistant", a)]).collect(),
            chars,
        ))
    }

    /// An HTTP API message whose caller waits for its reply (`/v1/messages` with a `chat_id`,
    /// `/v1/responses` with `store`), `id` the row [`Self::journal_waiting`] made: run at once
    /// with its conversation and finished in the journal, so later messages have it as history
    /// after a restart or a failover. `system` goes first and `inline` (the caller's own
    /// earlier turns) last in its history. Returns the run's outcome; `Err`: the journal
    /// failed. A run the drain cancels is failed (its caller is answered 503), never re-run;
    /// one a crash cuts short is re-run by the next incarnation, as an async message is.
    pub async fn run_journaled(
        self: &Arc<Self>,
        gw: &Gateway,
        id: &str,
        (system, inline): (Option<String>, Vec<Turn>),
        chunks: Option<Stream>,
    ) -> Result<Result<AgentReply, AgentError>, String> {
        let id2 = id.to_owned();
        let msg = match self.journal_step(gw, move |j| j.get(&id2)).await {
            Ok(Some(m)) => m,
            Ok(None) => return Err(format!("message {id} is gone")),
            Err(e) => return Err(e.to_string()),
        };
        let (mut req, mut steps) = self.request_for(gw, &msg).await;
        let mut history: Vec<Turn> = system.map(|s| Turn::new("system", s)).into_iter().collect();
        history.append(&mut req.history);
        history.extend(inline);
        req.history = history;
        let notes = RunNotes::default();
        let r = self.run_in_chat(gw, &msg, req, notes.clone(), chunks).await;
        for n in noted(notes.take()) {
            steps.push(n);
        }
        let outcome = match &r {
            Ok(reply) => Ok(reply.clone()),
            Err(AgentError::Cancelled) => Err(REASON_SYNC_INTERRUPTED.to_owned()),
            Err(e) => Err(e.to_string()),
        };
        self.finish(gw, &msg, outcome, steps).await;
        Ok(r)
    }

    /// Journals `msg` (a sync row) for [`Self::run_journaled`], already running under this
    /// incarnation (the async worker never takes it); its id.
    pub async fn journal_waiting(&self, gw: &Gateway, msg: NewMessage) -> Result<String, String> {
        let inc = gw.me.id.clone();
        self.with_journal(move |j| j.accept_claimed(&msg, &inc)).await
    }

    /// The conversation's start names the hermes session (backend/hermes.rs): `/new` moves it.
    async fn session_started(&self, msg: &Message) -> Option<String> {
        let p = match &msg.platform {
            Some(p) => p.clone(),
            None if super::http_chat::is_conversation(&msg.chat_id) => gatewarden_journal::HTTP_SESSIONS.to_owned(),
            None => return None,
        };
        let c = msg.chat_id.clone();
        self.with_journal(move |j| j.session_started(&p, &c)).await.unwrap_or_else(|e| {
            crate::warn!("cannot read the session of {}: {e}", msg.id);
            None
        })
    }

    /// Runs `req` as a run its chat can `/cancel` (which fails it with [`REASON_CANCELLED`]
    /// instead of leaving it for the next incarnation), its progress shown in a platform's chat.
    /// The run always streams: into the chat (typing, a growing preview) or into nothing, so
    /// that its first token is known for the trace; the reply is the whole answer either way.
    async fn run_in_chat(
        self: &Arc<Self>,
        gw: &Gateway,
        msg: &Message,
        req: AgentRequest,
        notes: RunNotes,
        caller: Option<Stream>,
    ) -> Result<AgentReply, AgentError> {
        let key = chat_key(msg.platform.as_deref(), &msg.chat_id);
        let token = self.cancel.child_token();
        self.chat_runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .push((msg.id.clone(), token.clone()));
        // A waiting HTTP caller's stream, or the chat's (or nothing's).
        let (tx, mut rx) = mpsc::channel::<String>(64);
        let (chunks, reach, shown) = match caller {
            Some((chunks, reach)) => {
                // Nothing is drained then: the drain below ends at once.
                drop(tx);
                (chunks, reach, None)
            }
            None => {
                let reach = Delivery::default();
                let shown = msg.platform.as_ref().map(|p| Shown::start(&self.wake, p, &msg.chat_id, &msg.id, &reach));
                (shown.as_ref().map_or(tx, |s| s.chunks.clone()), reach, shown)
            }
        };
        let drain = async move { while rx.recv().await.is_some() {} };
        let run = self.run_traced(gw, msg.platform.as_deref(), req, Some((chunks, reach)), Some(notes), token);
        let (r, ()) = tokio::join!(run, drain);
        let by_chat = self.end_chat_run(&key, &msg.id);
        let r = match r {
            Err(AgentError::Cancelled) if by_chat => Err(AgentError::Failed(REASON_CANCELLED.into())),
            r => r,
        };
        if let Some(s) = shown {
            s.end(!matches!(r, Err(AgentError::Cancelled))).await;
        }
        r
    }

    /// Forgets run `id` of chat `key` for `/cancel`; whether `/cancel` stopped it.
    fn end_chat_run(&self, key: &str, id: &str) -> bool {
        {
            let mut runs = self.chat_runs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = runs.get_mut(key) {
                v.retain(|(i, _)| i != id);
                if v.is_empty() {
                    runs.remove(key);
                }
            }
        }
        self.cancelled_by_chat.lock().unwrap_or_else(|p| p.into_inner()).remove(id)
    }

    /// Records the run's outcome for this incarnation with its trace `steps` (a failure with
    /// what its chat or caller is told), exports the trace, and wakes the platform's outbox.
    async fn finish(
        self: &Arc<Self>,
        gw: &Gateway,
        msg: &Message,
        outcome: Result<AgentReply, String>,
        steps: RunSteps,
    ) {
        let notice = match &outcome {
            Err(e) => {
                // In the message's span: the line carries its id and platform.
                crate::warn!("message failed: {e}");
                // Its reason may quote an agent's output: no line of it names a stored file.
                gatewarden_platforms::attachments::escape_text(&self.failure_notice(
                    msg.platform.as_deref(),
                    &msg.user_id,
                    &msg.id,
                    e,
                ))
            }
            Ok(_) => String::new(),
        };
        let outcome = match outcome {
            Ok(reply) if msg.platform.is_some() => Ok(with_files(gw, reply, &self.live().attachments).await),
            other => other,
        };
        let (inc, id) = (gw.me.id.clone(), msg.id.clone());
        let done = self
            .journal_step(gw, move |j| match &outcome {
                Ok(reply) => j.complete_traced(
                    &id,
                    &inc,
                    &reply.text,
                    reply.usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
                    steps.steps(),
                ),
                Err(e) => j.fail_traced(&id, &inc, e, &notice, steps.steps()),
            })
            .await;
        match done {
            Err(e) => crate::error!("journal update failed: {e}"),
            Ok(true) => self.export_trace(&msg.id),
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

/// The stored files a platform message's or a `/v1/responses` row's journaled text names
/// (crates/platforms/src/attachments.rs), and its text without those lines. Both escape the
/// sender's own lines that could pass for one (`escape_text`); a `/v1/messages` text is not
/// escaped, so it never names a stored file.
///
/// The one place the agent's input is made of the journal and the store, so for every backend:
/// with `[agent.transcription]`, each audio file is replaced by a line of its transcript
/// (backend/transcribe.rs), cached beside the file so that a re-run after a restart or a retry
/// does not transcribe it again; one that cannot be transcribed stays a file, with a line saying
/// why, and the run goes on.
async fn attachments_of(
    gw: &Gateway,
    msg: &Message,
    transcriber: Option<&gatewarden_agent::Transcriber>,
    cancel: &CancellationToken,
) -> (String, Vec<gatewarden_agent::backend::AgentFile>) {
    use gatewarden_agent::backend::transcribe::{self, Audio};
    use gatewarden_platforms::attachments;
    let escaped = msg.platform.is_some() || super::http_chat::continues(&msg.chat_id).is_some();
    if !escaped {
        return (msg.text.clone(), Vec::new());
    }
    let store = attachments::Store::in_home(gw.home.dir());
    let (mut text, files) = resolved_in(gw, &msg.text);
    let mut out = Vec::new();
    for resolved in files {
        let sha = resolved.sha256.clone();
        let file = agent_file(resolved);
        let Some(t) = transcriber.filter(|_| transcribe::is_audio(&file.kind)) else {
            out.push(file);
            continue;
        };
        let said = match store.transcript(&sha) {
            Some(cached) => Ok(cached),
            None => {
                let audio = Audio {
                    path: file.path.clone(),
                    name: file.name.clone(),
                    kind: file.kind.clone(),
                    size: file.size,
                };
                let r = t.transcribe(&audio, &cancel.child_token()).await;
                if let Ok(words) = &r
                    && let Err(e) = store.keep_transcript(&sha, words)
                {
                    crate::warn!("cannot cache the transcript of {}: {e}", file.name);
                }
                r
            }
        };
        let line = match said {
            Ok(words) => transcribe::transcript_line(&file.name, &words),
            Err(why) => {
                crate::warn!("voice {} of {} not transcribed: {}", file.name, msg.id, why.detail);
                out.push(file.clone());
                transcribe::failure_line(&file.name, &why.short)
            }
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&line);
    }
    (text, out)
}

/// The stored files `text` (escaped as [`attachments_of`] says) names, and the text without
/// those lines: a `/v1/responses` call with `store: false` runs from it directly.
pub(crate) fn files_named(gw: &Gateway, text: &str) -> (String, Vec<gatewarden_agent::backend::AgentFile>) {
    let (text, files) = resolved_in(gw, text);
    (text, files.into_iter().map(agent_file).collect())
}

/// [`files_named`] with each file's content hash, its identity in the store.
fn resolved_in(gw: &Gateway, text: &str) -> (String, Vec<gatewarden_platforms::attachments::Resolved>) {
    use gatewarden_platforms::attachments;
    if !text.contains("[attachment: ") {
        return (text.to_owned(), Vec::new());
    }
    attachments::resolve(&attachments::Store::in_home(gw.home.dir()), text)
}

fn agent_file(f: gatewarden_platforms::attachments::Resolved) -> gatewarden_agent::backend::AgentFile {
    gatewarden_agent::backend::AgentFile { path: f.path, name: f.name, kind: f.kind, size: f.size }
}

/// Earlier voice messages of the conversation as their cached transcripts (made when they
/// ran: [`attachments_of`]), so the agent keeps what was said; a line without one stays.
fn transcribed_history(gw: &Gateway, history: &mut [Turn]) {
    use gatewarden_agent::backend::transcribe;
    use gatewarden_platforms::attachments;
    let store = attachments::Store::in_home(gw.home.dir());
    for t in history.iter_mut().filter(|t| t.role == "user" && t.content.contains("[attachment: ")) {
        t.content = t
            .content
            .split('\n')
            .map(|l| match attachments::parse_line(l) {
                Some(n) if transcribe::is_audio(&n.kind) => store
                    .transcript(&n.sha256)
                    .map_or_else(|| l.to_owned(), |words| transcribe::transcript_line(&n.name, &words)),
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
}

/// A platform reply's text as the outbox sends it: the agent's own lines that could pass for a
/// stored attachment escaped, then one line per file the reply carries, stored first
/// (crates/platforms/src/attachments.rs: the sender uploads what the lines name). A file that
/// cannot be stored is named with the reason instead.
async fn with_files(gw: &Gateway, mut reply: AgentReply, limits: &gatewarden_config::AttachmentsConfig) -> AgentReply {
    use gatewarden_platforms::attachments::{self, Attachment, Bounds, Store};
    let mut text = attachments::escape_text(&reply.text);
    let files = std::mem::take(&mut reply.files);
    if files.is_empty() {
        reply.text = text;
        return reply;
    }
    let store = Store::in_home(gw.home.dir());
    // `[attachments]`'s bounds, any type: the operator's own command made these files.
    let bounds = Bounds { unknown_as_binary: true, allowed: Vec::new(), ..Bounds::from(limits) };
    let lines = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut used = 0;
        files
            .iter()
            .map(|path| {
                let name = path.file_name().map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
                let a = Attachment { name, ..Attachment::default() };
                // No per-event record: a reply is stored once per run, and the content address
                // makes a re-run's copy the same file.
                let outcome = store.fetch(None, &a, &bounds, started, &mut used, |_| {
                    let (f, _) = gatewarden_lifecycle::fsio::open_regular(path)
                        .ok()
                        .ok_or_else(|| format!("cannot read {}", path.display()))?;
                    Ok(Box::new(f) as Box<dyn std::io::Read + Send>)
                });
                attachments::line(&Attachment { outcome: Some(outcome), ..a })
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for l in lines {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&l);
    }
    reply.text = text;
    reply
}
