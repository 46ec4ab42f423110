//! Microsecond CPU<->GPU small copies on a stock NVIDIA driver, with no kernel module.
//!
//! GDRCopy gives the CPU a write-combined mapping of GPU memory through its `gdrdrv` module.
//! Strata picks a backend at run time ([`Copier::report`]):
//! 1. **dma-buf mmap**: a true CPU mapping of device memory, where the driver allows it
//!    (`cuMemGetHandleForAddressRange` + `mmap`; drivers up to 595 refuse it for discrete GPUs
//!    with ENOTSUPP, and we fall back).
//! 2. **the copy service** (the kernel-free default): a one-block persistent GPU kernel on its
//!    own stream polls a doorbell ring in write-combined pinned host memory ([`ring`]) and
//!    moves payloads between pinned staging memory and device memory; payloads up to 240 bytes
//!    travel inline in the doorbell slot. Large copies use the copy engine, through pinned
//!    staging filled by several host threads (`staged_engine`).
//!
//! `/dev/gdrdrv` is detected and reported, but this build does not drive it.
//!
//! Ordering guarantees are listed in [`copier`]. The C library `libstrata_gdr.so` (crate
//! `strata-gdr`, header `gdr/include/gdrapi.h`) offers the same service behind GDRCopy's API.

pub mod copier;
pub mod error;
pub mod ring;
pub mod service;
mod stage_workers;
mod staged_engine;
pub mod sys;

pub use copier::{Backend, BackendReport, Copier, CopyConfig, Mapping, Pinned};
pub use error::CopyError;
pub use service::ServiceConfig;

/// What `strata info` prints about small copies on GPU `ordinal`: the backend that would be
/// chosen and why, or why none can be.
pub fn probe(ordinal: usize) -> Result<BackendReport, String> {
    Copier::open(ordinal)
        .map(|c| c.report().clone())
        .map_err(|e| e.to_string())
}
