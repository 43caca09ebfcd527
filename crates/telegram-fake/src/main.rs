//! `telegram-fake [--listen ADDR] [--linger-ms N]`: the fake Bot API as a process, for
//! scripts/bench-platforms. Prints `listening http://ADDR` once it accepts, then serves until
//! killed. Test API: `POST /_fake/inject {"token","chat_id","user_id","text"}`,
//! `GET /_fake/sent?token=`, `GET /_fake/stats?token=`, `GET /_fake/actions?token=` (chat
//! actions), `GET /_fake/visible?token=` (the bot's messages as a user sees them now).

use std::time::Duration;

use gatewarden_telegram_fake::{FakeTelegram, Options};

fn main() -> std::process::ExitCode {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        match (a.as_str(), value.as_deref()) {
            ("--listen", Some(v)) => match v.parse() {
                Ok(addr) => opts.addr = addr,
                Err(e) => return usage(&format!("--listen {v}: {e}")),
            },
            ("--linger-ms", Some(v)) => match v.parse() {
                Ok(ms) => opts.linger = Duration::from_millis(ms),
                Err(e) => return usage(&format!("--linger-ms {v}: {e}")),
            },
            _ => return usage(&format!("unknown argument {a}")),
        }
    }
    let fake = match FakeTelegram::start(opts) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("telegram-fake: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    println!("listening {}", fake.base_url());
    loop {
        std::thread::park();
    }
}

fn usage(why: &str) -> std::process::ExitCode {
    eprintln!("telegram-fake: {why}\nusage: telegram-fake [--listen ADDR] [--linger-ms N]");
    std::process::ExitCode::from(2)
}
