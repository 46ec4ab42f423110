//! [`Unified`]: one allocation the CPU reads and writes through a pointer and kernels through
//! `strata/unified.cuh`, over one copy of the data.

use std::ops::Range;

use strata_gpu::driver::{Args, DeviceBuffer, Function, Grid, KernelParam};
use strata_gpu::layout::SpaceHandle;
use strata_gpu::{GpuStats, Space, Strata};

use crate::cpu_tracker::{CpuTracker, DirtyTracking, hash_listed, merge_ascending};
use crate::error::UnifiedError;
use crate::options::{Advice, Location, UnifiedOptions};
use crate::page_state::{Action, Event, PageState, Violation, step};
use crate::write_watch::WatchMode;

/// The value kernels take for a unified allocation (`StrataUnified` in `strata/unified.cuh`):
/// the space's handle, the CPU address of byte 0, so that CPU addresses stored in the data
/// translate to offsets on the device (`strata::unified_offset`), and the read-mostly replica
/// (element reads in its byte range are plain loads from it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnifiedHandle<'a> {
    /// The space's handle (`StrataSpace`).
    pub space: SpaceHandle<'a>,
    /// The CPU address of byte 0 of the allocation.
    pub cpu_base: u64,
    /// Device address of the read-mostly replica (0: none); it holds bytes
    /// `replica_begin..replica_end` of the allocation.
    pub replica: u64,
    /// First byte the replica holds.
    pub replica_begin: u64,
    /// One past the last byte the replica holds.
    pub replica_end: u64,
}

const _: () = assert!(std::mem::size_of::<UnifiedHandle<'_>>() == 128);

// SAFETY: #[repr(C)] and Copy: a StrataSpace (itself a KernelParam laid out as the header's
// struct) followed by four u64, exactly `StrataUnified` in unified.cuh; no host references
// (the replica is a device address owned by the allocation the handle borrows).
unsafe impl KernelParam for UnifiedHandle<'_> {
    fn companion_key(&self) -> Option<u64> {
        self.space.companion_key()
    }
}

/// What a sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Pages found written by the CPU (to the GPU) since the last sync.
    pub cpu_written: u64,
    /// Stale GPU copies freed without write-back.
    pub gpu_copies_dropped: u64,
    /// Pages the GPU wrote, written down into the host copy.
    pub written_down: u64,
    /// Bytes hashed to find CPU writes.
    pub hashed_bytes: u64,
}

/// Totals over the allocation's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnifiedStats {
    /// Syncs to the GPU.
    pub syncs_to_gpu: u64,
    /// Syncs to the CPU.
    pub syncs_to_cpu: u64,
    /// Sum of the syncs' reports.
    pub total: SyncReport,
}

impl SyncReport {
    pub(crate) fn add(&mut self, o: &SyncReport) {
        self.cpu_written += o.cpu_written;
        self.gpu_copies_dropped += o.gpu_copies_dropped;
        self.written_down += o.written_down;
        self.hashed_bytes += o.hashed_bytes;
    }
}

/// A run of read-mostly pages kept whole in GPU memory, read by kernels with plain loads
/// (no page-table lookup): equal to the host copy after each sync to the GPU, never written
/// back.
#[derive(Debug)]
struct Replica {
    buffer: DeviceBuffer,
    pages: Range<u64>,
}

/// GPU memory left free beside a replica (other allocations, the driver's own needs).
const REPLICA_HEADROOM: u64 = 512 << 20;

/// One allocation for CPU and GPU. See the crate docs for the rules.
#[derive(Debug)]
pub struct Unified {
    /// First field, so it is dropped first: its write protection ends before the space frees
    /// the host copy it covers.
    tracker: CpuTracker,
    replica: Option<Replica>,
    space: Space,
    size: u64,
    page: u64,
    state: Vec<PageState>,
    read_mostly: Vec<bool>,
    preferred: Vec<Option<Location>>,
    accessed_by: Vec<(Range<u64>, Location)>,
    /// The space's device write-back count when this side last accounted for them: a
    /// different count means pages were written down into the host copy behind our back
    /// (evictions during a kernel), so their hashes must be taken again.
    writebacks_seen: u64,
    /// The space's `pages_dirtied` count at a moment when no page was dirty on the GPU (after
    /// a sync to the CPU of the whole allocation): while the count stays there, a sync to the
    /// CPU needs no look at the page table (one GPU round trip less, for read-only phases).
    clean_at_dirtied: Option<u64>,
    /// [`UnifiedOptions::notified_writes`].
    notified_writes: bool,
    /// The longest run of read-mostly pages, the replica wanted (kept with the advice, so a
    /// sync does not walk the per-page advice).
    replica_wanted: Option<Range<u64>>,
    /// Whether some page is advised to live on the CPU (else a sync to the CPU evicts
    /// nothing and does not walk the per-page advice).
    prefers_cpu: bool,
    stats: UnifiedStats,
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Launches `function` with `args`, waits for the whole context and surfaces the access errors
/// kernels reported on `space`: the GPU phase of a launch helper.
pub(crate) fn run_kernel(
    function: &Function,
    grid: Grid,
    args: Args,
    space: &Space,
) -> Result<GpuStats, UnifiedError> {
    function
        .launch(grid, &args)
        .map_err(strata_gpu::SpaceError::from)?;
    space
        .gpu()
        .synchronize_context()
        .map_err(strata_gpu::SpaceError::from)?;
    // The counters after the kernel, read once for both the error check and the sync that
    // follows (each read is a host round trip: about a fiftieth of a small kernel's round).
    Ok(space.check_errors_and_stats()?)
}

/// Runs of consecutive page indices.
pub(crate) fn runs(pages: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some(r) if r.end == p => r.end += 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}

impl Unified {
    /// Allocates `size` bytes (zero-filled) on `strata`'s GPU: pinned host memory the CPU
    /// uses directly, paged into a GPU cache of `options.cache_bytes` for kernels.
    pub fn new(strata: &Strata, size: u64, options: &UnifiedOptions) -> Result<Self, UnifiedError> {
        let space_options = options.validate(size)?;
        let page = space_options.page_size;
        let rounded = size.next_multiple_of(page);
        let space = strata.space(rounded, &space_options)?;
        let pages = rounded / page;
        let tracker = CpuTracker::new(options.dirty_tracking, to_usize(page), space.host_bytes());
        let first = space.stats()?;
        let writebacks_seen = first.writebacks;
        let n = to_usize(pages);
        Ok(Unified {
            tracker,
            replica: None,
            space,
            size,
            page,
            state: vec![PageState::Shared; n],
            read_mostly: vec![false; n],
            preferred: vec![None; n],
            accessed_by: Vec::new(),
            writebacks_seen,
            // A new space has no dirty page.
            clean_at_dirtied: Some(first.pages_dirtied),
            notified_writes: options.notified_writes,
            replica_wanted: None,
            prefers_cpu: false,
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

    /// The space under the allocation (statistics, the GPU, the cache size).
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Totals of the syncs so far.
    pub fn stats(&self) -> UnifiedStats {
        self.stats
    }

    /// The state of page `p` as of the last sync.
    pub fn page_state(&self, p: u64) -> Option<PageState> {
        self.state.get(to_usize(p)).copied()
    }

    /// The `accessed-by` advice given so far (recorded; see [`Advice::AccessedBy`]).
    pub fn accessed_by(&self) -> &[(Range<u64>, Location)] {
        &self.accessed_by
    }

    /// The CPU's view of the data. Between a kernel and [`Unified::sync_to_cpu`] it may lack
    /// the GPU's writes (the launch helper syncs for you).
    pub fn as_slice(&self) -> &[u8] {
        &self.space.host_bytes()[..to_usize(self.size)]
    }

    /// The CPU's view, writable. With [`DirtyTracking::Declared`] the whole allocation counts
    /// as written at the next sync (use [`Unified::cpu_mut`] to name less).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.tracker.mode() == DirtyTracking::Declared {
            self.tracker.declare(0..self.state.len());
        }
        let size = to_usize(self.size);
        // SAFETY: the host copy is `pages * page` bytes of pinned memory owned by the space,
        // which `self` owns; `&mut self` excludes every other slice of it on the CPU side, and
        // the GPU side writes it only during kernels and syncs, which the rules (and the
        // launch helper) keep apart from CPU phases.
        unsafe { std::slice::from_raw_parts_mut(self.space.host_raw_ptr(), size) }
    }

    /// Bytes `range` of the CPU's view, writable, declared written.
    pub fn cpu_mut(&mut self, range: Range<u64>) -> Result<&mut [u8], UnifiedError> {
        self.mark_cpu_written(range.clone())?;
        let (start, end) = (to_usize(range.start), to_usize(range.end));
        // SAFETY: as in as_mut_slice; `range` was checked to lie within the allocation.
        let all = unsafe {
            std::slice::from_raw_parts_mut(self.space.host_raw_ptr(), to_usize(self.size))
        };
        Ok(&mut all[start..end])
    }

    /// Declares that the CPU wrote `range` (through [`Unified::as_ptr`], say): those pages
    /// count as written at the next sync whatever the tracking mode.
    pub fn mark_cpu_written(&mut self, range: Range<u64>) -> Result<(), UnifiedError> {
        let pages = self.pages_outward(&range)?;
        self.tracker
            .declare(to_usize(pages.start)..to_usize(pages.end));
        Ok(())
    }

    /// The CPU address of byte 0 (for C code and pointers stored in the data); valid as long
    /// as the allocation lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.space.host_raw_ptr()
    }

    /// The handle for kernels written against `strata/unified.cuh`. The GPU phase starts at
    /// the last [`Unified::sync_to_gpu`]; call [`Unified::sync_to_cpu`] after the kernels
    /// before the CPU reads or writes (or use [`Unified::launch`], which does both).
    pub fn handle(&mut self) -> UnifiedHandle<'_> {
        let (replica, replica_begin, replica_end) = match &self.replica {
            Some(r) => (
                r.buffer.ptr(),
                r.pages.start * self.page,
                (r.pages.end * self.page).min(self.size),
            ),
            None => (0, 0, 0),
        };
        UnifiedHandle {
            space: self.space.handle(),
            cpu_base: self.space.host_raw_ptr() as u64,
            replica,
            replica_begin,
            replica_end,
        }
    }

    /// The pages the read-mostly replica holds now (kernels' element reads there are plain
    /// loads from GPU memory), if there is one. Built at a sync to the GPU for the longest run
    /// of read-mostly pages when GPU memory holds it (with headroom), dropped when the advice
    /// changes.
    pub fn replica(&self) -> Option<Range<u64>> {
        self.replica.as_ref().map(|r| r.pages.clone())
    }

    /// How CPU writes are found (`WriteProtect` falls back to `Hash` where the kernel lacks
    /// it), and how many pages are tracked by hash now.
    pub fn dirty_tracking(&self) -> (DirtyTracking, usize) {
        (self.tracker.mode(), self.tracker.hot_pages())
    }

    /// With `WriteProtect` tracking, how the kernel reports CPU writes: `Notified` (a handler
    /// thread records them; chosen while at least half the pages are advised read-mostly,
    /// where the process may open such a userfaultfd) or `Scanned`.
    pub fn watch_mode(&self) -> Option<WatchMode> {
        self.tracker.watch_mode()
    }

    /// The longest run of read-mostly pages (the first of equal ones).
    fn longest_read_mostly_run(&self) -> Option<Range<u64>> {
        let mut best: Option<Range<u64>> = None;
        let mut start = None;
        for (p, &rm) in self
            .read_mostly
            .iter()
            .chain(std::iter::once(&false))
            .enumerate()
        {
            match (rm, start) {
                (true, None) => start = Some(p as u64),
                (false, Some(a)) => {
                    let run = a..p as u64;
                    if best
                        .as_ref()
                        .is_none_or(|b| run.end - run.start > b.end - b.start)
                    {
                        best = Some(run);
                    }
                    start = None;
                }
                _ => {}
            }
        }
        best
    }

    /// Brings the replica in line with the advice after a sync to the GPU: built (whole) when
    /// wanted and missing, otherwise only the pages the CPU wrote are copied up.
    fn refresh_replica(&mut self, cpu_written: &[usize]) -> Result<(), UnifiedError> {
        let Some(want) = self.replica_wanted.clone() else {
            self.replica = None;
            return Ok(());
        };
        let bytes_of = |pages: &Range<u64>, page: u64, size: u64| {
            pages.start * page..(pages.end * page).min(size)
        };
        if let Some(r) = &self.replica
            && r.pages == want
        {
            let inside: Vec<u64> = cpu_written
                .iter()
                .map(|&p| p as u64)
                .filter(|p| want.contains(p))
                .collect();
            let host = self.space.host_bytes();
            for run in runs(&inside) {
                let b = bytes_of(&run, self.page, self.size);
                r.buffer
                    .upload(
                        to_usize(b.start - want.start * self.page),
                        &host[to_usize(b.start)..to_usize(b.end)],
                    )
                    .map_err(strata_gpu::SpaceError::from)?;
            }
            return Ok(());
        }
        self.replica = None;
        let b = bytes_of(&want, self.page, self.size);
        let len = b.end - b.start;
        let (free, _) = self
            .space
            .gpu()
            .mem_info()
            .map_err(strata_gpu::SpaceError::from)?;
        if len + REPLICA_HEADROOM > free {
            tracing::debug!("no read-mostly replica: {len} bytes do not fit beside {free} free");
            return Ok(());
        }
        let Ok(buffer) = DeviceBuffer::zeroed(self.space.gpu(), to_usize(len)) else {
            return Ok(()); // the frames serve the pages instead
        };
        buffer
            .upload(
                0,
                &self.space.host_bytes()[to_usize(b.start)..to_usize(b.end)],
            )
            .map_err(strata_gpu::SpaceError::from)?;
        self.replica = Some(Replica {
            buffer,
            pages: want,
        });
        Ok(())
    }

    /// The parts of byte range `r` the replica does not hold.
    fn outside_replica(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let Some(rep) = &self.replica else {
            return vec![r];
        };
        let (a, b) = (rep.pages.start * self.page, rep.pages.end * self.page);
        [r.start..r.end.min(a), r.start.max(b)..r.end]
            .into_iter()
            .filter(|x| x.start < x.end)
            .collect()
    }

    fn check_range(&self, r: &Range<u64>) -> Result<(), UnifiedError> {
        if r.start > r.end || r.end > self.size {
            return Err(UnifiedError::Range {
                start: r.start,
                end: r.end,
                size: self.size,
            });
        }
        Ok(())
    }

    /// The pages `r` touches.
    fn pages_outward(&self, r: &Range<u64>) -> Result<Range<u64>, UnifiedError> {
        self.check_range(r)?;
        Ok(r.start / self.page..r.end.div_ceil(self.page))
    }

    fn all(&self) -> Range<u64> {
        0..self.size
    }

    /// Accounts for pages the GPU wrote down into the host copy on its own (evictions and
    /// background write-back during kernels): their hashes are taken again, so they do not
    /// look like CPU writes. Returns whether any such write-down happened.
    fn account_gpu_write_downs(&mut self) -> Result<bool, UnifiedError> {
        let now = self.space.stats()?.writebacks;
        let happened = now != self.writebacks_seen;
        if happened {
            self.tracker.rehash_all(self.space.host_bytes());
        }
        self.writebacks_seen = now;
        Ok(happened)
    }

    /// Makes the CPU's writes in `range` visible to kernels: finds the pages the CPU wrote
    /// since the last sync and frees their stale GPU copies without writing them back (only
    /// what changed; other pages keep their GPU copies). A page the GPU also wrote since the
    /// last sync is a [`UnifiedError::Conflict`], with nothing changed.
    ///
    /// Pages advised to the GPU are loaded again at once. Hot pages among them (rewritten in
    /// bulk at earlier syncs, tracked by hash) are taken as written without waiting for
    /// their hashes: they are hashed while the GPU loads them, and the hashes only decide
    /// which of them stay hot. A hot page the CPU did not write is loaded once more than
    /// needed (one page copy over the bus, about as much as hashing it) and then protected
    /// again; pages the GPU holds dirty and read-mostly pages are always hashed first, so a
    /// guess never raises a false conflict.
    pub fn sync_to_gpu(&mut self, range: Range<u64>) -> Result<SyncReport, UnifiedError> {
        let pages = self.pages_outward(&range)?;
        // Always (one small read of the device counters): kernels may have run with a handle
        // taken long before (C code keeps it), and evictions during them changed the host copy.
        self.account_gpu_write_downs()?;
        let mut report = SyncReport::default();
        let synced = to_usize(pages.start)..to_usize(pages.end);
        let found = self
            .tracker
            .written_deferring_hot(self.space.host_bytes(), synced.clone());
        let gpu_dirty = if found.sure.is_empty() && found.hot.is_empty() {
            Vec::new()
        } else {
            self.space.gpu_dirty_pages(pages.clone())?
        };
        // Hot pages taken as written unhashed (`assumed`), and those hashed now.
        let (assumed, check): (Vec<usize>, Vec<usize>) = found.hot.iter().partition(|&&p| {
            !self.read_mostly[p]
                && self.preferred[p] == Some(Location::Gpu)
                && gpu_dirty.binary_search(&(p as u64)).is_err()
        });
        let check_hashes = hash_listed(self.space.host_bytes(), to_usize(self.page), &check);
        let checked = self.tracker.hot_changes(&check, &check_hashes);
        let mut written = merge_ascending(found.sure, checked);
        // What the sync acts on: the pages known written and the assumed ones.
        let acted = merge_ascending(written.clone(), assumed.iter().map(|&p| (p, 0)).collect());
        let mut next = Vec::with_capacity(acted.len());
        let mut conflicts = Vec::new();
        let mut drop = Vec::new();
        for &(p, _) in &acted {
            let p64 = p as u64;
            let rm = self.read_mostly[p];
            let mut s = self.state[p];
            let mut events = Vec::with_capacity(3);
            if gpu_dirty.binary_search(&p64).is_ok() {
                events.push(Event::GpuWrote);
            }
            events.extend([Event::CpuWrote, Event::SyncToGpu]);
            let mut failed = false;
            for e in events {
                match step(s, e, rm) {
                    Ok((n, Action::DropGpuCopy)) => {
                        s = n;
                        drop.push(p64);
                    }
                    Ok((n, _)) => s = n,
                    Err(Violation::BothWrote | Violation::ReadMostlyWritten) => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                conflicts.push(p64);
            }
            next.push(s);
        }
        if !conflicts.is_empty() {
            return Err(UnifiedError::Conflict {
                pages: conflicts,
                page_size: self.page,
            });
        }
        let dropped = self.space.drop_pages(&drop)?;
        report.gpu_copies_dropped = dropped.dropped;
        for (&(p, _), s) in acted.iter().zip(next) {
            self.state[p] = s;
        }
        // Pages the GPU holds dirty from earlier kernels stay the GPU's (none of them was
        // written by the CPU: that was a conflict). Read only when there were CPU writes; the
        // state of the others is settled at the next sync to the CPU.
        for &p in &gpu_dirty {
            self.state[to_usize(p)] = PageState::GpuOwned;
        }
        // The replica holds read-mostly pages only, never assumed: `written` has every one of
        // them the CPU wrote.
        let cpu_written: Vec<usize> = written.iter().map(|&(p, _)| p).collect();
        self.refresh_replica(&cpu_written)?;
        let wanted: Vec<u64> = drop
            .iter()
            .copied()
            .filter(|&p| self.preferred[to_usize(p)] == Some(Location::Gpu))
            .collect();
        // The assumed pages' hashes are taken on other threads while the GPU loads the
        // wanted pages (a kernel reading the host copy: both only read it).
        let (loaded, assumed_hashes) = std::thread::scope(|s| {
            let bytes = self.space.host_bytes();
            let page = to_usize(self.page);
            let assumed = &assumed;
            let hasher =
                (!assumed.is_empty()).then(|| s.spawn(move || hash_listed(bytes, page, assumed)));
            let loaded = self.prefetch_pages(&wanted);
            let hashes = hasher.map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            (loaded, hashes.unwrap_or_default())
        });
        let changed = self.tracker.hot_changes(&assumed, &assumed_hashes);
        written = merge_ascending(written, changed);
        report.hashed_bytes = self.tracker.hashed_bytes();
        report.cpu_written = written.len() as u64;
        self.tracker
            .record(self.space.host_bytes(), synced, &written);
        loaded?;
        self.stats.syncs_to_gpu += 1;
        self.stats.total.add(&report);
        Ok(report)
    }

    /// Loads the listed pages (ascending) into GPU frames: one prefetch over their span, not a
    /// launch per run of them (pages between that are resident already are hits, and the
    /// others are loaded too: the advice asked for the range on the GPU). Pages the replica
    /// holds need no frames.
    fn prefetch_pages(&self, wanted: &[u64]) -> Result<(), UnifiedError> {
        if let (Some(&a), Some(&b)) = (wanted.first(), wanted.last()) {
            let span = a * self.page..((b + 1) * self.page).min(self.space.size());
            for r in self.outside_replica(span) {
                self.space.prefetch(r)?;
            }
        }
        Ok(())
    }

    /// Makes the GPU's writes in `range` visible to the CPU: pages dirty in GPU frames are
    /// written down into the host copy (only those; they stay cached, clean). A dirty page the
    /// CPU also wrote since the last sync is a [`UnifiedError::Conflict`] with nothing changed
    /// (checked whenever no page was written down during the kernels, which is always the case
    /// for data that fits the GPU cache). A dirty page advised read-mostly is dropped, never
    /// written back, and reported as [`UnifiedError::ReadMostlyWritten`] after the rest of the
    /// range was synced.
    pub fn sync_to_cpu(&mut self, range: Range<u64>) -> Result<SyncReport, UnifiedError> {
        self.sync_to_cpu_inner(range, false, None)
    }

    /// [`Unified::sync_to_cpu`] that resolves conflicts in the GPU's favour: pages both sides
    /// wrote get the GPU's bytes (the CPU's writes to them are overwritten).
    pub fn sync_to_cpu_overwriting(
        &mut self,
        range: Range<u64>,
    ) -> Result<SyncReport, UnifiedError> {
        self.sync_to_cpu_inner(range, true, None)
    }

    /// `after_kernels`: the counters as read after the kernels ended with nothing launched
    /// since (the launch helper's), else they are read here.
    fn sync_to_cpu_inner(
        &mut self,
        range: Range<u64>,
        gpu_wins: bool,
        after_kernels: Option<GpuStats>,
    ) -> Result<SyncReport, UnifiedError> {
        let pages = self.pages_outward(&range)?;
        // (stats waits for the kernels: no page can become dirty from here on.)
        let now = match after_kernels {
            Some(stats) => stats,
            None => self.space.stats()?,
        };
        let writebacks_now = now.writebacks;
        let behind_our_back = writebacks_now != self.writebacks_seen;
        let dirty = if self.clean_at_dirtied == Some(now.pages_dirtied) {
            Vec::new()
        } else {
            self.space.gpu_dirty_pages(pages.clone())?
        };
        let mut report = SyncReport::default();
        // Conflicts, where cheap: the host copy changed only by CPU writes (no write-down during
        // the kernels), so a dirty page whose hash moved was written on both sides.
        if !gpu_wins && !behind_our_back && !dirty.is_empty() {
            let idx: Vec<usize> = dirty.iter().map(|&p| to_usize(p)).collect();
            let cpu: Vec<u64> = self
                .tracker
                .written_among(self.space.host_bytes(), &idx)
                .into_iter()
                .map(|p| p as u64)
                .collect();
            report.hashed_bytes = self.tracker.hashed_bytes();
            if !cpu.is_empty() {
                return Err(UnifiedError::Conflict {
                    pages: cpu,
                    page_size: self.page,
                });
            }
        }
        let mut down = Vec::new();
        let mut read_mostly = Vec::new();
        for &p in &dirty {
            let i = to_usize(p);
            let s = if gpu_wins {
                PageState::Shared
            } else {
                self.state[i]
            };
            match step(s, Event::GpuWrote, self.read_mostly[i]) {
                Err(_) if self.read_mostly[i] => read_mostly.push(p),
                Err(_) => unreachable!("conflicts were ruled out above"),
                Ok((s, _)) => {
                    let (s, action) = step(s, Event::SyncToCpu, false).unwrap_or((s, Action::None));
                    debug_assert_eq!(action, Action::WriteDown);
                    self.state[i] = s;
                    down.push(p);
                }
            }
        }
        if !read_mostly.is_empty() {
            self.space.drop_pages(&read_mostly)?;
            report.gpu_copies_dropped = read_mostly.len() as u64;
        }
        let whole = pages.start == 0 && pages.end == self.state.len() as u64;
        if !down.is_empty() {
            if whole {
                self.space.flush()?;
            } else {
                self.space.write_down_pages(&down)?;
            }
        }
        report.written_down = down.len() as u64;
        if behind_our_back {
            self.tracker.rehash_all(self.space.host_bytes());
        } else {
            let idx: Vec<usize> = down.iter().map(|&p| to_usize(p)).collect();
            self.tracker.rehash(self.space.host_bytes(), &idx);
        }
        // The write-downs above count as write-backs on the device; read the count again only
        // when there were some (one host round trip less per sync otherwise).
        self.writebacks_seen = if down.is_empty() {
            writebacks_now
        } else {
            self.space.stats()?.writebacks
        };
        let leave: Vec<u64> = if self.prefers_cpu {
            (pages.start..pages.end)
                .filter(|&p| self.preferred[to_usize(p)] == Some(Location::Cpu))
                .collect()
        } else {
            Vec::new()
        };
        for r in runs(&leave) {
            self.space
                .evict(r.start * self.page..(r.end * self.page).min(self.space.size()))?;
        }
        if whole {
            // Every dirty page was written down (or its GPU copy dropped) above.
            self.clean_at_dirtied = Some(now.pages_dirtied);
        }
        self.stats.syncs_to_cpu += 1;
        self.stats.total.add(&report);
        if !read_mostly.is_empty() {
            return Err(UnifiedError::ReadMostlyWritten {
                pages: read_mostly,
                page_size: self.page,
                reached_host: behind_our_back,
            });
        }
        Ok(report)
    }

    /// Runs a kernel over the allocation with coherent hand-off: syncs the whole allocation to
    /// the GPU, launches `function` with the arguments `args` builds from the handle, waits,
    /// surfaces the kernel's access errors, and syncs everything back to the CPU.
    pub fn launch(
        &mut self,
        function: &Function,
        grid: Grid,
        args: impl FnOnce(UnifiedHandle<'_>) -> Args,
    ) -> Result<SyncReport, UnifiedError> {
        let mut report = self.sync_to_gpu(self.all())?;
        let after = run_kernel(function, grid, args(self.handle()), &self.space)?;
        report.add(&self.sync_to_cpu_inner(self.all(), false, Some(after))?);
        Ok(report)
    }

    /// Gives advice on the pages `range` touches (see [`Advice`]). Marking pages the GPU holds
    /// dirty read-mostly is refused (sync them to the CPU first).
    pub fn advise(&mut self, range: Range<u64>, advice: Advice) -> Result<(), UnifiedError> {
        if range.is_empty() {
            return Err(UnifiedError::Invalid(format!(
                "advice on the empty range {}..{} does nothing: pass a range with start < end",
                range.start, range.end
            )));
        }
        let pages = self.pages_outward(&range)?;
        let (a, b) = (to_usize(pages.start), to_usize(pages.end));
        match advice {
            Advice::ReadMostly(on) => {
                if on {
                    let dirty = self.space.gpu_dirty_pages(pages.clone())?;
                    if !dirty.is_empty() {
                        return Err(UnifiedError::Invalid(format!(
                            "{} page(s) of the range (first {}) hold GPU writes not yet synced: call sync_to_cpu before advising read-mostly",
                            dirty.len(),
                            dirty[0]
                        )));
                    }
                }
                self.read_mostly[a..b].fill(on);
                self.replica_wanted = self.longest_read_mostly_run();
                // Mostly read-mostly data: notified write protection, so that a sync after CPU
                // phases that wrote nothing does not walk the page table of the allocation.
                let rm = self.read_mostly.iter().filter(|&&x| x).count();
                let watch = if self.notified_writes && rm * 2 >= self.read_mostly.len() {
                    WatchMode::Notified
                } else {
                    WatchMode::Scanned
                };
                self.tracker.prefer_watch(self.space.host_bytes(), watch);
                // A replica no longer matching the advice goes at once: a kernel launched
                // before the next sync must not read pages it may now write from it.
                if self
                    .replica
                    .as_ref()
                    .is_some_and(|r| Some(&r.pages) != self.replica_wanted.as_ref())
                {
                    self.replica = None;
                }
            }
            Advice::PreferredLocation(l) => {
                self.preferred[a..b].fill(l);
                self.prefers_cpu = self.preferred.contains(&Some(Location::Cpu));
            }
            Advice::AccessedBy(l) => self.accessed_by.push((range, l)),
        }
        Ok(())
    }

    /// Moves the pages `range` touches toward `to` ahead of use: to the GPU, the range is
    /// synced to the GPU and loaded into the cache (as far as it holds); to the CPU, the
    /// GPU's writes are synced down and the range's GPU frames freed.
    pub fn prefetch(
        &mut self,
        range: Range<u64>,
        to: Location,
    ) -> Result<SyncReport, UnifiedError> {
        let pages = self.pages_outward(&range)?;
        let bytes = pages.start * self.page..(pages.end * self.page).min(self.space.size());
        match to {
            Location::Gpu => {
                let r = self.sync_to_gpu(range)?;
                for part in self.outside_replica(bytes) {
                    self.space.prefetch(part)?;
                }
                Ok(r)
            }
            Location::Cpu => {
                let r = self.sync_to_cpu(range)?;
                self.space.evict(bytes)?;
                Ok(r)
            }
        }
    }

    /// Discards the contents of the whole pages inside `range` (GMEM's eager free; partial
    /// pages at the ends are left alone, so no byte outside the range is touched): their GPU
    /// copies are freed without write-back, so GPU writes not yet synced are gone, and both
    /// sides then see the host copy's bytes as they are. Returns the pages discarded.
    pub fn discard(&mut self, range: Range<u64>) -> Result<u64, UnifiedError> {
        self.check_range(&range)?;
        self.account_gpu_write_downs()?;
        let first = range.start.div_ceil(self.page);
        let last = if range.end == self.size {
            self.state.len() as u64
        } else {
            range.end / self.page
        };
        if first >= last {
            return Ok(0);
        }
        let pages: Vec<u64> = (first..last).collect();
        for &p in &pages {
            let i = to_usize(p);
            self.state[i] = step(self.state[i], Event::Discard, self.read_mostly[i])
                .map_or(PageState::Shared, |(s, _)| s);
        }
        self.space.drop_pages(&pages)?;
        let (a, b) = (to_usize(first), to_usize(last));
        let now = self.tracker.written(self.space.host_bytes(), a..b);
        self.tracker.record(self.space.host_bytes(), a..b, &now);
        Ok(last - first)
    }
}
