//! The lease over TLS to a real PostgreSQL with `ssl = on` whose certificate the test makes from
//! its own CA (testkit::tls): `verify-full` with `sslrootcert`, `verify-ca` through an address
//! the certificate does not name, and the refusals (unknown issuer, wrong host name) naming the
//! reason; `pg_stat_ssl` proves the session is encrypted.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::time::Duration;

use gatewarden_cluster::{ClusterError, Holder, LeaseBackend, PgLease};
use gatewarden_testkit::postgres::{Cluster, PASSWORD};
use gatewarden_testkit::tls::{TestCa, Validity};

fn holder() -> Holder {
    Holder {
        host: "tls-host".into(),
        home: "/homes/tls".into(),
        pid: 4242,
        start_time: Some(1),
        incarnation: "inc-tls".into(),
        listen: None,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn url(host: &str, pg: &Cluster, query: &str, ca: &Path) -> String {
    format!("postgres://postgres@{host}:{}/gatewarden?{query}&sslrootcert={}", pg.port(), ca.display())
}

#[test]
fn verify_full_verify_ca_and_the_refusals() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden store CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let leaf = ca.leaf(&["localhost"], Validity::Now);
    pg.enable_tls(&leaf.cert_pem, &leaf.key_pem);
    let stranger = TestCa::new("someone else's CA").write_pem(dir.path(), "stranger.pem");
    rt().block_on(async {
        let ttl = Duration::from_secs(30);
        // verify-full by the name in the certificate.
        let mut full = PgLease::new(&url("localhost", &pg, "sslmode=verify-full", &ca_file), Some(PASSWORD), "t1")
            .unwrap()
            .with_application_name("gw-tls-full");
        full.acquire(&holder(), ttl).await.expect("verify-full");
        // verify-ca through 127.0.0.1, which the certificate does not name.
        let mut by_ca = PgLease::new(&url("127.0.0.1", &pg, "sslmode=verify-ca", &ca_file), Some(PASSWORD), "t2")
            .unwrap()
            .with_application_name("gw-tls-ca");
        by_ca.acquire(&holder(), ttl).await.expect("verify-ca");
        let ssl = pg.sql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name IN ('gw-tls-full', 'gw-tls-ca')",
        );
        assert_eq!(ssl.trim(), "2", "both sessions are encrypted");

        for (what, u, why) in [
            ("wrong host name", url("127.0.0.1", &pg, "sslmode=verify-full", &ca_file), "not valid for this host name"),
            ("unknown issuer", url("localhost", &pg, "sslmode=verify-full", &stranger), "unknown issuer"),
            // `require` verifies too; `prefer` does not fall back to plain text on a bad certificate.
            ("require", url("localhost", &pg, "sslmode=require", &stranger), "unknown issuer"),
            ("prefer", url("localhost", &pg, "sslmode=prefer", &stranger), "unknown issuer"),
        ] {
            let mut l = PgLease::new(&u, Some(PASSWORD), "t3").unwrap();
            match l.acquire(&holder(), ttl).await {
                Err(ClusterError::Connect(m)) => assert!(m.contains(why), "{what}: {m}"),
                other => panic!("{what}: expected a refused connection, got {other:?}"),
            }
        }
    });
}
