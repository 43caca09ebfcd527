use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// RFC 3339 UTC with microseconds and `+00:00`, as Python's `isoformat()` writes it.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let micros = d.subsec_micros();
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, dd) = civil_from_days(days);
    format!("{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{micros:06}+00:00", sod / 3600, (sod / 60) % 60, sod % 60)
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

// Howard Hinnant's days_from_civil inverse.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000+00:00");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_964_645_123_456);
        assert_eq!(rfc3339(t), "2026-11-29T15:04:05.123456+00:00");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000+00:00");
    }
}
