//! Predicting writes: a page that was written during its last stay in memory is installed
//! writable (and dirty) on its next read fault, so a program that reads and then writes each
//! page it touches pays one round trip to the pager per page instead of two (a missing-page
//! fault, then a write-protect fault). Off unless [`RegionBuilder::predict_writes`] asks.
//!
//! A page installed on a guess cannot show whether it was written (it never traps), so its
//! next eviction does not mark it written: the guess is made at most every other stay, and a
//! page written once and then only read costs one needless write-back, not one per eviction.
//!
//! [`RegionBuilder::predict_writes`]: super::RegionBuilder::predict_writes

use std::sync::atomic::{AtomicU64, Ordering};

use super::shared::Shared;
use crate::pages::{State, word};

/// In an absent page's word: the page was written (trapped) during its last stay. It lives in
/// the frame field, which only resident states use, beside `DISCARDED`; every fill builds a
/// fresh word, which clears it.
pub(super) const WRITTEN: u64 = 1 << 62;

/// One bit per page (empty when not enabled): for write prediction, installed writable on a
/// guess and not seen written since; reused for read-back, installed by read-back and not
/// seen used since.
#[derive(Debug)]
pub(super) struct Guessed(Box<[AtomicU64]>);

impl Guessed {
    pub(super) fn new(pages: usize, enabled: bool) -> Self {
        let words = if enabled { pages.div_ceil(64) } else { 0 };
        Self(crate::pages::zeroed_words(words))
    }

    fn bit(&self, page: usize) -> Option<(&AtomicU64, u64)> {
        self.0.get(page / 64).map(|w| (w, 1u64 << (page % 64)))
    }

    /// Records whether `page` was just installed on a guess.
    pub(super) fn set(&self, page: usize, guessed: bool) {
        if let Some((w, bit)) = self.bit(page) {
            if guessed {
                w.fetch_or(bit, Ordering::Relaxed);
            } else {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        }
    }

    /// Whether `page` was installed on a guess, clearing the record.
    pub(super) fn take(&self, page: usize) -> bool {
        self.bit(page)
            .is_some_and(|(w, bit)| w.fetch_and(!bit, Ordering::Relaxed) & bit != 0)
    }
}

impl Shared {
    /// Whether a read fault on `page` (its word `w`, claimed for filling) should install it
    /// writable: predicting is on and the page was seen written during its last stay.
    pub(super) fn guess_write(&self, w: u64) -> bool {
        self.predict_writes && w & WRITTEN != 0
    }

    /// The mark an evicted page's absent word carries: `WRITTEN` if it was dirty (`w` is its
    /// word before eviction) by a write the pager saw, not by a guess.
    pub(super) fn written_mark(&self, page: usize, w: u64) -> u64 {
        if !self.predict_writes {
            return 0;
        }
        let guessed = self.guessed.take(page);
        if word::state(w) == State::Dirty && !guessed {
            WRITTEN
        } else {
            0
        }
    }
}
