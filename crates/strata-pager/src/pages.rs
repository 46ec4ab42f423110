//! Per-page state in one atomic word, and the frame pool.
//!
//! Layout of a page word (`u64`):
//!
//! | bits   | meaning |
//! |--------|---------|
//! | 0..3   | [`State`] |
//! | 3      | `REF`: referenced since the clock hand last passed (fill, write, re-fault) |
//! | 4      | `WAITER`: a fault arrived while the page was in transition; wake on completion |
//! | 5..7   | heat (0..3): raised each time the page comes back soon after its eviction (a re-fault), lowered by each clock pass; a hot page survives that many extra passes, and keeps its heat while evicted |
//! | 7      | `GHOST`: the page was evicted before and bits 8..32 hold when |
//! | 8..32  | eviction stamp (coarse eviction clock, for the re-fault distance) |
//! | 32..64 | frame index while the page holds a frame |
//!
//! Every transition is a compare-and-swap on this word, so fillers, evictors, `flush` and
//! `evict` never need a lock to agree on who owns a page. Transitional states (`Filling`,
//! `Evicting`, `Flushing`, `Unprotecting`) belong to exactly one thread; a fault that meets
//! one sets `WAITER` and returns, and the owner wakes the range when it finishes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// Where a page is in its life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Not resident: the next access faults.
    Absent = 0,
    /// A filler owns it and is installing it.
    Filling = 1,
    /// Resident, write-protected, equal to the store's copy.
    Clean = 2,
    /// Resident and written since it was last stored.
    Dirty = 3,
    /// An evictor owns it and is dropping it (after writing it back if dirty).
    Evicting = 4,
    /// `flush` owns it and is writing it back; it stays resident.
    Flushing = 5,
    /// A write fault is lifting its write protection.
    Unprotecting = 6,
    /// Its fill failed: a poison marker makes every access raise `SIGBUS` until it is evicted.
    Poisoned = 7,
}

const STATE_MASK: u64 = 0b111;
/// Referenced bit.
pub const REF: u64 = 1 << 3;
/// Someone waits for the transition to end.
pub const WAITER: u64 = 1 << 4;
/// The heat field (two bits): re-faults soon after eviction.
pub const HOT: u64 = 0b11 << HEAT_SHIFT;
const HEAT_SHIFT: u32 = 5;
/// Evicted before; the stamp is valid.
pub const GHOST: u64 = 1 << 7;
const STAMP_SHIFT: u32 = 8;
/// Bits of the eviction stamp.
pub const STAMP_BITS: u32 = 24;
const STAMP_MASK: u64 = ((1 << STAMP_BITS) - 1) << STAMP_SHIFT;
const FRAME_SHIFT: u32 = 32;

/// Helpers on raw page words.
pub mod word {
    use super::*;

    /// The state of `w`.
    pub fn state(w: u64) -> State {
        match w & STATE_MASK {
            0 => State::Absent,
            1 => State::Filling,
            2 => State::Clean,
            3 => State::Dirty,
            4 => State::Evicting,
            5 => State::Flushing,
            6 => State::Unprotecting,
            _ => State::Poisoned,
        }
    }

    /// `w` with its state replaced.
    pub fn with_state(w: u64, s: State) -> u64 {
        (w & !STATE_MASK) | s as u64
    }

    /// The frame index held in `w`.
    pub fn frame(w: u64) -> u32 {
        u32::try_from(w >> FRAME_SHIFT).unwrap_or(u32::MAX)
    }

    /// `w` holding `frame`.
    pub fn with_frame(w: u64, frame: u32) -> u64 {
        (w & ((1 << FRAME_SHIFT) - 1)) | (u64::from(frame) << FRAME_SHIFT)
    }

    /// The eviction stamp of `w` (meaningful with `GHOST`).
    pub fn stamp(w: u64) -> u64 {
        (w & STAMP_MASK) >> STAMP_SHIFT
    }

    /// An absent page word remembering an eviction at `stamp` and the page's heat.
    pub fn evicted(stamp: u64, heat: u64) -> u64 {
        State::Absent as u64 | GHOST | ((stamp << STAMP_SHIFT) & STAMP_MASK) | with_heat(0, heat)
    }

    /// The heat (0..=3) of `w`.
    pub fn heat(w: u64) -> u64 {
        (w & HOT) >> HEAT_SHIFT
    }

    /// `w` with heat `h` (capped at 3).
    pub fn with_heat(w: u64, h: u64) -> u64 {
        (w & !HOT) | (h.min(3) << HEAT_SHIFT)
    }

    /// Whether the state is one a single thread is in the middle of.
    pub fn in_transition(w: u64) -> bool {
        matches!(
            state(w),
            State::Filling | State::Evicting | State::Flushing | State::Unprotecting
        )
    }
}

/// `n` zero words from a zeroed allocation (`calloc`): large tables come from fresh
/// anonymous memory that the kernel backs only where a word is first written, so a region
/// of millions of pages (a 64 GiB arena of 4 KiB pages: 128 MiB of words) costs memory and
/// start-up time only for the pages it uses. Writing the zeros (`collect`) made all of it
/// resident at once: 0.15 s and 145 MiB before the first fault.
pub(crate) fn zeroed_words(n: usize) -> Box<[AtomicU64]> {
    let words = Box::<[AtomicU64]>::new_zeroed_slice(n);
    // SAFETY: an `AtomicU64` has the size and bit validity of a `u64`, for which all-zero
    // bytes are the value 0; every element was zeroed by the allocation.
    unsafe { words.assume_init() }
}

/// The page table: one word per page of the region.
#[derive(Debug)]
pub struct PageTable {
    words: Box<[AtomicU64]>,
}

impl PageTable {
    /// `pages` absent pages.
    pub fn new(pages: usize) -> Self {
        Self {
            words: zeroed_words(pages),
        }
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The word of page `page`.
    pub fn get(&self, page: usize) -> &AtomicU64 {
        &self.words[page]
    }

    /// Loads page `page`'s word.
    pub fn load(&self, page: usize) -> u64 {
        self.words[page].load(Ordering::Acquire)
    }

    /// Compare-and-swap on page `page`.
    pub fn cas(&self, page: usize, old: u64, new: u64) -> bool {
        self.words[page]
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends a transition: stores `new` and reports whether a waiter must be woken.
    pub fn finish(&self, page: usize, new: u64) -> bool {
        self.words[page].swap(new & !WAITER, Ordering::AcqRel) & WAITER != 0
    }

    /// Marks that a fault waits on a page in transition. Returns false if the page left
    /// its transition meanwhile (the caller re-examines it).
    pub fn add_waiter(&self, page: usize) -> bool {
        let slot = &self.words[page];
        let mut w = slot.load(Ordering::Acquire);
        loop {
            if !word::in_transition(w) {
                return false;
            }
            match slot.compare_exchange_weak(w, w | WAITER, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }
}

/// Sentinel for a frame that holds no page.
pub const NO_PAGE: u64 = u64::MAX;

/// The resident-set budget: `frames` slots, the page each holds, a free list, the frames
/// withheld from use, and the clock hand.
#[derive(Debug)]
pub struct FramePool {
    /// Page held by each frame, or [`NO_PAGE`].
    owners: Box<[AtomicU64]>,
    free: Mutex<Lists>,
    free_count: AtomicUsize,
    /// Frames in `Lists::withheld` (read without the lock).
    withheld_count: AtomicUsize,
    /// Frames that left a page for the free list, the withheld list or a scratch buffer:
    /// lets a count of resident pages, taken frame by frame, tell whether a frame it counted
    /// moved meanwhile (and would be counted twice).
    moves: AtomicU64,
    hand: AtomicUsize,
    /// Evictors sleep here until the free count falls below the high-water target.
    pub pressure: Condvar,
    /// Paired with `pressure`.
    pub pressure_lock: Mutex<()>,
}

/// The free list and the withheld frames, under one lock so that a frame coming back goes
/// to exactly one of them.
#[derive(Debug)]
struct Lists {
    free: Vec<u32>,
    /// Frames held out of use for someone outside the pager (see [`FramePool::withhold`]).
    withheld: Vec<u32>,
    /// How many frames should be withheld: frames coming back go here until it is met.
    withhold_target: usize,
}

impl FramePool {
    /// A pool of `frames` free frames.
    pub fn new(frames: usize) -> Self {
        let frames32 = u32::try_from(frames).expect("frame count fits in 32 bits");
        Self {
            owners: (0..frames).map(|_| AtomicU64::new(NO_PAGE)).collect(),
            free: Mutex::new(Lists {
                // Popped from the back: hand out low frames first.
                free: (0..frames32).rev().collect(),
                withheld: Vec::new(),
                withhold_target: 0,
            }),
            free_count: AtomicUsize::new(frames),
            withheld_count: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
            hand: AtomicUsize::new(0),
            pressure: Condvar::new(),
            pressure_lock: Mutex::new(()),
        }
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Free frames now.
    pub fn free_count(&self) -> usize {
        self.free_count.load(Ordering::Acquire)
    }

    /// Frames withheld now.
    pub fn withheld_count(&self) -> usize {
        self.withheld_count.load(Ordering::Acquire)
    }

    /// The withholding target now.
    pub fn withhold_target(&self) -> usize {
        self.lock().withhold_target
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets how many frames are to be withheld. Frames withheld beyond it go back to the free
    /// list now; below it, frames coming back ([`FramePool::push`]) are withheld until it is
    /// met, and `take_free` free frames (at most) are withheld at once. Returns the frames
    /// withheld after the call.
    pub fn withhold(&self, target: usize, take_free: usize) -> usize {
        let mut lists = self.lock();
        lists.withhold_target = target;
        while lists.withheld.len() > target {
            let f = lists.withheld.pop().expect("more withheld than the target");
            lists.free.push(f);
            self.free_count.fetch_add(1, Ordering::AcqRel);
        }
        let mut taken = 0;
        while lists.withheld.len() < target && taken < take_free {
            let Some(f) = lists.free.pop() else { break };
            self.free_count.fetch_sub(1, Ordering::AcqRel);
            lists.withheld.push(f);
            taken += 1;
        }
        self.withheld_count
            .store(lists.withheld.len(), Ordering::Release);
        lists.withheld.len()
    }

    /// Takes a free frame, if any.
    pub fn pop(&self) -> Option<u32> {
        let mut lists = self.lock();
        let f = lists.free.pop()?;
        self.free_count.fetch_sub(1, Ordering::AcqRel);
        Some(f)
    }

    /// Takes a free frame only if more than `reserve` are free, so that what is left stays
    /// for faults that must have a frame (read-ahead uses this: it is a guess, and may never
    /// take the last frames a demand fault needs).
    pub fn pop_above(&self, reserve: usize) -> Option<u32> {
        let mut lists = self.lock();
        if lists.free.len() <= reserve {
            return None;
        }
        let f = lists.free.pop()?;
        self.free_count.fetch_sub(1, Ordering::AcqRel);
        Some(f)
    }

    /// Returns a frame to the free list, or withholds it while fewer frames are withheld
    /// than asked: every path that frees a frame (evictors, direct reclaim, scratch
    /// buffers) passes here, so they all honour the target without knowing of it.
    pub fn push(&self, frame: u32) {
        self.owners[frame as usize].store(NO_PAGE, Ordering::Release);
        let mut lists = self.lock();
        // Before the lists change: whoever sees a count that includes this frame sees the move.
        self.moves.fetch_add(1, Ordering::SeqCst);
        if lists.withheld.len() < lists.withhold_target {
            lists.withheld.push(frame);
            self.withheld_count
                .store(lists.withheld.len(), Ordering::Release);
        } else {
            lists.free.push(frame);
            self.free_count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Records that `frame`, taken from the pool, holds no page (held out of use).
    pub fn clear_owner(&self, frame: u32) {
        self.owners[frame as usize].store(NO_PAGE, Ordering::Release);
        self.moves.fetch_add(1, Ordering::SeqCst);
    }

    /// Frames moved out of pages so far (see the field).
    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::SeqCst)
    }

    /// Records that `frame` now holds `page`.
    pub fn assign(&self, frame: u32, page: usize) {
        self.owners[frame as usize].store(page as u64, Ordering::Release);
    }

    /// The page `frame` holds, or [`NO_PAGE`].
    pub fn owner(&self, frame: usize) -> u64 {
        self.owners[frame].load(Ordering::Acquire)
    }

    /// Advances the clock hand and returns the frame it now points at.
    pub fn tick(&self) -> usize {
        self.hand.fetch_add(1, Ordering::Relaxed) % self.owners.len()
    }

    /// Wakes evictors.
    pub fn nudge(&self) {
        self.pressure.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_fields_round_trip() {
        let w = word::with_frame(word::with_state(REF | HOT, State::Dirty), 123_456);
        assert_eq!(word::state(w), State::Dirty);
        assert_eq!(word::frame(w), 123_456);
        assert_ne!(w & REF, 0);
        assert_ne!(w & HOT, 0);
        let e = word::evicted((1 << STAMP_BITS) + 77, 2);
        assert_eq!(word::heat(e), 2);
        assert_eq!(word::heat(word::with_heat(e, 9)), 3, "heat saturates");
        assert_eq!(word::state(e), State::Absent);
        assert_eq!(word::stamp(e), 77, "stamps wrap within their bits");
        assert_ne!(e & GHOST, 0);
        for s in [
            State::Absent,
            State::Filling,
            State::Clean,
            State::Dirty,
            State::Evicting,
            State::Flushing,
            State::Unprotecting,
            State::Poisoned,
        ] {
            assert_eq!(word::state(word::with_state(u64::MAX, s)), s);
        }
    }

    #[test]
    fn waiters_only_attach_to_transitions() {
        let t = PageTable::new(2);
        assert!(!t.add_waiter(0), "an absent page has no owner to wake us");
        assert!(t.cas(0, 0, State::Filling as u64));
        assert!(t.add_waiter(0));
        assert!(
            t.finish(0, State::Clean as u64),
            "finish reports the waiter"
        );
        assert!(!t.finish(0, State::Clean as u64));
        assert_eq!(t.load(0) & WAITER, 0);
    }

    #[test]
    fn frame_pool_hands_out_each_frame_once() {
        let pool = FramePool::new(4);
        let got: Vec<u32> = std::iter::from_fn(|| pool.pop()).collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(pool.free_count(), 0);
        pool.assign(2, 99);
        assert_eq!(pool.owner(2), 99);
        pool.push(2);
        assert_eq!((pool.free_count(), pool.owner(2)), (1, NO_PAGE));
        assert_eq!(pool.pop(), Some(2));
        pool.push(2);
        pool.push(3);
        assert_eq!(pool.pop_above(2), None, "two free frames are the reserve");
        assert_eq!(pool.pop_above(1), Some(3));
        assert_eq!(pool.pop_above(1), None);
        assert_eq!(pool.pop(), Some(2));
    }

    #[test]
    fn withheld_frames_come_from_returns_and_go_back_free() {
        let pool = FramePool::new(6);
        let got: Vec<u32> = std::iter::from_fn(|| pool.pop()).collect();
        assert_eq!(got.len(), 6);
        assert_eq!(pool.withhold(3, 0), 0, "nothing free to take");
        for f in &got[..4] {
            pool.push(*f);
        }
        assert_eq!(pool.withheld_count(), 3, "returns meet the target first");
        assert_eq!(pool.free_count(), 1);
        assert_eq!(pool.withhold(4, 8), 4, "a free frame taken at once");
        assert_eq!(pool.free_count(), 0);
        assert_eq!(pool.withhold(1, 0), 1);
        assert_eq!(pool.free_count(), 3, "the surplus is free again");
        pool.push(got[4]);
        pool.push(got[5]);
        assert_eq!((pool.withheld_count(), pool.free_count()), (1, 5));
        assert_eq!(pool.withhold(0, 0), 0);
        let mut all: Vec<u32> = std::iter::from_fn(|| pool.pop()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..6).collect::<Vec<u32>>(),
            "no frame lost or doubled"
        );
    }
}
