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

/// Pages a discard claims and drops together: the most it holds at once.
const DISCARD_BATCH: usize = 64;

impl Shared {
    /// The word a released (not installed) page goes back to: absent, keeping its mark.
    pub(super) fn released(&self, page: usize, state: State) -> u64 {
        (self.pages.load(page) & DISCARDED) | state as u64
    }

    /// Discards pages `first..last`. Each page is claimed once no other thread is in the
    /// middle of a transition on it (a fill, write-back, flush or unprotect finishes first),
    /// so no write-back of old contents can land after the drop, and no page outside the
    /// range is touched. Resident pages are claimed (moved to `Evicting`) and dropped in
    /// batches of at most [`DISCARD_BATCH`]; before waiting for another thread's transition
    /// the batch claimed so far is dropped, so a discard never waits while it holds pages:
    /// the thread it waits for may be a fill that needs a frame, and a discard wider than
    /// the buffer could otherwise hold every one of them. Returns the number of resident
    /// pages dropped.
    ///
    /// If the kernel refuses a drop, the pages of that batch are given back as they were and
    /// the error is returned: pages dropped by earlier batches stay discarded, and the pages
    /// after the failed batch are left alone.
    pub(super) fn discard_pages(&self, first: usize, last: usize) -> Result<u64, RegionError> {
        let mut claimed = Vec::with_capacity(DISCARD_BATCH.min(last - first));
        let mut dropped = 0;
        for page in first..last {
            loop {
                let w = self.pages.load(page);
                if word::in_transition(w) {
                    // Never wait while holding pages: the owner may need one of our frames.
                    dropped += self.drop_discarded(&mut claimed)?;
                    self.settled(page);
                    continue;
                }
                let took = match word::state(w) {
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
                    // In transition: looked at again above.
                    _ => false,
                };
                if took {
                    break;
                }
            }
            if claimed.len() == DISCARD_BATCH {
                dropped += self.drop_discarded(&mut claimed)?;
            }
        }
        dropped += self.drop_discarded(&mut claimed)?;
        Ok(dropped)
    }

    /// Drops the `claimed` pages (each moved from a resident or poisoned word `w` to
    /// `Evicting` by this thread) from memory without writing them back, returns their frames
    /// and marks them absent and discarded; empties `claimed`. Returns the number of resident
    /// pages dropped. If the kernel refuses, every page is given back as it was.
    fn drop_discarded(&self, claimed: &mut Vec<(usize, u64)>) -> Result<u64, RegionError> {
        if claimed.is_empty() {
            return Ok(0);
        }
        let ranges = self.page_ranges(claimed);
        if let Err(source) = self.drop_ranges(&ranges) {
            // Nothing dropped for sure: give every page back as it was.
            for &(page, w) in claimed.iter() {
                self.finish(page, w);
            }
            claimed.clear();
            return Err(RegionError::Kernel {
                op: "MADV_DONTNEED",
                source,
                hint: "the pages were kept; this is a kernel or pager bug, report it",
            });
        }
        let mut dropped = 0;
        for &(page, w) in claimed.iter() {
            if word::state(w) != State::Poisoned {
                self.frames.push(word::frame(w));
                dropped += 1;
            }
            self.finish(page, DISCARDED | State::Absent as u64);
        }
        claimed.clear();
        self.stats.add_evictions(dropped);
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use strata_core::{MemoryStore, PagerConfig};

    use super::DISCARDED;
    use crate::pages::{State, word};
    use crate::region::Region;
    use crate::watchdog::Watchdog;

    /// A discard wider than the buffer meets a fill in its range that needs a frame while
    /// every frame is held (resident pages of the range, the rest by fills outside it): the
    /// discard drops what it claimed before it waits for the fill, so the fill gets a frame
    /// at once. Before, the discard waited while holding every resident page of the range in
    /// `Evicting`, and the fill starved until `FRAME_WAIT` (30 s) ran out with `BufferBusy`
    /// (its faulting thread would get `SIGBUS`). The pager threads are stopped after the
    /// setup, so the test alone moves pages and the order is fixed.
    #[test]
    fn discard_never_holds_pages_while_it_waits_for_a_fill() {
        if !crate::probe::probe().is_ok_and(|s| s.write_protect()) {
            eprintln!("SKIPPED: userfaultfd with write protection unavailable");
            return;
        }
        let _watchdog = Watchdog::start(
            "discard_never_holds_pages_while_it_waits_for_a_fill",
            Duration::from_secs(60),
        );
        let page = 4096usize;
        let frames = 8usize;
        let pages = 24usize;
        // The discarded range: wider than the buffer; its last page is the one being filled.
        let range = 16usize;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                u64::try_from(d.as_nanos() & 0xffff_ffff).unwrap_or(1)
            });
        eprintln!("seed {seed}");
        let data: Vec<u8> = (0..page * pages)
            .map(|i| u8::try_from((i as u64 ^ seed).wrapping_mul(0x9E37_79B9) >> 56).unwrap_or(0))
            .collect();
        let store = Arc::new(MemoryStore::from_bytes(&data));
        let config = PagerConfig::builder()
            .page_bytes(page as u64)
            .buffer_bytes((page * frames) as u64)
            .fillers(1)
            .evictors(1)
            .build()
            .unwrap();
        let mut region = Region::new(store, data.len() as u64, config).unwrap();
        for p in 0..frames {
            assert_eq!(
                std::hint::black_box(region.as_slice()[p * page]),
                data[p * page],
                "page {p}"
            );
        }
        // From here on no pager thread runs (and nothing touches the region's memory).
        region.stop_threads();
        let shared = &region.shared;
        let resident = (0..range)
            .filter(|&p| {
                matches!(
                    word::state(shared.pages.load(p)),
                    State::Clean | State::Dirty
                )
            })
            .count();
        assert!(resident > 0, "the setup left no page resident");
        // Every free frame is taken by a fill of a page outside the range.
        let mut held = Vec::new();
        while let Some(f) = shared.frames.pop() {
            let p = range + held.len();
            let w = shared.pages.load(p);
            assert!(shared.pages.cas(p, w, word::with_state(w, State::Filling)));
            held.push((p, f));
        }
        // A fill of the range's last page is under way.
        let filling = range - 1;
        let w = shared.pages.load(filling);
        assert_eq!(word::state(w), State::Absent);
        assert!(
            shared
                .pages
                .cas(filling, w, word::with_state(w, State::Filling))
        );
        let got = Mutex::new(None);
        let dropped = std::thread::scope(|scope| {
            scope.spawn(|| {
                // Once the discard has reached the filling page, the fill asks for a frame.
                let reached = |p: usize| {
                    let w = shared.pages.load(p);
                    word::state(w) == State::Evicting
                        || (word::state(w) == State::Absent && w & DISCARDED != 0)
                };
                let deadline = Instant::now() + Duration::from_secs(20);
                while !(0..filling).all(reached) && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                let started = Instant::now();
                let frame = shared.wait_for_frame();
                let waited = started.elapsed();
                if let Ok(Some(f)) = frame {
                    shared.frames.push(f);
                }
                shared.finish(filling, shared.released(filling, State::Absent));
                *got.lock().unwrap() = Some((frame.map(|f| f.is_some()), waited));
            });
            region.discard(0, (range * page) as u64)
        });
        let (frame, waited) = got.lock().unwrap().take().expect("the fill ran");
        let frame = frame.map_err(|e| e.to_string());
        assert_eq!(
            frame,
            Ok(true),
            "the fill got no frame after {waited:?} while a discard waited for it"
        );
        assert!(
            waited < Duration::from_secs(10),
            "the fill waited {waited:?} for a frame"
        );
        assert_eq!(dropped.expect("discard"), resident as u64);
        for p in 0..range {
            let w = shared.pages.load(p);
            assert!(
                word::state(w) == State::Absent && w & DISCARDED != 0,
                "page {p} not discarded: {w:#x}"
            );
        }
        for (p, f) in held {
            shared.frames.push(f);
            shared.finish(p, shared.released(p, State::Absent));
        }
    }
}
