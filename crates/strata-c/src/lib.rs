//! Strata's C library, `libstrata.so`, declared by `include/strata.h`: GPU spaces (create,
//! fill, read back, prefetch, evict, flush, statistics, and the `StrataSpace` handle that
//! kernels built with nvcc and `strata.cuh` take by value) and pager regions over any store
//! (memory, file, remote, with codecs). Every call returns a status code (`STRATA_OK` or a
//! `STRATA_E_*`) and leaves a message in a thread-local last-error string
//! (`strata_last_error`). The Umap-compatible API stays in `libstrata_umap.so`.
//!
//! The Rust functions behind the C calls (`region::open_region`, `gpu::space_options`) are
//! public too, so other bindings (strata-py) open regions and spaces the same way.
#![warn(missing_docs)]

pub mod error;
pub mod gpu;
pub mod region;
pub mod unified;

pub use error::{Error, Status};
pub use region::{RegionSpec, open_region};

/// The library's version, NUL-terminated (`strata_version()`).
#[unsafe(no_mangle)]
pub extern "C" fn strata_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
