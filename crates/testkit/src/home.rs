use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

/// A temporary gateway home. Layout: `<root>/home` is the home (created 0700 unless
/// [`TempHome::uncreated`] / [`TempHome::home_is_a_file`]); `<root>` also holds scratch files
/// (gateway stderr logs, decoy logs) so they never appear inside the home.
/// Removed on drop (keep it with `GW_KEEP_HOMES=1` for debugging).
pub struct TempHome {
    root: Option<tempfile::TempDir>,
    home: PathBuf,
    seq: AtomicU32,
}

impl Default for TempHome {
    fn default() -> Self {
        Self::new()
    }
}

impl TempHome {
    fn with_root() -> (tempfile::TempDir, PathBuf) {
        Self::with_root_in(&std::env::temp_dir())
    }

    fn with_root_in(parent: &Path) -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::Builder::new().prefix("gw-test-").tempdir_in(parent).expect("tempdir");
        let canon = root.path().canonicalize().expect("canonicalize tempdir");
        let home = canon.join("home");
        (root, home)
    }

    /// An existing, empty home (mode 0700).
    pub fn new() -> Self {
        Self::new_in(&std::env::temp_dir())
    }

    /// [`TempHome::new`] under `parent` (a filesystem of the test's own: `tmpfs`).
    pub fn new_in(parent: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let (root, home) = Self::with_root_in(parent);
        std::fs::create_dir(&home).expect("create home");
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        Self { root: Some(root), home, seq: AtomicU32::new(0) }
    }

    /// A home path that does not exist yet (`run` must create it).
    pub fn uncreated() -> Self {
        let (root, home) = Self::with_root();
        Self { root: Some(root), home, seq: AtomicU32::new(0) }
    }

    /// A regular file where the home directory should be: unusable even for root.
    pub fn home_is_a_file() -> Self {
        let (root, home) = Self::with_root();
        std::fs::write(&home, b"not a directory\n").unwrap();
        Self { root: Some(root), home, seq: AtomicU32::new(0) }
    }

    /// The (canonical) home path.
    pub fn path(&self) -> &Path {
        &self.home
    }
    /// Scratch directory next to the home.
    pub fn root(&self) -> &Path {
        self.home.parent().unwrap()
    }
    /// A fresh, unique scratch path `<root>/<stem>-<n><ext>` (not created).
    pub fn scratch(&self, stem: &str, ext: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.root().join(format!("{stem}-{n}{ext}"))
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.home.join(name)
    }
    pub fn lock_file(&self) -> PathBuf {
        self.file("gateway.lock")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.file("gateway.pid")
    }
    pub fn state_file(&self) -> PathBuf {
        self.file("gateway_state.json")
    }
    pub fn planned_stop_marker(&self) -> PathBuf {
        self.file(".gateway-planned-stop.json")
    }
    pub fn takeover_marker(&self) -> PathBuf {
        self.file(".gateway-takeover.json")
    }
    pub fn ledger(&self) -> PathBuf {
        self.file("lifecycle.jsonl")
    }
    pub fn control_sock(&self) -> PathBuf {
        self.file("control.sock")
    }

    /// Writes `bytes` to `name` in the home (atomically: temp + rename, so a gateway watching
    /// the directory never sees a half-written file).
    pub fn write(&self, name: &str, bytes: impl AsRef<[u8]>) {
        let tmp = self.scratch(".tk-write", ".tmp");
        std::fs::write(&tmp, bytes).expect("write temp");
        std::fs::rename(&tmp, self.file(name)).expect("rename into home");
    }

    pub fn exists(&self, name: &str) -> bool {
        self.file(name).exists()
    }

    /// Every file under the home whose bytes contain `needle` (what a test says is kept nowhere:
    /// a stranger's text, an address).
    pub fn files_holding(&self, needle: &str) -> Vec<PathBuf> {
        let mut hits = Vec::new();
        let mut dirs = vec![self.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
                    hits.push(p);
                }
            }
        }
        hits
    }

    /// Parsed JSON content of `name`, `None` if missing or unparseable.
    pub fn read_json(&self, name: &str) -> Option<Value> {
        let b = std::fs::read(self.file(name)).ok()?;
        serde_json::from_slice(&b).ok()
    }
    pub fn pid_record(&self) -> Option<Value> {
        self.read_json("gateway.pid")
    }
    pub fn state_record(&self) -> Option<Value> {
        self.read_json("gateway_state.json")
    }
    /// `gateway_state` field of `gateway_state.json`, if readable.
    pub fn state(&self) -> Option<String> {
        Some(self.state_record()?.get("gateway_state")?.as_str()?.to_string())
    }

    /// The ledger as lossy text.
    pub fn ledger_text(&self) -> String {
        std::fs::read(self.ledger()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }
    /// Every ledger line that parses as a JSON object (lenient, like `history`).
    pub fn ledger_events(&self) -> Vec<Value> {
        let raw = std::fs::read(self.ledger()).unwrap_or_default();
        raw.split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
            .filter(|v| v.is_object())
            .collect()
    }
    /// Ledger events with `event == name`.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.ledger_events().into_iter().filter(|e| e["event"] == name).collect()
    }

    /// Whether `gateway.lock` is held by anyone (read-only, from `/proc/locks`).
    pub fn lock_held(&self) -> bool {
        crate::lock_is_held(&self.lock_file())
    }

    /// Names of the files currently in the home (sorted), for diagnostics.
    pub fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.home)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        if std::env::var_os("GW_KEEP_HOMES").is_some()
            && let Some(r) = self.root.take()
        {
            eprintln!("testkit: keeping {}", r.keep().display());
        }
    }
}
