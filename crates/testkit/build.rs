//! Compiles the std-only signal-logging decoy (`decoy/gw_decoy.rs`) into OUT_DIR and exposes its
//! path to the library as `env!("GW_DECOY_BIN")`.
//!
//! Why not just a `[[bin]]`: `CARGO_BIN_EXE_<name>` is only set for the *owning* package's
//! integration tests, and a dev-dependency's binaries are never built when another package's
//! tests are built (`cargo nextest run -p gatewarden` on a clean checkout would find nothing in
//! `target/<profile>/`). A build script runs whenever the library is built, so the decoy exists
//! exactly when testkit is usable. The decoy has no dependencies, so one `rustc` call suffices.
//!
//! If the compile fails (exotic toolchain setup), the build still succeeds with a warning and the
//! library falls back at run time to `$GW_DECOY_BIN` or `target/<profile>/gw-decoy`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=decoy/gw_decoy.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").unwrap_or_default();
    let exe_suffix = if target.contains("windows") { ".exe" } else { "" };
    let out = out_dir.join(format!("gw-decoy{exe_suffix}"));

    let mut cmd = Command::new(rustc);
    cmd.arg("--edition=2024")
        .arg("--crate-name=gw_decoy")
        .arg("--crate-type=bin")
        .arg("-Copt-level=1")
        .arg("-Cdebuginfo=0")
        .arg("-o")
        .arg(&out)
        .arg(manifest.join("decoy/gw_decoy.rs"));
    if !target.is_empty() {
        cmd.arg(format!("--target={target}"));
    }
    if let Ok(linker) = env::var("RUSTC_LINKER") {
        cmd.arg(format!("-Clinker={linker}"));
    }
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        for f in flags.split('\x1f').filter(|f| !f.is_empty()) {
            cmd.arg(f);
        }
    }
    match cmd.output() {
        Ok(o) if o.status.success() => {
            println!("cargo:rustc-env=GW_DECOY_BIN={}", out.display());
        }
        Ok(o) => {
            println!(
                "cargo:warning=gw-decoy build failed ({}); decoy tests will look for $GW_DECOY_BIN",
                String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("")
            );
            println!("cargo:rustc-env=GW_DECOY_BIN=");
        }
        Err(e) => {
            println!("cargo:warning=cannot run rustc for gw-decoy: {e}");
            println!("cargo:rustc-env=GW_DECOY_BIN=");
        }
    }
}
