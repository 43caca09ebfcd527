//! Routing for a hermes-agent home (`--hermes-home DIR`, `GATEWARDEN_HERMES_HOME`, or a
//! `--home` whose lock record says `"kind": "hermes-gateway"`): the same verbs, each to its
//! function in `gatewarden_ops::hermes`; native-only verbs and flags are refused by name.

use std::process::ExitCode;

use gatewarden_hermes::{HermesHome, SelectedBy};
use gatewarden_ops::hermes::{self as h, refuse_native};

use crate::cli::Command;

/// Routes one verb for a hermes home.
pub fn dispatch(home: HermesHome, by: SelectedBy, command: Command) -> anyhow::Result<ExitCode> {
    if by == SelectedBy::Recognised {
        gatewarden_ops::errln!(
            "note: {} is a hermes-agent home (its records say \"kind\": \"hermes-gateway\"); managing it as --hermes-home",
            home.dir().display()
        );
    }
    if !matches!(command, Command::Dashboard { .. }) {
        h::check_home(&home)?;
    }
    Ok(match command {
        Command::Status { json } => h::status(&home, json)?,
        Command::Stop { timeout, no_kill, json } => {
            refuse_native("stop", &[("--json", json)])?;
            h::stop(&home, timeout, no_kill)?
        }
        Command::Start { listen, timeout, drain_timeout, json, .. } => {
            refuse_native(
                "start",
                &[("--listen", listen.is_some()), ("--drain-timeout", drain_timeout.is_some()), ("--json", json)],
            )?;
            h::start(&home, timeout)?
        }
        Command::Restart { timeout, backstop, json, .. } => {
            refuse_native("restart", &[("--backstop", backstop.is_some()), ("--json", json)])?;
            h::restart(&home, timeout)?
        }
        Command::Supervise(args) => h::supervise(&home, args.into())?,
        Command::Logs { follow, n, json } => {
            refuse_native("logs", &[("--json", json)])?;
            h::logs(&home, follow, n)?
        }
        Command::History { n, json } => h::history(&home, n, json)?,
        Command::Doctor(args) => h::doctor(&home, args.fix, args.json)?,
        Command::Service(args) => {
            let json = match &args.action {
                crate::cli::ServiceAction::Install(i) => i.json,
                crate::cli::ServiceAction::Uninstall(u) => u.json,
                crate::cli::ServiceAction::Status { .. } => false,
            };
            refuse_native("service", &[("--json", json)])?;
            h::service(&home, args.into())?
        }
        Command::Run(_) => anyhow::bail!("`run` is for native homes; for a hermes home use `start` or `supervise`"),
        Command::Reload { .. } => {
            anyhow::bail!("`reload` talks to a native gateway's control endpoint; hermes reads its own files at start")
        }
        Command::Init(_) => anyhow::bail!("`init` sets up a native home; a hermes home is set up by hermes"),
        Command::CancelDrain { .. } => {
            anyhow::bail!(
                "`cancel-drain` talks to a native gateway's control endpoint; a hermes drain cannot be cancelled"
            )
        }
        Command::Send { .. } => anyhow::bail!("`send` talks to a native gateway's control endpoint; hermes has none"),
        Command::Update(_) => {
            anyhow::bail!("`update` replaces gatewarden's own binary; update hermes-agent with `hermes update`")
        }
        Command::Check { .. } => anyhow::bail!("`check` validates a native home; for a hermes home use `doctor`"),
        Command::CrashBackoff => anyhow::bail!("`crash-backoff` belongs to a native home's systemd unit"),
        // `--hermes-home DIR dashboard`: the fleet page, with this hermes home among the rest.
        Command::Dashboard { listen, homes, mut hermes_homes } => {
            hermes_homes.insert(0, home.dir().to_path_buf());
            gatewarden_ops::dashboard::dashboard(gatewarden_ops::dashboard::DashboardArgs {
                listen,
                homes,
                hermes_homes,
            })?
        }
        Command::Top { .. } => anyhow::bail!("`top` shows a native home's snapshot; for a hermes home use `status`"),
        Command::Trace { .. } => anyhow::bail!("`trace` reads a native gateway's journal; hermes keeps none"),
        // Handled before any home is selected (cmd/mod.rs).
        Command::Completions { .. } | Command::Man => anyhow::bail!("about the command line, not a home"),
        Command::Pairing { .. } => {
            anyhow::bail!("`pairing` decides a native gateway's access; for a hermes home use `hermes pairing`")
        }
    })
}
