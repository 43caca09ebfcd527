//! OSes without `/proc`: these facts are unavailable; callers report "unknown".

pub fn environ(_pid: u32) -> Option<Vec<u8>> {
    None
}

pub fn cmdline(_pid: u32) -> Option<Vec<String>> {
    None
}

pub fn cgroup(_pid: u32) -> Option<String> {
    None
}

pub fn processes_with_env(_key: &str, _value: &std::ffi::OsStr, _argv_words: &[&str]) -> Vec<u32> {
    Vec::new()
}

pub fn process_uid(_pid: u32) -> Option<u32> {
    None
}
