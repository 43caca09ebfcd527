//! gatewarden-runtime
