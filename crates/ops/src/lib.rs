//! gatewarden's operations: what each CLI verb does, behind the thin binary (crates/gatewarden,
//! which parses the command line, calls one function here and exits with its code).
//!
//! - [`owner`]: who owns a home's gateway — the [`owner::ServiceManager`] trait with one
//!   implementation per manager (systemd, launchd, scheduled task, SCM, supervise, container
//!   PID 1, none), over a per-OS facade with identical signatures.
//! - [`ladder`]: the restart ladder, a pure observation → action machine
//!   ([`ladder::machine`]) and the thin driver that observes and acts; [`launch`] (start a
//!   gateway and wait for readiness) and [`halt`] (stop it and keep it down): the shared
//!   procedures, below the verbs.
//! - the verbs, one module each, each called by one line of the binary: [`start`], [`stop`],
//!   [`restart`], [`status`], [`update`] (the verified binary swap), [`supervise`],
//!   [`doctor`], [`check`], [`init`] (a home set up from questions or flags), [`dashboard`]
//!   (the fleet page), [`top`], [`service`], [`send`], [`logs`], [`history`],
//!   [`crash_backoff`], and the hermes-home verbs ([`hermes`]); what they share below them:
//!   [`options`] (filled by the binary's parser), [`ui`] (stdout and stderr, colour, `--json`),
//!   [`health`] (a status report read as users see it), [`probe`] (a bounded look at an
//!   upstream: credentials, the clock), [`intent`], `presence`, `progress`,
//!   [`ready`], [`release`], [`orchestrator`], [`crash_loop`], [`tail`], [`previous`] (how the
//!   replaced incarnation ran, for every start that revives it).
//!
//! The module graph has no cycle, and no verb runs another: what two verbs share is a procedure
//! below them (`start` and the ladder [`launch`], `stop` and `service` [`halt`], `restart` and
//! `update` run the [`ladder`]). One edge between verb modules is left, on purpose: `supervise`
//! reverts an unblessed release through the update transaction (`update::revert_after_crash`),
//! which only that module can finish.

#![deny(clippy::print_stdout, clippy::print_stderr)]

/// `println!` that a closed stdout cannot turn into a panic (`console`).
#[macro_export]
macro_rules! outln {
    () => { $crate::console::out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::out(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that a closed stdout cannot turn into a panic (`console`).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::console::out(format_args!($($t)*)) };
}

/// `eprintln!` that a closed stderr cannot turn into a panic (`console`).
#[macro_export]
macro_rules! errln {
    () => { $crate::console::err(format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::err(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprint!` that a closed stderr cannot turn into a panic (`console`).
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::console::err(format_args!($($t)*)) };
}

pub mod cancel;
pub mod check;
pub mod console;
pub mod crash_backoff;
pub mod crash_loop;
pub mod dashboard;
pub mod doctor;
pub mod env;
mod error;
pub mod halt;
pub mod health;
pub mod hermes;
pub mod history;
pub mod init;
pub mod intent;
pub mod ladder;
pub mod launch;
pub mod logs;
pub mod options;
pub mod orchestrator;
pub mod os;
pub mod outcome;
pub mod owner;
pub mod pairing;
mod presence;
pub mod previous;
pub mod probe;
mod progress;
pub mod ready;
pub mod release;
pub mod reload;
pub mod restart;
mod screen;
pub mod secrets;
pub mod send;
pub mod service;
pub mod start;
pub mod status;
pub mod stop;
pub mod supervise;
pub mod tail;
pub mod top;
pub mod trace;
pub mod ui;
pub mod update;

pub use error::{Context, Error, Result};
