//! The openai backend against a fake upstream: a hand-written HTTP/1.1 server on
//! 127.0.0.1:0, one connection per test.

use std::net::SocketAddr;
use std::time::Duration;

use gatewarden_agent::backend::{ApiKey, OpenAiAgent};
use gatewarden_agent::{Agent, AgentError, AgentRequest, Turn, build_agent};
use gatewarden_config::{AgentConfig, BackendKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);

/// What the fake upstream saw.
#[derive(Debug)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

async fn read_request(sock: &mut TcpStream) -> Seen {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut tmp).await.unwrap();
        assert!(n > 0, "client closed before sending a request");
        buf.extend_from_slice(&tmp[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap().to_string();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .expect("request has Content-Length");
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut tmp).await.unwrap();
        assert!(n > 0);
        body.extend_from_slice(&tmp[..n]);
    }
    Seen { request_line, headers, body: serde_json::from_slice(&body).unwrap() }
}

/// Serves one connection: reports the request as soon as it is read, then runs `respond`.
async fn upstream<F, Fut>(respond: F) -> (SocketAddr, oneshot::Receiver<Seen>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, seen_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let seen = read_request(&mut sock).await;
        let _ = seen_tx.send(seen);
        respond(sock).await;
    });
    (addr, seen_rx)
}

fn json_response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn sse_event(content: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    )
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";

fn agent(addr: SocketAddr, key: ApiKey, timeout: Duration) -> OpenAiAgent {
    OpenAiAgent::new(format!("http://{addr}/v1/"), "test-model".into(), key, timeout)
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

#[tokio::test]
async fn non_streaming_round_trip() {
    let (addr, seen) = upstream(|mut sock| async move {
        let body = json!({"id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there"}, "finish_reason": "stop"}]});
        sock.write_all(json_response("200 OK", &body.to_string()).as_bytes())
            .await
            .unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::Value("sk-test".into()), DEADLINE);
    let r = a.run(req("hello"), CancellationToken::new()).await.unwrap();
    assert_eq!(r.text, "Hi there");
    let seen = seen.await.unwrap();
    assert_eq!(seen.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(seen.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(
        seen.body,
        json!({"model": "test-model", "messages": [{"role": "user", "content": "hello"}], "stream": false})
    );
}

/// The conversation so far goes upstream before the new message, in order.
#[tokio::test]
async fn history_is_sent_before_the_message() {
    let (addr, seen) = upstream(|mut sock| async move {
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]});
        sock.write_all(json_response("200 OK", &body.to_string()).as_bytes()).await.unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let mut r = req("and now?");
    r.history = vec![Turn::new("system", "be brief"), Turn::new("user", "hi"), Turn::new("assistant", "hello")];
    a.run(r, CancellationToken::new()).await.unwrap();
    let seen = seen.await.unwrap();
    assert_eq!(
        seen.body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now?"}])
    );
}

#[tokio::test]
async fn streaming_passes_deltas_through_as_they_arrive() {
    let (first_seen_tx, first_seen_rx) = oneshot::channel::<()>();
    let (addr, seen) = upstream(|mut sock| async move {
        sock.write_all(SSE_HEAD.as_bytes()).await.unwrap();
        sock.write_all(b": keep-alive comment\n\n").await.unwrap();
        sock.write_all(sse_event("Hel").as_bytes()).await.unwrap();
        // The rest is sent only once the test holds the first delta: proof of pass-through.
        first_seen_rx.await.unwrap();
        sock.write_all(sse_event("lo").as_bytes()).await.unwrap();
        sock.write_all(sse_event(" world").as_bytes()).await.unwrap();
        sock.write_all(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        )
        .await
        .unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn(async move { a.run_streaming(req("hi"), CancellationToken::new(), tx).await });
    let first = tokio::time::timeout(DEADLINE, rx.recv()).await.unwrap();
    assert_eq!(first.as_deref(), Some("Hel"));
    first_seen_tx.send(()).unwrap();
    let mut rest = Vec::new();
    while let Some(c) = rx.recv().await {
        rest.push(c);
    }
    assert_eq!(rest, vec!["lo", " world"]);
    let r = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap().unwrap();
    assert_eq!(r.text, "Hello world");
    let seen = seen.await.unwrap();
    assert_eq!(seen.body["stream"], json!(true));
    assert_eq!(seen.header("authorization"), None);
}

/// An upstream that ignores `stream: true` and answers one JSON completion: the whole reply is
/// passed on as one delta, with its usage.
#[tokio::test]
async fn a_json_answer_to_a_streaming_request_is_one_delta() {
    let (addr, seen) = upstream(|mut sock| async move {
        let body = json!({"object": "chat.completion", "usage": {"prompt_tokens": 4, "completion_tokens": 2},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "All at once"}, "finish_reason": "stop"}]});
        sock.write_all(json_response("200 OK", &body.to_string()).as_bytes()).await.unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let (tx, mut rx) = mpsc::channel(8);
    let r = a.run_streaming(req("hi"), CancellationToken::new(), tx).await.unwrap();
    assert_eq!(r.text, "All at once");
    assert_eq!(r.usage.map(|u| (u.prompt_tokens, u.completion_tokens)), Some((4, 2)));
    assert_eq!(rx.recv().await.as_deref(), Some("All at once"));
    assert_eq!(rx.recv().await, None);
    assert_eq!(seen.await.unwrap().body["stream"], json!(true));
}

#[tokio::test]
async fn stream_cut_before_done_fails() {
    let (addr, _seen) = upstream(|mut sock| async move {
        sock.write_all(SSE_HEAD.as_bytes()).await.unwrap();
        sock.write_all(sse_event("partial").as_bytes()).await.unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let (tx, _rx) = mpsc::channel(8);
    let r = a.run_streaming(req("x"), CancellationToken::new(), tx).await;
    assert!(matches!(&r, Err(AgentError::Failed(m)) if m.contains("[DONE]")), "{r:?}");
}

#[tokio::test]
async fn upstream_error_status_is_reported() {
    // 400 is not retried (429 and 5xx are: tests/openai_failover.rs).
    let (addr, _seen) = upstream(|mut sock| async move {
        sock.write_all(json_response("400 Bad Request", r#"{"error":{"message":"bad messages"}}"#).as_bytes())
            .await
            .unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let r = a.run(req("x"), CancellationToken::new()).await;
    match r {
        Err(AgentError::Upstream { status, body }) => {
            assert_eq!(status, 400);
            assert!(body.contains("bad messages"), "{body}");
        }
        other => panic!("expected Upstream, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_response_fails() {
    let (addr, _seen) = upstream(|mut sock| async move {
        sock.write_all(json_response("200 OK", r#"{"choices":[]}"#).as_bytes()).await.unwrap();
    })
    .await;
    let a = agent(addr, ApiKey::None, DEADLINE);
    let r = a.run(req("x"), CancellationToken::new()).await;
    assert!(matches!(&r, Err(AgentError::Failed(m)) if m.contains("choices[0]")), "{r:?}");
}

/// An upstream that accepts the request and then never answers.
async fn stalled() -> (SocketAddr, oneshot::Receiver<Seen>, oneshot::Sender<()>) {
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let (addr, seen) = upstream(|sock| async move {
        // Hold the connection open, silent, until the test ends.
        let _sock = sock;
        let _ = release_rx.await;
    })
    .await;
    (addr, seen, release_tx)
}

#[tokio::test]
async fn cancel_is_prompt_while_upstream_stalls() {
    for streaming in [false, true] {
        let (addr, seen, _release) = stalled().await;
        let a = agent(addr, ApiKey::None, Duration::from_secs(600));
        let cancel = CancellationToken::new();
        let (tx, _rx) = mpsc::channel(8);
        let run = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                if streaming { a.run_streaming(req("x"), cancel, tx).await } else { a.run(req("x"), cancel).await }
            }
        });
        // Cancel only once the request is in flight.
        let _ = seen.await.unwrap();
        cancel.cancel();
        let r = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("cancel must not wait for the upstream")
            .unwrap();
        assert_eq!(r, Err(AgentError::Cancelled), "streaming={streaming}");
    }
}

#[tokio::test]
async fn timeout_while_upstream_stalls() {
    let (addr, _seen, _release) = stalled().await;
    let a = agent(addr, ApiKey::None, Duration::from_millis(300));
    let r = tokio::time::timeout(DEADLINE, a.run(req("x"), CancellationToken::new())).await.unwrap();
    assert_eq!(r, Err(AgentError::Timeout(Duration::from_millis(300))));
}

#[tokio::test]
async fn missing_key_variable_is_named_and_nothing_is_sent() {
    let cfg = AgentConfig {
        backend: BackendKind::Openai,
        base_url: Some("http://127.0.0.1:9/v1".into()),
        model: Some("m".into()),
        api_key_env: Some("GATEWARDEN_TEST_UNSET_KEY_41c9".into()),
        ..AgentConfig::default()
    };
    let a = build_agent(&cfg);
    assert_eq!(a.name(), "openai");
    let r = a.run(req("x"), CancellationToken::new()).await;
    assert!(
        matches!(&r, Err(AgentError::Failed(m)) if m.contains("GATEWARDEN_TEST_UNSET_KEY_41c9") && m.contains("is set in neither")),
        "{r:?}"
    );
}

/// A cancelled run must not keep the runtime from shutting down while the upstream stalls
/// (tokio's runtime drop waits for `spawn_blocking` work, which would wedge the gateway's exit
/// for up to `timeout_s`).
#[test]
fn cancelled_stalled_run_does_not_block_runtime_shutdown() {
    use std::io::Read;
    // The upstream lives outside the runtime, so shutting the runtime down cannot unblock it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (got_tx, got_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        let mut buf = [0u8; 1024];
        let _ = sock.read(&mut buf);
        let _ = got_tx.send(());
        let _ = release_rx.recv();
    });

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let a = agent(addr, ApiKey::None, Duration::from_secs(600));
        let cancel = CancellationToken::new();
        let run = tokio::spawn({
            let cancel = cancel.clone();
            async move { a.run(req("x"), cancel).await }
        });
        tokio::task::spawn_blocking(move || got_rx.recv().unwrap()).await.unwrap();
        cancel.cancel();
        assert_eq!(run.await.unwrap(), Err(AgentError::Cancelled));
    });
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(rt);
        let _ = done_tx.send(());
    });
    let shut_down = done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
    // Unblock the fake upstream either way so nothing leaks past the test.
    drop(release_tx);
    server.join().unwrap();
    assert!(shut_down, "runtime shutdown waited for the stalled upstream");
}
