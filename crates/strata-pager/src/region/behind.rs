//! Eviction behind a stream: while a program sweeps ahead through memory larger than the
//! buffer, the pages it has just passed are evicted before the clock's choice.
//!
//! Why: a sweep over more than the buffer, repeated (a loop over an array, `stress-ng`'s
//! `incdec` passes), is where the clock (like LRU) does worst: it evicts the oldest pages,
//! which are the ones the next pass wants first, so every page of every pass faults. Evicting
//! just behind the sweep instead keeps the front of the array resident from pass to pass,
//! and each pass faults only for what exceeds the buffer. A sweep over data used once (a
//! file read into memory) loses nothing either: what it passed is what it no longer needs.
//!
//! How: each fault that continues a stream grants as many evictions behind it as the fault
//! and its queued read-ahead windows fill, and points the search a gap behind the faulting
//! page (the program may still touch the page it left, and the window it just read): below
//! it for an ascending stream, above it for a descending one. A victim is taken from there
//! on away from the stream, whatever its reference bits; when a short search finds nothing
//! resident there, or the grant is used up (the program stopped sweeping: random faults
//! grant nothing), the clock chooses as before. Only with [`super::EvictionPolicy::Clock`]:
//! FIFO stays Umap's policy, for comparison.
//!
//! Descending streams get their grant while streams are lean (most faults random, see
//! `streams.rs`): GNU sort keeps its line structs below the end of its buffer and merges
//! them downwards, beside the lines it compares. Before, the pages those merges had passed
//! stayed until the clock came round (70-140 of a sort's 860 to 940 frames), so its 804
//! pages of line text never all fitted, and nearly every fault was on text one of those
//! pages had pushed out. A fast descending stream keeps its pages for the clock: often it is
//! a partition (NumPy's sort), whose pages the recursion wants back soon.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::shared::Shared;
use crate::pages::{State, word};

/// Pages looked at below the search point before giving the choice back to the clock.
const SEARCH: usize = 64;

/// Set in [`Behind::next`] when the latest stream descends: the search goes upwards. One
/// word holds both, so an evictor never pairs one stream's page with another's direction.
const UP: usize = 1 << (usize::BITS - 1);

/// Where to evict behind the latest stream, and how many evictions it has left.
#[derive(Debug)]
pub(super) struct Behind {
    /// The next page to look at, with [`UP`] set when the search goes upwards (behind a
    /// descending stream) and clear when it goes downwards.
    next: AtomicUsize,
    /// Evictions left to the stream.
    grant: AtomicUsize,
}

impl Behind {
    pub(super) fn new() -> Self {
        Self {
            next: AtomicUsize::new(0),
            grant: AtomicUsize::new(0),
        }
    }

    /// A fault at `page` continued an ascending stream and will fill `pages` pages: evict up
    /// to that many from `gap` pages below `page` down (at most `most` owed at once).
    pub(super) fn stream_at(&self, page: usize, gap: usize, pages: usize, most: usize) {
        let Some(below) = page.checked_sub(gap) else {
            return;
        };
        self.next.store(below, Ordering::Relaxed);
        self.owe(pages, most);
    }

    /// A fault at `page` continued a descending stream and will fill `pages` pages: evict up
    /// to that many from `gap` pages above `page` up (at most `most` owed at once).
    pub(super) fn stream_down_at(&self, page: usize, gap: usize, pages: usize, most: usize) {
        let Some(above) = page.checked_add(gap).filter(|a| a & UP == 0) else {
            return;
        };
        self.next.store(above | UP, Ordering::Relaxed);
        self.owe(pages, most);
    }

    fn owe(&self, pages: usize, most: usize) {
        let owed = self.grant.load(Ordering::Relaxed);
        self.grant
            .store(owed.saturating_add(pages).min(most), Ordering::Relaxed);
    }
}

impl Shared {
    /// A victim just behind the latest stream (moved to `Evicting`), if it is owed one and
    /// one is resident there.
    pub(super) fn claim_behind(&self) -> Option<(usize, u64)> {
        if self.behind.grant.load(Ordering::Relaxed) == 0 || self.pages.is_empty() {
            return None;
        }
        let next = self.behind.next.load(Ordering::Relaxed);
        let up = next & UP != 0;
        let last = self.pages.len() - 1;
        let start = next & !UP;
        // The pages looked at, `lo..=hi`, walked away from the stream (none when a descending
        // stream's search starts past the region's end).
        let (lo, hi) = if up {
            (start, start.saturating_add(SEARCH).min(last))
        } else {
            let start = start.min(last);
            (start.saturating_sub(SEARCH), start)
        };
        for i in 0..(hi + 1).saturating_sub(lo) {
            let q = if up { lo + i } else { hi - i };
            let w = self.pages.load(q);
            // Hot pages go too: a sweep repeated over a little more than the buffer brings
            // each page back soon after its eviction, which marks it hot (sparing hot pages
            // here doubled `stress-ng`'s store reads, session 15).
            if !matches!(word::state(w), State::Clean | State::Dirty) {
                continue;
            }
            if self.pages.cas(q, w, word::with_state(w, State::Evicting)) {
                let after = if up {
                    (q + 1) | UP
                } else {
                    q.saturating_sub(1)
                };
                self.behind.next.store(after, Ordering::Relaxed);
                // Races between evictors only make the grant end a little early or late.
                let left = self.behind.grant.load(Ordering::Relaxed);
                self.behind
                    .grant
                    .store(left.saturating_sub(1), Ordering::Relaxed);
                return Some((q, w));
            }
        }
        // Nothing resident just behind the stream: the clock chooses until it sweeps again.
        self.behind.grant.store(0, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_grants_evictions_below_a_gap_up_to_a_bound() {
        let b = Behind::new();
        b.stream_at(3, 8, 9, 100);
        assert_eq!(b.grant.load(Ordering::Relaxed), 0, "no page below the gap");
        b.stream_at(100, 8, 9, 20);
        assert_eq!(b.next.load(Ordering::Relaxed), 92);
        assert_eq!(b.grant.load(Ordering::Relaxed), 9);
        b.stream_at(109, 8, 9, 20);
        assert_eq!(b.next.load(Ordering::Relaxed), 101);
        assert_eq!(b.grant.load(Ordering::Relaxed), 18);
        b.stream_at(118, 8, 9, 20);
        assert_eq!(b.grant.load(Ordering::Relaxed), 20, "bounded");
    }

    #[test]
    fn a_descending_stream_grants_evictions_above_a_gap() {
        let b = Behind::new();
        b.stream_down_at(usize::MAX - 3, 8, 9, 100);
        assert_eq!(b.grant.load(Ordering::Relaxed), 0, "no page above the gap");
        b.stream_down_at(UP - 4, 8, 9, 100);
        assert_eq!(
            b.grant.load(Ordering::Relaxed),
            0,
            "the page would read as a direction"
        );
        b.stream_down_at(100, 8, 9, 20);
        assert_eq!(b.next.load(Ordering::Relaxed), 108 | UP);
        assert_eq!(b.grant.load(Ordering::Relaxed), 9);
        // An ascending stream after it points the search down again; the grant adds up.
        b.stream_at(300, 8, 9, 20);
        assert_eq!(b.next.load(Ordering::Relaxed), 292);
        assert_eq!(b.grant.load(Ordering::Relaxed), 18);
    }
}
