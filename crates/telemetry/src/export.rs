//! The exporter: a bounded queue and one thread that posts each batch once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use gatewarden_config::TelemetryConfig;
use gatewarden_journal::{Message, TraceEvent};
use serde_json::Value;

use crate::TelemetryError;

/// Export outcomes, for `/metrics` and `status`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Batches the collector accepted (2xx).
    pub exported: AtomicU64,
    /// Batches dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Batches the collector refused or that did not reach it in time.
    pub failed: AtomicU64,
}

enum Batch {
    Traces(Value),
    Metrics(Value),
}

/// Sends spans and metrics to `[telemetry] otlp_endpoint`. Cheap to share; its methods never
/// block: a full queue drops the batch and counts it ([`Stats::dropped`]).
#[derive(Debug)]
pub struct Exporter {
    queue: SyncSender<Batch>,
    stats: Arc<Stats>,
    service: String,
    started: SystemTime,
    metrics_interval: Duration,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Batch::Traces(_) => "Traces",
            Batch::Metrics(_) => "Metrics",
        })
    }
}

impl Exporter {
    /// The exporter for `config`; `None` when no endpoint is configured. Starts its thread.
    pub fn start(config: &TelemetryConfig) -> Result<Option<Exporter>, TelemetryError> {
        let Some(endpoint) = &config.otlp_endpoint else { return Ok(None) };
        let out = gatewarden_net::Outbound::new(config.ca_file.as_deref(), config.proxy.as_deref())?;
        let http = gatewarden_net::http_config(&out)
            .timeout_global(Some(Duration::from_secs(config.timeout_s)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let (queue, rx) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let stats = Arc::new(Stats::default());
        let base = endpoint.trim_end_matches('/').to_owned();
        let thread_stats = Arc::clone(&stats);
        std::thread::Builder::new()
            .name("otlp-export".into())
            // Encoding is done by the callers; this thread only writes bodies out.
            .stack_size(256 * 1024)
            .spawn(move || post_all(&http, &base, &rx, &thread_stats))
            .map_err(TelemetryError::Thread)?;
        Ok(Some(Exporter {
            queue,
            stats,
            service: config.service_name.clone(),
            started: SystemTime::now(),
            metrics_interval: Duration::from_secs(config.metrics_interval_s.max(1)),
        }))
    }

    /// `[telemetry] metrics_interval_s`.
    pub fn metrics_interval(&self) -> Duration {
        self.metrics_interval
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Exports the spans of a message's trace ([`crate::spans::spans_for`]) at its finish,
    /// but for the outbox's: the send may or may not have happened by the time the trace is
    /// read, so [`Exporter::outbox`] alone exports those (each exactly once).
    pub fn message(&self, msg: &Message, events: &[TraceEvent]) {
        let mut spans = crate::spans::spans_for(msg, events);
        spans.retain(|s| s.name != "gatewarden.outbox");
        if !spans.is_empty() {
            self.send(Batch::Traces(crate::otlp::traces(&self.service, &spans)));
        }
    }

    /// Exports the last `gatewarden.outbox` span of a message's trace: its reply just left
    /// (the message's other spans were exported at its finish, [`Exporter::message`]).
    pub fn outbox(&self, msg: &Message, events: &[TraceEvent]) {
        let spans = crate::spans::spans_for(msg, events);
        if let Some(last) = spans.into_iter().rev().find(|s| s.name == "gatewarden.outbox") {
            self.send(Batch::Traces(crate::otlp::traces(&self.service, &[last])));
        }
    }

    /// Exports the metrics in `prometheus_text` (what `/metrics` serves now).
    pub fn metrics(&self, prometheus_text: &str) {
        let m = crate::metrics::parse(prometheus_text);
        if !m.is_empty() {
            self.send(Batch::Metrics(crate::otlp::metrics(&self.service, &m, self.started, SystemTime::now())));
        }
    }

    fn send(&self, batch: Batch) {
        match self.queue.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The thread: each batch posted once (no retry: a collector that is down loses what it
/// missed, and the queue stays bounded); it ends when the exporter is dropped.
fn post_all(http: &ureq::Agent, base: &str, rx: &Receiver<Batch>, stats: &Stats) {
    while let Ok(batch) = rx.recv() {
        let (path, body) = match &batch {
            Batch::Traces(v) => ("/v1/traces", v),
            Batch::Metrics(v) => ("/v1/metrics", v),
        };
        let r = http.post(&format!("{base}{path}")).header("Content-Type", "application/json").send_json(body);
        let counter = match r {
            Ok(resp) if resp.status().is_success() => &stats.exported,
            _ => &stats.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
