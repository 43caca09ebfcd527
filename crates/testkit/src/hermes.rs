//! The hermes-agent 0.19 venv (`scripts/hermes-venv`) and what its processes must not inherit,
//! shared by the hermes crate's tests and the `--hermes-home` CLI tests.

use std::path::PathBuf;

/// The venv holding `bin/hermes`: `GATEWARDEN_HERMES_VENV`, else
/// `~/.cache/gatewarden/hermes-venv`. Missing: [`crate::unavailable`] (fails under `CI`).
pub fn venv() -> Option<PathBuf> {
    let dir = std::env::var_os("GATEWARDEN_HERMES_VENV")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gatewarden/hermes-venv")));
    match dir {
        Some(d) if d.join("bin/hermes").is_file() => Some(d),
        Some(d) => crate::unavailable("hermes-agent", &format!("no venv at {} (run scripts/hermes-venv)", d.display())),
        None => crate::unavailable("hermes-agent", "neither GATEWARDEN_HERMES_VENV nor HOME is set"),
    }
}

/// The venv, with the `[messaging]` extra hermes's API server needs (aiohttp): the stamp
/// `scripts/hermes-venv` writes once it is installed. Missing: [`crate::unavailable`].
pub fn venv_with_api_server() -> Option<PathBuf> {
    let v = venv()?;
    if v.join(".gatewarden-hermes-agent-0.19.0-messaging").is_file() {
        return Some(v);
    }
    crate::unavailable("hermes-agent[messaging]", &format!("{} lacks the [messaging] extra (run scripts/hermes-venv)", v.display()))
}

/// Variables a hermes child must not inherit: they would make it believe it is supervised, or
/// point it at the real user's state.
pub const SCRUB: &[&str] = &[
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "XPC_SERVICE_NAME",
    "HERMES_GATEWAY_EXTERNAL_SUPERVISOR",
    "HERMES_S6_SUPERVISED_CHILD",
    "HERMES_GATEWAY_LOCK_DIR",
    "GATEWARDEN_HERMES_HOME",
];

/// The API server key tests give hermes (hermes refuses keys under 16 characters).
pub const API_KEY: &str = "gatewarden-test-api-server-key-0123456789";

/// Writes a hermes home whose gateway serves the API server (the `api_server` platform) on
/// `127.0.0.1:<port>` with [`API_KEY`], its agent pointed at the OpenAI-compatible `llm_base`
/// (`http://…/v1`, e.g. [`crate::llmfake::FakeLlm::base_url`]), offline: no tirith download,
/// approvals left to the caller (hermes's own wait is an hour, so the caller's expiry decides),
/// the context window given (no model-metadata lookups), and only the terminal tool for API
/// runs (each run builds its agent with every enabled tool's checks: fewer is faster).
/// hermes's `.env` overrides the process environment, so everything is set there.
pub fn write_api_server_home(home: &std::path::Path, port: u16, llm_base: &str) {
    std::fs::create_dir_all(home).expect("hermes home");
    let env = format!(
        "API_SERVER_ENABLED=true\nAPI_SERVER_KEY={API_KEY}\nAPI_SERVER_PORT={port}\nAPI_SERVER_HOST=127.0.0.1\n\
         TIRITH_ENABLED=false\n"
    );
    std::fs::write(home.join(".env"), env).expect("hermes .env");
    let config = format!(
        "model:\n  provider: custom\n  base_url: {llm_base}\n  default: fake-model\n  api_key: sk-fake-provider\n\
         \x20 context_length: 128000\napprovals:\n  timeout: 3600\nplatform_toolsets:\n  api_server: [terminal]\n"
    );
    std::fs::write(home.join("config.yaml"), config).expect("hermes config.yaml");
}
