//! A region whose mapping the program splits (here with `madvise(MADV_DONTDUMP)` on part of
//! it, as NumPy does with `MADV_HUGEPAGE` on large arrays when no interposer stops it) still
//! serves every page. The kernel installs pages into one of its mappings per `UFFDIO_COPY`
//! and answers ENOENT for a run that crosses the split; before the pager retried such a run
//! page by page, the faulting thread was never woken and the program hung.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod common;

use std::time::Duration;

use common::{Rng, random_store, run_child, uffd_available};
use strata_core::PagerConfig;
use strata_pager::Region;

const PAGE: usize = 16 << 10;
const CHILD: &str = "STRATA_SPLIT_MAPPING_CHILD";

fn config(read_ahead: u64) -> PagerConfig {
    PagerConfig::builder()
        .page_bytes(PAGE as u64)
        .buffer_bytes(64 * PAGE as u64)
        .fillers(1)
        .evictors(1)
        .read_ahead(read_ahead)
        .build()
        .expect("test configuration is valid")
}

/// Splits the region's mapping at every page in `splits` by giving the pages from each split
/// to the next one the `MADV_DONTDUMP` flag (alternately with and without it), so no two
/// neighbouring parts can merge again.
fn split(region: &Region, splits: &[usize]) {
    let base = region.as_ptr() as usize;
    let mut bounds = splits.to_vec();
    bounds.push(region.len() / PAGE);
    for (i, w) in bounds.windows(2).enumerate() {
        if i % 2 == 1 {
            continue;
        }
        let (start, end) = (w[0], w[1]);
        // SAFETY: the range lies inside the region's mapping, which `region` keeps alive;
        // the advice changes a flag of the mapping, never its contents or protection.
        let rc = unsafe {
            libc::madvise(
                (base + start * PAGE) as *mut libc::c_void,
                (end - start) * PAGE,
                libc::MADV_DONTDUMP,
            )
        };
        assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
    }
}

/// How many mappings of this process cover `[start, end)` (from `/proc/self/maps`).
fn mappings_covering(start: usize, end: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .filter(|&(a, b)| a < end && b > start)
        .count()
}

/// The child's work: sweeps that fault runs across the splits, up and down, then random
/// reads and writes after eviction; every byte is checked.
fn sweep_a_split_region() {
    let mut rng = Rng::from_time("split_mapping");
    let pages = 256;
    let (store, data) = random_store(pages * PAGE, &mut rng);
    let region = Region::new(store.clone(), (pages * PAGE) as u64, config(8)).expect("maps");
    // Splits at odd places, so read-ahead windows of 8 pages cross them.
    let splits: Vec<usize> = vec![0, 13, 29, 30, 77, 131, 200, 251];
    split(&region, &splits);
    let base = region.as_ptr() as usize;
    let parts = mappings_covering(base, base + region.len());
    eprintln!("the region is now {parts} mappings");
    assert!(parts >= splits.len(), "the split did not happen: {parts}");
    let bytes = region.as_slice();
    for p in 0..pages {
        assert_eq!(
            &bytes[p * PAGE..(p + 1) * PAGE],
            &data[p * PAGE..(p + 1) * PAGE],
            "page {p} (ascending)"
        );
    }
    region.evict_all().expect("evict");
    for p in (0..pages).rev() {
        assert_eq!(
            &bytes[p * PAGE..(p + 1) * PAGE],
            &data[p * PAGE..(p + 1) * PAGE],
            "page {p} (descending)"
        );
    }
    // Writes across the splits reach the store.
    let mut expect = data;
    let ptr = region.as_ptr();
    for _ in 0..2000 {
        let i = rng.below((pages * PAGE) as u64) as usize;
        let v = rng.next() as u8;
        // SAFETY: `i` is inside the region, which stays mapped; no other thread touches it.
        unsafe { ptr.add(i).write_volatile(v) };
        expect[i] = v;
    }
    region.flush().expect("flush");
    drop(region);
    let stored = common::read_all(store.as_ref());
    let wrong = (0..stored.len())
        .filter(|&i| stored[i] != expect[i])
        .count();
    assert_eq!(wrong, 0, "{wrong} bytes differ in the store after flush");
    println!("split-mapping child ok");
}

#[test]
fn a_region_split_into_several_mappings_serves_every_page() {
    if std::env::var_os(CHILD).is_some() {
        sweep_a_split_region();
        return;
    }
    if !uffd_available("split_mapping") {
        return;
    }
    // In a child with a deadline: the failure this guards against is a thread asleep for
    // ever in the kernel.
    let outcome = run_child(
        "a_region_split_into_several_mappings_serves_every_page",
        CHILD,
        "1",
        Duration::from_secs(30),
    );
    assert!(
        outcome.success() && outcome.output.contains("split-mapping child ok"),
        "the child {} after {:?}:\n{}",
        match outcome.status {
            None => "hung (killed at its deadline)".to_string(),
            Some(s) => format!("ended with {s}"),
        },
        outcome.elapsed,
        outcome.output
    );
}
