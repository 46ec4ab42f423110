//! Why a region operation failed: [`RegionError`] and [`UnmapError`].

use strata_core::{ConfigError, StoreError};

use super::Region;
use crate::sys::UffdOpenError;

/// Why a region operation failed. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A zero-byte region.
    #[error("a region must hold at least one byte; ask for a positive size")]
    Empty,
    /// The store cannot back the region.
    #[error(
        "store {store} holds {store_size} bytes but the region needs {needed} (offset {offset} + size {size}); use a larger store or a smaller region"
    )]
    StoreTooSmall {
        /// The store.
        store: String,
        /// Its size.
        store_size: u64,
        /// Bytes needed.
        needed: u64,
        /// Region offset in the store.
        offset: u64,
        /// Region size.
        size: u64,
    },
    /// userfaultfd is unavailable.
    #[error(transparent)]
    Userfaultfd(#[from] UffdOpenError),
    /// A kernel call failed.
    #[error("{op} failed: {source}; {hint}")]
    Kernel {
        /// The call.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
        /// What to do.
        hint: &'static str,
    },
    /// A discard range that does not cover whole pages.
    #[error(
        "discard of {len} bytes at offset {offset} is not page-aligned (pages of {page_bytes} bytes); round the start up and the end down to whole pages"
    )]
    Unaligned {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Page size.
        page_bytes: u64,
    },
    /// A page could not be read from the store.
    #[error("filling page {page} (store offset {offset}) failed: {source}")]
    Fill {
        /// Page index.
        page: usize,
        /// Store offset of the page.
        offset: u64,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A dirty page could not be written back; it stays resident and dirty.
    #[error(
        "writing back page {page} (store offset {offset}) failed: {source}; the page stays resident and dirty, fix the store and flush again"
    )]
    WriteBack {
        /// Page index.
        page: usize,
        /// Store offset.
        offset: u64,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The store's own flush failed.
    #[error("flushing the store failed: {0}")]
    StoreFlush(#[source] StoreError),
    /// No frame could be freed: every resident page is dirty and cannot be written back.
    #[error(
        "the buffer of {frames} pages is full of dirty pages that cannot be written back ({last}); fix the store, or give the region a larger buffer"
    )]
    BufferExhausted {
        /// Frames in the buffer.
        frames: usize,
        /// The last write-back error.
        last: String,
    },
    /// No frame came free for a fault within [`FRAME_WAIT`](super::FRAME_WAIT): every frame was held by a fill
    /// or write-back the store did not finish. The store is not answering.
    #[error(
        "no frame of the buffer of {frames} pages came free within {waited_s} s: every one was held by a store read or write that did not finish; the store is not answering (check it, or give it a timeout)"
    )]
    BufferBusy {
        /// Frames in the buffer.
        frames: usize,
        /// Seconds waited.
        waited_s: u64,
    },
    /// A range outside the region.
    #[error(
        "range of {len} bytes at offset {offset} reaches past the region's end ({size} bytes); keep ranges inside the region"
    )]
    OutOfRange {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Region size.
        size: u64,
    },
}

/// [`Region::unmap`] failed to write every dirty page back; the region is handed back
/// intact so no data is lost.
#[derive(Debug, thiserror::Error)]
#[error(
    "unmapping the region failed: {error}; the region is still mapped and its dirty pages are kept"
)]
pub struct UnmapError {
    /// The region, still mapped.
    pub region: Region,
    /// Why the flush failed.
    pub error: RegionError,
}
