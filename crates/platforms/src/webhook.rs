//! `kind = "webhook"`: signed inbound webhooks for alerts, CI and ticket systems, on the generic
//! push intake (skeleton/push.rs) like WhatsApp's.
//!
//! - **In**: `POST /hooks/webhook/<name>` on the gateway's listener
//!   (crates/runtime/src/http/hooks.rs). Checked in this order: the body's size
//!   (`max_body_bytes`, else 413), the signature (else 401), replay (401), the rate
//!   (`rate_per_minute`, else 429 with `Retry-After`), then the message is pushed and the answer
//!   waits for its journal commit: `202 {"message_id": …}` once committed, 5xx otherwise so the
//!   sender retries. Nothing is journaled for a request refused before the push.
//! - **Signatures** ([`verify`]): `signature = "gatewarden"` (default) takes
//!   `X-Gatewarden-Timestamp: <unix seconds>` and `X-Gatewarden-Signature: sha256=<hex>`, the
//!   HMAC-SHA256 keyed by the secret of `timestamp + "." + body`; a timestamp more than
//!   `replay_window_s` from now (either way) is stale, and a signature already accepted within
//!   the window is a replay. `signature = "github"` takes GitHub's `X-Hub-Signature-256:
//!   sha256=<hex>` (the HMAC of the body alone) and requires `X-GitHub-Delivery`, which
//!   deduplicates. Compared in constant time (the MAC's own `verify_slice`).
//! - **Delivery ids**: `X-Gatewarden-Delivery` (or `X-GitHub-Delivery`) is the journal's event
//!   id, so a redelivery is journaled once and answered 202 with the same message id; without
//!   one the signature is the event id.
//! - **The message**: the body, JSON pretty-printed, else as text, at most [`MAX_TEXT_CHARS`];
//!   the chat is `webhook:<name>`, or `webhook:<name>:<thread>` with `X-Gatewarden-Thread`.
//!   The sender is authenticated by the secret, so the chat counts as listed (the access
//!   policy delivers it).
//! - **The reply** goes through the outbox to `callback_url` ([`Callback`]): a JSON POST
//!   signed the same way, with the skeleton's retries and backoff and the TLS and proxy rules
//!   of every client (gatewarden_net). Without a callback URL the reply is only fetchable
//!   (`GET /v1/messages/{id}`), and the outbox entry is recorded as sent.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::{Webhook as Settings, WebhookSignature};
use gatewarden_net::Outbound;
use serde_json::{Value, json};

use crate::skeleton::push::{PushIntake, PushLimits, PushReceiver, Refused};
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, HookAnswer, HookRequest, Host, Inbound};

/// The text the agent sees, at most (the body beyond it is cut, and said so).
pub const MAX_TEXT_CHARS: usize = 32_000;
/// The longest delivery id or thread taken; longer ones are refused (400).
const MAX_ID_BYTES: usize = 200;
/// A receive without a budget waits at most this long for a pushed request.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// Bound on every callback POST.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Accepted signatures remembered for the replay check, at most (the oldest go first).
const MAX_SEEN: usize = 100_000;

pub const TIMESTAMP_HEADER: &str = "x-gatewarden-timestamp";
pub const SIGNATURE_HEADER: &str = "x-gatewarden-signature";
pub const DELIVERY_HEADER: &str = "x-gatewarden-delivery";
pub const THREAD_HEADER: &str = "x-gatewarden-thread";
pub const GITHUB_SIGNATURE_HEADER: &str = "x-hub-signature-256";
pub const GITHUB_DELIVERY_HEADER: &str = "x-github-delivery";

/// The webhook adapter.
pub type Webhook = Skeleton<Proto>;

/// Why a request's signature is not accepted (all answered 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSignature {
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("the timestamp is {0} s away from now, past the replay window")]
    Stale(u64),
    #[error("wrong signature")]
    Wrong,
    #[error("this signed request was already accepted (a replay)")]
    Replayed,
}

/// What a request's signature established: the bytes that identify it for the replay check
/// and the event id (a delivery id, else the signature).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub signature: String,
    pub delivery: Option<String>,
}

pub use crate::hooksig::sign;

/// The `X-Gatewarden-Signature` of `body` sent at `timestamp`.
pub fn sign_gatewarden(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    sign(secret, &[timestamp.to_string().as_bytes(), b".", body])
}

/// Whether `header` (`sha256=<hex>`) is the MAC of `parts`; constant-time.
fn mac_ok(secret: &[u8], parts: &[&[u8]], header: &str, name: &'static str) -> Result<(), BadSignature> {
    crate::hooksig::verify(secret, parts, header).map_err(|r| match r {
        crate::hooksig::Refusal::Malformed => BadSignature::Malformed(name),
        crate::hooksig::Refusal::Wrong => BadSignature::Wrong,
    })
}

/// A delivery id or thread header: printable ASCII, bounded.
fn token(value: Option<&str>, name: &'static str) -> Result<Option<String>, BadSignature> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) if v.len() <= MAX_ID_BYTES && v.bytes().all(|b| b.is_ascii_graphic()) => Ok(Some(v.to_owned())),
        Some(_) => Err(BadSignature::Malformed(name)),
    }
}

/// Checks `req`'s signature under `scheme` at `now` (unix seconds); the replay check of an
/// accepted signature is [`Seen`]'s. Parses only headers; the body is MACed as it is.
pub fn verify(
    scheme: WebhookSignature,
    secret: &[u8],
    window_s: u64,
    req: &HookRequest,
    now: u64,
) -> Result<Verified, BadSignature> {
    match scheme {
        WebhookSignature::Gatewarden => {
            let ts = req.header(TIMESTAMP_HEADER).ok_or(BadSignature::Missing("X-Gatewarden-Timestamp"))?;
            let sig = req.header(SIGNATURE_HEADER).ok_or(BadSignature::Missing("X-Gatewarden-Signature"))?;
            let ts = ts.trim();
            let at: u64 = ts
                .parse()
                .ok()
                .filter(|_| ts.bytes().all(|b| b.is_ascii_digit()))
                .ok_or(BadSignature::Malformed("X-Gatewarden-Timestamp"))?;
            // Checked before the MAC too, but reported after it: a stale answer tells nothing
            // to whoever cannot sign.
            mac_ok(secret, &[ts.as_bytes(), b".", &req.body], sig, "X-Gatewarden-Signature")?;
            let skew = at.abs_diff(now);
            if skew > window_s {
                return Err(BadSignature::Stale(skew));
            }
            let delivery = token(req.header(DELIVERY_HEADER), "X-Gatewarden-Delivery")?;
            Ok(Verified { signature: sig.trim().to_ascii_lowercase(), delivery })
        }
        WebhookSignature::Github => {
            let sig = req.header(GITHUB_SIGNATURE_HEADER).ok_or(BadSignature::Missing("X-Hub-Signature-256"))?;
            mac_ok(secret, &[&req.body], sig, "X-Hub-Signature-256")?;
            // No timestamp: the delivery id is what makes a redelivery harmless.
            let delivery = token(req.header(GITHUB_DELIVERY_HEADER), "X-GitHub-Delivery")?
                .ok_or(BadSignature::Missing("X-GitHub-Delivery"))?;
            Ok(Verified { signature: sig.trim().to_ascii_lowercase(), delivery: Some(delivery) })
        }
    }
}

/// Signatures accepted within the replay window: one accepted again is a replay. Only
/// committed requests are remembered, so a sender retrying after a 5xx with the same bytes is
/// taken.
#[derive(Debug, Default)]
pub struct Seen {
    order: VecDeque<(u64, String)>,
    set: BTreeMap<String, u64>,
}

impl Seen {
    pub fn contains(&self, signature: &str) -> bool {
        self.set.contains_key(signature)
    }

    /// Remembers `signature` accepted at `now`, forgetting those older than `window_s`.
    pub fn insert(&mut self, signature: String, now: u64, window_s: u64) {
        while let Some((at, _)) = self.order.front()
            && (now.saturating_sub(*at) > window_s.saturating_mul(2) || self.order.len() >= MAX_SEEN)
        {
            if let Some((_, s)) = self.order.pop_front() {
                self.set.remove(&s);
            }
        }
        if self.set.insert(signature.clone(), now).is_none() {
            self.order.push_back((now, signature));
        }
    }
}

/// A token bucket of `per_minute` requests: `Err(seconds)` to wait when empty.
#[derive(Debug)]
pub struct Rate {
    per_minute: u32,
    tokens: f64,
    at: Instant,
}

impl Rate {
    pub fn new(per_minute: u32) -> Rate {
        Rate { per_minute, tokens: f64::from(per_minute), at: Instant::now() }
    }

    pub fn take(&mut self, now: Instant) -> Result<(), u64> {
        let per_s = f64::from(self.per_minute) / 60.0;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_s).min(f64::from(self.per_minute));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - self.tokens) / per_s).ceil() as u64).max(1))
        }
    }
}

/// The body as the agent reads it: JSON pretty-printed, else text; bounded.
pub fn message_text(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    match text.char_indices().nth(MAX_TEXT_CHARS) {
        Some((cut, _)) => format!("{}\n… (cut at {MAX_TEXT_CHARS} characters)", &text[..cut]),
        None => text,
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The webhook: its secret, bounds and callback.
pub struct Proto {
    name: String,
    secret: String,
    settings: Settings,
    out: Outbound,
    intake: Arc<PushIntake>,
    seen: Mutex<Seen>,
    rate: Mutex<Rate>,
    /// The host of the current start: the 202 names the journaled message.
    host: Mutex<Option<Arc<dyn Host>>>,
    /// The credential lock's key: one gateway takes this webhook's requests.
    credential: String,
}

impl Skeleton<Proto> {
    /// `secret` signs the requests and the callbacks.
    pub fn new(cfg: &PlatformConfig, secret: String) -> Result<Webhook, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let out = Outbound::new(cfg.ca_file.as_deref(), None)
            .map_err(|e| AdapterError::Start { name: cfg.adapter_name(), message: e.to_string() })?;
        let name = cfg.adapter_name();
        let proto = Proto {
            credential: format!("webhook:{name}"),
            name,
            secret,
            settings: s.clone(),
            out,
            intake: PushIntake::new(PushLimits::default()),
            seen: Mutex::new(Seen::default()),
            rate: Mutex::new(Rate::new(s.rate_per_minute())),
            host: Mutex::new(None),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Webhook, AdapterError> {
        let secret = creds.required(gatewarden_config::secrets::PlatformSecret::Secret, "secret_env or secret_file")?;
        Webhook::new(cfg, secret)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        // One callback per reply, whatever its length (the callback's receiver has no limit).
        piece: PieceLimit::Chars(1 << 20),
        line_per_piece: false,
        batch: 16,
        pace: None,
        min_receive: Duration::from_millis(50),
        // The sender gets 5xx for what is not committed and delivers again.
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(300),
    };
    type Receiver = Intake;
    type Sender = Callback;

    fn credential(&self) -> &str {
        &self.credential
    }

    fn watchdog_after(&self) -> Duration {
        // Every receive returns within a second; the watchdog only matters for a stuck call.
        Duration::from_secs(90)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(Intake, Callback), String> {
        *self.host.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(host));
        let http = gatewarden_net::http_config(&self.out).http_status_as_error(false).build().new_agent();
        let tx = Callback {
            http,
            url: self.settings.callback_url.as_deref().map(|u| u.trim().to_owned()),
            secret: self.secret.clone(),
            scheme: self.settings.signature,
            name: self.name.clone(),
        };
        Ok((Intake { push: self.intake.attach() }, tx))
    }

    fn hook(&self, req: &HookRequest, receiving: Result<(), String>) -> HookAnswer {
        if !req.post {
            return HookAnswer::text(405, "POST a signed request");
        }
        if req.body.len() > self.settings.max_body_bytes() {
            return HookAnswer::text(413, format!("the body is over {} bytes", self.settings.max_body_bytes()));
        }
        let (now, window) = (unix_now(), self.settings.replay_window_s());
        let v = match verify(self.settings.signature, self.secret.as_bytes(), window, req, now) {
            Ok(v) => v,
            Err(e) => return HookAnswer::text(401, e.to_string()),
        };
        let replay_checked = self.settings.signature == WebhookSignature::Gatewarden;
        if replay_checked && self.seen.lock().unwrap_or_else(|p| p.into_inner()).contains(&v.signature) {
            return HookAnswer::text(401, BadSignature::Replayed.to_string());
        }
        if let Err(after) = self.rate.lock().unwrap_or_else(|p| p.into_inner()).take(Instant::now()) {
            return HookAnswer { retry_after: Some(after), ..HookAnswer::text(429, "too many requests") };
        }
        let thread = match token(req.header(THREAD_HEADER), "X-Gatewarden-Thread") {
            Ok(t) => t,
            Err(e) => return HookAnswer::text(400, e.to_string()),
        };
        if let Err(why) = receiving {
            return Refused::NotRunning(why).answer();
        }
        let user = format!("webhook:{}", self.name);
        let chat = thread.map_or_else(|| user.clone(), |t| format!("{user}:{t}"));
        let event_id = v.delivery.clone().unwrap_or_else(|| v.signature.clone());
        let msg = Inbound {
            event_id: event_id.clone(),
            chat_id: chat,
            user_id: user,
            text: message_text(&req.body),
            sent_at: None,
            chat: ChatKind::Direct,
            listed: true,
            addressed: true,
            attachments: Vec::new(),
        };
        match self.intake.push(vec![msg], req.body.len()) {
            Ok(()) => {
                if replay_checked {
                    self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(v.signature, now, window);
                }
                let host = self.host.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let id = host.and_then(|h| h.message_id(&self.name, &event_id));
                HookAnswer::json(202, &json!({"message_id": id, "event_id": event_id}))
            }
            Err(e) => e.answer(),
        }
    }
}

/// The receive side: what the listener pushed.
pub struct Intake {
    push: PushReceiver,
}

impl skeleton::Receiver for Intake {
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        Ok(())
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        Ok(self.push.receive(ctx, budget.unwrap_or(RECEIVE_WAIT).min(RECEIVE_WAIT)))
    }

    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        self.push.confirm();
        Ok(())
    }
}

/// The send side: each reply POSTed to `callback_url`.
pub struct Callback {
    http: ureq::Agent,
    url: Option<String>,
    secret: String,
    scheme: WebhookSignature,
    name: String,
}

impl Callback {
    /// The callback's body for one piece of a reply to `chat`.
    pub fn body(name: &str, chat: &str, piece: &str, id: PieceId) -> String {
        json!({"webhook": name, "chat": chat, "seq": id.seq, "piece": id.index, "text": piece}).to_string()
    }
}

impl skeleton::Sender for Callback {
    fn send(&mut self, chat: &str, piece: &str, id: PieceId) -> Result<(), SendError> {
        // Without a callback the reply is fetched by message id: nothing to send.
        let Some(url) = &self.url else { return Ok(()) };
        let body = Callback::body(&self.name, chat, piece, id);
        let delivery = format!("{}-{}-{}", self.name, id.seq, id.index);
        let mut rq =
            self.http.post(url).header("Content-Type", "application/json").header("X-Gatewarden-Delivery", &delivery);
        rq = match self.scheme {
            WebhookSignature::Gatewarden => {
                let ts = unix_now();
                rq.header("X-Gatewarden-Timestamp", &ts.to_string())
                    .header("X-Gatewarden-Signature", &sign_gatewarden(self.secret.as_bytes(), ts, body.as_bytes()))
            }
            WebhookSignature::Github => {
                rq.header("X-Hub-Signature-256", &sign(self.secret.as_bytes(), &[body.as_bytes()]))
            }
        };
        let r = rq
            .config()
            .timeout_global(Some(CALL_TIMEOUT))
            .build()
            .send(body)
            .map_err(|e| SendError::Failed(gatewarden_net::describe(&e, url)))?;
        let status = r.status().as_u16();
        let retry_after = crate::header_secs(&r, "retry-after");
        match status {
            200..=299 => Ok(()),
            429 => Err(SendError::RateLimited(retry_after)),
            // A receiver's 4xx says this reply will never be taken; a 5xx may pass.
            400..=499 => Err(SendError::Rejected(format!("the callback answered {status}"))),
            _ => Err(SendError::Failed(format!("the callback answered {status}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)], body: &[u8]) -> HookRequest {
        HookRequest {
            post: true,
            query: String::new(),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            body: body.to_vec(),
        }
    }

    /// GitHub's published example (docs.github.com, "Validating webhook deliveries", "Testing
    /// the webhook payload validation").
    #[test]
    fn githubs_fixed_vector() {
        let secret = b"It's a Secret to Everybody";
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(secret, &[b"Hello, World!"]), sig);
        let ok = req(&[(GITHUB_SIGNATURE_HEADER, sig), (GITHUB_DELIVERY_HEADER, "d-1")], b"Hello, World!");
        let v = verify(WebhookSignature::Github, secret, 300, &ok, 0).unwrap();
        assert_eq!(v.delivery.as_deref(), Some("d-1"));
        let wrong = req(&[(GITHUB_SIGNATURE_HEADER, sig), (GITHUB_DELIVERY_HEADER, "d-1")], b"Hello, World?");
        assert_eq!(verify(WebhookSignature::Github, secret, 300, &wrong, 0), Err(BadSignature::Wrong));
        let no_delivery = req(&[(GITHUB_SIGNATURE_HEADER, sig)], b"Hello, World!");
        assert_eq!(
            verify(WebhookSignature::Github, secret, 300, &no_delivery, 0),
            Err(BadSignature::Missing("X-GitHub-Delivery"))
        );
        let unsigned = req(&[(GITHUB_DELIVERY_HEADER, "d-1")], b"Hello, World!");
        assert!(matches!(verify(WebhookSignature::Github, secret, 300, &unsigned, 0), Err(BadSignature::Missing(_))));
    }

    /// Our scheme's vector, quoted in README.md ("Webhooks").
    #[test]
    fn gatewardens_fixed_vector_stale_wrong_missing() {
        let secret = b"It's a Secret to Everybody";
        let sig = sign_gatewarden(secret, 1_700_000_000, b"Hello, World!");
        assert_eq!(sig, "sha256=76c83fd0acdf22faed320674fe8e04d528cfe8a17905e720a9611e40677c03b7");
        let headers = |ts: &str, s: &str| vec![(TIMESTAMP_HEADER, ts.to_owned()), (SIGNATURE_HEADER, s.to_owned())];
        let mk = |h: Vec<(&str, String)>, body: &[u8]| {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            req(&h, body)
        };
        let ok = mk(headers("1700000000", &sig), b"Hello, World!");
        let s = WebhookSignature::Gatewarden;
        assert!(verify(s, secret, 300, &ok, 1_700_000_000).is_ok());
        assert!(verify(s, secret, 300, &ok, 1_700_000_300).is_ok(), "at the window's edge");
        assert!(verify(s, secret, 300, &ok, 1_699_999_700).is_ok(), "a sender's clock ahead");
        assert_eq!(verify(s, secret, 300, &ok, 1_700_000_301), Err(BadSignature::Stale(301)));
        assert_eq!(verify(s, secret, 300, &ok, 1_699_999_699), Err(BadSignature::Stale(301)));
        let other_ts = mk(headers("1700000001", &sig), b"Hello, World!");
        assert_eq!(verify(s, secret, 300, &other_ts, 1_700_000_000), Err(BadSignature::Wrong));
        assert_eq!(verify(s, b"another secret", 300, &ok, 1_700_000_000), Err(BadSignature::Wrong));
        let no_prefix = mk(headers("1700000000", sig.trim_start_matches("sha256=")), b"Hello, World!");
        assert!(matches!(verify(s, secret, 300, &no_prefix, 1_700_000_000), Err(BadSignature::Malformed(_))));
        let bad_ts = mk(headers("+1700000000", &sig), b"Hello, World!");
        assert!(matches!(verify(s, secret, 300, &bad_ts, 1_700_000_000), Err(BadSignature::Malformed(_))));
        let missing = mk(vec![(SIGNATURE_HEADER, sig.clone())], b"Hello, World!");
        assert!(matches!(verify(s, secret, 300, &missing, 1_700_000_000), Err(BadSignature::Missing(_))));
        let mut seen = Seen::default();
        let v = verify(s, secret, 300, &ok, 1_700_000_000).unwrap();
        assert!(!seen.contains(&v.signature));
        seen.insert(v.signature.clone(), 1_700_000_000, 300);
        assert!(seen.contains(&v.signature), "replayed");
        seen.insert("sha256=00".into(), 1_700_000_601, 300);
        assert!(!seen.contains(&v.signature), "forgotten once it would be stale anyway");
    }

    #[test]
    fn the_text_is_pretty_json_or_the_body_and_bounded() {
        assert_eq!(message_text(br#"{"a":1}"#), "{\n  \"a\": 1\n}");
        assert_eq!(message_text(b"plain"), "plain");
        let long = "x".repeat(MAX_TEXT_CHARS + 5);
        assert!(message_text(long.as_bytes()).ends_with("(cut at 32000 characters)"));
    }

    #[test]
    fn the_rate_bound_says_when_to_come_back() {
        let t0 = Instant::now();
        let mut r = Rate::new(2);
        assert_eq!((r.take(t0), r.take(t0)), (Ok(()), Ok(())));
        assert_eq!(r.take(t0), Err(30));
        assert_eq!(r.take(t0 + Duration::from_secs(30)), Ok(()));
    }
}
