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
