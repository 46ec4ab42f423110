//! The copiers: threads that copy WRITE tickets' staging pages into host-cache slots, so that
//! the dispatcher only does the bookkeeping and many WRITEs are copied at once.
//!
//! The dispatcher prepares each copy under the cache's lock ([`HostCache::begin_absorb`]: a
//! slot for the page, its word withdrawn, the slot ABSORBING) and queues it; a copier copies
//! the bytes without the lock, publishes the slot ([`HostCache::finish_absorb`]), and only then
//! stores `done[t % capacity] = t + 1` and marks ticket `t` finished, which lets the dispatcher
//! move `head` past it (so the staging page is never reused before it was copied).
//!
//! A copier runs no store code: the copy is a `memcpy`. When no copier is alive (they could
//! only die by a bug) the dispatcher copies itself, so a WRITE never waits on a dead thread;
//! it also copies itself when a copy already waits for each copier, rather than idle.
//!
//! [`HostCache::begin_absorb`]: super::host_cache::HostCache::begin_absorb
//! [`HostCache::finish_absorb`]: super::host_cache::HostCache::finish_absorb

use std::sync::atomic::{Ordering, fence};

use super::server::Inner;

/// One WRITE ticket's copy: staging page `index` (of ticket `ticket`) into `slot`, which is
/// ABSORBING `page`; `len` bytes of the page lie inside the space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Absorb {
    pub(crate) ticket: u64,
    pub(crate) index: u32,
    pub(crate) page: u64,
    pub(crate) slot: u32,
    pub(crate) len: usize,
}

/// Marks ticket `ticket` (at ring index `index`) finished: the dispatcher may move `head` past
/// it once every earlier ticket is finished too.
pub(crate) fn finish_ticket(inner: &Inner, ticket: u64, index: u32) {
    inner.finished[index as usize].store(ticket + 1, Ordering::Release);
}

/// Whether ticket `ticket` (at ring index `index`) is finished.
pub(crate) fn ticket_finished(inner: &Inner, ticket: u64, index: u32) -> bool {
    inner.finished[index as usize].load(Ordering::Acquire) == ticket + 1
}

/// Hands a copy to the copiers, or does it on this thread when none is alive or a copy is
/// already waiting for each copier (the copiers are behind: the dispatcher would only wait for
/// them). The caller must not hold the cache's lock.
pub(crate) fn submit(inner: &Inner, job: Absorb) {
    let copiers = inner.alive_copiers.load(Ordering::Acquire);
    if copiers == 0 || inner.copies.len() >= copiers {
        absorb(inner, job);
    } else {
        inner.copies.push_one(job);
    }
}

/// Copies, publishes the slot, then completes the WRITE ticket.
pub(crate) fn absorb(inner: &Inner, job: Absorb) {
    let shared = &inner.shared;
    // The page's word was withdrawn (with a fence) on the dispatcher's thread, which handed the
    // job over through a lock; this fence keeps the seqlock rule on this thread as well: no
    // byte stored below becomes visible before the withdrawal.
    fence(Ordering::SeqCst);
    // SAFETY: the slot is ABSORBING: owned by this job alone (no host thread touches its bytes
    // and it is not taken) and its page's word is withdrawn; staging page `index` belongs to
    // published WRITE ticket `ticket`, which `head` has not passed (it passes only once
    // `finish_ticket` below has run).
    unsafe { shared.copy_staging_to_slot(job.index, job.slot, job.len) };
    inner.lock().finish_absorb(shared, job.page, job.slot);
    shared
        .done(job.index)
        .store(job.ticket + 1, Ordering::Release);
    finish_ticket(inner, job.ticket, job.index);
    inner.changed.notify_all();
}

/// Counts a copier out when it ends, however it ends.
struct CopierGuard<'a>(&'a Inner);

impl Drop for CopierGuard<'_> {
    fn drop(&mut self) {
        self.0.alive_copiers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A copier thread's body: copy until the queue closes. The caller counted it in
/// `alive_copiers`.
pub(crate) fn run(inner: &Inner) {
    let _guard = CopierGuard(inner);
    while let Some(job) = inner.copies.pop() {
        absorb(inner, job);
    }
}
