//! Spaces: a byte range larger than GPU memory, backed by pinned host memory and cached in
//! GPU frames, that kernels including `strata.cuh` read and write through a page table.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use strata_core::store::Store;

use crate::driver::{Args, DeviceBuffer, Function, Gpu, Grid, MappedHostBuffer};
use crate::layout::{DeviceCounters, FrameEntry, NO_PAGE, SpaceHandle};
pub use crate::runtime::{KernelModule, Strata};
use crate::tier::Backing;
use crate::tier::host_copy::HostCopy;
use crate::tier::peer::PeerTier;
use crate::tier::store::StoreTier;

mod coherence;
mod error;
mod options;
mod stats;
mod write_back;

pub use crate::tier::peer::PeerRevoke;
pub use coherence::DroppedPages;
pub use error::SpaceError;
pub use options::{
    AUTO_MIGRATE_AFTER_PER_4K, BackgroundWriteBack, ElementType, EvictionPolicy,
    MAX_SECTORS_PER_PAGE, MIN_SECTOR_BYTES, PEER_CHUNK_BYTES, PeerBorrow, RemoteAccess,
    SpaceOptions, SpacePlan, default_write_back, parse_remote_access, parse_sector,
    read_through_from_env, remote_access_from_env, sector_from_env, write_back_from_env,
};
pub use stats::{FaultHistogram, GpuStats, PeerStats};

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
    backing: Backing,
    page_table: DeviceBuffer,
    frames: DeviceBuffer,
    /// Owns the frames and the scratch page (kernels reach them through `handle`).
    _frame_data: DeviceBuffer,
    counters: DeviceBuffer,
    /// Pinned memory the counters are read into (each read is a DMA rather than a copy
    /// through a driver buffer): locked for the read, so reads from several threads queue.
    counters_staging: Mutex<MappedHostBuffer>,
    handle: SpaceHandle<'static>,
    options: SpaceOptions,
    /// The background write-back warps, if on.
    write_back: Option<Arc<write_back::WriteBackWarps>>,
    /// Borrowed memory of neighbour GPUs, if any (freed after the kernels end: fields drop
    /// after `Drop::drop` waited for them).
    peer: Option<PeerTier>,
}

impl Drop for Space {
    fn drop(&mut self) {
        if let Some(wb) = &self.write_back {
            wb.retire();
        }
        // Kernels queued with this space's handle (on any stream) must finish before its
        // buffers are freed; nothing can be done about a failure here but carry on.
        if let Err(e) = self.gpu.synchronize_context() {
            tracing::warn!("dropping a space: waiting for the GPU failed: {e}");
        }
        // A space over a store writes its dirty pages down first (`close` does the same and
        // hands back what it could not write; here all that is left is to say so).
        if matches!(&self.backing, Backing::Store(s) if !s.is_closed())
            && let Err(e) = self.close_in_place()
        {
            tracing::warn!("dropping a space over a store: {e}");
        }
    }
}

impl Space {
    pub(crate) fn new(
        strata: &Strata,
        size_bytes: u64,
        options: &SpaceOptions,
    ) -> Result<Self, SpaceError> {
        Space::build(strata, size_bytes, options, |gpu, plan| {
            let bytes = usize::try_from(plan.pages * plan.page.bytes())
                .map_err(|_| SpaceError::Invalid(format!("{size_bytes} bytes is too large")))?;
            Ok(Backing::HostCopy(HostCopy::new(MappedHostBuffer::new(
                gpu, bytes,
            )?)))
        })
    }

    pub(crate) fn over_store(
        strata: &Strata,
        store: Arc<dyn Store>,
        size_bytes: u64,
        options: &SpaceOptions,
    ) -> Result<Self, SpaceError> {
        if options.read_through {
            return Err(SpaceError::Invalid(
                "read-through reads first touches from a full host copy, which a space over a store does not have: leave SpaceOptions::read_through off".into(),
            ));
        }
        if !options.peers.is_empty() {
            return Err(SpaceError::Invalid(
                "a peer tier sits above a full pinned host copy; over a store it is not supported yet: leave SpaceOptions::peers empty or use Strata::space".into(),
            ));
        }
        if options.sector_for(options.page_size).is_some() {
            return Err(SpaceError::Invalid(
                "sub-page fetch loads sectors from a full host copy, which a space over a store does not have (its host cache holds whole pages): leave SpaceOptions::sector_bytes None (or STRATA_GPU_SECTOR=off) or use Strata::space".into(),
            ));
        }
        Space::build(strata, size_bytes, options, |gpu, plan| {
            Ok(Backing::Store(StoreTier::new(
                gpu,
                store,
                size_bytes,
                plan.page.bytes(),
                plan.pages,
                options.host_cache_bytes,
            )?))
        })
    }

    fn build(
        strata: &Strata,
        size_bytes: u64,
        options: &SpaceOptions,
        make_backing: impl FnOnce(&Arc<Gpu>, &SpacePlan) -> Result<Backing, SpaceError>,
    ) -> Result<Self, SpaceError> {
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
        let backing = make_backing(&gpu, &plan)?;
        let page_table = DeviceBuffer::zeroed(&gpu, to_usize(pages * 8)?)?;
        // The frame table, then (sub-page fetch) one sector word per frame.
        let sector = options.sector_for(ps);
        let sector_words = if sector.is_some() { frames } else { 0 };
        let frames_buf = DeviceBuffer::zeroed(&gpu, to_usize((frames + sector_words) * 8)?)?;
        // One page more than the frames: the scratch page failed device accesses point at.
        let frame_data = DeviceBuffer::zeroed(&gpu, to_usize(frame_bytes + ps)?)?;
        let counters = DeviceBuffer::zeroed(&gpu, std::mem::size_of::<DeviceCounters>())?;
        let mut initial = DeviceCounters::initial();
        initial.free_frames = frames;
        counters.upload(0, std::slice::from_ref(&initial))?;
        let counters_staging = Mutex::new(MappedHostBuffer::new(
            &gpu,
            std::mem::size_of::<DeviceCounters>(),
        )?);
        // Frame numbers have 31 bits in a page word (the 32nd marks part pages).
        let frame_count = u32::try_from(frames)
            .ok()
            .filter(|&f| u64::from(f) <= crate::layout::FRAME_MASK)
            .ok_or_else(|| SpaceError::Invalid("more than 2^31 frames: use larger pages".into()))?;
        // Every frame starts free (NO_PAGE) with zero flags.
        let free_frames: Vec<FrameEntry> = vec![
            FrameEntry {
                page: NO_PAGE,
                flags: 0
            };
            to_usize(frames)?
        ];
        frames_buf.upload(0, &free_frames)?;
        let peer = if options.peers.is_empty() {
            None
        } else {
            Some(PeerTier::new(&gpu, &options.peers, ps, pages)?)
        };
        let (host, ring, tier) = match &backing {
            Backing::HostCopy(h) => (h.buffer.device_ptr(), 0, crate::layout::TIER_HOST_COPY),
            Backing::Store(s) => (0, s.descriptor.ptr(), crate::layout::TIER_RING),
        };
        let handle = SpaceHandle {
            page_table: page_table.ptr(),
            frames: frames_buf.ptr(),
            frame_data: frame_data.ptr(),
            host,
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
            } | sector.map_or(0, |b| {
                b.trailing_zeros() << crate::layout::POLICY_SECTOR_SHIFT
            }),
            protected_quota,
            ring,
            tier,
            migrate_after: options
                .remote_access
                .resolve(ps, matches!(backing, Backing::HostCopy(_)))?,
            peer: peer.as_ref().map_or(0, |p| p.descriptor.ptr()),
            space: std::marker::PhantomData,
        };
        let write_back = match &options.background_write_back {
            Some(wb) => Some(write_back::WriteBackWarps::start(
                &gpu,
                &strata.write_back,
                &strata.write_back_stop,
                handle,
                wb,
            )?),
            None => None,
        };
        Ok(Space {
            write_back,
            peer,
            gpu,
            flush_fn: strata.flush.clone(),
            evict_fn: strata.evict.clone(),
            prefetch_fn: strata.prefetch.clone(),
            grid: strata.maintenance_grid(),
            backing,
            page_table,
            frames: frames_buf,
            _frame_data: frame_data,
            counters,
            counters_staging,
            handle,
            options: options.clone(),
        })
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

    /// Makes room for up to `max_chunks` 2 MiB chunks of neighbour GPUs' memory lent by other
    /// processes (the lending broker, crate `strata-broker`) as this space's peer tier. Chunks
    /// come and go while kernels run: [`Space::attach_peer_chunk`],
    /// [`Space::revoke_peer_chunks`]. Waits for the space's kernels first; launch kernels with
    /// [`Space::handle`] taken after this call.
    ///
    /// # Errors
    /// A space over a store or one that already has a peer tier, or no address space left.
    pub fn enable_peer_leases(&mut self, max_chunks: usize) -> Result<(), SpaceError> {
        if !matches!(self.backing, Backing::HostCopy(_)) || self.peer.is_some() {
            return Err(SpaceError::Invalid(
                "leased peer chunks need a space backed by its pinned host copy (Strata::space) without SpaceOptions::peers".into(),
            ));
        }
        self.gpu.synchronize_context()?;
        let tier = PeerTier::leased(
            &self.gpu,
            max_chunks,
            1u64 << self.handle.page_shift,
            self.handle.pages,
        )?;
        self.handle.peer = tier.descriptor.ptr();
        self.peer = Some(tier);
        Ok(())
    }

    /// Maps a chunk lent by another process (its exported descriptor; close it afterwards)
    /// into the peer tier; returns its chunk index. Safe while kernels run.
    ///
    /// # Errors
    /// No leased peer tier ([`Space::enable_peer_leases`]), no free chunk slot, or the driver
    /// refused the import.
    pub fn attach_peer_chunk(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<usize, SpaceError> {
        self.leased_peer()?.attach(fd)
    }

    /// Gives chunks back: kernels stop using them (pages they held are loaded from the host
    /// copy), warps still copying are waited for until `deadline`, then they are unmapped.
    /// Safe while kernels run. Returns how long each phase took.
    ///
    /// # Errors
    /// No leased peer tier, no such chunk, or warps still inside at the deadline (the chunks
    /// then stay revoked and mapped; call again).
    pub fn revoke_peer_chunks(
        &self,
        chunks: &[usize],
        deadline: std::time::Instant,
    ) -> Result<PeerRevoke, SpaceError> {
        self.leased_peer()?.revoke(chunks, deadline)
    }

    /// Chunk entries refused because the chunk was absent or revoked (waits for kernels).
    ///
    /// # Errors
    /// No leased peer tier, or the driver failed.
    pub fn peer_refused(&self) -> Result<u64, SpaceError> {
        self.gpu.synchronize_context()?;
        self.leased_peer()?.refused()
    }

    fn leased_peer(&self) -> Result<&PeerTier, SpaceError> {
        self.peer.as_ref().ok_or_else(|| {
            SpaceError::Invalid(
                "this space has no peer tier: call Space::enable_peer_leases first".into(),
            )
        })
    }

    /// Marks the space read-only for the kernels launched after this call (`true`), or
    /// writable again (`false`; the default).
    ///
    /// In a read-only space a kernel's write (element write or atomic, or a page acquired for
    /// writing) is refused: nothing is written, and [`Space::check_errors`] returns
    /// [`SpaceError::WroteReadOnly`]. In exchange, since no page can be dirty and the host copy
    /// cannot change while a kernel runs, pages read in place from the host copy
    /// (`acquire_page` with `STRATA_READ_IN_PLACE` or `STRATA_READ_REMOTE_OK`) skip the acquire
    /// on the page word, whose L1 invalidation throws out the lines every other warp of the
    /// multiprocessor is reading: BFS at scale 25 runs about 12 % faster
    /// (`crates/strata-gpu/results/issue12/read-only/`). For data no kernel writes: a graph, an
    /// embedding table, weights.
    ///
    /// Waits for the space's kernels, and when marking read-only writes every dirty cached
    /// page down first (they stay cached, clean). Launch kernels with a [`Space::handle`] taken
    /// after this call.
    ///
    /// # Errors
    /// The wait or the write-down failed (the space stays as it was).
    pub fn set_read_only(&mut self, read_only: bool) -> Result<(), SpaceError> {
        self.gpu.synchronize_context()?;
        if read_only {
            self.flush()?;
            self.handle.policy |= crate::layout::POLICY_READ_ONLY;
        } else {
            self.handle.policy &= !crate::layout::POLICY_READ_ONLY;
        }
        Ok(())
    }

    /// Whether kernels' writes are refused ([`Space::set_read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.handle.policy & crate::layout::POLICY_READ_ONLY != 0
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
    ///
    /// A space over a store has no host copy: it refuses with [`SpaceError::NoHostCopy`]
    /// (use `fill_from_slice`, `read_back`, or the store itself).
    pub fn with_host_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, SpaceError> {
        if !matches!(self.backing, Backing::HostCopy(_)) {
            return Err(SpaceError::NoHostCopy);
        }
        self.evict(0..self.size())?;
        let size = usize::try_from(self.size()).unwrap_or(usize::MAX);
        match &mut self.backing {
            Backing::HostCopy(h) => Ok(f(&mut h.buffer.as_mut_slice()[..size])),
            Backing::Store(_) => Err(SpaceError::NoHostCopy),
        }
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
        if bytes == 0 {
            return Ok(());
        }
        // The GPU's copies of the range go down first (dirty bytes of partial pages outside
        // `data` survive), then the bottom tier takes the bytes.
        self.evict(offset..offset + bytes)?;
        self.backing.write(offset, bytemuck::cast_slice(data))
    }

    /// Zero-fills the space.
    pub fn fill_zero(&mut self) -> Result<(), SpaceError> {
        self.evict(0..self.size())?;
        self.backing.zero(0..self.size())
    }

    /// Fills the space from the start of `store` (up to the smaller of the two sizes; the rest
    /// reads as zero), in 8 MiB pieces.
    pub fn fill_from_store(&mut self, store: &dyn Store) -> Result<(), SpaceError> {
        let n = self.size().min(store.size());
        self.evict(0..self.size())?;
        self.backing.zero(n..self.size())?;
        let mut buf = vec![0u8; 8 << 20];
        let mut at = 0;
        while at < n {
            let len = usize::try_from((n - at).min(buf.len() as u64)).unwrap_or(buf.len());
            store
                .read_at(at, &mut buf[..len])
                .map_err(|source| SpaceError::Store {
                    store: store.describe(),
                    source,
                })?;
            self.backing.write(at, &buf[..len])?;
            at += len as u64;
        }
        Ok(())
    }

    /// Writes every dirty cached page down the tier chain (pages stay cached, now clean): to
    /// the host copy, or through the host cache to the store, whose durability point follows.
    pub fn flush(&self) -> Result<(), SpaceError> {
        self.flush_gpu_frames()?;
        self.backing.flush()
    }

    /// Flushes and ends the space. A space over a store that cannot write everything down
    /// returns [`SpaceError::Unflushed`] with every page still dirty (index and bytes), so
    /// nothing is lost; dropping a space does the same flush but can only log a failure.
    pub fn close(mut self) -> Result<(), SpaceError> {
        self.close_in_place()
    }

    fn close_in_place(&mut self) -> Result<(), SpaceError> {
        let gpu_flush = self.flush_gpu_frames();
        // Pages still dirty in GPU frames could not go down: they are handed back too.
        let stuck = match (&gpu_flush, &self.backing) {
            (Err(_), Backing::Store(_)) => self.dirty_frames().unwrap_or_default(),
            _ => Vec::new(),
        };
        match &mut self.backing {
            Backing::HostCopy(_) => gpu_flush,
            Backing::Store(s) => match gpu_flush {
                Err(e) => {
                    let mut pages = stuck;
                    if let Err(SpaceError::Unflushed { pages: more, .. }) = s.close() {
                        pages.extend(more);
                    }
                    Err(SpaceError::Unflushed {
                        pages,
                        source: Box::new(e),
                    })
                }
                Ok(()) => s.close(),
            },
        }
    }

    /// The GPU part of a flush: dirty frames down one tier.
    fn flush_gpu_frames(&self) -> Result<(), SpaceError> {
        self.gpu.synchronize_context()?;
        self.flush_fn
            .launch(self.grid, &Args::new().arg(self.handle).alone())?;
        self.gpu.synchronize()?;
        self.check_errors()
    }

    /// Copies of the pages dirty in GPU frames (index and bytes), for an error that hands them
    /// back.
    fn dirty_frames(&self) -> Result<Vec<(u64, Vec<u8>)>, SpaceError> {
        let table = self.page_table()?;
        let ps = self.page_size();
        let mut out = Vec::new();
        for (page, &w) in table.iter().enumerate() {
            let word = crate::layout::PageWord::decode(w);
            if word.state == crate::layout::RESIDENT && word.dirty {
                let mut bytes = vec![0u8; usize::try_from(ps).unwrap_or(0)];
                self._frame_data.download(
                    usize::try_from(u64::from(word.frame) * ps).unwrap_or(0),
                    &mut bytes,
                )?;
                out.push((page as u64, bytes));
            }
        }
        Ok(out)
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
        self.backing.read(offset, bytemuck::cast_slice_mut(out))
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
            &Args::new().arg(self.handle).arg(first).arg(last).alone(),
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
            &Args::new().arg(self.handle).arg(first).arg(last).alone(),
        )?;
        self.gpu.synchronize()?;
        self.check_errors()
    }

    fn counters(&self) -> Result<DeviceCounters, SpaceError> {
        self.gpu.synchronize_context()?;
        let mut c = [DeviceCounters::initial()];
        let mut staging = self
            .counters_staging
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.counters.download_via(0, &mut c, &mut staging)?;
        Ok(c[0])
    }

    /// Returns the error a kernel reported (after waiting for every kernel queued on the
    /// GPU), if any, and clears every reported error: an element or page index out of range
    /// ([`SpaceError::OutOfRange`], [`SpaceError::PageOutOfRange`]) or a wait that gave up
    /// ([`SpaceError::NoFrame`]), in that order when several were reported.
    pub fn check_errors(&self) -> Result<(), SpaceError> {
        self.errors_in(self.counters()?)
    }

    /// [`Space::check_errors`], then, when no error was reported, the statistics
    /// ([`Space::stats`]) from the same read of the device counters: one host round trip
    /// instead of two, for a launch helper that checks a kernel and then reads the counts.
    pub fn check_errors_and_stats(&self) -> Result<GpuStats, SpaceError> {
        let c = self.counters()?;
        self.errors_in(c)?;
        self.stats_of(&c)
    }

    /// The error recorded in counters `c` (cleared on the device), if any.
    fn errors_in(&self, c: DeviceCounters) -> Result<(), SpaceError> {
        use crate::layout::{
            ERR_NO_FRAME, ERR_OUT_OF_RANGE, ERR_PAGE_OUT_OF_RANGE, ERR_READ_ONLY, ERR_STORE,
        };
        if c.error_flags == 0 {
            return Ok(());
        }
        let mut fresh = c;
        fresh.error_flags = 0;
        fresh.first_bad_index = u64::MAX;
        fresh.first_bad_page = u64::MAX;
        fresh.no_frame_page = u64::MAX;
        fresh.store_error_page = u64::MAX;
        fresh.read_only_write_page = u64::MAX;
        self.counters.upload(0, std::slice::from_ref(&fresh))?;
        let elem = self.options.element.size();
        Err(if c.error_flags & ERR_STORE != 0 {
            // The store's own words, when the host has them (else the host did not answer).
            let failures = match &self.backing {
                Backing::Store(s) => s.server().map(|r| r.take_errors()).unwrap_or_default(),
                Backing::HostCopy(_) => Vec::new(),
            };
            let page = c.store_error_page;
            let message = failures
                .iter()
                .find(|f| f.page == page)
                .or_else(|| failures.first())
                .map_or_else(
                    || "the host's request ring did not answer within the wait limit (its threads stopped, or the store stalled)".to_string(),
                    |f| f.message.clone(),
                );
            SpaceError::StoreFailed {
                page,
                failed_pages: failures.len().max(1),
                message,
            }
        } else if c.error_flags & ERR_OUT_OF_RANGE != 0 {
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
        } else if c.error_flags & ERR_READ_ONLY != 0 {
            SpaceError::WroteReadOnly {
                page: c.read_only_write_page,
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
        self.stats_of(&self.counters()?)
    }

    /// The statistics in counters `c` (and the peer tier's, read now).
    fn stats_of(&self, c: &DeviceCounters) -> Result<GpuStats, SpaceError> {
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
            host_cache_loads: c.host_cache_loads,
            background_writebacks: c.background_writebacks,
            remote_reads: c.remote_reads,
            remote_writes: c.remote_writes,
            pages_dirtied: c.pages_dirtied,
            sector_fills: c.sector_fills,
            fault_hist: FaultHistogram(c.fault_hist),
            peer: match &self.peer {
                Some(p) => {
                    let d = p.state()?;
                    let (reclaims, reclaimed_chunks) = p.reclaims();
                    Some(stats::PeerStats {
                        slots: p.slots,
                        borrowed_bytes: p.borrowed_bytes(),
                        loads: d.loads,
                        stores: d.stores,
                        stale: d.stale,
                        refused: p.refused()?,
                        reclaims,
                        reclaimed_chunks,
                    })
                }
                None => None,
            },
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
        fresh.store_error_page = c.store_error_page;
        fresh.read_only_write_page = c.read_only_write_page;
        fresh.pages_dirtied = c.pages_dirtied;
        fresh.wait_limit_ns = c.wait_limit_ns;
        fresh.clock_hand = c.clock_hand;
        fresh.protected_now = c.protected_now;
        fresh.lifetime_faults = c.lifetime_faults;
        fresh.free_frames = c.free_frames;
        self.counters.upload(0, std::slice::from_ref(&fresh))?;
        if let Some(p) = &self.peer {
            p.reset_counters()?;
        }
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
    /// Empty for a space over a store (it has no host copy).
    pub fn host_bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::HostCopy(h) => h.buffer.as_slice(),
            Backing::Store(_) => &[],
        }
    }

    /// The host copy's address, for copies queued by the caller (baselines); writes through it
    /// bypass the cache, so evict the range first if kernels may have it cached.
    /// Null for a space over a store (it has no host copy).
    pub fn host_raw_ptr(&self) -> *mut u8 {
        match &self.backing {
            Backing::HostCopy(h) => h.buffer.host_mut_ptr(),
            Backing::Store(_) => std::ptr::null_mut(),
        }
    }

    /// A space over a store: the host cache's and the ring's statistics (`None` for a space
    /// with a host copy).
    pub fn ring_stats(&self) -> Option<crate::ring::RingStats> {
        match &self.backing {
            Backing::Store(s) => s.server().ok().map(crate::ring::RingServer::stats),
            Backing::HostCopy(_) => None,
        }
    }

    /// Stops the ring's host threads as if they had died (tests of what kernels do then).
    #[doc(hidden)]
    pub fn kill_ring_for_test(&self) {
        if let Backing::Store(s) = &self.backing
            && let Ok(server) = s.server()
        {
            server.kill_for_test();
        }
    }

    /// Bytes of GPU memory the frames take (not counting the scratch page).
    pub fn cache_bytes(&self) -> u64 {
        u64::from(self.handle.frame_count) << self.handle.page_shift
    }
}
