//! The one error type of the operations (thiserror; `anyhow` stays in the binary).
//!
//! Most failures here end as a line for the operator, so an [`Error`] is a message, optionally
//! on top of the error that caused it ([`Context`]); `anyhow`'s `{:#}` at the edge prints the
//! whole chain, as it did when this code lived in the binary.

use std::fmt::Display;

/// A failed operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Worded for the operator already.
    #[error("{0}")]
    Msg(String),
    /// `what` failed because of `source`.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A library's error, passed through unchanged (its own `source` chain included).
    #[error(transparent)]
    Source(Foreign),
}

/// A boxed library error that keeps its own `Display` and `source` (transparent).
#[derive(Debug)]
pub struct Foreign(Box<dyn std::error::Error + Send + Sync + 'static>);

impl Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Foreign {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn msg(m: impl Display) -> Error {
        Error::Msg(m.to_string())
    }

    /// The message and its causes, `: `-joined (what `anyhow`'s `{:#}` prints).
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }
}

/// The library errors that `?` passes through.
macro_rules! passes_through {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Source(Foreign(Box::new(e)))
            }
        }
    )*};
}

passes_through!(
    std::io::Error,
    serde_json::Error,
    gatewarden_lifecycle::home::HomeError,
    gatewarden_lifecycle::lock::LockError,
    gatewarden_control::ClientError,
    gatewarden_service::command::CommandError,
    gatewarden_service::systemd::SystemctlError,
    gatewarden_service::launchd::LaunchdError,
    gatewarden_service::launchd::LaunchctlError,
    gatewarden_service::spec::SpecError,
    gatewarden_service::windows_scm::ScmError,
    gatewarden_service::supervise::ParkedStateError,
    gatewarden_hermes::stop::StopError,
    ureq::Error,
);

/// `anyhow::Context` for this crate: wrap an error (or a `None`) in a message.
pub trait Context<T> {
    fn context(self, what: impl Display) -> Result<T>;
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::Context { what: what.to_string(), source: Box::new(e) })
    }
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error::Context { what: what().to_string(), source: Box::new(e) })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Display) -> Result<T> {
        self.ok_or_else(|| Error::Msg(what.to_string()))
    }
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.ok_or_else(|| Error::Msg(what().to_string()))
    }
}

/// `return Err(Error::Msg(format!(…)))`.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::Error::Msg(format!($($t)*))) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_joins_the_causes_like_anyhow() {
        let io = std::io::Error::other("disk on fire");
        let e = Err::<(), _>(io).context("cannot write x").unwrap_err();
        assert_eq!(e.to_string(), "cannot write x");
        assert_eq!(e.chain(), "cannot write x: disk on fire");
        let e: Error = std::io::Error::other("plain").into();
        assert_eq!(e.chain(), "plain");
    }
}
