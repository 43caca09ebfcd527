//! gatewarden-testkit
