//! WhatsApp adapter: the Cloud API. Meta pushes each message to a webhook on the gateway's own
//! listener (`/hooks/whatsapp/<name>`); replies go through the Graph API's messages endpoint.
//!
//! - **The webhook** (https://developers.facebook.com/docs/graph-api/webhooks/getting-started,
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/guides/set-up-webhooks). The GET
//!   handshake answers `hub.challenge` when `hub.mode` is `subscribe` and `hub.verify_token`
//!   equals the configured verify token (compared in constant time), else 403. Each POST carries
//!   `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body, keyed by the app secret>`;
//!   a missing or wrong one gets 401 and nothing is journaled.
//! - **Nothing lost.** A POST's messages go through the skeleton's push intake
//!   (skeleton/push.rs): the answer is 200 only once they are journaled; a failed commit, an
//!   adapter that is not receiving (starting, draining, parked) or a commit that does not come
//!   within 10 s gets 5xx, and Meta delivers the notification again ("we will keep trying with
//!   decreasing frequency until the request succeeds, for up to 7 days",
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/components). The journal
//!   key is the message's `wamid`, the same in every redelivery. During a restart the listener
//!   is handed over (crates/runtime/src/http/serve.rs), so deliveries wait in its backlog.
//!   `statuses[]` (sent, delivered, read) are not messages: answered 200, nothing journaled.
//! - **Chats.** A chat is the sender's `wa_id` (digits): the Cloud API's conversations are one
//!   customer and the business number, so every chat is direct. Text, and the titles of button
//!   and interactive replies, are taken, and so are media messages (below).
//!   Notifications for another phone number of the same WhatsApp Business Account are ignored.
//! - **Media in** (issue 29 §1; https://developers.facebook.com/docs/whatsapp/cloud-api/webhooks/components,
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/reference/media): `image`,
//!   `document` (with its `filename`), `audio` (a voice note when `voice` is true), `video` and
//!   `sticker` messages carry a media `id` and `mime_type`; their `caption` is the text. The
//!   download is `GET /{api_version}/{media-id}` with the bearer token, which names a short-lived
//!   `url`, `mime_type` and `file_size`, then `GET url` with the same bearer (Meta requires it
//!   there), under the skeleton's bounds (attachments.rs) before the journal commit: a slow
//!   download makes the webhook answer 5xx and Meta redeliver, and the store's per-event record
//!   means the redelivery downloads nothing twice.
//! - **Media out** (issue 29 §2): `POST /{api_version}/{phone_number_id}/media` (multipart:
//!   `messaging_product=whatsapp`, `type`, `file`) returns a media id, then a message of type
//!   `image` (JPEG or PNG up to 5 MB), `audio` (AAC, AMR, MP3, M4A, OGG up to 16 MB) or
//!   `document` (anything else, with its `filename`) naming that id, inside the same 24-hour
//!   window as text. No idempotency key: a crash between the message and the outbox commit
//!   uploads and posts that entry's files again after the restart (worst case one duplicate, as
//!   for text; the orphaned upload expires on Meta's side).
//! - **Replies** (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/messages):
//!   `POST /{api_version}/{phone_number_id}/messages` with a bearer access token, text pieces
//!   of at most 4,096 characters. No idempotency key: a crash between a post and the outbox
//!   commit posts that piece again. The 24-hour customer-service window is kept on our side:
//!   a reply more than 24 h after the chat's last message is not sent, and its entry is recorded
//!   as rejected with the reason (also when Meta says so, error 131047); templates are out of
//!   scope. The last message time per chat is saved in `<home>/platforms/whatsapp-<name>.json`
//!   at each confirm, so a restart keeps the windows.
//! - **Errors** (https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes):
//!   190 (token expired or invalid) and HTTP 401 park the adapter; 130429 (throughput), 131056
//!   (pair rate), 4 and 80007 (rate limits) and HTTP 429 wait, with `Retry-After` when given;
//!   131000, 131016 and 5xx are retried with backoff; any other error rejects the entry, naming
//!   the code.
//! - **The agent at work.** `typing` marks the chat's last message read with the typing
//!   indicator (`status: read`, `message_id`, `typing_indicator: {type: text}`,
//!   https://developers.facebook.com/docs/whatsapp/cloud-api/typing-indicators), at most once
//!   every 20 s per chat (the indicator lasts 25 s or until the reply). No previews: the Cloud
//!   API cannot edit a message.
//! - **The credential** is the phone-number id: one gateway sends as one number. At connect the
//!   access token is checked with `GET /{api_version}/{phone_number_id}` (a refusal parks).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Whatsapp as Settings;
use gatewarden_lifecycle::fsio;
use gatewarden_net::Outbound;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::attachments::Attachment;
use crate::skeleton::push::{PushIntake, PushLimits, PushReceiver};
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, HookAnswer, HookRequest, Host, Inbound};

/// The public Graph API.
pub const DEFAULT_API_BASE: &str = "https://graph.facebook.com";
/// The Graph API version used when `api_version` is not set.
pub const DEFAULT_API_VERSION: &str = "v21.0";
/// Characters per text message (the Cloud API's `text.body` limit).
const MAX_TEXT_CHARS: usize = 4096;
const MAX_BODY_BYTES: u64 = 1 << 20;
/// Bound on every Graph API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// A receive without a budget waits at most this long for a pushed request.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// The customer-service window: replies are free-form only this long after the customer's
/// last message.
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The typing indicator is sent again for the same message only after this long.
const TYPING_EVERY: Duration = Duration::from_secs(20);
/// Chats whose window is remembered, at most (the oldest are forgotten first).
const MAX_CHATS: usize = 100_000;
/// Bound on one media upload (the file streamed from the store).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// The Cloud API's size limits for media messages
/// (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/media#supported-media-types).
const MAX_IMAGE_BYTES: u64 = 5 << 20;
const MAX_AUDIO_BYTES: u64 = 16 << 20;

/// The WhatsApp adapter.
pub type Whatsapp = Skeleton<Proto>;

/// The webhook and the Graph API.
pub struct Proto {
    name: String,
    phone_number_id: String,
    token: String,
    app_secret: String,
    verify_token: String,
    /// `{base}/{version}/{phone_number_id}`.
    node: String,
    out: Outbound,
    allowed: Vec<String>,
    intake: Arc<PushIntake>,
    windows: Arc<Mutex<Windows>>,
}

impl Skeleton<Proto> {
    /// `token` is the access token (`token_env`), `app_secret` and `verify_token` check the
    /// webhook.
    pub fn new(
        cfg: &PlatformConfig,
        token: String,
        app_secret: String,
        verify_token: String,
    ) -> Result<Whatsapp, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let start_error = |message: String| AdapterError::Start { name: cfg.adapter_name(), message };
        let out = Outbound::new(cfg.ca_file.as_deref(), None).map_err(|e| start_error(e.to_string()))?;
        let phone_number_id = s.phone_number_id.clone().unwrap_or_default().trim().to_owned();
        let base = s.api_base.clone().unwrap_or_else(|| DEFAULT_API_BASE.to_owned());
        let version = s.api_version.clone().unwrap_or_else(|| DEFAULT_API_VERSION.to_owned());
        let proto = Proto {
            name: cfg.adapter_name(),
            node: format!("{}/{version}/{phone_number_id}", base.trim_end_matches('/')),
            phone_number_id,
            token,
            app_secret,
            verify_token,
            out,
            allowed: cfg.allowed_chats.clone(),
            intake: PushIntake::new(PushLimits::default()),
            windows: Arc::new(Mutex::new(Windows::default())),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Whatsapp, AdapterError> {
        use gatewarden_config::secrets::PlatformSecret;
        // The access token sends; the app secret and verify token check Meta's webhook.
        let app_secret = creds.required(PlatformSecret::AppSecret, "app_secret_env or app_secret_file")?;
        let verify = creds.required(PlatformSecret::VerifyToken, "verify_token_env or verify_token_file")?;
        Whatsapp::new(cfg, creds.token()?, app_secret, verify)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 16,
        // The messages endpoint's own errors (130429, 429) pace the replies.
        pace: None,
        min_receive: Duration::from_millis(50),
        // Meta redelivers every notification not answered 200.
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(300),
    };
    type Receiver = Webhook;
    type Sender = Graph;

    fn credential(&self) -> &str {
        &self.phone_number_id
    }

    fn watchdog_after(&self) -> Duration {
        // Every receive returns within a second; the watchdog only matters for a stuck call.
        Duration::from_secs(90)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(Webhook, Graph), String> {
        let path = host.state_dir().map(|d| d.join(format!("whatsapp-{}.json", self.name)));
        *self.windows.lock().unwrap_or_else(|p| p.into_inner()) = Windows::load(path.as_deref());
        let api = Api::new(&self.node, &self.token, &self.out);
        let rx = Webhook { api: api.clone(), push: self.intake.attach(), windows: Arc::clone(&self.windows), path };
        Ok((rx, Graph { api, windows: Arc::clone(&self.windows), typed: BTreeMap::new() }))
    }

    fn hook(&self, req: &HookRequest, receiving: Result<(), String>) -> HookAnswer {
        if !req.post {
            return match handshake(&req.query, &self.verify_token) {
                Some(challenge) => HookAnswer::text(200, challenge),
                None => HookAnswer::text(403, "verification failed: wrong hub.mode or hub.verify_token"),
            };
        }
        if !signature_ok(self.app_secret.as_bytes(), &req.body, req.header("x-hub-signature-256")) {
            return HookAnswer::text(401, "missing or wrong X-Hub-Signature-256");
        }
        let messages = match parse_notification(&req.body, &self.phone_number_id, &self.allowed) {
            Ok(m) => m,
            Err(e) => return HookAnswer::text(400, e),
        };
        if messages.is_empty() {
            // Statuses, other fields, another number: nothing to journal.
            return HookAnswer::text(200, "ok");
        }
        if let Err(why) = receiving {
            return skeleton::push::Refused::NotRunning(why).answer();
        }
        match self.intake.push(messages, req.body.len()) {
            Ok(()) => HookAnswer::text(200, "ok"),
            Err(e) => e.answer(),
        }
    }
}

/// Whether `header` (`sha256=<hex>`) is the HMAC-SHA256 of `body` keyed by `secret`. The
/// comparison is the MAC's own constant-time one.
pub fn signature_ok(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    header.is_some_and(|h| crate::hooksig::verify(secret, &[body], h).is_ok())
}

/// `sha256=<hex>`: what Meta (and GitHub) send for `body` with `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    crate::hooksig::sign(secret, &[body])
}

/// Equal bytes, in time independent of where they differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// The query's value of `key`, percent-decoded (`+` is a space; the first occurrence).
fn query_value(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
}

/// The GET verification: the challenge to echo, when the mode is `subscribe` and the token is
/// ours.
fn handshake(query: &str, verify_token: &str) -> Option<String> {
    let mode = query_value(query, "hub.mode")?;
    let token = query_value(query, "hub.verify_token")?;
    let challenge = query_value(query, "hub.challenge")?;
    (mode == "subscribe" && !verify_token.is_empty() && ct_eq(token.as_bytes(), verify_token.as_bytes()))
        .then_some(challenge)
}

/// The messages of one webhook notification for `phone_number_id` (`Err`: not JSON).
fn parse_notification(body: &[u8], phone_number_id: &str, allowed: &[String]) -> Result<Vec<Inbound>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if v["object"] != "whatsapp_business_account" {
        // Signed by Meta, for another product of the app: nothing of ours, and refusing it
        // would only make Meta send it again.
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let changes =
        v["entry"].as_array().into_iter().flatten().flat_map(|e| e["changes"].as_array().into_iter().flatten());
    for change in changes.filter(|c| c["field"] == "messages") {
        let value = &change["value"];
        if value["metadata"]["phone_number_id"].as_str() != Some(phone_number_id) {
            continue;
        }
        for m in value["messages"].as_array().into_iter().flatten() {
            if let Some(msg) = parse_message(m, allowed) {
                out.push(msg);
            }
        }
    }
    Ok(out)
}

/// One `messages[]` item as an inbound message (`None`: no text or file to answer, or no id).
fn parse_message(m: &Value, allowed: &[String]) -> Option<Inbound> {
    let id = m["id"].as_str().filter(|s| !s.is_empty())?;
    let from = m["from"].as_str().filter(|s| !s.is_empty())?;
    let kind = m["type"].as_str()?;
    let attachments: Vec<Attachment> = media(kind, &m[kind]).into_iter().collect();
    let text = match kind {
        "text" => m["text"]["body"].as_str(),
        "button" => m["button"]["text"].as_str(),
        "interactive" => {
            let i = &m["interactive"];
            i["button_reply"]["title"].as_str().or_else(|| i["list_reply"]["title"].as_str())
        }
        // A file's words are its caption; a file alone is still a message.
        _ if !attachments.is_empty() => Some(m[kind]["caption"].as_str().unwrap_or("")),
        _ => None,
    }?;
    let sent_at =
        m["timestamp"].as_str().and_then(|t| t.parse::<u64>().ok()).map(|s| UNIX_EPOCH + Duration::from_secs(s));
    Some(Inbound {
        event_id: id.to_owned(),
        chat_id: from.to_owned(),
        user_id: from.to_owned(),
        text: text.to_owned(),
        sent_at,
        chat: ChatKind::Direct,
        listed: allowed.iter().any(|a| a == from),
        addressed: true,
        attachments,
    })
}

/// The file a media message of type `kind` carries (`m` is its `image`, `document`, … object),
/// fetched by its media id. The webhook gives no size: the download's own bounds apply.
fn media(kind: &str, m: &Value) -> Option<Attachment> {
    let (name, declared) = match kind {
        "image" => ("image.jpg", "image/jpeg"),
        "document" => ("document", "application/octet-stream"),
        "audio" if m["voice"] == true => ("voice.ogg", "audio/ogg"),
        "audio" => ("audio.mp3", "audio/mpeg"),
        "video" => ("video.mp4", "video/mp4"),
        "sticker" => ("sticker.webp", "image/webp"),
        _ => return None,
    };
    let id = m["id"].as_str().filter(|i| media_id_ok(i))?;
    // `mime_type` may carry parameters (`audio/ogg; codecs=opus`): the type is what is checked.
    let declared = m["mime_type"].as_str().and_then(|t| t.split(';').next()).map_or(declared, str::trim);
    Some(Attachment {
        name: m["filename"].as_str().filter(|f| !f.trim().is_empty()).unwrap_or(name).to_owned(),
        declared: declared.to_owned(),
        size: None,
        fetch: id.to_owned(),
        outcome: None,
    })
}

/// A media id as a path segment (Meta's are digits; letters, `-` and `_` are allowed).
fn media_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The chats' customer-service windows: each chat's last message (time and id).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Windows {
    /// `wa_id` → (unix seconds of the last message, its `wamid`).
    chats: BTreeMap<String, (u64, String)>,
}

impl Windows {
    fn load(path: Option<&std::path::Path>) -> Windows {
        match path.map(fsio::read_json::<Windows>) {
            Some(fsio::ReadOutcome::Ok(w)) => w,
            _ => Windows::default(),
        }
    }

    fn seen(&mut self, chat: &str, at: u64, id: &str) {
        let e = self.chats.entry(chat.to_owned()).or_insert((0, String::new()));
        if at >= e.0 {
            *e = (at, id.to_owned());
        }
    }

    /// Drops the chats whose window closed, and the oldest past [`MAX_CHATS`].
    fn prune(&mut self, now: u64) {
        self.chats.retain(|_, (at, _)| now.saturating_sub(*at) < WINDOW.as_secs());
        if self.chats.len() > MAX_CHATS {
            let mut times: Vec<u64> = self.chats.values().map(|(t, _)| *t).collect();
            times.sort_unstable();
            let cut = times[times.len() - MAX_CHATS];
            self.chats.retain(|_, (at, _)| *at >= cut);
        }
    }

    /// Why a reply to `chat` cannot be sent now, if it cannot.
    fn closed(&self, chat: &str, now: u64) -> Option<String> {
        match self.chats.get(chat) {
            None => Some(format!(
                "outside WhatsApp's 24-hour customer-service window: no message from {chat} in the last 24 h (templates are not configured)"
            )),
            Some((at, _)) if now.saturating_sub(*at) >= WINDOW.as_secs() => Some(format!(
                "outside WhatsApp's 24-hour customer-service window: the last message from {chat} was {} h ago (templates are not configured)",
                now.saturating_sub(*at) / 3600
            )),
            Some(_) => None,
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Why a Graph API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ApiError {
    Network(String),
    RateLimited(Option<Duration>, String),
    Auth(String),
    /// Outside the customer-service window (131047).
    Window(String),
    Server(String),
    Refused(String),
}

/// Classifies one Graph API answer (the error codes of the module notes).
fn classify(status: u16, body: &Value, retry_after: Option<Duration>) -> Result<Value, ApiError> {
    let err = &body["error"];
    if (200..300).contains(&status) && err.is_null() {
        return Ok(body.clone());
    }
    let code = err["code"].as_i64();
    let what = format!(
        "Graph API {status}{}: {}",
        code.map(|c| format!(" (code {c})")).unwrap_or_default(),
        err["error_data"]["details"].as_str().or(err["message"].as_str()).unwrap_or("no error message")
    );
    Err(match code {
        Some(190) => ApiError::Auth(what),
        Some(131047) => ApiError::Window(what),
        Some(130429 | 131056 | 4 | 80007) => ApiError::RateLimited(retry_after, what),
        Some(131000 | 131016 | 1 | 2) => ApiError::Server(what),
        _ if status == 401 => ApiError::Auth(what),
        _ if status == 429 => ApiError::RateLimited(retry_after, what),
        _ if status >= 500 => ApiError::Server(what),
        _ => ApiError::Refused(what),
    })
}

/// The phone number's node on the Graph API, with the access token.
#[derive(Clone)]
struct Api {
    http: ureq::Agent,
    node: String,
    token: String,
}

impl Api {
    fn new(node: &str, token: &str, out: &Outbound) -> Api {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        Api { http, node: node.to_owned(), token: token.to_owned() }
    }

    /// GETs the node itself (`body` none) or POSTs `body` to its `messages` edge.
    fn call(&self, body: Option<&Value>) -> Result<Value, ApiError> {
        let bearer = format!("Bearer {}", self.token);
        let sent = match body {
            None => {
                let url = format!("{}?fields=id", self.node);
                self.http
                    .get(&url)
                    .header("Authorization", &bearer)
                    .config()
                    .timeout_global(Some(CALL_TIMEOUT))
                    .build()
                    .call()
                    .map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))
            }
            Some(b) => {
                let url = format!("{}/messages", self.node);
                self.http
                    .post(&url)
                    .header("Authorization", &bearer)
                    .header("Content-Type", "application/json")
                    .config()
                    .timeout_global(Some(CALL_TIMEOUT))
                    .build()
                    .send(b.to_string())
                    .map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))
            }
        };
        answer(sent?)
    }

    /// `{base}/{api_version}`: the Graph API root the media nodes hang off.
    fn graph(&self) -> &str {
        self.node.rsplit_once('/').map_or(self.node.as_str(), |(g, _)| g)
    }

    /// `GET /{api_version}/{media-id}`, then `GET` of the `url` it names, both with the bearer
    /// (module notes); the body is streamed to the store. A `file_size` past the store's bound
    /// (`max`) is refused before the download.
    fn media(&self, id: &str, max: Option<u64>, timeout: Duration) -> Result<Box<dyn std::io::Read + Send>, String> {
        if !media_id_ok(id) {
            return Err(format!("{id:?} is not a media id"));
        }
        let bearer = format!("Bearer {}", self.token);
        let url = format!("{}/{id}", self.graph());
        let sent = self
            .http
            .get(&url)
            .header("Authorization", &bearer)
            .config()
            .timeout_global(Some(CALL_TIMEOUT.min(timeout)))
            .build()
            .call()
            .map_err(|e| gatewarden_net::describe(&e, &url))?;
        let info = answer(sent).map_err(|e| media_error(&e))?;
        if let (Some(size), Some(max)) = (info["file_size"].as_u64(), max)
            && size > max
        {
            return Err(format!(
                "too large ({} > {})",
                crate::attachments::human_size(size),
                crate::attachments::human_size(max)
            ));
        }
        let Some(file) = info["url"].as_str().filter(|u| u.starts_with("https://") || u.starts_with("http://")) else {
            return Err("the media node named no url".into());
        };
        crate::filexfer::download(&self.http, file, Some(&self.token), timeout)
    }

    /// `POST /{phone_number_id}/media` of a stored file; returns the media id.
    fn upload(&self, file: &OutFile) -> Result<String, ApiError> {
        let fields = [("messaging_product", "whatsapp"), ("type", file.kind.as_str())];
        let form = crate::filexfer::multipart(&fields, "file", file).map_err(ApiError::Refused)?;
        let url = format!("{}/media", self.node);
        let bearer = format!("Bearer {}", self.token);
        let sent = crate::filexfer::post_form(&self.http, &url, Some(&bearer), form, UPLOAD_TIMEOUT)
            .map_err(|e| ApiError::Network(gatewarden_net::describe(&e, &url)))?;
        let v = answer(sent)?;
        v["id"]
            .as_str()
            .filter(|i| media_id_ok(i))
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Server("the media upload returned no id".into()))
    }
}

/// Reads and classifies one Graph API answer.
fn answer(response: ureq::http::Response<ureq::Body>) -> Result<Value, ApiError> {
    let status = response.status().as_u16();
    let retry_after = crate::header_secs(&response, "retry-after");
    let v = crate::json_body(response, MAX_BODY_BYTES).map_err(ApiError::Network)?;
    classify(status, &v, retry_after)
}

/// A media lookup's failure, for the refusal the chat is told.
fn media_error(e: &ApiError) -> String {
    match e {
        ApiError::Network(m) => format!("cannot reach the Graph API: {m}"),
        ApiError::RateLimited(_, m)
        | ApiError::Auth(m)
        | ApiError::Window(m)
        | ApiError::Server(m)
        | ApiError::Refused(m) => m.clone(),
    }
}

/// The receive side: what the webhook pushed.
pub struct Webhook {
    api: Api,
    push: PushReceiver,
    windows: Arc<Mutex<Windows>>,
    path: Option<PathBuf>,
}

impl skeleton::Receiver for Webhook {
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        match self.api.call(None) {
            Ok(_) => Ok(()),
            Err(ApiError::Auth(m)) => Err(Failure::Rejected(format!("access token (token_env): {m}"))),
            Err(ApiError::RateLimited(d, _)) => Err(Failure::RateLimited(d)),
            Err(ApiError::Network(m)) => Err(Failure::Down(format!("cannot reach the Graph API: {m}"))),
            Err(ApiError::Window(m) | ApiError::Server(m) | ApiError::Refused(m)) => Err(Failure::Down(m)),
        }
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        let batch = self.push.receive(ctx, budget.unwrap_or(RECEIVE_WAIT).min(RECEIVE_WAIT));
        if !batch.messages.is_empty() {
            // Before the commit: a reply can be sent as soon as the message is journaled.
            let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            for m in &batch.messages {
                let at =
                    m.sent_at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or_else(unix_now, |d| d.as_secs());
                w.seen(&m.chat_id, at.min(unix_now()), &m.event_id);
            }
        }
        Ok(batch)
    }

    fn fetch(&mut self, ctx: &Ctx, a: &Attachment, timeout: Duration) -> Result<Box<dyn std::io::Read + Send>, String> {
        let max = ctx.host().attachments().map(|(_, b)| b.per_file);
        self.api.media(&a.fetch, max, timeout)
    }

    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        self.push.confirm();
        let Some(path) = &self.path else { return Ok(()) };
        let snapshot = {
            let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            w.prune(unix_now());
            w.clone()
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        fsio::write_json(path, &snapshot).map_err(|e| format!("cannot save {}: {e}", path.display()))
    }
}

/// The send side: the messages edge.
pub struct Graph {
    api: Api,
    windows: Arc<Mutex<Windows>>,
    /// Per chat: the message last marked read with the typing indicator, and when.
    typed: BTreeMap<String, (String, Instant)>,
}

fn send_error(e: ApiError) -> SendError {
    match e {
        ApiError::RateLimited(d, _) => SendError::RateLimited(d),
        ApiError::Auth(m) => SendError::Unauthorized(format!("access token (token_env): {m}")),
        ApiError::Window(m) => SendError::Rejected(format!("outside WhatsApp's 24-hour customer-service window: {m}")),
        ApiError::Refused(m) => SendError::Rejected(m),
        ApiError::Network(m) => SendError::Failed(format!("cannot reach the Graph API: {m}")),
        ApiError::Server(m) => SendError::Failed(m),
    }
}

impl skeleton::Sender for Graph {
    /// The media upload, then a media message naming it (module notes).
    fn send_file(&mut self, chat: &str, file: &OutFile, _id: PieceId) -> Result<(), SendError> {
        if let Some(why) = self.windows.lock().unwrap_or_else(|p| p.into_inner()).closed(chat, unix_now()) {
            return Err(SendError::Rejected(why));
        }
        let media = self.api.upload(file).map_err(send_error)?;
        let kind = media_kind(&file.kind, file.size);
        let mut object = json!({"id": media});
        if kind == "document" {
            object["filename"] = json!(file.name);
        }
        let body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": chat,
            "type": kind,
            kind: object,
        });
        self.api.call(Some(&body)).map(drop).map_err(send_error)
    }

    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        if let Some(why) = self.windows.lock().unwrap_or_else(|p| p.into_inner()).closed(chat, unix_now()) {
            return Err(SendError::Rejected(why));
        }
        let body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": chat,
            "type": "text",
            "text": {"preview_url": false, "body": piece},
        });
        self.api.call(Some(&body)).map(drop).map_err(send_error)
    }

    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if !on {
            // The indicator ends with the reply or after 25 s.
            return Ok(());
        }
        let Some((_, wamid)) = self.windows.lock().unwrap_or_else(|p| p.into_inner()).chats.get(chat).cloned() else {
            return Ok(());
        };
        if self.typed.get(chat).is_some_and(|(id, at)| *id == wamid && at.elapsed() < TYPING_EVERY) {
            return Ok(());
        }
        let body = json!({
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": wamid,
            "typing_indicator": {"type": "text"},
        });
        self.api.call(Some(&body)).map_err(send_error)?;
        if self.typed.len() > 1024 {
            self.typed.retain(|_, (_, at)| at.elapsed() < TYPING_EVERY);
        }
        self.typed.insert(chat.to_owned(), (wamid, Instant::now()));
        Ok(())
    }
}

/// The media message type a stored file goes out as (module notes).
fn media_kind(kind: &str, size: u64) -> &'static str {
    match kind {
        "image/jpeg" | "image/png" if size <= MAX_IMAGE_BYTES => "image",
        "audio/aac" | "audio/amr" | "audio/mpeg" | "audio/mp4" | "audio/ogg" if size <= MAX_AUDIO_BYTES => "audio",
        _ => "document",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's published test values for `X-Hub-Signature-256`
    /// (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries).
    #[test]
    fn github_published_vector() {
        let (secret, body) = (b"It's a Secret to Everybody".as_slice(), b"Hello, World!".as_slice());
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(secret, body), header);
        assert!(signature_ok(secret, body, Some(header)));
        assert!(!signature_ok(secret, b"Hello, World?", Some(header)));
        assert!(!signature_ok(b"another secret", body, Some(header)));
        assert!(!signature_ok(secret, body, None));
        assert!(!signature_ok(secret, body, Some(&header[7..])), "the sha256= prefix is required");
        assert!(!signature_ok(secret, body, Some("sha256=75")), "a truncated MAC");
        assert!(!signature_ok(secret, body, Some("sha256=zz")));
    }

    /// Meta's format: the same HMAC over the raw JSON body as sent (escaped unicode kept),
    /// `sha256=` and lower-case hex.
    #[test]
    fn meta_format() {
        let body = br#"{"object":"whatsapp_business_account","entry":[{"id":"0","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"16505551111","phone_number_id":"123456123"},"messages":[{"from":"16315551181","id":"wamid.ABGGFlA5FpafAgo6EHmCHpL6XnENNA","timestamp":"1504902988","type":"text","text":{"body":"caf\u00e9"}}]}}]}]}"#;
        let header = sign(b"app-secret", body);
        assert!(header.starts_with("sha256=") && header.len() == 7 + 64 && header == header.to_lowercase());
        assert!(signature_ok(b"app-secret", body, Some(&header)));
        assert!(signature_ok(b"app-secret", body, Some(&header.to_uppercase().replace("SHA256=", "sha256="))));
        // Re-serialised JSON (unicode unescaped) is other bytes: refused.
        let reparsed = serde_json::to_vec(&serde_json::from_slice::<Value>(body).unwrap()).unwrap();
        assert!(!signature_ok(b"app-secret", &reparsed, Some(&header)));
        let msgs = parse_notification(body, "123456123", &[]).unwrap();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].text, "café");
        assert_eq!(msgs[0].event_id, "wamid.ABGGFlA5FpafAgo6EHmCHpL6XnENNA");
        assert_eq!(msgs[0].sent_at, Some(UNIX_EPOCH + Duration::from_secs(1504902988)));
        assert!(parse_notification(body, "999", &[]).unwrap().is_empty(), "another number's");
    }

    #[test]
    fn the_handshake_needs_subscribe_and_the_token() {
        assert_eq!(
            handshake("hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meatyhamhock", "meatyhamhock"),
            Some("1158201444".into())
        );
        assert_eq!(
            handshake("hub.mode=subscribe&hub.challenge=x&hub.verify_token=a%20b%2Bc", "a b+c"),
            Some("x".into())
        );
        assert_eq!(handshake("hub.mode=subscribe&hub.challenge=1&hub.verify_token=wrong", "meatyhamhock"), None);
        assert_eq!(handshake("hub.mode=unsubscribe&hub.challenge=1&hub.verify_token=t", "t"), None);
        assert_eq!(handshake("hub.mode=subscribe&hub.verify_token=t", "t"), None);
        assert_eq!(handshake("hub.mode=subscribe&hub.challenge=1&hub.verify_token=", ""), None);
        assert_eq!(query_value("a=%zz%4&b=2", "a").as_deref(), Some("%zz%4"), "bad escapes are kept");
    }

    /// Media messages (Meta's payload examples) carry their file: the caption is the text, a
    /// file alone is a message with empty text, and a media id that is no path segment is
    /// dropped.
    #[test]
    fn whatsapp_media_messages_carry_their_files() {
        let msg = |kind: &str, obj: Value| json!({"from": "1555", "id": "wamid.m", "timestamp": "1", "type": kind, kind: obj});
        let image = json!({"caption": "look", "mime_type": "image/jpeg", "sha256": "x", "id": "1003"});
        let m = parse_message(&msg("image", image), &[]).unwrap();
        assert_eq!(m.text, "look");
        assert_eq!(
            (m.attachments[0].name.as_str(), m.attachments[0].declared.as_str(), m.attachments[0].fetch.as_str()),
            ("image.jpg", "image/jpeg", "1003")
        );
        let doc = json!({"filename": "report.pdf", "mime_type": "application/pdf", "sha256": "x", "id": "1004"});
        let m = parse_message(&msg("document", doc), &[]).unwrap();
        assert_eq!((m.text.as_str(), m.attachments[0].name.as_str()), ("", "report.pdf"));
        let voice = json!({"mime_type": "audio/ogg; codecs=opus", "sha256": "x", "id": "1005", "voice": true});
        let m = parse_message(&msg("audio", voice), &[]).unwrap();
        assert_eq!((m.attachments[0].name.as_str(), m.attachments[0].declared.as_str()), ("voice.ogg", "audio/ogg"));
        for kind in ["video", "sticker", "audio"] {
            let m = parse_message(&msg(kind, json!({"id": "77", "mime_type": "x/y"})), &[]).unwrap();
            assert_eq!(m.attachments.len(), 1, "{kind}");
        }
        assert!(parse_message(&msg("image", json!({"id": "../1"})), &[]).is_none(), "not a media id");
        assert!(parse_message(&msg("location", json!({"latitude": 1})), &[]).is_none());
        assert_eq!(media_kind("image/png", 10), "image");
        assert_eq!(media_kind("image/png", MAX_IMAGE_BYTES + 1), "document");
        assert_eq!(media_kind("audio/ogg", 10), "audio");
        assert_eq!(media_kind("application/pdf", 10), "document");
    }

    #[test]
    fn statuses_are_not_messages() {
        let body = json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{"field": "messages", "value": {
        "metadata": {"phone_number_id": "42"},
        "statuses": [{"id": "wamid.x", "status": "delivered", "recipient_id": "1555"}],
        "messages": [
            {"from": "1555", "id": "wamid.img", "timestamp": "1", "type": "image", "image": {"id": "m1"}},
            {"from": "1555", "id": "wamid.btn", "timestamp": "2", "type": "button", "button": {"text": "Yes", "payload": "y"}},
            {"from": "1666", "id": "wamid.int", "timestamp": "3", "type": "interactive", "interactive": {"type": "list_reply", "list_reply": {"id": "a", "title": "Option A"}}},
        ]}}]}]});
        let msgs = parse_notification(body.to_string().as_bytes(), "42", &["1666".into()]).unwrap();
        let got: Vec<_> = msgs.iter().map(|m| (m.event_id.as_str(), m.text.as_str(), m.listed)).collect();
        assert_eq!(got, [("wamid.img", "", false), ("wamid.btn", "Yes", false), ("wamid.int", "Option A", true)]);
        assert!(msgs.iter().all(|m| m.chat == ChatKind::Direct && m.addressed));
        assert_eq!(parse_notification(b"{}", "42", &[]), Ok(Vec::new()), "another product's: nothing");
        assert!(parse_notification(b"nope", "42", &[]).is_err());
    }

    #[test]
    fn graph_errors_are_classified_as_meta_documents() {
        let err =
            |code: i64| json!({"error": {"message": "m", "type": "OAuthException", "code": code, "fbtrace_id": "A"}});
        assert!(matches!(classify(401, &err(190), None), Err(ApiError::Auth(_))));
        assert!(matches!(classify(400, &err(131047), None), Err(ApiError::Window(_))));
        assert!(matches!(
            classify(400, &err(130429), Some(Duration::from_secs(3))),
            Err(ApiError::RateLimited(Some(d), _)) if d == Duration::from_secs(3)
        ));
        assert!(matches!(classify(400, &err(131056), None), Err(ApiError::RateLimited(None, _))));
        assert!(matches!(classify(429, &Value::Null, None), Err(ApiError::RateLimited(None, _))));
        assert!(matches!(classify(500, &err(131000), None), Err(ApiError::Server(_))));
        assert!(matches!(classify(502, &Value::Null, None), Err(ApiError::Server(_))));
        match classify(400, &err(131026), None) {
            Err(ApiError::Refused(m)) => assert!(m.contains("131026"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(classify(200, &json!({"messages": [{"id": "wamid.1"}]}), None).is_ok());
        assert!(matches!(send_error(ApiError::Auth("x".into())), SendError::Unauthorized(_)));
        assert!(matches!(send_error(ApiError::Window("x".into())), SendError::Rejected(m) if m.contains("24-hour")));
    }

    #[test]
    fn the_window_is_24_hours_from_the_last_message() {
        let mut w = Windows::default();
        let now = 1_000_000;
        assert!(w.closed("1555", now).is_some_and(|m| m.contains("24-hour")));
        w.seen("1555", now - WINDOW.as_secs() + 60, "wamid.a");
        assert_eq!(w.closed("1555", now), None);
        assert!(w.closed("1555", now + 60).is_some_and(|m| m.contains("24 h ago")));
        w.seen("1555", now - 10, "wamid.b");
        w.seen("1555", now - 20, "wamid.old");
        assert_eq!(w.chats["1555"], (now - 10, "wamid.b".to_owned()), "an older message does not move it back");
        w.seen("1666", now - WINDOW.as_secs() - 1, "wamid.c");
        w.prune(now);
        assert_eq!(w.chats.keys().collect::<Vec<_>>(), ["1555"]);
    }
}
