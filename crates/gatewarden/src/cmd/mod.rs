//! One file per verb; [`dispatch`] is the table of contents.

mod history;
mod logs;
mod presence;
mod progress;
mod restart;
mod run;
mod send;
mod start;
mod status;
mod stop;

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use gatewarden_lifecycle::Home;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli, started_at: SystemTime, started: Instant) -> anyhow::Result<ExitCode> {
    let home = Home::resolve(cli.home)?;
    match cli.command {
        Command::Run(args) => Ok(run::run(home, args, started_at, started)),
        Command::Status { json } => status::status(&home, json),
        Command::Stop { timeout, no_kill } => stop::stop(&home, timeout, no_kill),
        Command::Start { listen, timeout, drain_timeout } => {
            start::start(&home, listen.as_deref(), timeout, drain_timeout)
        }
        Command::Restart { timeout } => restart::restart(&home, timeout),
        Command::Send { text, chat, user, is_async } => send::send(&home, &text, &chat, &user, is_async),
        Command::Logs { follow, n } => logs::logs(&home, follow, n),
        Command::History { n, json } => history::history(&home, n, json),
    }
}
