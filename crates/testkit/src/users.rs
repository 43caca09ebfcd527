//! A second local user for the tests that act as root against another user's home or
//! processes: made with `useradd` under a name no other test (or test run) uses, removed with
//! `userdel` when dropped. Needs root; elsewhere [`crate::unavailable`] decides.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A user made for one test.
#[derive(Debug)]
pub struct TempUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl TempUser {
    /// Makes a system user (no home, no login shell) with its own group; `None` after saying
    /// why when that cannot be done (not root, no `useradd`), a failure under `CI`.
    pub fn create() -> Option<TempUser> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return crate::unavailable("a second user", "only root can create one (useradd)");
        }
        static N: AtomicU32 = AtomicU32::new(0);
        // Letters first, at most 32 characters, unique per process and call.
        let name = format!("gwt{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        // /etc/passwd is locked by any concurrent useradd (exit 10): retry, bounded.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = Command::new("useradd")
                .args(["--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", &name])
                .status();
            match st {
                Ok(s) if s.success() => break,
                Ok(s) if s.code() == Some(10) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return crate::unavailable("a second user", &format!("useradd {name}: {other:?}")),
            }
        }
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").arg(flag).arg(&name).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|_| out.status.success())
        };
        match (id("-u"), id("-g")) {
            (Some(uid), Some(gid)) => Some(TempUser { name, uid, gid }),
            _ => {
                let _ = Command::new("userdel").arg(&name).status();
                crate::unavailable("a second user", &format!("{name} was created but `id` does not know it"))
            }
        }
    }

    pub fn ids(&self) -> (u32, u32) {
        (self.uid, self.gid)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        // `-f`: even while a process of the test still runs as it (the test kills its own).
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Ok(s) = Command::new("userdel").arg("-f").arg(&self.name).status() {
            if s.code() != Some(10) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
