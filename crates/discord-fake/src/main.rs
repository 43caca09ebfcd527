//! `discord-fake [--token T] [--heartbeat-ms N] [--bucket-limit N] [--bucket-window-ms N]`: the fake Discord as a process, for
//! scripts/bench-platforms. Prints `listening http://ADDR/api/v10` (the `api_base`) once it
//! accepts, then serves until killed. Test API: `POST /_fake/inject {"channel_id","author_id",
//! "content"}`, `GET /_fake/sent`, `GET /_fake/stats[?reset_gap=1]` (`max_resume_gap_ms`: the
//! longest a session went without a connection before its resume, since the last reset).

use std::time::Duration;

use gatewarden_discord_fake::{FakeDiscord, Options};

fn main() -> std::process::ExitCode {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        match (a.as_str(), value.as_deref()) {
            ("--token", Some(v)) => opts.token = v.to_owned(),
            ("--heartbeat-ms", Some(v)) => match v.parse() {
                Ok(ms) => opts.heartbeat_interval = Duration::from_millis(ms),
                Err(e) => return usage(&format!("--heartbeat-ms {v}: {e}")),
            },
            ("--bucket-limit", Some(v)) => match v.parse() {
                Ok(n) => opts.bucket_limit = n,
                Err(e) => return usage(&format!("--bucket-limit {v}: {e}")),
            },
            ("--bucket-window-ms", Some(v)) => match v.parse() {
                Ok(ms) => opts.bucket_window = Duration::from_millis(ms),
                Err(e) => return usage(&format!("--bucket-window-ms {v}: {e}")),
            },
            ("--rest", Some(v)) => match v.parse() {
                Ok(addr) => opts.rest_addr = addr,
                Err(e) => return usage(&format!("--rest {v}: {e}")),
            },
            _ => return usage(&format!("unknown argument {a}")),
        }
    }
    let fake = match FakeDiscord::start(opts) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("discord-fake: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    println!("listening {}", fake.api_base());
    loop {
        std::thread::park();
    }
}

fn usage(why: &str) -> std::process::ExitCode {
    eprintln!(
        "discord-fake: {why}\nusage: discord-fake [--token T] [--heartbeat-ms N] [--bucket-limit N] [--bucket-window-ms N] [--rest ADDR]"
    );
    std::process::ExitCode::from(2)
}
