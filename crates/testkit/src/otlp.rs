//! An OTLP/HTTP receiver for tests (no OpenTelemetry collector runs offline): accepts
//! `POST /v1/traces` and `POST /v1/metrics` with `Content-Type: application/json`, decodes the
//! payloads by the OTLP JSON mapping and checks their shape, and keeps what it decoded.
//!
//! What it models, from the OTLP specification (opentelemetry-proto, "OTLP/HTTP" and "JSON
//! Protobuf Encoding"): the request bodies `ExportTraceServiceRequest` (`resourceSpans[]
//! .scopeSpans[].spans[]`) and `ExportMetricsServiceRequest` (`resourceMetrics[].scopeMetrics[]
//! .metrics[]` with a `sum` or `gauge` of `dataPoints`); `traceId` / `spanId` / `parentSpanId`
//! as hex strings of 16 / 8 bytes (not base64, unlike the generic protobuf JSON mapping);
//! 64-bit times as decimal strings or numbers; a 200 answer with an empty JSON object for a
//! full success, 400 for a payload that cannot be decoded.

use std::collections::BTreeMap;
use std::io::{self, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::netfakes::Listener;
use gatewarden_fakewire::http1;

/// A decoded span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: Option<String>,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: BTreeMap<String, String>,
    /// `status.code`: 0 unset, 1 ok, 2 error.
    pub status: u64,
    /// `status.message`, when given.
    pub status_message: Option<String>,
}

/// A decoded metric data point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub service: String,
    pub metric: String,
    /// `sum` (with monotonic) or `gauge`.
    pub kind: &'static str,
    pub attributes: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Default)]
struct Seen {
    spans: Vec<Span>,
    points: Vec<Point>,
    /// Requests refused, with why.
    refused: Vec<String>,
    requests: usize,
}

/// The receiver; stops accepting when dropped.
pub struct OtlpReceiver {
    listener: Listener,
    seen: Arc<Mutex<Seen>>,
}

impl OtlpReceiver {
    pub fn start() -> io::Result<OtlpReceiver> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = Arc::clone(&seen);
        let listener = Listener::start(move |conn| serve(conn, &s))?;
        Ok(OtlpReceiver { listener, seen })
    }

    /// `http://127.0.0.1:<port>`, for `[telemetry] otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.listener.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.addr
    }

    pub fn spans(&self) -> Vec<Span> {
        self.lock().spans.clone()
    }

    pub fn points(&self) -> Vec<Point> {
        self.lock().points.clone()
    }

    /// Payloads that did not decode, with why: a test asserts there are none.
    pub fn refused(&self) -> Vec<String> {
        self.lock().refused.clone()
    }

    pub fn requests(&self) -> usize {
        self.lock().requests
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn serve(conn: TcpStream, seen: &Mutex<Seen>) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    // Keep-alive: one request after another until the client closes.
    while let Ok(req) = http1::read_request(&mut r, 16 << 20) {
        let (method, path, body) = (req.method.as_str(), req.target.as_str(), req.body.as_slice());
        let header = |name: &str| req.header(name);
        let decoded = if method != "POST" {
            Err(format!("{method} {path}: only POST"))
        } else if !header("content-type").is_some_and(|t| t.starts_with("application/json")) {
            Err(format!("{path}: content-type {:?} is not application/json", header("content-type")))
        } else {
            serde_json::from_slice::<Value>(body).map_err(|e| format!("{path}: not JSON: {e}")).and_then(|v| {
                match path {
                    "/v1/traces" => decode_traces(&v).map(|s| (s, Vec::new())),
                    "/v1/metrics" => decode_metrics(&v).map(|p| (Vec::new(), p)),
                    other => Err(format!("{other}: not an OTLP path")),
                }
            })
        };
        let status = {
            let mut s = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            s.requests += 1;
            match decoded {
                Ok((spans, points)) => {
                    s.spans.extend(spans);
                    s.points.extend(points);
                    200
                }
                Err(why) => {
                    s.refused.push(why);
                    400
                }
            }
        };
        if http1::write_response(&mut w, status, &[("Content-Type", "application/json")], b"{}").is_err() {
            return;
        }
    }
}

fn str_at<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a str, String> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| format!("{what}: {key} missing or not a string: {v}"))
}

fn array<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a Vec<Value>, String> {
    v.get(key).and_then(Value::as_array).ok_or_else(|| format!("{what}: {key} missing or not an array"))
}

/// A 64-bit integer: a decimal string or a number.
fn u64_at(v: &Value, key: &str, what: &str) -> Result<u64, String> {
    match v.get(key) {
        Some(Value::String(s)) => s.parse().map_err(|_| format!("{what}: {key} {s:?} is not a decimal integer")),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("{what}: {key} {n} is not a u64")),
        _ => Err(format!("{what}: {key} missing")),
    }
}

fn hex_id(v: &Value, key: &str, bytes: usize, what: &str) -> Result<String, String> {
    let s = str_at(v, key, what)?;
    if s.len() != bytes * 2 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!("{what}: {key} {s:?} is not {bytes} bytes of lowercase hex"));
    }
    if s.bytes().all(|b| b == b'0') {
        return Err(format!("{what}: {key} is all zeroes (invalid)"));
    }
    Ok(s.to_owned())
}

/// `attributes: [{key, value: {stringValue | intValue | doubleValue | boolValue}}]`.
fn attributes(v: &Value, what: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let Some(list) = v.get("attributes") else { return Ok(out) };
    for a in list.as_array().ok_or_else(|| format!("{what}: attributes is not an array"))? {
        let key = str_at(a, "key", what)?;
        let val = a.get("value").ok_or_else(|| format!("{what}: attribute {key} has no value"))?;
        let text = if let Some(s) = val.get("stringValue").and_then(Value::as_str) {
            s.to_owned()
        } else if let Some(x) = val.get("intValue").or_else(|| val.get("doubleValue")).or_else(|| val.get("boolValue")) {
            x.to_string().trim_matches('"').to_owned()
        } else {
            return Err(format!("{what}: attribute {key} has no known value type: {val}"));
        };
        out.insert(key.to_owned(), text);
    }
    Ok(out)
}

fn service(resource: &Value) -> Result<String, String> {
    let attrs = attributes(resource.get("resource").unwrap_or(&Value::Null), "resource")?;
    attrs.get("service.name").cloned().ok_or_else(|| "resource: no service.name".to_owned())
}

fn decode_traces(v: &Value) -> Result<Vec<Span>, String> {
    let mut out = Vec::new();
    for rs in array(v, "resourceSpans", "request")? {
        let service = service(rs)?;
        for ss in array(rs, "scopeSpans", "resourceSpans")? {
            for s in array(ss, "spans", "scopeSpans")? {
                let name = str_at(s, "name", "span")?.to_owned();
                let what = format!("span {name}");
                let parent = match s.get("parentSpanId").and_then(Value::as_str) {
                    None | Some("") => None,
                    Some(_) => Some(hex_id(s, "parentSpanId", 8, &what)?),
                };
                let (start_ns, end_ns) =
                    (u64_at(s, "startTimeUnixNano", &what)?, u64_at(s, "endTimeUnixNano", &what)?);
                if end_ns < start_ns {
                    return Err(format!("{what}: ends before it starts"));
                }
                out.push(Span {
                    service: service.clone(),
                    trace_id: hex_id(s, "traceId", 16, &what)?,
                    span_id: hex_id(s, "spanId", 8, &what)?,
                    parent,
                    start_ns,
                    end_ns,
                    attributes: attributes(s, &what)?,
                    status: s.pointer("/status/code").and_then(Value::as_u64).unwrap_or(0),
                    status_message: s.pointer("/status/message").and_then(Value::as_str).map(str::to_owned),
                    name,
                });
            }
        }
    }
    Ok(out)
}

fn decode_metrics(v: &Value) -> Result<Vec<Point>, String> {
    let mut out = Vec::new();
    for rm in array(v, "resourceMetrics", "request")? {
        let service = service(rm)?;
        for sm in array(rm, "scopeMetrics", "resourceMetrics")? {
            for m in array(sm, "metrics", "scopeMetrics")? {
                let name = str_at(m, "name", "metric")?.to_owned();
                let (kind, data) = match (m.get("sum"), m.get("gauge")) {
                    (Some(s), None) => ("sum", s),
                    (None, Some(g)) => ("gauge", g),
                    _ => return Err(format!("metric {name}: exactly one of sum or gauge expected")),
                };
                if kind == "sum" && data.get("aggregationTemporality").and_then(Value::as_u64).is_none_or(|t| t == 0) {
                    return Err(format!("metric {name}: a sum needs an aggregationTemporality"));
                }
                for p in array(data, "dataPoints", &name)? {
                    u64_at(p, "timeUnixNano", &name)?;
                    let value = match (p.get("asDouble"), p.get("asInt")) {
                        (Some(d), _) => d.as_f64().ok_or_else(|| format!("metric {name}: asDouble {d}"))?,
                        (None, Some(i)) => {
                            i.as_str().and_then(|s| s.parse::<i64>().ok()).or_else(|| i.as_i64()).ok_or_else(
                                || format!("metric {name}: asInt {i}"),
                            )? as f64
                        }
                        _ => return Err(format!("metric {name}: a data point without a value")),
                    };
                    out.push(Point {
                        service: service.clone(),
                        metric: name.clone(),
                        kind,
                        attributes: attributes(p, &name)?,
                        value,
                    });
                }
            }
        }
    }
    Ok(out)
}
