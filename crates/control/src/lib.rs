//! gatewarden-control
