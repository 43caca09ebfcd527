//! The systemd notification protocol, as the gateway speaks it: lifecycle's [`Notifier`]
//! (crates/lifecycle/src/sdnotify.rs, shared with `hermes supervise`), its failures logged
//! and otherwise ignored.

pub use gatewarden_lifecycle::sdnotify::watchdog_interval;

/// lifecycle's notifier, whose failures go to the gateway's log.
#[derive(Debug, Clone)]
pub struct Notifier(gatewarden_lifecycle::sdnotify::Notifier);

impl Notifier {
    pub fn for_supervisor(s: gatewarden_lifecycle::Supervisor) -> Notifier {
        Notifier(gatewarden_lifecycle::sdnotify::Notifier::for_supervisor(s))
    }

    pub fn enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Sends `msg`; a failure is logged once per call and otherwise ignored: a gateway must
    /// not die because its manager went away.
    pub fn send(&self, msg: &str) {
        if let Err(e) = self.0.send(msg) {
            crate::warn!("{e}");
        }
    }

    pub fn status(&self, text: &str) {
        if let Err(e) = self.0.status(text) {
            crate::warn!("{e}");
        }
    }
}
