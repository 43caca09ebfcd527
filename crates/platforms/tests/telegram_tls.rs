//! The Telegram adapter over real TLS: the fake Bot API behind a TLS front whose certificate
//! comes from a CA made for this test (crates/testkit/src/tls.rs). A private CA round trip
//! (`ca_file`), and the three certificate failures (unknown issuer, wrong host name, expired):
//! each leaves the adapter `degraded` with the host and the reason, retried with backoff, and
//! not one byte of HTTP (the token is in the URL) reaches the server.

// testkit (the TLS fronts, the CA) is Unix-only; crates/net's own tests run everywhere.
#![cfg(unix)]

mod support;
use support::{MemHost, wait_for};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::telegram::Telegram;
use gatewarden_platforms::{Adapter, Host, State};
use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::tls::{Leaf, TestCa, TlsFront, Validity};

const TOKEN: &str = "123456:tls-token";

fn config(base: &str, ca_file: &Path) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ca_file: Some(ca_file.to_owned()),
        ..PlatformConfig::with(platform::Telegram {
            api_base: Some(base.into()),
            poll_timeout_s: 2,
            ..platform::Telegram::default()
        })
    }
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(300), ..Options::default() }).unwrap()
}

fn front(fake: &FakeTelegram, leaf: &Leaf) -> TlsFront {
    TlsFront::start(fake.addr(), leaf).unwrap()
}

fn start(base: String, ca_file: &Path) -> Arc<Telegram> {
    let t = Arc::new(Telegram::new(&config(&base, ca_file), TOKEN.into()).unwrap());
    t.start(Arc::new(MemHost::echoing()) as Arc<dyn Host>).unwrap();
    t
}

fn https(name: &str, addr: SocketAddr) -> String {
    format!("https://{name}:{}", addr.port())
}

#[test]
fn round_trip_over_tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let fake = fake();
    let front = front(&fake, &ca.leaf(&["localhost", "127.0.0.1"], Validity::Now));
    // By name (SNI and a DNS-name check) and by address (an IP SAN).
    for name in ["localhost", "127.0.0.1"] {
        let t = start(https(name, front.addr()), &ca_file);
        wait_for("connected", Duration::from_secs(10), || t.status().state() == State::Connected);
        let text = format!("over TLS to {name}");
        fake.inject(TOKEN, 7, 42, &text);
        let want = format!("echo: {text}");
        fake.wait_sent(TOKEN, Duration::from_secs(10), |s| s.iter().any(|m| m.text == want)).unwrap();
        t.stop_intake();
        assert!(t.close(Instant::now() + Duration::from_secs(3)));
    }
    assert!(front.handshakes() >= 2, "the traffic went through the TLS front");
}

#[test]
fn certificate_failures_degrade_name_the_host_and_send_nothing() {
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
        let fake = fake();
        let front = front(&fake, &leaf);
        let base = https("localhost", front.addr());
        let t = start(base, &ca_file);
        wait_for(case, Duration::from_secs(10), || matches!(t.status().state(), State::Degraded(_)));
        let reason = t.status().state().reason().unwrap_or_default().to_owned();
        let host = format!("localhost:{}", front.addr().port());
        assert!(reason.contains(&host) && reason.contains(why), "{case}: {reason}");
        assert!(!reason.contains(TOKEN), "{case}: the token leaked: {reason}");
        // Retried with backoff: more attempts come, each refused.
        wait_for("a retry", Duration::from_secs(10), || front.accepted() >= 2);
        assert_eq!(front.handshakes(), 0, "{case}: a handshake completed");
        assert!(fake.polls(TOKEN).is_empty(), "{case}: the fake saw a poll");
        assert!(matches!(t.status().state(), State::Degraded(_)), "{case}");
        t.close(Instant::now() + Duration::from_secs(3));
    }
}
