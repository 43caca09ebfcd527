//! The fake signal-cli daemon of crates/testkit/src/signalfake.rs as a process, for
//! scripts/bench-platforms. Prints `listening <api_base> <account>`, then answers one line per
//! command read from stdin:
//!
//! - `msg <from> <text…>` → `ok <id>` (a direct message from number `<from>`)
//! - `sent` → `sent <n>` (messages the daemon sent so far)
//! - `stats` → `stats <lost> <receive_calls> <busy> <queued>`
//!
//! It exits when stdin closes.

#[cfg(unix)]
fn main() {
    use gatewarden_testkit::signalfake::{FakeSignal, Options};
    use std::io::{BufRead, Write};
    let fake = match FakeSignal::start(Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("signal-fake: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening {} {}", fake.base_url(), fake.account());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.splitn(3, ' ');
        let answer = match (words.next(), words.next(), words.next()) {
            (Some("msg"), Some(from), Some(text)) => format!("ok {}", fake.message(from, text)),
            (Some("sent"), ..) => format!("sent {}", fake.sent().len()),
            (Some("stats"), ..) => {
                let s = fake.stats();
                format!("stats {} {} {} {}", s.lost, s.receive_calls, s.busy, s.queued)
            }
            _ => format!("error unknown command {line:?}"),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}

#[cfg(not(unix))]
fn main() {
    eprintln!("signal-fake: Unix only");
    std::process::exit(1);
}
