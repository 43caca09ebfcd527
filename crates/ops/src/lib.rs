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
//! The module graph has no cycle: shared steps (the readiness wait in [`ready`], the last known
//! good copy in [`release`], detaching in [`orchestrator`]) sit below the verbs, and where one
//! operation is a step of another (`service` stops, the restart ladder starts, `update`
//! restarts) the call goes one way, down.

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
