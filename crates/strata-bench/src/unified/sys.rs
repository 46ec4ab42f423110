//! The raw CUDA calls of the unified benchmark's managed-memory baseline: `cuMemAdvise` and
//! `cuMemPrefetchAsync` (the driver API's cudaMemAdvise / cudaMemPrefetchAsync).

use cudarc::driver::sys;
use strata_gpu::driver::Gpu;

/// Where a managed range should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Host memory.
    Host,
    /// The benchmark's GPU.
    Device,
}

fn location(gpu: &Gpu, side: Side) -> sys::CUmemLocation {
    match side {
        Side::Host => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        Side::Device => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: i32::try_from(gpu.ordinal()).unwrap_or(0),
        },
    }
}

fn check(rc: sys::CUresult, call: &str) -> anyhow::Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        anyhow::bail!("{call} failed: {rc:?}")
    }
}

/// `cuMemAdvise_v2(ptr, bytes, advice, side)` on a managed range.
pub(crate) fn advise(
    gpu: &Gpu,
    ptr: u64,
    bytes: usize,
    advice: sys::CUmem_advise,
    side: Side,
) -> anyhow::Result<()> {
    gpu.bind()?;
    // SAFETY: `ptr..ptr + bytes` is a managed allocation of the caller's, alive for the call;
    // advice only changes the driver's placement policy for it.
    check(
        unsafe { sys::cuMemAdvise_v2(ptr, bytes, advice, location(gpu, side)) },
        "cuMemAdvise",
    )
}

/// `cuMemPrefetchAsync_v2` of a managed range to `side` on the GPU's stream, then waits.
pub(crate) fn prefetch(gpu: &Gpu, ptr: u64, bytes: usize, side: Side) -> anyhow::Result<()> {
    gpu.bind()?;
    check(
        // SAFETY: as in `advise`; the stream is the GPU's own, alive as long as `gpu`.
        unsafe { sys::cuMemPrefetchAsync_v2(ptr, bytes, location(gpu, side), 0, gpu.stream()) },
        "cuMemPrefetchAsync",
    )?;
    gpu.synchronize()?;
    Ok(())
}
