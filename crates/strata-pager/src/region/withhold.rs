//! Frames withheld from a running region's budget by someone outside the fault path, for
//! example `strata run`'s watcher of its memory group: when the group is about to run out,
//! the pager gives memory back at once, and takes it again once the group has room.
//!
//! A withheld frame is out of the budget like a scratch buffer's held frame: the pool keeps
//! it on a list of its own ([`crate::pages::FramePool::withhold`]), so resident pages, held
//! and withheld frames never add up to more than the budget, and no frame is lost or used
//! twice. The caller evicts for the frames it asks for (the memory is back when the call
//! returns); what it cannot evict at once (pages being filled or written back) comes from
//! the frames that evictors, faults and scratch buffers return afterwards, which all go to
//! the withheld list first while it is short.
//!
//! Withholding acts on what the caller sees, a millisecond late. For the moments when the
//! memory a fill is about to charge may not be there at all (a memory group at its limit
//! whose page cache is held by the very `read()` that waits on the fault),
//! [`Region::evict_before_fills`](super::Region::evict_before_fills) makes every fill take
//! its frames by evicting pages (free frames stay unused; `frames.rs`), so each page it
//! installs is charged against one given back just before: the region's charge never grows
//! while it is set, and a fill never needs the kernel to reclaim anything.

use super::evict::EVICT_BATCH;
use super::shared::Shared;

/// How many frames are withheld: the target asked for (after capping, see
/// [`Region::withhold_frames`](super::Region::withhold_frames)) and those held now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Withheld {
    /// Frames to withhold.
    pub target: usize,
    /// Frames withheld now (below `target` until enough pages could be evicted).
    pub held: usize,
}

impl Shared {
    /// Most frames that may be withheld: the region keeps its scratch buffers' share, the
    /// read-ahead reserve, a window and a frame per filler, so that faults go on finding
    /// frames (by direct reclaim) however much is withheld.
    pub(super) fn most_withheld(&self) -> usize {
        let keep = self.park_limit + self.ahead_reserve + self.read_ahead + self.config.fillers;
        self.frames.len().saturating_sub(keep.max(1))
    }

    /// Sets the withholding target (capped at [`Shared::most_withheld`]) and evicts now for
    /// the frames it lacks; see the module documentation.
    pub(super) fn withhold(&self, target: usize) -> Withheld {
        let target = target.min(self.most_withheld());
        let mut held = self.frames.withhold(target, 0);
        while held < target {
            let claimed = self.claim_victims((target - held).min(EVICT_BATCH));
            if claimed.is_empty() {
                break;
            }
            let (frames, error) = self.complete_evictions(claimed);
            let progress = !frames.is_empty();
            // Below the target, `push` withholds them.
            for f in frames {
                self.frames.push(f);
            }
            if let Some(e) = error {
                self.record(e);
                break;
            }
            if !progress {
                break;
            }
            held = self.frames.withheld_count();
        }
        if held < target {
            // Every resident page is busy now: free frames then, so that the resident set
            // cannot grow back into what was asked for.
            held = self.frames.withhold(target, target - held);
            if self.frames.free_count() < self.wake_below_free {
                self.wake_evictors();
            }
        }
        Withheld { target, held }
    }

    /// The target and the frames withheld now.
    pub(super) fn withheld(&self) -> Withheld {
        Withheld {
            target: self.frames.withhold_target(),
            held: self.frames.withheld_count(),
        }
    }
}
