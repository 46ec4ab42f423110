//! End-to-end tests of `Region` over real userfaultfd.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{FlakyStore, Rng, config, random_store, read_all, uffd_available};
use strata_core::{FileStore, MemoryStore, PagerConfig, Store};
use strata_pager::{EvictionPolicy, Region, RegionError};

macro_rules! need_uffd {
    ($name:expr) => {
        if !uffd_available($name) {
            return;
        }
    };
}

#[test]
fn reads_and_writes_through_a_small_buffer() {
    need_uffd!("reads_and_writes_through_a_small_buffer");
    let mut rng = Rng::from_time("reads_and_writes");
    for page in [4096u64, 12 << 10, 64 << 10] {
        let size = 4 << 20;
        let (store, data) = random_store(size, &mut rng);
        let mut region = Region::new(store.clone(), size as u64, config(page, 512 << 10, 2, 1))
            .expect("region maps");
        assert_eq!(
            region.as_slice(),
            &data[..],
            "page {page}: read through the pager"
        );
        let stats = region.stats();
        assert!(stats.faults >= (size as u64) / page, "{stats}");
        assert!(
            stats.evictions > 0,
            "the buffer is 1/8 of the region: {stats}"
        );
        // Overwrite a random subset of bytes, then flush and compare the store.
        let mut expect = data.clone();
        let slice = region.as_mut_slice();
        for _ in 0..20_000 {
            let i = rng.below(size as u64) as usize;
            let v = rng.next() as u8;
            slice[i] = v;
            expect[i] = v;
        }
        region.flush().expect("flush");
        assert!(
            read_all(&*store) == expect,
            "page {page}: store after flush"
        );
        // A clean page traps its first write once: that is how the pager sees it is dirty.
        region.evict_all().unwrap();
        region.prefetch(&[(0, 1)]).unwrap();
        let before = region.counters().write_faults;
        region.as_mut_slice()[7] ^= 0xFF;
        region.as_mut_slice()[8] ^= 0xFF;
        assert_eq!(region.counters().write_faults, before + 1);
        assert_eq!(region.counters().dirty_pages, 1);
        region.flush().unwrap();
        expect[7] ^= 0xFF;
        expect[8] ^= 0xFF;
        assert!(
            read_all(&*store) == expect,
            "page {page}: store after second flush"
        );
        assert_eq!(
            region.counters().dirty_pages,
            0,
            "flush leaves no dirty page"
        );
    }
}

#[test]
fn partial_last_page_and_store_offset() {
    need_uffd!("partial_last_page_and_store_offset");
    let mut rng = Rng::from_time("partial_last_page");
    let (store, data) = random_store(1 << 20, &mut rng);
    let offset = 3 * 4096 + 4096;
    let size = 100_000u64; // not a whole number of 16 KiB pages
    let mut region = Region::builder(store.clone(), size)
        .config(config(16 << 10, 64 << 10, 1, 1))
        .store_offset(offset)
        .build()
        .unwrap();
    let off = offset as usize;
    assert_eq!(region.as_slice(), &data[off..off + size as usize]);
    region.as_mut_slice().fill(0xAB);
    region.unmap().expect("unmap flushes");
    let after = read_all(&*store);
    assert!(after[off..off + size as usize].iter().all(|&b| b == 0xAB));
    assert_eq!(
        after[..off],
        data[..off],
        "bytes before the region untouched"
    );
    assert_eq!(
        after[off + size as usize..],
        data[off + size as usize..],
        "bytes after the region untouched (partial last page)"
    );
}

/// Umap's churn scenario: readers check read-only pages, writers own pages they update and
/// check, while the buffer holds 1/16 of the region.
#[test]
fn churn_concurrent_readers_and_writers() {
    need_uffd!("churn_concurrent_readers_and_writers");
    let mut rng = Rng::from_time("churn");
    let words = (8 << 20) / 8; // 8 MiB region of u64
    let ro_words = words / 2;
    let key = rng.next();
    let expected_ro = move |i: usize| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key;
    let store = Arc::new(MemoryStore::new((words * 8) as u64));
    let init: Vec<u8> = (0..ro_words)
        .flat_map(|i| expected_ro(i).to_le_bytes())
        .collect();
    store.write_at(0, &init).unwrap();
    let region = Region::new(
        store.clone(),
        (words * 8) as u64,
        config(4096, 512 << 10, 2, 1),
    )
    .unwrap();
    let base = region.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let checks = AtomicU64::new(0);
    let writers = 2;
    let rw_words = (words - ro_words) / writers;
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let (stop, checks) = (&stop, &checks);
            let mut rng = Rng(rng.next() ^ r);
            s.spawn(move || {
                let ptr = base as *const AtomicU64;
                while !stop.load(Ordering::Relaxed) {
                    let i = rng.below(ro_words as u64) as usize;
                    // SAFETY: i < words; the region outlives the scope; atomics make the
                    // concurrent access well defined.
                    let v = unsafe { &*ptr.add(i) }.load(Ordering::Relaxed);
                    assert_eq!(v, expected_ro(i), "read-only word {i}");
                    checks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for wi in 0..writers {
            let (stop, checks) = (&stop, &checks);
            let mut rng = Rng(rng.next() ^ (wi as u64 + 100));
            s.spawn(move || {
                let ptr = base as *const AtomicU64;
                let lo = ro_words + wi * rw_words;
                let mut shadow = vec![0u64; rw_words];
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    for _ in 0..256 {
                        let j = rng.below(rw_words as u64) as usize;
                        let v = round << 32 | j as u64;
                        // SAFETY: lo + j < words; this writer owns this slice.
                        unsafe { &*ptr.add(lo + j) }.store(v, Ordering::Relaxed);
                        shadow[j] = v;
                    }
                    for _ in 0..256 {
                        let j = rng.below(rw_words as u64) as usize;
                        // SAFETY: as above.
                        let v = unsafe { &*ptr.add(lo + j) }.load(Ordering::Relaxed);
                        assert_eq!(v, shadow[j], "writer {wi} word {j}");
                        checks.fetch_add(1, Ordering::Relaxed);
                    }
                }
                shadow
            });
        }
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
    });
    let stats = region.stats();
    eprintln!("churn: {} checks\n{stats}", checks.load(Ordering::Relaxed));
    assert!(
        stats.evictions > 100,
        "the buffer must have churned: {stats}"
    );
    assert!(stats.writebacks > 0, "{stats}");
    region.flush().unwrap();
    // Read-only half unchanged in the store.
    let all = read_all(&*store);
    assert_eq!(&all[..init.len()], &init[..]);
}

#[test]
fn flush_then_remap_persists_to_a_file() {
    need_uffd!("flush_then_remap_persists_to_a_file");
    let mut rng = Rng::from_time("flush_then_remap");
    let dir = std::env::temp_dir().join(format!("strata-pager-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("persist.bin");
    let size = 3 << 20;
    let mut data = vec![0u8; size];
    rng.fill(&mut data);
    {
        let store = Arc::new(FileStore::create(&path, size as u64).unwrap());
        let mut region = Region::new(store, size as u64, config(8192, 256 << 10, 1, 1)).unwrap();
        region.as_mut_slice().copy_from_slice(&data);
        region.flush().unwrap();
        // Dirty a few more pages after the flush: the drop must write them too.
        region.as_mut_slice()[..4096].fill(7);
        data[..4096].fill(7);
    }
    let store = Arc::new(
        FileStore::open(
            &path,
            size as u64,
            &strata_core::FileStoreOptions::default(),
        )
        .unwrap(),
    );
    let region = Region::new(store, size as u64, config(64 << 10, 512 << 10, 2, 1)).unwrap();
    assert!(region.as_slice() == &data[..], "file contents after remap");
    drop(region);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sort_through_a_region() {
    need_uffd!("sort_through_a_region");
    let mut rng = Rng::from_time("sort");
    let n = (4 << 20) / 8;
    let mut values: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let store = Arc::new(MemoryStore::from_bytes(&bytes));
    let mut region = Region::new(
        store.clone(),
        bytes.len() as u64,
        config(16 << 10, 512 << 10, 2, 2),
    )
    .unwrap();
    // SAFETY: the region is 8-byte aligned (page aligned), n * 8 bytes long, and borrowed
    // mutably for the slice's lifetime.
    let slice = unsafe {
        std::slice::from_raw_parts_mut(region.as_mut_slice().as_mut_ptr().cast::<u64>(), n)
    };
    slice.sort_unstable();
    values.sort_unstable();
    assert!(slice == &values[..], "sorted through the pager");
    region.unmap().unwrap();
    let back = read_all(&*store);
    let stored: Vec<u64> = back
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(stored, values, "sorted data reached the store");
}

#[test]
fn prefetch_and_evict_show_in_statistics() {
    need_uffd!("prefetch_and_evict_show_in_statistics");
    let mut rng = Rng::from_time("prefetch_evict");
    let page = 16u64 << 10;
    let (store, data) = random_store(4 << 20, &mut rng);
    let region = Region::new(store, 4 << 20, config(page, 1 << 20, 1, 1)).unwrap();
    let got = region.prefetch(&[(0, 256 << 10), (1 << 20, 100)]).unwrap();
    assert_eq!(got, 16 + 1, "16 pages + the one page covering 100 bytes");
    let s = region.stats();
    assert_eq!((s.prefetched_pages, s.faults), (17, 0), "{s}");
    assert_eq!(region.counters().resident_pages, 17);
    // Touching prefetched pages costs no fault.
    assert_eq!(&region.as_slice()[..256 << 10], &data[..256 << 10]);
    assert_eq!(region.stats().faults, 0);
    // Prefetching resident pages reads nothing.
    assert_eq!(region.prefetch(&[(0, 256 << 10)]).unwrap(), 0);
    let dropped = region.evict(0, 128 << 10).unwrap();
    assert_eq!(dropped, 8);
    assert_eq!(region.stats().evictions, 8);
    assert_eq!(region.counters().resident_pages, 9);
    assert_eq!(&region.as_slice()[..128 << 10], &data[..128 << 10]);
    assert_eq!(region.stats().faults, 8, "evicted pages fault back in");
    assert_eq!(region.evict_all().unwrap(), 9 + 8);
    assert_eq!(region.counters().resident_pages, 0);
    // Bad ranges.
    for (off, len) in [(4 << 20, 1), (0, (4 << 20) + 1), (5, 0), (u64::MAX, 2)] {
        assert!(
            matches!(region.evict(off, len), Err(RegionError::OutOfRange { .. })),
            "evict({off}, {len})"
        );
        assert!(matches!(
            region.prefetch(&[(off, len)]),
            Err(RegionError::OutOfRange { .. })
        ));
    }
}

#[test]
fn unmap_with_dirty_pages_loses_nothing() {
    need_uffd!("unmap_with_dirty_pages_loses_nothing");
    let mut rng = Rng::from_time("unmap_dirty");
    let size = 6 << 20;
    let store = Arc::new(MemoryStore::new(size));
    let mut region = Region::new(store.clone(), size, config(4096, 256 << 10, 2, 1)).unwrap();
    let mut expect = vec![0u8; size as usize];
    rng.fill(&mut expect);
    region.as_mut_slice().copy_from_slice(&expect);
    assert!(
        region.counters().dirty_pages > 0,
        "dirty pages remain before unmap"
    );
    region.unmap().unwrap();
    assert!(read_all(&*store) == expect, "every byte reached the store");
    // And through drop, with several regions alive at once and different page sizes.
    let stores: Vec<Arc<MemoryStore>> = (0..3)
        .map(|_| Arc::new(MemoryStore::new(1 << 20)))
        .collect();
    let mut regions: Vec<Region> = stores
        .iter()
        .zip([4096u64, 8192, 2 << 20])
        .map(|(s, p)| {
            let buffer = (p * 4).max(64 << 10);
            Region::new(s.clone(), 1 << 20, config(p, buffer, 1, 1)).unwrap()
        })
        .collect();
    for (k, r) in regions.iter_mut().enumerate() {
        r.as_mut_slice().fill(k as u8 + 1);
    }
    drop(regions);
    for (k, s) in stores.iter().enumerate() {
        assert!(
            read_all(&**s).iter().all(|&b| b == k as u8 + 1),
            "region {k}"
        );
    }
}

#[test]
fn failing_store_errors_reach_flush_and_unmap_keeps_the_region() {
    need_uffd!("failing_store_errors_reach_flush");
    let size = 1 << 20;
    let store = Arc::new(FlakyStore::new(size));
    let mut region = Region::new(store.clone(), size, config(4096, 128 << 10, 1, 1)).unwrap();
    region.as_mut_slice()[..64 << 10].fill(9);
    store.fail_writes.store(true, Ordering::SeqCst);
    let e = region.flush().unwrap_err();
    assert!(matches!(e, RegionError::WriteBack { .. }), "{e}");
    assert!(e.to_string().contains("injected write failure"), "{e}");
    let err = region.unmap().unwrap_err();
    assert!(err.to_string().contains("still mapped"), "{err}");
    let region = err.region;
    assert!(region.counters().dirty_pages >= 16);
    assert!(region.stats().errors > 0);
    // Repair the store: nothing was lost.
    store.fail_writes.store(false, Ordering::SeqCst);
    region.unmap().unwrap();
    assert!(read_all(&store.inner)[..64 << 10].iter().all(|&b| b == 9));

    // Prefetch surfaces read errors as errors, and leaves the pages absent.
    let region = Region::new(store.clone(), size, config(4096, 128 << 10, 1, 1)).unwrap();
    store.fail_reads.store(true, Ordering::SeqCst);
    let e = region.prefetch(&[(0, 8192)]).unwrap_err();
    assert!(matches!(e, RegionError::Fill { .. }), "{e}");
    assert_eq!(region.counters().resident_pages, 0);
    store.fail_reads.store(false, Ordering::SeqCst);
    assert_eq!(region.prefetch(&[(0, 8192)]).unwrap(), 2);
}

/// A store that cannot be read answers the faulting thread with SIGBUS (no hang, no zeros),
/// through `UFFDIO_POISON` where the kernel has it and through a signal to the thread where
/// it does not. Runs in a child process, which must die of SIGBUS within a deadline.
#[test]
fn failing_store_fault_delivers_sigbus_not_a_hang() {
    if let Some(mode) = std::env::var_os("PAGER_SIGBUS_CHILD") {
        let size = 1 << 20;
        let store = Arc::new(FlakyStore::new(size));
        store.fail_reads.store(true, Ordering::SeqCst);
        let mut builder = Region::builder(store, size).config(config(4096, 64 << 10, 1, 1));
        if mode == "signal" {
            builder = builder.without_poison();
        }
        let region = builder.build().unwrap();
        let v = region.as_slice()[5000];
        // Reaching this line means the faulting thread saw data it cannot have.
        println!("CHILD READ {v}");
        std::process::exit(3);
    }
    need_uffd!("failing_store_fault_delivers_sigbus_not_a_hang");
    use std::os::unix::process::ExitStatusExt;
    for mode in ["poison", "signal"] {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "failing_store_fault_delivers_sigbus_not_a_hang",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PAGER_SIGBUS_CHILD", mode)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{mode}: the faulting thread hung on a failing store");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            status.signal(),
            Some(libc::SIGBUS),
            "{mode}: child should die of SIGBUS, got {status:?}"
        );
    }
}

#[test]
fn bad_configuration_is_refused() {
    need_uffd!("bad_configuration_is_refused");
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(1 << 20));
    let ok = config(4096, 64 << 10, 1, 1);
    let e = Region::new(store.clone(), 0, ok.clone()).unwrap_err();
    assert!(matches!(e, RegionError::Empty), "{e}");
    let e = Region::new(store.clone(), (1 << 20) + 1, ok.clone()).unwrap_err();
    assert!(matches!(e, RegionError::StoreTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("use a larger store"), "{e}");
    let e = Region::builder(store.clone(), 1 << 20)
        .store_offset(1)
        .config(ok)
        .build()
        .unwrap_err();
    assert!(
        matches!(e, RegionError::StoreTooSmall { offset: 1, .. }),
        "{e}"
    );
    let bad = PagerConfig::builder().page_bytes(5000).build().unwrap_err();
    assert!(bad.to_string().contains("multiple of 4 KiB"));
    assert!("lru".parse::<EvictionPolicy>().is_err());
}

/// The clock keeps a re-used hot set resident while a scan streams past; FIFO does not.
#[test]
fn clock_beats_fifo_on_a_hot_set_with_a_scan() {
    need_uffd!("clock_beats_fifo_on_a_hot_set_with_a_scan");
    let faults = |policy| {
        let size = 8u64 << 20;
        let store = Arc::new(MemoryStore::new(size));
        let region = Region::builder(store, size)
            .config(config(4096, 1 << 20, 1, 1))
            .policy(policy)
            .build()
            .unwrap();
        let s = region.as_slice();
        let hot = 64; // pages, well inside the 256-page buffer
        let mut sum = 0u64;
        for round in 0..8 {
            for p in 0..hot {
                sum += u64::from(s[p * 4096]);
            }
            // A scan of 128 cold pages per round.
            for p in 0..128 {
                sum += u64::from(s[(hot + 1 + round * 128 + p) * 4096]);
            }
        }
        assert_eq!(sum, 0);
        region.stats().faults
    };
    let (clock, fifo) = (faults(EvictionPolicy::Clock), faults(EvictionPolicy::Fifo));
    eprintln!("faults: clock {clock}, fifo {fifo}");
    assert!(clock <= fifo, "clock {clock} vs fifo {fifo}");
}

#[test]
fn read_only_region_at_a_fixed_address() {
    need_uffd!("read_only_region_at_a_fixed_address");
    let mut rng = Rng::from_time("read_only_fixed");
    let (store, data) = random_store(1 << 20, &mut rng);
    // Reserve an address range of our own, then map the region over it.
    // SAFETY: a fresh PROT_NONE anonymous mapping at an address of the kernel's choosing.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            1 << 20,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    let addr = addr.cast::<u8>();
    // SAFETY: the range is our reservation above, which the region replaces (and unmaps when
    // dropped).
    let region = unsafe {
        Region::builder(store, 1 << 20)
            .config(config(8192, 64 << 10, 1, 1))
            .read_only(true)
            .fixed_address(addr)
    }
    .build()
    .unwrap();
    assert_eq!(region.as_ptr(), addr);
    assert!(region.as_slice() == &data[..]);
    region.flush().unwrap();
    assert_eq!(region.counters().dirty_pages, 0);
    assert_eq!(region.stats().writebacks, 0);
}

/// `Region::evict_all`, then writes, then `Region::flush`: every page written since reaches the
/// store, round after round, with the budget the whole region or part of it and read-ahead on
/// or off, and the resident set stays within the budget. (Evicted frames were once returned to
/// the free list twice, so two pages could share one frame and the second was invisible to
/// flush and eviction: its writes never reached the store.)
#[test]
fn flush_after_evict_writes_every_written_page() {
    if !common::uffd_available("flush_after_evict_writes_every_written_page") {
        return;
    }
    let mut rng = common::Rng::from_time("flush_after_evict_writes_every_written_page");
    let page: u64 = 64 << 10;
    let pages = 8u64;
    let size = page * pages;
    for (budget_pages, read_ahead) in [(8u64, 0u64), (8, 4), (4, 0), (4, 2)] {
        let inner = Arc::new(MemoryStore::new(size));
        let store: Arc<dyn Store> = inner.clone();
        let config = PagerConfig::builder()
            .page_bytes(page)
            .buffer_bytes(budget_pages * page)
            .read_ahead(read_ahead)
            .build()
            .unwrap();
        let mut region = Region::builder(store, size).config(config).build().unwrap();
        for round in 1..6u64 {
            let offset = rng.below(page / 8) * 8;
            let stamps: Vec<u64> = (0..pages).map(|_| rng.next()).collect();
            for (p, stamp) in (0..pages).zip(&stamps) {
                let at = usize::try_from(p * page + offset).unwrap();
                region.as_mut_slice()[at..at + 8].copy_from_slice(&stamp.to_le_bytes());
            }
            region.flush().unwrap();
            let stale: Vec<u64> = (0..pages)
                .filter(|&p| {
                    let mut x = [0u8; 8];
                    inner.read_at(p * page + offset, &mut x).unwrap();
                    u64::from_le_bytes(x) != stamps[usize::try_from(p).unwrap()]
                })
                .collect();
            assert!(
                stale.is_empty(),
                "budget {budget_pages} pages, read-ahead {read_ahead}, round {round}: flush left pages {stale:?} stale in the store"
            );
            let resident = region.counters().resident_pages;
            assert!(
                resident <= budget_pages,
                "budget {budget_pages} pages: {resident} resident"
            );
            region.evict_all().unwrap();
        }
        region.unmap().unwrap();
    }
}
