//! A small tmpfs of a test's own (Linux, as root): a home on a disk the test fills and frees.
//! Without the right to mount one the test is skipped, and fails under `CI`
//! ([`crate::unavailable`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs, unmounted (lazily) on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB in a fresh directory; `None` when this process cannot.
    #[track_caller]
    pub fn mount(mib: u64) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new().prefix("gw-tmpfs-").tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => crate::unavailable("a tmpfs of the test's own", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => crate::unavailable("a tmpfs of the test's own", &format!("cannot run mount(8): {e}")),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn filler(&self) -> PathBuf {
        self.path().join(FILLER)
    }

    /// Fills the filesystem to its last byte ([`fill_dir`]): every write after this one fails
    /// with "no space left on device" until [`Tmpfs::free`].
    pub fn fill(&self) {
        fill_dir(self.path());
    }

    /// Gives back what [`Tmpfs::fill`] took.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }

    /// Bytes left on it.
    pub fn available(&self) -> u64 {
        let out = Command::new("df").args(["--output=avail", "-B1"]).arg(self.path()).output().expect("df");
        String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap_or(0)
    }
}

/// The file [`fill_dir`] fills the disk with.
const FILLER: &str = ".fill";

/// Fills the filesystem holding `dir` to its last byte, with one file (`.fill`) in `dir`;
/// [`Tmpfs::free`] gives it back. For a thread that fills at a point of its own choosing.
pub fn fill_dir(dir: &Path) {
    let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(FILLER)) else { return };
    for size in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
        let chunk = vec![0x5a_u8; size];
        while f.write_all(&chunk).is_ok() {}
    }
    let _ = f.sync_all();
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a process the test left (killed on its own drop) may still hold a file here.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
