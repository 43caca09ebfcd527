//! gatewarden-telemetry: OpenTelemetry export over OTLP/HTTP.
//!
//! - [`spans`]: a message's trace (crates/journal/src/trace.rs) as spans: the message, and under
//!   it the journal commit, the queue wait, the run with each provider tried and the first
//!   token, and the outbox. The same steps `gatewarden trace` shows.
//! - [`metrics`]: the Prometheus text `/metrics` serves, as OTLP metrics (counters as
//!   cumulative monotonic sums, the rest as gauges): one source for both.
//! - [`reason`]: a failure as exported: a code and a fixed sentence, never the reason's own
//!   text (it can quote the conversation).
//! - [`otlp`]: the OTLP/HTTP JSON encoding (opentelemetry-proto's JSON mapping: hex ids,
//!   lowerCamelCase fields, integer enums, 64-bit integers as strings).
//! - [`Exporter`]: one thread posting to `<otlp_endpoint>/v1/traces` and `/v1/metrics`, behind
//!   a bounded queue that never blocks a message (full: dropped and counted), each request
//!   bounded by `timeout_s`, TLS and proxy from crates/net.
//!
//! Why not the opentelemetry crates: `opentelemetry-otlp` brings a protobuf stack (prost) and an
//! HTTP client of its own (reqwest/hyper-client, or tonic for gRPC), and `opentelemetry_sdk` its
//! batch processors and runtime glue — several MB of code in a binary optimised for size, where
//! idle RSS is mostly code pages (issue 22's ≤ 5 MB budget). JSON is a valid OTLP/HTTP encoding,
//! serde_json and ureq are in the binary already, and what is exported is a handful of span and
//! metric shapes: a few hundred lines here cost next to nothing, and nothing when unconfigured.

pub mod metrics;
pub mod otlp;
pub mod reason;
pub mod spans;

mod export;

pub use export::{Exporter, Stats};

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry: {0}")]
    Net(#[from] gatewarden_net::NetError),
    #[error("telemetry: cannot start the exporter thread: {0}")]
    Thread(std::io::Error),
}
