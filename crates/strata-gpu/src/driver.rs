//! A thin safe layer over the CUDA driver calls Strata needs (cudarc's `sys` bindings, loaded at
//! run time): the GPU handle, device and pinned host buffers, events, module loading and
//! launching. Everything unsafe about the driver lives here.

use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{CudaContext, sys};

/// A failed CUDA driver call.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// libcuda could not be loaded.
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded): run on a machine with an NVIDIA GPU and driver"
    )]
    NoDriver,
    /// A driver call returned an error.
    #[error("CUDA call {call} failed: {code:?} ({message}){hint}")]
    Call {
        /// The driver function.
        call: &'static str,
        /// Its result code.
        code: sys::CUresult,
        /// The driver's description.
        message: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// A kernel name not found in a module.
    #[error(
        "kernel {0:?} is not in the module: declare it `extern \"C\" __global__` so its name is not mangled"
    )]
    NoSuchKernel(String),
}

pub(crate) fn check(code: sys::CUresult, call: &'static str) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString only writes a pointer to a static string into `text`.
    let message = unsafe {
        if sys::cuGetErrorString(code, &raw mut text) == sys::CUresult::CUDA_SUCCESS
            && !text.is_null()
        {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        } else {
            "unknown error".to_string()
        }
    };
    let hint = match code {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            ": ask for a smaller cache or space, or free GPU memory"
        }
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS | sys::CUresult::CUDA_ERROR_LAUNCH_FAILED => {
            ": a kernel accessed memory outside its buffers; the context is unusable, restart the process"
        }
        sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
            ": a stream or module handle is not live in this GPU's context (a foreign stream must belong to its primary context)"
        }
        sys::CUresult::CUDA_ERROR_INVALID_VALUE if call == "cuLaunchKernel" => {
            ": check the launch geometry (1 to 1024 threads per block)"
        }
        _ => "",
    };
    Err(DriverError::Call {
        call,
        code,
        message,
        hint,
    })
}

/// One GPU, its primary context and a stream that Strata's work is ordered on.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Multiprocessors.
    pub multiprocessors: u32,
    /// Device name.
    pub name: String,
    /// Work queued beside kernels launched with a space's handle, by the space's key.
    companions: Mutex<Vec<(u64, Weak<dyn LaunchCompanion>)>>,
}

/// Work a space queues beside every kernel launched with its handle (its background
/// write-back): called after the kernel was queued on `stream`.
pub(crate) trait LaunchCompanion: Send + Sync + std::fmt::Debug {
    /// Queues the companion work and, on `stream` after the kernel, what ends it.
    fn after_launch(&self, stream: sys::CUstream);
}

// SAFETY: the stream handle is only used with the context made current on the calling thread
// (`bind`), and CUDA streams may be used from any thread.
unsafe impl Send for Gpu {}
// SAFETY: as above; the driver serialises calls on one stream internally.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens GPU `ordinal` (its primary context, shared with other libraries in the process).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, DriverError> {
        if !crate::probe::driver_present() {
            return Err(DriverError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| DriverError::Call {
            call: "cuDevicePrimaryCtxRetain",
            code: e.0,
            message: e.to_string(),
            hint: "",
        })?;
        ctx.bind_to_thread().map_err(|e| DriverError::Call {
            call: "cuCtxSetCurrent",
            code: e.0,
            message: e.to_string(),
            hint: "",
        })?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        check(
            // SAFETY: the context is current; `stream` is a valid out-pointer.
            unsafe {
                sys::cuStreamCreate(
                    &raw mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        use sys::CUdevice_attribute as A;
        let attr = |a| {
            ctx.attribute(a).map_err(|e| DriverError::Call {
                call: "cuDeviceGetAttribute",
                code: e.0,
                message: e.to_string(),
                hint: "",
            })
        };
        let compute_capability = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let multiprocessors =
            u32::try_from(attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?).unwrap_or(1);
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            compute_capability,
            multiprocessors,
            name,
            companions: Mutex::new(Vec::new()),
        }))
    }

    /// Runs `companion` beside every later launch whose arguments carry `key` (a space's).
    pub(crate) fn add_companion(&self, key: u64, companion: Weak<dyn LaunchCompanion>) {
        let mut list = self
            .companions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        list.retain(|(_, c)| c.strong_count() > 0);
        list.push((key, companion));
    }

    /// Stops running the companion of `key`.
    pub(crate) fn remove_companion(&self, key: u64) {
        self.companions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(k, c)| *k != key && c.strong_count() > 0);
    }

    fn companions_of(&self, keys: &[u64]) -> Vec<Arc<dyn LaunchCompanion>> {
        let list = self
            .companions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<Arc<dyn LaunchCompanion>> = Vec::new();
        for (k, c) in list.iter() {
            if keys.contains(k)
                && let Some(c) = c.upgrade()
            {
                out.push(c);
            }
        }
        out
    }

    /// The GPU's ordinal (CUDA device number).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), DriverError> {
        check(
            // SAFETY: the context handle is alive as long as `self.ctx`.
            unsafe { sys::cuCtxSetCurrent(self.ctx.cu_ctx()) },
            "cuCtxSetCurrent",
        )
    }

    /// The stream Strata orders its work on.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Free and total GPU memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), DriverError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        check(
            // SAFETY: valid out-pointers; context current.
            unsafe { sys::cuMemGetInfo_v2(&raw mut free, &raw mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free as u64, total as u64))
    }

    /// Waits for everything queued on Strata's stream.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.bind()?;
        check(
            // SAFETY: the stream belongs to this context and is alive.
            unsafe { sys::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )
    }

    /// Waits for everything queued in this GPU's context, on every stream: Strata's own, other
    /// Strata handles' (they share the primary context) and users' streams. The ordering point
    /// of host maintenance (flush, evict, prefetch, read-back) and of freeing a space.
    pub fn synchronize_context(&self) -> Result<(), DriverError> {
        self.bind()?;
        check(
            // SAFETY: the context is current on this thread (bind above) and alive (self.ctx).
            unsafe { sys::cuCtxSynchronize() },
            "cuCtxSynchronize",
        )
    }

    /// Lets kernels in this GPU's context read and write `peer`'s device memory (over NVLink
    /// or PCIe peer-to-peer), by the pointers `peer`'s allocations already have. Enabling
    /// twice is not an error. Fails where the two GPUs cannot reach each other (see
    /// `probe::gpus()`'s `peers`).
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: this context is current (bind above); `peer.ctx` is a live context; flags
        // must be 0.
        let code = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        if code == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(code, "cuCtxEnablePeerAccess")
    }

    /// `sm_XY` for NVRTC.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: the stream was created by us in this context and is destroyed once.
            unsafe {
                sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}

/// Memory of neighbour GPUs mapped for one GPU's kernels (CUDA virtual memory management):
/// chunks created on each lender, mapped side by side into one reserved address range, lenders
/// taking turns chunk by chunk, with read/write access granted to the borrower for this range
/// only (no context-wide peer access). Unmapped and released on drop.
#[derive(Debug)]
pub struct BorrowedMemory {
    borrower: Arc<Gpu>,
    /// The lenders' primary contexts, kept alive while their memory is mapped.
    _lenders: Vec<Arc<Gpu>>,
    base: sys::CUdeviceptr,
    bytes: usize,
    mapped: usize,
    handles: Vec<sys::CUmemGenericAllocationHandle>,
}

// SAFETY: the range and handles are plain driver identifiers, valid from any thread.
unsafe impl Send for BorrowedMemory {}
// SAFETY: as above; nothing is mutated after construction.
unsafe impl Sync for BorrowedMemory {}

fn device_allocation(ordinal: usize) -> sys::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is plain data; all-zero is its documented "no flags" value.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = i32::try_from(ordinal).unwrap_or(i32::MAX);
    prop
}

/// The allocation granularity for `prop` (2 MiB on current GPUs).
fn allocation_granularity(prop: &sys::CUmemAllocationProp) -> Result<usize, DriverError> {
    let mut granularity = 0usize;
    check(
        // SAFETY: valid out-pointer and property.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &raw mut granularity,
                prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(granularity)
}

impl BorrowedMemory {
    /// Borrows `chunks` chunks of `chunk` bytes from each `(lender ordinal, chunks)` for
    /// `borrower`'s kernels.
    ///
    /// # Errors
    /// A lender that does not exist, is the borrower, cannot be reached from it, has too little
    /// free memory, or a chunk size that is not a multiple of the lender's granularity.
    pub fn new(
        borrower: &Arc<Gpu>,
        lenders: &[(usize, usize)],
        chunk: usize,
    ) -> Result<Self, DriverError> {
        borrower.bind()?;
        let mut count = 0i32;
        check(
            // SAFETY: valid out-pointer; the driver is initialised (a context exists).
            unsafe { sys::cuDeviceGetCount(&raw mut count) },
            "cuDeviceGetCount",
        )?;
        let mut gpus = Vec::new();
        for &(ordinal, _) in lenders {
            let refuse = |why: String| DriverError::Call {
                call: "cuMemCreate",
                code: sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
                message: why,
                hint: "",
            };
            if i32::try_from(ordinal).map_or(true, |o| o >= count) {
                return Err(refuse(format!(
                    "GPU {ordinal} does not exist (this machine has {count}): name a neighbour GPU that does"
                )));
            }
            if ordinal == borrower.ordinal() {
                return Err(refuse(format!(
                    "GPU {ordinal} is the space's own GPU: borrow from a neighbour"
                )));
            }
            let lender = Gpu::open(ordinal)?;
            let mut can = 0i32;
            check(
                // SAFETY: both devices are valid; valid out-pointer.
                unsafe {
                    sys::cuDeviceCanAccessPeer(
                        &raw mut can,
                        borrower.ctx.cu_device(),
                        lender.ctx.cu_device(),
                    )
                },
                "cuDeviceCanAccessPeer",
            )?;
            if can == 0 {
                return Err(refuse(format!(
                    "GPU {} cannot reach GPU {ordinal}'s memory (no NVLink or PCIe peer path): borrow from a GPU that `strata info` lists as a peer",
                    borrower.ordinal()
                )));
            }
            let granularity = allocation_granularity(&device_allocation(ordinal))?;
            if granularity == 0 || !chunk.is_multiple_of(granularity) {
                return Err(refuse(format!(
                    "chunks of {chunk} bytes are not a multiple of GPU {ordinal}'s allocation granularity ({granularity})"
                )));
            }
            gpus.push(lender);
        }
        let total_chunks: usize = lenders.iter().map(|&(_, n)| n).sum();
        let bytes = total_chunks * chunk;
        let mut base: sys::CUdeviceptr = 0;
        borrower.bind()?;
        check(
            // SAFETY: valid out-pointer; size is a multiple of the granularity checked above.
            unsafe { sys::cuMemAddressReserve(&raw mut base, bytes, chunk, 0, 0) },
            "cuMemAddressReserve",
        )?;
        let mut me = BorrowedMemory {
            borrower: borrower.clone(),
            _lenders: gpus,
            base,
            bytes,
            mapped: 0,
            handles: Vec::new(),
        };
        // Lenders take turns chunk by chunk, so consecutive slots spread over every link.
        let mut left: Vec<usize> = lenders.iter().map(|&(_, n)| n).collect();
        while me.mapped < bytes {
            for (i, &(ordinal, _)) in lenders.iter().enumerate() {
                if left[i] == 0 {
                    continue;
                }
                left[i] -= 1;
                let prop = device_allocation(ordinal);
                let mut handle: sys::CUmemGenericAllocationHandle = 0;
                check(
                    // SAFETY: valid out-pointer and property; `chunk` is a granularity multiple.
                    unsafe { sys::cuMemCreate(&raw mut handle, chunk, &raw const prop, 0) },
                    "cuMemCreate",
                )?;
                me.handles.push(handle);
                check(
                    // SAFETY: [base + mapped, + chunk) lies inside the reserved range and is unmapped;
                    // `handle` is a fresh allocation of exactly `chunk` bytes.
                    unsafe { sys::cuMemMap(base + me.mapped as u64, chunk, 0, handle, 0) },
                    "cuMemMap",
                )?;
                me.mapped += chunk;
            }
        }
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::try_from(borrower.ordinal()).unwrap_or(i32::MAX),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        check(
            // SAFETY: the whole range is mapped (above); one valid descriptor.
            unsafe { sys::cuMemSetAccess(base, bytes, &raw const access, 1) },
            "cuMemSetAccess",
        )?;
        Ok(me)
    }

    /// The range's device address (as the borrower sees it).
    pub fn ptr(&self) -> u64 {
        self.base
    }

    /// Bytes borrowed.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Never empty (at least one chunk).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for BorrowedMemory {
    fn drop(&mut self) {
        if self.borrower.bind().is_err() {
            return;
        }
        // SAFETY: every mapped byte was mapped by us (prefix of the range), the handles are
        // ours and released once, the range was reserved by us and is freed once.
        unsafe {
            if self.mapped > 0 {
                sys::cuMemUnmap(self.base, self.mapped);
            }
            for &h in &self.handles {
                sys::cuMemRelease(h);
            }
            sys::cuMemAddressFree(self.base, self.bytes);
        }
    }
}

/// Refuses a VMM request with a message saying what to do.
fn vmm_refusal(call: &'static str, message: String) -> DriverError {
    DriverError::Call {
        call,
        code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        message,
        hint: "",
    }
}

fn access_for(gpu: &Gpu) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: i32::try_from(gpu.ordinal()).unwrap_or(i32::MAX),
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// A chunk of a GPU's memory created to be lent to another process (inter-job harvesting):
/// a VMM allocation that can be exported as a POSIX file descriptor. It is not mapped in this
/// process (unmapping 2 MiB at a time costs tens of microseconds a chunk, which a reclaim
/// would pay); [`LendableChunk::fill_u32`] maps it for the moment it writes. Its memory is
/// freed once this value is dropped, every exported descriptor is closed and every importer
/// has released it.
#[derive(Debug)]
pub struct LendableChunk {
    gpu: Arc<Gpu>,
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
}

// SAFETY: the handle and range are plain driver identifiers, valid from any thread (every
// call binds the context first).
unsafe impl Send for LendableChunk {}
// SAFETY: as above; nothing is mutated after construction.
unsafe impl Sync for LendableChunk {}

impl LendableChunk {
    /// The chunk size granularity of `gpu` for exportable memory (2 MiB on current GPUs).
    ///
    /// # Errors
    /// The driver call failed.
    pub fn granularity(gpu: &Gpu) -> Result<usize, DriverError> {
        gpu.bind()?;
        allocation_granularity(&Self::prop(gpu))
    }

    fn prop(gpu: &Gpu) -> sys::CUmemAllocationProp {
        let mut prop = device_allocation(gpu.ordinal());
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop
    }

    /// Creates a chunk of `bytes` (a multiple of [`LendableChunk::granularity`]) on `gpu`.
    ///
    /// # Errors
    /// A size that is not a granularity multiple, or the GPU is out of memory.
    pub fn create(gpu: &Arc<Gpu>, bytes: usize) -> Result<Self, DriverError> {
        let granularity = Self::granularity(gpu)?;
        if bytes == 0 || granularity == 0 || !bytes.is_multiple_of(granularity) {
            return Err(vmm_refusal(
                "cuMemCreate",
                format!(
                    "a lent chunk must be a positive multiple of {granularity} bytes, not {bytes}"
                ),
            ));
        }
        let prop = Self::prop(gpu);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: valid out-pointer and property; `bytes` is a granularity multiple.
            unsafe { sys::cuMemCreate(&raw mut handle, bytes, &raw const prop, 0) },
            "cuMemCreate",
        )?;
        Ok(LendableChunk {
            gpu: gpu.clone(),
            handle,
            bytes,
        })
    }

    /// Exports the chunk as a new POSIX file descriptor (close it once it has been sent on:
    /// an open descriptor keeps the memory allocated).
    ///
    /// # Errors
    /// The driver refused (e.g. a driver without POSIX descriptor support).
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd, DriverError> {
        use std::os::fd::FromRawFd;
        self.gpu.bind()?;
        let mut fd: std::ffi::c_int = -1;
        check(
            // SAFETY: for POSIX_FILE_DESCRIPTOR the out-pointer receives an int; `handle` is a
            // live allocation created with that handle type requested.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&raw mut fd).cast(),
                    self.handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            "cuMemExportToShareableHandle",
        )?;
        if fd < 0 {
            return Err(vmm_refusal(
                "cuMemExportToShareableHandle",
                "the driver returned no descriptor".into(),
            ));
        }
        // SAFETY: the driver just opened `fd` for us; nobody else owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Sets every 32-bit word of the chunk to `value`: maps it in this process, fills it on
    /// the GPU's stream, waits, and unmaps it again.
    ///
    /// # Errors
    /// A driver call failed (the chunk is unmapped again whatever happened).
    pub fn fill_u32(&self, value: u32) -> Result<(), DriverError> {
        let granularity = Self::granularity(&self.gpu)?;
        let mut base: sys::CUdeviceptr = 0;
        check(
            // SAFETY: valid out-pointer; size and alignment are granularity multiples.
            unsafe { sys::cuMemAddressReserve(&raw mut base, self.bytes, granularity, 0, 0) },
            "cuMemAddressReserve",
        )?;
        let access = access_for(&self.gpu);
        let result = check(
            // SAFETY: [base, +bytes) is a fresh reservation of exactly the allocation's size.
            unsafe { sys::cuMemMap(base, self.bytes, 0, self.handle, 0) },
            "cuMemMap",
        )
        .and_then(|()| {
            let filled = check(
                // SAFETY: the range is mapped (above); one valid descriptor.
                unsafe { sys::cuMemSetAccess(base, self.bytes, &raw const access, 1) },
                "cuMemSetAccess",
            )
            .and_then(|()| {
                check(
                    // SAFETY: [base, +bytes) is mapped read/write for this GPU.
                    unsafe { sys::cuMemsetD32Async(base, value, self.bytes / 4, self.gpu.stream) },
                    "cuMemsetD32Async",
                )
            })
            .and_then(|()| self.gpu.synchronize());
            // SAFETY: mapped just above; the memset was waited for (or never queued).
            unsafe { sys::cuMemUnmap(base, self.bytes) };
            filled
        });
        // SAFETY: reserved above by us, nothing mapped in it any more.
        unsafe { sys::cuMemAddressFree(base, self.bytes) };
        result
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for LendableChunk {
    fn drop(&mut self) {
        if self.gpu.bind().is_err() {
            return;
        }
        // SAFETY: the handle is ours and released once.
        unsafe { sys::cuMemRelease(self.handle) };
    }
}

/// A window of chunks borrowed from other processes, for one GPU's kernels: one reserved
/// address range of `capacity` chunk slots; a chunk received as a descriptor is imported and
/// mapped into a free slot with read/write access for this GPU only, and unmapped again when
/// it is revoked. Slots do not move, so device code can address slot `i` at
/// `ptr() + i * chunk_bytes()` for the window's life.
#[derive(Debug)]
pub struct PeerWindow {
    gpu: Arc<Gpu>,
    base: sys::CUdeviceptr,
    chunk: usize,
    slots: Vec<Option<sys::CUmemGenericAllocationHandle>>,
}

// SAFETY: plain driver identifiers, valid from any thread (every call binds the context).
unsafe impl Send for PeerWindow {}
// SAFETY: shared use only reads; mapping and unmapping take `&mut self`.
unsafe impl Sync for PeerWindow {}

impl PeerWindow {
    /// Reserves room for `capacity` chunks of `chunk` bytes on `gpu` (address space only).
    ///
    /// # Errors
    /// A zero capacity, a chunk size that is not a granularity multiple, or no address space.
    pub fn reserve(gpu: &Arc<Gpu>, capacity: usize, chunk: usize) -> Result<Self, DriverError> {
        let granularity = LendableChunk::granularity(gpu)?;
        if capacity == 0 || chunk == 0 || !chunk.is_multiple_of(granularity) {
            return Err(vmm_refusal(
                "cuMemAddressReserve",
                format!(
                    "a peer window needs at least one chunk of a multiple of {granularity} bytes (asked {capacity} x {chunk})"
                ),
            ));
        }
        let bytes = capacity.checked_mul(chunk).ok_or_else(|| {
            vmm_refusal(
                "cuMemAddressReserve",
                format!("{capacity} chunks of {chunk} bytes overflow"),
            )
        })?;
        let mut base: sys::CUdeviceptr = 0;
        check(
            // SAFETY: valid out-pointer; size and alignment are granularity multiples.
            unsafe { sys::cuMemAddressReserve(&raw mut base, bytes, chunk, 0, 0) },
            "cuMemAddressReserve",
        )?;
        Ok(PeerWindow {
            gpu: gpu.clone(),
            base,
            chunk,
            slots: vec![None; capacity],
        })
    }

    /// Imports the chunk behind `fd` (exported by another process with
    /// [`LendableChunk::export_fd`]) and maps it into a free slot; returns the slot. The
    /// descriptor may be closed afterwards.
    ///
    /// # Errors
    /// No free slot, a chunk of another size, or the driver refused the import (e.g. the
    /// lender's GPU cannot be reached from this one).
    pub fn map(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> Result<usize, DriverError> {
        use std::os::fd::AsRawFd;
        let slot = self.slots.iter().position(Option::is_none).ok_or_else(|| {
            vmm_refusal(
                "cuMemMap",
                format!(
                    "all {} slots of the peer window are in use: reserve a larger window",
                    self.slots.len()
                ),
            )
        })?;
        self.gpu.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // An open descriptor is never negative.
        let raw = usize::try_from(fd.as_raw_fd()).unwrap_or_default();
        check(
            // SAFETY: for POSIX_FILE_DESCRIPTOR the "pointer" argument carries the descriptor
            // number itself; `fd` is open for the whole call (borrowed).
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &raw mut handle,
                    std::ptr::without_provenance_mut::<c_void>(raw),
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        let at = self.slot_ptr(slot);
        let mapped = check(
            // SAFETY: slot `slot` lies inside our reservation and is unmapped; a chunk of another
            // size is refused by the driver (the mapping must cover the whole allocation).
            unsafe { sys::cuMemMap(at, self.chunk, 0, handle, 0) },
            "cuMemMap",
        );
        if let Err(e) = mapped {
            // SAFETY: the imported handle is ours and not mapped.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let access = access_for(&self.gpu);
        let granted = check(
            // SAFETY: the slot is mapped (above); one valid descriptor for this GPU only.
            unsafe { sys::cuMemSetAccess(at, self.chunk, &raw const access, 1) },
            "cuMemSetAccess",
        );
        if let Err(e) = granted {
            // SAFETY: mapped just above by us; the handle is ours.
            unsafe {
                sys::cuMemUnmap(at, self.chunk);
                sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.slots[slot] = Some(handle);
        Ok(slot)
    }

    /// Unmaps slot `slot` and releases its chunk. Nothing may access the slot any more
    /// (device code must have been told, and must have stopped, before).
    ///
    /// # Errors
    /// The slot holds no chunk, or the driver call failed (the slot then stays mapped).
    pub fn unmap(&mut self, slot: usize) -> Result<(), DriverError> {
        let handle = self
            .slots
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| {
                vmm_refusal(
                    "cuMemUnmap",
                    format!("peer window slot {slot} holds no chunk"),
                )
            })?;
        self.gpu.bind()?;
        let at = self.slot_ptr(slot);
        let unmapped = check(
            // SAFETY: the slot was mapped by `map` with exactly `chunk` bytes.
            unsafe { sys::cuMemUnmap(at, self.chunk) },
            "cuMemUnmap",
        );
        if unmapped.is_err() {
            // Still mapped: keep it (and its handle) so nothing maps over it.
            self.slots[slot] = Some(handle);
            return unmapped;
        }
        // SAFETY: the imported handle is ours and released once (it was taken out above).
        unsafe { sys::cuMemRelease(handle) };
        Ok(())
    }

    /// Unmaps and releases several slots, with one `cuMemUnmap` per run of adjacent slots
    /// (each unmap call costs tens of microseconds however much it covers). Nothing may access
    /// them any more.
    ///
    /// # Errors
    /// A slot that holds no chunk (nothing is unmapped then), or the driver failed.
    pub fn unmap_many(&mut self, slots: &[usize]) -> Result<(), DriverError> {
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if let Some(&bad) = sorted
            .iter()
            .find(|&&s| !self.slots.get(s).is_some_and(Option::is_some))
        {
            return Err(vmm_refusal(
                "cuMemUnmap",
                format!("peer window slot {bad} holds no chunk"),
            ));
        }
        self.gpu.bind()?;
        let mut first_error: Result<(), DriverError> = Ok(());
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
                j += 1;
            }
            let run = &sorted[i..j];
            let together = check(
                // SAFETY: slots `run` are adjacent and each was mapped by `map` with exactly
                // `chunk` bytes, so the range covers whole mappings only.
                unsafe { sys::cuMemUnmap(self.slot_ptr(run[0]), run.len() * self.chunk) },
                "cuMemUnmap",
            );
            if together.is_ok() {
                for &slot in run {
                    if let Some(handle) = self.slots[slot].take() {
                        // SAFETY: unmapped above; the imported handle is ours, released once.
                        unsafe { sys::cuMemRelease(handle) };
                    }
                }
            } else {
                // One by one, keeping any slot that will not unmap.
                for &slot in run {
                    let one = self.unmap(slot);
                    if first_error.is_ok() {
                        first_error = one;
                    }
                }
            }
            i = j;
        }
        first_error
    }

    /// Copies `dst.len()` bytes at `offset` of slot `slot` to the host (checks and tests).
    ///
    /// # Errors
    /// The slot holds no chunk or the range exceeds it.
    pub fn read(&self, slot: usize, offset: usize, dst: &mut [u8]) -> Result<(), DriverError> {
        if !self.slots.get(slot).is_some_and(Option::is_some)
            || offset
                .checked_add(dst.len())
                .is_none_or(|end| end > self.chunk)
        {
            return Err(vmm_refusal(
                "cuMemcpyDtoH",
                format!("slot {slot}, bytes {offset}+{} are not mapped", dst.len()),
            ));
        }
        self.gpu.bind()?;
        check(
            // SAFETY: the source range lies inside a mapped slot readable by this GPU; `dst` is
            // a host buffer of exactly that length; the synchronous copy ends before return.
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    dst.as_mut_ptr().cast(),
                    self.slot_ptr(slot) + offset as u64,
                    dst.len(),
                )
            },
            "cuMemcpyDtoH",
        )
    }

    /// Device address of the window.
    pub fn ptr(&self) -> u64 {
        self.base
    }

    /// Device address of slot `slot`.
    pub fn slot_ptr(&self, slot: usize) -> u64 {
        self.base + (slot * self.chunk) as u64
    }

    /// Chunk size.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding a chunk.
    pub fn mapped(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

impl Drop for PeerWindow {
    fn drop(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                let _ = self.unmap(slot);
            }
        }
        if self.gpu.bind().is_ok() {
            // SAFETY: the whole reservation is ours, unmapped above, and freed once.
            unsafe { sys::cuMemAddressFree(self.base, self.slots.len() * self.chunk) };
        }
    }
}

/// A stream another library created in a GPU's primary context (PyTorch's or CuPy's), by its
/// raw handle; 0 is the legacy default stream. Strata never destroys it.
#[derive(Debug, Clone, Copy)]
pub struct ForeignStream(sys::CUstream);

// SAFETY: a stream handle may be used from any thread once its context is current there;
// every use binds the GPU's context first.
unsafe impl Send for ForeignStream {}
// SAFETY: as above.
unsafe impl Sync for ForeignStream {}

impl ForeignStream {
    /// The stream whose handle is `handle` (as `torch.cuda.current_stream().cuda_stream`
    /// gives it).
    ///
    /// # Safety
    /// `handle` is 0 or a live stream of the primary context of the GPU it is used with, and
    /// stays alive while work queued on it through this value runs.
    pub unsafe fn from_raw(handle: u64) -> Self {
        ForeignStream(std::ptr::with_exposed_provenance_mut(
            usize::try_from(handle).unwrap_or(usize::MAX),
        ))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self, gpu: &Gpu) -> Result<(), DriverError> {
        gpu.bind()?;
        check(
            // SAFETY: a live stream of this context (from_raw's contract), or 0.
            unsafe { sys::cuStreamSynchronize(self.0) },
            "cuStreamSynchronize",
        )
    }
}

/// An extra stream on a GPU (for overlapping copies with kernels), destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    gpu: Arc<Gpu>,
    raw: sys::CUstream,
}

// SAFETY: a CUDA stream may be used from any thread once its context is current there, and
// every method binds the context first (or is called by code that did).
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises work queued on one stream from several threads.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self, DriverError> {
        gpu.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let rc =
            // SAFETY: the context is current; `raw` is a valid out-pointer.
            unsafe { sys::cuStreamCreate(&raw mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
        check(rc, "cuStreamCreate")?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }
    /// A new non-blocking stream of the highest priority the GPU offers: its kernels get
    /// multiprocessors as soon as any are free, ahead of work queued on ordinary streams.
    pub fn new_high_priority(gpu: &Arc<Gpu>) -> Result<Self, DriverError> {
        gpu.bind()?;
        let (mut least, mut greatest) = (0i32, 0i32);
        check(
            // SAFETY: the context is current; valid out-pointers.
            unsafe { sys::cuCtxGetStreamPriorityRange(&raw mut least, &raw mut greatest) },
            "cuCtxGetStreamPriorityRange",
        )?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        check(
            // SAFETY: the context is current; `raw` is a valid out-pointer; `greatest` is a
            // priority the driver just reported.
            unsafe {
                sys::cuStreamCreateWithPriority(
                    &raw mut raw,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                    greatest,
                )
            },
            "cuStreamCreateWithPriority",
        )?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }
    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }
    /// Copies `bytes` from host address `src` to device address `dst`, queued on this stream.
    ///
    /// # Safety
    /// `src` must be valid for `bytes` bytes until the copy completes (pinned memory for a truly
    /// asynchronous copy), and `dst..dst+bytes` must be device memory the caller owns.
    pub unsafe fn copy_htod(
        &self,
        dst: u64,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller guarantees both ranges (function contract).
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, self.raw) },
            "cuMemcpyHtoDAsync",
        )
    }
    /// Copies `bytes` from device address `src` to host address `dst`, queued on this stream.
    ///
    /// # Safety
    /// As [`Stream::copy_htod`], with the directions swapped.
    pub unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller guarantees both ranges (function contract).
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, self.raw) },
            "cuMemcpyDtoHAsync",
        )
    }
    /// Waits for the stream.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: stream alive.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created by us, destroyed once.
            unsafe {
                sys::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

/// GPU memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) of GPU memory, zeroed.
    pub fn zeroed(gpu: &Arc<Gpu>, bytes: usize) -> Result<Self, DriverError> {
        gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        check(
            // SAFETY: valid out-pointer; context current.
            unsafe { sys::cuMemAlloc_v2(&raw mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        let buf = DeviceBuffer {
            gpu: gpu.clone(),
            ptr,
            bytes,
        };
        buf.fill_bytes(0)?;
        Ok(buf)
    }

    /// Sets every byte to `value`. Ordered on Strata's stream (which does not synchronise with
    /// the legacy default stream) and waited for.
    pub fn fill_bytes(&self, value: u8) -> Result<(), DriverError> {
        self.gpu.bind()?;
        check(
            // SAFETY: `ptr` points at `bytes` bytes we own; the stream is alive.
            unsafe { sys::cuMemsetD8Async(self.ptr, value, self.bytes, self.gpu.stream) },
            "cuMemsetD8Async",
        )?;
        self.gpu.synchronize()
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies `src` into the buffer at byte `offset`, ordered after earlier work on Strata's
    /// stream; returns when done.
    pub fn upload<T: Copy>(&self, offset: usize, src: &[T]) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(src);
        assert!(
            offset + bytes <= self.bytes,
            "upload past the end of a device buffer"
        );
        // Earlier kernels on Strata's stream may still use the buffer: wait for them first.
        self.gpu.synchronize()?;
        let dst = self.ptr + offset as u64;
        check(
            // SAFETY: the range lies inside our allocation (asserted); `src` is valid for `bytes`
            // until the synchronisation below.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), bytes, self.gpu.stream) },
            "cuMemcpyHtoDAsync",
        )?;
        self.gpu.synchronize()
    }

    /// Copies from byte `offset` of the buffer into `dst`, after earlier work on Strata's stream;
    /// returns when done.
    pub fn download<T: Copy>(&self, offset: usize, dst: &mut [T]) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(dst);
        assert!(
            offset + bytes <= self.bytes,
            "download past the end of a device buffer"
        );
        self.gpu.bind()?;
        let src = self.ptr + offset as u64;
        check(
            // SAFETY: the range lies inside our allocation; `dst` is valid for writes of `bytes`
            // until the synchronisation below. Queued behind earlier kernels on the stream.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, bytes, self.gpu.stream)
            },
            "cuMemcpyDtoHAsync",
        )?;
        self.gpu.synchronize()
    }
}

impl DeviceBuffer {
    /// [`DeviceBuffer::download`] through pinned host memory: the copy is one DMA into
    /// `staging` (no bounce through a driver buffer, as a copy into pageable memory takes),
    /// then a CPU copy into `dst`. For small reads on a latency path (the device counters
    /// after each kernel). `staging` must hold at least `dst`'s bytes.
    pub fn download_via<T: Copy>(
        &self,
        offset: usize,
        dst: &mut [T],
        staging: &mut MappedHostBuffer,
    ) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(dst);
        assert!(
            offset + bytes <= self.bytes,
            "download past the end of a device buffer"
        );
        assert!(
            bytes <= staging.bytes,
            "staging buffer smaller than the read"
        );
        self.gpu.bind()?;
        check(
            // SAFETY: the source range lies inside our allocation and the destination inside
            // `staging` (both checked above); `staging` is borrowed mutably until the
            // synchronisation below, so nothing else reads or writes it meanwhile.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    staging.host.cast(),
                    self.ptr + offset as u64,
                    bytes,
                    self.gpu.stream,
                )
            },
            "cuMemcpyDtoHAsync",
        )?;
        self.gpu.synchronize()?;
        // SAFETY: the copy above finished (stream synchronised) and wrote `bytes` bytes at
        // `staging.host`; `dst` is valid for `bytes` bytes of writes and does not overlap the
        // pinned buffer we own. `T: Copy` is plain data, the bytes came from a buffer of `T`s.
        unsafe {
            std::ptr::copy_nonoverlapping(staging.host, dst.as_mut_ptr().cast::<u8>(), bytes);
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            unsafe {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// Pinned host memory mapped into the GPU's address space (`cuMemHostAlloc` with DEVICEMAP):
/// kernels read and write it directly over PCIe.
#[derive(Debug)]
pub struct MappedHostBuffer {
    gpu: Arc<Gpu>,
    host: *mut u8,
    device: sys::CUdeviceptr,
    bytes: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through &/&mut self.
unsafe impl Send for MappedHostBuffer {}
// SAFETY: shared access only reads through `as_slice`.
unsafe impl Sync for MappedHostBuffer {}

impl MappedHostBuffer {
    /// Allocates `bytes` of pinned, mapped host memory.
    pub fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<Self, DriverError> {
        gpu.bind()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer; context current.
            unsafe {
                sys::cuMemHostAlloc(
                    &raw mut host,
                    bytes.max(1),
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            },
            "cuMemHostAlloc",
        )?;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&raw mut device, host, 0) };
        if let Err(e) = check(rc, "cuMemHostGetDevicePointer") {
            // SAFETY: freeing what we just allocated.
            unsafe {
                sys::cuMemFreeHost(host);
            }
            return Err(e);
        }
        Ok(MappedHostBuffer {
            gpu: gpu.clone(),
            host: host.cast(),
            device,
            bytes,
        })
    }

    /// The device address kernels use.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The bytes, for the CPU.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `host` points at `bytes` bytes we own for our lifetime.
        unsafe { std::slice::from_raw_parts(self.host, self.bytes) }
    }

    /// The bytes, for the CPU to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes) }
    }

    /// Host address.
    pub fn host_ptr(&self) -> *const u8 {
        self.host
    }

    /// Host address for writes by asynchronous copies (the caller orders them).
    pub fn host_mut_ptr(&self) -> *mut u8 {
        self.host
    }
}

impl Drop for MappedHostBuffer {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `host` came from cuMemHostAlloc and is freed once.
            unsafe {
                sys::cuMemFreeHost(self.host.cast());
            }
        }
    }
}

/// A loaded module (CUBIN). Its kernels ([`Function`]) keep it loaded: it is unloaded when
/// the module and every function taken from it are dropped.
#[derive(Debug)]
pub struct Module {
    loaded: Arc<LoadedModule>,
}

/// The driver's module handle, unloaded on drop (shared by a [`Module`] and its functions).
#[derive(Debug)]
struct LoadedModule {
    gpu: Arc<Gpu>,
    module: sys::CUmodule,
}

// SAFETY: module handles are context-wide and usable from any thread with the context current.
unsafe impl Send for LoadedModule {}
// SAFETY: as above.
unsafe impl Sync for LoadedModule {}

impl Module {
    /// Loads a CUBIN image.
    pub fn load(gpu: &Arc<Gpu>, image: &[u8]) -> Result<Self, DriverError> {
        gpu.bind()?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: `image` is a complete CUBIN produced by NVRTC for this device.
            unsafe { sys::cuModuleLoadData(&raw mut module, image.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        Ok(Module {
            loaded: Arc::new(LoadedModule {
                gpu: gpu.clone(),
                module,
            }),
        })
    }

    /// Looks up an `extern "C"` kernel.
    pub fn function(&self, name: &str) -> Result<Function, DriverError> {
        self.loaded.gpu.bind()?;
        let cname = CString::new(name).map_err(|_| DriverError::NoSuchKernel(name.into()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module alive; valid out-pointer and C string.
        let rc =
            unsafe { sys::cuModuleGetFunction(&raw mut f, self.loaded.module, cname.as_ptr()) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(DriverError::NoSuchKernel(name.into()));
        }
        check(rc, "cuModuleGetFunction")?;
        Ok(Function {
            gpu: self.loaded.gpu.clone(),
            _module: self.loaded.clone(),
            f,
            name: name.into(),
        })
    }
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // Kernels already queued from it must finish before it is unloaded.
        if self.gpu.synchronize_context().is_ok() {
            // SAFETY: loaded by us and unloaded once, when the last Module or Function holding
            // it is dropped, so no launch can name one of its functions afterwards.
            unsafe {
                sys::cuModuleUnload(self.module);
            }
        }
    }
}

/// A kernel in a loaded [`Module`]; it keeps the module loaded.
#[derive(Debug, Clone)]
pub struct Function {
    gpu: Arc<Gpu>,
    _module: Arc<LoadedModule>,
    f: sys::CUfunction,
    name: String,
}

// SAFETY: function handles are context-wide.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

/// A value that can be passed to a kernel by value: plain data with the layout the kernel
/// expects.
///
/// # Safety
/// The type must be `Copy`, hold no host references the kernel would follow, and match the
/// kernel parameter's C layout.
pub unsafe trait KernelParam: Copy {
    /// For a space's handle: the key of the work the space queues beside the kernel.
    #[doc(hidden)]
    fn companion_key(&self) -> Option<u64> {
        None
    }
}
// SAFETY: primitives have their C layout.
unsafe impl KernelParam for u32 {}
// SAFETY: as above.
unsafe impl KernelParam for i32 {}
// SAFETY: as above.
unsafe impl KernelParam for u64 {}
// SAFETY: as above.
unsafe impl KernelParam for i64 {}
// SAFETY: as above.
unsafe impl KernelParam for f32 {}
// SAFETY: as above.
unsafe impl KernelParam for f64 {}

/// Kernel arguments, in order.
#[derive(Debug, Default, Clone)]
pub struct Args {
    storage: Vec<Box<[u64]>>,
    /// Keys of the spaces whose handles are among the arguments.
    companions: Vec<u64>,
}

impl Args {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends one argument.
    pub fn arg<T: KernelParam>(mut self, value: T) -> Self {
        let words = std::mem::size_of::<T>().div_ceil(8).max(1);
        let mut slot = vec![0u64; words].into_boxed_slice();
        // SAFETY: `slot` has at least size_of::<T>() bytes and u64 alignment (>= T's for all
        // KernelParam types, which are at most 8-aligned).
        unsafe { std::ptr::write_unaligned(slot.as_mut_ptr().cast::<T>(), value) };
        self.storage.push(slot);
        if let Some(key) = value.companion_key() {
            self.companions.push(key);
        }
        self
    }

    /// Arguments whose launch queues nothing beside the kernel (Strata's own maintenance and
    /// write-back kernels).
    pub(crate) fn alone(mut self) -> Self {
        self.companions.clear();
        self
    }
}

/// Launch geometry.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    /// Blocks.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Blocks of `threads` that fit on one multiprocessor at once.
    pub fn blocks_per_sm(&self, threads: u32) -> Result<u32, DriverError> {
        self.gpu.bind()?;
        let mut n = 0i32;
        check(
            // SAFETY: valid function and out-pointer.
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &raw mut n,
                    self.f,
                    i32::try_from(threads).unwrap_or(i32::MAX),
                    0,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(u32::try_from(n).unwrap_or(0).max(1))
    }

    /// A grid that fills the GPU with resident blocks of `threads` (a persistent grid).
    pub fn full_grid(&self, threads: u32) -> Result<Grid, DriverError> {
        Ok(Grid {
            blocks: self.blocks_per_sm(threads)? * self.gpu.multiprocessors,
            threads,
        })
    }

    /// Queues the kernel on `stream` (Strata's stream when `None`). A space whose handle is
    /// among the arguments queues its background write-back beside it (see
    /// `SpaceOptions::background_write_back`).
    pub fn launch_on(
        &self,
        grid: Grid,
        args: &Args,
        stream: Option<&Stream>,
    ) -> Result<(), DriverError> {
        self.launch_with_companions(grid, args, stream.map_or(self.gpu.stream, Stream::raw))
    }

    /// Queues the kernel on a stream another library made in this GPU's context (PyTorch's
    /// current stream, CuPy's), with the same companions as [`Function::launch_on`].
    pub fn launch_on_foreign(
        &self,
        grid: Grid,
        args: &Args,
        stream: ForeignStream,
    ) -> Result<(), DriverError> {
        self.launch_with_companions(grid, args, stream.0)
    }

    fn launch_with_companions(
        &self,
        grid: Grid,
        args: &Args,
        raw: sys::CUstream,
    ) -> Result<(), DriverError> {
        self.launch_raw(grid, args, raw)?;
        if !args.companions.is_empty() {
            for companion in self.gpu.companions_of(&args.companions) {
                companion.after_launch(raw);
            }
        }
        Ok(())
    }

    /// Queues the kernel on a raw stream of this GPU's context, and nothing beside it.
    pub(crate) fn launch_raw(
        &self,
        grid: Grid,
        args: &Args,
        stream: sys::CUstream,
    ) -> Result<(), DriverError> {
        self.gpu.bind()?;
        let mut ptrs: Vec<*mut c_void> = args
            .storage
            .iter()
            .map(|s| s.as_ptr().cast_mut().cast::<c_void>())
            .collect();
        // SAFETY: every pointer in `ptrs` points at a live argument slot laid out as the
        // kernel parameter (KernelParam contract); the driver copies them before returning;
        // `stream` belongs to this GPU's context (callers' contract).
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.f,
                    grid.blocks.max(1),
                    1,
                    1,
                    grid.threads.max(1),
                    1,
                    1,
                    0,
                    stream,
                    ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }

    /// Queues the kernel on Strata's stream.
    pub fn launch(&self, grid: Grid, args: &Args) -> Result<(), DriverError> {
        self.launch_on(grid, args, None)
    }
}

/// A CUDA event for timing.
#[derive(Debug)]
pub struct Event {
    gpu: Arc<Gpu>,
    e: sys::CUevent,
}

impl Event {
    /// A timing event.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self, DriverError> {
        gpu.bind()?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer.
            unsafe { sys::cuEventCreate(&raw mut e, 0) },
            "cuEventCreate",
        )?;
        Ok(Event {
            gpu: gpu.clone(),
            e,
        })
    }
    /// Records on `stream` (Strata's when `None`).
    pub fn record(&self, stream: Option<&Stream>) -> Result<(), DriverError> {
        check(
            // SAFETY: event and stream alive.
            unsafe { sys::cuEventRecord(self.e, stream.map_or(self.gpu.stream, Stream::raw)) },
            "cuEventRecord",
        )
    }
    /// Makes `stream` wait for this event.
    pub fn wait_on(&self, stream: Option<&Stream>) -> Result<(), DriverError> {
        check(
            // SAFETY: event and stream alive.
            unsafe {
                sys::cuStreamWaitEvent(stream.map_or(self.gpu.stream, Stream::raw), self.e, 0)
            },
            "cuStreamWaitEvent",
        )
    }
    /// Milliseconds from `self` to `end`, waiting for `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        check(
            // SAFETY: both events alive.
            unsafe { sys::cuEventSynchronize(end.e) },
            "cuEventSynchronize",
        )?;
        let mut ms = 0f32;
        check(
            // SAFETY: valid out-pointer; both events recorded.
            unsafe { sys::cuEventElapsedTime_v2(&raw mut ms, self.e, end.e) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(self.e);
        }
    }
}

/// CUDA managed (UVM) memory, for baselines only. Never larger than free GPU memory: the
/// constructor refuses, since oversubscribed managed memory can hang a shared GPU.
#[derive(Debug)]
pub struct ManagedBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl ManagedBuffer {
    /// Allocates `bytes` of managed memory if at least `bytes + headroom` of GPU memory is free;
    /// `Ok(None)` otherwise.
    pub fn new_if_fits(
        gpu: &Arc<Gpu>,
        bytes: usize,
        headroom: u64,
    ) -> Result<Option<Self>, DriverError> {
        let (free, _) = gpu.mem_info()?;
        if bytes as u64 + headroom > free {
            return Ok(None);
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let rc =
            // SAFETY: valid out-pointer; context current (mem_info bound it).
            unsafe { sys::cuMemAllocManaged(&raw mut ptr, bytes.max(1), sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32) };
        check(rc, "cuMemAllocManaged")?;
        Ok(Some(ManagedBuffer {
            gpu: gpu.clone(),
            ptr,
            bytes,
        }))
    }
    /// The address (valid on host and device).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The bytes, for the CPU to write (pages migrate to the host on touch).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: managed memory is host-addressable at `ptr` for `bytes` bytes, owned by us;
        // no kernel runs on it while `&mut self` is held (callers synchronise first).
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.bytes) }
    }
    /// Moves every page back to host memory (queued on Strata's stream), so the next GPU touch
    /// pays UVM's first-touch faults again.
    pub fn prefetch_to_host(&self) -> Result<(), DriverError> {
        self.gpu.bind()?;
        let location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        // SAFETY: the range is our managed allocation; the stream is alive.
        let rc = unsafe {
            sys::cuMemPrefetchAsync_v2(self.ptr, self.bytes, location, 0, self.gpu.stream)
        };
        check(rc, "cuMemPrefetchAsync")
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: from cuMemAllocManaged, freed once.
            unsafe {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}
