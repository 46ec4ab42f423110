//! The host's view of the memory a store-backed space shares with the GPU: the ring entries,
//! `head`, the `done` words, the per-page slot words, the slot reference bytes, the host-cache
//! slots and the write staging pages (see [`super::layout`] for who writes what).
//!
//! This file is the ring's raw-memory boundary: every pointer is dereferenced here and nowhere
//! else. Words are handed out as atomics; page bytes move through copy helpers whose safety
//! contract is the seqlock protocol of `layout.rs` (the host is the only writer of a slot's
//! bytes, and device readers validate what they copied against the slot word).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64};

use super::error::RingError;
use super::layout::RingRequest;

// Sizes are checked to fit `usize` once; indices below them then convert without loss.
const _: () = assert!(size_of::<usize>() == size_of::<u64>());

/// `u64` to `usize` on the 64-bit hosts this crate supports (asserted above).
#[allow(clippy::cast_possible_truncation)]
fn to_usize(v: u64) -> usize {
    v as usize
}

/// Alignment of every area [`SharedRing::in_heap`] allocates (a page, like pinned memory).
pub const SHARED_ALIGN: usize = 4096;

/// The shape of the shared memory, checked once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Ring entries (a power of two).
    pub capacity: u32,
    /// Pages of the space (`ceil(space_size / page_size)`).
    pub pages: u64,
    /// Host-cache slots.
    pub slot_count: u64,
    /// Bytes per page (a multiple of 16).
    pub page_size: u64,
    /// Bytes of the space; the last page may be partial.
    pub space_size: u64,
}

impl RingGeometry {
    /// Checks the shape: capacity a power of two, page size a nonzero multiple of 16, `pages`
    /// matching the space size, at least one slot, slot indices fitting the slot word, and
    /// every area's size fitting the address space.
    pub fn check(&self) -> Result<(), RingError> {
        let bad = |s: String| Err(RingError::Geometry(s));
        if self.capacity == 0 || !self.capacity.is_power_of_two() || self.capacity > 1 << 30 {
            return bad(format!(
                "capacity {} is not a power of two in 1..=2^30",
                self.capacity
            ));
        }
        if self.page_size == 0 || !self.page_size.is_multiple_of(16) {
            return bad(format!(
                "page size {} is not a nonzero multiple of 16",
                self.page_size
            ));
        }
        if self.space_size == 0 {
            return bad("the space is empty".into());
        }
        if self.pages != self.space_size.div_ceil(self.page_size) {
            return bad(format!(
                "{} pages do not cover a space of {} bytes in pages of {} (it takes {})",
                self.pages,
                self.space_size,
                self.page_size,
                self.space_size.div_ceil(self.page_size)
            ));
        }
        if self.slot_count == 0 || self.slot_count >= u64::from(u32::MAX) {
            return bad(format!(
                "slot count {} is not in 1..2^32-1",
                self.slot_count
            ));
        }
        for (what, bytes) in [
            ("entries", u64::from(self.capacity).checked_mul(32)),
            ("slot words", self.pages.checked_mul(8)),
            ("slots", self.slot_count.checked_mul(self.page_size)),
            (
                "staging",
                u64::from(self.capacity).checked_mul(self.page_size),
            ),
        ] {
            match bytes {
                Some(b) if b <= 1 << 62 => {}
                _ => return bad(format!("the {what} area does not fit in memory")),
            }
        }
        Ok(())
    }
}

/// Heap memory owned by a [`SharedRing`] made with [`SharedRing::in_heap`].
struct HeapArea {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the area is plain bytes owned by this value alone; who touches it concurrently is
// governed by SharedRing's accessors, not by this owner.
unsafe impl Send for HeapArea {}
// SAFETY: as above; the owner itself exposes nothing.
unsafe impl Sync for HeapArea {}

impl HeapArea {
    fn zeroed(bytes: u64) -> Result<Self, RingError> {
        let size = to_usize(bytes.max(1));
        let layout = Layout::from_size_align(size, SHARED_ALIGN)
            .map_err(|_| RingError::OutOfMemory { bytes })?;
        // SAFETY: the layout has a nonzero size (at least 1 byte).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RingError::OutOfMemory { bytes });
        }
        Ok(HeapArea { ptr, layout })
    }
}

impl Drop for HeapArea {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Host addresses of the memory a store-backed space shares with the GPU, and the memory's
/// owner. See the module docs and [`super::layout`].
pub struct SharedRing {
    entries: *mut RingRequest,
    head: *mut u64,
    done: *mut u64,
    slot_words: *mut u64,
    slot_refs: *mut u8,
    slots: *mut u8,
    staging: *mut u8,
    geometry: RingGeometry,
    /// Owns the memory; dropped last.
    _keep_alive: Box<dyn Any + Send + Sync>,
}

// SAFETY: the pointers stay valid while `_keep_alive` lives (an invariant of the
// constructors); every word is reached through atomics and page bytes through the unsafe copy
// helpers, whose callers uphold the single-writer rules of the protocol.
unsafe impl Send for SharedRing {}
// SAFETY: as above.
unsafe impl Sync for SharedRing {}

impl fmt::Debug for SharedRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRing")
            .field("geometry", &self.geometry)
            .field("entries", &self.entries)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl SharedRing {
    /// Zeroed, 4096-aligned heap memory for a ring of `capacity` entries over a space of
    /// `space_size` bytes in `pages` pages of `page_size`, with `slot_count` host-cache slots.
    /// For tests and for a device emulated by host threads; the GPU needs pinned mapped memory
    /// ([`SharedRing::from_raw`]).
    pub fn in_heap(
        capacity: u32,
        pages: u64,
        slot_count: u64,
        page_size: u64,
        space_size: u64,
    ) -> Result<Self, RingError> {
        let geometry = RingGeometry {
            capacity,
            pages,
            slot_count,
            page_size,
            space_size,
        };
        geometry.check()?;
        let cap = u64::from(capacity);
        let areas = [
            HeapArea::zeroed(cap * 32)?,
            HeapArea::zeroed(8)?,
            HeapArea::zeroed(cap * 8)?,
            HeapArea::zeroed(pages * 8)?,
            HeapArea::zeroed(slot_count)?,
            HeapArea::zeroed(slot_count * page_size)?,
            HeapArea::zeroed(cap * page_size)?,
        ];
        let p: Vec<*mut u8> = areas.iter().map(|a| a.ptr).collect();
        // SAFETY: each area is zeroed, 4096-aligned, as large as `from_raw` requires for this
        // geometry, distinct from the others, and owned by `areas`, which becomes the owner.
        unsafe {
            Self::from_raw(
                p[0].cast(),
                p[1].cast(),
                p[2].cast(),
                p[3].cast(),
                p[4],
                p[5],
                p[6],
                geometry,
                Box::new(areas),
            )
        }
    }

    /// Wraps memory allocated elsewhere (pinned, mapped CUDA host buffers).
    ///
    /// # Safety
    /// For as long as `keep_alive` lives:
    /// * `entries` points to `capacity` [`RingRequest`]s, `done` to `capacity` u64s,
    ///   `slot_words` to `pages` u64s, `head` to one u64 (all 8-byte aligned); `slot_refs` to
    ///   `slot_count` bytes, `slots` to `slot_count * page_size` bytes and `staging` to
    ///   `capacity * page_size` bytes; each valid for reads and writes, none overlapping another.
    /// * Every word starts zero (`seq`, `head`, `done`, slot words): a nonzero `seq` would be
    ///   taken for a posted request.
    /// * Nothing but this value and a device that follows the protocol of
    ///   [`super::layout`] touches the memory, and host and device see each other's stores
    ///   (pinned memory mapped into the GPU is coherent at system scope).
    /// * `keep_alive` owns (or keeps alive) the memory; it is dropped after the last use.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_raw(
        entries: *mut RingRequest,
        head: *mut u64,
        done: *mut u64,
        slot_words: *mut u64,
        slot_refs: *mut u8,
        slots: *mut u8,
        staging: *mut u8,
        geometry: RingGeometry,
        keep_alive: Box<dyn Any + Send + Sync>,
    ) -> Result<Self, RingError> {
        geometry.check()?;
        for (what, ptr, align) in [
            ("entries", entries.cast::<u8>(), 8),
            ("head", head.cast(), 8),
            ("done", done.cast(), 8),
            ("slot words", slot_words.cast(), 8),
            ("slot references", slot_refs, 1),
            ("slots", slots, 16),
            ("staging", staging, 16),
        ] {
            if ptr.is_null() || !(ptr as usize).is_multiple_of(align) {
                return Err(RingError::Geometry(format!(
                    "the {what} pointer {ptr:?} is null or not {align}-byte aligned"
                )));
            }
        }
        Ok(SharedRing {
            entries,
            head,
            done,
            slot_words,
            slot_refs,
            slots,
            staging,
            geometry,
            _keep_alive: keep_alive,
        })
    }

    /// The shape.
    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Ring entries (a power of two).
    pub fn capacity(&self) -> u32 {
        self.geometry.capacity
    }

    /// Pages of the space.
    pub fn pages(&self) -> u64 {
        self.geometry.pages
    }

    /// Host-cache slots.
    pub fn slot_count(&self) -> u64 {
        self.geometry.slot_count
    }

    /// Bytes per page.
    pub fn page_size(&self) -> u64 {
        self.geometry.page_size
    }

    /// Bytes of the space.
    pub fn space_size(&self) -> u64 {
        self.geometry.space_size
    }

    /// The entry index of ticket `ticket`.
    pub fn ring_index(&self, ticket: u64) -> u32 {
        // The mask keeps the value below `capacity`, a u32.
        u32::try_from(ticket & u64::from(self.geometry.capacity - 1)).unwrap_or(0)
    }

    /// Store bytes page `page` covers: `[page * page_size, min((page+1) * page_size, size))`.
    ///
    /// # Panics
    /// If `page` is not a page of the space.
    pub fn page_range(&self, page: u64) -> (u64, usize) {
        assert!(page < self.geometry.pages, "page {page} out of range");
        let start = page * self.geometry.page_size;
        let end = (start + self.geometry.page_size).min(self.geometry.space_size);
        (start, to_usize(end - start))
    }

    fn page_bytes(&self) -> usize {
        to_usize(self.geometry.page_size)
    }

    fn entry(&self, index: u32) -> *mut RingRequest {
        assert!(index < self.geometry.capacity, "entry {index} out of range");
        // SAFETY: index < capacity, the entries area's length (constructor invariant).
        unsafe { self.entries.add(index as usize) }
    }

    /// Entry `index`'s `seq` (ticket + 1 once published).
    pub fn entry_seq(&self, index: u32) -> &AtomicU64 {
        // SAFETY: the field lies in the live, aligned entries area; every access to it goes
        // through atomics (host and emulated device alike; the GPU stores it with a
        // system-scope release after a fence).
        unsafe { AtomicU64::from_ptr(&raw mut (*self.entry(index)).seq) }
    }

    /// Entry `index`'s page.
    pub fn entry_page(&self, index: u32) -> &AtomicU64 {
        // SAFETY: as for `entry_seq`.
        unsafe { AtomicU64::from_ptr(&raw mut (*self.entry(index)).page) }
    }

    /// Entry `index`'s kind (`REQ_*`).
    pub fn entry_kind(&self, index: u32) -> &AtomicU32 {
        // SAFETY: as for `entry_seq`; the field is 4-byte aligned inside the 8-aligned entry.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.entry(index)).kind) }
    }

    /// Tickets the host has consumed (written by the host only).
    pub fn head(&self) -> &AtomicU64 {
        // SAFETY: `head` is a live, aligned u64 accessed only through atomics.
        unsafe { AtomicU64::from_ptr(self.head) }
    }

    /// Completion word of entry `index`: `t + 1` once write ticket `t` is in the host cache.
    pub fn done(&self, index: u32) -> &AtomicU64 {
        assert!(index < self.geometry.capacity, "done {index} out of range");
        // SAFETY: index < capacity, the done area's length; accessed only through atomics.
        unsafe { AtomicU64::from_ptr(self.done.add(index as usize)) }
    }

    /// Page `page`'s slot word (written by the host only).
    ///
    /// # Panics
    /// If `page` is not a page of the space.
    pub fn slot_word(&self, page: u64) -> &AtomicU64 {
        assert!(page < self.geometry.pages, "slot word {page} out of range");
        // SAFETY: page < pages, the slot-word area's length; accessed only through atomics.
        unsafe { AtomicU64::from_ptr(self.slot_words.add(to_usize(page))) }
    }

    /// Slot `slot`'s reference byte (the device stores 1 on a hit; the host's clock clears it).
    pub fn slot_ref(&self, slot: u32) -> &AtomicU8 {
        assert!(
            u64::from(slot) < self.geometry.slot_count,
            "slot {slot} out of range"
        );
        // SAFETY: slot < slot_count, the reference area's length; accessed only through atomics.
        unsafe { AtomicU8::from_ptr(self.slot_refs.add(slot as usize)) }
    }

    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        assert!(
            u64::from(slot) < self.geometry.slot_count,
            "slot {slot} out of range"
        );
        // SAFETY: slot < slot_count, so the slot's page lies inside the slots area.
        unsafe { self.slots.add(slot as usize * self.page_bytes()) }
    }

    fn staging_ptr(&self, index: u32) -> *mut u8 {
        assert!(
            index < self.geometry.capacity,
            "staging {index} out of range"
        );
        // SAFETY: index < capacity, so the staging page lies inside the staging area.
        unsafe { self.staging.add(index as usize * self.page_bytes()) }
    }

    /// Slot `slot`'s bytes, to fill from the store.
    ///
    /// # Safety
    /// The caller is the slot's only host writer and reader until the slice is dropped (the
    /// slot is FILLING and owned by the caller's job), and the slot's page shows no PRESENT
    /// slot word naming this slot (device readers that copy it anyway discard the copy, as the
    /// seqlock of the protocol requires).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_bytes_mut(&self, slot: u32) -> &mut [u8] {
        // SAFETY: the slot's page lies in the slots area; exclusivity on the host is the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(slot), self.page_bytes()) }
    }

    /// Slot `slot`'s bytes, to write to the store or copy out.
    ///
    /// # Safety
    /// No host thread writes the slot until the slice is dropped (the slot is WRITING, or the
    /// caller holds the host cache's lock). The device never writes slots.
    pub unsafe fn slot_bytes(&self, slot: u32) -> &[u8] {
        // SAFETY: as for `slot_bytes_mut`, shared.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(slot), self.page_bytes()) }
    }

    /// Copies `src` into slot `slot` and zeroes the rest of the slot.
    ///
    /// # Safety
    /// As for [`SharedRing::slot_bytes_mut`]: the caller is the slot's only host writer, and the
    /// slot word of the slot's page (if any) was cleared first.
    ///
    /// # Panics
    /// If `src` is longer than a page.
    pub unsafe fn copy_into_slot(&self, slot: u32, src: &[u8]) {
        // SAFETY: forwarded contract.
        let dst = unsafe { self.slot_bytes_mut(slot) };
        dst[..src.len()].copy_from_slice(src);
        dst[src.len()..].fill(0);
    }

    /// Copies the first `len` bytes of staging page `index` into slot `slot` and zeroes the
    /// rest of the slot (bytes past the space's end must read as zero).
    ///
    /// # Safety
    /// As for [`SharedRing::copy_into_slot`]; besides, staging page `index` belongs to a
    /// published write ticket that `head` has not yet passed (so no warp writes it now).
    pub unsafe fn copy_staging_to_slot(&self, index: u32, slot: u32, len: usize) {
        assert!(len <= self.page_bytes(), "length {len} exceeds a page");
        // SAFETY: the staging page is stable (contract) and inside the staging area.
        let src = unsafe { std::slice::from_raw_parts(self.staging_ptr(index), len) };
        // SAFETY: forwarded contract; the areas do not overlap.
        unsafe { self.copy_into_slot(slot, src) }
    }

    /// Copies `dst.len()` bytes from slot `slot` (a device-side hit, or a copy of a dirty
    /// page). The copy may be torn if a host thread writes the slot meanwhile.
    ///
    /// # Safety
    /// Either no host thread writes the slot meanwhile (as for [`SharedRing::slot_bytes`]),
    /// or the caller is a seqlock reader that validates the copy against the slot word and
    /// discards it if the word changed.
    pub unsafe fn copy_from_slot(&self, slot: u32, dst: &mut [u8]) {
        assert!(dst.len() <= self.page_bytes(), "copy exceeds a page");
        // SAFETY: the source lies in the slots area; torn reads are the caller's to discard.
        unsafe { std::ptr::copy_nonoverlapping(self.slot_ptr(slot), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `dst.len()` bytes out of staging page `index`.
    ///
    /// # Safety
    /// As for [`SharedRing::copy_staging_to_slot`]: the staging page belongs to a published
    /// write ticket that `head` has not yet passed.
    pub unsafe fn copy_from_staging(&self, index: u32, dst: &mut [u8]) {
        assert!(dst.len() <= self.page_bytes(), "copy exceeds a page");
        // SAFETY: the source lies in the staging area and is stable (contract).
        unsafe {
            std::ptr::copy_nonoverlapping(self.staging_ptr(index), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Copies `src` into staging page `index` (the device's side of a write request).
    ///
    /// # Safety
    /// The caller holds ticket `t` with `t % capacity == index`, not yet published, and `head`
    /// has passed `t - capacity` (so the host no longer reads this staging page).
    pub unsafe fn copy_to_staging(&self, index: u32, src: &[u8]) {
        assert!(src.len() <= self.page_bytes(), "copy exceeds a page");
        // SAFETY: the destination lies in the staging area and is the caller's alone.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.staging_ptr(index), src.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_checked() {
        let ok = RingGeometry {
            capacity: 8,
            pages: 3,
            slot_count: 2,
            page_size: 4096,
            space_size: 3 * 4096 - 100,
        };
        ok.check().unwrap();
        for bad in [
            RingGeometry { capacity: 6, ..ok },
            RingGeometry { capacity: 0, ..ok },
            RingGeometry { pages: 4, ..ok },
            RingGeometry {
                page_size: 1000,
                ..ok
            },
            RingGeometry {
                slot_count: 0,
                ..ok
            },
            RingGeometry {
                space_size: 0,
                pages: 0,
                ..ok
            },
            RingGeometry {
                slot_count: u64::MAX / 2,
                ..ok
            },
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.to_string().contains("fix the sizes"), "{e}");
        }
    }

    #[test]
    fn heap_memory_is_zeroed_aligned_and_addressable() {
        let r = SharedRing::in_heap(4, 3, 2, 4096, 3 * 4096 - 100).unwrap();
        assert_eq!(r.page_range(2), (2 * 4096, 4096 - 100));
        assert_eq!(r.ring_index(9), 1);
        for i in 0..4 {
            assert_eq!(r.entry_seq(i).load(std::sync::atomic::Ordering::Relaxed), 0);
            assert_eq!(r.done(i).load(std::sync::atomic::Ordering::Relaxed), 0);
        }
        assert_eq!(r.head().load(std::sync::atomic::Ordering::Relaxed), 0);
        // SAFETY: single-threaded test; nothing else touches the ring.
        unsafe {
            assert!(r.slot_bytes(1).iter().all(|&b| b == 0));
            assert_eq!(r.slot_bytes(0).as_ptr() as usize % SHARED_ALIGN, 0);
            r.copy_to_staging(3, &[7; 64]);
            r.copy_into_slot(1, &[9; 4096]);
            r.copy_staging_to_slot(3, 1, 32);
            let mut got = vec![1u8; 4096];
            r.copy_from_slot(1, &mut got);
            assert_eq!(&got[..32], &[7; 32]);
            assert!(got[32..].iter().all(|&b| b == 0), "the rest is zeroed");
        }
    }
}
