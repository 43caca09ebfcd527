//! gatewarden-service
