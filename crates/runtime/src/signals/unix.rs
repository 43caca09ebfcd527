//! Unix: one `SA_SIGINFO` handler for every signal the gateway answers (tokio's signal streams
//! do not carry `siginfo`, so they cannot say who sent a SIGTERM).
//!
//! The handler is async-signal-safe: it stores `si_pid`/`si_uid` in atomics, counts the
//! signal, and writes one byte to a socket pair (`write(2)` is on POSIX's list) to wake
//! [`Signals::recv`], which does everything else outside the handler (reading the sender's
//! command line included). The handlers need no runtime, so `run` installs them first thing:
//! a SIGHUP during start-up no longer kills the gateway by the default action.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdStream;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use libc::c_int;

use super::{Action, Signal, SignalKind, SignalSender};

/// The signals handled, in the order pending ones are taken (a stop before a reload).
const WATCHED: [(c_int, SignalKind); 7] = [
    (libc::SIGINT, SignalKind::Interrupt),
    (libc::SIGTERM, SignalKind::Terminate),
    (libc::SIGQUIT, SignalKind::Quit),
    (libc::SIGUSR1, SignalKind::Restart),
    (libc::SIGHUP, SignalKind::Reload),
    (libc::SIGUSR2, SignalKind::User2),
    (libc::SIGPIPE, SignalKind::Pipe),
];

/// One watched signal: how many arrived and not yet taken, and the last sender.
struct Slot {
    pending: AtomicU32,
    pid: AtomicI32,
    uid: AtomicU32,
}

impl Slot {
    const fn new() -> Slot {
        Slot { pending: AtomicU32::new(0), pid: AtomicI32::new(0), uid: AtomicU32::new(0) }
    }
}

static SLOTS: [Slot; WATCHED.len()] = [const { Slot::new() }; WATCHED.len()];
/// The write end of the wake pair (-1 before `install`).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// Keeps the write end open for the life of the process.
static WAKE: OnceLock<StdStream> = OnceLock::new();

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let saved = errno::get();
    if let Some(i) = WATCHED.iter().position(|(s, _)| *s == sig) {
        let slot = &SLOTS[i];
        let (pid, uid) = match info.is_null() {
            true => (0, 0),
            // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t; the accessors read
            // plain fields.
            false => unsafe { ((*info).si_pid(), (*info).si_uid()) },
        };
        slot.pid.store(pid, Ordering::Release);
        slot.uid.store(uid, Ordering::Release);
        slot.pending.fetch_add(1, Ordering::AcqRel);
        let fd = WAKE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            let byte = 1u8;
            // SAFETY: write(2) is async-signal-safe; the fd is non-blocking and never closed.
            // A full buffer (EAGAIN) loses nothing: the count is already stored.
            unsafe {
                libc::write(fd, (&raw const byte).cast(), 1);
            }
        }
    }
    errno::set(saved);
}

/// What `recv` waits on: the read end, made a tokio stream inside the runtime.
enum Reader {
    Std(StdStream),
    Tokio(tokio::net::UnixStream),
}

pub struct Signals {
    reader: Option<Reader>,
}

impl Signals {
    /// Installs the handlers (once per process). Needs no async runtime.
    pub fn install() -> io::Result<Signals> {
        let (reader, writer) = StdStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let fd = writer.as_raw_fd();
        if WAKE.set(writer).is_err() {
            return Err(io::Error::other("the signal handlers are already installed"));
        }
        WAKE_FD.store(fd, Ordering::Release);
        for (sig, _) in WATCHED {
            // SAFETY: a zeroed sigaction is a valid value to fill in; the handler only touches
            // atomics, errno and write(2).
            let rc = unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Signals { reader: Some(Reader::Std(reader)) })
    }

    pub async fn recv(&mut self) -> Signal {
        loop {
            self.drain_wakes();
            if let Some(s) = take(|_| true) {
                return s;
            }
            match self.reader() {
                Some(r) => {
                    let _ = r.readable().await;
                }
                // Cannot happen inside the runtime; looking again later still delivers.
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// A pending signal that ends the gateway or restarts it, without waiting (before the
    /// runtime: a successor waiting for its predecessor's lock); the others stay pending.
    pub fn take_ending(&mut self) -> Option<Signal> {
        self.drain_wakes();
        take(|k| matches!(k.action(), Action::End | Action::Restart))
    }

    fn reader(&mut self) -> Option<&tokio::net::UnixStream> {
        if let Some(Reader::Std(_)) = &self.reader
            && let Some(Reader::Std(s)) = self.reader.take()
        {
            self.reader = tokio::net::UnixStream::from_std(s).ok().map(Reader::Tokio);
        }
        match &self.reader {
            Some(Reader::Tokio(r)) => Some(r),
            _ => None,
        }
    }

    /// Empties the wake pair (the counts are the truth, the bytes only wake).
    fn drain_wakes(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            let n = match &mut self.reader {
                Some(Reader::Tokio(r)) => r.try_read(&mut buf),
                Some(Reader::Std(r)) => r.read(&mut buf),
                None => return,
            };
            if !matches!(n, Ok(n) if n > 0) {
                return;
            }
        }
    }
}

/// The first pending signal of a kind `wanted`, with its sender. A SIGPIPE our own process
/// raised (a write to a closed pipe: the kernel names us as its sender) is dropped here: that
/// write fails with EPIPE where it happens, which is its handling.
fn take(wanted: impl Fn(SignalKind) -> bool) -> Option<Signal> {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    for (i, (_, kind)) in WATCHED.iter().enumerate() {
        if !wanted(*kind) {
            continue;
        }
        let slot = &SLOTS[i];
        if slot.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_err() {
            continue;
        }
        let (pid, uid) = (slot.pid.load(Ordering::Acquire), slot.uid.load(Ordering::Acquire));
        if *kind == SignalKind::Pipe && pid == me {
            continue;
        }
        // pid 0: the kernel (a terminal's hangup) or a sender the OS did not name.
        let sender = u32::try_from(pid).ok().filter(|p| *p > 0).map(|pid| SignalSender {
            pid,
            uid,
            argv: gatewarden_lifecycle::platform::cmdline(pid).unwrap_or_default(),
        });
        return Some(Signal { kind: *kind, sender });
    }
    None
}

/// errno, saved and restored around the handler's `write(2)`.
mod errno {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn slot() -> *mut libc::c_int {
        // SAFETY: returns the calling thread's errno location; always valid.
        unsafe { libc::__errno_location() }
    }

    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    fn slot() -> *mut libc::c_int {
        // SAFETY: as above.
        unsafe { libc::__error() }
    }

    // Elsewhere errno is left as the write leaves it (it only changes when the write fails).
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd"
    )))]
    fn slot() -> *mut libc::c_int {
        std::ptr::null_mut()
    }

    pub fn get() -> libc::c_int {
        let p = slot();
        // SAFETY: the location is the calling thread's own, or null.
        if p.is_null() { 0 } else { unsafe { *p } }
    }

    pub fn set(v: libc::c_int) {
        let p = slot();
        if !p.is_null() {
            // SAFETY: as above.
            unsafe { *p = v }
        }
    }
}
