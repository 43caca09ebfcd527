//! The systemd notification protocol (`sd_notify(3)`), spoken directly: one datagram per
//! message to `$NOTIFY_SOCKET`. No-op when the variable is unset (not under systemd) and on
//! platforms without Unix datagram sockets.
//!
//! Messages used: `READY=1` once running, `STOPPING=1` when the drain starts, `RELOADING=1`
//! before a restart hand-off, `STATUS=…` for every phase, `WATCHDOG=1` pings at half the
//! `WatchdogSec`, and `EXTEND_TIMEOUT_USEC=…` while a drain is in progress so the stop timeout
//! covers it.

use std::time::Duration;

use crate::Supervisor;

/// A connection to the manager's notification socket, if there is one. Shared by the gateway
/// (crates/runtime/src/sdnotify.rs, which logs failures) and `hermes supervise` (crates/ops).
#[derive(Debug, Clone)]
pub struct Notifier {
    socket: Option<String>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier { socket: std::env::var("NOTIFY_SOCKET").ok().filter(|s| !s.is_empty()) }
    }

    /// Notifies only a manager proven to run us: an inherited `NOTIFY_SOCKET` belongs to some
    /// other unit, which must not hear our READY=1 or STOPPING=1.
    pub fn for_supervisor(s: Supervisor) -> Notifier {
        match s {
            Supervisor::Systemd => Notifier::from_env(),
            _ => Notifier { socket: None },
        }
    }

    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends `msg` (newline-separated assignments); the error names the socket. A caller logs
    /// it and goes on: a process must not die because its manager went away.
    pub fn send(&self, msg: &str) -> Result<(), String> {
        match &self.socket {
            Some(path) => imp::send(path, msg).map_err(|e| format!("sd_notify to {path} failed: {e}")),
            None => Ok(()),
        }
    }

    pub fn status(&self, text: &str) -> Result<(), String> {
        self.send(&format!("STATUS={}", text.replace('\n', " ")))
    }
}

/// The watchdog interval requested by the manager, if it is meant for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok().and_then(|p| p.parse::<u32>().ok())
        && pid != std::process::id()
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

#[cfg(unix)]
mod imp {
    use std::io;
    use std::os::unix::net::UnixDatagram;

    pub fn send(path: &str, msg: &str) -> io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        #[cfg(target_os = "linux")]
        if let Some(name) = path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            return sock.send_to_addr(msg.as_bytes(), &addr).map(drop);
        }
        sock.send_to(msg.as_bytes(), path).map(drop)
    }
}

#[cfg(not(unix))]
mod imp {
    pub fn send(_path: &str, _msg: &str) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("notify");
        let server = std::os::unix::net::UnixDatagram::bind(&p).unwrap();
        let n = Notifier { socket: Some(p.to_string_lossy().into_owned()) };
        n.send("READY=1").unwrap();
        n.status("running\nnow").unwrap();
        let mut buf = [0u8; 128];
        let k = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"READY=1");
        let k = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"STATUS=running now");
    }
}
