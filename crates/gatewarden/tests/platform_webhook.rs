//! Issue 29 §4: signed inbound webhooks (`kind = "webhook"`, crates/platforms/src/webhook.rs) in
//! real gateway processes: `POST /hooks/webhook/<name>` signed with HMAC-SHA256 over
//! `timestamp "." body`, 202 with the message id once journaled, the reply POSTed to a loopback
//! callback server here that checks its signature. Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use work_common::*;

use sha2::{Digest, Sha256};

const SECRET_ENV: &str = "GW_TEST_WEBHOOK_SECRET";
const SECRET: &str = "It's a Secret to Everybody";
const REPLY: Duration = Duration::from_secs(20);

/// HMAC-SHA256 (RFC 2104) written out here, so the test does not trust the product's MAC.
fn hmac_hex(key: &[u8], msg: &[u8]) -> String {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(msg).finalize();
    let outer = Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The headers of a request signed at `ts`.
fn signed(ts: u64, body: &[u8], delivery: Option<&str>) -> Vec<(String, String)> {
    let mut msg = format!("{ts}.").into_bytes();
    msg.extend_from_slice(body);
    let mut h = vec![
        ("X-Gatewarden-Timestamp".to_owned(), ts.to_string()),
        ("X-Gatewarden-Signature".to_owned(), format!("sha256={}", hmac_hex(SECRET.as_bytes(), &msg))),
    ];
    if let Some(d) = delivery {
        h.push(("X-Gatewarden-Delivery".to_owned(), d.to_owned()));
    }
    h
}

fn post(addr: SocketAddr, headers: &[(String, String)], body: &[u8]) -> HttpResponse {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    http_request(addr, "POST", "/hooks/webhook/alerts", &h, Some(body), Duration::from_secs(15)).expect("POST the hook")
}

/// One callback POST as the server here received it.
#[derive(Debug, Clone)]
struct Call {
    answered: u16,
    signature_ok: bool,
    body: serde_json::Value,
}

/// A loopback callback receiver: answers 500 to the first `fail` calls, then 200, and checks
/// each call's signature.
struct CallbackServer {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl CallbackServer {
    fn start(fail: usize) -> CallbackServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
        let c = Arc::clone(&calls);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut headers = Vec::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                    }
                }
                let get = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone()).unwrap_or_default();
                let len: usize = get("content-length").parse().unwrap_or(0);
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                let mut msg = format!("{}.", get("x-gatewarden-timestamp")).into_bytes();
                msg.extend_from_slice(&body);
                let signature_ok = get("x-gatewarden-signature")
                    == format!("sha256={}", hmac_hex(SECRET.as_bytes(), &msg))
                    && get("x-gatewarden-timestamp").parse::<u64>().is_ok_and(|t| t.abs_diff(now()) < 300);
                let mut calls = c.lock().unwrap();
                let answered = if calls.len() < fail { 500 } else { 200 };
                calls.push(Call { answered, signature_ok, body: serde_json::from_slice(&body).unwrap_or_default() });
                drop(calls);
                let _ = conn.write_all(
                    format!("HTTP/1.1 {answered} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                );
            }
        });
        CallbackServer { addr, calls }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn delivered(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.answered == 200).collect()
    }
}

fn config(callback: Option<SocketAddr>) -> String {
    let cb = callback.map(|a| format!("callback_url = \"http://{a}/cb\"\n")).unwrap_or_default();
    format!(
        "drain_timeout_s = 5\n[agent]\nbackend = \"echo\"\n\
         [[platform]]\nkind = \"webhook\"\nname = \"alerts\"\nsecret_env = \"{SECRET_ENV}\"\n\
         max_body_bytes = 4096\n{cb}"
    )
}

fn start_gw(home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
    write_config(home.path(), config);
    let mut g =
        builder(home).env(TAG_VAR, sw.tag()).env(SECRET_ENV, SECRET).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn();
    g.wait_ready(READY);
    wait_adapter(home, "connected", READY);
    g
}

/// Signed → 202 with the message id → the reply at the callback, signed, after two failed
/// tries (once); the reply is fetchable by that id; a redelivery (same delivery id) → 202, no
/// second run; the exact request again → 401 (replay); unsigned, wrongly signed and stale → 401
/// and nothing journaled; oversize → 413.
#[test]
fn signed_post_202_then_the_signed_callback_once() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cb = CallbackServer::start(2);
    let mut g = start_gw(&home, &sw, &config(Some(cb.addr)));
    let addr = g.listen();

    let body = br#"{"alert":"disk full","host":"db1"}"#;
    let headers = signed(now(), body, Some("d-1"));
    let r = post(addr, &headers, body);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json().unwrap()["message_id"].as_str().expect("the message id").to_owned();

    let ok = wait_until(REPLY, || !cb.delivered().is_empty());
    assert!(ok, "no reply at the callback: {:?}\n{}", cb.calls(), g.stderr_tail(20));
    let calls = cb.calls();
    assert_eq!(calls.len(), 3, "two failures, then the reply: {calls:?}");
    assert!(calls.iter().all(|c| c.signature_ok), "every callback signed: {calls:?}");
    let text = calls[2].body["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains("\"alert\": \"disk full\""), "the echo of the pretty-printed body: {text}");
    assert_eq!(calls[2].body["chat"], "webhook:alerts");

    let m = Api::new(addr).get(&format!("/v1/messages/{id}")).unwrap().json().unwrap();
    assert_eq!((m["state"].as_str(), m["chat_id"].as_str()), (Some("done"), Some("webhook:alerts")), "{m}");
    assert_eq!(m["reply"].as_str(), Some(text.as_str()), "{m}");

    // A redelivery, signed anew: the same message, no second run. Its timestamp is one second
    // on, so its signature differs from the first even within the same second (the very same
    // signature is a replay, below).
    let again = post(addr, &signed(now() + 1, body, Some("d-1")), body);
    assert_eq!(again.status, 202, "{}", again.text());
    assert_eq!(again.json().unwrap()["message_id"].as_str(), Some(id.as_str()));
    // The very same request again: a replay.
    assert_eq!(post(addr, &headers, body).status, 401, "replayed");

    let forged = br#"{"alert":"forged"}"#;
    assert_eq!(post(addr, &[], forged).status, 401, "unsigned");
    let mut wrong = signed(now(), forged, None);
    wrong[1].1 = format!("sha256={}", hmac_hex(b"another secret", forged));
    assert_eq!(post(addr, &wrong, forged).status, 401, "wrong secret");
    // 302 s: the gateway's clock may be a second past ours, and 300 s is still inside.
    assert_eq!(post(addr, &signed(now() - 302, forged, None), forged).status, 401, "stale");
    assert_eq!(post(addr, &signed(now() + 302, forged, None), forged).status, 401, "from the future");
    let big = vec![b'x'; 5000];
    assert_eq!(post(addr, &signed(now(), &big, None), &big).status, 413);

    let quiet = holds_for(Duration::from_millis(1500), || cb.calls().len() == 3);
    assert!(quiet.is_ok(), "a second run or a forged one answered: {:?}", cb.calls());
    let p = platforms(&home);
    // The request and its redelivery reached the journal (which kept one); none of the refused.
    assert_eq!(p[0]["received"].as_u64(), Some(2), "only the signed requests were delivered: {p}");
    stop_cleanly(&home, &mut g);
}

/// The gateway is killed between the 202 and the callback (the callback refuses meanwhile):
/// the next incarnation delivers the reply, once.
#[test]
fn a_restart_between_the_202_and_the_callback_delivers_once() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cb = CallbackServer::start(usize::MAX);
    let cfg = config(Some(cb.addr));
    let mut g = start_gw(&home, &sw, &cfg);
    let body = b"build 42 failed";
    let r = post(g.listen(), &signed(now(), body, Some("ci-42")), body);
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(wait_until(REPLY, || !cb.calls().is_empty()), "the callback was tried");
    g.kill();
    let cb2 = CallbackServer::start(0);
    let mut g2 = start_gw(&home, &sw, &config(Some(cb2.addr)));
    let ok = wait_until(REPLY, || !cb2.delivered().is_empty());
    assert!(ok, "the reply after the restart: {:?}\n{}", cb2.calls(), g2.stderr_tail(20));
    let quiet = holds_for(Duration::from_millis(1500), || cb2.calls().len() == 1);
    assert!(quiet.is_ok(), "sent more than once: {:?}", cb2.calls());
    assert_eq!(cb2.calls()[0].body["text"], "build 42 failed");
    assert!(cb2.calls()[0].signature_ok);
    stop_cleanly(&home, &mut g2);
}

/// GitHub's variant with GitHub's published example (secret, body and signature from
/// docs.github.com, "Validating webhook deliveries"), and the rate bound: past
/// `rate_per_minute`, 429 with `Retry-After`.
#[test]
fn the_github_variant_and_the_rate_bound() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cfg = format!(
        "[agent]\nbackend = \"echo\"\n[[platform]]\nkind = \"webhook\"\nname = \"gh\"\n\
         secret_env = \"{SECRET_ENV}\"\nsignature = \"github\"\nrate_per_minute = 2\n"
    );
    let mut g = start_gw(&home, &sw, &cfg);
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    assert_eq!(format!("sha256={}", hmac_hex(SECRET.as_bytes(), b"Hello, World!")), sig);
    let gh = |delivery: &str| {
        let h = [("X-Hub-Signature-256", sig), ("X-GitHub-Delivery", delivery)];
        http_request(g.listen(), "POST", "/hooks/webhook/gh", &h, Some(b"Hello, World!"), Duration::from_secs(15))
            .expect("POST the hook")
    };
    let r = gh("72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json().unwrap()["message_id"].as_str().expect("the message id").to_owned();
    let m = wait_until(REPLY, || {
        Api::new(g.listen())
            .get(&format!("/v1/messages/{id}"))
            .is_ok_and(|r| r.json().is_ok_and(|m| m["state"] == "done"))
    });
    assert!(m, "the reply is fetchable without a callback");
    let no_delivery = http_request(
        g.listen(),
        "POST",
        "/hooks/webhook/gh",
        &[("X-Hub-Signature-256", sig)],
        Some(b"Hello, World!"),
        Duration::from_secs(15),
    )
    .unwrap();
    assert_eq!(no_delivery.status, 401, "GitHub's variant needs the delivery id: {}", no_delivery.text());
    assert_eq!(gh("second").status, 202);
    let r = gh("third");
    assert_eq!(r.status, 429, "{}", r.text());
    let after = r.headers.iter().find(|(k, _)| k == "retry-after").and_then(|(_, v)| v.parse::<u64>().ok());
    assert!(after.is_some_and(|s| (1..=30).contains(&s)), "Retry-After: {:?}", r.headers);
    stop_cleanly(&home, &mut g);
}

/// `X-Gatewarden-Thread` makes each thread its own conversation (`webhook:<name>:<thread>`),
/// so a sender correlates each callback with its request by the `chat` it names; a thread
/// that is not one printable token is refused (400) and nothing is journaled.
#[test]
fn threads_are_their_own_chats_and_the_callback_names_them() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cb = CallbackServer::start(0);
    let mut g = start_gw(&home, &sw, &config(Some(cb.addr)));
    let addr = g.listen();
    let with_thread = |thread: &str, body: &[u8], delivery: &str| {
        let mut h = signed(now(), body, Some(delivery));
        h.push(("X-Gatewarden-Thread".to_owned(), thread.to_owned()));
        post(addr, &h, body)
    };
    let a = with_thread("ticket-17", b"printer on fire", "t-1");
    assert_eq!(a.status, 202, "{}", a.text());
    let b = with_thread("ticket-18", b"coffee machine empty", "t-2");
    assert_eq!(b.status, 202, "{}", b.text());
    let ok = wait_until(REPLY, || cb.delivered().len() == 2);
    assert!(ok, "both replies at the callback: {:?}\n{}", cb.calls(), g.stderr_tail(20));
    let mut got: Vec<(String, String)> = cb
        .delivered()
        .iter()
        .map(|c| {
            (
                c.body["chat"].as_str().unwrap_or_default().to_owned(),
                c.body["text"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("webhook:alerts:ticket-17".to_owned(), "printer on fire".to_owned()),
            ("webhook:alerts:ticket-18".to_owned(), "coffee machine empty".to_owned())
        ],
        "each reply names its own thread"
    );
    let id = a.json().unwrap()["message_id"].as_str().expect("the message id").to_owned();
    let m = Api::new(addr).get(&format!("/v1/messages/{id}")).unwrap().json().unwrap();
    assert_eq!(m["chat_id"].as_str(), Some("webhook:alerts:ticket-17"), "{m}");

    let bad = with_thread("two words", b"x", "t-3");
    assert_eq!(bad.status, 400, "{}", bad.text());
    let p = platforms(&home);
    assert_eq!(p[0]["received"].as_u64(), Some(2), "the refused thread was not journaled: {p}");
    stop_cleanly(&home, &mut g);
}
