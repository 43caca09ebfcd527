//! Discord's REST API as the adapter uses it: `GET /gateway/bot`, Create (with a file too),
//! Edit and Delete Message and Trigger Typing Indicator, with the per-route buckets and the global limit kept
//! from the `X-RateLimit-*` headers and 429s, for every one of them alike.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gatewarden_net::Outbound;
use serde_json::{Value, json};

const MAX_BODY_BYTES: u64 = 1 << 20;
/// Buckets remembered before the expired ones are dropped.
const MAX_BUCKETS: usize = 1024;

/// Why a REST call failed, typed by what the adapter does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestError {
    /// No answer (connect, timeout, TLS).
    Network(String),
    /// 429, or a bucket known to be empty: wait this long.
    Limited(Duration),
    /// 401: the token is refused.
    Unauthorized(String),
    /// 400/403/404: this request never succeeds (unknown channel, missing permissions).
    Rejected(String),
    /// 404 with code 10008, Unknown Message: the message is gone (deleted, or never ours).
    Gone(String),
    /// 5xx and anything else.
    Server(String),
}

impl std::fmt::Display for RestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestError::Network(m) => write!(f, "cannot reach the Discord API: {m}"),
            RestError::Limited(d) => write!(f, "rate limited: retry after {:.3} s", d.as_secs_f64()),
            RestError::Unauthorized(m) | RestError::Rejected(m) | RestError::Gone(m) | RestError::Server(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Discord's JSON error code for Unknown Message (docs: "JSON Error Codes").
const UNKNOWN_MESSAGE: u64 = 10008;

/// One request's method and body.
#[derive(Debug, Clone, Copy)]
enum Verb<'a> {
    Get,
    /// A POST with a JSON body, or an empty one (Trigger Typing Indicator).
    Post(Option<&'a Value>),
    Patch(&'a Value),
    Delete,
}

/// `id` as a path segment: Discord's ids are snowflakes, decimal digits only (so an id from a
/// chat, a preview file or a server can never reach another route).
fn snowflake<'a>(what: &str, id: &'a str) -> Result<&'a str, RestError> {
    if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RestError::Rejected(format!("{id:?} is no Discord {what} id")));
    }
    Ok(id)
}

/// One route bucket's last known state.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    remaining: u64,
    reset_at: Instant,
}

/// The REST client with its rate-limit state (one per sender thread).
pub struct Rest {
    http: ureq::Agent,
    base: String,
    token: String,
    /// Per route and major parameter (`POST /channels/{id}/messages` per channel).
    buckets: HashMap<String, Bucket>,
    /// A global 429 names a time before which nothing is sent.
    global_until: Option<Instant>,
}

/// A number header (`X-RateLimit-Remaining`, `-Reset-After`).
fn header_f64(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<f64> {
    r.headers().get(name)?.to_str().ok()?.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

/// Seconds as a duration, capped at a day (a hostile header cannot park the sender for ever).
fn secs(v: f64) -> Duration {
    Duration::from_secs_f64(v.clamp(0.0, 86_400.0))
}

impl Rest {
    pub fn new(base: &str, token: &str, out: &Outbound) -> Rest {
        let http = gatewarden_net::http_config(out).http_status_as_error(false).build().new_agent();
        Rest {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            buckets: HashMap::new(),
            global_until: None,
        }
    }

    fn redact(&self, s: String) -> String {
        if self.token.is_empty() { s } else { s.replace(&self.token, "<token>") }
    }

    /// How long the route `key` must wait before its next request, from what is known.
    pub fn wait_for(&self, key: &str, now: Instant) -> Option<Duration> {
        let global = self.global_until.filter(|t| *t > now).map(|t| t - now);
        let bucket = self.buckets.get(key).filter(|b| b.remaining == 0 && b.reset_at > now).map(|b| b.reset_at - now);
        match (global, bucket) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    fn call(&mut self, key: &str, path: &str, verb: Verb<'_>, timeout: Duration) -> Result<Value, RestError> {
        if let Some(wait) = self.wait_for(key, Instant::now()) {
            return Err(RestError::Limited(wait));
        }
        let url = format!("{}{path}", self.base);
        let auth = format!("Bot {}", self.token);
        let t = Some(timeout);
        let result = match verb {
            Verb::Get => self.http.get(&url).header("Authorization", &auth).config().timeout_global(t).build().call(),
            Verb::Post(Some(b)) => {
                self.http.post(&url).header("Authorization", &auth).config().timeout_global(t).build().send_json(b)
            }
            Verb::Post(None) => {
                self.http.post(&url).header("Authorization", &auth).config().timeout_global(t).build().send_empty()
            }
            Verb::Patch(b) => {
                self.http.patch(&url).header("Authorization", &auth).config().timeout_global(t).build().send_json(b)
            }
            Verb::Delete => {
                self.http.delete(&url).header("Authorization", &auth).config().timeout_global(t).build().call()
            }
        };
        self.answer(key, &url, result)
    }

    /// A response's rate-limit headers kept for `key`, and its outcome.
    fn answer(
        &mut self,
        key: &str,
        url: &str,
        result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, RestError> {
        let response = result.map_err(|e| RestError::Network(self.redact(gatewarden_net::describe(&e, url))))?;
        let status = response.status().as_u16();
        let now = Instant::now();
        let remaining = header_f64(&response, "x-ratelimit-remaining");
        let reset_after = header_f64(&response, "x-ratelimit-reset-after");
        let global =
            response.headers().get("x-ratelimit-global").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let retry_header = header_f64(&response, "retry-after");
        let v = crate::json_body(response, MAX_BODY_BYTES).map_err(|e| RestError::Network(self.redact(e)))?;
        if let (Some(rem), Some(after)) = (remaining, reset_after) {
            if self.buckets.len() >= MAX_BUCKETS {
                self.buckets.retain(|_, b| b.reset_at > now);
            }
            self.buckets.insert(key.to_owned(), Bucket { remaining: rem as u64, reset_at: now + secs(after) });
        }
        if status == 429 {
            let after = secs(v["retry_after"].as_f64().or(retry_header).unwrap_or(1.0));
            if global || v["global"] == Value::Bool(true) {
                self.global_until = Some(now + after);
            } else {
                let b = self.buckets.entry(key.to_owned()).or_insert(Bucket { remaining: 0, reset_at: now });
                b.remaining = 0;
                b.reset_at = b.reset_at.max(now + after);
            }
            return Err(RestError::Limited(after));
        }
        if (200..300).contains(&status) {
            return Ok(v);
        }
        let desc = self.redact(match (v["code"].as_u64(), v["message"].as_str()) {
            (Some(code), Some(m)) => format!("HTTP {status} (code {code}): {m}"),
            _ => format!("HTTP {status}"),
        });
        Err(match status {
            401 => RestError::Unauthorized(desc),
            404 if v["code"].as_u64() == Some(UNKNOWN_MESSAGE) => RestError::Gone(desc),
            // 413: a file past the upload limit (code 40005) never fits.
            400 | 403 | 404 | 413 => RestError::Rejected(desc),
            _ => RestError::Server(desc),
        })
    }

    /// `GET /gateway/bot`: the gateway URL (and a check of the token).
    pub fn gateway_url(&mut self) -> Result<String, RestError> {
        let v = self.call("GET /gateway/bot", "/gateway/bot", Verb::Get, Duration::from_secs(15))?;
        v["url"].as_str().map(str::to_owned).ok_or_else(|| RestError::Server("/gateway/bot returned no url".into()))
    }

    /// Create Message with `content`, mentions disabled; `nonce` (enforced) makes a resend
    /// return the first one. Returns the message's id, when the answer names it.
    pub fn create_message(
        &mut self,
        channel: &str,
        content: &str,
        nonce: Option<&str>,
        timeout: Duration,
    ) -> Result<Option<String>, RestError> {
        let channel = snowflake("channel", channel)?;
        let mut body = json!({"content": content, "allowed_mentions": {"parse": []}});
        if let Some(n) = nonce {
            body["nonce"] = json!(n);
            body["enforce_nonce"] = json!(true);
        }
        let key = format!("POST /channels/{channel}/messages");
        let v = self.call(&key, &format!("/channels/{channel}/messages"), Verb::Post(Some(&body)), timeout)?;
        Ok(v["id"].as_str().map(str::to_owned))
    }

    /// Create Message with one file (docs/reference "Uploading Files"): `multipart/form-data`
    /// with `payload_json` (`attachments[0]` names `files[0]`; the same enforced `nonce` as
    /// [`Rest::create_message`], mentions disabled) and the file streamed from the store.
    /// Returns the message's id, when the answer names it.
    pub fn upload_message(
        &mut self,
        channel: &str,
        file: &crate::skeleton::OutFile,
        nonce: Option<&str>,
        timeout: Duration,
    ) -> Result<Option<String>, RestError> {
        let channel = snowflake("channel", channel)?;
        let key = format!("POST /channels/{channel}/messages");
        if let Some(wait) = self.wait_for(&key, Instant::now()) {
            return Err(RestError::Limited(wait));
        }
        let name = gatewarden_net::multipart::header_safe(&file.name);
        let mut payload = json!({
            "attachments": [{"id": 0, "filename": name}],
            "allowed_mentions": {"parse": []},
        });
        if let Some(n) = nonce {
            payload["nonce"] = json!(n);
            payload["enforce_nonce"] = json!(true);
        }
        let payload = payload.to_string();
        let form =
            crate::filexfer::multipart(&[("payload_json", &payload)], "files[0]", file).map_err(RestError::Rejected)?;
        let url = format!("{}/channels/{channel}/messages", self.base);
        let auth = format!("Bot {}", self.token);
        let result = crate::filexfer::post_form(&self.http, &url, Some(&auth), form, timeout);
        let v = self.answer(&key, &url, result)?;
        Ok(v["id"].as_str().map(str::to_owned))
    }

    /// Edit Message: `PATCH /channels/{channel}/messages/{message}` with the new `content`.
    pub fn edit_message(
        &mut self,
        channel: &str,
        message: &str,
        content: &str,
        timeout: Duration,
    ) -> Result<(), RestError> {
        let (channel, message) = (snowflake("channel", channel)?, snowflake("message", message)?);
        let body = json!({"content": content, "allowed_mentions": {"parse": []}});
        // The route's bucket is per channel (its major parameter), whatever the message.
        let key = format!("PATCH /channels/{channel}/messages/:id");
        self.call(&key, &format!("/channels/{channel}/messages/{message}"), Verb::Patch(&body), timeout).map(drop)
    }

    /// Delete Message; one already gone (Unknown Message) counts as deleted.
    pub fn delete_message(&mut self, channel: &str, message: &str, timeout: Duration) -> Result<(), RestError> {
        let (channel, message) = (snowflake("channel", channel)?, snowflake("message", message)?);
        let key = format!("DELETE /channels/{channel}/messages/:id");
        match self.call(&key, &format!("/channels/{channel}/messages/{message}"), Verb::Delete, timeout) {
            Ok(_) | Err(RestError::Gone(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Trigger Typing Indicator: `POST /channels/{channel}/typing`, shown for about 10 s or
    /// until the bot's next message in the channel.
    pub fn trigger_typing(&mut self, channel: &str, timeout: Duration) -> Result<(), RestError> {
        let channel = snowflake("channel", channel)?;
        let key = format!("POST /channels/{channel}/typing");
        self.call(&key, &format!("/channels/{channel}/typing"), Verb::Post(None), timeout).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_limits_are_waited_before_asking() {
        let mut r = Rest::new("http://127.0.0.1:1", "t", &Outbound::system());
        let now = Instant::now();
        assert_eq!(r.wait_for("a", now), None);
        r.buckets.insert("a".into(), Bucket { remaining: 0, reset_at: now + Duration::from_secs(2) });
        r.buckets.insert("b".into(), Bucket { remaining: 3, reset_at: now + Duration::from_secs(2) });
        assert_eq!(r.wait_for("a", now), Some(Duration::from_secs(2)));
        assert_eq!(r.wait_for("b", now), None, "a bucket with requests left does not wait");
        r.global_until = Some(now + Duration::from_secs(5));
        assert_eq!(r.wait_for("b", now), Some(Duration::from_secs(5)), "the global limit holds every route");
        assert_eq!(secs(1e12), Duration::from_secs(86_400));
        let t = Duration::from_secs(1);
        assert!(matches!(r.create_message("../x", "hi", None, t), Err(RestError::Rejected(_))));
        assert!(matches!(r.edit_message("1", "2/../3", "hi", t), Err(RestError::Rejected(_))));
        assert!(matches!(r.delete_message("1", "", t), Err(RestError::Rejected(_))));
        assert!(matches!(r.trigger_typing("1?x=", t), Err(RestError::Rejected(_))));
    }
}
