//! Managing an existing hermes-agent gateway without disturbing it.
//!
//! hermes-agent 0.19 keeps its lifecycle in files of its home (`gateway.lock`, `gateway.pid`,
//! `gateway_state.json`, markers, logs; see crates/hermes/README.md). This crate
//! reads them, drives hermes through its own mechanisms (the planned-stop marker, SIGTERM,
//! SIGUSR1, `hermes gateway run`) and verifies every outcome by process identity. The CLI
//! verbs wire these functions; nothing here parses arguments.
//!
//! Ground rules, from measurements of the real package:
//! - Never take `gateway.lock`: hermes tries it once at start-up and exits 1 when a probe
//!   holds it. The holder comes from the kernel's lock table ([`holder`]).
//! - Never delete or rewrite `gateway.lock`, `gateway.pid`, `gateway_state.json` or a scoped
//!   token lock. Our own records live in `<home>/gatewarden/` ([`HermesHome::ours_dir`]).
//! - The planned-stop marker is written in hermes's exact format ([`marker`]).
//!
//! Modules:
//! - [`home`]: selecting and naming a hermes home.
//! - [`files`]: lenient readers for hermes's files.
//! - [`holder`]: who holds the lock, without taking it.
//! - [`status`]: the status report and its text rendering.
//! - [`marker`]: the planned-stop marker.
//! - [`launch`]: what `start`/`restart` will run, resolved before anything is stopped.
//! - [`stop`], [`start`], [`restart`]: verified lifecycle actions.
//! - [`policy`]: what `supervise` does after each hermes exit.
//! - [`supervise`]: the supervise loop for a hermes child.
//! - [`supervisor`]: who supervises a running hermes.
//! - [`history`], [`doctor`], [`unit`]: exit history, findings, a systemd unit.
//! - [`scoped`]: hermes's scoped credential locks, read and shared (one bot token, one gateway).
//! - [`sys`]: the per-OS facade (the only place with `cfg`).

pub mod doctor;
pub mod files;
pub mod history;
pub mod holder;
pub mod home;
pub mod launch;
pub mod ledger;
pub mod marker;
pub mod policy;
pub mod restart;
pub mod scoped;
pub mod start;
pub mod status;
pub mod stop;
pub mod supervise;
pub mod supervisor;
pub mod sys;
pub mod unit;

pub use home::{HermesHome, SelectedBy};
pub use status::{HermesStatus, status};

/// The `kind` hermes writes into its pid and lock records.
pub const HERMES_KIND: &str = "hermes-gateway";
