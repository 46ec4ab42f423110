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
//! survives one more pass. A dirty victim is write-protected first, then written back, then
//! dropped with `MADV_DONTNEED`, so a write racing with the write-back waits instead of being
//! lost. [`EvictionPolicy::Fifo`] (Umap's policy) is kept for comparison.
//!
//! # What a faulting thread gets when the store fails
//! The fill is abandoned, the error is recorded (returned by [`Region::flush`] and
//! [`Region::take_error`]) and the faulting thread receives `SIGBUS`, as with an access beyond
//! the end of a file mapped with `mmap`. On kernels with `UFFDIO_POISON` (Linux 6.6+) the page
//! is poisoned: every access raises `SIGBUS` until [`Region::evict`] clears it, after which the
//! next access retries the store. On older kernels the faulting thread is sent `SIGBUS`
//! directly and the page stays absent. The faulting thread is never left waiting and never sees
//! zeros in place of data it cannot have.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_core::stats::format_ns;
use strata_core::{ConfigError, PagerConfig, Stats, StatsSnapshot, Store, StoreError, Tier};

use crate::pages::{FramePool, HOT, PageTable, REF, STAMP_BITS, State, word};
use crate::sys::{self, EventFd, FaultPoller, Mapping, Uffd, UffdMsg, UffdOpenError};

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

/// Why a region operation failed. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A zero-byte region.
    #[error("a region must hold at least one byte; ask for a positive size")]
    Empty,
    /// The store cannot back the region.
    #[error(
        "store {store} holds {store_size} bytes but the region needs {needed} (offset {offset} + size {size}); use a larger store or a smaller region"
    )]
    StoreTooSmall {
        /// The store.
        store: String,
        /// Its size.
        store_size: u64,
        /// Bytes needed.
        needed: u64,
        /// Region offset in the store.
        offset: u64,
        /// Region size.
        size: u64,
    },
    /// userfaultfd is unavailable.
    #[error(transparent)]
    Userfaultfd(#[from] UffdOpenError),
    /// A kernel call failed.
    #[error("{op} failed: {source}; {hint}")]
    Kernel {
        /// The call.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
        /// What to do.
        hint: &'static str,
    },
    /// A page could not be read from the store.
    #[error("filling page {page} (store offset {offset}) failed: {source}")]
    Fill {
        /// Page index.
        page: usize,
        /// Store offset of the page.
        offset: u64,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A dirty page could not be written back; it stays resident and dirty.
    #[error(
        "writing back page {page} (store offset {offset}) failed: {source}; the page stays resident and dirty, fix the store and flush again"
    )]
    WriteBack {
        /// Page index.
        page: usize,
        /// Store offset.
        offset: u64,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The store's own flush failed.
    #[error("flushing the store failed: {0}")]
    StoreFlush(#[source] StoreError),
    /// No frame could be freed: every resident page is dirty and cannot be written back.
    #[error(
        "the buffer of {frames} pages is full of dirty pages that cannot be written back ({last}); fix the store, or give the region a larger buffer"
    )]
    BufferExhausted {
        /// Frames in the buffer.
        frames: usize,
        /// The last write-back error.
        last: String,
    },
    /// No frame came free for a fault within [`FRAME_WAIT`]: every frame was held by a fill
    /// or write-back the store did not finish. The store is not answering.
    #[error(
        "no frame of the buffer of {frames} pages came free within {waited_s} s: every one was held by a store read or write that did not finish; the store is not answering (check it, or give it a timeout)"
    )]
    BufferBusy {
        /// Frames in the buffer.
        frames: usize,
        /// Seconds waited.
        waited_s: u64,
    },
    /// A range outside the region.
    #[error(
        "range of {len} bytes at offset {offset} reaches past the region's end ({size} bytes); keep ranges inside the region"
    )]
    OutOfRange {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Region size.
        size: u64,
    },
}

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
    /// Pages resident now.
    pub resident_pages: u64,
    /// Pages dirty now.
    pub dirty_pages: u64,
}

#[derive(Debug, Default)]
struct Counters {
    write_faults: AtomicU64,
    refaults: AtomicU64,
    direct_reclaims: AtomicU64,
    read_ahead_pages: AtomicU64,
    duplicate_faults: AtomicU64,
    failed_faults: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Longest run read and installed in one go (prefetch and read-ahead), in bytes.
const MAX_RUN_BYTES: usize = 4 << 20;
/// Pages an evictor claims and drops together.
const EVICT_BATCH: usize = 64;
/// Fault messages read per `read(2)`: a few, so that a burst spreads over the fillers.
const MESSAGES_PER_READ: usize = 4;
/// Longest a fault waits for a frame to come free. Frames are only ever held across one store
/// read or write (no thread holds a frame while it waits for another), so this passes only
/// when the store stops answering; the fault then fails with [`RegionError::BufferBusy`].
pub const FRAME_WAIT: Duration = Duration::from_secs(30);
/// Read-ahead windows waiting for a read-ahead thread, per filler; older ones are dropped.
const QUEUED_WINDOWS_PER_FILLER: usize = 2;

/// Builds a [`Region`] with options beyond [`Region::new`].
#[derive(Debug)]
pub struct RegionBuilder {
    store: Arc<dyn Store>,
    size: u64,
    config: Option<PagerConfig>,
    offset: u64,
    policy: EvictionPolicy,
    tier: Option<Tier>,
    fixed_address: usize,
    read_only: bool,
    without_poison: bool,
}

impl RegionBuilder {
    /// Answer failed fills by sending `SIGBUS` to the faulting thread even where the kernel
    /// has `UFFDIO_POISON` (the behaviour on kernels before 6.6), so tests cover that path.
    #[doc(hidden)]
    pub fn without_poison(mut self) -> Self {
        self.without_poison = true;
        self
    }

    /// Map the region at exactly this address (`MAP_FIXED`), replacing what is there.
    ///
    /// # Safety
    /// The caller must own `[addr, addr + size rounded up to pages)`: anything mapped there is
    /// discarded, as with `mmap(MAP_FIXED)`. `addr` must be aligned to 4 KiB.
    pub unsafe fn fixed_address(mut self, addr: *mut u8) -> Self {
        self.fixed_address = addr as usize;
        self
    }
    /// Make the region read-only to the program (writes raise `SIGSEGV`, as with a
    /// `PROT_READ` mapping). Nothing is ever written back.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
    /// The pager configuration (default: `PagerConfig::builder().with_env()?.build()?`).
    pub fn config(mut self, config: PagerConfig) -> Self {
        self.config = Some(config);
        self
    }
    /// Byte offset of the region's first byte in the store (default 0).
    pub fn store_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }
    /// Eviction policy (default [`EvictionPolicy::Clock`]).
    pub fn policy(mut self, policy: EvictionPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// The tier statistics count the store's bytes against (default: guessed from the
    /// store's description: `file` for files, `remote` for memory nodes, else `host`).
    pub fn tier(mut self, tier: Tier) -> Self {
        self.tier = Some(tier);
        self
    }

    /// Maps the region and starts its threads.
    pub fn build(mut self) -> Result<Region, RegionError> {
        let config = match self.config.take() {
            Some(c) => c,
            None => PagerConfig::builder().with_env()?.build()?,
        };
        Region::start(self, config)
    }
}

struct Shared {
    map: Mapping,
    uffd: Uffd,
    store: Arc<dyn Store>,
    offset: u64,
    size: u64,
    page_bytes: usize,
    pages: PageTable,
    frames: FramePool,
    config: PagerConfig,
    policy: EvictionPolicy,
    tier: Tier,
    stats: Stats,
    counters: Counters,
    first_error: Mutex<Option<RegionError>>,
    stop: AtomicBool,
    stop_fd: EventFd,
    /// Fault messages being served now (statistics wait for them: see `Region::stats`).
    in_service: AtomicUsize,
    /// Answer failed fills with `UFFDIO_POISON` (else `SIGBUS` to the faulting thread).
    use_poison: bool,
    /// Read-ahead windows for the read-ahead threads (not claimed: a demand fault on one of
    /// their pages never waits behind the queue).
    ra_queue: Mutex<std::collections::VecDeque<(usize, usize)>>,
    /// Signals `ra_queue`.
    ra_ready: std::sync::Condvar,
    /// For batched `MADV_DONTNEED` through `process_madvise` (None where unavailable).
    pidfd: Option<sys::SelfPidFd>,
    /// Set once `process_madvise` was refused (older kernels): use `madvise` per range.
    no_process_madvise: AtomicBool,
    /// Evictors were woken and have not gone back to sleep (fillers then need not wake them).
    evict_pending: AtomicBool,
    evictions: AtomicU64,
    /// Evictions per stamp tick, so the stamp's bits span several buffer turnovers.
    stamp_unit: u64,
    /// Evictors wake when free frames fall below this (resident above the high mark).
    wake_below_free: usize,
    /// Evictors stop once free frames reach this (resident at the low mark).
    stop_at_free: usize,
    /// Pages read ahead per window.
    read_ahead: usize,
    /// Free frames read-ahead leaves for demand faults.
    ahead_reserve: usize,
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

/// [`Region::unmap`] failed to write every dirty page back; the region is handed back
/// intact so no data is lost.
#[derive(Debug, thiserror::Error)]
#[error(
    "unmapping the region failed: {error}; the region is still mapped and its dirty pages are kept"
)]
pub struct UnmapError {
    /// The region, still mapped.
    pub region: Region,
    /// Why the flush failed.
    pub error: RegionError,
}

impl Region {
    /// Maps `size` bytes backed by `store` (from its offset 0) with `config`. The store must
    /// hold at least `size` bytes; a last partial page reads and writes only the bytes inside
    /// the region.
    pub fn new(store: Arc<dyn Store>, size: u64, config: PagerConfig) -> Result<Self, RegionError> {
        Self::builder(store, size).config(config).build()
    }

    /// A builder for options beyond [`Region::new`].
    pub fn builder(store: Arc<dyn Store>, size: u64) -> RegionBuilder {
        RegionBuilder {
            store,
            size,
            config: None,
            offset: 0,
            policy: EvictionPolicy::default(),
            tier: None,
            fixed_address: 0,
            read_only: false,
            without_poison: false,
        }
    }

    fn start(b: RegionBuilder, config: PagerConfig) -> Result<Self, RegionError> {
        if b.size == 0 {
            return Err(RegionError::Empty);
        }
        let needed = b.offset.saturating_add(b.size);
        if b.store.size() < needed {
            return Err(RegionError::StoreTooSmall {
                store: b.store.describe(),
                store_size: b.store.size(),
                needed,
                offset: b.offset,
                size: b.size,
            });
        }
        let too_big = |_| RegionError::OutOfRange {
            offset: 0,
            len: b.size,
            size: usize::MAX as u64,
        };
        let page_bytes = usize::try_from(config.page_bytes).map_err(too_big)?;
        let page_count = usize::try_from(b.size.div_ceil(config.page_bytes)).map_err(too_big)?;
        let map_len = page_count * page_bytes;
        let frames = usize::try_from(config.buffer_pages())
            .unwrap_or(usize::MAX)
            .min(page_count)
            .max(1);
        let uffd = Uffd::open()?;
        let use_poison = uffd.can_poison() && !b.without_poison;
        if !b.fixed_address.is_multiple_of(4096) {
            return Err(RegionError::Kernel {
                op: "mmap(MAP_FIXED)",
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
                hint: "a fixed address must be aligned to 4 KiB",
            });
        }
        // SAFETY: a null address lets the kernel choose; a fixed one was vouched for by the
        // caller of the unsafe `RegionBuilder::fixed_address`.
        let map = unsafe { Mapping::anonymous_at(b.fixed_address as *mut u8, map_len) }.map_err(
            |source| RegionError::Kernel {
                op: "mmap",
                source,
                hint: "the address space is exhausted or RLIMIT_AS is too low; map a smaller region",
            },
        )?;
        if b.read_only {
            map.set_read_only(true)
                .map_err(|source| RegionError::Kernel {
                    op: "mprotect",
                    source,
                    hint: "the kernel refused to make the region read-only",
                })?;
        }
        uffd.register(map.ptr() as usize, map_len)
            .map_err(|source| RegionError::Kernel {
                op: "UFFDIO_REGISTER",
                source,
                hint: "the kernel refused to register the range (too many regions?); unmap some regions",
            })?;
        let stop_fd = EventFd::new().map_err(|source| RegionError::Kernel {
            op: "eventfd",
            source,
            hint: "the process is out of file descriptors; raise the limit (ulimit -n)",
        })?;
        let high = frames * usize::from(config.high_water_percent) / 100;
        let low = frames * usize::from(config.low_water_percent) / 100;
        let wake_below_free = (frames - high.min(frames)).max(1);
        let stop_at_free = (frames - low.min(frames)).max(wake_below_free);
        let tier = b.tier.unwrap_or_else(|| {
            let d = b.store.describe();
            if d.starts_with("file") {
                Tier::File
            } else if d.starts_with("remote") {
                Tier::Remote
            } else {
                Tier::Host
            }
        });
        // A window is at most a quarter of the buffer, and read-ahead never takes the last
        // free frames (the reserve): demand faults must always find a frame quickly.
        let read_ahead = usize::try_from(config.read_ahead)
            .unwrap_or(0)
            .min(MAX_RUN_BYTES / page_bytes)
            .min(frames / 4);
        let ahead_reserve = config.fillers.max(frames / 16).min(frames / 2);
        let shared = Arc::new(Shared {
            map,
            uffd,
            store: b.store,
            offset: b.offset,
            size: b.size,
            page_bytes,
            pages: PageTable::new(page_count),
            frames: FramePool::new(frames),
            policy: b.policy,
            tier,
            stats: Stats::default(),
            counters: Counters::default(),
            first_error: Mutex::new(None),
            stop: AtomicBool::new(false),
            stop_fd,
            in_service: AtomicUsize::new(0),
            use_poison,
            ra_queue: Mutex::new(std::collections::VecDeque::new()),
            ra_ready: std::sync::Condvar::new(),
            pidfd: sys::SelfPidFd::open().ok(),
            no_process_madvise: AtomicBool::new(false),
            evict_pending: AtomicBool::new(false),
            evictions: AtomicU64::new(0),
            stamp_unit: ((frames as u64 * 4) >> STAMP_BITS).max(1),
            wake_below_free,
            stop_at_free,
            read_ahead,
            ahead_reserve,
            config,
        });
        let mut region = Region {
            shared,
            threads: Vec::new(),
            closed: false,
        };
        for i in 0..region.shared.config.fillers {
            let poller =
                FaultPoller::new(region.shared.uffd.raw_fd(), region.shared.stop_fd.raw_fd())
                    .map_err(|source| RegionError::Kernel {
                        op: "epoll",
                        source,
                        hint: "the process is out of file descriptors; raise the limit (ulimit -n)",
                    })?;
            let sh = Arc::clone(&region.shared);
            region.spawn(format!("strata-fill-{i}"), move || sh.filler_main(&poller))?;
        }
        if region.shared.read_ahead > 0 {
            for i in 0..region.shared.config.fillers {
                let sh = Arc::clone(&region.shared);
                region.spawn(format!("strata-ahead-{i}"), move || sh.read_ahead_main())?;
            }
        }
        for i in 0..region.shared.config.evictors {
            let sh = Arc::clone(&region.shared);
            region.spawn(format!("strata-evict-{i}"), move || sh.evictor_main())?;
        }
        Ok(region)
    }

    fn spawn(
        &mut self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<(), RegionError> {
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|source| RegionError::Kernel {
                op: "spawning a pager thread",
                source,
                hint: "the process hit its thread limit; use fewer fillers or evictors",
            })?;
        self.threads.push(handle);
        Ok(())
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

    /// Pager-specific counters (waits like [`Region::stats`]).
    pub fn counters(&self) -> PagerCounters {
        self.shared.quiesce();
        let c = &self.shared.counters;
        let (mut resident, mut dirty) = (0, 0);
        for f in 0..self.shared.frames.len() {
            let page = self.shared.frames.owner(f);
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
            }
        }
        PagerCounters {
            write_faults: c.write_faults.load(Ordering::Relaxed),
            refaults: c.refaults.load(Ordering::Relaxed),
            direct_reclaims: c.direct_reclaims.load(Ordering::Relaxed),
            read_ahead_pages: c.read_ahead_pages.load(Ordering::Relaxed),
            duplicate_faults: c.duplicate_faults.load(Ordering::Relaxed),
            failed_faults: c.failed_faults.load(Ordering::Relaxed),
            resident_pages: resident,
            dirty_pages: dirty,
        }
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
            return Err(e);
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
        let mut scratch = Scratch(Vec::new());
        let mut total = 0;
        for (first, last) in spans {
            total += self.shared.prefetch_pages(first, last, &mut scratch)?;
        }
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

/// Per-thread scratch buffer for store reads, 4 KiB-aligned so that stores opened with
/// `O_DIRECT` read straight into it instead of through a bounce buffer.
struct Scratch(Vec<u8>);

impl Scratch {
    const ALIGN: usize = 4096;

    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.0.len() < len + Self::ALIGN {
            self.0 = vec![0; len + Self::ALIGN];
        }
        let skip = self.0.as_ptr().align_offset(Self::ALIGN);
        &mut self.0[skip..skip + len]
    }
}

/// Where a run's frames come from. Only the first frame of a run may wait (for an eviction):
/// a thread never holds frames while it waits for more, so runs cannot deadlock on the buffer.
enum FrameSource {
    /// A demand fault: its own page may wait for an eviction; the pages read with it are
    /// read-ahead and take only free frames above the reserve.
    Demand,
    /// `Region::prefetch`: the first page may wait; later pages take a free frame or evict one
    /// page each without waiting.
    Prefetch,
    /// Read-ahead: free frames above the reserve only, never an eviction, never a wait.
    ReadAhead,
}

enum OnFillError {
    /// Poison the first page of the run (and SIGBUS the faulting thread).
    Poison { tid: u32 },
    /// Leave the pages absent.
    Release,
}

impl Shared {
    fn page_addr(&self, page: usize) -> usize {
        self.map.ptr() as usize + page * self.page_bytes
    }

    fn store_offset(&self, page: usize) -> u64 {
        self.offset + (page * self.page_bytes) as u64
    }

    /// Bytes of `page` inside the region (the last page may be partial).
    fn io_len(&self, page: usize) -> usize {
        let start = (page * self.page_bytes) as u64;
        usize::try_from((self.size - start).min(self.page_bytes as u64)).unwrap_or(self.page_bytes)
    }

    fn record(&self, error: RegionError) {
        self.stats.add_error();
        let mut slot = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    fn wake(&self, page: usize) {
        if let Err(e) = self.uffd.wake(self.page_addr(page), self.page_bytes) {
            eprintln!("strata-pager: UFFDIO_WAKE failed: {e}");
        }
    }

    fn finish(&self, page: usize, new: u64) {
        if self.pages.finish(page, new) {
            self.wake(page);
        }
    }

    // ---- fault handling ---------------------------------------------------------------------

    fn filler_main(&self, poller: &FaultPoller) {
        let mut scratch = Scratch(Vec::new());
        let mut msgs = [UffdMsg::default(); MESSAGES_PER_READ];
        let per_read = if self.config.fillers > 1 {
            MESSAGES_PER_READ
        } else {
            1
        };
        loop {
            match self.uffd.read_messages(&mut msgs[..per_read]) {
                Ok(n) if n > 0 => {
                    for m in &msgs[..n] {
                        self.handle(m, &mut scratch);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("strata-pager: reading fault messages failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = poller.wait() {
                eprintln!("strata-pager: epoll_wait failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// Waits up to 10 ms for the faults in service to finish their bookkeeping.
    fn quiesce(&self) {
        let deadline = Instant::now() + Duration::from_millis(10);
        while self.in_service.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }

    fn handle(&self, msg: &UffdMsg, scratch: &mut Scratch) {
        if msg.event != sys::EVENT_PAGEFAULT {
            return;
        }
        self.in_service.fetch_add(1, Ordering::AcqRel);
        self.serve(msg, scratch);
        self.in_service.fetch_sub(1, Ordering::AcqRel);
    }

    fn serve(&self, msg: &UffdMsg, scratch: &mut Scratch) {
        let base = self.map.ptr() as usize;
        let addr = usize::try_from(msg.address).unwrap_or(usize::MAX);
        let Some(page) = addr.checked_sub(base).map(|d| d / self.page_bytes) else {
            return;
        };
        if page >= self.pages.len() {
            return;
        }
        if msg.flags & sys::PAGEFAULT_FLAG_WP != 0 {
            self.on_write_protect_fault(page);
        } else {
            let write = msg.flags & sys::PAGEFAULT_FLAG_WRITE != 0;
            self.on_missing_fault(page, write, msg.ptid, scratch);
        }
    }

    fn on_write_protect_fault(&self, page: usize) {
        loop {
            let w = self.pages.load(page);
            match word::state(w) {
                s @ (State::Clean | State::Dirty) => {
                    if !self
                        .pages
                        .cas(page, w, word::with_state(w, State::Unprotecting))
                    {
                        continue;
                    }
                    if s == State::Clean {
                        bump(&self.counters.write_faults, 1);
                    }
                    // Unprotecting wakes the writer; the page is already marked in transition,
                    // so no evictor or flush can re-protect it underneath us.
                    if let Err(e) =
                        self.uffd
                            .write_protect(self.page_addr(page), self.page_bytes, false)
                    {
                        eprintln!("strata-pager: removing write protection failed: {e}");
                    }
                    self.finish(page, word::with_state(w | REF, State::Dirty));
                    return;
                }
                State::Absent | State::Poisoned => {
                    // Evicted meanwhile: the retry faults as missing.
                    return self.wake_duplicate(page);
                }
                _ => {
                    if self.wait_for_owner(page) {
                        return;
                    }
                }
            }
        }
    }

    /// A fault that needs no work of ours: wake its thread so it retries.
    fn wake_duplicate(&self, page: usize) {
        bump(&self.counters.duplicate_faults, 1);
        self.wake(page);
    }

    /// A fault on a page another thread is working on: leave a note so that thread wakes
    /// the faulter when done. False if the page left its transition meanwhile.
    fn wait_for_owner(&self, page: usize) -> bool {
        let noted = self.pages.add_waiter(page);
        if noted {
            bump(&self.counters.duplicate_faults, 1);
        }
        noted
    }

    fn on_missing_fault(&self, page: usize, write: bool, tid: u32, scratch: &mut Scratch) {
        let started = Instant::now();
        loop {
            let w = self.pages.load(page);
            match word::state(w) {
                State::Absent | State::Poisoned => {
                    if self.pages.cas(page, w, word::with_state(w, State::Filling)) {
                        break;
                    }
                }
                State::Clean | State::Dirty => {
                    // Another filler installed it; make sure this faulter is awake.
                    return self.wake_duplicate(page);
                }
                _ => {
                    if self.wait_for_owner(page) {
                        return;
                    }
                }
            }
        }
        // A fault right after a resident page continues a sequential run: read this window
        // with the faulting page, and hand the window after it to a read-ahead thread first,
        // so that both reads are in flight together and the next fault finds its pages
        // arriving.
        let sequential = self.read_ahead > 0
            && page > 0
            && !matches!(
                word::state(self.pages.load(page - 1)),
                State::Absent | State::Poisoned
            );
        let mut extra = 0;
        if sequential {
            extra = self.claim_run(page + 1, self.read_ahead);
            if extra == self.read_ahead {
                self.queue_read_ahead(page + 1 + extra, self.read_ahead);
            }
        }
        let together = if write { 1 } else { 1 + extra };
        match self.fill_run(
            page,
            together,
            write,
            &FrameSource::Demand,
            &OnFillError::Poison { tid },
            scratch,
        ) {
            Ok(n) => {
                self.stats.record_fault(started.elapsed());
                let ahead = n.saturating_sub(1) as u64;
                bump(&self.counters.read_ahead_pages, ahead);
                self.stats.add_prefetched(ahead);
            }
            Err(e) => {
                if together > 1 {
                    // fill_run released the window with the failed page.
                } else if extra > 0 {
                    self.release_run(page + 1, extra);
                }
                self.record(e);
                return;
            }
        }
        if write && extra > 0 {
            self.fill_ahead(page + 1, extra, scratch);
        }
    }

    /// Claims up to `max` absent pages from `first` on (moves them to `Filling`), stopping
    /// at the first that is not absent. Returns how many.
    fn claim_run(&self, first: usize, max: usize) -> usize {
        let end = (first + max).min(self.pages.len());
        let mut count = 0;
        for q in first..end {
            let w = self.pages.load(q);
            if word::state(w) != State::Absent
                || !self.pages.cas(q, w, word::with_state(w, State::Filling))
            {
                break;
            }
            count += 1;
        }
        count
    }

    /// Fills claimed read-ahead pages, with free frames above the reserve only. Read-ahead is
    /// a guess: its failure is not the program's (the page's own fault reports a lasting
    /// store error).
    fn fill_ahead(&self, first: usize, count: usize, scratch: &mut Scratch) {
        if let Ok(n) = self.fill_run(
            first,
            count,
            false,
            &FrameSource::ReadAhead,
            &OnFillError::Release,
            scratch,
        ) {
            bump(&self.counters.read_ahead_pages, n as u64);
            self.stats.add_prefetched(n as u64);
        }
    }

    fn queue_read_ahead(&self, first: usize, count: usize) {
        let mut q = self.ra_queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= QUEUED_WINDOWS_PER_FILLER * self.config.fillers.max(1) {
            // The read-ahead threads are behind: the oldest guess is the least useful.
            q.pop_front();
        }
        q.push_back((first, count));
        drop(q);
        self.ra_ready.notify_one();
    }

    fn read_ahead_main(&self) {
        let mut scratch = Scratch(Vec::new());
        loop {
            let job = {
                let mut q = self.ra_queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(job) = q.pop_front() {
                        break job;
                    }
                    q = self
                        .ra_ready
                        .wait_timeout(q, Duration::from_millis(50))
                        .map_or_else(|e| e.into_inner().0, |r| r.0);
                }
            };
            // Claimed only now, so a demand fault that came first has the page to itself.
            let n = self.claim_run(job.0, job.1);
            if n > 0 {
                self.fill_ahead(job.0, n, &mut scratch);
            }
        }
    }

    /// Fills pages `first..first+count`, which the caller has moved to `Filling`. Returns how
    /// many were installed (fewer than `count` when frames ran short; the rest are released).
    /// On a store error every page of the run is released (or the first poisoned).
    fn fill_run(
        &self,
        first: usize,
        count: usize,
        write: bool,
        source: &FrameSource,
        on_error: &OnFillError,
        scratch: &mut Scratch,
    ) -> Result<usize, RegionError> {
        let mut frames = Vec::with_capacity(count);
        for i in 0..count {
            let frame = match (source, i) {
                (FrameSource::Demand | FrameSource::Prefetch, 0) => self.wait_for_frame(),
                (FrameSource::Prefetch, _) => Ok(self.frame_now()),
                (FrameSource::Demand | FrameSource::ReadAhead, _) => Ok(self.frame_for_ahead()),
            };
            match frame {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    // Only a first frame waits, so nothing is held here.
                    self.release_run(first, count);
                    if let OnFillError::Poison { tid } = on_error {
                        // Released pages are claimable again; poisoning the faulting page
                        // (unless another filler took it meanwhile) answers the faulter.
                        self.fail_absent_page(first, *tid);
                    }
                    return Err(e);
                }
            }
        }
        let got = frames.len();
        if got < count {
            self.release_run(first + got, count - got);
        }
        if got == 0 {
            return Ok(0);
        }
        let bytes = got * self.page_bytes;
        let buf = scratch.get(bytes);
        let inside = (0..got).map(|i| self.io_len(first + i)).sum::<usize>();
        if inside < bytes {
            buf[inside..].fill(0);
        }
        if let Err(source) = self
            .store
            .read_at(self.store_offset(first), &mut buf[..inside])
        {
            for f in &frames {
                self.frames.push(*f);
            }
            let error = RegionError::Fill {
                page: first,
                offset: self.store_offset(first),
                source,
            };
            match on_error {
                OnFillError::Poison { tid } => {
                    self.release_run(first + 1, got - 1);
                    self.poison(first, *tid);
                }
                OnFillError::Release => self.release_run(first, got),
            }
            return Err(error);
        }
        self.stats.add_read(self.tier, inside as u64);
        for (i, f) in frames.iter().enumerate() {
            self.frames.assign(*f, first + i);
        }
        if let Err(e) = self.uffd.copy(self.page_addr(first), buf, !write) {
            // EEXIST would mean someone mapped pages behind the pager's back (for example
            // MADV_DONTNEED undone by a write from the kernel); anything else is a bug.
            eprintln!("strata-pager: UFFDIO_COPY of page {first} failed: {e}");
            for f in &frames {
                self.frames.push(*f);
            }
            self.release_run(first, got);
            return Err(RegionError::Kernel {
                op: "UFFDIO_COPY",
                source: e,
                hint: "this is a pager bug or a program that remapped the region; report it",
            });
        }
        let now = self.evictions.load(Ordering::Relaxed) / self.stamp_unit;
        let span = self.frames.len() as u64 / self.stamp_unit;
        for (i, f) in frames.iter().enumerate() {
            let page = first + i;
            let old = self.pages.load(page);
            let mut new = REF;
            if old & crate::pages::GHOST != 0 {
                let distance = now.wrapping_sub(word::stamp(old)) & ((1 << STAMP_BITS) - 1);
                if distance <= span {
                    // Back within one buffer's worth of evictions: a little more memory would
                    // have kept it, so it earns (more) extra passes.
                    new = word::with_heat(new, word::heat(old) + 1);
                    bump(&self.counters.refaults, 1);
                }
            }
            let state = if write { State::Dirty } else { State::Clean };
            self.finish(page, word::with_frame(word::with_state(new, state), *f));
        }
        Ok(got)
    }

    fn release_run(&self, first: usize, count: usize) {
        for page in first..first + count {
            self.finish(page, State::Absent as u64);
        }
    }

    /// Answers a failed fault on `page` (in `Filling`): poison, else SIGBUS to the thread.
    fn poison(&self, page: usize, tid: u32) {
        bump(&self.counters.failed_faults, 1);
        if self.use_poison {
            match self.uffd.poison(self.page_addr(page), self.page_bytes) {
                Ok(()) => {
                    self.finish(page, State::Poisoned as u64);
                    return;
                }
                Err(e) => eprintln!("strata-pager: UFFDIO_POISON failed: {e}; sending SIGBUS"),
            }
        }
        if let Err(e) = sys::sigbus_thread(tid) {
            eprintln!("strata-pager: cannot deliver SIGBUS to thread {tid}: {e}");
        }
        self.finish(page, State::Absent as u64);
        self.wake(page);
    }

    /// As [`Shared::poison`] for a page already released to `Absent`.
    fn fail_absent_page(&self, page: usize, tid: u32) {
        let w = self.pages.load(page);
        if word::state(w) == State::Absent
            && self.pages.cas(page, w, word::with_state(w, State::Filling))
        {
            self.poison(page, tid);
        } else {
            self.wake(page);
        }
    }

    fn prefetch_pages(
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
            let mut count = 0;
            while page + count < last && count < max_run {
                let q = page + count;
                let w = self.pages.load(q);
                if word::state(w) != State::Absent
                    || !self.pages.cas(q, w, word::with_state(w, State::Filling))
                {
                    break;
                }
                count += 1;
            }
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

    // ---- frames and eviction ----------------------------------------------------------------

    /// Wakes the evictors unless they are already awake.
    fn wake_evictors(&self) {
        if !self.evict_pending.swap(true, Ordering::AcqRel) {
            // Under the lock, so an evictor between its check and its wait cannot miss it.
            let _guard = self
                .frames
                .pressure_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.frames.nudge();
        }
    }

    /// Takes a free frame, waking the evictors when free frames run low.
    fn pop_frame(&self) -> Option<u32> {
        let f = self.frames.pop();
        if f.is_none() || self.frames.free_count() < self.wake_below_free {
            self.wake_evictors();
        }
        f
    }

    /// A frame for read-ahead: a free one above the demand reserve, or none.
    fn frame_for_ahead(&self) -> Option<u32> {
        let f = self.frames.pop_above(self.ahead_reserve);
        if f.is_none() || self.frames.free_count() < self.wake_below_free {
            self.wake_evictors();
        }
        f
    }

    /// A frame without waiting: a free one, else one page evicted now (if one can be).
    fn frame_now(&self) -> Option<u32> {
        if let Some(f) = self.pop_frame() {
            return Some(f);
        }
        match self.evict_one() {
            Evicted::Frame(f) => Some(f),
            Evicted::Nothing => None,
            Evicted::WriteFailed(e) => {
                self.record(e);
                None
            }
        }
    }

    /// A frame for a page that must have one: a free frame, else one this thread evicts
    /// (direct reclaim). The caller holds no frame, and every frame is held only across one
    /// store operation, so frames come free unless the store stops answering: after
    /// [`FRAME_WAIT`] the fault fails with `BufferBusy`, or with `BufferExhausted` when every
    /// write-back of a dirty page failed.
    fn wait_for_frame(&self) -> Result<Option<u32>, RegionError> {
        if let Some(f) = self.pop_frame() {
            return Ok(Some(f));
        }
        bump(&self.counters.direct_reclaims, 1);
        let mut failures = 0usize;
        let mut last_error = None;
        let started = Instant::now();
        let mut idle = 0u32;
        loop {
            if let Some(f) = self.frames.pop() {
                return Ok(Some(f));
            }
            match self.evict_one() {
                Evicted::Frame(f) => return Ok(Some(f)),
                Evicted::Nothing => {
                    // Every frame is being filled or written back: those end with their store
                    // operation. Back off so that spinning does not slow them down.
                    idle += 1;
                    if idle < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                Evicted::WriteFailed(e) => {
                    failures += 1;
                    last_error = Some(e.to_string());
                    self.record(e);
                }
            }
            if failures > 2 * self.frames.len() {
                return Err(RegionError::BufferExhausted {
                    frames: self.frames.len(),
                    last: last_error.unwrap_or_default(),
                });
            }
            if started.elapsed() > FRAME_WAIT {
                return Err(match last_error {
                    Some(last) => RegionError::BufferExhausted {
                        frames: self.frames.len(),
                        last,
                    },
                    None => RegionError::BufferBusy {
                        frames: self.frames.len(),
                        waited_s: FRAME_WAIT.as_secs(),
                    },
                });
            }
        }
    }

    /// Sweeps the clock until it claims a victim (moves it to `Evicting`), giving pages with
    /// a reference or hot bit another pass. None if a few turns found nothing evictable.
    fn claim_victim(&self) -> Option<(usize, u64)> {
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

    /// Evicts one page; the caller gets its frame.
    fn evict_one(&self) -> Evicted {
        let Some(victim) = self.claim_victim() else {
            return Evicted::Nothing;
        };
        let (mut frames, error) = self.complete_evictions(vec![victim]);
        match (frames.pop(), error) {
            (Some(f), _) => Evicted::Frame(f),
            (None, Some(e)) => Evicted::WriteFailed(e),
            (None, None) => Evicted::Nothing,
        }
    }

    /// Evicts `page` whose word was `w` (resident). Ok(false): the page changed meanwhile.
    /// Its frame goes back to the free list.
    fn evict_page(&self, page: usize, w: u64) -> Result<bool, RegionError> {
        if !self
            .pages
            .cas(page, w, word::with_state(w, State::Evicting))
        {
            return Ok(false);
        }
        let (frames, error) = self.complete_evictions(vec![(page, w)]);
        for f in &frames {
            self.frames.push(*f);
        }
        match error {
            Some(e) => Err(e),
            None => Ok(!frames.is_empty()),
        }
    }

    /// Finishes evicting pages this thread claimed (each was `w` before it became
    /// `Evicting`): writes dirty ones back, drops them all from memory (one call for the lot
    /// where the kernel allows, so one TLB flush), and marks them absent. Returns the freed
    /// frames and the first write-back error (a page that fails stays resident and dirty).
    fn complete_evictions(
        &self,
        mut claimed: Vec<(usize, u64)>,
    ) -> (Vec<u32>, Option<RegionError>) {
        let mut first_error = None;
        claimed.retain(|&(page, w)| {
            if word::state(w) != State::Dirty {
                return true;
            }
            match self.write_back(page) {
                Ok(()) => true,
                Err(e) => {
                    self.finish(page, word::with_state(w | REF, State::Dirty));
                    first_error.get_or_insert(e);
                    false
                }
            }
        });
        if claimed.is_empty() {
            return (Vec::new(), first_error);
        }
        claimed.sort_unstable_by_key(|&(page, _)| page);
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &(page, _) in &claimed {
            let addr = self.page_addr(page);
            match ranges.last_mut() {
                Some((start, len)) if *start + *len == addr => *len += self.page_bytes,
                _ => ranges.push((addr, self.page_bytes)),
            }
        }
        if let Err(e) = self.drop_ranges(&ranges) {
            // Nothing was lost: dirty pages were written back (and are protected again).
            eprintln!("strata-pager: MADV_DONTNEED failed: {e}");
            for &(page, w) in &claimed {
                self.finish(page, word::with_state(w, State::Clean));
            }
            return (Vec::new(), first_error);
        }
        let mut frames = Vec::with_capacity(claimed.len());
        for &(page, w) in &claimed {
            let stamp = self.evictions.fetch_add(1, Ordering::Relaxed) / self.stamp_unit;
            self.finish(page, word::evicted(stamp, word::heat(w)));
            frames.push(word::frame(w));
        }
        self.stats.add_evictions(claimed.len() as u64);
        (frames, first_error)
    }

    /// Drops the pages of `ranges` (addresses inside the mapping) from memory.
    fn drop_ranges(&self, ranges: &[(usize, usize)]) -> std::io::Result<()> {
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

    /// Write-protects `page` and writes it to the store. The caller owns the page in a
    /// transition state. On success the page is protected and equal to the store's copy.
    fn write_back(&self, page: usize) -> Result<(), RegionError> {
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

    fn evictor_main(&self) {
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
                let mut claimed = Vec::with_capacity(want);
                while claimed.len() < want {
                    match self.claim_victim() {
                        Some(v) => claimed.push(v),
                        None => break,
                    }
                }
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

    fn evict_pages(&self, first: usize, last: usize) -> Result<u64, RegionError> {
        let mut dropped = 0;
        let mut first_error = None;
        for page in first..last {
            let w = self.settled(page);
            match word::state(w) {
                State::Clean | State::Dirty => match self.evict_page(page, w) {
                    Ok(true) => {
                        self.frames.push(word::frame(w));
                        dropped += 1;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.stats.add_error();
                        first_error.get_or_insert(e);
                    }
                },
                State::Poisoned
                    if self
                        .pages
                        .cas(page, w, word::with_state(w, State::Evicting)) =>
                {
                    let cleared = self.map.advise(
                        page * self.page_bytes,
                        self.page_bytes,
                        libc::MADV_DONTNEED,
                    );
                    if let Err(e) = cleared {
                        eprintln!("strata-pager: clearing a poisoned page failed: {e}");
                    }
                    self.finish(page, State::Absent as u64);
                }
                _ => {}
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(dropped),
        }
    }

    /// The page's word once no thread is in the middle of a transition on it.
    fn settled(&self, page: usize) -> u64 {
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

    fn flush_dirty(&self) -> Result<(), RegionError> {
        let mut first_error = None;
        for f in 0..self.frames.len() {
            let page = self.frames.owner(f);
            if page == crate::pages::NO_PAGE {
                continue;
            }
            let page = usize::try_from(page).unwrap_or(usize::MAX);
            // A faulting thread resumes as soon as its page is installed or unprotected, a
            // moment before the filler records the new state; wait for that moment to pass so a
            // page the caller has just written is not skipped.
            let w = self.settled(page);
            if word::frame(w) as usize != f || word::state(w) != State::Dirty {
                continue;
            }
            if !self
                .pages
                .cas(page, w, word::with_state(w, State::Flushing))
            {
                continue;
            }
            match self.write_back(page) {
                Ok(()) => self.finish(page, word::with_state(w, State::Clean)),
                Err(e) => {
                    self.stats.add_error();
                    self.finish(page, word::with_state(w, State::Dirty));
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

enum Evicted {
    Frame(u32),
    Nothing,
    WriteFailed(RegionError),
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
