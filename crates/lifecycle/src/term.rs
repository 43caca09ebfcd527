//! Outside text on its way to a terminal: chat messages, an agent's stderr and log lines can
//! carry escape sequences (`ESC ] 0 ; … BEL` retitles the window, `ESC [ 2 J` clears it, some
//! terminals answer queries into the input). Control characters are shown escaped instead.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as itself: C0 and C1 controls and DEL (a tab is
/// kept), and the bidirectional overrides and isolates that reorder what is shown.
pub fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\t') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every [`is_unsafe`] character written as an escape (`\x1b`, `\u{9b}`, `\n`): one
/// line of plain text, whatever `s` holds. Borrowed when nothing needed escaping.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_unsafe(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_reach_the_terminal_as_text() {
        assert!(matches!(escape("plain text\twith a tab, ünïcode"), Cow::Borrowed(_)));
        assert_eq!(escape("\u{1b}]0;pwned\u{7}\u{1b}[2J"), "\\x1b]0;pwned\\x07\\x1b[2J");
        assert_eq!(escape("a\r\nb\u{7f}"), "a\\r\\nb\\x7f");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert!(!escape("\u{1b}\u{0}\u{85}\u{2066}").chars().any(is_unsafe));
    }
}
