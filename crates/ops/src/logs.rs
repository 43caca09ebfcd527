//! `gatewarden logs [-f] [-n N] [--json]`: the gateway's own log file (`--json`: one object
//! per line, crates/dashboard/src/gather.rs `log_line_json`).

use std::process::ExitCode;

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::fsio::{self, ReadOutcome};

use crate::tail::{Shape, tail};

pub fn logs(home: &Home, follow: bool, n: usize, json: bool) -> crate::Result<ExitCode> {
    let path = home.logs_dir().join("gateway.log");
    let open = || match fsio::open_regular(&path) {
        ReadOutcome::Ok((f, _)) => Ok(Some(f)),
        ReadOutcome::Missing => Ok(None),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => Err(std::io::Error::other(why)),
    };
    let shape = if json { Shape::Json } else { Shape::Text };
    tail(&path, open, follow, n, "only background starts write one; `run` logs to stderr", shape)
}
