//! Sequential-stream detection: the ends of the last few runs of pages (filled, or made
//! writable), so that a fault right at one of them is known to continue a stream.
//!
//! Having a resident neighbour is not enough evidence: with a large resident set most random
//! faults have one, and reading ahead (or unprotecting ahead) for them wastes frames, store
//! reads and write-backs. A fault exactly at the end of a recent run is rare by chance.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs remembered in each ring: a few concurrent streams (threads sweeping arrays side by
/// side, a merge reading two runs and writing a third) each keep their slot long enough to
/// be continued.
const SLOTS: usize = 8;

/// A ring of runs: their first pages and their ends (one past the last page).
#[derive(Debug)]
struct Ring {
    starts: [AtomicUsize; SLOTS],
    ends: [AtomicUsize; SLOTS],
    cursor: AtomicUsize,
}

/// Marks an empty start slot (no run starts there: a run below it would end past the
/// address space).
const NO_START: usize = usize::MAX;

impl Ring {
    fn new() -> Self {
        Self {
            starts: std::array::from_fn(|_| AtomicUsize::new(NO_START)),
            // Page 0 never continues a stream (see `continues`), so 0 means "empty".
            ends: std::array::from_fn(|_| AtomicUsize::new(0)),
            cursor: AtomicUsize::new(0),
        }
    }

    fn note(&self, first: usize, end: usize) {
        let slot = self.cursor.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.starts[slot].store(first, Ordering::Relaxed);
        self.ends[slot].store(end, Ordering::Relaxed);
    }

    fn ends_at(&self, page: usize) -> bool {
        self.ends.iter().any(|e| e.load(Ordering::Relaxed) == page)
    }

    fn starts_at(&self, page: usize) -> bool {
        self.starts
            .iter()
            .any(|e| e.load(Ordering::Relaxed) == page)
    }
}

/// Recent runs (first page and end), in two rings: every run lands in `recent`; runs that continued
/// a stream (or were read ahead for one) land in `streams` too. Random faults each note a
/// run of their own, so with one ring a program that interleaves a sequential sweep with
/// random accesses (a merge sort's runs and the lines they point to) pushed its stream out
/// between two of its faults, and read-ahead never started: `sort` at 3x the budget with
/// 16 KiB pages took 4x the faults of 64 KiB pages for the same bytes. Only a run that
/// already continued once enters `streams`, so random faults cannot evict it.
#[derive(Debug)]
pub(super) struct Streams {
    recent: Ring,
    streams: Ring,
}

impl Streams {
    pub(super) fn new() -> Self {
        Self {
            recent: Ring::new(),
            streams: Ring::new(),
        }
    }

    /// Remembers a run `first..end` not known to be part of a stream.
    pub(super) fn note(&self, first: usize, end: usize) {
        self.recent.note(first, end);
    }

    /// Remembers a run `first..end` that continued a stream (or was read ahead for one).
    pub(super) fn note_stream(&self, first: usize, end: usize) {
        self.streams.note(first, end);
    }

    /// Whether `page` is where a recent run ended (it continues an ascending stream).
    pub(super) fn continues(&self, page: usize) -> bool {
        page > 0 && (self.streams.ends_at(page) || self.recent.ends_at(page))
    }

    /// Whether a recent run starts just above `page` (it continues a descending stream).
    pub(super) fn continues_down(&self, page: usize) -> bool {
        page.checked_add(1)
            .is_some_and(|above| self.streams.starts_at(above) || self.recent.starts_at(above))
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
        s.note(3, 5);
        assert!(s.continues(5));
        assert!(
            !s.continues(4) && !s.continues(6),
            "neighbours of the end are not"
        );
        // Older runs fall out once SLOTS newer ones were noted.
        for end in 100..100 + SLOTS {
            s.note(end - 1, end);
        }
        assert!(!s.continues(5));
        assert!((100..100 + SLOTS).all(|e| s.continues(e)));
    }

    #[test]
    fn random_runs_do_not_push_a_stream_out() {
        let s = Streams::new();
        s.note(49, 50);
        assert!(s.continues(50));
        // The fault at 50 continued the run: its new end is a stream's.
        s.note(50, 51);
        s.note_stream(50, 51);
        // Many random faults between two faults of the stream (each a run of one page).
        for end in (1000..1000 + 4 * SLOTS).map(|k| k * 7) {
            s.note(end - 1, end);
        }
        assert!(s.continues(51), "a random burst evicted the stream");
        assert!(!s.continues(50) && !s.continues(52));
        // SLOTS newer streams do push it out (the table stays small and exact).
        for end in 2000..2000 + SLOTS {
            s.note_stream(end - 1, end);
        }
        assert!(!s.continues(51));
    }

    #[test]
    fn a_fault_just_below_a_recent_run_continues_it_downwards() {
        let s = Streams::new();
        assert!(!s.continues_down(usize::MAX), "no overflow at the top");
        assert!(!s.continues_down(0));
        s.note(40, 48);
        assert!(s.continues_down(39));
        assert!(!s.continues_down(40) && !s.continues_down(38) && !s.continues_down(47));
        assert!(s.continues(48) && !s.continues(39));
        s.note_stream(32, 40);
        for end in (1000..1000 + 4 * SLOTS).map(|k| k * 7) {
            s.note(end - 1, end);
        }
        assert!(
            s.continues_down(31),
            "a random burst evicted the descending stream"
        );
        assert!(!s.continues_down(39));
    }
}
