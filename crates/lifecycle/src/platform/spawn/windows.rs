//! Windows: detached consoles and new process groups; no descriptor hand-over, no exec.

use std::io;
use std::net::TcpListener;
use std::os::windows::process::CommandExt;
use std::process::Command;

const DETACHED_PROCESS: u32 = 0x0000_0008;
const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
const CREATE_NO_WINDOW: u32 = 0x0800_0000;

/// Platform-specific behaviour: sockets are not handed over (that needs WSADuplicateSocket and
/// a side channel); the successor binds the address itself, retrying while it is in use.
pub fn detach(cmd: &mut Command, _listener: Option<&TcpListener>) -> Option<String> {
    cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW);
    None
}

pub fn adopt_listener(_value: &str) -> io::Result<TcpListener> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "listener inheritance is not supported on Windows"))
}

/// DETACHED_PROCESS drops the console, so a detached orchestrator could not print.
pub const DETACH_KEEPS_OUTPUT: bool = false;

/// No listener inheritance on Windows.
pub fn listener_handle(_l: &TcpListener) -> Option<String> {
    None
}

/// Windows has no exec; nothing runs as a PID-namespace init there.
pub fn exec_in_place(_cmd: Command, _listener: Option<TcpListener>) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "re-executing in place is not supported on Windows")
}

pub fn own_process_group(cmd: &mut Command) {
    cmd.creation_flags(CREATE_NEW_PROCESS_GROUP);
}

/// A spawned child's tree, as a job object created with `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`,
/// so that even a crash of the gateway (which closes the handle) takes the tree down.
/// `TerminateJobObject` kills every member; Windows has no polite SIGTERM for a console-less
/// child, so `terminate` is a kill here. If assignment fails (for instance, a job that forbids
/// nesting), `taskkill /T /F` on the child's tree is the fallback.
#[derive(Debug)]
pub struct ProcessGroup {
    /// The job handle as an integer so the struct is Send + Sync; 0 = no job.
    job: usize,
    pid: Option<u32>,
}

impl ProcessGroup {
    /// Before spawning: a new process group (a Ctrl+C in the gateway's console is the gateway's
    /// business, not delivered straight to the child), and no console window.
    pub fn prepare(cmd: &mut Command) {
        cmd.creation_flags(CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW);
    }

    /// Right after spawning `pid`, before it is waited on (its unreaped handle keeps the pid
    /// from being reused while we open it).
    pub fn attach(pid: Option<u32>) -> ProcessGroup {
        use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
        use windows_sys::Win32::System::JobObjects::{
            AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
            JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation, SetInformationJobObject,
        };
        use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SET_QUOTA, PROCESS_TERMINATE};
        let Some(id) = pid else { return ProcessGroup { job: 0, pid } };
        // SAFETY: plain Win32 calls on handles we own and close; the limit struct outlives the
        // call that reads it.
        let job = unsafe {
            let process: HANDLE = OpenProcess(PROCESS_SET_QUOTA | PROCESS_TERMINATE, 0, id);
            let job: HANDLE = CreateJobObjectW(std::ptr::null(), std::ptr::null());
            let ok = !process.is_null() && !job.is_null() && {
                let mut info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
                info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
                SetInformationJobObject(
                    job,
                    JobObjectExtendedLimitInformation,
                    (&raw const info).cast(),
                    std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
                ) != 0
                    && AssignProcessToJobObject(job, process) != 0
            };
            if !process.is_null() {
                CloseHandle(process);
            }
            if ok {
                job as usize
            } else {
                if !job.is_null() {
                    CloseHandle(job);
                }
                0
            }
        };
        ProcessGroup { job, pid }
    }

    pub fn terminate(&self) {
        self.kill();
    }

    pub fn kill(&self) {
        if self.job != 0 {
            // SAFETY: `job` is a live job handle owned by `self` (closed only in Drop).
            unsafe {
                windows_sys::Win32::System::JobObjects::TerminateJobObject(self.job as _, 1);
            }
        } else if let Some(pid) = self.pid {
            // No job: kill the tree by parent links. Not awaited; its result is advisory.
            let _ = Command::new("taskkill")
                .args(["/T", "/F", "/PID", &pid.to_string()])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.job != 0 {
            // SAFETY: closing the handle we created; KILL_ON_JOB_CLOSE ends any leftovers.
            unsafe {
                windows_sys::Win32::Foundation::CloseHandle(self.job as _);
            }
        }
    }
}

pub use super::without_groups::*;
