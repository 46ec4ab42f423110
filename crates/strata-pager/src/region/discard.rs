//! `Region::discard`: dropping pages without writing them back, so that they read as zeros.
//!
//! A discarded page is absent with the [`DISCARDED`] mark: its next fill installs zeros
//! without reading the store, and the mark is cleared by that fill. The zero page is installed
//! dirty, so if it is evicted later its zeros are written back (the store's old bytes are never
//! read again through the region). Until then the store's bytes for the page are left as they
//! were: they are unspecified to anyone reading the store directly.

use super::RegionError;
use super::shared::Shared;
use crate::pages::{State, word};

/// Marks an absent (or poisoned, or filling) page as discarded: fill it with zeros, read
/// nothing. It lives in the frame field, which only resident states use; every fill builds a
/// fresh word, which clears it.
pub(super) const DISCARDED: u64 = 1 << 63;

/// Whether page word `w` may be claimed as a later page of a run whose first page is
/// discarded (`zero`) or not: a run is all discarded pages (filled with zeros, nothing read)
/// or none, so a run's store read never covers a discarded page.
pub(super) fn joins_run(w: u64, zero: bool) -> bool {
    word::state(w) == State::Absent && (w & DISCARDED != 0) == zero
}

/// Whether page word `w` is discarded (fills with zeros).
pub(super) fn is_discarded(w: u64) -> bool {
    w & DISCARDED != 0
}

impl Shared {
    /// The word a released (not installed) page goes back to: absent, keeping its mark.
    pub(super) fn released(&self, page: usize, state: State) -> u64 {
        (self.pages.load(page) & DISCARDED) | state as u64
    }

    /// Discards pages `first..last`. Each page is claimed once no other thread is in the
    /// middle of a transition on it (a fill, write-back, flush or unprotect finishes first),
    /// so no write-back of old contents can land after the drop, and no page outside the
    /// range is touched. Returns the number of resident pages dropped.
    pub(super) fn discard_pages(&self, first: usize, last: usize) -> Result<u64, RegionError> {
        let mut claimed = Vec::new();
        for page in first..last {
            loop {
                let w = self.settled(page);
                let ok = match word::state(w) {
                    State::Absent => self.pages.cas(page, w, w | DISCARDED),
                    State::Clean | State::Dirty | State::Poisoned => {
                        let took = self
                            .pages
                            .cas(page, w, word::with_state(w, State::Evicting));
                        if took {
                            claimed.push((page, w));
                        }
                        took
                    }
                    _ => false,
                };
                if ok {
                    break;
                }
            }
        }
        let ranges = self.page_ranges(&claimed);
        if let Err(source) = self.drop_ranges(&ranges) {
            // Nothing dropped for sure: give every page back as it was.
            for &(page, w) in &claimed {
                self.finish(page, w);
            }
            return Err(RegionError::Kernel {
                op: "MADV_DONTNEED",
                source,
                hint: "the pages were kept; this is a kernel or pager bug, report it",
            });
        }
        let mut dropped = 0;
        for &(page, w) in &claimed {
            if word::state(w) != State::Poisoned {
                self.frames.push(word::frame(w));
                dropped += 1;
            }
            self.finish(page, DISCARDED | State::Absent as u64);
        }
        self.stats.add_evictions(dropped);
        Ok(dropped)
    }
}
