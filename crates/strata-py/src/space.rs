//! `strata._strata.Space` and `KernelModule`: GPU spaces (create, fill from and read into host
//! memory, prefetch, evict, flush, statistics, the 72-byte `StrataSpace` handle) and user
//! kernels compiled with NVRTC and launched with arguments from Python ([`crate::kernels`]).
//! One `Strata` runtime per GPU is shared by every space and module on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use strata::gpu::{CSpaceOptions, space_options};
use strata_core::StoreConfig;
use strata_gpu::{Space, Strata};

use crate::errors::{InvalidArgumentError, py_err};
use crate::kernels::PyKernelModule;

/// How long a warp may wait for a page of a space over a store (Strata's default is 4 s).
const STORE_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The runtime of GPU `ordinal`, opened (and Strata's kernels loaded) at first use.
fn runtime(ordinal: usize) -> Result<Arc<Strata>, strata::Error> {
    static RUNTIMES: OnceLock<Mutex<HashMap<usize, Arc<Strata>>>> = OnceLock::new();
    let mut map = RUNTIMES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = map.get(&ordinal) {
        return Ok(Arc::clone(s));
    }
    let s = Arc::new(Strata::new(ordinal)?);
    map.insert(ordinal, Arc::clone(&s));
    Ok(s)
}

fn element_code(dtype: &str) -> PyResult<u32> {
    Ok(match dtype {
        "int32" | "i32" => 0,
        "uint32" | "u32" => 1,
        "int64" | "i64" => 2,
        "uint64" | "u64" => 3,
        "float32" | "f32" => 4,
        "float64" | "f64" => 5,
        other => {
            return Err(InvalidArgumentError::new_err(format!(
                "element type {other:?} is not supported: use int32, uint32, int64, uint64, float32 or float64"
            )));
        }
    })
}

/// A GPU space: a byte range larger than GPU memory, paged by the GPU.
#[derive(Debug)]
#[pyclass(module = "strata._strata", name = "Space", frozen, subclass)]
pub struct PySpace {
    space: Mutex<Space>,
    pub(crate) runtime: Arc<Strata>,
}

impl PySpace {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Space> {
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PySpace {
    /// Creates a zero-filled space of `size` bytes on GPU `device`: over pinned host memory,
    /// or with `store` (`memory`, `file:PATH`, `remote:HOST:PORT[,...]` with `token`) over
    /// that store, through a pinned host cache of `host_cache_bytes`. `remote_access`: how
    /// pages not resident are reached (`"auto"`, `"off"`, or a number of accesses after
    /// which a page migrates; default: `STRATA_GPU_REMOTE_ACCESS`, else auto).
    /// `sector_bytes`: sub-page fetch (a size such as 4096 or `"4KiB"`, or `"off"`; default:
    /// `STRATA_GPU_SECTOR`, else whole pages). `read_only`: kernels' writes are refused.
    #[new]
    #[pyo3(signature = (size, page_size = 65536, cache_bytes = 1 << 30, dtype = "uint64",
                        policy = "clock", protected_fraction = 0.5, read_through = false,
                        device = 0, store = None, token = None, host_cache_bytes = None,
                        remote_access = None, sector_bytes = None, read_only = false))]
    #[allow(clippy::too_many_arguments)] // mirrors the keyword arguments Python callers see
    fn new(
        py: Python<'_>,
        size: u64,
        page_size: u64,
        cache_bytes: u64,
        dtype: &str,
        policy: &str,
        protected_fraction: f64,
        read_through: bool,
        device: usize,
        store: Option<&str>,
        token: Option<String>,
        host_cache_bytes: Option<u64>,
        remote_access: Option<&Bound<'_, PyAny>>,
        sector_bytes: Option<&Bound<'_, PyAny>>,
        read_only: bool,
    ) -> PyResult<Self> {
        let policy = match policy {
            "clock" => 0,
            "scan-resistant" | "scan_resistant" => 1,
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "eviction policy {other:?} is unknown: use \"clock\" or \"scan-resistant\""
                )));
            }
        };
        let mut options = space_options(&CSpaceOptions {
            page_size,
            cache_bytes,
            element: element_code(dtype)?,
            policy,
            protected_fraction,
            read_through: u32::from(read_through),
        })
        .map_err(py_err)?;
        // Numbers and strings alike ("auto", 16, "4KiB", 4096), checked before the GPU is
        // touched.
        if let Some(v) = remote_access {
            options.remote_access =
                strata_gpu::space::parse_remote_access(&v.str()?.to_cow()?).map_err(invalid)?;
        }
        if let Some(v) = sector_bytes {
            options.sector_bytes =
                strata_gpu::space::parse_sector(&v.str()?.to_cow()?).map_err(invalid)?;
        }
        // The store's spec is checked before the GPU is touched.
        let store_config = store
            .map(|spec| -> Result<StoreConfig, strata::Error> {
                let mut config = StoreConfig::builder().kind(spec.parse()?).grow(true);
                if let Some(t) = token {
                    config = config.token(t);
                }
                Ok(config.build()?)
            })
            .transpose()
            .map_err(py_err)?;
        let (space, runtime) = py
            .detach(|| -> Result<_, strata::Error> {
                let rt = runtime(device)?;
                let space = match store_config {
                    None => rt.space(size, &options)?,
                    Some(config) => {
                        let store = strata_net::open_store_with_page(&config, size, page_size)?;
                        options.host_cache_bytes = host_cache_bytes;
                        let space = rt.space_over_store(store, size, &options)?;
                        // Host threads serve a store's faults, far slower than a warp copies
                        // pinned memory: thousands of concurrent faults may wait long.
                        space.set_wait_limit(STORE_WAIT_LIMIT)?;
                        space
                    }
                };
                let mut space = space;
                if read_only {
                    space.set_read_only(true)?;
                }
                Ok((space, rt))
            })
            .map_err(py_err)?;
        Ok(PySpace {
            space: Mutex::new(space),
            runtime,
        })
    }

    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.lock().size()
    }

    /// Page size in bytes.
    #[getter]
    fn page_size(&self) -> u64 {
        self.lock().page_size()
    }

    /// Frames in the GPU page cache.
    #[getter]
    fn frames(&self) -> u32 {
        self.lock().frames()
    }

    /// The `StrataSpace` handle kernels take by value: 96 bytes, as in `strata.cuh`.
    fn handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let space = self.lock();
        let h = space.handle();
        let mut b = Vec::with_capacity(96);
        for w in [
            h.page_table,
            h.frames,
            h.frame_data,
            h.host,
            h.counters,
            h.size_bytes,
            h.pages,
        ] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        for w in [h.frame_count, h.page_shift, h.policy, h.protected_quota] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.extend_from_slice(&h.ring.to_ne_bytes());
        for w in [h.tier, h.migrate_after] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.extend_from_slice(&h.peer.to_ne_bytes());
        PyBytes::new(py, &b)
    }

    /// Copies `nbytes` from host address `address` into the space at `offset`. Internal:
    /// `strata.Space.fill` passes a NumPy array's buffer, which it keeps alive for the call.
    fn _fill_from_address(
        &self,
        py: Python<'_>,
        offset: u64,
        address: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        if !host_buffer_given(address, nbytes)? {
            return Ok(());
        }
        // SAFETY: the Python wrapper passes the data pointer and byte length of a C-contiguous
        // NumPy array it holds a reference to for the whole call.
        let data = unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) };
        py.detach(|| self.lock().fill_from_slice(offset, data))
            .map_err(py_err)
    }

    /// Copies `nbytes` of the space at `offset` to host address `address` (dirty pages are
    /// flushed first). Internal: `strata.Space.read` passes a writable NumPy array's buffer.
    fn _read_to_address(
        &self,
        py: Python<'_>,
        offset: u64,
        address: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        if !host_buffer_given(address, nbytes)? {
            return Ok(());
        }
        // SAFETY: the Python wrapper passes the data pointer and byte length of a writable
        // C-contiguous NumPy array it holds a reference to for the whole call.
        let out = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) };
        py.detach(|| self.lock().read_back(offset, out))
            .map_err(py_err)
    }

    /// Zeroes the whole space.
    fn fill_zero(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().fill_zero()).map_err(py_err)
    }

    /// Brings the pages of `[offset, offset+length)` into the GPU cache.
    fn prefetch(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        let end = checked_end(offset, length)?;
        py.detach(|| self.lock().prefetch(offset..end))
            .map_err(py_err)
    }

    /// Drops the pages of `[offset, offset+length)` from the GPU cache (dirty ones written
    /// back).
    fn evict(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        let end = checked_end(offset, length)?;
        py.detach(|| self.lock().evict(offset..end)).map_err(py_err)
    }

    /// Writes every dirty cached page back to the host copy.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().flush()).map_err(py_err)
    }

    /// Raises if a kernel accessed an element outside the space.
    fn check_errors(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().check_errors()).map_err(py_err)
    }

    /// The space's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.lock().stats()).map_err(py_err)?;
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("faults", s.faults)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("writebacks", s.writebacks)?;
        d.set_item("prefetched", s.prefetched)?;
        d.set_item("bytes_in", s.bytes_in)?;
        d.set_item("bytes_out", s.bytes_out)?;
        d.set_item("fault_ns_total", s.fault_ns_total)?;
        d.set_item("fault_ns_max", s.fault_ns_max)?;
        Ok(d)
    }

    /// Zeroes the counters.
    fn reset_stats(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.lock().reset_stats()).map_err(py_err)
    }

    /// Compiles CUDA source that may `#include "strata.cuh"` for this space's GPU (NVRTC,
    /// cached on disk). Compile errors raise `StrataError` with NVRTC's log.
    #[pyo3(signature = (source, name = "kernel.cu", options = Vec::new()))]
    fn compile(
        &self,
        py: Python<'_>,
        source: &str,
        name: &str,
        options: Vec<String>,
    ) -> PyResult<PyKernelModule> {
        PyKernelModule::compile(py, &self.runtime, source, name, &options)
    }
}

/// Whether a host buffer of `nbytes` at `address` needs copying: false for an empty one, an
/// error for a null address with bytes.
/// A bad option value, as Python's InvalidArgumentError with the library's advice.
fn invalid(e: strata_gpu::SpaceError) -> PyErr {
    InvalidArgumentError::new_err(e.to_string())
}

fn host_buffer_given(address: usize, nbytes: usize) -> PyResult<bool> {
    match (address, nbytes) {
        (_, 0) => Ok(false),
        (0, _) => Err(InvalidArgumentError::new_err("address is NULL")),
        _ => Ok(true),
    }
}

fn checked_end(offset: u64, length: u64) -> PyResult<u64> {
    offset
        .checked_add(length)
        .ok_or_else(|| InvalidArgumentError::new_err(format!("range {offset}+{length} overflows")))
}
