//! The `Store` trait: where a space's or region's backing bytes live.
//!
//! A store is a flat, fixed-size byte range. Pagers and GPU tiers read and write whole pages or
//! runs of pages at byte offsets; the trait itself accepts any offset and length inside the
//! store so that codecs and tests can use it directly. Every implementation is `Send + Sync` and
//! must tolerate many threads reading and writing disjoint ranges at once (filler and evictor
//! pools do exactly that). Concurrent writes to *overlapping* ranges are allowed but the result
//! is some interleaving chosen by the store; callers that care serialise them.

mod faulty;
mod file;
mod memory;
mod packed;
mod sys;

pub use faulty::{FaultCounts, FaultPlan, FaultPlanError, FaultyStore};
pub use file::{FileStore, FileStoreOpenError, FileStoreOptions};
pub use memory::MemoryStore;
pub use packed::PackedMemoryStore;

use std::io;

/// Why a store operation failed. Every variant says what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The operating system refused the I/O.
    #[error(
        "{store}: {op} of {len} bytes at offset {offset} failed: {source}; check the backing device or file and retry"
    )]
    Io {
        /// Which store (for example `file:/data/x`).
        store: String,
        /// `read`, `write` or `flush`.
        op: &'static str,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The request reaches past the end of the store.
    #[error(
        "{store}: request of {len} bytes at offset {offset} reaches past the store's end ({size} bytes); keep requests inside the store or create a larger one"
    )]
    OutOfRange {
        /// Which store.
        store: String,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// Size of the store in bytes.
        size: u64,
    },
    /// The bytes read back are not what was written (a checksum, header or codec check failed).
    #[error(
        "{store}: data at offset {offset} is corrupt ({detail}); the page cannot be trusted, restore it from a good copy"
    )]
    Corrupt {
        /// Which store.
        store: String,
        /// Byte offset of the damaged page or run.
        offset: u64,
        /// What check failed.
        detail: String,
    },
    /// The store cannot serve requests now (a remote node is gone, a link timed out).
    #[error("{store} is unavailable: {reason}")]
    Unavailable {
        /// Which store.
        store: String,
        /// Why, including what to do.
        reason: String,
    },
}

impl StoreError {
    /// Builds an [`StoreError::OutOfRange`] for `store` of `size` bytes.
    pub fn out_of_range(store: &dyn Store, offset: u64, len: u64) -> Self {
        StoreError::OutOfRange {
            store: store.describe(),
            offset,
            len,
            size: store.size(),
        }
    }
}

/// One read in a batch: `buf.len()` bytes starting at `offset`.
#[derive(Debug)]
pub struct ReadRequest<'a> {
    /// Byte offset in the store.
    pub offset: u64,
    /// Where the bytes go.
    pub buf: &'a mut [u8],
}

/// A fixed-size byte range that backs a space or region. See the module docs for the contract.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Size of the store in bytes. Constant for the store's lifetime.
    fn size(&self) -> u64;

    /// Reads `buf.len()` bytes starting at `offset`. Bytes never written read as zero.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Writes `buf` starting at `offset`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError>;

    /// Durability point: once this returns, every completed `write_at` survives the process
    /// (for stores that persist at all; for memory it is a no-op).
    fn flush(&self) -> Result<(), StoreError>;

    /// A short human-readable name, such as `memory(64 MiB)` or `file:/data/x`.
    fn describe(&self) -> String;

    /// Reads several ranges. Stores with latency to hide (remote memory) override this to keep
    /// many requests in flight; the default serves them one after another.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for request in requests.iter_mut() {
            self.read_at(request.offset, request.buf)?;
        }
        Ok(())
    }

    /// Writes several ranges; the batch counterpart of [`Store::write_at`].
    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for (offset, buf) in requests {
            self.write_at(*offset, buf)?;
        }
        Ok(())
    }
}

/// Checks that `[offset, offset + len)` lies inside a store of `size` bytes.
pub fn check_range(store: &dyn Store, offset: u64, len: usize) -> Result<(), StoreError> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= store.size() => Ok(()),
        _ => Err(StoreError::out_of_range(store, offset, len)),
    }
}
