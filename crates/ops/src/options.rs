//! The verbs' options as plain data: the binary's parser (crates/gatewarden/src/cli.rs, where
//! each flag is documented) fills them, so this crate does not depend on clap.

/// `gatewarden service`: which subcommand.
#[derive(Debug, Clone)]
pub struct ServiceArgs {
    pub action: ServiceAction,
}

/// `service`'s subcommands (crates/gatewarden/src/cli.rs documents them).
#[derive(Debug, Clone)]
pub enum ServiceAction {
    Install(InstallArgs),
    Uninstall(UninstallArgs),
    Status { json: bool },
}

/// `service install`'s options, one per flag (crates/gatewarden/src/cli.rs documents them).
#[derive(Debug, Clone, Default)]
pub struct InstallArgs {
    pub system: bool,
    pub print: bool,
    pub run_as: Option<String>,
    pub no_start: bool,
    pub adopt: bool,
    pub hermes: Option<std::path::PathBuf>,
    pub restart_sec_ms: Option<u64>,
    pub watchdog_s: Option<u64>,
    pub start_limit_burst: Option<u32>,
    pub json: bool,
}

/// `service uninstall`'s options.
#[derive(Debug, Clone, Default)]
pub struct UninstallArgs {
    pub system: bool,
    pub json: bool,
}

/// `init`'s options, one per flag of `gatewarden init` (crates/gatewarden/src/cli.rs documents
/// them); what is not given is asked on a terminal.
#[derive(Debug, Clone, Default)]
pub struct InitArgs {
    pub platform: Option<String>,
    pub backend: Option<String>,
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub api_key_env: Option<String>,
    pub token_env: Option<String>,
    pub api_base: Option<String>,
    pub admins: Vec<String>,
    pub listen: Option<String>,
    pub force: bool,
    pub offline: bool,
    pub no_input: bool,
    pub json: bool,
}

/// `supervise`'s options, one per flag of `gatewarden supervise` (crates/gatewarden/src/cli.rs
/// documents them).
#[derive(Debug, Clone, Default)]
pub struct SuperviseArgs {
    pub listen: Option<String>,
    pub drain_timeout: Option<u64>,
    pub hermes: Option<std::path::PathBuf>,
    pub scm: bool,
    pub brake_restarts: usize,
    pub brake_window_s: u64,
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

/// `update`'s options, one per flag of `gatewarden update` (crates/gatewarden/src/cli.rs
/// documents them).
#[derive(Debug, Clone, Default)]
pub struct UpdateArgs {
    pub from: Option<String>,
    pub sha256: Option<String>,
    pub signature: Option<String>,
    pub timeout: u64,
    pub json: bool,
    pub status: bool,
    pub rollback: bool,
    pub resume: bool,
    pub after_exit: bool,
    pub allow_downgrade: bool,
    pub chat: Option<String>,
    pub chat_platform: Option<String>,
}
