//! gatewarden-agent: what answers messages.
//!
//! - [`backend`]: the [`Agent`] trait and its four backends (`echo`, `exec`, `openai`, `hermes`), built
//!   from `[agent]` of config.toml (crates/config).

pub mod backend;

pub use backend::{
    Agent, AgentError, AgentFuture, AgentReply, AgentRequest, Approvals, HermesAgent, Pending, ProviderEvent,
    ProviderStatus, Question, Transcriber, Turn, Usage, build_agent, build_agent_with, within_budget,
};
