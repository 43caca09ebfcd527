//! Outside text the verbs print (chat messages and replies, an agent's stderr in a failure
//! reason, log lines): on a terminal its control characters are shown escaped
//! (crates/lifecycle/src/term.rs), so a message cannot retitle, clear or drive the operator's
//! terminal; piped or redirected it is written as it is, for tools (README, "CLI").

use std::borrow::Cow;
use std::io::IsTerminal;

/// `s` as stdout may show it; its line breaks are kept (a reply has several lines).
pub fn shown(s: &str) -> Cow<'_, str> {
    if !std::io::stdout().is_terminal() || !s.chars().any(|c| c != '\n' && gatewarden_lifecycle::term::is_unsafe(c)) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.split('\n').map(gatewarden_lifecycle::term::escape).collect::<Vec<_>>().join("\n"))
}
