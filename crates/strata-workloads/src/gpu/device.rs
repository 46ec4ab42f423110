//! GPU plumbing the workloads need beyond `strata-gpu`'s API: CUDA managed memory for the UVM
//! baseline, a whole-context synchronisation, and the workloads' error type.
//!
//! Why a context-wide sync: Strata orders its work on a non-blocking stream, while the driver's
//! synchronous copies and memsets run on the legacy default stream, which a non-blocking
//! stream does not wait for. After a bulk upload we wait for the whole context before any
//! kernel may read the data; small state is set by kernels on Strata's stream instead.

use std::sync::Arc;

use cudarc::driver::sys;
use strata_gpu::SpaceError;
use strata_gpu::driver::{DriverError, Gpu};

/// Errors of the GPU workloads.
#[derive(Debug, thiserror::Error)]
pub enum GpuWorkloadError {
    /// The Strata runtime failed.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// A driver call through `strata-gpu` failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A driver call made here failed.
    #[error("CUDA call {call} failed with {code:?}{hint}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// Its result.
        code: sys::CUresult,
        /// What to do.
        hint: &'static str,
    },
    /// Data does not fit where it was asked to go.
    #[error("{what} needs {need} but only {free} of GPU memory is free: {advice}")]
    DoesNotFit {
        /// What was being placed.
        what: String,
        /// Bytes needed (formatted).
        need: String,
        /// Bytes free (formatted).
        free: String,
        /// What to do.
        advice: &'static str,
    },
    /// Bad parameters.
    #[error("{0}")]
    Invalid(String),
    /// A GPU result failed validation.
    #[error("GPU result is wrong: {0}")]
    Validation(String),
}

fn check(code: sys::CUresult, call: &'static str) -> Result<(), GpuWorkloadError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let hint = if code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        ": free GPU memory or use a smaller size"
    } else {
        ""
    };
    Err(GpuWorkloadError::Cuda { call, code, hint })
}

/// Waits for all work in the GPU's context (every stream, the legacy one included).
///
/// # Errors
/// A failed kernel or copy surfaces here.
pub fn context_sync(gpu: &Gpu) -> Result<(), GpuWorkloadError> {
    gpu.bind()?;
    // SAFETY: the context is current on this thread (bind); the call takes no pointers.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Memory kept free beyond a managed or device allocation (kernels, modules, other users).
pub const HEADROOM: u64 = 1 << 30;

/// Fails unless `bytes` plus [`HEADROOM`] fit in the GPU's free memory now.
///
/// # Errors
/// [`GpuWorkloadError::DoesNotFit`].
pub fn ensure_fits(
    gpu: &Gpu,
    bytes: u64,
    what: &str,
    advice: &'static str,
) -> Result<(), GpuWorkloadError> {
    let (free, _) = gpu.mem_info()?;
    if bytes + HEADROOM > free {
        return Err(GpuWorkloadError::DoesNotFit {
            what: what.to_string(),
            need: strata_core::format_size(bytes + HEADROOM),
            free: strata_core::format_size(free),
            advice,
        });
    }
    Ok(())
}

/// CUDA managed (UVM) memory. Created only when it fits in free GPU memory: oversubscribed
/// managed memory can hang a shared GPU, so this type refuses to do it.
#[derive(Debug)]
pub struct ManagedBuffer {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the allocation is owned by this value; CUDA allows any thread with the context
// current (every method binds it) to use or free it.
unsafe impl Send for ManagedBuffer {}
// SAFETY: shared references only read the pointer value or hand out shared slices.
unsafe impl Sync for ManagedBuffer {}

impl ManagedBuffer {
    /// Allocates `len` bytes of managed memory (attached globally), zero-filled on the host.
    ///
    /// # Errors
    /// The data would not fit in free GPU memory, or the allocation failed.
    pub fn new(gpu: &Arc<Gpu>, len: usize) -> Result<Self, GpuWorkloadError> {
        ensure_fits(
            gpu,
            len as u64,
            "a managed (UVM) buffer",
            "UVM is measured only with data that fits, never oversubscribed",
        )?;
        gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current; flag 1 = CU_MEM_ATTACH_GLOBAL.
        let code = unsafe { sys::cuMemAllocManaged(&raw mut ptr, len.max(1), 1) };
        check(code, "cuMemAllocManaged")?;
        let mut buffer = Self {
            gpu: gpu.clone(),
            ptr,
            len,
        };
        buffer.as_mut_slice().fill(0);
        Ok(buffer)
    }

    /// The device (and host) address.
    #[must_use]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Host view of the bytes. Callers must not let a kernel run on the buffer meanwhile
    /// (`&mut self` and the synchronous kernels of this crate ensure it).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let addr = usize::try_from(self.ptr).expect("host addresses fit usize");
        // SAFETY: `ptr` is a managed allocation of `len` bytes, addressable from the host
        // (managed memory shares one address on host and device); `&mut self` makes the view
        // unique, and no kernel touches it while we hold it.
        unsafe {
            std::slice::from_raw_parts_mut(
                std::ptr::with_exposed_provenance_mut::<u8>(addr),
                self.len,
            )
        }
    }

    /// Moves every page back to host memory, so the next kernel pays UVM's first-touch
    /// migration again (each timed UVM run starts from the host, like Strata's cold runs).
    ///
    /// # Errors
    /// The prefetch failed.
    pub fn prefetch_to_host(&self) -> Result<(), GpuWorkloadError> {
        self.gpu.bind()?;
        let location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let stream = self.gpu.stream();
        // SAFETY: the range is this allocation; the stream belongs to the current context.
        let code = unsafe { sys::cuMemPrefetchAsync_v2(self.ptr, self.len, location, 0, stream) };
        check(code, "cuMemPrefetchAsync")?;
        self.gpu.synchronize()?;
        Ok(())
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAllocManaged and is freed exactly once.
            unsafe {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}
