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

    pub fn display(&self) -> String {
        match self {
            Endpoint::Socket(p) => p.to_string_lossy().into_owned(),
            Endpoint::Pipe(n) => n.clone(),
        }
    }
}

/// `/tmp/gatewarden-<uid>`: created 0700 by the server before binding.
pub fn short_socket_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/gatewarden-{}", crate::transport::uid()))
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
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
