//! systemd value syntax: argument quoting, command-line splitting and time spans.
//!
//! Quoting follows `systemd.service(5)` "Command lines" and `systemd.syntax(7)`:
//! - a word is quoted with double quotes when it holds anything outside a conservative safe
//!   set, and inside quotes `\` and `"` are backslash-escaped (C-style unescaping applies);
//! - `%` starts a specifier everywhere, so a literal one is `%%`;
//! - `$` starts variable expansion in `ExecStart=` (not in `Environment=`), so a literal one
//!   is `$$`.
//!
//! Splitting is the inverse used by drift detection, and is tolerant: malformed input
//! (an unterminated quote, a dangling backslash) yields the best-effort words, never a panic.

use std::time::Duration;

/// Characters that never need quoting in an `ExecStart=` word.
fn is_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-' | ':' | ',' | '=' | '+' | '@')
}

/// Quotes one `ExecStart=` word (`expand_dollar = true`) or one `Environment=` assignment
/// (`expand_dollar = false`, where `$` is literal).
#[must_use]
pub fn quote_word(word: &str, expand_dollar: bool) -> String {
    let needs_quotes = word.is_empty() || !word.chars().all(is_safe);
    let mut out = String::with_capacity(word.len() + 2);
    if needs_quotes {
        out.push('"');
    }
    for c in word.chars() {
        match c {
            '\\' if needs_quotes => out.push_str(r"\\"),
            '"' if needs_quotes => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if expand_dollar => out.push_str("$$"),
            _ => out.push(c),
        }
    }
    if needs_quotes {
        out.push('"');
    }
    out
}

/// Quotes a whole `ExecStart=` command line.
#[must_use]
pub fn quote_command(words: &[&str]) -> String {
    words.iter().map(|w| quote_word(w, true)).collect::<Vec<_>>().join(" ")
}

/// Splits a command line (or `Environment=` value) into words, undoing quoting, backslash
/// escapes and `%%`/`$$` doubling. Leading `ExecStart=` prefixes (`-`, `@`, `:`, `+`, `!`) on
/// the first word are dropped.
#[must_use]
pub fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('n') => cur.push('\n'),
                    Some('t') => cur.push('\t'),
                    Some(other) => cur.push(other),
                    None => {}
                }
            }
            '%' | '$' if chars.peek() == Some(&c) => {
                chars.next();
                in_word = true;
                cur.push(c);
            }
            '"' | '\'' if quote == Some(c) => quote = None,
            '"' | '\'' if quote.is_none() => {
                quote = Some(c);
                in_word = true;
            }
            c if c.is_whitespace() && quote.is_none() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    if let Some(first) = words.first_mut() {
        let stripped = first.trim_start_matches(['-', '@', ':', '+', '!']);
        if stripped.len() != first.len() {
            *first = stripped.to_owned();
        }
    }
    words
}

/// A parsed `systemd.time(7)` span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimeSpan {
    /// A finite duration.
    Finite(Duration),
    /// `infinity`.
    Infinity,
}

/// Parses a time span such as `100ms`, `70`, `1min 30s`, `2h`, `infinity`. A bare number is
/// seconds. Returns `None` for anything unparseable.
#[must_use]
pub fn parse_timespan(s: &str) -> Option<TimeSpan> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("infinity") {
        return Some(TimeSpan::Infinity);
    }
    if s.is_empty() {
        return None;
    }
    let mut total_us: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let number: f64 = rest[..num_end].parse().ok()?;
        rest = rest[num_end..].trim_start();
        let unit_end = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let us_per: f64 = match unit {
            "" | "s" | "sec" | "second" | "seconds" => 1e6,
            "us" | "usec" | "µs" => 1.0,
            "ms" | "msec" => 1e3,
            "m" | "min" | "minute" | "minutes" => 60e6,
            "h" | "hr" | "hour" | "hours" => 3600e6,
            "d" | "day" | "days" => 86_400e6,
            "w" | "week" | "weeks" => 604_800e6,
            "M" | "month" | "months" => 2_629_800e6,
            "y" | "year" | "years" => 31_557_600e6,
            _ => return None,
        };
        let part = number * us_per;
        if !part.is_finite() || part < 0.0 {
            return None;
        }
        // Float-to-int `as` saturates, so an absurd span clamps instead of wrapping, and
        // sub-microsecond precision is meaningless here.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let part = part as u128;
        total_us = total_us.saturating_add(part);
    }
    let us = u64::try_from(total_us).unwrap_or(u64::MAX);
    Some(TimeSpan::Finite(Duration::from_micros(us)))
}

/// Renders milliseconds the way the generator writes `RestartSec=`: `100ms`, `2s`.
#[must_use]
pub fn format_ms(ms: u64) -> String {
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_words_stay_bare() {
        assert_eq!(quote_word("/usr/bin/gatewarden", true), "/usr/bin/gatewarden");
        assert_eq!(quote_word("--home", true), "--home");
    }

    #[test]
    fn specials_are_quoted_and_escaped() {
        assert_eq!(quote_word("", true), "\"\"");
        assert_eq!(quote_word("a b", true), "\"a b\"");
        assert_eq!(quote_word("50%", true), "\"50%%\"");
        assert_eq!(quote_word("$HOME", true), "\"$$HOME\"");
        assert_eq!(quote_word("$HOME", false), "\"$HOME\"");
        assert_eq!(quote_word(r#"say "hi"\"#, true), r#""say \"hi\"\\""#);
        assert_eq!(quote_word("it's", true), "\"it's\"");
    }

    #[test]
    fn split_inverts_quote() {
        let words = ["/opt/My App/gw", "run", "--home", "/h/50% $x \"q\" \\", "", "it's"];
        let line = quote_command(&words);
        assert_eq!(split_words(&line), words);
    }

    #[test]
    fn split_is_tolerant() {
        assert_eq!(split_words("-/bin/x a"), ["/bin/x", "a"]);
        assert_eq!(split_words("\"unterminated a"), ["unterminated a"]);
        assert_eq!(split_words("dangling\\"), ["dangling"]);
        assert_eq!(split_words("  "), Vec::<String>::new());
        assert_eq!(split_words("'single quoted' x"), ["single quoted", "x"]);
    }

    #[test]
    fn timespans_parse() {
        let f = |ms| Some(TimeSpan::Finite(Duration::from_millis(ms)));
        assert_eq!(parse_timespan("100ms"), f(100));
        assert_eq!(parse_timespan("70"), f(70_000));
        assert_eq!(parse_timespan("1min 30s"), f(90_000));
        assert_eq!(parse_timespan("1min30s"), f(90_000));
        assert_eq!(parse_timespan("0.5s"), f(500));
        assert_eq!(parse_timespan("2h"), f(7_200_000));
        assert_eq!(parse_timespan("infinity"), Some(TimeSpan::Infinity));
        assert_eq!(parse_timespan(""), None);
        assert_eq!(parse_timespan("soon"), None);
        assert_eq!(parse_timespan("5 parsecs"), None);
        assert!(parse_timespan("99999999999999999999999y").is_some());
    }

    #[test]
    fn format_ms_is_compact() {
        assert_eq!(format_ms(100), "100ms");
        assert_eq!(format_ms(2000), "2s");
        assert_eq!(format_ms(0), "0s");
    }
}
