//! gatewarden-agent: what answers messages.
//!
//! - [`backend`]: the [`Agent`] trait and its four backends (`echo`, `exec`, `openai`, `hermes`), built
//!   from `[agent]` of config.toml (crates/config).

pub mod backend;

pub use backend::{
    Agent, AgentError, Approvals, HermesAgent, Pending, Question, AgentFuture, AgentReply, AgentRequest, ProviderEvent, ProviderStatus, Turn, Usage, build_agent,
    build_agent_with_env, within_budget,
};
