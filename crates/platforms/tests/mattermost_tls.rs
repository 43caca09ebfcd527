//! The Mattermost adapter over real TLS: the fake Mattermost (REST and WebSocket on one port)
//! behind a TLS front whose certificate comes from a CA made for this test
//! (crates/testkit/src/tls.rs), reached with `ca_file`: a round trip over `https://` and
//! `wss://` (crates/chatproto/src/ws.rs), and a certificate that names another host, which
//! leaves the adapter `degraded` without a connection.

// testkit (the TLS fronts, the CA, the fake) is Unix-only.
#![cfg(unix)]

mod support;
use support::{MemHost, wait_for};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::mattermost::Mattermost;
use gatewarden_platforms::{Adapter, Host, State};
use gatewarden_testkit::mattermostfake::{FakeMattermost, Options};
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};

fn start(fake: &FakeMattermost, server: &str, ca_file: &Path) -> (Arc<Mattermost>, Arc<MemHost>) {
    let cfg = PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ca_file: Some(ca_file.to_owned()),
        ..PlatformConfig::with(platform::Mattermost { server: Some(server.into()) })
    };
    let m = Arc::new(Mattermost::new(&cfg, fake.options().token).unwrap());
    let host = Arc::new(MemHost::echoing());
    m.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    (m, host)
}

#[test]
fn round_trip_over_https_and_wss_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden mattermost test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let fake = FakeMattermost::start(Options::default()).unwrap();
    let front = TlsFront::start(fake.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let (m, _host) = start(&fake, &format!("https://localhost:{}", front.addr().port()), &ca_file);
    wait_for("connected", Duration::from_secs(10), || m.status().state() == State::Connected);
    fake.user_post("chan1", "u1", "over tls", None);
    let p = fake.wait_bot_posts(1, Duration::from_secs(10)).unwrap();
    assert_eq!(p[0].message, "echo: over tls");
    assert_eq!(fake.stats().connections, 1, "the WebSocket came through the front");
    assert!(front.handshakes() >= 3, "REST and the WebSocket went through TLS: {}", front.handshakes());
    m.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn a_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden mattermost test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let fake = FakeMattermost::start(Options::default()).unwrap();
    let front = TlsFront::start(fake.addr(), &ca.leaf(&["elsewhere.test"], Validity::Now)).unwrap();
    let (m, _host) = start(&fake, &format!("https://localhost:{}", front.addr().port()), &ca_file);
    wait_for("degraded", Duration::from_secs(10), || matches!(m.status().state(), State::Degraded(_)));
    let why = m.status().state().reason().unwrap_or_default().to_owned();
    eprintln!("degraded: {why}");
    assert!(why.contains("not valid for this host name"), "{why}");
    assert_eq!(fake.stats().connections, 0, "no WebSocket reached the fake");
    m.close(Instant::now() + Duration::from_secs(2));
}
