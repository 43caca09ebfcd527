//! What lease renewal costs the database (scripts/bench-cluster; ignored in the normal suite).
//! N lease drivers, each on its own connection as a gateway would be, against one throwaway
//! PostgreSQL: in clusters of two (an active and a standby each) and in one cluster (one active,
//! N-1 standbys polling the same row). Reports transactions per second and the server's CPU.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use gatewarden_cluster::{PgLease, Timing};
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

mod common;
use common::holder;

fn measure(pg: &Cluster, gateways: usize, per_cluster: usize, ttl: Duration, renew: Duration, window: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let tag = format!("b{per_cluster}");
    rt.block_on(async {
        let timing = Timing::new(ttl, renew).unwrap();
        let mut handles = Vec::new();
        for n in 0..gateways {
            let name = format!("{tag}-{}", n / per_cluster);
            let lease = PgLease::new(&pg.url(), Some(PASSWORD), &name).unwrap();
            handles.push(gatewarden_cluster::spawn(lease, &name, holder(n as u32), timing));
        }
        // Warm-up: every cluster has its active, every driver has connected.
        let t0 = Instant::now();
        while handles.iter().filter(|(h, _)| h.is_active()).count() < gateways.div_ceil(per_cluster) {
            assert!(t0.elapsed() < Duration::from_secs(60), "clusters did not settle");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(renew).await;
        let xacts = |pg: &Cluster| -> u64 {
            pg.sql("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'gatewarden'")
                .parse()
                .unwrap_or(0)
        };
        let (x0, c0, t) = tokio::task::block_in_place(|| (xacts(pg), pg.cpu_seconds(), Instant::now()));
        tokio::time::sleep(window).await;
        let (x1, c1) = tokio::task::block_in_place(|| (xacts(pg), pg.cpu_seconds()));
        let secs = t.elapsed().as_secs_f64();
        let cpu = (c1 - c0).max(0.0) / secs * 100.0;
        println!(
            "bench-cluster renewal: {gateways} gateways, {} per cluster, ttl {}s, renew {}s: {:.1} transactions/s, server CPU {cpu:.2}% of one core",
            per_cluster,
            ttl.as_secs(),
            renew.as_secs(),
            (x1.saturating_sub(x0)) as f64 / secs,
        );
        drop(handles);
    });
}

#[test]
#[ignore = "benchmark: scripts/bench-cluster"]
fn renewal_load() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let n: usize = std::env::var("GW_BENCH_GATEWAYS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let window =
        Duration::from_secs(std::env::var("GW_BENCH_WINDOW_S").ok().and_then(|s| s.parse().ok()).unwrap_or(20));
    let (ttl, renew) = (Duration::from_secs(15), Duration::from_secs(5));
    measure(&pg, n, 2, ttl, renew, window);
    measure(&pg, n, n, ttl, renew, window);
}
