//! The state a region's threads share ([`Shared`]): the mapping, the store, the page and
//! frame tables, counters, and the few helpers every path uses (addresses, waking, errors).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_core::{PagerConfig, Stats, Store, Tier};

use super::read_back::EvictLog;
use super::streams::Streams;
use super::trace::Trace;
use super::write_intent::Guessed;
use super::{EvictionPolicy, RegionError};
use crate::pages::{FramePool, PageTable};
use crate::sys::{self, EventFd, Mapping, Uffd};

/// Longest run read and installed in one go (prefetch and read-ahead), in bytes.
pub(super) const MAX_RUN_BYTES: usize = 4 << 20;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) write_faults: AtomicU64,
    pub(super) refaults: AtomicU64,
    pub(super) direct_reclaims: AtomicU64,
    pub(super) read_ahead_pages: AtomicU64,
    pub(super) duplicate_faults: AtomicU64,
    pub(super) failed_faults: AtomicU64,
    pub(super) read_back_pages: AtomicU64,
    pub(super) unchanged_write_backs: AtomicU64,
    pub(super) evicted_before_fills: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(super) struct Shared {
    pub(super) map: Mapping,
    pub(super) uffd: Uffd,
    pub(super) store: Arc<dyn Store>,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) page_bytes: usize,
    pub(super) pages: PageTable,
    pub(super) frames: FramePool,
    pub(super) config: PagerConfig,
    pub(super) policy: EvictionPolicy,
    pub(super) tier: Tier,
    pub(super) stats: Stats,
    pub(super) counters: Counters,
    pub(super) first_error: Mutex<Option<RegionError>>,
    pub(super) stop: AtomicBool,
    pub(super) stop_fd: EventFd,
    /// Fault messages being served now (statistics wait for them: see `Region::stats`).
    pub(super) in_service: AtomicUsize,
    /// Set while one filler polls for the next fault (fault.rs): one poller is enough.
    pub(super) fault_poller_busy: AtomicBool,
    /// Answer failed fills with `UFFDIO_POISON` (else `SIGBUS` to the faulting thread).
    pub(super) use_poison: bool,
    /// Read-ahead windows for the read-ahead threads (not claimed: a demand fault on one of
    /// their pages never waits behind the queue).
    pub(super) ra_queue: Mutex<std::collections::VecDeque<(usize, usize)>>,
    /// Signals `ra_queue`.
    pub(super) ra_ready: std::sync::Condvar,
    /// For batched `MADV_DONTNEED` through `process_madvise` (None where unavailable).
    pub(super) pidfd: Option<sys::SelfPidFd>,
    /// Set once `process_madvise` was refused (older kernels): use `madvise` per range.
    pub(super) no_process_madvise: AtomicBool,
    /// Evictors were woken and have not gone back to sleep (fillers then need not wake them).
    pub(super) evict_pending: AtomicBool,
    pub(super) evictions: AtomicU64,
    /// Evictions per stamp tick, so the stamp's bits span several buffer turnovers.
    pub(super) stamp_unit: u64,
    /// Evictors wake when free frames fall below this (resident above the high mark).
    pub(super) wake_below_free: usize,
    /// Evictors stop once free frames reach this (resident at the low mark).
    pub(super) stop_at_free: usize,
    /// Pages read ahead per window.
    pub(super) read_ahead: usize,
    /// Free frames read-ahead leaves for demand faults.
    pub(super) ahead_reserve: usize,
    /// Ends of recent fills: a missing-page fault at one continues a read stream.
    pub(super) fill_streams: Streams,
    /// Where evictions go behind the latest stream (see `behind.rs`).
    pub(super) behind: super::behind::Behind,
    /// Ends of recent runs made writable: a write fault at one continues a write stream.
    pub(super) write_streams: Streams,
    /// Install pages written during their last stay writable on a read fault.
    pub(super) predict_writes: bool,
    /// Install every page writable; evictions and flushes find written pages by digest.
    pub(super) writes_by_digest: bool,
    /// Digests of the store's copies, to drop unchanged dirty pages without a write.
    pub(super) digests: super::unchanged::Digests,
    /// Pages installed writable on that guess (see `write_intent.rs`).
    pub(super) guessed: Guessed,
    /// Pages read back with a fault from its neighbours in eviction order (0: none).
    pub(super) read_back: usize,
    /// The eviction order read-back draws on (None when read-back is off).
    pub(super) evict_log: Option<EvictLog>,
    /// Pages installed by read-back and not seen used since (a first write shows use).
    pub(super) read_back_unused: Guessed,
    /// The event record `STRATA_PAGER_TRACE` asks for (see `trace.rs`); None by default.
    pub(super) trace: Option<Trace>,
    /// Where zero fills copy from (see [`Zeros`]).
    pub(super) zeros: Zeros,
    /// Frames held out of use by the threads' scratch buffers (see [`Scratch`]).
    pub(super) parked: AtomicUsize,
    /// Most frames the scratch buffers may hold together: an eighth of the buffer, so that
    /// fills always find frames.
    pub(super) park_limit: usize,
    /// Fills evict as many pages as they install first (see `withhold.rs`).
    pub(super) evict_before_fills: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("store", &self.store.describe())
            .field("size", &self.size)
            .field("page_bytes", &self.page_bytes)
            .field("frames", &self.frames.len())
            .finish_non_exhaustive()
    }
}

/// A read-only anonymous mapping that is never written, as long as the longest run: reading
/// it maps only the kernel's shared zero page, so a run of zero pages (new or discarded
/// memory) is copied from it without a memset and without charging scratch memory.
pub(super) struct Zeros(Mapping);

impl Zeros {
    /// Zeros for runs of up to `len` bytes.
    pub(super) fn new(len: usize) -> std::io::Result<Self> {
        let map = Mapping::anonymous(len.max(1))?;
        map.set_read_only(true)?;
        Ok(Self(map))
    }

    /// Bytes available.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// The first `len` bytes (at most [`Zeros::len`]), all zero.
    pub(super) fn bytes(&self, len: usize) -> &[u8] {
        assert!(
            len <= self.0.len(),
            "a zero run longer than the zero mapping"
        );
        // SAFETY: the mapping is ours, read-only (nothing can write it, so it reads zero for
        // ever) and at least `len` bytes long; it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.0.ptr(), len) }
    }
}

/// How long a pager thread waits with nothing to do before it gives its scratch buffer's
/// window back ([`Scratch::release`]).
pub(super) const IDLE_RELEASE: Duration = Duration::from_millis(50);

/// Per-thread scratch buffer for store reads, page-aligned (its own anonymous mapping) so
/// that stores opened with `O_DIRECT` read straight into it instead of through a bounce
/// buffer.
///
/// Its pages are charged to the process like the region's, so while they are resident the
/// buffer holds as many of the region's frames out of use (up to [`Shared::park_limit`]
/// in all): the buffers and the resident pages together stay within the budget, where
/// before a window's worth per filler and read-ahead thread (half a MiB each with 64 KiB
/// pages and 8 pages ahead) came on top of it. The bytes past `keep` go back to the kernel
/// (`MADV_DONTNEED`), and their frames to the free list, after [`Scratch::RELEASE_AFTER`]
/// uses in a row that each needed less than the buffer holds: all but the largest of them
/// (at least `keep`: a filler keeps one page, so random faults never touch fresh pages) goes
/// back. So a filler whose streams went lean (half windows between single pages) stops
/// holding the frames of full windows, and one down to single pages holds one page. The
/// rest goes when the thread goes idle ([`Scratch::release`]). A window after
/// that pays the kernel's zero-fill faults on its pages once (about 10 us per 64 KiB),
/// small beside the store reads that fill it. Measured in `crates/strata-run/results`
/// (session 11).
pub(super) struct Scratch {
    map: Option<Mapping>,
    /// Bytes to keep when releasing after small uses.
    keep: usize,
    /// Bytes from the start that may be resident (touched since the last release).
    touched: usize,
    /// Uses in a row that each needed less than `touched`, and the largest of them.
    smaller_uses: u32,
    smaller_largest: usize,
    /// Frames of the region held out of use for the resident bytes.
    held: Vec<u32>,
}

impl Scratch {
    /// Uses within `keep` after which the rest is given back.
    pub(super) const RELEASE_AFTER: u32 = 64;
    const ALIGN: usize = 4096;

    /// An empty buffer that gives back what it holds past `keep` bytes once its uses stay
    /// within them.
    pub(super) fn new(keep: usize) -> Self {
        Self {
            map: None,
            keep: keep.next_multiple_of(Self::ALIGN),
            touched: 0,
            smaller_uses: 0,
            smaller_largest: 0,
            held: Vec::new(),
        }
    }

    /// `len` bytes to read into. With `region`, frames are held for the buffer's resident
    /// pages (taken without waiting: free ones above the demand reserve, then pages evicted
    /// now; fewer when none can be had).
    pub(super) fn get(&mut self, len: usize, region: Option<&Shared>) -> &mut [u8] {
        if len.next_multiple_of(Self::ALIGN) >= self.touched {
            self.smaller_uses = 0;
            self.smaller_largest = 0;
        } else {
            self.smaller_uses += 1;
            self.smaller_largest = self.smaller_largest.max(len);
            if self.smaller_uses == Self::RELEASE_AFTER {
                self.release(self.smaller_largest.max(self.keep), region);
                self.smaller_uses = 0;
                self.smaller_largest = 0;
            }
        }
        if self.map.as_ref().is_none_or(|m| m.len() < len) {
            let size = len.max(1).next_multiple_of(Self::ALIGN);
            // As a Vec's allocation would: no memory for half a MiB is not recoverable here.
            let map = Mapping::anonymous(size).unwrap_or_else(|e| {
                panic!("strata-pager: cannot map a scratch buffer of {size} bytes: {e}")
            });
            // The old mapping goes with its pages: nothing of it stays resident.
            self.map = Some(map);
            self.touched = 0;
        }
        self.touched = self.touched.max(len.next_multiple_of(Self::ALIGN));
        if let Some(region) = region {
            self.hold_frames(region);
        }
        let map = self.map.as_ref().expect("mapped above");
        // SAFETY: the mapping is ours, readable and writable, at least `len` bytes long, and
        // lives as long as `self`, which the returned borrow holds exclusively.
        unsafe { std::slice::from_raw_parts_mut(map.ptr(), len) }
    }

    fn hold_frames(&mut self, region: &Shared) {
        let want = self.touched.div_ceil(region.page_bytes);
        if self.held.len() >= want {
            return;
        }
        let room = region
            .park_limit
            .saturating_sub(region.parked.load(Ordering::Acquire));
        let more = (want - self.held.len()).min(room);
        if more == 0 {
            return;
        }
        let frames = region.frames_evicting(more);
        // Owners cleared first, so a count that sees them parked sees them moved.
        for &f in &frames {
            region.frames.clear_owner(f);
        }
        region.parked.fetch_add(frames.len(), Ordering::AcqRel);
        self.held.extend(frames);
    }

    /// Gives the pages past `keep` bytes back to the kernel (their contents are not needed:
    /// every use writes the bytes it reads), and the frames held for them to `region`'s free
    /// list. A failed `madvise` only leaves the pages resident (and their frames held).
    pub(super) fn release(&mut self, keep: usize, region: Option<&Shared>) {
        let keep = keep.next_multiple_of(Self::ALIGN);
        let Some(map) = &self.map else { return };
        let end = self.touched.min(map.len());
        if end > keep && map.advise(keep, end - keep, libc::MADV_DONTNEED).is_err() {
            return;
        }
        self.touched = self.touched.min(keep);
        if let Some(region) = region {
            let want = self.touched.div_ceil(region.page_bytes);
            while self.held.len() > want {
                let f = self.held.pop().expect("more held than wanted");
                region.parked.fetch_sub(1, Ordering::AcqRel);
                region.frames.push(f);
            }
        }
    }

    /// Whether pages past `keep` may be resident (a release would give some back).
    pub(super) fn holds_more_than_kept(&self) -> bool {
        self.touched > self.keep
    }

    /// Bytes that may be resident now (for tests).
    #[cfg(test)]
    pub(super) fn touched(&self) -> usize {
        self.touched
    }
}

impl Shared {
    pub(super) fn page_addr(&self, page: usize) -> usize {
        self.map.ptr() as usize + page * self.page_bytes
    }

    pub(super) fn store_offset(&self, page: usize) -> u64 {
        self.offset + (page * self.page_bytes) as u64
    }

    /// Bytes of `page` inside the region (the last page may be partial).
    pub(super) fn io_len(&self, page: usize) -> usize {
        let start = (page * self.page_bytes) as u64;
        usize::try_from((self.size - start).min(self.page_bytes as u64)).unwrap_or(self.page_bytes)
    }

    pub(super) fn record(&self, error: RegionError) {
        self.stats.add_error();
        let mut slot = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    pub(super) fn wake(&self, page: usize) {
        if let Err(e) = self.uffd.wake(self.page_addr(page), self.page_bytes) {
            eprintln!("strata-pager: UFFDIO_WAKE failed: {e}");
        }
    }

    pub(super) fn finish(&self, page: usize, new: u64) {
        if self.pages.finish(page, new) {
            self.wake(page);
        }
    }

    /// Waits up to 10 ms for the faults in service to finish their bookkeeping.
    pub(super) fn quiesce(&self) {
        let deadline = Instant::now() + Duration::from_millis(10);
        while self.in_service.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;
    use crate::sys::resident_bytes;

    fn resident(s: &mut Scratch) -> usize {
        let len = s.map.as_ref().map_or(0, crate::sys::Mapping::len);
        if len == 0 {
            return 0;
        }
        let ptr = s.map.as_ref().unwrap().ptr();
        resident_bytes(ptr, len).unwrap()
    }

    /// A window held through a run of single-page uses is given back (all but the kept
    /// page), an idle release gives back the rest, and the buffer works after both: a
    /// scratch that kept its window charged the program half a MiB per thread.
    #[test]
    fn scratch_gives_its_window_back_after_small_uses_and_when_idle() {
        let page = 65_536;
        let window = 9 * page;
        let mut s = Scratch::new(page);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.subsec_nanos())
            | 1;
        eprintln!("seed {seed}");
        let byte = |i: usize, k: u32| {
            (i as u64)
                .wrapping_mul(u64::from(seed))
                .wrapping_add(u64::from(k))
                .to_le_bytes()[1]
        };
        let fill = |buf: &mut [u8], k: u32| {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = byte(i, k);
            }
        };
        let check = |buf: &[u8], k: u32| buf.iter().enumerate().all(|(i, &b)| b == byte(i, k));
        let buf = s.get(window, None);
        fill(buf, 1);
        assert!(check(buf, 1));
        assert!(s.map.as_ref().unwrap().ptr().align_offset(4096) == 0);
        assert_eq!(resident(&mut s), window);
        // Small uses keep the window until the count is reached.
        for k in 0..Scratch::RELEASE_AFTER - 1 {
            let buf = s.get(page, None);
            fill(buf, k);
            assert!(check(buf, k));
        }
        assert_eq!(resident(&mut s), window, "released too early");
        let buf = s.get(page / 2, None);
        fill(buf, 99);
        assert!(
            check(buf, 99),
            "the kept page lost a write made after the release"
        );
        assert_eq!(
            resident(&mut s),
            page,
            "the window past the kept page stayed"
        );
        assert_eq!(s.touched(), page);
        // A window again works (fresh zero pages past the kept one) and is counted.
        let buf = s.get(window, None);
        assert!(buf[page..].iter().all(|&b| b == 0));
        fill(buf, 5);
        assert!(check(buf, 5));
        assert!(s.holds_more_than_kept());
        // A large use resets the count: 63 small uses after it keep the window again.
        for _ in 0..Scratch::RELEASE_AFTER - 1 {
            s.get(1, None);
        }
        assert_eq!(resident(&mut s), window);
        // Idle: all of it goes.
        s.release(0, None);
        assert_eq!(resident(&mut s), 0);
        assert!(!s.holds_more_than_kept());
        let buf = s.get(3 * page + 17, None);
        assert_eq!(buf.len(), 3 * page + 17);
        fill(buf, 8);
        assert!(check(buf, 8));
        // A larger window maps a larger buffer.
        let buf = s.get(20 * page, None);
        fill(buf, 9);
        assert!(check(buf, 9));
        assert_eq!(resident(&mut s), 20 * page);
    }

    /// A window held through a round of uses that read at most half windows shrinks to
    /// half a window, and a full window afterwards still works: a filler whose streams went
    /// lean held a full window's frames for ever, since single pages and half windows
    /// alternate and never make a run of small uses.
    #[test]
    fn scratch_shrinks_to_the_largest_use_of_a_round() {
        let page = 32_768;
        let mut s = Scratch::new(page);
        let buf = s.get(9 * page, None);
        buf.fill(7);
        assert_eq!(resident(&mut s), 9 * page);
        // A round: the full window's use began it; then half windows between single pages.
        for k in 1..Scratch::RELEASE_AFTER {
            let len = if k % 8 == 0 { 5 * page } else { page };
            s.get(len, None).fill(1);
        }
        assert_eq!(resident(&mut s), 9 * page, "the round held the full window");
        for k in 0..Scratch::RELEASE_AFTER {
            let len = if k % 8 == 0 { 5 * page } else { page };
            let buf = s.get(len, None);
            buf.fill(2);
            assert!(buf.iter().all(|&b| b == 2));
        }
        assert_eq!(
            resident(&mut s),
            5 * page,
            "shrinks to the largest use of the round"
        );
        let buf = s.get(9 * page, None);
        assert!(
            buf[5 * page..].iter().all(|&b| b == 0),
            "fresh pages past the kept ones"
        );
        buf.fill(3);
        assert!(buf.iter().all(|&b| b == 3));
        assert_eq!(resident(&mut s), 9 * page);
    }
}
