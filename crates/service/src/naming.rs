//! Per-home identity of the service definitions.
//!
//! Several homes can be installed side by side, so every manager-visible name carries the
//! home's identity. The default home keeps the short, memorable name
//! (`gatewarden.service`, `ai.gatewarden.gateway`, `gatewarden`); any other home gets a suffix of
//! 8 hex digits of a **stable** hash of its canonical path, so a foreign home can never alias
//! the default one and two homes never share a unit.
//!
//! The hash is FNV-1a 64 implemented here. `std`'s `DefaultHasher` is randomly keyed per
//! process and may change between Rust releases, which would rename installed services after a
//! rebuild; FNV-1a is fixed forever. We take the **high** 32 bits: FNV's multiply only carries
//! upwards, so the high bits depend on every input byte while the low bits mix poorly.

use std::path::Path;

/// FNV-1a 64-bit offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Systemd unit stem, launchd label and Windows name of the default home.
pub const BASE_NAME: &str = "gatewarden";
/// launchd label of the default home.
pub const LAUNCHD_BASE_LABEL: &str = "ai.gatewarden.gateway";

/// FNV-1a 64 of `bytes`. Stable across processes, platforms and Rust versions.
#[must_use]
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// 8 lowercase hex digits identifying a canonical home path.
///
/// The path is hashed through [`std::ffi::OsStr::as_encoded_bytes`]: raw bytes on Unix, and
/// plain UTF-8 for every valid-Unicode path on every platform, so the value is reproducible.
#[must_use]
pub fn home_hash8(canonical_home: &Path) -> String {
    let hash = fnv1a64(canonical_home.as_os_str().as_encoded_bytes());
    format!("{:08x}", hash >> 32)
}

/// The names a home's service definitions use with each manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceNames {
    /// `None` for the default home, else the 8-hex suffix.
    suffix: Option<String>,
}

impl ServiceNames {
    /// Names for `canonical_home`. The caller decides whether it is the per-OS default home
    /// (it knows the resolution rules; see `docs/protocol.md` §1).
    #[must_use]
    pub fn new(canonical_home: &Path, is_default_home: bool) -> Self {
        let suffix = (!is_default_home).then(|| home_hash8(canonical_home));
        Self { suffix }
    }

    /// The 8-hex suffix, `None` for the default home.
    #[must_use]
    pub fn suffix(&self) -> Option<&str> {
        self.suffix.as_deref()
    }

    /// `gatewarden.service` or `gatewarden-<hash>.service`.
    #[must_use]
    pub fn systemd_unit(&self) -> String {
        format!("{}.service", self.windows_name())
    }

    /// `ai.gatewarden.gateway` or `ai.gatewarden.gateway.<hash>`.
    #[must_use]
    pub fn launchd_label(&self) -> String {
        match &self.suffix {
            None => LAUNCHD_BASE_LABEL.to_owned(),
            Some(h) => format!("{LAUNCHD_BASE_LABEL}.{h}"),
        }
    }

    /// File name of the LaunchAgent plist: `<label>.plist`.
    #[must_use]
    pub fn launchd_plist_file(&self) -> String {
        format!("{}.plist", self.launchd_label())
    }

    /// Windows scheduled-task and SCM service name: `gatewarden` or `gatewarden-<hash>`.
    #[must_use]
    pub fn windows_name(&self) -> String {
        match &self.suffix {
            None => BASE_NAME.to_owned(),
            Some(h) => format!("{BASE_NAME}-{h}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        // Vectors from the FNV reference (http://www.isthe.com/chongo/tech/comp/fnv/).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn default_home_uses_bare_names() {
        let n = ServiceNames::new(Path::new("/home/a/.local/state/gatewarden"), true);
        assert_eq!(n.systemd_unit(), "gatewarden.service");
        assert_eq!(n.launchd_label(), "ai.gatewarden.gateway");
        assert_eq!(n.launchd_plist_file(), "ai.gatewarden.gateway.plist");
        assert_eq!(n.windows_name(), "gatewarden");
        assert_eq!(n.suffix(), None);
    }

    #[test]
    fn other_home_gets_stable_suffix() {
        let home = Path::new("/srv/gw/team-a");
        let n = ServiceNames::new(home, false);
        let h = home_hash8(home);
        assert_eq!(h.len(), 8);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // Pinned so a refactor cannot silently rename installed services.
        assert_eq!(h, format!("{:08x}", fnv1a64(b"/srv/gw/team-a") >> 32));
        assert_eq!(n.systemd_unit(), format!("gatewarden-{h}.service"));
        assert_eq!(n.launchd_label(), format!("ai.gatewarden.gateway.{h}"));
        assert_eq!(n.windows_name(), format!("gatewarden-{h}"));
    }

    #[test]
    fn distinct_homes_get_distinct_names() {
        let a = ServiceNames::new(Path::new("/srv/gw/a"), false);
        let b = ServiceNames::new(Path::new("/srv/gw/b"), false);
        assert_ne!(a.systemd_unit(), b.systemd_unit());
    }
}
