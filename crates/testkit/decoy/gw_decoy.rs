//! gw-decoy: a stand-in for "some unrelated process that happens to own a recycled PID".
//!
//! Usage: `gw-decoy <signal-log> <ready-file>`
//!
//! Installs handlers for SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2 and SIGTERM. Each received
//! signal appends its name and a newline (`SIGTERM\n`) to `<signal-log>` (O_APPEND, one
//! `write(2)` from the handler, which is async-signal-safe). Once the handlers are in place it
//! writes its pid to `<ready-file>` and then waits forever. Only SIGKILL/SIGSTOP get through.
//!
//! std-only on purpose (no crates): testkit's build.rs compiles this file with a bare `rustc`
//! invocation, which cannot resolve dependencies.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

static LOG_FD: AtomicI32 = AtomicI32::new(-1);

#[cfg(unix)]
unsafe extern "C" {
    fn signal(signum: c_int, handler: usize) -> usize;
    fn write(fd: c_int, buf: *const u8, count: usize) -> isize;
    fn pause() -> c_int;
    #[cfg(target_os = "linux")]
    fn prctl(option: c_int, arg2: usize, arg3: usize, arg4: usize, arg5: usize) -> c_int;
}

#[cfg(unix)]
const SIGNALS: &[(c_int, &[u8])] = &[
    (1, b"SIGHUP\n"),
    (2, b"SIGINT\n"),
    (3, b"SIGQUIT\n"),
    (15, b"SIGTERM\n"),
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    (30, b"SIGUSR1\n"),
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    (31, b"SIGUSR2\n"),
    #[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "freebsd")))]
    (10, b"SIGUSR1\n"),
    #[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "freebsd")))]
    (12, b"SIGUSR2\n"),
];

#[cfg(unix)]
extern "C" fn on_signal(signum: c_int) {
    let mut name: &[u8] = b"SIGOTHER\n";
    for (n, s) in SIGNALS {
        if *n == signum {
            name = s;
        }
    }
    let fd = LOG_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; `name` is a 'static byte slice.
        unsafe {
            write(fd, name.as_ptr(), name.len());
        }
    }
}

#[cfg(unix)]
fn main() {
    use std::os::fd::IntoRawFd;

    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: gw-decoy <signal-log> <ready-file>");
        std::process::exit(2);
    }
    // If the test process (more precisely: the thread that spawned us) dies, die too, so a
    // crashed test never leaves a decoy behind.
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_PDEATHSIG (1) with SIGKILL (9); plain integer arguments.
    unsafe {
        prctl(1, 9, 0, 0, 0);
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&args[1]).unwrap_or_else(|e| {
        eprintln!("gw-decoy: cannot open {}: {e}", args[1]);
        std::process::exit(1)
    });
    LOG_FD.store(log.into_raw_fd(), Ordering::SeqCst);
    for (n, _) in SIGNALS {
        // SAFETY: installing a plain C handler; BSD semantics (persistent, SA_RESTART) on
        // glibc, musl and macOS.
        let prev = unsafe { signal(*n, on_signal as extern "C" fn(c_int) as usize) };
        if prev == usize::MAX {
            eprintln!("gw-decoy: signal({n}) failed");
            std::process::exit(1);
        }
    }
    let tmp = format!("{}.tmp", args[2]);
    std::fs::write(&tmp, format!("{}\n", std::process::id())).expect("write ready file");
    std::fs::rename(&tmp, &args[2]).expect("publish ready file");
    loop {
        // SAFETY: pause(2) has no preconditions.
        unsafe {
            pause();
        }
    }
}

#[cfg(not(unix))]
fn main() {
    eprintln!("gw-decoy: unix only");
    std::process::exit(2);
}
