//! gatewarden-dashboard: the gateway's web dashboard: pure parts, and the web layer that serves them.
//!
//! * [`snapshot`]: the plain data a page is rendered from ([`Snapshot`], [`HomeSummary`]).
//! * [`timeline`]: the ledger reduced to incarnations (how each ended, who asked).
//! * [`render`]: the main page, its live fragments, the fleet page (HTML with inline SVG).
//! * [`text`]: the same snapshot as plain text, for a terminal view.
//! * [`sse`]: the server-sent-events encoder and the fragment ids the page's script swaps.
//! * [`actions`]: what a button does (the CLI verb it runs) and the outcome it reports.
//! * [`auth`]: token → session cookie, CSRF, `Origin`/`Host` checks.
//! * [`gather`]: a snapshot from a home's files (ledger, desired state, state file, OS lock).
//! * [`registry`]: the per-user registry of gateway homes the fleet page lists.
//! * [`web`]: the one web layer both servers mount (a gateway's `/ui`, the fleet's pages):
//!   who may read, logins and their throttle, sessions, event streams, action checks.
//!
//! Nothing here listens or spawns: the runtime and `gatewarden dashboard` serve [`web`]'s
//! routes (crates/dashboard/README.md).

pub mod actions;
pub mod auth;
pub mod gather;
pub mod live;
pub mod registry;
pub mod render;
pub mod snapshot;
pub mod sse;
pub mod text;
pub mod timeline;
pub mod web;

pub use render::{Viewer, fleet, fragment, page};
pub use snapshot::{HomeSummary, Snapshot};
