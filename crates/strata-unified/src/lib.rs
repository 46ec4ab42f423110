//! One allocation for CPU and GPU: [`Unified`] is a CPU slice/pointer and a GPU handle over
//! **one copy** of the data, GMEM's unified alloc/free in user space on NVIDIA GPUs.
//!
//! The data lives in the pinned host copy of a Strata GPU space: the CPU reads and writes it
//! directly (no fault, no copy), kernels reach it through the space's GPU page cache (frames
//! loaded on demand by the faulting warp, so the allocation may be larger than the cache).
//! Byte offsets are equal on both sides, and `strata/unified.cuh` translates CPU addresses
//! stored in the data (`strata::unified_offset`), so a pointer-linked structure the CPU built
//! is walked by a kernel as it is.
//!
//! # Coherence rules (like managed memory without concurrent access)
//! * Phases alternate. A **GPU phase** runs from [`Unified::sync_to_gpu`] to
//!   [`Unified::sync_to_cpu`]; kernels run only inside one, and the CPU neither reads nor
//!   writes the allocation then. Between them is a **CPU phase**. [`Unified::launch`] wraps
//!   one kernel in one GPU phase.
//! * `sync_to_gpu(range)` finds the pages the CPU wrote (see [`DirtyTracking`]) and frees
//!   their GPU copies **without** write-back; other pages keep their GPU copies. A page the CPU
//!   must hand over before a kernel has to be in a synced range (the launch helper syncs all).
//! * `sync_to_cpu(range)` writes the pages the GPU dirtied down into the host copy (only
//!   those); they stay cached, clean.
//! * A page both sides wrote between two syncs is a [`UnifiedError::Conflict`], detected at
//!   the next sync (always at `sync_to_gpu`; at `sync_to_cpu` whenever no page was written down
//!   during the kernels, i.e. always for data that fits the GPU cache). Nothing is changed then:
//!   [`Unified::discard`] keeps the CPU's bytes, [`Unified::sync_to_cpu_overwriting`] the GPU's.
//! * Read-mostly pages ([`Advice::ReadMostly`]) are never written back; a kernel write to one
//!   is dropped and reported ([`UnifiedError::ReadMostlyWritten`]; if the GPU cache was
//!   oversubscribed, eviction may have written it down already, and the error says so).
//!   The longest run of read-mostly pages is **replicated** whole in GPU memory at the next
//!   sync to the GPU when it fits (with 512 MiB to spare): kernels' element reads there are
//!   plain loads from the replica, no page-table lookup ([`Unified::replica`]); CPU reads go to
//!   the host copy; a sync copies up only the replica's pages the CPU wrote; changing the
//!   advice drops it at once. Take the handle again after each sync to the GPU.
//! * Page states and transitions: [`page_state`].
//!
//! # Costs
//! Only pages that changed move, in both directions. Finding the CPU's writes
//! ([`cpu_tracker`]): by default ([`DirtyTracking::WriteProtect`]) the host copy is
//! write-protected between syncs (userfaultfd, asynchronous mode), so the first CPU write to
//! each 4 KiB costs a minor fault (about 0.7 us) and a sync reads no data, only the kernel's
//! list of written pages (0.3 ms per GiB); pages rewritten wholesale become "hot" and are
//! hashed instead. While at least half the allocation is advised read-mostly, a handler
//! thread records the CPU's first write to each page as it happens instead (notified write
//! protection, [`write_log`]; [`UnifiedOptions::notified_writes`]), so a sync after CPU
//! phases that wrote nothing costs microseconds, not a page-table walk. DMA writes into the pointer are not seen (declare them). Where the kernel
//! lacks it (before Linux 6.7) it falls back to [`DirtyTracking::Hash`]: one hash pass over
//! the synced range per sync (about 16 ms per GiB on 16 cores).
//! [`DirtyTracking::Declared`] costs nothing but counts only writes named through
//! [`Unified::cpu_mut`] / [`Unified::mark_cpu_written`]. An allocation the GPU cache holds
//! whole runs without the space's background write-back (nothing is ever evicted, so it would
//! only copy pages down during kernels); a larger one keeps it. Measured against CUDA managed
//! memory in `results/README.md`.
//!
//! # Data larger than host memory
//! A [`Unified`] keeps its data in pinned host memory and refuses sizes beyond it
//! ([`UnifiedError::BeyondHostMemory`]). [`UnifiedOverStore`] keeps the data in a store (a
//! file, a memory node): the CPU side is a pager region over the store, the GPU side a space
//! over the same store, and each side's writes to the store are logged so a sync drops exactly
//! the other side's stale copies. Its rules are stricter (whole-allocation syncs in strict
//! alternation, out-of-order syncs refused with nothing moved; no hints, replicas or discard);
//! see [`over_store`]. Its GPU tests (`tests/gpu.rs`, `over_a_store_*`: phases against a
//! replay over a store larger than both caches, a failing store, the edges) run on a GPU; its
//! CPU half is tested without one. One GPU per allocation.
//!
//! The benchmark against CUDA managed memory is `strata bench unified` (crate strata-bench).
#![warn(missing_docs)]

pub mod cpu_tracker;
mod error;
mod options;
pub mod over_store;
pub mod page_state;
mod sys;
mod unified;
pub mod write_log;
pub mod write_watch;

pub use cpu_tracker::DirtyTracking;
pub use error::UnifiedError;
pub use options::{Advice, Location, UnifiedOptions, host_available};
pub use over_store::{LoggingStore, UnifiedOverStore};
pub use unified::{SyncReport, Unified, UnifiedHandle, UnifiedStats};

/// The device header for unified allocations (`strata/unified.cuh`), to write out beside
/// `strata.cuh` for nvcc users.
pub const UNIFIED_CUH: &str = include_str!("../../strata-gpu/cuda/strata/unified.cuh");

/// Compiles a kernel source that uses `strata/unified.cuh` (and so `strata.cuh`) through
/// NVRTC for `strata`'s GPU: the header's text is put in front of the source, so
/// `#include "strata/unified.cuh"` in the source is optional.
pub fn compile(
    strata: &strata_gpu::Strata,
    source: &str,
    name: &str,
) -> Result<strata_gpu::KernelModule, UnifiedError> {
    Ok(strata.compile(&with_header(source), name)?)
}

/// `source` with the unified header's text in front (the `#include "strata/unified.cuh"` line,
/// which NVRTC would not find, removed).
pub fn with_header(source: &str) -> String {
    let body = source.replace("#include \"strata/unified.cuh\"", "");
    format!("{UNIFIED_CUH}\n#line 1 \"user\"\n{body}")
}
