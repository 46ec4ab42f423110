//! The dispatcher: the one thread that drains the request ring, strictly in ticket order.
//!
//! It reads entries ahead of `head` with its own cursor and handles each in ticket order; a
//! ticket's work may finish later (a WRITE's copy runs on a copier), and `head` moves to the
//! lowest ticket not yet finished, so a staging page is never reused before it was copied.
//! A WRITE takes its page's slot at once (ABSORBING: word withdrawn) and hands the copy to the
//! copiers (`copier.rs`), which publish the slot and `done`; a READ posted after the write
//! finds the slot ABSORBING and waits for its word as for a fill, so it always sees the
//! written bytes, and a second WRITE of the page waits for the first copy.
//!
//! READ misses take a slot and go to the store workers as fills; misses that arrive while the
//! workers are busy join one batch.
//! When no slot is free or clean the dispatcher writes dirty slots back and waits for one
//! (back-pressure); when the store refuses every dirty page, a READ gets ERROR and a WRITE
//! keeps its bytes on the heap, so that the ring never stops and nothing is dropped.
//!
//! Idle, it polls through short gaps (spins, then yields), then parks for 20 µs growing to
//! 320 µs, so an idle space costs almost no CPU; while copies are in flight it never parks,
//! so that `head` (the device's room in the ring) follows them at once.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::copier::{self, Absorb};
use super::error::PageOp;
use super::host_cache::{HostCache, SlotState, withdraw_word};
use super::layout::{REQ_READ, REQ_READ_AHEAD, REQ_WRITE, SlotWord};
use super::server::Inner;
use super::store_io::{Job, submit};

/// Recent READ pages, to spot sequential runs across interleaved warps.
#[derive(Debug)]
struct Recent {
    pages: [u64; 16],
    next: usize,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            pages: [u64::MAX; 16],
            next: 0,
        }
    }
}

impl Recent {
    /// Notes `page`; true when `page - 1` was read recently (a sequential run).
    fn sequential(&mut self, page: u64) -> bool {
        let run = page > 0 && self.pages.contains(&(page - 1));
        self.pages[self.next] = page;
        self.next = (self.next + 1) % self.pages.len();
        run
    }
}

/// Sets `false` when the dispatcher ends, however it ends.
struct AliveFlag<'a>(&'a Inner);

impl Drop for AliveFlag<'_> {
    fn drop(&mut self) {
        self.0.dispatcher_alive.store(false, Ordering::Release);
    }
}

/// The dispatcher thread's body.
pub(crate) fn run(inner: &Inner) {
    let _alive = AliveFlag(inner);
    let shared = &inner.shared;
    let capacity = u64::from(shared.capacity());
    // `head`: the lowest ticket not finished (published to the device); `cursor`: the next
    // ticket to handle. Tickets in between are handled, their work (WRITE copies) in flight.
    let mut head = shared.head().load(Ordering::Acquire);
    let mut cursor = head;
    let mut idle: u32 = 0;
    let mut recent = Recent::default();
    let mut since_check: u32 = 0;
    loop {
        if inner.stopping() {
            return;
        }
        let before = head;
        while head < cursor && copier::ticket_finished(inner, head, shared.ring_index(head)) {
            head += 1;
        }
        if head != before {
            shared.head().store(head, Ordering::Release);
            idle = 0;
        }
        let index = shared.ring_index(cursor);
        if cursor - head < capacity && shared.entry_seq(index).load(Ordering::Acquire) == cursor + 1
        {
            let page = shared.entry_page(index).load(Ordering::Relaxed);
            let kind = shared.entry_kind(index).load(Ordering::Relaxed);
            let mut queued = false;
            match kind {
                REQ_READ => read(inner, page, false, &mut recent),
                REQ_READ_AHEAD => read(inner, page, true, &mut recent),
                REQ_WRITE => queued = write(inner, page, cursor, index),
                other => inner.lock().record(
                    page,
                    PageOp::Read,
                    format!("the device posted ticket {cursor} with unknown request kind {other}; the device code and the host disagree, rebuild both"),
                ),
            }
            if inner.kill.load(Ordering::Acquire) {
                return; // killed mid-request: leave the ticket unconsumed, as a dead host would
            }
            if !queued {
                if !matches!(kind, REQ_READ | REQ_READ_AHEAD) {
                    shared.done(index).store(cursor + 1, Ordering::Release);
                }
                copier::finish_ticket(inner, cursor, index);
            }
            cursor += 1;
            idle = 0;
            since_check += 1;
            if since_check >= 64 {
                since_check = 0;
                background_write_back(inner);
            }
            continue;
        }
        if idle == 0 {
            background_write_back(inner);
        }
        idle = idle.saturating_add(1);
        if head < cursor {
            // Copies in flight end within microseconds: poll for them without parking, so
            // that `head` (room in the ring for the device) follows at once.
            if idle < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        // A kernel's faults come in bursts with gaps of microseconds between waves: polling
        // through such gaps keeps a fault from paying a thread wake-up; only a longer silence
        // (no kernel running) parks, and the parks grow so an idle space costs little CPU.
        match idle {
            0..2048 => std::hint::spin_loop(),
            2048..2304 => std::thread::yield_now(),
            _ => {
                let step = ((idle - 2304) / 16).min(4);
                std::thread::park_timeout(Duration::from_micros(20 << step));
            }
        }
    }
}

/// Starts writing dirty slots back when more than the high-water fraction is dirty, keeping
/// at most `threads - 1` batches in flight (one worker stays free for fills).
fn background_write_back(inner: &Inner) {
    let mut cache = inner.lock();
    let slots = inner.shared.slot_count();
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let high = (inner.options.dirty_high_water * slots as f64) as u64;
    let batch = inner.options.max_batch as u64;
    let limit = batch * (inner.options.threads as u64 - 1).max(1);
    if cache.dirty_count() > high && cache.writing() + batch <= limit && cache.has_dirty_present() {
        let items = cache.begin_write_back(inner.options.max_batch, |_| true);
        if !items.is_empty() {
            submit(inner, &mut cache, Job::WriteBack(items));
        }
    }
}

/// A slot for a page that needs one now: a free or clean slot, else dirty slots are written
/// back and the dispatcher waits for one. `None` when the store refuses every dirty page
/// (a round of write-backs ended with nothing clean and nothing in flight), or on stop.
fn obtain_slot<'a>(
    inner: &'a Inner,
    mut cache: MutexGuard<'a, HostCache>,
) -> (MutexGuard<'a, HostCache>, Option<u32>) {
    let mut submitted = false;
    loop {
        if let Some(slot) = cache.take_clean(&inner.shared) {
            return (cache, Some(slot));
        }
        if inner.stopping() {
            return (cache, None);
        }
        if cache.writing() == 0 {
            if submitted && cache.filling() + cache.absorbing() == 0 {
                return (cache, None);
            }
            let items = cache.begin_write_back(inner.options.max_batch, |_| true);
            if items.is_empty() {
                if cache.filling() + cache.absorbing() == 0 {
                    return (cache, None);
                }
            } else {
                submit(inner, &mut cache, Job::WriteBack(items));
                submitted = true;
            }
        }
        inner.counters.slot_waits.fetch_add(1, Ordering::Relaxed);
        cache = inner.wait(cache);
    }
}

const NO_SLOT: &str = "every host-cache slot holds a dirty page the store refuses to take; fix the store, flush the space, and access the page again";

fn read(inner: &Inner, page: u64, ahead: bool, recent: &mut Recent) {
    let shared = &inner.shared;
    let counter = if ahead {
        &inner.counters.read_ahead_requests
    } else {
        &inner.counters.read_requests
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if page >= shared.pages() {
        inner.lock().record(
            page,
            PageOp::Read,
            format!(
                "the device asked for page {page} of a space of {} pages; fix the kernel's page index",
                shared.pages()
            ),
        );
        return;
    }
    let mut cache = inner.lock();
    if ahead {
        read_ahead(inner, &mut cache, page..page + 1);
        return;
    }
    if let Some((slot, _)) = cache.lookup(page) {
        cache.touch(slot); // present, filling or writing: the waiting warp sees it soon
        return;
    }
    if SlotWord::decode(shared.slot_word(page).load(Ordering::Relaxed)).error {
        return; // the warp sees ERROR; take_errors withdraws it so a later access retries
    }
    if let Some(bytes) = cache.take_overflow(page) {
        let (mut cache, slot) = obtain_slot(inner, cache);
        match slot {
            // SAFETY: the slot was just taken (free, its old word withdrawn) under the lock.
            Some(slot) => cache.put_dirty(shared, page, slot, |s| unsafe {
                shared.copy_into_slot(s, &bytes);
            }),
            None => {
                cache.put_overflow(page, bytes);
                cache.finish_fill_failed(shared, page, NO_SLOT);
            }
        }
        return;
    }
    let (mut cache, slot) = obtain_slot(inner, cache);
    let Some(slot) = slot else {
        cache.finish_fill_failed(shared, page, NO_SLOT);
        return;
    };
    cache.begin_fill(page, slot, false);
    submit(inner, &mut cache, Job::Fill(vec![(page, slot)]));
    let n = inner.options.read_ahead_pages;
    if n > 0 && recent.sequential(page) {
        let end = (page + 1).saturating_add(n).min(shared.pages());
        read_ahead(inner, &mut cache, page + 1..end);
    }
}

/// Slots of the clock's path a read-ahead looks at for a spare one.
const READ_AHEAD_WINDOW: usize = 64;

/// Starts fills for the pages of `pages` that are absent, while spare slots last (free, or
/// clean and unreferenced near the clock's hand: read-ahead never demotes a hot page).
fn read_ahead(inner: &Inner, cache: &mut HostCache, pages: std::ops::Range<u64>) {
    let shared = &inner.shared;
    let mut items = Vec::new();
    for page in pages {
        if cache.lookup(page).is_some()
            || SlotWord::decode(shared.slot_word(page).load(Ordering::Relaxed)).error
            || cache.has_overflow(page)
        {
            continue;
        }
        match cache.take_spare(shared, READ_AHEAD_WINDOW) {
            Some(slot) => {
                cache.begin_fill(page, slot, true);
                items.push((page, slot));
            }
            None => {
                inner
                    .counters
                    .read_ahead_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if !items.is_empty() {
        inner
            .counters
            .read_ahead_pages
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        submit(inner, cache, Job::Fill(items));
    }
}

/// Handles WRITE ticket `ticket` (at ring index `index`) of `page`. True when its copy was
/// handed to the copiers, which then store `done` and finish the ticket; false when the
/// dispatcher must (the write was refused, kept in overflow, or the server is stopping).
fn write(inner: &Inner, page: u64, ticket: u64, index: u32) -> bool {
    let shared = &inner.shared;
    inner
        .counters
        .write_requests
        .fetch_add(1, Ordering::Relaxed);
    if page >= shared.pages() {
        inner.lock().record(
            page,
            PageOp::Write,
            format!(
                "the device wrote page {page} of a space of {} pages; the bytes were dropped, fix the kernel's page index",
                shared.pages()
            ),
        );
        return false;
    }
    let (_, len) = shared.page_range(page);
    let job = |slot| Absorb {
        ticket,
        index,
        page,
        slot,
        len,
    };
    let mut cache = inner.lock();
    loop {
        match cache.lookup(page) {
            Some((slot, SlotState::Present)) => {
                cache.begin_absorb(shared, page, slot);
                drop(cache);
                copier::submit(inner, job(slot));
                return true;
            }
            Some((slot, SlotState::Writing)) => {
                // The store must not see half of the new bytes: they go to another slot, or,
                // with none clean, wait for the store write to end.
                if let Some(new) = cache.take_clean(shared) {
                    cache.redirect_write(shared, page, slot, new);
                    drop(cache);
                    copier::submit(inner, job(new));
                    return true;
                }
            }
            // Filling: the store read must not land over the write; it ends within a store
            // call. Absorbing: an earlier WRITE's copy, which must land first; it ends within
            // a memcpy.
            Some(_) => {}
            None => break,
        }
        if inner.stopping() {
            return false;
        }
        cache = inner.wait(cache);
    }
    drop(cache.take_overflow(page)); // superseded by these bytes
    let (mut cache, slot) = obtain_slot(inner, cache);
    if let Some(slot) = slot {
        cache.begin_absorb(shared, page, slot);
        drop(cache);
        copier::submit(inner, job(slot));
        return true;
    }
    let mut bytes = vec![0; len];
    // SAFETY: the staging page belongs to this published ticket, which head has not passed
    // (the dispatcher finishes the ticket after this returns).
    unsafe { shared.copy_from_staging(index, &mut bytes) };
    withdraw_word(shared, page); // a stale ERROR word goes: the page is whole again
    cache.put_overflow(page, bytes);
    cache.record(page, PageOp::Write, NO_SLOT.into());
    false
}
