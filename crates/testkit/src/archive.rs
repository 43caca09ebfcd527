//! Release archives for tests of `update --from` (crates/gatewarden/src/cmd/update/archive.rs
//! and crates/gatewarden/tests/update.rs): a `.tar.gz` written header by header, so a test can
//! also hold what the `tar` builder refuses to write (`..` in a name, a link out of the tree).

use std::io::Write;

/// A `.tar.gz` of regular files `(name, data)`, mode 755.
pub fn tar_gz(members: &[(&str, &[u8])]) -> Vec<u8> {
    let members: Vec<(&str, tar::EntryType, &[u8])> =
        members.iter().map(|(name, data)| (*name, tar::EntryType::Regular, *data)).collect();
    tar_gz_members(&members)
}

/// A `.tar.gz` of `(name, kind, data)` members, mode 755, names written raw; a link member
/// points at `elsewhere`.
pub fn tar_gz_members(members: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let mut raw = Vec::new();
    for (name, kind, data) in members {
        let mut h = tar::Header::new_gnu();
        let field = &mut h.as_old_mut().name;
        field[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_mode(0o755);
        h.set_size(data.len() as u64);
        if kind.is_symlink() {
            h.set_link_name("elsewhere").expect("a short link name");
        }
        h.set_cksum();
        raw.extend_from_slice(h.as_bytes());
        raw.extend_from_slice(data);
        raw.resize(raw.len().div_ceil(512) * 512, 0);
    }
    raw.extend_from_slice(&[0; 1024]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).expect("writing to a Vec");
    gz.finish().expect("writing to a Vec")
}
