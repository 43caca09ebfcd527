//! The one liveness primitive.
//!
//! [`probe`] is total: it never panics, never returns an error and never sends a signal.
//! The OS-specific facts are gathered in [`crate::platform`]; how those facts map to
//! [`Liveness`] lives in [`crate::liveness`] as pure functions, below the facade.

pub use crate::liveness::Liveness;

/// Probes `pid`. See the module docs.
pub fn probe(pid: i64) -> Liveness {
    match valid_pid(pid) {
        Some(pid) => crate::platform::probe(pid),
        None => Liveness::Dead,
    }
}

/// [`probe`] for a pid already known to be positive, the shape marker classification takes.
pub fn probe_u32(pid: u32) -> Liveness {
    probe(i64::from(pid))
}

/// A pid we may hand to the OS: `1..=i32::MAX`. Zero and negatives address process groups on
/// Unix (`kill(0, _)`, `kill(-1, _)`), and values above `i32::MAX` become negative there.
pub fn valid_pid(pid: i64) -> Option<u32> {
    if (1..=i64::from(i32::MAX)).contains(&pid) { Some(pid as u32) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_pids_are_dead_without_asking_the_os() {
        for pid in [0, -1, -4242, i64::from(i32::MAX) + 1, i64::MAX, i64::MIN] {
            assert_eq!(probe(pid), Liveness::Dead, "pid {pid}");
        }
    }

    #[test]
    fn own_pid_is_alive_with_start_time() {
        match probe(i64::from(std::process::id())) {
            Liveness::Alive { start_time: Some(_) } => {}
            other => panic!("own process probed as {other:?}"),
        }
    }

    #[test]
    fn reaped_child_is_dead_and_zombie_is_dead() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--list")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = i64::from(child.id());
        // Not yet reaped: on Unix the exited child is a zombie until wait(); either way it
        // must never read as Alive once it has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match probe(pid) {
                Liveness::Dead => break,
                Liveness::Alive { .. } if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                other => panic!("exited child probed as {other:?}"),
            }
        }
        child.wait().unwrap();
        assert_eq!(probe(pid), Liveness::Dead);
    }
}
