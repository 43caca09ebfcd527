//! Credential leases against a real throwaway PostgreSQL (testkit::postgres): one credential,
//! one gateway, across clusters; a same-cluster successor takes over at once; an expired lease
//! never blocks; a stale epoch is fenced.
#![cfg(target_os = "linux")]

use std::time::Duration;

use gatewarden_cluster::credlease::{CredAcquired, CredHolder, CredKey, PgCredLeases};
use gatewarden_cluster::{Acquired, ClusterError, Holder, LeaseBackend, PgLease};
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

mod common;
use common::holder;

fn cred(cluster: &str, h: &Holder, epoch: i64) -> CredHolder {
    CredHolder {
        cluster: cluster.into(),
        host: h.host.clone(),
        home: h.home.clone(),
        pid: h.pid,
        incarnation: h.incarnation.clone(),
        epoch,
        adapter: Some("telegram".into()),
    }
}

fn key() -> CredKey {
    CredKey { platform: "telegram".into(), credential: "ab".repeat(32) }
}

async fn epoch_of(pg: &Cluster, name: &str, h: &Holder, ttl: Duration) -> (PgLease, i64) {
    let mut l = PgLease::new(&pg.url(), Some(PASSWORD), name).unwrap();
    match l.acquire(h, ttl).await.unwrap() {
        Acquired::Granted(g) => (l, g.epoch),
        other => panic!("expected a grant of {name}: {other:?}"),
    }
}

#[test]
fn one_credential_one_cluster_and_handover_rules() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let long = Duration::from_secs(30);
        let short = Duration::from_millis(800);
        let (h1, h2, h3) = (holder(1), holder(2), holder(3));
        let (mut lease_a, ea) = epoch_of(&pg, "ca", &h1, long).await;
        let (_lease_b, eb) = epoch_of(&pg, "cb", &h2, long).await;
        let mut a = PgCredLeases::new(&pg.url(), Some(PASSWORD), "ca").unwrap();
        let mut b = PgCredLeases::new(&pg.url(), Some(PASSWORD), "cb").unwrap();
        let (ca, cb) = (cred("ca", &h1, ea), cred("cb", &h2, eb));

        assert_eq!(a.acquire(&key(), &ca, short).await.unwrap(), CredAcquired::Granted);
        assert_eq!(a.acquire(&key(), &ca, short).await.unwrap(), CredAcquired::Granted, "ours: idempotent");
        // Another cluster is refused, with the holder named.
        match b.acquire(&key(), &cb, long).await.unwrap() {
            CredAcquired::Held { holder: Some(h), expires_in } => {
                assert_eq!(h, ca);
                assert!(expires_in <= short, "{expires_in:?}");
                assert!(h.to_string().contains("cluster ca") && h.to_string().contains("/homes/1"), "{h}");
            }
            other => panic!("cluster cb must be refused: {other:?}"),
        }
        let secret = pg.sql("SELECT count(*) FROM gw_credential_lease WHERE credential LIKE '%tok%'");
        assert_eq!(secret, "0");

        // A renewal keeps it; once A stops renewing (a dead holder), it expires and B takes it.
        assert!(a.renew(&key(), &ca, short).await.unwrap());
        let mut taken = false;
        for _ in 0..100 {
            if b.acquire(&key(), &cb, long).await.unwrap() == CredAcquired::Granted {
                taken = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(taken, "an expired lease of a dead holder must not block");
        assert!(!a.renew(&key(), &ca, short).await.unwrap(), "A lost it");
        b.release(&key(), &cb).await.unwrap();

        // Same cluster: a newer epoch takes over a live lease of an older one at once.
        assert_eq!(a.acquire(&key(), &ca, long).await.unwrap(), CredAcquired::Granted);
        lease_a.release(&h1, ea).await.unwrap();
        let (_lease_a2, ea2) = epoch_of(&pg, "ca", &h3, long).await;
        assert!(ea2 > ea);
        let mut a2 = PgCredLeases::new(&pg.url(), Some(PASSWORD), "ca").unwrap();
        let ca2 = cred("ca", &h3, ea2);
        assert_eq!(a2.acquire(&key(), &ca2, long).await.unwrap(), CredAcquired::Granted);
        // The old epoch can neither renew (not its row any more) nor take it back (fenced).
        let r = a.renew(&key(), &ca, long).await;
        assert!(matches!(r, Ok(false) | Err(ClusterError::Fenced { .. })), "{r:?}");
        assert!(matches!(a.acquire(&key(), &ca, long).await, Err(ClusterError::Fenced { .. })));
        let who = pg.sql("SELECT holder->>'home', epoch FROM gw_credential_lease");
        assert_eq!(who, format!("/homes/3|{ea2}"));
    });
}
