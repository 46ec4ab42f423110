//! [`Region`]: a range of virtual memory whose pages live in a [`Store`] and are brought in on
//! demand through userfaultfd.
//!
//! # How a fault is served
//! Every filler thread waits on the region's userfaultfd (epoll with exclusive wake-ups, so one
//! fault wakes one filler), reads the fault message itself and serves it: there is no manager
//! thread in between, and no thread whose stall stops every fault. A missing-page fault claims
//! the page (compare-and-swap on its page word), takes a free frame of the buffer (or, if none
//! is free, evicts one itself: *direct reclaim*, so a filler never waits for another thread to
//! make room), reads the page from the store and installs it with `UFFDIO_COPY`. Read faults
//! install the page write-protected, so the first write traps once and marks it dirty; write
//! faults install it writable and dirty at once.
//!
//! # Eviction
//! Evictor threads keep the resident set between the low and high water marks: they sleep until
//! free frames fall below the high mark and evict until the low mark is reached. The victim is
//! chosen by a clock over frames ([`EvictionPolicy::Clock`]): a page's reference bit is set
//! when it is filled or first written, and a page that faults again soon after its eviction
//! (its *re-fault distance*, counted in evictions, is below the buffer size) is marked hot and
//! survives one more pass. While a program sweeps up or down through memory, the pages just
//! behind the sweep go first (`behind.rs`), so that a sweep repeated over more than the
//! buffer keeps the front resident instead of evicting what the next pass wants first, and a
//! slow stream beside pages read at random does not push them out. Where most recent faults
//! are random, streams keep a lean footprint (half a window, none queued, a short gap
//! behind; `streams.rs`). A dirty victim is write-protected first, then written back, then
//! dropped with `MADV_DONTNEED`, so a write racing with the write-back waits instead of being
//! lost. [`EvictionPolicy::Fifo`] (Umap's policy) is kept for comparison. Woken evictors
//! always make room for one read-ahead window, and read-ahead threads that find too few free
//! frames evict for their windows themselves, so water marks that keep almost no frame free
//! (`strata run`'s) still leave streams their windows.
//!
//! # What a faulting thread gets when the store fails
//! The fill is abandoned, the error is recorded (returned by [`Region::flush`] and
//! [`Region::take_error`]) and the faulting thread receives `SIGBUS`, as with an access beyond
//! the end of a file mapped with `mmap`. On kernels with `UFFDIO_POISON` (Linux 6.6+) the page
//! is poisoned: every access raises `SIGBUS` until [`Region::evict`] clears it, after which the
//! next access retries the store. On older kernels the faulting thread is sent `SIGBUS`
//! directly and the page stays absent. The faulting thread is never left waiting and never sees
//! zeros in place of data it cannot have.
//!
//! # Where things are
//! - `builder.rs`: [`RegionBuilder`] and starting a region (checks, mapping, threads).
//! - `shared.rs`: the state every pager thread shares, and its small helpers.
//! - `fault.rs`: filler threads and the fault path (fills, write-protect faults, poison).
//! - `frames.rs`: where a fill gets frames (free list, read-ahead's share, direct reclaim).
//! - `read_ahead.rs`: read-ahead windows and their threads, and explicit prefetch.
//! - `read_back.rs`: pages evicted next to a faulting page read back with it (the eviction log).
//! - `streams.rs`: sequential-stream detection (the ends of recent runs).
//! - `write_intent.rs`: installing pages written last time writable at once (optional).
//! - `evict.rs`: victim choice, evictor threads, and `Region::evict`.
//! - `withhold.rs`: frames taken out of the budget from outside (`Region::withhold_frames`).
//! - `flush.rs`: writing dirty pages back (for flush, eviction and unmap).
//! - `trace.rs`: the optional event record (`STRATA_PAGER_TRACE`) for offline studies.
//! - `discard.rs`: `Region::discard` (pages dropped unwritten, read back as zeros).
//! - `error.rs`: [`RegionError`] and [`UnmapError`].
//! - this file: the public [`Region`] API (access, statistics, flush, prefetch, evict, unmap).

mod behind;
mod builder;
mod discard;
mod error;
mod evict;
mod fault;
mod flush;
mod frames;
mod read_ahead;
mod read_back;
mod shared;
mod streams;
mod trace;
mod unchanged;
mod withhold;
mod write_intent;

pub use builder::RegionBuilder;
pub use error::{RegionError, UnmapError};
pub use evict::EvictionPolicy;
pub use frames::FRAME_WAIT;
pub use withhold::Withheld;
pub use write_intent::WriteTracking;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use strata_core::stats::format_ns;
use strata_core::{PagerConfig, StatsSnapshot, Store};

use crate::pages::{State, word};
use shared::{Scratch, Shared};

/// Scans of the frames [`Region::counters`] makes at most, looking for one during which no
/// frame moved.
const COUNT_TRIES: usize = 64;

/// Pager counters beyond the shared [`StatsSnapshot`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PagerCounters {
    /// First writes to clean pages (write-protect faults).
    pub write_faults: u64,
    /// Faults on pages evicted shortly before (re-fault distance below the buffer size).
    pub refaults: u64,
    /// Times a filler found no free frame and evicted one itself.
    pub direct_reclaims: u64,
    /// Pages brought in by read-ahead after sequential faults.
    pub read_ahead_pages: u64,
    /// Fault messages for pages another thread was already serving.
    pub duplicate_faults: u64,
    /// Faults answered with `SIGBUS` because the store failed.
    pub failed_faults: u64,
    /// Pages read back with a fault because they were evicted next to its page.
    pub read_back_pages: u64,
    /// Dirty pages evicted without a write because they held the store's bytes again.
    pub unchanged_write_backs: u64,
    /// Pages resident now.
    pub resident_pages: u64,
    /// Pages dirty now.
    pub dirty_pages: u64,
    /// Frames held out of use while the pager threads' scratch buffers (the windows they
    /// read into) are resident, so that those buffers count against the budget too.
    pub scratch_frames: u64,
    /// Resident pages a pager thread is moving right now (being evicted, flushed, filled or
    /// unprotected for a first write). A page being written back is in neither
    /// `dirty_pages` nor the store yet: wait until this is 0 to see it land.
    pub pages_in_transition: u64,
    /// Frames withheld from the budget now ([`Region::withhold_frames`]).
    pub withheld_frames: u64,
    /// Pages evicted by fills just before they installed theirs
    /// ([`Region::evict_before_fills`]).
    pub evicted_before_fills: u64,
}

/// A region of memory paged from a store. See the module documentation.
///
/// The memory is ordinary memory to the program: read and write it through [`Region::as_slice`],
/// [`Region::as_mut_slice`] or, from several threads at once, through [`Region::as_ptr`].
/// Dropping the region flushes it (use [`Region::unmap`] to see a flush error and keep the
/// region when the flush fails).
#[derive(Debug)]
pub struct Region {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Region {
    /// Maps `size` bytes backed by `store` (from its offset 0) with `config`. The store must
    /// hold at least `size` bytes; a last partial page reads and writes only the bytes inside
    /// the region.
    pub fn new(store: Arc<dyn Store>, size: u64, config: PagerConfig) -> Result<Self, RegionError> {
        Self::builder(store, size).config(config).build()
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.map.ptr()
    }

    /// Size in bytes (as asked for; the mapping itself is rounded up to whole pages).
    pub fn len(&self) -> usize {
        usize::try_from(self.shared.size).expect("the size was checked against usize")
    }

    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        self.shared.size == 0
    }

    /// The region as bytes. Pages fault in as they are read.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for `len()` bytes for as long as `self` lives, and
        // writes through other paths need `&mut self` or the unsafe `as_ptr`. The pager only
        // installs pages the program has not seen (their contents are the store's, which is
        // what the program reads) and writes nothing into resident pages.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes this the only live reference.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// The configuration in force.
    pub fn config(&self) -> &PagerConfig {
        &self.shared.config
    }

    /// The eviction policy in force.
    pub fn policy(&self) -> EvictionPolicy {
        self.shared.policy
    }

    /// The backing store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Counters shared with the rest of Strata. A faulting thread resumes the moment its page
    /// is installed, a moment before the filler counts the fault; this waits (at most a few
    /// milliseconds) for faults in service to be counted, so a thread that reads its own
    /// statistics sees its own faults.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.quiesce();
        self.shared.stats.snapshot()
    }

    /// Pager-specific counters (waits like [`Region::stats`]). While threads fault, the
    /// resident, scratch and withheld counts are from one scan during which no frame left a
    /// page, when one of a few scans manages that; under very heavy churn they may count a
    /// frame that moved during the last scan twice.
    pub fn counters(&self) -> PagerCounters {
        self.shared.quiesce();
        let c = &self.shared.counters;
        let frames = &self.shared.frames;
        // Resident pages are counted frame by frame while the region runs: a frame counted
        // under its page that then goes to the withheld list or a scratch buffer would be
        // counted twice, so the count is taken again (a few times at most) until no frame
        // moved during it.
        let (mut resident, mut dirty, mut moving, mut withheld, mut scratch);
        let mut tries = 0;
        loop {
            let moves = frames.moves();
            (resident, dirty, moving) = (0, 0, 0);
            for f in 0..frames.len() {
                let page = frames.owner(f);
                if page == crate::pages::NO_PAGE {
                    continue;
                }
                let Ok(page) = usize::try_from(page) else {
                    continue;
                };
                let w = self.shared.pages.load(page);
                if word::frame(w) as usize == f && !matches!(word::state(w), State::Absent) {
                    resident += 1;
                    dirty += u64::from(word::state(w) == State::Dirty);
                    moving += u64::from(word::in_transition(w));
                }
            }
            withheld = frames.withheld_count() as u64;
            scratch = self.shared.parked.load(Ordering::Acquire) as u64;
            tries += 1;
            if frames.moves() == moves || tries == COUNT_TRIES {
                break;
            }
        }
        PagerCounters {
            write_faults: c.write_faults.load(Ordering::Relaxed),
            refaults: c.refaults.load(Ordering::Relaxed),
            direct_reclaims: c.direct_reclaims.load(Ordering::Relaxed),
            read_ahead_pages: c.read_ahead_pages.load(Ordering::Relaxed),
            duplicate_faults: c.duplicate_faults.load(Ordering::Relaxed),
            failed_faults: c.failed_faults.load(Ordering::Relaxed),
            read_back_pages: c.read_back_pages.load(Ordering::Relaxed),
            unchanged_write_backs: c.unchanged_write_backs.load(Ordering::Relaxed),
            resident_pages: resident,
            scratch_frames: scratch,
            dirty_pages: dirty,
            pages_in_transition: moving,
            withheld_frames: withheld,
            evicted_before_fills: c.evicted_before_fills.load(Ordering::Relaxed),
        }
    }

    /// Takes frames out of the budget (or gives them back): `target` frames are to be held out
    /// of use, capped so that the region keeps enough to make progress (its scratch
    /// buffers' share, the read-ahead reserve and window, a frame per filler). Raising it
    /// evicts pages now, by this thread (dirty ones are written back), so their memory is
    /// back when the call returns; frames it could not evict at once (pages being filled or
    /// written back) are taken as they come free, by the evictors and faults. Lowering it
    /// puts frames back at once. Never waits for another thread. For a caller outside the
    /// fault path, such as a watcher of the process's memory group.
    pub fn withhold_frames(&self, target: usize) -> Withheld {
        self.shared.withhold(target)
    }

    /// While `on`, every fill first evicts as many pages as it is about to install (as far
    /// as any can be evicted), so the region's memory charge never grows: for a caller that
    /// sees the process's memory group at its limit, where the kernel could otherwise find
    /// nothing to reclaim for the page being installed and kill the process. Costs an
    /// eviction (a write-back for a dirty page) on each fault's path while set.
    pub fn evict_before_fills(&self, on: bool) {
        self.shared.evict_before_fills.store(on, Ordering::Relaxed);
    }

    /// The withholding target and the frames withheld now (cheap: no wait, no scan).
    pub fn withheld(&self) -> Withheld {
        self.shared.withheld()
    }

    /// Frames in the region's budget (its buffer in pages).
    pub fn frames(&self) -> usize {
        self.shared.frames.len()
    }

    /// Debug: raw page words of the first `n` pages.
    #[doc(hidden)]
    pub fn debug_words(&self, n: usize) -> Vec<u64> {
        (0..n.min(self.shared.pages.len()))
            .map(|p| self.shared.pages.load(p))
            .collect()
    }

    /// Takes the first error recorded by a pager thread (a failed fill or write-back), if any.
    pub fn take_error(&self) -> Option<RegionError> {
        self.shared
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Writes every dirty page back (pages stay resident, write-protected again), then flushes
    /// the store. Returns the first write-back error, else an error a pager thread recorded
    /// since the last call, else the store's flush error.
    pub fn flush(&self) -> Result<(), RegionError> {
        self.shared.flush_dirty()?;
        if let Some(e) = self.take_error() {
            if !matches!(e, RegionError::WriteBack { .. }) {
                return Err(e);
            }
            // An evictor's write-back failed while this flush ran (the store failed, or was
            // repaired only after that write started): its page stayed dirty, perhaps after
            // the flush had passed it. One more pass writes it, or fails with the store's error.
            self.shared.flush_dirty()?;
            if let Some(e) = self.take_error() {
                return Err(e);
            }
        }
        self.shared.store.flush().map_err(RegionError::StoreFlush)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(usize, usize), RegionError> {
        let size = self.shared.size;
        match offset.checked_add(len) {
            Some(end) if end <= size && len > 0 => {
                let pb = self.shared.config.page_bytes;
                let first = usize::try_from(offset / pb).unwrap_or(usize::MAX);
                let last = usize::try_from(end.div_ceil(pb)).unwrap_or(usize::MAX);
                Ok((first, last))
            }
            _ => Err(RegionError::OutOfRange { offset, len, size }),
        }
    }

    /// Brings the pages covering each `(offset, len)` byte range in now (read-only, clean),
    /// so later accesses do not fault. Returns the number of pages read. Ranges larger than
    /// the buffer evict their own earlier pages.
    pub fn prefetch(&self, ranges: &[(u64, u64)]) -> Result<u64, RegionError> {
        let mut spans = Vec::with_capacity(ranges.len());
        for &(offset, len) in ranges {
            spans.push(self.check_range(offset, len)?);
        }
        let mut scratch = Scratch::new(0);
        let mut total = 0;
        let mut result = Ok(());
        for (first, last) in spans {
            match self.shared.prefetch_pages(first, last, &mut scratch) {
                Ok(n) => total += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Its frames go back with its pages.
        scratch.release(0, Some(&self.shared));
        result?;
        self.shared.stats.add_prefetched(total);
        Ok(total)
    }

    /// Drops the pages covering `[offset, offset+len)` from memory, writing dirty ones back
    /// first. Poisoned pages (failed fills) are cleared, so their next access retries the
    /// store. Pages in the middle of a fill or write-back are waited for. Returns the number
    /// of pages dropped.
    pub fn evict(&self, offset: u64, len: u64) -> Result<u64, RegionError> {
        let (first, last) = self.check_range(offset, len)?;
        self.shared.evict_pages(first, last)
    }

    /// Discards `[offset, offset+len)`: its pages are dropped without being written back, and
    /// every later access reads zeros (filled without reading the store) until written.
    /// The store's bytes for the range are unspecified until the pages are written back again
    /// (a zero page filled after a discard is dirty, so its eviction writes the zeros).
    ///
    /// `offset` must be a multiple of the page size, and `offset + len` too unless it is the
    /// end of the region. Safe against concurrent faults, evictions and flushes: a fill,
    /// write-back or flush in progress on a page of the range finishes first, pages outside
    /// the range are untouched. An access racing with the discard of its own page sees either
    /// the old contents (if it completed first) or zeros, never a fault error. The discard
    /// never holds pages while it waits for another thread, so faults in the range keep
    /// finding frames however wide it is. Returns the number of resident pages dropped. If the
    /// kernel refuses to drop pages, the error says so: pages dropped before it read zeros,
    /// the others keep their contents.
    pub fn discard(&self, offset: u64, len: u64) -> Result<u64, RegionError> {
        let pb = self.shared.config.page_bytes;
        let end = offset.checked_add(len);
        let aligned = offset.is_multiple_of(pb)
            && end.is_some_and(|e| e.is_multiple_of(pb) || e == self.shared.size);
        let (first, last) = self.check_range(offset, len)?;
        if !aligned {
            return Err(RegionError::Unaligned {
                offset,
                len,
                page_bytes: pb,
            });
        }
        self.shared.discard_pages(first, last)
    }

    /// Drops every resident page (writing dirty ones back).
    pub fn evict_all(&self) -> Result<u64, RegionError> {
        self.evict(0, self.shared.size)
    }

    /// Flushes, stops the pager threads and unmaps. If the flush fails, the region is handed
    /// back (still mapped, dirty pages intact) inside the error.
    pub fn unmap(mut self) -> Result<(), Box<UnmapError>> {
        if let Err(error) = self.flush() {
            return Err(Box::new(UnmapError {
                region: self,
                error,
            }));
        }
        self.stop_threads();
        self.closed = true;
        Ok(())
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Err(e) = self.shared.stop_fd.signal() {
            eprintln!("strata-pager: cannot signal pager threads to stop: {e}");
        }
        {
            let _guard = self
                .shared
                .frames
                .pressure_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.frames.nudge();
        }
        {
            let _guard = self
                .shared
                .ra_queue
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.ra_ready.notify_all();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                eprintln!("strata-pager: a pager thread panicked");
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.stop_threads();
        // No thread can touch the region now; write back what is dirty.
        let result = self
            .shared
            .flush_dirty()
            .and_then(|()| self.shared.store.flush().map_err(RegionError::StoreFlush));
        if let Err(e) = result {
            eprintln!(
                "strata-pager: dropping a region of {} could not write every dirty page back: {e}; call Region::unmap to handle this error",
                self.shared.store.describe()
            );
        }
    }
}

/// Formats a service-time summary line (used by the CLI).
pub fn service_summary(stats: &StatsSnapshot) -> String {
    let s = &stats.service_time;
    format!(
        "fault service: mean {}, p50 {}, p99 {}",
        format_ns(s.mean_ns()),
        format_ns(s.p50_ns),
        format_ns(s.p99_ns)
    )
}
