//! Release versions: what a binary's `--version` says, and whether one release is newer than
//! another (semver order). Pure.

pub(super) fn parse_version(out: &str) -> Option<String> {
    let v = out.trim().strip_prefix("gatewarden ")?.trim();
    let ok = !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || ".-+_".contains(c));
    ok.then(|| v.to_owned())
}

/// Why installing `candidate` over `running` is a downgrade that needs `--allow-downgrade`:
/// older, or not comparable (a downgrade cannot be ruled out). `None`: it is newer.
pub(super) fn downgrade_refusal(running: &str, candidate: &str) -> Option<String> {
    let how = match compare_versions(candidate, running) {
        Some(std::cmp::Ordering::Greater) => return None,
        Some(_) => format!("release {candidate} is not newer than the running {running}"),
        None => format!("cannot tell whether release {candidate} is newer than the running {running}"),
    };
    Some(format!(
        "{how}: a downgrade needs `update --allow-downgrade` on the command line (chat /update never downgrades; \
         `update --rollback` returns to the last known good binary)"
    ))
}

/// Orders two versions `MAJOR.MINOR.PATCH[-PRE][+BUILD]` as semver does (build metadata
/// ignored, a pre-release before its release); `None` when either is not such a version.
pub(super) fn compare_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    fn parse(v: &str) -> Option<(Vec<u64>, Option<&str>)> {
        let v = v.split('+').next()?;
        let (core, pre) = match v.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (v, None),
        };
        let nums: Vec<u64> = core.split('.').map(|n| n.parse().ok()).collect::<Option<_>>()?;
        (!nums.is_empty() && nums.len() <= 4).then_some((nums, pre))
    }
    fn pre_cmp(a: &str, b: &str) -> Ordering {
        let mut x = a.split('.');
        let mut y = b.split('.');
        loop {
            match (x.next(), y.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some(p), Some(q)) => {
                    let o = match (p.parse::<u64>(), q.parse::<u64>()) {
                        (Ok(m), Ok(n)) => m.cmp(&n),
                        (Ok(_), Err(_)) => Ordering::Less,
                        (Err(_), Ok(_)) => Ordering::Greater,
                        (Err(_), Err(_)) => p.cmp(q),
                    };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
            }
        }
    }
    let (an, ap) = parse(a)?;
    let (bn, bp) = parse(b)?;
    let width = an.len().max(bn.len());
    let pad = |v: &[u64]| (0..width).map(|i| v.get(i).copied().unwrap_or(0)).collect::<Vec<_>>();
    Some(pad(&an).cmp(&pad(&bn)).then_with(|| match (ap, bp) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(p), Some(q)) => pre_cmp(p, q),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_semver_and_downgrades_are_named() {
        use std::cmp::Ordering::*;
        for (a, b, o) in [
            ("0.1.0", "0.0.9", Greater),
            ("0.10.0", "0.9.0", Greater),
            ("1.0", "1.0.0", Equal),
            ("1.0.0-rc.1", "1.0.0", Less),
            ("1.0.0-rc.2", "1.0.0-rc.10", Less),
            ("1.0.0-alpha", "1.0.0-1", Greater),
            ("1.0.0+abc", "1.0.0+def", Equal),
        ] {
            assert_eq!(compare_versions(a, b), Some(o), "{a} vs {b}");
            assert_eq!(compare_versions(b, a), Some(o.reverse()), "{b} vs {a}");
        }
        assert_eq!(compare_versions("dev", "0.1.0"), None);
        assert_eq!(downgrade_refusal("0.1.0", "0.2.0"), None);
        assert!(downgrade_refusal("0.1.0", "0.0.1").is_some_and(|w| w.contains("--allow-downgrade")));
        assert!(downgrade_refusal("0.1.0", "nightly").is_some_and(|w| w.contains("cannot tell")));
    }

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(parse_version("gatewarden 0.2.0-rc1\n").as_deref(), Some("0.2.0-rc1"));
        assert_eq!(parse_version("gatewarden \n"), None);
        assert_eq!(parse_version("other 1.0"), None);
        assert_eq!(parse_version("gatewarden 1.0; rm -rf /"), None);
    }
}
