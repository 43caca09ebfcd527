use std::io;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::Halves;
use crate::Endpoint;

pub(crate) fn connect(ep: &Endpoint, _deadline: Instant) -> io::Result<Halves> {
    let Endpoint::Socket(path) = ep else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "named pipes exist only on Windows"));
    };
    // connect(2) on a Unix socket either succeeds or fails at once; no retry loop needed.
    let s = UnixStream::connect(path)?;
    let r = s.try_clone()?;
    Ok((Box::new(r), Box::new(s)))
}

pub(crate) fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}
