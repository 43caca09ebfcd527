//! The gateway's role in an active/standby cluster (`[cluster]` in config.toml).
//!
//! Without `[cluster]` nothing here runs and every gateway is active. With it:
//! - the lease driver (crates/cluster) competes for the cluster's lease; the snapshot it
//!   publishes carries the local deadline, and [`Gateway::is_active`] checks it on every use,
//!   so intake stops at the deadline even if the driver task is late;
//! - the async worker starts on the first promotion and re-reads the journal on every later one;
//! - `/readyz` is 200 only on the active, and a standby answers the message APIs with 503 and
//!   the active's address ([`standby_gate`]; docs/protocol.md);
//! - the journal (messages, sessions, outbox, inbound dedup ids) is the cluster's, in
//!   PostgreSQL ([`ClusterSettings::store`], crates/cluster/src/store.rs): every write carries the
//!   epoch of the driver's snapshot, and a write the fence refuses demotes at once;
//! - lifecycle ledger events are copied to the store, fenced by the epoch;
//! - after the drain the lease is released ([`release`]), so a standby takes over within one
//!   renewal interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use gatewarden_cluster::{Change, Holder, PgLease, Timing};
use serde_json::json;

use crate::app::App;
use crate::options::{ClusterSettings, host_name};
use crate::platforms::RoleEvent;

/// How long a stopping active waits for its release to reach the store.
const RELEASE_BUDGET: Duration = Duration::from_secs(3);
/// Response header naming the active's API address on a standby's 503.
pub const ACTIVE_HEADER: &str = "x-gatewarden-active";

/// Starts competing for the lease. Called once the HTTP address is known (it goes into the
/// holder identity, for standbys to point clients at).
pub fn start(app: &Arc<App>, s: &ClusterSettings) -> Result<(), String> {
    let gw = &app.gw;
    let c = &s.config;
    let timing = Timing::new(c.lease_ttl(), c.renew_interval()).map_err(|e| format!("[cluster]: {e}"))?;
    let backend = PgLease::new(&c.store_url(), s.password.as_ref().map(|p| p.expose()), &c.name)
        .map_err(|e| format!("[cluster] store: {e}"))?
        // Tells the gateways' sessions apart in pg_stat_activity.
        .with_application_name(&format!("gatewarden pid {}", gw.me.pid));
    let me = Holder {
        host: host_name(),
        home: gw.home_str.clone(),
        pid: gw.me.pid,
        start_time: gw.me.start_time,
        incarnation: gw.me.id.clone(),
        listen: gw.listen().map(str::to_owned),
    };
    let (handle, mut changes) = gatewarden_cluster::spawn(backend, &c.name, me, timing);
    if let Some(store) = &s.store {
        store.attach(handle.clone());
    }
    if gw.cluster.set(handle).is_err() {
        return Err("cluster already started".into());
    }
    // The adapters run on the active only (platforms.rs).
    app.platforms.follow_role(gw, s)?;
    crate::info!(
        "cluster {}: standby, competing for the lease (ttl {}s, renewal every {}s)",
        c.name,
        c.lease_ttl_s,
        c.renew_interval_s
    );
    gw.record(
        "cluster_joined",
        json!({"name": c.name, "lease_ttl_s": c.lease_ttl_s, "renew_interval_s": c.renew_interval_s}),
    );
    let app = Arc::clone(app);
    tokio::spawn(async move {
        let gw = &app.gw;
        let mut started = false;
        while let Some(change) = changes.recv().await {
            match change {
                Change::Promoted { epoch, since } => {
                    crate::info!("cluster: active, epoch {epoch}");
                    gw.record("cluster_promoted", json!({"epoch": epoch, "since": since}));
                    // The pairing book as the old active left it, before any adapter starts.
                    let gate = Arc::clone(&app.work.gate);
                    match tokio::task::spawn_blocking(move || gate.book.refresh()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            crate::warn!("cluster: cannot read the pairing book: {e}; read again before each decision")
                        }
                        Err(e) => crate::warn!("cluster: cannot read the pairing book: {e}"),
                    }
                    app.platforms.role_changed(RoleEvent::Promoted { epoch });
                    if started {
                        app.work.resume_queued(Arc::clone(gw));
                    } else {
                        started = true;
                        app.work.start_worker(Arc::clone(gw));
                    }
                }
                Change::Demoted { epoch, reason, at, fence_refused } => {
                    // Intake stopped already (the receive budget is zero); now close them.
                    app.platforms.role_changed(RoleEvent::Demoted);
                    crate::warn!(
                        "cluster: demoted from epoch {epoch} ({}){}",
                        reason.as_str(),
                        match fence_refused {
                            Some(true) => "; the store refused our writes: a newer epoch exists",
                            _ => "",
                        }
                    );
                    gw.record(
                        "cluster_demoted",
                        json!({
                            "epoch": epoch,
                            "reason": reason.as_str(),
                            "demoted_at": gatewarden_lifecycle::timefmt::format(at),
                            "fence_refused": fence_refused,
                        }),
                    );
                }
            }
        }
    });
    Ok(())
}

/// Gives the lease up after the drain (a no-op without `[cluster]` or when not active).
pub async fn release(app: &App) {
    let Some(h) = app.cluster.get() else { return };
    // The credentials first: the adapters closed in the drain, and the successor takes them at
    // its promotion.
    app.platforms.release_leases(RELEASE_BUDGET).await;
    let was = h.snapshot();
    h.release(RELEASE_BUDGET).await;
    if was.is_active_at(Instant::now()) {
        app.record("cluster_released", json!({"epoch": was.epoch}));
    }
}

/// What a standby answers a request only the active serves: who the active is.
pub fn standby_words(gw: &crate::gateway::Gateway) -> String {
    let snap = gw.cluster.get().map(|h| h.snapshot());
    let active = snap.as_ref().and_then(|s| s.active.as_ref()).filter(|a| a.live);
    let listen = active.and_then(|a| a.holder.listen.clone());
    let name = snap.as_ref().map(|s| s.name.clone()).unwrap_or_default();
    match (&listen, active) {
        (Some(l), Some(a)) => format!(
            "this gateway is a standby in cluster {name}; the active serves http://{l} (host {})",
            a.holder.host
        ),
        _ => format!("this gateway is a standby in cluster {name}; no active is known right now"),
    }
}

/// A standby answers everything but `/v1/status` and `/metrics` with 503 and the active's
/// address (header [`ACTIVE_HEADER`] and the JSON body); it does not forward.
pub async fn standby_gate(State(gw): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if gw.is_active() || path == "/v1/status" || path == "/metrics" {
        return next.run(req).await;
    }
    let snap = gw.cluster.get().map(|h| h.snapshot());
    let active = snap.as_ref().and_then(|s| s.active.as_ref()).filter(|a| a.live);
    let listen = active.and_then(|a| a.holder.listen.clone());
    let message = standby_words(&gw);
    let body = json!({"error": {
        "type": "standby",
        "message": message,
        "active": active.map(|a| json!({"host": a.holder.host, "listen": a.holder.listen, "epoch": a.epoch})),
    }});
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if let Some(v) = listen.and_then(|l| HeaderValue::from_str(&l).ok()) {
        resp.headers_mut().insert(ACTIVE_HEADER, v);
    }
    resp
}
