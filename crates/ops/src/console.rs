//! The verbs' only way to the terminal. `println!` panics when stdout is a pipe whose reader
//! is gone (`gatewarden history -n 200 | head -c1` exited 134, issue 27 §7); these never do:
//! what the reader no longer wants is dropped and the verb carries on to its own exit code (a
//! verb must not stop half-way through a transaction because its output was cut). The
//! `outln!`, `out!`, `errln!` and `err!` macros (crate root) call them; `clippy::print_stdout`
//! and `clippy::print_stderr` are denied in this crate and in the binary.

use std::fmt;
use std::io::Write;

/// Writes to stdout, ignoring a closed or failing stdout.
pub fn out(args: fmt::Arguments<'_>) {
    let _ = std::io::stdout().lock().write_fmt(args);
}

/// Writes to stderr, ignoring a closed or failing stderr.
pub fn err(args: fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Whether an I/O error means the reader went away (a pipe's reader closed): an end for a
/// verb that only writes, never a failure.
pub fn reader_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}
