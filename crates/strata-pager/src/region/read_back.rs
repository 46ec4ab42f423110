//! Read-back: a fault's page comes back from the store together with pages evicted next to it.
//!
//! Why: pages an evictor drops together were used together (the clock reaches frames filled
//! at about the same time), and they tend to be needed together again. A program that thrashes
//! at random through a disk or a memory node pays one synchronous store read per fault; reading
//! the neighbours in eviction order with it, in one batched store read (one `io_uring`
//! submission on a file, one pipelined batch on a memory node), costs about one read's latency
//! and saves the faults they would take. This is the kernel's swap read-around, where pages
//! evicted together sit in neighbouring swap slots; here the store keeps pages at their own
//! offsets, so the neighbours come from a log of the eviction order instead. Measured on a
//! trace of `sort` at 6x its budget (`crates/strata-run/results/readback/`): 7 neighbours cut
//! the synchronous reads by half to two thirds.
//!
//! Safety of the data: a page is read back only if it is absent, was not discarded, and its
//! latest eviction is the one logged (so the store holds its newest bytes: a dirty page is
//! written back before it is marked absent). It is claimed (`Absent` -> `Filling`) before the
//! read, so no fault, flush or discard touches it meanwhile (a fault on it waits for this
//! filler), and installed write-protected and clean, so a later write traps and marks it
//! dirty. Read-back takes only free frames above the demand reserve, like read-ahead: it never
//! evicts and never waits. If the batched read fails, the read-back pages are released (left
//! absent, their store copies untouched) and the faulting page is read again alone: an error
//! on a neighbour never fails the fault.
//!
//! A page read back and evicted again without a fault on it (a first write traps; a read
//! does not show) is left out of the eviction log: otherwise a group read back together is
//! evicted together, and the next fault on any of them reads the whole group back again,
//! used or not. Sort at 6x with that loop read 6 times the bytes and took no fewer faults.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_core::store::ReadRequest;

use super::RegionError;
use super::discard::is_discarded;
use super::fault::OnFillError;
use super::shared::{Scratch, Shared, bump};
use super::trace::Event;
use crate::pages::{GHOST, State, word};

/// The recent eviction order: which page was evicted at each position, and each page's latest
/// position, so the neighbours of a faulting page's eviction can be found.
#[derive(Debug)]
pub(super) struct EvictLog {
    /// Page + 1 evicted at each position (modulo the ring's length); 0: none yet.
    ring: Box<[AtomicU64]>,
    /// Position + 1 of each page's latest logged eviction; 0: never.
    latest: Box<[AtomicU64]>,
    next: AtomicU64,
}

impl EvictLog {
    /// A log for `pages` pages remembering the last `depth` evictions (rounded up to a power
    /// of two). Both tables are zeroed lazily, so a large sparse region costs only what it uses.
    pub(super) fn new(pages: usize, depth: usize) -> Self {
        Self {
            ring: crate::pages::zeroed_words(depth.next_power_of_two()),
            latest: crate::pages::zeroed_words(pages),
            next: AtomicU64::new(0),
        }
    }

    /// Notes that `page` is being evicted (call before its word becomes absent).
    pub(super) fn note(&self, page: usize) {
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        self.slot(at).store(page as u64 + 1, Ordering::Relaxed);
        self.latest[page].store(at + 1, Ordering::Release);
    }

    fn slot(&self, at: u64) -> &AtomicU64 {
        let mask = self.ring.len() as u64 - 1;
        // The mask keeps the index below the ring's length, which is a usize.
        &self.ring[usize::try_from(at & mask).unwrap_or(0)]
    }

    /// The page evicted at position `at`, if the log still holds it and it is that page's
    /// latest eviction.
    fn page_at(&self, at: u64) -> Option<usize> {
        let next = self.next.load(Ordering::Relaxed);
        if at >= next || next - at > self.ring.len() as u64 {
            return None;
        }
        let page = usize::try_from(self.slot(at).load(Ordering::Relaxed).checked_sub(1)?).ok()?;
        let latest = self.latest.get(page)?.load(Ordering::Acquire);
        (latest == at + 1).then_some(page)
    }

    /// Forgets `page`'s latest eviction: it was read back and never seen used, so it is no
    /// one's neighbour (reading it back again would repeat the waste).
    pub(super) fn forget(&self, page: usize) {
        self.latest[page].store(0, Ordering::Release);
    }

    /// The position of `page`'s latest eviction, if the log still holds it.
    fn position(&self, page: usize) -> Option<u64> {
        let at = self
            .latest
            .get(page)?
            .load(Ordering::Acquire)
            .checked_sub(1)?;
        self.page_at(at).filter(|&p| p == page).map(|_| at)
    }
}

impl Shared {
    /// Claims (moves to `Filling`) up to `self.read_back` pages evicted next to `page` in
    /// eviction order, nearest first, that are absent with the store's copy current; each
    /// with its absent word, to go back to if it is not installed. `page` itself must be
    /// claimed by the caller.
    pub(super) fn claim_read_back(&self, page: usize) -> Vec<(usize, u64)> {
        let Some(log) = &self.evict_log else {
            return Vec::new();
        };
        let Some(at) = log.position(page) else {
            return Vec::new();
        };
        let want = self.read_back;
        let mut claimed = Vec::with_capacity(want);
        // Look a little past `want` each way: some neighbours came back already.
        for d in 1..=2 * want as u64 {
            for pos in [at.checked_add(d), at.checked_sub(d)].into_iter().flatten() {
                if claimed.len() == want {
                    return claimed;
                }
                let Some(q) = log.page_at(pos) else {
                    continue;
                };
                let w = self.pages.load(q);
                if word::state(w) == State::Absent
                    && w & GHOST != 0
                    && !is_discarded(w)
                    && self.pages.cas(q, w, word::with_state(w, State::Filling))
                {
                    claimed.push((q, w));
                }
            }
        }
        claimed
    }

    /// Fills the faulting `page` alone, as a plain demand fault (which re-checks the page's
    /// kind), giving back the frame `first` it had taken. No read-back page was installed.
    fn fill_alone(
        &self,
        page: usize,
        write: bool,
        first: u32,
        tid: u32,
        scratch: &mut Scratch,
    ) -> Result<usize, RegionError> {
        self.frames.push(first);
        self.fill_run(
            page,
            1,
            write,
            &super::fault::FrameSource::Demand,
            &OnFillError::Poison { tid },
            scratch,
        )
        .map(|_| 0)
    }

    /// Fills the faulting `page` (claimed) and the read-back pages `others` (claimed) with one
    /// batched store read. The faulting page gets a frame as any demand fault; the others take
    /// free frames above the reserve, and those without one are released. Returns how many
    /// read-back pages were installed; an error is the faulting page's own.
    pub(super) fn fill_with_read_back(
        &self,
        page: usize,
        write: bool,
        mut others: Vec<(usize, u64)>,
        tid: u32,
        scratch: &mut Scratch,
    ) -> Result<usize, RegionError> {
        let first = match self.wait_for_frame() {
            Ok(Some(f)) => f,
            Ok(None) => unreachable!("a demand frame waits until it gets one or fails"),
            Err(e) => {
                self.give_back(&others, &[]);
                self.release_run(page, 1);
                self.fail_absent_page(page, tid);
                return Err(e);
            }
        };
        let mut frames = vec![first];
        while frames.len() <= others.len() {
            match self.frame_for_ahead() {
                Some(f) => frames.push(f),
                None => break,
            }
        }
        self.give_back(&others[frames.len() - 1..], &[]);
        others.truncate(frames.len() - 1);
        if others.is_empty() {
            // No frame to spare: the plain fill.
            return self.fill_alone(page, write, first, tid, scratch);
        }
        let pb = self.page_bytes;
        let pages: Vec<usize> = std::iter::once(page)
            .chain(others.iter().map(|&(q, _)| q))
            .collect();
        let buf = scratch.get(pages.len() * pb, Some(self));
        buf.fill(0);
        let read = {
            let mut requests: Vec<ReadRequest<'_>> = buf
                .chunks_mut(pb)
                .zip(&pages)
                .map(|(chunk, &p)| ReadRequest {
                    offset: self.store_offset(p),
                    buf: &mut chunk[..self.io_len(p)],
                })
                .collect();
            self.store.read_batch(&mut requests)
        };
        if read.is_err() {
            // Which request failed is not known: give the read-back pages up (absent, their
            // store copies untouched) and read the faulting page alone, so that an error on
            // a neighbour does not fail this fault.
            self.give_back(&others, &frames[1..]);
            return self.fill_alone(page, write, first, tid, scratch);
        }
        let bytes: u64 = pages.iter().map(|&p| self.io_len(p) as u64).sum();
        self.stats.add_read(self.tier, bytes);
        // Not digested (read-back is off by default): these pages are always written back.
        for &p in &pages {
            self.digests.forget(p);
        }
        // The faulting page first: its thread waits for it.
        let guessed = !write && self.guess_write(self.pages.load(page));
        let writable = write || guessed;
        self.frames.assign(first, page);
        if let Err(e) = self.uffd.copy(self.page_addr(page), &buf[..pb], !writable) {
            eprintln!("strata-pager: UFFDIO_COPY of page {page} failed: {e}");
            self.frames.push(first);
            self.poison(page, tid);
            self.give_back(&others, &frames[1..]);
            return Err(RegionError::Kernel {
                op: "UFFDIO_COPY",
                source: e,
                hint: "this is a pager bug or a program that remapped the region; report it",
            });
        }
        self.installed(page, first, writable, guessed, Event::Demand, false);
        let mut got = 0;
        for (i, (&(q, w), &f)) in others.iter().zip(&frames[1..]).enumerate() {
            let bytes = &buf[(i + 1) * pb..(i + 2) * pb];
            self.frames.assign(f, q);
            match self.uffd.copy(self.page_addr(q), bytes, true) {
                Ok(()) => {
                    self.installed(q, f, false, false, Event::ReadBack, false);
                    got += 1;
                }
                Err(e) => {
                    // ENOENT: the program split the region's mapping there; the page stays
                    // absent and faults normally.
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        eprintln!("strata-pager: UFFDIO_COPY of read-back page {q} failed: {e}");
                    }
                    self.give_back(&[(q, w)], &[f]);
                }
            }
        }
        bump(&self.counters.read_back_pages, got as u64);
        self.stats.add_prefetched(got as u64);
        Ok(got)
    }

    /// Puts read-back pages that were not installed back as they were (absent, with their
    /// eviction marks; waiting faults are woken and retry), and their frames, if any, back
    /// on the free list.
    fn give_back(&self, pages: &[(usize, u64)], frames: &[u32]) {
        for &f in frames {
            self.frames.push(f);
        }
        for &(q, w) in pages {
            self.finish(q, w);
        }
    }
}
