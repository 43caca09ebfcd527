//! Windows: handles have no per-process soft limit to raise, and the process heap decommits
//! freed memory on its own.

pub fn raise_nofile() -> Option<u64> {
    None
}

pub fn tune_allocator() {}

pub fn release_memory() {}
