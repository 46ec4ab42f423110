//! The host side of the tier chain under a space's GPU cache (the device side is
//! `cuda/strata/tier_*.cuh` and `tiers.cuh`):
//!
//! ```text
//!   GPU frames (page cache in GPU memory, per space)
//!        |  a miss asks the tier below; a dirty victim goes down the same way
//!        v
//!   host_copy: the whole space in pinned host memory     -- or --   store: a bounded pinned
//!   (loaded directly by the faulting warp)                          host cache (slots) the warp
//!                                                                    loads directly when it holds
//!                                                                    the page, and otherwise asks
//!                                                                    for through the request ring
//!                                                                          |  host threads
//!                                                                          v  (read_batch/write_batch)
//!                                                                    any Store: memory, file,
//!                                                                    memory node, compressed
//! ```
//!
//! Above the host copy a space may have a peer tier (`peer`): a victim cache in memory
//! borrowed from neighbour GPUs, asked before the host copy.
//!
//! A new tier is one device header (`tier_<name>.cuh`, an exchange and a write-back, plus a
//! line in each switch of `tiers.cuh`) and one module here (a variant of [`Backing`] with what
//! the host must do for the space's maintenance calls).

pub(crate) mod host_copy;
pub(crate) mod peer;
pub(crate) mod store;

use std::ops::Range;

use crate::space::SpaceError;

/// What holds a space's bytes below its GPU cache.
#[derive(Debug)]
pub(crate) enum Backing {
    /// The whole space in pinned host memory.
    HostCopy(host_copy::HostCopy),
    /// A store, through a pinned host cache and the request ring.
    Store(store::StoreTier),
}

impl Backing {
    /// After the GPU's dirty pages went down: makes the bottom tier current (and durable, for
    /// stores that persist).
    pub(crate) fn flush(&self) -> Result<(), SpaceError> {
        match self {
            Backing::HostCopy(_) => Ok(()),
            Backing::Store(s) => s.flush(),
        }
    }

    /// Copies `out.len()` bytes at byte `offset` from the bottom tier (after a flush).
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), SpaceError> {
        match self {
            Backing::HostCopy(h) => {
                h.read(offset, out);
                Ok(())
            }
            Backing::Store(s) => s.read(offset, out),
        }
    }

    /// Writes `data` at byte `offset` of the bottom tier; the GPU holds no page of the range
    /// (the caller evicted it) and no kernel runs.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), SpaceError> {
        match self {
            Backing::HostCopy(h) => {
                h.write(offset, data);
                Ok(())
            }
            Backing::Store(s) => s.write(offset, data),
        }
    }

    /// Fills `range` of the bottom tier with zeros (same preconditions as [`Backing::write`]).
    pub(crate) fn zero(&mut self, range: Range<u64>) -> Result<(), SpaceError> {
        match self {
            Backing::HostCopy(h) => {
                h.zero(range);
                Ok(())
            }
            Backing::Store(s) => s.zero(range),
        }
    }
}
