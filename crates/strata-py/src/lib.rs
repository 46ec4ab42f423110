//! The `strata._strata` extension module behind the `strata` Python package: pager regions
//! ([`region`]), GPU spaces ([`space`]) and kernels launched on any stream ([`kernels`]), and errors as Python exceptions carrying
//! the Rust message ([`errors`]). The NumPy-facing API is Python (`python/strata/`).
#![warn(missing_docs)]

mod errors;
mod kernels;
mod region;
mod space;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// What this machine offers Strata: version, userfaultfd, CUDA driver, NVRTC.
#[pyfunction]
fn info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    match strata_pager::probe::probe() {
        Ok(u) => {
            d.set_item("userfaultfd", true)?;
            d.set_item("userfaultfd_write_protect", u.write_protect())?;
            d.set_item("userfaultfd_kernel_faults", u.kernel_faults)?;
        }
        Err(e) => {
            d.set_item("userfaultfd", false)?;
            d.set_item("userfaultfd_error", e.to_string())?;
        }
    }
    d.set_item("cuda_driver", strata_gpu::probe::driver_present())?;
    d.set_item("nvrtc", strata_gpu::probe::nvrtc_present())?;
    let gpus = py.detach(strata_gpu::probe::gpus);
    match gpus {
        Ok(list) => {
            let names: Vec<String> = list.iter().map(|g| g.name.clone()).collect();
            d.set_item("gpus", names)?;
        }
        Err(e) => {
            d.set_item("gpus", Vec::<String>::new())?;
            d.set_item("gpu_error", e)?;
        }
    }
    Ok(d)
}

/// Compiles CUDA source that may `#include "strata.cuh"` for `arch` (e.g. `"sm_90"`) with
/// NVRTC, through the disk cache, and returns the CUBIN: checks a kernel source on a machine
/// without a GPU (NVRTC only). Compile errors raise `StrataError` with NVRTC's log.
#[pyfunction]
#[pyo3(signature = (source, name = "kernel.cu", arch = "sm_90", options = Vec::new()))]
fn nvrtc_compile<'py>(
    py: Python<'py>,
    source: &str,
    name: &str,
    arch: &str,
    options: Vec<String>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let (cubin, _) = py
        .detach(|| strata_gpu::nvrtc::compile_cached(source, name, arch, &options))
        .map_err(|e| errors::py_err(strata_gpu::SpaceError::from(e)))?;
    Ok(pyo3::types::PyBytes::new(py, &cubin))
}

#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_compile, m)?)?;
    errors::register(m)?;
    m.add_class::<region::PyRegion>()?;
    m.add_class::<space::PySpace>()?;
    m.add_class::<kernels::PyKernelModule>()?;
    Ok(())
}
