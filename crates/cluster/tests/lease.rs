//! The PostgreSQL lease against a real throwaway server (testkit::postgres).
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use gatewarden_cluster::driver::RoleView;
use gatewarden_cluster::{Acquired, ClusterError, LeaseBackend, PgLease, Timing};
use gatewarden_testkit::postgres::{Cluster, PASSWORD, Proxy, ProxyMode};

mod common;
use common::holder;

fn lease(pg: &Cluster, name: &str) -> PgLease {
    PgLease::new(&pg.url(), Some(PASSWORD), name).expect("lease")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn granted(a: Acquired) -> i64 {
    match a {
        Acquired::Granted(g) => g.epoch,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn grant_renew_release_and_the_fence() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    rt().block_on(async {
        let ttl = Duration::from_secs(30);
        let (mut a, mut b) = (lease(&pg, "c1"), lease(&pg, "c1"));
        let (ha, hb) = (holder(1), holder(2));
        let e1 = granted(a.acquire(&ha, ttl).await.unwrap());
        assert_eq!(e1, 1);
        match b.acquire(&hb, ttl).await.unwrap() {
            Acquired::Held { current: Some(cur), expires_in } => {
                assert_eq!(cur.holder, ha);
                assert_eq!(cur.epoch, 1);
                assert!(cur.live);
                assert!(expires_in > Duration::from_secs(25), "{expires_in:?}");
            }
            other => panic!("B must see A's live lease: {other:?}"),
        }
        assert!(a.renew(&ha, e1, ttl).await.unwrap());
        a.record(&ha, e1, "hello", &serde_json::json!({"n": 1})).await.unwrap();
        // B cannot write under A's epoch, nor under a made-up one.
        assert!(matches!(b.record(&hb, 2, "x", &serde_json::json!({})).await, Err(ClusterError::Fenced { .. })));
        a.release(&ha, e1).await.unwrap();
        let e2 = granted(b.acquire(&hb, ttl).await.unwrap());
        assert_eq!(e2, 2, "a new holder gets a larger epoch");
        // The old holder: renewal refused, writes fenced.
        assert!(!a.renew(&ha, e1, ttl).await.unwrap());
        let e = a.record(&ha, e1, "late", &serde_json::json!({})).await.unwrap_err();
        assert!(matches!(e, ClusterError::Fenced { epoch: 1, .. }), "{e}");
        b.record(&hb, e2, "mine", &serde_json::json!({})).await.unwrap();
        let cur = a.current().await.unwrap().unwrap();
        assert_eq!((cur.epoch, cur.holder.incarnation.as_str()), (2, "inc2"));
    });
    assert_eq!(pg.sql("SELECT string_agg(epoch || ':' || (holder->>'incarnation'), ',' ORDER BY epoch) FROM gw_lease_history WHERE name = 'c1'"), "1:inc1,2:inc2");
    assert_eq!(
        pg.sql("SELECT string_agg(event || '@' || epoch, ',' ORDER BY id) FROM gw_events WHERE name = 'c1'"),
        "hello@1,mine@2"
    );
    assert_eq!(
        pg.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM gw_schema_version"),
        gatewarden_cluster::schema_versions().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
    );
}

#[test]
fn an_expired_lease_goes_to_the_next_taker_and_fences_the_old_one() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    rt().block_on(async {
        let (mut a, mut b) = (lease(&pg, "c2"), lease(&pg, "c2"));
        let (ha, hb) = (holder(1), holder(2));
        let e1 = granted(a.acquire(&ha, Duration::from_millis(300)).await.unwrap());
        // B keeps trying; it must get the lease only once the database clock passed the expiry.
        let t0 = Instant::now();
        let e2 = loop {
            match b.acquire(&hb, Duration::from_secs(30)).await.unwrap() {
                Acquired::Granted(g) => break g.epoch,
                Acquired::Held { .. } => {
                    assert!(t0.elapsed() < Duration::from_secs(10), "never granted after expiry");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        assert!(t0.elapsed() >= Duration::from_millis(250), "granted before expiry: {:?}", t0.elapsed());
        assert_eq!(e2, e1 + 1);
        assert!(!a.renew(&ha, e1, Duration::from_secs(30)).await.unwrap());
        assert!(matches!(a.record(&ha, e1, "late", &serde_json::json!({})).await, Err(ClusterError::Fenced { .. })));
    });
}

#[test]
fn racing_standbys_get_exactly_one_grant_per_epoch() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let wins = rt().block_on(async {
        let mut tasks = Vec::new();
        for n in 0..8 {
            let mut l = lease(&pg, "c3");
            tasks.push(tokio::spawn(async move {
                matches!(l.acquire(&holder(n), Duration::from_secs(30)).await, Ok(Acquired::Granted(_)))
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.unwrap());
        }
        wins
    });
    assert_eq!(wins, 1);
    assert_eq!(pg.sql("SELECT count(*) || ':' || max(epoch) FROM gw_lease_history WHERE name = 'c3'"), "1:1");
    assert_eq!(
        pg.sql("SELECT count(*) || ',' || count(DISTINCT version) FROM gw_schema_version"),
        format!("{0},{0}", gatewarden_cluster::schema_versions().count()),
        "migrations ran once"
    );
}

/// The driver demotes on its local deadline while the database still holds its lease: a
/// stalled connection never leaves a window with two actives.
#[test]
fn a_stalled_store_connection_demotes_before_the_database_expiry() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let proxy = Proxy::start(pg.addr());
    let rt = rt();
    rt.block_on(async {
        let backend = PgLease::new(&pg.url_via(proxy.addr()), Some(PASSWORD), "c4").unwrap();
        let timing = Timing::new(Duration::from_millis(1600), Duration::from_millis(400)).unwrap();
        let (handle, mut changes) = gatewarden_cluster::spawn(backend, "c4", holder(1), timing);
        let first = tokio::time::timeout(Duration::from_secs(10), changes.recv()).await.unwrap().unwrap();
        assert!(matches!(first, gatewarden_cluster::Change::Promoted { epoch: 1, .. }), "{first:?}");
        assert!(handle.is_active());
        proxy.set(ProxyMode::Stall);
        let stalled = Instant::now();
        // Intake stops when the snapshot says so (the change event follows the last fenced
        // write attempt, which waits for the stalled connection).
        while handle.is_active() {
            assert!(stalled.elapsed() < Duration::from_secs(10), "never demoted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = stalled.elapsed();
        // Checked right away, on a direct connection: the lease is still live in the database.
        let live = tokio::task::block_in_place(|| {
            pg.sql("SELECT (expires_at > clock_timestamp()) || ',' || epoch FROM gw_lease WHERE name = 'c4'")
        });
        assert_eq!(live, "true,1", "demoted only after the database expiry (after {took:?})");
        let demoted = tokio::time::timeout(Duration::from_secs(10), changes.recv()).await.unwrap().unwrap();
        assert!(
            matches!(
                demoted,
                gatewarden_cluster::Change::Demoted {
                    epoch: 1,
                    reason: gatewarden_cluster::DemoteReason::Deadline,
                    ..
                }
            ),
            "{demoted:?}"
        );
        assert!(!handle.is_active());
        assert_eq!(handle.snapshot().role, RoleView::Standby);
        assert!(took < Duration::from_millis(1600), "demotion took {took:?}, longer than the TTL");
    });
}
