//! Where a fill gets its frames: the free list, read-ahead's share of it (never the demand
//! reserve), and direct reclaim for a fault that must have one. Only a run's first frame
//! may wait, so no thread ever holds frames while waiting for more.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::RegionError;
use super::evict::Evicted;
use super::shared::{Shared, bump};
use crate::pages::NO_PAGE;

/// Longest a fault waits for a frame to come free. Frames are only ever held across one store
/// read or write (no thread holds a frame while it waits for another), so this passes only
/// when the store stops answering; the fault then fails with [`RegionError::BufferBusy`].
pub const FRAME_WAIT: Duration = Duration::from_secs(30);

impl Shared {
    /// Wakes the evictors unless they are already awake.
    pub(super) fn wake_evictors(&self) {
        if !self.evict_pending.swap(true, Ordering::AcqRel) {
            // Under the lock, so an evictor between its check and its wait cannot miss it.
            let _guard = self
                .frames
                .pressure_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.frames.nudge();
        }
    }

    /// Takes a free frame, waking the evictors when free frames run low.
    pub(super) fn pop_frame(&self) -> Option<u32> {
        let f = self.frames.pop();
        if f.is_none() || self.frames.free_count() < self.wake_below_free {
            self.wake_evictors();
        }
        f
    }

    /// A frame for read-ahead: a free one above the demand reserve, or none.
    pub(super) fn frame_for_ahead(&self) -> Option<u32> {
        let f = self.frames.pop_above(self.ahead_reserve);
        if f.is_none() || self.frames.free_count() < self.wake_below_free {
            self.wake_evictors();
        }
        f
    }

    /// Up to `count` frames without waiting, for a read-ahead thread: free ones above the
    /// demand reserve, then pages this thread evicts together (one drop for the lot). The
    /// evictors may then keep only a few frames free (`strata run`'s water marks): a stream's
    /// windows no longer need a standing reserve of idle frames, which a program that also
    /// reads at random (sort's lines) would rather hold its pages in.
    ///
    /// While fills evict before they install ([`Shared::evict_before_fills`]), free frames
    /// are left alone: every frame returned comes with memory given back just now.
    pub(super) fn frames_evicting(&self, count: usize) -> Vec<u32> {
        let mut frames = Vec::with_capacity(count);
        let free_ok = !self.evict_before_fills.load(Ordering::Relaxed);
        while free_ok && frames.len() < count {
            match self.frame_for_ahead() {
                Some(f) => frames.push(f),
                None => break,
            }
        }
        let mut claimed = Vec::with_capacity(count - frames.len());
        while frames.len() + claimed.len() < count {
            match self.claim_victim() {
                Some(v) => claimed.push(v),
                None => break,
            }
        }
        if !claimed.is_empty() {
            let (freed, error) = self.complete_evictions(claimed);
            if !free_ok {
                bump(&self.counters.evicted_before_fills, freed.len() as u64);
            }
            frames.extend(freed);
            if let Some(e) = error {
                self.record(e);
            }
        }
        frames
    }

    /// A frame without waiting: a free one, else one page evicted now (if one can be).
    pub(super) fn frame_now(&self) -> Option<u32> {
        if let Some(f) = self.pop_frame() {
            return Some(f);
        }
        match self.evict_one() {
            Evicted::Frame(f) => Some(f),
            Evicted::Nothing => None,
            Evicted::WriteFailed { error, .. } => {
                self.record(error);
                None
            }
        }
    }

    /// A frame for a page that must have one: a free frame, else one this thread evicts
    /// (direct reclaim). The caller holds no frame, and every frame is held only across one
    /// store operation, so frames come free unless the store stops answering: after
    /// [`FRAME_WAIT`] the fault fails with `BufferBusy`. It fails sooner, with
    /// `BufferExhausted`, once every frame holds a page whose write-back failed in this wait.
    pub(super) fn wait_for_frame(&self) -> Result<Option<u32>, RegionError> {
        if let Some(f) = self.pop_frame() {
            return Ok(Some(f));
        }
        bump(&self.counters.direct_reclaims, 1);
        // Pages whose write-back failed during this wait. A count of failures is not enough:
        // the clock gives hot pages extra passes, so it may offer the same few unwritable
        // pages many times before the clean or unchanged pages beside them (a four-frame
        // buffer with two unwritable pages failed faults that way).
        let mut unwritable: HashSet<usize> = HashSet::new();
        let mut failures = 0usize;
        // Failures at which the frames are checked next: each check walks every frame, so
        // they come at doubling counts (a large buffer of dead pages costs a few walks).
        let mut check_at = 2 * self.frames.len() + 1;
        let mut last_error = None;
        let started = Instant::now();
        let mut idle = 0u32;
        loop {
            if let Some(f) = self.frames.pop() {
                return Ok(Some(f));
            }
            match self.evict_one() {
                Evicted::Frame(f) => return Ok(Some(f)),
                Evicted::Nothing => {}
                Evicted::WriteFailed { page, error } => {
                    failures += 1;
                    unwritable.insert(page);
                    last_error = Some(error.to_string());
                    self.record(error);
                    if failures >= check_at {
                        check_at *= 2;
                        if self.only_pages_held(&unwritable) {
                            if let Some(f) = self.frames.pop() {
                                return Ok(Some(f));
                            }
                            return Err(RegionError::BufferExhausted {
                                frames: self.frames.len(),
                                last: last_error.unwrap_or_default(),
                            });
                        }
                    }
                }
            }
            // Every frame is being filled or written back (those end with their store
            // operation), or its page cannot be written now: back off so that spinning does
            // not slow the others down or hammer a failing store.
            idle += 1;
            if idle < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
            if started.elapsed() > FRAME_WAIT {
                return Err(match last_error {
                    Some(last) => RegionError::BufferExhausted {
                        frames: self.frames.len(),
                        last,
                    },
                    None => RegionError::BufferBusy {
                        frames: self.frames.len(),
                        waited_s: FRAME_WAIT.as_secs(),
                    },
                });
            }
        }
    }

    /// Whether every frame that holds a page holds one of `pages` (frames free, withheld or
    /// held by a scratch buffer hold none). While another page holds a frame (clean, written
    /// or unchanged, or in another thread's fill or eviction) a frame may still come free.
    fn only_pages_held(&self, pages: &HashSet<usize>) -> bool {
        (0..self.frames.len()).all(|f| {
            let owner = self.frames.owner(f);
            owner == NO_PAGE || usize::try_from(owner).is_ok_and(|p| pages.contains(&p))
        })
    }
}
