//! Who may do what on the dashboard, as pure functions (the clock and the request's headers
//! are arguments; only [`random_token`] touches the OS).
//!
//! * Reading is open (on the listener the gateway already guards with its `Host` check).
//! * Actions need the gateway's `api_token`, given once (`POST /ui/login`) and exchanged for a
//!   random session id in an `HttpOnly; SameSite=Strict` cookie; without a configured token
//!   there are no actions at all.
//! * Every POST must come from the page itself: its `Host` is one this gateway answers to,
//!   its `Origin` names that same host, and (once logged in) it carries the session's CSRF
//!   token. A token, a session id or a CSRF token is never rendered into a page except the
//!   CSRF token of the session viewing it.

use std::collections::VecDeque;

/// The session cookie's name.
pub const COOKIE: &str = "gw_session";
/// The form field and header that carry the CSRF token.
pub const CSRF_FIELD: &str = "csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";
/// A session lasts this long (µs): a day of work, then the token again.
pub const SESSION_TTL_US: i128 = 12 * 3600 * 1_000_000;
/// Sessions kept at once; the oldest is dropped past it, so logins cannot grow memory.
pub const MAX_SESSIONS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("this gateway does not answer to Host {0:?}")]
    Host(String),
    #[error("the request came from another origin ({0})")]
    Origin(String),
    #[error("no actions: this gateway has no api_token configured")]
    NoToken,
    #[error("wrong token")]
    WrongToken,
    #[error("not logged in (or the session expired): give the api_token first")]
    NoSession,
    #[error("missing or wrong CSRF token")]
    Csrf,
    #[error("the operating system gave no random bytes: {0}")]
    Random(String),
}

/// Equality that takes the same time wherever the first difference is (the length is not
/// secret: tokens and session ids have fixed shapes).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// 32 random bytes from the OS, as 64 hex digits.
pub fn random_token() -> Result<String, Refusal> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| Refusal::Random(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The `Host` rule of the gateway's API and its dashboard (the runtime's `http::host_allowed`
/// calls it, against DNS rebinding): a loopback name, the bound address unless it is unspecified, or one of
/// `allowed_hosts` (a configured name without a port matches every port).
pub fn host_allowed(host: &str, bound: Option<&str>, allowed_hosts: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let name = host_name(&host);
    if matches!(name, "localhost" | "127.0.0.1" | "[::1]") {
        return true;
    }
    if let Some(b) = bound.and_then(|b| b.parse::<std::net::SocketAddr>().ok())
        && !b.ip().is_unspecified()
        && name == host_name(&b.to_string())
    {
        return true;
    }
    allowed_hosts.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        if host_name(&a) == a { a == name } else { a == host }
    })
}

/// `host[:port]` without the port; an IPv6 literal keeps its brackets.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The facts of one POST that the checks need.
#[derive(Debug, Clone, Copy, Default)]
pub struct Post<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    /// The whole `Cookie` header.
    pub cookie: Option<&'a str>,
    /// The CSRF token from the form field or header.
    pub csrf: Option<&'a str>,
}

/// Where the page is served and who it answers to.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub api_token: Option<String>,
    pub bound: Option<String>,
    pub allowed_hosts: Vec<String>,
}

impl Policy {
    /// The origin checks every POST passes first (the login included): a `Host` this gateway
    /// answers to, and an `Origin` that is `http(s)://` that same host. A POST without
    /// `Origin` is refused: every browser sends it on POST, and a script outside a browser has
    /// the bearer API.
    pub fn check_origin(&self, p: &Post<'_>) -> Result<(), Refusal> {
        let host = p.host.ok_or_else(|| Refusal::Host(String::new()))?;
        if !host_allowed(host, self.bound.as_deref(), &self.allowed_hosts) {
            return Err(Refusal::Host(host.to_owned()));
        }
        let origin = p.origin.ok_or_else(|| Refusal::Origin("no Origin header".into()))?;
        let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        match rest {
            Some(o) if o.eq_ignore_ascii_case(host.trim()) => Ok(()),
            _ => Err(Refusal::Origin(origin.to_owned())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub csrf: String,
    pub created_us: i128,
}

/// The logged-in sessions of one gateway, in memory (a restart logs everyone out).
#[derive(Debug, Default)]
pub struct Sessions {
    list: VecDeque<Session>,
}

impl Sessions {
    /// `POST /ui/login`: the given token against the configured one (constant time); a new
    /// session on success. The caller has run [`Policy::check_origin`].
    pub fn login(&mut self, policy: &Policy, given: &str, now_us: i128) -> Result<Session, Refusal> {
        let token = policy.api_token.as_deref().ok_or(Refusal::NoToken)?;
        if !ct_eq(given.trim().as_bytes(), token.as_bytes()) {
            return Err(Refusal::WrongToken);
        }
        let s = Session { id: random_token()?, csrf: random_token()?, created_us: now_us };
        self.list.retain(|s| now_us - s.created_us < SESSION_TTL_US);
        while self.list.len() >= MAX_SESSIONS {
            self.list.pop_front();
        }
        self.list.push_back(s.clone());
        Ok(s)
    }

    /// The live session named by a `Cookie` header.
    pub fn find(&self, cookie_header: Option<&str>, now_us: i128) -> Option<&Session> {
        let id = cookie_value(cookie_header?, COOKIE)?;
        // Every live session is compared, so the time taken does not say which one matched.
        self.list
            .iter()
            .filter(|s| now_us - s.created_us < SESSION_TTL_US)
            .fold(None, |found, s| if ct_eq(s.id.as_bytes(), id.as_bytes()) { Some(s) } else { found })
    }

    /// An action's POST: origin checks, a live session, its CSRF token.
    pub fn check_action(&self, policy: &Policy, p: &Post<'_>, now_us: i128) -> Result<&Session, Refusal> {
        policy.check_origin(p)?;
        if policy.api_token.is_none() {
            return Err(Refusal::NoToken);
        }
        let s = self.find(p.cookie, now_us).ok_or(Refusal::NoSession)?;
        match p.csrf {
            Some(c) if ct_eq(c.as_bytes(), s.csrf.as_bytes()) => Ok(s),
            _ => Err(Refusal::Csrf),
        }
    }

    pub fn logout(&mut self, id: &str) {
        self.list.retain(|s| !ct_eq(s.id.as_bytes(), id.as_bytes()));
    }
}

/// The `Set-Cookie` value for a new session: not readable by scripts, never sent by another
/// site, only to the dashboard's paths.
pub fn set_cookie(s: &Session) -> String {
    format!("{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}", s.id, SESSION_TTL_US / 1_000_000)
}

/// One cookie's value from a `Cookie` header (`a=1; gw_session=…`).
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').filter_map(|kv| kv.trim().split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v.trim())
}

/// One field of an `application/x-www-form-urlencoded` body (`+` is a space, `%XX` a byte;
/// bad escapes are kept as written). The first occurrence wins.
pub fn form_value(body: &str, key: &str) -> Option<String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| decode(k) == key)
        .map(|(_, v)| decode(v))
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => match b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(x) => {
                    out.push(x);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_token_comparison() {
        assert_eq!(host_name("localhost:7878"), "localhost");
        assert_eq!(host_name("[::1]:7878"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("evil.example"), "evil.example");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
    }

    fn policy() -> Policy {
        Policy { api_token: Some("s3cret".into()), bound: Some("127.0.0.1:8080".into()), allowed_hosts: vec![] }
    }

    fn post<'a>(cookie: Option<&'a str>, csrf: Option<&'a str>) -> Post<'a> {
        Post { host: Some("127.0.0.1:8080"), origin: Some("http://127.0.0.1:8080"), cookie, csrf }
    }

    #[test]
    fn host_rule_matches_the_gateways() {
        let allowed = vec!["gw.test".to_owned(), "other.test:81".to_owned()];
        for ok in
            ["localhost", "LOCALHOST:9", "127.0.0.1:1", "[::1]:5", "gw.test:1234", "other.test:81", "10.0.0.5:8080"]
        {
            assert!(host_allowed(ok, Some("10.0.0.5:8080"), &allowed), "{ok}");
        }
        for bad in ["evil.test", "other.test:82", "localhost.evil.test", "10.0.0.5.evil:8080", "0.0.0.0:8080"] {
            assert!(!host_allowed(bad, Some("0.0.0.0:8080"), &allowed), "{bad}");
        }
    }

    #[test]
    fn origin_must_be_the_page_itself() {
        let p = policy();
        assert_eq!(p.check_origin(&post(None, None)), Ok(()));
        let foreign = Post { origin: Some("http://evil.test"), ..post(None, None) };
        assert_eq!(p.check_origin(&foreign), Err(Refusal::Origin("http://evil.test".into())));
        let rebound = Post { host: Some("evil.test:8080"), origin: Some("http://evil.test:8080"), ..post(None, None) };
        assert_eq!(p.check_origin(&rebound), Err(Refusal::Host("evil.test:8080".into())));
        for o in [None, Some("null"), Some("http://127.0.0.1:8081"), Some("file://")] {
            assert!(p.check_origin(&Post { origin: o, ..post(None, None) }).is_err(), "{o:?}");
        }
    }

    #[test]
    fn token_once_then_cookie_and_csrf() {
        let p = policy();
        let mut s = Sessions::default();
        assert_eq!(s.login(&p, "wrong", 0), Err(Refusal::WrongToken));
        assert_eq!(s.login(&Policy::default(), "s3cret", 0), Err(Refusal::NoToken));
        let sess = s.login(&p, "s3cret", 0).unwrap();
        assert_eq!(sess.id.len(), 64);
        assert_ne!(sess.id, sess.csrf);
        let c = set_cookie(&sess);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.starts_with("gw_session="), "{c}");
        let cookie = format!("theme=dark; {COOKIE}={}", sess.id);
        assert_eq!(s.check_action(&p, &post(Some(&cookie), Some(&sess.csrf)), 1).map(|x| &x.id), Ok(&sess.id));
        assert_eq!(s.check_action(&p, &post(Some(&cookie), None), 1).err(), Some(Refusal::Csrf));
        assert_eq!(s.check_action(&p, &post(Some(&cookie), Some("0")), 1).err(), Some(Refusal::Csrf));
        assert_eq!(s.check_action(&p, &post(None, Some(&sess.csrf)), 1).err(), Some(Refusal::NoSession));
        // Expired.
        assert_eq!(
            s.check_action(&p, &post(Some(&cookie), Some(&sess.csrf)), SESSION_TTL_US).err(),
            Some(Refusal::NoSession)
        );
        // A foreign origin is refused before the session is even looked at.
        let foreign = Post { origin: Some("http://evil.test"), ..post(Some(&cookie), Some(&sess.csrf)) };
        assert!(matches!(s.check_action(&p, &foreign, 1), Err(Refusal::Origin(_))));
        s.logout(&sess.id);
        assert_eq!(s.check_action(&p, &post(Some(&cookie), Some(&sess.csrf)), 1).err(), Some(Refusal::NoSession));
    }

    #[test]
    fn sessions_are_bounded() {
        let p = policy();
        let mut s = Sessions::default();
        let first = s.login(&p, "s3cret", 0).unwrap();
        for _ in 0..MAX_SESSIONS {
            s.login(&p, "s3cret", 0).unwrap();
        }
        assert_eq!(s.list.len(), MAX_SESSIONS);
        assert!(s.find(Some(&format!("{COOKIE}={}", first.id)), 0).is_none());
    }

    #[test]
    fn form_fields() {
        let body = "token=a%2Bb+c%3D&csrf=x&empty=&flag&token=second";
        assert_eq!(form_value(body, "token").as_deref(), Some("a+b c="));
        assert_eq!(form_value(body, "csrf").as_deref(), Some("x"));
        assert_eq!(form_value(body, "empty").as_deref(), Some(""));
        assert_eq!(form_value(body, "flag").as_deref(), Some(""));
        assert_eq!(form_value(body, "nope"), None);
        assert_eq!(form_value("x=%zz%4", "x").as_deref(), Some("%zz%4"));
        assert_eq!(form_value("x=%C3%A9", "x").as_deref(), Some("é"));
    }

    #[test]
    fn constant_time_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }
}
