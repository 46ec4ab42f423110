//! The peer tier: a victim cache in memory borrowed from neighbour GPUs, above the pinned host
//! copy (device side `cuda/strata/tier_peer.cuh`). Every page leaving a GPU frame is also
//! copied into a borrowed slot; a fault on a page that still has its slot copies it over
//! NVLink instead of PCIe. Slot copies are always clean (the host copy is written at the same
//! eviction), so the host never writes anything back from them, and dropping them (host
//! writes to the space, the space's end) loses nothing.
//!
//! The memory comes either from this process ([`PeerBorrow`]: neighbour GPUs' memory
//! allocated here, kept for the space's life) or from other processes through the lending
//! broker (leased chunks: [`PeerTier::leased`]). Leased chunks arrive and leave while kernels
//! run: the slot table is reserved for the most chunks at creation, slots of absent chunks are
//! unusable, and a revoke marks the chunk revoked on the device, waits (on a stream of its own,
//! while the user's kernels run) until no warp is copying from or to it, invalidates its slot
//! words and unmaps it. Device side: `StrataPeerLeases` in `tier_peer.cuh`.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::driver::{BorrowedMemory, DeviceBuffer, Gpu, PeerWindow, Stream};
use crate::layout::PeerDescriptor;
use crate::space::{PEER_CHUNK_BYTES, PeerBorrow, SpaceError};

/// `STRATA_PEER_GEN_SHIFT`: where a slot word's generation starts.
const GEN_SHIFT: u32 = 40;

/// Per-chunk lease state (`StrataPeerLeases`), in the descriptor buffer right after the
/// `StrataPeer`; all zero for memory of this process (never revoked).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PeerLeases {
    /// `[chunks]` u32, nonzero: absent or revoked (device address).
    pub revoked: u64,
    /// `[chunks]` u32, warps copying from or to the chunk now (device address).
    pub inflight: u64,
    /// log2(slots per chunk).
    pub chunk_shift: u32,
    /// Chunks (0: not leased).
    pub chunks: u32,
    /// Zero.
    pub reserved: u64,
    /// Chunk entries refused because the chunk was absent or revoked.
    pub refused: u64,
}

const _: () = assert!(std::mem::size_of::<PeerLeases>() == 40);
/// Bytes of the descriptor buffer: `StrataPeer` then `StrataPeerLeases`.
const DESCRIPTOR_BYTES: usize =
    std::mem::size_of::<PeerDescriptor>() + std::mem::size_of::<PeerLeases>();

/// How long the phases of a revoke took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerRevoke {
    /// Marking the chunks revoked and waiting for warps inside them to leave.
    pub waited: Duration,
    /// Invalidating their slot words.
    pub invalidated: Duration,
    /// Unmapping and releasing them.
    pub unmapped: Duration,
}

/// Where the slots' memory comes from.
#[derive(Debug)]
enum SlotMemory {
    /// Neighbour GPUs' memory allocated by this process.
    Own(BorrowedMemory),
    /// Chunks lent by other processes, mapped into a window as they arrive.
    Leased(Mutex<Leased>),
}

/// Leased chunks and the device words that guard them.
#[derive(Debug)]
struct Leased {
    window: PeerWindow,
    revoked: DeviceBuffer,
    inflight: DeviceBuffer,
    /// Host writes and polls while the user's kernels run (non-blocking: it waits for no
    /// other stream, and none waits for it).
    side: Stream,
    slots_per_chunk: u64,
    slot_words: u64,
    /// Successful `revoke` calls (reclaims answered) and the chunks they gave back.
    revocations: u64,
    revoked_chunks: u64,
}

/// A space's borrowed slots and their bookkeeping (in the borrower's memory).
#[derive(Debug)]
pub(crate) struct PeerTier {
    /// The borrowed memory, mapped for the space's GPU.
    memory: SlotMemory,
    /// `StrataPeer` followed by `StrataPeerLeases`.
    pub(crate) descriptor: DeviceBuffer,
    _slot_words: DeviceBuffer,
    _page_slots: DeviceBuffer,
    /// Slots (pages the borrowed memory can hold).
    pub(crate) slots: u64,
}

impl PeerTier {
    /// Borrows what `borrows` asks for (whole 2 MiB chunks) for a space of `pages` pages of
    /// `page_size` bytes on `gpu`.
    pub(crate) fn new(
        gpu: &Arc<Gpu>,
        borrows: &[PeerBorrow],
        page_size: u64,
        pages: u64,
    ) -> Result<Self, SpaceError> {
        let chunk = usize::try_from(PEER_CHUNK_BYTES).unwrap_or(usize::MAX);
        let lenders: Vec<(usize, usize)> = borrows
            .iter()
            .map(|b| {
                (
                    b.gpu,
                    usize::try_from(b.bytes / PEER_CHUNK_BYTES).unwrap_or(0),
                )
            })
            .collect();
        let memory = BorrowedMemory::new(gpu, &lenders, chunk)?;
        let slots = memory.len() as u64 / page_size;
        let base = memory.ptr();
        Self::assemble(
            gpu,
            SlotMemory::Own(memory),
            base,
            slots,
            pages,
            PeerLeases::default(),
        )
    }

    /// Room for up to `max_chunks` 2 MiB chunks lent by other processes (none mapped yet), for
    /// a space of `pages` pages of `page_size` bytes on `gpu`.
    pub(crate) fn leased(
        gpu: &Arc<Gpu>,
        max_chunks: usize,
        page_size: u64,
        pages: u64,
    ) -> Result<Self, SpaceError> {
        if page_size > PEER_CHUNK_BYTES || max_chunks == 0 {
            return Err(SpaceError::Invalid(format!(
                "leased peer chunks need pages of at most 2 MiB and room for at least one chunk (pages {page_size}, chunks {max_chunks})"
            )));
        }
        let chunks = u32::try_from(max_chunks)
            .map_err(|_| SpaceError::Invalid(format!("{max_chunks} chunks is too many")))?;
        let chunk = usize::try_from(PEER_CHUNK_BYTES).unwrap_or(usize::MAX);
        let window = PeerWindow::reserve(gpu, max_chunks, chunk)?;
        let slots_per_chunk = PEER_CHUNK_BYTES / page_size;
        let revoked = DeviceBuffer::zeroed(gpu, max_chunks * 4)?;
        revoked.upload(0, &vec![1u32; max_chunks])?;
        let inflight = DeviceBuffer::zeroed(gpu, max_chunks * 4)?;
        let leases = PeerLeases {
            revoked: revoked.ptr(),
            inflight: inflight.ptr(),
            chunk_shift: slots_per_chunk.trailing_zeros(),
            chunks,
            ..PeerLeases::default()
        };
        let base = window.ptr();
        let slots = max_chunks as u64 * slots_per_chunk;
        let memory = SlotMemory::Leased(Mutex::new(Leased {
            window,
            revoked,
            inflight,
            side: Stream::new(gpu)?,
            slots_per_chunk,
            slot_words: 0,
            revocations: 0,
            revoked_chunks: 0,
        }));
        let tier = Self::assemble(gpu, memory, base, slots, pages, leases)?;
        if let SlotMemory::Leased(l) = &tier.memory {
            l.lock().unwrap_or_else(PoisonError::into_inner).slot_words = tier._slot_words.ptr();
        }
        Ok(tier)
    }

    fn assemble(
        gpu: &Arc<Gpu>,
        memory: SlotMemory,
        base: u64,
        slots: u64,
        pages: u64,
        leases: PeerLeases,
    ) -> Result<Self, SpaceError> {
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| SpaceError::Invalid(format!("{v} bytes is too large")))
        };
        let slot_words = DeviceBuffer::zeroed(gpu, to_usize(slots * 8)?)?;
        let page_slots = DeviceBuffer::zeroed(gpu, to_usize(pages * 4)?)?;
        let descriptor = DeviceBuffer::zeroed(gpu, DESCRIPTOR_BYTES)?;
        descriptor.upload(
            0,
            &[PeerDescriptor {
                slots: base,
                slot_words: slot_words.ptr(),
                page_slots: page_slots.ptr(),
                slot_count: slots,
                ..PeerDescriptor::default()
            }],
        )?;
        descriptor.upload(std::mem::size_of::<PeerDescriptor>(), &[leases])?;
        Ok(PeerTier {
            memory,
            descriptor,
            _slot_words: slot_words,
            _page_slots: page_slots,
            slots,
        })
    }

    fn leased_state(&self) -> Result<std::sync::MutexGuard<'_, Leased>, SpaceError> {
        match &self.memory {
            SlotMemory::Leased(l) => Ok(l.lock().unwrap_or_else(PoisonError::into_inner)),
            SlotMemory::Own(_) => Err(SpaceError::Invalid(
                "this space's peer memory is its own (SpaceOptions::peers), not leased: create it with Space::enable_peer_leases".into(),
            )),
        }
    }

    /// Maps the chunk behind `fd` (exported by a lender) into a free chunk slot and makes its
    /// slots usable; returns the chunk's index. Safe while kernels run.
    pub(crate) fn attach(&self, fd: BorrowedFd<'_>) -> Result<usize, SpaceError> {
        let mut l = self.leased_state()?;
        let chunk = l.window.map(fd)?;
        // Its slot words are invalid already (zero at creation, invalidated at revoke).
        let zero = 0u32;
        // SAFETY: `zero` lives until the stream is synchronised below; the destination is
        // word `chunk` of our `revoked` buffer.
        unsafe {
            l.side.copy_htod(
                l.revoked.ptr() + 4 * chunk as u64,
                (&raw const zero).cast(),
                4,
            )?
        };
        l.side.synchronize()?;
        Ok(chunk)
    }

    /// Revokes `chunks`: no warp enters them any more, the ones inside leave (waited for
    /// until `deadline`), their slot words are invalidated (faults of their pages load from the
    /// host copy) and they are unmapped (adjacent chunks with one call). Safe while kernels
    /// run. Returns how long each phase took.
    pub(crate) fn revoke(
        &self,
        chunks: &[usize],
        deadline: Instant,
    ) -> Result<PeerRevoke, SpaceError> {
        let mut l = self.leased_state()?;
        let capacity = l.window.capacity();
        if chunks.is_empty() {
            return Ok(PeerRevoke::default());
        }
        if let Some(bad) = chunks.iter().find(|&&c| c >= capacity) {
            return Err(SpaceError::Invalid(format!(
                "peer chunk {bad} does not exist (room for {capacity})"
            )));
        }
        // Runs of adjacent chunks: one copy per run, not per chunk (each small copy costs tens
        // of microseconds while kernels run).
        let mut sorted = chunks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let runs = adjacent_runs(&sorted);
        let ones = vec![1u32; sorted.len()];
        for &(first, len) in &runs {
            // SAFETY: `ones` (at least `len` words) lives until the synchronisation below; the
            // destination is words first..first+len of `revoked` (all < capacity, checked).
            unsafe {
                l.side.copy_htod(
                    l.revoked.ptr() + 4 * first as u64,
                    ones.as_ptr().cast(),
                    4 * len,
                )?
            };
        }
        l.side.synchronize()?;
        let start = Instant::now();
        let mut inside = vec![0u32; capacity];
        loop {
            // SAFETY: `inside` (capacity words) lives until the synchronisation below; the
            // source is the whole `inflight` buffer.
            unsafe {
                l.side
                    .copy_dtoh(inside.as_mut_ptr().cast(), l.inflight.ptr(), capacity * 4)?
            };
            l.side.synchronize()?;
            let busy: u32 = chunks.iter().map(|&c| inside[c]).sum();
            if busy == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(SpaceError::Invalid(format!(
                    "{busy} warps still copy from or to the revoked peer chunks at the deadline: they stay revoked and mapped; revoke them again"
                )));
            }
            std::hint::spin_loop();
        }
        let waited = start.elapsed();
        let start = Instant::now();
        // No warp can touch these chunks' slot words now (a warp writes them only inside the
        // chunk): bump each word's generation and clear it, so a fault that read a word
        // before the revocation finds it changed and loads from the host copy.
        let spc = usize::try_from(l.slots_per_chunk).unwrap_or(usize::MAX);
        let (lo, hi) = (sorted[0], sorted[sorted.len() - 1] + 1);
        let mut words = vec![0u64; (hi - lo) * spc];
        let base = l.slot_words + 8 * (lo * spc) as u64;
        // SAFETY: `words` lives until the synchronisation; the source is the slot words of
        // chunks lo..hi inside our slot-word buffer (hi <= capacity).
        unsafe {
            l.side
                .copy_dtoh(words.as_mut_ptr().cast(), base, words.len() * 8)?
        };
        l.side.synchronize()?;
        for &(first, len) in &runs {
            let run = &mut words[(first - lo) * spc..(first - lo + len) * spc];
            for w in run.iter_mut() {
                *w = ((*w >> GEN_SHIFT) + 1) << GEN_SHIFT;
            }
            // SAFETY: `words` lives until the synchronisation below; only the revoked chunks'
            // words are written back (chunks between them are live and not ours to touch).
            unsafe {
                l.side.copy_htod(
                    base + 8 * ((first - lo) * spc) as u64,
                    run.as_ptr().cast(),
                    run.len() * 8,
                )?
            };
        }
        l.side.synchronize()?;
        let invalidated = start.elapsed();
        let start = Instant::now();
        l.window.unmap_many(&sorted)?;
        l.revocations += 1;
        l.revoked_chunks += sorted.len() as u64;
        Ok(PeerRevoke {
            waited,
            invalidated,
            unmapped: start.elapsed(),
        })
    }

    /// The descriptor as the device left it (counters included); no kernel may run.
    pub(crate) fn state(&self) -> Result<PeerDescriptor, SpaceError> {
        let mut d = [PeerDescriptor::default()];
        self.descriptor.download(0, &mut d)?;
        Ok(d[0])
    }

    /// Zeroes the counters (not the slots); no kernel may run.
    pub(crate) fn reset_counters(&self) -> Result<(), SpaceError> {
        let mut d = self.state()?;
        d.loads = 0;
        d.stores = 0;
        d.stale = 0;
        self.descriptor.upload(0, &[d])?;
        let at = std::mem::size_of::<PeerDescriptor>();
        let mut leases = [PeerLeases::default()];
        self.descriptor.download(at, &mut leases)?;
        leases[0].refused = 0;
        self.descriptor.upload(at, &leases)?;
        if let SlotMemory::Leased(l) = &self.memory {
            let mut l = l.lock().unwrap_or_else(PoisonError::into_inner);
            l.revocations = 0;
            l.revoked_chunks = 0;
        }
        Ok(())
    }

    /// Bytes borrowed (mapped now).
    pub(crate) fn borrowed_bytes(&self) -> u64 {
        match &self.memory {
            SlotMemory::Own(m) => m.len() as u64,
            SlotMemory::Leased(l) => {
                let l = l.lock().unwrap_or_else(PoisonError::into_inner);
                (l.window.mapped() * l.window.chunk_bytes()) as u64
            }
        }
    }

    /// Reclaims answered (successful revokes) and the chunks they gave back; (0, 0) for
    /// memory this process borrowed itself.
    pub(crate) fn reclaims(&self) -> (u64, u64) {
        match &self.memory {
            SlotMemory::Own(_) => (0, 0),
            SlotMemory::Leased(l) => {
                let l = l.lock().unwrap_or_else(PoisonError::into_inner);
                (l.revocations, l.revoked_chunks)
            }
        }
    }

    /// Chunk entries refused because the chunk was absent or revoked; no kernel may run.
    pub(crate) fn refused(&self) -> Result<u64, SpaceError> {
        let mut d = [PeerLeases::default()];
        self.descriptor
            .download(std::mem::size_of::<PeerDescriptor>(), &mut d)?;
        Ok(d[0].refused)
    }
}

/// `sorted` (ascending, no repeats) as runs of adjacent values: (first, length).
fn adjacent_runs(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &c in sorted {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == c => *len += 1,
            _ => runs.push((c, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::adjacent_runs;

    #[test]
    fn runs_of_adjacent_chunks() {
        assert_eq!(adjacent_runs(&[]), vec![]);
        assert_eq!(adjacent_runs(&[3]), vec![(3, 1)]);
        assert_eq!(
            adjacent_runs(&[0, 1, 2, 5, 6, 9]),
            vec![(0, 3), (5, 2), (9, 1)]
        );
    }
}
