//! Cleanup of processes a test does not spawn itself, and `/proc` process-group inspection.
//!
//! A restarting gateway starts its successor in a new session, `gatewarden start` detaches the
//! gateway, and `gatewarden restart` detaches its orchestrator: none of them is a child of the
//! test, so kill-on-drop handles cannot reach them. A [`Sweeper`] gives the test a unique tag,
//! passed to every gateway / CLI it spawns as the environment variable [`TAG_VAR`]; every
//! descendant inherits it (successors, orchestrators, exec-backend runs and their
//! grandchildren), and on drop the sweeper SIGKILLs every live process whose environment carries
//! the tag. Nothing else is ever signalled: the tag is unique per sweeper.

use std::time::Duration;

/// Environment variable carrying a [`Sweeper`]'s tag.
pub const TAG_VAR: &str = "GW_TEST_SWEEP_TAG";

/// This test process's own sweeper (see [`process_tag`]); swept when the process exits.
static PROCESS: std::sync::OnceLock<Sweeper> = std::sync::OnceLock::new();

/// The tag of this test process's sweeper: `test_env` (crates/testkit/src/lib.rs) gives it to
/// every gateway and CLI the kit spawns, so whatever they detach (a `start`'s gateway, a
/// restart's backstop and what it kicks) is found even when the test named no [`Sweeper`] of
/// its own (one it names replaces this tag). The sweep runs when the test process exits
/// (nextest runs one test per process: when that test ends, passed or failed), and says on
/// stderr what it had to kill: a test that needed it left something running.
pub fn process_tag() -> &'static str {
    PROCESS
        .get_or_init(|| {
            // SAFETY: registers a plain `extern "C"` function; it runs once, at `exit`.
            unsafe { libc::atexit(sweep_at_exit) };
            Sweeper::new()
        })
        .tag()
}

extern "C" fn sweep_at_exit() {
    let Some(sw) = PROCESS.get() else { return };
    let left: Vec<(u32, String)> = sw.tagged().into_iter().map(|p| (p, cmdline_of(p).join(" "))).collect();
    if left.is_empty() {
        return;
    }
    sw.sweep();
    for (pid, cmd) in left {
        eprintln!("testkit: killed pid {pid} left running by this test: {cmd}");
    }
}

/// Kills, on drop, every process whose environment has `GW_TEST_SWEEP_TAG=<this tag>`.
#[derive(Debug)]
pub struct Sweeper {
    tag: String,
}

impl Default for Sweeper {
    fn default() -> Self {
        Self::new()
    }
}

impl Sweeper {
    pub fn new() -> Sweeper {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        Sweeper { tag: format!("{}-{}-{nanos}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)) }
    }

    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// `(TAG_VAR, tag)` for `cli_env` / `GatewayBuilder::env`.
    pub fn env(&self) -> (&'static str, &str) {
        (TAG_VAR, &self.tag)
    }

    /// Applies the tag to a command.
    pub fn tag_command(&self, cmd: &mut std::process::Command) {
        cmd.env(TAG_VAR, &self.tag);
    }

    /// Live processes carrying the tag (excluding this test process).
    pub fn tagged(&self) -> Vec<u32> {
        procs_with_env(TAG_VAR, &self.tag)
    }

    /// SIGKILLs every tagged process until none is left (bounded: 5 s). Returns the pids seen.
    pub fn sweep(&self) -> Vec<u32> {
        let mut seen = Vec::new();
        crate::wait_until(Duration::from_secs(5), || {
            let now = self.tagged();
            for &p in &now {
                // Re-read the environment right before the signal: the pid must still carry our
                // tag (a recycled pid would not).
                if env_of(p).is_some_and(|e| has_var(&e, TAG_VAR, &self.tag)) {
                    let _ = crate::send_signal(p, libc::SIGKILL);
                }
                if !seen.contains(&p) {
                    seen.push(p);
                }
            }
            now.is_empty()
        });
        seen
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.sweep();
    }
}

fn env_of(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok()
}

fn has_var(environ: &[u8], key: &str, value: &str) -> bool {
    let want = format!("{key}={value}");
    environ.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).collect())
        .unwrap_or_default()
}

/// Live (non-zombie) pids whose environment contains `key=value`, excluding this process.
pub fn procs_with_env(key: &str, value: &str) -> Vec<u32> {
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|&p| p != me && env_of(p).is_some_and(|e| has_var(&e, key, value)) && crate::pid_alive(p))
        .collect()
}

/// Fields of `/proc/<pid>/stat` after the `comm` field (index 0 = state).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Process group id of `pid`.
pub fn pgid_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}

/// Session id of `pid`.
pub fn sid_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

/// Parent pid of `pid`.
pub fn ppid_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Live (non-zombie) members of process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    all_pids().into_iter().filter(|&p| pgid_of(p) == Some(pgid) && crate::pid_alive(p)).collect()
}

/// `/proc/<pid>/cmdline` as lossy strings.
pub fn cmdline_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeper_kills_a_tagged_detached_grandchild() {
        let sw = Sweeper::new();
        let mut c = std::process::Command::new("/bin/sh");
        // The grandchild leaves the group and the session: only the tag finds it. It prints its
        // own pid: `$!` would name setsid, which forks (and exits) when it leads its group.
        c.args(["-c", "setsid sh -c 'echo $$ >&3; exec sleep 300 3>&-' 3>&1 >/dev/null 2>&1 &"]);
        sw.tag_command(&mut c);
        let out = c.output().unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(crate::wait_until(Duration::from_secs(5), || sw.tagged().contains(&pid)));
        assert!(sw.sweep().contains(&pid));
        assert!(crate::wait_until(Duration::from_secs(5), || !crate::pid_alive(pid)));
        assert!(group_members(pid).is_empty());
    }
}
