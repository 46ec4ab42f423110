//! Spaces: a byte range larger than GPU memory, backed by pinned host memory and cached in
//! GPU frames, that kernels including `strata.cuh` read and write through a page table.

use std::ops::Range;
use std::sync::Arc;

use strata_core::stats::{HISTOGRAM_BUCKETS, HistogramSnapshot, StatsSnapshot, Tier, TierBytes};
use strata_core::store::{Store, StoreError};

use crate::driver::{
    Args, DeviceBuffer, DriverError, Function, Gpu, Grid, MappedHostBuffer, Module,
};
use crate::layout::{DeviceCounters, FrameEntry, NO_PAGE, SpaceHandle};
use crate::nvrtc::{self, CompileError};

/// Errors of the GPU runtime and its spaces.
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A kernel did not compile.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A bad size or option.
    #[error("invalid space option: {0}")]
    Invalid(String),
    /// The cache does not fit in free GPU memory.
    #[error(
        "page cache of {cache} plus {tables} of tables does not fit in the {free} of free GPU memory: ask for a smaller cache (STRATA_CACHE_SIZE)"
    )]
    CacheTooLarge {
        /// Requested cache.
        cache: String,
        /// Tables.
        tables: String,
        /// Free GPU memory.
        free: String,
    },
    /// A device access fell outside the space.
    #[error(
        "a kernel accessed element {index} of a space of {elements} elements (element size {elem} bytes); the access was dropped: check the kernel's index arithmetic"
    )]
    OutOfRange {
        /// First bad element index seen.
        index: u64,
        /// Elements in the space at that element size (as the kernel saw them).
        elements: u64,
        /// Element size assumed.
        elem: u64,
    },
    /// A kernel named a page index past the end (`acquire`, `acquire_page`, `view_page`).
    #[error(
        "a kernel acquired page {page} of a space of {pages} pages ({page_size}-byte pages); nothing was touched and the call got a scratch page: check the kernel's page arithmetic (pages run 0..{pages})"
    )]
    PageOutOfRange {
        /// First bad page index seen.
        page: u64,
        /// Pages in the space.
        pages: u64,
        /// Page size in bytes.
        page_size: u64,
    },
    /// A warp waited past the space's wait limit for a frame (or a page others were moving)
    /// and gave up.
    #[error(
        "a kernel waited more than {limit_ms} ms for a frame for page {page} of a space of {pages} pages whose cache has {frames} frames, and gave up (that access was dropped: reads got 0, writes were lost). Every frame stayed pinned: a warp may hold the pages of one acquire (at most 32) at a time, and the warps running at once must together hold fewer pins than the cache has frames. Give a larger cache (STRATA_CACHE_SIZE), release pages before acquiring more, or launch fewer warps (or raise the limit with Space::set_wait_limit if the kernel is merely slow)"
    )]
    NoFrame {
        /// First page a warp gave up on.
        page: u64,
        /// Pages in the space.
        pages: u64,
        /// Frames in the cache.
        frames: u32,
        /// The wait limit, ms.
        limit_ms: u64,
    },
    /// A host-side range outside the space.
    #[error("range {start}..{end} is outside the space of {size} bytes")]
    Range {
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// Space size.
        size: u64,
    },
    /// Filling from a store failed.
    #[error("filling the space from {store} failed: {source}")]
    Store {
        /// The store.
        store: String,
        /// Why.
        source: StoreError,
    },
}

/// Element types a space may be declared with (4 or 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ElementType {
    /// `int`.
    I32,
    /// `unsigned`.
    U32,
    /// `long long`.
    I64,
    /// `unsigned long long`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl ElementType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            ElementType::I32 | ElementType::U32 | ElementType::F32 => 4,
            _ => 8,
        }
    }
}

/// Eviction policy of a space's page cache.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum EvictionPolicy {
    /// Clock with reference bits (second chance).
    Clock,
    /// Clock plus a protected segment: a page enters it only when referenced again after the
    /// clock hand passed it (or when it faults again after an earlier stay), and leaves it
    /// after 16 epochs (of as many faults as the cache has frames) without a reference. A loop
    /// larger than the cache keeps the protected part resident instead of thrashing it all.
    /// Probationary pages are evicted only once half the probationary segment's turnover (in
    /// faults) has passed since their last second chance, unless a whole sweep finds none so
    /// old; so leave the probationary part (1 - fraction) a few frames per concurrently
    /// faulting warp, or pages two warps need one after the other are loaded twice.
    ScanResistant {
        /// Fraction of frames the protected segment may hold (0 to 0.95).
        protected_fraction: f64,
    },
}

/// Options of a new space.
#[derive(Debug, Clone)]
pub struct SpaceOptions {
    /// Page size in bytes (power of two, 4 KiB to 2 MiB).
    pub page_size: u64,
    /// GPU memory for the page cache, in bytes (rounded down to whole pages, at least 2).
    pub cache_bytes: u64,
    /// Element type (for the typed host calls).
    pub element: ElementType,
    /// Eviction policy.
    pub policy: EvictionPolicy,
    /// Read-through: a page read (`acquire_page` without write) that misses on a page with no
    /// history is served from the pinned host copy without taking a frame, and only a page
    /// referenced again migrates (`evict` forgets the history of its range). For read-only
    /// data read about once per kernel; kernels must not write pages they read this way.
    pub read_through: bool,
    /// Spaces over a store ([`Strata::space_over_store`]): bytes of pinned host memory for the
    /// host cache between the GPU cache and the store (whole pages, at least 2). `None`: a
    /// quarter of the host's available memory, at most the space's size. Spaces backed by a
    /// full pinned host copy ([`Strata::space`]) ignore it.
    pub host_cache_bytes: Option<u64>,
}

impl Default for SpaceOptions {
    fn default() -> Self {
        SpaceOptions {
            page_size: 64 << 10,
            cache_bytes: 1 << 30,
            element: ElementType::U64,
            policy: EvictionPolicy::Clock,
            read_through: false,
            host_cache_bytes: None,
        }
    }
}

/// One GPU with Strata's kernels loaded: creates spaces and compiles users' kernels.
#[derive(Debug)]
pub struct Strata {
    gpu: Arc<Gpu>,
    _kernels: Module,
    flush: Function,
    evict: Function,
    prefetch: Function,
    layout_probe: Function,
}

/// A user kernel module compiled against `strata.cuh`.
#[derive(Debug)]
pub struct KernelModule {
    module: Module,
    /// Whether the CUBIN came from the disk cache.
    pub cache: nvrtc::CacheOutcome,
}

impl KernelModule {
    /// A kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function, SpaceError> {
        Ok(self.module.function(name)?)
    }
}

impl Strata {
    /// Opens GPU `ordinal` and loads Strata's kernels (compiled through NVRTC, or from the disk
    /// cache).
    pub fn new(ordinal: usize) -> Result<Self, SpaceError> {
        let gpu = Gpu::open(ordinal)?;
        let (cubin, _) = nvrtc::compile_cached(
            nvrtc::STRATA_KERNELS_CU,
            "strata_kernels.cu",
            &gpu.arch(),
            &[],
        )?;
        let kernels = Module::load(&gpu, &cubin)?;
        Ok(Strata {
            flush: kernels.function("strata_flush")?,
            evict: kernels.function("strata_evict")?,
            prefetch: kernels.function("strata_prefetch")?,
            layout_probe: kernels.function("strata_layout_probe")?,
            _kernels: kernels,
            gpu,
        })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Compiles a user kernel source that may `#include "strata.cuh"`, for this GPU, through the
    /// disk cache. A compile error carries NVRTC's log.
    pub fn compile(&self, source: &str, name: &str) -> Result<KernelModule, SpaceError> {
        self.compile_with(source, name, &[])
    }

    /// [`Strata::compile`] with extra NVRTC options (e.g. `-DN=4`, `--use_fast_math`).
    pub fn compile_with(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<KernelModule, SpaceError> {
        let (cubin, cache) = nvrtc::compile_cached(source, name, &self.gpu.arch(), options)?;
        Ok(KernelModule {
            module: Module::load(&self.gpu, &cubin)?,
            cache,
        })
    }

    /// Runs the layout probe kernel and returns what the device compiler laid out, in the order
    /// of [`crate::layout::host_layout`].
    pub fn device_layout(&self) -> Result<Vec<u64>, SpaceError> {
        let n = crate::layout::host_layout().len();
        let buf = DeviceBuffer::zeroed(&self.gpu, n * 8)?;
        self.layout_probe.launch(
            Grid {
                blocks: 1,
                threads: 32,
            },
            &Args::new().arg(buf.ptr()),
        )?;
        self.gpu.synchronize()?;
        let mut out = vec![0u64; n];
        buf.download(0, &mut out)?;
        Ok(out)
    }

    /// Creates a space of `size_bytes`, zero-filled, with an empty cache.
    pub fn space(&self, size_bytes: u64, options: &SpaceOptions) -> Result<Space, SpaceError> {
        Space::new(self, size_bytes, options)
    }

    /// Creates a space of `size_bytes` whose bytes live in `store` (from its offset 0; the
    /// store must hold at least `size_bytes`): memory, file, a memory node, a compressed store.
    /// Pages move store -> host cache (pinned, `options.host_cache_bytes`) -> GPU cache on
    /// demand, through a request ring that host threads serve; dirty pages go back down the
    /// same chain. [`Space::flush`] makes the store current; [`Space::close`] flushes and
    /// hands back what it could not write.
    pub fn space_over_store(
        &self,
        store: Arc<dyn Store>,
        size_bytes: u64,
        options: &SpaceOptions,
    ) -> Result<Space, SpaceError> {
        let _ = (store, size_bytes, options);
        Err(SpaceError::Invalid(
            "spaces over a store are being built in this branch".into(),
        ))
    }

    fn maintenance_grid(&self) -> Grid {
        Grid {
            blocks: self.gpu.multiprocessors * 8,
            threads: 256,
        }
    }
}

/// A space: see the crate docs.
///
/// Host maintenance (`flush`, `evict`, `prefetch`, `read_back`, the fills, statistics and error
/// checks) first waits for every kernel queued on the GPU's context, whatever stream or Strata
/// handle launched it, and runs its own kernels to completion: a kernel queued before the call
/// is never raced. (Kernels that another thread queues while such a call runs are that
/// thread's race to avoid, as with any memory those kernels share.) Dropping a space waits the
/// same way before its memory is freed, and the space keeps Strata's kernels loaded.
#[derive(Debug)]
pub struct Space {
    gpu: Arc<Gpu>,
    flush_fn: Function,
    evict_fn: Function,
    prefetch_fn: Function,
    grid: Grid,
    host: MappedHostBuffer,
    page_table: DeviceBuffer,
    frames: DeviceBuffer,
    /// Owns the frames and the scratch page (kernels reach them through `handle`).
    _frame_data: DeviceBuffer,
    counters: DeviceBuffer,
    handle: SpaceHandle<'static>,
    options: SpaceOptions,
}

impl Drop for Space {
    fn drop(&mut self) {
        // Kernels queued with this space's handle (on any stream) must finish before its
        // buffers are freed; nothing can be done about a failure here but carry on.
        if let Err(e) = self.gpu.synchronize_context() {
            tracing::warn!("dropping a space: waiting for the GPU failed: {e}");
        }
    }
}

fn fmt(bytes: u64) -> String {
    strata_core::units::format_size(bytes)
}

impl Space {
    fn new(strata: &Strata, size_bytes: u64, options: &SpaceOptions) -> Result<Self, SpaceError> {
        let plan = SpacePlan::new(size_bytes, options)?;
        let (page, pages, frames, protected_quota) =
            (plan.page, plan.pages, plan.frames, plan.protected_quota);
        let ps = page.bytes();
        let gpu = strata.gpu.clone();
        let frame_bytes = frames * ps;
        let (free, _) = gpu.mem_info()?;
        plan.check_fits(free)?;
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| SpaceError::Invalid(format!("{v} bytes is too large")))
        };
        let host = MappedHostBuffer::new(&gpu, to_usize(pages * ps)?)?;
        let page_table = DeviceBuffer::zeroed(&gpu, to_usize(pages * 8)?)?;
        let frames_buf = DeviceBuffer::zeroed(&gpu, to_usize(frames * 8)?)?;
        frames_buf.fill_bytes(0xFF)?;
        // One page more than the frames: the scratch page failed device accesses point at.
        let frame_data = DeviceBuffer::zeroed(&gpu, to_usize(frame_bytes + ps)?)?;
        let counters = DeviceBuffer::zeroed(&gpu, std::mem::size_of::<DeviceCounters>())?;
        counters.upload(0, std::slice::from_ref(&DeviceCounters::initial()))?;
        let frame_count = u32::try_from(frames)
            .map_err(|_| SpaceError::Invalid("more than 2^32 frames: use larger pages".into()))?;
        // Frame flags start at zero; the 0xFF fill above made every page field NO_PAGE.
        let zero_flags: Vec<FrameEntry> = vec![
            FrameEntry {
                page: NO_PAGE,
                flags: 0
            };
            to_usize(frames)?
        ];
        frames_buf.upload(0, &zero_flags)?;
        let handle = SpaceHandle {
            page_table: page_table.ptr(),
            frames: frames_buf.ptr(),
            frame_data: frame_data.ptr(),
            host: host.device_ptr(),
            counters: counters.ptr(),
            size_bytes,
            pages,
            frame_count,
            page_shift: page.shift(),
            policy: match options.policy {
                EvictionPolicy::Clock => 0,
                EvictionPolicy::ScanResistant { .. } => 1,
            } | if options.read_through {
                crate::layout::POLICY_READ_THROUGH
            } else {
                0
            },
            protected_quota,
            ring: 0,
            tier: crate::layout::TIER_HOST_COPY,
            reserved: 0,
            space: std::marker::PhantomData,
        };
        let mut space = Space {
            gpu,
            flush_fn: strata.flush.clone(),
            evict_fn: strata.evict.clone(),
            prefetch_fn: strata.prefetch.clone(),
            grid: strata.maintenance_grid(),
            host,
            page_table,
            frames: frames_buf,
            _frame_data: frame_data,
            counters,
            handle,
            options: options.clone(),
        };
        space.host.as_mut_slice().fill(0);
        Ok(space)
    }

    /// The handle to pass to kernels (`StrataSpace` by value). It borrows the space, and
    /// dropping the space waits for kernels launched with it.
    ///
    /// A handle cannot outlive its space:
    ///
    /// ```compile_fail
    /// # fn f(strata: &strata_gpu::Strata) {
    /// let handle = {
    ///     let space = strata.space(1 << 20, &Default::default()).unwrap();
    ///     space.handle() // `space` does not live long enough
    /// };
    /// # let _ = handle;
    /// # }
    /// ```
    pub fn handle(&self) -> SpaceHandle<'_> {
        self.handle
    }

    /// Sets how long a warp waits for a frame or a page before it gives up with
    /// [`SpaceError::NoFrame`] (4 s at first; at least 1 ms). Waits end sooner whenever the
    /// kernel keeps to the rules in `strata.cuh` (what a kernel may hold at once).
    pub fn set_wait_limit(&self, limit: std::time::Duration) -> Result<(), SpaceError> {
        let ns = u64::try_from(limit.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        let mut c = self.counters()?;
        c.wait_limit_ns = ns;
        self.counters.upload(0, std::slice::from_ref(&c))?;
        Ok(())
    }

    /// Bytes addressable.
    pub fn size(&self) -> u64 {
        self.handle.size_bytes
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        1 << self.handle.page_shift
    }

    /// Frames in the cache.
    pub fn frames(&self) -> u32 {
        self.handle.frame_count
    }

    /// The options it was made with.
    pub fn options(&self) -> &SpaceOptions {
        &self.options
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn check_range(&self, r: &Range<u64>) -> Result<(), SpaceError> {
        if r.start > r.end || r.end > self.size() {
            return Err(SpaceError::Range {
                start: r.start,
                end: r.end,
                size: self.size(),
            });
        }
        Ok(())
    }

    /// Runs `f` on the host copy's bytes (after writing back and dropping every cached page,
    /// so the GPU sees exactly what `f` leaves). The slice covers whole pages.
    pub fn with_host_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, SpaceError> {
        self.evict(0..self.size())?;
        let size = usize::try_from(self.size()).unwrap_or(usize::MAX);
        Ok(f(&mut self.host.as_mut_slice()[..size]))
    }

    /// Copies `data` into the space at byte `offset`.
    ///
    /// `T` is plain data ([`bytemuck::Pod`]): no padding, and every byte pattern valid, so
    /// types like `bool` or references are refused at compile time:
    ///
    /// ```compile_fail
    /// # fn f(space: &mut strata_gpu::Space) {
    /// space.fill_from_slice(0, &[true, false]).unwrap(); // bool is not Pod
    /// # }
    /// ```
    pub fn fill_from_slice<T: bytemuck::Pod>(
        &mut self,
        offset: u64,
        data: &[T],
    ) -> Result<(), SpaceError> {
        let bytes = std::mem::size_of_val(data) as u64;
        self.check_range(&(offset..offset.saturating_add(bytes)))?;
        let src: &[u8] = bytemuck::cast_slice(data);
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        self.with_host_mut(|h| h[start..start + src.len()].copy_from_slice(src))
    }

    /// Zero-fills the space.
    pub fn fill_zero(&mut self) -> Result<(), SpaceError> {
        self.with_host_mut(|h| h.fill(0))
    }

    /// Fills the space from the start of `store` (up to the smaller of the two sizes; the rest
    /// reads as zero).
    pub fn fill_from_store(&mut self, store: &dyn Store) -> Result<(), SpaceError> {
        let n = self.size().min(store.size());
        let len = usize::try_from(n).unwrap_or(usize::MAX);
        self.with_host_mut(|h| {
            h.fill(0);
            store.read_at(0, &mut h[..len])
        })?
        .map_err(|source| SpaceError::Store {
            store: store.describe(),
            source,
        })
    }

    /// Writes every dirty cached page back to the host copy (pages stay cached, now clean).
    pub fn flush(&self) -> Result<(), SpaceError> {
        self.gpu.synchronize_context()?;
        self.flush_fn
            .launch(self.grid, &Args::new().arg(self.handle))?;
        self.gpu.synchronize()?;
        self.check_errors()
    }

    /// Copies `out.len()` elements from byte `offset` into `out`, after a flush (which waits
    /// for every kernel queued on the GPU, on any stream).
    ///
    /// `T` is plain data ([`bytemuck::Pod`]): any bytes are a valid `T`, so `bool`, `char` or
    /// references are refused at compile time:
    ///
    /// ```compile_fail
    /// # fn f(space: &strata_gpu::Space) {
    /// let mut out = [false; 8];
    /// space.read_back(0, &mut out).unwrap(); // bool is not Pod
    /// # }
    /// ```
    pub fn read_back<T: bytemuck::Pod>(
        &self,
        offset: u64,
        out: &mut [T],
    ) -> Result<(), SpaceError> {
        let bytes = std::mem::size_of_val(out) as u64;
        self.check_range(&(offset..offset.saturating_add(bytes)))?;
        self.flush()?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let len = usize::try_from(bytes).unwrap_or(usize::MAX);
        let dst: &mut [u8] = bytemuck::cast_slice_mut(out);
        dst.copy_from_slice(&self.host.as_slice()[start..start + len]);
        Ok(())
    }

    fn page_range(&self, r: &Range<u64>) -> Result<(u64, u64), SpaceError> {
        self.check_range(r)?;
        let ps = self.page_size();
        Ok((r.start / ps, r.end.div_ceil(ps)))
    }

    /// Brings the pages of byte range `r` into the cache (as far as it holds them).
    pub fn prefetch(&self, r: Range<u64>) -> Result<(), SpaceError> {
        let (first, last) = self.page_range(&r)?;
        self.gpu.synchronize_context()?;
        self.prefetch_fn.launch(
            self.grid,
            &Args::new().arg(self.handle).arg(first).arg(last),
        )?;
        self.gpu.synchronize()?;
        self.check_errors()
    }

    /// Drops the pages of byte range `r` from the cache, writing dirty ones back first.
    pub fn evict(&self, r: Range<u64>) -> Result<(), SpaceError> {
        let (first, last) = self.page_range(&r)?;
        self.gpu.synchronize_context()?;
        self.evict_fn.launch(
            self.grid,
            &Args::new().arg(self.handle).arg(first).arg(last),
        )?;
        self.gpu.synchronize()?;
        self.check_errors()
    }

    fn counters(&self) -> Result<DeviceCounters, SpaceError> {
        self.gpu.synchronize_context()?;
        let mut c = [DeviceCounters::initial()];
        self.counters.download(0, &mut c)?;
        Ok(c[0])
    }

    /// Returns the error a kernel reported (after waiting for every kernel queued on the
    /// GPU), if any, and clears every reported error: an element or page index out of range
    /// ([`SpaceError::OutOfRange`], [`SpaceError::PageOutOfRange`]) or a wait that gave up
    /// ([`SpaceError::NoFrame`]), in that order when several were reported.
    pub fn check_errors(&self) -> Result<(), SpaceError> {
        use crate::layout::{ERR_NO_FRAME, ERR_OUT_OF_RANGE, ERR_PAGE_OUT_OF_RANGE};
        let c = self.counters()?;
        if c.error_flags == 0 {
            return Ok(());
        }
        let mut fresh = c;
        fresh.error_flags = 0;
        fresh.first_bad_index = u64::MAX;
        fresh.first_bad_page = u64::MAX;
        fresh.no_frame_page = u64::MAX;
        self.counters.upload(0, std::slice::from_ref(&fresh))?;
        let elem = self.options.element.size();
        Err(if c.error_flags & ERR_OUT_OF_RANGE != 0 {
            SpaceError::OutOfRange {
                index: c.first_bad_index,
                elements: self.size() / elem,
                elem,
            }
        } else if c.error_flags & ERR_PAGE_OUT_OF_RANGE != 0 {
            SpaceError::PageOutOfRange {
                page: c.first_bad_page,
                pages: self.handle.pages,
                page_size: self.page_size(),
            }
        } else if c.error_flags & ERR_NO_FRAME != 0 {
            SpaceError::NoFrame {
                page: c.no_frame_page,
                pages: self.handle.pages,
                frames: self.handle.frame_count,
                limit_ms: c.wait_limit_ns / 1_000_000,
            }
        } else {
            SpaceError::Invalid(format!(
                "a kernel reported unknown error flags {:#x}: the header and this crate disagree",
                c.error_flags
            ))
        })
    }

    /// Statistics kept on the device.
    pub fn stats(&self) -> Result<GpuStats, SpaceError> {
        let c = self.counters()?;
        Ok(GpuStats {
            hits: c.hits.iter().sum(),
            faults: c.faults,
            evictions: c.evictions,
            writebacks: c.writebacks,
            prefetched: c.prefetched,
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
            fault_ns_total: c.fault_ns_total,
            fault_ns_max: c.fault_ns_max,
            no_frame_retries: c.no_frame_retries,
            protected_frames: c.protected_now,
            optimistic_retries: c.optimistic_retries,
            read_through: c.read_through,
        })
    }

    /// Zeroes the statistics (not the error flag).
    pub fn reset_stats(&self) -> Result<(), SpaceError> {
        let c = self.counters()?;
        let mut fresh = DeviceCounters::initial();
        fresh.error_flags = c.error_flags;
        fresh.first_bad_index = c.first_bad_index;
        fresh.first_bad_page = c.first_bad_page;
        fresh.no_frame_page = c.no_frame_page;
        fresh.wait_limit_ns = c.wait_limit_ns;
        fresh.clock_hand = c.clock_hand;
        fresh.protected_now = c.protected_now;
        fresh.lifetime_faults = c.lifetime_faults;
        self.counters.upload(0, std::slice::from_ref(&fresh))?;
        Ok(())
    }

    /// Reads the raw page table (for tests and debugging).
    pub fn page_table(&self) -> Result<Vec<u64>, SpaceError> {
        self.gpu.synchronize_context()?;
        let mut out = vec![0u64; usize::try_from(self.handle.pages).unwrap_or(0)];
        self.page_table.download(0, &mut out)?;
        Ok(out)
    }

    /// Reads the raw frame table (for tests and debugging).
    pub fn frame_table(&self) -> Result<Vec<FrameEntry>, SpaceError> {
        self.gpu.synchronize_context()?;
        let n = self.handle.frame_count as usize;
        let mut out = vec![FrameEntry { page: 0, flags: 0 }; n];
        self.frames.download(0, &mut out)?;
        Ok(out)
    }

    /// The host copy's bytes as of the last flush (cached dirty pages are not in it).
    pub fn host_bytes(&self) -> &[u8] {
        self.host.as_slice()
    }

    /// The host copy's address, for copies queued by the caller (baselines); writes through it
    /// bypass the cache, so evict the range first if kernels may have it cached.
    pub fn host_raw_ptr(&self) -> *mut u8 {
        self.host.host_mut_ptr()
    }

    /// Bytes of GPU memory the frames take (not counting the scratch page).
    pub fn cache_bytes(&self) -> u64 {
        u64::from(self.handle.frame_count) << self.handle.page_shift
    }
}

/// A space's device statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuStats {
    /// Accesses that found the page resident, pinned or optimistic (one per group of lanes
    /// on one page, not per element).
    pub hits: u64,
    /// Faults served.
    pub faults: u64,
    /// Evictions.
    pub evictions: u64,
    /// Write-backs.
    pub writebacks: u64,
    /// Pages brought in by prefetch.
    pub prefetched: u64,
    /// Bytes host -> GPU.
    pub bytes_in: u64,
    /// Bytes GPU -> host.
    pub bytes_out: u64,
    /// Sum of fault service times, ns.
    pub fault_ns_total: u64,
    /// Longest fault, ns.
    pub fault_ns_max: u64,
    /// Sweeps that found every frame pinned.
    pub no_frame_retries: u64,
    /// Frames in the protected segment now.
    pub protected_frames: u32,
    /// Optimistic (pin-free) reads whose page moved while they read; each fell back to a
    /// pinned read.
    pub optimistic_retries: u64,
    /// Page reads served from the host copy by read-through (no frame taken).
    pub read_through: u64,
}

impl GpuStats {
    /// Mean fault service time in ns.
    pub fn mean_fault_ns(&self) -> u64 {
        self.fault_ns_total.checked_div(self.faults).unwrap_or(0)
    }

    /// As the workspace's common statistics snapshot (fault times as a one-bucket histogram at
    /// the mean, since the device keeps only sum and max).
    pub fn to_snapshot(&self) -> StatsSnapshot {
        let mut buckets = [0u64; HISTOGRAM_BUCKETS];
        let mean = self.mean_fault_ns();
        let b = (64 - mean.leading_zeros()).saturating_sub(1) as usize;
        buckets[b.min(HISTOGRAM_BUCKETS - 1)] = self.faults;
        StatsSnapshot {
            faults: self.faults,
            hits: self.hits,
            evictions: self.evictions,
            writebacks: self.writebacks,
            prefetched_pages: self.prefetched,
            errors: 0,
            tiers: vec![TierBytes {
                tier: Tier::Host,
                bytes_read: self.bytes_in,
                bytes_written: self.bytes_out,
            }],
            service_time: HistogramSnapshot::from_buckets(
                buckets,
                self.fault_ns_total,
                self.fault_ns_max,
            ),
        }
    }
}

/// The geometry of a space, validated without touching a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpacePlan {
    /// Page size.
    pub page: strata_core::geometry::PageSize,
    /// Pages in the space.
    pub pages: u64,
    /// Frames in the cache (never more than the pages, at least 2).
    pub frames: u64,
    /// Most frames the protected segment may hold.
    pub protected_quota: u32,
}

impl SpacePlan {
    /// Validates `options` for a space of `size_bytes`.
    pub fn new(size_bytes: u64, options: &SpaceOptions) -> Result<Self, SpaceError> {
        let page = strata_core::geometry::PageSize::new(options.page_size)
            .map_err(|e| SpaceError::Invalid(e.to_string()))?;
        let ps = page.bytes();
        if size_bytes == 0 {
            return Err(SpaceError::Invalid(
                "a space needs at least one byte: give a positive size".into(),
            ));
        }
        if !size_bytes.is_multiple_of(options.element.size()) {
            return Err(SpaceError::Invalid(format!(
                "size {size_bytes} is not a whole number of {}-byte elements",
                options.element.size()
            )));
        }
        let pages = size_bytes.div_ceil(ps);
        if pages >= u64::from(NO_PAGE) {
            return Err(SpaceError::Invalid(format!(
                "{pages} pages is more than a space can index (2^32 - 1): use larger pages"
            )));
        }
        let frames = (options.cache_bytes / ps).min(pages.max(2));
        if frames < 2 {
            return Err(SpaceError::Invalid(format!(
                "a cache of {} holds fewer than 2 pages of {}: ask for at least {}",
                fmt(options.cache_bytes),
                fmt(ps),
                fmt(2 * ps)
            )));
        }
        let protected_quota = match options.policy {
            EvictionPolicy::Clock => 0,
            EvictionPolicy::ScanResistant { protected_fraction } => {
                if !(0.0..=0.95).contains(&protected_fraction) {
                    return Err(SpaceError::Invalid(format!(
                        "protected fraction {protected_fraction} is outside 0..=0.95: give a fraction of the cache such as 0.5"
                    )));
                }
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss
                )]
                let q = (frames as f64 * protected_fraction) as u32;
                q
            }
        };
        Ok(SpacePlan {
            page,
            pages,
            frames,
            protected_quota,
        })
    }

    /// Bytes of GPU memory the space takes: frames, and the rest (page table, frame table,
    /// counters, the scratch page failed accesses get).
    pub fn gpu_bytes(&self) -> (u64, u64) {
        let frame_bytes = self.frames * self.page.bytes();
        let table_bytes = self.pages * 8
            + self.frames * 8
            + std::mem::size_of::<DeviceCounters>() as u64
            + self.page.bytes();
        (frame_bytes, table_bytes)
    }

    /// Checks that the space fits in `free` bytes of GPU memory with 256 MiB to spare for
    /// kernels, modules and other users of the GPU.
    pub fn check_fits(&self, free: u64) -> Result<(), SpaceError> {
        let (frame_bytes, table_bytes) = self.gpu_bytes();
        if frame_bytes + table_bytes + (256 << 20) > free {
            return Err(SpaceError::CacheTooLarge {
                cache: fmt(frame_bytes),
                tables: fmt(table_bytes),
                free: fmt(free),
            });
        }
        Ok(())
    }
}

impl SpaceOptions {
    /// Applies `STRATA_PAGE_SIZE` and `STRATA_CACHE_SIZE` from the environment (through the
    /// workspace's validated configuration).
    pub fn with_env(mut self) -> Result<Self, SpaceError> {
        let cfg = strata_core::config::SpaceConfig::builder()
            .page_size(self.page_size)
            .cache_bytes(self.cache_bytes)
            .with_env()
            .and_then(strata_core::config::SpaceConfigBuilder::build)
            .map_err(|e| SpaceError::Invalid(e.to_string()))?;
        self.page_size = cfg.page_size.bytes();
        self.cache_bytes = cfg.cache_bytes;
        if let Some(on) = read_through_from_env()? {
            self.read_through = on;
        }
        Ok(self)
    }
}

/// `STRATA_GPU_READ_THROUGH` (true/false) if set: whether new spaces read first touches
/// through from the host copy ([`SpaceOptions::read_through`]).
///
/// # Errors
/// The variable is set to something other than a boolean, or a `STRATA_*` variable is not
/// UTF-8.
pub fn read_through_from_env() -> Result<Option<bool>, SpaceError> {
    strata_core::config::process_env()
        .and_then(|env| strata_core::config::env_bool(&env, "STRATA_GPU_READ_THROUGH"))
        .map_err(|e| SpaceError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(page: u64, cache: u64, policy: EvictionPolicy) -> SpaceOptions {
        SpaceOptions {
            page_size: page,
            cache_bytes: cache,
            element: ElementType::F64,
            policy,
            read_through: false,
            host_cache_bytes: None,
        }
    }

    #[test]
    fn plan_validates_sizes_and_policies() {
        let p = SpacePlan::new(10 << 20, &o(64 << 10, 1 << 20, EvictionPolicy::Clock)).unwrap();
        assert_eq!((p.pages, p.frames, p.protected_quota), (160, 16, 0));
        // The cache never exceeds the space.
        let p = SpacePlan::new(1 << 20, &o(4096, 1 << 30, EvictionPolicy::Clock)).unwrap();
        assert_eq!(p.frames, 256);
        // A partial last page still counts.
        let p = SpacePlan::new(4096 + 8, &o(4096, 1 << 20, EvictionPolicy::Clock)).unwrap();
        assert_eq!(p.pages, 2);
        let sr = EvictionPolicy::ScanResistant {
            protected_fraction: 0.5,
        };
        assert_eq!(
            SpacePlan::new(1 << 30, &o(1 << 20, 64 << 20, sr))
                .unwrap()
                .protected_quota,
            32
        );
        for (size, opts) in [
            (0, o(4096, 1 << 20, EvictionPolicy::Clock)),
            (12, o(4096, 1 << 20, EvictionPolicy::Clock)),
            (1 << 20, o(3000, 1 << 20, EvictionPolicy::Clock)),
            (1 << 20, o(4096, 4096, EvictionPolicy::Clock)),
            (
                1 << 20,
                o(
                    4096,
                    1 << 20,
                    EvictionPolicy::ScanResistant {
                        protected_fraction: 1.5,
                    },
                ),
            ),
            (1 << 50, o(4096, 1 << 20, EvictionPolicy::Clock)),
        ] {
            let e = SpacePlan::new(size, &opts).unwrap_err();
            assert!(matches!(e, SpaceError::Invalid(_)), "{size} {opts:?}: {e}");
        }
    }

    #[test]
    fn plan_checks_free_gpu_memory() {
        let p = SpacePlan::new(8 << 30, &o(64 << 10, 1 << 30, EvictionPolicy::Clock)).unwrap();
        let (frames, tables) = p.gpu_bytes();
        assert_eq!(frames, 1 << 30);
        assert!(p.check_fits(frames + tables + (256 << 20)).is_ok());
        let e = p.check_fits(frames).unwrap_err();
        assert!(e.to_string().contains("smaller cache"), "{e}");
    }

    #[test]
    fn stats_convert_to_the_common_snapshot() {
        let st = GpuStats {
            hits: 30,
            faults: 10,
            evictions: 4,
            writebacks: 2,
            prefetched: 1,
            bytes_in: 40960,
            bytes_out: 8192,
            fault_ns_total: 10_000,
            fault_ns_max: 3_000,
            no_frame_retries: 0,
            protected_frames: 0,
            optimistic_retries: 0,
            read_through: 0,
        };
        assert_eq!(st.mean_fault_ns(), 1000);
        let snap = st.to_snapshot();
        assert_eq!(snap.faults, 10);
        assert_eq!(snap.hit_rate(), Some(0.75));
        assert_eq!(snap.tiers[0].bytes_read, 40960);
    }
}
