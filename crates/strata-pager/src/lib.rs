//! Strata's user-space pager: CPU memory regions whose pages live in any
//! [`Store`](strata_core::Store) and are brought in on demand through userfaultfd.
//!
//! ```no_run
//! use std::sync::Arc;
//! use strata_core::{MemoryStore, PagerConfig};
//! use strata_pager::Region;
//!
//! let store = Arc::new(MemoryStore::new(1 << 30));
//! let config = PagerConfig::builder().page_bytes(64 << 10).buffer_bytes(64 << 20).build()?;
//! let mut region = Region::new(store, 1 << 30, config)?;
//! region.as_mut_slice()[12345] = 7; // faults the page in, marks it dirty
//! region.flush()?;                  // writes it back to the store
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design, and where it departs from Umap
//! - No manager thread: every filler waits on the region's userfaultfd itself (epoll with
//!   `EPOLLEXCLUSIVE`, so one fault wakes one filler) and serves the faults it reads. A
//!   filler that finds no free frame evicts one itself (direct reclaim), so no thread's stall
//!   holds up every fault.
//! - Page state is one atomic word per page (state, reference/hot bits, eviction stamp,
//!   frame); all transitions are compare-and-swaps. A fault on a page another thread is
//!   working on leaves a waiter bit and returns; the owner wakes the range when done.
//! - Clean pages are installed write-protected (`UFFDIO_COPY_MODE_WP`), so a first write is
//!   seen once and marks the page dirty; write faults on missing pages install writable pages.
//!   Before a dirty page is written back it is write-protected again, so a racing write waits
//!   rather than being lost.
//! - Eviction: a clock over the buffer's frames with reference bits (set by fills and first
//!   writes) and re-fault detection (a page that comes back within one buffer's worth of
//!   evictions is hot and survives an extra pass), rather than Umap's FIFO. Evictors claim a
//!   batch of victims, write its dirty pages back as runs of neighbours (one write-protect
//!   call and one store write per run, all runs in one `write_batch`), and drop the batch
//!   with one `process_madvise(MADV_DONTNEED)` (one TLB shootdown per batch; `madvise` per
//!   range on kernels before 6.13).
//! - Read-ahead: a fault at the end of a recent fill (a sequential stream; a merely resident
//!   neighbour is not enough, see `region/streams.rs`) reads the next window with the faulting
//!   page and queues the two windows after it for read-ahead threads, so three reads are in
//!   flight; streams run both ways, and pages a stream passed are evicted first. While most
//!   faults are random (a program whose working set is read at random, beside slow
//!   streams), a stream reads half a window and queues none, so its frames stay with that
//!   set. A write stream over pages read ahead lifts their write protection a window at a
//!   time, so they do not trap one by one. Runs of discarded pages fill with zeros together.
//!   Read-ahead never starves a demand fault: it takes only free frames above a reserve kept
//!   for faults, never evicts, never waits, and claims a queued window only when it reads it;
//!   a window is at most a quarter of the buffer. Only a fault's own page may wait for a
//!   frame, and no thread waits for a frame while holding one, so fills cannot deadlock.
//! - Per-region page size (any multiple of 4 KiB up to 2 MiB), buffer, thread counts,
//!   read-ahead and water marks; any number of regions; memory is given back on eviction.
//! - A store error on a fault answers the faulting thread with `SIGBUS` (poisoned page) and
//!   is returned by the next `flush`; a write-back error keeps the page dirty and resident.
//!   `SIGBUS` means the store failed, and nothing else: a read error, a buffer whose every
//!   frame holds a page the store refused to take back, or a store that left every frame
//!   busy for [`region::FRAME_WAIT`] (30 s).
//!   See [`region`] for the details.
//!
//! Layout (rustix-style): [`sys`] holds every raw kernel call (userfaultfd ioctls with
//! `#[repr(C)]` structs checked by layout tests, `mmap`, `epoll`); [`pages`] the lock-free page
//! and frame tables; [`region`] the safe [`Region`] API and its filler, read-ahead and evictor threads (one file
//! per job: see its docs);
//! [`probe`] the userfaultfd capability probe used by `strata info`. The STREAM kernels that
//! `strata bench stream` runs over a region live in `strata-bench`, with the other benchmarks.
#![warn(missing_docs)]

pub mod pages;
pub mod probe;
pub mod region;
pub mod sys;
#[cfg(test)]
mod watchdog;

pub use region::{
    EvictionPolicy, PagerCounters, Region, RegionBuilder, RegionError, UnmapError, Withheld,
    WriteTracking,
};
