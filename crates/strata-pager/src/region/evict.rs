//! Eviction: the clock (or FIFO) that picks victims, the evictor threads that keep the
//! resident set between the water marks, and `Region::evict`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::RegionError;
use super::shared::Shared;
use super::trace::{Event, Trace};
use crate::pages::{HOT, REF, State, word};

/// How the evictors choose a victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Clock over the buffer's frames with reference bits (set on fill and first write) and
    /// re-fault detection: the default.
    #[default]
    Clock,
    /// First in, first out (the clock without reference bits): Umap's policy, for comparison.
    Fifo,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "clock" => Ok(Self::Clock),
            "fifo" => Ok(Self::Fifo),
            _ => Err(format!(
                "eviction policy {s:?} not understood; write clock or fifo"
            )),
        }
    }
}

pub(super) enum Evicted {
    Frame(u32),
    Nothing,
    /// The victim's write-back failed: it stays resident and dirty.
    WriteFailed {
        page: usize,
        error: RegionError,
    },
}

/// Pages an evictor claims and drops together.
pub(super) const EVICT_BATCH: usize = 64;

impl Shared {
    /// Sweeps the clock until it claims a victim (moves it to `Evicting`), giving pages with
    /// a reference or hot bit another pass. None if a few turns found nothing evictable.
    pub(super) fn claim_victim(&self) -> Option<(usize, u64)> {
        if self.policy == EvictionPolicy::Clock
            && let Some(victim) = self.claim_behind()
        {
            return Some(victim);
        }
        let n = self.frames.len();
        for _ in 0..3 * n {
            let f = self.frames.tick();
            let page = self.frames.owner(f);
            if page == crate::pages::NO_PAGE {
                continue;
            }
            let page = usize::try_from(page).unwrap_or(usize::MAX);
            let w = self.pages.load(page);
            if word::frame(w) as usize != f
                || !matches!(word::state(w), State::Clean | State::Dirty)
            {
                continue;
            }
            if self.policy == EvictionPolicy::Clock && w & (REF | HOT) != 0 {
                // Another pass: clear the reference bit, or else cool the page by one.
                let cooled = if w & REF != 0 {
                    w & !REF
                } else {
                    word::with_heat(w, word::heat(w) - 1)
                };
                self.pages.cas(page, w, cooled);
                continue;
            }
            if self
                .pages
                .cas(page, w, word::with_state(w, State::Evicting))
            {
                return Some((page, w));
            }
        }
        None
    }

    /// Claims up to `want` victims (fewer when the clock finds no more evictable now).
    pub(super) fn claim_victims(&self, want: usize) -> Vec<(usize, u64)> {
        let mut claimed = Vec::with_capacity(want);
        while claimed.len() < want {
            match self.claim_victim() {
                Some(v) => claimed.push(v),
                None => break,
            }
        }
        claimed
    }

    /// Evicts one page; the caller gets its frame.
    pub(super) fn evict_one(&self) -> Evicted {
        let Some(victim) = self.claim_victim() else {
            return Evicted::Nothing;
        };
        let (mut frames, error) = self.complete_evictions(vec![victim]);
        match (frames.pop(), error) {
            (Some(f), _) => Evicted::Frame(f),
            (None, Some(error)) => Evicted::WriteFailed {
                page: victim.0,
                error,
            },
            (None, None) => Evicted::Nothing,
        }
    }

    /// Evicts `page` whose word was `w` (resident). `Ok(None)`: the word changed meanwhile
    /// (the caller looks again); `Ok(Some(dropped))`: whether the page left memory (it stays,
    /// clean, when the kernel refused to drop it). Its frame goes back to the free list.
    pub(super) fn evict_page(&self, page: usize, w: u64) -> Result<Option<bool>, RegionError> {
        if !self
            .pages
            .cas(page, w, word::with_state(w, State::Evicting))
        {
            return Ok(None);
        }
        let (frames, error) = self.complete_evictions(vec![(page, w)]);
        for f in &frames {
            self.frames.push(*f);
        }
        match error {
            Some(e) => Err(e),
            None => Ok(Some(!frames.is_empty())),
        }
    }

    /// Finishes evicting pages this thread claimed (each was `w` before it became
    /// `Evicting`): writes dirty ones back, drops them all from memory (one call for the lot
    /// where the kernel allows, so one TLB flush), and marks them absent. Returns the freed
    /// frames and the first write-back error (a page that fails stays resident and dirty).
    pub(super) fn complete_evictions(
        &self,
        mut claimed: Vec<(usize, u64)>,
    ) -> (Vec<u32>, Option<RegionError>) {
        let mut first_error = None;
        claimed.sort_unstable_by_key(|&(page, _)| page);
        let dirty: Vec<usize> = claimed
            .iter()
            .filter(|&&(_, w)| word::state(w) == State::Dirty)
            .map(|&(page, _)| page)
            .collect();
        // Dirty pages whose bytes are the store's copy again are dropped without a write.
        let unchanged = self.unchanged_of(&dirty);
        let dirty: Vec<usize> = dirty
            .into_iter()
            .filter(|p| unchanged.binary_search(p).is_err())
            .collect();
        let failed = self.write_back_many(&dirty);
        if !failed.is_empty() {
            let mut failed_pages = Vec::with_capacity(failed.len());
            for (page, e) in failed {
                failed_pages.push(page);
                first_error.get_or_insert(e);
            }
            claimed.retain(|&(page, w)| {
                if failed_pages.binary_search(&page).is_err() {
                    return true;
                }
                self.finish(page, word::with_state(w | REF, State::Dirty));
                false
            });
        }
        if claimed.is_empty() {
            return (Vec::new(), first_error);
        }
        let ranges = self.page_ranges(&claimed);
        if let Err(e) = self.drop_ranges(&ranges) {
            // Nothing was lost: dirty pages were written back (and are protected again).
            eprintln!("strata-pager: MADV_DONTNEED failed: {e}");
            for &(page, w) in &claimed {
                self.finish(page, word::with_state(w, State::Clean));
            }
            return (Vec::new(), first_error);
        }
        let mut frames = Vec::with_capacity(claimed.len());
        let batch = self.trace.as_ref().map(Trace::next_batch);
        for &(page, w) in &claimed {
            let mark = self.written_mark(page, w);
            if let (Some(trace), Some(batch)) = (&self.trace, batch) {
                if word::state(w) == State::Dirty && unchanged.binary_search(&page).is_err() {
                    // Without a written mark, a dirty page was made writable on a guess.
                    let guessed = self.predict_writes && mark == 0;
                    trace.note(Event::WroteBack, page, u64::from(guessed));
                }
                trace.note(Event::Evicted, page, batch);
            }
            if let Some(log) = &self.evict_log {
                if self.read_back_unused.take(page) {
                    log.forget(page);
                } else {
                    log.note(page);
                }
            }
            let stamp = self.evictions.fetch_add(1, Ordering::Relaxed) / self.stamp_unit;
            self.finish(page, word::evicted(stamp, word::heat(w)) | mark);
            frames.push(word::frame(w));
        }
        self.stats.add_evictions(claimed.len() as u64);
        (frames, first_error)
    }

    /// The address ranges of `claimed` pages (sorted by page), neighbours merged.
    pub(super) fn page_ranges(&self, claimed: &[(usize, u64)]) -> Vec<(usize, usize)> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &(page, _) in claimed {
            let addr = self.page_addr(page);
            match ranges.last_mut() {
                Some((start, len)) if *start + *len == addr => *len += self.page_bytes,
                _ => ranges.push((addr, self.page_bytes)),
            }
        }
        ranges
    }

    /// Drops the pages of `ranges` (addresses inside the mapping) from memory.
    pub(super) fn drop_ranges(&self, ranges: &[(usize, usize)]) -> std::io::Result<()> {
        if ranges.len() > 1
            && let Some(pidfd) = &self.pidfd
            && !self.no_process_madvise.load(Ordering::Relaxed)
        {
            let total: usize = ranges.iter().map(|r| r.1).sum();
            match pidfd.dontneed(ranges) {
                Ok(n) if n == total => return Ok(()),
                Ok(_) => {} // partly done: finish below (dropping twice is harmless)
                Err(_) => self.no_process_madvise.store(true, Ordering::Relaxed),
            }
        }
        let base = self.map.ptr() as usize;
        for &(addr, len) in ranges {
            self.map.advise(addr - base, len, libc::MADV_DONTNEED)?;
        }
        Ok(())
    }

    pub(super) fn evictor_main(&self) {
        loop {
            {
                let guard = self
                    .frames
                    .pressure_lock
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                // Cleared under the lock: a filler that sets it again must take the lock to
                // wake us, which it can only do once we wait.
                self.evict_pending.store(false, Ordering::Release);
                if !self.stop.load(Ordering::Acquire)
                    && self.frames.free_count() >= self.wake_below_free
                {
                    let _unused = self
                        .frames
                        .pressure
                        .wait_timeout(guard, Duration::from_millis(50));
                }
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            while self.frames.free_count() < self.stop_at_free && !self.stop.load(Ordering::Acquire)
            {
                // Claim a batch, then drop it with one call: far fewer system calls and TLB
                // shootdowns than page by page.
                let want = (self.stop_at_free - self.frames.free_count()).clamp(1, EVICT_BATCH);
                let claimed = self.claim_victims(want);
                if claimed.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                    break;
                }
                let (frames, error) = self.complete_evictions(claimed);
                for f in frames {
                    self.frames.push(f);
                }
                if let Some(e) = error {
                    self.record(e);
                    std::thread::sleep(Duration::from_millis(1));
                    break;
                }
            }
        }
    }

    pub(super) fn evict_pages(&self, first: usize, last: usize) -> Result<u64, RegionError> {
        let mut dropped = 0;
        let mut first_error = None;
        for page in first..last {
            // A failed compare-and-swap (the clock cleared a reference bit, a fault noted that
            // it waits) is retried: only a page that is no longer resident is left alone.
            loop {
                let w = self.settled(page);
                match word::state(w) {
                    // evict_page returns the frame to the free list itself: pushing it here
                    // too would list it twice, and two pages would then share one frame, the
                    // second invisible to flush and eviction (its writes never reached the
                    // store).
                    State::Clean | State::Dirty => match self.evict_page(page, w) {
                        Ok(Some(true)) => dropped += 1,
                        Ok(Some(false)) => {}
                        Ok(None) => continue,
                        Err(e) => {
                            self.stats.add_error();
                            first_error.get_or_insert(e);
                        }
                    },
                    State::Poisoned => {
                        if !self
                            .pages
                            .cas(page, w, word::with_state(w, State::Evicting))
                        {
                            continue;
                        }
                        let cleared = self.map.advise(
                            page * self.page_bytes,
                            self.page_bytes,
                            libc::MADV_DONTNEED,
                        );
                        if let Err(e) = cleared {
                            eprintln!("strata-pager: clearing a poisoned page failed: {e}");
                        }
                        self.finish(page, self.released(page, State::Absent));
                    }
                    _ => {}
                }
                break;
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(dropped),
        }
    }
}
