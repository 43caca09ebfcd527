//! gatewarden-agent
