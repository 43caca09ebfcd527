//! The rendered unit passes `systemd-analyze verify` (user and system scope).
#![cfg(target_os = "linux")]

use std::process::Command;

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::unit::{Scope, UnitOptions, render, unit_name};

#[test]
fn rendered_units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        gatewarden_testkit::unavailable::<()>("systemd-analyze", "not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let home = HermesHome::at(dir.path().join("hermes home"));
    std::fs::create_dir_all(home.dir()).expect("mkdir");
    // A system unit of a home owned by another user runs as that user (numeric User=/Group=).
    for (scope, run_as) in [(Scope::User, None), (Scope::System, None), (Scope::System, Some((65534, 65534)))] {
        let o = UnitOptions {
            home: home.clone(),
            gatewarden: "/bin/true".into(),
            hermes: "/bin/true".into(),
            scope,
            drain_timeout_s: 0,
            run_as,
        };
        let path = dir.path().join(unit_name(&home));
        std::fs::write(&path, render(&o)).expect("write unit");
        let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{scope:?}: {stderr}");
        assert!(!stderr.contains(&path.display().to_string()), "{scope:?}: warnings about our unit: {stderr}");
    }
}
