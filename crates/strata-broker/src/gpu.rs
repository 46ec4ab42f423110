//! The real GPU behind [`ChunkSource`] and [`ChunkSink`] (feature `gpu`): a lender's chunks
//! are CUDA VMM allocations exported as POSIX descriptors ([`GpuSource`]); a borrower imports
//! each into a slot of a [`PeerWindow`] with access for its own GPU only ([`GpuSink`]).
//!
//! A chunk can be filled by the lender with a word derived from a seed and its id, and a
//! borrower given the same seed checks it after import: proof that the right memory crossed
//! processes and GPUs, used by the GPU tests.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use strata_gpu::Space;
use strata_gpu::driver::{DriverError, Gpu, LendableChunk, PeerWindow};

use crate::borrower::{ChunkSink, Grant};
use crate::fake::pattern;
use crate::ledger::{ChunkId, LeaseId};
use crate::lender::ChunkSource;

/// The 32-bit word a chunk is filled with for `seed` (see the module docs).
pub fn fill_word(seed: u64, chunk: ChunkId) -> u32 {
    // The low half of a mixed 64-bit value.
    let [a, b, c, d, ..] = pattern(seed, chunk, 0).to_le_bytes();
    u32::from_le_bytes([a, b, c, d])
}

/// Lends chunks of one GPU.
#[derive(Debug)]
pub struct GpuSource {
    gpu: Arc<Gpu>,
    chunk_bytes: usize,
    chunks: BTreeMap<ChunkId, LendableChunk>,
    next: ChunkId,
    fill: Option<u64>,
    releases: ReleaseLog,
}

/// When each release of a lender's chunks started and how long it took (shared with whoever
/// measures reclaims; the source itself moves into the lender's thread).
pub type ReleaseLog = Arc<std::sync::Mutex<Vec<(Instant, std::time::Duration, usize)>>>;

impl GpuSource {
    /// A source on GPU `ordinal` with chunks of the allocation granularity (2 MiB), each
    /// filled from `fill` when given.
    ///
    /// # Errors
    /// No such GPU or no driver.
    pub fn open(ordinal: usize, fill: Option<u64>) -> Result<Self, DriverError> {
        let gpu = Gpu::open(ordinal)?;
        let chunk_bytes = LendableChunk::granularity(&gpu)?;
        Ok(GpuSource {
            gpu,
            chunk_bytes,
            chunks: BTreeMap::new(),
            next: 1,
            fill,
            releases: ReleaseLog::default(),
        })
    }

    /// Lends chunks of `bytes` instead (a multiple of the granularity): fewer, larger chunks
    /// cost fewer driver calls to create and to give back.
    ///
    /// # Errors
    /// Not a positive multiple of the granularity.
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Result<Self, String> {
        let granularity = LendableChunk::granularity(&self.gpu).map_err(|e| e.to_string())?;
        if bytes == 0 || !bytes.is_multiple_of(granularity) {
            return Err(format!(
                "chunks must be a positive multiple of {granularity} bytes, not {bytes}"
            ));
        }
        self.chunk_bytes = bytes;
        Ok(self)
    }

    /// The GPU.
    pub fn gpu_handle(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The log of releases: (start, duration, chunks).
    pub fn release_log(&self) -> ReleaseLog {
        self.releases.clone()
    }

    /// Chunks created and not released.
    pub fn live(&self) -> usize {
        self.chunks.len()
    }

    fn make(&mut self) -> Result<(ChunkId, OwnedFd), DriverError> {
        let chunk = LendableChunk::create(&self.gpu, self.chunk_bytes)?;
        let id = self.next;
        self.next += 1;
        if let Some(seed) = self.fill {
            chunk.fill_u32(fill_word(seed, id))?;
        }
        let fd = chunk.export_fd()?;
        self.chunks.insert(id, chunk);
        Ok((id, fd))
    }
}

impl ChunkSource for GpuSource {
    fn gpu(&self) -> u32 {
        u32::try_from(self.gpu.ordinal()).unwrap_or(u32::MAX)
    }

    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes as u64
    }

    fn create(&mut self, count: u32) -> Result<Vec<(ChunkId, OwnedFd)>, String> {
        let mut out = Vec::new();
        for _ in 0..count {
            match self.make() {
                Ok(c) => out.push(c),
                Err(e) => {
                    // Nothing half-made is kept: the chunks of this call go again.
                    for (id, _) in &out {
                        self.chunks.remove(id);
                    }
                    return Err(format!("GPU {}: {e}", self.gpu.ordinal()));
                }
            }
        }
        Ok(out)
    }

    fn release(&mut self, chunks: &[ChunkId]) {
        let start = Instant::now();
        for c in chunks {
            self.chunks.remove(c);
        }
        if let Ok(mut log) = self.releases.lock() {
            log.push((start, start.elapsed(), chunks.len()));
        }
    }
}

/// Maps borrowed chunks for one GPU's kernels.
#[derive(Debug)]
pub struct GpuSink {
    window: PeerWindow,
    slots: BTreeMap<(LeaseId, ChunkId), usize>,
    verify: Option<u64>,
    /// Chunks whose contents were checked on arrival.
    pub checked: u64,
}

impl GpuSink {
    /// A sink on `gpu` with room for `capacity` chunks of `chunk_bytes`, checking each
    /// chunk's fill word on arrival when `verify` is given.
    ///
    /// # Errors
    /// The window could not be reserved.
    pub fn new(
        gpu: &Arc<Gpu>,
        capacity: usize,
        chunk_bytes: usize,
        verify: Option<u64>,
    ) -> Result<Self, DriverError> {
        Ok(GpuSink {
            window: PeerWindow::reserve(gpu, capacity, chunk_bytes)?,
            slots: BTreeMap::new(),
            verify,
            checked: 0,
        })
    }

    /// The window the chunks are mapped into.
    pub fn window(&self) -> &PeerWindow {
        &self.window
    }

    /// Slot of a held chunk.
    pub fn slot(&self, lease: LeaseId, chunk: ChunkId) -> Option<usize> {
        self.slots.get(&(lease, chunk)).copied()
    }

    fn check(&self, slot: usize, seed: u64, chunk: ChunkId) -> Result<(), String> {
        let want = fill_word(seed, chunk);
        let chunk_bytes = self.window.chunk_bytes();
        let mut buf = vec![0u8; 4096];
        for offset in [0, chunk_bytes / 2, chunk_bytes - buf.len()] {
            self.window
                .read(slot, offset, &mut buf)
                .map_err(|e| e.to_string())?;
            if let Some(i) = buf
                .chunks_exact(4)
                .position(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != want)
            {
                return Err(format!(
                    "chunk {chunk}: byte {} differs from what the lender wrote",
                    offset + 4 * i
                ));
            }
        }
        Ok(())
    }
}

impl ChunkSink for GpuSink {
    fn attach(&mut self, grant: &Grant, fds: Vec<OwnedFd>) -> Result<(), String> {
        if grant.chunk_bytes != self.window.chunk_bytes() as u64 {
            return Err(format!(
                "chunks of {} bytes do not fit this window's {}-byte slots",
                grant.chunk_bytes,
                self.window.chunk_bytes()
            ));
        }
        let mut mapped = Vec::new();
        let mut failure = None;
        for (&id, fd) in grant.chunks.iter().zip(&fds) {
            let slot = match self.window.map(fd.as_fd()) {
                Ok(s) => s,
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            };
            mapped.push((id, slot));
            if let Some(seed) = self.verify
                && let Err(e) = self.check(slot, seed, id)
            {
                failure = Some(e);
                break;
            }
        }
        // Imported: the descriptors are no longer needed (and would pin the memory).
        drop(fds);
        if let Some(why) = failure {
            let slots: Vec<usize> = mapped.iter().map(|&(_, slot)| slot).collect();
            let _ = self.window.unmap_many(&slots);
            return Err(why);
        }
        self.checked += if self.verify.is_some() {
            mapped.len() as u64
        } else {
            0
        };
        for (id, slot) in mapped {
            self.slots.insert((grant.lease, id), slot);
        }
        Ok(())
    }

    fn revoke(
        &mut self,
        lease: LeaseId,
        chunks: &[ChunkId],
        _deadline: Instant,
    ) -> Result<(), String> {
        let slots: Vec<usize> = chunks
            .iter()
            .filter_map(|&c| self.slots.remove(&(lease, c)))
            .collect();
        self.window.unmap_many(&slots).map_err(|e| e.to_string())
    }

    fn broker_lost(&mut self) {
        let slots: Vec<usize> = std::mem::take(&mut self.slots).into_values().collect();
        let _ = self.window.unmap_many(&slots);
    }
}

/// Borrowed chunks go into a space's peer tier ([`Space::enable_peer_leases`]): attached as
/// they arrive, revoked on the broker's word even while kernels run (pages in a revoked chunk
/// are loaded from the space's host copy, so nothing is lost: the peer tier only ever holds
/// clean copies).
#[derive(Debug)]
pub struct SpaceSink {
    space: Arc<Space>,
    chunks: BTreeMap<(LeaseId, ChunkId), usize>,
    /// Each revoke's phases and its whole duration.
    pub revokes: Vec<(strata_gpu::space::PeerRevoke, std::time::Duration)>,
}

impl SpaceSink {
    /// A sink feeding `space` (whose peer leases are enabled).
    pub fn new(space: Arc<Space>) -> Self {
        SpaceSink {
            space,
            chunks: BTreeMap::new(),
            revokes: Vec::new(),
        }
    }

    /// Chunks attached now.
    pub fn attached(&self) -> usize {
        self.chunks.len()
    }
}

impl ChunkSink for SpaceSink {
    fn attach(&mut self, grant: &Grant, fds: Vec<OwnedFd>) -> Result<(), String> {
        if grant.chunk_bytes != strata_gpu::space::PEER_CHUNK_BYTES {
            return Err(format!(
                "a space's peer tier takes chunks of {} bytes, not {}: lend with the default chunk size",
                strata_gpu::space::PEER_CHUNK_BYTES,
                grant.chunk_bytes
            ));
        }
        let mut done = Vec::new();
        for (&id, fd) in grant.chunks.iter().zip(&fds) {
            match self.space.attach_peer_chunk(fd.as_fd()) {
                Ok(index) => done.push((id, index)),
                Err(e) => {
                    let deadline = Instant::now() + std::time::Duration::from_secs(1);
                    let indices: Vec<usize> = done.iter().map(|&(_, i)| i).collect();
                    let _ = self.space.revoke_peer_chunks(&indices, deadline);
                    return Err(e.to_string());
                }
            }
        }
        drop(fds);
        for (id, index) in done {
            self.chunks.insert((grant.lease, id), index);
        }
        Ok(())
    }

    fn revoke(
        &mut self,
        lease: LeaseId,
        chunks: &[ChunkId],
        deadline: Instant,
    ) -> Result<(), String> {
        let held: Vec<ChunkId> = chunks
            .iter()
            .copied()
            .filter(|&c| self.chunks.contains_key(&(lease, c)))
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let indices: Vec<usize> = held.iter().map(|&c| self.chunks[&(lease, c)]).collect();
        let start = Instant::now();
        let phases = self
            .space
            .revoke_peer_chunks(&indices, deadline)
            .map_err(|e| e.to_string())?;
        self.revokes.push((phases, start.elapsed()));
        for c in held {
            self.chunks.remove(&(lease, c));
        }
        Ok(())
    }

    fn broker_lost(&mut self) {
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let indices: Vec<usize> = std::mem::take(&mut self.chunks).into_values().collect();
        if let Err(e) = self.space.revoke_peer_chunks(&indices, deadline) {
            tracing::error!("dropping borrowed chunks after the broker left: {e}");
        }
    }
}
