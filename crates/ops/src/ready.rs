//! Is a gateway there, and ready? The readiness wait every verb that starts something shares
//! (`start`, `service install`, the restart ladder, `update`), and the quick looks it is made of.

use std::time::{Duration, Instant};

use gatewarden_control::{Client, Endpoint, StatusReport};
use gatewarden_lifecycle::lock::LockProbe;
use gatewarden_lifecycle::{Home, InstanceLock};

/// The gateway's status over its control endpoint, within `t`.
pub fn status_of(ep: &Endpoint, t: Duration) -> Result<StatusReport, String> {
    Client::connect(ep, t).and_then(|mut c| c.status(t)).map_err(|e| e.to_string())
}

/// Whether something holds the home's instance lock.
pub fn lock_held(home: &Home) -> bool {
    !matches!(InstanceLock::probe(&home.lock()), LockProbe::Free(_) | LockProbe::Missing)
}

/// Waits until the control endpoint answers with state `running`.
pub fn wait_ready(home: &Home, timeout: Duration) -> Option<StatusReport> {
    wait_ready_where(home, timeout, |_| true)
}

/// Waits until the control endpoint answers `running` with a report accepted by `accept`.
pub fn wait_ready_where(
    home: &Home,
    timeout: Duration,
    accept: impl Fn(&StatusReport) -> bool,
) -> Option<StatusReport> {
    let ep = Endpoint::for_home(home.dir());
    let deadline = Instant::now() + timeout;
    let t = Duration::from_millis(500);
    loop {
        if let Ok(s) = Client::connect(&ep, t).and_then(|mut c| c.status(t))
            && s.state.as_deref() == Some("running")
            && accept(&s)
        {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
