//! GPU tests of sub-page fetch (`cuda/strata/sectors.cuh`, `SpaceOptions::sector_bytes`):
//! element accesses that miss load only the sectors their warp touches, and further sectors
//! are loaded into resident pages as accesses need them, while other warps of the same kernel
//! read and write the same pages, pages are evicted with only some sectors held (dirty or
//! not), and whole-page access (acquire_page) asks for the rest. Every write must land exactly
//! once, every read must see the right bytes, and the host copy must end equal to a host
//! replay. Without a CUDA driver each test prints `skipped: no CUDA driver` and passes.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use strata_gpu::driver::{Args, DeviceBuffer, Grid};
use strata_gpu::space::RemoteAccess;
use strata_gpu::{EvictionPolicy, SpaceError, SpaceOptions};

mod common;
use common::{check_mixed_lanes, opts, page_sums, random_words, replay, seed, strata_or_skip};

const KERNELS: &str = include_str!("remote_kernels.cu");

fn options(page: u64, frames: u64, sector: Option<u64>, remote: RemoteAccess) -> SpaceOptions {
    SpaceOptions {
        remote_access: remote,
        sector_bytes: sector,
        ..opts(page, frames * page, EvictionPolicy::Clock)
    }
}

/// Mixed lanes (order-sensitive read-then-write owners, atomic adders, readers of
/// never-written elements, all in the same warps and pages) over spaces 1x, 2x and 8x caches
/// of a few frames, with sectors of several sizes and remote access off, migrating after 2
/// accesses, and automatic: the host copy ends exactly as a host replay, no read is wrong, and
/// with remote access off over a space larger than the cache the faults really load part
/// pages and resident pages really gain sectors.
#[test]
fn sectors_lose_no_write_and_serve_no_wrong_read() {
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
    // (page, frames, sector): 16 and 32 sectors a page, 2 a page, and a sector raised to a
    // 32nd of the page.
    let geometries = [
        (64u64 << 10, 8u64, 4u64 << 10),
        (64 << 10, 8, 512),
        (16 << 10, 16, 8 << 10),
        (8 << 10, 4, 1 << 10),
    ];
    for (page, frames, sector) in geometries {
        for ratio in [1u64, 2, 8] {
            for remote in [
                RemoteAccess::Off,
                RemoteAccess::MigrateAfter(2),
                RemoteAccess::Auto,
            ] {
                let bytes = frames * page * ratio;
                let n = (bytes / 8) as usize;
                let s = seed();
                let start = random_words(n, s);
                let o = options(page, frames, Some(sector), remote);
                let mut space = strata.space(bytes, &o).unwrap();
                let what = format!(
                    "page {page} sector {sector} ({:?} in use) ratio {ratio} {remote:?} seed {s:#x}",
                    o.sector_for(page)
                );
                let st = check_mixed_lanes(&f, grid, &mut space, &start, 24, s, &bad, &what);
                if remote == RemoteAccess::Off && ratio > 1 {
                    assert!(
                        st.bytes_in < st.faults * page,
                        "{what}: faults loaded whole pages: {st:?}"
                    );
                    assert!(
                        st.sector_fills > 0,
                        "{what}: no resident page gained a sector: {st:?}"
                    );
                }
            }
        }
    }
}

/// Warps whose lanes work in two spaces at once (thread t in space (t >> 2) & 1), one with
/// sectors and one without, or both with different sector sizes, down to caches of two frames:
/// each space ends exactly as a host replay of its own lanes.
#[test]
fn warps_mixing_a_sectored_and_a_whole_page_space() {
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
    // (page, frames, ratio, sector, remote) of space 0 and of space 1.
    type Side = (u64, u64, u64, Option<u64>, RemoteAccess);
    let cases: [(Side, Side); 3] = [
        (
            (64 << 10, 2, 8, Some(4 << 10), RemoteAccess::Off),
            (4 << 10, 2, 8, None, RemoteAccess::Auto),
        ),
        (
            (32 << 10, 4, 4, Some(1 << 10), RemoteAccess::MigrateAfter(2)),
            (64 << 10, 2, 4, Some(16 << 10), RemoteAccess::Off),
        ),
        (
            (64 << 10, 3, 2, None, RemoteAccess::Off),
            (16 << 10, 2, 8, Some(2 << 10), RemoteAccess::Auto),
        ),
    ];
    for (a, b) in cases {
        let s = seed();
        let mut spaces = Vec::new();
        let mut starts = Vec::new();
        for (k, &(page, frames, ratio, sector, remote)) in [a, b].iter().enumerate() {
            let bytes = frames * page * ratio;
            let start = random_words((bytes / 8) as usize, s ^ k as u64);
            let mut space = strata
                .space(bytes, &options(page, frames, sector, remote))
                .unwrap();
            space.fill_from_slice(0, &start).unwrap();
            spaces.push(space);
            starts.push(start);
        }
        let what = format!("{a:?} + {b:?} seed {s:#x}");
        common::check_two_spaces(&f, grid, &spaces, &starts, s, &bad, &what);
    }
}

/// After element writers leave pages in frames with only some sectors held (some dirty), whole
/// page reads (`acquire_page`, migrating and in place) see every byte of every page; then
/// `write_down_pages` writes down only the held sectors of the dirty pages, and the host copy
/// equals the replay (sectors never loaded keep the host copy's bytes, not the frame's).
#[test]
fn whole_page_access_and_write_down_see_part_pages_whole() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "remote_kernels.cu").unwrap();
    let mixed = module.function("mixed_lanes").unwrap();
    let sums_fn = module.function("page_sums").unwrap();
    let grid = Grid {
        blocks: 4,
        threads: 64,
    };
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    let bad = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    for (page, sector, ratio) in [(64u64 << 10, 4u64 << 10, 4u64), (16 << 10, 2 << 10, 2)] {
        let frames = 16u64;
        let bytes = frames * page * ratio;
        let n = (bytes / 8) as usize;
        let pages = (bytes / page) as usize;
        let s = seed();
        let what = format!("page {page} sector {sector} ratio {ratio} seed {s:#x}");
        let start = random_words(n, s);
        let mut space = strata
            .space(
                bytes,
                &options(page, frames, Some(sector), RemoteAccess::Off),
            )
            .unwrap();
        space.fill_from_slice(0, &start).unwrap();
        let ops = 4u64;
        mixed
            .launch(
                grid,
                &Args::new()
                    .arg(space.handle())
                    .arg(ops)
                    .arg(s ^ 0x99)
                    .arg(s.rotate_left(17))
                    .arg(bad.ptr()),
            )
            .unwrap();
        space.check_errors().unwrap();
        let want = replay(&start, threads, ops, s ^ 0x99);
        let table = space.page_table().unwrap();
        let dirty_pages: Vec<u64> = table
            .iter()
            .enumerate()
            .filter(|(_, w)| {
                let w = strata_gpu::layout::PageWord::decode(**w);
                w.state == strata_gpu::layout::RESIDENT && w.dirty
            })
            .map(|(p, _)| p as u64)
            .collect();
        assert!(!dirty_pages.is_empty(), "{what}: no page left dirty");
        // Part pages written down: the host copy is the replay on those pages.
        let written = space.write_down_pages(&dirty_pages).unwrap();
        assert_eq!(written, dirty_pages, "{what}");
        let host = space.host_bytes();
        let words = (page / 8) as usize;
        for &p in &dirty_pages {
            let at = p as usize * words;
            let got: &[u64] = bytemuck::cast_slice(&host[at * 8..(at + words) * 8]);
            assert!(
                got == &want[at..at + words],
                "{what}: page {p} written down wrong"
            );
        }
        let sums = DeviceBuffer::zeroed(strata.gpu(), pages * 8).unwrap();
        for mode in [0u32, 2, 0] {
            space.reset_stats().unwrap();
            sums_fn
                .launch(
                    Grid {
                        blocks: 8,
                        threads: 128,
                    },
                    &Args::new().arg(space.handle()).arg(mode).arg(sums.ptr()),
                )
                .unwrap();
            space.check_errors().unwrap();
            let st = space.stats().unwrap();
            let mut got = vec![0u64; pages];
            sums.download(0, &mut got).unwrap();
            let first = got
                .iter()
                .zip(page_sums(&want, page))
                .position(|(g, e)| *g != e);
            assert_eq!(
                first, None,
                "{what}: whole-page sums (read mode {mode}) differ: {st:?}"
            );
        }
        let mut back = vec![0u64; n];
        space.read_back(0, &mut back).unwrap();
        assert!(back == want, "{what}: read_back differs from the replay");
    }
}

/// Sub-page fetch is refused where it cannot work, with a message that says what to do: a
/// space over a store (its host cache holds whole pages), a peer tier, and sector sizes that
/// are not a power of two of at least 512 bytes. A sector that leaves fewer than 2 a page
/// means whole pages for that page size.
#[test]
fn sub_page_fetch_refuses_what_it_cannot_serve() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let store: std::sync::Arc<dyn strata_core::store::Store> =
        std::sync::Arc::new(strata_core::store::MemoryStore::try_new(1 << 20).unwrap());
    let o = options(64 << 10, 4, Some(4 << 10), RemoteAccess::Auto);
    let err = strata.space_over_store(store, 1 << 20, &o).unwrap_err();
    assert!(
        matches!(&err, SpaceError::Invalid(m) if m.contains("sector_bytes")),
        "{err}"
    );
    for bad in [0u64, 256, 3000, 4097] {
        let err = strata
            .space(
                1 << 20,
                &options(64 << 10, 4, Some(bad), RemoteAccess::Auto),
            )
            .unwrap_err();
        assert!(
            matches!(&err, SpaceError::Invalid(m) if m.contains("power of two")),
            "sector {bad}: {err}"
        );
    }
    // 4 KiB pages with 4 KiB sectors: whole pages (the handle carries no sector size).
    let o = options(4 << 10, 4, Some(4 << 10), RemoteAccess::Auto);
    assert_eq!(o.sector_for(4 << 10), None);
    assert_eq!(o.sector_for(64 << 10), Some(4 << 10));
    assert_eq!(o.sector_for(2 << 20), Some(64 << 10));
    let space = strata.space(1 << 20, &o).unwrap();
    assert_eq!(
        space.handle().policy & strata_gpu::layout::POLICY_SECTOR_MASK,
        0
    );
}
