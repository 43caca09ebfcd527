//! Unix: `RLIMIT_NOFILE` through rustix; glibc's malloc tuned through libc (other libcs keep
//! their defaults: musl and the BSD/macOS allocators return memory on their own).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

pub fn raise_nofile() -> Option<u64> {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current != maximum && setrlimit(Resource::Nofile, Rlimit { current: maximum, maximum }).is_err() {
        // macOS reports an unlimited hard limit but refuses a soft one above OPEN_MAX.
        let open_max = current.map_or(10_240, |c| c.max(10_240));
        let _ = setrlimit(Resource::Nofile, Rlimit { current: Some(open_max), maximum });
    }
    getrlimit(Resource::Nofile).current
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_allocator() {
    // glibc gives each thread that meets contention its own arena (up to 8 per core), and
    // memory freed into an arena stays there: after a burst of connections handled on the
    // tokio workers and the blocking pool, RSS stayed at 120-275 MB. Two arenas keep the
    // workers from contending on one lock while bounding what is retained.
    // SAFETY: mallopt only changes allocator parameters; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        // A fixed threshold: blocks of 128 KiB and more (request bodies) are their own
        // mappings, returned to the OS when freed. glibc's default raises the threshold to the
        // largest block freed so far (up to 32 MiB), after which 2 MiB bodies land in the
        // arenas and stay resident once freed: 500 unfinished bodies left RSS 90+ MB above
        // the 64 MiB bodies budget (docs/security.md).
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_allocator() {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_memory() {
    // SAFETY: malloc_trim walks the arenas under their locks and only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_memory() {}
