//! The Windows Service Control Manager facade: install, uninstall, start, stop, query, and the
//! service-main adapter. The **only** platform-conditional code in this crate.
//!
//! The public API exists on every platform; off Windows each function returns
//! [`ScmError::Unsupported`], so callers need no `cfg` of their own. The decisions (what to
//! register, how to report stop progress, how to map exit codes) are pure and live in
//! [`crate::windows`]; this file only moves them across the Win32 boundary via
//! `windows-service` 0.8.
//!
//! # Service-main adapter
//!
//! [`run_service`] enters the SCM dispatcher (blocking), reports `Running`, and runs the
//! caller's body on its own thread. `Stop`, `Shutdown` and `Preshutdown` control events call
//! the caller's graceful-stop callback and return at once (a control handler that blocks makes
//! the SCM report "the service did not respond"); the service thread then reports
//! `StopPending` with an incrementing checkpoint and a wait hint every
//! [`StopPendingProgress::interval`] until the caller's `is_stopped()` is true or the body
//! returns, and finally `Stopped` with the body's exit code (non-zero = service-specific
//! error, so SCM failure actions apply).

use crate::windows::{ScmInstall, StopPendingProgress};

/// Why an SCM operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScmError {
    /// Not on Windows.
    #[error("the Windows service manager is not available on this platform")]
    Unsupported,
    /// A Win32 call failed.
    #[error("while {op}: {message}")]
    Windows {
        /// What we were doing.
        op: &'static str,
        /// The error, rendered.
        message: String,
    },
    /// [`run_service`] was called while another service body is registered.
    #[error("a service is already being dispatched in this process")]
    AlreadyDispatching,
}

/// The SCM's state of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScmState {
    /// Stopped.
    Stopped,
    /// Starting.
    StartPending,
    /// Stopping.
    StopPending,
    /// Running.
    Running,
    /// Resuming.
    ContinuePending,
    /// Pausing.
    PausePending,
    /// Paused.
    Paused,
}

/// A service's status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScmStatus {
    /// State.
    pub state: ScmState,
    /// Process id while running.
    pub pid: Option<u32>,
    /// Win32 exit code (`ERROR_SERVICE_SPECIFIC_ERROR` = 1066 when `specific_exit` is set).
    pub win32_exit: u32,
    /// Service-specific exit code.
    pub specific_exit: Option<u32>,
}

/// Which control event asked the service to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// `SERVICE_CONTROL_STOP` (services.msc, `sc stop`).
    Stop,
    /// `SERVICE_CONTROL_SHUTDOWN`.
    Shutdown,
    /// `SERVICE_CONTROL_PRESHUTDOWN` (gets the configured preshutdown timeout).
    Preshutdown,
}

/// What the service-main adapter calls.
pub struct ServiceHooks {
    /// Begin a graceful stop (must return quickly; e.g. cancel a token, send control `stop`).
    pub request_stop: Box<dyn Fn(StopCause) + Send + Sync>,
    /// Whether the gateway has fully stopped.
    pub is_stopped: Box<dyn Fn() -> bool + Send + Sync>,
    /// The service body (the supervisor loop); returns the process exit code.
    pub run: Box<dyn FnOnce() -> i32 + Send>,
    /// Stop-progress reporting cadence.
    pub progress: StopPendingProgress,
}

impl std::fmt::Debug for ServiceHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHooks").field("progress", &self.progress).finish_non_exhaustive()
    }
}

/// Registers the service with the SCM (auto-start, restart failure actions, preshutdown
/// timeout). Needs administrator rights.
pub fn install(spec: &ScmInstall) -> Result<(), ScmError> {
    imp::install(spec)
}

/// Stops (best effort) and deletes the service.
pub fn uninstall(name: &str) -> Result<(), ScmError> {
    imp::uninstall(name)
}

/// Asks the SCM to start the service.
pub fn start(name: &str) -> Result<(), ScmError> {
    imp::start(name)
}

/// Sends `SERVICE_CONTROL_STOP`; returns the status right after (usually `StopPending`).
pub fn stop(name: &str) -> Result<ScmStatus, ScmError> {
    imp::stop(name)
}

/// Queries the service's status.
pub fn query(name: &str) -> Result<ScmStatus, ScmError> {
    imp::query(name)
}

/// Runs the current process as service `name` (call from `main` when launched by the SCM;
/// blocks until the service has stopped).
pub fn run_service(name: &str, hooks: ServiceHooks) -> Result<(), ScmError> {
    imp::run_service(name, hooks)
}

#[cfg(not(windows))]
mod imp {
    use super::{ScmError, ScmInstall, ScmStatus, ServiceHooks};

    pub(super) fn install(_: &ScmInstall) -> Result<(), ScmError> {
        Err(ScmError::Unsupported)
    }
    pub(super) fn uninstall(_: &str) -> Result<(), ScmError> {
        Err(ScmError::Unsupported)
    }
    pub(super) fn start(_: &str) -> Result<(), ScmError> {
        Err(ScmError::Unsupported)
    }
    pub(super) fn stop(_: &str) -> Result<ScmStatus, ScmError> {
        Err(ScmError::Unsupported)
    }
    pub(super) fn query(_: &str) -> Result<ScmStatus, ScmError> {
        Err(ScmError::Unsupported)
    }
    pub(super) fn run_service(_: &str, _: ServiceHooks) -> Result<(), ScmError> {
        Err(ScmError::Unsupported)
    }
}

#[cfg(windows)]
mod imp {
    use std::ffi::{OsStr, OsString};
    use std::path::PathBuf;
    use std::sync::{Mutex, mpsc};
    use std::time::Duration;

    use windows_service::service::{
        ServiceAccess, ServiceAction, ServiceActionType, ServiceControl, ServiceControlAccept, ServiceErrorControl,
        ServiceExitCode, ServiceFailureActions, ServiceFailureResetPeriod, ServiceInfo, ServiceStartType, ServiceState,
        ServiceStatus, ServiceType,
    };
    use windows_service::service_control_handler::{self, ServiceControlHandlerResult, ServiceStatusHandle};
    use windows_service::service_dispatcher;
    use windows_service::service_manager::{ServiceManager, ServiceManagerAccess};

    use super::{ScmError, ScmInstall, ScmState, ScmStatus, ServiceHooks, StopCause};
    use crate::windows::{ScmExit, scm_exit_code};

    /// `ERROR_SERVICE_SPECIFIC_ERROR`.
    const SERVICE_SPECIFIC: u32 = 1066;

    fn err(op: &'static str) -> impl FnOnce(windows_service::Error) -> ScmError {
        move |e| ScmError::Windows { op, message: e.to_string() }
    }

    /// windows-service panics converting durations that overflow `u32` milliseconds.
    fn clamp(d: Duration) -> Duration {
        d.min(Duration::from_millis(u64::from(u32::MAX)))
    }

    fn manager(access: ServiceManagerAccess) -> Result<ServiceManager, ScmError> {
        ServiceManager::local_computer(None::<&str>, access).map_err(err("connecting to the service manager"))
    }

    pub(super) fn install(i: &ScmInstall) -> Result<(), ScmError> {
        let m = manager(ServiceManagerAccess::CONNECT | ServiceManagerAccess::CREATE_SERVICE)?;
        let info = ServiceInfo {
            name: OsString::from(&i.name),
            display_name: OsString::from(&i.display_name),
            service_type: ServiceType::OWN_PROCESS,
            start_type: ServiceStartType::AutoStart,
            error_control: ServiceErrorControl::Normal,
            executable_path: PathBuf::from(&i.exe),
            launch_arguments: i.args.iter().map(OsString::from).collect(),
            dependencies: Vec::new(),
            account_name: i.account.as_ref().map(OsString::from),
            account_password: None,
        };
        let svc = m
            .create_service(&info, ServiceAccess::CHANGE_CONFIG | ServiceAccess::START)
            .map_err(err("creating the service"))?;
        svc.set_description(&i.description).map_err(err("setting the description"))?;
        let actions = i
            .failure_restart_delays
            .iter()
            .map(|d| ServiceAction { action_type: ServiceActionType::Restart, delay: clamp(*d) })
            .collect();
        svc.update_failure_actions(ServiceFailureActions {
            reset_period: ServiceFailureResetPeriod::After(Duration::from_secs(
                i.failure_reset_period.as_secs().min(u64::from(u32::MAX - 1)),
            )),
            reboot_msg: None,
            command: None,
            actions: Some(actions),
        })
        .map_err(err("setting failure actions"))?;
        // A non-zero exit with SERVICE_STOPPED counts as a failure too, not only crashes.
        svc.set_failure_actions_on_non_crash_failures(true)
            .map_err(err("enabling failure actions for non-crash failures"))?;
        svc.set_preshutdown_timeout(clamp(i.preshutdown_timeout)).map_err(err("setting the preshutdown timeout"))?;
        Ok(())
    }

    pub(super) fn uninstall(name: &str) -> Result<(), ScmError> {
        let m = manager(ServiceManagerAccess::CONNECT)?;
        let svc = m
            .open_service(name, ServiceAccess::DELETE | ServiceAccess::STOP | ServiceAccess::QUERY_STATUS)
            .map_err(err("opening the service"))?;
        // Already stopped is fine; deletion completes once it has stopped.
        let _ = svc.stop();
        svc.delete().map_err(err("deleting the service"))
    }

    pub(super) fn start(name: &str) -> Result<(), ScmError> {
        let m = manager(ServiceManagerAccess::CONNECT)?;
        let svc = m.open_service(name, ServiceAccess::START).map_err(err("opening the service"))?;
        svc.start::<&OsStr>(&[]).map_err(err("starting the service"))
    }

    pub(super) fn stop(name: &str) -> Result<ScmStatus, ScmError> {
        let m = manager(ServiceManagerAccess::CONNECT)?;
        let svc = m
            .open_service(name, ServiceAccess::STOP | ServiceAccess::QUERY_STATUS)
            .map_err(err("opening the service"))?;
        svc.stop().map(convert).map_err(err("stopping the service"))
    }

    pub(super) fn query(name: &str) -> Result<ScmStatus, ScmError> {
        let m = manager(ServiceManagerAccess::CONNECT)?;
        let svc = m.open_service(name, ServiceAccess::QUERY_STATUS).map_err(err("opening the service"))?;
        svc.query_status().map(convert).map_err(err("querying the service"))
    }

    fn convert(s: ServiceStatus) -> ScmStatus {
        let state = match s.current_state {
            ServiceState::Stopped => ScmState::Stopped,
            ServiceState::StartPending => ScmState::StartPending,
            ServiceState::StopPending => ScmState::StopPending,
            ServiceState::Running => ScmState::Running,
            ServiceState::ContinuePending => ScmState::ContinuePending,
            ServiceState::PausePending => ScmState::PausePending,
            ServiceState::Paused => ScmState::Paused,
        };
        let (win32_exit, specific_exit) = match s.exit_code {
            ServiceExitCode::Win32(c) => (c, None),
            ServiceExitCode::ServiceSpecific(c) => (SERVICE_SPECIFIC, Some(c)),
        };
        ScmStatus { state, pid: s.process_id, win32_exit, specific_exit }
    }

    /// The hooks and service name handed from [`run_service`] to the dispatcher's thread.
    static PENDING: Mutex<Option<(String, ServiceHooks)>> = Mutex::new(None);

    enum Event {
        Stop,
        BodyDone(i32),
    }

    windows_service::define_windows_service!(ffi_service_main, service_main);

    pub(super) fn run_service(name: &str, hooks: ServiceHooks) -> Result<(), ScmError> {
        {
            let mut slot = PENDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.is_some() {
                return Err(ScmError::AlreadyDispatching);
            }
            *slot = Some((name.to_owned(), hooks));
        }
        let result = service_dispatcher::start(name, ffi_service_main).map_err(err("starting the service dispatcher"));
        // If the SCM never called service_main, do not leave the hooks behind.
        PENDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        result
    }

    fn status(state: ServiceState, checkpoint: u32, wait_hint: Duration, exit: ServiceExitCode) -> ServiceStatus {
        let controls_accepted = if state == ServiceState::Running {
            // PRESHUTDOWN and SHUTDOWN are mutually exclusive; preshutdown gives more time.
            ServiceControlAccept::STOP | ServiceControlAccept::PRESHUTDOWN
        } else {
            ServiceControlAccept::empty()
        };
        ServiceStatus {
            service_type: ServiceType::OWN_PROCESS,
            current_state: state,
            controls_accepted,
            exit_code: exit,
            checkpoint,
            wait_hint: clamp(wait_hint),
            process_id: None,
        }
    }

    fn service_main(_arguments: Vec<OsString>) {
        let taken = PENDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let Some((name, hooks)) = taken else {
            return;
        };
        // Errors here cannot be reported anywhere but the SCM itself, which then shows the
        // service as failed to start.
        let _ = serve(&name, hooks);
    }

    fn serve(name: &str, hooks: ServiceHooks) -> Result<(), windows_service::Error> {
        let ServiceHooks { request_stop, is_stopped, run, mut progress } = hooks;
        let (tx, rx) = mpsc::channel::<Event>();
        let handler_tx = Mutex::new(tx.clone());
        let handler = move |control: ServiceControl| -> ServiceControlHandlerResult {
            let cause = match control {
                ServiceControl::Stop => StopCause::Stop,
                ServiceControl::Shutdown => StopCause::Shutdown,
                ServiceControl::Preshutdown => StopCause::Preshutdown,
                ServiceControl::Interrogate => return ServiceControlHandlerResult::NoError,
                _ => return ServiceControlHandlerResult::NotImplemented,
            };
            request_stop(cause);
            let _ = handler_tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(Event::Stop);
            ServiceControlHandlerResult::NoError
        };
        let handle: ServiceStatusHandle = service_control_handler::register(name, handler)?;
        handle.set_service_status(status(ServiceState::Running, 0, Duration::ZERO, ServiceExitCode::NO_ERROR))?;

        std::thread::spawn(move || {
            let code = run();
            let _ = tx.send(Event::BodyDone(code));
        });

        let mut stopping = false;
        let code = loop {
            let event = if stopping {
                match rx.recv_timeout(progress.interval) {
                    Ok(e) => Some(e),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break 0,
                }
            } else {
                match rx.recv() {
                    Ok(e) => Some(e),
                    Err(_) => break 0,
                }
            };
            match event {
                Some(Event::BodyDone(code)) => break code,
                Some(Event::Stop) => stopping = true,
                None => {}
            }
            if stopping {
                if is_stopped() {
                    break 0;
                }
                let (checkpoint, hint) = progress.next_report();
                let _ = handle.set_service_status(status(
                    ServiceState::StopPending,
                    checkpoint,
                    hint,
                    ServiceExitCode::NO_ERROR,
                ));
            }
        };
        let exit = match scm_exit_code(code) {
            ScmExit::NoError => ServiceExitCode::NO_ERROR,
            ScmExit::ServiceSpecific(c) => ServiceExitCode::ServiceSpecific(c),
        };
        handle.set_service_status(status(ServiceState::Stopped, 0, Duration::ZERO, exit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(windows, ignore = "talks to the real SCM")]
    fn off_windows_everything_is_unsupported() {
        assert!(matches!(query("gatewarden"), Err(ScmError::Unsupported)));
        assert!(matches!(start("gatewarden"), Err(ScmError::Unsupported)));
        let hooks = ServiceHooks {
            request_stop: Box::new(|_| {}),
            is_stopped: Box::new(|| true),
            run: Box::new(|| 0),
            progress: StopPendingProgress::default(),
        };
        assert!(matches!(run_service("gatewarden", hooks), Err(ScmError::Unsupported)));
    }
}
