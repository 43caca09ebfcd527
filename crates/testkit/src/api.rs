//! The gateway's HTTP API from a test: any method, JSON bodies, bearer tokens, and the
//! message / notice / status helpers the message, drain and restart tests share.
//!
//! Loopback only (panics otherwise), one request per connection (`Connection: close`), every
//! read and write bounded by the caller's timeout. The wire ([`request`] and the response parser:
//! `Content-Length`, chunked, or read-to-EOF bodies) is http.rs's, shared with [`crate::http_get`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::HttpResponse;
// The wire (one request, the response parser) lives in http.rs; the API helpers build on it.
pub use crate::http::request;

/// A client for one gateway address, optionally with a bearer token.
#[derive(Debug, Clone)]
pub struct Api {
    pub addr: SocketAddr,
    pub token: Option<String>,
    pub timeout: Duration,
}

impl Api {
    pub fn new(addr: SocketAddr) -> Api {
        Api { addr, token: None, timeout: Duration::from_secs(10) }
    }
    pub fn with_token(mut self, token: &str) -> Api {
        self.token = Some(token.to_string());
        self
    }
    pub fn with_timeout(mut self, t: Duration) -> Api {
        self.timeout = t;
        self
    }

    fn auth(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        let a = self.auth();
        let h: Vec<(&str, &str)> = a.as_deref().map(|v| vec![("Authorization", v)]).unwrap_or_default();
        request(self.addr, "GET", path, &h, None, self.timeout)
    }

    pub fn post_json(&self, path: &str, body: &Value) -> std::io::Result<HttpResponse> {
        let a = self.auth();
        let h: Vec<(&str, &str)> = a.as_deref().map(|v| vec![("Authorization", v)]).unwrap_or_default();
        request(self.addr, "POST", path, &h, Some(body.to_string().as_bytes()), self.timeout)
    }

    /// `POST /v1/messages` (sync).
    pub fn send(&self, chat: &str, user: &str, text: &str) -> std::io::Result<HttpResponse> {
        self.post_json("/v1/messages", &json!({"chat_id": chat, "user_id": user, "text": text}))
    }

    /// A connection to the gateway, opened now, for [`Api::send_on`] later.
    pub fn open(&self) -> std::io::Result<std::net::TcpStream> {
        std::net::TcpStream::connect_timeout(&self.addr, self.timeout)
    }

    /// [`Api::send`] on a connection from [`Api::open`].
    pub fn send_on(&self, conn: std::net::TcpStream, chat: &str, user: &str, text: &str) -> std::io::Result<HttpResponse> {
        let a = self.auth();
        let h: Vec<(&str, &str)> = a.as_deref().map(|v| vec![("Authorization", v)]).unwrap_or_default();
        let body = json!({"chat_id": chat, "user_id": user, "text": text}).to_string();
        crate::http::request_on(conn, "POST", "/v1/messages", &h, Some(body.as_bytes()), self.timeout)
    }

    /// `POST /v1/messages` with `"async": true`.
    pub fn send_async(&self, chat: &str, user: &str, text: &str) -> std::io::Result<HttpResponse> {
        self.post_json("/v1/messages", &json!({"chat_id": chat, "user_id": user, "text": text, "async": true}))
    }

    /// `POST /v1/messages` async, expecting 202; returns the message id.
    #[track_caller]
    pub fn submit(&self, chat: &str, text: &str) -> String {
        let r = self.send_async(chat, chat, text).unwrap_or_else(|e| panic!("async POST {text:?}: {e}"));
        assert_eq!(r.status, 202, "async POST {text:?}: {} {}", r.status, r.text());
        let v = r.json().expect("202 body is JSON");
        v["message_id"].as_str().unwrap_or_else(|| panic!("no message_id in {v}")).to_string()
    }

    /// `GET /v1/messages/{id}` as JSON (`None` on transport errors or non-200).
    pub fn message(&self, id: &str) -> Option<Value> {
        let r = self.get(&format!("/v1/messages/{id}")).ok()?;
        (r.status == 200).then(|| r.json().ok()).flatten()
    }

    /// `GET /v1/notices?chat_id=…` → the notices (consumes them).
    pub fn notices(&self, chat: &str) -> std::io::Result<Vec<String>> {
        let r = self.get(&format!("/v1/notices?chat_id={chat}"))?;
        let v = r.json().map_err(std::io::Error::other)?;
        Ok(v["notices"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(str::to_string)).collect())
    }

    /// `GET /v1/status` as JSON.
    pub fn status(&self) -> Option<Value> {
        let r = self.get("/v1/status").ok()?;
        (r.status == 200).then(|| r.json().ok()).flatten()
    }

    /// `GET /readyz` status code (`None` if nothing answers).
    pub fn readyz(&self) -> Option<u16> {
        crate::http_get(self.addr, "/readyz", Duration::from_millis(1000)).ok().map(|r| r.status)
    }
}

/// Header lookup (names are stored lowercased).
pub fn header<'a>(r: &'a HttpResponse, name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    r.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
}

/// Writes `<home>/config.toml` atomically.
pub fn write_config(home: &Path, toml: &str) {
    let tmp = home.join(".config.toml.tk-tmp");
    std::fs::write(&tmp, toml).expect("write config temp");
    std::fs::rename(&tmp, home.join("config.toml")).expect("rename config.toml");
}

/// A free loopback port right now, for a server that binds it later (Synapse binds 10-40 s
/// later). See [`free_ports`].
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct loopback ports, free right now, for servers that bind them later. Picked at
/// random below the ephemeral ranges (Linux 32768-60999, Windows 49152-65535): the kernel's
/// port-0 binds and every outgoing connection's source port come from those, and either could
/// take a port before its server binds it. Each is bound here to be sure it is free, and all are
/// held until all are chosen (dovecot refuses duplicate listeners).
pub fn free_ports<const N: usize>() -> [u16; N] {
    use std::hash::{BuildHasher, Hasher};
    use std::net::TcpListener;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    const FIRST: u16 = 20_000;
    const SPAN: u64 = 12_768; // up to 32767
    let keys = std::collections::hash_map::RandomState::new();
    let pick = || {
        for _ in 0..200 {
            let mut h = keys.build_hasher();
            h.write_u64(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            h.write_u32(std::process::id());
            let port = FIRST + u16::try_from(h.finish() % SPAN).unwrap_or(0);
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                return l;
            }
        }
        TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
    };
    let held: [TcpListener; N] = std::array::from_fn(|_| pick());
    held.map(|l| l.local_addr().expect("local_addr").port())
}

/// The gateway that holds `home`'s lock right now, as `gateway_state.json` describes it:
/// `(pid, incarnation, state, listen)`, only when the lock is held by that pid.
pub fn current_gateway(home: &Path) -> Option<(u32, String, String, Option<SocketAddr>)> {
    let b = std::fs::read(home.join("gateway_state.json")).ok()?;
    let v: Value = serde_json::from_slice(&b).ok()?;
    let pid = v.get("pid")?.as_u64()? as u32;
    // /proc/locks is generated page by page while parallel tests take and drop locks: one read
    // can miss a line, so look up to three times before saying "not the holder".
    if !(0..3).any(|_| crate::lock_holders(&home.join("gateway.lock")).contains(&pid)) {
        return None;
    }
    let inc = v.get("incarnation")?.as_str()?.to_string();
    let state = v.get("gateway_state")?.as_str()?.to_string();
    let listen = v.get("listen").and_then(Value::as_str).and_then(|s| s.parse().ok());
    Some((pid, inc, state, listen))
}

/// Waits up to `timeout` for a `running` gateway in `home` whose pid is not in `not` and whose
/// `/readyz` answers 200; returns `(pid, incarnation, listen)`.
pub fn wait_new_ready(home: &Path, not: &[u32], timeout: Duration) -> Option<(u32, String, SocketAddr)> {
    let mut found = None;
    crate::wait_until(timeout, || {
        let Some((pid, inc, state, Some(addr))) = current_gateway(home) else { return false };
        if not.contains(&pid) || state != "running" {
            return false;
        }
        if crate::http_get(addr, "/readyz", Duration::from_millis(1000)).map(|r| r.status).ok() == Some(200) {
            found = Some((pid, inc, addr));
            return true;
        }
        false
    });
    found
}

/// A client that keeps calling one gateway from a thread while a test changes it: a sync
/// message, then `/v1/status`, again and again, with no pause. [`Caller::finish`] says how
/// many calls failed (transport errors and non-2xx answers, each described) and which
/// incarnations answered, so a test shows "the old gateway served throughout, 0 failed".
pub struct Caller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Calls>,
}

/// What a [`Caller`] saw.
#[derive(Debug, Default)]
pub struct Calls {
    pub ok: u64,
    pub failed: Vec<String>,
    pub incarnations: std::collections::BTreeSet<String>,
}

impl Caller {
    pub fn start(api: Api) -> Caller {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut calls = Calls::default();
            let mut n = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                match api.send("caller", "caller", &format!("call {n}")) {
                    Ok(r) if (200..300).contains(&r.status) => calls.ok += 1,
                    Ok(r) => calls.failed.push(format!("message {n}: {} {}", r.status, r.text())),
                    Err(e) => calls.failed.push(format!("message {n}: {e}")),
                }
                match api.get("/v1/status") {
                    Ok(r) if r.status == 200 => {
                        calls.ok += 1;
                        if let Some(i) = r.json().ok().and_then(|v| v["incarnation"].as_str().map(str::to_owned)) {
                            calls.incarnations.insert(i);
                        }
                    }
                    Ok(r) => calls.failed.push(format!("status {n}: {} {}", r.status, r.text())),
                    Err(e) => calls.failed.push(format!("status {n}: {e}")),
                }
            }
            calls
        });
        Caller { stop, thread }
    }

    /// Stops calling and returns what was seen.
    pub fn finish(self) -> Calls {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

impl Calls {
    /// Every call answered, and only by `incarnation`.
    #[track_caller]
    pub fn assert_only(&self, incarnation: &str, what: &str) {
        assert!(self.failed.is_empty(), "{what}: {} failed call(s): {:#?}", self.failed.len(), self.failed);
        assert!(self.ok >= 4, "{what}: the caller barely ran ({} calls)", self.ok);
        let only: Vec<&str> = self.incarnations.iter().map(String::as_str).collect();
        assert_eq!(only, vec![incarnation], "{what}: answered by {only:?}");
    }
}
