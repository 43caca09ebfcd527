//! One file per verb; [`dispatch`] is the table of contents.

mod check;
mod crash_backoff;
pub mod doctor;
mod hermes;
mod history;
mod intent;
mod logs;
mod manager;
mod os;
mod presence;
mod progress;
mod restart;
mod run;
mod send;
pub mod service;
mod start;
mod status;
mod stop;
pub mod supervise;
pub mod update;

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use gatewarden_lifecycle::Home;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli, started_at: SystemTime, started: Instant) -> anyhow::Result<ExitCode> {
    // A hermes-agent home: flag, env, or a `--home` whose records say hermes (cmd/hermes.rs).
    let env = |k: &str| std::env::var_os(k);
    if let Some((h, by)) = gatewarden_hermes::home::select(cli.hermes_home.as_deref(), cli.home.as_deref(), env) {
        return hermes::dispatch(h, by, cli.command);
    }
    let home = Home::resolve(cli.home)?;
    intent::set_issued(started_at);
    match cli.command {
        Command::Run(args) => Ok(run::run(home, args, started_at, started)),
        Command::Status { json } => status::status(&home, json),
        Command::Stop { timeout, no_kill } => stop::stop(&home, timeout, no_kill),
        Command::Start { listen, timeout, drain_timeout, desired_seq } => {
            start::start(&home, listen.as_deref(), timeout, drain_timeout, desired_seq)
        }
        Command::Restart { timeout, backstop, desired_seq } => restart::restart(&home, timeout, backstop, desired_seq),
        Command::Send { text, chat, user, is_async } => send::send(&home, &text, &chat, &user, is_async),
        Command::Logs { follow, n } => logs::logs(&home, follow, n),
        Command::History { n, json } => history::history(&home, n, json),
        Command::Service(args) => service::service(&home, args),
        Command::Supervise(args) => supervise::supervise(&home, args),
        Command::Doctor(args) => doctor::doctor(&home, &args),
        Command::Check { target, json } => check::check(&home, target.as_deref(), json),
        Command::Update(args) => update::update(&home, args),
        Command::CrashBackoff => crash_backoff::crash_backoff(&home),
    }
}
