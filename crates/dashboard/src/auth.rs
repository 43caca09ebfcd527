//! Who may do what on the dashboard, as pure functions (the clock and the request's headers
//! are arguments; only [`random_token`] touches the OS).
//!
//! * Reading needs a session wherever a token is configured (the web layer's `ReadRule`,
//!   crate::web); without one, a gateway's page is open on loopback and shows no message text.
//! * Actions need the gateway's `api_token`, given once (`POST /ui/login`) and exchanged for a
//!   random session id in an `HttpOnly; SameSite=Strict` cookie; without a configured token
//!   there are no actions at all.
//! * Failed logins are throttled per client ([`Throttle`]): a few free tries, then each one
//!   waits longer, up to a minute; the web layer records each in the ledger.
//! * Every POST must come from the page itself: its `Host` is one this gateway answers to,
//!   its `Origin` names that same host, and (once logged in) it carries the session's CSRF
//!   token. A token, a session id or a CSRF token is never rendered into a page except the
//!   CSRF token of the session viewing it.

use std::collections::{HashMap, VecDeque};

/// The session cookie's name.
pub const COOKIE: &str = "gw_session";
/// The form field and header that carry the CSRF token.
pub const CSRF_FIELD: &str = "csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";
/// A session lasts this long (µs): a day of work, then the token again.
pub const SESSION_TTL_US: i128 = 12 * 3600 * 1_000_000;

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
    #[error("too many failed logins from this client: try again in {0} s")]
    Throttled(u64),
    #[error("the operating system gave no random bytes: {0}")]
    Random(String),
}

/// Equality that takes the same time wherever the first difference is (the length is not
/// secret: tokens and session ids have fixed shapes).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
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
    /// The cookie's value: `<created µs, hex>.<256 random bits, hex>.<its HMAC, hex>`.
    pub id: String,
    pub csrf: String,
    pub created_us: i128,
}

/// Logouts remembered at once (each until its session would have expired anyway); past it the
/// oldest is forgotten.
pub const MAX_LOGOUTS: usize = 1024;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::{KeyInit, Mac};
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let Ok(mut m) = <HmacSha256 as KeyInit>::new_from_slice(key) else { return [0; 32] };
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Logged-in sessions, carried by their cookie: the session id is signed with a key derived
/// from the token, so every incarnation of a gateway that has the same token accepts it (a
/// restart does not log the open page out, and its event stream reconnects to the successor),
/// and a changed token ends them all. The CSRF token is an HMAC of the session id. Held in
/// memory: only logouts (bounded; a restart forgets them, while the browser forgot the cookie
/// at logout already).
#[derive(Debug, Default)]
pub struct Sessions {
    /// `None`: no token, no sessions.
    key: Option<[u8; 32]>,
    logouts: VecDeque<(String, i128)>,
}

impl Sessions {
    /// The sessions of a server whose token is `token`.
    pub fn new(token: Option<&str>) -> Sessions {
        Sessions {
            key: token.map(|t| hmac(t.as_bytes(), &[b"gatewarden dashboard sessions"])),
            logouts: VecDeque::new(),
        }
    }

    fn csrf(key: &[u8; 32], id: &str) -> String {
        hex(&hmac(key, &[b"csrf\0", id.as_bytes()]))
    }

    /// `POST /ui/login`: the given token against the configured one (constant time); a new
    /// session on success. The caller has run [`Policy::check_origin`] and the throttle.
    pub fn login(&mut self, policy: &Policy, given: &str, now_us: i128) -> Result<Session, Refusal> {
        let token = policy.api_token.as_deref().ok_or(Refusal::NoToken)?;
        let key = self.key.ok_or(Refusal::NoToken)?;
        if !ct_eq(given.trim().as_bytes(), token.as_bytes()) {
            return Err(Refusal::WrongToken);
        }
        let body = format!("{now_us:x}.{}", random_token()?);
        let id = format!("{body}.{}", hex(&hmac(&key, &[b"session\0", body.as_bytes()])));
        Ok(Session { csrf: Sessions::csrf(&key, &id), id, created_us: now_us })
    }

    /// The live session named by a `Cookie` header: signed with this token, not expired, not
    /// logged out.
    pub fn find(&self, cookie_header: Option<&str>, now_us: i128) -> Option<Session> {
        let key = self.key?;
        let id = cookie_value(cookie_header?, COOKIE)?;
        let (body, mac) = id.rsplit_once('.')?;
        let created_us = i128::from_str_radix(body.split_once('.')?.0, 16).ok()?;
        let want = hex(&hmac(&key, &[b"session\0", body.as_bytes()]));
        let live = (0..SESSION_TTL_US).contains(&(now_us - created_us));
        let out = self.logouts.iter().any(|(gone, _)| ct_eq(gone.as_bytes(), id.as_bytes()));
        (ct_eq(mac.as_bytes(), want.as_bytes()) && live && !out).then(|| Session {
            csrf: Sessions::csrf(&key, id),
            id: id.to_owned(),
            created_us,
        })
    }

    /// An action's POST: origin checks, a live session, its CSRF token.
    pub fn check_action(&self, policy: &Policy, p: &Post<'_>, now_us: i128) -> Result<Session, Refusal> {
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

    /// Ends a session (found by [`Sessions::find`] or [`Sessions::check_action`]) for this
    /// server's lifetime.
    pub fn logout(&mut self, s: &Session, now_us: i128) {
        self.logouts.retain(|(_, until)| *until > now_us);
        while self.logouts.len() >= MAX_LOGOUTS {
            self.logouts.pop_front();
        }
        self.logouts.push_back((s.id.clone(), s.created_us + SESSION_TTL_US));
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

/// Failed logins a client may make before it has to wait.
pub const FREE_FAILURES: u32 = 5;
/// The longest wait after a failed login (µs): doubling from one second past the free tries.
pub const MAX_LOCKOUT_US: i128 = 60 * 1_000_000;
/// A client's failures are forgotten this long after its last one (µs).
pub const FORGET_US: i128 = 15 * 60 * 1_000_000;
/// Clients remembered at once; past it the longest-quiet one is forgotten first.
pub const MAX_CLIENTS: usize = 4096;

/// One client's failed logins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tries {
    failures: u32,
    last_us: i128,
    /// No login is looked at from this client before then.
    until_us: i128,
}

/// What a failed login did to its client: for the refusal and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// Failures in a row (within [`FORGET_US`] of each other).
    pub failures: u32,
    /// Seconds before this client's next login is looked at (0: at once).
    pub wait_s: u64,
}

/// Failed logins per client (its address), in memory: a login is looked at only once the
/// client's wait is over, so guessing a token costs time, not just requests. Pure: the clock is
/// an argument.
#[derive(Debug, Default)]
pub struct Throttle {
    clients: HashMap<String, Tries>,
}

impl Throttle {
    /// `Err(seconds)` while `client` must wait; a login is not even compared meanwhile.
    pub fn check(&self, client: &str, now_us: i128) -> Result<(), u64> {
        match self.clients.get(client) {
            Some(t) if t.until_us > now_us => Err(secs_up(t.until_us - now_us)),
            _ => Ok(()),
        }
    }

    /// Records a failed login of `client`.
    pub fn failed(&mut self, client: &str, now_us: i128) -> Failed {
        self.clients.retain(|_, t| now_us - t.last_us < FORGET_US);
        if self.clients.len() >= MAX_CLIENTS && !self.clients.contains_key(client) {
            let quiet = self.clients.iter().min_by_key(|(_, t)| t.last_us).map(|(k, _)| k.clone());
            if let Some(k) = quiet {
                self.clients.remove(&k);
            }
        }
        let t = self.clients.entry(client.to_owned()).or_insert(Tries { failures: 0, last_us: now_us, until_us: 0 });
        t.failures = t.failures.saturating_add(1);
        t.last_us = now_us;
        let past = t.failures.saturating_sub(FREE_FAILURES);
        let wait = if past == 0 { 0 } else { (1_000_000i128 << (past - 1).min(6)).min(MAX_LOCKOUT_US) };
        t.until_us = now_us + wait;
        Failed { failures: t.failures, wait_s: secs_up(wait) }
    }

    /// A successful login forgets the client's failures.
    pub fn succeeded(&mut self, client: &str) {
        self.clients.remove(client);
    }
}

fn secs_up(us: i128) -> u64 {
    u64::try_from((us + 999_999) / 1_000_000).unwrap_or(u64::MAX)
}

/// One field of an `application/x-www-form-urlencoded` body (`+` is a space, `%XX` a byte;
/// bad escapes are kept as written). The first occurrence wins.
pub fn form_value(body: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(body.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
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
        let mut s = Sessions::new(p.api_token.as_deref());
        assert_eq!(s.login(&p, "wrong", 0), Err(Refusal::WrongToken));
        assert_eq!(Sessions::default().login(&Policy::default(), "s3cret", 0), Err(Refusal::NoToken));
        let sess = s.login(&p, "s3cret", 0).unwrap();
        assert_ne!(sess.id, sess.csrf);
        assert!(sess.id.len() > 128 && !sess.id.contains("s3cret"), "{}", sess.id);
        let c = set_cookie(&sess);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.starts_with("gw_session="), "{c}");
        let cookie = format!("theme=dark; {COOKIE}={}", sess.id);
        assert_eq!(s.check_action(&p, &post(Some(&cookie), Some(&sess.csrf)), 1).map(|x| x.id), Ok(sess.id.clone()));
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
        s.logout(&sess, 1);
        assert_eq!(s.check_action(&p, &post(Some(&cookie), Some(&sess.csrf)), 1).err(), Some(Refusal::NoSession));
    }

    /// A session is the token holder's in every incarnation with that token (a restart keeps
    /// the page logged in), in none other, and cannot be forged or stretched.
    #[test]
    fn sessions_outlive_a_restart_but_not_a_new_token_or_a_forgery() {
        let p = policy();
        let sess = Sessions::new(Some("s3cret")).login(&p, "s3cret", 0).unwrap();
        let cookie = format!("{COOKIE}={}", sess.id);
        let successor = Sessions::new(Some("s3cret"));
        assert_eq!(successor.find(Some(&cookie), 1).map(|s| s.csrf), Some(sess.csrf.clone()));
        assert!(Sessions::new(Some("another-token-0123")).find(Some(&cookie), 1).is_none());
        assert!(Sessions::default().find(Some(&cookie), 1).is_none());
        // A later creation time (a longer life) under the same mac, or a guessed mac.
        let (body, mac) = sess.id.rsplit_once('.').unwrap();
        let (_, nonce) = body.split_once('.').unwrap();
        for forged in [
            format!("{:x}.{nonce}.{mac}", SESSION_TTL_US),
            format!("{body}.{}", "0".repeat(64)),
            "0.0".into(),
            "".into(),
        ] {
            assert!(successor.find(Some(&format!("{COOKIE}={forged}")), 1).is_none(), "{forged}");
        }
        // Logouts are bounded in memory.
        let mut s = Sessions::new(Some("s3cret"));
        for i in 0..MAX_LOGOUTS + 5 {
            let x = s.login(&p, "s3cret", i as i128).unwrap();
            s.logout(&x, i as i128);
        }
        assert_eq!(s.logouts.len(), MAX_LOGOUTS);
    }

    #[test]
    fn failed_logins_wait_longer_and_longer_per_client() {
        let mut t = Throttle::default();
        let s = 1_000_000i128;
        for n in 1..=FREE_FAILURES {
            assert_eq!(t.check("10.0.0.1", 0), Ok(()));
            assert_eq!(t.failed("10.0.0.1", 0), Failed { failures: n, wait_s: 0 });
        }
        assert_eq!(t.failed("10.0.0.1", 0), Failed { failures: 6, wait_s: 1 });
        assert_eq!(t.check("10.0.0.1", 0), Err(1));
        assert_eq!(t.check("10.0.0.2", 0), Ok(()), "per client");
        assert_eq!(t.check("10.0.0.1", s), Ok(()));
        assert_eq!(t.failed("10.0.0.1", s).wait_s, 2);
        let mut now = s;
        for _ in 0..20 {
            now += MAX_LOCKOUT_US;
            assert_eq!(t.check("10.0.0.1", now), Ok(()));
            assert!(t.failed("10.0.0.1", now).wait_s <= 60, "capped at a minute");
        }
        assert_eq!(t.check("10.0.0.1", now + 30 * s), Err(30));
        t.succeeded("10.0.0.1");
        assert_eq!(t.check("10.0.0.1", now), Ok(()));
        // Forgotten after a quiet while; bounded in clients.
        t.failed("10.0.0.3", 0);
        t.failed("10.0.0.3", FORGET_US + 1);
        assert_eq!(t.clients["10.0.0.3"].failures, 1);
        for i in 0..MAX_CLIENTS + 10 {
            t.failed(&format!("c{i}"), FORGET_US + 2);
        }
        assert!(t.clients.len() <= MAX_CLIENTS);
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
