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
//! How: each fault that continues an ascending stream grants as many evictions behind it as
//! the fault and its queued read-ahead windows fill, and points the search a gap below the
//! faulting page (the program may still touch the page it left, and the window it just
//! read). A victim is taken from there downwards, whatever its reference bits; when a short
//! search finds nothing resident there, or the grant is used up (the program stopped
//! sweeping: random faults grant nothing), the clock chooses as before. Only with
//! [`super::EvictionPolicy::Clock`]: FIFO stays Umap's policy, for comparison.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::shared::Shared;
use crate::pages::{State, word};

/// Pages looked at below the search point before giving the choice back to the clock.
const SEARCH: usize = 64;

/// Where to evict behind the latest stream, and how many evictions it has left.
#[derive(Debug)]
pub(super) struct Behind {
    /// The next page to look at (downwards).
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
        let start = self
            .behind
            .next
            .load(Ordering::Relaxed)
            .min(self.pages.len().saturating_sub(1));
        for q in (start.saturating_sub(SEARCH)..=start).rev() {
            let w = self.pages.load(q);
            if !matches!(word::state(w), State::Clean | State::Dirty) {
                continue;
            }
            if self.pages.cas(q, w, word::with_state(w, State::Evicting)) {
                self.behind
                    .next
                    .store(q.saturating_sub(1), Ordering::Relaxed);
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
}
