//! The fake WhatsApp Cloud API of crates/testkit/src/whatsappfake.rs as a process, for
//! scripts/bench-platforms. Prints `listening <api_base> <phone_number_id> <version> <token>
//! <app_secret> <verify_token>`, then answers one line per command read from stdin:
//!
//! - `webhook <url>` → `ok` (where notifications are POSTed)
//! - `msg <from> <text…>` → `ok <wamid>` (a customer's text)
//! - `posted` → `posted <n>` (texts sent so far)
//! - `stats` → `stats <posts> <redeliveries> <pending>`
//!
//! It exits when stdin closes.

#[cfg(unix)]
fn main() {
    use gatewarden_testkit::whatsappfake::{FakeWhatsapp, Options};
    use std::io::{BufRead, Write};
    let fake = match FakeWhatsapp::start(Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("whatsapp-fake: {e}");
            std::process::exit(1);
        }
    };
    let o = fake.options();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "listening {} {} {} {} {} {}",
        fake.api_base(),
        o.phone_number_id,
        o.version,
        o.token,
        o.app_secret,
        o.verify_token
    );
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.splitn(3, ' ');
        let answer = match (words.next(), words.next(), words.next()) {
            (Some("webhook"), Some(url), None) => {
                fake.set_webhook(url);
                "ok".to_owned()
            }
            (Some("msg"), Some(from), Some(text)) => format!("ok {}", fake.message(from, text)),
            (Some("posted"), ..) => format!("posted {}", fake.posted().len()),
            (Some("stats"), ..) => {
                let s = fake.stats();
                format!("stats {} {} {}", s.posts, s.redeliveries, s.pending)
            }
            _ => format!("error unknown command {line:?}"),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}

#[cfg(not(unix))]
fn main() {
    eprintln!("whatsapp-fake: Unix only");
    std::process::exit(1);
}
