//! Named-pipe transport. Remote clients are rejected; the pipe's default DACL grants full
//! access only to the creating user, SYSTEM and administrators.

use std::sync::Arc;

use gatewarden_control::Endpoint;
use tokio::net::windows::named_pipe::ServerOptions;
use tokio::sync::mpsc::UnboundedSender;

use crate::app::App;
use crate::cause::Cause;

pub fn bind(ep: &Endpoint, gw: Arc<App>, tx: UnboundedSender<Cause>) -> Result<(), String> {
    let Endpoint::Pipe(name) = ep else { return Err("Unix sockets are not used on Windows".into()) };
    let name = name.clone();
    let mut server = ServerOptions::new()
        .first_pipe_instance(true)
        .reject_remote_clients(true)
        .create(&name)
        .map_err(|e| format!("cannot create control pipe {name}: {e}"))?;
    tokio::spawn(async move {
        loop {
            if server.connect().await.is_err() {
                continue;
            }
            let next = match ServerOptions::new().reject_remote_clients(true).create(&name) {
                Ok(s) => s,
                Err(e) => {
                    crate::error!("cannot create the next control pipe instance: {e}");
                    return;
                }
            };
            let conn = std::mem::replace(&mut server, next);
            tokio::spawn(super::serve_conn(conn, Arc::clone(&gw), tx.clone()));
        }
    });
    Ok(())
}

pub fn unbind(_ep: &Endpoint) {}
