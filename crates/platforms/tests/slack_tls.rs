//! The Slack adapter over real TLS: the fake Slack's Web API and its Socket Mode port each
//! behind a TLS front whose certificate comes from a CA made for this test
//! (crates/testkit/src/tls.rs), reached with `ca_file`: a round trip over `https://` and
//! `wss://`, and a WebSocket whose certificate names another host, which leaves the adapter
//! `degraded` without a connection.

// testkit (the TLS fronts, the CA, the fake) is Unix-only.
#![cfg(unix)]

mod support;
use support::{MemHost, wait_for};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::slack::Slack;
use gatewarden_platforms::{Adapter, Host, State};
use gatewarden_testkit::slackfake::{FakeSlack, Options};
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};

fn config(base: &str, ca_file: &Path) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ca_file: Some(ca_file.to_owned()),
        ..PlatformConfig::with(platform::Slack {
            api_base: Some(base.into()),
            bot_token_env: Some("UNUSED_TOO".into()),
            ..platform::Slack::default()
        })
    }
}

/// A fake whose Web API and WebSocket are behind TLS fronts; the WebSocket's certificate names
/// `ws_name`. Returns the fake, the fronts and the `https://` API base.
fn fronted(ca: &TestCa, ws_name: &str) -> (FakeSlack, TlsFront, TlsFront, String) {
    // The fronts need the fake's ports, the fake the WebSocket front's: start, then point it.
    let fake = FakeSlack::start(Options::default()).unwrap();
    let (http, ws) = fake.addrs();
    let api = TlsFront::start(http, &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let wss = TlsFront::start(ws, &ca.leaf(&[ws_name], Validity::Now)).unwrap();
    fake.set_ws_url(&format!("wss://localhost:{}", wss.addr().port()));
    let base = format!("https://localhost:{}/api/", api.addr().port());
    (fake, api, wss, base)
}

fn start(fake: &FakeSlack, base: &str, ca_file: &Path) -> (Arc<Slack>, Arc<MemHost>) {
    let o = fake.options();
    let s = Arc::new(Slack::new(&config(base, ca_file), o.app_token, o.bot_token).unwrap());
    let host = Arc::new(MemHost::echoing());
    s.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    (s, host)
}

#[test]
fn round_trip_over_https_and_wss_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden slack test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let (fake, api, wss, base) = fronted(&ca, "localhost");
    let (s, _host) = start(&fake, &base, &ca_file);
    wait_for("connected", Duration::from_secs(10), || s.status().state() == State::Connected);
    fake.user_message("C1", "U1", "over tls", None);
    let p = fake.wait_posted(1, Duration::from_secs(10)).unwrap();
    assert_eq!(p[0].text, "echo: over tls");
    assert!(api.handshakes() >= 2 && wss.handshakes() == 1, "{} / {}", api.handshakes(), wss.handshakes());
    s.close(Instant::now() + Duration::from_secs(3));
}

#[test]
fn a_websocket_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden slack test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let (fake, _api, _wss, base) = fronted(&ca, "elsewhere.test");
    let (s, _host) = start(&fake, &base, &ca_file);
    wait_for("degraded", Duration::from_secs(10), || matches!(s.status().state(), State::Degraded(_)));
    let why = s.status().state().reason().unwrap_or_default().to_owned();
    eprintln!("degraded: {why}");
    assert!(why.contains("handshake failed") && why.contains("not valid for this host name"), "{why}");
    assert_eq!(fake.stats().connections, 0, "no WebSocket reached the fake");
    s.close(Instant::now() + Duration::from_secs(2));
}
