//! A fake GPU for tests without one: a chunk is a memfd (a real descriptor that really
//! crosses the socket), filled by the lender with a pattern derived from a seed and the chunk
//! id, which the borrower checks word by word after receiving it. The lender can tell which
//! of its chunks are still referenced anywhere.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use crate::borrower::{ChunkSink, Grant};
use crate::ledger::{ChunkId, LeaseId};
use crate::lender::ChunkSource;

/// The word at `index` of chunk `chunk` for `seed` (any fixed mixing works; this one makes
/// neighbouring chunks and words differ in many bits).
pub fn pattern(seed: u64, chunk: ChunkId, index: u64) -> u64 {
    let mut x = seed
        ^ chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// The name of the memfds a source with `seed` creates (`/proc/PID/fd` shows it, so tests can
/// count the descriptors that still pin chunks).
pub fn memfd_name(seed: u64) -> String {
    format!("strata-fake-chunk-{seed:016x}")
}

/// Lends memfd chunks.
#[derive(Debug)]
pub struct MemfdSource {
    gpu: u32,
    chunk_bytes: u64,
    seed: u64,
    next: ChunkId,
    live: BTreeMap<ChunkId, OwnedFd>,
    /// Refuse to create more than this many live chunks (a lender out of memory).
    pub capacity: usize,
}

impl MemfdSource {
    /// A source for `gpu` with chunks of `chunk_bytes` (a multiple of 8) filled from `seed`.
    pub fn new(gpu: u32, chunk_bytes: u64, seed: u64) -> Self {
        MemfdSource {
            gpu,
            chunk_bytes,
            seed,
            next: 1,
            live: BTreeMap::new(),
            capacity: usize::MAX,
        }
    }
}

impl ChunkSource for MemfdSource {
    fn gpu(&self) -> u32 {
        self.gpu
    }

    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn create(&mut self, count: u32) -> Result<Vec<(ChunkId, OwnedFd)>, String> {
        if self.live.len() + count as usize > self.capacity {
            return Err(format!(
                "out of memory: {} chunks live, capacity {}",
                self.live.len(),
                self.capacity
            ));
        }
        let mut out = Vec::new();
        for _ in 0..count {
            let id = self.next;
            self.next += 1;
            let fd =
                rustix::fs::memfd_create(memfd_name(self.seed), rustix::fs::MemfdFlags::CLOEXEC)
                    .map_err(|e| e.to_string())?;
            let bytes: Vec<u8> = (0..self.chunk_bytes / 8)
                .flat_map(|i| pattern(self.seed, id, i).to_le_bytes())
                .collect();
            rustix::io::pwrite(&fd, &bytes, 0).map_err(|e| e.to_string())?;
            let exported = fd.try_clone().map_err(|e| e.to_string())?;
            self.live.insert(id, fd);
            out.push((id, exported));
        }
        Ok(out)
    }

    fn release(&mut self, chunks: &[ChunkId]) {
        for c in chunks {
            self.live.remove(c);
        }
    }
}

/// Borrows memfd chunks, checking every word on arrival.
#[derive(Debug)]
pub struct MemfdSink {
    seed: u64,
    held: BTreeMap<(LeaseId, ChunkId), OwnedFd>,
    /// Chunks received and checked.
    pub checked: u64,
    /// Revokes served.
    pub revoked: u64,
    /// Set to make `revoke` never return (a borrower that ignores reclaims).
    pub stubborn: bool,
}

impl MemfdSink {
    /// A sink expecting chunks filled from `seed`.
    pub fn new(seed: u64) -> Self {
        MemfdSink {
            seed,
            held: BTreeMap::new(),
            checked: 0,
            revoked: 0,
            stubborn: false,
        }
    }

    /// Chunks held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

impl ChunkSink for MemfdSink {
    fn attach(&mut self, grant: &Grant, fds: Vec<OwnedFd>) -> Result<(), String> {
        let mut buf = vec![0u8; usize::try_from(grant.chunk_bytes).map_err(|e| e.to_string())?];
        for (&id, fd) in grant.chunks.iter().zip(&fds) {
            let n = rustix::io::pread(fd, &mut buf, 0).map_err(|e| e.to_string())?;
            if n != buf.len() {
                return Err(format!("chunk {id}: {n} of {} bytes readable", buf.len()));
            }
            for (i, w) in buf.chunks_exact(8).enumerate() {
                let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                if got != pattern(self.seed, id, i as u64) {
                    return Err(format!(
                        "chunk {id} word {i}: {got:#x} is not what the lender wrote"
                    ));
                }
            }
            self.checked += 1;
        }
        for (&id, fd) in grant.chunks.iter().zip(fds) {
            self.held.insert((grant.lease, id), fd);
        }
        Ok(())
    }

    fn revoke(
        &mut self,
        lease: LeaseId,
        chunks: &[ChunkId],
        _deadline: std::time::Instant,
    ) -> Result<(), String> {
        if self.stubborn {
            loop {
                std::thread::park();
            }
        }
        for c in chunks {
            self.held.remove(&(lease, *c));
        }
        self.revoked += 1;
        Ok(())
    }

    fn broker_lost(&mut self) {
        self.held.clear();
    }
}
