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
        eprintln!(
            "note: {} is a hermes-agent home (its records say \"kind\": \"hermes-gateway\"); managing it as --hermes-home",
            home.dir().display()
        );
    }
    Ok(match command {
        Command::Status { json } => h::status(&home, json)?,
        Command::Stop { timeout, no_kill } => h::stop(&home, timeout, no_kill)?,
        Command::Start { listen, timeout, drain_timeout, .. } => {
            refuse_native("start", &[("--listen", listen.is_some()), ("--drain-timeout", drain_timeout.is_some())])?;
            h::start(&home, timeout)?
        }
        Command::Restart { timeout, backstop, .. } => {
            refuse_native("restart", &[("--backstop", backstop.is_some())])?;
            h::restart(&home, timeout)?
        }
        Command::Supervise(args) => h::supervise(&home, args.into())?,
        Command::Logs { follow, n } => h::logs(&home, follow, n)?,
        Command::History { n, json } => h::history(&home, n, json)?,
        Command::Doctor(args) => h::doctor(&home, args.fix, args.json)?,
        Command::Service(args) => h::service(&home, args.into())?,
        Command::Run(_) => anyhow::bail!("`run` is for native homes; for a hermes home use `start` or `supervise`"),
        Command::CancelDrain => {
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
    })
}
