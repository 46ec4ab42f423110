//! Sequential-stream detection: the ends of the last few runs of pages (filled, or made
//! writable), so that a fault right at one of them is known to continue a stream.
//!
//! Having a resident neighbour is not enough evidence: with a large resident set most random
//! faults have one, and reading ahead (or unprotecting ahead) for them wastes frames, store
//! reads and write-backs. A fault exactly at the end of a recent run is rare by chance.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs remembered: a few concurrent streams (threads sweeping arrays side by side) each
/// keep their slot long enough to be continued.
const SLOTS: usize = 8;

/// The ends (one past the last page) of the most recent runs, as a ring.
#[derive(Debug)]
pub(super) struct Streams {
    ends: [AtomicUsize; SLOTS],
    cursor: AtomicUsize,
}

impl Streams {
    pub(super) fn new() -> Self {
        Self {
            // Page 0 never continues a stream (see `continues`), so 0 means "empty".
            ends: std::array::from_fn(|_| AtomicUsize::new(0)),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Remembers that a run ended just before page `end`.
    pub(super) fn note(&self, end: usize) {
        let slot = self.cursor.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.ends[slot].store(end, Ordering::Relaxed);
    }

    /// Whether `page` is where a recent run ended.
    pub(super) fn continues(&self, page: usize) -> bool {
        page > 0 && self.ends.iter().any(|e| e.load(Ordering::Relaxed) == page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_end_of_a_recent_run_continues_it() {
        let s = Streams::new();
        assert!(
            !s.continues(0),
            "page 0 never continues (0 marks an empty slot)"
        );
        assert!(!s.continues(5));
        s.note(5);
        assert!(s.continues(5));
        assert!(
            !s.continues(4) && !s.continues(6),
            "neighbours of the end are not"
        );
        // Older runs fall out once SLOTS newer ones were noted.
        for end in 100..100 + SLOTS {
            s.note(end);
        }
        assert!(!s.continues(5));
        assert!((100..100 + SLOTS).all(|e| s.continues(e)));
    }
}
