//! A fake OpenAI-compatible provider on loopback, scripted per test, that records when and what
//! it was asked.
//!
//! What it models of the public OpenAI API (https://platform.openai.com/docs/api-reference/chat):
//! - `POST /v1/chat/completions` with a JSON body (`model`, `messages`, `stream`,
//!   `stream_options.include_usage`); any other path is a 404 with an `error` object, except:
//! - `GET /v1/models` (https://platform.openai.com/docs/api-reference/models/list): a `list` of
//!   one `model` object (`id` `fake-model`, `created`, `owned_by`), and `GET /v1/models/{id}`
//!   (…/models/retrieve) that object (clients probe these before their first call).
//! - A non-streaming answer is a `chat.completion` object: `choices[0].message.content`,
//!   `finish_reason: "stop"`, and `usage` (`prompt_tokens`, `completion_tokens`,
//!   `total_tokens`).
//! - A streaming answer (`stream: true`) is `text/event-stream`: one `data: {json}` event per
//!   `chat.completion.chunk` (the first with `delta.role`, then `delta.content` pieces, then an
//!   empty delta with `finish_reason`), each followed by a blank line; with
//!   `stream_options.include_usage` a last chunk with empty `choices` and the `usage`; then
//!   `data: [DONE]`.
//! - Errors are `{"error": {"message", "type", "code"}}` with the HTTP status; a 429 (rate
//!   limit) may carry `Retry-After` (seconds or an HTTP date).
//! - With [`FakeLlm::require_key`], a request without `Authorization: Bearer <that key>` gets
//!   a 401 `invalid_api_key`, as OpenAI answers a wrong key; [`FakeLlm::set_clock`] puts a
//!   `Date` header (the fake's clock, set off by the given offset) on the model list.
//! - Tool calls (https://platform.openai.com/docs/guides/function-calling): the assistant
//!   message has `content: null` and `tool_calls: [{id, type: "function", function: {name,
//!   arguments}}]` (`arguments` a JSON string), `finish_reason: "tool_calls"`; streamed, the
//!   first delta carries the calls with their `index`. The caller then sends the tool's result
//!   as a `role: "tool"` message with the call's `tool_call_id`.
//! - `POST /v1/audio/transcriptions`
//!   (https://platform.openai.com/docs/api-reference/audio/createTranscription): a
//!   `multipart/form-data` body (with a `Content-Length`; else 411) with the parts `file`
//!   (required), `model` (required: else 400), `language` and `response_format` (optional);
//!   answers `{"text": …}` (`response_format=text`: the plain text). The transcript is the one
//!   set with [`FakeLlm::set_transcript`], else the printable ASCII runs of the file's bytes
//!   (so a test's "audio" can say what it is). Each call is recorded ([`FakeLlm::transcriptions`]:
//!   model, language, file name, type and size, the `Authorization` header), apart from the
//!   chat requests; [`FakeLlm::fail_transcriptions`] makes them answer an error status.
//!
//! Scripting: answers queued with [`FakeLlm::then`] are given in arrival order; rules
//! ([`FakeLlm::on`]) answer by the request's last message instead, so an agent that makes
//! extra calls of its own (hermes-agent titles its sessions) still meets its script. A
//! [`Reply::Held`] answer waits for [`FakeLlm::release`] (a run kept in flight on purpose), or
//! ends unanswered when the caller closes its connection first. [`Reply::Broken`] drops the
//! connection part-way through an answer, [`Reply::Endless`] never finishes one.
//!
//! Every response is `Connection: close` (no keep-alive to reason about). Plain std threads,
//! like the other fakes in netfakes.rs.

use std::collections::VecDeque;
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use gatewarden_fakewire::http1;

use crate::netfakes::Listener;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A completion with this text (streamed word by word when the request streams) and usage
    /// `(prompt_tokens, completion_tokens)`.
    Text { text: String, usage: Option<(u64, u64)> },
    /// An error status with an OpenAI error body, and `Retry-After` when given.
    Status { code: u16, retry_after: Option<String> },
    /// Read the request, then answer nothing (until the fake is dropped).
    Hang,
    /// An assistant message calling one tool (`arguments` is sent as a JSON string).
    ToolCall { name: String, arguments: Value },
    /// `echo: <the last user message>`.
    Echo,
    /// Waits for [`FakeLlm::release`] (or the fake's drop), then answers the inner reply.
    Held(Box<Reply>),
    /// Starts answering `text` (streamed word by word, or a JSON body cut short), then drops
    /// the connection before the answer is complete: no `finish_reason`, no `[DONE]`.
    Broken { text: String },
    /// Streams content forever (16 KiB a chunk, `chunk_gap` apart) until the caller goes away
    /// or the fake is dropped; a non-streaming request gets a JSON body that never ends.
    Endless,
}

impl Reply {
    pub fn text(text: &str) -> Reply {
        Reply::Text { text: text.into(), usage: Some((7, 3)) }
    }

    pub fn status(code: u16) -> Reply {
        Reply::Status { code, retry_after: None }
    }

    pub fn rate_limited(retry_after: &str) -> Reply {
        Reply::Status { code: 429, retry_after: Some(retry_after.into()) }
    }

    pub fn tool(name: &str, arguments: Value) -> Reply {
        Reply::ToolCall { name: name.into(), arguments }
    }

    /// `then`, once [`FakeLlm::release`] is called.
    pub fn held(then: Reply) -> Reply {
        Reply::Held(Box::new(then))
    }

    /// `text` begun, then the connection dropped ([`Reply::Broken`]).
    pub fn broken(text: &str) -> Reply {
        Reply::Broken { text: text.into() }
    }
}

/// Answers for requests whose last message has `role` and contains `contains`: the replies in
/// order, the last one repeated.
#[derive(Debug)]
struct Rule {
    role: String,
    contains: String,
    replies: VecDeque<Reply>,
}

/// A request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When its head was read.
    pub at: Instant,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
struct Script {
    next: VecDeque<Reply>,
    default: Reply,
    seen: Vec<Seen>,
    /// Before the response head (the provider's own latency).
    latency: Duration,
    /// Between two streamed chunks.
    chunk_gap: Duration,
    rules: Vec<Rule>,
    /// [`FakeLlm::release`] calls so far; a held answer waits for the next one.
    released: u64,
    /// Requests holding right now.
    holding: usize,
    /// The API key every request must carry ([`FakeLlm::require_key`]).
    key: Option<String>,
    /// Seconds the fake's clock is ahead of ours (negative: behind), for `Date`.
    clock_offset_s: Option<i64>,
    /// `POST /v1/audio/transcriptions`: its calls and script.
    transcription: Transcription,
}

/// The fake provider. Dropping it stops accepting and releases hanging requests.
pub struct FakeLlm {
    listener: Listener,
    script: Arc<Mutex<Script>>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeLlm {
    /// Answers every request with `default` once the script (see [`FakeLlm::then`]) is spent.
    pub fn start(default: Reply) -> io::Result<FakeLlm> {
        let script = Arc::new(Mutex::new(Script {
            next: VecDeque::new(),
            default,
            seen: Vec::new(),
            latency: Duration::ZERO,
            chunk_gap: Duration::ZERO,
            rules: Vec::new(),
            released: 0,
            holding: 0,
            key: None,
            clock_offset_s: None,
            transcription: Transcription::default(),
        }));
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, stop) = (Arc::clone(&script), Arc::clone(&stopped));
        let listener = Listener::start(move |conn| serve(conn, &s, &stop))?;
        Ok(FakeLlm { listener, script, stopped })
    }

    /// Queues answers for the next requests, in order.
    pub fn then(&self, replies: impl IntoIterator<Item = Reply>) -> &FakeLlm {
        self.lock().next.extend(replies);
        self
    }

    /// Answers a request whose last message has `role` (`user`, `tool`) and contains
    /// `contains` with `replies` in order, the last one for every later match. Rules are
    /// tried in the order they were added, before the queue of [`FakeLlm::then`].
    pub fn on(&self, role: &str, contains: &str, replies: impl IntoIterator<Item = Reply>) -> &FakeLlm {
        let replies: VecDeque<Reply> = replies.into_iter().collect();
        if !replies.is_empty() {
            self.lock().rules.push(Rule { role: role.into(), contains: contains.into(), replies });
        }
        self
    }

    /// Lets every request holding now (a [`Reply::Held`]) answer.
    pub fn release(&self) {
        self.lock().released += 1;
    }

    /// Refuses every request that does not carry `Authorization: Bearer <key>` (401).
    pub fn require_key(&self, key: &str) -> &FakeLlm {
        self.lock().key = Some(key.to_owned());
        self
    }

    /// The model list answers with a `Date` this many seconds off this machine's clock.
    pub fn set_clock(&self, offset_s: i64) -> &FakeLlm {
        self.lock().clock_offset_s = Some(offset_s);
        self
    }

    /// How many requests are holding now.
    pub fn holding(&self) -> usize {
        self.lock().holding
    }

    /// The requests whose last user message contains `text`.
    pub fn asked(&self, text: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| last_of(&s.body, "user").is_some_and(|c| c.contains(text))).collect()
    }

    /// The provider's own latency before each response head, and between streamed chunks.
    pub fn set_latency(&self, head: Duration, chunk_gap: Duration) {
        let mut s = self.lock();
        s.latency = head;
        s.chunk_gap = chunk_gap;
    }

    /// `http://127.0.0.1:<port>/v1`, for `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.listener.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.addr
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// How many requests arrived so far.
    pub fn requests(&self) -> usize {
        self.lock().seen.len()
    }

    /// Every `POST /v1/audio/transcriptions` so far, in arrival order.
    pub fn transcriptions(&self) -> Vec<Transcribed> {
        self.lock().transcription.calls.clone()
    }

    /// Transcriptions answer `text` (instead of the file's printable runs).
    pub fn set_transcript(&self, text: &str) -> &FakeLlm {
        self.lock().transcription.text = Some(text.to_owned());
        self
    }

    /// Transcriptions answer this error status (`None`: they succeed again).
    pub fn fail_transcriptions(&self, status: Option<u16>) -> &FakeLlm {
        self.lock().transcription.fail = status;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn serve(conn: TcpStream, script: &Mutex<Script>, stopped: &std::sync::atomic::AtomicBool) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let Ok(head) = http1::read_head(&mut r) else { return };
    let at = Instant::now();
    let len = head.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0).min(16 << 20);
    let http1::Head { method, target: path, headers } = head;
    if method == "POST" && path.ends_with("/audio/transcriptions") {
        serve_transcription(&mut r, &mut w, &headers, at, script);
        return;
    }
    let mut body = vec![0u8; len];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (reply, latency, gap, key_refused, clock_offset_s) = {
        let mut s = script.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key_refused = s.key.as_ref().is_some_and(|k| {
            let given = headers.iter().find(|(h, _)| h.eq_ignore_ascii_case("authorization")).map(|(_, v)| v.as_str());
            given != Some(format!("Bearer {k}").as_str())
        });
        s.seen.push(Seen { at, path: path.clone(), headers, body: body.clone() });
        let last = body.get("messages").and_then(Value::as_array).and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
        let (role, content) = (last["role"].as_str().unwrap_or_default(), text_of(&last["content"]));
        let ruled = s.rules.iter_mut().find(|r| r.role == role && content.contains(&r.contains)).map(|r| {
            if r.replies.len() > 1 { r.replies.pop_front().unwrap_or(Reply::Echo) } else { r.replies[0].clone() }
        });
        let reply = match ruled {
            Some(r) => r,
            None => s.next.pop_front().unwrap_or_else(|| s.default.clone()),
        };
        (reply, s.latency, s.chunk_gap, key_refused, s.clock_offset_s)
    };
    if key_refused {
        let _ = respond_error(&mut w, 401, None);
        return;
    }
    if method == "GET" && (path == "/v1/models" || path.starts_with("/v1/models/")) {
        let model = |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "gatewarden-fake"});
        let body = match path.strip_prefix("/v1/models/") {
            Some(id) => model(id),
            None => json!({"object": "list", "data": [model("fake-model")]}),
        }
        .to_string();
        let date = clock_offset_s
            .map(|off| {
                let now = std::time::SystemTime::now();
                let at = match u64::try_from(off) {
                    Ok(ahead) => now + Duration::from_secs(ahead),
                    Err(_) => now - Duration::from_secs(off.unsigned_abs()),
                };
                format!("Date: {}\r\n", httpdate::fmt_http_date(at))
            })
            .unwrap_or_default();
        let _ = write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{date}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    if method != "POST" || !path.ends_with("/chat/completions") {
        let _ = respond_error(&mut w, 404, None);
        return;
    }
    std::thread::sleep(latency);
    let reply = match reply {
        Reply::Held(then) => {
            let mark = {
                let mut s = script.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                s.holding += 1;
                s.released
            };
            // The caller may give up first (hermes aborts its request when its run is
            // stopped; a killed process closes it): then nothing is answered.
            let _ = w.set_nonblocking(true);
            let mut gone = false;
            loop {
                let s = script.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if s.released > mark || stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                drop(s);
                if matches!(w.peek(&mut [0u8; 1]), Ok(0)) || matches!(w.peek(&mut [0u8; 1]), Err(ref e) if e.kind() != io::ErrorKind::WouldBlock) {
                    gone = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = w.set_nonblocking(false);
            script.lock().unwrap_or_else(std::sync::PoisonError::into_inner).holding -= 1;
            if gone {
                return;
            }
            *then
        }
        Reply::Echo => Reply::Text { text: format!("echo: {}", last_of(&body, "user").unwrap_or_default()), usage: Some((7, 3)) },
        r => r,
    };
    let _ = match reply {
        Reply::Status { code, retry_after } => respond_error(&mut w, code, retry_after.as_deref()),
        Reply::Hang => {
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }
        Reply::Text { text, usage } if body["stream"] == json!(true) => {
            let include_usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
            respond_stream(&mut w, &body, &text, usage.filter(|_| include_usage), gap)
        }
        Reply::Text { text, usage } => respond_json(&mut w, &body, &text, usage),
        Reply::ToolCall { name, arguments } => respond_tool(&mut w, &body, &name, &arguments, body["stream"] == json!(true)),
        Reply::Broken { text } => respond_broken(&mut w, &body, &text, gap),
        Reply::Endless => respond_endless(&mut w, &body, gap, stopped),
        // Nested holds and echoes are answered as text.
        Reply::Held(_) | Reply::Echo => respond_json(&mut w, &body, "", None),
    };
}

/// A message's text: a string, or the text parts of a content array.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(" "),
        _ => String::new(),
    }
}

/// The content of the last message with `role` in a chat-completions body.
fn last_of(body: &Value, role: &str) -> Option<String> {
    let msgs = body.get("messages")?.as_array()?;
    msgs.iter().rev().find(|m| m["role"] == role).map(|m| text_of(&m["content"]))
}

fn respond_tool(w: &mut TcpStream, req: &Value, name: &str, arguments: &Value, stream: bool) -> io::Result<()> {
    let call = |index: Option<usize>| {
        let mut c = json!({"id": "call_fake_1", "type": "function", "function": {"name": name, "arguments": arguments.to_string()}});
        if let Some(i) = index {
            c["index"] = json!(i);
        }
        c
    };
    if !stream {
        let body = json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": req["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [call(None)]},
                         "finish_reason": "tool_calls"}],
            "usage": usage_json((7, 3)),
        })
        .to_string();
        return write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    for e in [
        chunk(json!({"role": "assistant", "content": null, "tool_calls": [call(Some(0))]}), Value::Null),
        chunk(json!({}), json!("tool_calls")),
    ] {
        write!(w, "data: {e}\n\n")?;
    }
    w.write_all(b"data: [DONE]\n\n")?;
    w.flush()
}

fn usage_json(u: (u64, u64)) -> Value {
    json!({"prompt_tokens": u.0, "completion_tokens": u.1, "total_tokens": u.0 + u.1})
}

fn respond_json(w: &mut TcpStream, req: &Value, text: &str, usage: Option<(u64, u64)>) -> io::Result<()> {
    let mut v = json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": req["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    });
    if let Some(u) = usage {
        v["usage"] = usage_json(u);
    }
    let body = v.to_string();
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn respond_stream(
    w: &mut TcpStream,
    req: &Value,
    text: &str,
    usage: Option<(u64, u64)>,
    gap: Duration,
) -> io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    events.extend(text.split_inclusive(' ').map(|piece| chunk(json!({"content": piece}), Value::Null)));
    events.push(chunk(json!({}), json!("stop")));
    if let Some(u) = usage {
        events.push(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                           "model": req["model"], "choices": [], "usage": usage_json(u)}));
    }
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(gap);
        }
        write!(w, "data: {e}\n\n")?;
        w.flush()?;
    }
    w.write_all(b"data: [DONE]\n\n")?;
    w.flush()
}

/// [`Reply::Broken`]: the head and the first part of the answer, then the connection closes.
fn respond_broken(w: &mut TcpStream, req: &Value, text: &str, gap: Duration) -> io::Result<()> {
    if req["stream"] != json!(true) {
        let body = json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": req["model"],
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
        .to_string();
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.len(),
            &body[..body.len() / 2]
        )?;
        return w.flush();
    }
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    let chunk = |delta: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    };
    write!(w, "data: {}\n\n", chunk(json!({"role": "assistant", "content": ""})))?;
    for piece in text.split_inclusive(' ') {
        std::thread::sleep(gap);
        write!(w, "data: {}\n\n", chunk(json!({"content": piece})))?;
        w.flush()?;
    }
    std::thread::sleep(gap);
    w.shutdown(std::net::Shutdown::Both)
}

/// [`Reply::Endless`]: content until the caller goes away or the fake stops.
fn respond_endless(
    w: &mut TcpStream,
    req: &Value,
    gap: Duration,
    stopped: &std::sync::atomic::AtomicBool,
) -> io::Result<()> {
    let piece = "endless ".repeat(2048);
    if req["stream"] != json!(true) {
        w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")?;
        write!(w, "{{\"choices\": [{{\"message\": {{\"content\": \"")?;
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            w.write_all(piece.as_bytes())?;
            std::thread::sleep(gap);
        }
        return Ok(());
    }
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    let event = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": req["model"],
                       "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
    let line = format!("data: {event}\n\n");
    while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
        w.write_all(line.as_bytes())?;
        std::thread::sleep(gap);
    }
    Ok(())
}

fn respond_error(w: &mut TcpStream, code: u16, retry_after: Option<&str>) -> io::Result<()> {
    let (reason, kind) = match code {
        429 => ("Too Many Requests", "rate_limit_exceeded"),
        400 => ("Bad Request", "invalid_request_error"),
        401 => ("Unauthorized", "invalid_api_key"),
        404 => ("Not Found", "not_found"),
        500 => ("Internal Server Error", "server_error"),
        502 => ("Bad Gateway", "server_error"),
        503 => ("Service Unavailable", "server_error"),
        _ => ("Error", "server_error"),
    };
    let body =
        json!({"error": {"message": format!("fake provider: {reason}"), "type": kind, "code": kind}}).to_string();
    let extra = retry_after.map(|v| format!("Retry-After: {v}\r\n")).unwrap_or_default();
    write!(
        w,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A `POST /v1/audio/transcriptions` as the fake saw it.
#[derive(Debug, Clone)]
pub struct Transcribed {
    /// When its head was read.
    pub at: Instant,
    pub model: Option<String>,
    pub language: Option<String>,
    pub response_format: Option<String>,
    /// The `file` part's `filename`, `Content-Type` and size in bytes.
    pub file_name: Option<String>,
    pub file_type: Option<String>,
    pub file_size: Option<usize>,
    /// The `Authorization` header as sent.
    pub authorization: Option<String>,
    /// The status answered.
    pub status: u16,
}

#[derive(Debug, Default)]
struct Transcription {
    calls: Vec<Transcribed>,
    text: Option<String>,
    fail: Option<u16>,
}

/// The fake's transcript of `audio`: its printable ASCII runs of five or more (longer than a
/// container's magic, `OggS`), joined.
fn printable_runs(audio: &[u8]) -> String {
    let words: Vec<String> = audio
        .split(|b| !(b.is_ascii_graphic() || *b == b' '))
        .map(|run| String::from_utf8_lossy(run).trim().to_owned())
        .filter(|run| run.len() >= 5)
        .collect();
    if words.is_empty() { format!("({} bytes of audio)", audio.len()) } else { words.join(" ") }
}

/// `POST /v1/audio/transcriptions` (see the module doc).
fn serve_transcription(
    r: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    headers: &[(String, String)],
    at: Instant,
    script: &Mutex<Script>,
) {
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) else {
        let _ = respond_error(w, 411, None);
        return;
    };
    let mut body = vec![0u8; len.min(64 << 20)];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let parts = gatewarden_fakewire::form::parse(&header("content-type").unwrap_or_default(), &body).unwrap_or_default();
    let field = |name: &str| {
        parts.iter().find(|p| p.name == name).map(|p| String::from_utf8_lossy(&p.bytes).into_owned())
    };
    let file = parts.iter().find(|p| p.name == "file");
    let mut s = script.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key_refused = s.key.as_ref().is_some_and(|k| header("authorization") != Some(format!("Bearer {k}")));
    let status = match (key_refused, s.transcription.fail, file, field("model")) {
        (true, ..) => 401,
        (false, Some(code), ..) => code,
        (false, None, Some(_), Some(_)) => 200,
        _ => 400,
    };
    s.transcription.calls.push(Transcribed {
        at,
        model: field("model"),
        language: field("language"),
        response_format: field("response_format"),
        file_name: file.and_then(|f| f.filename.clone()),
        file_type: file.map(|f| f.content_type.clone()).filter(|t| !t.is_empty()),
        file_size: file.map(|f| f.bytes.len()),
        authorization: header("authorization"),
        status,
    });
    let text = s.transcription.text.clone().unwrap_or_else(|| file.map(|f| printable_runs(&f.bytes)).unwrap_or_default());
    drop(s);
    if status != 200 {
        let _ = respond_error(w, status, None);
        return;
    }
    let (ctype, out) = match field("response_format").as_deref() {
        Some("text") => ("text/plain", text),
        _ => ("application/json", json!({"text": text}).to_string()),
    };
    let _ = write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    );
}
