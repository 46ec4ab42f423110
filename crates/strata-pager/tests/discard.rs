//! `Region::discard`: dropped pages read as zeros without store traffic, neighbours keep their
//! data, and discards racing with writers, evictors and faults never lose or crash.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::watchdog::Watchdog;
use common::{Rng, config, random_store, read_all, uffd_available};
use strata_core::StatsSnapshot;
use strata_pager::{Region, RegionError};

const PAGE: usize = 64 << 10;

fn io(s: &StatsSnapshot) -> (u64, u64) {
    s.tiers
        .iter()
        .fold((0, 0), |(r, w), t| (r + t.bytes_read, w + t.bytes_written))
}

#[test]
fn discarded_pages_read_zeros_without_store_traffic_and_neighbours_survive() {
    if !uffd_available("discard_zeros") {
        return;
    }
    let mut rng = Rng::from_time("discard_zeros");
    let size = 4 << 20;
    let (store, data) = random_store(size, &mut rng);
    let mut region = Region::new(
        store.clone(),
        size as u64,
        config(PAGE as u64, 1 << 20, 2, 1),
    )
    .expect("region maps");
    let mut expect = data.clone();
    // Dirty everything resident now, plus a few random writes.
    for _ in 0..5000 {
        let i = rng.below(size as u64) as usize;
        let v = rng.next() as u8;
        region.as_mut_slice()[i] = v;
        expect[i] = v;
    }
    let first = 1 + rng.below(40) as usize;
    // At most a quarter of the 16-frame buffer.
    let pages = 1 + rng.below(4) as usize;
    let (off, len) = (first * PAGE, pages * PAGE);
    // Touch the range so some of it is resident and dirty.
    region.as_mut_slice()[off] ^= 1;
    region.discard(off as u64, len as u64).expect("discard");
    expect[off..off + len].fill(0);
    // Empty the buffer (writing every other page back), so that reading the range needs no
    // eviction: with a full one, the clock or the stream the read makes (`behind.rs`) may
    // evict a zero page of the range, which writes its zeros and may read them back.
    region.evict_all().expect("evict");
    let before = io(&region.stats());
    assert!(
        region.as_slice()[off..off + len].iter().all(|&b| b == 0),
        "discarded range reads zeros"
    );
    let after = io(&region.stats());
    assert_eq!(before, after, "reading discarded pages touches the store");
    // Everything, through eviction and flush, matches.
    region.evict_all().expect("evict");
    assert_eq!(region.as_slice(), &expect[..], "after eviction");
    region.flush().expect("flush");
    let stored = read_all(store.as_ref());
    assert_eq!(&stored[..off], &expect[..off], "store before the range");
    assert_eq!(&stored[off + len..], &expect[off + len..], "store after");
    // Reading zeros again after eviction of the zero pages wrote them back.
    region.evict_all().expect("evict");
    assert_eq!(
        read_all(store.as_ref()),
        expect,
        "zero pages were written back"
    );
    // Bad input.
    let bad = [
        (1u64, PAGE as u64),
        (0, 100),
        (size as u64, PAGE as u64),
        (0, 0),
    ];
    for (o, l) in bad {
        let e = region.discard(o, l).expect_err("refused");
        assert!(
            matches!(
                e,
                RegionError::Unaligned { .. } | RegionError::OutOfRange { .. }
            ),
            "{e}"
        );
    }
    assert_eq!(region.as_slice(), &expect[..], "refusals changed nothing");
    region.unmap().expect("unmap");
}

#[test]
fn discard_races_with_writers_evictors_and_faults() {
    if !uffd_available("discard_races") {
        return;
    }
    let mut rng = Rng::from_time("discard_races");
    let pages = 64;
    let size = pages * PAGE;
    let (store, data) = random_store(size, &mut rng);
    // Buffer of 8 pages: the evictor and direct reclaim run all the time.
    let region = Arc::new(
        Region::new(
            store.clone(),
            size as u64,
            config(PAGE as u64, 8 * PAGE as u64, 2, 1),
        )
        .expect("region maps"),
    );
    // Pages 0..32 belong to the writers (each writes its own pages with a known pattern);
    // pages 32..64 are discarded and read concurrently by a reader thread.
    let stop = Arc::new(AtomicBool::new(false));
    let base = region.as_ptr() as usize;
    let mut writers = Vec::new();
    for t in 0..2usize {
        let stop = stop.clone();
        let seed = rng.next();
        writers.push(std::thread::spawn(move || {
            let mut r = Rng(seed);
            let mut mine = vec![0u8; 16];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let page = t * 16 + r.below(16) as usize;
                let v = r.next() as u8 | 1;
                // SAFETY: the page lies inside the live region, only this thread writes it.
                unsafe { std::ptr::write_volatile((base + page * PAGE + 7) as *mut u8, v) };
                mine[page - t * 16] = v;
                n += 1;
            }
            (mine, n)
        }));
    }
    let reader = {
        let stop = stop.clone();
        let original = data[32 * PAGE..].to_vec();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut page = 32;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: inside the live region; nothing writes pages 32..64.
                let b = unsafe { std::ptr::read_volatile((base + page * PAGE + 3) as *const u8) };
                let old = original[(page - 32) * PAGE + 3];
                assert!(
                    b == 0 || b == old,
                    "page {page}: {b} neither zero nor old {old}"
                );
                reads += 1;
                page = 32 + (page + 7) % 32;
            }
            reads
        })
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut discards = 0;
    while Instant::now() < deadline {
        let first = 32 + rng.below(32) as usize;
        let n = 1 + rng.below((64 - first) as u64) as usize;
        region
            .discard((first * PAGE) as u64, (n * PAGE) as u64)
            .expect("discard");
        discards += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("reader: never a wrong byte or SIGBUS");
    let mut expect = data.clone();
    for (t, w) in writers.into_iter().enumerate() {
        let (mine, n) = w.join().expect("writer");
        eprintln!("writer {t}: {n} writes");
        for (i, v) in mine.iter().enumerate() {
            if *v != 0 {
                expect[(t * 16 + i) * PAGE + 7] = *v;
            }
        }
    }
    eprintln!("{discards} discards, {reads} racing reads");
    region
        .discard(32 * PAGE as u64, 32 * PAGE as u64)
        .expect("discard");
    expect[32 * PAGE..].fill(0);
    region.evict_all().expect("evict");
    region.flush().expect("flush");
    assert_eq!(
        region.as_slice(),
        &expect[..],
        "no write of another range lost"
    );
    assert_eq!(&read_all(store.as_ref())[..32 * PAGE], &expect[..32 * PAGE]);
    Arc::into_inner(region)
        .expect("sole owner")
        .unmap()
        .expect("unmap");
}

/// Discards far wider than a four-frame buffer, racing with two threads that fault pages of
/// the same range: every fault is served (no `SIGBUS` from a fill starved of frames), every
/// 8-byte word read is the store's or zero, and once the discards end the range reads zeros
/// while the pages after it keep their data. A discard that stalls aborts the test binary
/// after 60 s rather than hang CI.
#[test]
fn wide_discards_racing_faults_in_a_four_frame_buffer() {
    if !uffd_available("wide_discards") {
        return;
    }
    let _watchdog = Watchdog::start(
        "wide_discards_racing_faults_in_a_four_frame_buffer",
        Duration::from_secs(60),
    );
    let mut rng = Rng::from_time("wide_discards");
    let page = 4096usize;
    let pages = 48usize;
    // Pages 0..40 are discarded and read; 40..48 are only read.
    let range = 40usize;
    let size = pages * page;
    let (store, data) = random_store(size, &mut rng);
    let region = Arc::new(
        Region::new(
            store,
            size as u64,
            config(page as u64, 4 * page as u64, 2, 1),
        )
        .expect("region maps"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let base = region.as_ptr() as usize;
    let data = Arc::new(data);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, data) = (stop.clone(), data.clone());
            let seed = rng.next();
            std::thread::spawn(move || {
                let mut r = Rng(seed);
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = r.below(pages as u64) as usize;
                    let at = p * page + 8 * r.below((page / 8) as u64) as usize;
                    // SAFETY: an aligned word inside the live region; no thread writes it.
                    let v = unsafe { std::ptr::read_volatile((base + at) as *const u64) };
                    let old = u64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes"));
                    assert!(
                        v == old || (p < range && v == 0),
                        "page {p} offset {at}: {v:#x} is neither the store's {old:#x} nor zero"
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut discards = 0u64;
    let mut dropped = 0u64;
    while Instant::now() < deadline {
        let first = rng.below(8) as usize;
        let n = 8 + rng.below((range - first - 8) as u64 + 1) as usize;
        dropped += region
            .discard((first * page) as u64, (n * page) as u64)
            .expect("discard");
        discards += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reads: Vec<u64> = readers
        .into_iter()
        .map(|r| r.join().expect("reader: never a wrong word or SIGBUS"))
        .collect();
    eprintln!("{discards} discards dropped {dropped} pages; racing reads {reads:?}");
    region
        .discard(0, (range * page) as u64)
        .expect("last discard");
    let slice = region.as_slice();
    assert!(
        slice[..range * page].iter().all(|&b| b == 0),
        "the discarded range reads zeros"
    );
    assert_eq!(
        &slice[range * page..],
        &data[range * page..],
        "pages after it"
    );
    Arc::into_inner(region)
        .expect("sole owner")
        .unmap()
        .expect("unmap");
}
