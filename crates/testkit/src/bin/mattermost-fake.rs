//! The fake Mattermost of crates/testkit/src/mattermostfake.rs as a process, for
//! scripts/bench-platforms. Prints `listening <server> <token>`, then answers one line per
//! command read from stdin:
//!
//! - `msg <channel> <user> <text…>` → `ok <post_id>` (a user's post)
//! - `posted` → `posted <n>` (the bot's posts so far)
//! - `stats` → `stats <connections> <since_calls> <channel_lists> <events>`
//!
//! It exits when stdin closes.

#[cfg(unix)]
fn main() {
    use gatewarden_testkit::mattermostfake::{FakeMattermost, Options};
    use std::io::{BufRead, Write};
    let fake = match FakeMattermost::start(Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mattermost-fake: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening {} {}", fake.server(), fake.options().token);
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.splitn(4, ' ');
        let answer = match (words.next(), words.next(), words.next(), words.next()) {
            (Some("msg"), Some(ch), Some(user), Some(text)) => format!("ok {}", fake.user_post(ch, user, text, None)),
            (Some("posted"), ..) => format!("posted {}", fake.bot_posts().len()),
            (Some("stats"), ..) => {
                let s = fake.stats();
                format!("stats {} {} {} {}", s.connections, s.since_calls, s.channel_lists, s.events)
            }
            _ => format!("error unknown command {line:?}"),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}

#[cfg(not(unix))]
fn main() {
    eprintln!("mattermost-fake: Unix only");
    std::process::exit(1);
}
