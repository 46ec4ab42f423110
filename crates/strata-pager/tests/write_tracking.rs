//! Finding written pages by digest (`WriteTracking::Digest`): no write traps, every changed
//! page reaches the store at eviction and at flush, and no page that was only read (or put
//! back to its stored bytes) is written; without digests the region traps writes instead.
#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{Rng, uffd_available};
use strata_core::store::ReadRequest;
use strata_core::{MemoryStore, PagerConfig, Store, StoreError};
use strata_pager::{Region, WriteTracking};

const PAGE: usize = 4096;

/// A memory store that remembers which pages each write covered.
#[derive(Debug)]
struct WriteLog {
    inner: MemoryStore,
    /// Pages covered by writes, one entry per page per write.
    written: Mutex<Vec<usize>>,
    writes: AtomicU64,
}

impl WriteLog {
    fn new(data: &[u8]) -> Self {
        Self {
            inner: MemoryStore::from_bytes(data),
            written: Mutex::new(Vec::new()),
            writes: AtomicU64::new(0),
        }
    }
    /// Pages written since the last call, sorted, each once.
    fn take_written(&self) -> Vec<usize> {
        let mut pages = std::mem::take(&mut *self.written.lock().expect("not poisoned"));
        pages.sort_unstable();
        pages.dedup();
        pages
    }
    fn contents(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.inner.size() as usize];
        self.inner.read_at(0, &mut out).expect("memory store reads");
        out
    }
}

impl Store for WriteLog {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let first = offset as usize / PAGE;
        let last = (offset as usize + buf.len()).div_ceil(PAGE);
        self.written
            .lock()
            .expect("not poisoned")
            .extend(first..last);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "write-log".into()
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for r in requests.iter_mut() {
            self.inner.read_at(r.offset, r.buf)?;
        }
        Ok(())
    }
}

fn random(size: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = vec![0u8; size];
    rng.fill(&mut data);
    data
}

fn config(buffer_pages: usize, skip_unchanged: bool) -> PagerConfig {
    PagerConfig::builder()
        .page_bytes(PAGE as u64)
        .buffer_bytes((buffer_pages * PAGE) as u64)
        .fillers(1)
        .evictors(1)
        .read_ahead(4)
        .skip_unchanged(skip_unchanged)
        .build()
        .expect("test configuration is valid")
}

fn region(
    data: &[u8],
    buffer_pages: usize,
    tracking: WriteTracking,
    skip_unchanged: bool,
) -> (Arc<WriteLog>, Region) {
    let store = Arc::new(WriteLog::new(data));
    let region = Region::builder(store.clone(), data.len() as u64)
        .config(config(buffer_pages, skip_unchanged))
        .write_tracking(tracking)
        .build()
        .expect("region maps");
    (store, region)
}

/// What the program does to one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Touch {
    Read,
    /// A byte changed for good.
    Change,
    /// A byte changed and put back (as `sort` does to print a line).
    Restore,
}

/// Touches every page once, in a random order, as `plan` says; returns the expected bytes.
fn touch_all(region: &mut Region, data: &[u8], plan: &[Touch], rng: &mut Rng) -> Vec<u8> {
    let mut want = data.to_vec();
    let mut order: Vec<usize> = (0..plan.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut sum = 0u64;
    for p in order {
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        let s = region.as_mut_slice();
        match plan[p] {
            Touch::Read => sum = sum.wrapping_add(u64::from(s[i])),
            Touch::Change => {
                s[i] ^= 0xa5;
                want[i] ^= 0xa5;
            }
            Touch::Restore => {
                let at = std::ptr::from_mut(&mut s[i]);
                // SAFETY: `at` points into the slice borrowed just above; volatile so that
                // neither store is optimised away.
                unsafe {
                    let old = std::ptr::read_volatile(at);
                    std::ptr::write_volatile(at, !old);
                    std::ptr::write_volatile(at, old);
                }
            }
        }
    }
    std::hint::black_box(sum);
    want
}

fn random_plan(pages: usize, rng: &mut Rng) -> Vec<Touch> {
    (0..pages)
        .map(|_| match rng.below(3) {
            0 => Touch::Read,
            1 => Touch::Change,
            _ => Touch::Restore,
        })
        .collect()
}

fn changed(plan: &[Touch]) -> Vec<usize> {
    (0..plan.len())
        .filter(|&p| plan[p] == Touch::Change)
        .collect()
}

#[test]
fn evictions_write_back_exactly_the_pages_that_changed_and_no_write_traps() {
    if !uffd_available("digest_evictions") {
        return;
    }
    let mut rng = Rng::from_time("digest_evictions");
    let pages = 96;
    let data = random(pages * PAGE, &mut rng);
    let plan = random_plan(pages, &mut rng);
    for tracking in [WriteTracking::Digest, WriteTracking::Trap] {
        // A buffer of 12 pages: most pages are evicted while the others are touched.
        let (store, mut region) = region(&data, 12, tracking, true);
        let want = touch_all(&mut region, &data, &plan, &mut rng);
        region.evict_all().expect("evicts");
        let traps = region.counters().write_faults;
        let written = store.take_written();
        eprintln!(
            "{tracking:?}: {traps} write faults, {} pages written, {} changed",
            written.len(),
            changed(&plan).len()
        );
        assert!(
            store.contents() == want,
            "{tracking:?}: the store lost a change"
        );
        assert_eq!(written, changed(&plan), "{tracking:?}: pages written");
        if tracking == WriteTracking::Digest {
            assert_eq!(traps, 0, "no write trapped");
        } else {
            assert!(traps > 0, "writes trap by default");
        }
        // And the program still sees its bytes, read back from the store.
        assert!(region.as_slice() == &want[..], "{tracking:?}: read back");
    }
}

#[test]
fn a_flush_writes_only_changed_pages_and_a_write_after_it_is_flushed_too() {
    if !uffd_available("digest_flush") {
        return;
    }
    let mut rng = Rng::from_time("digest_flush");
    let pages = 40;
    // The plan touches the first quarter of a region with a frame for every page, so nothing
    // is evicted (the evictors keep a share of the frames free): the flushes alone write.
    let data = random(4 * pages * PAGE, &mut rng);
    let plan = random_plan(pages, &mut rng);
    let (store, mut region) = region(&data, 4 * pages, WriteTracking::Digest, true);
    let mut want = touch_all(&mut region, &data, &plan, &mut rng);
    region.flush().expect("flushes");
    assert_eq!(store.take_written(), changed(&plan), "the first flush");
    assert!(store.contents() == want);
    region.flush().expect("flushes");
    assert_eq!(store.take_written(), Vec::<usize>::new(), "nothing new");

    // Flushed pages are clean and protected again: their next write traps and is flushed.
    let p = rng.below(pages as u64) as usize;
    let i = p * PAGE + rng.below(PAGE as u64) as usize;
    region.as_mut_slice()[i] ^= 0x3c;
    want[i] ^= 0x3c;
    assert_eq!(
        region.counters().write_faults,
        1,
        "the write after the flush"
    );
    region.flush().expect("flushes");
    assert_eq!(store.take_written(), vec![p]);
    assert!(store.contents() == want);

    // Bytes put back to what the store now holds are not written, also on a page the flush
    // wrote; bytes put back to what the store held before the flush are (the digest follows
    // the store, not the first fill).
    let q = (p + 1 + rng.below(pages as u64 - 1) as usize) % pages;
    let j = q * PAGE + 11;
    let at = std::ptr::from_mut(&mut region.as_mut_slice()[j]);
    // SAFETY: inside the region, borrowed just above; volatile so both stores happen.
    unsafe {
        let old = std::ptr::read_volatile(at);
        std::ptr::write_volatile(at, !old);
        std::ptr::write_volatile(at, old);
    }
    region.as_mut_slice()[i] ^= 0x3c;
    want[i] ^= 0x3c;
    region.evict_all().expect("evicts");
    assert_eq!(
        store.take_written(),
        vec![p],
        "only the page put back before the flush"
    );
    assert!(store.contents() == want);
    assert_eq!(
        region.counters().refaults,
        0,
        "nothing was evicted before evict_all"
    );
}

#[test]
fn without_digests_the_region_traps_writes_and_loses_nothing() {
    if !uffd_available("digest_off") {
        return;
    }
    let mut rng = Rng::from_time("digest_off");
    let pages = 64;
    let data = random(pages * PAGE, &mut rng);
    let plan = random_plan(pages, &mut rng);
    let (store, mut region) = region(&data, 10, WriteTracking::Digest, false);
    let want = touch_all(&mut region, &data, &plan, &mut rng);
    region.evict_all().expect("evicts");
    assert!(
        region.counters().write_faults > 0,
        "digests off: writes trap"
    );
    assert!(store.contents() == want, "a change was lost");
    // Without digests nothing tells a page put back, or a page made writable ahead of a
    // stream of writes and then only read, from a changed one: those may be written too.
    let written = store.take_written();
    for p in changed(&plan) {
        assert!(written.binary_search(&p).is_ok(), "page {p} not written");
    }
}

/// Four threads keep adding to counters on their own pages of a region 8 times its buffer,
/// so evictions (which write-protect and hash a page before dropping it) race with writes to
/// the very pages they evict. Every addition must survive.
#[test]
fn writers_racing_evictions_lose_no_update() {
    if !uffd_available("digest_race") {
        return;
    }
    let mut rng = Rng::from_time("digest_race");
    let pages = 128;
    let data = vec![0u8; pages * PAGE];
    let (store, region) = region(&data, 16, WriteTracking::Digest, true);
    let threads = 4;
    let rounds = 3000;
    let seeds: Vec<u64> = (0..threads).map(|_| rng.next()).collect();
    let base = region.as_ptr() as usize;
    let expected: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds
            .iter()
            .enumerate()
            .map(|(t, &seed)| {
                scope.spawn(move || {
                    let mut rng = Rng(seed);
                    // Thread t owns the pages p with p % threads == t; one u64 counter each
                    // at a random slot, plus reads of the others' pages (read, never written).
                    let own: Vec<usize> = (0..pages).filter(|p| p % threads == t).collect();
                    let mut counts = vec![0u64; pages];
                    for _ in 0..rounds {
                        let p = own[rng.below(own.len() as u64) as usize];
                        let slot = (rng.below((PAGE / 8) as u64) as usize) * 8;
                        let addr = base + p * PAGE + slot;
                        // SAFETY: inside the region (p < pages, slot + 8 <= PAGE), aligned
                        // to 8, and only thread t ever writes page p.
                        unsafe {
                            let v = std::ptr::read_volatile(addr as *const u64);
                            std::ptr::write_volatile(addr as *mut u64, v + 1);
                        }
                        counts[p] += 1;
                        let other = rng.below(pages as u64) as usize * PAGE;
                        // SAFETY: inside the region; a read of another thread's page.
                        std::hint::black_box(unsafe {
                            std::ptr::read_volatile((base + other) as *const u8)
                        });
                    }
                    counts
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    let totals: Vec<u64> = (0..pages)
        .map(|p| expected.iter().map(|c| c[p]).sum())
        .collect();
    let sum_page = |bytes: &[u8]| -> u64 {
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .sum()
    };
    for (p, (page, &total)) in region.as_slice().chunks(PAGE).zip(&totals).enumerate() {
        assert_eq!(sum_page(page), total, "page {p} in memory");
    }
    region.evict_all().expect("evicts");
    assert_eq!(region.counters().write_faults, 0);
    let stored = store.contents();
    for (p, (page, &total)) in stored.chunks(PAGE).zip(&totals).enumerate() {
        assert_eq!(sum_page(page), total, "page {p} in the store");
    }
    assert!(
        region.stats().evictions > pages as u64,
        "evictions raced the writers"
    );
}

/// The smallest buffer (4 frames) over a store whose writes fail for a while: by digest, a
/// changed page whose write-back fails stays in memory with its bytes, faults keep being
/// served from the frames left, and once the store takes writes again every change reaches
/// it; pages only read are never written.
///
/// Repeated on fresh regions: the pages read over and over come back soon after each
/// eviction, so the clock gives them extra passes and offers the two unwritable pages again
/// and again first. A fault used to give up (`SIGBUS`) after eight failed write-backs
/// although two frames held pages it could drop: about one round in ten.
#[test]
fn four_frames_and_a_store_that_refuses_writes_lose_nothing_by_digest() {
    if !uffd_available("digest_flaky") {
        return;
    }
    let mut rng = Rng::from_time("digest_flaky");
    for _ in 0..40 {
        four_frames_with_refused_writes(&mut rng);
    }
}

fn four_frames_with_refused_writes(rng: &mut Rng) {
    let pages = 24;
    let store = Arc::new(common::FlakyStore::new((pages * PAGE) as u64));
    let mut want = random(pages * PAGE, rng);
    store.inner.write_at(0, &want).expect("memory store");
    let mut region = Region::builder(store.clone(), want.len() as u64)
        .config(config(4, true))
        .write_tracking(WriteTracking::Digest)
        .build()
        .expect("region maps");
    // Writes to a few pages, then reads everywhere while the store refuses writes: the
    // changed pages cannot leave, the read ones can (no write needed).
    let changed: Vec<usize> = (0..2).map(|_| rng.below(pages as u64) as usize).collect();
    for &p in &changed {
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        region.as_mut_slice()[i] ^= 0x77;
        want[i] ^= 0x77;
    }
    store.fail_writes.store(true, Ordering::SeqCst);
    for _ in 0..30 {
        for p in 0..pages {
            let i = p * PAGE + rng.below(PAGE as u64) as usize;
            assert_eq!(region.as_slice()[i], want[i], "page {p} while writes fail");
        }
    }
    assert!(
        region.evict_all().is_err(),
        "the changed pages could not be written"
    );
    store.fail_writes.store(false, Ordering::SeqCst);
    region
        .evict_all()
        .expect("evicts once the store takes writes");
    assert!(
        common::read_all(store.as_ref()) == want,
        "a change was lost or a page damaged"
    );
    assert_eq!(region.counters().write_faults, 0);
    assert!(region.as_slice() == &want[..], "read back");
}
