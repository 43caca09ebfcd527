//! "Does a gateway run in this home?" — answered by the lock alone, healing stale state
//! (under the lock) when the answer is no. Shared by `status` and `stop`.

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::heal::heal_stale;
use gatewarden_lifecycle::lock::{InstanceLock, LockProbe};

pub enum Presence {
    Running,
    /// Not running; `healed` names the stale files removed.
    NotRunning {
        healed: Vec<String>,
    },
    /// The lock could not be probed.
    Unknown(String),
}

pub fn presence(home: &Home, by: &str) -> Presence {
    if !home.dir().exists() {
        return Presence::NotRunning { healed: Vec::new() };
    }
    match InstanceLock::probe(&home.lock()) {
        LockProbe::Held => Presence::Running,
        LockProbe::Missing => Presence::NotRunning { healed: Vec::new() },
        LockProbe::Free(guard) => {
            let socket = match Endpoint::for_home(home.dir()) {
                Endpoint::Socket(p) => vec![p],
                Endpoint::Pipe(_) => Vec::new(),
            };
            let healed = heal_stale(home, &guard, by, None, &socket);
            Presence::NotRunning { healed }
        }
        LockProbe::Error(why) => Presence::Unknown(why),
    }
}
