//! The Discord Gateway's wire: one WebSocket (crates/chatproto/src/ws.rs), the payload decoder
//! and the close-code table. No adapter state here.

use std::time::{Duration, Instant};

use gatewarden_chatproto::ws::{self, Incoming};
use gatewarden_net::ClientTls;
use serde_json::Value;

/// The largest gateway message read (a big guild's GUILD_CREATE is a few MiB).
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// How long a write may block before the connection counts as lost.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gateway payload (op, d, s, t), as documented in "Payload Structure".
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    pub op: u64,
    pub d: Value,
    pub s: Option<u64>,
    pub t: Option<String>,
}

/// Decodes one text frame; `None` for anything that is not a gateway payload. Total: any input
/// is either a payload or `None`.
pub fn decode(text: &str) -> Option<Payload> {
    let v: Value = serde_json::from_str(text).ok()?;
    let op = v.get("op")?.as_u64()?;
    Some(Payload {
        op,
        d: v.get("d").cloned().unwrap_or(Value::Null),
        s: v.get("s").and_then(Value::as_u64),
        t: v.get("t").and_then(Value::as_str).map(str::to_owned),
    })
}

/// What a gateway close code asks of the client (the "Gateway Close Event Codes" table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseAction {
    /// Reconnect and resume the session.
    Resume,
    /// Reconnect with a new session (the old one is gone).
    NewSession,
    /// Do not reconnect: the configuration or the token is wrong. The text names the code.
    Fatal(&'static str),
}

pub fn close_action(code: u16) -> CloseAction {
    match code {
        4004 => CloseAction::Fatal("4004 authentication failed: the bot token is invalid"),
        4010 => CloseAction::Fatal("4010 invalid shard"),
        4011 => CloseAction::Fatal("4011 sharding required: the bot is in too many guilds for one connection"),
        4012 => CloseAction::Fatal("4012 invalid API version"),
        4013 => CloseAction::Fatal("4013 invalid intents"),
        4014 => CloseAction::Fatal(
            "4014 disallowed intents: enable the Message Content Intent for this bot (Developer Portal, Bot, Privileged Gateway Intents)",
        ),
        4007 | 4009 => CloseAction::NewSession,
        _ => CloseAction::Resume,
    }
}

/// Why the socket failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketError {
    /// A URL the adapter will not use (not wss, unparsable).
    Url(String),
    /// Connect, TLS, handshake, read or write failed: the connection is gone.
    Lost(String),
}

impl std::fmt::Display for SocketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SocketError::Url(m) | SocketError::Lost(m) => f.write_str(m),
        }
    }
}

/// One read's outcome.
#[derive(Debug)]
pub enum Frame {
    Payload(Payload),
    /// The server closed, with its code when it sent one.
    Closed(Option<u16>, String),
    /// Nothing arrived in time.
    Idle,
}

pub use gatewarden_chatproto::ws::WsUrl;

/// Parses a gateway URL. `ws://` only when `plain_ok` (an `http://` API base: a test set-up).
pub fn parse_url(url: &str, plain_ok: bool) -> Result<WsUrl, SocketError> {
    let bad = |why: &str| SocketError::Url(format!("gateway URL {url:?}: {why}"));
    if url.starts_with("ws://") && !plain_ok {
        return Err(bad("not wss:// (plain ws:// only under an http:// api_base)"));
    }
    if !url.starts_with("wss://") && !url.starts_with("ws://") {
        return Err(bad("not a wss:// URL"));
    }
    let mut u = ws::parse_url(url).ok_or_else(|| bad("no host or a bad port"))?;
    u.path = u.path.trim_end_matches('/').to_owned();
    Ok(u)
}

/// One gateway connection.
pub struct Socket {
    ws: ws::Client,
}

impl Socket {
    /// Connects to `url` (v10, JSON), verifying TLS with `tls`, within `timeout`.
    pub fn open(url: &WsUrl, tls: &ClientTls, timeout: Duration) -> Result<Socket, SocketError> {
        let scheme = if url.tls { "wss" } else { "ws" };
        let path = if url.path.is_empty() { "/" } else { url.path.as_str() };
        let request = format!("{scheme}://{}{path}?v=10&encoding=json", url.authority());
        let opts =
            ws::Options { request: &request, timeout, write_timeout: WRITE_TIMEOUT, max_message: MAX_MESSAGE_BYTES };
        let ws = ws::Client::open(url, tls, &opts).map_err(|e| {
            let what = match e.stage {
                ws::Stage::Resolve => "cannot resolve",
                ws::Stage::Connect => "cannot connect",
                ws::Stage::Socket => "socket",
                ws::Stage::Tls => "TLS",
                ws::Stage::Handshake => "gateway handshake",
            };
            SocketError::Lost(format!("{}: {what}: {}", url.host, e.detail))
        })?;
        Ok(Socket { ws })
    }

    pub fn send(&mut self, v: &Value) -> Result<(), SocketError> {
        self.ws.send_text(v.to_string()).map_err(|e| SocketError::Lost(format!("gateway write: {e}")))
    }

    /// Reads one payload, waiting at most `wait` (at least 1 ms).
    pub fn read(&mut self, wait: Duration) -> Result<Frame, SocketError> {
        let end = Instant::now() + wait;
        loop {
            self.ws.set_read_timeout(end.saturating_duration_since(Instant::now()));
            match self.ws.read() {
                Incoming::Text(t) => {
                    // Anything that is no payload is skipped, like an unknown opcode.
                    if let Some(p) = decode(&t) {
                        return Ok(Frame::Payload(p));
                    }
                }
                Incoming::Close(frame) => {
                    let (code, reason) = frame.map_or((None, String::new()), |(c, r)| (Some(c), r));
                    return Ok(Frame::Closed(code, reason));
                }
                Incoming::Other => {}
                Incoming::Idle => {
                    if Instant::now() >= end {
                        return Ok(Frame::Idle);
                    }
                }
                Incoming::Closed(_) => return Ok(Frame::Closed(None, "connection closed".into())),
                Incoming::Failed(e) => return Err(SocketError::Lost(format!("gateway read: {e}"))),
            }
        }
    }

    /// Closes with `code`: a non-1000 code keeps the session resumable ("Disconnections").
    pub fn close(&mut self, code: u16) {
        self.ws.close(Some(code));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payloads_decode_and_garbage_does_not() {
        let p = decode(r#"{"op":0,"t":"MESSAGE_CREATE","s":42,"d":{"id":"1"}}"#).unwrap();
        assert_eq!((p.op, p.s, p.t.as_deref()), (0, Some(42), Some("MESSAGE_CREATE")));
        assert_eq!(p.d, json!({"id": "1"}));
        let hello = decode(r#"{"op":10,"d":{"heartbeat_interval":41250},"s":null,"t":null}"#).unwrap();
        assert_eq!((hello.op, hello.s, hello.t), (10, None, None));
        for bad in ["", "null", "[]", "{}", r#"{"op":"0"}"#, r#"{"op":-1}"#, "{\"op\":1", "\u{0}"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decoding_is_total_on_arbitrary_input() {
        // A cheap fuzz: seeded pseudo-random mutations of real payloads never panic.
        let seeds = [
            r#"{"op":0,"t":"MESSAGE_CREATE","s":42,"d":{"id":"1","content":"hi"}}"#,
            r#"{"op":9,"d":false}"#,
            r#"{"op":10,"d":{"heartbeat_interval":41250}}"#,
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..5000 {
            let mut bytes = seeds[i % seeds.len()].as_bytes().to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % bytes.len();
                bytes[at] = (x >> 32) as u8;
            }
            let _ = decode(&String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn close_codes_follow_the_table() {
        assert!(matches!(close_action(4004), CloseAction::Fatal(m) if m.contains("4004")));
        assert!(matches!(close_action(4014), CloseAction::Fatal(m) if m.contains("Message Content Intent")));
        for code in [4010, 4011, 4012, 4013] {
            assert!(matches!(close_action(code), CloseAction::Fatal(_)), "{code}");
        }
        assert_eq!(close_action(4007), CloseAction::NewSession);
        assert_eq!(close_action(4009), CloseAction::NewSession);
        for code in [1000, 1001, 4000, 4001, 4002, 4003, 4005, 4008] {
            assert_eq!(close_action(code), CloseAction::Resume, "{code}");
        }
    }

    #[test]
    fn gateway_urls_need_wss_unless_plain_is_allowed() {
        let u = parse_url("wss://gateway.discord.gg", false).unwrap();
        assert_eq!((u.tls, u.host.as_str(), u.port, u.path.as_str()), (true, "gateway.discord.gg", 443, ""));
        let r = parse_url("wss://gateway-us-east1-b.discord.gg/?v=10", false).unwrap();
        assert_eq!((r.port, r.path.as_str()), (443, ""));
        assert!(matches!(parse_url("ws://127.0.0.1:9000", false), Err(SocketError::Url(_))));
        let p = parse_url("ws://127.0.0.1:9000/resume", true).unwrap();
        assert_eq!((p.tls, p.host.as_str(), p.port, p.path.as_str()), (false, "127.0.0.1", 9000, "/resume"));
        assert!(parse_url("https://discord.com", true).is_err());
        assert!(parse_url("wss://", true).is_err());
        assert!(parse_url("wss://user@host", true).is_err());
        assert!(parse_url("wss://h:notaport", true).is_err());
        assert_eq!(parse_url("wss://[::1]:8443/x", false).unwrap().host, "::1");
    }
}
