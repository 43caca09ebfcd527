//! `GET /metrics`: Prometheus text exposition.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use gatewarden_agent::ProviderStatus;

use crate::app::App;

pub async fn metrics(State(gw): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render(&gw).await).into_response()
}

/// The exposition text: what `/metrics` serves and what the OTLP exporter sends
/// (crates/telemetry/src/metrics.rs reads it back).
pub(crate) async fn render(gw: &Arc<App>) -> String {
    let m = &gw.work.metrics;
    let counts = gw.work.with_journal(|j| j.counts()).await.ok();
    let mut out = String::with_capacity(1024);
    let _ = writeln!(out, "# HELP gatewarden_runs_total Agent runs by outcome, this incarnation.");
    let _ = writeln!(out, "# TYPE gatewarden_runs_total counter");
    for (outcome, c) in [("ok", &m.ok), ("failed", &m.failed), ("cancelled", &m.cancelled), ("timeout", &m.timeout)] {
        let _ = writeln!(out, "gatewarden_runs_total{{outcome=\"{outcome}\"}} {}", c.load(Ordering::Relaxed));
    }
    let _ = writeln!(out, "# HELP gatewarden_active_runs Runs in flight.");
    let _ = writeln!(out, "# TYPE gatewarden_active_runs gauge");
    let _ = writeln!(out, "gatewarden_active_runs {}", gw.runs.active());
    let _ = writeln!(out, "# HELP gatewarden_unavailable_total Requests answered 503 while draining.");
    let _ = writeln!(out, "# TYPE gatewarden_unavailable_total counter");
    let _ = writeln!(out, "gatewarden_unavailable_total {}", m.unavailable.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP gatewarden_async_accepted_total Async messages journaled.");
    let _ = writeln!(out, "# TYPE gatewarden_async_accepted_total counter");
    let _ = writeln!(out, "gatewarden_async_accepted_total {}", m.accepted_async.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP gatewarden_restarts_total Restarts requested, from the lifecycle ledger.");
    let _ = writeln!(out, "# TYPE gatewarden_restarts_total counter");
    let _ = writeln!(out, "gatewarden_restarts_total {}", m.restarts_before.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP gatewarden_drain_seconds Drain durations, from the lifecycle ledger.");
    let _ = writeln!(out, "# TYPE gatewarden_drain_seconds summary");
    let _ =
        writeln!(out, "gatewarden_drain_seconds_sum {:.3}", m.drain_ms_before.load(Ordering::Relaxed) as f64 / 1000.0);
    let _ = writeln!(out, "gatewarden_drain_seconds_count {}", m.drains_before.load(Ordering::Relaxed));
    if let Some(c) = counts {
        let _ = writeln!(out, "# HELP gatewarden_journal_messages Journaled messages by state.");
        let _ = writeln!(out, "# TYPE gatewarden_journal_messages gauge");
        for (state, n) in [("queued", c.queued), ("running", c.running), ("done", c.done), ("failed", c.failed)] {
            let _ = writeln!(out, "gatewarden_journal_messages{{state=\"{state}\"}} {n}");
        }
    }
    provider_metrics(gw, &mut out);
    platform_metrics(gw, &mut out).await;
    telemetry_metrics(gw, &mut out);
    let _ = writeln!(out, "# HELP gatewarden_up 1 while the gateway serves; state as a label.");
    let _ = writeln!(out, "# TYPE gatewarden_up gauge");
    let _ = writeln!(out, "gatewarden_up{{state=\"{}\",incarnation=\"{}\"}} 1", gw.phase.get(), gw.me.id);
    out
}

/// The OTLP exporter's outcomes (crates/telemetry), when `[telemetry]` is configured.
fn telemetry_metrics(gw: &Arc<App>, out: &mut String) {
    let Some(x) = gw.work.live().telemetry.clone() else { return };
    let s = x.stats();
    let _ = writeln!(out, "# HELP gatewarden_otlp_batches_total OTLP export batches by outcome.");
    let _ = writeln!(out, "# TYPE gatewarden_otlp_batches_total counter");
    for (outcome, c) in [("exported", &s.exported), ("dropped", &s.dropped), ("failed", &s.failed)] {
        let _ = writeln!(out, "gatewarden_otlp_batches_total{{outcome=\"{outcome}\"}} {}", c.load(Ordering::Relaxed));
    }
}

/// Per chat-platform adapter gauges and counters (crates/runtime/src/platforms.rs).
async fn platform_metrics(gw: &Arc<App>, out: &mut String) {
    let snaps = gw.platforms.snapshots();
    if snaps.is_empty() {
        return;
    }
    let names: Vec<String> = snaps.iter().map(|s| s.0.clone()).collect();
    let outbox = gw
        .work
        .with_journal(move |j| names.iter().map(|n| j.outbox_counts(n)).collect::<Result<Vec<_>, _>>())
        .await
        .unwrap_or_default();
    let _ = writeln!(out, "# HELP gatewarden_platform_state 1 for each adapter's current state.");
    let _ = writeln!(out, "# TYPE gatewarden_platform_state gauge");
    for (name, kind, s) in &snaps {
        let _ = writeln!(
            out,
            "gatewarden_platform_state{{platform=\"{name}\",kind=\"{kind}\",state=\"{}\"}} 1",
            s.state.name()
        );
    }
    let _ = writeln!(
        out,
        "# HELP gatewarden_platform_progress_age_seconds Seconds since the adapter last received or sent."
    );
    let _ = writeln!(out, "# TYPE gatewarden_platform_progress_age_seconds gauge");
    for (name, _, s) in &snaps {
        if let Some(age) = s.progress_age_s {
            let _ = writeln!(out, "gatewarden_platform_progress_age_seconds{{platform=\"{name}\"}} {age:.3}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP gatewarden_platform_lag_seconds Platform timestamp to journal commit, last inbound message."
    );
    let _ = writeln!(out, "# TYPE gatewarden_platform_lag_seconds gauge");
    for (name, _, s) in &snaps {
        if let Some(lag) = s.lag_s {
            let _ = writeln!(out, "gatewarden_platform_lag_seconds{{platform=\"{name}\"}} {lag:.3}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP gatewarden_platform_events_total Inbound messages received, replies sent, conflicts seen (this incarnation)."
    );
    let _ = writeln!(out, "# TYPE gatewarden_platform_events_total counter");
    for (name, _, s) in &snaps {
        for (what, n) in [("received", s.received), ("sent", s.sent), ("conflict", s.conflicts)] {
            let _ = writeln!(out, "gatewarden_platform_events_total{{platform=\"{name}\",event=\"{what}\"}} {n}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP gatewarden_platform_refused_total Inbound messages the access policy kept from the agent, by reason (this incarnation)."
    );
    let _ = writeln!(out, "# TYPE gatewarden_platform_refused_total counter");
    for (name, _, _) in &snaps {
        for (why, n) in gw.work.gate.refused(name) {
            let _ = writeln!(
                out,
                "gatewarden_platform_refused_total{{platform=\"{name}\",reason=\"{}\"}} {n}",
                why.label()
            );
        }
    }
    let access = gw.work.gate.report_cached(std::time::SystemTime::now());
    let _ = writeln!(out, "# HELP gatewarden_platform_pairing_pending Pairing codes waiting for the owner.");
    let _ = writeln!(out, "# TYPE gatewarden_platform_pairing_pending gauge");
    for a in &access {
        let n = a["pending"].as_array().map_or(0, Vec::len);
        let _ = writeln!(
            out,
            "gatewarden_platform_pairing_pending{{platform=\"{}\"}} {n}",
            label(a["name"].as_str().unwrap_or(""))
        );
    }
    if outbox.len() == snaps.len() {
        let _ = writeln!(out, "# HELP gatewarden_platform_outbox Outbox entries by state.");
        let _ = writeln!(out, "# TYPE gatewarden_platform_outbox gauge");
        for ((name, _, _), (pending, sent, failed)) in snaps.iter().zip(outbox) {
            for (state, n) in [("pending", pending), ("sent", sent), ("failed", failed)] {
                let _ = writeln!(out, "gatewarden_platform_outbox{{platform=\"{name}\",state=\"{state}\"}} {n}");
            }
        }
    }
}

/// Tokens used and the openai backend's providers (crates/agent/src/backend/provider.rs).
fn provider_metrics(gw: &Arc<App>, out: &mut String) {
    let m = &gw.work.metrics;
    let _ = writeln!(out, "# HELP gatewarden_tokens_total Tokens the upstream reported, this incarnation.");
    let _ = writeln!(out, "# TYPE gatewarden_tokens_total counter");
    for (kind, c) in [("prompt", &m.prompt_tokens), ("completion", &m.completion_tokens)] {
        let _ = writeln!(out, "gatewarden_tokens_total{{kind=\"{kind}\"}} {}", c.load(Ordering::Relaxed));
    }
    let providers = gw.work.live().agent.providers();
    if providers.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP gatewarden_provider_state 1 for each upstream provider's current state.");
    let _ = writeln!(out, "# TYPE gatewarden_provider_state gauge");
    for p in &providers {
        let _ = writeln!(out, "gatewarden_provider_state{{provider=\"{}\",state=\"{}\"}} 1", label(&p.name), p.state);
    }
    type Counter = (&'static str, &'static str, fn(&ProviderStatus) -> u64);
    let counters: [Counter; 2] = [
        ("attempts", "HTTP requests made to each provider, this incarnation.", |p: &ProviderStatus| p.attempts),
        ("failures", "Requests to each provider that failed, this incarnation.", |p: &ProviderStatus| p.failures),
    ];
    for (what, help, value) in counters {
        let _ = writeln!(out, "# HELP gatewarden_provider_{what}_total {help}");
        let _ = writeln!(out, "# TYPE gatewarden_provider_{what}_total counter");
        for p in &providers {
            let _ = writeln!(out, "gatewarden_provider_{what}_total{{provider=\"{}\"}} {}", label(&p.name), value(p));
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
