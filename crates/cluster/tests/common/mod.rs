//! Fixtures shared by the cluster's integration tests (each test file is its own crate and
//! includes this module).

use gatewarden_cluster::Holder;

/// Gateway `n` of a test cluster: its own home, pid, incarnation and listen address.
pub fn holder(n: u32) -> Holder {
    Holder {
        host: "test-host".into(),
        home: format!("/homes/{n}"),
        pid: 1000 + n,
        start_time: Some(u64::from(n)),
        incarnation: format!("inc{n}"),
        listen: Some(format!("127.0.0.1:{}", 7000 + n)),
    }
}
