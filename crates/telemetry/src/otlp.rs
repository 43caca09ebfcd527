//! OTLP/HTTP JSON (opentelemetry-proto's JSON mapping of `ExportTraceServiceRequest` and
//! `ExportMetricsServiceRequest`): trace and span ids as lowercase hex, fields in
//! lowerCamelCase, enums as integers, 64-bit integers as decimal strings.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::metrics::{Kind, Metric};
use crate::spans::Span;

/// `SpanKind` INTERNAL.
const SPAN_KIND_INTERNAL: u8 = 1;
/// `Status.code` ERROR; OK is only set by instrumentation that knows better, so unset (0).
const STATUS_ERROR: u8 = 2;
/// `AggregationTemporality` CUMULATIVE.
const CUMULATIVE: u8 = 2;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
}

fn attributes<'a>(kv: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
    Value::Array(kv.into_iter().map(|(k, v)| json!({"key": k, "value": {"stringValue": v}})).collect())
}

fn resource(service: &str) -> Value {
    json!({"attributes": attributes([("service.name", service), ("service.version", env!("CARGO_PKG_VERSION"))])})
}

fn scope() -> Value {
    json!({"name": "gatewarden", "version": env!("CARGO_PKG_VERSION")})
}

/// An `ExportTraceServiceRequest` holding `spans`.
pub fn traces(service: &str, spans: &[Span]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": hex(&s.trace_id),
                "spanId": hex(&s.span_id),
                "name": s.name,
                "kind": SPAN_KIND_INTERNAL,
                "startTimeUnixNano": nanos(s.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": attributes(
                    s.attributes
                        .iter()
                        .map(|(k, v)| (*k, v.as_str()))
                        .chain(s.error.as_ref().map(|r| ("gatewarden.reason_code", r.code.as_str())))
                ),
            });
            if let Some(p) = s.parent {
                v["parentSpanId"] = Value::String(hex(&p));
            }
            if let Some(why) = &s.error {
                v["status"] = json!({"code": STATUS_ERROR, "message": why.message});
            }
            v
        })
        .collect();
    json!({"resourceSpans": [{"resource": resource(service), "scopeSpans": [{"scope": scope(), "spans": spans}]}]})
}

/// An `ExportMetricsServiceRequest` holding `metrics`, sampled at `now` (cumulative sums start
/// at `start`, the incarnation's start).
pub fn metrics(service: &str, metrics: &[Metric], start: SystemTime, now: SystemTime) -> Value {
    let metrics: Vec<Value> = metrics
        .iter()
        .map(|m| {
            let points: Vec<Value> = m
                .points
                .iter()
                .map(|p| {
                    let mut v = json!({
                        "attributes": attributes(p.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
                        "timeUnixNano": nanos(now),
                        "asDouble": p.value,
                    });
                    if m.kind == Kind::Counter {
                        v["startTimeUnixNano"] = Value::String(nanos(start));
                    }
                    v
                })
                .collect();
            let mut v = json!({"name": m.name, "description": m.help});
            match m.kind {
                Kind::Counter => {
                    v["sum"] = json!({"dataPoints": points, "aggregationTemporality": CUMULATIVE, "isMonotonic": true})
                }
                Kind::Gauge => v["gauge"] = json!({"dataPoints": points}),
            }
            v
        })
        .collect();
    json!({"resourceMetrics": [{"resource": resource(service), "scopeMetrics": [{"scope": scope(), "metrics": metrics}]}]})
}
