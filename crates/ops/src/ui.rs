//! How every verb talks to whoever ran it (README, "CLI"): results on stdout, progress and
//! notes on stderr; colour only where a person reads it (`--color`, `NO_COLOR`); and with
//! `--json`, one JSON document (or JSON lines) alone on stdout.
//!
//! The lifecycle verbs (`start`, `stop`, `restart`, `cancel-drain`, `service install`,
//! `service uninstall`) say what they do in lines written as they go; with `--json`,
//! `outcome::outcome` (crates/ops/src/outcome.rs) points stdout at stderr for the verb's whole run (so no line of it can land in
//! the document, whoever prints it, children included) and writes the document, the verb's
//! exit code and the status it left, to the original stdout at the end (docs/protocol.md §6.3).

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::OnceLock;

use serde_json::Value;

/// `--color`: `auto` (a terminal without `NO_COLOR`), `always`, `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

static COLOR: OnceLock<ColorChoice> = OnceLock::new();

/// The binary's choice, once, before the verb runs.
pub fn set_color(choice: ColorChoice) {
    let _ = COLOR.set(choice);
}

/// Pure: whether to colour a stream. `always`/`never` win; `auto` colours a terminal unless
/// `NO_COLOR` is set to anything but the empty string (https://no-color.org) or `TERM=dumb`.
pub fn colour_wanted(choice: ColorChoice, terminal: bool, no_color: Option<&str>, term: Option<&str>) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => terminal && no_color.is_none_or(str::is_empty) && term != Some("dumb"),
    }
}

fn colour_on(terminal: bool) -> bool {
    let env = |k: &str| std::env::var(k).ok();
    colour_wanted(
        COLOR.get().copied().unwrap_or_default(),
        terminal,
        env("NO_COLOR").as_deref(),
        env("TERM").as_deref(),
    )
}

/// What a word in a line means; its colour follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Good,
    Warn,
    Bad,
    Dim,
}

impl Tone {
    fn sgr(self) -> &'static str {
        match self {
            Tone::Good => "32",
            Tone::Warn => "33",
            Tone::Bad => "1;31",
            Tone::Dim => "2",
        }
    }
}

/// `text` for stdout, coloured when stdout is shown to a person.
pub fn paint(tone: Tone, text: &str) -> Cow<'_, str> {
    paint_if(colour_on(std::io::stdout().is_terminal()), tone, text)
}

/// `text` for stderr, coloured when stderr is shown to a person.
pub fn paint_err(tone: Tone, text: &str) -> Cow<'_, str> {
    paint_if(colour_on(std::io::stderr().is_terminal()), tone, text)
}

/// Pure: `text` in `tone` when `on`.
pub fn paint_if(on: bool, tone: Tone, text: &str) -> Cow<'_, str> {
    match on {
        true => Cow::Owned(format!("\u{1b}[{}m{text}\u{1b}[0m", tone.sgr())),
        false => Cow::Borrowed(text),
    }
}

/// The tone of a gateway or adapter state word.
pub fn state_tone(state: &str) -> Tone {
    match state {
        "running" | "connected" | "healthy" | "ok" => Tone::Good,
        "degraded" | "draining" | "starting" | "stopping" | "connecting" | "standby" | "cooling_down" | "failing"
        | "warning" => Tone::Warn,
        "parked" | "unresponsive" | "failed" | "error" => Tone::Bad,
        _ => Tone::Dim,
    }
}

/// `ExitCode` has no getter: the byte it was made from.
pub fn code_of(code: ExitCode) -> u8 {
    (0..=255u8).find(|n| ExitCode::from(*n) == code).unwrap_or(1)
}

/// Writes one JSON document, then a newline, to stdout (pretty when a person reads it).
pub fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let text = match out.is_terminal() {
        true => serde_json::to_string_pretty(v),
        false => serde_json::to_string(v),
    }
    .unwrap_or_else(|_| "null".into());
    // A reader that went away wants nothing more: not an error of the verb.
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_a_person_unless_asked() {
        use ColorChoice::*;
        assert!(colour_wanted(Auto, true, None, Some("xterm")));
        assert!(!colour_wanted(Auto, false, None, Some("xterm")), "piped");
        assert!(!colour_wanted(Auto, true, Some("1"), None), "NO_COLOR");
        assert!(colour_wanted(Auto, true, Some(""), None), "an empty NO_COLOR is unset");
        assert!(!colour_wanted(Auto, true, None, Some("dumb")));
        assert!(colour_wanted(Always, false, Some("1"), Some("dumb")), "--color always wins");
        assert!(!colour_wanted(Never, true, None, None));
        assert_eq!(paint_if(false, Tone::Bad, "x"), "x");
        assert_eq!(paint_if(true, Tone::Good, "ok"), "\u{1b}[32mok\u{1b}[0m");
    }

    #[test]
    fn exit_codes_read_back() {
        for n in [0u8, 1, 3, 75, 78, 255] {
            assert_eq!(code_of(ExitCode::from(n)), n);
        }
    }
}
