//! `strata._strata.Region`: a pager region over any store, whose memory Python exposes as a
//! NumPy array (`strata.pager.array`). The array keeps this object alive through its base, and
//! this object keeps the mapping alive, so the memory outlives every view of it.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata::{RegionSpec, open_region};
use strata_pager::Region;

use crate::errors::py_err;

/// A pager region (CPU memory whose pages come from a store on demand).
#[derive(Debug)]
#[pyclass(module = "strata._strata", name = "Region", frozen)]
pub struct PyRegion {
    region: Region,
    spec: RegionSpec,
}

#[pymethods]
impl PyRegion {
    /// Opens a region of `size` bytes over `store` (`memory`, `file:PATH`,
    /// `remote:HOST:PORT[,...]`) with `codec` (`none`, `lz4`, `zfp:TOL`).
    #[new]
    #[pyo3(signature = (size, store = "memory", codec = "none", token = None, grow = true,
                        page_bytes = 0, buffer_bytes = 0, fillers = 0, evictors = 0))]
    #[allow(clippy::too_many_arguments)] // mirrors the keyword arguments Python callers see
    fn new(
        py: Python<'_>,
        size: u64,
        store: &str,
        codec: &str,
        token: Option<String>,
        grow: bool,
        page_bytes: u64,
        buffer_bytes: u64,
        fillers: usize,
        evictors: usize,
    ) -> PyResult<Self> {
        let spec = RegionSpec {
            store: store.to_string(),
            codec: codec.to_string(),
            token,
            grow,
            page_bytes,
            buffer_bytes,
            fillers,
            evictors,
        };
        // Opening may connect to memory nodes or read a file: let other threads run.
        let region = py.detach(|| open_region(size, &spec)).map_err(py_err)?;
        Ok(PyRegion { region, spec })
    }

    /// Address of the first byte.
    #[getter]
    fn address(&self) -> usize {
        self.region.as_ptr() as usize
    }

    /// Length in bytes.
    fn __len__(&self) -> usize {
        self.region.len()
    }

    /// Page size in bytes.
    #[getter]
    fn page_bytes(&self) -> u64 {
        self.region.config().page_bytes
    }

    /// The store spec the region was opened with.
    #[getter]
    fn store(&self) -> String {
        self.spec.store.clone()
    }

    /// The codec spec the region was opened with.
    #[getter]
    fn codec(&self) -> String {
        self.spec.codec.clone()
    }

    /// Writes every dirty page back and flushes the store.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.region.flush()).map_err(py_err)
    }

    /// Brings the pages of `[offset, offset+length)` in now; returns the pages read.
    fn prefetch(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<u64> {
        py.detach(|| self.region.prefetch(&[(offset, length)]))
            .map_err(py_err)
    }

    /// Drops the pages of `[offset, offset+length)` (dirty ones written back first); returns
    /// the pages dropped.
    fn evict(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<u64> {
        py.detach(|| self.region.evict(offset, length))
            .map_err(py_err)
    }

    /// The region's counters: faults, hits, evictions, writebacks, prefetched_pages, errors.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.region.stats();
        let d = PyDict::new(py);
        d.set_item("faults", s.faults)?;
        d.set_item("hits", s.hits)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("writebacks", s.writebacks)?;
        d.set_item("prefetched_pages", s.prefetched_pages)?;
        d.set_item("errors", s.errors)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Region(size={}, store={:?}, codec={:?}, page_bytes={})",
            self.region.len(),
            self.spec.store,
            self.spec.codec,
            self.region.config().page_bytes
        )
    }
}
