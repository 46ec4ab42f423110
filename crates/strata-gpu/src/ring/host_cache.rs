//! The bounded host cache between the GPU cache and the store: which page each slot holds,
//! whether it is dirty, what is being done to it, and which slot to reuse next.
//!
//! Replacement is CLOCK over slots: a slot is spared once if the device touched it (its
//! `slot_refs` byte) or the host did (a READ or WRITE for its page); a clean, unreferenced,
//! PRESENT slot is taken. Dirty slots are never taken: they are written to the store first
//! (by the server, in batches) and taken once clean. A page the store refuses to take stays
//! dirty in its slot; when every slot holds such a page, a write that needs a slot keeps its
//! bytes in an overflow map on the heap instead, so nothing is ever dropped.
//!
//! Slot words follow the seqlock rule of [`super::layout`]: before a slot's bytes are
//! overwritten or the slot reused, its page's word loses PRESENT and gains a generation (a
//! release store, then a sequentially consistent fence); new contents are published with a
//! release store of `PRESENT | slot | generation + 1`.
//!
//! A WRITE's bytes reach a slot through [`HostCache::begin_absorb`] (word withdrawn, slot
//! ABSORBING), a copy by a copier thread outside the lock, and [`HostCache::finish_absorb`]
//! (dirty, PRESENT): an ABSORBING slot is to READs what a FILLING one is (they wait for the
//! word), and nothing takes, writes back or copies it meanwhile.
//!
//! Not thread-safe by itself: the server keeps it behind one mutex.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{Ordering, fence};

use super::error::{PageFailure, PageOp};
use super::layout::SlotWord;
use super::shared::SharedRing;

/// The outcome of writing (page, slot) to the store.
pub(crate) type WriteResult = ((u64, u32), Result<(), String>);

/// What is happening to a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Holds nothing.
    Free,
    /// A store read is filling it (a worker owns its bytes).
    Filling,
    /// Holds its page; readable by the device.
    Present,
    /// Holds its page, which is being written to the store (readable; not writable).
    Writing,
    /// A WRITE's bytes are being copied in from its staging page (a copier owns the bytes;
    /// the page's word is withdrawn until the copy ends, so READs wait as for a fill).
    Absorbing,
}

#[derive(Debug, Clone)]
struct Slot {
    page: u64,
    state: SlotState,
    dirty: bool,
    /// Referenced by a host request since the clock last passed.
    host_ref: bool,
    /// Filling for read-ahead only: nobody waits, so a failed fill is forgotten, not an error.
    ahead: bool,
    /// WRITING an old version of a page that has moved to another slot: when the store
    /// write ends the slot is freed and the outcome ignored (the newer bytes are dirty there).
    orphan: bool,
}

/// Stores `word` for `page`: the next generation, with the given flags.
fn store_word(shared: &SharedRing, page: u64, present: Option<u32>, error: bool) {
    let word = shared.slot_word(page);
    // The host is the word's only writer, and all host writers hold the cache's lock.
    let old = SlotWord::decode(word.load(Ordering::Relaxed));
    let new = SlotWord {
        present: present.is_some(),
        error,
        slot: present.unwrap_or(0),
        generation: old.generation.wrapping_add(1),
    };
    word.store(new.encode(), Ordering::Release);
}

/// Withdraws `page`'s word (not present, next generation) before its slot is overwritten or
/// reused; the fence keeps the slot's later byte stores from becoming visible first.
pub(crate) fn withdraw_word(shared: &SharedRing, page: u64) {
    store_word(shared, page, None, false);
    fence(Ordering::SeqCst);
}

/// The bounded host cache's table. See the module docs.
#[derive(Debug)]
pub(crate) struct HostCache {
    slots: Vec<Slot>,
    free: Vec<u32>,
    map: HashMap<u64, u32>,
    hand: usize,
    dirty: u64,
    filling: u64,
    writing: u64,
    absorbing: u64,
    max_absorbing: u64,
    overflow: BTreeMap<u64, Vec<u8>>,
    /// Pages with an orphaned store write in flight: none of their slots is written back
    /// until it ends, so two writes of one page never race in the store.
    orphan_pages: HashSet<u64>,
    failures: BTreeMap<(u64, PageOp), String>,
    evictions: u64,
    redirects: u64,
}

impl HostCache {
    /// An empty cache of `slot_count` slots.
    pub(crate) fn new(slot_count: u32) -> Self {
        HostCache {
            slots: vec![
                Slot {
                    page: u64::MAX,
                    state: SlotState::Free,
                    dirty: false,
                    host_ref: false,
                    ahead: false,
                    orphan: false,
                };
                slot_count as usize
            ],
            free: (0..slot_count).rev().collect(),
            map: HashMap::new(),
            hand: 0,
            dirty: 0,
            filling: 0,
            writing: 0,
            absorbing: 0,
            max_absorbing: 0,
            overflow: BTreeMap::new(),
            orphan_pages: HashSet::new(),
            failures: BTreeMap::new(),
            evictions: 0,
            redirects: 0,
        }
    }

    /// The slot holding (or filling) `page`, and its state.
    pub(crate) fn lookup(&self, page: u64) -> Option<(u32, SlotState)> {
        self.map
            .get(&page)
            .map(|&s| (s, self.slots[s as usize].state))
    }

    /// Notes a host request for the slot's page (CLOCK spares it once); a read-ahead fill in
    /// progress becomes a demand fill (a warp now waits on it).
    pub(crate) fn touch(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.host_ref = true;
        s.ahead = false;
    }

    /// Dirty slots (including those being written).
    pub(crate) fn dirty_count(&self) -> u64 {
        self.dirty
    }

    /// Slots being filled from the store.
    pub(crate) fn filling(&self) -> u64 {
        self.filling
    }

    /// Slots being written to the store.
    pub(crate) fn writing(&self) -> u64 {
        self.writing
    }

    /// Slots taking a WRITE's bytes from a staging page.
    pub(crate) fn absorbing(&self) -> u64 {
        self.absorbing
    }

    /// The most slots ABSORBING at once so far (WRITE copies in flight together).
    pub(crate) fn max_absorbing(&self) -> u64 {
        self.max_absorbing
    }

    /// Clean slots taken for other pages so far.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// WRITEs moved to another slot because theirs was being written to the store.
    pub(crate) fn redirects(&self) -> u64 {
        self.redirects
    }

    /// Whether some page in `range` is being written (to the store, or into its slot from a
    /// staging page), or filled when `filling_too`.
    pub(crate) fn busy_in(&self, range: &Range<u64>, filling_too: bool) -> bool {
        self.orphan_pages.iter().any(|p| range.contains(p))
            || self.map.iter().any(|(p, &s)| {
                range.contains(p)
                    && match self.slots[s as usize].state {
                        SlotState::Writing | SlotState::Absorbing => true,
                        SlotState::Filling => filling_too,
                        _ => false,
                    }
            })
    }

    /// A free slot, or a clean unreferenced PRESENT one taken from its page (CLOCK, at most
    /// two turns so that every reference bit gets cleared once). `None` when every slot is
    /// dirty, busy, or (after two turns) still referenced.
    pub(crate) fn take_clean(&mut self, shared: &SharedRing) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let n = self.slots.len();
        for _ in 0..2 * n {
            let s = self.hand;
            self.hand = (s + 1) % n;
            let index = u32::try_from(s).unwrap_or(u32::MAX);
            let slot = &mut self.slots[s];
            if slot.state != SlotState::Present {
                continue;
            }
            let device_ref = shared.slot_ref(index).swap(0, Ordering::Relaxed) != 0;
            if device_ref || slot.host_ref {
                slot.host_ref = false;
                continue;
            }
            if slot.dirty {
                continue;
            }
            self.evict_clean(shared, s);
            return Some(index);
        }
        None
    }

    /// Takes clean PRESENT slot `s` from its page (word withdrawn first).
    fn evict_clean(&mut self, shared: &SharedRing, s: usize) {
        let slot = &mut self.slots[s];
        debug_assert!(slot.state == SlotState::Present && !slot.dirty);
        withdraw_word(shared, slot.page);
        self.map.remove(&slot.page);
        slot.page = u64::MAX;
        slot.state = SlotState::Free;
        self.evictions += 1;
    }

    /// A spare slot for read-ahead: a free one, or the first clean, unreferenced PRESENT slot
    /// among the next `window` on the clock's path (references are left alone, so that
    /// read-ahead never takes a referenced page's second chance).
    pub(crate) fn take_spare(&mut self, shared: &SharedRing, window: usize) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let n = self.slots.len();
        for i in 0..window.min(n) {
            let s = (self.hand + i) % n;
            let index = u32::try_from(s).unwrap_or(u32::MAX);
            let slot = &mut self.slots[s];
            if slot.state != SlotState::Present
                || slot.dirty
                || slot.host_ref
                || shared.slot_ref(index).load(Ordering::Relaxed) != 0
            {
                continue;
            }
            self.evict_clean(shared, s);
            self.hand = (s + 1) % n;
            return Some(index);
        }
        None
    }

    /// Gives back a slot from [`HostCache::take_clean`] that was not used.
    #[cfg(test)]
    pub(crate) fn give_back(&mut self, slot: u32) {
        debug_assert_eq!(self.slots[slot as usize].state, SlotState::Free);
        self.free.push(slot);
    }

    /// `slot` (from [`HostCache::take_clean`]) starts filling with `page` from the store;
    /// `ahead`: for read-ahead (nobody waits yet).
    pub(crate) fn begin_fill(&mut self, page: u64, slot: u32, ahead: bool) {
        let s = &mut self.slots[slot as usize];
        debug_assert_eq!(s.state, SlotState::Free);
        *s = Slot {
            page,
            state: SlotState::Filling,
            dirty: false,
            host_ref: !ahead,
            ahead,
            orphan: false,
        };
        self.map.insert(page, slot);
        self.filling += 1;
    }

    /// The store read for `page` into `slot` ended: publish PRESENT, or ERROR and free the slot
    /// (a failed read-ahead nobody waits for only frees the slot and withdraws the word, so
    /// the next access retries the store).
    pub(crate) fn finish_fill(
        &mut self,
        shared: &SharedRing,
        page: u64,
        slot: u32,
        result: Result<(), String>,
    ) {
        let s = &mut self.slots[slot as usize];
        assert!(
            s.page == page && s.state == SlotState::Filling,
            "slot {slot} is not filling page {page}"
        );
        self.filling -= 1;
        match result {
            Ok(()) => {
                s.state = SlotState::Present;
                self.failures.remove(&(page, PageOp::Read));
                store_word(shared, page, Some(slot), false);
            }
            Err(message) => {
                let ahead = s.ahead;
                s.state = SlotState::Free;
                s.page = u64::MAX;
                self.map.remove(&page);
                self.free.push(slot);
                if !ahead {
                    self.failures.insert((page, PageOp::Read), message);
                }
                store_word(shared, page, None, !ahead);
            }
        }
    }

    /// Publishes ERROR for `page`, which has no slot, and records why.
    pub(crate) fn finish_fill_failed(&mut self, shared: &SharedRing, page: u64, why: &str) {
        debug_assert!(!self.map.contains_key(&page));
        self.failures.insert((page, PageOp::Read), why.to_string());
        store_word(shared, page, None, true);
    }

    /// Puts a page's new bytes into `slot`, which is free (from [`HostCache::take_clean`]) or
    /// PRESENT with this page: the bytes come from `fill` (given the slot) once the old word
    /// is withdrawn; the slot ends dirty and PRESENT.
    pub(crate) fn put_dirty(
        &mut self,
        shared: &SharedRing,
        page: u64,
        slot: u32,
        fill: impl FnOnce(u32),
    ) {
        let s = &mut self.slots[slot as usize];
        match s.state {
            SlotState::Present if s.page == page => withdraw_word(shared, page),
            SlotState::Free => {
                self.map.insert(page, slot);
                // A stale ERROR word goes too: the page is whole again.
                withdraw_word(shared, page);
            }
            other => panic!("slot {slot} cannot take page {page} while {other:?}"),
        }
        fill(slot);
        if !s.dirty {
            self.dirty += 1;
        }
        *s = Slot {
            page,
            state: SlotState::Present,
            dirty: true,
            host_ref: true,
            ahead: false,
            orphan: false,
        };
        store_word(shared, page, Some(slot), false);
    }

    /// `slot`, which is free (from [`HostCache::take_clean`]) or PRESENT with `page`, starts
    /// taking a WRITE's new bytes, copied in by another thread: the page's word is withdrawn
    /// first (seqlock), and until [`HostCache::finish_absorb`] the slot is neither readable
    /// by the device, nor written back, nor taken. A dirty slot's old bytes stop counting as
    /// dirty: the new bytes replace them.
    pub(crate) fn begin_absorb(&mut self, shared: &SharedRing, page: u64, slot: u32) {
        let s = &mut self.slots[slot as usize];
        match s.state {
            SlotState::Present if s.page == page => {}
            // A stale ERROR word goes too (below): the page is whole again.
            SlotState::Free => {
                self.map.insert(page, slot);
            }
            other => panic!("slot {slot} cannot take page {page} while {other:?}"),
        }
        withdraw_word(shared, page);
        if s.dirty {
            self.dirty -= 1;
        }
        *s = Slot {
            page,
            state: SlotState::Absorbing,
            dirty: false,
            host_ref: true,
            ahead: false,
            orphan: false,
        };
        self.absorbing += 1;
        self.max_absorbing = self.max_absorbing.max(self.absorbing);
    }

    /// The copy begun with [`HostCache::begin_absorb`] ended: the slot is dirty and PRESENT.
    pub(crate) fn finish_absorb(&mut self, shared: &SharedRing, page: u64, slot: u32) {
        let s = &mut self.slots[slot as usize];
        assert!(
            s.page == page && s.state == SlotState::Absorbing,
            "slot {slot} is not absorbing page {page}"
        );
        s.state = SlotState::Present;
        s.dirty = true;
        self.dirty += 1;
        self.absorbing -= 1;
        store_word(shared, page, Some(slot), false);
    }

    /// A WRITE for `page`, whose slot `old` is being written to the store: the new bytes go to
    /// free slot `new` (from [`HostCache::take_clean`]) instead of waiting, copied in by
    /// another thread ([`HostCache::begin_absorb`]), and `old` becomes an orphan, freed when
    /// its store write ends.
    pub(crate) fn redirect_write(&mut self, shared: &SharedRing, page: u64, old: u32, new: u32) {
        let o = &mut self.slots[old as usize];
        assert!(
            o.page == page && o.state == SlotState::Writing && o.dirty,
            "slot {old} is not writing page {page}"
        );
        withdraw_word(shared, page);
        o.orphan = true;
        o.dirty = false;
        self.dirty -= 1;
        self.orphan_pages.insert(page);
        self.map.remove(&page);
        self.redirects += 1;
        self.begin_absorb(shared, page, new);
    }

    /// Marks up to `max` dirty PRESENT slots whose pages pass `want` as WRITING, in clock order
    /// from the hand (the next victims first), and returns their (page, slot).
    pub(crate) fn begin_write_back(
        &mut self,
        max: usize,
        want: impl Fn(u64) -> bool,
    ) -> Vec<(u64, u32)> {
        let n = self.slots.len();
        let mut picked = Vec::new();
        for i in 0..n {
            if picked.len() >= max {
                break;
            }
            let s = (self.hand + i) % n;
            let slot = &mut self.slots[s];
            if slot.state == SlotState::Present
                && slot.dirty
                && want(slot.page)
                && !self.orphan_pages.contains(&slot.page)
            {
                slot.state = SlotState::Writing;
                self.writing += 1;
                picked.push((slot.page, u32::try_from(s).unwrap_or(u32::MAX)));
            }
        }
        picked
    }

    /// Store writes begun with [`HostCache::begin_write_back`] ended: written pages turn
    /// clean, failed ones stay dirty with their error recorded.
    pub(crate) fn finish_write_back(&mut self, results: &[WriteResult]) {
        for ((page, slot), result) in results {
            let s = &mut self.slots[*slot as usize];
            assert!(
                s.page == *page && s.state == SlotState::Writing,
                "slot {slot} is not writing page {page}"
            );
            self.writing -= 1;
            if s.orphan {
                s.orphan = false;
                s.state = SlotState::Free;
                s.page = u64::MAX;
                self.free.push(*slot);
                self.orphan_pages.remove(page);
                continue;
            }
            s.state = SlotState::Present;
            match result {
                Ok(()) => {
                    s.dirty = false;
                    self.dirty -= 1;
                    self.failures.remove(&(*page, PageOp::Write));
                }
                Err(message) => {
                    self.failures
                        .insert((*page, PageOp::Write), message.clone());
                }
            }
        }
    }

    /// Whether some dirty slot is PRESENT (can be written back now).
    pub(crate) fn has_dirty_present(&self) -> bool {
        self.dirty + self.orphan_pages.len() as u64 > self.writing
    }

    /// Keeps a dirty page that no slot could take.
    pub(crate) fn put_overflow(&mut self, page: u64, bytes: Vec<u8>) {
        debug_assert!(!self.map.contains_key(&page));
        self.overflow.insert(page, bytes);
    }

    /// Whether a page's only copy is in overflow.
    pub(crate) fn has_overflow(&self, page: u64) -> bool {
        self.overflow.contains_key(&page)
    }

    /// Takes a page's overflow copy, if any.
    pub(crate) fn take_overflow(&mut self, page: u64) -> Option<Vec<u8>> {
        self.overflow.remove(&page)
    }

    /// Takes every overflow copy in `range`.
    pub(crate) fn take_overflow_range(&mut self, range: &Range<u64>) -> Vec<(u64, Vec<u8>)> {
        let pages: Vec<u64> = self
            .overflow
            .range(range.clone())
            .map(|(p, _)| *p)
            .collect();
        pages
            .into_iter()
            .filter_map(|p| self.overflow.remove(&p).map(|b| (p, b)))
            .collect()
    }

    /// Records a failure on `page`.
    pub(crate) fn record(&mut self, page: u64, op: PageOp, message: String) {
        self.failures.insert((page, op), message);
    }

    /// Takes the recorded failures; read failures' ERROR words are withdrawn so that the next
    /// access retries the store.
    pub(crate) fn take_failures(&mut self, shared: &SharedRing) -> Vec<PageFailure> {
        let failures = std::mem::take(&mut self.failures);
        failures
            .into_iter()
            .map(|((page, op), message)| {
                if op == PageOp::Read
                    && page < shared.pages()
                    && SlotWord::decode(shared.slot_word(page).load(Ordering::Relaxed)).error
                {
                    withdraw_word(shared, page);
                }
                PageFailure { page, op, message }
            })
            .collect()
    }

    /// Copies of every dirty page (in slots and in overflow), page-length bytes, by page.
    pub(crate) fn dirty_copies(&self, shared: &SharedRing) -> Vec<(u64, Vec<u8>)> {
        let mut out: Vec<(u64, Vec<u8>)> = self.overflow.clone().into_iter().collect();
        for (s, slot) in self.slots.iter().enumerate() {
            if slot.dirty {
                let (_, len) = shared.page_range(slot.page);
                let mut bytes = vec![0; len];
                // SAFETY: the caller holds the cache's lock, under which every host write to a
                // PRESENT or WRITING slot happens; workers never write such slots.
                unsafe { shared.copy_from_slot(u32::try_from(s).unwrap_or(u32::MAX), &mut bytes) };
                out.push((slot.page, bytes));
            }
        }
        out.sort_by_key(|(p, _)| *p);
        out
    }

    /// Drops every clean page in `range` from the cache (words withdrawn), and withdraws
    /// ERROR words there. Dirty and busy slots stay.
    pub(crate) fn drop_clean(&mut self, shared: &SharedRing, range: &Range<u64>) {
        let pages: Vec<(u64, u32)> = self
            .map
            .iter()
            .filter(|(p, _)| range.contains(p))
            .map(|(p, s)| (*p, *s))
            .collect();
        for (page, slot) in pages {
            let s = &mut self.slots[slot as usize];
            if s.state == SlotState::Present && !s.dirty {
                withdraw_word(shared, page);
                s.state = SlotState::Free;
                s.page = u64::MAX;
                s.host_ref = false;
                self.map.remove(&page);
                self.free.push(slot);
            }
        }
        let failed: Vec<u64> = self
            .failures
            .keys()
            .filter(|(p, op)| *op == PageOp::Read && range.contains(p))
            .map(|(p, _)| *p)
            .collect();
        for page in failed {
            if page < shared.pages()
                && SlotWord::decode(shared.slot_word(page).load(Ordering::Relaxed)).error
            {
                withdraw_word(shared, page);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(r: &SharedRing, page: u64) -> SlotWord {
        SlotWord::decode(r.slot_word(page).load(Ordering::Relaxed))
    }

    #[test]
    fn clock_spares_referenced_slots_and_never_takes_dirty_ones() {
        let r = SharedRing::in_heap(4, 8, 3, 64, 8 * 64).unwrap();
        let mut c = HostCache::new(3);
        for page in 0..3 {
            let s = c.take_clean(&r).unwrap();
            c.begin_fill(page, s, false);
            c.finish_fill(&r, page, s, Ok(()));
            assert!(word(&r, page).present);
            assert_eq!(word(&r, page).slot, s);
        }
        // Page 0 dirty, page 1 referenced by the device, page 2 only by its old fill.
        let s0 = c.lookup(0).unwrap().0;
        // SAFETY: single-threaded test.
        c.put_dirty(&r, 0, s0, |s| unsafe { r.copy_into_slot(s, &[1; 64]) });
        assert_eq!(c.dirty_count(), 1);
        for slot in &mut c.slots {
            slot.host_ref = false;
        }
        r.slot_ref(c.lookup(1).unwrap().0)
            .store(1, Ordering::Relaxed);
        let before = word(&r, 2).generation;
        let victim = c.take_clean(&r).unwrap();
        assert_eq!(victim, 2);
        assert!(c.lookup(2).is_none(), "page 2 was taken");
        assert!(!word(&r, 2).present);
        assert_eq!(word(&r, 2).generation, before + 1);
        assert_eq!(
            r.slot_ref(1).load(Ordering::Relaxed),
            0,
            "the clock cleared it"
        );
        c.give_back(victim);
        // Page 1 is next (its reference was cleared); then nothing clean is left.
        assert!(c.take_clean(&r).is_some());
        let s = c.take_clean(&r).unwrap();
        c.begin_fill(5, s, false);
        assert!(
            c.take_clean(&r).is_none(),
            "page 0 is dirty, page 5 is filling"
        );
        let batch = c.begin_write_back(8, |_| true);
        assert_eq!(batch, vec![(0, s0)]);
        c.finish_write_back(&[(batch[0], Err("disk on fire".into()))]);
        assert_eq!(c.dirty_count(), 1, "a failed write keeps the page dirty");
        let f = c.take_failures(&r);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].page, f[0].op), (0, PageOp::Write));
        assert_eq!(c.dirty_copies(&r), vec![(0, vec![1; 64])]);
    }

    #[test]
    fn a_write_to_a_slot_being_written_moves_to_another_slot() {
        let r = SharedRing::in_heap(4, 4, 3, 64, 4 * 64).unwrap();
        let mut c = HostCache::new(3);
        let s0 = c.take_clean(&r).unwrap();
        // SAFETY: single-threaded test.
        c.put_dirty(&r, 2, s0, |s| unsafe { r.copy_into_slot(s, &[1; 64]) });
        let batch = c.begin_write_back(8, |_| true);
        assert_eq!(batch, vec![(2, s0)]);
        let s1 = c.take_clean(&r).unwrap();
        c.redirect_write(&r, 2, s0, s1);
        assert_eq!(c.lookup(2), Some((s1, SlotState::Absorbing)));
        assert!(!word(&r, 2).present, "no word while the copy runs");
        assert!(c.busy_in(&(2..3), false), "the copy is in flight");
        // SAFETY: single-threaded test; the slot is absorbing, owned by this copy.
        unsafe { r.copy_into_slot(s1, &[2; 64]) };
        c.finish_absorb(&r, 2, s1);
        assert_eq!(c.lookup(2), Some((s1, SlotState::Present)));
        assert_eq!(word(&r, 2).slot, s1);
        assert!(c.busy_in(&(2..3), false), "the orphan's write is in flight");
        assert!(
            c.begin_write_back(8, |_| true).is_empty(),
            "no second write of page 2 while the first is in flight"
        );
        assert_eq!(
            c.dirty_copies(&r),
            vec![(2, vec![2; 64])],
            "only the new bytes"
        );
        c.finish_write_back(&[(batch[0], Ok(()))]);
        assert_eq!(c.dirty_count(), 1, "the new bytes are still dirty");
        assert!(!c.busy_in(&(2..3), false));
        assert_eq!(c.begin_write_back(8, |_| true), vec![(2, s1)]);
        assert_eq!(c.redirects(), 1);
        assert!(c.take_clean(&r).is_some(), "the orphan slot was freed");
    }

    #[test]
    fn failed_fills_publish_error_and_take_failures_withdraws_it() {
        let r = SharedRing::in_heap(4, 2, 1, 64, 100).unwrap();
        let mut c = HostCache::new(1);
        let s = c.take_clean(&r).unwrap();
        c.begin_fill(1, s, false);
        c.finish_fill(&r, 1, s, Err("gone".into()));
        let w = word(&r, 1);
        assert!(w.error && !w.present);
        assert!(c.lookup(1).is_none());
        let f = c.take_failures(&r);
        assert_eq!(f[0].message, "gone");
        let w2 = word(&r, 1);
        assert!(!w2.error && !w2.present);
        assert_eq!(w2.generation, w.generation + 1);
        assert!(c.take_clean(&r).is_some(), "the slot was freed");
    }
}
