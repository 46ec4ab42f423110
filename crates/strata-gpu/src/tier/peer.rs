//! The peer tier: a victim cache in memory borrowed from neighbour GPUs, above the pinned host
//! copy (device side `cuda/strata/tier_peer.cuh`). Every page leaving a GPU frame is also
//! copied into a borrowed slot; a fault on a page that still has its slot copies it over
//! NVLink instead of PCIe. Slot copies are always clean (the host copy is written at the same
//! eviction), so the host never writes anything back from them, and dropping them (host
//! writes to the space, the space's end) loses nothing.

use std::sync::Arc;

use crate::driver::{BorrowedMemory, DeviceBuffer, Gpu};
use crate::layout::PeerDescriptor;
use crate::space::{PEER_CHUNK_BYTES, PeerBorrow, SpaceError};

/// A space's borrowed slots and their bookkeeping (in the borrower's memory).
#[derive(Debug)]
pub(crate) struct PeerTier {
    /// The borrowed chunks, mapped for the space's GPU.
    memory: BorrowedMemory,
    /// `StrataPeer`.
    pub(crate) descriptor: DeviceBuffer,
    _slot_words: DeviceBuffer,
    _page_slots: DeviceBuffer,
    /// Slots (pages the borrowed memory holds).
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
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| SpaceError::Invalid(format!("{v} bytes is too large")))
        };
        let slot_words = DeviceBuffer::zeroed(gpu, to_usize(slots * 8)?)?;
        let page_slots = DeviceBuffer::zeroed(gpu, to_usize(pages * 4)?)?;
        let descriptor = DeviceBuffer::zeroed(gpu, std::mem::size_of::<PeerDescriptor>())?;
        descriptor.upload(
            0,
            &[PeerDescriptor {
                slots: memory.ptr(),
                slot_words: slot_words.ptr(),
                page_slots: page_slots.ptr(),
                slot_count: slots,
                ..PeerDescriptor::default()
            }],
        )?;
        Ok(PeerTier {
            memory,
            descriptor,
            _slot_words: slot_words,
            _page_slots: page_slots,
            slots,
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
        Ok(())
    }

    /// Bytes borrowed.
    pub(crate) fn borrowed_bytes(&self) -> u64 {
        self.memory.len() as u64
    }
}
