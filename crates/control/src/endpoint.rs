//! Where a home's control endpoint lives.

use std::path::{Path, PathBuf};

/// A control endpoint address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix stream socket.
    Socket(PathBuf),
    /// A Windows named pipe (`\\.\pipe\...`).
    Pipe(String),
}

/// Longest socket path we use: `sun_path` is 104 bytes on macOS, 108 on Linux, NUL included.
const MAX_SOCKET_PATH: usize = 100;

impl Endpoint {
    /// The endpoint for a (canonical) home directory.
    pub fn for_home(home: &Path) -> Endpoint {
        if cfg!(windows) {
            return Endpoint::Pipe(format!(r"\\.\pipe\gatewarden-{:016x}", fnv1a(home.to_string_lossy().as_bytes())));
        }
        let p = home.join("control.sock");
        if p.as_os_str().len() <= MAX_SOCKET_PATH {
            Endpoint::Socket(p)
        } else {
            // A deep home would overflow sun_path: use a short, per-user, per-home name.
            Endpoint::Socket(short_socket_dir().join(format!("{:016x}.sock", fnv1a(home.to_string_lossy().as_bytes()))))
        }
    }

    /// The shared short-path folder ([`short_socket_dir`]) this socket lives in, if it does:
    /// a client checks that folder before it believes the socket (transport/unix.rs).
    pub(crate) fn shared_folder(&self) -> Option<&Path> {
        match self {
            Endpoint::Socket(p) => p.parent().filter(|d| *d == short_socket_dir()),
            Endpoint::Pipe(_) => None,
        }
    }

    pub fn display(&self) -> String {
        match self {
            Endpoint::Socket(p) => p.to_string_lossy().into_owned(),
            Endpoint::Pipe(n) => n.clone(),
        }
    }
}

/// The folder for short socket paths: `$XDG_RUNTIME_DIR/gatewarden` when `XDG_RUNTIME_DIR` is
/// an absolute directory of ours with mode 0700 (a per-user folder nobody else can pre-create),
/// else `/tmp/gatewarden-<uid>`. Deterministic for a given user and environment, so the server
/// and the client agree; both check the folder on every use ([`check_socket_dir`]).
pub fn short_socket_dir() -> PathBuf {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && crate::transport::check_private_dir(p).is_ok());
    short_socket_dir_for(xdg, crate::transport::uid())
}

fn short_socket_dir_for(xdg: Option<PathBuf>, uid: u32) -> PathBuf {
    match xdg {
        Some(run) => run.join("gatewarden"),
        None => PathBuf::from(format!("/tmp/gatewarden-{uid}")),
    }
}

/// Server side: creates the short-path folder 0700 if missing and refuses one that is not a
/// directory of ours with mode 0700 (another user who created it first could swap sockets).
pub fn prepare_socket_dir(dir: &Path) -> Result<(), String> {
    crate::transport::prepare_private_dir(dir)
}

/// Client side: the same check, without creating anything.
pub fn check_socket_dir(dir: &Path) -> Result<(), String> {
    crate::transport::check_private_dir(dir)
}

/// FNV-1a 64: stable across runs and versions, unlike std's randomized hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_homes_use_the_home_and_long_ones_a_hash() {
        if cfg!(windows) {
            assert!(
                matches!(Endpoint::for_home(Path::new("C:\\x")), Endpoint::Pipe(n) if n.starts_with(r"\\.\pipe\gatewarden-"))
            );
            return;
        }
        assert_eq!(Endpoint::for_home(Path::new("/h")), Endpoint::Socket("/h/control.sock".into()));
        let long = PathBuf::from("/").join("x".repeat(150));
        let Endpoint::Socket(p) = Endpoint::for_home(&long) else { panic!() };
        assert!(p.as_os_str().len() <= MAX_SOCKET_PATH, "{}", p.display());
        assert_eq!(Endpoint::for_home(&long), Endpoint::for_home(&long));
    }

    #[test]
    fn xdg_runtime_dir_is_preferred_when_usable() {
        assert_eq!(short_socket_dir_for(None, 7), PathBuf::from("/tmp/gatewarden-7"));
        assert_eq!(short_socket_dir_for(Some("/run/user/7".into()), 7), PathBuf::from("/run/user/7/gatewarden"));
    }

    #[cfg(unix)]
    #[test]
    fn socket_dir_must_be_private_and_ours() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("gw");
        prepare_socket_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(prepare_socket_dir(&dir).unwrap_err().contains("755"));
        assert!(check_socket_dir(&dir).is_err());
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(check_socket_dir(&link).unwrap_err().contains("not a directory"));
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
