//! The home's copies of gatewarden executables: the staged releases
//! (`<home>/releases/<version>-<sha12>/`) and the last known good copy that the systemd unit's
//! `ExecStopPost=` runs to revert a release that cannot start. Shared by `update` (which
//! stages, swaps and blesses), `service install` (which refreshes the good copy) and the
//! owners (whose definitions name it).

use std::io::Read;
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::Home;
use sha2::Digest;

pub(crate) const RELEASES: &str = "releases";

/// `gatewarden`, `gatewarden.exe` on Windows.
fn exe_name() -> String {
    format!("gatewarden{}", std::env::consts::EXE_SUFFIX)
}

/// Where the last blessed binary is kept for `ExecStopPost=` (a stable path the unit names).
pub fn good_copy(home: &Home) -> PathBuf {
    let name = exe_name();
    home.dir().join(RELEASES).join("good").join(name)
}

/// Refreshes [`good_copy`] from `exe` (at `service install` and at every blessing).
pub fn refresh_good_copy(home: &Home, exe: &Path) -> std::io::Result<()> {
    copy_executable(exe, &good_copy(home))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

pub(crate) fn release_path(home: &Home, version: &str, sha: &str) -> PathBuf {
    let name = exe_name();
    home.dir().join(RELEASES).join(format!("{version}-{}", &sha[..sha.len().min(12)])).join(name)
}

pub(crate) fn write_executable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    crate::os::proc::make_executable(path)
}

/// Copies an executable (keeping it runnable), unless an identical copy is there already.
pub(crate) fn copy_executable(from: &Path, to: &Path) -> std::io::Result<()> {
    if to.is_file() && sha256_file(to).ok() == sha256_file(from).ok() {
        return Ok(());
    }
    if let Some(p) = to.parent() {
        // 0700 whatever the umask (the home's releases; an existing folder is left alone).
        gatewarden_lifecycle::platform::create_private_dir(p)?;
    }
    let tmp = to.with_extension("partial");
    std::fs::copy(from, &tmp)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    crate::os::proc::make_executable(&tmp)?;
    std::fs::rename(&tmp, to)
}
