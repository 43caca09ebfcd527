//! Real hermes-agent processes in a hermetic environment, for the tests of this crate.
//!
//! - The venv comes from `scripts/hermes-venv` (`GATEWARDEN_HERMES_VENV`, else
//!   `~/.cache/gatewarden/hermes-venv`). Missing: the test fails under `CI=true`, else it
//!   says why and returns early.
//! - Every hermes child: `HERMES_HOME`, `HOME` and `XDG_STATE_HOME` in a temp dir,
//!   `TIRITH_ENABLED=false` (no download), no inherited supervisor variables, its own
//!   process group; [`Lab`]'s drop kills every group it started.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::start::{self, Mode};

pub use gatewarden_testkit::hermes::{SCRUB, venv};

pub struct Lab {
    pub dir: tempfile::TempDir,
    pub home: HermesHome,
    pub hermes: PathBuf,
    groups: Mutex<Vec<u32>>,
}

impl Lab {
    pub fn new() -> Option<Lab> {
        let venv = venv()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let home = HermesHome::at(dir.path().join("home"));
        for d in [home.dir().to_path_buf(), dir.path().join("user"), dir.path().join("xdg")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        Some(Lab { hermes: venv.join("bin/hermes"), home, groups: Mutex::new(Vec::new()), dir })
    }

    pub fn user_home(&self) -> PathBuf {
        self.dir.path().join("user")
    }

    pub fn scoped_lock_dir(&self) -> PathBuf {
        self.dir.path().join("xdg/hermes/gateway-locks")
    }

    /// `hermes gateway run` for this lab's home, hermetic.
    pub fn command(&self, mode: Mode) -> Command {
        let mut cmd = start::command(&self.home, &self.hermes, mode);
        hermetic(&mut cmd, self.dir.path());
        cmd
    }

    /// A resolved command (`launch::resolve`), hermetic.
    pub fn command_for(&self, launch: &gatewarden_hermes::launch::Launch, mode: Mode) -> Command {
        let mut cmd = start::command_for(&self.home, launch, mode);
        hermetic(&mut cmd, self.dir.path());
        cmd
    }

    /// Remembers a process group to kill on drop.
    pub fn track(&self, pgid: u32) {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).push(pgid);
    }

    /// Spawns hermes detached (own session = own group), tracked.
    pub fn spawn(&self) -> Child {
        let child = start::spawn(&self.home, self.command(Mode::Detached)).expect("spawn hermes");
        self.track(child.id());
        child
    }
}

/// Sets the flag when dropped, so a panicking test still ends a supervise loop it started.
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Makes a hermes command hermetic (after [`start::command`], whose supervisor tag it keeps).
/// The child also dies with the thread that spawned it: when nextest kills a timed-out test,
/// no drop guard runs, and a detached hermes would otherwise live on.
pub fn hermetic(cmd: &mut Command, root: &Path) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    for k in SCRUB {
        cmd.env_remove(k);
    }
    cmd.env("HOME", root.join("user"))
        .env("XDG_STATE_HOME", root.join("xdg"))
        .env("TIRITH_ENABLED", "false")
        .env("HERMES_GATEWAY_MAX_STARTS", "0");
}

impl Drop for Lab {
    fn drop(&mut self) {
        for g in self.groups.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: plain syscall; a negative pid addresses the group we created.
            unsafe {
                libc::kill(-(*g as i32), libc::SIGKILL);
            }
        }
    }
}

pub fn send(pid: u32, sig: i32) {
    // SAFETY: plain syscall on a positive pid the test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Waits for `child` to exit within `timeout`, returning its status; kills it otherwise.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("pid {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `cond` holds, polling every `every`; panics with `what` after `timeout`.
pub fn must(timeout: Duration, every: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(every);
    }
}

/// Path → (inode, length) of every file under `dir` except our own folder and hermes's
/// logs and databases that change on their own.
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, (u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
            if m.is_dir() {
                if p.file_name().is_some_and(|n| n != "gatewarden") {
                    stack.push(p);
                }
            } else {
                out.insert(p, (m.ino(), m.len()));
            }
        }
    }
    out
}
