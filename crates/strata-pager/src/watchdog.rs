//! A test's watchdog: aborts the whole test binary when a test runs past its limit, so a test
//! of a hang fails in bounded time instead of hanging CI. Shared by the unit tests and (through
//! `#[path]` in `tests/common`) the integration tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Aborts the process if it is not dropped within its limit.
#[derive(Debug)]
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts watching `test`: the process aborts once `limit` passes, unless dropped first.
    pub fn start(test: &'static str, limit: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let watched = done.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            while !watched.load(Ordering::Relaxed) {
                if started.elapsed() > limit {
                    eprintln!("{test}: stalled for {limit:?}; aborting the test binary");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
