use std::path::Path;
use std::time::{Duration, SystemTime};

/// RFC 3339 UTC with microseconds and `+00:00`, as Python's `isoformat()` writes it (the
/// gateway's own formatter: every record a test writes must parse as the gateway's do).
pub fn rfc3339(t: SystemTime) -> String {
    gatewarden_lifecycle::timefmt::format(t)
}

pub fn rfc3339_now() -> String {
    rfc3339(SystemTime::now())
}

/// Now plus `offset_secs` (negative: in the past).
pub fn rfc3339_offset(offset_secs: i64) -> String {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs(offset_secs.unsigned_abs())
    };
    rfc3339(t)
}

/// A planned-stop marker (`.gateway-planned-stop.json`, protocol §2.3). `home: None` writes
/// the hermes-style marker without the `home` field. `written_at` is RFC 3339.
pub fn marker_json(target_pid: u32, target_start_time: Option<u64>, home: Option<&Path>, written_at: &str) -> String {
    let mut m = serde_json::json!({
        "target_pid": target_pid,
        "target_start_time": target_start_time,
        "stopper_pid": std::process::id(),
        "stopper_argv": ["gatewarden-testkit", "marker"],
        "written_at": written_at,
    });
    if let Some(h) = home {
        m["home"] = serde_json::Value::String(h.to_string_lossy().into_owned());
    }
    m.to_string()
}
