use std::fs::OpenOptions;
use std::io;
use std::time::{Duration, Instant};

use super::Halves;
use crate::Endpoint;

/// `ERROR_PIPE_BUSY`: every server instance is in use; another is created right after accept.
const ERROR_PIPE_BUSY: i32 = 231;

pub(crate) fn connect(ep: &Endpoint, deadline: Instant) -> io::Result<Halves> {
    let Endpoint::Pipe(name) = ep else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "Unix sockets are not used on Windows"));
    };
    loop {
        match OpenOptions::new().read(true).write(true).open(name) {
            Ok(f) => {
                let r = f.try_clone()?;
                return Ok((Box::new(r), Box::new(f)));
            }
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn uid() -> u32 {
    0
}

/// Named pipes have no folder. Who may create or open them is decided by the pipe's DACL
/// (see crates/runtime/src/control/windows.rs); the client does not yet check the server
/// process's owner (docs/security.md).
pub(crate) fn check_private_dir(_dir: &std::path::Path) -> Result<(), String> {
    Ok(())
}

pub(crate) fn prepare_private_dir(_dir: &std::path::Path) -> Result<(), String> {
    Ok(())
}
