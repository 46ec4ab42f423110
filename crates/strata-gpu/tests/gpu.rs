//! GPU tests: run on a machine with an NVIDIA GPU (scripts/gpu-check.sh runs them on the device
//! machine). Without a CUDA driver each test prints `skipped: no CUDA driver` and passes.
//! Fresh random data every run; the seed is printed.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use strata_gpu::driver::{Args, DeviceBuffer, Grid};
use strata_gpu::{ElementType, EvictionPolicy, SpaceError};

mod common;
use common::{check_read_random, opts, random_words, replay_rmw_owned, seed, strata_or_skip};

const KERNELS: &str = include_str!("gpu_kernels.cu");

#[test]
fn layout_matches_on_the_device() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    assert_eq!(
        strata.device_layout().unwrap(),
        strata_gpu::layout::host_layout()
    );
}

/// Random read-modify-writes from every SM against a host replay, then random reads, then a
/// read-back of the whole space, at 1x to 8x oversubscription and 4 KiB to 2 MiB pages.
#[test]
fn random_reads_and_writes_match_a_host_reference() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let rmw = module.function("rmw_owned").unwrap();
    let read = module.function("read_random").unwrap();
    // (page size, cache, ratios, blocks per SM, threads, ops per thread): big pages get fewer
    // accesses, since nearly every access at 8x moves a whole page.
    type Config = (u64, u64, &'static [u64], u32, u32, u64);
    let configs: [Config; 3] = [
        (4 << 10, 32 << 20, &[1, 2, 4, 8], 0, 256, 8),
        (64 << 10, 32 << 20, &[1, 2, 4, 8], 0, 256, 4),
        (2 << 20, 64 << 20, &[1, 4], 1, 64, 1),
    ];
    for (page, cache, ratios, blocks_per_sm, threads_per_block, ops) in configs {
        for &ratio in ratios {
            for policy in [
                EvictionPolicy::Clock,
                EvictionPolicy::ScanResistant {
                    protected_fraction: 0.5,
                },
            ] {
                if ratio != 4 && !matches!(policy, EvictionPolicy::Clock) {
                    continue;
                }
                let s = seed();
                let bytes = cache * ratio;
                let n = (bytes / 8) as usize;
                let mut space = strata.space(bytes, &opts(page, cache, policy)).unwrap();
                let mut reference = random_words(n, s);
                space.fill_from_slice(0, &reference).unwrap();
                let grid = if blocks_per_sm == 0 {
                    rmw.full_grid(threads_per_block).unwrap()
                } else {
                    Grid {
                        blocks: blocks_per_sm * strata.gpu().multiprocessors,
                        threads: threads_per_block,
                    }
                };
                let threads = u64::from(grid.blocks) * u64::from(grid.threads);
                rmw.launch(grid, &Args::new().arg(space.handle()).arg(ops).arg(s))
                    .unwrap();
                space.check_errors().unwrap();
                replay_rmw_owned(&mut reference, threads, ops, s);
                let what = format!("page {page} ratio {ratio} {policy:?}");
                check_read_random(
                    &read,
                    &space,
                    grid,
                    &reference,
                    ops.min(4),
                    s ^ 0x5555,
                    &what,
                );
                let mut back = vec![0u64; n];
                space.read_back(0, &mut back).unwrap();
                let bad = back.iter().zip(&reference).filter(|(a, b)| a != b).count();
                assert_eq!(
                    bad, 0,
                    "page {page} ratio {ratio} {policy:?}: {bad} elements differ after flush"
                );
                let st = space.stats().unwrap();
                eprintln!("page {page:>8} ratio {ratio} {policy:?}: {st:?}");
                assert!(st.faults > 0);
                if ratio > 1 {
                    assert!(
                        st.evictions > 0 && st.writebacks > 0,
                        "no eviction at {ratio}x: {st:?}"
                    );
                }
            }
        }
    }
}

/// Every warp of a full grid faults on the same page at once: one fault, exact atomic count.
#[test]
fn every_warp_of_a_full_grid_faults_on_one_page() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let hammer = module.function("hammer_one").unwrap();
    for page in [4u64 << 10, 2 << 20] {
        let s = seed();
        let mut space = strata
            .space(64 << 20, &opts(page, 16 << 20, EvictionPolicy::Clock))
            .unwrap();
        let n = (space.size() / 8) as usize;
        let data = random_words(n, s);
        space.fill_from_slice(0, &data).unwrap();
        let i = (s % (n as u64 - 2)) & !1;
        let grid = hammer.full_grid(256).unwrap();
        let threads = u64::from(grid.blocks) * u64::from(grid.threads);
        let seen = DeviceBuffer::zeroed(strata.gpu(), threads as usize * 8).unwrap();
        hammer
            .launch(
                grid,
                &Args::new().arg(space.handle()).arg(i).arg(seen.ptr()),
            )
            .unwrap();
        space.check_errors().unwrap();
        let st = space.stats().unwrap();
        let mut v = [0u64; 2];
        space.read_back(i * 8, &mut v).unwrap();
        assert_eq!(
            v[0],
            data[i as usize].wrapping_add(threads),
            "lost atomic adds"
        );
        assert_eq!(v[1], data[i as usize + 1]);
        let mut got = vec![0u64; threads as usize];
        seen.download(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&g| g == data[i as usize + 1]),
            "a warp read a wrong value"
        );
        assert!(
            st.faults <= 2,
            "one page (two if i+1 crosses) should fault once: {st:?}"
        );
    }
}

/// Writes survive eviction and flush; evict() and prefetch() do what they say.
#[test]
fn writes_survive_eviction_and_flush() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let rmw = module.function("rmw_owned").unwrap();
    let s = seed();
    let cache = 4u64 << 20;
    let mut space = strata
        .space(8 * cache, &opts(64 << 10, cache, EvictionPolicy::Clock))
        .unwrap();
    let n = (space.size() / 8) as usize;
    let data = random_words(n, s);
    space.fill_from_slice(0, &data).unwrap();
    let grid = Grid {
        blocks: 64,
        threads: 256,
    };
    rmw.launch(grid, &Args::new().arg(space.handle()).arg(4u64).arg(s))
        .unwrap();
    space.flush().unwrap();
    let before = space.stats().unwrap();
    assert!(before.writebacks > 0);
    // After a flush nothing is dirty: evicting everything writes nothing more back.
    space.evict(0..space.size()).unwrap();
    let after = space.stats().unwrap();
    assert_eq!(
        after.writebacks, before.writebacks,
        "flush left dirty pages"
    );
    assert!(
        space
            .page_table()
            .unwrap()
            .iter()
            .all(|&w| w >> 32 & 3 == 0),
        "evict left pages resident"
    );
    let mut back = vec![0u64; n];
    space.read_back(0, &mut back).unwrap();
    assert_ne!(back, data, "the kernel changed nothing");
    // prefetch brings pages in; a read of them afterwards faults no more.
    space.reset_stats().unwrap();
    space.prefetch(0..cache / 2).unwrap();
    let st = space.stats().unwrap();
    assert_eq!(st.prefetched, cache / 2 / (64 << 10));
    assert!(
        space.prefetch(0..space.size() + 1).is_err(),
        "a range past the end must be refused"
    );
}

#[test]
fn float_and_32_bit_atomics() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let k = module.function("atomics_mixed").unwrap();
    let mut o = opts(4 << 10, 64 << 10, EvictionPolicy::Clock);
    o.element = ElementType::F32;
    let mut sf = strata.space(256 << 10, &o).unwrap();
    o.element = ElementType::U32;
    let mut si = strata.space(256 << 10, &o).unwrap();
    sf.fill_zero().unwrap();
    si.fill_zero().unwrap();
    let grid = Grid {
        blocks: 512,
        threads: 256,
    };
    k.launch(grid, &Args::new().arg(sf.handle()).arg(si.handle()))
        .unwrap();
    let mut f = vec![0f32; 64];
    sf.read_back(0, &mut f).unwrap();
    let per = 512.0 * 256.0 / 64.0 * 0.5;
    assert!(
        f.iter().all(|&x| x == per),
        "float atomics lost updates: {:?}",
        &f[..4]
    );
    let mut u = vec![0u32; (256 << 10) / 4];
    si.read_back(0, &mut u).unwrap();
    assert_eq!(u.iter().map(|&x| u64::from(x)).sum::<u64>(), 512 * 256);
}

#[test]
fn out_of_range_access_is_an_error_and_writes_nothing() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let poke = module.function("poke").unwrap();
    let s = seed();
    let mut space = strata
        .space(1 << 20, &opts(4 << 10, 256 << 10, EvictionPolicy::Clock))
        .unwrap();
    let n = space.size() / 8;
    let data = random_words(n as usize, s);
    space.fill_from_slice(0, &data).unwrap();
    let out = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    let bad = n + 5 + s % 1000;
    poke.launch(
        Grid {
            blocks: 1,
            threads: 32,
        },
        &Args::new().arg(space.handle()).arg(bad).arg(out.ptr()),
    )
    .unwrap();
    match space.check_errors() {
        Err(SpaceError::OutOfRange {
            index, elements, ..
        }) => {
            assert_eq!(index, bad);
            assert_eq!(elements, n);
        }
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
    // Reported once, then cleared.
    space.check_errors().unwrap();
    // The same through the read that also gives the statistics: a valid poke (a fault and a
    // dirtied page, so the counts are not all zero), then a bad one.
    let grid = Grid {
        blocks: 1,
        threads: 32,
    };
    let good = s % n;
    poke.launch(
        grid,
        &Args::new().arg(space.handle()).arg(good).arg(out.ptr()),
    )
    .unwrap();
    let stats = space.check_errors_and_stats().unwrap();
    assert_eq!(stats, space.stats().unwrap(), "one read, the same counts");
    assert!(
        stats.pages_dirtied >= 1 && stats.faults + stats.hits >= 1,
        "{stats:?}"
    );
    poke.launch(
        grid,
        &Args::new().arg(space.handle()).arg(bad).arg(out.ptr()),
    )
    .unwrap();
    match space.check_errors_and_stats() {
        Err(SpaceError::OutOfRange { index, .. }) => assert_eq!(index, bad),
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
    space.check_errors().unwrap();
    let mut back = vec![0u64; n as usize];
    let mut data = data;
    data[good as usize] = 7;
    space.read_back(0, &mut back).unwrap();
    assert_eq!(back, data, "an out-of-range write changed the space");
}

#[test]
fn compile_error_is_reported_with_its_log() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let err = strata
        .compile(
            "#include \"strata.cuh\"\nextern \"C\" __global__ void k() { not_declared(); }\n",
            "bad.cu",
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("not_declared") && text.contains("bad.cu"),
        "{text}"
    );
}

/// A loop over twice the cache: clock thrashes (nearly every access faults); the scan-resistant
/// policy keeps its protected segment resident.
#[test]
fn scan_resistant_policy_beats_clock_on_a_loop_twice_the_cache() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let lp = module.function("loop_pages").unwrap();
    let cache = 8u64 << 20;
    let page = 64u64 << 10;
    let pages = 2 * cache / page;
    let mut faults = Vec::new();
    for policy in [
        EvictionPolicy::Clock,
        EvictionPolicy::ScanResistant {
            protected_fraction: 0.75,
        },
    ] {
        let space = strata.space(2 * cache, &opts(page, cache, policy)).unwrap();
        let sink = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
        // A small grid so the loop runs in order, as a scan does.
        lp.launch(
            Grid {
                blocks: 4,
                threads: 128,
            },
            &Args::new()
                .arg(space.handle())
                .arg(pages)
                .arg(8u64)
                .arg(sink.ptr()),
        )
        .unwrap();
        let st = space.stats().unwrap();
        eprintln!("{policy:?}: {st:?}");
        faults.push(st.faults);
    }
    assert!(
        faults[1] * 10 < faults[0] * 8,
        "scan-resistant faults {} vs clock {}",
        faults[1],
        faults[0]
    );
    // The protected segment (96 of 128 frames) stays across passes: the first pass faults on
    // every page, each later one on about the 160 pages outside the segment.
    let ideal = pages + 7 * (pages - 96);
    assert!(
        faults[1] * 100 <= ideal * 115,
        "scan-resistant faults {} against {ideal} if the protected segment were kept",
        faults[1]
    );
}

/// Optimistic (pin-free) reads race evictions and write-backs: readers through `Array::read`
/// and through `view_page`/`view_valid` check every value against what the space must hold,
/// while writers dirty pages, at 1x (all hits) to 8x, with both policies and two page sizes.
#[test]
fn optimistic_reads_never_return_another_pages_bytes() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let verify = module.function("verify_reads").unwrap();
    let grid = verify.full_grid(256).unwrap();
    // (page size, cache, reads per thread): big pages get fewer, as nearly every random read
    // at 8x moves a whole page.
    for (page, cache, ops) in [(4u64 << 10, 4u64 << 20, 32u64), (64 << 10, 32 << 20, 4)] {
        for ratio in [1u64, 2, 8] {
            for policy in [
                EvictionPolicy::Clock,
                EvictionPolicy::ScanResistant {
                    protected_fraction: 0.75,
                },
            ] {
                let key = seed();
                let n = (cache * ratio / 8) as usize;
                let values: Vec<u64> = (0..n as u64).map(|i| i ^ key).collect();
                let mut space = strata
                    .space(cache * ratio, &opts(page, cache, policy))
                    .unwrap();
                space.fill_from_slice(0, &values).unwrap();
                let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
                // Hot set: four pages, read by about half of all reads.
                let hot = 4 * page / 8;
                verify
                    .launch(
                        grid,
                        &Args::new()
                            .arg(space.handle())
                            .arg(ops)
                            .arg(key.rotate_left(17))
                            .arg(key)
                            .arg(hot)
                            .arg(bad.ptr()),
                    )
                    .unwrap();
                space.check_errors().unwrap();
                let mut wrong = [0u64];
                bad.download(0, &mut wrong).unwrap();
                let st = space.stats().unwrap();
                eprintln!("page {page:>6} ratio {ratio} {policy:?}: {st:?}");
                assert_eq!(
                    wrong[0], 0,
                    "page {page} ratio {ratio} {policy:?}: {} reads returned bytes that are not the page's (key {key:#x})",
                    wrong[0]
                );
                assert!(st.hits > 0, "no hit at all: {st:?}");
                if ratio > 1 {
                    assert!(st.evictions > 0 && st.writebacks > 0, "no eviction: {st:?}");
                }
                let mut back = vec![0u64; n];
                space.read_back(0, &mut back).unwrap();
                let differ = back.iter().zip(&values).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ, 0,
                    "page {page} ratio {ratio} {policy:?}: {differ} elements differ after flush"
                );
            }
        }
    }
}

/// Read-through: the first touch of each page is served from the host copy (no fault, no
/// frame), a second touch migrates it, and `evict` makes the next touch a first touch again;
/// every byte read either way is the page's.
#[test]
fn read_through_serves_first_touches_from_the_host_copy() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let check = module.function("check_pages").unwrap();
    let (page, cache) = (64u64 << 10, 4u64 << 20);
    let pages = 4 * cache / page;
    let key = seed();
    let n = (pages * page / 8) as usize;
    let values: Vec<u64> = (0..n as u64).map(|i| i ^ key).collect();
    let mut options = opts(page, cache, EvictionPolicy::Clock);
    options.read_through = true;
    let mut space = strata.space(pages * page, &options).unwrap();
    space.fill_from_slice(0, &values).unwrap();
    let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    let grid = check.full_grid(256).unwrap();
    let pass = |space: &strata_gpu::Space| {
        check
            .launch(
                grid,
                &Args::new().arg(space.handle()).arg(key).arg(bad.ptr()),
            )
            .unwrap();
        space.check_errors().unwrap();
        let st = space.stats().unwrap();
        eprintln!("{st:?}");
        st
    };
    let first = pass(&space);
    assert_eq!((first.read_through, first.faults), (pages, 0), "{first:?}");
    let second = pass(&space);
    assert_eq!(second.read_through, pages, "{second:?}");
    assert!(
        second.faults >= pages,
        "a second touch must migrate: {second:?}"
    );
    space.evict(0..pages * page).unwrap();
    let third = pass(&space);
    assert_eq!(
        third.read_through,
        2 * pages,
        "evict forgets history: {third:?}"
    );
    let mut wrong = [0u64];
    bad.download(0, &mut wrong).unwrap();
    assert_eq!(wrong[0], 0, "{} elements read through were wrong", wrong[0]);
}

#[test]
fn bad_options_are_refused_with_a_reason() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let e = strata
        .space(1 << 20, &opts(3000, 1 << 20, EvictionPolicy::Clock))
        .unwrap_err();
    assert!(matches!(e, SpaceError::Invalid(_)), "{e}");
    let (free, _) = strata.gpu().mem_info().unwrap();
    let e = strata.space(
        1 << 20,
        &opts(4096, free + (1 << 30), EvictionPolicy::Clock),
    );
    // A 1 MiB space caps the cache at its own size, so this succeeds; a huge space does not.
    assert!(e.is_ok());
    let e = strata
        .space(
            free * 2,
            &opts(2 << 20, free + (1 << 30), EvictionPolicy::Clock),
        )
        .unwrap_err();
    assert!(matches!(e, SpaceError::CacheTooLarge { .. }), "{e}");
}
