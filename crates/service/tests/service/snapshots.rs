use gatewarden_service::spec::{Scope, ServiceSpec};
use gatewarden_service::{launchd, systemd, windows};

fn unix_spec() -> ServiceSpec {
    let mut s = ServiceSpec::new("/usr/local/bin/gatewarden", "/home/alice/.local/state/gatewarden");
    s.is_default_home = true;
    s
}

#[test]
fn systemd_user_unit() {
    insta::assert_snapshot!("systemd_user_unit", systemd::render_unit(&unix_spec()).unwrap());
}

#[test]
fn systemd_system_unit() {
    let mut s = ServiceSpec::new("/opt/gatewarden/bin/gatewarden", "/var/lib/gatewarden/team 50% $a");
    s.scope = Scope::System;
    s.run_as_user = Some("gatewarden".into());
    s.drain_timeout_s = 180;
    s.cron_floor_s = 30;
    s.extra_args = vec!["--log-level".into(), "debug".into()];
    insta::assert_snapshot!("systemd_system_unit", systemd::render_unit(&s).unwrap());
}

#[test]
fn launchd_plist() {
    let mut s = ServiceSpec::new("/usr/local/bin/gatewarden", "/Users/alice/Library/Application Support/gatewarden");
    s.is_default_home = true;
    insta::assert_snapshot!("launchd_plist", launchd::render_plist(&s).unwrap());
}

#[test]
fn windows_task_xml() {
    let s = ServiceSpec::new(
        r"C:\Program Files\gatewarden\gatewarden.exe",
        r"C:\Users\Alice & Bob\AppData\Local\gatewarden",
    );
    insta::assert_snapshot!("windows_task_xml", windows::render_task_xml(&s, r"DESKTOP-1\alice").unwrap());
}
