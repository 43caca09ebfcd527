//! The openai backend over real TLS: an OpenAI-compatible fake behind a TLS front whose
//! certificate comes from a CA made for this test (crates/testkit/src/tls.rs), reached through
//! `build_agent` with `[agent] ca_file`, plain and streaming; and the three certificate
//! failures, each refused before anything (the API key included) is sent, naming the host and
//! the reason.

// testkit (the TLS fronts, the CA) is Unix-only; crates/net's own tests run everywhere.
#![cfg(unix)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use gatewarden_agent::{Agent, AgentError, AgentRequest, build_agent};
use gatewarden_config::{AgentConfig, BackendKind};
use gatewarden_testkit::tls::{Leaf, TestCa, TlsFront, Validity};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);
const KEY_ENV: &str = "GATEWARDEN_TEST_OPENAI_TLS_KEY";

/// A plain upstream for one request: reports the request body, then answers `reply`.
async fn upstream(reply: String) -> (SocketAddr, oneshot::Receiver<(String, Value)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let (head, len) = loop {
            let n = sock.read(&mut tmp).await.unwrap();
            assert!(n > 0, "client closed before sending a request");
            buf.extend_from_slice(&tmp[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..p]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap();
                buf.drain(..p + 4);
                break (head, len);
            }
        };
        while buf.len() < len {
            let n = sock.read(&mut tmp).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&tmp[..n]);
        }
        let _ = tx.send((head, serde_json::from_slice(&buf).unwrap()));
        sock.write_all(reply.as_bytes()).await.unwrap();
    });
    (addr, rx)
}

fn json_reply(content: &str) -> String {
    let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn sse_reply(parts: &[&str]) -> String {
    let mut s = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n".to_owned();
    for p in parts {
        s.push_str(&format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": p}}]})));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

fn backend(base: String, ca_file: &Path) -> Box<dyn Agent> {
    set_key_env();
    build_agent(&AgentConfig {
        backend: BackendKind::Openai,
        base_url: Some(base),
        model: Some("m".into()),
        api_key_env: Some(KEY_ENV.into()),
        ca_file: Some(ca_file.to_owned()),
        ..AgentConfig::default()
    })
}

/// The API key the backend reads; every test sets the same value.
fn set_key_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: runs once, before any backend thread of this binary reads the environment.
    ONCE.call_once(|| unsafe { std::env::set_var(KEY_ENV, "sk-secret-tls") });
}

fn req(text: &str) -> AgentRequest {
    AgentRequest {
        run_id: "r1".into(),
        chat_id: "c1".into(),
        user_id: "u1".into(),
        text: text.into(),
        history: Vec::new(),
        platform: None,
        session_started: None,
        http_conversation: false,
        attachments: Vec::new(),
    }
}

fn front(addr: SocketAddr, leaf: &Leaf) -> TlsFront {
    TlsFront::start(addr, leaf).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_and_streaming_over_https_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let leaf = ca.leaf(&["localhost"], Validity::Now);

    let (addr, seen) = upstream(json_reply("Hi over TLS")).await;
    let f = front(addr, &leaf);
    let a = backend(format!("https://localhost:{}/v1", f.addr().port()), &ca_file);
    let r = tokio::time::timeout(DEADLINE, a.run(req("hello"), CancellationToken::new())).await.unwrap().unwrap();
    assert_eq!(r.text, "Hi over TLS");
    let (head, body) = seen.await.unwrap();
    assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1"), "{head}");
    assert!(head.contains("Bearer sk-secret-tls"), "{head}");
    assert_eq!(body["stream"], json!(false));
    assert_eq!(f.handshakes(), 1);

    let (addr, seen) = upstream(sse_reply(&["Hel", "lo"])).await;
    let f = front(addr, &leaf);
    let a = backend(format!("https://localhost:{}/v1", f.addr().port()), &ca_file);
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn(async move { a.run_streaming(req("hi"), CancellationToken::new(), tx).await });
    let mut chunks = Vec::new();
    while let Some(c) = tokio::time::timeout(DEADLINE, rx.recv()).await.unwrap() {
        chunks.push(c);
    }
    assert_eq!(chunks, ["Hel", "lo"]);
    assert_eq!(tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap().unwrap().text, "Hello");
    assert_eq!(seen.await.unwrap().1["stream"], json!(true));
}

#[tokio::test(flavor = "multi_thread")]
async fn certificate_failures_are_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let stranger = TestCa::new("someone else's CA");
    let cases = [
        ("unknown issuer", stranger.leaf(&["localhost"], Validity::Now), "unknown issuer"),
        ("wrong host name", ca.leaf(&["wrong.example"], Validity::Now), "not valid for this host name"),
        ("expired", ca.leaf(&["localhost"], Validity::Expired), "expired"),
    ];
    for (case, leaf, why) in cases {
        let (addr, mut seen) = upstream(json_reply("must not be reached")).await;
        let f = front(addr, &leaf);
        let a = backend(format!("https://localhost:{}/v1", f.addr().port()), &ca_file);
        let r = tokio::time::timeout(DEADLINE, a.run(req("secret question"), CancellationToken::new())).await.unwrap();
        let Err(AgentError::Failed(m)) = r else { panic!("{case}: {r:?}") };
        let host = format!("localhost:{}", f.addr().port());
        assert!(m.contains(&host) && m.contains(why), "{case}: {m}");
        assert!(!m.contains("sk-secret-tls"), "{case}: {m}");
        assert_eq!(f.handshakes(), 0, "{case}: a handshake completed");
        assert!(f.accepted() >= 1, "{case}: the client never connected");
        assert!(seen.try_recv().is_err(), "{case}: the upstream received a request");
    }
}
