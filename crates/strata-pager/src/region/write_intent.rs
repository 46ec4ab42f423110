//! How the pager learns which resident pages a program wrote, so that evicting a page the
//! program only read costs no store write.
//!
//! - [`WriteTracking::Trap`] (the default): a page read from the store is installed
//!   write-protected, and the first write to it traps once (a write-protect fault) and marks it
//!   dirty. Predicting writes softens that: a page that was written during its last stay in
//!   memory is installed writable (and dirty) on its next read fault, so a program that reads
//!   and then writes each page it touches pays one round trip to the pager per page instead of
//!   two (a missing-page fault, then a write-protect fault). Off unless
//!   [`RegionBuilder::predict_writes`] asks. A page installed on a guess cannot show whether it
//!   was written (it never traps), so its next eviction does not mark it written: the guess is
//!   made at most every other stay, and a page written once and then only read costs one
//!   needless write-back, not one per eviction.
//! - [`WriteTracking::Digest`]: every page is installed writable and no write ever traps. The
//!   digest of the bytes read (`unchanged.rs`) tells, at eviction or flush, which pages the
//!   program changed; only those are written. A write-protect fault is a round trip to the
//!   pager on the program's critical path (tens of microseconds on a virtual machine, most of
//!   it waking the program's CPU), while a digest costs a few microseconds of an evictor's
//!   time off that path: `sort` of 32 MiB under a 32 MiB memory group over a memory node took
//!   3.54 s instead of 3.83 s (14 k write-protect faults gone), over a file 5.67 s instead of
//!   6.57 s. The price: an eviction of a page that was only read now write-protects it and
//!   hashes it before dropping it, and a page filled with zeros is always written back, as
//!   with trapping.
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

/// How the pager learns which resident pages were written (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteTracking {
    /// Install pages read from the store write-protected; the first write traps and marks the
    /// page dirty (the default).
    #[default]
    Trap,
    /// Install every page writable and write back, at eviction or flush, only the pages whose
    /// bytes no longer match the digest of what was read. Needs the digests of
    /// `PagerConfig::skip_unchanged` (on by default); without them, and for read-only
    /// regions, the region traps writes instead.
    Digest,
}

impl Shared {
    /// Whether a fill from the store of `count` pages for a read fault (the first page's word
    /// `w`) installs them writable: always when writes are found by digest, else single pages
    /// whose write is predicted.
    pub(super) fn fill_writable(&self, count: usize, w: u64) -> bool {
        self.writes_by_digest || (count == 1 && self.guess_write(w))
    }

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
