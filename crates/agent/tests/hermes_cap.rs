//! Issue 31 §5 for the hermes backend: a hermes run that streams forever ends once the reply
//! passes `[agent] max_reply_bytes`, with a failure naming the key, and the run is stopped on
//! hermes's side (`POST /v1/runs/{id}/stop`).
//!
//! The fake models hermes-agent 0.19's API server as `gateway/platforms/api_server.py`
//! serves it (crates/agent/src/backend/hermes.rs cites the same): `POST /v1/runs` answers
//! `{"run_id": …}`, `GET /v1/runs/{id}/events` is a server-sent event stream of
//! `{"event": "message.delta", "delta": …}` objects, and `POST /v1/runs/{id}/stop` ends the
//! run. This one never sends `run.completed`: its stream only ends when the client leaves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gatewarden_agent::{AgentError, AgentRequest, build_agent_with};
use gatewarden_config::{AgentConfig, BackendKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The most an events stream writes before giving up on its reader (bounds the test).
const STREAM_LIMIT: usize = 64 * 1024 * 1024;

struct EndlessHermes {
    url: String,
    stops: Arc<AtomicUsize>,
    streamed: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
}

impl EndlessHermes {
    fn start() -> EndlessHermes {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let (stops, streamed, done) = (Arc::default(), Arc::default(), Arc::new(AtomicBool::new(false)));
        let (s, w, d) = (Arc::clone(&stops), Arc::clone(&streamed), Arc::clone(&done));
        std::thread::spawn(move || {
            for conn in l.incoming() {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (s, w) = (Arc::clone(&s), Arc::clone(&w));
                std::thread::spawn(move || serve(conn, &s, &w));
            }
        });
        EndlessHermes { url, stops, streamed, done }
    }
}

impl Drop for EndlessHermes {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

fn serve(conn: TcpStream, stops: &AtomicUsize, streamed: &AtomicUsize) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut r = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or_default().to_owned());
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    let _ = r.read_exact(&mut body);
    let mut w = conn;
    let json = |w: &mut TcpStream, status: &str, body: &str| {
        let _ = write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    match (method.as_str(), path.as_str()) {
        ("POST", "/v1/runs") => json(&mut w, "200 OK", r#"{"run_id":"run-endless","status":"started"}"#),
        ("POST", "/v1/runs/run-endless/stop") => {
            stops.fetch_add(1, Ordering::SeqCst);
            json(&mut w, "200 OK", r#"{"run_id":"run-endless","status":"stopping"}"#);
        }
        ("GET", "/v1/runs/run-endless/events") => {
            let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
            let event = format!("data: {{\"event\":\"message.delta\",\"delta\":\"{}\"}}\n\n", "x".repeat(1024));
            let mut sent = 0usize;
            while sent < STREAM_LIMIT && w.write_all(event.as_bytes()).is_ok() {
                sent += event.len();
                streamed.fetch_add(1024, Ordering::SeqCst);
            }
        }
        _ => json(&mut w, "404 Not Found", r#"{"error":"not found"}"#),
    }
}

fn config(url: &str, cap: usize) -> AgentConfig {
    AgentConfig {
        backend: BackendKind::Hermes,
        base_url: Some(url.to_owned()),
        api_key_env: Some(KEY_VAR.into()),
        timeout_s: 120,
        max_reply_bytes: cap,
        ..AgentConfig::default()
    }
}

const KEY_VAR: &str = "GW_TEST_HERMES_API_SERVER_KEY";

/// The backend with its API server key given as the gateway gives it (resolved secrets).
fn agent(c: &AgentConfig) -> Box<dyn gatewarden_agent::Agent> {
    let whole = gatewarden_config::Config { agent: c.clone(), ..Default::default() };
    let no_home = std::env::temp_dir().join("gatewarden-hermes-cap-no-such-home");
    let env = |name: &str| (name == KEY_VAR).then(|| std::ffi::OsString::from("test-api-server-key"));
    let secrets = gatewarden_config::Secrets::resolve_with(&no_home, &whole, &env);
    build_agent_with(c, &secrets, Vec::new(), None)
}

fn req() -> AgentRequest {
    AgentRequest::new("r1", "c", "u", "tell me everything", vec![])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_hermes_run_ends_at_max_reply_bytes_and_is_stopped() {
    const CAP: usize = 64 * 1024;
    let hermes = EndlessHermes::start();
    let a = agent(&config(&hermes.url, CAP));

    // Streamed to a caller: at most the cap passes on, then the run fails naming the key.
    let (tx, mut rx) = mpsc::channel::<String>(64);
    let shown = tokio::spawn(async move {
        let mut n = 0usize;
        while let Some(c) = rx.recv().await {
            n += c.len();
        }
        n
    });
    let t0 = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), a.run_streaming(req(), CancellationToken::new(), tx))
        .await
        .expect("the run ended");
    assert!(matches!(&r, Err(AgentError::Failed(why)) if why.contains("max_reply_bytes")), "{r:?}");
    let passed = shown.await.expect("the reader");
    assert!(passed <= CAP, "{passed} bytes passed on past a cap of {CAP}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while hermes.stops.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(hermes.stops.load(Ordering::SeqCst) >= 1, "the run was not stopped on hermes's side");
    eprintln!(
        "ended after {:?}, {} KiB streamed by the fake",
        t0.elapsed(),
        hermes.streamed.load(Ordering::SeqCst) / 1024
    );

    // A sync caller: the same cap.
    let r = tokio::time::timeout(Duration::from_secs(60), a.run(req(), CancellationToken::new())).await.expect("ended");
    assert!(matches!(&r, Err(AgentError::Failed(why)) if why.contains("max_reply_bytes")), "{r:?}");
    assert!(hermes.stops.load(Ordering::SeqCst) >= 1);
}
