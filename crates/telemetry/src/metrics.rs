//! The Prometheus text exposition `/metrics` serves (crates/runtime/src/http/metrics.rs), read
//! back as metrics for OTLP: the same numbers under the same names, from one renderer.

/// How a metric adds up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `# TYPE … counter`, and a summary's `_sum` / `_count`: a cumulative monotonic sum.
    Counter,
    /// Everything else: the value now.
    Gauge,
}

/// One sample of a metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// One metric with its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub points: Vec<Point>,
}

/// Series read at most (the text is ours, but bound it anyway).
const MAX_SERIES: usize = 4096;

/// Parses the text exposition; lines it does not understand are skipped.
pub fn parse(text: &str) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::new();
    let mut types: Vec<(String, String, String)> = Vec::new(); // (family, type, help)
    let mut help: Option<(String, String)> = None;
    let mut series = 0usize;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name.to_owned(), h.to_owned()));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let h = help.take().filter(|(n, _)| n == name).map(|(_, h)| h).unwrap_or_default();
            types.push((name.to_owned(), ty.trim().to_owned(), h));
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() || series >= MAX_SERIES {
            continue;
        }
        let Some((name, labels, value)) = sample(line) else { continue };
        series += 1;
        let family = types.iter().find(|(f, _, _)| {
            *f == name || name.strip_prefix(f.as_str()).is_some_and(|s| s == "_sum" || s == "_count")
        });
        let (kind, help) = match family {
            Some((f, ty, h)) if ty == "counter" || (ty == "summary" && *f != name) => (Kind::Counter, h.clone()),
            Some((_, _, h)) => (Kind::Gauge, h.clone()),
            None => (Kind::Gauge, String::new()),
        };
        let point = Point { labels, value };
        match out.iter_mut().find(|m| m.name == name) {
            Some(m) => m.points.push(point),
            None => out.push(Metric { name: name.to_owned(), help, kind, points: vec![point] }),
        }
    }
    out
}

/// A sample's labels, in order.
type Labels = Vec<(String, String)>;

/// `name{a="x",b="y"} value` → its parts.
fn sample(line: &str) -> Option<(&str, Labels, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.trim().parse().ok()?;
    let Some((name, rest)) = head.split_once('{') else { return Some((head.trim(), Vec::new(), value)) };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut val = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').trim().to_owned(), val));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_summaries() {
        let text = "# HELP a_total Runs.\n# TYPE a_total counter\na_total{outcome=\"ok\"} 3\na_total{outcome=\"failed\"} 1\n\
                    # HELP g Gauge.\n# TYPE g gauge\ng{state=\"run\\\"ning\",x=\"1\"} 2.5\n\
                    # HELP d Drains.\n# TYPE d summary\nd_sum 1.500\nd_count 2\nbare 7\n";
        let m = parse(text);
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a_total", "g", "d_sum", "d_count", "bare"]);
        assert_eq!((m[0].kind, m[0].points.len(), m[0].help.as_str()), (Kind::Counter, 2, "Runs."));
        assert_eq!(m[0].points[1].labels, [("outcome".to_owned(), "failed".to_owned())]);
        assert_eq!(m[1].kind, Kind::Gauge);
        assert_eq!(
            m[1].points[0].labels,
            [("state".to_owned(), "run\"ning".to_owned()), ("x".to_owned(), "1".to_owned())]
        );
        assert_eq!(m[1].points[0].value, 2.5);
        assert_eq!((m[2].kind, m[3].kind, m[3].points[0].value), (Kind::Counter, Kind::Counter, 2.0));
        assert_eq!(m[4].kind, Kind::Gauge);
    }
}
