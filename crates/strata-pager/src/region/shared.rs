//! The state a region's threads share ([`Shared`]): the mapping, the store, the page and
//! frame tables, counters, and the few helpers every path uses (addresses, waking, errors).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_core::{PagerConfig, Stats, Store, Tier};

use super::read_back::EvictLog;
use super::streams::Streams;
use super::trace::Trace;
use super::write_intent::Guessed;
use super::{EvictionPolicy, RegionError};
use crate::pages::{FramePool, PageTable};
use crate::sys::{self, EventFd, Mapping, Uffd};

/// Longest run read and installed in one go (prefetch and read-ahead), in bytes.
pub(super) const MAX_RUN_BYTES: usize = 4 << 20;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) write_faults: AtomicU64,
    pub(super) refaults: AtomicU64,
    pub(super) direct_reclaims: AtomicU64,
    pub(super) read_ahead_pages: AtomicU64,
    pub(super) duplicate_faults: AtomicU64,
    pub(super) failed_faults: AtomicU64,
    pub(super) read_back_pages: AtomicU64,
    pub(super) unchanged_write_backs: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(super) struct Shared {
    pub(super) map: Mapping,
    pub(super) uffd: Uffd,
    pub(super) store: Arc<dyn Store>,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) page_bytes: usize,
    pub(super) pages: PageTable,
    pub(super) frames: FramePool,
    pub(super) config: PagerConfig,
    pub(super) policy: EvictionPolicy,
    pub(super) tier: Tier,
    pub(super) stats: Stats,
    pub(super) counters: Counters,
    pub(super) first_error: Mutex<Option<RegionError>>,
    pub(super) stop: AtomicBool,
    pub(super) stop_fd: EventFd,
    /// Fault messages being served now (statistics wait for them: see `Region::stats`).
    pub(super) in_service: AtomicUsize,
    /// Set while one filler polls for the next fault (fault.rs): one poller is enough.
    pub(super) fault_poller_busy: AtomicBool,
    /// Answer failed fills with `UFFDIO_POISON` (else `SIGBUS` to the faulting thread).
    pub(super) use_poison: bool,
    /// Read-ahead windows for the read-ahead threads (not claimed: a demand fault on one of
    /// their pages never waits behind the queue).
    pub(super) ra_queue: Mutex<std::collections::VecDeque<(usize, usize)>>,
    /// Signals `ra_queue`.
    pub(super) ra_ready: std::sync::Condvar,
    /// For batched `MADV_DONTNEED` through `process_madvise` (None where unavailable).
    pub(super) pidfd: Option<sys::SelfPidFd>,
    /// Set once `process_madvise` was refused (older kernels): use `madvise` per range.
    pub(super) no_process_madvise: AtomicBool,
    /// Evictors were woken and have not gone back to sleep (fillers then need not wake them).
    pub(super) evict_pending: AtomicBool,
    pub(super) evictions: AtomicU64,
    /// Evictions per stamp tick, so the stamp's bits span several buffer turnovers.
    pub(super) stamp_unit: u64,
    /// Evictors wake when free frames fall below this (resident above the high mark).
    pub(super) wake_below_free: usize,
    /// Evictors stop once free frames reach this (resident at the low mark).
    pub(super) stop_at_free: usize,
    /// Pages read ahead per window.
    pub(super) read_ahead: usize,
    /// Free frames read-ahead leaves for demand faults.
    pub(super) ahead_reserve: usize,
    /// Ends of recent fills: a missing-page fault at one continues a read stream.
    pub(super) fill_streams: Streams,
    /// Ends of recent runs made writable: a write fault at one continues a write stream.
    pub(super) write_streams: Streams,
    /// Install pages written during their last stay writable on a read fault.
    pub(super) predict_writes: bool,
    /// Digests of the store's copies, to drop unchanged dirty pages without a write.
    pub(super) digests: super::unchanged::Digests,
    /// Pages installed writable on that guess (see `write_intent.rs`).
    pub(super) guessed: Guessed,
    /// Pages read back with a fault from its neighbours in eviction order (0: none).
    pub(super) read_back: usize,
    /// The eviction order read-back draws on (None when read-back is off).
    pub(super) evict_log: Option<EvictLog>,
    /// Pages installed by read-back and not seen used since (a first write shows use).
    pub(super) read_back_unused: Guessed,
    /// The event record `STRATA_PAGER_TRACE` asks for (see `trace.rs`); None by default.
    pub(super) trace: Option<Trace>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("store", &self.store.describe())
            .field("size", &self.size)
            .field("page_bytes", &self.page_bytes)
            .field("frames", &self.frames.len())
            .finish_non_exhaustive()
    }
}

/// Per-thread scratch buffer for store reads, 4 KiB-aligned so that stores opened with
/// `O_DIRECT` read straight into it instead of through a bounce buffer.
pub(super) struct Scratch(pub(super) Vec<u8>);

impl Scratch {
    const ALIGN: usize = 4096;

    pub(super) fn get(&mut self, len: usize) -> &mut [u8] {
        if self.0.len() < len + Self::ALIGN {
            self.0 = vec![0; len + Self::ALIGN];
        }
        let skip = self.0.as_ptr().align_offset(Self::ALIGN);
        &mut self.0[skip..skip + len]
    }
}

impl Shared {
    pub(super) fn page_addr(&self, page: usize) -> usize {
        self.map.ptr() as usize + page * self.page_bytes
    }

    pub(super) fn store_offset(&self, page: usize) -> u64 {
        self.offset + (page * self.page_bytes) as u64
    }

    /// Bytes of `page` inside the region (the last page may be partial).
    pub(super) fn io_len(&self, page: usize) -> usize {
        let start = (page * self.page_bytes) as u64;
        usize::try_from((self.size - start).min(self.page_bytes as u64)).unwrap_or(self.page_bytes)
    }

    pub(super) fn record(&self, error: RegionError) {
        self.stats.add_error();
        let mut slot = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    pub(super) fn wake(&self, page: usize) {
        if let Err(e) = self.uffd.wake(self.page_addr(page), self.page_bytes) {
            eprintln!("strata-pager: UFFDIO_WAKE failed: {e}");
        }
    }

    pub(super) fn finish(&self, page: usize, new: u64) {
        if self.pages.finish(page, new) {
            self.wake(page);
        }
    }

    /// Waits up to 10 ms for the faults in service to finish their bookkeeping.
    pub(super) fn quiesce(&self) {
        let deadline = Instant::now() + Duration::from_millis(10);
        while self.in_service.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }
}
