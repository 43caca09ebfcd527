//! RFC 3339 timestamps in the form Python's `datetime.isoformat()` writes them
//! (`2026-11-29T15:04:05.123456+00:00`), without a date-time dependency.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (negative before 1970).
pub fn to_micros(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i128,
        Err(e) => -(e.duration().as_micros() as i128),
    }
}

/// The inverse of [`to_micros`]; saturates instead of panicking.
pub fn from_micros(us: i128) -> SystemTime {
    let mag = Duration::from_micros(us.unsigned_abs().min(u64::MAX as u128) as u64);
    if us >= 0 {
        UNIX_EPOCH.checked_add(mag).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(mag).unwrap_or(UNIX_EPOCH)
    }
}

/// Formats `t` as UTC with microseconds and a `+00:00` offset.
pub fn format(t: SystemTime) -> String {
    let us = to_micros(t);
    let secs = us.div_euclid(1_000_000) as i64;
    let frac = us.rem_euclid(1_000_000) as u32;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:06}+00:00", sod / 3600, (sod / 60) % 60, sod % 60)
}

/// Now, formatted.
pub fn now() -> String {
    format(SystemTime::now())
}

/// Parses an RFC 3339 timestamp (`T` or space separator, optional fraction, `Z` or `±HH:MM`).
/// Returns `None` for anything else, including naive timestamps (no offset), which cannot be
/// compared safely.
pub fn parse(s: &str) -> Option<SystemTime> {
    let b = s.trim().as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ') {
        return None;
    }
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut micros: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = &b[start..i.min(start + 6)];
        let mut v: i64 = 0;
        for &c in digits {
            v = v * 10 + i64::from(c - b'0');
        }
        for _ in digits.len()..6 {
            v *= 10;
        }
        micros = v;
    }
    let offset_s: i64 = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if *sign == b'-' { -o } else { o }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    Some(from_micros(i128::from(secs) * 1_000_000 + i128::from(micros)))
}

// Howard Hinnant's civil-calendar algorithms (public domain).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python_isoformat() {
        let t = from_micros(1_764_428_645_123_456);
        assert_eq!(format(t), "2025-11-29T15:04:05.123456+00:00");
        assert_eq!(format(UNIX_EPOCH), "1970-01-01T00:00:00.000000+00:00");
        // 2000-02-29: a leap day of a century year.
        assert_eq!(format(from_micros(951_782_400_000_000)), "2000-02-29T00:00:00.000000+00:00");
        assert_eq!(format(UNIX_EPOCH), "1970-01-01T00:00:00.000000+00:00");
    }

    #[test]
    fn parses_offsets_fractions_and_z() {
        let base = parse("2025-11-29T15:04:05.123456+00:00").unwrap();
        assert_eq!(to_micros(base), 1_764_428_645_123_456);
        assert_eq!(parse("2025-11-29T16:04:05.123456+01:00"), Some(base));
        assert_eq!(to_micros(parse("2025-11-29T15:04:05Z").unwrap()), 1_764_428_645_000_000);
        assert_eq!(to_micros(parse("2025-11-29 15:04:05.5+00:00").unwrap()), 1_764_428_645_500_000);
    }

    #[test]
    fn rejects_naive_and_garbage() {
        for s in [
            "",
            "2025-11-29T15:04:05",
            "yesterday",
            "2025-13-01T00:00:00Z",
            "2025-11-29T15:04:05+0000",
            "２０２５-11-29T15:04:05Z",
        ] {
            assert_eq!(parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn round_trips() {
        for us in [0i128, 1, 999_999, 1_000_000_000_000_000, 4_102_444_800_000_000, -1_000_000] {
            let t = from_micros(us);
            assert_eq!(to_micros(parse(&format(t)).unwrap()), us);
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = parse(&s);
        }
    }
}
