//! Rust errors as Python exceptions: `strata.StrataError` (every failure, with the Rust
//! message) and its subclass `strata.NoCudaDriverError` (GPU calls on a machine without a CUDA
//! driver) and `strata.InvalidArgumentError` (bad sizes, ranges, specs and options).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use strata::{Error, Status};

create_exception!(
    strata,
    StrataError,
    PyException,
    "A Strata call failed; the message says why and what to do."
);
create_exception!(
    strata,
    NoCudaDriverError,
    StrataError,
    "No CUDA driver (libcuda.so) on this machine: GPU spaces need an NVIDIA GPU and driver."
);
create_exception!(
    strata,
    InvalidArgumentError,
    StrataError,
    "A bad argument: a size, range, store or codec spec, or option Strata refuses."
);

/// Converts a library error into the matching Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.status() {
        Status::NoDriver => NoCudaDriverError::new_err(msg),
        Status::Invalid | Status::Config | Status::Range => InvalidArgumentError::new_err(msg),
        _ => StrataError::new_err(msg),
    }
}

/// Shorthand for mapping anything convertible into the library error.
pub(crate) fn py_err(e: impl Into<Error>) -> PyErr {
    to_py(e.into())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("StrataError", py.get_type::<StrataError>())?;
    m.add("NoCudaDriverError", py.get_type::<NoCudaDriverError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    Ok(())
}
