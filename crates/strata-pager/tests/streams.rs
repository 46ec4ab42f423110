//! Sequential streams and batched write-back: read-ahead follows sequential faults and not
//! random ones, a write stream over read-ahead pages traps once per window, discarded runs
//! fill with zeros together, and eviction writes dirty neighbours as one run while a store
//! that refuses some writes keeps exactly those pages (nothing lost). Plus write prediction:
//! pages written last time come back writable, saving their write-protect faults.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Rng, uffd_available};
use strata_core::config::PagerConfigBuilder;
use strata_core::store::ReadRequest;
use strata_core::{MemoryStore, PagerConfig, Store, StoreError};
use strata_pager::{Region, RegionError};

const PAGE: usize = 16 << 10;

/// A memory store that counts its calls and refuses writes that touch one byte range.
#[derive(Debug)]
struct CountingStore {
    inner: MemoryStore,
    reads: AtomicU64,
    /// Every read: (offset, length).
    read_ranges: std::sync::Mutex<Vec<(u64, u64)>>,
    writes: AtomicU64,
    /// Writes overlapping `[bad_start, bad_end)` fail (empty range: none do).
    bad_start: AtomicU64,
    bad_end: AtomicU64,
}

impl CountingStore {
    fn new(data: &[u8]) -> Self {
        Self {
            inner: MemoryStore::from_bytes(data),
            reads: AtomicU64::new(0),
            read_ranges: std::sync::Mutex::new(Vec::new()),
            writes: AtomicU64::new(0),
            bad_start: AtomicU64::new(0),
            bad_end: AtomicU64::new(0),
        }
    }
}

impl Store for CountingStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.read_ranges
            .lock()
            .expect("not poisoned")
            .push((offset, buf.len() as u64));
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let (start, end) = (
            self.bad_start.load(Ordering::SeqCst),
            self.bad_end.load(Ordering::SeqCst),
        );
        if offset < end && offset + buf.len() as u64 > start {
            return Err(StoreError::Unavailable {
                store: self.describe(),
                reason: format!("injected failure writing {} bytes at {offset}", buf.len()),
            });
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "counting-memory".into()
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for r in requests.iter_mut() {
            self.read_at(r.offset, r.buf)?;
        }
        Ok(())
    }
}

fn random(size: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = vec![0u8; size];
    rng.fill(&mut data);
    data
}

/// A region over a fresh counting store holding `data`.
fn region_over(data: &[u8], config: PagerConfig) -> (Arc<CountingStore>, Region) {
    let store = Arc::new(CountingStore::new(data));
    let region = Region::new(store.clone(), data.len() as u64, config).expect("region maps");
    (store, region)
}

fn config_builder(buffer_pages: u64, read_ahead: u64) -> PagerConfigBuilder {
    PagerConfig::builder()
        .page_bytes(PAGE as u64)
        .buffer_bytes(buffer_pages * PAGE as u64)
        .fillers(1)
        .evictors(1)
        .read_ahead(read_ahead)
}

fn config(buffer_pages: u64, read_ahead: u64) -> PagerConfig {
    config_builder(buffer_pages, read_ahead)
        .build()
        .expect("test configuration is valid")
}

#[test]
fn sequential_faults_read_ahead_and_random_ones_do_not() {
    if !uffd_available("streams_read_ahead") {
        return;
    }
    let mut rng = Rng::from_time("streams_read_ahead");
    let pages = 512;
    let data = random(pages * PAGE, &mut rng);
    // Sequential: most pages arrive by read-ahead, far fewer faults than pages. Read-ahead
    // takes free frames only and its windows go to threads of their own: on a busy machine
    // (CI: 2 cores, many tests at once) the evictors and read-ahead threads can be starved
    // for a whole scan, which then faults on about half its pages with read-ahead intact
    // (270 faults, 242 read ahead, 1 run in 12 under load). So the best of up to three
    // scans, each over a fresh region, is judged: without read-ahead every scan faults on
    // every page.
    let mut scans = Vec::new();
    for _ in 0..3 {
        let (_store, region) = region_over(&data, config(128, 8));
        let mut sum = 0u64;
        for p in 0..pages {
            let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
            assert_eq!(
                page,
                &data[p * PAGE..(p + 1) * PAGE],
                "page {p} (sequential)"
            );
            sum += u64::from(page[0]);
        }
        let (faults, ahead) = (region.stats().faults, region.counters().read_ahead_pages);
        eprintln!("sequential: {faults} faults, {ahead} read ahead (checksum {sum})");
        scans.push((faults, ahead));
        if faults * 3 < pages as u64 && ahead as usize >= pages / 2 {
            break;
        }
    }
    let (faults, ahead) = scans.iter().min().copied().expect("three scans");
    assert!(
        faults * 3 < pages as u64,
        "a sequential scan faulted at best {faults} times for {pages} pages: {scans:?}"
    );
    assert!(
        ahead as usize >= pages / 2,
        "the best scan read {ahead} pages ahead: {scans:?}"
    );

    // Random: with a quarter of the pages resident, most faults have a resident neighbour,
    // which no longer counts as a stream. A few continue a recent fill by chance and read a
    // window (up to the next resident page): 343-662 pages ahead over about 2400 faults
    // before session 11, 423-775 over 2500 since the windows' scratch buffers hold frames
    // (fewer pages resident, so chance windows run longer). A stream would read 8 per fault.
    let (_store, region) = region_over(&data, config(128, 8));
    for _ in 0..3000 {
        let p = rng.below(pages as u64) as usize;
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        assert_eq!(region.as_slice()[i], data[i], "byte {i} (random)");
    }
    let (stats, counters) = (region.stats(), region.counters());
    eprintln!(
        "random: {} faults, {} read ahead",
        stats.faults, counters.read_ahead_pages
    );
    assert!(stats.faults > 1000, "random reads must fault");
    assert!(
        counters.read_ahead_pages * 2 < stats.faults,
        "random faults read {} pages ahead over {} faults",
        counters.read_ahead_pages,
        stats.faults
    );
}

#[test]
fn streams_read_ahead_when_the_evictors_keep_almost_no_frame_free() {
    if !uffd_available("streams_tight_water") {
        return;
    }
    let mut rng = Rng::from_time("streams_tight_water");
    let pages = 512;
    let data = random(pages * PAGE, &mut rng);
    // `strata run`'s water marks: evict only when the free frames run out, down to 99 %.
    // Read-ahead threads then find no free frame above the reserve and evict their windows'
    // frames themselves. Before, a window took free frames only, and a scan under these
    // marks faulted on nearly every page (the evictors left 1-2 frames free).
    let tight = config_builder(128, 8)
        .water_marks(99, 100)
        .build()
        .expect("test configuration is valid");
    // A write sweep (dirty pages: evictions write them back), then two read sweeps checked
    // byte for byte; as above, the best of up to three regions is judged on a busy machine.
    let mut scans = Vec::new();
    for _ in 0..3 {
        let (store, mut region) = region_over(&data, tight.clone());
        for p in 0..pages {
            region.as_mut_slice()[p * PAGE + p % PAGE] ^= 0xa5;
        }
        let faults_before = region.stats().faults;
        for sweep in 0..2 {
            for p in 0..pages {
                let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
                let mut want = data[p * PAGE..(p + 1) * PAGE].to_vec();
                want[p % PAGE] ^= 0xa5;
                assert_eq!(page, &want[..], "page {p} (sweep {sweep})");
            }
        }
        let faults = region.stats().faults - faults_before;
        let ahead = region.counters().read_ahead_pages;
        eprintln!(
            "tight water marks: {faults} faults for {} pages read, {ahead} read ahead, {} writes",
            2 * pages,
            store.writes.load(Ordering::SeqCst)
        );
        scans.push((faults, ahead));
        if faults * 3 < 2 * pages as u64 {
            break;
        }
    }
    let (faults, ahead) = scans.iter().min().copied().expect("three scans");
    assert!(
        faults * 3 < 2 * pages as u64,
        "two read sweeps faulted at best {faults} times for {} pages: {scans:?}",
        2 * pages
    );
    assert!(
        ahead as usize >= pages,
        "the best region read {ahead} pages ahead: {scans:?}"
    );
}

#[test]
fn descending_streams_read_ahead_even_between_random_faults() {
    if !uffd_available("streams_descending") {
        return;
    }
    let mut rng = Rng::from_time("streams_descending");
    let pages = 512;
    let data = random(pages * PAGE, &mut rng);
    // A sweep from the top down (GNU sort merges its line table this way): before, every
    // page faulted on its own. The best of up to three regions is judged: on a busy machine
    // the read-ahead thread may be descheduled while the scan runs past its windows.
    let mut scans = Vec::new();
    for _ in 0..3 {
        let (_store, region) = region_over(&data, config(128, 8));
        for p in (0..pages).rev() {
            let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
            assert_eq!(
                page,
                &data[p * PAGE..(p + 1) * PAGE],
                "page {p} (descending)"
            );
        }
        let (stats, counters) = (region.stats(), region.counters());
        eprintln!(
            "descending: {} faults, {} read ahead",
            stats.faults, counters.read_ahead_pages
        );
        scans.push(stats.faults);
        if stats.faults * 3 < pages as u64 {
            break;
        }
    }
    let faults = scans.iter().min().copied().expect("three scans");
    assert!(
        faults * 3 < pages as u64,
        "a descending scan faulted at best {faults} times for {pages} pages: {scans:?}"
    );

    // Two descending runs merged into an ascending output, with a random read of the upper
    // half between every two steps (a merge comparing the lines its entries point to): the
    // random faults, each a run of its own, must not push the streams out of the detector.
    // Before, only the first pages of each stream came from read-ahead.
    let (_store, region) = region_over(&data, config(128, 8));
    let s = region.as_slice();
    let (mut a, mut b) = (pages / 4, pages / 2);
    let mut out = 0;
    while a > 0 || b > pages / 4 {
        let from_a = b == pages / 4 || (a > 0 && rng.below(2) == 0);
        let src = if from_a {
            a -= 1;
            a
        } else {
            b -= 1;
            b
        };
        for p in [src, out] {
            let i = p * PAGE + rng.below(PAGE as u64) as usize;
            assert_eq!(s[i], data[i], "byte {i} (stream)");
        }
        out = (out + 1).min(pages / 2 - 1);
        let r = pages / 2 + rng.below(pages as u64 / 2) as usize;
        let i = r * PAGE + rng.below(PAGE as u64) as usize;
        assert_eq!(s[i], data[i], "byte {i} (random)");
    }
    let counters = region.counters();
    eprintln!(
        "merge with random reads: {} faults, {} read ahead",
        region.stats().faults,
        counters.read_ahead_pages
    );
    assert!(
        counters.read_ahead_pages >= pages as u64 / 4,
        "the streams read only {} pages ahead of {} stream pages",
        counters.read_ahead_pages,
        pages / 2
    );
}

#[test]
fn a_write_stream_over_read_ahead_pages_traps_once_per_window() {
    if !uffd_available("streams_write") {
        return;
    }
    let mut rng = Rng::from_time("streams_write");
    // Large enough that a random write rarely lands where a recent run ended (1 in 256).
    let pages = 2048;
    let data = random(pages * PAGE, &mut rng);
    // Everything fits: reading installs every page clean (write-protected).
    let (store, region) = region_over(&data, config(4096, 8));
    let mut expect = data.clone();
    assert!(region.as_slice() == &data[..], "first read");
    // Every trap of a write: a write fault on a clean page, or a fault on an evicted one
    // (the evictors keep the buffer below its high water mark).
    let traps = || region.counters().write_faults + region.stats().faults;
    let start = traps();
    let base = region.as_ptr();
    for p in 0..pages {
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        let v = rng.next() as u8;
        // SAFETY: `i` lies inside the region, which outlives this loop; no other reference
        // to these bytes is live.
        unsafe { base.add(i).write_volatile(v) };
        expect[i] = v;
    }
    let sequential_traps = traps() - start;
    // Random writes to other pages are not a stream: one trap per page written.
    region.flush().expect("flush");
    let start = traps();
    let mut written = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let p = rng.below(pages as u64) as usize;
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        let v = rng.next() as u8;
        // SAFETY: as above.
        unsafe { base.add(i).write_volatile(v) };
        expect[i] = v;
        written.insert(p);
    }
    let random_traps = traps() - start;
    eprintln!(
        "{sequential_traps} traps for {pages} pages written in order; {random_traps} for {} pages at random",
        written.len()
    );
    assert!(
        sequential_traps * 4 < pages as u64,
        "a sequential write stream trapped {sequential_traps} times over {pages} pages"
    );
    assert!(
        random_traps * 10 >= written.len() as u64 * 9,
        "random writes trapped only {random_traps} times over {} pages",
        written.len()
    );
    region.flush().expect("flush");
    let mut stored = vec![0u8; data.len()];
    store.read_at(0, &mut stored).expect("read the store");
    assert!(stored == expect, "the store holds every write after flush");
}

#[test]
fn discarded_runs_fill_with_zeros_together_and_stored_neighbours_keep_data() {
    if !uffd_available("streams_zero_runs") {
        return;
    }
    let mut rng = Rng::from_time("streams_zero_runs");
    let pages = 256;
    let data = random(pages * PAGE, &mut rng);
    let (store, region) = region_over(&data, config(512, 8));
    // A discarded range starting and ending at random pages, stored pages on both sides.
    let first = 1 + rng.below(60) as usize;
    let last = first + 64 + rng.below(100) as usize;
    region
        .discard((first * PAGE) as u64, ((last - first) * PAGE) as u64)
        .expect("discard");
    let mut expect = data.clone();
    expect[first * PAGE..last * PAGE].fill(0);
    let faults_before = region.stats().faults;
    assert!(
        region.as_slice()[first * PAGE..last * PAGE]
            .iter()
            .all(|&b| b == 0),
        "discarded pages read zeros"
    );
    let faults = region.stats().faults - faults_before;
    // Read-ahead may run past the range into stored pages; no read may cover a zero page.
    let (lo, hi) = ((first * PAGE) as u64, (last * PAGE) as u64);
    let reads = store.read_ranges.lock().expect("not poisoned").clone();
    assert!(
        reads.iter().all(|&(o, n)| o + n <= lo || o >= hi),
        "a store read covered discarded pages [{lo}, {hi}): {reads:?}"
    );
    assert!(
        faults * 3 < (last - first) as u64,
        "{faults} faults for {} discarded pages read in order",
        last - first
    );
    // A stream running into stored pages reads them, not zeros; and one running from stored
    // pages into the discarded range reads zeros there.
    assert_eq!(region.as_slice(), &expect[..], "whole region");
    region.evict_all().expect("evict");
    let lead = (first - 1) * PAGE;
    assert_eq!(
        &region.as_slice()[lead..],
        &expect[lead..],
        "a stream from a stored page across the discarded range"
    );
}

#[test]
fn eviction_writes_dirty_neighbours_as_one_run_and_a_refused_page_stays_dirty() {
    if !uffd_available("streams_write_back") {
        return;
    }
    let mut rng = Rng::from_time("streams_write_back");
    let pages = 512;
    let data = random(pages * PAGE, &mut rng);
    // Evictors that start early and free half the buffer at a time, so that eviction (in
    // batches) rather than faults evicting one page each (direct reclaim) makes the room.
    let evicting = PagerConfig::builder()
        .page_bytes(PAGE as u64)
        .buffer_bytes(128 * PAGE as u64)
        .fillers(1)
        .evictors(1)
        .water_marks(40, 70)
        .build()
        .expect("test configuration is valid");
    let (store, region) = region_over(&data, evicting);
    // One page whose write-backs the store refuses for now.
    let bad = 100 + rng.below(300) as usize;
    store.bad_start.store((bad * PAGE) as u64, Ordering::SeqCst);
    store
        .bad_end
        .store(((bad + 1) * PAGE) as u64, Ordering::SeqCst);
    let mut expect = data.clone();
    rng.fill(&mut expect);
    let base = region.as_ptr();
    for p in 0..pages {
        // SAFETY: the page lies inside the region, which outlives this loop; no reference to
        // these bytes is live.
        unsafe {
            std::ptr::copy_nonoverlapping(expect[p * PAGE..].as_ptr(), base.add(p * PAGE), PAGE);
        }
    }
    let stats = region.stats();
    let writes = store.writes.load(Ordering::SeqCst);
    eprintln!(
        "{} write-backs in {writes} store writes; page {bad} refused",
        stats.writebacks
    );
    assert!(stats.writebacks > 300, "the sweep evicted dirty pages");
    // Page by page, writes would equal write-backs. Direct reclaim (a fault evicting one page
    // itself, which a busy machine forces when the evictor gets no CPU) and the per-page
    // retries of the batch holding the refused page (at most 64 pages and the failed batch)
    // write single pages: count those out, then the evictor's batches must have written at
    // least two pages per store write on average.
    let direct = region.counters().direct_reclaims;
    let batched_pages = stats.writebacks.saturating_sub(direct);
    let batched_writes = writes.saturating_sub(direct + 65);
    eprintln!("{direct} direct reclaims; {batched_pages} pages in {batched_writes} batch writes");
    if batched_pages >= 200 {
        assert!(
            batched_writes * 2 < batched_pages,
            "dirty neighbours were written page by page ({writes} writes for {} pages, {direct} direct reclaims)",
            stats.writebacks
        );
    } else {
        eprintln!("the evictor was starved (direct reclaim did the eviction): batching not judged");
    }
    // The refused page is still resident and dirty: flush reports it, and nothing is lost.
    match region.flush() {
        Err(RegionError::WriteBack { page, .. }) => assert_eq!(page, bad),
        other => panic!("flush with page {bad} refused gave {other:?}"),
    }
    assert_eq!(
        region.as_slice(),
        &expect[..],
        "contents while the page is refused"
    );
    store.bad_end.store(0, Ordering::SeqCst);
    // Failures the evictor recorded before the store healed are reported by the next
    // flushes (at most a few); then flush succeeds.
    let mut stale = 0;
    loop {
        match region.flush() {
            Ok(()) => break,
            Err(RegionError::WriteBack { page, .. }) if page == bad && stale < 3 => stale += 1,
            Err(e) => panic!("flush once the store accepts page {bad}: {e}"),
        }
    }
    region.evict_all().expect("evict");
    let mut stored = vec![0u8; data.len()];
    store.read_at(0, &mut stored).expect("read the store");
    assert!(stored == expect, "the store holds every page");
    assert_eq!(region.as_slice(), &expect[..], "contents read back");
}

/// Reads, then writes one byte of, every page in a random order, `rounds` times, under a
/// buffer an eighth of the region. Returns the write-protect faults of every round but the
/// first (which has no history to predict from).
fn read_then_write_rounds(region: &Region, expect: &mut [u8], rounds: usize, rng: &mut Rng) -> u64 {
    let pages = expect.len() / PAGE;
    let base = region.as_ptr();
    let mut before = 0;
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..pages).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        if round == 1 {
            before = region.counters().write_faults;
        }
        for p in order {
            let i = p * PAGE + rng.below(PAGE as u64) as usize;
            // SAFETY: `i` lies inside the region, which outlives this loop; no reference to
            // these bytes is live.
            let old = unsafe { base.add(i).read_volatile() };
            assert_eq!(old, expect[i], "byte {i} before its write");
            let v = old.wrapping_add(1 + rng.below(200) as u8);
            // SAFETY: as above.
            unsafe { base.add(i).write_volatile(v) };
            expect[i] = v;
        }
    }
    region.counters().write_faults - before
}

#[test]
fn pages_written_last_time_come_back_writable_and_nothing_is_lost() {
    if !uffd_available("streams_predict_writes") {
        return;
    }
    let mut rng = Rng::from_time("streams_predict_writes");
    let pages = 256;
    let data = random(pages * PAGE, &mut rng);
    let mut traps = Vec::new();
    for predict in [false, true] {
        let store = Arc::new(CountingStore::new(&data));
        let region = Region::builder(store.clone(), data.len() as u64)
            .config(config(32, 0))
            .predict_writes(predict)
            .build()
            .expect("region maps");
        let mut expect = data.clone();
        let last = read_then_write_rounds(&region, &mut expect, 3, &mut rng);
        eprintln!(
            "predict {predict}: {last} write-protect faults in two rounds over {pages} pages read then written"
        );
        traps.push(last);
        // A last round that only reads: guessed pages are written back unchanged, never lost.
        for p in 0..pages {
            assert_eq!(
                &region.as_slice()[p * PAGE..(p + 1) * PAGE],
                &expect[p * PAGE..(p + 1) * PAGE],
                "page {p} (predict {predict})"
            );
        }
        region.flush().expect("flush");
        let mut stored = vec![0u8; data.len()];
        store.read_at(0, &mut stored).expect("read the store");
        assert!(
            stored == expect,
            "the store holds every write (predict {predict})"
        );
        region.evict_all().expect("evict");
        assert!(
            region.as_slice() == &expect[..],
            "read back (predict {predict})"
        );
    }
    // Without prediction every page traps on its write (few stay resident across a round);
    // with it, pages written in the round before come back writable every other round.
    assert!(
        traps[0] as usize >= pages * 3 / 4,
        "without prediction: {traps:?}"
    );
    assert!(
        traps[1] * 4 < traps[0] * 3,
        "prediction saved too few write-protect faults: {traps:?}"
    );
}

#[test]
fn pages_written_back_to_their_stored_bytes_are_evicted_without_a_write() {
    if !uffd_available("streams_unchanged") {
        return;
    }
    let mut rng = Rng::from_time("streams_unchanged");
    let pages = 64;
    // Twice the pages used, and a buffer as large: nothing is evicted before `evict_all`.
    let data = random(2 * pages * PAGE, &mut rng);
    let build = |skip: bool| {
        let store = Arc::new(CountingStore::new(&data));
        let config = config_builder(2 * pages as u64, 0)
            .skip_unchanged(skip)
            .build()
            .expect("test configuration is valid");
        let region = Region::new(store.clone(), data.len() as u64, config).expect("region maps");
        (store, region)
    };
    // Each page read from the store, then: a byte changed and put back (as `sort` does to
    // print a line), a byte changed for good, or two bytes swapped and swapped back.
    let restored = |p: usize| p % 3 != 1;
    let expected = |p: usize| {
        let mut want = data[p * PAGE..(p + 1) * PAGE].to_vec();
        if !restored(p) {
            want[p] ^= 0x5a;
        }
        want
    };
    for skip in [true, false] {
        let (store, mut region) = build(skip);
        for p in 0..pages {
            let s = region.as_mut_slice();
            let i = p * PAGE + rng.below(PAGE as u64 - 1) as usize;
            if restored(p) {
                let old = s[i];
                s[i] = !old;
                s.swap(i, i + 1);
                s.swap(i, i + 1);
                s[i] = old;
            } else {
                s[p * PAGE + p] ^= 0x5a;
            }
        }
        let c = region.counters();
        assert_eq!(c.dirty_pages, pages as u64, "all written: {c:?}");
        let writes_before = store.writes.load(Ordering::SeqCst);
        region.evict_all().expect("evicts");
        let written = store.writes.load(Ordering::SeqCst) - writes_before;
        let skipped = region.counters().unchanged_write_backs;
        let changed = (0..pages).filter(|&p| !restored(p)).count() as u64;
        eprintln!("skip {skip}: {written} store writes, {skipped} unchanged pages not written");
        if skip {
            assert_eq!(
                skipped,
                pages as u64 - changed,
                "every restored page skipped"
            );
            // Changed pages may go in runs: at most one write each, at least one in all.
            assert!(written >= 1 && written <= changed, "{written} writes");
        } else {
            assert_eq!(skipped, 0);
        }
        for p in 0..pages {
            let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
            assert_eq!(
                page,
                &expected(p)[..],
                "page {p} after eviction (skip {skip})"
            );
        }
    }

    // A flush makes the store hold the page's new bytes: putting the old bytes back is then a
    // change, and must be written (were the digest of the first fill kept, it would match them
    // and the store would keep the flushed bytes).
    let (store, mut region) = build(true);
    let original = region.as_slice()[..PAGE].to_vec();
    region.as_mut_slice()[7] ^= 0xff;
    region.flush().expect("flushes");
    let mut stored = vec![0u8; PAGE];
    store.read_at(0, &mut stored).expect("reads");
    assert_eq!(stored[7], original[7] ^ 0xff, "the flush stored the change");
    region.as_mut_slice()[7] ^= 0xff;
    region.evict_all().expect("evicts");
    store.read_at(0, &mut stored).expect("reads");
    assert!(
        stored == original,
        "the old bytes, put back after the flush, did not reach the store"
    );
    assert!(
        region.as_slice()[..PAGE] == original[..],
        "page 0 read back"
    );
    assert_eq!(region.counters().unchanged_write_backs, 0);
}

/// The windows the pager threads read into are charged like the region's pages, so while
/// they are resident they hold frames out of use (resident pages and held frames never
/// exceed the buffer), and once the threads go back to single pages or sleep, the memory
/// and the frames come back (one page per filler stays). Data stays exact throughout.
#[test]
fn scratch_windows_hold_frames_while_resident_and_give_them_back() {
    if !uffd_available("scratch_frames") {
        return;
    }
    let mut rng = Rng::from_time("scratch_frames");
    let pages = 512;
    let frames = 128u64;
    let data = random(pages * PAGE, &mut rng);
    let cfg = config_builder(frames, 8)
        .water_marks(99, 100)
        .build()
        .expect("test configuration is valid");
    let (_store, mut region) = region_over(&data, cfg);
    let within_budget = |region: &Region, when: &str| {
        let c = region.counters();
        assert!(
            c.resident_pages + c.scratch_frames <= frames,
            "{when}: {} resident and {} held for scratch in {frames} frames",
            c.resident_pages,
            c.scratch_frames
        );
        c
    };
    let mut want = data.clone();
    // Sequential write then read sweeps: windows are read, and their buffers hold frames.
    for p in 0..pages {
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        region.as_mut_slice()[i] ^= 0x3c;
        want[i] ^= 0x3c;
        if p % 64 == 63 {
            within_budget(&region, "write sweep");
        }
    }
    let mut held_in_stream = 0;
    for p in 0..pages {
        assert_eq!(
            &region.as_slice()[p * PAGE..(p + 1) * PAGE],
            &want[p * PAGE..(p + 1) * PAGE],
            "page {p}, read sweep"
        );
        if p % 32 == 31 {
            held_in_stream =
                held_in_stream.max(within_budget(&region, "read sweep").scratch_frames);
        }
    }
    assert!(
        held_in_stream >= 8,
        "a read-ahead window of 8 pages held {held_in_stream} frames"
    );
    assert!(
        held_in_stream <= frames / 8,
        "{held_in_stream} held: more than an eighth"
    );
    // Random single pages (never next to the last one): the filler's window goes back after
    // 64 of them, the read-ahead thread's once it has been idle for a while.
    let mut last = 0usize;
    for k in 0..400 {
        let mut p = rng.below(pages as u64) as usize;
        if p.abs_diff(last) <= 1 {
            p = (p + pages / 2) % pages;
        }
        last = p;
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        assert_eq!(region.as_slice()[i], want[i], "page {p}, random read {k}");
        if k % 50 == 49 {
            within_budget(&region, "random reads");
        }
    }
    let t = std::time::Instant::now();
    let mut c = within_budget(&region, "idle");
    while c.scratch_frames > 1 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        c = within_budget(&region, "idle");
    }
    assert!(
        c.scratch_frames <= 1,
        "{} frames still held after random faults and {:?} idle",
        c.scratch_frames,
        t.elapsed()
    );
    assert_eq!(region.as_slice(), &want[..]);
    region.flush().expect("flush");
}

/// Resident pages of `region` in `pages` (by `mincore`).
fn resident_in(region: &Region, pages: std::ops::Range<usize>) -> usize {
    let len = pages.len() * PAGE;
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range lies inside the region's mapping, which `region` keeps alive, and
    // `vec` has one byte per 4 KiB page of it.
    let rc = unsafe {
        libc::mincore(
            region
                .as_ptr()
                .add(pages.start * PAGE)
                .cast::<libc::c_void>(),
            len,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    let per_page = PAGE / 4096;
    vec.chunks(per_page).filter(|c| c[0] & 1 != 0).count()
}

/// A slow stream among random faults (GNU sort's last merge: a page of line structs passed
/// for every two dozen faults on its line text) keeps a lean footprint: half a read-ahead
/// window, nothing queued ahead, and a short gap behind, so that the frames go to the pages
/// read at random. Before, the stream held its window, two queued windows and a gap of two
/// windows behind (about 40 pages of 16 KiB here), and its passed pages stayed until the
/// clock came round.
#[test]
fn a_slow_stream_among_random_faults_keeps_a_lean_footprint() {
    if !uffd_available("streams_lean") {
        return;
    }
    let mut rng = Rng::from_time("streams_lean");
    let (random_pages, stream_pages, between) = (256, 512, 24);
    let pages = random_pages + stream_pages;
    let data = random(pages * PAGE, &mut rng);
    let (_store, region) = region_over(&data, config(96, 8));
    let s = region.as_slice();
    let mut most = 0;
    let mut sum = 0usize;
    let mut looked = 0u32;
    for (k, p) in (random_pages..pages).rev().enumerate() {
        let i = p * PAGE + rng.below(PAGE as u64) as usize;
        assert_eq!(s[i], data[i], "byte {i} (stream)");
        for _ in 0..between {
            let i = rng.below((random_pages * PAGE) as u64) as usize;
            assert_eq!(s[i], data[i], "byte {i} (random)");
        }
        // After the first few dozen faults have shown that most are random.
        if k >= 16 {
            let held = resident_in(&region, random_pages..pages);
            most = most.max(held);
            sum += held;
            looked += 1;
        }
    }
    let counters = region.counters();
    eprintln!(
        "stream pages resident: at most {most}, {:.1} on average; {} faults, {} read ahead",
        sum as f64 / f64::from(looked),
        region.stats().faults,
        counters.read_ahead_pages
    );
    assert!(
        counters.read_ahead_pages >= stream_pages as u64 / 2,
        "the slow stream was not followed: {} pages read ahead of {stream_pages}",
        counters.read_ahead_pages
    );
    // Lean: the page, half a window (4) and a gap of 2, plus what evictions owed have not
    // yet taken; measured at most 8. Without the lean footprint: up to 48.
    assert!(
        most <= 16,
        "the slow stream held up to {most} pages ({:.1} on average)",
        sum as f64 / f64::from(looked)
    );
}
