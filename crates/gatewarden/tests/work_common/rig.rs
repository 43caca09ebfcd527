//! The update rig (tests/update.rs, tests/overlap.rs): a home whose gateway runs a private copy
//! of the built binary, so an update can swap that file, and real releases made from it (the
//! same build with its version string patched).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::common::*;

pub const UPDATE_LIMIT: Duration = Duration::from_secs(90);

pub struct Rig {
    pub home: TempHome,
    pub sw: Sweeper,
    pub dir: tempfile::TempDir,
    /// The installed executable the update swaps.
    pub exe: PathBuf,
    /// A pristine copy of the old version (script candidates delegate to it).
    pub pristine: PathBuf,
    pub version: String,
}

pub fn version_of(bin: &Path) -> String {
    let out = std::process::Command::new(bin).arg("--version").output().expect("--version");
    String::from_utf8_lossy(&out.stdout).trim().strip_prefix("gatewarden ").expect("gatewarden X").to_owned()
}

/// A home with `config`, the binary installed in a private directory, and a gateway running it.
pub fn rig(config: &str) -> (Rig, Gateway) {
    rig_then(|_| config.to_owned(), &[])
}

/// [`rig`] in `home` (a home on a filesystem of the test's own).
pub fn rig_on(home: TempHome, config: &str) -> (Rig, Gateway) {
    rig_with(Rig::installed_for(home), |_| config.to_owned(), &[])
}

/// [`rig`] whose config is made from the rig (to name its candidates), and a gateway started
/// with `env` too.
pub fn rig_then(config: impl FnOnce(&Rig) -> String, env: &[(&str, &str)]) -> (Rig, Gateway) {
    rig_with(Rig::installed(), config, env)
}

fn rig_with(r: Rig, config: impl FnOnce(&Rig) -> String, env: &[(&str, &str)]) -> (Rig, Gateway) {
    write_config(r.home.path(), &format!("[agent]\nbackend = \"echo\"\n{}", config(&r)));
    let mut b = GatewayBuilder::new(&r.exe, &r.home).env(TAG_VAR, r.sw.tag());
    for (k, v) in env {
        b = b.env(*k, *v);
    }
    let mut g = b.spawn();
    g.wait_ready(READY);
    (r, g)
}

impl Rig {
    /// A fresh home and the built binary copied into a private `bin/` (the file an update
    /// swaps), with a pristine copy in `rel/`; nothing written to the home, nothing running.
    pub fn installed() -> Rig {
        Rig::installed_for(TempHome::new())
    }

    /// [`Rig::installed`] for `home` (a home on a filesystem of the test's own).
    pub fn installed_for(home: TempHome) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::fs::create_dir(dir.path().join("rel")).unwrap();
        let exe = dir.path().join("bin/gatewarden");
        std::fs::copy(bin(), &exe).unwrap();
        let pristine = dir.path().join("rel/pristine");
        std::fs::copy(bin(), &pristine).unwrap();
        let version = version_of(&exe);
        Rig { home, sw: Sweeper::new(), dir, exe, pristine, version }
    }

    /// The same build with every occurrence of its version string replaced by `to` (same
    /// length): a real gatewarden that reports `to` everywhere.
    pub fn release(&self, to: &str) -> PathBuf {
        assert_eq!(to.len(), self.version.len(), "the patched version must keep the length");
        let bytes = std::fs::read(&self.pristine).unwrap();
        let (old, new) = (self.version.as_bytes(), to.as_bytes());
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        let mut n = 0;
        let edge = |b: Option<&u8>| b.is_none_or(|c| !(c.is_ascii_digit() || *c == b'.'));
        while i < bytes.len() {
            // Only the end is checked: the linker merges string literals, so the version may
            // follow another string's last digit ("WATCHDOG=1" + "0.1.0").
            if bytes[i..].starts_with(old) && edge(bytes.get(i + old.len())) {
                out.extend_from_slice(new);
                i += old.len();
                n += 1;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        assert!(n > 0, "version string not found in the binary");
        let path = self.dir.path().join(format!("rel/gatewarden-{to}"));
        std::fs::write(&path, out).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(version_of(&path), to);
        path
    }

    /// A shell-script candidate: `--version` says `version`, `check` runs the real check of
    /// the pristine binary, and `run` does `run_body`.
    pub fn script(&self, name: &str, version: &str, run_body: &str) -> PathBuf {
        let path = self.dir.path().join(format!("rel/{name}"));
        let text = format!(
            "#!/bin/sh\ncase \"$*\" in\n  *--version*) echo \"gatewarden {version}\";;\n  *\" check\"*) exec {} \"$@\";;\n  *) {run_body};;\nesac\n",
            self.pristine.display()
        );
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    pub fn update(&self, args: &[&str]) -> CliOutput {
        let mut all = vec!["update"];
        all.extend_from_slice(args);
        cli_with(&self.exe, self.home.path(), &all, &[(TAG_VAR, self.sw.tag())], UPDATE_LIMIT)
    }

    pub fn txn(&self) -> Value {
        self.home.read_json("update.json").unwrap_or(Value::Null)
    }

    /// Exactly one gateway process runs, it holds the lock, answers `running`, reports
    /// `version`, and the installed executable is that version.
    #[track_caller]
    pub fn assert_one_gateway(&self, version: &str) {
        let mut seen = String::new();
        let ok = wait_until(READY, || {
            let gateways: Vec<u32> = self
                .sw
                .tagged()
                .into_iter()
                .filter(|&p| {
                    let c = sweep::cmdline_of(p);
                    // Script candidates (`sh …`) are not gateways; the wrong-version one runs
                    // the pristine copy of the old build.
                    c.first().is_some_and(|a| !a.ends_with("sh")) && c.iter().any(|a| a == "run")
                })
                .collect();
            let holders = lock_holders(&self.home.lock_file());
            let st = cli(&self.exe, self.home.path(), &["status", "--json"]);
            let v = if st.code == Some(0) { st.json() } else { Value::Null };
            seen = format!("gateways {gateways:?}, lock holders {holders:?}, status {v}");
            gateways.len() == 1
                && holders == gateways
                && v["state"] == json!("running")
                && v["version"] == json!(version)
                && v["pid"] == json!(gateways[0])
        });
        assert!(ok, "expected exactly one gateway running {version}: {seen}\n{}", self.home.ledger_text());
        assert_eq!(version_of(&self.exe), version, "the installed executable");
    }
}
