//! gatewarden-lifecycle
