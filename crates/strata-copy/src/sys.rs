//! Every raw CUDA driver, NVRTC and libc call of this crate (through cudarc's `sys` bindings,
//! loaded at run time), each wrapped so the rest of the crate stays safe.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use crate::error::CopyError;

static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn count_fork_in_child() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many forks led to this process from the one that first called this (a child counts one
/// more than its parent), or `None` if the fork handler could not be installed. A copier
/// compares it on every copy instead of calling `getpid`, which is a system call (0.1 to 0.3 us
/// in a VM) where a copy has 2 us in all.
pub fn fork_generation() -> Option<u64> {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *INSTALLED.get_or_init(|| {
        // SAFETY: registers a child handler that only bumps an atomic (async-signal-safe);
        // it is never unregistered, and the static it touches lives forever.
        unsafe { libc::pthread_atfork(None, None, Some(count_fork_in_child)) == 0 }
    });
    ok.then(|| FORKS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Whether libcuda can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen libcuda.
    unsafe { sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only attempts to dlopen libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn hint_for(code: sys::CUresult) -> &'static str {
    match code {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ": free GPU memory or pin less",
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS | sys::CUresult::CUDA_ERROR_LAUNCH_FAILED => {
            ": a kernel touched memory outside its buffers (was a pinned buffer freed?); the context is lost, restart the process"
        }
        sys::CUresult::CUDA_ERROR_NOT_SUPPORTED => ": this GPU or driver does not offer it",
        _ => "",
    }
}

/// Turns a CUresult into a Result.
pub fn check(code: sys::CUresult, call: &'static str) -> Result<(), CopyError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    let message = unsafe {
        if sys::cuGetErrorString(code, &raw mut text) == sys::CUresult::CUDA_SUCCESS
            && !text.is_null()
        {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        } else {
            format!("{code:?}")
        }
    };
    Err(CopyError::Cuda {
        call,
        code: code as u32,
        message,
        hint: hint_for(code),
    })
}

/// The primary context of one GPU.
#[derive(Debug, Clone)]
pub struct Context {
    ctx: Arc<CudaContext>,
    /// CUDA ordinal.
    pub ordinal: usize,
}

impl Context {
    /// Retains GPU `ordinal`'s primary context.
    pub fn open(ordinal: usize) -> Result<Context, CopyError> {
        if !driver_present() {
            return Err(CopyError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CopyError::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            code: e.0 as u32,
            message: e.to_string(),
            hint: ": check the GPU ordinal against `strata info`",
        })?;
        let c = Context { ctx, ordinal };
        c.bind()?;
        Ok(c)
    }

    /// Makes the context current on this thread.
    pub fn bind(&self) -> Result<(), CopyError> {
        // SAFETY: the context is retained for as long as `self.ctx` lives.
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx.cu_ctx()) },
            "cuCtxSetCurrent",
        )
    }

    /// A device attribute.
    pub fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32, CopyError> {
        self.ctx.attribute(a).map_err(|e| CopyError::Cuda {
            call: "cuDeviceGetAttribute",
            code: e.0 as u32,
            message: e.to_string(),
            hint: "",
        })
    }

    /// The device name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }
}

/// The driver's CUDA version, e.g. 13000.
pub fn driver_version() -> Result<i32, CopyError> {
    let mut v = 0;
    check(
        // SAFETY: valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&raw mut v) },
        "cuDriverGetVersion",
    )?;
    Ok(v)
}

/// Pinned host memory from cuMemHostAlloc, zeroed, freed on drop.
#[derive(Debug)]
pub struct HostMem {
    ctx: Context,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is plain memory owned by this value; the pointer is not aliased by
// other owners. Concurrent access is arbitrated by the users (the ring protocol).
unsafe impl Send for HostMem {}
// SAFETY: as above.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// Allocates `len` bytes of pinned, device-mapped host memory; `write_combined` for memory
    /// the CPU only writes (fast WC stores, very slow CPU reads).
    pub fn new(ctx: &Context, len: usize, write_combined: bool) -> Result<HostMem, CopyError> {
        ctx.bind()?;
        let mut flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        if write_combined {
            flags |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { sys::cuMemHostAlloc(&raw mut p, len, flags) },
            "cuMemHostAlloc",
        )?;
        // SAFETY: the allocation has `len` bytes; zeroing gives the ring its "no request" state.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(HostMem {
            ctx: ctx.clone(),
            ptr: p.cast(),
            len,
        })
    }

    /// Start of the allocation (also its device address, under UVA).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the allocation.
    pub fn device_ptr(&self) -> Result<u64, CopyError> {
        self.ctx.bind()?;
        let mut d: sys::CUdeviceptr = 0;
        check(
            // SAFETY: `ptr` is a live cuMemHostAlloc allocation made with DEVICEMAP.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&raw mut d, self.ptr.cast(), 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(d)
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc and freed exactly once here.
            unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        }
    }
}

/// A stream of our own.
#[derive(Debug)]
pub struct Stream {
    ctx: Context,
    raw: sys::CUstream,
}

// SAFETY: CUstream handles may be used from any thread with their context current.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises work on one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream (never implicitly synchronised with the legacy default stream).
    pub fn new(ctx: &Context) -> Result<Stream, CopyError> {
        ctx.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer, context current.
            unsafe {
                sys::cuStreamCreate(
                    &raw mut raw,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<(), CopyError> {
        // SAFETY: our own live stream.
        unsafe { stream_synchronize(&self.ctx, self.raw) }
    }

    /// `Ok(true)` when idle, `Ok(false)` while busy, `Err` if queued work failed.
    pub fn query(&self) -> Result<bool, CopyError> {
        self.ctx.bind()?;
        // SAFETY: the stream is alive.
        let rc = unsafe { sys::cuStreamQuery(self.raw) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(rc, "cuStreamQuery").map(|()| true)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by us, destroyed once.
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// Waits for a (possibly foreign) stream.
///
/// # Safety
/// `stream` must be null (the legacy default stream) or a live stream of `ctx`.
pub unsafe fn stream_synchronize(ctx: &Context, stream: sys::CUstream) -> Result<(), CopyError> {
    ctx.bind()?;
    // SAFETY: the caller passes a live stream of this context (or null, the default stream).
    check(
        unsafe { sys::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// A loaded module holding one kernel.
#[derive(Debug)]
pub struct Kernel {
    ctx: Context,
    module: sys::CUmodule,
    func: sys::CUfunction,
}

// SAFETY: module and function handles are context-wide and usable from any thread.
unsafe impl Send for Kernel {}
// SAFETY: as above; launching does not mutate the handles.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Loads a CUBIN and finds `name` in it.
    pub fn load(ctx: &Context, cubin: &[u8], name: &str) -> Result<Kernel, CopyError> {
        ctx.bind()?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: `cubin` is a complete ELF image that lives across the call.
            unsafe { sys::cuModuleLoadData(&raw mut module, cubin.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        let cname =
            CString::new(name).map_err(|_| CopyError::Invalid("NUL in kernel name".into()))?;
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module just loaded; valid C string.
        let rc = unsafe { sys::cuModuleGetFunction(&raw mut func, module, cname.as_ptr()) };
        if let Err(e) = check(rc, "cuModuleGetFunction") {
            // SAFETY: loaded above, unloaded once.
            unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
        Ok(Kernel {
            ctx: ctx.clone(),
            module,
            func,
        })
    }

    /// Launches `grid` blocks of `block` threads on `stream`.
    ///
    /// # Safety
    /// `params` must point to values whose types and order match the kernel's signature, and
    /// every address they carry must stay valid while the kernel runs.
    pub unsafe fn launch(
        &self,
        stream: sys::CUstream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CopyError> {
        self.ctx.bind()?;
        // SAFETY: forwarded to the caller's contract; function and stream are alive.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.func,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by us, unloaded once, after every launch was waited for by owners.
            unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// Synchronous host-to-device copy (the copy engine; `src` may be pageable).
pub fn memcpy_htod(ctx: &Context, dst: u64, src: &[u8]) -> Result<(), CopyError> {
    ctx.bind()?;
    // SAFETY: `src` is a live slice; `dst` was range-checked by the caller against a pinned
    // allocation.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) },
        "cuMemcpyHtoD",
    )
}

/// Synchronous device-to-host copy.
pub fn memcpy_dtoh(ctx: &Context, dst: &mut [u8], src: u64) -> Result<(), CopyError> {
    ctx.bind()?;
    // SAFETY: `dst` is a live mutable slice; `src` was range-checked by the caller.
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) },
        "cuMemcpyDtoH",
    )
}

/// A CUDA event without timing (a marker in a stream to wait for).
#[derive(Debug)]
pub struct Event {
    ctx: Context,
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread with their context current.
unsafe impl Send for Event {}
// SAFETY: as above; record and synchronise are thread-safe in the driver.
unsafe impl Sync for Event {}

impl Event {
    /// A new event (never recorded: waiting for it returns at once).
    pub fn new(ctx: &Context) -> Result<Event, CopyError> {
        ctx.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer, context current.
            unsafe {
                sys::cuEventCreate(
                    &raw mut raw,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                )
            },
            "cuEventCreate",
        )?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// Marks the current end of `stream`'s queue.
    pub fn record(&self, stream: &Stream) -> Result<(), CopyError> {
        self.ctx.bind()?;
        // SAFETY: both handles are alive and of this context.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw()) },
            "cuEventRecord",
        )
    }

    /// Waits until the work queued before the last `record` completed.
    pub fn synchronize(&self) -> Result<(), CopyError> {
        self.ctx.bind()?;
        // SAFETY: the event is alive.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by us, destroyed once.
            unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// Host-to-device copy queued on `stream`.
///
/// # Safety
/// `src..src+len` must stay valid and unchanged until the copy completes on the stream.
pub unsafe fn memcpy_htod_async(
    ctx: &Context,
    dst: u64,
    src: *const u8,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CopyError> {
    ctx.bind()?;
    // SAFETY: forwarded to the caller's contract.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream) },
        "cuMemcpyHtoDAsync",
    )
}

/// Device-to-host copy queued on `stream`.
///
/// # Safety
/// `dst..dst+len` must stay valid and unaliased until the copy completes on the stream.
pub unsafe fn memcpy_dtoh_async(
    ctx: &Context,
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CopyError> {
    ctx.bind()?;
    // SAFETY: forwarded to the caller's contract.
    check(
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream) },
        "cuMemcpyDtoHAsync",
    )
}

/// What the driver says about a device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// Unique id of the allocation (never reused).
    pub buffer_id: u64,
    /// Start of the allocation.
    pub base: u64,
    /// Its size.
    pub size: u64,
    /// GPU ordinal owning it.
    pub ordinal: i32,
}

/// Queries the allocation behind `addr`; `Err` if it is not device memory.
pub fn pointer_info(ctx: &Context, addr: u64) -> Result<PointerInfo, CopyError> {
    use sys::CUpointer_attribute as A;
    ctx.bind()?;
    let mut mem_type: u32 = 0;
    check(
        // SAFETY: out-pointer of the attribute's documented type (unsigned int).
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut mem_type).cast(),
                A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        },
        "cuPointerGetAttribute(MEMORY_TYPE)",
    )?;
    if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(CopyError::Invalid(format!(
            "memory type {mem_type} is not device memory"
        )));
    }
    let mut managed: u32 = 0;
    check(
        // SAFETY: out-pointer of type unsigned int (bool attribute).
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut managed).cast(),
                A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                addr,
            )
        },
        "cuPointerGetAttribute(IS_MANAGED)",
    )?;
    if managed != 0 {
        return Err(CopyError::Invalid(
            "managed (UVM) memory is not supported".into(),
        ));
    }
    let mut buffer_id: u64 = 0;
    check(
        // SAFETY: BUFFER_ID is an unsigned long long.
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut buffer_id).cast(),
                A::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                addr,
            )
        },
        "cuPointerGetAttribute(BUFFER_ID)",
    )?;
    let mut ordinal: i32 = -1;
    check(
        // SAFETY: DEVICE_ORDINAL is an int.
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut ordinal).cast(),
                A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        },
        "cuPointerGetAttribute(DEVICE_ORDINAL)",
    )?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    check(
        // SAFETY: valid out-pointers.
        unsafe { sys::cuMemGetAddressRange_v2(&raw mut base, &raw mut size, addr) },
        "cuMemGetAddressRange",
    )?;
    Ok(PointerInfo {
        buffer_id,
        base,
        size: size as u64,
        ordinal,
    })
}

/// Just the buffer id (the per-copy liveness check: one cheap driver call). Tried first
/// without making the context current (a pointer query needs none under unified addressing,
/// and `cuCtxSetCurrent` costs as much again); bound and retried if the driver asks for one.
pub fn buffer_id(ctx: &Context, addr: u64) -> Option<u64> {
    let query = || {
        let mut id: u64 = 0;
        // SAFETY: BUFFER_ID is an unsigned long long.
        let rc = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut id).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                addr,
            )
        };
        (rc, id)
    };
    let (mut rc, mut id) = query();
    if rc == sys::CUresult::CUDA_ERROR_INVALID_CONTEXT {
        ctx.bind().ok()?;
        (rc, id) = query();
    }
    (rc == sys::CUresult::CUDA_SUCCESS).then_some(id)
}

/// Device memory from cuMemAlloc, freed on drop.
#[derive(Debug)]
pub struct DeviceAlloc {
    ctx: Context,
    ptr: u64,
    len: usize,
    vmm: Option<VmmParts>,
}

#[derive(Debug)]
struct VmmParts {
    handle: sys::CUmemGenericAllocationHandle,
    reserved: usize,
}

impl DeviceAlloc {
    /// `len` bytes from cuMemAlloc.
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceAlloc, CopyError> {
        ctx.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        check(
            // SAFETY: valid out-pointer, context current.
            unsafe { sys::cuMemAlloc_v2(&raw mut ptr, len) },
            "cuMemAlloc",
        )?;
        Ok(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: None,
        })
    }

    /// `len` bytes (rounded up to the granularity) from the VMM API, with the GPUDirect RDMA
    /// flag set as GDRCopy requires, mapped read-write for this GPU.
    pub fn new_vmm(ctx: &Context, len: usize) -> Result<DeviceAlloc, CopyError> {
        ctx.bind()?;
        let device =
            i32::try_from(ctx.ordinal).map_err(|_| CopyError::Invalid("ordinal".into()))?;
        // SAFETY: an all-zero CUmemAllocationProp is a valid starting value (plain C struct).
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        prop.allocFlags.gpuDirectRDMACapable = 1;
        let mut gran: usize = 0;
        check(
            // SAFETY: valid pointers.
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &raw mut gran,
                    &raw const prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            },
            "cuMemGetAllocationGranularity",
        )?;
        let size = len.div_ceil(gran.max(1)) * gran.max(1);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: valid pointers; size is a granularity multiple.
            unsafe { sys::cuMemCreate(&raw mut handle, size, &raw const prop, 0) },
            "cuMemCreate",
        )?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { sys::cuMemAddressReserve(&raw mut ptr, size, gran, 0, 0) };
        if let Err(e) = check(rc, "cuMemAddressReserve") {
            // SAFETY: created above, released once.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let undo = |ptr, handle| {
            // SAFETY: reserved and created above; released once on this error path.
            unsafe {
                sys::cuMemUnmap(ptr, size);
                sys::cuMemAddressFree(ptr, size);
                sys::cuMemRelease(handle);
            }
        };
        if let Err(e) = check(
            // SAFETY: the reservation and handle have the same size.
            unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) },
            "cuMemMap",
        ) {
            undo(ptr, handle);
            return Err(e);
        }
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        if let Err(e) = check(
            // SAFETY: one valid descriptor for the mapped range.
            unsafe { sys::cuMemSetAccess(ptr, size, &raw const access, 1) },
            "cuMemSetAccess",
        ) {
            undo(ptr, handle);
            return Err(e);
        }
        Ok(DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: Some(VmmParts {
                handle,
                reserved: size,
            }),
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        match &self.vmm {
            // SAFETY: allocated by cuMemAlloc, freed once.
            None => unsafe {
                sys::cuMemFree_v2(self.ptr);
            },
            // SAFETY: mapped, reserved and created in new_vmm; torn down once in reverse order.
            Some(v) => unsafe {
                sys::cuMemUnmap(self.ptr, v.reserved);
                sys::cuMemAddressFree(self.ptr, v.reserved);
                sys::cuMemRelease(v.handle);
            },
        }
    }
}

/// Exports `[addr, addr+len)` as a dma-buf fd (CUDA 11.7+ drivers).
pub fn dmabuf_export(ctx: &Context, addr: u64, len: usize) -> Result<i32, CopyError> {
    ctx.bind()?;
    let mut fd: i32 = -1;
    check(
        // SAFETY: the handle type DMA_BUF_FD writes an int fd into the out-pointer.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&raw mut fd).cast(),
                addr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
        "cuMemGetHandleForAddressRange(DMA_BUF_FD)",
    )?;
    Ok(fd)
}

/// `mmap(fd)` shared read-write; returns the mapping or the errno.
pub fn mmap_fd(fd: i32, len: usize) -> Result<*mut u8, std::io::Error> {
    // SAFETY: a fresh mapping at a kernel-chosen address; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// A PROT_NONE anonymous reservation: any load or store through it faults.
pub fn mmap_none(len: usize) -> Result<*mut u8, std::io::Error> {
    // SAFETY: a fresh anonymous reservation at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Unmaps a mapping made by [`mmap_fd`] or [`mmap_none`].
///
/// # Safety
/// `p..p+len` must be a mapping this crate made and nothing may use it afterwards.
pub unsafe fn munmap(p: *mut u8, len: usize) {
    // SAFETY: forwarded to the caller's contract.
    unsafe { libc::munmap(p.cast(), len) };
}

/// Closes a file descriptor this crate owns.
pub fn close_fd(fd: i32) {
    // SAFETY: the fd came from dmabuf_export and is closed once.
    unsafe { libc::close(fd) };
}

/// Compiles CUDA C++ to a CUBIN for `arch` (e.g. `sm_90`) through NVRTC.
pub fn nvrtc_compile(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, CopyError> {
    use cudarc::nvrtc::sys as n;
    if !nvrtc_present() {
        return Err(CopyError::Compile(
            "NVRTC not found: install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib directory on LD_LIBRARY_PATH".into(),
        ));
    }
    let nul = |_| CopyError::Compile("NUL byte in source or option".into());
    let src = CString::new(source).map_err(nul)?;
    let cname = CString::new(name).map_err(nul)?;
    let ok = |rc: n::nvrtcResult, call: &str| {
        if rc == n::nvrtcResult::NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(CopyError::Compile(format!("{call} returned {rc:?}")))
        }
    };
    let mut prog: n::nvrtcProgram = std::ptr::null_mut();
    ok(
        // SAFETY: live C strings; no headers.
        unsafe {
            n::nvrtcCreateProgram(
                &raw mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let result = (|| {
        let opts = [
            CString::new(format!("--gpu-architecture={arch}")).map_err(nul)?,
            CString::new("-std=c++17").map_err(nul)?,
        ];
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `ptrs` holds live C strings for the call.
        let rc = unsafe { n::nvrtcCompileProgram(prog, 2, ptrs.as_ptr()) };
        if rc != n::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            // SAFETY: valid program and out-pointer.
            unsafe { n::nvrtcGetProgramLogSize(prog, &raw mut size) };
            let mut log = vec![0u8; size.max(1)];
            // SAFETY: `log` has the size NVRTC reported.
            unsafe { n::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) };
            return Err(CopyError::Compile(format!(
                "{name} for {arch}: {rc:?}\n{}",
                String::from_utf8_lossy(&log).trim_end_matches('\0')
            )));
        }
        let mut size = 0usize;
        ok(
            // SAFETY: compiled program, valid out-pointer.
            unsafe { n::nvrtcGetCUBINSize(prog, &raw mut size) },
            "nvrtcGetCUBINSize",
        )?;
        if size == 0 {
            return Err(CopyError::Compile(format!(
                "no CUBIN for {arch}: give a real sm_XY"
            )));
        }
        let mut cubin = vec![0u8; size];
        ok(
            // SAFETY: `cubin` has the reported size.
            unsafe { n::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) },
            "nvrtcGetCUBIN",
        )?;
        Ok(cubin)
    })();
    // SAFETY: created above, destroyed once.
    unsafe { n::nvrtcDestroyProgram(&raw mut prog) };
    result
}

/// `Some(memory type)` when `p` is page-locked host memory known to CUDA, `None` for pageable.
pub fn host_memory_type(p: *const u8) -> Option<u32> {
    let mut t: u32 = 0;
    // SAFETY: out-pointer of type unsigned int; the driver only inspects the address.
    let rc = unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut t).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p as sys::CUdeviceptr,
        )
    };
    (rc == sys::CUresult::CUDA_SUCCESS && t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32)
        .then_some(t)
}
