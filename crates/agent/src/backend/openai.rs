//! `openai`: OpenAI-compatible chat-completions upstreams, tried in order with failover.
//!
//! The providers are `[[agent.provider]]` (or the one `[agent] base_url`): the first is the
//! primary. A provider answering 429, 408, 409 or 5xx, refusing the connection or not
//! answering within `attempt_timeout_s` is retried `retries` times with jittered exponential
//! backoff (at least its `Retry-After`), then the next is tried; other 4xx are not retried
//! (401/403/404 move on to the next provider, the rest fail the run). Everything stays within
//! the run's `timeout_s`, and a wait that would not fit moves on at once. Each provider's
//! health is a circuit breaker (backend/provider.rs): after a streak of failed calls it is
//! skipped for `cooldown_s`, then one probe call is let through. An answer that breaks off
//! after its head (a dropped connection, a stream cut short or reporting an error) is retried
//! and failed over like a refused connection as long as none of it has reached the chat or
//! caller (backend/delivery.rs, issue 27 §6); once some has, the failure ends the run (another
//! provider's answer cannot be appended). A reply longer than `max_reply_bytes`, streamed or
//! not, ends the run with a failure (issue 31 §5: an endless stream).
//!
//! Each run POSTs `{"model": …, "messages": [<history>…, {"role": "user", "content": <text>}], "stream": …}`
//! to `<base_url>/chat/completions`, with `Authorization: Bearer <key>` when a key is configured
//! (`api_key_env` / `api_key_file`, resolved by crates/config/src/secrets.rs when the gateway is
//! prepared; the gateway does not start without it, and a backend built without it fails each
//! run with the resolver's words). The reply is `choices[0].message.content`; streaming
//! parses the server-sent events (`data: {json}` lines, ended by `data: [DONE]`) and passes each
//! `choices[0].delta.content` through as a chunk (backend/sse.rs bounds lines and events).
//! Streaming requests ask for `stream_options.include_usage`; the usage, streamed or not, is in
//! the reply. An upstream that answers a streaming request with one JSON completion is passed
//! on as one delta. A 4xx that every provider would repeat becomes [`AgentError::Upstream`].
//!
//! TLS and proxies come from crates/net (the OS trust store or `[agent] ca_file`; the
//! environment's `HTTPS_PROXY` / `NO_PROXY`); a certificate the upstream cannot prove fails the
//! run before anything is sent, naming the host and the reason.
//!
//! HTTP is ureq (blocking) on a dedicated thread per run, not hyper: ureq is already the
//! workspace's client and brings TLS with no connector stack, and one thread per
//! in-flight run is cheap at a gateway's concurrency. The thread is a plain `std::thread`, not
//! `spawn_blocking`, because dropping a tokio runtime waits for its blocking pool: a stalled
//! upstream would then hold up the gateway's exit. The async side never waits on that thread
//! after a cancel: it returns [`AgentError::Cancelled`] at once, and the thread notices the token
//! at its next read (or at ureq's global timeout, set just above the run timeout), then exits
//! without delivering anything; process exit ends it in any case.

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_config::{Secret, SecretId, Secrets};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::provider::{Admit, Backoff, Failure, Health, Pause, State, Verdict, classify, parse_retry_after};
use super::sse::SseDecoder;
use super::{
    Agent, AgentError, AgentFuture, AgentReply, AgentRequest, ProviderEvent, ProviderStatus, Usage, send_chunk,
    truncate, with_timeout,
};

/// Bytes of an error body kept in [`AgentError::Upstream`].
const ERROR_BODY_BYTES: usize = 4096;
/// Largest non-streaming response body read.
const MAX_BODY_BYTES: u64 = 16 << 20;
/// Largest single SSE line.
const MAX_LINE_BYTES: usize = 1 << 20;
/// Largest SSE event (its `data` lines together).
const MAX_EVENT_BYTES: usize = 4 << 20;

/// The API key of one upstream, as the secret resolver (crates/config/src/secrets.rs) left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiKey {
    /// No `Authorization` header (local servers).
    None,
    /// The key (its `Debug` is redacted).
    Value(Secret),
    /// Named, but not to be had: every run fails with these words (never a value).
    Missing(String),
}

impl ApiKey {
    /// The resolver's answer for one upstream.
    pub fn from_resolved(r: Result<Option<Secret>, String>) -> ApiKey {
        match r {
            Ok(Some(v)) => ApiKey::Value(v),
            Ok(None) => ApiKey::None,
            Err(why) => ApiKey::Missing(why),
        }
    }

    fn resolve(&self) -> Result<Option<Secret>, AgentError> {
        match self {
            ApiKey::None => Ok(None),
            ApiKey::Value(v) => Ok(Some(v.clone())),
            ApiKey::Missing(why) => Err(AgentError::Failed(format!("openai backend: {why}"))),
        }
    }
}

/// One upstream as the backend (and the transcriber, transcribe.rs) uses it.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    pub(super) name: String,
    /// The endpoint: `<base_url>/chat/completions` (or `/audio/transcriptions`).
    pub(super) url: String,
    pub(super) model: String,
    pub(super) key: ApiKey,
    pub(super) headers: Vec<(String, String)>,
    /// `Err`: the TLS or proxy settings could not be loaded (a `ca_file` gone since the
    /// configuration was checked); every attempt at this provider fails with it.
    pub(super) http: Result<ureq::Agent, String>,
}

impl Upstream {
    fn new(
        name: String,
        base_url: &str,
        model: String,
        key: ApiKey,
        out: &gatewarden_net::Outbound,
        timeout: Duration,
    ) -> Self {
        Upstream {
            name,
            url: format!("{}/chat/completions", base_url.trim().trim_end_matches('/')),
            model,
            key,
            headers: Vec::new(),
            http: Ok(http_agent(out, timeout)),
        }
    }
}

/// Retries, backoff and cool-down (`[agent] retries`, `backoff_ms`, `cooldown_s`,
/// `attempt_timeout_s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub retries: u32,
    pub backoff: Duration,
    pub cooldown: Duration,
    pub attempt_timeout: Duration,
    /// `max_reply_bytes`: the longest reply a run may produce.
    pub max_reply: usize,
}

impl Default for Policy {
    fn default() -> Self {
        let d = gatewarden_config::AgentConfig::default();
        Policy::from_config(&d)
    }
}

impl Policy {
    pub fn from_config(c: &gatewarden_config::AgentConfig) -> Policy {
        Policy {
            retries: c.retries,
            backoff: Duration::from_millis(c.backoff_ms),
            cooldown: Duration::from_secs(c.cooldown_s),
            attempt_timeout: Duration::from_secs(c.attempt_timeout_s),
            max_reply: c.max_reply_bytes,
        }
    }
}

/// Talks to OpenAI-compatible upstreams: the first is the primary, the rest fallbacks.
#[derive(Debug, Clone)]
pub struct OpenAiAgent {
    upstreams: Vec<Upstream>,
    policy: Policy,
    timeout: Duration,
    /// One per upstream, same order. Never held across an await.
    health: Arc<Mutex<Vec<Health>>>,
    /// State changes not yet taken by [`Agent::take_provider_events`] (bounded).
    events: Arc<Mutex<Vec<ProviderEvent>>>,
}

/// Most state changes kept for the runtime between two runs.
const MAX_EVENTS: usize = 256;

/// How one call at one provider (its attempts and retries) ended, when not with a reply.
enum CallEnd {
    /// The provider failed; the next may be tried.
    Failed(Failure),
    /// The run ends with this error (a 4xx that every provider would repeat, a stream broken
    /// after part of the reply was passed on, cancelled).
    Stop(AgentError, Option<Failure>),
}

impl OpenAiAgent {
    /// `base_url` like `https://api.openai.com/v1` (a trailing `/` is fine); the system trust
    /// store and the environment's proxy; the default [`Policy`].
    pub fn new(base_url: String, model: String, key: ApiKey, timeout: Duration) -> Self {
        let name = gatewarden_net::url_host(base_url.trim()).to_string();
        let up = Upstream::new(name, &base_url, model, key, &gatewarden_net::Outbound::system(), timeout);
        OpenAiAgent::from_upstreams(vec![up], Policy::default(), timeout)
    }

    fn from_upstreams(upstreams: Vec<Upstream>, policy: Policy, timeout: Duration) -> Self {
        let health = Arc::new(Mutex::new(vec![Health::default(); upstreams.len()]));
        OpenAiAgent { upstreams, policy, timeout, health, events: Arc::new(Mutex::new(Vec::new())) }
    }

    /// The backend of `[agent]`: its `[[agent.provider]]` tables, or its one upstream, with
    /// their keys from `secrets`.
    pub fn from_config(c: &gatewarden_config::AgentConfig, secrets: &Secrets) -> Self {
        let timeout = c.timeout();
        let ups = c
            .providers()
            .into_iter()
            .map(|p| {
                let out = gatewarden_net::Outbound::new(p.ca_file.as_deref(), p.proxy.as_deref());
                let name = p.display_name();
                let id = match c.provider.is_empty() {
                    true => SecretId::Agent,
                    false => SecretId::Provider { name: name.clone() },
                };
                let key = ApiKey::from_resolved(secrets.get(&id));
                let mut up = Upstream::new(
                    name.clone(),
                    &p.base_url,
                    p.model.clone(),
                    key,
                    &gatewarden_net::Outbound::system(),
                    timeout,
                );
                up.headers = p.headers.into_iter().collect();
                up.http = out.map(|o| http_agent(&o, timeout)).map_err(|e| format!("provider {name}: {e}"));
                up
            })
            .collect();
        OpenAiAgent::from_upstreams(ups, Policy::from_config(c), timeout)
    }

    /// The primary's TLS and proxy settings (`[agent] ca_file`).
    pub fn with_outbound(mut self, out: Result<gatewarden_net::Outbound, gatewarden_net::NetError>) -> Self {
        if let Some(up) = self.upstreams.first_mut() {
            up.http = out.map(|o| http_agent(&o, self.timeout)).map_err(|e| format!("openai backend: [agent] {e}"));
        }
        self
    }

    /// Adds a fallback, tried after the upstreams before it.
    pub fn with_fallback(mut self, name: &str, base_url: &str, model: &str, key: ApiKey) -> Self {
        let up =
            Upstream::new(name.into(), base_url, model.into(), key, &gatewarden_net::Outbound::system(), self.timeout);
        self.upstreams.push(up);
        self.health = Arc::new(Mutex::new(vec![Health::default(); self.upstreams.len()]));
        self
    }

    /// Replaces the retry policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The primary's endpoint.
    pub fn url(&self) -> &str {
        self.upstreams.first().map_or("", |u| u.url.as_str())
    }

    async fn go(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        let deadline = Instant::now() + self.timeout;
        with_timeout(self.timeout, &cancel, |cancel| self.call(req, cancel, chunks, deadline)).await
    }

    fn with_health<T>(&self, f: impl FnOnce(&mut Vec<Health>) -> T) -> T {
        let mut g = self.health.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g)
    }

    /// Records a state change for the runtime (ledger) when `before` says there was one.
    fn changed(&self, i: usize, before: Option<State>) {
        let Some(before) = before else { return };
        let snap = self.snapshot(i);
        let mut ev = self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ev.len() >= MAX_EVENTS {
            ev.remove(0);
        }
        ev.push(ProviderEvent { from: before.name().to_string(), status: snap });
    }

    fn snapshot(&self, i: usize) -> ProviderStatus {
        let (now, wall) = (Instant::now(), SystemTime::now());
        self.with_health(|h| {
            let h = &h[i];
            let (reason, until) = match &h.state {
                State::Healthy => (None, None),
                State::Failing { reason } => (Some(reason.clone()), None),
                State::CoolingDown { until, reason } => {
                    (Some(reason.clone()), Some(wall + until.saturating_duration_since(now)))
                }
            };
            ProviderStatus {
                name: self.upstreams[i].name.clone(),
                state: h.state.name().to_string(),
                reason,
                until,
                attempts: h.attempts,
                failures: h.failures,
            }
        })
    }

    /// The providers in order, each called at most once per round; when every one is cooling
    /// down, the run waits for the first cool-down to end (within its deadline) and probes.
    async fn call(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
        deadline: Instant,
    ) -> Result<AgentReply, AgentError> {
        if cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        if self.upstreams.is_empty() {
            return Err(AgentError::Failed("openai backend: no provider is configured".into()));
        }
        let mut tried: Vec<String> = Vec::new();
        let mut waited = false;
        loop {
            let mut soonest: Option<Instant> = None;
            let mut called = false;
            for i in 0..self.upstreams.len() {
                let name = &self.upstreams[i].name;
                match self.with_health(|h| h[i].admit(Instant::now())) {
                    Admit::Skip { until } => {
                        soonest = Some(soonest.map_or(until, |s| s.min(until)));
                        continue;
                    }
                    Admit::Yes => called = true,
                }
                let (started, t0) = (std::time::SystemTime::now(), Instant::now());
                let r = self.call_one(i, &req, &cancel, chunks.as_ref(), deadline).await;
                super::trace::note(super::trace::Note::ProviderTried {
                    provider: name.clone(),
                    outcome: match &r {
                        Ok(_) => "ok".into(),
                        Err(CallEnd::Failed(f)) => f.reason(),
                        Err(CallEnd::Stop(e, _)) => e.to_string(),
                    },
                    started,
                    elapsed: t0.elapsed(),
                });
                match r {
                    Ok(reply) => {
                        let before = self.with_health(|h| h[i].succeeded());
                        self.changed(i, before);
                        return Ok(reply);
                    }
                    Err(CallEnd::Failed(f)) => {
                        let retry_after = match &f {
                            Failure::Status { retry_after, .. } => *retry_after,
                            _ => None,
                        };
                        tried.push(format!("{name}: {}", f.reason()));
                        let before = self.with_health(|h| {
                            h[i].failed(f.reason(), Instant::now(), self.policy.cooldown, retry_after)
                        });
                        self.changed(i, before);
                    }
                    Err(CallEnd::Stop(e, failure)) => {
                        match failure {
                            Some(f) => {
                                let before = self.with_health(|h| {
                                    h[i].failed(f.reason(), Instant::now(), self.policy.cooldown, None)
                                });
                                self.changed(i, before);
                            }
                            None => self.with_health(|h| h[i].abandoned()),
                        }
                        return Err(e);
                    }
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            // Every provider cooling down: wait for the first to end, once, if it fits.
            match soonest {
                Some(until) if !called && !waited && until < deadline => {
                    waited = true;
                    tokio::select! {
                        () = tokio::time::sleep_until(until.into()) => continue,
                        () = cancel.cancelled() => return Err(AgentError::Cancelled),
                    }
                }
                _ => {}
            }
            let skipped = self.upstreams.len().saturating_sub(tried.len());
            let mut why = tried.join("; ");
            if skipped > 0 {
                if !why.is_empty() {
                    why.push_str("; ");
                }
                why.push_str(&format!("{skipped} cooling down"));
            }
            return Err(AgentError::Failed(format!("openai backend: no provider answered: {why}")));
        }
    }

    /// One provider: attempts with jittered exponential backoff (at least `Retry-After`) while
    /// the failure is transient and the wait fits in the run's deadline.
    async fn call_one(
        &self,
        i: usize,
        req: &AgentRequest,
        cancel: &CancellationToken,
        chunks: Option<&mpsc::Sender<String>>,
        deadline: Instant,
    ) -> Result<AgentReply, CallEnd> {
        let backoff = Backoff { base: self.policy.backoff };
        let mut retry = 0u32;
        loop {
            self.with_health(|h| h[i].attempted());
            let failure = match self.attempt(i, req, cancel, chunks, deadline).await {
                Ok(reply) => return Ok(reply),
                Err(CallEnd::Failed(f)) => f,
                Err(stop) => {
                    // A provider that broke off after part of the reply was shown failed too
                    // (status `failures`, gatewarden_provider_failures_total).
                    if matches!(stop, CallEnd::Stop(_, Some(_))) {
                        self.with_health(|h| h[i].attempt_failed());
                    }
                    return Err(stop);
                }
            };
            self.with_health(|h| h[i].attempt_failed());
            match classify(&failure) {
                Verdict::Fatal => {
                    let e = match &failure {
                        Failure::Status { status, body, .. } => {
                            AgentError::Upstream { status: *status, body: body.clone() }
                        }
                        other => AgentError::Failed(other.reason()),
                    };
                    return Err(CallEnd::Stop(e, None));
                }
                Verdict::Next => return Err(CallEnd::Failed(failure)),
                Verdict::Retry { after } => {
                    match backoff.pause(retry, self.policy.retries, after, deadline, cancel).await {
                        Pause::Again => retry += 1,
                        Pause::GiveUp => return Err(CallEnd::Failed(failure)),
                        Pause::Cancelled => return Err(CallEnd::Stop(AgentError::Cancelled, None)),
                    }
                }
            }
        }
    }

    /// One HTTP request, on its own thread (see the module comment).
    async fn attempt(
        &self,
        i: usize,
        req: &AgentRequest,
        cancel: &CancellationToken,
        chunks: Option<&mpsc::Sender<String>>,
        deadline: Instant,
    ) -> Result<AgentReply, CallEnd> {
        let up = &self.upstreams[i];
        if up.model.is_empty() || up.url.starts_with("/chat") {
            let e = AgentError::Failed("openai backend: base_url and model must be configured".into());
            return Err(CallEnd::Stop(e, None));
        }
        let key = up.key.resolve().map_err(|e| CallEnd::Failed(Failure::Protocol(e.to_string())))?;
        let http = up.http.clone().map_err(|e| CallEnd::Failed(Failure::Connect(e)))?;
        let streaming = chunks.is_some();
        let mut messages: Vec<Value> =
            req.history.iter().map(|t| json!({"role": t.role, "content": t.content})).collect();
        messages.push(json!({"role": "user", "content": super::files::user_content(&req.text, &req.attachments)}));
        let mut body = json!({"model": up.model, "messages": messages, "stream": streaming});
        if streaming {
            body["stream_options"] = json!({"include_usage": true});
        }
        // The response head is awaited at most `attempt_timeout`; when the run's deadline
        // comes first, the async side reports it (the thread's bound is only a backstop).
        let left = deadline.saturating_duration_since(Instant::now());
        let head = if self.policy.attempt_timeout < left {
            self.policy.attempt_timeout
        } else {
            left + Duration::from_secs(1)
        };
        let call = Call {
            http,
            url: up.url.clone(),
            key,
            headers: up.headers.clone(),
            body,
            head_timeout: head,
            total_timeout: left + Duration::from_secs(1),
            cancel: cancel.clone(),
        };
        let (delta_tx, mut delta_rx) = mpsc::channel::<String>(64);
        let (result_tx, mut worker) = oneshot::channel();
        // A plain thread, not `spawn_blocking`: a runtime's shutdown waits for its blocking
        // pool, so a cancelled run whose upstream stalls would hold up the gateway's exit.
        std::thread::Builder::new()
            .name("gatewarden-openai".into())
            .spawn(move || {
                let result = if streaming { call.streaming(&delta_tx) } else { call.complete() };
                let _ = result_tx.send(result);
            })
            .map_err(|e| {
                CallEnd::Stop(AgentError::Failed(format!("openai backend: cannot start a worker thread: {e}")), None)
            })?;

        let mut streamed = String::new();
        let mut deltas_open = streaming;
        let max = self.policy.max_reply;
        let too_long = || {
            // Dropping the receiver ends the worker thread at its next delta.
            CallEnd::Stop(
                AgentError::Failed(format!(
                    "openai backend: the reply grew past [agent] max_reply_bytes ({max} bytes); the run was ended"
                )),
                None,
            )
        };
        loop {
            tokio::select! {
                delta = delta_rx.recv(), if deltas_open => match delta {
                    Some(delta) => {
                        if streamed.len().saturating_add(delta.len()) > max {
                            return Err(too_long());
                        }
                        streamed.push_str(&delta);
                        if let Some(chunks) = chunks {
                            send_chunk(chunks, cancel, delta).await.map_err(|e| CallEnd::Stop(e, None))?;
                        }
                    }
                    None => deltas_open = false,
                },
                joined = &mut worker, if !deltas_open => {
                    return match joined {
                        Ok(Ok(done)) if done.text.as_ref().is_some_and(|t| t.len() > max) => Err(too_long()),
                        Ok(Ok(done)) => Ok(AgentReply { text: done.text.unwrap_or(streamed), usage: done.usage, files: Vec::new() }),
                        // Part of the reply went on its way: another provider's answer can
                        // follow only if none of it reached the caller (its pieces are then
                        // dropped on the way); else it cannot be appended.
                        Ok(Err(f)) if !streamed.is_empty() && !super::delivery::retract() => {
                            Err(CallEnd::Stop(AgentError::Failed(f.reason()), Some(f)))
                        }
                        Ok(Err(f)) => Err(CallEnd::Failed(f)),
                        Err(_) => Err(CallEnd::Stop(AgentError::Failed("openai backend: the worker thread died".into()), None)),
                    };
                }
                () = cancel.cancelled() => return Err(CallEnd::Stop(AgentError::Cancelled, None)),
            }
        }
    }
}

/// A request that got no answer, as a [`Failure`] (shared with backend/transcribe.rs).
pub(super) fn send_failure(e: ureq::Error, url: &str) -> Failure {
    match e {
        ureq::Error::Timeout(_) => Failure::TimedOut,
        // A certificate the provider cannot prove will not change on a retry.
        e if gatewarden_net::tls_reason(&e).is_some() => {
            Failure::Protocol(format!("{url}: {}", gatewarden_net::describe(&e, url)))
        }
        e => Failure::Connect(format!("{url}: {}", gatewarden_net::describe(&e, url))),
    }
}

/// A response that is not a success, as a [`Failure`] (its `Retry-After` and the start of its
/// body); a success is passed on (shared with backend/transcribe.rs).
pub(super) fn refused(
    mut response: ureq::http::Response<ureq::Body>,
) -> Result<ureq::http::Response<ureq::Body>, Failure> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    let body =
        response.body_mut().with_config().limit(ERROR_BODY_BYTES as u64 * 4).read_to_string().unwrap_or_default();
    Err(Failure::Status { status: status.as_u16(), retry_after, body: truncate(body.trim(), ERROR_BODY_BYTES) })
}

/// The blocking client of one provider: crates/net's TLS and proxy rules, statuses as values
/// (shared with backend/transcribe.rs).
pub(super) fn http_agent(out: &gatewarden_net::Outbound, timeout: Duration) -> ureq::Agent {
    gatewarden_net::http_config(out)
        // The async side reports the timeout; this only bounds the blocking thread.
        .timeout_global(Some(timeout + Duration::from_secs(1)))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// A finished attempt: the reply (`None`: what was streamed) and the usage, if reported.
struct Done {
    text: Option<String>,
    usage: Option<Usage>,
}

/// One upstream request, run on a blocking thread.
struct Call {
    http: ureq::Agent,
    url: String,
    key: Option<Secret>,
    headers: Vec<(String, String)>,
    body: Value,
    head_timeout: Duration,
    total_timeout: Duration,
    cancel: CancellationToken,
}

impl Call {
    fn send(&self) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let mut request = self.http.post(&self.url).header("Content-Type", "application/json");
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        if let Some(key) = &self.key {
            request = request.header("Authorization", format!("Bearer {}", key.expose()));
        }
        if self.body["stream"] == Value::Bool(true) {
            request = request.header("Accept", "text/event-stream");
        }
        let request = request
            .config()
            .timeout_global(Some(self.total_timeout))
            .timeout_recv_response(Some(self.head_timeout))
            .build();
        let response = request.send_json(&self.body).map_err(|e| send_failure(e, &self.url))?;
        refused(response)
    }

    /// Non-streaming: the whole reply.
    fn complete(&self) -> Result<Done, Failure> {
        self.completion(self.send()?)
    }

    /// A `chat.completion` object's reply and usage.
    fn completion(&self, mut response: ureq::http::Response<ureq::Body>) -> Result<Done, Failure> {
        let text = response.body_mut().with_config().limit(MAX_BODY_BYTES).read_to_string().map_err(|e| match e {
            // Too big is a broken reply, not a broken connection: not worth a retry.
            ureq::Error::BodyExceedsLimit(_) => Failure::Protocol(format!("reading upstream response: {e}")),
            e => Failure::Interrupted(format!("reading upstream response: {e}")),
        })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Failure::Protocol(format!("upstream response is not JSON ({e}): {}", truncate(&text, 200))))?;
        match value.pointer("/choices/0/message/content") {
            Some(Value::String(content)) => Ok(Done { text: Some(content.clone()), usage: usage_of(&value) }),
            _ => Err(Failure::Protocol(format!(
                "upstream response has no choices[0].message.content: {}",
                truncate(&text, 200)
            ))),
        }
    }

    /// Streaming: deltas go to `deltas`; the reply is what was streamed.
    fn streaming(&self, deltas: &mpsc::Sender<String>) -> Result<Done, Failure> {
        let response = self.send()?;
        // An upstream that ignores `stream: true` answers one JSON completion (the chats stream
        // every run since issue 17 §3): passed on as one delta.
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        if content_type.trim_start().to_ascii_lowercase().starts_with("application/json") {
            let done = self.completion(response)?;
            if let Some(text) = done.text.filter(|t| !t.is_empty())
                && deltas.blocking_send(text).is_err()
            {
                return Err(Failure::Protocol("cancelled".into()));
            }
            return Ok(Done { text: None, usage: done.usage });
        }
        let mut reader = response.into_body().into_reader();
        let mut decoder = SseDecoder::new(MAX_LINE_BYTES, MAX_EVENT_BYTES);
        let mut finished = false;
        let mut usage = None;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if self.cancel.is_cancelled() {
                return Err(Failure::Protocol("cancelled".into()));
            }
            let n = reader.read(&mut buf).map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => Failure::TimedOut,
                _ => Failure::Interrupted(format!("reading upstream stream: {e}")),
            })?;
            let events =
                if n == 0 { decoder.finish().map(|e| e.into_iter().collect()) } else { decoder.push(&buf[..n]) };
            for data in events.map_err(|e| Failure::Protocol(e.to_string()))? {
                match parse_sse_data(&data)? {
                    SseLine::Ignore => {}
                    SseLine::Done => return Ok(Done { text: None, usage }),
                    SseLine::Delta { content, finish, usage: u } => {
                        finished |= finish;
                        usage = u.or(usage);
                        if let Some(content) = content
                            && deltas.blocking_send(content).is_err()
                        {
                            // The async side is gone (cancelled or timed out).
                            return Err(Failure::Protocol("cancelled".into()));
                        }
                    }
                }
            }
            if n == 0 {
                break;
            }
        }
        if finished {
            Ok(Done { text: None, usage })
        } else {
            Err(Failure::Interrupted("upstream stream ended before [DONE]".into()))
        }
    }
}

/// `usage.prompt_tokens` and `usage.completion_tokens`, when the upstream reports them.
fn usage_of(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    Some(Usage {
        prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
        completion_tokens: u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    })
}

#[derive(Debug, PartialEq, Eq)]
enum SseLine {
    /// Blank line, comment, `event:`/`id:`/`retry:` field, or a data event without content.
    Ignore,
    /// `data: [DONE]`.
    Done,
    /// A chat.completion.chunk (the last one may carry only `usage`).
    Delta { content: Option<String>, finish: bool, usage: Option<Usage> },
}

/// Parses one event's `data` of an OpenAI server-sent-event stream.
fn parse_sse_data(data: &str) -> Result<SseLine, Failure> {
    if data.trim() == "[DONE]" {
        return Ok(SseLine::Done);
    }
    if data.trim().is_empty() {
        return Ok(SseLine::Ignore);
    }
    let value: Value = serde_json::from_str(data)
        .map_err(|e| Failure::Protocol(format!("upstream stream event is not JSON ({e}): {}", truncate(data, 200))))?;
    if let Some(error) = value.get("error") {
        return Err(Failure::Interrupted(format!(
            "upstream stream error: {}",
            truncate(&error.to_string(), ERROR_BODY_BYTES)
        )));
    }
    let content = match value.pointer("/choices/0/delta/content") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let finish = matches!(value.pointer("/choices/0/finish_reason"), Some(Value::String(_)));
    Ok(SseLine::Delta { content, finish, usage: usage_of(&value) })
}

impl Agent for OpenAiAgent {
    fn name(&self) -> &str {
        "openai"
    }

    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_> {
        Box::pin(self.go(req, cancel, chunks))
    }

    fn providers(&self) -> Vec<ProviderStatus> {
        (0..self.upstreams.len()).map(|i| self.snapshot(i)).collect()
    }

    fn take_provider_events(&self) -> Vec<ProviderEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_data() {
        assert_eq!(parse_sse_data("").unwrap(), SseLine::Ignore);
        assert_eq!(parse_sse_data("[DONE]").unwrap(), SseLine::Done);
        assert_eq!(
            parse_sse_data(r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#).unwrap(),
            SseLine::Delta { content: Some("hi".into()), finish: false, usage: None }
        );
        assert_eq!(
            parse_sse_data(r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#).unwrap(),
            SseLine::Delta { content: None, finish: true, usage: None }
        );
        // stream_options.include_usage: a last chunk with no choices.
        assert_eq!(
            parse_sse_data(r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#)
                .unwrap(),
            SseLine::Delta {
                content: None,
                finish: false,
                usage: Some(Usage { prompt_tokens: 9, completion_tokens: 3 })
            }
        );
        assert!(parse_sse_data("{nope").is_err());
        assert!(parse_sse_data(r#"{"error":{"message":"boom"}}"#).is_err());
    }

    #[test]
    fn a_missing_key_fails_in_the_resolvers_words_and_a_key_never_prints() {
        let key = ApiKey::from_resolved(Err("[agent] api_key: K (api_key_env) is set in neither".into()));
        let e = key.resolve().unwrap_err().to_string();
        assert!(e.contains("K (api_key_env) is set in neither"), "{e}");
        assert_eq!(ApiKey::from_resolved(Ok(None)), ApiKey::None);
        assert!(!format!("{:?}", ApiKey::Value("sk-secret".into())).contains("sk-secret"));
    }

    #[test]
    fn url_joins_base() {
        let a = OpenAiAgent::new("http://h/v1/".into(), "m".into(), ApiKey::None, Duration::from_secs(1));
        assert_eq!(a.url(), "http://h/v1/chat/completions");
    }
}
