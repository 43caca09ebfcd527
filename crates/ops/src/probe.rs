//! A bounded look at an upstream the configuration names, with crates/net's TLS and proxy
//! rules: `init` tries the credentials it was given (Telegram `getMe`, the provider's
//! `/models`), `doctor` compares this machine's clock with the upstream's `Date`. Each look is
//! one request of at most [`TIMEOUT`], follows no redirect, and is put in words that never
//! hold the URL's path (a Telegram token is in it) or a key.

use std::time::{Duration, SystemTime};

use gatewarden_net::Outbound;
use serde_json::Value;

/// The longest any one look takes: an offline machine is told so quickly.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The most of an answer that is read.
const MAX_BODY: u64 = 1 << 20;
/// A clock further off than this is `doctor`'s `clock-skew`: certificates may be refused as
/// expired or not valid yet, and signed requests as stale.
pub const CLOCK_SKEW_MAX: Duration = Duration::from_secs(300);

/// Telegram's Bot API, when the `[[platform]]` table names no `api_base`.
pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// An upstream's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// The body as JSON (`Null` when it is not).
    pub body: Value,
    /// Its `Date` header.
    pub date: Option<SystemTime>,
}

/// One GET of `url` with `headers`, within [`TIMEOUT`]: the answer, or why there was none.
pub fn get(url: &str, out: &Outbound, headers: &[(&str, String)]) -> Result<Answer, String> {
    let agent: ureq::Agent = gatewarden_net::http_config(out)
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(TIMEOUT))
        .build()
        .new_agent();
    let mut req = agent.get(url);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req.call().map_err(|e| match e {
        ureq::Error::Timeout(_) => {
            format!("{}: no answer within {} s", gatewarden_net::url_host(url), TIMEOUT.as_secs())
        }
        e => gatewarden_net::describe(&e, url),
    })?;
    let status = resp.status().as_u16();
    let date = resp.headers().get("date").and_then(|d| d.to_str().ok()).and_then(|d| httpdate::parse_http_date(d).ok());
    let bytes = resp.into_body().with_config().limit(MAX_BODY).read_to_vec().unwrap_or_default();
    Ok(Answer { status, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null), date })
}

/// What a credential check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The upstream took it; what it said about itself.
    Accepted(String),
    /// The upstream refused it (the reason, in its words).
    Rejected(String),
    /// No verdict: the upstream could not be asked (offline, refused, a certificate).
    Unreachable(String),
}

/// Telegram `getMe` with `token` at `api_base`.
pub fn telegram(api_base: &str, token: &str, out: &Outbound) -> Verdict {
    let url = format!("{}/bot{token}/getMe", api_base.trim_end_matches('/'));
    match get(&url, out, &[]) {
        Err(why) => Verdict::Unreachable(why),
        Ok(a) => telegram_verdict(&a),
    }
}

/// Pure: a `getMe` answer in words.
pub fn telegram_verdict(a: &Answer) -> Verdict {
    let r = &a.body["result"];
    match (a.status, a.body["ok"].as_bool()) {
        (200, Some(true)) => Verdict::Accepted(format!(
            "bot @{} (id {})",
            r["username"].as_str().unwrap_or("?"),
            r["id"].as_u64().map_or("?".into(), |i| i.to_string())
        )),
        (401 | 404, _) => Verdict::Rejected(format!(
            "Telegram does not know this token ({}); ask @BotFather for the bot's token",
            a.body["description"].as_str().unwrap_or("Unauthorized")
        )),
        (s, _) => Verdict::Unreachable(format!("the Bot API answered HTTP {s}")),
    }
}

/// The provider's `GET /models` with `key`: the verdict and the models it lists.
pub fn provider(base_url: &str, key: Option<&str>, out: &Outbound) -> (Verdict, Vec<String>) {
    let url = format!("{}/models", base_url.trim_end_matches('/'));
    let headers: Vec<(&str, String)> = key.map(|k| ("Authorization", format!("Bearer {k}"))).into_iter().collect();
    match get(&url, out, &headers) {
        Err(why) => (Verdict::Unreachable(why), Vec::new()),
        Ok(a) => provider_verdict(&a),
    }
}

/// Pure: a `/models` answer in words, with the model ids it lists.
pub fn provider_verdict(a: &Answer) -> (Verdict, Vec<String>) {
    let models: Vec<String> = a.body["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let said = || {
        a.body["error"]["message"]
            .as_str()
            .or_else(|| a.body["error"].as_str())
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    };
    let v = match a.status {
        200..=299 => Verdict::Accepted(format!("the provider lists {} model(s)", models.len())),
        401 | 403 => Verdict::Rejected(format!("the provider refused the API key (HTTP {}){}", a.status, said())),
        // Some providers serve no model list: the key is tried at the first message.
        404 | 405 => Verdict::Unreachable(format!("the provider has no model list (HTTP {})", a.status)),
        s => Verdict::Unreachable(format!("the provider answered HTTP {s}{}", said())),
    };
    (v, models)
}

/// How far this machine's clock is ahead of `url`'s (negative: behind), from one answer's
/// `Date` (whole seconds, so ±1 s is noise); `Err` when it cannot be told.
pub fn clock_skew(url: &str, out: &Outbound) -> Result<f64, String> {
    let a = get(url, out, &[])?;
    let date = a.date.ok_or_else(|| format!("{} sent no Date header", gatewarden_net::url_host(url)))?;
    Ok(skew(SystemTime::now(), date))
}

/// Pure: `local - remote` in seconds.
pub fn skew(local: SystemTime, remote: SystemTime) -> f64 {
    match local.duration_since(remote) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(status: u16, body: Value) -> Answer {
        Answer { status, body, date: None }
    }

    #[test]
    fn telegram_answers_in_words() {
        let ok = answer(200, json!({"ok": true, "result": {"id": 42, "is_bot": true, "username": "gw_bot"}}));
        assert_eq!(telegram_verdict(&ok), Verdict::Accepted("bot @gw_bot (id 42)".into()));
        let no = answer(401, json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
        assert!(matches!(telegram_verdict(&no), Verdict::Rejected(w) if w.contains("Unauthorized")));
        assert!(matches!(telegram_verdict(&answer(502, Value::Null)), Verdict::Unreachable(_)));
    }

    #[test]
    fn provider_answers_in_words() {
        let ok = answer(200, json!({"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]}));
        assert_eq!(
            provider_verdict(&ok),
            (Verdict::Accepted("the provider lists 2 model(s)".into()), vec!["m1".into(), "m2".into()])
        );
        let no = answer(401, json!({"error": {"message": "Incorrect API key provided"}}));
        assert!(matches!(provider_verdict(&no).0, Verdict::Rejected(w) if w.contains("(HTTP 401): Incorrect API key")));
        assert!(matches!(provider_verdict(&answer(404, Value::Null)).0, Verdict::Unreachable(_)));
    }

    #[test]
    fn skew_is_signed() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(skew(t, t - Duration::from_secs(600)), 600.0);
        assert_eq!(skew(t, t + Duration::from_secs(30)), -30.0);
    }
}
