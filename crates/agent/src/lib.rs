//! gatewarden-agent: what answers messages, and what remembers them.
//!
//! - [`config`]: `<home>/config.toml` (every key optional, located errors, exit 78).
//! - [`backend`]: the [`Agent`] trait and its three backends (`echo`, `exec`, `openai`).
//! - [`journal`]: the durable SQLite message journal (accepted → queued → running → done/failed,
//!   re-run once after an interruption, never completed twice).

pub mod backend;
pub mod config;
pub mod journal;

pub use backend::{
    Agent, AgentError, AgentFuture, AgentReply, AgentRequest, ProviderEvent, ProviderStatus, Turn, Usage, build_agent,
    build_agent_with_env, within_budget,
};
pub use config::{AgentConfig, BackendKind, ClusterConfig, Config, ConfigError, EX_CONFIG, ProviderConfig};
pub use journal::{Journal, JournalError, Store};
