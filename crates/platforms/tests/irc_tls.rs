//! IRC over TLS against a real ngIRCd's SSL port, whose certificate and key the test writes from
//! a CA made for it (crates/testkit/src/tls.rs): the client verifies and talks both ways (a
//! plain-TCP user on the same server sees the bot's lines); an untrusted certificate is a
//! `degraded` adapter naming the server and the reason, and the bot never registers.
#![cfg(unix)]

mod support;
use support::{MemHost, wait};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_chatproto::irc::{Config, Connection, Error, Event};
use gatewarden_config::{PlatformConfig, platform};
use gatewarden_net::ClientTls;
use gatewarden_platforms::irc::Irc;
use gatewarden_platforms::{Adapter, State};
use gatewarden_testkit::servers::Ngircd;
use gatewarden_testkit::tls::{TestCa, Validity};

const WAIT: Duration = Duration::from_secs(10);

fn config(server: String, ca_file: &Path) -> PlatformConfig {
    PlatformConfig {
        allowed_chats: vec!["#tls".into()],
        conflict_standby_s: 5,
        ca_file: Some(ca_file.to_owned()),
        ..PlatformConfig::with(platform::Irc {
            server: Some(server),
            nick: Some("gwtls".into()),
            tls: true,
            ..platform::Irc::default()
        })
    }
}

#[test]
fn the_adapter_talks_over_tls_and_refuses_an_untrusted_server() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let leaf = ca.leaf(&["localhost", "127.0.0.1"], Validity::Now);
    let Some(s) = Ngircd::start_tls(&leaf.cert_pem, &leaf.key_pem) else { return };
    let tls_addr = s.tls_addr().unwrap();

    // The client library alone: verified TLS registration on the SSL port.
    let mut cfg = Config::new(format!("localhost:{}", tls_addr.port()), "carol");
    cfg.tls = Some(ClientTls::from_ca_file(&ca_file).unwrap());
    let mut carol = Connection::connect(&cfg).unwrap();
    carol.join("#tls", WAIT).unwrap();

    let irc = Irc::new(&config(format!("localhost:{}", tls_addr.port()), &ca_file), None, None).unwrap();
    let host = Arc::new(MemHost::echoing());
    irc.start(host.clone()).unwrap();
    wait("connected", || irc.status().state() == State::Connected);
    wait(
        "the bot's JOIN",
        || matches!(carol.next_event(Duration::from_millis(50)), Ok(Some(Event::Join { nick, .. })) if nick == "gwtls"),
    );
    carol.privmsg("#tls", "hello over TLS").unwrap();
    wait("the inbound message", || host.inbox.lock().unwrap().iter().any(|m| m.text == "hello over TLS"));
    irc.wake();
    wait("the echo", || {
        matches!(carol.next_event(Duration::from_millis(50)),
            Ok(Some(Event::Privmsg { from, text, .. })) if from == "gwtls" && text == "echo: hello over TLS")
    });
    irc.stop_intake();
    irc.close(Instant::now() + Duration::from_secs(3));

    // A CA the server's certificate is not from: the handshake is refused.
    let stranger = TestCa::new("someone else's CA").write_pem(dir.path(), "stranger.pem");
    let mut cfg = Config::new(format!("localhost:{}", tls_addr.port()), "mallory");
    cfg.tls = Some(ClientTls::from_ca_file(&stranger).unwrap());
    let e = Connection::connect(&cfg).unwrap_err();
    assert!(matches!(&e, Error::Tls { reason, .. } if reason.contains("unknown issuer")), "{e}");
    // A TLS client on the plain port gets no TLS: refused, not hung.
    let mut cfg = Config::new(s.addr().to_string(), "mallory");
    cfg.tls = Some(ClientTls::from_ca_file(&ca_file).unwrap());
    cfg.connect_timeout = Duration::from_secs(2);
    let e = Connection::connect(&cfg).unwrap_err();
    assert!(matches!(&e, Error::Tls { .. } | Error::Timeout(_)), "{e}");

    let irc = Irc::new(&config(format!("localhost:{}", tls_addr.port()), &stranger), None, None).unwrap();
    irc.start(Arc::new(MemHost::echoing())).unwrap();
    wait("degraded", || matches!(irc.status().state(), State::Degraded(_)));
    let reason = irc.status().state().reason().unwrap_or_default().to_owned();
    assert!(
        reason.contains(&format!("localhost:{}", tls_addr.port())) && reason.contains("unknown issuer"),
        "{reason}"
    );
    irc.close(Instant::now() + Duration::from_secs(3));
}

/// SASL asked of a server that cannot do it (ngIRCd has no SASL): the adapter is parked with
/// the reason instead of registering without the account it was told to prove.
#[test]
fn sasl_against_a_server_without_it_parks_the_adapter() {
    let Some(s) = Ngircd::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = TestCa::new("unused").write_pem(dir.path(), "ca.pem");
    let mut cfg = config(s.addr().to_string(), &ca_file);
    let gatewarden_config::PlatformSettings::Irc(irc) = &mut cfg.settings else { unreachable!() };
    irc.tls = false;
    let irc = Irc::new(&cfg, None, Some("sasl-secret".into())).unwrap();
    irc.start(Arc::new(MemHost::echoing())).unwrap();
    wait("parked", || matches!(irc.status().state(), State::Parked(_)));
    let reason = irc.status().state().reason().unwrap_or_default().to_owned();
    assert!(reason.contains("SASL") && !reason.contains("sasl-secret"), "{reason}");
    irc.close(Instant::now() + Duration::from_secs(3));
}
