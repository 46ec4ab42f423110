//! The raw CUDA driver calls of the Python package, all in one place: loading a compiled
//! module, finding its kernels, occupancy, and launching on a stream the caller names (a
//! PyTorch or CuPy stream handle), which `strata_gpu`'s launcher cannot take (it launches on
//! its own streams only).

use std::ffi::{CString, c_void};

use cudarc::driver::sys;
use strata_gpu::driver::DriverError;

fn check(code: sys::CUresult, call: &'static str) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(DriverError::Call {
        call,
        code,
        message: format!("{code:?}"),
        hint: match code {
            sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
                ": the stream handle is not a live stream of this GPU's context"
            }
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                ": check the launch geometry (threads per block at most 1024)"
            }
            _ => "",
        },
    })
}

/// A module loaded into the current context (the GPU's primary context: the caller binds it).
#[derive(Debug)]
pub(crate) struct RawModule(sys::CUmodule);

// SAFETY: a module handle is context-wide and may be used from any thread with that context
// current; the owner (`PyKernelModule`) binds the context before every call.
unsafe impl Send for RawModule {}
// SAFETY: as above; the driver serialises calls on one module internally.
unsafe impl Sync for RawModule {}

/// A kernel of a [`RawModule`] (valid while the module is loaded).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawFunction(sys::CUfunction);

// SAFETY: function handles are context-wide; the module that owns it outlives every use (the
// owner keeps both together).
unsafe impl Send for RawFunction {}
// SAFETY: as above.
unsafe impl Sync for RawFunction {}

impl RawModule {
    /// Loads a CUBIN into the current context.
    pub(crate) fn load(cubin: &[u8]) -> Result<Self, DriverError> {
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // cuModuleLoadData wants a NUL-terminated image for PTX; a CUBIN is read by its own
        // header, but a trailing zero is harmless and keeps both safe.
        let mut image = cubin.to_vec();
        image.push(0);
        check(
            // SAFETY: `image` is a valid image for the call's duration; valid out-pointer; the
            // caller made the GPU's context current.
            unsafe { sys::cuModuleLoadData(&raw mut module, image.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        Ok(RawModule(module))
    }

    /// The `extern "C"` kernel `name`.
    pub(crate) fn function(&self, name: &str) -> Result<RawFunction, DriverError> {
        let cname = CString::new(name).map_err(|_| DriverError::NoSuchKernel(name.into()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (self alive); valid out-pointer and C string.
        let rc = unsafe { sys::cuModuleGetFunction(&raw mut f, self.0, cname.as_ptr()) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(DriverError::NoSuchKernel(name.into()));
        }
        check(rc, "cuModuleGetFunction")?;
        Ok(RawFunction(f))
    }

    /// Unloads the module. The caller first waits for every kernel of it (context sync).
    pub(crate) fn unload(&mut self) {
        if !self.0.is_null() {
            // SAFETY: loaded by us, unloaded once (nulled below); the caller synchronised the
            // context, so no queued launch still names one of its kernels.
            unsafe {
                sys::cuModuleUnload(self.0);
            }
            self.0 = std::ptr::null_mut();
        }
    }
}

impl RawFunction {
    /// Blocks of `threads` threads resident on one multiprocessor at once.
    pub(crate) fn blocks_per_sm(self, threads: u32) -> Result<u32, DriverError> {
        let mut n: i32 = 0;
        let threads = i32::try_from(threads).unwrap_or(i32::MAX);
        check(
            // SAFETY: a live function handle; valid out-pointer.
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&raw mut n, self.0, threads, 0)
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(u32::try_from(n).unwrap_or(0).max(1))
    }

    /// Queues the kernel on `stream` (a raw `CUstream`; 0 is the legacy default stream).
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a live slot laid out as
    /// that parameter, and `stream` must be a live stream of the current context (or 0).
    pub(crate) unsafe fn launch(
        self,
        blocks: u32,
        threads: u32,
        params: &mut [*mut c_void],
        stream: u64,
    ) -> Result<(), DriverError> {
        check(
            // SAFETY: the caller guarantees the parameters and the stream (function contract);
            // the driver copies the parameters before returning.
            unsafe {
                sys::cuLaunchKernel(
                    self.0,
                    blocks.max(1),
                    1,
                    1,
                    threads.max(1),
                    1,
                    1,
                    0,
                    raw_stream(stream),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

/// Waits for `stream` (a raw handle of the current context; 0 the legacy default stream).
pub(crate) fn synchronize_stream(stream: u64) -> Result<(), DriverError> {
    check(
        // SAFETY: the caller passes a live stream of the current context (or 0).
        unsafe { sys::cuStreamSynchronize(raw_stream(stream)) },
        "cuStreamSynchronize",
    )
}

/// A stream handle from its integer value (as PyTorch's `cuda_stream` gives it).
fn raw_stream(stream: u64) -> sys::CUstream {
    std::ptr::with_exposed_provenance_mut(usize::try_from(stream).unwrap_or(usize::MAX))
}
