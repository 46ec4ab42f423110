//! `MemoryStore`: host DRAM, the embedded default.

use std::sync::RwLock;

use super::{Store, StoreError, check_range};
use crate::units::format_size;

/// Chunk granularity. Chunks are allocated on first write, so a large store that is mostly
/// never written costs nothing; each chunk has its own lock, so threads working on different
/// chunks never contend.
const CHUNK_BYTES: usize = 256 * 1024;

/// One chunk: `None` until first written (reads as zeros).
type Chunk = RwLock<Option<Box<[u8]>>>;

/// A store in host memory. Sparse (zero until written) and safe for concurrent use: each 256 KiB
/// chunk sits behind its own reader-writer lock.
#[derive(Debug)]
pub struct MemoryStore {
    size: u64,
    chunks: Box<[Chunk]>,
}

impl MemoryStore {
    /// Creates a zero-filled store of `size` bytes. Memory is taken only as chunks are written.
    ///
    /// # Panics
    /// If this machine cannot even hold the chunk table (24 bytes per 256 KiB); use
    /// [`MemoryStore::try_new`] for sizes that come from users.
    pub fn new(size: u64) -> Self {
        Self::try_new(size).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Creates a zero-filled store of `size` bytes, or says that this machine cannot hold
    /// one so large (its chunk table alone does not fit).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the chunk table cannot be allocated.
    pub fn try_new(size: u64) -> Result<Self, StoreError> {
        let too_large = || {
            StoreError::Unavailable {
            store: format!("memory({})", format_size(size)),
            reason: "a memory store this size is too large for this machine (its table of 256 KiB chunks cannot be allocated); use a smaller size or a file store".into(),
        }
        };
        let chunk_count =
            usize::try_from(size.div_ceil(CHUNK_BYTES as u64)).map_err(|_| too_large())?;
        let mut chunks = Vec::new();
        chunks
            .try_reserve_exact(chunk_count)
            .map_err(|_| too_large())?;
        chunks.extend((0..chunk_count).map(|_| RwLock::new(None)));
        Ok(Self {
            size,
            chunks: chunks.into_boxed_slice(),
        })
    }

    /// Creates a store holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let store = Self::new(bytes.len() as u64);
        store
            .write_at(0, bytes)
            .expect("a fresh store holds its own initial contents");
        store
    }

    /// Bytes of host memory the store holds now (written chunks only).
    pub fn resident_bytes(&self) -> u64 {
        let held = self
            .chunks
            .iter()
            .filter(|c| c.read().unwrap_or_else(|e| e.into_inner()).is_some())
            .count();
        (held * CHUNK_BYTES) as u64
    }

    /// Splits `[offset, offset+len)` into (chunk index, offset in chunk, length) pieces.
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        let mut pos = offset;
        let end = offset + len as u64;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            // Both fit in usize: `pos < size`, and the chunk table was sized from `size`.
            let chunk = usize::try_from(pos / CHUNK_BYTES as u64).ok()?;
            let within = usize::try_from(pos % CHUNK_BYTES as u64).ok()?;
            let take = (CHUNK_BYTES - within).min(usize::try_from(end - pos).ok()?);
            pos += take as u64;
            Some((chunk, within, take))
        })
    }
}

impl Store for MemoryStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        for (chunk, within, take) in Self::pieces(offset, buf.len()) {
            let guard = self.chunks[chunk].read().unwrap_or_else(|e| e.into_inner());
            let out = &mut buf[done..done + take];
            match guard.as_deref() {
                Some(data) => out.copy_from_slice(&data[within..within + take]),
                None => out.fill(0),
            }
            done += take;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        for (chunk, within, take) in Self::pieces(offset, buf.len()) {
            let mut guard = self.chunks[chunk]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let data = guard.get_or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice());
            data[within..within + take].copy_from_slice(&buf[done..done + take]);
            done += take;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory({})", format_size(self.size))
    }
}
