//! Sequential-stream detection: the ends of the last few runs of pages (filled, or made
//! writable), so that a fault right at one of them is known to continue a stream.
//!
//! Having a resident neighbour is not enough evidence: with a large resident set most random
//! faults have one, and reading ahead (or unprotecting ahead) for them wastes frames, store
//! reads and write-backs. A fault exactly at the end of a recent run is rare by chance.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs remembered in each ring: a few concurrent streams (threads sweeping arrays side by
/// side, a merge reading two runs and writing a third) each keep their slot long enough to
/// be continued.
const SLOTS: usize = 8;

/// Runs remembered in the long history, where a stream that faults only once in a few dozen
/// faults (between them, random ones) is still found; see [`Streams::note`].
const HISTORY: usize = 64;

/// A ring of `N` runs: their first pages and their ends (one past the last page).
#[derive(Debug)]
struct Ring<const N: usize = SLOTS> {
    starts: [AtomicUsize; N],
    ends: [AtomicUsize; N],
    cursor: AtomicUsize,
}

/// Marks an empty start slot (no run starts there: a run below it would end past the
/// address space).
const NO_START: usize = usize::MAX;

impl<const N: usize> Ring<N> {
    fn new() -> Self {
        Self {
            starts: std::array::from_fn(|_| AtomicUsize::new(NO_START)),
            // Page 0 never continues a stream (see `continues`), so 0 means "empty".
            ends: std::array::from_fn(|_| AtomicUsize::new(0)),
            cursor: AtomicUsize::new(0),
        }
    }

    fn note(&self, first: usize, end: usize) {
        let slot = self.cursor.fetch_add(1, Ordering::Relaxed) % N;
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

    /// The slots of the `k` runs noted last (a racing `note` may shift them by one).
    fn newest(&self, k: usize) -> impl Iterator<Item = usize> {
        let cursor = self.cursor.load(Ordering::Relaxed);
        (1..=k.min(N)).map(move |back| cursor.wrapping_sub(back) % N)
    }

    /// Whether one of the `k` runs noted last ends at `page`.
    fn newest_end_at(&self, k: usize, page: usize) -> bool {
        self.newest(k)
            .any(|slot| self.ends[slot].load(Ordering::Relaxed) == page)
    }

    /// Whether one of the `k` runs noted last starts at `page`.
    fn newest_start_at(&self, k: usize, page: usize) -> bool {
        self.newest(k)
            .any(|slot| self.starts[slot].load(Ordering::Relaxed) == page)
    }
}

/// Recent runs (first page and end), in rings: every run lands in `history`, whose newest
/// [`SLOTS`] are the recent ones; runs that continued a stream (or were read ahead for one)
/// land in `streams` too. Random faults each note a run of their own, so with one ring a
/// program that interleaves a sequential sweep with
/// random accesses (a merge sort's runs and the lines they point to) pushed its stream out
/// between two of its faults, and read-ahead never started: `sort` at 3x the budget with
/// 16 KiB pages took 4x the faults of 64 KiB pages for the same bytes. Only a run that
/// already continued once enters `streams`, so random faults cannot evict it.
///
/// A stream slower than that (GNU sort's last merge passes a page of line structs once in
/// about 24 faults on its line text) is found over two steps: a run that continues one of
/// the last [`HISTORY`] runs becomes a candidate, and a fault that continues a candidate
/// continues a stream. A random fault lands next to one of 64 runs often, but next to one
/// of the few candidates rarely (about 2 % of sort's faults on its text).
#[derive(Debug)]
pub(super) struct Streams {
    /// Every run noted; its newest [`SLOTS`] are the recent runs.
    history: Ring<HISTORY>,
    streams: Ring,
    candidates: Ring,
    /// The share of recent faults that continued a stream, in 1/[`SHARE_ONE`]ths, decaying by
    /// a 32nd per fault (see [`Streams::mostly_random`]).
    share: AtomicUsize,
    /// Whether streams keep a lean footprint now (see [`Streams::mostly_random`]).
    lean: AtomicBool,
}

/// [`Streams::share`] when every recent fault continued a stream.
const SHARE_ONE: usize = 1 << 10;

impl Streams {
    pub(super) fn new() -> Self {
        Self {
            history: Ring::new(),
            streams: Ring::new(),
            candidates: Ring::new(),
            share: AtomicUsize::new(SHARE_ONE / 2),
            lean: AtomicBool::new(false),
        }
    }

    /// Counts a fault into the share of faults that continue streams.
    pub(super) fn count_fault(&self, continued_a_stream: bool) {
        let share = self.share.load(Ordering::Relaxed);
        let target = if continued_a_stream { SHARE_ONE } else { 0 };
        // Racing faults may lose an update; the share is a trend, not a count.
        let next = if target > share {
            share + (target - share).div_ceil(32)
        } else {
            share - (share - target).div_ceil(32)
        };
        self.share.store(next, Ordering::Relaxed);
        if next < SHARE_ONE / 4 {
            self.lean.store(true, Ordering::Relaxed);
        } else if next > SHARE_ONE * 3 / 4 {
            self.lean.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the program reads mostly at random, its streams slow beside it (GNU sort's
    /// last merge: about 24 faults on its line text for each page of line structs it
    /// passes): from when fewer than a quarter of recent faults continued a stream until
    /// more than three quarters do. Such a program's working set is what it reads at
    /// random; a stream then keeps a lean footprint (a smaller window, none queued ahead, a
    /// short gap behind), since frames held by streams are frames taken from it, and a slow
    /// stream needs no deep read-ahead to stay ahead. The gap between the two thresholds
    /// keeps a program whose random set just fitted from going back at once to the
    /// footprint that pushed it out.
    pub(super) fn mostly_random(&self) -> bool {
        self.lean.load(Ordering::Relaxed)
    }

    /// Remembers a run `first..end` not known to be part of a stream; one that continues a
    /// run of the history either way becomes a candidate.
    pub(super) fn note(&self, first: usize, end: usize) {
        if (first > 0 && self.history.ends_at(first)) || self.history.starts_at(end) {
            self.candidates.note(first, end);
        }
        self.history.note(first, end);
    }

    /// Remembers a run `first..end` that continued a stream (or was read ahead for one).
    pub(super) fn note_stream(&self, first: usize, end: usize) {
        self.streams.note(first, end);
    }

    /// Whether `page` is where a recent run ended (it continues an ascending stream).
    pub(super) fn continues(&self, page: usize) -> bool {
        page > 0
            && (self.streams.ends_at(page)
                || self.history.newest_end_at(SLOTS, page)
                || self.candidates.ends_at(page))
    }

    /// Whether a recent run starts just above `page` (it continues a descending stream).
    pub(super) fn continues_down(&self, page: usize) -> bool {
        page.checked_add(1).is_some_and(|above| {
            self.streams.starts_at(above)
                || self.history.newest_start_at(SLOTS, above)
                || self.candidates.starts_at(above)
        })
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
        // SLOTS newer streams and candidates do push it out (the tables stay small and
        // exact).
        for end in 2000..2000 + SLOTS {
            s.note_stream(end - 1, end);
        }
        for end in 3001..3002 + SLOTS {
            s.note(end - 1, end);
        }
        assert!(!s.continues(51));
    }

    #[test]
    fn a_slow_stream_among_random_faults_is_found_on_its_third_fault() {
        let s = Streams::new();
        let mut random = 1000..;
        let mut burst = |s: &Streams| {
            // Two dozen random faults between two of the stream's (sort's last merge),
            // spread far apart, none next to another.
            for _ in 0..24 {
                let p = random.next().expect("endless") * 13;
                s.note(p, p + 1);
            }
        };
        // Descending, one page per fault: 80, then 79, then 78.
        s.note(80, 81);
        burst(&s);
        assert!(!s.continues_down(79), "the recent ring forgot it");
        s.note(79, 80);
        burst(&s);
        assert!(s.continues_down(78), "the candidate continues");
        // Ascending likewise.
        s.note(500, 501);
        burst(&s);
        assert!(!s.continues(501));
        s.note(501, 502);
        burst(&s);
        assert!(s.continues(502));
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

    #[test]
    fn the_share_of_stream_faults_follows_the_recent_faults() {
        let s = Streams::new();
        assert!(!s.mostly_random(), "starts in between");
        for _ in 0..100 {
            s.count_fault(false);
        }
        assert!(s.mostly_random());
        // One stream fault in 25 (sort's last merge) stays mostly random.
        for k in 0..500 {
            s.count_fault(k % 25 == 0);
        }
        assert!(s.mostly_random());
        // A run of stream faults ends it within a few dozen faults, once they are more than
        // three quarters of the recent ones.
        for _ in 0..20 {
            s.count_fault(true);
        }
        assert!(s.mostly_random(), "half is not enough to leave");
        for _ in 0..30 {
            s.count_fault(true);
        }
        assert!(!s.mostly_random());
        for _ in 0..1000 {
            s.count_fault(true);
        }
        assert_eq!(
            s.share.load(Ordering::Relaxed),
            SHARE_ONE,
            "saturates at one"
        );
        for _ in 0..1000 {
            s.count_fault(false);
        }
        assert_eq!(s.share.load(Ordering::Relaxed), 0, "and at zero");
    }
}
