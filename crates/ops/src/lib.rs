//! gatewarden's operations: what each CLI verb does, behind the thin binary (crates/gatewarden,
//! which parses the command line, calls one function here and exits with its code).
//!
//! - [`owner`]: who owns a home's gateway — the [`owner::ServiceManager`] trait with one
//!   implementation per manager (systemd, launchd, scheduled task, SCM, supervise, container
//!   PID 1, none), over a per-OS facade with identical signatures.
//! - [`restart`]: the restart ladder, a pure observation → action machine
//!   ([`restart::machine`]) and the thin driver that observes and acts.
//! - [`start`] (with the readiness wait every verb shares), [`stop`], [`status`], [`update`]
//!   (the verified binary swap), [`supervise`], [`doctor`], [`check`], [`service`], the
//!   hermes-home verbs ([`hermes`]), and the small helpers they share ([`intent`],
//!   [`presence`], [`progress`]).
//!
//! Verbs never call each other: shared steps (the readiness wait, stop-then-start, the last
//! known good copy) are functions of the module that owns them.

pub mod check;
pub mod crash_backoff;
pub mod doctor;
pub mod env;
mod error;
pub mod hermes;
pub mod history;
pub mod intent;
pub mod logs;
pub mod orchestrator;
pub mod os;
pub mod owner;
mod presence;
mod progress;
pub mod ready;
pub mod release;
pub mod restart;
pub mod send;
pub mod service;
pub mod start;
pub mod status;
pub mod stop;
pub mod supervise;
pub mod update;

pub use error::{Context, Error, Result};
