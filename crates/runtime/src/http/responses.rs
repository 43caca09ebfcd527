//! `POST /v1/responses` and `GET /v1/responses/{id}`: the subset of OpenAI's Responses API that
//! the SDKs use (`model`, `input` as text or messages, `instructions`, `previous_response_id`,
//! `store`, `stream` with its typed server-sent events), so `client.responses.create` works
//! against the gateway.
//!
//! A stored response (`store`, the default) is a journal row like a `/v1/messages` one: its
//! `chat_id` is `responses:` and the message id of the response it continues
//! (crates/runtime/src/worker/mod.rs `http_chat`), its text the last user message, its reply
//! the output. So it has the messages' retention and cluster behaviour, and
//! `previous_response_id` walks that chain back for the history
//! (`Work::response_chain`). The response id is `resp_` and the message id. Not kept: the
//! `instructions` (OpenAI does not carry them over either) and earlier items of a list `input`
//! (they are history of that call only).
//!
//! Images (`input_image`) and files (`input_file`) of the last user message are taken inline
//! only, as base64 (`data:image/png;base64,…`): stored under `[attachments]` like a platform's
//! files (crates/platforms/src/attachments.rs: content-addressed, typed by content) before the
//! row is journaled, and named by the same `[attachment: …]` lines, so the agent gets them as a
//! platform message's (an image an `image_url` part for `openai`). An `http(s)` URL is refused:
//! fetching what a caller names would let it reach the gateway's network (SSRF); so is a
//! `file_id` (there is no Files API here).

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use gatewarden_agent::backend::delivery::Delivery;
use gatewarden_agent::{AgentError, AgentReply, AgentRequest, Turn, Usage};
use gatewarden_journal::{Kind, NewMessage, State as RowState};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::messages::{agent_error, unavailable};
use crate::app::App;
use crate::worker::http_chat;

/// Items of a list `input`, at most (the body limit bounds their size).
pub const MAX_INPUT_ITEMS: usize = 256;
/// Content parts of one input message, at most.
pub const MAX_PARTS: usize = 64;
/// The longest `user` / `safety_identifier` kept as the row's user id.
const MAX_USER_CHARS: usize = 256;

/// A parsed `POST /v1/responses` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseIn {
    pub model: Option<String>,
    /// The last user message's text: what the agent answers.
    pub text: String,
    /// The items of a list `input` before it, in order (`developer` becomes `system`).
    pub inline: Vec<Turn>,
    pub instructions: Option<String>,
    /// The message id `previous_response_id` names (without `resp_`), as given.
    pub previous: Option<String>,
    pub store: bool,
    pub stream: bool,
    pub user: Option<String>,
    /// The images and files of the last user message, in order, not yet decoded.
    pub files: Vec<InFile>,
}

/// An image or file given inline in the last user message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFile {
    /// Where it was given (`input[2].content[1]`), for a refusal.
    pub at: String,
    pub name: String,
    /// The data URL's type (lowercase), or empty for bare base64.
    pub declared: String,
    /// An `input_image`: its content must be an image.
    pub image: bool,
    pub base64: String,
}

/// An OpenAI-style `invalid_request_error` (400), `param` naming the field.
fn invalid(param: &str, message: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": {"type": "invalid_request_error", "message": message.into(), "param": param, "code": null}})),
    )
        .into_response()
}

/// Why a body is refused: the field and a message for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub param: &'static str,
    pub message: String,
}

fn refused(param: &'static str, message: impl Into<String>) -> Refused {
    Refused { param, message: message.into() }
}

/// An optional string field (`null` is absent).
fn opt_str(v: &Value, key: &'static str) -> Result<Option<String>, Refused> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(refused(key, format!("{key} must be a string"))),
    }
}

fn opt_bool(v: &Value, key: &'static str, default: bool) -> Result<bool, Refused> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(refused(key, format!("{key} must be true or false"))),
    }
}

/// Parses a request body: every field checked for its type, lists bounded, never a panic.
pub fn parse(v: &Value) -> Result<ResponseIn, Refused> {
    if !v.is_object() {
        return Err(refused("body", "the body must be a JSON object"));
    }
    let (text, inline, files) = match v.get("input") {
        None | Some(Value::Null) => return Err(refused("input", "input is required")),
        Some(Value::String(s)) => (s.clone(), Vec::new(), Vec::new()),
        Some(Value::Array(items)) => parse_items(items)?,
        Some(_) => return Err(refused("input", "input must be a string or a list of input items")),
    };
    if text.trim().is_empty() && files.is_empty() {
        return Err(refused("input", "the last user message has no text"));
    }
    let previous = match opt_str(v, "previous_response_id")? {
        None => None,
        Some(p) => Some(
            p.strip_prefix("resp_")
                .filter(|id| !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric()))
                .ok_or_else(|| refused("previous_response_id", format!("Previous response with id '{p}' not found.")))?
                .to_owned(),
        ),
    };
    let user = match opt_str(v, "user")? {
        Some(u) => Some(u),
        None => opt_str(v, "safety_identifier")?,
    };
    if user.as_ref().is_some_and(|u| u.chars().count() > MAX_USER_CHARS) {
        return Err(refused("user", format!("user is longer than {MAX_USER_CHARS} characters")));
    }
    Ok(ResponseIn {
        model: opt_str(v, "model")?,
        text,
        inline,
        instructions: opt_str(v, "instructions")?.filter(|i| !i.is_empty()),
        previous,
        store: opt_bool(v, "store", true)?,
        stream: opt_bool(v, "stream", false)?,
        user,
        files,
    })
}

/// A list `input`: messages, the last one the user's (the only one that may carry files).
fn parse_items(items: &[Value]) -> Result<(String, Vec<Turn>, Vec<InFile>), Refused> {
    if items.is_empty() {
        return Err(refused("input", "input is an empty list"));
    }
    if items.len() > MAX_INPUT_ITEMS {
        return Err(refused("input", format!("input has {} items; at most {MAX_INPUT_ITEMS}", items.len())));
    }
    let mut turns = Vec::with_capacity(items.len());
    let mut files = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let (turn, mut fs) = parse_item(i, item)?;
        if !fs.is_empty() && i + 1 < items.len() {
            return Err(refused(
                "input",
                format!("input[{i}]: images and files are taken in the last user message only"),
            ));
        }
        files.append(&mut fs);
        turns.push(turn);
    }
    match turns.pop() {
        Some(last) if last.role == "user" => Ok((last.content, turns, files)),
        _ => Err(refused("input", "the last input item must be a message with role \"user\"")),
    }
}

fn parse_item(i: usize, item: &Value) -> Result<(Turn, Vec<InFile>), Refused> {
    let Some(obj) = item.as_object() else {
        return Err(refused("input", format!("input[{i}] must be an object")));
    };
    match obj.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "message" => {}
        Some(Value::String(t)) => {
            return Err(refused("input", format!("input[{i}]: items of type {t:?} are not supported; send messages")));
        }
        Some(_) => return Err(refused("input", format!("input[{i}].type must be a string"))),
    }
    let role = match obj.get("role") {
        Some(Value::String(r)) if matches!(r.as_str(), "user" | "assistant" | "system") => r.clone(),
        Some(Value::String(r)) if r == "developer" => "system".to_owned(),
        Some(Value::String(r)) => {
            return Err(refused("input", format!("input[{i}].role {r:?} is not user, assistant, system or developer")));
        }
        _ => return Err(refused("input", format!("input[{i}].role is required (a string)"))),
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            if parts.len() > MAX_PARTS {
                return Err(refused(
                    "input",
                    format!("input[{i}] has {} content parts; at most {MAX_PARTS}", parts.len()),
                ));
            }
            let mut texts = Vec::with_capacity(parts.len());
            let mut files = Vec::new();
            for (k, p) in parts.iter().enumerate() {
                match part(i, k, p)? {
                    Part::Text(t) => texts.push(t),
                    Part::File(f) => files.push(f),
                }
            }
            return Ok((Turn { role, content: texts.join("\n") }, files));
        }
        _ => return Err(refused("input", format!("input[{i}].content must be a string or a list of content parts"))),
    };
    Ok((Turn { role, content }, Vec::new()))
}

enum Part {
    Text(String),
    File(InFile),
}

fn part(i: usize, k: usize, p: &Value) -> Result<Part, Refused> {
    let at = format!("input[{i}].content[{k}]");
    match p.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => match p.get("text") {
            Some(Value::String(t)) => Ok(Part::Text(t.clone())),
            _ => Err(refused("input", format!("{at}.text must be a string"))),
        },
        Some("input_image") => {
            no_file_id(&at, p)?;
            // A string in the Responses API, `{"url": …}` in Chat Completions' shape.
            let url = match p.get("image_url") {
                Some(Value::String(u)) => u.as_str(),
                Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).unwrap_or_default(),
                _ => "",
            };
            let (declared, base64) = data_url(&at, url)?;
            if !declared.starts_with("image/") {
                return Err(refused("input", format!("{at}: input_image needs a data:image/…;base64, URL")));
            }
            let ext: String =
                declared["image/".len()..].chars().take_while(char::is_ascii_alphanumeric).take(8).collect();
            let ext = if ext == "jpeg" { "jpg".to_owned() } else { ext };
            Ok(Part::File(InFile { at, name: format!("image.{ext}"), declared, image: true, base64 }))
        }
        Some("input_file") => {
            no_file_id(&at, p)?;
            if p.get("file_url").is_some_and(|u| !u.is_null()) {
                return Err(refused("input", format!("{at}: file_url is not fetched ({NO_FETCH}); send file_data")));
            }
            let Some(data) = p.get("file_data").and_then(Value::as_str) else {
                return Err(refused("input", format!("{at}: input_file needs file_data (base64 or a data: URL)")));
            };
            let (declared, base64) =
                if data.starts_with("data:") { data_url(&at, data)? } else { (String::new(), data.to_owned()) };
            let name = match p.get("filename") {
                Some(Value::String(n)) if !n.trim().is_empty() => n.chars().take(200).collect(),
                _ => "file".to_owned(),
            };
            Ok(Part::File(InFile { at, name, declared, image: false, base64 }))
        }
        Some("input_audio") => Err(refused("input", format!("{at}: audio is not supported by this gateway yet"))),
        Some(t) => Err(refused("input", format!("{at}: content parts of type {t:?} are not supported"))),
        None => Err(refused("input", format!("{at} needs a string \"type\""))),
    }
}

/// Why a URL a caller names is not fetched.
const NO_FETCH: &str = "the gateway does not fetch URLs a caller names";

fn no_file_id(at: &str, p: &Value) -> Result<(), Refused> {
    if p.get("file_id").is_some_and(|f| !f.is_null()) {
        return Err(refused(
            "input",
            format!("{at}: file_id is not supported (no Files API here); send the data inline"),
        ));
    }
    Ok(())
}

/// `data:<type>[;…];base64,<data>`: the type (lowercase, possibly empty) and the base64.
fn data_url(at: &str, url: &str) -> Result<(String, String), Refused> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https:/") {
        return Err(refused(
            "input",
            format!(
                "{at}: image URLs are not fetched ({NO_FETCH}); send the image inline as a data:image/…;base64, URL"
            ),
        ));
    }
    let Some((head, data)) = url.strip_prefix("data:").and_then(|r| r.split_once(',')) else {
        return Err(refused("input", format!("{at}: not a data: URL; send data:<type>;base64,<data>")));
    };
    let mut params = head.split(';');
    let kind = params.next().unwrap_or_default().trim().to_ascii_lowercase();
    if !params.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(refused("input", format!("{at}: the data: URL must be base64 (data:<type>;base64,…)")));
    }
    let valid = kind.len() <= 100 && kind.bytes().all(|b| b.is_ascii_alphanumeric() || b"/+.-_".contains(&b));
    if !valid {
        return Err(refused("input", format!("{at}: the data: URL's type is not a MIME type")));
    }
    Ok((kind, data.to_owned()))
}

/// What a response object says, for [`response_json`].
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// The message id (the response is `resp_` and it).
    pub id: String,
    pub created_at: u64,
    /// `queued`, `in_progress`, `completed`, `failed`.
    pub status: &'static str,
    pub model: String,
    pub instructions: Option<String>,
    /// The message id of the response it continues.
    pub previous: Option<String>,
    pub store: bool,
    pub user: Option<String>,
    /// The output text, once completed.
    pub output: Option<String>,
    pub usage: Option<Usage>,
    /// What the caller may read of a failure.
    pub error: Option<String>,
}

fn item_id(id: &str) -> String {
    format!("msg_{id}")
}

/// The assistant's message item, `status` `in_progress` or `completed`.
fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(output_part).into_iter().collect();
    json!({"type": "message", "id": item_id(id), "status": status, "role": "assistant", "content": content})
}

fn output_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The response object as the API reference documents it (`output_text` is the SDKs' own
/// convenience over `output`).
pub fn response_json(s: &Shape) -> Value {
    let output: Vec<Value> =
        s.output.as_deref().map(|t| message_item(&s.id, Some(t), "completed")).into_iter().collect();
    let usage = s.usage.map(|u| {
        json!({"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens)})
    });
    json!({
        "id": format!("resp_{}", s.id),
        "object": "response",
        "created_at": s.created_at,
        "status": s.status,
        "error": s.error.as_ref().map(|m| json!({"code": "server_error", "message": m})),
        "incomplete_details": null,
        "instructions": s.instructions,
        "max_output_tokens": null,
        "model": s.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": s.previous.as_ref().map(|p| format!("resp_{p}")),
        "reasoning": null,
        "store": s.store,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": usage,
        "user": s.user,
        "metadata": {},
    })
}

/// The server-sent events of one streamed response, numbered in order (`sequence_number`).
pub struct Events {
    seq: u64,
    shape: Shape,
}

impl Events {
    pub fn new(shape: Shape) -> Events {
        Events { seq: 0, shape }
    }

    fn ev(&mut self, ty: &str, mut body: Value) -> Value {
        body["type"] = json!(ty);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        body
    }

    /// Before the first delta: the response created and in progress, its message and its text
    /// part opened.
    pub fn start(&mut self) -> Vec<Value> {
        self.shape.status = "in_progress";
        let r = response_json(&self.shape);
        let item = message_item(&self.shape.id, None, "in_progress");
        let item_id = item_id(&self.shape.id);
        vec![
            self.ev("response.created", json!({"response": r})),
            self.ev("response.in_progress", json!({"response": r})),
            self.ev("response.output_item.added", json!({"output_index": 0, "item": item})),
            self.ev(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": output_part("")}),
            ),
        ]
    }

    pub fn delta(&mut self, delta: &str) -> Value {
        let item_id = item_id(&self.shape.id);
        self.ev(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}),
        )
    }

    /// After the run: the text, part and item done, and the response completed.
    pub fn completed(&mut self, reply: &AgentReply) -> Vec<Value> {
        let item_id = item_id(&self.shape.id);
        let text = reply.text.as_str();
        self.shape.status = "completed";
        self.shape.output = Some(reply.text.clone());
        self.shape.usage = reply.usage;
        let r = response_json(&self.shape);
        vec![
            self.ev(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
            ),
            self.ev(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": output_part(text)}),
            ),
            self.ev(
                "response.output_item.done",
                json!({"output_index": 0, "item": message_item(&self.shape.id, Some(text), "completed")}),
            ),
            self.ev("response.completed", json!({"response": r})),
        ]
    }

    /// The run failed: `notice` is what the caller may read.
    pub fn failed(&mut self, notice: &str) -> Vec<Value> {
        self.shape.status = "failed";
        self.shape.error = Some(notice.to_owned());
        let r = response_json(&self.shape);
        vec![self.ev("response.failed", json!({"response": r}))]
    }
}

/// One event on the wire: named by its type, as the API sends them.
pub fn sse(ev: &Value) -> Bytes {
    let ty = ev.get("type").and_then(Value::as_str).unwrap_or("message");
    Bytes::from(format!("event: {ty}\ndata: {ev}\n\n"))
}

/// Seconds since the epoch of a journal timestamp (`YYYY-MM-DDTHH:MM:SS…`, UTC); 0 when it is
/// not one.
pub fn unix_seconds(ts: &str) -> u64 {
    let num = |r: std::ops::Range<usize>| ts.get(r).and_then(|s| s.parse::<i64>().ok());
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) =
        (num(0..4), num(5..7), num(8..10), num(11..13), num(14..16), num(17..19))
    else {
        return 0;
    };
    // Days from the civil date (H. Hinnant's algorithm), proleptic Gregorian.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + s).unwrap_or(0)
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn not_found(id: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(
            json!({"error": {"type": "invalid_request_error", "message": format!("No response found with id '{id}'."),
                              "param": null, "code": null}}),
        ),
    )
        .into_response()
}

/// `POST /v1/responses`. The body is parsed here (not by an extractor) so that every refusal is
/// a 400 naming the field.
pub async fn create(State(gw): State<Arc<App>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return invalid("body", format!("the body is not valid JSON: {e}")),
    };
    let mut r = match parse(&v) {
        Ok(r) => r,
        Err(Refused { param, message }) => return invalid(param, message),
    };
    let work = &gw.work;
    // The response continued must be a stored one (OpenAI answers 400 too).
    if let Some(prev) = r.previous.clone() {
        let found = work.with_journal(move |j| j.get(&prev)).await;
        match found {
            Ok(Some(m)) if m.platform.is_none() && http_chat::continues(&m.chat_id).is_some() => {}
            Ok(_) => {
                let p = r.previous.as_deref().unwrap_or_default();
                return invalid("previous_response_id", format!("Previous response with id 'resp_{p}' not found."));
            }
            Err(e) => return super::messages::error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
        }
    }
    if !gw.accepts_work() {
        return unavailable(&gw, "responses");
    }
    // The files are stored before the row is journaled; a refused one refuses the call, and
    // nothing is journaled.
    r.text = match with_files(&gw, std::mem::take(&mut r.files), &r.text).await {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let user = r.user.clone().unwrap_or_default();
    let model = r.model.clone().unwrap_or_else(|| work.model());
    // A stored response is a journal row; one not stored runs like a one-shot message.
    let id = if r.store {
        let msg = NewMessage {
            chat_id: format!("{}{}", http_chat::RESPONSES, r.previous.as_deref().unwrap_or_default()),
            user_id: user.clone(),
            text: r.text.clone(),
            kind: Kind::Sync,
        };
        match work.journal_waiting(&gw, msg).await {
            Ok(id) => id,
            Err(e) => return super::messages::error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
        }
    } else {
        work.next_run_id(&gw.me.id).replace(|c: char| !c.is_ascii_alphanumeric(), "")
    };
    let shape = Shape {
        id: id.clone(),
        created_at: now_s(),
        status: "in_progress",
        model,
        instructions: r.instructions.clone(),
        previous: r.previous.clone(),
        store: r.store,
        user: r.user.clone(),
        ..Shape::default()
    };
    if r.stream {
        return stream(gw, r, shape);
    }
    match run(&gw, &r, &id, None).await {
        Ok(Ok(reply)) => {
            let shape = Shape { status: "completed", output: Some(reply.text), usage: reply.usage, ..shape };
            Json(response_json(&shape)).into_response()
        }
        Ok(Err(e)) => agent_error(work, &user, &id, &e),
        Err(e) => super::messages::error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
    }
}

/// The text the agent gets for `text` and `files`: the caller's lines that could pass for an
/// attachment line escaped, then one `[attachment: …]` line per file, each stored first under
/// `[attachments]` (crates/platforms/src/attachments.rs, as a platform's files). A file that
/// cannot be taken refuses the call in [`invalid`]'s shape: 413 too large, 400 otherwise (a
/// stored file no row names goes with retention).
async fn with_files(gw: &Arc<App>, files: Vec<InFile>, text: &str) -> Result<String, Response> {
    use base64::Engine as _;
    use gatewarden_platforms::attachments::{self, Attachment, Bounds, Outcome, Store, human_size};
    let mut out = attachments::escape_text(text);
    if files.is_empty() {
        return Ok(out);
    }
    let store = Store::in_home(gw.home.dir());
    let bounds = Bounds::from(&gw.work.live().attachments);
    let lines = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut used = 0u64;
        let mut lines = Vec::with_capacity(files.len());
        for f in files {
            let at = &f.at;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(f.base64.trim())
                .map_err(|e| (StatusCode::BAD_REQUEST, format!("{at}: the data is not valid base64: {e}")))?;
            let size = bytes.len() as u64;
            if size > bounds.per_file || used.saturating_add(size) > bounds.per_message {
                let (total, cap, what) = if size > bounds.per_file {
                    (size, bounds.per_file, "a file")
                } else {
                    (used.saturating_add(size), bounds.per_message, "a message")
                };
                let why =
                    format!("{at}: too large ({} > {} {what}, [attachments])", human_size(total), human_size(cap));
                return Err((StatusCode::PAYLOAD_TOO_LARGE, why));
            }
            let a = Attachment { name: f.name, declared: f.declared, size: Some(size), ..Attachment::default() };
            let outcome = store.fetch(None, &a, &bounds, started, &mut used, |_| {
                Ok(Box::new(std::io::Cursor::new(bytes)) as Box<dyn std::io::Read + Send>)
            });
            match &outcome {
                Outcome::Stored(s) if f.image && !s.kind.starts_with("image/") => {
                    return Err((StatusCode::BAD_REQUEST, format!("{at}: not an image (the content is {})", s.kind)));
                }
                Outcome::Stored(_) => {}
                Outcome::Refused(why) => return Err((StatusCode::BAD_REQUEST, format!("{at}: refused: {why}"))),
            }
            lines.push(attachments::line(&Attachment { outcome: Some(outcome), ..a }));
        }
        Ok(lines)
    })
    .await;
    let lines = match lines {
        Ok(Ok(lines)) => lines,
        Ok(Err((status, why))) => {
            let mut r = invalid("input", why);
            *r.status_mut() = status;
            return Err(r);
        }
        Err(e) => return Err(super::messages::error(StatusCode::INTERNAL_SERVER_ERROR, "attachments", e.to_string())),
    };
    for l in lines {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&l);
    }
    Ok(out)
}

/// Runs response `id` (journaled when `r.store`), streaming into `chunks`.
async fn run(
    gw: &Arc<App>,
    r: &ResponseIn,
    id: &str,
    chunks: Option<crate::worker::Stream>,
) -> Result<Result<AgentReply, AgentError>, String> {
    let work = &gw.work;
    if r.store {
        return super::messages::run_journaled(gw, id, (r.instructions.clone(), r.inline.clone()), chunks).await;
    }
    let live = work.live();
    let chain = match &r.previous {
        Some(p) => work.response_chain(p, live.history_turns, live.history_chars).await?,
        None => Vec::new(),
    };
    let mut history: Vec<Turn> = r.instructions.iter().map(|i| Turn::new("system", i.clone())).collect();
    history.extend(chain);
    history.extend(r.inline.iter().cloned());
    let user = r.user.clone().unwrap_or_default();
    let (text, files) = crate::worker::files_named(gw, &r.text);
    let mut req = AgentRequest::new(id, "responses", user, text, history);
    req.attachments = files;
    Ok(work.run_reply(gw, req, chunks).await)
}

/// `stream: true`: the typed events as the run goes, ending in `response.completed` or
/// `response.failed`.
fn stream(gw: Arc<App>, r: ResponseIn, shape: Shape) -> Response {
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    let (tx, rx) = mpsc::channel::<String>(64);
    let id = shape.id.clone();
    let mut events = Events::new(shape);
    let start = events.start();
    let reach = Delivery::default();
    tokio::spawn(async move {
        for ev in &start {
            let _ = out_tx.send(sse(ev)).await;
        }
        let (r2, id2, gw2, reach2) = (r.clone(), id.clone(), Arc::clone(&gw), reach.clone());
        let ran = tokio::spawn(async move { run(&gw2, &r2, &id2, Some((tx, reach2))).await });
        let mut rx = rx;
        while let Some(piece) = rx.recv().await {
            // Pieces of a provider given up on before anything reached the caller are dropped;
            // the first one passed on ends failover (issue 27 §6), as for chat completions.
            if reach.take().is_some_and(|e| reach.reach(e)) {
                let _ = out_tx.send(sse(&events.delta(&piece))).await;
            }
        }
        let outcome = ran.await.unwrap_or_else(|e| Ok(Err(AgentError::Failed(format!("run panicked: {e}")))));
        let user = r.user.clone().unwrap_or_default();
        let last = match outcome {
            Ok(Ok(reply)) => events.completed(&reply),
            Ok(Err(e)) => {
                crate::warn!("response {id} failed: {e}");
                events.failed(&gw.work.failure_notice(None, &user, &id, &e.to_string()))
            }
            Err(e) => {
                crate::warn!("response {id}: journal: {e}");
                events.failed(&gw.work.failure_notice(None, &user, &id, &e))
            }
        };
        for ev in &last {
            let _ = out_tx.send(sse(ev)).await;
        }
    });
    (
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(gatewarden_dashboard::web::ReceiverStream(out_rx)),
    )
        .into_response()
}

/// `GET /v1/responses/{id}`: a stored response as it is now, on whichever gateway stored it
/// (the journal is the cluster's).
pub async fn get_one(State(gw): State<Arc<App>>, Path(rid): Path<String>) -> Response {
    let Some(id) = rid.strip_prefix("resp_").filter(|i| !i.is_empty()).map(str::to_owned) else {
        return not_found(&rid);
    };
    let id2 = id.clone();
    let found = gw.work.with_journal(move |j| Ok((j.get(&id2)?, j.usage(&id2)?))).await;
    let (m, usage) = match found {
        Ok((Some(m), usage)) => (m, usage),
        Ok((None, _)) => return not_found(&rid),
        Err(e) => return super::messages::error(StatusCode::INTERNAL_SERVER_ERROR, "journal", e),
    };
    let Some(previous) = http_chat::continues(&m.chat_id).filter(|_| m.platform.is_none()) else {
        return not_found(&rid);
    };
    let status = match m.state {
        RowState::Queued => "queued",
        RowState::Running => "in_progress",
        RowState::Done => "completed",
        RowState::Failed => "failed",
    };
    let shape = Shape {
        id: m.id.clone(),
        created_at: unix_seconds(&m.created_at),
        status,
        model: gw.work.model(),
        instructions: None,
        previous: Some(previous.to_owned()).filter(|p| !p.is_empty()),
        store: true,
        user: Some(m.user_id.clone()).filter(|u| !u.is_empty()),
        output: m.reply.clone().filter(|_| m.state == RowState::Done),
        usage: usage.map(|(p, c)| Usage { prompt_tokens: p, completion_tokens: c }),
        error: m.reason.as_deref().map(|r| gw.work.failure_notice(None, &m.user_id, &m.id, r)),
    };
    Json(response_json(&shape)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: Value) -> ResponseIn {
        parse(&v).unwrap_or_else(|e| panic!("{v}: {e:?}"))
    }

    fn err(v: Value) -> Refused {
        parse(&v).expect_err(&v.to_string())
    }

    #[test]
    fn a_string_input_with_the_fields_the_sdks_send() {
        let r = ok(json!({"model": "m", "input": "hi", "instructions": "be brief",
                          "previous_response_id": "resp_abc123", "store": false, "stream": true, "user": "u"}));
        assert_eq!(
            r,
            ResponseIn {
                model: Some("m".into()),
                text: "hi".into(),
                inline: vec![],
                instructions: Some("be brief".into()),
                previous: Some("abc123".into()),
                store: false,
                stream: true,
                user: Some("u".into()),
                files: vec![],
            }
        );
        let d = ok(json!({"input": "x", "model": null, "temperature": 0.2, "tools": []}));
        assert!(d.store && !d.stream && d.previous.is_none() && d.model.is_none(), "{d:?}");
    }

    #[test]
    fn a_list_input_gives_history_and_the_last_user_text() {
        let r = ok(json!({"input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "r1"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "two"}, {"type": "input_text", "text": "more"}]},
        ]}));
        assert_eq!(r.text, "two\nmore");
        assert_eq!(
            r.inline,
            vec![Turn::new("system", "rules"), Turn::new("user", "one"), Turn::new("assistant", "r1")]
        );
    }

    #[test]
    fn hostile_bodies_are_refused_with_the_field_named() {
        let cases = [
            (json!([1, 2]), "body", "JSON object"),
            (json!({}), "input", "required"),
            (json!({"input": 5}), "input", "string or a list"),
            (json!({"input": []}), "input", "empty"),
            (json!({"input": ""}), "input", "no text"),
            (json!({"input": "x", "model": 3}), "model", "string"),
            (json!({"input": "x", "stream": "yes"}), "stream", "true or false"),
            (json!({"input": "x", "store": 1}), "store", "true or false"),
            (json!({"input": "x", "instructions": ["a"]}), "instructions", "string"),
            (json!({"input": "x", "previous_response_id": 7}), "previous_response_id", "string"),
            (json!({"input": "x", "previous_response_id": "abc"}), "previous_response_id", "not found"),
            (json!({"input": "x", "previous_response_id": "resp_../x"}), "previous_response_id", "not found"),
            (json!({"input": "x", "user": "u".repeat(300)}), "user", "longer"),
            (json!({"input": ["hi"]}), "input", "must be an object"),
            (json!({"input": [{"role": "user"}]}), "input", "content must be"),
            (json!({"input": [{"role": 1, "content": "x"}]}), "input", "role is required"),
            (json!({"input": [{"role": "tool", "content": "x"}]}), "input", "not user, assistant"),
            (json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input", "not supported"),
            (json!({"input": [{"role": "assistant", "content": "x"}]}), "input", "last input item"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}),
                "input",
                "text must",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}),
                "input",
                "not a data: URL",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png"}]}]}),
                "input",
                "not fetched",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png,AA"}]}]}),
                "input",
                "base64",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:text/plain;base64,AA=="}]}]}),
                "input",
                "data:image/",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input",
                "file_id",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input",
                "file_id",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "http://10.0.0.1/"}]}]}),
                "input",
                "not fetched",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "filename": "a.txt"}]}]}),
                "input",
                "file_data",
            ),
            (
                json!({"input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]},
                    {"role": "assistant", "content": "seen"},
                    {"role": "user", "content": "and?"},
                ]}),
                "input",
                "last user message only",
            ),
            (json!({"input": [{"role": "user", "content": [{"text": "x"}]}]}), "input", "\"type\""),
            (json!({"input": [{"role": "user", "content": [{"type": "weird"}]}]}), "input", "not supported"),
        ];
        for (body, param, says) in cases {
            let e = err(body.clone());
            assert_eq!(e.param, param, "{body}: {e:?}");
            assert!(e.message.contains(says), "{body}: {e:?} should say {says:?}");
        }
    }

    /// Images and files of the last user message are kept (not yet decoded) with where they
    /// were given; an image-only message has no text and is still taken.
    #[test]
    fn inline_images_and_files_of_the_last_message_are_taken() {
        let r = ok(json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/JPEG;base64,/9j/", "detail": "auto"},
            {"type": "input_image", "image_url": {"url": "data:image/png;charset=x;base64,iVBO"}},
            {"type": "input_file", "filename": "notes.txt", "file_data": "data:text/plain;base64,aGk="},
            {"type": "input_file", "file_data": "aGk="},
        ]}]}));
        assert_eq!(r.text, "what is this?");
        let got: Vec<_> = r
            .files
            .iter()
            .map(|f| (f.at.as_str(), f.name.as_str(), f.declared.as_str(), f.image, f.base64.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("input[0].content[1]", "image.jpg", "image/jpeg", true, "/9j/"),
                ("input[0].content[2]", "image.png", "image/png", true, "iVBO"),
                ("input[0].content[3]", "notes.txt", "text/plain", false, "aGk="),
                ("input[0].content[4]", "file", "", false, "aGk="),
            ]
        );
        let only = ok(json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]}]}));
        assert!(only.text.is_empty() && only.files.len() == 1, "{only:?}");
    }

    #[test]
    fn oversized_lists_are_refused() {
        let item = json!({"role": "user", "content": "x"});
        let e = err(json!({"input": vec![item.clone(); MAX_INPUT_ITEMS + 1]}));
        assert!(e.message.contains(&format!("at most {MAX_INPUT_ITEMS}")), "{e:?}");
        assert!(parse(&json!({"input": vec![item; MAX_INPUT_ITEMS]})).is_ok());
        let part = json!({"type": "input_text", "text": "x"});
        let e = err(json!({"input": [{"role": "user", "content": vec![part; MAX_PARTS + 1]}]}));
        assert!(e.message.contains(&format!("at most {MAX_PARTS}")), "{e:?}");
    }

    /// The event sequence the SDKs parse: typed, numbered from 0 without gaps, one message item
    /// whose deltas add up to the done text, ending in `response.completed` with the output.
    #[test]
    fn a_streamed_response_emits_the_documented_event_sequence() {
        let shape = Shape { id: "abc".into(), model: "m".into(), store: true, ..Shape::default() };
        let mut ev = Events::new(shape);
        let mut all = ev.start();
        all.push(ev.delta("Hel"));
        all.push(ev.delta("lo"));
        all.extend(ev.completed(&AgentReply {
            text: "Hello".into(),
            usage: Some(Usage { prompt_tokens: 3, completion_tokens: 2 }),
            files: Vec::new(),
        }));
        let types: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in all.iter().enumerate() {
            assert_eq!(e["sequence_number"], json!(i), "{e}");
        }
        assert_eq!(all[0]["response"]["status"], "in_progress");
        assert_eq!(all[0]["response"]["id"], "resp_abc");
        assert_eq!(all[0]["response"]["output"], json!([]));
        let deltas: String = all.iter().filter_map(|e| e["delta"].as_str()).collect();
        assert_eq!(deltas, "Hello");
        assert_eq!(all[4]["item_id"], "msg_abc");
        assert_eq!(all[6]["text"], "Hello");
        let done = &all[9]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["object"], "response");
        assert_eq!(done["output"][0]["type"], "message");
        assert_eq!(
            done["output"][0]["content"][0],
            json!({"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []})
        );
        assert_eq!(done["usage"]["total_tokens"], 5);
        let wire = String::from_utf8(sse(&all[9]).to_vec()).unwrap();
        assert!(wire.starts_with("event: response.completed\ndata: {") && wire.ends_with("}\n\n"), "{wire}");
    }

    #[test]
    fn a_failed_stream_ends_in_response_failed_with_the_notice() {
        let mut ev = Events::new(Shape { id: "x".into(), ..Shape::default() });
        let start = ev.start();
        let failed = ev.failed("the agent failed (reference x)");
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0]["type"], "response.failed");
        assert_eq!(failed[0]["sequence_number"], json!(start.len()));
        assert_eq!(failed[0]["response"]["status"], "failed");
        assert_eq!(failed[0]["response"]["error"]["message"], "the agent failed (reference x)");
    }

    #[test]
    fn journal_timestamps_become_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00.000000Z"), 0);
        assert_eq!(unix_seconds("2026-12-05T01:11:16.123456Z"), 1_796_433_076);
        assert_eq!(unix_seconds("2000-02-29 12:00:00+00"), 951_825_600);
        assert_eq!(unix_seconds("garbage"), 0);
        assert_eq!(unix_seconds(""), 0);
    }
}
