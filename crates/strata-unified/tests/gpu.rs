//! GPU tests of unified allocations (skipped without a CUDA driver): alternating CPU and GPU
//! phases with writes on both sides checked against a CPU replay, at sizes that fit the GPU
//! cache and at 2x and 8x it; read-mostly pages never written back; discard drops; a list
//! the CPU built walked by a kernel; conflicts reported with nothing lost; allocations over a
//! store (`UnifiedOverStore`): phases against a replay, the host paths and the edges.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use rand::{Rng, SeedableRng};
use strata_gpu::driver::{Args, DeviceBuffer, Function, Grid};
use strata_gpu::{KernelModule, Strata};
use strata_unified::{
    Advice, DirtyTracking, Location, Unified, UnifiedError, UnifiedHandle, UnifiedOptions,
};

const KERNELS: &str = include_str!("kernels.cu");

fn setup() -> Option<(Strata, KernelModule)> {
    if !strata_gpu::probe::driver_present() {
        eprintln!("skipped: no CUDA driver");
        return None;
    }
    let strata = Strata::new(0).expect("a CUDA driver is present but Strata could not start");
    let module = strata_unified::compile(&strata, KERNELS, "unified_kernels.cu").expect("compile");
    Some((strata, module))
}

fn rng() -> rand::rngs::StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    x
}

fn words(u: &Unified) -> &[u64] {
    bytemuck::cast_slice(u.as_slice())
}

fn words_mut(u: &mut Unified) -> &mut [u64] {
    bytemuck::cast_slice_mut(u.as_mut_slice())
}

fn grid(f: &Function) -> Grid {
    f.full_grid(256).expect("grid")
}

/// Launches the `update` kernel with a handle taken by hand (no launch helper, no sync).
fn launch_update(update: &Function, h: UnifiedHandle<'_>, n: u64, salt: u64, every: u64) {
    update
        .launch(
            grid(update),
            &Args::new().arg(h).arg(n).arg(salt).arg(every),
        )
        .unwrap();
}

/// A kernel sum of words [a, b) (the GPU's view), through a sync to the GPU.
fn gpu_sum(u: &mut Unified, m: &KernelModule, a: u64, b: u64) -> u64 {
    gpu_sum_with(u, m, "sum", a, b)
}

/// [`gpu_sum`] with the kernel named `kernel` (`sum` or `sum_read_mostly`).
fn gpu_sum_with(u: &mut Unified, m: &KernelModule, kernel: &str, a: u64, b: u64) -> u64 {
    let f = m.function(kernel).unwrap();
    let out = DeviceBuffer::zeroed(u.space().gpu(), 8).unwrap();
    u.launch(&f, grid(&f), |h| {
        Args::new().arg(h).arg(a).arg(b).arg(out.ptr())
    })
    .unwrap();
    let mut s = [0u64];
    out.download(0, &mut s).unwrap();
    s[0]
}

/// Rounds of CPU writes and GPU read-modify-writes on random subsets, every word checked
/// against a replay after each round; half the GPU phases use the launch helper, half the
/// explicit syncs and handle.
/// A unified allocation whose CPU writes are found by write protection, or None (said) where
/// the kernel lacks asynchronous write protection.
fn write_protected(strata: &Strata, bytes: u64, page: u64, cache_bytes: u64) -> Option<Unified> {
    let opts = UnifiedOptions {
        page_size: page,
        cache_bytes,
        dirty_tracking: DirtyTracking::WriteProtect,
        ..UnifiedOptions::default()
    };
    let u = Unified::new(strata, bytes, &opts).unwrap();
    if u.dirty_tracking().0 != DirtyTracking::WriteProtect {
        eprintln!("skipped: no asynchronous write protection here");
        return None;
    }
    Some(u)
}

/// What the `update` kernel does to the words, on the CPU.
fn replay_update(replay: &mut [u64], salt: u64, every: u64) {
    for (i, w) in replay.iter_mut().enumerate() {
        if mix(i as u64 ^ salt).is_multiple_of(every) {
            *w = mix(*w ^ salt);
        }
    }
}

/// Every word of the CPU's view equals the replay (`what` says where the check is).
fn assert_replay(u: &Unified, replay: &[u64], what: &str) {
    let got = words(u);
    if let Some(i) = (0..replay.len()).find(|&i| got[i] != replay[i]) {
        panic!(
            "{what}: word {i} is {:#x}, replay says {:#x}",
            got[i], replay[i]
        );
    }
}

fn phases(cache_divisor: u64, tracking: DirtyTracking) {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = if cache_divisor == 1 {
        32 << 20
    } else {
        64 << 20
    };
    let n = bytes / 8;
    let opts = UnifiedOptions {
        page_size: page,
        cache_bytes: bytes / cache_divisor,
        dirty_tracking: tracking,
        ..UnifiedOptions::default()
    };
    let mut u = Unified::new(&strata, bytes, &opts).unwrap();
    assert_eq!(
        u.dirty_tracking().0,
        tracking,
        "tracking fell back (this kernel lacks asynchronous write protection?)"
    );
    let mut replay: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    words_mut(&mut u).copy_from_slice(&replay);
    let update = m.function("update").unwrap();
    for round in 0..6u64 {
        // CPU phase: a random subset of pages, a few words each (all pages in round 0).
        let pages = bytes / page;
        let touched = if round == 0 {
            pages
        } else {
            rng.random_range(1..pages / 4)
        };
        for _ in 0..touched {
            let p = rng.random_range(0..pages);
            for _ in 0..4 {
                let i = (p * page / 8 + rng.random_range(0..page / 8)) as usize;
                let v: u64 = rng.random();
                replay[i] = v;
                if tracking == DirtyTracking::Declared {
                    let at = i as u64 * 8;
                    u.cpu_mut(at..at + 8)
                        .unwrap()
                        .copy_from_slice(&v.to_ne_bytes());
                } else {
                    words_mut(&mut u)[i] = v;
                }
            }
        }
        // GPU phase: a subset of words read and rewritten.
        let salt = mix(round ^ 0x5eed);
        let every = 1 + round % 3;
        if round % 2 == 0 {
            u.launch(&update, grid(&update), |h| {
                Args::new().arg(h).arg(n).arg(salt).arg(every)
            })
            .unwrap();
        } else {
            u.sync_to_gpu(0..bytes).unwrap();
            let h = u.handle();
            launch_update(&update, h, n, salt, every);
            u.space().check_errors().unwrap();
            u.sync_to_cpu(0..bytes).unwrap();
        }
        replay_update(&mut replay, salt, every);
        assert_replay(
            &u,
            &replay,
            &format!("round {round}, cache 1/{cache_divisor}"),
        );
    }
    // The GPU's view agrees too (it reads what the CPU's last phase left, here everything).
    let want = replay.iter().fold(0u64, |s, &w| s.wrapping_add(w));
    assert_eq!(gpu_sum(&mut u, &m, 0, n), want);
    let st = u.stats();
    eprintln!(
        "cache 1/{cache_divisor} {tracking:?}: {st:?} gpu {:?}, (mode, hot pages) now {:?}",
        u.space().stats().unwrap().writebacks,
        u.dirty_tracking()
    );
    assert!(st.total.cpu_written > 0 && st.total.written_down > 0);
}

#[test]
fn phases_fit_the_cache() {
    phases(1, DirtyTracking::Hash);
}

#[test]
fn phases_fit_the_cache_write_protected() {
    phases(1, DirtyTracking::WriteProtect);
}

/// Evictions during kernels write pages down into the host copy by DMA: write protection
/// must not take them for CPU writes (a false conflict) nor miss the CPU's own.
#[test]
fn phases_at_eight_times_the_cache_write_protected() {
    phases(8, DirtyTracking::WriteProtect);
}

#[test]
fn phases_fit_the_cache_declared_writes() {
    phases(1, DirtyTracking::Declared);
}

#[test]
fn phases_at_twice_the_cache() {
    phases(2, DirtyTracking::Hash);
}

#[test]
fn phases_at_eight_times_the_cache() {
    phases(8, DirtyTracking::Hash);
}

/// Only the pages the CPU changed move: a CPU phase that writes k pages drops at most k GPU
/// copies, and a GPU phase that writes k pages writes exactly k down.
#[test]
fn only_changed_pages_move() {
    let Some((strata, m)) = setup() else { return };
    let page: u64 = 64 << 10;
    let bytes = 16 << 20;
    let mut u = Unified::new(&strata, bytes, &UnifiedOptions::default()).unwrap();
    let fill = m.function("fill").unwrap();
    // Load everything into the cache (a kernel's reads alone leave some pages in the host
    // copy: pages not resident are read in place until they earn a frame).
    u.prefetch(0..bytes, Location::Gpu).unwrap();
    let n = bytes / 8;
    gpu_sum(&mut u, &m, 0, n);
    let w = words_mut(&mut u);
    w[0] = 1;
    w[(3 * page / 8) as usize] = 2;
    let r = u.sync_to_gpu(0..bytes).unwrap();
    assert_eq!((r.cpu_written, r.gpu_copies_dropped), (2, 2), "{r:?}");
    let first = 5 * page / 8;
    let r = u
        .launch(&fill, grid(&fill), |h| {
            Args::new()
                .arg(h)
                .arg(first)
                .arg(first + 2 * page / 8)
                .arg(7u64)
        })
        .unwrap();
    assert_eq!(r.written_down, 2, "{r:?}");
    assert_eq!(r.cpu_written, 0);
    assert!(
        words(&u)[first as usize..(first + 2 * page / 8) as usize]
            .iter()
            .all(|&v| v == 7)
    );
}

#[test]
fn read_mostly_pages_are_never_written_back() {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes = 8 << 20;
    let mut u = Unified::new(&strata, bytes, &UnifiedOptions::default()).unwrap();
    let table: Vec<u64> = (0..bytes / 8).map(|_| rng.random()).collect();
    words_mut(&mut u).copy_from_slice(&table);
    u.advise(0..4 * page, Advice::ReadMostly(true)).unwrap();
    // Readers are fine, and write nothing down; they read the replica the sync built.
    let want = table[..(4 * page / 8) as usize]
        .iter()
        .fold(0u64, |s, &w| s.wrapping_add(w));
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want);
    assert_eq!(
        u.replica(),
        Some(0..4),
        "the read-mostly pages have a replica"
    );
    let loads = u.space().stats().unwrap();
    eprintln!("GPU paging after the replica read: {loads:?}");
    // A writer over read-mostly and ordinary pages: the read-mostly ones are dropped and
    // reported, the others synced.
    let fill = m.function("fill").unwrap();
    let err = u
        .launch(&fill, grid(&fill), |h| {
            Args::new()
                .arg(h)
                .arg(2 * page / 8)
                .arg(6 * page / 8)
                .arg(9u64)
        })
        .unwrap_err();
    match &err {
        UnifiedError::ReadMostlyWritten {
            pages,
            reached_host,
            ..
        } => {
            assert_eq!(pages, &vec![2, 3]);
            assert!(!reached_host);
        }
        e => panic!("expected ReadMostlyWritten, got {e}"),
    }
    eprintln!("{err}");
    let w = words(&u);
    assert_eq!(
        &w[..(4 * page / 8) as usize],
        &table[..(4 * page / 8) as usize],
        "read-mostly bytes changed"
    );
    assert!(
        w[(4 * page / 8) as usize..(6 * page / 8) as usize]
            .iter()
            .all(|&v| v == 9)
    );
    // And the GPU's view of them is the host's again.
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want);
    // CPU writes to read-mostly pages reach the GPU (the replica's page copied up again).
    words_mut(&mut u)[0] = table[0].wrapping_add(5);
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want.wrapping_add(5));
    let mut rng_page = rng.random_range(0..4u64);
    let i = (rng_page * page / 8 + rng.random_range(0..page / 8)) as usize;
    let before = words(&u)[i];
    words_mut(&mut u)[i] = before.wrapping_add(11);
    assert_eq!(
        gpu_sum(&mut u, &m, 0, 4 * page / 8),
        want.wrapping_add(5).wrapping_add(11),
        "a CPU write to replica page {rng_page} reached the kernels"
    );
    words_mut(&mut u)[i] = before;
    // Clearing the advice on page 1 drops the replica at once; the next sync builds one for
    // the longest read-mostly run left (pages 2..4), and the sums stay right.
    u.advise(page..2 * page, Advice::ReadMostly(false)).unwrap();
    assert_eq!(u.replica(), None);
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want.wrapping_add(5));
    assert_eq!(u.replica(), Some(2..4));
    // The lean reader: pages 2..4 from the replica, 0 and 1 from the host copy.
    assert_eq!(
        gpu_sum_with(&mut u, &m, "sum_read_mostly", 0, 4 * page / 8),
        want.wrapping_add(5)
    );
    rng_page = 3;
    let j = (rng_page * page / 8) as usize;
    words_mut(&mut u)[j] = words(&u)[j].wrapping_add(1);
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want.wrapping_add(6));
    u.advise(0..bytes, Advice::ReadMostly(false)).unwrap();
    assert_eq!(gpu_sum(&mut u, &m, 0, 4 * page / 8), want.wrapping_add(6));
    assert_eq!(u.replica(), None, "no read-mostly pages, no replica");
}

/// A read-mostly table with write-protect tracking: CPU writes are recorded by the notified
/// handler (where the process may open one: asserted when root), and every write reaches the
/// kernels, from two threads, round after round; a sync after a CPU phase that wrote nothing
/// finds nothing, and one after a few writes finds exactly their pages.
#[test]
fn read_mostly_table_with_notified_writes() {
    use strata_unified::write_watch::WatchMode;
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = 16 << 20;
    let n = bytes / 8;
    let opts = UnifiedOptions {
        dirty_tracking: DirtyTracking::WriteProtect,
        ..UnifiedOptions::default()
    };
    let mut u = Unified::new(&strata, bytes, &opts).unwrap();
    let mut table: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    words_mut(&mut u).copy_from_slice(&table);
    u.advise(0..bytes, Advice::ReadMostly(true)).unwrap();
    let mode = u.watch_mode();
    eprintln!("watch mode {mode:?}, tracking {:?}", u.dirty_tracking());
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 && opts.notified_writes {
        assert_eq!(mode, Some(WatchMode::Notified));
    }
    let sum = |t: &[u64]| t.iter().fold(0u64, |s, &w| s.wrapping_add(w));
    assert_eq!(gpu_sum(&mut u, &m, 0, n), sum(&table));
    for round in 0..8 {
        let writes = if round % 3 == 0 {
            0
        } else {
            rng.random_range(1..40)
        };
        // Distinct words (a map by index), so the two threads never write the same one.
        let picks: Vec<(usize, u64)> = (0..writes)
            .map(|_| (rng.random_range(0..n as usize), rng.random()))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        let base = u.as_ptr() as usize;
        std::thread::scope(|s| {
            for half in picks.chunks(picks.len().div_ceil(2).max(1)) {
                s.spawn(move || {
                    for &(i, v) in half {
                        // SAFETY: word i < n of the allocation, alive for the scope; a CPU
                        // phase (no kernel runs); each word written by one thread.
                        unsafe { std::ptr::write_volatile((base as *mut u64).add(i), v) };
                    }
                });
            }
        });
        for &(i, v) in &picks {
            table[i] = v;
        }
        let pages: std::collections::BTreeSet<u64> =
            picks.iter().map(|&(i, _)| i as u64 * 8 / page).collect();
        let r = u.sync_to_gpu(0..bytes).unwrap();
        assert_eq!(
            r.cpu_written,
            pages.len() as u64,
            "round {round}: {pages:?}"
        );
        assert_eq!(gpu_sum(&mut u, &m, 0, n), sum(&table), "round {round}");
        assert_eq!(words(&u), &table[..], "round {round}: the host copy");
    }
    assert_eq!(u.replica(), Some(0..bytes / page));
}

#[test]
fn discard_drops_gpu_writes() {
    let Some((strata, m)) = setup() else { return };
    let page: u64 = 64 << 10;
    let bytes = 4 << 20;
    let mut u = Unified::new(&strata, bytes, &UnifiedOptions::default()).unwrap();
    words_mut(&mut u).fill(3);
    u.sync_to_gpu(0..bytes).unwrap();
    let fill = m.function("fill").unwrap();
    let h = u.handle();
    fill.launch(
        grid(&fill),
        &Args::new().arg(h).arg(0u64).arg(bytes / 8).arg(8u64),
    )
    .unwrap();
    // Discard pages 1..3 (the range rounds inward: bytes 100..3*page+5 covers whole pages 1, 2).
    assert_eq!(u.discard(100..3 * page + 5).unwrap(), 2);
    u.sync_to_cpu(0..bytes).unwrap();
    let w = words(&u);
    let per = (page / 8) as usize;
    assert!(
        w[..per].iter().all(|&v| v == 8),
        "page 0 kept the GPU's writes"
    );
    assert!(
        w[per..3 * per].iter().all(|&v| v == 3),
        "discarded pages were written back"
    );
    assert!(w[3 * per..].iter().all(|&v| v == 8));
    // The GPU sees the host's bytes of the discarded pages again.
    assert_eq!(
        gpu_sum(&mut u, &m, per as u64, 3 * per as u64),
        3 * 2 * per as u64
    );
}

#[test]
fn kernel_walks_a_list_the_cpu_built() {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let nodes: u64 = 200_000; // 3.2 MiB of nodes, spread over the pages in random order
    let bytes = nodes * 16;
    let opts = UnifiedOptions {
        cache_bytes: 1 << 20,
        ..UnifiedOptions::default()
    };
    let mut u = Unified::new(&strata, bytes, &opts).unwrap();
    let base = u.as_ptr() as u64;
    let mut order: Vec<u64> = (0..nodes).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let w = words_mut(&mut u);
    let mut want = 0u64;
    for (k, &slot) in order.iter().enumerate() {
        let next = order.get(k + 1).map_or(0, |&n| base + n * 16);
        let value: u64 = rng.random::<u32>().into();
        want = want.wrapping_add(value);
        w[(slot * 2) as usize] = next;
        w[(slot * 2 + 1) as usize] = value;
    }
    let head = base + order[0] * 16;
    let f = m.function("walk").unwrap();
    let out = DeviceBuffer::zeroed(u.space().gpu(), 16).unwrap();
    let started = std::time::Instant::now();
    u.launch(
        &f,
        Grid {
            blocks: 1,
            threads: 32,
        },
        |h| Args::new().arg(h).arg(head).arg(nodes + 1).arg(out.ptr()),
    )
    .unwrap();
    let mut got = [0u64; 2];
    out.download(0, &mut got).unwrap();
    let stats = u.space().stats().unwrap();
    eprintln!(
        "walk of {nodes} nodes: {:?}, {} faults, {} reads in place",
        started.elapsed(),
        stats.faults,
        stats.remote_reads
    );
    assert_eq!(
        got,
        [want, nodes],
        "list walked on the GPU (cache 1/3 of the list)"
    );
    // One thread chasing pointers reads hops in place rather than copying a page per hop
    // with one lane (which took over 90 s for this list).
    assert!(stats.remote_reads > nodes / 2, "{stats:?}");
}

/// Hot pages (rewritten in bulk) advised to the GPU are taken as written at a sync and loaded
/// while their hashes are taken: every sync is exact on both sides, the report counts only
/// the pages that changed, pages left alone cool (protected again, then moved only when
/// written), and a hot page the GPU holds dirty is hashed first, so leaving it alone is no
/// conflict and writing it is one.
#[test]
fn hot_pages_for_the_gpu_are_loaded_while_hashed_and_cool_when_left_alone() {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = 16 << 20;
    let pages = bytes / page;
    let per = (page / 8) as usize;
    let n = bytes / 8;
    let Some(mut u) = write_protected(&strata, bytes, page, 1 << 30) else {
        return;
    };
    u.advise(0..bytes, Advice::PreferredLocation(Some(Location::Gpu)))
        .unwrap();
    // The GPU's view after a sync to the GPU, read by a kernel launched by hand and followed
    // by a sync to the CPU only: a second sync to the GPU here (the launch helper's) would
    // find the hot pages unchanged and cool them.
    let sum = m.function("sum").unwrap();
    let out = DeviceBuffer::zeroed(strata.gpu(), 8).unwrap();
    let check = |u: &mut Unified, what: &str| {
        let want = words(u).iter().fold(0u64, |s, &w| s.wrapping_add(w));
        sum.launch(
            grid(&sum),
            &Args::new().arg(u.handle()).arg(0u64).arg(n).arg(out.ptr()),
        )
        .unwrap();
        u.space().check_errors().unwrap();
        u.sync_to_cpu(0..bytes).unwrap();
        let mut got = [0u64];
        out.download(0, &mut got).unwrap();
        out.upload(0, &[0u64]).unwrap();
        assert_eq!(got[0], want, "{what}: the GPU's view");
    };
    // Two rewrites of everything: the first makes every page hot, the second is assumed.
    for round in 0..2 {
        let fresh: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        words_mut(&mut u).copy_from_slice(&fresh);
        let r = u.sync_to_gpu(0..bytes).unwrap();
        assert_eq!(r.cpu_written, pages, "round {round}: {r:?}");
        check(&mut u, "a full rewrite");
    }
    assert_eq!(u.dirty_tracking().1 as u64, pages, "every page is hot");
    // Half the pages rewritten: all are dropped and loaded (assumed), half are counted, and
    // the other half cool.
    for p in (0..pages as usize).step_by(2) {
        let i = p * per + rng.random_range(0..per);
        words_mut(&mut u)[i] ^= 1 + rng.random_range(0..u64::MAX - 1);
    }
    let r = u.sync_to_gpu(0..bytes).unwrap();
    assert_eq!(r.cpu_written, pages / 2, "{r:?}");
    assert_eq!(r.gpu_copies_dropped, pages, "{r:?}");
    assert_eq!(u.dirty_tracking().1 as u64, pages / 2, "half cooled");
    check(&mut u, "half rewritten");
    // Nothing written: the hot half is assumed once more, then every page has cooled.
    let r = u.sync_to_gpu(0..bytes).unwrap();
    assert_eq!(
        (r.cpu_written, r.gpu_copies_dropped),
        (0, pages / 2),
        "{r:?}"
    );
    assert_eq!(u.dirty_tracking().1, 0, "all cooled");
    // A cooled page is protected again: one word of one page moves one page.
    let p = 2 * rng.random_range(0..pages as usize / 2) + 1;
    words_mut(&mut u)[p * per + 3] = rng.random();
    let r = u.sync_to_gpu(0..bytes).unwrap();
    assert_eq!((r.cpu_written, r.gpu_copies_dropped), (1, 1), "{r:?}");
    check(&mut u, "one word after cooling");
    // Hot again, then the GPU dirties pages 0 and 1 (a handle taken by hand, no sync).
    for _ in 0..2 {
        let fresh: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        words_mut(&mut u).copy_from_slice(&fresh);
        u.sync_to_gpu(0..bytes).unwrap();
    }
    assert_eq!(u.dirty_tracking().1 as u64, pages);
    let fill = m.function("fill").unwrap();
    let fill_two = |u: &mut Unified, v: u64| {
        let h = u.handle();
        fill.launch(
            grid(&fill),
            &Args::new().arg(h).arg(0u64).arg(2 * page / 8).arg(v),
        )
        .unwrap();
        u.space().gpu().synchronize_context().unwrap();
    };
    fill_two(&mut u, 9);
    // The CPU left them alone (it rewrote the rest): no conflict, and the GPU's bytes win.
    for p in 2..pages as usize {
        words_mut(&mut u)[p * per] ^= 1;
    }
    let r = u.sync_to_gpu(0..bytes).unwrap();
    assert_eq!(r.cpu_written, pages - 2, "{r:?}");
    u.sync_to_cpu(0..bytes).unwrap();
    assert!(words(&u)[..2 * per].iter().all(|&v| v == 9));
    check(&mut u, "the GPU's pages beside the CPU's");
    // Hot again; this time the CPU writes page 1 too: reported, nothing lost.
    for _ in 0..2 {
        let fresh: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        words_mut(&mut u).copy_from_slice(&fresh);
        u.sync_to_gpu(0..bytes).unwrap();
    }
    fill_two(&mut u, 11);
    words_mut(&mut u)[per + 5] = 42;
    let err = u.sync_to_gpu(0..bytes).unwrap_err();
    assert!(
        matches!(&err, UnifiedError::Conflict { pages, .. } if pages == &vec![1]),
        "{err}"
    );
    assert_eq!(words(&u)[per + 5], 42);
    u.sync_to_cpu_overwriting(0..bytes).unwrap();
    assert!(words(&u)[..2 * per].iter().all(|&v| v == 11));
    u.sync_to_gpu(0..bytes).unwrap();
    check(&mut u, "after the conflict");
}

/// Hot pages under advice on part of the range, a cache a quarter of the data, syncs of
/// random subranges: CPU rewrites of most pages (so pages turn hot) alternate with kernels that
/// update a subset in place, and every word is checked against a replay after each round
/// (hot pages advised to the GPU are taken as written unhashed; the others are hashed first).
#[test]
fn hot_pages_under_partial_advice_small_cache_and_partial_syncs() {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = 16 << 20;
    let pages = bytes / page;
    let n = bytes / 8;
    let Some(mut u) = write_protected(&strata, bytes, page, bytes / 4) else {
        return;
    };
    // The GPU advice on a random middle stretch only.
    let a = rng.random_range(0..pages / 2) * page;
    let b = rng.random_range(pages / 2 + 1..=pages) * page;
    u.advise(a..b, Advice::PreferredLocation(Some(Location::Gpu)))
        .unwrap();
    let mut replay: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    words_mut(&mut u).copy_from_slice(&replay);
    let update = m.function("update").unwrap();
    let mut hot_seen = 0;
    for round in 0..8u64 {
        // Most pages rewritten (a heavy sync makes them hot), a word or a whole page each.
        for p in 0..pages {
            if rng.random_range(0..4) == 0 {
                continue;
            }
            let base = (p * page / 8) as usize;
            if rng.random() {
                let i = base + rng.random_range(0..(page / 8) as usize);
                replay[i] = rng.random();
                words_mut(&mut u)[i] = replay[i];
            } else {
                for w in &mut replay[base..base + (page / 8) as usize] {
                    *w = rng.random();
                }
                words_mut(&mut u)[base..base + (page / 8) as usize]
                    .copy_from_slice(&replay[base..base + (page / 8) as usize]);
            }
        }
        // A sync of a random subrange first (byte bounds not page-aligned), then the launch
        // helper syncs the rest.
        let x = rng.random_range(0..bytes);
        let y = rng.random_range(x..=bytes);
        u.sync_to_gpu(x..y).unwrap();
        hot_seen = hot_seen.max(u.dirty_tracking().1);
        let salt = mix(round ^ 0xad71ce);
        let every = 1 + round % 3;
        u.launch(&update, grid(&update), |h| {
            Args::new().arg(h).arg(n).arg(salt).arg(every)
        })
        .unwrap();
        replay_update(&mut replay, salt, every);
        assert_replay(
            &u,
            &replay,
            &format!("round {round}, advice on bytes {a}..{b}"),
        );
    }
    assert!(
        hot_seen > 0,
        "no page ever turned hot: the test did not reach the hot path"
    );
    let want = replay.iter().fold(0u64, |s, &w| s.wrapping_add(w));
    assert_eq!(gpu_sum(&mut u, &m, 0, n), want, "the GPU's view at the end");
}

/// Hot read-mostly pages beside hot ordinary ones, all advised to the GPU, with a cache of
/// the whole data and one of two frames: the CPU rewrites everything twice a round (the second
/// sync finds the pages hot; read-mostly ones are hashed before anything moves, the others
/// taken as written), and the GPU's view through the replica and through the pages must be the
/// CPU's every round, with no write-back reported for read-mostly data.
fn hot_read_mostly_rounds(cache_pages: u64) {
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = 4 << 20;
    let n = bytes / 8;
    let Some(mut u) = write_protected(&strata, bytes, page, cache_pages * page) else {
        return;
    };
    let rm = rng.random_range(1..bytes / page) * page;
    u.advise(0..rm, Advice::ReadMostly(true)).unwrap();
    u.advise(0..bytes, Advice::PreferredLocation(Some(Location::Gpu)))
        .unwrap();
    let split = rm / 8;
    for round in 0..4 {
        let mut want = Vec::new();
        for _ in 0..2 {
            want = (0..n).map(|_| rng.random()).collect::<Vec<u64>>();
            words_mut(&mut u).copy_from_slice(&want);
            let r = u.sync_to_gpu(0..bytes).unwrap();
            assert_eq!(r.cpu_written, bytes / page, "round {round}: {r:?}");
        }
        let sum = |w: &[u64]| w.iter().fold(0u64, |s, &x| s.wrapping_add(x));
        assert_eq!(
            gpu_sum_with(&mut u, &m, "sum_read_mostly", 0, split),
            sum(&want[..split as usize]),
            "round {round}: the read-mostly part (cache of {cache_pages} pages)"
        );
        assert_eq!(
            gpu_sum(&mut u, &m, split, n),
            sum(&want[split as usize..]),
            "round {round}: the rest (cache of {cache_pages} pages)"
        );
        assert_eq!(words(&u), &want[..], "round {round}: the CPU's bytes");
    }
}

#[test]
fn hot_read_mostly_pages_with_the_whole_data_cached() {
    hot_read_mostly_rounds(64);
}

#[test]
fn hot_read_mostly_pages_with_a_cache_of_two_frames() {
    hot_read_mostly_rounds(2);
}

#[test]
fn both_sides_writing_a_page_is_reported_and_nothing_is_lost() {
    let Some((strata, m)) = setup() else { return };
    let page: u64 = 64 << 10;
    let bytes = 1 << 20;
    let mut u = Unified::new(&strata, bytes, &UnifiedOptions::default()).unwrap();
    u.sync_to_gpu(0..bytes).unwrap();
    let fill = m.function("fill").unwrap();
    let h = u.handle();
    fill.launch(
        grid(&fill),
        &Args::new().arg(h).arg(0u64).arg(2 * page / 8).arg(5u64),
    )
    .unwrap();
    u.space().gpu().synchronize_context().unwrap();
    // Against the rules: the CPU writes page 1 while the GPU holds it dirty.
    words_mut(&mut u)[(page / 8) as usize] = 42;
    let err = u.sync_to_cpu(0..bytes).unwrap_err();
    assert!(
        matches!(&err, UnifiedError::Conflict { pages, .. } if pages == &vec![1]),
        "{err}"
    );
    eprintln!("{err}");
    // Nothing changed: the CPU's word is there, and sync_to_gpu sees the same conflict.
    assert_eq!(words(&u)[(page / 8) as usize], 42);
    assert!(matches!(
        u.sync_to_gpu(0..bytes),
        Err(UnifiedError::Conflict { .. })
    ));
    // Keeping the GPU's bytes resolves it.
    u.sync_to_cpu_overwriting(0..bytes).unwrap();
    assert_eq!(words(&u)[(page / 8) as usize], 5);
    assert!(words(&u)[..(2 * page / 8) as usize].iter().all(|&v| v == 5));
    u.sync_to_gpu(0..bytes).unwrap();
}

#[test]
fn bad_ranges_are_refused_with_a_gpu() {
    let Some((strata, _)) = setup() else { return };
    let mut u = Unified::new(&strata, 1000, &UnifiedOptions::default()).unwrap();
    assert_eq!(u.as_slice().len(), 1000);
    assert!(matches!(
        u.sync_to_gpu(0..1001),
        Err(UnifiedError::Range { .. })
    ));
    assert!(matches!(
        u.sync_to_cpu(std::ops::Range { start: 5, end: 4 }),
        Err(UnifiedError::Range { .. })
    ));
    assert!(matches!(
        u.advise(3..3, Advice::ReadMostly(true)),
        Err(UnifiedError::Invalid(_))
    ));
    assert!(matches!(
        u.discard(0..2000),
        Err(UnifiedError::Range { .. })
    ));
    assert!(matches!(
        u.cpu_mut(999..1001),
        Err(UnifiedError::Range { .. })
    ));
    assert!(matches!(
        Unified::new(&strata, 0, &UnifiedOptions::default()),
        Err(UnifiedError::Invalid(_))
    ));
    assert!(matches!(
        Unified::new(&strata, 1 << 60, &UnifiedOptions::default()),
        Err(UnifiedError::BeyondHostMemory { .. })
    ));
}
/// An allocation over a store, with a CPU cache (pager buffer, host cache) a quarter of the
/// data and a GPU cache a quarter of it: alternating CPU writes and GPU read-modify-writes,
/// every word checked against a replay; only the pages one side wrote are dropped on the
/// other; syncs out of order are refused with nothing moved.
#[test]
fn over_a_store_larger_than_both_caches() {
    use std::sync::Arc;
    use strata_unified::UnifiedOverStore;
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let bytes: u64 = 32 << 20;
    let n = bytes / 8;
    let store: Arc<dyn strata_core::Store> = Arc::new(strata_core::MemoryStore::new(bytes));
    let opts = UnifiedOptions {
        page_size: page,
        cache_bytes: bytes / 4,
        ..UnifiedOptions::default()
    };
    let mut u = UnifiedOverStore::new(&strata, store.clone(), bytes, &opts, bytes / 4).unwrap();
    let mut replay: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    for (i, &v) in replay.iter().enumerate() {
        u.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    let update = m.function("update").unwrap();
    let pages = bytes / page;
    for round in 0..5u64 {
        let touched = if round == 0 {
            0
        } else {
            rng.random_range(1..pages / 2)
        };
        let mut cpu_pages = std::collections::BTreeSet::new();
        for _ in 0..touched {
            let p = rng.random_range(0..pages);
            cpu_pages.insert(p);
            let i = (p * page / 8 + rng.random_range(0..page / 8)) as usize;
            let v: u64 = rng.random();
            replay[i] = v;
            u.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        let salt = mix(round ^ 0xfeed);
        let every = 1 + round % 3;
        let r = u
            .launch(&update, grid(&update), |h| {
                Args::new().arg(h).arg(n).arg(salt).arg(every)
            })
            .unwrap();
        if round > 0 {
            assert_eq!(
                r.cpu_written,
                cpu_pages.len() as u64,
                "round {round}: {r:?}"
            );
        }
        for (i, w) in replay.iter_mut().enumerate() {
            if mix(i as u64 ^ salt).is_multiple_of(every) {
                *w = mix(*w ^ salt);
            }
        }
        let got: &[u64] = bytemuck::cast_slice(u.as_slice());
        let bad = (0..n as usize).find(|&i| got[i] != replay[i]);
        assert!(
            bad.is_none(),
            "round {round}: word {} is {:#x}, replay says {:#x}",
            bad.unwrap(),
            got[bad.unwrap()],
            replay[bad.unwrap()]
        );
    }
    // The store holds the same bytes once synced.
    let mut b = vec![0u8; 8];
    let i = rng.random_range(0..n);
    store.read_at(i * 8, &mut b).unwrap();
    assert_eq!(
        u64::from_ne_bytes(b.try_into().unwrap()),
        replay[i as usize]
    );
    // Out of order: a kernel's writes not synced before the next sync to the GPU.
    u.sync_to_gpu().unwrap();
    let h = u.handle();
    launch_update(&update, h, n, 1u64, 1u64);
    u.space().check_errors().unwrap();
    let e = u.sync_to_gpu().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    u.sync_to_cpu().unwrap();
    for w in &mut replay {
        *w = mix(*w ^ 1); // every = 1: each word
    }
    // The CPU writing during a GPU phase: refused at the sync to the CPU.
    u.sync_to_gpu().unwrap();
    u.as_mut_slice()[0] ^= 1;
    replay[0] ^= 1;
    let e = u.sync_to_cpu().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    u.sync_to_gpu().unwrap();
    u.sync_to_cpu().unwrap();
    let got: &[u64] = bytemuck::cast_slice(u.as_slice());
    assert!(got == &replay[..], "nothing was lost by the refused syncs");
    eprintln!("over a store: {:?}", u.stats());
}

/// Words of an allocation over a store (the CPU's view).
fn store_words(u: &strata_unified::UnifiedOverStore) -> &[u64] {
    let whole = u.as_slice().len() / 8 * 8;
    bytemuck::cast_slice(&u.as_slice()[..whole])
}

/// The edges a user reaches over a store, with a size that is not a multiple of the page and
/// caches smaller than the data (GPU 32 pages, CPU 16, data 49): the GPU side's host read
/// (`read_back`) after a sync to the GPU equals the CPU's bytes; GPU-side host writes
/// (`fill_from_slice`, unaligned, across pages and into the last partial page) reach the CPU
/// at the sync to the CPU; both sides writing in one phase refuses both syncs until the
/// merging sync, which keeps every write to pages one side wrote; a store that refuses writes
/// fails the sync in either direction with nothing lost, and the repeated sync succeeds.
#[test]
fn over_a_store_host_paths_and_edges() {
    use std::sync::Arc;
    use strata_core::store::{FaultPlan, FaultyStore};
    use strata_unified::UnifiedOverStore;
    let Some((strata, m)) = setup() else { return };
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let size: u64 = 3 * (1 << 20) + 12345;
    let rounded = size.next_multiple_of(page);
    let memory: Arc<dyn strata_core::Store> = Arc::new(strata_core::MemoryStore::new(rounded));
    let faulty = Arc::new(FaultyStore::new(memory.clone(), rng.random()));
    let opts = UnifiedOptions {
        page_size: page,
        cache_bytes: 32 * page,
        ..UnifiedOptions::default()
    };
    let mut u = UnifiedOverStore::new(&strata, faulty.clone(), size, &opts, 16 * page).unwrap();
    assert_eq!(u.as_slice().len() as u64, size);
    let mut replay = vec![0u8; size as usize];
    rng.fill(&mut replay[..]);
    u.as_mut_slice().copy_from_slice(&replay);
    let r = u.sync_to_gpu().unwrap();
    assert_eq!(r.cpu_written, rounded / page, "{r:?}");
    // The GPU side's host path reads the CPU's bytes.
    let mut seen = vec![0u8; size as usize];
    u.space().read_back(0, &mut seen).unwrap();
    assert!(
        seen == replay,
        "read_back after sync_to_gpu equals the CPU's bytes"
    );

    // GPU-side host writes: unaligned, across a page boundary, into the last partial page.
    let mut touched = std::collections::BTreeSet::new();
    for (at, len) in [
        (page - 3, 10u64),
        (5 * page + 1, 2 * page),
        (size - 100, 100),
    ] {
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        replay[at as usize..(at + len) as usize].copy_from_slice(&bytes);
        u.space_mut().fill_from_slice(at, &bytes).unwrap();
        touched.extend(at / page..(at + len).div_ceil(page));
    }
    let e = u.sync_to_gpu().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    assert!(e.to_string().contains("call sync_to_cpu"), "{e}");
    let r = u.sync_to_cpu().unwrap();
    assert_eq!(r.written_down, touched.len() as u64, "{r:?}");
    assert!(
        u.as_slice() == &replay[..],
        "the CPU sees the GPU side's writes"
    );

    // Both sides write in one GPU phase: the CPU to a word of a page the kernel leaves alone.
    let update = m.function("update").unwrap();
    let n = size / 8;
    let (salt, every) = (mix(rng.random()), 1u64 << 14);
    let kernel_writes = |i: u64| mix(i ^ salt).is_multiple_of(every);
    let quiet = (0..rounded / page)
        .find(|&p| !(p * page / 8..((p + 1) * page / 8).min(n)).any(kernel_writes))
        .expect("a page the kernel does not write");
    u.sync_to_gpu().unwrap();
    let h = u.handle();
    launch_update(&update, h, n, salt, every);
    u.space().check_errors().unwrap();
    let at = (quiet * page) as usize;
    u.as_mut_slice()[at] ^= 0x5a;
    replay[at] ^= 0x5a;
    for i in (0..n).filter(|&i| kernel_writes(i)) {
        let b = (i * 8) as usize;
        let w = u64::from_ne_bytes(replay[b..b + 8].try_into().unwrap());
        replay[b..b + 8].copy_from_slice(&mix(w ^ salt).to_ne_bytes());
    }
    let e = u.sync_to_cpu().unwrap_err();
    assert!(e.to_string().contains("sync_to_cpu_merging"), "{e}");
    let e = u.sync_to_gpu().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    let (_, both) = u.sync_to_cpu_merging().unwrap();
    assert!(both.is_empty(), "pages both wrote: {both:?}");
    assert!(u.as_slice() == &replay[..], "both sides' writes kept");
    u.sync_to_gpu().unwrap();
    u.space().read_back(0, &mut seen).unwrap();
    assert!(seen == replay, "the GPU side agrees after the next sync");
    u.sync_to_cpu().unwrap();

    // A store that refuses writes: to the GPU (the CPU's pages), then to the CPU (the GPU's).
    let p = rng.random_range(0..size);
    u.as_mut_slice()[p as usize] ^= 1;
    replay[p as usize] ^= 1;
    faulty
        .set_plan(FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    let e = u.sync_to_gpu().unwrap_err();
    assert!(matches!(e, UnifiedError::Region { .. }), "{e}");
    faulty.heal();
    u.sync_to_gpu().unwrap();
    let h = u.handle();
    launch_update(&update, h, n, salt, 1u64);
    u.space().check_errors().unwrap();
    for i in 0..n {
        let b = (i * 8) as usize;
        let w = u64::from_ne_bytes(replay[b..b + 8].try_into().unwrap());
        replay[b..b + 8].copy_from_slice(&mix(w ^ salt).to_ne_bytes());
    }
    faulty
        .set_plan(FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    let e = u.sync_to_cpu().unwrap_err();
    eprintln!("sync_to_cpu with a failing store: {e}");
    faulty.heal();
    u.sync_to_cpu().unwrap();
    assert!(
        u.as_slice() == &replay[..],
        "nothing lost by the failed syncs"
    );
    assert_eq!(store_words(&u).len() as u64, n);
    eprintln!("over a store, edges: {:?}", u.stats());
}
