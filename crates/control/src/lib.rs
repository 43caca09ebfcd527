//! The control protocol between the CLI and a running gateway (docs/protocol.md §3).
//!
//! - [`proto`]: the messages, one payload type per request, one status shape.
//! - [`endpoint`]: where a home's endpoint lives (socket path or pipe name).
//! - [`client`]: a blocking client with deadlines, for the CLI.
//! - [`framing`]: newline-delimited JSON with a size cap.
//! - [`stopper`]: the one stop escalation (control, marker + verified SIGTERM, verified kill).
//! - [`runs`]: the tag an incarnation's agent runs carry, and ending what they left.

pub mod client;
pub mod endpoint;
pub mod framing;
pub mod proto;
pub mod runs;
pub mod stopper;
mod transport;

pub use client::{Client, ClientError};
pub use endpoint::Endpoint;
pub use proto::{Hello, Op, PairingRequest, Request, Requester, Response, StatusReport, StopReason};

/// Protocol version; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
/// The `proto` string in the hello.
pub const PROTOCOL_NAME: &str = "gatewarden-control";
/// Largest accepted line, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
