//! `openai`: any OpenAI-compatible chat-completions upstream.
//!
//! Each run POSTs `{"model": …, "messages": [<history>…, {"role": "user", "content": <text>}], "stream": …}`
//! to `<base_url>/chat/completions`, with `Authorization: Bearer <key>` when a key is configured
//! (`api_key_env` names the environment variable; it is read at each run, and a missing variable
//! fails the run with a message naming it). The reply is `choices[0].message.content`; streaming
//! parses the server-sent events (`data: {json}` lines, ended by `data: [DONE]`) and passes each
//! `choices[0].delta.content` through as a chunk. A non-2xx status becomes
//! [`AgentError::Upstream`] with (the start of) the body.
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

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Agent, AgentError, AgentFuture, AgentReply, AgentRequest, send_chunk, with_timeout};

/// Bytes of an error body kept in [`AgentError::Upstream`].
const ERROR_BODY_BYTES: usize = 4096;
/// Largest non-streaming response body read.
const MAX_BODY_BYTES: u64 = 16 << 20;
/// Largest single SSE line.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// Where the API key comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum ApiKey {
    /// No `Authorization` header (local servers).
    None,
    /// Read this environment variable at each run.
    Env(String),
    /// A literal key (tests, embedding).
    Value(String),
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiKey::None => f.write_str("None"),
            ApiKey::Env(name) => f.debug_tuple("Env").field(name).finish(),
            ApiKey::Value(_) => f.write_str("Value(<redacted>)"),
        }
    }
}

impl ApiKey {
    fn resolve(&self) -> Result<Option<String>, AgentError> {
        match self {
            ApiKey::None => Ok(None),
            ApiKey::Value(v) => Ok(Some(v.clone())),
            ApiKey::Env(name) => match std::env::var(name) {
                Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_string())),
                Ok(_) => Err(AgentError::Failed(format!(
                    "openai backend: environment variable {name} (api_key_env) is empty"
                ))),
                Err(std::env::VarError::NotPresent) => Err(AgentError::Failed(format!(
                    "openai backend: environment variable {name} (api_key_env) is not set"
                ))),
                Err(std::env::VarError::NotUnicode(_)) => Err(AgentError::Failed(format!(
                    "openai backend: environment variable {name} (api_key_env) is not valid UTF-8"
                ))),
            },
        }
    }
}

/// Talks to an OpenAI-compatible upstream.
#[derive(Debug, Clone)]
pub struct OpenAiAgent {
    url: String,
    model: String,
    key: ApiKey,
    timeout: Duration,
    /// `Err`: the TLS settings could not be loaded (a `ca_file` gone since the configuration
    /// was checked); every run fails with it.
    http: Result<ureq::Agent, String>,
}

impl OpenAiAgent {
    /// `base_url` like `https://api.openai.com/v1` (a trailing `/` is fine); the system trust
    /// store and the environment's proxy.
    pub fn new(base_url: String, model: String, key: ApiKey, timeout: Duration) -> Self {
        let http = Ok(http_agent(&gatewarden_net::Outbound::system(), timeout));
        OpenAiAgent {
            url: format!("{}/chat/completions", base_url.trim().trim_end_matches('/')),
            model,
            key,
            timeout,
            http,
        }
    }

    /// The same with the upstream's own TLS and proxy settings (`[agent] ca_file`).
    pub fn with_outbound(mut self, out: Result<gatewarden_net::Outbound, gatewarden_net::NetError>) -> Self {
        self.http = out.map(|o| http_agent(&o, self.timeout)).map_err(|e| format!("openai backend: [agent] {e}"));
        self
    }

    /// The endpoint posted to.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn go(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        with_timeout(self.timeout, &cancel, |cancel| self.call(req, cancel, chunks)).await
    }

    async fn call(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        if cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        if self.model.is_empty() || self.url.starts_with("/chat") {
            return Err(AgentError::Failed("openai backend: base_url and model must be configured".into()));
        }
        let key = self.key.resolve()?;
        let http = self.http.clone().map_err(AgentError::Failed)?;
        let streaming = chunks.is_some();
        let mut messages: Vec<Value> =
            req.history.iter().map(|t| json!({"role": t.role, "content": t.content})).collect();
        messages.push(json!({"role": "user", "content": req.text}));
        let body = json!({"model": self.model, "messages": messages, "stream": streaming});
        let call = Call { http, url: self.url.clone(), key, body, cancel: cancel.clone() };
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
            .map_err(|e| AgentError::Failed(format!("openai backend: cannot start a worker thread: {e}")))?;

        let mut streamed = String::new();
        let mut deltas_open = streaming;
        loop {
            tokio::select! {
                delta = delta_rx.recv(), if deltas_open => match delta {
                    Some(delta) => {
                        streamed.push_str(&delta);
                        if let Some(chunks) = &chunks {
                            send_chunk(chunks, &cancel, delta).await?;
                        }
                    }
                    None => deltas_open = false,
                },
                joined = &mut worker, if !deltas_open => {
                    return match joined {
                        Ok(Ok(Some(text))) => Ok(AgentReply { text }),
                        Ok(Ok(None)) => Ok(AgentReply { text: streamed }),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(AgentError::Failed("openai backend: the worker thread died".into())),
                    };
                }
                () = cancel.cancelled() => return Err(AgentError::Cancelled),
            }
        }
    }
}

fn http_agent(out: &gatewarden_net::Outbound, timeout: Duration) -> ureq::Agent {
    gatewarden_net::http_config(out)
        // The async side reports the timeout; this only bounds the blocking thread.
        .timeout_global(Some(timeout + Duration::from_secs(1)))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// One upstream request, run on a blocking thread.
struct Call {
    http: ureq::Agent,
    url: String,
    key: Option<String>,
    body: Value,
    cancel: CancellationToken,
}

impl Call {
    fn send(&self) -> Result<ureq::http::Response<ureq::Body>, AgentError> {
        let mut request = self.http.post(&self.url).header("Content-Type", "application/json");
        if let Some(key) = &self.key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        if self.body["stream"] == Value::Bool(true) {
            request = request.header("Accept", "text/event-stream");
        }
        let mut response = request.send_json(&self.body).map_err(|e| {
            AgentError::Failed(format!("upstream {}: {}", self.url, gatewarden_net::describe(&e, &self.url)))
        })?;
        let status = response.status();
        if !status.is_success() {
            let body = response
                .body_mut()
                .with_config()
                .limit(ERROR_BODY_BYTES as u64 * 4)
                .read_to_string()
                .unwrap_or_default();
            return Err(AgentError::Upstream {
                status: status.as_u16(),
                body: truncate(body.trim(), ERROR_BODY_BYTES),
            });
        }
        Ok(response)
    }

    /// Non-streaming: the whole reply, as `Some(text)`.
    fn complete(&self) -> Result<Option<String>, AgentError> {
        let mut response = self.send()?;
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(|e| AgentError::Failed(format!("reading upstream response: {e}")))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            AgentError::Failed(format!("upstream response is not JSON ({e}): {}", truncate(&text, 200)))
        })?;
        match value.pointer("/choices/0/message/content") {
            Some(Value::String(content)) => Ok(Some(content.clone())),
            _ => Err(AgentError::Failed(format!(
                "upstream response has no choices[0].message.content: {}",
                truncate(&text, 200)
            ))),
        }
    }

    /// Streaming: deltas go to `deltas`; `Ok(None)` means "the reply is what was streamed".
    fn streaming(&self, deltas: &mpsc::Sender<String>) -> Result<Option<String>, AgentError> {
        let response = self.send()?;
        let mut reader = BufReader::new(response.into_body().into_reader());
        let mut finished = false;
        let mut line = Vec::new();
        loop {
            if self.cancel.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            line.clear();
            let n = (&mut reader)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut line)
                .map_err(|e| AgentError::Failed(format!("reading upstream stream: {e}")))?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') && n as u64 == MAX_LINE_BYTES {
                return Err(AgentError::Failed(format!("upstream stream line longer than {MAX_LINE_BYTES} bytes")));
            }
            let text = String::from_utf8_lossy(&line);
            match parse_sse_line(&text)? {
                SseLine::Ignore => {}
                SseLine::Done => return Ok(None),
                SseLine::Delta { content, finish } => {
                    finished |= finish;
                    if let Some(content) = content
                        && deltas.blocking_send(content).is_err()
                    {
                        // The async side is gone (cancelled or timed out).
                        return Err(AgentError::Cancelled);
                    }
                }
            }
        }
        if finished { Ok(None) } else { Err(AgentError::Failed("upstream stream ended before [DONE]".into())) }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum SseLine {
    /// Blank line, comment, `event:`/`id:`/`retry:` field, or a data event without content.
    Ignore,
    /// `data: [DONE]`.
    Done,
    /// A chat.completion.chunk.
    Delta { content: Option<String>, finish: bool },
}

/// Parses one line of an OpenAI server-sent-event stream.
fn parse_sse_line(line: &str) -> Result<SseLine, AgentError> {
    let line = line.trim_end_matches(['\n', '\r']);
    let Some(data) = line.strip_prefix("data:") else {
        return Ok(SseLine::Ignore);
    };
    let data = data.strip_prefix(' ').unwrap_or(data);
    if data.trim() == "[DONE]" {
        return Ok(SseLine::Done);
    }
    if data.trim().is_empty() {
        return Ok(SseLine::Ignore);
    }
    let value: Value = serde_json::from_str(data)
        .map_err(|e| AgentError::Failed(format!("upstream stream event is not JSON ({e}): {}", truncate(data, 200))))?;
    if let Some(error) = value.get("error") {
        return Err(AgentError::Failed(format!(
            "upstream stream error: {}",
            truncate(&error.to_string(), ERROR_BODY_BYTES)
        )));
    }
    let content = match value.pointer("/choices/0/delta/content") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let finish = matches!(value.pointer("/choices/0/finish_reason"), Some(Value::String(_)));
    Ok(SseLine::Delta { content, finish })
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines() {
        assert_eq!(parse_sse_line("\n").unwrap(), SseLine::Ignore);
        assert_eq!(parse_sse_line(": keep-alive\n").unwrap(), SseLine::Ignore);
        assert_eq!(parse_sse_line("event: x\r\n").unwrap(), SseLine::Ignore);
        assert_eq!(parse_sse_line("data: [DONE]\r\n").unwrap(), SseLine::Done);
        assert_eq!(parse_sse_line("data:[DONE]").unwrap(), SseLine::Done);
        assert_eq!(
            parse_sse_line(r#"data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#).unwrap(),
            SseLine::Delta { content: Some("hi".into()), finish: false }
        );
        assert_eq!(
            parse_sse_line(r#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}"#).unwrap(),
            SseLine::Delta { content: None, finish: true }
        );
        assert!(parse_sse_line("data: {nope").is_err());
        assert!(parse_sse_line(r#"data: {"error":{"message":"boom"}}"#).is_err());
    }

    #[test]
    fn missing_env_key_is_named() {
        let key = ApiKey::Env("GATEWARDEN_TEST_SURELY_UNSET_7f3a9c".into());
        let e = key.resolve().unwrap_err().to_string();
        assert!(e.contains("GATEWARDEN_TEST_SURELY_UNSET_7f3a9c"), "{e}");
        assert!(e.contains("not set"), "{e}");
        assert!(!format!("{:?}", ApiKey::Value("sk-secret".into())).contains("sk-secret"));
    }

    #[test]
    fn url_joins_base() {
        let a = OpenAiAgent::new("http://h/v1/".into(), "m".into(), ApiKey::None, Duration::from_secs(1));
        assert_eq!(a.url(), "http://h/v1/chat/completions");
    }

    #[test]
    fn truncate_respects_chars() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
