//! A tolerant reader for systemd unit files.
//!
//! Accepts what systemd accepts and shrugs at what it would warn about: comments (`#`, `;`),
//! blank lines, whitespace around `=`, backslash line continuations, repeated sections (as in
//! `systemctl cat` output, where drop-ins follow the main file) and junk lines (skipped).
//! Passing `systemctl cat <unit>` output therefore checks the *effective* configuration,
//! drop-ins included.
//!
//! Value semantics follow systemd: most settings are "last assignment wins"; list settings
//! (`Environment=`, the `*ExitStatus=` lists, `After=`, …) accumulate, and an empty assignment
//! resets the list.

/// One `Key=Value` line, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEntry {
    /// Section name without brackets, e.g. `Service`.
    pub section: String,
    /// Key, e.g. `ExecStart`.
    pub key: String,
    /// Raw value with surrounding whitespace trimmed.
    pub value: String,
}

/// A parsed unit: every assignment in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedUnit {
    /// All assignments, in file order.
    pub entries: Vec<UnitEntry>,
}

/// Settings whose assignments accumulate instead of replacing each other.
const LIST_KEYS: &[&str] = &[
    "Environment",
    "SuccessExitStatus",
    "RestartForceExitStatus",
    "RestartPreventExitStatus",
    "After",
    "Before",
    "Wants",
    "Requires",
    "WantedBy",
    "RequiredBy",
    "ExecStartPre",
    "ExecStartPost",
    "ExecStopPost",
    "LoadCredential",
];

/// Whether `key` is a list setting (accumulates, empty resets).
#[must_use]
pub fn is_list_key(key: &str) -> bool {
    LIST_KEYS.contains(&key)
}

/// Parses unit text. Never fails: unparseable lines are skipped.
#[must_use]
pub fn parse_unit(text: &str) -> ParsedUnit {
    let mut entries = Vec::new();
    let mut section: Option<String> = None;
    let mut pending: Option<String> = None;
    for raw in text.lines() {
        // Continuation: a trailing backslash joins the next line with a space.
        let line = match pending.take() {
            Some(mut acc) => {
                let t = raw.trim_start();
                if t.starts_with('#') || t.starts_with(';') {
                    // systemd ignores comment lines inside a continuation.
                    pending = Some(acc);
                    continue;
                }
                acc.push(' ');
                acc.push_str(t);
                acc
            }
            None => raw.to_owned(),
        };
        if let Some(stripped) = line.trim_end().strip_suffix('\\') {
            pending = Some(stripped.to_owned());
            continue;
        }
        handle_line(&line, &mut section, &mut entries);
    }
    if let Some(rest) = pending {
        handle_line(&rest, &mut section, &mut entries);
    }
    ParsedUnit { entries }
}

fn handle_line(line: &str, section: &mut Option<String>, entries: &mut Vec<UnitEntry>) {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
        return;
    }
    if let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        *section = Some(name.trim().to_owned());
        return;
    }
    let (Some(sec), Some((k, v))) = (section.as_ref(), t.split_once('=')) else {
        return;
    };
    let key = k.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return;
    }
    entries.push(UnitEntry { section: sec.clone(), key: key.to_owned(), value: v.trim().to_owned() });
}

impl ParsedUnit {
    /// The effective value of a scalar setting (last assignment wins).
    #[must_use]
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.entries.iter().rev().find(|e| e.section == section && e.key == key).map(|e| e.value.as_str())
    }

    /// The effective values of a list setting: accumulated assignments, an empty assignment
    /// clearing everything before it. `None` when the key never appears.
    #[must_use]
    pub fn get_list(&self, section: &str, key: &str) -> Option<Vec<&str>> {
        let mut seen = false;
        let mut out = Vec::new();
        for e in self.entries.iter().filter(|e| e.section == section && e.key == key) {
            seen = true;
            if e.value.is_empty() {
                out.clear();
            } else {
                out.push(e.value.as_str());
            }
        }
        seen.then_some(out)
    }

    /// Distinct `(section, key)` pairs in first-appearance order.
    #[must_use]
    pub fn keys(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for e in &self.entries {
            let k = (e.section.as_str(), e.key.as_str());
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sections_keys_and_comments() {
        let u = parse_unit(
            "# header\n[Unit]\nDescription = hello world \n; c\n[Service]\nType=notify\n\
             junk line\n=novalue\nExecStart=/bin/a \\\n  --flag \\\n# inner comment\n  x\n",
        );
        assert_eq!(u.get("Unit", "Description"), Some("hello world"));
        assert_eq!(u.get("Service", "Type"), Some("notify"));
        assert_eq!(u.get("Service", "ExecStart"), Some("/bin/a  --flag  x"));
        assert_eq!(u.get("Service", "Missing"), None);
    }

    #[test]
    fn last_wins_and_lists_accumulate_with_reset() {
        let u = parse_unit(
            "[Service]\nTimeoutStopSec=10\nSuccessExitStatus=1\n[Service]\nTimeoutStopSec=90\n\
             SuccessExitStatus=\nSuccessExitStatus=75\nSuccessExitStatus=76\n",
        );
        assert_eq!(u.get("Service", "TimeoutStopSec"), Some("90"));
        assert_eq!(u.get_list("Service", "SuccessExitStatus"), Some(vec!["75", "76"]));
        assert_eq!(u.get_list("Service", "Environment"), None);
    }

    #[test]
    fn garbage_never_panics() {
        for text in ["", "[", "]", "[[x]]\n=\n==\n", "\\", "[S]\nK=\\", "\u{feff}[S]\nK=v"] {
            let _ = parse_unit(text).keys();
        }
    }
}
