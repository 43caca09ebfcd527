//! `gatewarden start`: the launcher (`launch.rs`), reporting on stdout (`--json`: one
//! document, `outcome::outcome`).

use std::process::ExitCode;

use gatewarden_lifecycle::Home;

use crate::launch::{Report, Via, launch};

/// `as_before`: what the command line leaves open is taken from the last gateway that ran here
/// (`previous.rs`), as every start that revives one does.
pub fn start(
    home: &Home,
    listen: Option<&str>,
    timeout_s: u64,
    drain_timeout_s: Option<u64>,
    on_behalf: Option<u64>,
    as_before: bool,
    json: bool,
) -> crate::Result<ExitCode> {
    let before = if as_before { crate::previous::of(&home.canonicalized()) } else { Default::default() };
    let listen = listen.or(before.listen.as_deref());
    let drain_timeout_s = drain_timeout_s.or(before.drain_timeout_s);
    crate::outcome::outcome(home, "start", json, || {
        launch(home, listen, timeout_s, drain_timeout_s, on_behalf, Report::Stdout, Via::Owner)
    })
}
