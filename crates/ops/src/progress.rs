//! Progress for long waits: a spinner with the phase on a terminal, plain lines otherwise
//! (one per phase change, so logs and CI output stay readable).

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Progress {
    phase: Arc<Mutex<Option<String>>>,
    spinner: Mutex<Option<std::thread::JoinHandle<()>>>,
    tty: bool,
}

impl Progress {
    pub fn new() -> Progress {
        let tty = std::io::stderr().is_terminal();
        let phase: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let spinner = tty.then(|| {
            let phase = Arc::clone(&phase);
            std::thread::spawn(move || {
                const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
                let t0 = Instant::now();
                for i in 0.. {
                    let Some(p) = phase.lock().ok().and_then(|g| g.clone()) else { break };
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K{} {p} ({}s)", FRAMES[i % FRAMES.len()], t0.elapsed().as_secs());
                    let _ = err.flush();
                    drop(err);
                    std::thread::sleep(Duration::from_millis(80));
                }
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
            })
        });
        Progress { phase, spinner: Mutex::new(spinner), tty }
    }

    pub fn phase(&self, p: &str) {
        if let Ok(mut g) = self.phase.lock() {
            if g.as_deref() == Some(p) {
                return;
            }
            *g = Some(p.to_owned());
        }
        if !self.tty {
            errln!("… {p}");
        }
    }

    /// Ends the display (idempotent; by reference, so a shared progress can be finished
    /// before a final message).
    pub fn finish(&self) {
        if let Ok(mut g) = self.phase.lock() {
            *g = None;
        }
        if let Some(h) = self.spinner.lock().ok().and_then(|mut s| s.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
