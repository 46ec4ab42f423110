//! [`RingServer`]: the host threads that serve a store-backed space's request ring: one
//! dispatcher draining the ring in ticket order (`dispatcher.rs`), copiers that copy WRITEs'
//! staging pages into host-cache slots in parallel (`copier.rs`, as many as store threads),
//! and a pool of store I/O workers (`store_io.rs`) that fill and write back host-cache slots
//! in batches.
//!
//! Host calls ([`RingServer::flush`], [`RingServer::invalidate`]) run on the caller's thread
//! and are meant for when no kernel runs; they share the host cache's lock with the threads.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_core::store::Store;

use super::copier::{self, Absorb};
use super::error::{DirtyPages, PageFailure, PageOp, RingError};
use super::host_cache::HostCache;
use super::shared::SharedRing;
use super::store_io::{self, JobQueue};

/// How a [`RingServer`] works.
#[derive(Debug, Clone, PartialEq)]
pub struct RingServerOptions {
    /// Store I/O worker threads (1..=256); as many copier threads copy WRITEs into slots.
    pub threads: usize,
    /// Most pages per store batch (1..=65536).
    pub max_batch: usize,
    /// Pages read ahead past a READ that continues a sequential run (0 turns it off). Read-ahead
    /// only uses free or clean slots; it never makes a request wait.
    pub read_ahead_pages: u64,
    /// Fraction of host-cache slots (0..=1) that may be dirty before the server writes dirty
    /// slots back in the background, so that reads rarely wait for a store write.
    pub dirty_high_water: f64,
}

impl Default for RingServerOptions {
    fn default() -> Self {
        RingServerOptions {
            threads: 4,
            max_batch: 64,
            read_ahead_pages: 8,
            dirty_high_water: 0.5,
        }
    }
}

impl RingServerOptions {
    fn check(&self) -> Result<(), RingError> {
        let bad = |name, value: String, fix| Err(RingError::Options { name, value, fix });
        if !(1..=256).contains(&self.threads) {
            return bad("threads", self.threads.to_string(), "use 1 to 256 threads");
        }
        if !(1..=65536).contains(&self.max_batch) {
            return bad(
                "max_batch",
                self.max_batch.to_string(),
                "use 1 to 65536 pages per batch",
            );
        }
        if !(0.0..=1.0).contains(&self.dirty_high_water) {
            return bad(
                "dirty_high_water",
                self.dirty_high_water.to_string(),
                "use a fraction between 0 and 1",
            );
        }
        Ok(())
    }
}

/// What a [`RingServer`] has done.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RingStats {
    /// READ requests taken from the ring.
    pub read_requests: u64,
    /// WRITE requests taken from the ring.
    pub write_requests: u64,
    /// READ_AHEAD requests taken from the ring.
    pub read_ahead_requests: u64,
    /// Pages read ahead (requested or by the server's own sequential detection).
    pub read_ahead_pages: u64,
    /// Read-ahead pages dropped for want of a clean slot.
    pub read_ahead_dropped: u64,
    /// `read_batch` calls.
    pub store_read_batches: u64,
    /// `write_batch` calls.
    pub store_write_batches: u64,
    /// Bytes read from the store.
    pub store_bytes_in: u64,
    /// Bytes written to the store.
    pub store_bytes_out: u64,
    /// Clean host-cache slots taken for other pages.
    pub evictions: u64,
    /// WRITEs whose page's slot was being written to the store, moved to another slot.
    pub write_redirects: u64,
    /// Times the dispatcher waited for a slot (back-pressure).
    pub slot_waits: u64,
    /// The most WRITE copies in flight at once (handed to the copiers, not yet finished).
    pub max_writes_in_flight: u64,
    /// Dirty host-cache slots now.
    pub dirty_slots: u64,
    /// Pages in the largest store batch.
    pub max_batch: u64,
    /// Mean pages per store batch.
    pub mean_batch: f64,
}

/// Counters shared by the server's threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) read_requests: AtomicU64,
    pub(crate) write_requests: AtomicU64,
    pub(crate) read_ahead_requests: AtomicU64,
    pub(crate) read_ahead_pages: AtomicU64,
    pub(crate) read_ahead_dropped: AtomicU64,
    pub(crate) read_batches: AtomicU64,
    pub(crate) write_batches: AtomicU64,
    pub(crate) batch_pages: AtomicU64,
    pub(crate) max_batch: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) slot_waits: AtomicU64,
}

impl Counters {
    pub(crate) fn batch(&self, write: bool, pages: usize, bytes: u64) {
        let pages = pages as u64;
        if write {
            self.write_batches.fetch_add(1, Ordering::Relaxed);
            self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.read_batches.fetch_add(1, Ordering::Relaxed);
            self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        }
        self.batch_pages.fetch_add(pages, Ordering::Relaxed);
        self.max_batch.fetch_max(pages, Ordering::Relaxed);
    }
}

/// State shared by the server's threads and its host calls.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) shared: Arc<SharedRing>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: RingServerOptions,
    pub(crate) cache: Mutex<HostCache>,
    /// Signalled whenever a slot changes state (fills, write-backs end).
    pub(crate) changed: Condvar,
    pub(crate) queue: JobQueue,
    pub(crate) alive_workers: AtomicUsize,
    /// WRITE copies waiting for a copier.
    pub(crate) copies: JobQueue<Absorb>,
    pub(crate) alive_copiers: AtomicUsize,
    /// Per ring index: ticket + 1 once the ticket's work is finished (`head` may pass it).
    pub(crate) finished: Box<[AtomicU64]>,
    pub(crate) stop: AtomicBool,
    pub(crate) kill: AtomicBool,
    pub(crate) dispatcher_alive: AtomicBool,
    pub(crate) counters: Counters,
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HostCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot to change state (or a short while).
    pub(crate) fn wait<'a>(&self, cache: MutexGuard<'a, HostCache>) -> MutexGuard<'a, HostCache> {
        self.changed
            .wait_timeout(cache, Duration::from_millis(2))
            .map_or_else(|e| e.into_inner().0, |r| r.0)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.kill.load(Ordering::Acquire)
    }

    /// Writes the dirty pages of `range` (slots and overflow) to the store on this thread,
    /// waiting first for write-backs in flight there. Returns the pages that failed (they stay
    /// dirty).
    fn write_back_range(&self, range: &Range<u64>) -> Vec<PageFailure> {
        let mut cache = self.lock();
        while cache.busy_in(range, false) {
            cache = self.wait(cache);
        }
        let items = cache.begin_write_back(usize::MAX, |p| range.contains(&p));
        let overflow = cache.take_overflow_range(range);
        drop(cache);
        let shared = &self.shared;
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks(self.options.max_batch) {
            results.extend(store_io::write_slots(self, chunk));
        }
        let mut overflow_results = Vec::with_capacity(overflow.len());
        for chunk in overflow.chunks(self.options.max_batch) {
            let ranges: Vec<(u64, &[u8])> = chunk
                .iter()
                .map(|(p, b)| (shared.page_range(*p).0, &b[..]))
                .collect();
            overflow_results.extend(store_io::write_ranges(self, &ranges));
        }
        let mut failures = Vec::new();
        let mut cache = self.lock();
        for ((page, _), result) in &results {
            if let Err(message) = result {
                failures.push(PageFailure {
                    page: *page,
                    op: PageOp::Write,
                    message: message.clone(),
                });
            }
        }
        cache.finish_write_back(&results);
        for ((page, bytes), result) in overflow.into_iter().zip(overflow_results) {
            if let Err(message) = result {
                failures.push(PageFailure {
                    page,
                    op: PageOp::Write,
                    message: message.clone(),
                });
                cache.record(page, PageOp::Write, message);
                // Nothing newer can exist: no kernel runs during host calls, and a write
                // that arrived anyway went to a slot, which supersedes this copy.
                if cache.lookup(page).is_none() {
                    cache.put_overflow(page, bytes);
                }
            }
        }
        self.changed.notify_all();
        failures.sort_by_key(|f| f.page);
        failures
    }
}

/// The host side of a store-backed space's request ring. See the module docs and
/// [`super::layout`].
pub struct RingServer {
    inner: Arc<Inner>,
    dispatcher: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    copiers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RingServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingServer")
            .field("geometry", &self.inner.shared.geometry())
            .field("store", &self.inner.store.describe())
            .field("options", &self.inner.options)
            .field("alive", &self.is_alive())
            .finish_non_exhaustive()
    }
}

impl RingServer {
    /// Starts serving `shared` from `store` (at least the space's size).
    pub fn start(
        shared: SharedRing,
        store: Arc<dyn Store>,
        options: RingServerOptions,
    ) -> Result<RingServer, RingError> {
        options.check()?;
        shared.geometry().check()?;
        if store.size() < shared.space_size() {
            return Err(RingError::StoreTooSmall {
                store: store.describe(),
                store_size: store.size(),
                space_size: shared.space_size(),
            });
        }
        let slots = u32::try_from(shared.slot_count())
            .map_err(|_| RingError::Geometry("too many slots".into()))?;
        let capacity = shared.capacity();
        let inner = Arc::new(Inner {
            shared: Arc::new(shared),
            store,
            cache: Mutex::new(HostCache::new(slots)),
            changed: Condvar::new(),
            queue: JobQueue::new(options.max_batch),
            alive_workers: AtomicUsize::new(0),
            copies: JobQueue::new(1),
            alive_copiers: AtomicUsize::new(0),
            finished: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            kill: AtomicBool::new(false),
            dispatcher_alive: AtomicBool::new(true),
            counters: Counters::default(),
            options,
        });
        let mut server = RingServer {
            inner: Arc::clone(&inner),
            dispatcher: None,
            workers: Vec::new(),
            copiers: Vec::new(),
        };
        let threads = inner.options.threads;
        spawn_pool(
            &inner,
            "io",
            threads,
            alive_workers,
            store_io::run_worker,
            &mut server.workers,
        )?;
        spawn_pool(
            &inner,
            "copy",
            threads,
            alive_copiers,
            copier::run,
            &mut server.copiers,
        )?;
        let dispatcher = Arc::clone(&inner);
        server.dispatcher = Some(
            std::thread::Builder::new()
                .name("strata-ring-dispatch".into())
                .spawn(move || super::dispatcher::run(&dispatcher))
                .map_err(RingError::Spawn)?,
        );
        Ok(server)
    }

    /// The shared memory the server serves (for the device side and for tests).
    pub fn shared(&self) -> &Arc<SharedRing> {
        &self.inner.shared
    }

    /// Writes every dirty host-cache page to the store (`write_batch`), then flushes the store.
    /// Call it when no kernel runs. Pages that fail stay dirty and the error lists them.
    pub fn flush(&self) -> Result<(), RingError> {
        let failures = self.inner.write_back_range(&(0..self.inner.shared.pages()));
        if !failures.is_empty() {
            return Err(RingError::Flush { failures });
        }
        self.inner.store.flush().map_err(RingError::StoreFlush)
    }

    /// Writes the dirty pages of `pages` to the store, then drops the range from the host
    /// cache (slot words withdrawn, generation bumped; ERROR words withdrawn too). Call it when
    /// no kernel runs. Pages that fail to write stay dirty and cached, and the error lists them.
    pub fn invalidate(&self, pages: Range<u64>) -> Result<(), RingError> {
        let total = self.inner.shared.pages();
        if pages.start > pages.end || pages.end > total {
            return Err(RingError::PageRange {
                start: pages.start,
                end: pages.end,
                pages: total,
            });
        }
        let failures = self.inner.write_back_range(&pages);
        let mut cache = self.inner.lock();
        while cache.busy_in(&pages, true) {
            cache = self.inner.wait(cache);
        }
        cache.drop_clean(&self.inner.shared, &pages);
        drop(cache);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(RingError::Flush { failures })
        }
    }

    /// Takes the pages the store failed on since the last call (reads and writes). Read
    /// failures' ERROR slot words are withdrawn, so the next access retries the store.
    pub fn take_errors(&self) -> Vec<PageFailure> {
        let mut cache = self.inner.lock();
        cache.take_failures(&self.inner.shared)
    }

    /// Copies of the pages still dirty in the host cache (page, bytes of the page's length),
    /// for an error that hands data back.
    pub fn dirty_pages(&self) -> Vec<(u64, Vec<u8>)> {
        let mut cache = self.inner.lock();
        // A WRITE being copied into its slot holds the page's newest bytes: wait for it.
        while cache.absorbing() > 0 && self.inner.alive_copiers.load(Ordering::Acquire) > 0 {
            cache = self.inner.wait(cache);
        }
        cache.dirty_copies(&self.inner.shared)
    }

    /// What the server has done.
    pub fn stats(&self) -> RingStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (evictions, dirty_slots, write_redirects, max_writes_in_flight) = {
            let cache = self.inner.lock();
            (
                cache.evictions(),
                cache.dirty_count(),
                cache.redirects(),
                cache.max_absorbing(),
            )
        };
        let batches = get(&c.read_batches) + get(&c.write_batches);
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let mean_batch = if batches == 0 {
            0.0
        } else {
            get(&c.batch_pages) as f64 / batches as f64
        };
        RingStats {
            read_requests: get(&c.read_requests),
            write_requests: get(&c.write_requests),
            read_ahead_requests: get(&c.read_ahead_requests),
            read_ahead_pages: get(&c.read_ahead_pages),
            read_ahead_dropped: get(&c.read_ahead_dropped),
            store_read_batches: get(&c.read_batches),
            store_write_batches: get(&c.write_batches),
            store_bytes_in: get(&c.bytes_in),
            store_bytes_out: get(&c.bytes_out),
            evictions,
            write_redirects,
            slot_waits: get(&c.slot_waits),
            max_writes_in_flight,
            dirty_slots,
            max_batch: get(&c.max_batch),
            mean_batch,
        }
    }

    /// Whether the dispatcher runs (it stops on shutdown, on a kill, or if it panicked).
    pub fn is_alive(&self) -> bool {
        self.inner.dispatcher_alive.load(Ordering::Acquire) && !self.inner.stopping()
    }

    /// Flushes, then stops the threads. On a flush failure the threads stop anyway and the
    /// error hands back the pages the store would not take.
    pub fn shutdown(mut self) -> Result<(), RingError> {
        self.finish()
    }

    /// Stops the dispatcher without flushing, as if it had died (tests of the device's bounded
    /// waits), and waits (at most 5 s) until it has ended: a request posted after this
    /// returns is never taken, however the threads were scheduled.
    #[doc(hidden)]
    pub fn kill_for_test(&self) {
        self.inner.kill.store(true, Ordering::Release);
        if let Some(d) = &self.dispatcher {
            d.thread().unpark();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while self.inner.dispatcher_alive.load(Ordering::Acquire)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    fn finish(&mut self) -> Result<(), RingError> {
        if self.dispatcher.is_none() && self.workers.is_empty() && self.copiers.is_empty() {
            return Ok(());
        }
        // A server that never fully started holds nothing dirty.
        let flushed = if self.dispatcher.is_some() {
            self.flush()
        } else {
            Ok(())
        };
        self.inner.stop.store(true, Ordering::Release);
        if let Some(dispatcher) = self.dispatcher.take() {
            dispatcher.thread().unpark();
            if dispatcher.join().is_err() {
                tracing::warn!("the ring dispatcher had panicked");
            }
        }
        self.inner.copies.close();
        for copier in self.copiers.drain(..) {
            if copier.join().is_err() {
                tracing::warn!("a ring copier had panicked");
            }
        }
        self.inner.queue.close();
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::warn!("a ring store worker had panicked");
            }
        }
        match flushed {
            Err(RingError::Flush { failures }) => Err(RingError::Unflushed {
                failures,
                dirty: DirtyPages(self.dirty_pages()),
            }),
            other => other,
        }
    }
}

fn alive_workers(inner: &Inner) -> &AtomicUsize {
    &inner.alive_workers
}

fn alive_copiers(inner: &Inner) -> &AtomicUsize {
    &inner.alive_copiers
}

/// Starts `count` threads named `strata-ring-{name}-{i}` running `body`, each counted in
/// `alive(inner)` before it starts (the body counts itself out when it ends). On a failed
/// spawn the threads started so far stay in `handles`, for the server's drop to stop.
fn spawn_pool(
    inner: &Arc<Inner>,
    name: &str,
    count: usize,
    alive: fn(&Inner) -> &AtomicUsize,
    body: fn(&Inner),
    handles: &mut Vec<JoinHandle<()>>,
) -> Result<(), RingError> {
    for i in 0..count {
        let thread_inner = Arc::clone(inner);
        alive(inner).fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name(format!("strata-ring-{name}-{i}"))
            .spawn(move || body(&thread_inner));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                alive(inner).fetch_sub(1, Ordering::AcqRel);
                return Err(RingError::Spawn(e));
            }
        }
    }
    Ok(())
}

impl Drop for RingServer {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("ring server dropped: {e}");
        }
    }
}
