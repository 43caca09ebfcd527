//! `config.toml` (crates/config/config.example.toml), loaded as `Config::load` does after the
//! read: any bytes give a configuration or a located error whose line is inside the file.
#![no_main]

use std::path::Path;

use gatewarden_config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Config::from_bytes(Path::new("/home/a/.local/state/gatewarden/config.toml"), data) {
        Ok(config) => {
            let _ = config.is_loopback_listen();
            let _ = config.check_exposure();
            let _ = (config.drain_timeout(), config.agent.timeout(), config.agent.delay(), config.agent.kill_grace());
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            let _ = (e.exit_code(), e.key());
            if let Some(line) = e.line() {
                let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
                assert!((1..=lines).contains(&line), "error line {line} outside a {lines}-line file: {e}");
            }
        }
    }
});
