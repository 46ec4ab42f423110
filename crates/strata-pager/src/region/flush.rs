//! Writing dirty pages back: write-protect, then store, for `flush`, eviction and unmap.

use super::RegionError;
use super::shared::{MAX_RUN_BYTES, Shared};
use crate::pages::{State, word};

/// Dirty pages a flush claims and writes back together.
const FLUSH_BATCH: usize = 64;

/// What [`Shared::claim_dirty`] found.
enum Claim {
    /// Claimed (moved to `Flushing`); its word before.
    Claimed(u64),
    /// Not dirty in that frame, or already in this flush's batch.
    Skip,
    /// In another thread's transition: look again once it ends.
    Busy,
}

impl Shared {
    /// Write-protects `page` and writes it to the store. The caller owns the page in a
    /// transition state. On success the page is protected and equal to the store's copy.
    pub(super) fn write_back(&self, page: usize) -> Result<(), RegionError> {
        // Before any byte is written: whether the write lands whole, in part or not at all,
        // the store may no longer hold the bytes of the page's last fill.
        self.digests.forget(page);
        let addr = self.page_addr(page);
        self.uffd
            .write_protect(addr, self.page_bytes, true)
            .map_err(|source| RegionError::Kernel {
                op: "UFFDIO_WRITEPROTECT",
                source,
                hint: "this is a pager bug; report it",
            })?;
        let len = self.io_len(page);
        // SAFETY: the page is resident (we own it in a transition state, so nobody evicts it)
        // and write-protected, so no thread modifies these bytes while we read them.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        let offset = self.store_offset(page);
        self.store
            .write_at(offset, bytes)
            .map_err(|source| RegionError::WriteBack {
                page,
                offset,
                source,
            })?;
        self.stats.add_writebacks(1);
        self.stats.add_written(self.tier, len as u64);
        Ok(())
    }

    /// Writes back `pages` (sorted, each owned by the caller in a transition state): pages
    /// next to each other are write-protected with one call and written as one run, and all
    /// runs go to the store in one batch, so an eviction batch costs a few system calls and
    /// large sequential writes instead of one of each per page. Returns the pages that could
    /// not be written, with their errors (every other page is protected and stored). When the
    /// batch fails, its pages are retried one by one, so exactly the pages the store refuses
    /// are reported.
    pub(super) fn write_back_many(&self, pages: &[usize]) -> Vec<(usize, RegionError)> {
        // As in write_back: forgotten before anything is written.
        for &page in pages {
            self.digests.forget(page);
        }
        if pages.len() <= 1 {
            return pages
                .iter()
                .filter_map(|&p| self.write_back(p).err().map(|e| (p, e)))
                .collect();
        }
        let max_run = (MAX_RUN_BYTES / self.page_bytes).max(1);
        // (first page, pages) of each run.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &page in pages {
            match runs.last_mut() {
                Some((first, n)) if *first + *n == page && *n < max_run => *n += 1,
                _ => runs.push((page, 1)),
            }
        }
        let protected = runs.iter().try_for_each(|&(first, n)| {
            self.uffd
                .write_protect(self.page_addr(first), n * self.page_bytes, true)
        });
        let mut bytes = 0u64;
        let batch: Vec<(u64, &[u8])> = runs
            .iter()
            .map(|&(first, n)| {
                let len = (n - 1) * self.page_bytes + self.io_len(first + n - 1);
                bytes += len as u64;
                // SAFETY: the run's pages are resident (the caller owns each in a transition
                // state, so nobody evicts them) and write-protected above, so no thread
                // modifies these bytes while the store reads them; `len` stays inside the
                // region (the last page counts only its bytes inside).
                let run =
                    unsafe { std::slice::from_raw_parts(self.page_addr(first) as *const u8, len) };
                (self.store_offset(first), run)
            })
            .collect();
        if protected.is_ok() && self.store.write_batch(&batch).is_ok() {
            self.stats.add_writebacks(pages.len() as u64);
            self.stats.add_written(self.tier, bytes);
            return Vec::new();
        }
        drop(batch);
        pages
            .iter()
            .filter_map(|&p| self.write_back(p).err().map(|e| (p, e)))
            .collect()
    }

    /// Writes every dirty page back and marks it clean. Pages are claimed (moved to
    /// `Flushing`) in batches of [`FLUSH_BATCH`] and written with [`Shared::write_back_many`],
    /// so a flush of scattered pages costs a few queued store writes per batch rather than one
    /// synchronous write (and one write-protect call) per page. A page whose write fails stays
    /// dirty and the first error is returned, after every other page was tried.
    pub(super) fn flush_dirty(&self) -> Result<(), RegionError> {
        let mut first_error = None;
        let mut claimed: Vec<(usize, u64)> = Vec::with_capacity(FLUSH_BATCH);
        for f in 0..self.frames.len() {
            let page = self.frames.owner(f);
            if page == crate::pages::NO_PAGE {
                continue;
            }
            let page = usize::try_from(page).unwrap_or(usize::MAX);
            loop {
                match self.claim_dirty(page, f, &claimed) {
                    Claim::Claimed(w) => {
                        claimed.push((page, w));
                        if claimed.len() == FLUSH_BATCH {
                            self.flush_claimed(&mut claimed, &mut first_error);
                        }
                    }
                    Claim::Skip => {}
                    Claim::Busy => {
                        // Never wait while holding pages: the thread we wait for may need a
                        // frame, and a batch as large as the buffer holds every one of them.
                        if !claimed.is_empty() {
                            self.flush_claimed(&mut claimed, &mut first_error);
                        }
                        self.settled(page);
                        continue;
                    }
                }
                break;
            }
        }
        self.flush_claimed(&mut claimed, &mut first_error);
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Moves `page`, if it is dirty in frame `f`, to `Flushing` (`Claim::Claimed` with its
    /// word before); `Claim::Busy` if another thread is in the middle of a transition on it.
    ///
    /// A failed compare-and-swap is retried, never taken as "not dirty": the word of a dirty
    /// page also changes when the clock clears its reference bit or cools it, or a fault
    /// notes that it waits, and a flush that skipped the page then lost its writes. A frame's
    /// owner can be stale (a frame taken by direct reclaim names its old page until the new
    /// one is installed), so the page may be one this flush has already claimed: skipped.
    fn claim_dirty(&self, page: usize, f: usize, claimed: &[(usize, u64)]) -> Claim {
        loop {
            let w = self.pages.load(page);
            if word::in_transition(w) {
                // A faulting thread resumes as soon as its page is installed or unprotected, a
                // moment before the filler records the new state: that transition must end
                // before the page is judged, or a page the caller has just written is missed.
                if claimed.iter().any(|&(p, _)| p == page) {
                    return Claim::Skip;
                }
                return Claim::Busy;
            }
            if word::frame(w) as usize != f || word::state(w) != State::Dirty {
                return Claim::Skip;
            }
            if self
                .pages
                .cas(page, w, word::with_state(w, State::Flushing))
            {
                return Claim::Claimed(w);
            }
        }
    }

    /// Writes back the `claimed` pages (each moved from `Dirty`, word `w`, to `Flushing` by
    /// this thread), marks the written ones clean and the failed ones dirty again, and empties
    /// `claimed`.
    fn flush_claimed(
        &self,
        claimed: &mut Vec<(usize, u64)>,
        first_error: &mut Option<RegionError>,
    ) {
        claimed.sort_unstable_by_key(|&(page, _)| page);
        let pages: Vec<usize> = claimed.iter().map(|&(page, _)| page).collect();
        // Pages whose bytes are the store's copy again need no write (every page read and not
        // changed, when writes are found by digest): `unchanged_of` leaves them protected, so
        // they are clean like the written ones.
        let unchanged = self.unchanged_of(&pages);
        let pages: Vec<usize> = pages
            .into_iter()
            .filter(|p| unchanged.binary_search(p).is_err())
            .collect();
        let mut failed = self.write_back_many(&pages);
        failed.sort_unstable_by_key(|(page, _)| *page);
        let written: Vec<usize> = pages
            .iter()
            .copied()
            .filter(|&p| failed.binary_search_by_key(&p, |(q, _)| *q).is_err())
            .collect();
        self.remember_written(&written);
        for &(page, w) in claimed.iter() {
            match failed.binary_search_by_key(&page, |(p, _)| *p) {
                Ok(_) => {
                    self.stats.add_error();
                    self.finish(page, word::with_state(w, State::Dirty));
                }
                Err(_) => self.finish(page, word::with_state(w, State::Clean)),
            }
        }
        if let Some((_, e)) = failed.into_iter().next() {
            first_error.get_or_insert(e);
        }
        claimed.clear();
    }

    /// The page's word once no thread is in the middle of a transition on it.
    pub(super) fn settled(&self, page: usize) -> u64 {
        let mut spins = 0u32;
        loop {
            let w = self.pages.load(page);
            if !word::in_transition(w) {
                return w;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // random test bytes: truncation is the point
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use strata_core::{MemoryStore, PagerConfig, Store};

    use crate::pages::{REF, State, word};
    use crate::region::Region;
    use crate::watchdog::Watchdog;

    /// A flush running beside a thread that keeps changing dirty pages' words the way the
    /// evictors' clock does (reference bit cleared, set again by a fault) writes every page
    /// (a lost compare-and-swap is not "not dirty"), and finishes: before, one run in three
    /// hung for good, the flush waiting on a page of its own unwritten batch (named by a frame
    /// whose owner entry was stale). A flush that stalls aborts the test binary rather than
    /// hang CI.
    #[test]
    fn flush_writes_pages_whose_words_change_under_it() {
        if !crate::probe::probe().is_ok_and(|s| s.write_protect()) {
            eprintln!("SKIPPED: userfaultfd with write protection unavailable");
            return;
        }
        let _watchdog = Watchdog::start(
            "flush_writes_pages_whose_words_change_under_it",
            std::time::Duration::from_secs(60),
        );
        let page = 4096usize;
        let pages = 8usize;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        eprintln!("seed {seed}");
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let data: Vec<u8> = (0..page * pages).map(|_| next() as u8).collect();
        let store = Arc::new(MemoryStore::from_bytes(&data));
        let config = PagerConfig::builder()
            .page_bytes(page as u64)
            .buffer_bytes((page * pages) as u64)
            .fillers(1)
            .evictors(1)
            .build()
            .unwrap();
        let mut region = Region::new(store.clone(), data.len() as u64, config).unwrap();
        let mut expect = data;
        for round in 0..400 {
            let slice = region.as_mut_slice();
            for p in 0..pages {
                let i = p * page + (next() as usize % page);
                let v = next() as u8;
                slice[i] = v;
                expect[i] = v;
            }
            let stop = AtomicBool::new(false);
            let shared = &region.shared;
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        for p in 0..pages {
                            let w = shared.pages.load(p);
                            if matches!(word::state(w), State::Clean | State::Dirty) {
                                shared.pages.cas(p, w, w ^ REF);
                            }
                        }
                    }
                });
                let flushed = region.flush();
                stop.store(true, Ordering::Relaxed);
                flushed.unwrap();
            });
            let mut stored = vec![0u8; expect.len()];
            store.read_at(0, &mut stored).unwrap();
            let wrong = (0..pages)
                .filter(|&p| stored[p * page..(p + 1) * page] != expect[p * page..(p + 1) * page])
                .count();
            assert_eq!(
                wrong, 0,
                "round {round}: {wrong} pages not written by flush"
            );
        }
    }
}
