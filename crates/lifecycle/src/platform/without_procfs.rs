//! What only Linux's `/proc` (and systemd) can tell, for every other OS: unknown. A gateway
//! there is never proven to run under systemd, never reported as stopped, and a taken port is
//! reported without a holder.

pub fn systemd_main_pid() -> Option<u32> {
    None
}

/// Where no kernel lock table names a holder, the verified pid record is all there is.
pub fn cmdline(_pid: u32) -> Option<Vec<String>> {
    None
}

pub fn argv(_pid: u32) -> Option<Vec<String>> {
    None
}

pub fn environ(_pid: u32) -> Option<Vec<u8>> {
    None
}

pub fn cgroup(_pid: u32) -> Option<String> {
    None
}

pub fn process_uid(_pid: u32) -> Option<u32> {
    None
}

pub fn processes_with_env(_key: &str, _value: &std::ffi::OsStr, _argv_words: &[&str]) -> Vec<u32> {
    Vec::new()
}

pub fn is_stopped(_pid: u32) -> Option<bool> {
    None
}

pub fn port_listeners(_port: u16) -> Vec<super::PortListener> {
    Vec::new()
}

/// Only Linux is known to keep start-up code pages mapped after their use (fault-around).
pub fn release_startup_pages() -> usize {
    0
}

/// Where there is no `/proc` the usage is not read (`top` shows `-`).
pub fn process_usage(_pid: u32) -> Option<super::ProcessUsage> {
    None
}
