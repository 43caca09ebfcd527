//! Per-OS facade: run a child in its own process group and kill the whole group.
//!
//! This is the only module of the exec backend with `cfg`s.
//!
//! - Unix: the child is spawned with `process_group(0)`, so its pid is the group id and every
//!   descendant that does not call `setsid`/`setpgid` itself is a member. SIGTERM/SIGKILL go to
//!   the group (`kill(-pgid, …)`).
//! - Windows: the child is assigned to a job object right after spawn, with
//!   `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE` so that even a crash of the gateway (which closes the
//!   handle) takes the tree down. `TerminateJobObject` kills every member; Windows has no polite
//!   SIGTERM for a console-less child, so `terminate` is a kill there. If assignment fails (for
//!   instance, a job that forbids nesting), `taskkill /T /F` on the child's tree is the fallback.

use tokio::process::{Child, Command};

/// Prepares `cmd` so that the spawned child leads its own group.
pub(super) fn configure(cmd: &mut Command) {
    imp::configure(cmd);
}

/// Handle on a spawned child's group.
pub(super) struct Group(imp::Group);

impl Group {
    /// Must be called right after spawn, before the child is waited on.
    pub(super) fn attach(child: &Child) -> Group {
        Group(imp::Group::attach(child))
    }

    /// Asks every member to exit (SIGTERM on Unix).
    pub(super) fn terminate(&self) {
        self.0.terminate();
    }

    /// Kills every member at once (SIGKILL on Unix). Safe to call more than once.
    pub(super) fn kill(&self) {
        self.0.kill();
    }

    /// The run is over and the group was killed and its leader reaped: drop the handle without
    /// the kill that dropping an unreleased group does (the backstop for a run future that is
    /// dropped half-way instead of being cancelled).
    pub(super) fn release(mut self) {
        self.0.released = true;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.0.released {
            self.0.kill();
        }
    }
}

/// Human-readable description of how a child ended ("exit status 3", "killed by signal 9").
pub(super) fn describe_exit(status: std::process::ExitStatus) -> String {
    imp::describe_exit(status)
}

#[cfg(unix)]
mod imp {
    use rustix::process::{Pid, Signal, kill_process_group};
    use tokio::process::{Child, Command};

    pub(super) fn configure(cmd: &mut Command) {
        cmd.process_group(0);
    }

    pub(super) struct Group {
        pgid: Option<Pid>,
        pub(super) released: bool,
    }

    impl Group {
        pub(super) fn attach(child: &Child) -> Group {
            let pgid = child.id().and_then(|id| i32::try_from(id).ok()).and_then(Pid::from_raw);
            Group { pgid, released: false }
        }

        fn signal(&self, sig: Signal) {
            if let Some(pgid) = self.pgid {
                // ESRCH (group already gone) is the common, harmless case. The group id cannot
                // be reused while any member lives; once all are gone, a stranger would need to
                // get this very pid and make it a group leader between our reaping the leader
                // and this call (microseconds, with sequential pid allocation): accepted.
                let _ = kill_process_group(pgid, sig);
            }
        }

        pub(super) fn terminate(&self) {
            self.signal(Signal::TERM);
        }

        pub(super) fn kill(&self) {
            self.signal(Signal::KILL);
        }
    }

    pub(super) fn describe_exit(status: std::process::ExitStatus) -> String {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => status.to_string(),
        }
    }
}

#[cfg(windows)]
mod imp {
    use tokio::process::{Child, Command};
    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
    use windows_sys::Win32::System::JobObjects::{
        AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
        JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation, SetInformationJobObject,
        TerminateJobObject,
    };

    /// CREATE_NEW_PROCESS_GROUP: a Ctrl+C in the gateway's console is the gateway's business,
    /// not delivered straight to the agent. CREATE_NO_WINDOW: no console window pops up.
    const CREATION_FLAGS: u32 = 0x0000_0200 | 0x0800_0000;

    pub(super) fn configure(cmd: &mut Command) {
        cmd.creation_flags(CREATION_FLAGS);
    }

    pub(super) struct Group {
        /// The job handle as an integer so the struct is Send + Sync; 0 = no job.
        job: usize,
        pid: Option<u32>,
        pub(super) released: bool,
    }

    impl Group {
        pub(super) fn attach(child: &Child) -> Group {
            let pid = child.id();
            let Some(process) = child.raw_handle() else {
                return Group { job: 0, pid, released: false };
            };
            // SAFETY: plain Win32 calls on handles we own; `process` is valid while `child` is
            // borrowed, and the limit struct outlives the call that reads it.
            let job = unsafe {
                let job: HANDLE = CreateJobObjectW(std::ptr::null(), std::ptr::null());
                if job.is_null() {
                    0
                } else {
                    let mut info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
                    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
                    let ok = SetInformationJobObject(
                        job,
                        JobObjectExtendedLimitInformation,
                        (&raw const info).cast(),
                        std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
                    ) != 0
                        && AssignProcessToJobObject(job, process as HANDLE) != 0;
                    if ok {
                        job as usize
                    } else {
                        CloseHandle(job);
                        0
                    }
                }
            };
            Group { job, pid, released: false }
        }

        pub(super) fn terminate(&self) {
            self.kill();
        }

        pub(super) fn kill(&self) {
            if self.job != 0 {
                // SAFETY: `job` is a live job handle owned by `self` (closed only in Drop).
                unsafe {
                    TerminateJobObject(self.job as HANDLE, 1);
                }
            } else if let Some(pid) = self.pid {
                // No job: kill the tree by parent links. Not awaited; its result is advisory.
                let _ = std::process::Command::new("taskkill")
                    .args(["/T", "/F", "/PID", &pid.to_string()])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn();
            }
        }
    }

    impl Drop for Group {
        fn drop(&mut self) {
            // Runs after the facade's Drop (which kills an unreleased group).
            if self.job != 0 {
                // SAFETY: closing the handle we created; KILL_ON_JOB_CLOSE ends any leftovers.
                unsafe {
                    CloseHandle(self.job as HANDLE);
                }
            }
        }
    }

    pub(super) fn describe_exit(status: std::process::ExitStatus) -> String {
        match status.code() {
            Some(code) => format!("exit status {code}"),
            None => status.to_string(),
        }
    }
}
