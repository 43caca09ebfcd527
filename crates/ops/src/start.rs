//! `gatewarden start`: the launcher (`launch.rs`), reporting on stdout.

use std::process::ExitCode;

use gatewarden_lifecycle::Home;

use crate::launch::{Report, launch};

pub fn start(
    home: &Home,
    listen: Option<&str>,
    timeout_s: u64,
    drain_timeout_s: Option<u64>,
    on_behalf: Option<u64>,
) -> crate::Result<ExitCode> {
    launch(home, listen, timeout_s, drain_timeout_s, on_behalf, Report::Stdout)
}
