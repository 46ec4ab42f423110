//! GPU plumbing the workloads need beyond `strata-gpu`'s API: a whole-context synchronisation,
//! a free-memory check, and the workloads' error type.
//!
//! Why a context-wide sync: Strata orders its work on a non-blocking stream, while the driver's
//! synchronous copies and memsets run on the legacy default stream, which a non-blocking
//! stream does not wait for. After a bulk upload we wait for the whole context before any
//! kernel may read the data; small state is set by kernels on Strata's stream instead.

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
