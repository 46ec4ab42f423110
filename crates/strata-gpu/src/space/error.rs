//! What can go wrong with the GPU runtime and its spaces, each error saying what to do.

use strata_core::store::StoreError;

use crate::driver::DriverError;
use crate::nvrtc::CompileError;

/// Errors of the GPU runtime and its spaces.
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A kernel did not compile.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A bad size or option.
    #[error("invalid space option: {0}")]
    Invalid(String),
    /// The cache does not fit in free GPU memory.
    #[error(
        "page cache of {cache} plus {tables} of tables does not fit in the {free} of free GPU memory: ask for a smaller cache (STRATA_CACHE_SIZE)"
    )]
    CacheTooLarge {
        /// Requested cache.
        cache: String,
        /// Tables.
        tables: String,
        /// Free GPU memory.
        free: String,
    },
    /// A device access fell outside the space.
    #[error(
        "a kernel accessed element {index} of a space of {elements} elements (element size {elem} bytes); the access was dropped: check the kernel's index arithmetic"
    )]
    OutOfRange {
        /// First bad element index seen.
        index: u64,
        /// Elements in the space at that element size (as the kernel saw them).
        elements: u64,
        /// Element size assumed.
        elem: u64,
    },
    /// A kernel named a page index past the end (`acquire`, `acquire_page`, `view_page`).
    #[error(
        "a kernel acquired page {page} of a space of {pages} pages ({page_size}-byte pages); nothing was touched and the call got a scratch page: check the kernel's page arithmetic (pages run 0..{pages})"
    )]
    PageOutOfRange {
        /// First bad page index seen.
        page: u64,
        /// Pages in the space.
        pages: u64,
        /// Page size in bytes.
        page_size: u64,
    },
    /// A warp waited past the space's wait limit for a frame (or a page others were moving)
    /// and gave up.
    #[error(
        "a kernel waited more than {limit_ms} ms for a frame for page {page} of a space of {pages} pages whose cache has {frames} frames, and gave up (that access was dropped: reads got 0, writes were lost). Every frame stayed pinned: a warp may hold the pages of one acquire (at most 32) at a time, and the warps running at once must together hold fewer pins than the cache has frames. Give a larger cache (STRATA_CACHE_SIZE), release pages before acquiring more, or launch fewer warps (or raise the limit with Space::set_wait_limit if the kernel is merely slow)"
    )]
    NoFrame {
        /// First page a warp gave up on.
        page: u64,
        /// Pages in the space.
        pages: u64,
        /// Frames in the cache.
        frames: u32,
        /// The wait limit, ms.
        limit_ms: u64,
    },
    /// A kernel wrote a space marked read-only.
    #[error(
        "a kernel tried to write page {page} of a space marked read-only (Space::set_read_only); nothing was written. Call set_read_only(false) before launching kernels that write this space"
    )]
    WroteReadOnly {
        /// First page a kernel tried to write.
        page: u64,
    },
    /// A host-side range outside the space.
    #[error("range {start}..{end} is outside the space of {size} bytes")]
    Range {
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// Space size.
        size: u64,
    },
    /// A space over a store was asked for its host copy, which it does not have.
    #[error(
        "a space over a store has no host copy: use fill_from_slice / read_back, or read and write the store itself while no kernel runs"
    )]
    NoHostCopy,
    /// A lower tier (the store, or the host threads serving the ring) failed pages.
    #[error(
        "the store failed page {page} ({failed_pages} page(s) in all): {message}. Those accesses failed (reads got 0, writes to them were not made); pages flushed before are intact, and dirty pages that could not go down stay cached. Fix the store, then retry the kernel (check_errors cleared the failure)"
    )]
    StoreFailed {
        /// First page that failed.
        page: u64,
        /// Pages that failed since the last check.
        failed_pages: usize,
        /// The store's message (or why the host did not answer).
        message: String,
    },
    /// Closing (or flushing a space about to end) could not write every dirty page down;
    /// they are all here, so nothing is lost.
    #[error("{} dirty page(s) could not be written down and are handed back with this error (page index, bytes): {source}", pages.len())]
    Unflushed {
        /// Page index and bytes of every page not written.
        pages: Vec<(u64, Vec<u8>)>,
        /// Why.
        source: Box<SpaceError>,
    },
    /// The request ring's host side failed.
    #[error(transparent)]
    Ring(#[from] crate::ring::RingError),
    /// Filling from a store failed.
    #[error("filling the space from {store} failed: {source}")]
    Store {
        /// The store.
        store: String,
        /// Why.
        source: StoreError,
    },
}
