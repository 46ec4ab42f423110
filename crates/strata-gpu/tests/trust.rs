//! GPU tests of the "trust before breadth" defects (issue 10): lanes of a group that differ in
//! read/write, lanes of one warp in two spaces, more pins than frames (scan-resistant and
//! clock), host maintenance against kernels of other streams and handles, page indices past
//! the end, and host drop order. Without a CUDA driver each test prints `skipped: no CUDA
//! driver` and passes. Fresh random data every run; the seed is printed.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use std::time::{Duration, Instant};

use strata_gpu::driver::{Args, DeviceBuffer, Grid, Stream};
use strata_gpu::{EvictionPolicy, Space, SpaceError, SpaceOptions, Strata};

mod common;
use common::{mix, opts, random_words, seed, strata_or_skip};

const KERNELS: &str = include_str!("trust_kernels.cu");

fn filled(strata: &Strata, bytes: u64, o: &SpaceOptions, seed: u64) -> (Space, Vec<u64>) {
    let mut space = strata.space(bytes, o).unwrap();
    let data = random_words((bytes / 8) as usize, seed);
    space.fill_from_slice(0, &data).unwrap();
    (space, data)
}

fn read_all(space: &Space) -> Vec<u64> {
    let mut back = vec![0u64; (space.size() / 8) as usize];
    space.read_back(0, &mut back).unwrap();
    back
}

fn grid(blocks: u32, threads: u32) -> Grid {
    Grid { blocks, threads }
}

/// Lost writes: a group whose leader (lane 0) only reads while other lanes write must pin for
/// writing, or eviction drops the writes. 16x oversubscription, 4 KiB pages, both policies.
#[test]
fn a_group_writes_if_any_lane_writes() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let k = module.function("mixed_rw").unwrap();
    for policy in [
        EvictionPolicy::Clock,
        EvictionPolicy::ScanResistant {
            protected_fraction: 0.5,
        },
    ] {
        let s = seed();
        let (page, pages) = (4096u64, 4096u64);
        let (space, mut reference) = filled(&strata, page * pages, &opts(page, 1 << 20, policy), s);
        // Writers: a random non-empty set of lanes, never lane 0 (the group's leader).
        let writers = ((mix(s) as u32) | 2) & !1;
        let (blocks, threads, rounds) = (64u32, 64u32, 64u64);
        let warps = u64::from(blocks * threads / 32);
        k.launch(
            grid(blocks, threads),
            &Args::new()
                .arg(space.handle())
                .arg(rounds)
                .arg(s)
                .arg(writers),
        )
        .unwrap();
        space.check_errors().unwrap();
        for w in 0..warps {
            let mine = (pages - w).div_ceil(warps);
            for r in 0..rounds {
                let p = w + warps * (mix(s ^ (w << 24) ^ r) % mine);
                for lane in 0..32u64 {
                    if writers >> lane & 1 == 1 {
                        reference[(p * 512 + lane) as usize] = mix(s ^ (p << 20) ^ (r << 8) ^ lane);
                    }
                }
            }
        }
        let back = read_all(&space);
        let lost = back.iter().zip(&reference).filter(|(a, b)| a != b).count();
        let st = space.stats().unwrap();
        assert_eq!(
            lost, 0,
            "{policy:?}: {lost} words differ (writers {writers:#x}, {} evictions)",
            st.evictions
        );
        assert!(
            st.evictions > 0,
            "{policy:?}: the test must evict to mean anything"
        );
    }
}

/// Wrong data with several spaces: lanes of one warp use the same page number in two spaces
/// (chosen per element or per lane), through the element API and through acquire.
#[test]
fn lanes_of_one_warp_in_two_spaces_keep_them_apart() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let elements = module.function("two_spaces_elements").unwrap();
    let pages_k = module.function("two_spaces_pages").unwrap();
    let s = seed();
    let bytes = 8u64 << 20;
    let (a, mut ra) = filled(
        &strata,
        bytes,
        &opts(4096, 256 << 10, EvictionPolicy::Clock),
        s,
    );
    let (b, mut rb) = filled(
        &strata,
        bytes,
        &opts(4096, 512 << 10, EvictionPolicy::Clock),
        !s,
    );
    elements
        .launch(
            elements.full_grid(256).unwrap(),
            &Args::new().arg(a.handle()).arg(b.handle()).arg(s),
        )
        .unwrap();
    a.check_errors().unwrap();
    b.check_errors().unwrap();
    for i in 0..bytes / 8 {
        let r = if mix(s ^ i) & 1 == 1 {
            &mut ra
        } else {
            &mut rb
        };
        r[i as usize] = r[i as usize].wrapping_mul(3).wrapping_add(i);
    }
    assert!(read_all(&a) == ra, "space a differs after element updates");
    assert!(read_all(&b) == rb, "space b differs after element updates");
    // Page-granular, 16x and 32x oversubscribed: 32 warps, each holding at most one pin per
    // space (fewer than either cache's frames, as the rules in strata.cuh ask).
    let s2 = mix(s);
    a.evict(0..bytes).unwrap();
    pages_k
        .launch(
            grid(4, 256),
            &Args::new().arg(a.handle()).arg(b.handle()).arg(s2),
        )
        .unwrap();
    a.check_errors().unwrap();
    b.check_errors().unwrap();
    for p in 0..bytes / 4096 {
        for lane in 0..32u64 {
            let r = if mix(s2 ^ (p << 5) ^ lane) & 1 == 1 {
                &mut ra
            } else {
                &mut rb
            };
            let i = (p * 512 + lane) as usize;
            r[i] = r[i].wrapping_add(lane + 1);
        }
    }
    assert!(read_all(&a) == ra, "space a differs after page updates");
    assert!(read_all(&b) == rb, "space b differs after page updates");
}

/// Runs `many_pins` (one warp, `distinct` pages pinned at once) and returns, per lane, how
/// many of its accesses succeeded, plus the kernel's duration including check_errors.
fn many_pins(
    strata: &Strata,
    module: &strata_gpu::KernelModule,
    space: &Space,
    distinct: u32,
    rounds: u64,
    s: u64,
) -> (Vec<u64>, Result<(), SpaceError>, Duration) {
    let k = module.function("many_pins").unwrap();
    let ok = DeviceBuffer::zeroed(strata.gpu(), 32 * 8).unwrap();
    let t = Instant::now();
    k.launch(
        grid(1, 32),
        &Args::new()
            .arg(space.handle())
            .arg(distinct)
            .arg(rounds)
            .arg(s)
            .arg(ok.ptr()),
    )
    .unwrap();
    let r = space.check_errors();
    let took = t.elapsed();
    let mut counts = vec![0u64; 32];
    ok.download(0, &mut counts).unwrap();
    (counts, r, took)
}

/// Hang (a): with the scan-resistant policy at 0.75 protected (64 frames, 16 probationary), a
/// warp that pins 32 pages at once used to spin forever once the protected segment was full.
/// Now the last lap of a sweep takes protected frames too: every access succeeds, correctly.
#[test]
fn scan_resistant_warp_pinning_more_than_the_probationary_segment_progresses() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let warm = module.function("warm_pages").unwrap();
    let s = seed();
    let policy = EvictionPolicy::ScanResistant {
        protected_fraction: 0.75,
    };
    let (space, mut reference) = filled(&strata, 1024 * 4096, &opts(4096, 64 * 4096, policy), s);
    space.set_wait_limit(Duration::from_secs(3)).unwrap();
    let sink = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    warm.launch(
        grid(1, 32),
        &Args::new()
            .arg(space.handle())
            .arg(80u64)
            .arg(8u64)
            .arg(sink.ptr()),
    )
    .unwrap();
    space.check_errors().unwrap();
    let protected = space.stats().unwrap().protected_frames;
    eprintln!("protected frames after warm-up: {protected} of 64");
    assert!(
        protected > 32,
        "the warm-up must leave fewer probationary frames than the 32 pins to test anything"
    );
    let rounds = 40;
    let (counts, r, took) = many_pins(&strata, &module, &space, 32, rounds, s);
    eprintln!("32 pins x {rounds} rounds took {took:?}");
    r.unwrap();
    assert!(
        counts.iter().all(|&c| c == rounds),
        "per-lane successes {counts:?}"
    );
    for round in 0..rounds {
        let base = mix(s ^ round) % (1024 - 32 + 1);
        for lane in 0..32u64 {
            let p = base + lane;
            reference[(p * 512 + lane) as usize] = p * 1000 + lane;
        }
    }
    assert!(
        read_all(&space) == reference,
        "pinned writes differ from the reference"
    );
}

/// Hang (b): three pages pinned at once in a two-frame cache used to loop forever
/// (STRATA_ERR_NO_FRAME was never raised). Now the warp gives up after the wait limit and
/// check_errors returns NoFrame with the page; two pins in the same cache still succeed.
#[test]
fn more_pins_than_frames_is_a_no_frame_error_not_a_hang() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    for policy in [
        EvictionPolicy::Clock,
        EvictionPolicy::ScanResistant {
            protected_fraction: 0.5,
        },
    ] {
        let s = seed();
        let (space, _) = filled(&strata, 8 * 4096, &opts(4096, 2 * 4096, policy), s);
        assert_eq!(space.frames(), 2);
        space.set_wait_limit(Duration::from_millis(200)).unwrap();
        let (counts, r, took) = many_pins(&strata, &module, &space, 3, 1, s);
        eprintln!("{policy:?}: 3 pins in 2 frames ended after {took:?}: {r:?}");
        match r {
            Err(e @ SpaceError::NoFrame { page, frames, .. }) => {
                assert!(page < 8, "page {page}");
                assert_eq!(frames, 2);
                let msg = e.to_string();
                assert!(msg.contains("larger cache"), "{msg}");
            }
            other => panic!("{policy:?}: expected NoFrame, got {other:?}"),
        }
        assert!(
            took < Duration::from_secs(20),
            "the wait is bounded: {took:?}"
        );
        assert!(
            counts.contains(&0),
            "some lane must have failed: {counts:?}"
        );
        space.check_errors().unwrap(); // reported once, then cleared
        let (counts, r, _) = many_pins(&strata, &module, &space, 2, 20, s);
        r.unwrap();
        assert!(counts.iter().all(|&c| c == 20), "{policy:?}: {counts:?}");
    }
}

/// Page indices past the end: acquire, acquire_page and view_page record the first bad page,
/// give the lane a failed access, and touch nothing (the space reads back unchanged but for
/// the in-range lanes' own writes).
#[test]
fn out_of_range_pages_are_errors_that_touch_nothing() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let k = module.function("page_oob").unwrap();
    let pages = 64u64;
    for (mode, first) in [
        (0i32, pages - 16),
        (1, pages - 16),
        (2, pages - 16),
        (1, u64::MAX - 40),
    ] {
        let s = seed();
        // A cache as large as the space: after the prefetch (mode 2) every page is resident.
        let (space, mut reference) = filled(
            &strata,
            pages * 4096,
            &opts(4096, pages * 4096, EvictionPolicy::Clock),
            s,
        );
        if mode == 2 {
            space.prefetch(0..space.size()).unwrap();
        }
        let out = DeviceBuffer::zeroed(strata.gpu(), 64 * 8).unwrap();
        k.launch(
            grid(1, 32),
            &Args::new()
                .arg(space.handle())
                .arg(first)
                .arg(mode)
                .arg(out.ptr()),
        )
        .unwrap();
        let bad = first.max(pages);
        match space.check_errors() {
            Err(SpaceError::PageOutOfRange { page, pages: n, .. }) => {
                assert_eq!((page, n), (bad, pages), "mode {mode}");
            }
            other => panic!("mode {mode}: expected PageOutOfRange, got {other:?}"),
        }
        let mut got = vec![0u64; 64];
        out.download(0, &mut got).unwrap();
        for lane in 0..32u64 {
            let in_range = first.checked_add(lane).is_some_and(|p| p < pages);
            assert_eq!(
                got[lane as usize],
                if in_range { 1 } else { 2 },
                "mode {mode} lane {lane}"
            );
            if in_range && mode != 2 {
                reference[((first + lane) * 512 + lane) as usize] ^= 0xFF;
            }
        }
        assert!(
            read_all(&space) == reference,
            "mode {mode}: the space changed beyond the valid lanes' writes"
        );
    }
}

/// Expected contents after `slow_writer` with `passes` passes.
fn written(words: u64, passes: u64, s: u64) -> Vec<u64> {
    (0..words)
        .map(|i| mix(s ^ i).wrapping_add(passes - 1))
        .collect()
}

/// Maintenance ordering: a long writer launched through a second Strata handle (its own
/// stream) or on a user's stream is waited for by read_back and evict of the first handle's
/// space (read_back used to return unwritten data; evict retired pinned pages).
#[test]
fn maintenance_waits_for_kernels_of_other_streams_and_handles() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let other = Strata::new(0).unwrap();
    let module_other = other.compile(KERNELS, "trust_kernels.cu").unwrap();
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let bytes = 8u64 << 20;
    let passes = 400u64;
    // Second handle, then read_back at once.
    let s = seed();
    let (space, _) = filled(
        &strata,
        bytes,
        &opts(4096, 2 << 20, EvictionPolicy::Clock),
        s,
    );
    let k = module_other.function("slow_writer").unwrap();
    let t = Instant::now();
    k.launch(
        grid(8, 128),
        &Args::new().arg(space.handle()).arg(passes).arg(s),
    )
    .unwrap();
    let back = read_all(&space);
    eprintln!("second handle: read_back returned after {:?}", t.elapsed());
    assert!(
        back == written(bytes / 8, passes, s),
        "read_back did not wait for the other handle's kernel"
    );
    space.check_errors().unwrap();
    // User stream, then evict at once, then read_back.
    let s = mix(s);
    let stream = Stream::new(strata.gpu()).unwrap();
    let k = module.function("slow_writer").unwrap();
    let t = Instant::now();
    k.launch_on(
        grid(8, 128),
        &Args::new().arg(space.handle()).arg(passes).arg(s),
        Some(&stream),
    )
    .unwrap();
    space.evict(0..bytes).unwrap();
    eprintln!("user stream: evict returned after {:?}", t.elapsed());
    assert!(
        read_all(&space) == written(bytes / 8, passes, s),
        "evict did not wait for the user stream's kernel"
    );
    space.check_errors().unwrap();
}

/// Host lifetimes: a space outlives the Strata that made it (flush, evict and prefetch still
/// launch loaded kernels), and dropping a space waits for a kernel still using it.
#[test]
fn drop_order_is_safe() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let s = seed();
    let module = strata.compile(KERNELS, "trust_kernels.cu").unwrap();
    let k = module.function("slow_writer").unwrap();
    drop(module); // the function keeps its module loaded
    let bytes = 4u64 << 20;
    let (space, _) = filled(
        &strata,
        bytes,
        &opts(4096, 1 << 20, EvictionPolicy::Clock),
        s,
    );
    k.launch(
        grid(8, 128),
        &Args::new().arg(space.handle()).arg(3u64).arg(s),
    )
    .unwrap();
    let gpu = strata.gpu().clone();
    drop(strata);
    space.flush().unwrap();
    space.evict(0..bytes).unwrap();
    space.prefetch(0..bytes).unwrap();
    assert!(
        read_all(&space) == written(bytes / 8, 3, s),
        "maintenance after dropping Strata"
    );
    // Drop a space while a long kernel writes it on another stream: the drop waits, so the
    // context stays healthy (a freed page table under a running kernel would fault it).
    let stream = Stream::new(&gpu).unwrap();
    k.launch_on(
        grid(8, 128),
        &Args::new().arg(space.handle()).arg(200u64).arg(s),
        Some(&stream),
    )
    .unwrap();
    let t = Instant::now();
    drop(space);
    eprintln!(
        "dropping a space under a running kernel took {:?}",
        t.elapsed()
    );
    gpu.synchronize_context()
        .expect("the context must be healthy after the drop");
    let strata = Strata::new(0).unwrap();
    let (space, data) = filled(
        &strata,
        1 << 20,
        &opts(4096, 1 << 20, EvictionPolicy::Clock),
        !s,
    );
    assert!(read_all(&space) == data);
    space.check_errors().unwrap();
}
