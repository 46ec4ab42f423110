//! GPU tests of remote access (`cuda/strata/remote.cuh`): element reads and writes of pages not
//! resident go over the bus in place until a page has earned a frame, then migrate. Pages
//! switch between the two modes all the time here (tiny thresholds, caches of a few frames,
//! spaces up to 8x the cache) while, in the same warps, lanes write their own elements in an
//! order-sensitive way, lanes add with atomics (which always migrate) and lanes read elements
//! nobody writes on the same pages. Every write must land exactly once, in order; every read
//! must see the right bytes. Without a CUDA driver each test prints `skipped: no CUDA driver`
//! and passes.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use strata_gpu::Space;
use strata_gpu::driver::{Args, DeviceBuffer, Function, Grid};
use strata_gpu::space::RemoteAccess;
use strata_gpu::{EvictionPolicy, SpaceOptions};

mod common;
use common::{check_mixed_lanes, opts, page_sums, random_words, replay, seed, strata_or_skip};

const KERNELS: &str = include_str!("remote_kernels.cu");

fn options(page: u64, cache: u64, remote: RemoteAccess) -> SpaceOptions {
    SpaceOptions {
        remote_access: remote,
        ..opts(page, cache, EvictionPolicy::Clock)
    }
}

/// Mixed lanes over spaces 1x, 2x and 8x caches of a few frames, with pages migrating after 2,
/// 3 or 16 accesses and with remote access off: the same exact result as a host replay, no
/// read ever wrong, and (when on) both modes really used.
#[test]
fn pages_switching_modes_mid_kernel_lose_no_write_and_serve_no_wrong_read() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "remote_kernels.cu").unwrap();
    let f = module.function("mixed_lanes").unwrap();
    let grid = Grid {
        blocks: 16,
        threads: 128,
    };
    let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    for (page, frames) in [(4u64 << 10, 16u64), (64 << 10, 8)] {
        for ratio in [1u64, 2, 8] {
            for remote in [
                RemoteAccess::MigrateAfter(2),
                RemoteAccess::MigrateAfter(3),
                RemoteAccess::MigrateAfter(16),
                RemoteAccess::Auto,
                RemoteAccess::ReadsOnly,
                RemoteAccess::Off,
            ] {
                let cache = frames * page;
                let bytes = cache * ratio;
                let n = (bytes / 8) as usize;
                let s = seed();
                let start = random_words(n, s);
                let mut space = strata.space(bytes, &options(page, cache, remote)).unwrap();
                let what = format!("page {page} ratio {ratio} {remote:?} seed {s:#x}");
                let st = check_mixed_lanes(&f, grid, &mut space, &start, 24, s, &bad, &what);
                assert_eq!(
                    st.fault_hist.count(),
                    st.faults,
                    "{what}: histogram counts every fault"
                );
                match remote {
                    RemoteAccess::Off => {
                        assert_eq!(st.remote_reads + st.remote_writes, 0, "{what}");
                    }
                    RemoteAccess::ReadsOnly => {
                        assert_eq!(st.remote_writes, 0, "{what}: a write went in place");
                        if ratio == 8 {
                            assert!(st.remote_reads > 0 && st.faults > 0, "{what}");
                        }
                    }
                    // A space the cache holds whole soon has every page resident.
                    _ if ratio < 8 => {}
                    _ => {
                        assert!(
                            st.remote_reads > 0 && st.remote_writes > 0,
                            "{what}: never remote"
                        );
                        assert!(st.faults > 0, "{what}: never migrated");
                    }
                }
            }
        }
    }
}

/// Over a space 8x its cache: sparse reads (about one per page) are served in place and return
/// exactly the host copy's bytes; dense reads make pages migrate; `evict` forgets the counts,
/// so the next sparse pass is in place again; writers afterwards still match a host replay.
#[test]
fn remote_reads_return_the_host_copy_and_counts_decay_into_migration() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "remote_kernels.cu").unwrap();
    let f = module.function("mixed_lanes").unwrap();
    let read = strata
        .compile(include_str!("gpu_kernels.cu"), "gpu_kernels.cu")
        .unwrap()
        .function("read_random")
        .unwrap();
    // Few threads for the sparse passes (about one read per page), the full grid for the dense.
    let sparse = Grid {
        blocks: 16,
        threads: 256,
    };
    let grid = read.full_grid(256).unwrap();
    let (page, cache) = (4u64 << 10, 4u64 << 20);
    let bytes = 8 * cache;
    let n = (bytes / 8) as usize;
    let s = seed();
    let start = random_words(n, s);
    let mut space = strata
        .space(bytes, &options(page, cache, RemoteAccess::MigrateAfter(8)))
        .unwrap();
    space.fill_from_slice(0, &start).unwrap();
    // A few reads per page: nearly all in place, hardly a fault.
    common::check_read_random(&read, &space, sparse, &start, 2, s, "sparse reads");
    let st = space.stats().unwrap();
    eprintln!("sparse: {st:?}");
    let reads = u64::from(sparse.blocks) * u64::from(sparse.threads) * 2;
    assert!(
        st.remote_reads * 4 > reads * 3,
        "sparse reads mostly remote: {st:?}"
    );
    // Many reads per page: pages earn frames.
    space.reset_stats().unwrap();
    common::check_read_random(&read, &space, grid, &start, 64, s ^ 1, "dense reads");
    let st = space.stats().unwrap();
    eprintln!("dense: {st:?}");
    assert!(
        st.faults > 0 && st.hits > 0,
        "dense reads migrate pages: {st:?}"
    );
    // Evict forgets the counts: the next sparse pass is remote again.
    space.evict(0..bytes).unwrap();
    space.reset_stats().unwrap();
    common::check_read_random(&read, &space, sparse, &start, 1, s ^ 2, "after evict");
    let st = space.stats().unwrap();
    eprintln!("after evict: {st:?}");
    assert!(
        st.remote_reads * 4 > u64::from(sparse.blocks) * u64::from(sparse.threads) * 3,
        "{st:?}"
    );
    // And writers over it still match the replay.
    let small = Grid {
        blocks: 32,
        threads: 256,
    };
    let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    f.launch(
        small,
        &Args::new()
            .arg(space.handle())
            .arg(16u64)
            .arg(s ^ 9)
            .arg(s.rotate_left(17))
            .arg(bad.ptr()),
    )
    .unwrap();
    space.check_errors().unwrap();
    let mut wrong = [0u64];
    bad.download(0, &mut wrong).unwrap();
    assert_eq!(wrong[0], 0);
    let mut back = vec![0u64; n];
    space.read_back(0, &mut back).unwrap();
    assert!(
        back == replay(&start, 32 * 256, 16, s ^ 9),
        "writers after reads differ"
    );
}

/// Every warp has lanes in two spaces at once (thread t in space (t >> 2) & 1), the spaces
/// differing in page size, cache and remote-access mode, down to caches of two frames (all
/// element access needs): each space ends exactly as a host replay of its own lanes, and no
/// read of a never-written element is wrong.
#[test]
fn warps_mixing_two_spaces_with_remote_access_and_two_frame_caches() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "remote_kernels.cu").unwrap();
    let f = module.function("mixed_lanes_two_spaces").unwrap();
    let grid = Grid {
        blocks: 8,
        threads: 128,
    };
    let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    // (page, frames, ratio, remote) of space 0 and of space 1.
    let cases = [
        (
            (4u64 << 10, 2u64, 8u64, RemoteAccess::Auto),
            (64u64 << 10, 2u64, 4u64, RemoteAccess::Off),
        ),
        (
            (4 << 10, 2, 8, RemoteAccess::MigrateAfter(2)),
            (4 << 10, 16, 2, RemoteAccess::MigrateAfter(16)),
        ),
        (
            (64 << 10, 4, 8, RemoteAccess::Auto),
            (4 << 10, 2, 1, RemoteAccess::Auto),
        ),
    ];
    for (a, b) in cases {
        let s = seed();
        let mut spaces = Vec::new();
        let mut starts = Vec::new();
        for (k, &(page, frames, ratio, remote)) in [a, b].iter().enumerate() {
            let cache = frames * page;
            let bytes = cache * ratio;
            let start = random_words((bytes / 8) as usize, s ^ k as u64);
            let mut space = strata.space(bytes, &options(page, cache, remote)).unwrap();
            space.fill_from_slice(0, &start).unwrap();
            spaces.push(space);
            starts.push(start);
        }
        let what = format!("{a:?} + {b:?} seed {s:#x}");
        common::check_two_spaces(&f, grid, &spaces, &starts, s, &bad, &what);
    }
}

/// The grid `rmw_owned` runs with in the page-read tests (8 ops per thread).
const WRITERS: Grid = Grid {
    blocks: 4,
    threads: 128,
};

/// The page-read tests' kernels: this file's module, and `rmw_owned` (the writers).
fn page_read_kernels(strata: &strata_gpu::Strata) -> (strata_gpu::KernelModule, Function) {
    let module = strata.compile(KERNELS, "remote_kernels.cu").unwrap();
    let writers = strata
        .compile(include_str!("gpu_kernels.cu"), "gpu_kernels.cu")
        .unwrap()
        .function("rmw_owned")
        .unwrap();
    (module, writers)
}

/// The grid of the page-read kernels (one warp per page, grid-stride).
const READERS: Grid = Grid {
    blocks: 8,
    threads: 128,
};

/// Runs `rmw_owned` (`writers`) over `space` with `seed` and replays it on `want`.
fn write_pass(writers: &Function, space: &Space, want: &mut [u64], seed: u64) {
    writers
        .launch(
            WRITERS,
            &Args::new().arg(space.handle()).arg(8u64).arg(seed),
        )
        .unwrap();
    let threads = u64::from(WRITERS.blocks) * u64::from(WRITERS.threads);
    common::replay_rmw_owned(want, threads, 8, seed);
}

/// A space 4x a cache of 8 pages of `page` bytes, filled with fresh random words, after
/// `rmw_owned` left some pages dirty in frames and others written back: the space and the
/// words it must hold.
fn space_after_writers(
    strata: &strata_gpu::Strata,
    writers: &Function,
    page: u64,
    remote: RemoteAccess,
    s: u64,
) -> (Space, Vec<u64>) {
    let cache = 8 * page;
    let bytes = 4 * cache;
    let mut want = random_words((bytes / 8) as usize, s);
    let mut space = strata.space(bytes, &options(page, cache, remote)).unwrap();
    space.fill_from_slice(0, &want).unwrap();
    write_pass(writers, &space, &mut want, s ^ 3);
    space.check_errors().unwrap();
    (space, want)
}

/// Runs `page_sums` (`sums_fn`) over `space` with `read_mode`; checks errors; the sums.
fn run_page_sums(
    sums_fn: &Function,
    space: &Space,
    read_mode: u32,
    sums: &DeviceBuffer,
) -> Vec<u64> {
    sums_fn
        .launch(
            READERS,
            &Args::new()
                .arg(space.handle())
                .arg(read_mode)
                .arg(sums.ptr()),
        )
        .unwrap();
    space.check_errors().unwrap();
    let mut got = vec![0u64; (space.size() / space.page_size()) as usize];
    sums.download(0, &mut got).unwrap();
    got
}

/// `acquire_page` with `STRATA_READ_IN_PLACE` over a space 4x its cache, after writers left
/// some pages dirty in frames and others written back: every page reads its current bytes
/// (resident ones from their frames, the rest from the host copy), nothing migrates, and the
/// pages read in place are counted as remote reads. The same pass with `STRATA_READ_MIGRATE`
/// faults pages in and reads the same sums.
#[test]
fn page_reads_in_place_see_current_bytes_and_move_nothing() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let (module, writers) = page_read_kernels(&strata);
    let sums_fn = module.function("page_sums").unwrap();
    for (page, remote) in [
        (4u64 << 10, RemoteAccess::Off),
        (64 << 10, RemoteAccess::Auto),
    ] {
        let s = seed();
        let (space, want) = space_after_writers(&strata, &writers, page, remote, s);
        let pages = want.len() / (page / 8) as usize;
        let expected = page_sums(&want, page);
        let sums = DeviceBuffer::zeroed(strata.gpu(), pages * 8).unwrap();
        let what = format!("page {page} {remote:?} seed {s:#x}");
        for (mode, name) in [(2u32, "in place"), (0u32, "migrate")] {
            space.reset_stats().unwrap();
            let got = run_page_sums(&sums_fn, &space, mode, &sums);
            let st = space.stats().unwrap();
            let first = got.iter().zip(&expected).position(|(g, e)| g != e);
            assert_eq!(first, None, "{what}, {name}: page sums differ");
            eprintln!(
                "{what}, {name}: faults {} hits {} remote reads {}",
                st.faults, st.hits, st.remote_reads
            );
            if mode == 2 {
                assert_eq!(st.faults, 0, "{what}: reads in place moved pages");
                assert!(
                    st.remote_reads >= (pages - 8) as u64,
                    "{what}: pages not resident were not read in place: {st:?}"
                );
            } else {
                assert!(st.faults > 0, "{what}: a migrating pass faulted nothing");
            }
        }
    }
}

/// A read-only space (`Space::set_read_only`) after writers left pages dirty in frames: the
/// call writes them down, then page reads in place, with remote access and migrating all see
/// the current bytes; lanes that acquire a page for writing, element writes and atomics are
/// refused (`WroteReadOnly`, nothing written) while the readers of the same warps go on; made
/// writable again, the same kernel writes.
#[test]
fn a_read_only_space_refuses_writes_and_reads_current_bytes() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let (module, writers) = page_read_kernels(&strata);
    let sums_fn = module.function("page_sums").unwrap();
    let mixed_fn = module.function("page_readers_and_writers").unwrap();
    for (page, remote) in [
        (4u64 << 10, RemoteAccess::Auto),
        (64 << 10, RemoteAccess::MigrateAfter(2)),
    ] {
        let s = seed();
        let what = format!("page {page} {remote:?} seed {s:#x}");
        let (mut space, mut want) = space_after_writers(&strata, &writers, page, remote, s);
        let n = want.len();
        let words = (page / 8) as usize;
        let pages = n / words;
        assert!(!space.is_read_only());
        space.set_read_only(true).unwrap();
        assert!(space.is_read_only());
        let sums = DeviceBuffer::zeroed(strata.gpu(), pages * 8).unwrap();
        // Twice in place (pages resident from the writers stay in their frames), once with
        // remote access, once migrating, then in place again over the migrated cache.
        for mode in [2u32, 2, 1, 0, 2] {
            assert_eq!(
                run_page_sums(&sums_fn, &space, mode, &sums),
                page_sums(&want, page),
                "{what}: read-only sums, read mode {mode}"
            );
        }
        let dirtied = space.stats().unwrap().pages_dirtied;
        assert!(dirtied > 0, "{what}: the writers dirtied no page");
        // Writers are refused, and write nothing; readers in the same warps read right.
        let done = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
        let mixed = |space: &strata_gpu::Space| {
            mixed_fn
                .launch(
                    READERS,
                    &Args::new()
                        .arg(space.handle())
                        .arg(sums.ptr())
                        .arg(done.ptr()),
                )
                .unwrap();
        };
        mixed(&space);
        let err = space.check_errors().unwrap_err();
        assert!(
            matches!(err, strata_gpu::SpaceError::WroteReadOnly { page } if (page as usize) < pages),
            "{what}: {err}"
        );
        assert!(err.to_string().contains("set_read_only(false)"), "{err}");
        let mut d = [0u64];
        done.download(0, &mut d).unwrap();
        assert_eq!(
            d[0], 0,
            "{what}: a writer's acquire succeeded in a read-only space"
        );
        let mut got = vec![0u64; pages];
        sums.download(0, &mut got).unwrap();
        // The 16 reading lanes cover every word of the page (lane / 2 + 16 k).
        assert_eq!(
            got,
            page_sums(&want, page),
            "{what}: readers beside refused writers"
        );
        let mut unchanged = want.clone();
        write_pass(&writers, &space, &mut unchanged, s ^ 5);
        assert!(matches!(
            space.check_errors(),
            Err(strata_gpu::SpaceError::WroteReadOnly { .. })
        ));
        let mut back = vec![0u64; n];
        space.read_back(0, &mut back).unwrap();
        assert!(back == want, "{what}: a refused write changed the space");
        assert_eq!(
            space.stats().unwrap().pages_dirtied,
            dirtied,
            "{what}: a page became dirty in a read-only space"
        );
        // Writable again: the same kernels write.
        space.set_read_only(false).unwrap();
        write_pass(&writers, &space, &mut want, s ^ 5);
        space.check_errors().unwrap();
        mixed(&space);
        space.check_errors().unwrap();
        done.download(0, &mut d).unwrap();
        assert_eq!(d[0], 16 * pages as u64, "{what}: writers once writable");
        assert!(
            space.stats().unwrap().pages_dirtied > dirtied,
            "{what}: writes once writable dirtied no page"
        );
        space.read_back(0, &mut back).unwrap();
        for chunk in want.chunks_mut(words) {
            for w in (1..32).step_by(2) {
                chunk[w] = chunk[w].wrapping_add(1);
            }
        }
        assert!(back == want, "{what}: writes after set_read_only(false)");
    }
}
