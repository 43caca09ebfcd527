//! Issue 8, findings 3, 5 and 6: HTTP floods, anonymous control and the smaller ones. Real
//! gateway processes, real sockets, loopback only (docs/security.md).
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use work_common::*;

const ECHO: &str = "[agent]\nbackend = \"echo\"\n";

/// Sends `raw` on a new connection and reads until the server closes it (or `timeout`).
fn exchange(addr: SocketAddr, raw: &str, timeout: Duration) -> String {
    let mut s = TcpStream::connect_timeout(&addr, timeout).expect("connect");
    s.set_read_timeout(Some(timeout)).unwrap();
    s.write_all(raw.as_bytes()).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path` with the given `Host` header and optional `Authorization`; returns the raw response.
fn get_with_host(addr: SocketAddr, path: &str, host: &str, auth: Option<&str>) -> String {
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"), READY)
}

fn status_of(raw: &str) -> Option<u16> {
    raw.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Waits until the peer closes `s` (EOF or reset); returns how long that took.
fn closed_within(s: &mut TcpStream, bound: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut b = [0u8; 4096];
    while t0.elapsed() < bound {
        match s.read(&mut b) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(t0.elapsed()),
        }
    }
    None
}

/// A keep-alive connection on which `GET /healthz` was answered 200 (a 503 at the cap is retried
/// on a new connection, within [`READY`]).
fn served_and_kept_open(addr: SocketAddr) -> TcpStream {
    let t0 = Instant::now();
    loop {
        let mut s = TcpStream::connect_timeout(&addr, READY).expect("connect");
        s.set_read_timeout(Some(READY)).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("write");
        let mut got = Vec::new();
        let mut b = [0u8; 1024];
        let head_end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(i + 4);
            }
            match s.read(&mut b) {
                Ok(0) | Err(_) => break None,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        };
        let raw = String::from_utf8_lossy(&got[..head_end.unwrap_or(got.len())]).into_owned();
        let head = raw.to_ascii_lowercase();
        if head_end.is_some() && status_of(&raw) == Some(200) && !head.contains("connection: close") {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a length on /healthz");
            while got.len() < head_end.unwrap_or(0) + len {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => panic!("the kept-open connection closed mid-body"),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                }
            }
            return s;
        }
        assert!(t0.elapsed() < READY, "no place for a kept-open connection: {head}");
    }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Finding 3: ~1,100 slowloris connections (each stuck in its request head) against a gateway
/// whose descriptor limit is 1,024. `/healthz` answers (within seconds), `status` reports it running, and a
/// graceful `stop` ends it with exit 0 recorded in the ledger; the gateway never holds more
/// descriptors than the limit minus the lifecycle's reserve.
#[test]
fn slowloris_at_a_1024_fd_limit_keeps_health_status_and_stop() {
    let prlimit = which("prlimit");
    let home = TempHome::new();
    let sw = Sweeper::new();
    // A wrapper so the gateway itself starts under the limit (hard = soft: nothing to raise).
    let wrapper = home.root().join("gatewarden-at-1024");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {prlimit} --nofile=1024:1024 -- {} \"$@\"\n", bin())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A header timeout longer than the test: only the cap protects the gateway here.
    write_config(home.path(), &format!("{ECHO}[http]\nheader_timeout_s = 300\n"));
    let mut g = GatewayBuilder::new(&wrapper, &home).env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", g.pid())).unwrap();
    assert!(
        limits.lines().any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("1024")),
        "{limits}"
    );

    let mut conns = Vec::new();
    let mut peak_fds = 0;
    for i in 0..1100 {
        let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { continue };
        let _ = c.write_all(format!("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow-{i}: ").as_bytes());
        conns.push(c);
        if i % 100 == 99 {
            peak_fds = peak_fds.max(fd_count(g.pid()));
        }
    }
    peak_fds = peak_fds.max(fd_count(g.pid()));
    assert!(peak_fds <= 1024 - 64, "the gateway held {peak_fds} descriptors under a 1,024 limit");

    // The flood's connections become evictable a second after connecting; the probe may meet
    // a 503 until then, never a hang.
    let mut last = None;
    let healthy = wait_until(Duration::from_secs(5), || {
        last = Some(http_get(addr, "/healthz", Duration::from_secs(2)).map(|r| r.status));
        matches!(last, Some(Ok(200)))
    });
    assert!(healthy, "/healthz under the flood: {last:?}\n{}", g.diag());
    let st = run_cli(&home, &["status"]);
    assert_cli(&st, 0, "status under the flood");
    assert!(st.text_lc().contains("running"), "{st:#?}");
    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop under the flood");
    let status = g.wait_exit(EXIT);
    assert_exit_code(&g, status, 0, "graceful stop under the flood");
    let exited = home.events("exited");
    assert!(exited.iter().any(|e| e["code"] == json!(0)), "{}", home.ledger_text());
    drop(conns);
}

/// Finding 3: a connection stuck in its request head, an idle keep-alive connection and a body
/// that never completes are all ended by the configured timeouts.
#[test]
fn slow_heads_idle_keep_alive_and_slow_bodies_time_out() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, &format!("{ECHO}[http]\nheader_timeout_s = 1\nbody_timeout_s = 1\n"));
    let addr = g.listen();

    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(5));
    assert!(took.is_some_and(|t| t < Duration::from_secs(3)), "slow head open after {took:?}");

    let mut idle = TcpStream::connect(addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut b = [0u8; 512];
    idle.set_read_timeout(Some(READY)).unwrap();
    let n = idle.read(&mut b).unwrap();
    assert!(b[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&b[..n]));
    let took = closed_within(&mut idle, Duration::from_secs(5));
    assert!(took.is_some_and(|t| t < Duration::from_secs(3)), "idle keep-alive open after {took:?}");

    let mut body = TcpStream::connect(addr).unwrap();
    body.write_all(
        b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"chat",
    )
    .unwrap();
    body.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = body.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&out), Some(408), "slow body: {out:?}");
}

/// Finding 3: at the cap, a new connection closes the oldest idle one and is served; when every
/// connection is busy (or has just connected), it gets a quick 503 with `Connection: close`.
#[test]
fn past_the_cap_idle_connections_make_room_and_busy_ones_get_503() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    // Each run leaves a file, so the test sees both runs in flight without a connection.
    let runs = home.root().join("agent_runs");
    std::fs::create_dir_all(&runs).unwrap();
    let script = format!("touch {}/$GATEWARDEN_RUN_ID; sleep 3; cat", runs.display());
    let g = gateway(
        &home,
        &sw,
        &format!(
            "[http]\nmax_connections = 2\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\n"
        ),
    );
    let addr = g.listen();

    // Two served keep-alive connections hold both places (and nothing else does: the start-up
    // probes' connections may still be registered for a moment, so each is retried until served).
    let mut idle1 = served_and_kept_open(addr);
    let _idle2 = served_and_kept_open(addr);
    // Served by evicting the oldest idle connection once it has been idle for a moment.
    must_wait_until(READY, "an idle connection makes room", || {
        http_get(addr, "/healthz", READY).is_ok_and(|r| r.status == 200)
    });
    assert!(closed_within(&mut idle1, Duration::from_secs(3)).is_some(), "the oldest idle connection was evicted");

    let busy: Vec<_> = (0..2).map(|i| send_bg(addr, &format!("busy{i}"), "slow")).collect();
    must_wait_until(READY, "two runs in flight", || std::fs::read_dir(&runs).map(|d| d.count()).unwrap_or(0) >= 2);
    let raw = exchange(addr, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", READY);
    assert_eq!(status_of(&raw), Some(503), "{raw}");
    assert!(raw.to_ascii_lowercase().contains("connection: close"), "{raw}");
    for b in busy {
        let (r, _) = b.join().unwrap();
        let r = r.expect("busy request");
        assert_eq!(r.status, 200, "busy requests are never cut: {}", r.text());
    }
}

/// Finding 5: on the default (loopback, no token) gateway, `/stop` and `/restart` over HTTP are
/// refused to anyone, and the gateway keeps running; the local owner's `gatewarden send /stop`
/// goes through the control socket and stops it (exit 0).
#[test]
fn anonymous_stop_and_restart_are_refused_but_the_owner_may_send_them() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, ECHO);
    let api = Api::new(g.listen());
    for cmd in ["/stop", "/restart"] {
        let r = api.send("chat", "cli", cmd).unwrap();
        assert_eq!(r.status, 403, "{cmd}: {}", r.text());
        let r = api.send_async("chat", "cli", cmd).unwrap();
        assert_eq!(r.status, 403, "async {cmd}: {}", r.text());
    }
    assert!(api.send("chat", "u", "/status").is_ok_and(|r| r.status == 200));
    assert!(g.alive(), "{}", g.diag());
    assert!(home.events("stop_requested").is_empty() && home.events("restart_requested").is_empty());

    let out = cli_tagged(&home, &sw, &["send", "/stop"], READY);
    assert_cli(&out, 0, "send /stop as the local owner");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "owner's /stop");
    let req = home.events("stop_requested");
    assert_eq!(req.len(), 1, "{}", home.ledger_text());
    assert_eq!(req[0]["requester"]["channel"], json!("cli-send"), "{}", req[0]);
}

/// Finding 5: DNS rebinding. A request whose `Host` names another site is refused (421) on every
/// path; loopback names with any port, the bound address and configured `allowed_hosts` pass.
#[test]
fn rebinding_host_headers_are_refused() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, &format!("{ECHO}[http]\nallowed_hosts = [\"gw.test\", \"other.test:81\"]\n"));
    let addr = g.listen();
    let port = addr.port();
    for host in ["attacker.example", "attacker.example:80", "127.0.0.1.nip.io", "other.test:82", "localhostx"] {
        for path in ["/v1/status", "/healthz"] {
            let raw = get_with_host(addr, path, host, None);
            assert_eq!(status_of(&raw), Some(421), "Host {host} {path}: {raw}");
        }
    }
    let pass = [
        format!("localhost:{port}"),
        "localhost".into(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "gw.test:1234".into(),
        "GW.TEST".into(),
        "other.test:81".into(),
    ];
    for host in &pass {
        let raw = get_with_host(addr, "/v1/status", host, None);
        assert_eq!(status_of(&raw), Some(200), "Host {host}: {raw}");
    }
}

/// Finding 6: the `Bearer` scheme is case-insensitive; a wrong token is still refused.
#[test]
fn bearer_scheme_is_case_insensitive() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, &format!("api_token = \"tok-0123456789abcd\"\n{ECHO}"));
    let addr = g.listen();
    for auth in ["Bearer tok-0123456789abcd", "bearer tok-0123456789abcd", "BEARER tok-0123456789abcd"] {
        let raw = get_with_host(addr, "/v1/status", "localhost", Some(auth));
        assert_eq!(status_of(&raw), Some(200), "{auth}: {raw}");
    }
    for auth in ["bearer nope", "Basic tok-0123456789abcd"] {
        let raw = get_with_host(addr, "/v1/status", "localhost", Some(auth));
        assert_eq!(status_of(&raw), Some(401), "{auth}: {raw}");
    }
}

/// Finding 6: an `api_token` that could never authenticate (non-ASCII, blank) stops the
/// gateway at start with exit 78 and the key named.
#[test]
fn unusable_api_tokens_are_refused_at_start() {
    for token in ["caf\u{e9}", "  ", "two words"] {
        let home = TempHome::new();
        write_config(home.path(), &format!("api_token = \"{token}\"\n{ECHO}"));
        let mut g = builder(&home).spawn();
        let st = g.wait_exit(EXIT);
        assert_exit_code(&g, st, 78, &format!("api_token {token:?}"));
        assert!(g.stderr().contains("'api_token'"), "{token:?}: {}", g.stderr_tail(10));
    }
}

fn which(tool: &str) -> String {
    let out = std::process::Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!path.is_empty(), "{tool} is required (util-linux)");
    path
}

/// Finding 6: the journal's retention. Finished messages past `[journal] max_size_mb` are
/// pruned at start, oldest first; the newest stay readable.
#[test]
fn journal_retention_prunes_the_oldest_finished_messages_at_start() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config = format!("[journal]\nmax_size_mb = 1\n{ECHO}");
    let mut g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    let text = "y".repeat(100 * 1024);
    let ids: Vec<String> = (0..30).map(|_| api.submit("big", &text)).collect();
    for id in &ids {
        wait_final(&api, id, READY);
    }
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    g.wait_exit(EXIT);
    let journal = home.path().join("journal.sqlite3");
    let before = std::fs::metadata(&journal).unwrap().len();
    assert!(before > 4 * 1024 * 1024, "30 × 200 KiB of messages: {before} bytes");

    let g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    must_wait_until(READY, "the oldest message pruned", || {
        api.get(&format!("/v1/messages/{}", ids[0])).is_ok_and(|r| r.status == 404)
    });
    let newest = api.message(ids.last().unwrap()).expect("the newest message stays");
    assert_eq!(newest["state"], json!("done"), "{newest}");
    let kept = ids.iter().filter(|id| api.message(id).is_some()).count();
    assert!((1..=10).contains(&kept), "{kept} of 30 messages of 200 KiB kept under 1 MiB");
}
