//! What can go wrong with a unified allocation, each error saying what to do.

use strata_gpu::SpaceError;

/// Errors of unified allocations.
#[derive(Debug, thiserror::Error)]
pub enum UnifiedError {
    /// The GPU runtime or the space under the allocation failed.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// A bad size, option, range or hint.
    #[error("invalid unified allocation request: {0}")]
    Invalid(String),
    /// A byte range outside the allocation.
    #[error(
        "range {start}..{end} is outside the unified allocation of {size} bytes: pass a range within 0..{size} (start <= end)"
    )]
    Range {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Allocation size.
        size: u64,
    },
    /// The allocation does not fit in host memory.
    #[error(
        "{size} bytes do not fit in the host's available memory ({available} bytes): a Unified keeps its data in pinned host memory; for data larger than host memory put it in a store (a file, a memory node) and use UnifiedOverStore::new (its GPU path has not yet run on a GPU in this version), or allocate less"
    )]
    BeyondHostMemory {
        /// Requested size.
        size: u64,
        /// Host memory available now.
        available: u64,
    },
    /// The CPU and the GPU both wrote the same pages since the last sync.
    #[error(
        "the CPU and the GPU both wrote {} page(s) since the last sync (first pages {:?}, {page_size}-byte pages); nothing was changed, both copies are kept: pages are owned by one side between syncs (sync_to_cpu after a kernel before the CPU writes, sync_to_gpu before the next kernel). To keep the CPU's bytes discard the pages' GPU copies (discard), or to keep the GPU's call sync_to_cpu_overwriting",
        pages.len(), &pages[..pages.len().min(8)]
    )]
    Conflict {
        /// The pages (indices), ascending.
        pages: Vec<u64>,
        /// Page size in bytes.
        page_size: u64,
    },
    /// A sync of an allocation over a store out of the phase order it needs (nothing was
    /// moved); the message says which sync to call.
    #[error("sync out of order on a unified allocation over a store: {0}")]
    PhaseOrder(String),
    /// The CPU side (pager region) of an allocation over a store failed.
    #[error(
        "the CPU side (pager region) of a unified allocation over a store failed while {during}: {source}; nothing was lost: pages the store did not take stay dirty in the region (or listed for the next sync), so fix the store and repeat the call"
    )]
    Region {
        /// What the allocation was doing.
        during: &'static str,
        /// The pager's error.
        source: strata_pager::RegionError,
    },
    /// A kernel wrote pages advised read-mostly.
    #[error(
        "a kernel wrote {} page(s) advised read-mostly (first pages {:?}, {page_size}-byte pages); {}: clear the advice (Advice::ReadMostly(false)) on data kernels write",
        pages.len(), &pages[..pages.len().min(8)],
        if *reached_host { "some of those writes reached the host copy through eviction before the kernel ended" } else { "the GPU's writes were dropped, the host copy is unchanged (read-mostly data is never written back)" }
    )]
    ReadMostlyWritten {
        /// The pages (indices), ascending.
        pages: Vec<u64>,
        /// Page size in bytes.
        page_size: u64,
        /// Whether evictions during the kernel wrote some of them down anyway.
        reached_host: bool,
    },
}
