//! The table of contents: each verb goes to one function of the operations crate
//! (crates/ops), which does the work and says what it did; `run` and the hermes routing are
//! the two files here.

mod hermes;
mod run;

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use gatewarden_lifecycle::Home;
use gatewarden_ops as ops;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli, started_at: SystemTime, started: Instant) -> anyhow::Result<ExitCode> {
    // A hermes-agent home: flag, env, or a `--home` whose records say hermes (cmd/hermes.rs).
    let env = |k: &str| std::env::var_os(k);
    if let Some((h, by)) = gatewarden_hermes::home::select(cli.hermes_home.as_deref(), cli.home.as_deref(), env) {
        return hermes::dispatch(h, by, cli.command);
    }
    let home = Home::resolve(cli.home)?;
    ops::intent::set_issued(started_at);
    Ok(match cli.command {
        Command::Run(args) => run::run(home, args, started_at, started),
        Command::Status { json } => ops::status::status(&home, json)?,
        Command::Stop { timeout, no_kill } => ops::stop::stop(&home, timeout, no_kill)?,
        Command::Start { listen, timeout, drain_timeout, desired_seq } => {
            ops::start::start(&home, listen.as_deref(), timeout, drain_timeout, desired_seq)?
        }
        Command::Restart { timeout, backstop, desired_seq } => {
            ops::restart::restart(&home, timeout, backstop, desired_seq)?
        }
        Command::CancelDrain => ops::cancel::cancel_drain(&home)?,
        Command::Send { text, chat, user, is_async } => ops::send::send(&home, &text, &chat, &user, is_async)?,
        Command::Logs { follow, n } => ops::logs::logs(&home, follow, n)?,
        Command::History { n, json } => ops::history::history(&home, n, json)?,
        Command::Trace { id, json } => ops::trace::trace(&home, &id, json)?,
        Command::Service(args) => ops::service::service(&home, args.into())?,
        Command::Supervise(args) => ops::supervise::supervise(&home, args.into())?,
        Command::Doctor(args) => ops::doctor::doctor(&home, args.fix, args.json)?,
        Command::Check { target, json } => ops::check::check(&home, target.as_deref(), json)?,
        Command::Update(args) => ops::update::update(&home, args.into())?,
        Command::CrashBackoff => ops::crash_backoff::crash_backoff(&home)?,
        Command::Dashboard { listen, homes, hermes_homes } => {
            ops::dashboard::dashboard(ops::dashboard::DashboardArgs { listen, homes, hermes_homes })?
        }
        Command::Top { once, n } => ops::dashboard::top(&home, once, n)?,
    })
}
