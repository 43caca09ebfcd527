//! Release archives for `update --from`: a gzip-compressed tar holding one executable named
//! `gatewarden` (or `gatewarden.exe`). The format is told by its magic bytes, never by the
//! name; the sha256 and the signature were checked on the archive's bytes before this runs.
//! Nothing is unpacked to disk: the one member is read into memory and staged like a bare
//! binary, so no member name can point anywhere.

use std::io::Read;
use std::path::Component;

/// What `update --from` delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Anything else: staged as the executable itself (its `--version` decides).
    Binary,
    TarGz,
    Zip,
}

impl Format {
    pub fn detect(bytes: &[u8]) -> Format {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            Format::TarGz
        } else if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
            Format::Zip
        } else {
            Format::Binary
        }
    }
}

/// The member names that are the release's executable.
const NAMES: [&str; 2] = ["gatewarden", "gatewarden.exe"];

/// The executable inside a `.tar.gz`: exactly one regular file named [`NAMES`] of at most
/// `cap` bytes. Refused: a member name that climbs out (`..`, absolute), any link (a release
/// holds the file itself), two candidates, none, an oversized member, more than `2 × cap`
/// unpacked in all (a gzip bomb), and corrupt gzip or tar data (checked to the gzip trailer).
pub fn tar_gz_executable(bytes: &[u8], cap: u64) -> Result<Vec<u8>, String> {
    let total = cap.saturating_mul(2);
    let corrupt = |e: std::io::Error| format!("the archive is not a valid .tar.gz: {e}");
    let mut ar = tar::Archive::new(Capped { inner: flate2::read::GzDecoder::new(bytes), left: total });
    let mut found: Option<(String, Vec<u8>)> = None;
    for entry in ar.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let path = entry.path().map_err(corrupt)?.into_owned();
        let shown = path.display().to_string();
        if path.components().any(|c| matches!(c, Component::ParentDir | Component::RootDir | Component::Prefix(_))) {
            return Err(format!("the archive member {shown:?} points outside the archive (path traversal)"));
        }
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            return Err(format!(
                "the archive member {shown:?} is a link; a release archive holds the executable itself"
            ));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !kind.is_file() || !NAMES.contains(&name) {
            continue;
        }
        if let Some((first, _)) = &found {
            return Err(format!("the archive holds two executables ({first:?} and {shown:?}); which one to install?"));
        }
        let size = entry.header().size().map_err(corrupt)?;
        if size > cap {
            return Err(format!("the archive member {shown:?} is {size} bytes, over the {cap}-byte limit"));
        }
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        entry.by_ref().take(cap).read_to_end(&mut data).map_err(corrupt)?;
        found = Some((shown, data));
    }
    // tar stops at its end-of-archive blocks: read on to the gzip trailer, whose CRC and
    // length check the whole stream.
    std::io::copy(&mut ar.into_inner(), &mut std::io::sink()).map_err(corrupt)?;
    found
        .map(|(_, data)| data)
        .ok_or_else(|| format!("the archive holds no executable named {} (or {})", NAMES[0], NAMES[1]))
}

/// A reader that fails, rather than ends, once `left` bytes have been read.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "it unpacks to more than twice the size limit")
        })?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_testkit::archive::tar_gz_members as tar_gz;

    const CAP: u64 = 1 << 20;

    const FILE: tar::EntryType = tar::EntryType::Regular;

    #[test]
    fn formats_are_told_by_magic_bytes() {
        assert_eq!(Format::detect(&tar_gz(&[])), Format::TarGz);
        assert_eq!(Format::detect(b"PK\x03\x04rest"), Format::Zip);
        assert_eq!(Format::detect(b"\x7fELF..."), Format::Binary);
        assert_eq!(Format::detect(b""), Format::Binary);
    }

    #[test]
    fn the_one_executable_is_extracted() {
        let a = tar_gz(&[
            ("gatewarden-1.2.3/", tar::EntryType::Directory, b""),
            ("gatewarden-1.2.3/README.md", FILE, b"readme"),
            ("gatewarden-1.2.3/gatewarden", FILE, b"#!/bin/sh\n"),
        ]);
        assert_eq!(tar_gz_executable(&a, CAP).unwrap(), b"#!/bin/sh\n");
        let w = tar_gz(&[("gatewarden.exe", FILE, b"MZ")]);
        assert_eq!(tar_gz_executable(&w, CAP).unwrap(), b"MZ");
    }

    #[track_caller]
    fn refused(a: &[u8], why: &str) {
        let e = tar_gz_executable(a, CAP).expect_err(why);
        assert!(e.contains(why), "expected {why:?} in {e:?}");
    }

    #[test]
    fn hostile_or_ambiguous_archives_are_refused() {
        refused(&tar_gz(&[("../gatewarden", FILE, b"x")]), "path traversal");
        refused(&tar_gz(&[("/usr/bin/gatewarden", FILE, b"x")]), "path traversal");
        refused(&tar_gz(&[("a/../../b", FILE, b"x")]), "path traversal");
        refused(&tar_gz(&[("gatewarden", tar::EntryType::Symlink, b"")]), "is a link");
        refused(&tar_gz(&[("gatewarden", tar::EntryType::Link, b"")]), "is a link");
        refused(&tar_gz(&[("a/gatewarden", FILE, b"1"), ("b/gatewarden", FILE, b"2")]), "two executables");
        refused(&tar_gz(&[("README.md", FILE, b"x")]), "no executable");
        refused(&tar_gz(&[]), "no executable");
        let big = vec![0u8; (CAP + 1) as usize];
        refused(&tar_gz(&[("gatewarden", FILE, &big)]), "over the");
        // Other members count too: a bomb of zeros is stopped at twice the cap.
        let filler = vec![0u8; CAP as usize];
        let bomb = tar_gz(&[("a", FILE, &filler), ("b", FILE, &filler), ("gatewarden", FILE, b"x")]);
        refused(&bomb, "more than twice");
    }

    #[test]
    fn corrupt_gzip_is_refused() {
        let good = tar_gz(&[("gatewarden", FILE, b"#!/bin/sh\n")]);
        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        refused(&flipped, "not a valid .tar.gz");
        // The trailer's CRC: the tar data is intact, the stream is not.
        let mut crc = good.clone();
        let at = crc.len() - 8;
        crc[at] ^= 0xff;
        refused(&crc, "not a valid .tar.gz");
        refused(&good[..good.len() / 2], "not a valid .tar.gz");
        refused(&[0x1f, 0x8b, 0, 0], "not a valid .tar.gz");
    }
}
