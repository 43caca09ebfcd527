//! The gatewarden lifecycle kernel.
//!
//! Everything the gateway and the CLI need to agree on "who runs, who may be signalled, and
//! how it ended", with no async runtime and no HTTP:
//!
//! - [`identity`]: a process is `(pid, start_time)`, compared exactly.
//! - [`probe`]: a total liveness probe (`Alive | Dead | Unknown`); [`liveness`]: the pure
//!   mapping of OS answers onto it (including Windows error codes), testable on any host.
//! - [`procfs`]: pure parsers of the `/proc` texts the facade reads.
//! - [`lock`]: the OS-held instance lock, the single truth for "a gateway runs in this home".
//! - [`records`] and [`fsio`]: atomic writes and lenient reads of `gateway.pid` and
//!   `gateway_state.json`.
//! - [`marker`]: planned-stop and takeover markers that are obeyed only by the incarnation
//!   they name, and healed by whoever finds them stale.
//! - [`desired`]: the operator's intent (run or stopped), binding on every starter.
//! - [`disk`]: a home on a full disk, named by `status` and `doctor`.
//! - [`overlap`]: pure decisions for verbs that overlap (a swap meeting a restart).
//! - [`exit`]: the one intent → exit-code table.
//! - [`supervisor`]: who supervises us (systemd, launchd, container, override, none).
//! - [`ledger`]: the append-only lifecycle ledger.
//! - [`home`]: where state lives and the names of its files.
//! - [`platform`]: the per-OS facade; the only place with `cfg`. It uses the pure modules
//!   ([`identity`], [`liveness`], [`procfs`]) and nothing above it, so no module circles back.
//! - [`term`]: outside text escaped for a terminal.

pub mod crashes;
pub mod desired;
pub mod disk;
pub mod exit;
pub mod fsio;
pub mod heal;
pub mod holder;
pub mod home;
pub mod identity;
pub mod ledger;
pub mod liveness;
pub mod lock;
pub mod marker;
pub mod overlap;
pub mod platform;
pub mod probe;
pub mod procfs;
pub mod records;
pub mod sdnotify;
pub mod supervisor;
pub mod term;
pub mod timefmt;

pub use exit::ExitIntent;
pub use home::Home;
pub use identity::ProcessIdentity;
pub use liveness::Liveness;
pub use lock::{InstanceLock, LockError};
pub use supervisor::Supervisor;

/// The version every record, hello and ledger line carries. A build may override it (never a
/// running process): `GATEWARDEN_BUILD_VERSION=0.2.0-rc1 cargo build` stamps release candidates.
pub const VERSION: &str = match option_env!("GATEWARDEN_BUILD_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};
