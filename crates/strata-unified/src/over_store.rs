//! [`UnifiedOverStore`]: a unified allocation whose data lives in a [`Store`] (a file, a memory
//! node, a compressed store), so it may be larger than host memory as well as GPU memory.
//!
//! **Status: the GPU path of this type has not yet run on a GPU in this version.** Its CPU
//! half (the pager region, the logs and the sync protocol's CPU steps) is tested here without a
//! GPU; the GPU tests (`tests/gpu.rs`, `over_a_store_*`) are written and skip without a CUDA
//! driver. Until they have passed on a GPU, treat kernel results over this type as unverified.
//!
//! The CPU side is a pager region over the store (strata-pager: an ordinary pointer, pages
//! faulted in and evicted by the pager within `cpu_cache_bytes`); the GPU side is a space over
//! the same store (strata-gpu: GPU frames over a pinned host cache of `cpu_cache_bytes`). Each
//! side reaches the store through its own [`LoggingStore`], which records the pages that side
//! wrote: that is how a sync knows what changed, and only those pages' stale copies on the
//! other side are dropped.
//!
//! # Rules (stricter than [`crate::Unified`]'s)
//! * Syncs cover the whole allocation. [`UnifiedOverStore::sync_to_gpu`] writes the CPU's dirty
//!   pages to the store (region flush) and drops the GPU's copies of exactly the pages the CPU
//!   wrote (GPU frames and host-cache slots); [`UnifiedOverStore::sync_to_cpu`] writes the
//!   GPU's dirty pages to the store (space flush) and drops the region's copies of exactly the
//!   pages the GPU wrote (during the kernels or at the flush).
//! * A sync to the GPU while kernels' writes are not yet synced to the CPU, and a sync to the
//!   CPU while the CPU holds writes made during the GPU phase, are refused before anything
//!   moves ([`UnifiedError::PhaseOrder`]): with two caches over one store either order of
//!   write-back could overwrite one side's bytes. The launch helper always syncs both ways.
//! * If both sides wrote in one GPU phase, both syncs refuse; [`UnifiedOverStore::sync_to_cpu_merging`]
//!   is the way out: every page only one side wrote keeps that side's bytes, and a page both
//!   wrote ends up with one side's whole page (which one is not defined, as for concurrent
//!   writes under managed memory) and is listed.
//! * A failed sync (the store refused a write) loses nothing: pages the store did not take
//!   stay dirty on their side, and pages already written stay listed, so repeating the sync
//!   once the store works again finishes it. Kernels must not run after a failed sync to the
//!   GPU (they could read stale copies of pages the CPU wrote).
//! * No hints, replicas or discards in this version; `strata::ReadMostly` (which reads the
//!   host copy directly) does not work over a store and reports every read outside a replica
//!   as out of range: use `strata::Unified<T>`.
//! * The size need not be a multiple of the page size; the store must hold the whole last
//!   page (the GPU side pages whole pages).
//! * Dropping the allocation writes both sides' dirty pages to the store, the CPU's first:
//!   sync to the CPU before dropping after kernels, or a page both sides wrote ends up with
//!   one side's bytes.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use strata_core::store::ReadRequest;
use strata_core::{PagerConfig, Store, StoreError};
use strata_gpu::driver::{Args, Function, Grid};
use strata_gpu::{Space, Strata};
use strata_pager::Region;

use crate::error::UnifiedError;
use crate::options::UnifiedOptions;
use crate::unified::{SyncReport, UnifiedHandle, UnifiedStats, run_kernel, runs};

/// A store that records which pages were written through it, then forwards everything.
#[derive(Debug)]
pub struct LoggingStore {
    inner: Arc<dyn Store>,
    page: u64,
    written: Mutex<BTreeSet<u64>>,
}

impl LoggingStore {
    /// Wraps `inner`, logging writes in pages of `page` bytes (a power of two).
    pub fn new(inner: Arc<dyn Store>, page: u64) -> Self {
        LoggingStore {
            inner,
            page: page.max(1),
            written: Mutex::new(BTreeSet::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn log(&self, offset: u64, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / self.page;
        let last = offset.saturating_add(len as u64).div_ceil(self.page);
        self.lock().extend(first..last);
    }

    /// The pages written since the last call, ascending; the log starts empty again.
    pub fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.lock()).into_iter().collect()
    }

    /// The pages written since the last [`LoggingStore::take`], ascending (the log is kept).
    pub fn peek(&self) -> Vec<u64> {
        self.lock().iter().copied().collect()
    }

    /// Puts pages back into the log (a step after [`LoggingStore::take`] failed, so the next
    /// attempt sees them again).
    pub fn restore(&self, pages: &[u64]) {
        self.lock().extend(pages.iter().copied());
    }
}

impl Store for LoggingStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        // Logged before the write: a write that fails part-way may still have changed bytes.
        self.log(offset, buf.len());
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        self.inner.read_batch(requests)
    }
    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for (offset, buf) in requests {
            self.log(*offset, buf.len());
        }
        self.inner.write_batch(requests)
    }
}

/// The CPU half of an allocation over a store: the pager region and both sides' logs. It
/// knows nothing of GPUs, so its part of the protocol is tested without one (the GPU side's
/// store writes are what the GPU log records, whoever makes them).
#[derive(Debug)]
struct CpuSide {
    region: Region,
    cpu_log: Arc<LoggingStore>,
    gpu_log: Arc<LoggingStore>,
    page: u64,
}

impl CpuSide {
    /// A region of `size` bytes over `cpu_log`'s store with a buffer of `cpu_cache_bytes`.
    fn new(
        cpu_log: Arc<LoggingStore>,
        gpu_log: Arc<LoggingStore>,
        size: u64,
        page: u64,
        cpu_cache_bytes: u64,
    ) -> Result<Self, UnifiedError> {
        let config = PagerConfig::builder()
            .page_bytes(page)
            .buffer_bytes(
                cpu_cache_bytes
                    .min(size.next_multiple_of(page))
                    .max(MIN_CPU_CACHE_PAGES * page),
            )
            .build()
            .map_err(|e| UnifiedError::Invalid(format!("pager configuration: {e}")))?;
        let region = Region::builder(cpu_log.clone(), size)
            .config(config)
            .build()
            .map_err(|source| UnifiedError::Region {
                during: "mapping the CPU side",
                source,
            })?;
        Ok(CpuSide {
            region,
            cpu_log,
            gpu_log,
            page,
        })
    }

    fn size(&self) -> u64 {
        self.region.len() as u64
    }

    /// The start of a GPU phase, CPU half: refused while the GPU's store writes are not synced
    /// to the CPU; otherwise the region's dirty pages go to the store and the pages the CPU
    /// wrote since the last call are returned (taken from the log).
    fn hand_to_gpu(&mut self) -> Result<Vec<u64>, UnifiedError> {
        let theirs = self.gpu_log.peek();
        if !theirs.is_empty() {
            return Err(UnifiedError::PhaseOrder(format!(
                "kernels wrote {} page(s) to the store (first {:?}) that were not synced to the CPU: call sync_to_cpu after kernels, before the CPU writes and the next sync to the GPU (nothing was moved)",
                theirs.len(),
                &theirs[..theirs.len().min(8)]
            )));
        }
        self.flush_region("writing the CPU's pages to the store for a sync to the GPU")?;
        Ok(self.cpu_log.take())
    }

    /// Writes every dirty page of the region to the store. An error a pager thread recorded
    /// earlier (an eviction's write-back that failed: that page stayed dirty) is overtaken
    /// when this flush writes every dirty page, so it is logged, not returned: a sync that
    /// repeats a failed one succeeds once the store works again.
    fn flush_region(&self, during: &'static str) -> Result<(), UnifiedError> {
        let earlier = self.region.take_error();
        if let Some(e) = &earlier {
            tracing::warn!("unified over a store: a pager thread failed before this sync: {e}");
        }
        self.region
            .flush()
            .map_err(|source| UnifiedError::Region { during, source })
    }

    /// Refuses the end of a GPU phase while the CPU holds writes made during it: pages dirty
    /// in the region, or written to the store by the pager's eviction since the last sync to
    /// the GPU.
    fn refuse_cpu_writes(&self) -> Result<(), UnifiedError> {
        // A page an evictor is writing back at this moment is neither dirty nor logged yet:
        // look again until no page is on the move (or at worst for a second, then refuse).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let (dirty, written) = loop {
            let counters = self.region.counters();
            let written = self.cpu_log.peek().len();
            if counters.dirty_pages > 0 || written > 0 {
                break (counters.dirty_pages, written);
            }
            if counters.pages_in_transition == 0 {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                break (counters.pages_in_transition, written);
            }
            std::thread::yield_now();
        };
        Err(UnifiedError::PhaseOrder(format!(
            "the CPU wrote during a GPU phase ({dirty} page(s) dirty, {written} already written to the store since the last sync_to_gpu); nothing was moved. If no kernel wrote since, call sync_to_gpu, then sync_to_cpu; otherwise call sync_to_cpu_merging, which keeps each side's writes to pages only it wrote (a page both wrote ends up with one side's bytes and is listed)"
        )))
    }

    /// The end of a GPU phase, CPU half, once the GPU side wrote all its pages to the store:
    /// the region drops its copies of the pages the GPU wrote (they are read again from the
    /// store on the next touch). Returns those pages.
    fn take_from_gpu(&mut self) -> Result<Vec<u64>, UnifiedError> {
        let written = self.gpu_log.take();
        let size = self.size();
        for (i, r) in runs(&written).iter().enumerate() {
            let start = r.start * self.page;
            let end = (r.end * self.page).min(size);
            if let Err(source) = self.region.evict(start, end - start) {
                // The pages of this run and the later ones still hold stale copies: list them
                // again, so the repeated sync drops them.
                let left: Vec<u64> = runs(&written)[i..].iter().flat_map(Range::clone).collect();
                self.gpu_log.restore(&left);
                return Err(UnifiedError::Region {
                    during: "dropping the CPU's stale copies of pages the GPU wrote",
                    source,
                });
            }
        }
        Ok(written)
    }

    /// [`CpuSide::take_from_gpu`] after writing the CPU's writes of the GPU phase to the store
    /// first (`write_gpu_side` writes the GPU's): the pages both sides wrote are returned as
    /// well. The CPU's pages stay logged for the next sync to the GPU.
    fn merge_from_gpu(
        &mut self,
        write_gpu_side: impl FnOnce() -> Result<(), UnifiedError>,
    ) -> Result<(Vec<u64>, Vec<u64>), UnifiedError> {
        self.flush_region("writing the CPU's pages to the store for a merging sync to the CPU")?;
        write_gpu_side()?;
        let cpu = self.cpu_log.peek();
        let gpu = self.take_from_gpu()?;
        let both = gpu
            .iter()
            .copied()
            .filter(|p| cpu.binary_search(p).is_ok())
            .collect();
        Ok((gpu, both))
    }
}

/// One allocation for CPU and GPU over a store. See the module docs for the rules; its GPU
/// path has not yet run on a GPU in this version.
#[derive(Debug)]
pub struct UnifiedOverStore {
    /// First, so it is dropped (flushed, unmapped) before the space.
    cpu: CpuSide,
    space: Space,
    size: u64,
    page: u64,
    /// The space's device write-back count at the end of the last sync to the CPU: another
    /// count means kernels wrote pages down since.
    writebacks_seen: u64,
    stats: UnifiedStats,
}

impl UnifiedOverStore {
    /// A unified allocation of `size` bytes over `store` (its first `size` bytes, rounded up
    /// to whole pages, which the store must hold): a pager region of `cpu_cache_bytes` for the
    /// CPU, a GPU cache of `options.cache_bytes` over a pinned host cache of `cpu_cache_bytes`
    /// for kernels. Host memory taken: `cpu_cache_bytes` twice (the pager's buffer and the
    /// space's pinned host cache; at least 4 pages), plus the ring's pinned staging (up to
    /// 64 MiB). `options.dirty_tracking` is not used (each side's own writes are logged).
    /// The store's bytes are the allocation's initial contents.
    pub fn new(
        strata: &Strata,
        store: Arc<dyn Store>,
        size: u64,
        options: &UnifiedOptions,
        cpu_cache_bytes: u64,
    ) -> Result<Self, UnifiedError> {
        let mut space_options = options.validate_geometry(size)?;
        let page = space_options.page_size;
        let rounded = size.next_multiple_of(page);
        check_store_and_cache(store.as_ref(), rounded, page, cpu_cache_bytes)?;
        space_options.host_cache_bytes = Some(cpu_cache_bytes.min(rounded));
        let cpu_log = Arc::new(LoggingStore::new(store.clone(), page));
        let gpu_log = Arc::new(LoggingStore::new(store, page));
        let space = strata.space_over_store(gpu_log.clone(), rounded, &space_options)?;
        let cpu = CpuSide::new(cpu_log, gpu_log, size, page, cpu_cache_bytes)?;
        let writebacks_seen = space.stats()?.writebacks;
        Ok(UnifiedOverStore {
            cpu,
            space,
            size,
            page,
            writebacks_seen,
            stats: UnifiedStats::default(),
        })
    }

    /// Bytes the allocation holds.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Always false: an allocation has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The coherence and paging unit in bytes.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// The GPU side (statistics, the GPU, `read_back`).
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The GPU side, writable: its host writes (`Space::fill_from_slice`, `fill_zero`) reach
    /// the store through the GPU's log, so they count as the GPU's writes, as a kernel's
    /// would: make them in a GPU phase (after a sync to the GPU, before the sync to the CPU).
    pub fn space_mut(&mut self) -> &mut Space {
        &mut self.space
    }

    /// The CPU side (statistics, counters).
    pub fn region(&self) -> &Region {
        &self.cpu.region
    }

    /// Totals of the syncs so far.
    pub fn stats(&self) -> UnifiedStats {
        self.stats
    }

    /// The CPU's view (pages fault in from the store as touched).
    pub fn as_slice(&self) -> &[u8] {
        self.cpu.region.as_slice()
    }

    /// The CPU's view, writable (the pager sees which pages are written).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.cpu.region.as_mut_slice()
    }

    /// The CPU address of byte 0; valid as long as the allocation lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.cpu.region.as_ptr()
    }

    /// The handle for kernels written against `strata/unified.cuh` (no replica; use
    /// `strata::Unified<T>`, not `strata::ReadMostly`).
    pub fn handle(&mut self) -> UnifiedHandle<'_> {
        UnifiedHandle {
            space: self.space.handle(),
            cpu_base: self.cpu.region.as_ptr() as u64,
            replica: 0,
            replica_begin: 0,
            replica_end: 0,
        }
    }

    fn pages(&self) -> u64 {
        self.size.div_ceil(self.page)
    }

    /// Makes the CPU's writes visible to kernels: the region's dirty pages go to the store and
    /// the GPU's copies of exactly the pages the CPU wrote are dropped. Refused (nothing moved)
    /// while kernels' writes are not synced to the CPU.
    pub fn sync_to_gpu(&mut self) -> Result<SyncReport, UnifiedError> {
        let now = self.space.stats()?.writebacks;
        let dirty = self.space.gpu_dirty_pages(0..self.pages())?;
        if now != self.writebacks_seen || !dirty.is_empty() {
            return Err(UnifiedError::PhaseOrder(format!(
                "kernels wrote pages ({} still dirty on the GPU{}) that were not synced to the CPU: call sync_to_cpu after kernels, before the CPU writes and the next sync to the GPU (nothing was moved)",
                dirty.len(),
                if now == self.writebacks_seen {
                    ""
                } else {
                    ", others written down during the kernels"
                }
            )));
        }
        let written = self.cpu.hand_to_gpu()?;
        let dropped = match self.space.drop_clean_copies(&written) {
            Ok(d) => d,
            Err(e) => {
                // Those pages' GPU copies may still be stale: the repeated sync drops them.
                self.cpu.cpu_log.restore(&written);
                return Err(e.into());
            }
        };
        let report = SyncReport {
            cpu_written: written.len() as u64,
            gpu_copies_dropped: dropped,
            ..SyncReport::default()
        };
        self.stats.syncs_to_gpu += 1;
        self.stats.total.add(&report);
        Ok(report)
    }

    /// Makes the GPU's writes visible to the CPU: the GPU's dirty pages go to the store and
    /// the region's copies of exactly the pages the GPU wrote are dropped (read again on the
    /// next touch). Refused (nothing moved) while the CPU holds writes made since the last
    /// sync to the GPU.
    pub fn sync_to_cpu(&mut self) -> Result<SyncReport, UnifiedError> {
        self.cpu.refuse_cpu_writes()?;
        self.space.flush()?;
        let written = self.cpu.take_from_gpu()?;
        self.end_gpu_phase(written.len() as u64)
    }

    /// [`UnifiedOverStore::sync_to_cpu`] for a GPU phase in which the CPU wrote too: the CPU's
    /// writes go to the store first, then the GPU's; each page only one side wrote keeps that
    /// side's bytes on both sides, and a page both wrote ends up with one side's whole page
    /// (which one is not defined). Returns the report and the pages both sides wrote.
    pub fn sync_to_cpu_merging(&mut self) -> Result<(SyncReport, Vec<u64>), UnifiedError> {
        let space = &self.space;
        let (written, both) = self.cpu.merge_from_gpu(|| Ok(space.flush()?))?;
        Ok((self.end_gpu_phase(written.len() as u64)?, both))
    }

    fn end_gpu_phase(&mut self, written_down: u64) -> Result<SyncReport, UnifiedError> {
        self.writebacks_seen = self.space.stats()?.writebacks;
        let report = SyncReport {
            written_down,
            ..SyncReport::default()
        };
        self.stats.syncs_to_cpu += 1;
        self.stats.total.add(&report);
        Ok(report)
    }

    /// Runs a kernel with coherent hand-off: sync to the GPU, launch with the arguments `args`
    /// builds from the handle, wait, surface the kernel's access errors, sync to the CPU.
    pub fn launch(
        &mut self,
        function: &Function,
        grid: Grid,
        args: impl FnOnce(UnifiedHandle<'_>) -> Args,
    ) -> Result<SyncReport, UnifiedError> {
        let mut report = self.sync_to_gpu()?;
        run_kernel(function, grid, args(self.handle()), &self.space)?;
        report.add(&self.sync_to_cpu()?);
        Ok(report)
    }
}

/// Pages the CPU cache must hold at least (the pager's least buffer).
const MIN_CPU_CACHE_PAGES: u64 = 4;

/// The store must hold every page of the allocation, and the CPU cache the pager's least.
fn check_store_and_cache(
    store: &dyn Store,
    rounded: u64,
    page: u64,
    cpu_cache_bytes: u64,
) -> Result<(), UnifiedError> {
    if store.size() < rounded {
        return Err(UnifiedError::Invalid(format!(
            "the store ({}) holds {} bytes, fewer than the {rounded} bytes (whole {page}-byte pages) of the allocation: use a larger store or a smaller size",
            store.describe(),
            store.size()
        )));
    }
    if cpu_cache_bytes < MIN_CPU_CACHE_PAGES * page {
        return Err(UnifiedError::Invalid(format!(
            "a CPU cache of {cpu_cache_bytes} bytes holds fewer than {MIN_CPU_CACHE_PAGES} pages of {page} (the pager's least buffer): ask for at least {} bytes",
            MIN_CPU_CACHE_PAGES * page
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
