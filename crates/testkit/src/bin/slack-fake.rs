//! The fake Slack of crates/testkit/src/slackfake.rs as a process, for scripts/bench-platforms.
//! Prints `listening <api_base> <app_token> <bot_token>`, then answers one line per command
//! read from stdin:
//!
//! - `msg <channel> <user> <text…>` → `ok <event_id>` (a user's message)
//! - `posted` → `posted <n>` (posts so far)
//! - `stats` → `stats <max_gap_ms> <lost> <redeliveries> <pending>`
//! - `reset_gap` → `ok`
//!
//! It exits when stdin closes.

#[cfg(unix)]
fn main() {
    use gatewarden_testkit::slackfake::{FakeSlack, Options};
    use std::io::{BufRead, Write};
    let fake = match FakeSlack::start(Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("slack-fake: {e}");
            std::process::exit(1);
        }
    };
    let o = fake.options();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening {} {} {}", fake.api_base(), o.app_token, o.bot_token);
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.splitn(4, ' ');
        let answer = match (words.next(), words.next(), words.next(), words.next()) {
            (Some("msg"), Some(ch), Some(user), Some(text)) => {
                format!("ok {}", fake.user_message(ch, user, text, None))
            }
            (Some("posted"), ..) => format!("posted {}", fake.posted().len()),
            (Some("stats"), ..) => {
                let s = fake.stats();
                format!("stats {} {} {} {}", s.max_gap_ms, s.lost, s.redeliveries, s.pending)
            }
            (Some("reset_gap"), ..) => {
                fake.reset_gap();
                "ok".to_owned()
            }
            _ => format!("error unknown command {line:?}"),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}

#[cfg(not(unix))]
fn main() {
    eprintln!("slack-fake: Unix only");
    std::process::exit(1);
}
