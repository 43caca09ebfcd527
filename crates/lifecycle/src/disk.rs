//! A home on a full disk (issue 30, item 3): `status` and `doctor` name it, with the path and
//! the space left, because every record the lifecycle relies on (the ledger, the state file,
//! the journal) stops being written there.

use std::path::Path;

use serde::Serialize;

use crate::platform;

/// Below this many free bytes a home's disk is full: the journal, the ledger and the records
/// can no longer be counted on (the ledger alone rotates at 1 MiB).
pub const FULL_BELOW: u64 = 1 << 20;

/// A full disk under a home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Full {
    pub path: String,
    pub free_bytes: u64,
}

impl Full {
    pub fn describe(&self) -> String {
        format!(
            "the disk holding {} is full ({} bytes free): records, the ledger and the journal cannot be written; free some space",
            self.path, self.free_bytes
        )
    }
}

/// Pure: whether `free_bytes` at `path` is a full disk.
pub fn judge(path: &Path, free_bytes: u64) -> Option<Full> {
    (free_bytes < FULL_BELOW).then(|| Full { path: path.to_string_lossy().into_owned(), free_bytes })
}

/// The disk under `home_dir`, when it is full (`None` when it has room or cannot be asked).
pub fn full(home_dir: &Path) -> Option<Full> {
    judge(home_dir, platform::free_space(home_dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_below_a_mebibyte() {
        let p = Path::new("/h");
        assert_eq!(judge(p, 0), Some(Full { path: "/h".into(), free_bytes: 0 }));
        assert!(judge(p, FULL_BELOW - 1).is_some());
        assert_eq!(judge(p, FULL_BELOW), None);
        assert!(judge(p, 4096).unwrap().describe().contains("/h is full (4096 bytes free)"));
    }

    #[cfg(unix)]
    #[test]
    fn the_temp_dir_has_room() {
        let dir = tempfile::tempdir().unwrap();
        assert!(platform::free_space(dir.path()).is_some_and(|f| f > 0));
    }
}
