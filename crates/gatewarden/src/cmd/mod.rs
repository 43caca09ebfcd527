//! The table of contents: each verb goes to one function of the operations crate
//! (crates/ops), which does the work and says what it did; `run` and the hermes routing are
//! the two files here.

mod hermes;
mod run;

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use gatewarden_lifecycle::Home;
use gatewarden_ops as ops;

use crate::cli::{Cli, Command, CompletionShell};

pub fn dispatch(cli: Cli, started_at: SystemTime, started: Instant) -> anyhow::Result<ExitCode> {
    ops::ui::set_color(cli.color.into());
    // About the command line itself: no home needed.
    match cli.command {
        Command::Completions { shell } => return completions(shell),
        Command::Man => return man(),
        _ => {}
    }
    // A hermes-agent home: flag, env, or a `--home` whose records say hermes (cmd/hermes.rs).
    let env = |k: &str| std::env::var_os(k);
    if let Some((h, by)) = gatewarden_hermes::home::select(cli.hermes_home.as_deref(), cli.home.as_deref(), env) {
        return hermes::dispatch(h, by, cli.command);
    }
    let home = Home::resolve(cli.home)?;
    ops::intent::set_issued(started_at);
    Ok(match cli.command {
        Command::Init(args) => ops::init::init(&home, args.into())?,
        Command::Run(args) => run::run(home, args, started_at, started),
        Command::Status { json } => ops::status::status(&home, json)?,
        Command::Stop { timeout, no_kill, json } => ops::stop::stop(&home, timeout, no_kill, json)?,
        Command::Start { listen, timeout, drain_timeout, desired_seq, as_before, json } => {
            ops::start::start(&home, listen.as_deref(), timeout, drain_timeout, desired_seq, as_before, json)?
        }
        Command::Restart { timeout, backstop, desired_seq, json } => {
            ops::restart::restart(&home, timeout, backstop, desired_seq, json)?
        }
        Command::CancelDrain { json } => ops::cancel::cancel_drain(&home, json)?,
        Command::Reload { json } => ops::reload::reload(&home, json)?,
        Command::Send { text, chat, user, is_async, json } => {
            ops::send::send(&home, &text, &chat, &user, is_async, json)?
        }
        Command::Logs { follow, n, json } => ops::logs::logs(&home, follow, n, json)?,
        Command::History { n, json } => ops::history::history(&home, n, json)?,
        Command::Pairing { action } => {
            let (request, json) = action.request();
            ops::pairing::pairing(&home, request, json)?
        }
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
        Command::Top { once, n, json } => ops::top::top(&home, once, n, json)?,
        Command::Completions { shell } => completions(shell)?,
        Command::Man => man()?,
    })
}

/// `completions SHELL`: clap_complete's script for the parser in cli.rs.
fn completions(shell: CompletionShell) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    // Into memory first: clap_complete panics on a failed write (a closed pipe), we report it.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "gatewarden", &mut script);
    print_all(&script)
}

fn print_all(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `man`: gatewarden(1) in roff, with a section per verb, rendered from the same parser.
fn man() -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        use std::io::Write;
        let name = sub.get_name();
        writeln!(out, ".SH \"GATEWARDEN {}\"", name.to_ascii_uppercase())?;
        let sub_man = clap_mangen::Man::new(sub.clone().bin_name(format!("gatewarden {name}")));
        sub_man.render_synopsis_section(&mut out)?;
        sub_man.render_description_section(&mut out)?;
        sub_man.render_options_section(&mut out)?;
    }
    clap_mangen::Man::new(cmd).render_version_section(&mut out)?;
    print_all(&out)
}
