//! The Matrix client over TLS to a real Synapse: its client listener behind a TLS front whose
//! certificate comes from a CA made for this test (testkit::tls). Login and whoami over https
//! with that CA as `ca_file`; with another CA the call fails as a transient error naming the
//! host and the reason, and no request reaches Synapse (zero handshakes).
#![cfg(unix)]

use std::time::Duration;

use gatewarden_chatproto::matrix::{Client, ErrorKind};
use gatewarden_net::Outbound;
use gatewarden_testkit::servers::Synapse;
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};

const CALL: Duration = Duration::from_secs(20);

#[test]
fn login_over_tls_and_an_untrusted_homeserver_refused() {
    let Some(s) = Synapse::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let front = TlsFront::start(s.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let base = format!("https://localhost:{}", front.addr().port());
    let u = s.register("tlsuser", "tls-password-1");

    let out = Outbound::new(Some(&ca_file), None).unwrap();
    let mut c = Client::with_outbound(&base, CALL, &out).unwrap();
    let session = c.login_password(&u.localpart, &u.password, Some("TLSDEV")).unwrap();
    assert_eq!(session.user_id, u.user_id);
    c.set_access_token(u.access_token.clone());
    assert_eq!(c.whoami().unwrap().user_id, u.user_id);
    let handshakes = front.handshakes();
    assert!(handshakes >= 1);

    let stranger = TestCa::new("someone else's CA").write_pem(dir.path(), "stranger.pem");
    let out = Outbound::new(Some(&stranger), None).unwrap();
    let mut c = Client::with_outbound(&base, CALL, &out).unwrap();
    let e = c.login_password(&u.localpart, &u.password, Some("TLSDEV2")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    let m = e.to_string();
    assert!(m.contains(&format!("localhost:{}", front.addr().port())) && m.contains("unknown issuer"), "{m}");
    assert!(!m.contains("tls-password-1"));
    assert_eq!(front.handshakes(), handshakes, "no handshake completed with the untrusted CA");
}
