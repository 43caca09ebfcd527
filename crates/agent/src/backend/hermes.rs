//! `hermes`: hermes-agent's own agent (tools, memory, approvals) through the API server of its
//! gateway (the `api_server` platform of hermes-agent 0.19, `gateway/platforms/api_server.py`).
//!
//! Each run, on a dedicated thread (ureq is blocking; see backend/openai.rs for why a plain
//! `std::thread`):
//! 1. `GET /api/sessions/{session}/messages`: the conversation hermes keeps for this chat's
//!    session (its text turns; a trailing user turn is an interrupted run and is dropped). A
//!    404 (a hermes that never saw the session: a fresh home, a failover) falls back to the
//!    journal's history in the request.
//! 2. `POST /v1/runs` `{input, session_id, conversation_history}` with
//!    `X-Hermes-Session-Key` (the chat's long-term memory scope) → `202 {run_id}`.
//! 3. `GET /v1/runs/{run_id}/events`: server-sent `data: {json}` events named by `event`:
//!    `message.delta` (`delta`, passed on as chunks), `tool.started` / `tool.completed` /
//!    `reasoning.available` (progress), `approval.request` (`command`, `description`,
//!    `choices`), `approval.responded`, and the terminal `run.completed` (`output`, `usage`),
//!    `run.failed` (`error`) and `run.cancelled`. The stream ends with a `: stream closed`
//!    comment.
//!
//! Every request carries `Authorization: Bearer <API_SERVER_KEY>`.
//!
//! - **Sessions.** One hermes session per `(platform, chat)` and conversation: its id is a hash
//!   of the platform, the chat and the journal's session start (`/new` moves it), so nothing new
//!   is stored and the mapping survives restarts and failover ([`session_id`]). An HTTP API
//!   conversation (`/v1/messages` with a `chat_id`) is a chat of the platform `""`
//!   ([`super::HTTP_SCOPE`]); a one-shot call has no session.
//! - **hermes down or restarting.** A refused connection, a 5xx/429, a 404 for the run or a
//!   stream cut before its terminal event (hermes killed) is waited out: the run starts again
//!   once hermes answers, until the run's `timeout_s`. hermes forgets runs when it exits, so
//!   the run is re-submitted, with the session as it then is.
//! - **Stop.** A cancelled run (drain budget spent, chat `/cancel`) or a run past `timeout_s`
//!   is stopped with `POST /v1/runs/{run_id}/stop` before the future resolves (bounded).
//! - **Approvals.** `approval.request` becomes a question to the chat (backend/approval.rs);
//!   the answer is `POST /v1/runs/{run_id}/approval` `{"choice": "once" | "deny"}`; no answer
//!   within `approval_timeout_s` is answered "deny".

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_config::{Secret, SecretId, Secrets};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::approval::{Approvals, Pending};
use super::openai::ApiKey;
use super::sse::SseDecoder;
use super::{Agent, AgentError, AgentFuture, AgentReply, AgentRequest, Turn, Usage, send_chunk, with_timeout};

/// Largest JSON body read from hermes (a session's messages).
const MAX_BODY_BYTES: u64 = 16 << 20;
const MAX_LINE_BYTES: usize = 1 << 20;
const MAX_EVENT_BYTES: usize = 4 << 20;
/// Bytes of an error body kept in a message.
const ERROR_BODY_BYTES: usize = 2048;
/// Between two tries while hermes is down or restarting.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// One request's wait for a response head (hermes answers these at once).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop or an approval answer may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(3);
/// hermes's default API server port (`DEFAULT_PORT` in its api_server.py).
const DEFAULT_PORT: u16 = 8642;
/// Largest `.env` read from a hermes home.
const MAX_ENV_BYTES: u64 = 256 << 10;

/// Where the API server is and its key.
#[derive(Clone)]
pub enum Endpoint {
    /// `base_url`, and the key of `api_key_env` / `api_key_file` (crates/config/src/secrets.rs).
    Url { base_url: String, key: ApiKey },
    /// A hermes home: `API_SERVER_HOST`/`API_SERVER_PORT`/`API_SERVER_KEY` of its `.env` (read
    /// at each run; hermes reads it at start), unless `base_url` / the key say otherwise.
    Home { home: PathBuf, base_url: Option<String>, key: ApiKey },
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Url { base_url, .. } => write!(f, "Url({base_url})"),
            Endpoint::Home { home, .. } => write!(f, "Home({})", home.display()),
        }
    }
}

/// `(base_url, key)` for one run.
fn resolve(ep: &Endpoint) -> Result<(String, Secret), AgentError> {
    let configured = |key: &ApiKey| match key {
        ApiKey::Value(v) => Ok(Some(v.clone())),
        ApiKey::None => Ok(None),
        ApiKey::Missing(why) => Err(AgentError::Failed(format!("hermes backend: {why}"))),
    };
    match ep {
        Endpoint::Url { base_url, key } => {
            let Some(key) = configured(key)? else {
                return Err(AgentError::Failed("hermes backend: api_key_env is not set".into()));
            };
            Ok((base_url.trim().trim_end_matches('/').to_owned(), key))
        }
        Endpoint::Home { home, base_url, key } => {
            let env = read_dotenv(&home.join(".env"))?;
            let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let url = match base_url {
                Some(u) => u.trim().trim_end_matches('/').to_owned(),
                None => {
                    let host = get("API_SERVER_HOST").filter(|h| !h.is_empty()).unwrap_or_else(|| "127.0.0.1".into());
                    let port = get("API_SERVER_PORT").and_then(|p| p.parse::<u16>().ok()).unwrap_or(DEFAULT_PORT);
                    // A wildcard bind is reached on loopback.
                    let host = match host.as_str() {
                        "0.0.0.0" | "::" | "[::]" => "127.0.0.1".to_owned(),
                        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
                        h => h.to_owned(),
                    };
                    format!("http://{host}:{port}")
                }
            };
            let key = match configured(key)? {
                Some(k) => k,
                None => get("API_SERVER_KEY").filter(|k| !k.is_empty()).map(Secret::from).ok_or_else(|| {
                    AgentError::Failed(format!(
                        "hermes backend: {} sets no API_SERVER_KEY (hermes's API server needs one of at least 16 characters)",
                        home.join(".env").display()
                    ))
                })?,
            };
            Ok((url, key))
        }
    }
}

/// `KEY=value` lines of a hermes `.env` (`export `, quotes and comments as python-dotenv reads
/// them in the simple cases hermes documents).
fn read_dotenv(path: &std::path::Path) -> Result<Vec<(String, String)>, AgentError> {
    use gatewarden_lifecycle::fsio::{ReadOutcome, read_capped};
    let bytes = match read_capped(path, MAX_ENV_BYTES) {
        ReadOutcome::Ok(b) => b,
        ReadOutcome::Missing => return Ok(Vec::new()),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
            return Err(AgentError::Failed(format!("hermes backend: cannot read {}: {why}", path.display())));
        }
    };
    Ok(parse_dotenv(&String::from_utf8_lossy(&bytes)))
}

fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("export ").unwrap_or(l);
            if l.starts_with('#') {
                return None;
            }
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = match v.chars().next() {
                Some(q @ ('"' | '\'')) => v[1..].split(q).next().unwrap_or_default(),
                _ => v.split(" #").next().unwrap_or_default().trim(),
            };
            Some((k.trim().to_owned(), v.to_owned()))
        })
        .collect()
}

/// The hermes session of a chat's conversation: `gw-` and 32 hex digits of
/// SHA-256(platform, chat, the journal's session start). Stable across restarts and
/// failover; a `/new` (a new start) gives a new one.
pub fn session_id(platform: &str, chat_id: &str, started: Option<&str>) -> String {
    digest(&["session", platform, chat_id, started.unwrap_or("")])
}

/// The chat's long-term memory scope (`X-Hermes-Session-Key`): the same across `/new`.
pub fn session_key(platform: &str, chat_id: &str) -> String {
    digest(&["key", platform, chat_id])
}

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let out = h.finalize();
    let hex: String = out.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("gw-{hex}")
}

/// What the run's thread reports.
#[derive(Debug)]
enum Ev {
    /// hermes accepted the run under this id.
    Started(String),
    Delta(String),
    /// A tool started or finished (`tool: preview`, `tool done`): the hook for chat progress
    /// (issue 17 section 3), not yet read.
    Progress(#[allow(dead_code)] String),
    Approval {
        hermes_run: String,
        what: String,
    },
    Done(Result<AgentReply, AgentError>),
}

/// hermes's agent behind its API server.
#[derive(Debug, Clone)]
pub struct HermesAgent {
    endpoint: Endpoint,
    timeout: Duration,
    approval_timeout: Duration,
    history_chars: usize,
    history_turns: usize,
    /// `[agent] max_reply_bytes`: the streamed reply past it ends the run.
    max_reply: usize,
    approvals: Arc<Approvals>,
    /// `(base_url, run id)` of runs in flight, for `status`-like reporting and tests.
    active: Arc<Mutex<Vec<String>>>,
}

impl HermesAgent {
    pub fn new(endpoint: Endpoint, timeout: Duration, approval_timeout: Duration) -> HermesAgent {
        HermesAgent {
            endpoint,
            timeout,
            approval_timeout,
            history_chars: 8000,
            history_turns: 10,
            max_reply: gatewarden_config::DEFAULT_MAX_REPLY_BYTES,
            approvals: Arc::new(Approvals::default()),
            active: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The backend of `[agent]`, its API server key (if named) from `secrets`.
    pub fn from_config(c: &gatewarden_config::AgentConfig, secrets: &Secrets) -> HermesAgent {
        let key = ApiKey::from_resolved(secrets.get(&SecretId::Agent));
        let endpoint = match &c.hermes_home {
            Some(home) => Endpoint::Home { home: home.clone(), base_url: c.base_url.clone(), key },
            None => Endpoint::Url { base_url: c.base_url.clone().unwrap_or_default(), key },
        };
        let mut a = HermesAgent::new(endpoint, c.timeout(), Duration::from_secs(c.approval_timeout_s));
        a.history_chars = c.history_chars;
        a.history_turns = c.history_turns;
        a.max_reply = c.max_reply_bytes;
        a
    }

    async fn go(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        let (url, key) = resolve(&self.endpoint)?;
        let deadline = Instant::now() + self.timeout;
        let http = http_agent(self.timeout);
        let r =
            with_timeout(self.timeout, &cancel, |tok| self.drive(&req, tok, chunks, (url, key), deadline, http)).await;
        self.approvals.withdraw(&req.run_id);
        // hermes names the files a reply carries with `MEDIA:<path>` tags, which `/v1/runs`
        // passes on as they are; only a hermes home of ours says where they may be.
        match (r, &self.endpoint) {
            (Ok(mut reply), Endpoint::Home { home, .. }) => {
                let (text, files) = media_files(&reply.text, home);
                reply.text = text;
                reply.files.extend(files);
                Ok(reply)
            }
            (r, _) => r,
        }
    }

    async fn drive(
        &self,
        req: &AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
        (url, key): (String, Secret),
        deadline: Instant,
        http: ureq::Agent,
    ) -> Result<AgentReply, AgentError> {
        let (tx, mut rx) = mpsc::channel::<Ev>(64);
        let client = Client { http, url, key };
        let history = if self.history_turns == 0 { Vec::new() } else { req.history.clone() };
        let run = RunThread {
            client: client.clone(),
            // Images as parts, other files named (files.rs `runs_input`).
            input: super::files::runs_input(&req.text, &req.attachments),
            session: req.session_scope().map(|p| session_id(p, &req.chat_id, req.session_started.as_deref())),
            session_key: req.session_scope().map(|p| session_key(p, &req.chat_id)),
            fallback_history: history,
            history_chars: self.history_chars,
            history_turns: self.history_turns,
            deadline,
            cancel: cancel.clone(),
        };
        std::thread::Builder::new()
            .name("hermes-run".into())
            .spawn(move || run.run(&tx))
            .map_err(|e| AgentError::Failed(format!("hermes backend: cannot start a worker thread: {e}")))?;
        // Approval waits end with the run.
        let approvals_done = cancel.child_token();
        let _end_approvals = approvals_done.clone().drop_guard();
        let mut current: Option<String> = None;
        let mut streamed = 0usize;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Ev::Started(id)) => {
                        self.track(&id, true);
                        if let Some(old) = current.replace(id) {
                            self.track(&old, false);
                        }
                    }
                    Some(Ev::Delta(d)) => {
                        streamed = streamed.saturating_add(d.len());
                        if streamed > self.max_reply {
                            if let Some(id) = current.take() {
                                self.track(&id, false);
                                let c = client.clone();
                                let _ = run_blocking(move || c.post(&format!("/v1/runs/{id}/stop"), &json!({}))).await;
                            }
                            return Err(AgentError::Failed(format!(
                                "hermes backend: the reply grew past [agent] max_reply_bytes ({} bytes); the run was ended",
                                self.max_reply
                            )));
                        }
                        if let Some(ch) = &chunks {
                            // A cancel during the send is handled by the branch below.
                            let _ = send_chunk(ch, &cancel, d).await;
                        }
                    }
                    // The chat's progress is the text deltas above (typing, a growing
                    // preview); tool and reasoning events have no place in it yet.
                    Some(Ev::Progress(_)) => {}
                    Some(Ev::Approval { hermes_run, what }) => {
                        self.approval(req, client.clone(), hermes_run, what, approvals_done.clone());
                    }
                    Some(Ev::Done(r)) => {
                        if let Some(id) = current.take() {
                            self.track(&id, false);
                        }
                        return r;
                    }
                    None => return Err(AgentError::Failed("hermes backend: the worker thread died".into())),
                },
                () = cancel.cancelled() => {
                    if let Some(id) = current.take() {
                        self.track(&id, false);
                        // Bounded: the future must resolve promptly once cancelled.
                        let c = client.clone();
                        let _ = run_blocking(move || c.post(&format!("/v1/runs/{id}/stop"), &json!({}))).await;
                    }
                    return Err(AgentError::Cancelled);
                }
            }
        }
    }

    fn track(&self, hermes_run: &str, on: bool) {
        let mut a = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if on {
            a.push(hermes_run.to_owned());
        } else {
            a.retain(|r| r != hermes_run);
        }
    }

    /// Asks the chat, waits for its answer (or the expiry), and answers hermes.
    fn approval(&self, req: &AgentRequest, client: Client, hermes_run: String, what: String, done: CancellationToken) {
        let pending = Pending { run_id: req.run_id.clone(), user_id: req.user_id.clone(), what: what.clone() };
        let secs = self.approval_timeout.as_secs();
        let question = format!(
            "the agent asks for approval: {what}\nanswer /approve or /deny (only you or an admin; denied in {secs} s without an answer)"
        );
        let answer = self.approvals.ask(req.platform.as_deref(), &req.chat_id, pending, question);
        let (approvals, timeout) = (Arc::clone(&self.approvals), self.approval_timeout);
        let (platform, chat, run_id) = (req.platform.clone(), req.chat_id.clone(), req.run_id.clone());
        tokio::spawn(async move {
            let approve = match answer {
                None => false,
                Some(rx) => tokio::select! {
                    r = tokio::time::timeout(timeout, rx) => match r {
                        Ok(Ok(yes)) => yes,
                        Ok(Err(_)) => false,
                        Err(_) => {
                            approvals.withdraw(&run_id);
                            if let Some(p) = &platform {
                                approvals.tell(p, &chat, format!("no answer within {} s: denied ({what})", timeout.as_secs()));
                            }
                            false
                        }
                    },
                    () = done.cancelled() => return,
                },
            };
            let choice = if approve { "once" } else { "deny" };
            let path = format!("/v1/runs/{hermes_run}/approval");
            let _ = run_blocking(move || client.post(&path, &json!({"choice": choice}))).await;
        });
    }
}

impl Agent for HermesAgent {
    fn name(&self) -> &str {
        "hermes"
    }

    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_> {
        Box::pin(self.go(req, cancel, chunks))
    }

    fn approvals(&self) -> Option<Arc<Approvals>> {
        Some(Arc::clone(&self.approvals))
    }
}

/// Runs a short blocking request on its own thread, waiting at most [`CONTROL_TIMEOUT`] plus a
/// second for it.
async fn run_blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("hermes-control".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    tokio::time::timeout(CONTROL_TIMEOUT + Duration::from_secs(1), rx).await.ok()?.ok()
}

fn http_agent(timeout: Duration) -> ureq::Agent {
    // Loopback or the operator's own network: the API server speaks plain http (hermes has no
    // TLS listener); proxies from the environment are not for it.
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout + Duration::from_secs(1)))
        .timeout_connect(Some(Duration::from_secs(2)))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .new_agent()
}

/// Why an attempt did not give a reply.
enum Step {
    /// hermes is down, restarting, or lost the run: try again once it answers.
    Down(String),
    /// The run ends with this.
    End(AgentError),
}

#[derive(Clone)]
struct Client {
    http: ureq::Agent,
    url: String,
    key: Secret,
}

impl Client {
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<ureq::http::Response<ureq::Body>, Step> {
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {}", self.key.expose());
        let r = match (method, body) {
            ("POST", Some(b)) => self
                .http
                .post(&url)
                .header("Authorization", &auth)
                .config()
                .timeout_recv_response(Some(HEAD_TIMEOUT))
                .build()
                .send_json(b),
            _ => self
                .http
                .get(&url)
                .header("Authorization", &auth)
                .header("Accept", "application/json, text/event-stream")
                .config()
                .timeout_recv_response(Some(HEAD_TIMEOUT))
                .build()
                .call(),
        };
        r.map_err(|e| Step::Down(format!("{url}: {e}")))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, Step> {
        let mut r = self.request("POST", path, Some(body))?;
        json_of(&mut r, path)
    }

    fn get_json(&self, path: &str) -> Result<(u16, Value), Step> {
        let mut r = self.request("GET", path, None)?;
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(|e| Step::Down(format!("{path}: reading the response: {e}")))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

/// The JSON of a success response; hermes's errors and restarts mapped to [`Step`].
fn json_of(r: &mut ureq::http::Response<ureq::Body>, path: &str) -> Result<Value, Step> {
    let status = r.status().as_u16();
    let text = r.body_mut().with_config().limit(MAX_BODY_BYTES).read_to_string().unwrap_or_default();
    match status {
        200..=299 => serde_json::from_str(&text)
            .map_err(|e| Step::End(AgentError::Failed(format!("hermes {path}: response is not JSON ({e})")))),
        // Busy (max_concurrent_runs), restarting, or a proxy in front of it.
        429 | 500..=599 => Err(Step::Down(format!("hermes {path}: HTTP {status}"))),
        _ => Err(Step::End(AgentError::Upstream { status, body: super::tail(text.trim(), ERROR_BODY_BYTES) })),
    }
}

/// One run, on its own thread.
struct RunThread {
    client: Client,
    input: Value,
    session: Option<String>,
    session_key: Option<String>,
    fallback_history: Vec<Turn>,
    history_chars: usize,
    history_turns: usize,
    deadline: Instant,
    cancel: CancellationToken,
}

impl RunThread {
    fn run(self, tx: &mpsc::Sender<Ev>) {
        loop {
            if self.cancel.is_cancelled() || Instant::now() >= self.deadline {
                return;
            }
            match self.attempt(tx) {
                Ok(reply) => {
                    let _ = tx.blocking_send(Ev::Done(Ok(reply)));
                    return;
                }
                Err(Step::End(e)) => {
                    let _ = tx.blocking_send(Ev::Done(Err(e)));
                    return;
                }
                // Waits in the journal's `running` row until hermes is back or the run's
                // timeout_s is spent.
                Err(Step::Down(_why)) => {
                    let until = Instant::now() + RETRY_PAUSE;
                    while Instant::now() < until && !self.cancel.is_cancelled() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
    }

    /// The conversation so far: hermes's session, else the journal's.
    fn history(&self) -> Result<Vec<Turn>, Step> {
        if self.history_turns == 0 {
            return Ok(Vec::new());
        }
        let Some(sid) = &self.session else { return Ok(self.fallback_history.clone()) };
        let (status, v) = self.client.get_json(&format!("/api/sessions/{sid}/messages"))?;
        match status {
            200 => Ok(session_turns(&v, self.history_turns, self.history_chars)),
            404 => Ok(self.fallback_history.clone()),
            429 | 500..=599 => Err(Step::Down(format!("hermes session {sid}: HTTP {status}"))),
            _ => Err(Step::End(AgentError::Upstream { status, body: super::tail(&v.to_string(), ERROR_BODY_BYTES) })),
        }
    }

    fn attempt(&self, tx: &mpsc::Sender<Ev>) -> Result<AgentReply, Step> {
        let history = self.history()?;
        let mut body = json!({
            "input": self.input,
            "conversation_history": history.iter().map(|t| json!({"role": t.role, "content": t.content})).collect::<Vec<_>>(),
        });
        if let Some(sid) = &self.session {
            body["session_id"] = json!(sid);
        }
        let mut req = self
            .client
            .http
            .post(format!("{}/v1/runs", self.client.url))
            .header("Authorization", format!("Bearer {}", self.client.key.expose()));
        if let Some(k) = &self.session_key {
            req = req.header("X-Hermes-Session-Key", k);
        }
        let mut r = req
            .config()
            .timeout_recv_response(Some(HEAD_TIMEOUT))
            .build()
            .send_json(&body)
            .map_err(|e| Step::Down(format!("hermes /v1/runs: {e}")))?;
        let started = json_of(&mut r, "/v1/runs")?;
        let Some(run_id) = started.get("run_id").and_then(Value::as_str).map(str::to_owned) else {
            return Err(Step::End(AgentError::Failed("hermes /v1/runs: no run_id in the answer".into())));
        };
        if tx.blocking_send(Ev::Started(run_id.clone())).is_err() {
            return Err(Step::End(AgentError::Cancelled));
        }
        match self.follow(&run_id, tx) {
            Ok(Some(reply)) => Ok(reply),
            Err(e) => Err(e),
            // The stream ended without a terminal event: ask for the run's status.
            Ok(None) => self.poll(&run_id),
        }
    }

    /// Reads the run's events; `None` when the stream ended without a terminal event.
    fn follow(&self, run_id: &str, tx: &mpsc::Sender<Ev>) -> Result<Option<AgentReply>, Step> {
        let r = self.client.request("GET", &format!("/v1/runs/{run_id}/events"), None)?;
        match r.status().as_u16() {
            200 => {}
            // Gone (a restarted hermes does not know it): start over.
            404 => return Err(Step::Down(format!("hermes forgot run {run_id}"))),
            s => return Err(Step::Down(format!("hermes run {run_id} events: HTTP {s}"))),
        }
        let mut reader = r.into_body().into_reader();
        let mut decoder = SseDecoder::new(MAX_LINE_BYTES, MAX_EVENT_BYTES);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if self.cancel.is_cancelled() {
                return Err(Step::End(AgentError::Cancelled));
            }
            let n = match reader.read(&mut buf) {
                Ok(n) => n,
                // hermes died mid-run, or the connection broke.
                Err(_) => return Ok(None),
            };
            let events =
                if n == 0 { decoder.finish().map(|e| e.into_iter().collect()) } else { decoder.push(&buf[..n]) };
            let events = events.map_err(|e| Step::End(AgentError::Failed(format!("hermes run events: {e}"))))?;
            for data in events {
                let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
                match event(&v) {
                    Event::Delta(d) => {
                        if tx.blocking_send(Ev::Delta(d)).is_err() {
                            return Err(Step::End(AgentError::Cancelled));
                        }
                    }
                    Event::Progress(p) => {
                        let _ = tx.try_send(Ev::Progress(p));
                    }
                    Event::Approval(what) => {
                        if tx.blocking_send(Ev::Approval { hermes_run: run_id.to_owned(), what }).is_err() {
                            return Err(Step::End(AgentError::Cancelled));
                        }
                    }
                    Event::End(r) => return r.map(Some).map_err(Step::End),
                    Event::Other => {}
                }
            }
            if n == 0 {
                return Ok(None);
            }
        }
    }

    /// After the stream ended early: the run's status until it is final (hermes keeps it an
    /// hour), or [`Step::Down`] when hermes is gone.
    fn poll(&self, run_id: &str) -> Result<AgentReply, Step> {
        loop {
            if self.cancel.is_cancelled() || Instant::now() >= self.deadline {
                return Err(Step::End(AgentError::Cancelled));
            }
            let (status, v) = self.client.get_json(&format!("/v1/runs/{run_id}"))?;
            if status == 404 {
                return Err(Step::Down(format!("hermes forgot run {run_id}")));
            }
            match v.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(completed(&v)),
                Some("failed") => return Err(Step::End(failed(&v))),
                Some("cancelled") => return Err(Step::End(AgentError::Cancelled)),
                _ => std::thread::sleep(RETRY_PAUSE),
            }
        }
    }
}

enum Event {
    Delta(String),
    Progress(String),
    Approval(String),
    End(Result<AgentReply, AgentError>),
    Other,
}

/// One `/v1/runs/{id}/events` event (hermes's api_server.py `_handle_runs`).
fn event(v: &Value) -> Event {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    match v.get("event").and_then(Value::as_str).unwrap_or_default() {
        "message.delta" => Event::Delta(s("delta")),
        "tool.started" => Event::Progress(format!("{}: {}", s("tool"), s("preview"))),
        "tool.completed" => Event::Progress(format!("{} done", s("tool"))),
        "approval.request" => {
            let (cmd, desc) = (s("command"), s("description"));
            Event::Approval(match (cmd.is_empty(), desc.is_empty()) {
                (false, false) => format!("{cmd} ({desc})"),
                (false, true) => cmd,
                _ => desc,
            })
        }
        "run.completed" => Event::End(Ok(completed(v))),
        "run.failed" => Event::End(Err(failed(v))),
        "run.cancelled" => Event::End(Err(AgentError::Cancelled)),
        _ => Event::Other,
    }
}

fn completed(v: &Value) -> AgentReply {
    let text = v.get("output").and_then(Value::as_str).unwrap_or_default().to_owned();
    let n = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64).unwrap_or(0);
    let (p, c) = (n("input_tokens"), n("output_tokens"));
    AgentReply {
        text,
        usage: (p + c > 0).then_some(Usage { prompt_tokens: p, completion_tokens: c }),
        files: Vec::new(),
    }
}

/// The files a reply's `MEDIA:<path>` tags name (hermes-agent 0.19.0 gateway/platforms/base.py
/// `MEDIA_TAG_CLEANUP_RE`: an absolute path, bare or quoted), and the text without those tags.
/// Only a regular file in the hermes `home`'s media caches is taken ([`under_home`]); any other tag stays in
/// the text as hermes wrote it. The runtime copies the files into the store under
/// `[attachments]`, never through a link (crates/runtime/src/worker/run.rs `with_files`).
fn media_files(text: &str, home: &std::path::Path) -> (String, Vec<std::path::PathBuf>) {
    const TAG: &str = "MEDIA:";
    if !text.contains(TAG) {
        return (text.to_owned(), Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut files = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(TAG) {
        let (before, tag) = rest.split_at(at);
        let after = tag[TAG.len()..].trim_start_matches([' ', '\t']);
        let quote = after.chars().next().filter(|c| matches!(c, '`' | '"' | '\''));
        let (raw, len) = match quote {
            Some(q) => match after[1..].find(q) {
                Some(end) => (&after[1..=end], end + 2),
                None => ("", 0),
            },
            None => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                let path = after[..end].trim_end_matches([',', '.', ';', ':', ')', '}', ']', '`', '"', '\'']);
                (path, path.len())
            }
        };
        let taken = (!raw.is_empty()).then(|| under_home(std::path::Path::new(raw), home)).flatten();
        match taken {
            Some(path) => {
                // The quote hermes may open the tag with goes too (`"MEDIA:/a.png"`).
                let before = before.strip_suffix(['`', '"', '\'']).unwrap_or(before);
                out.push_str(before.trim_end_matches([' ', '\t']));
                files.push(path);
                // And the quote it may close with (`MEDIA:/a.png`).
                rest = after[len..].strip_prefix(['`', '"', '\'']).unwrap_or(&after[len..]);
            }
            None => {
                out.push_str(before);
                out.push_str(TAG);
                rest = &tag[TAG.len()..];
            }
        }
    }
    out.push_str(rest);
    (out.trim().to_owned(), files)
}

/// Where under a hermes home its tools leave the files a reply names (hermes-agent 0.19.0
/// gateway/platforms/base.py `MEDIA_DELIVERY_SAFE_ROOTS`). The rest of the home holds its
/// secrets (`.env`, `auth.json`, `config.yaml`) and state, never sent to a chat.
const MEDIA_ROOTS: &[&str] =
    &["cache", "image_cache", "audio_cache", "video_cache", "document_cache", "browser_screenshots"];

/// `path` as a regular file in one of the hermes `home`'s [`MEDIA_ROOTS`]: absolute, without
/// `..`, not itself a link, and inside them once every link on the way is resolved (a link out
/// of them is refused).
fn under_home(path: &std::path::Path, home: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::path::Component;
    if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return None;
    }
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let real = std::fs::canonicalize(path).ok()?;
    let home = std::fs::canonicalize(home).ok()?;
    MEDIA_ROOTS.iter().any(|r| real.starts_with(home.join(r))).then_some(real)
}

fn failed(v: &Value) -> AgentError {
    let why = v.get("error").and_then(Value::as_str).unwrap_or("agent run failed");
    AgentError::Failed(format!("hermes: {}", super::tail(why, ERROR_BODY_BYTES)))
}

/// The text turns of a hermes session (`GET /api/sessions/{id}/messages`), oldest first:
/// user and assistant messages with text (tool calls and results stay hermes's), without a
/// trailing user turn (an interrupted run: its message is the input again), the newest
/// `turns` pairs within `chars`.
fn session_turns(v: &Value, turns: usize, chars: usize) -> Vec<Turn> {
    let mut out: Vec<Turn> = v
        .get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let role = m.get("role").and_then(Value::as_str)?;
            let content = m.get("content").and_then(Value::as_str)?.trim();
            (matches!(role, "user" | "assistant") && !content.is_empty()).then(|| Turn::new(role, content))
        })
        .collect();
    while out.last().is_some_and(|t| t.role == "user") {
        out.pop();
    }
    let skip = out.len().saturating_sub(turns.saturating_mul(2));
    super::within_budget(out.split_off(skip), chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `MEDIA:<path>` tags of a reply: a regular file in the hermes home's caches becomes a
    /// file of the reply and its tag leaves the text; a path outside them (the home's `.env`
    /// too), through a link out of them, with `..`, relative or missing stays in the text.
    #[cfg(unix)]
    #[test]
    fn media_tags_under_the_hermes_home_become_reply_files() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("hermes");
        std::fs::create_dir_all(home.join("cache")).unwrap();
        let png = home.join("cache/out.png");
        std::fs::write(&png, b"png").unwrap();
        let outside = d.path().join("secret.png");
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::write(home.join(".env"), b"API_SERVER_KEY=k").unwrap();
        std::os::unix::fs::symlink(&outside, home.join("cache/link.png")).unwrap();
        let real = std::fs::canonicalize(&png).unwrap();
        let (p, h) = (png.display(), home.display());

        let (text, files) = media_files(&format!("here it is: MEDIA:{p}\nenjoy."), &home);
        assert_eq!((text.as_str(), files.clone()), ("here it is:\nenjoy.", vec![real.clone()]));
        let (text, files) = media_files(&format!("`MEDIA:{p}`, and \"MEDIA:{p}\"."), &home);
        assert_eq!((text.as_str(), files.len()), (", and.", 2), "quoted tags");
        let (text, files) = media_files(&format!("MEDIA: {p})"), &home);
        assert_eq!((text.as_str(), files), (")", vec![real]));
        for kept in [
            format!("MEDIA:{}", outside.display()),
            format!("MEDIA:{h}/cache/link.png"),
            format!("MEDIA:{h}/.env"),
            format!("MEDIA:{h}/cache/../cache/out.png"),
            "MEDIA:cache/out.png".to_owned(),
            format!("MEDIA:{h}/cache/missing.png"),
            format!("MEDIA:{h}/cache"),
            "MEDIA:".to_owned(),
            "no tag at all".to_owned(),
        ] {
            assert_eq!(media_files(&kept, &home), (kept.clone(), vec![]), "{kept}");
        }
    }

    #[test]
    fn session_ids_are_stable_and_move_with_new() {
        let a = session_id("tg", "42", Some("2026-01-01T00:00:00.000000+00:00"));
        assert_eq!(a, session_id("tg", "42", Some("2026-01-01T00:00:00.000000+00:00")));
        assert_ne!(a, session_id("tg", "42", Some("2026-01-02T00:00:00.000000+00:00")));
        assert_ne!(a, session_id("tg", "43", Some("2026-01-01T00:00:00.000000+00:00")));
        // Lengths are part of the hash: no two splits of the same bytes collide.
        assert_ne!(session_id("t", "g42", None), session_id("tg", "42", None));
        assert_eq!(a.len(), 3 + 32);
        assert_eq!(session_key("tg", "42"), session_key("tg", "42"));
        assert_ne!(session_key("tg", "42"), session_id("tg", "42", None));
    }

    /// An HTTP API conversation has a session of its own (never a platform chat's of the same
    /// id); a one-shot call has none.
    #[test]
    fn http_conversations_have_sessions_and_one_shot_calls_none() {
        let mut req = AgentRequest::new("r", "42", "u", "hi", Vec::new());
        assert_eq!(req.session_scope(), None, "one-shot");
        req.http_conversation = true;
        let http = req.session_scope().map(|p| session_id(p, &req.chat_id, None));
        assert!(http.is_some());
        assert_ne!(http, Some(session_id("tg", "42", None)));
        req.platform = Some("tg".into());
        assert_eq!(req.session_scope(), Some("tg"), "a platform chat's is the platform's");
    }

    #[test]
    fn session_turns_keep_text_and_drop_an_interrupted_question() {
        let v = json!({"data": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": null, "tool_calls": [{}]},
            {"role": "tool", "content": "output"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]});
        assert_eq!(session_turns(&v, 10, 1000), vec![Turn::new("user", "a"), Turn::new("assistant", "b")]);
        assert!(session_turns(&v, 0, 1000).is_empty());
        assert!(session_turns(&json!({"error": {}}), 10, 1000).is_empty());
    }

    #[test]
    fn events_map_to_the_run() {
        let done = json!({"event": "run.completed", "output": "hi", "usage": {"input_tokens": 3, "output_tokens": 2}});
        match event(&done) {
            Event::End(Ok(r)) => {
                assert_eq!(r.text, "hi");
                assert_eq!(r.usage, Some(Usage { prompt_tokens: 3, completion_tokens: 2 }));
            }
            _ => panic!("run.completed is the end"),
        }
        assert!(matches!(event(&json!({"event": "run.failed", "error": "x"})), Event::End(Err(AgentError::Failed(_)))));
        assert!(matches!(event(&json!({"event": "run.cancelled"})), Event::End(Err(AgentError::Cancelled))));
        let ask = json!({"event": "approval.request", "command": "rm -rf /x", "description": "delete in root path"});
        assert!(matches!(event(&ask), Event::Approval(w) if w == "rm -rf /x (delete in root path)"));
        assert!(matches!(event(&json!({"event": "message.delta", "delta": "h"})), Event::Delta(d) if d == "h"));
        assert!(matches!(event(&json!({"event": "hermes.new"})), Event::Other));
    }

    #[test]
    fn dotenv_reads_hermes_settings() {
        let env = parse_dotenv("# c\nexport API_SERVER_KEY=\"abc def\"\nAPI_SERVER_PORT=8650 # port\nX='q'\nbad\n");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("API_SERVER_KEY"), Some("abc def"));
        assert_eq!(get("API_SERVER_PORT"), Some("8650"));
        assert_eq!(get("X"), Some("q"));
        assert_eq!(get("bad"), None);
    }
}
