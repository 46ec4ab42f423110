//! Bringing pages in before they fault: read-ahead windows after sequential faults (served
//! by the read-ahead threads) and explicit prefetch.

use std::sync::atomic::Ordering;

use super::RegionError;
use super::discard::{is_discarded, joins_run};
use super::fault::{FrameSource, OnFillError};
use super::shared::{IDLE_RELEASE, MAX_RUN_BYTES, Scratch, Shared, bump};
use crate::pages::{State, word};

/// Read-ahead windows waiting for a read-ahead thread, per filler; older ones are dropped.
const QUEUED_WINDOWS_PER_FILLER: usize = 4;
/// Windows queued after the one a sequential fault reads itself: two, so that two thirds
/// of a stream is read in the background rather than one half.
pub(super) const WINDOWS_AHEAD: usize = 2;

impl Shared {
    /// Claims up to `max` absent pages from `first` on (moves them to `Filling`), stopping
    /// at the first that is not absent or not of the run's kind: discarded (`Some(true)`) or
    /// not (`Some(false)`); `None` takes the kind of the page at `first`. Returns how many.
    pub(super) fn claim_run(&self, first: usize, max: usize, zero: Option<bool>) -> usize {
        let end = (first + max).min(self.pages.len());
        let mut count = 0;
        let mut zero = zero;
        for q in first..end {
            let w = self.pages.load(q);
            let kind = *zero.get_or_insert_with(|| is_discarded(w));
            if !joins_run(w, kind) || !self.pages.cas(q, w, word::with_state(w, State::Filling)) {
                break;
            }
            count += 1;
        }
        count
    }

    /// Claims up to `max` absent pages just below `end` (`end - 1` first, then downwards),
    /// stopping as [`Shared::claim_run`] does. Returns how many: the run is
    /// `end - count..end`.
    pub(super) fn claim_run_down(&self, end: usize, max: usize, zero: bool) -> usize {
        let mut count = 0;
        while count < max && count < end {
            let q = end - 1 - count;
            let w = self.pages.load(q);
            if !joins_run(w, zero) || !self.pages.cas(q, w, word::with_state(w, State::Filling)) {
                break;
            }
            count += 1;
        }
        count
    }

    /// Fills claimed read-ahead pages, from `source` (read-ahead, or background). Read-ahead
    /// is a guess: its failure is not the program's (the page's own fault reports a lasting
    /// store error).
    pub(super) fn fill_ahead(
        &self,
        first: usize,
        count: usize,
        source: &FrameSource,
        scratch: &mut Scratch,
    ) {
        if let Ok(n) = self.fill_run(first, count, false, source, &OnFillError::Release, scratch) {
            bump(&self.counters.read_ahead_pages, n as u64);
            self.stats.add_prefetched(n as u64);
        }
    }

    pub(super) fn queue_read_ahead(&self, first: usize, count: usize) {
        let mut q = self.ra_queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= QUEUED_WINDOWS_PER_FILLER * self.config.fillers.max(1) {
            // The read-ahead threads are behind: the oldest guess is the least useful.
            q.pop_front();
        }
        q.push_back((first, count));
        drop(q);
        self.ra_ready.notify_one();
    }

    pub(super) fn read_ahead_main(&self) {
        // Every job is a window: nothing is kept once the thread goes idle.
        let mut scratch = Scratch::new(0);
        loop {
            let job = {
                let mut q = self.ra_queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        drop(q);
                        scratch.release(0, Some(self));
                        return;
                    }
                    if let Some(job) = q.pop_front() {
                        break job;
                    }
                    let (guard, waited) = self
                        .ra_ready
                        .wait_timeout(q, IDLE_RELEASE)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    q = guard;
                    if waited.timed_out() && q.is_empty() && scratch.holds_more_than_kept() {
                        // No stream for a while (a random phase): its window's memory is
                        // the program's again.
                        scratch.release(0, Some(self));
                    }
                }
            };
            // Claimed only now, so a demand fault that came first has the page to itself.
            let n = self.claim_run(job.0, job.1, None);
            if n > 0 {
                self.fill_ahead(job.0, n, &FrameSource::Background, &mut scratch);
            }
        }
    }

    pub(super) fn prefetch_pages(
        &self,
        first: usize,
        last: usize,
        scratch: &mut Scratch,
    ) -> Result<u64, RegionError> {
        let max_run = (MAX_RUN_BYTES / self.page_bytes)
            .min(self.frames.len() / 4)
            .max(1);
        let mut total = 0u64;
        let mut page = first;
        while page < last {
            let count = self.claim_run(page, (last - page).min(max_run), None);
            if count == 0 {
                page += 1;
                continue;
            }
            let got = self.fill_run(
                page,
                count,
                false,
                &FrameSource::Prefetch,
                &OnFillError::Release,
                scratch,
            )?;
            total += got as u64;
            // Pages that found no frame were released: the next run starts with them.
            page += got.max(1);
        }
        Ok(total)
    }
}
