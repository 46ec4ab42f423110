//! Building a region: [`RegionBuilder`]'s options, then [`Region::start`], which checks
//! them, maps and registers the range, and starts the filler, read-ahead and evictor threads.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use strata_core::{PagerConfig, Stats, Store, Tier};

use super::shared::{Counters, MAX_RUN_BYTES, Shared};
use super::streams::Streams;
use super::write_intent::{Guessed, WriteTracking};
use super::{EvictionPolicy, Region, RegionError};
use crate::pages::{FramePool, PageTable, STAMP_BITS};
use crate::sys::{self, EventFd, FaultPoller, Mapping, Uffd};

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
    predict_writes: bool,
    write_tracking: WriteTracking,
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
    /// Install a page that was written during its last stay in memory writable (and dirty) on
    /// its next read fault, saving the write-protect fault of programs that read, then write
    /// each page (default off). A wrong guess costs one write-back of an unchanged page; a
    /// guessed page is not guessed again on its next fault, so that cost never repeats.
    pub fn predict_writes(mut self, predict: bool) -> Self {
        self.predict_writes = predict;
        self
    }
    /// How the region learns which pages the program wrote (default
    /// [`WriteTracking::Trap`]; see [`WriteTracking`]).
    pub fn write_tracking(mut self, tracking: WriteTracking) -> Self {
        self.write_tracking = tracking;
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

impl Region {
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
            predict_writes: false,
            write_tracking: WriteTracking::Trap,
        }
    }

    pub(super) fn start(b: RegionBuilder, config: PagerConfig) -> Result<Self, RegionError> {
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
        let too_big = || RegionError::OutOfRange {
            offset: 0,
            len: b.size,
            size: usize::MAX as u64,
        };
        let page_bytes = usize::try_from(config.page_bytes).map_err(|_| too_big())?;
        let page_count =
            usize::try_from(b.size.div_ceil(config.page_bytes)).map_err(|_| too_big())?;
        // A size near the top of the address space must not wrap when rounded up to pages.
        let map_len = page_count.checked_mul(page_bytes).ok_or_else(too_big)?;
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
        // As a read-ahead window: one batch fits the scratch limit and a quarter of the buffer.
        let read_back = usize::try_from(config.read_back)
            .unwrap_or(0)
            .min((MAX_RUN_BYTES / page_bytes).saturating_sub(1))
            .min(frames / 4);
        let read_ahead = usize::try_from(config.read_ahead)
            .unwrap_or(0)
            .min(MAX_RUN_BYTES / page_bytes)
            .min(frames / 4);
        // Evictors that wake make room for at least one window, so that a sequential fault
        // can read its window with it even under water marks that keep few frames free
        // (strata run's 99/100); the windows after it are read by read-ahead threads, which
        // evict for their frames themselves.
        let stop_at_free = stop_at_free.max((read_ahead + config.fillers).min(frames / 4));
        // The reserve need not exceed the frames free when the evictors wake (they refill
        // it from there): a larger one would leave read-ahead no frames at all when high
        // water marks keep few frames free.
        let ahead_reserve = config
            .fillers
            .max((frames / 16).min(wake_below_free))
            .min(frames / 2);
        let digests =
            super::unchanged::Digests::new(page_count, config.skip_unchanged && !b.read_only);
        // Without digests (turned off, or no random secret to key them) nothing could tell a
        // written page from a read one: writes are trapped instead.
        let writes_by_digest = b.write_tracking == WriteTracking::Digest && digests.enabled();
        // Every fill is writable by digest already: no write left to predict.
        let predict_writes = b.predict_writes && !b.read_only && !writes_by_digest;
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
            fault_poller_busy: AtomicBool::new(false),
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
            fill_streams: Streams::new(),
            behind: super::behind::Behind::new(),
            write_streams: Streams::new(),
            predict_writes,
            guessed: Guessed::new(page_count, predict_writes),
            writes_by_digest,
            digests,
            read_back,
            evict_log: (read_back > 0).then(|| {
                // Deep enough that a page evicted a few buffers' worth ago still finds its
                // neighbours: past that, they rarely come back together.
                super::read_back::EvictLog::new(page_count, (16 * frames).max(1 << 16))
            }),
            read_back_unused: Guessed::new(page_count, read_back > 0),
            trace: super::trace::Trace::from_env(page_bytes, frames),
            // The longest run: a demand page and its read-ahead window, or a prefetch run.
            zeros: super::shared::Zeros::new(MAX_RUN_BYTES + page_bytes).map_err(|source| {
                RegionError::Kernel {
                    op: "mmap",
                    source,
                    hint: "the process is out of address space or mappings; raise the limits",
                }
            })?,
            parked: AtomicUsize::new(0),
            park_limit: frames / 8,
            evict_before_fills: AtomicBool::new(false),
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
}
