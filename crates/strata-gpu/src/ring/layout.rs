//! The memory the GPU and the host share for a store-backed space: the request ring, the
//! per-page host-cache words, the host-cache slots and the write-back staging pages. The device
//! side is `cuda/strata/tier_ring.cuh`; both sides check the sizes.
//!
//! Protocol (the device is any number of warps; the host is the ring server's threads):
//!
//! * **Posting.** A warp claims ticket `t` with an atomic add on the ring's `tail` (in GPU
//!   memory), waits (bounded, with back-off) until `t - head < capacity` (`head` is written by
//!   the host: tickets it has consumed), writes entry `t % capacity` (`page`, `kind`; for a
//!   write, the page's bytes into staging page `t % capacity` first), fences at system scope,
//!   and stores `seq = t + 1` last. The host consumes entries strictly in ticket order: it waits
//!   for entry `head % capacity` to show `seq == head + 1`, reads it, handles it, and only then
//!   advances `head` (so a staging page is never reused before the host has copied it).
//! * **Reads** ([`REQ_READ`]). The host makes the page present in the host cache (a slot from
//!   the cache's own replacement policy; a dirty victim slot is written to the store first),
//!   filled from the store (`read_batch`), and then publishes the page's slot word:
//!   `PRESENT | slot | generation+1`. The warp waits on that word, not on the entry: the slot
//!   word is the read's completion word. On a store error the host publishes
//!   `ERROR | generation+1` and keeps the store's message for `check_errors`. The word stays
//!   ERROR (READs of the page are ignored meanwhile) until the host takes the errors, which
//!   withdraws it (no flags, generation+1) so that the next access retries the store. A warp
//!   whose page's word moved to another generation without PRESENT or ERROR (the page was
//!   filled and evicted again before the warp looked) posts its READ again.
//! * **Hits in the host cache** need no request: a warp reads the slot word (acquire), copies
//!   the slot, fences, and reads the word again; equal words prove the slot held the page
//!   throughout (a seqlock). The host therefore changes the word (clears PRESENT, bumps the
//!   generation) *before* it overwrites or reuses a slot. The warp also stores 1 into the
//!   slot's reference byte (`slot_refs`), which the host cache's clock reads and clears.
//! * **Writes** ([`REQ_WRITE`]): a dirty page leaving a GPU frame. The host copies the staging
//!   page into the page's slot (taking one if it has none), marks the slot dirty, bumps the
//!   generation, and stores `done[t % capacity] = t + 1`. The warp keeps the page EVICTING in
//!   its page table until it sees `done >= t + 1`, so no later fault can read the page from
//!   anywhere before the write is in the host cache; and since the host handles tickets in
//!   order, a read posted after the write sees it. The host stores `done` for every WRITE
//!   ticket, even one it must refuse (a page past the space's end: the error is recorded).
//! * **Read-ahead** ([`REQ_READ_AHEAD`]): like a read, but no warp waits; the host may drop it
//!   when the cache has no clean slot to spare. A failed read-ahead publishes no ERROR: it
//!   withdraws the word (generation+1), and a waiting warp re-posts its READ.
//! * The host never writes GPU memory and the GPU never does atomics on host memory: every
//!   shared word has exactly one writer side, except the reference bytes (the device stores
//!   1, the host's clock stores 0; a lost reference only costs a page its second chance).

use std::mem::{offset_of, size_of};

/// Request kind: bring the page into the host cache (a warp waits on its slot word).
pub const REQ_READ: u32 = 1;
/// Request kind: the staging page holds the page's new bytes (a warp waits on `done`).
pub const REQ_WRITE: u32 = 2;
/// Request kind: bring the page in if convenient (nobody waits).
pub const REQ_READ_AHEAD: u32 = 3;

/// Slot word: the slot index bits.
pub const SLOT_INDEX_MASK: u64 = 0xFFFF_FFFF;
/// Slot word: the page is in the host cache at the slot in the low bits.
pub const SLOT_PRESENT: u64 = 1 << 32;
/// Slot word: the store failed to read the page (the message is on the host).
pub const SLOT_ERROR: u64 = 1 << 33;
/// Slot word: generation shift; the generation is bumped on every change of the word.
pub const SLOT_GEN_SHIFT: u32 = 40;
/// Slot word: one generation.
pub const SLOT_GEN_ONE: u64 = 1 << SLOT_GEN_SHIFT;

/// One ring entry (`StrataRequest`), in pinned host memory, written by one warp.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingRequest {
    /// Ticket + 1, stored last: the entry is published when it equals the ticket + 1.
    pub seq: u64,
    /// Page of the space.
    pub page: u64,
    /// `REQ_*`.
    pub kind: u32,
    /// Unused (zero).
    pub reserved: u32,
    /// Unused (zero).
    pub reserved2: u64,
}

/// The ring's descriptor (`StrataRing`), in GPU memory; `tail` is the only field that changes
/// (the device's ticket counter). Pointers are device addresses of pinned mapped host memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingDescriptor {
    /// Tickets claimed by warps (device atomics).
    pub tail: u64,
    /// `[capacity]` [`RingRequest`].
    pub entries: u64,
    /// One u64: tickets the host has consumed.
    pub head: u64,
    /// `[capacity]` u64: completion of write tickets (`t + 1` once applied).
    pub done: u64,
    /// `[pages]` u64 slot words.
    pub slot_words: u64,
    /// `[slot_count]` u8 reference bytes (the device stores 1 on a hit).
    pub slot_refs: u64,
    /// `[slot_count * page_size]` host-cache bytes.
    pub slots: u64,
    /// `[capacity * page_size]` staging pages for writes.
    pub staging: u64,
    /// Slots in the host cache.
    pub slot_count: u64,
    /// Entries (a power of two).
    pub capacity: u32,
    /// Unused (zero).
    pub flags: u32,
}

const _: () = assert!(size_of::<RingRequest>() == 32);
const _: () = assert!(size_of::<RingDescriptor>() == 80);
const _: () = assert!(offset_of!(RingDescriptor, slot_count) == 64);
const _: () = assert!(offset_of!(RingDescriptor, capacity) == 72);

/// Decoded slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotWord {
    /// In the host cache.
    pub present: bool,
    /// The store failed on it.
    pub error: bool,
    /// Slot (meaningful when present).
    pub slot: u32,
    /// Generation (24 bits).
    pub generation: u32,
}

impl SlotWord {
    /// Decodes.
    pub fn decode(w: u64) -> Self {
        SlotWord {
            present: w & SLOT_PRESENT != 0,
            error: w & SLOT_ERROR != 0,
            slot: u32::try_from(w & SLOT_INDEX_MASK).unwrap_or(u32::MAX),
            generation: u32::try_from(w >> SLOT_GEN_SHIFT).unwrap_or(u32::MAX),
        }
    }
    /// Encodes.
    pub fn encode(self) -> u64 {
        u64::from(self.slot)
            | if self.present { SLOT_PRESENT } else { 0 }
            | if self.error { SLOT_ERROR } else { 0 }
            | (u64::from(self.generation & 0xFF_FFFF) << SLOT_GEN_SHIFT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_words_round_trip() {
        for w in [
            SlotWord {
                present: true,
                error: false,
                slot: 7,
                generation: 3,
            },
            SlotWord {
                present: false,
                error: true,
                slot: 0,
                generation: 0xFF_FFFF,
            },
            SlotWord {
                present: false,
                error: false,
                slot: u32::MAX,
                generation: 0,
            },
        ] {
            assert_eq!(SlotWord::decode(w.encode()), w);
        }
        // A generation bump by adding SLOT_GEN_ONE wraps out of the word rather than into flags.
        let top = SlotWord {
            present: true,
            error: false,
            slot: 1,
            generation: 0xFF_FFFF,
        }
        .encode();
        assert_eq!(
            SlotWord::decode(top.wrapping_add(SLOT_GEN_ONE)).generation,
            0
        );
        assert!(SlotWord::decode(top.wrapping_add(SLOT_GEN_ONE)).present);
    }
}
