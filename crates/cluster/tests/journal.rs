//! The fenced message journal on a real throwaway PostgreSQL.
#![cfg(target_os = "linux")]

use std::time::Duration;

use gatewarden_cluster::journal::PgJournal;
use gatewarden_cluster::{Acquired, ClusterError, Holder, LeaseBackend, PgLease};
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

fn holder(n: u32) -> Holder {
    Holder {
        host: "h".into(),
        home: format!("/homes/{n}"),
        pid: n,
        start_time: None,
        incarnation: format!("inc{n}"),
        listen: None,
    }
}

/// A deposed active cannot finish a run; the new active re-runs it exactly once.
#[test]
fn a_deposed_active_cannot_complete_and_the_new_one_reruns_once() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let lease = |pg: &Cluster| PgLease::new(&pg.url(), Some(PASSWORD), "j").unwrap();
        let (mut la, mut lb) = (lease(&pg), lease(&pg));
        let (ha, hb) = (holder(1), holder(2));
        let Acquired::Granted(ga) = la.acquire(&ha, Duration::from_secs(30)).await.unwrap() else { panic!("A") };
        let mut ja = PgJournal::new(lease(&pg));
        let m1 = ja.accept(ga.epoch, "c", "u", "one").await.unwrap();
        let m2 = ja.accept(ga.epoch, "c", "u", "two").await.unwrap();
        assert!(ja.claim(ga.epoch, &m1, "inc1").await.unwrap());
        assert!(!ja.claim(ga.epoch, &m1, "inc1").await.unwrap(), "a claim is taken once");
        assert!(ja.complete(ga.epoch, &m1, "inc1", "ONE").await.unwrap());
        assert!(ja.claim(ga.epoch, &m2, "inc1").await.unwrap());
        // B cannot write before it holds the lease.
        let mut jb = PgJournal::new(lease(&pg));
        assert!(matches!(jb.accept(ga.epoch + 1, "c", "u", "x").await, Err(ClusterError::Fenced { .. })));
        // A is deposed while running m2 (its lease released, as after a pause).
        la.release(&ha, ga.epoch).await.unwrap();
        let Acquired::Granted(gb) = lb.acquire(&hb, Duration::from_secs(30)).await.unwrap() else { panic!("B") };
        assert!(gb.epoch > ga.epoch);
        let late = ja.complete(ga.epoch, &m2, "inc1", "TWO-late").await;
        assert!(matches!(late, Err(ClusterError::Fenced { .. })), "{late:?}");
        assert!(matches!(ja.accept(ga.epoch, "c", "u", "late").await, Err(ClusterError::Fenced { .. })));
        // B recovers: m2 is requeued once, run and completed by B.
        assert_eq!(jb.recover(gb.epoch, "inc2").await.unwrap(), vec![m2.clone()]);
        assert!(jb.claim(gb.epoch, &m2, "inc2").await.unwrap());
        assert!(jb.complete(gb.epoch, &m2, "inc2", "TWO").await.unwrap());
        let two = jb.get(&m2).await.unwrap().unwrap();
        assert_eq!(
            (two.state.as_str(), two.reply.as_deref(), two.attempts, two.epoch),
            ("done", Some("TWO"), 2, gb.epoch)
        );
        let one = jb.get(&m1).await.unwrap().unwrap();
        assert_eq!((one.state.as_str(), one.reply.as_deref(), one.epoch), ("done", Some("ONE"), ga.epoch));
        assert!(jb.recover(gb.epoch, "inc2").await.unwrap().is_empty());
    });
    assert_eq!(pg.sql("SELECT count(*) FROM gw_messages WHERE name = 'j'"), "2", "the late accept left no row");
    assert_eq!(pg.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM gw_schema_version"), "1,2,3");
}
