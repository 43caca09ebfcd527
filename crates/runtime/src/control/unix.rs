//! Unix socket transport: 0600 socket, peer must be our own uid (`SO_PEERCRED`/`getpeereid`).

use std::path::Path;
use std::sync::Arc;

use gatewarden_control::Endpoint;
use tokio::net::UnixListener;
use tokio::sync::mpsc::UnboundedSender;

use crate::app::App;
use crate::cause::Cause;

/// Binds the endpoint (the caller holds the instance lock, so any socket file there is a
/// leftover) and spawns the accept loop.
pub fn bind(ep: &Endpoint, gw: Arc<App>, tx: UnboundedSender<Cause>) -> Result<(), String> {
    let Endpoint::Socket(path) = ep else { return Err("named pipes are Windows-only".into()) };
    if let Some(dir) = path.parent()
        && dir == gatewarden_control::endpoint::short_socket_dir()
    {
        // Checked on every start: another user who created the folder first could otherwise
        // swap in a socket of their own.
        gatewarden_control::endpoint::prepare_socket_dir(dir)
            .map_err(|e| format!("refusing the control socket folder: {e}"))?;
    }
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot bind control socket {}: {e}", path.display()))?;
    restrict(path)?;
    let me = rustix::process::geteuid().as_raw();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == me => {
                    tokio::spawn(super::serve_conn(stream, Arc::clone(&gw), tx.clone()));
                }
                Ok(cred) => crate::warn!("refused a control connection from uid {} (not {me})", cred.uid()),
                Err(e) => crate::warn!("refused a control connection: cannot read peer credentials ({e})"),
            }
        }
    });
    Ok(())
}

fn restrict(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", path.display()))
}

/// Removes the socket file at exit.
pub fn unbind(ep: &Endpoint) {
    if let Endpoint::Socket(path) = ep {
        let _ = std::fs::remove_file(path);
    }
}
