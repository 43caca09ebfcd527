//! Issue 28: the release artifacts `scripts/release` makes are what `gatewarden update`
//! installs, end to end over https with a test CA.
//!
//! The script packages this test build's debug binary (`--prebuilt`): a fat-LTO release build
//! takes minutes and CI builds none; the packaging, the completions, the man page, the
//! checksums and the signatures are the script's own either way. The running gateway is the
//! same build with its version patched down to 0.0.9 (work_common's `Rig::release`), so the
//! release is the newer version a configured `[update] public_key` asks for.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::netfakes::StaticHttp;
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};
use std::path::Path;
use std::process::Command;
use work_common::rig::*;
use work_common::*;

/// `minisign` (Debian's package), or `None` (reported; a failure under CI).
fn minisign() -> Option<()> {
    match Command::new("minisign").arg("-v").output() {
        Ok(_) => Some(()),
        Err(e) => gatewarden_testkit::unavailable("minisign", &format!("{e} (apt-get install minisign)")),
    }
}

#[track_caller]
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

#[test]
fn the_release_scripts_tarball_is_installed_by_update_over_https() {
    let Some(()) = minisign() else { return };
    let keys = tempfile::tempdir().unwrap();
    let (public, secret) = (keys.path().join("release.pub"), keys.path().join("release.sec"));
    run_ok(Command::new("minisign").args(["-G", "-W", "-p"]).arg(&public).arg("-s").arg(&secret));
    let key_line = std::fs::read_to_string(&public).unwrap().lines().nth(1).unwrap().to_owned();

    // The script's output.
    let out = keys.path().join("dist");
    let script = gatewarden_testkit::podman::repo_root().join("scripts/release");
    run_ok(
        Command::new(&script)
            .arg("--key")
            .arg(&secret)
            .arg("--out")
            .arg(&out)
            .arg("--prebuilt")
            .arg(bin())
            .env("GATEWARDEN_RELEASE_GZIP", "1"),
    );
    let version = version_of(Path::new(bin()));
    let tarball = format!("gatewarden-{version}-x86_64-linux.tar.gz");
    let listing = run_ok(Command::new("tar").arg("tzf").arg(out.join(&tarball)));
    for f in [
        "gatewarden",
        "LICENSE",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "README.md",
        "completions/gatewarden.bash",
        "completions/_gatewarden",
        "completions/gatewarden.fish",
        "man/gatewarden.1",
    ] {
        assert!(
            listing.lines().any(|l| l == format!("gatewarden-{version}-x86_64-linux/{f}")),
            "{f} not in:\n{listing}"
        );
    }
    run_ok(Command::new("sha256sum").arg("-c").arg("SHA256SUMS").current_dir(&out));
    run_ok(Command::new("minisign").arg("-V").arg("-p").arg(&public).arg("-m").arg(out.join("SHA256SUMS")));

    // Served over https by a test CA's certificate; the gateway trusts that CA for updates.
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    let origin = StaticHttp::files(files).unwrap();
    let ca = TestCa::new("gatewarden release test CA");
    let front = TlsFront::start(origin.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let base = format!("https://localhost:{}", front.addr().port());

    // A gateway running an older version of the same build, with the release key configured.
    let r = Rig::installed();
    let ca_file = ca.write_pem(r.dir.path(), "ca.pem");
    std::fs::copy(r.release("0.0.9"), &r.exe).unwrap();
    write_config(
        r.home.path(),
        &format!(
            "[agent]\nbackend = \"echo\"\n[update]\nprobation_s = 1\npublic_key = \"{key_line}\"\nca_file = \"{}\"\n",
            ca_file.display()
        ),
    );
    let mut g = GatewayBuilder::new(&r.exe, &r.home).env(TAG_VAR, r.sw.tag()).spawn();
    g.wait_ready(READY);
    let from = format!("{base}/{tarball}");
    let sig = format!("{base}/{tarball}.minisig");
    let up = r.update(&["--from", &from, "--signature", &sig, "--timeout", "60"]);
    assert_cli(&up, 0, "update from the release tarball");
    assert!(up.stdout.contains(&format!("updated 0.0.9 → {version}")), "{up:#?}");
    r.assert_one_gateway(&version);
    assert!(front.handshakes() >= 2, "tarball and signature came over TLS");

    // A tarball whose signature is not the release key's is refused before anything changes.
    let other = keys.path().join("other.sec");
    run_ok(Command::new("minisign").args(["-G", "-W", "-p"]).arg(keys.path().join("other.pub")).arg("-s").arg(&other));
    let forged = keys.path().join("forged.minisig");
    run_ok(
        Command::new("minisign")
            .arg("-S")
            .arg("-s")
            .arg(&other)
            .arg("-m")
            .arg(out.join(&tarball))
            .arg("-x")
            .arg(&forged),
    );
    let bad = r.update(&["--from", &from, "--signature", forged.to_str().unwrap(), "--allow-downgrade"]);
    assert_cli(&bad, 1, "a signature by another key");
    assert!(bad.text_lc().contains("signature"), "{bad:#?}");
    r.assert_one_gateway(&version);
}
