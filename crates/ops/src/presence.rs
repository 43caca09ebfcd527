//! "Does a gateway run in this home?" — answered by the lock alone, healing stale state
//! (under the lock) when the answer is no. Shared by `status` and `stop`.

use gatewarden_control::Endpoint;
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::heal::heal_stale;
use gatewarden_lifecycle::lock::{InstanceLock, LockError, LockProbe};

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
        // Nothing ever ran here, yet records may have been copied in from a live home: heal them
        // under a lock of our own, so a gateway starting meanwhile cannot lose its fresh ones.
        LockProbe::Missing if home.pid_file().exists() || home.state_file().exists() => {
            match InstanceLock::try_acquire(&home.lock()) {
                Ok(guard) => heal(home, &guard, by),
                Err(LockError::Held { .. }) => Presence::Running,
                Err(e) => Presence::Unknown(e.to_string()),
            }
        }
        LockProbe::Missing => Presence::NotRunning { healed: Vec::new() },
        LockProbe::Free(guard) => heal(home, &guard, by),
        LockProbe::Error(why) => Presence::Unknown(why),
    }
}

fn heal(home: &Home, guard: &InstanceLock, by: &str) -> Presence {
    let socket = match Endpoint::for_home(home.dir()) {
        Endpoint::Socket(p) => vec![p],
        Endpoint::Pipe(_) => Vec::new(),
    };
    Presence::NotRunning { healed: heal_stale(home, guard, by, None, &socket) }
}
