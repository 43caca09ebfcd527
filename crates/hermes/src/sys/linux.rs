//! Linux: `/proc/<pid>/{environ,cmdline,cgroup}`.

use std::path::PathBuf;

fn proc_file(pid: u32, name: &str) -> PathBuf {
    PathBuf::from("/proc").join(pid.to_string()).join(name)
}

pub fn environ(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(proc_file(pid, "environ")).ok()
}

pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let bytes = std::fs::read(proc_file(pid, "cmdline")).ok()?;
    Some(bytes.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

pub fn cgroup(pid: u32) -> Option<String> {
    std::fs::read_to_string(proc_file(pid, "cgroup")).ok()
}

/// pids of processes whose environment has `key=value` and whose argv contains every word
/// of `argv_words` (`["gateway", "run"]`). Other users' processes are skipped (unreadable).
pub fn processes_with_env(key: &str, value: &std::ffi::OsStr, argv_words: &[&str]) -> Vec<u32> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let want = value.as_bytes();
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Some(env) = environ(pid) else { continue };
        let hit = env
            .split(|&b| b == 0)
            .any(|kv| kv.strip_prefix(key.as_bytes()).and_then(|r| r.strip_prefix(b"=")) == Some(want));
        if hit && cmdline(pid).is_some_and(|a| argv_words.iter().all(|w| a.iter().any(|x| x == w))) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// The uid a process runs as: `/proc/<pid>` belongs to it.
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(PathBuf::from("/proc").join(pid.to_string())).ok().map(|m| m.uid())
}
