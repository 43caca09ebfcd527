//! The Discord adapter over TLS: the fake's REST API and gateway behind TLS fronts with a test
//! CA's certificate (testkit::tls), reached with `ca_file`: `https://` REST and `wss://`
//! gateway, a RESUME over a new TLS session; a gateway certificate from another CA degrades
//! the adapter naming the reason, and a `ws://` gateway under an `https://` API base is
//! refused.
#![cfg(unix)] // testkit (the TLS fronts) is Unix-only

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_discord_fake::{FakeDiscord, Options};
use gatewarden_platforms::discord::Discord;
use gatewarden_platforms::{Adapter, Host, Inbound, Outgoing, Sent, State};
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};

mod support;
use support::{MemHost, wait_for};

const TOKEN: &str = "fake-bot-token";

/// The shared in-memory host (tests/support) with a state dir.
struct DirHost {
    mem: MemHost,
    dir: PathBuf,
}

impl Host for DirHost {
    fn deliver(&self, adapter: &str, msg: Inbound) -> Result<(), String> {
        self.mem.deliver(adapter, msg)
    }
    fn outbox(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        self.mem.outbox(adapter, limit)
    }
    fn sent(&self, seq: i64, outcome: Sent) {
        self.mem.sent(seq, outcome);
    }
    fn state_changed(&self, adapter: &str, state: &State) {
        self.mem.state_changed(adapter, state);
    }
    fn state_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
}

/// `first_seq`: where this host's outbox numbering starts (a real journal's never restarts, and
/// the nonce is keyed by it).
fn start(base: &str, ca_file: &Path, dir: &Path, first_seq: usize) -> Arc<Discord> {
    let cfg = PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ca_file: Some(ca_file.to_owned()),
        ..PlatformConfig::with(platform::Discord { api_base: Some(base.into()) })
    };
    let d = Arc::new(Discord::new(&cfg, TOKEN.into()).unwrap());
    let mem = MemHost::echoing();
    for _ in 0..first_seq {
        mem.queue("0", "placeholder");
    }
    mem.outbox.lock().unwrap().clear();
    let host = Arc::new(DirHost { mem, dir: dir.to_owned() });
    d.start(host as Arc<dyn Host>).unwrap();
    d
}

#[test]
fn wss_and_https_with_a_private_ca_and_a_resume_over_a_new_tls_session() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let fake =
        FakeDiscord::start(Options { heartbeat_interval: Duration::from_millis(500), ..Options::default() }).unwrap();
    let leaf = ca.leaf(&["localhost"], Validity::Now);
    let rest = TlsFront::start(fake.rest_addr(), &leaf).unwrap();
    let gw = TlsFront::start(fake.gateway_addr(), &leaf).unwrap();
    fake.set_public_gateway(&format!("wss://localhost:{}", gw.addr().port()));
    let base = format!("https://localhost:{}/api/v10", rest.addr().port());
    let d = start(&base, &ca_file, dir.path(), 0);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message("100", "7", "over TLS");
    fake.wait_sent(Duration::from_secs(10), |s| s.iter().any(|m| m.content == "echo: over TLS")).unwrap();
    d.stop_intake();
    assert!(d.close(Instant::now() + Duration::from_secs(3)));
    fake.message("100", "7", "missed");
    let d = start(&base, &ca_file, dir.path(), 100);
    let got = fake.wait_sent(Duration::from_secs(10), |s| s.iter().any(|m| m.content == "echo: missed"));
    assert!(got.is_ok(), "{:?} {:?}", d.status().snapshot(), fake.stats());
    d.stop_intake();
    assert!(d.close(Instant::now() + Duration::from_secs(3)));
    let st = fake.stats();
    assert_eq!((st.identifies, st.resumed), (1, 1), "{st:?}");
    assert!(gw.handshakes() >= 2 && rest.handshakes() >= 1, "the traffic went through the TLS fronts");
}

#[test]
fn a_stranger_gateway_certificate_and_plain_ws_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let stranger = TestCa::new("someone else's CA");
    let fake = FakeDiscord::start(Options::default()).unwrap();
    let rest = TlsFront::start(fake.rest_addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let gw = TlsFront::start(fake.gateway_addr(), &stranger.leaf(&["localhost"], Validity::Now)).unwrap();
    fake.set_public_gateway(&format!("wss://localhost:{}", gw.addr().port()));
    let base = format!("https://localhost:{}/api/v10", rest.addr().port());
    let d = start(&base, &ca_file, &dir.path().join("a"), 0);
    wait_for("degraded", Duration::from_secs(10), || matches!(d.status().state(), State::Degraded(_)));
    let why = d.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("unknown issuer") && !why.contains(TOKEN), "{why}");
    d.stop_intake();
    d.close(Instant::now() + Duration::from_secs(2));
    assert_eq!(fake.stats().identifies, 0, "the token never went to an unverified gateway");

    // An https API naming a plain ws:// gateway: refused for good, the token never sent.
    fake.set_public_gateway(&format!("ws://{}", fake.gateway_addr()));
    let d = start(&base, &ca_file, &dir.path().join("b"), 0);
    wait_for("parked", Duration::from_secs(10), || matches!(d.status().state(), State::Parked(_)));
    let why = d.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("wss://"), "{why}");
    d.stop_intake();
    d.close(Instant::now() + Duration::from_secs(2));
    assert_eq!(fake.stats().identifies, 0);
}
