//! The copy API: open a GPU, pin a device buffer, map it, copy to and from it.
//!
//! # Ordering, exactly
//! - [`Pinned::copy_to`] returns once the bytes are in device memory: a kernel launched (or a
//!   copy issued) after it returns sees them. It is not ordered against kernels already running:
//!   they may see the new bytes at any moment, in any order within the copy.
//! - [`Pinned::post_to`] returns after handing the bytes over (the caller's slice may be reused
//!   at once); they reach device memory shortly after, always before any later copy of the same
//!   [`Copier`] completes. [`Copier::flush`] waits for them.
//! - [`Pinned::copy_from`] returns the bytes as they were when the copy ran, after every earlier
//!   copy of the same copier (posted or not) landed. It is not ordered against running kernels.
//! - [`Pinned::copy_to_on_stream`] / [`Pinned::copy_from_on_stream`] are ordered on the caller's
//!   CUDA stream: after the work queued on it before, before the work queued after. They go
//!   through the copy engine, so they cost what `cudaMemcpyAsync` costs.
//! - Copies of one copier are served in the order they were issued, from any thread.

use std::sync::{Arc, Mutex, OnceLock};

use crate::error::CopyError;
use crate::service::{Service, ServiceConfig};
use crate::staged_engine::StagedEngine;
use crate::sys::{self, Context};

/// The mechanism that moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Backend {
    /// A true CPU mapping of device memory through dma-buf `mmap` (drivers that allow it).
    DmaBufMmap,
    /// The kernel-free default: a persistent GPU copy service behind a doorbell ring.
    Service,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::DmaBufMmap => "dma-buf mmap (CPU mapping of device memory)",
            Backend::Service => "GPU copy service (persistent kernel, doorbell ring)",
        })
    }
}

/// What the run-time backend choice found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackendReport {
    /// The backend in use.
    pub backend: Backend,
    /// gdrdrv's device file: present or not, and what this build does with it.
    pub gdrdrv: String,
    /// dma-buf mmap: usable, or why not.
    pub dmabuf: String,
    /// The driver's CUDA version (e.g. 13000).
    pub driver_version: i32,
}

/// Options of a [`Copier`].
#[derive(Debug, Clone)]
pub struct CopyConfig {
    /// Tuning of the copy service.
    pub service: ServiceConfig,
    /// Host-to-device copies of at least this many bytes use the copy engine instead of the
    /// service.
    pub large_threshold: usize,
    /// Device-to-host copies of at least this many bytes use the copy engine instead of the
    /// service.
    pub large_threshold_d2h: usize,
    /// Host-to-device copy-engine copies of at least this many bytes go through strata's
    /// pinned staging, filled by `copy_threads` threads; smaller ones hand pageable memory to
    /// the driver.
    pub pipeline_min: usize,
    /// The same for device-to-host copies.
    pub pipeline_min_d2h: usize,
    /// Host threads copying to and from pinned staging on that path (the caller counts).
    pub copy_threads: usize,
    /// Bytes per pinned staging buffer (two are allocated on first use).
    pub pipeline_chunk: usize,
    /// Skip the dma-buf probe and use the service.
    pub force_service: bool,
    /// Check before every copy that the pinned allocation still exists (one driver query,
    /// about 0.1 us), so a copy after `cuMemFree` fails instead of writing freed memory.
    pub check_liveness: bool,
}

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig {
            service: ServiceConfig::default(),
            large_threshold: 128 << 10,
            large_threshold_d2h: 256 << 10,
            pipeline_min: 128 << 10,
            pipeline_min_d2h: 256 << 10,
            copy_threads: std::thread::available_parallelism()
                .map_or(1, |n| (n.get() / 2).clamp(1, 4)),
            pipeline_chunk: 4 << 20,
            force_service: false,
            check_liveness: true,
        }
    }
}

#[derive(Debug)]
struct Inner {
    ctx: Context,
    pid: u32,
    /// [`sys::fork_generation`] at open: a different value means a forked child.
    forks: Option<u64>,
    report: BackendReport,
    cfg: CopyConfig,
    service: OnceLock<Service>,
    service_init: Mutex<()>,
    /// Stream of the copy-engine path (large copies), created on first use.
    copy_stream: OnceLock<sys::Stream>,
    /// Pinned staging of the pipelined copy-engine path, allocated on first use; one large
    /// copy at a time goes through it.
    staged: Mutex<Option<StagedEngine>>,
}

/// One GPU opened for small copies. Cheap to clone; shareable across threads.
#[derive(Debug, Clone)]
pub struct Copier {
    inner: Arc<Inner>,
}

const GDRDRV_PATH: &str = "/dev/gdrdrv";

fn probe_dmabuf(ctx: &Context) -> Result<(), String> {
    let size = 2 << 20;
    let buf = sys::DeviceAlloc::new(ctx, size).map_err(|e| e.to_string())?;
    let fd =
        sys::dmabuf_export(ctx, buf.ptr(), size).map_err(|e| format!("export refused: {e}"))?;
    let r = sys::mmap_fd(fd, size);
    sys::close_fd(fd);
    match r {
        Ok(p) => {
            // SAFETY: mapped just above, unmapped once, never used.
            unsafe { sys::munmap(p, size) };
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(524) => Err(
            "export works but mmap is refused (ENOTSUPP): this driver allows dma-buf CPU mappings only on integrated GPUs".into(),
        ),
        Err(e) => Err(format!("mmap of the dma-buf failed: {e}")),
    }
}

impl Copier {
    /// Opens GPU `ordinal` with default options.
    pub fn open(ordinal: usize) -> Result<Copier, CopyError> {
        Copier::open_with(ordinal, CopyConfig::default())
    }

    /// Opens GPU `ordinal`; probes the backends (no kernel starts until the first copy).
    pub fn open_with(ordinal: usize, cfg: CopyConfig) -> Result<Copier, CopyError> {
        let ctx = Context::open(ordinal)?;
        let gdrdrv = if std::path::Path::new(GDRDRV_PATH).exists() {
            format!(
                "{GDRDRV_PATH} present; this build does not drive gdrdrv (use NVIDIA's libgdrapi for it)"
            )
        } else {
            format!("{GDRDRV_PATH} absent")
        };
        let dmabuf = if cfg.force_service {
            Err("not probed (service forced)".to_string())
        } else {
            probe_dmabuf(&ctx)
        };
        let report = BackendReport {
            backend: if dmabuf.is_ok() {
                Backend::DmaBufMmap
            } else {
                Backend::Service
            },
            gdrdrv,
            dmabuf: dmabuf.err().unwrap_or_else(|| "usable".into()),
            driver_version: sys::driver_version()?,
        };
        Ok(Copier {
            inner: Arc::new(Inner {
                ctx,
                pid: std::process::id(),
                forks: sys::fork_generation(),
                report,
                cfg,
                service: OnceLock::new(),
                service_init: Mutex::new(()),
                copy_stream: OnceLock::new(),
                staged: Mutex::new(None),
            }),
        })
    }

    /// The backend choice and why.
    pub fn report(&self) -> &BackendReport {
        &self.inner.report
    }

    /// The GPU's name.
    pub fn gpu_name(&self) -> String {
        self.inner.ctx.name()
    }

    /// The context (for callers that allocate device memory to pin).
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    fn check_pid(&self) -> Result<(), CopyError> {
        if self.inner.forks.is_some() && sys::fork_generation() == self.inner.forks {
            return Ok(());
        }
        let current = std::process::id();
        if current != self.inner.pid || sys::fork_generation() != self.inner.forks {
            return Err(CopyError::Forked {
                owner: self.inner.pid,
                current,
            });
        }
        Ok(())
    }

    fn service(&self) -> Result<&Service, CopyError> {
        if let Some(s) = self.inner.service.get() {
            return Ok(s);
        }
        let _guard = self
            .inner
            .service_init
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.inner.service.get() {
            return Ok(s);
        }
        let s = Service::new(&self.inner.ctx, self.inner.cfg.service.clone())?;
        Ok(self.inner.service.get_or_init(|| s))
    }

    /// Copy-engine copy host to device, complete on return. `cuMemcpyHtoD` from pageable
    /// memory may return before the DMA lands, so queue it on our stream and wait for that.
    fn engine_htod(&self, dev: u64, data: &[u8]) -> Result<(), CopyError> {
        self.flush()?;
        let stream = self.copy_stream()?;
        if data.len() >= self.inner.cfg.pipeline_min {
            return self.with_staging(|st, ctx, threads| st.htod(ctx, stream, dev, data, threads));
        }
        // SAFETY: `data` stays borrowed until the stream synchronisation below.
        unsafe {
            sys::memcpy_htod_async(
                &self.inner.ctx,
                dev,
                data.as_ptr(),
                data.len(),
                stream.raw(),
            )?
        };
        stream.synchronize()
    }

    /// Copy-engine copy device to host, complete on return.
    fn engine_dtoh(&self, out: &mut [u8], dev: u64) -> Result<(), CopyError> {
        self.flush()?;
        let stream = self.copy_stream()?;
        if out.len() >= self.inner.cfg.pipeline_min_d2h {
            return self.with_staging(|st, ctx, threads| st.dtoh(ctx, stream, out, dev, threads));
        }
        // SAFETY: `out` stays borrowed until the stream synchronisation below.
        unsafe {
            sys::memcpy_dtoh_async(
                &self.inner.ctx,
                out.as_mut_ptr(),
                dev,
                out.len(),
                stream.raw(),
            )?
        };
        stream.synchronize()
    }

    /// Runs `f` on the pinned staging (allocated on first use), one large copy at a time.
    fn with_staging(
        &self,
        f: impl FnOnce(&StagedEngine, &Context, usize) -> Result<(), CopyError>,
    ) -> Result<(), CopyError> {
        let mut guard = self.inner.staged.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let chunk = self.inner.cfg.pipeline_chunk.max(256 << 10);
            let threads = self.inner.cfg.copy_threads.max(1);
            *guard = Some(StagedEngine::new(&self.inner.ctx, chunk, threads)?);
        }
        match guard.as_ref() {
            Some(st) => f(st, &self.inner.ctx, self.inner.cfg.copy_threads.max(1)),
            None => Err(CopyError::Invalid("pinned staging missing".into())),
        }
    }

    fn copy_stream(&self) -> Result<&sys::Stream, CopyError> {
        if let Some(s) = self.inner.copy_stream.get() {
            return Ok(s);
        }
        let s = sys::Stream::new(&self.inner.ctx)?;
        Ok(self.inner.copy_stream.get_or_init(|| s))
    }

    /// Waits until every posted copy landed.
    pub fn flush(&self) -> Result<(), CopyError> {
        self.check_pid()?;
        match self.inner.service.get() {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }

    /// Stops the service kernel now, if running (the next copy restarts it).
    pub fn stop_service(&self) -> Result<(), CopyError> {
        match self.inner.service.get() {
            Some(s) => s.stop(),
            None => Ok(()),
        }
    }

    /// Whether the service kernel is running.
    pub fn service_running(&self) -> bool {
        self.inner.service.get().is_some_and(Service::running)
    }

    /// Allocates device memory with cuMemAlloc (a convenience for tests and benchmarks).
    pub fn alloc(&self, len: usize) -> Result<sys::DeviceAlloc, CopyError> {
        sys::DeviceAlloc::new(&self.inner.ctx, len)
    }

    /// Allocates device memory with the VMM API (GPUDirect RDMA flag set).
    pub fn alloc_vmm(&self, len: usize) -> Result<sys::DeviceAlloc, CopyError> {
        sys::DeviceAlloc::new_vmm(&self.inner.ctx, len)
    }

    /// Pins `[addr, addr + size)` of device memory of this GPU for copies. The range must lie
    /// within one allocation; it must not be freed while pinned (copies then fail, see
    /// [`CopyConfig::check_liveness`]).
    pub fn pin(&self, addr: u64, size: u64) -> Result<Pinned, CopyError> {
        self.check_pid()?;
        if size == 0 || addr.checked_add(size).is_none() {
            return Err(CopyError::BadSize(size));
        }
        let ordinal = self.inner.ctx.ordinal;
        let info =
            sys::pointer_info(&self.inner.ctx, addr).map_err(|e| CopyError::NotDeviceMemory {
                addr,
                ordinal,
                why: e.to_string(),
            })?;
        if usize::try_from(info.ordinal).ok() != Some(ordinal) {
            return Err(CopyError::NotDeviceMemory {
                addr,
                ordinal,
                why: format!("it belongs to GPU {}", info.ordinal),
            });
        }
        if addr + size > info.base + info.size {
            return Err(CopyError::PastAllocation {
                addr,
                size,
                alloc_base: info.base,
                alloc_size: info.size,
            });
        }
        let cpu = if self.inner.report.backend == Backend::DmaBufMmap {
            Some(DmabufMap::new(&self.inner.ctx, addr, size, info)?)
        } else {
            None
        };
        Ok(Pinned {
            copier: self.clone(),
            addr,
            size,
            buffer_id: info.buffer_id,
            cpu,
        })
    }
}

/// A dma-buf CPU mapping covering a pinned range.
#[derive(Debug)]
struct DmabufMap {
    fd: i32,
    map: *mut u8,
    map_len: usize,
    /// Where the pinned address sits in the mapping.
    skew: usize,
}

// SAFETY: the mapping is owned by this value; copies through it are plain memory accesses.
unsafe impl Send for DmabufMap {}
// SAFETY: as above; concurrent copies to one device range are the caller's race, as with memcpy.
unsafe impl Sync for DmabufMap {}

impl DmabufMap {
    fn new(
        ctx: &Context,
        addr: u64,
        size: u64,
        info: sys::PointerInfo,
    ) -> Result<DmabufMap, CopyError> {
        const GPU_PAGE: u64 = 64 << 10;
        let start = (addr & !(GPU_PAGE - 1)).max(info.base);
        let end = (addr + size).div_ceil(GPU_PAGE) * GPU_PAGE;
        let end = end.min(info.base + info.size);
        let len = usize::try_from(end - start).map_err(|_| CopyError::BadSize(size))?;
        let fd = sys::dmabuf_export(ctx, start, len)?;
        let map = sys::mmap_fd(fd, len).map_err(|source| {
            sys::close_fd(fd);
            CopyError::Os {
                call: "mmap of a dma-buf",
                source,
            }
        })?;
        Ok(DmabufMap {
            fd,
            map,
            map_len: len,
            skew: usize::try_from(addr - start).unwrap_or(0),
        })
    }
}

impl Drop for DmabufMap {
    fn drop(&mut self) {
        // SAFETY: mapped in new, unmapped once; Pinned (the only user) is being dropped.
        unsafe { sys::munmap(self.map, self.map_len) };
        sys::close_fd(self.fd);
    }
}

#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// A pinned range of device memory. Dropping it unpins.
#[derive(Debug)]
pub struct Pinned {
    copier: Copier,
    addr: u64,
    size: u64,
    buffer_id: u64,
    cpu: Option<DmabufMap>,
}

impl Pinned {
    /// The pinned device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The pinned size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether copies go through a true CPU mapping (dma-buf) rather than the service.
    pub fn cpu_mapped(&self) -> bool {
        self.cpu.is_some()
    }

    /// The CPU address of the pinned start when the backend maps device memory into the
    /// process (dma-buf), else `None`.
    pub fn cpu_mapping(&self) -> Option<*mut u8> {
        self.cpu.as_ref().map(|m| self.cpu_ptr(m, 0))
    }

    /// Maps the range for copies (a borrow: unmapping is dropping the [`Mapping`]).
    pub fn map(&self) -> Result<Mapping<'_>, CopyError> {
        self.copier.check_pid()?;
        Ok(Mapping { pinned: self })
    }

    /// Unpins (same as dropping).
    pub fn unpin(self) {}

    /// Checks the process, the range and (if configured) that the allocation still exists;
    /// returns the device address of `offset`.
    pub fn check(&self, offset: u64, len: usize) -> Result<u64, CopyError> {
        self.copier.check_pid()?;
        let len64 = len as u64;
        if offset.checked_add(len64).is_none_or(|end| end > self.size) {
            return Err(CopyError::OutOfRange {
                offset,
                len: len64,
                size: self.size,
            });
        }
        if self.copier.inner.cfg.check_liveness
            && sys::buffer_id(&self.copier.inner.ctx, self.addr) != Some(self.buffer_id)
        {
            return Err(CopyError::Freed { addr: self.addr });
        }
        Ok(self.addr + offset)
    }

    fn cpu_ptr(&self, m: &DmabufMap, offset: u64) -> *mut u8 {
        // SAFETY: offset was range-checked against size, and the mapping covers skew + size.
        unsafe { m.map.add(m.skew + usize::try_from(offset).unwrap_or(0)) }
    }

    /// Copies `data` to `offset`; see the module docs for ordering.
    pub fn copy_to(&self, offset: u64, data: &[u8]) -> Result<(), CopyError> {
        let dev = self.check(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        if let Some(m) = &self.cpu {
            // SAFETY: the destination lies within the mapping (checked); source is a live slice.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.cpu_ptr(m, offset), data.len())
            };
            store_fence();
            return Ok(());
        }
        if data.len() >= self.copier.inner.cfg.large_threshold {
            return self.copier.engine_htod(dev, data);
        }
        self.copier.service()?.h2d(dev, data)
    }

    /// Hands `data` over for `offset` and returns before it lands; see the module docs.
    pub fn post_to(&self, offset: u64, data: &[u8]) -> Result<(), CopyError> {
        if self.cpu.is_some() || data.len() >= self.copier.inner.cfg.large_threshold {
            return self.copy_to(offset, data);
        }
        let dev = self.check(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.copier.service()?.post_h2d(dev, data).map(|_| ())
    }

    /// Fills `out` from `offset`; see the module docs for ordering.
    pub fn copy_from(&self, offset: u64, out: &mut [u8]) -> Result<(), CopyError> {
        let dev = self.check(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        if let Some(m) = &self.cpu {
            // SAFETY: the source lies within the mapping (checked); `out` is a live slice.
            unsafe {
                std::ptr::copy_nonoverlapping(self.cpu_ptr(m, offset), out.as_mut_ptr(), out.len())
            };
            return Ok(());
        }
        if out.len() >= self.copier.inner.cfg.large_threshold_d2h {
            return self.copier.engine_dtoh(out, dev);
        }
        self.copier.service()?.d2h(dev, out)
    }

    /// Copies `data` to `offset` ordered on `stream` (a `CUstream`; null is the legacy default
    /// stream): after work queued there before, before work queued after. Earlier copies of
    /// this copier land first. Returns once `data` has been captured (the driver stages
    /// pageable memory; for page-locked `data` this waits for the copy). Copy-engine cost.
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this copier's GPU context.
    pub unsafe fn copy_to_on_stream(
        &self,
        stream: cudarc::driver::sys::CUstream,
        offset: u64,
        data: &[u8],
    ) -> Result<(), CopyError> {
        let dev = self.check(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.copier.flush()?;
        let ctx = &self.copier.inner.ctx;
        // SAFETY: `data` outlives the call; we synchronise below whenever the driver might read
        // it after returning (page-locked memory), so it is never read after we return.
        unsafe { sys::memcpy_htod_async(ctx, dev, data.as_ptr(), data.len(), stream)? };
        if host_is_page_locked(data.as_ptr()) {
            // SAFETY: the caller vouches for `stream`.
            unsafe { sys::stream_synchronize(ctx, stream)? };
        }
        Ok(())
    }

    /// Fills `out` from `offset` ordered on `stream`: after the work queued there before.
    /// Returns when `out` holds the bytes (it waits for the stream up to this copy).
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this copier's GPU context.
    pub unsafe fn copy_from_on_stream(
        &self,
        stream: cudarc::driver::sys::CUstream,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), CopyError> {
        let dev = self.check(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.copier.flush()?;
        let ctx = &self.copier.inner.ctx;
        // SAFETY: `out` stays borrowed until the stream synchronisation below completes.
        unsafe { sys::memcpy_dtoh_async(ctx, out.as_mut_ptr(), dev, out.len(), stream)? };
        // SAFETY: the caller vouches for `stream`.
        unsafe { sys::stream_synchronize(ctx, stream) }
    }
}

fn host_is_page_locked(p: *const u8) -> bool {
    sys::host_memory_type(p).is_some()
}

/// A mapped pinned range: the handle copies go through. Dropping it unmaps.
#[derive(Debug)]
pub struct Mapping<'a> {
    pinned: &'a Pinned,
}

impl Mapping<'_> {
    /// See [`Pinned::copy_to`].
    pub fn copy_to(&self, offset: u64, data: &[u8]) -> Result<(), CopyError> {
        self.pinned.copy_to(offset, data)
    }

    /// See [`Pinned::post_to`].
    pub fn post_to(&self, offset: u64, data: &[u8]) -> Result<(), CopyError> {
        self.pinned.post_to(offset, data)
    }

    /// See [`Pinned::copy_from`].
    pub fn copy_from(&self, offset: u64, out: &mut [u8]) -> Result<(), CopyError> {
        self.pinned.copy_from(offset, out)
    }

    /// The mapped size.
    pub fn size(&self) -> u64 {
        self.pinned.size
    }

    /// Unmaps (same as dropping).
    pub fn unmap(self) {}
}
