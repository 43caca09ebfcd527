//! systemd: the unit generator, a tolerant unit reader, drift detection, `systemctl show`
//! parsing and a `systemctl` wrapper.
//!
//! The unit runs the gateway directly (`gatewarden run --home H --supervisor systemd`,
//! `Type=notify`): systemd is a complete supervisor once the exit-code contract is declared
//! (see [`render`]), so no `gatewarden supervise` layer is needed here, unlike launchd.

pub mod drift;
pub mod render;
pub mod show;
pub mod syntax;
pub mod systemctl;
pub mod unit_file;

pub use drift::{drift, exec_start_binary, timeout_stop};
pub use render::{linger_hint, render_unit, unit_path};
pub use show::{ActiveState, SHOW_PROPERTIES, UnitResult, UnitStatus, parse_show};
pub use syntax::{TimeSpan, parse_timespan, quote_command, quote_word, split_words};
pub use systemctl::{IsActive, Systemctl, SystemctlError};
pub use unit_file::{ParsedUnit, UnitEntry, parse_unit};
