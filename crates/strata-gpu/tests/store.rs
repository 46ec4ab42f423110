//! GPU tests of spaces over a store (issue 11): random reads and writes from every SM against a
//! CPU replay over memory, file and memory-node stores, with the GPU cache 8x and the host
//! cache 2x smaller than the space, pages 4 KiB to 2 MiB, both policies; flush, reopen, compare;
//! stores that fail reads or writes; a ring whose host threads died; a memory node killed while
//! a kernel runs. Without a CUDA driver each test prints `skipped: no CUDA driver` and passes.
//! Fresh random data every run; the seed is printed.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_core::store::{FaultPlan, FaultyStore, FileStore, MemoryStore, Store};
use strata_gpu::driver::{Args, DeviceBuffer, Grid};
use strata_gpu::{EvictionPolicy, KernelModule, Space, SpaceError, SpaceOptions, Strata};

mod common;
use common::{mix, opts, random_words, seed, strata_or_skip};

const KERNELS: &str = include_str!("store_kernels.cu");
const GRID: Grid = Grid {
    blocks: 264,
    threads: 256,
};

fn store_opts(page: u64, space: u64, policy: EvictionPolicy) -> SpaceOptions {
    let mut o = opts(page, (space / 8).max(2 * page), policy);
    o.host_cache_bytes = Some((space / 2).max(2 * page));
    o
}

fn write_words(store: &dyn Store, words: &[u64]) {
    store.write_at(0, bytemuck::cast_slice(words)).unwrap();
}

fn read_all(space: &Space) -> Vec<u64> {
    let mut back = vec![0u64; (space.size() / 8) as usize];
    space.read_back(0, &mut back).unwrap();
    back
}

/// The CPU replay of `random_rw`: the final contents and each thread's sum of reads.
fn replay(initial: &[u64], threads: u64, ops: u64, seed: u64) -> (Vec<u64>, Vec<u64>) {
    let mut words = initial.to_vec();
    let n = words.len() as u64;
    let halves = n / 2;
    let mut sums = vec![0u64; threads as usize];
    for t in 0..threads {
        let owned = if t < halves {
            (halves - t).div_ceil(threads)
        } else {
            0
        };
        let mut sum = 0u64;
        for j in 0..ops {
            let r = mix(seed ^ (t << 24) ^ j);
            if r & 1 == 1 && owned > 0 {
                let idx = 2 * (t + threads * ((r >> 1) % owned));
                words[idx as usize] = mix(seed ^ (idx << 8) ^ (j << 40));
            } else {
                let idx = 2 * ((r >> 1) % halves) + 1;
                sum = sum.wrapping_add(initial[idx as usize]);
            }
        }
        sums[t as usize] = sum;
    }
    (words, sums)
}

/// Runs `random_rw` on `space` and checks the reads and the final contents against the replay.
fn random_rw_matches_replay(
    strata: &Strata,
    module: &KernelModule,
    space: &Space,
    initial: &[u64],
    s: u64,
) -> Vec<u64> {
    // Every SM, with as many random accesses as keep the traffic a few GB (nearly every access
    // faults once the space is 8x the cache).
    let big = space.page_size() >= 1 << 20;
    let grid = if big {
        Grid {
            blocks: 132,
            threads: 64,
        }
    } else {
        GRID
    };
    let threads = u64::from(grid.blocks * grid.threads);
    let ops = if big { 2 } else { 48 };
    let sums = DeviceBuffer::zeroed(strata.gpu(), (threads * 8) as usize).unwrap();
    let t0 = Instant::now();
    module
        .function("random_rw")
        .unwrap()
        .launch(
            grid,
            &Args::new()
                .arg(space.handle())
                .arg(ops)
                .arg(s)
                .arg(sums.ptr()),
        )
        .unwrap();
    space.check_errors().unwrap();
    let took = t0.elapsed();
    let (expect, expect_sums) = replay(initial, threads, ops, s);
    let mut got_sums = vec![0u64; threads as usize];
    sums.download(0, &mut got_sums).unwrap();
    let bad_sums = got_sums
        .iter()
        .zip(&expect_sums)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        bad_sums, 0,
        "{bad_sums} threads read something else than the replay"
    );
    let back = read_all(space);
    let bad = back.iter().zip(&expect).filter(|(a, b)| a != b).count();
    let st = space.stats().unwrap();
    eprintln!(
        "  {} pages of {} KiB, {} frames: {took:?}, faults {} writebacks {} host-cache loads {}, {bad} words differ",
        space.size() / space.page_size(),
        space.page_size() >> 10,
        space.frames(),
        st.faults,
        st.writebacks,
        st.host_cache_loads
    );
    assert_eq!(bad, 0, "{bad} words differ from the replay");
    assert!(
        st.faults > u64::from(space.frames()),
        "the cache must have turned over"
    );
    expect
}

/// Random reads and writes from all SMs against a CPU replay, over memory and file stores,
/// pages 4 KiB, 64 KiB and 2 MiB, both policies; the file is closed, reopened and compared.
#[test]
fn random_reads_and_writes_match_a_cpu_replay_over_memory_and_file() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "store_kernels.cu").unwrap();
    let sr = EvictionPolicy::ScanResistant {
        protected_fraction: 0.5,
    };
    let dir = tempfile::tempdir().unwrap();
    for (page, policy, file, space_bytes) in [
        (4096u64, EvictionPolicy::Clock, false, 32u64 << 20),
        (4096, sr, true, 32 << 20),
        (64 << 10, sr, false, 64 << 20),
        (64 << 10, EvictionPolicy::Clock, true, 64 << 20),
        (2 << 20, EvictionPolicy::Clock, false, 128 << 20),
        (2 << 20, sr, true, 128 << 20),
    ] {
        let s = seed();
        eprintln!("page {page} {policy:?} file {file}");
        let initial = random_words((space_bytes / 8) as usize, s);
        let path = dir.path().join(format!("space-{page}-{file}"));
        let store: Arc<dyn Store> = if file {
            Arc::new(FileStore::create(&path, space_bytes).unwrap())
        } else {
            Arc::new(MemoryStore::try_new(space_bytes).unwrap())
        };
        write_words(store.as_ref(), &initial);
        let space = strata
            .space_over_store(
                store.clone(),
                space_bytes,
                &store_opts(page, space_bytes, policy),
            )
            .unwrap();
        let expect = random_rw_matches_replay(&strata, &module, &space, &initial, s);
        space.close().unwrap();
        // After close the store itself holds the result...
        let mut back = vec![0u64; expect.len()];
        store
            .read_at(0, bytemuck::cast_slice_mut(&mut back))
            .unwrap();
        assert!(
            back == expect,
            "the store differs from the replay after close"
        );
        drop(store);
        // ... and a file holds it for whoever opens it next.
        if file {
            let reopened = FileStore::open(
                &path,
                space_bytes,
                &strata_core::store::FileStoreOptions::default(),
            )
            .unwrap();
            let mut back = vec![0u64; expect.len()];
            reopened
                .read_at(0, bytemuck::cast_slice_mut(&mut back))
                .unwrap();
            assert!(back == expect, "the reopened file differs from the replay");
        }
    }
}

/// Random words in a memory store of `bytes`, and a fault injector in front of it.
fn faulty_memory(bytes: u64, s: u64) -> (Vec<u64>, Arc<dyn Store>, Arc<FaultyStore>) {
    let initial = random_words((bytes / 8) as usize, s);
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::try_new(bytes).unwrap());
    write_words(inner.as_ref(), &initial);
    let faulty = Arc::new(FaultyStore::new(inner.clone(), s));
    (initial, inner, faulty)
}

/// A store that fails every read: the kernel ends (no hang) with StoreFailed naming a page and
/// the store's message; pages flushed before are intact in the store; healed, the same kernel
/// works.
#[test]
fn a_store_failing_reads_is_an_error_not_a_hang() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "store_kernels.cu").unwrap();
    let s = seed();
    let bytes = 16u64 << 20;
    let page = 64u64 << 10;
    let (initial, inner, faulty) = faulty_memory(bytes, s);
    let space = strata
        .space_over_store(
            faulty.clone(),
            bytes,
            &store_opts(page, bytes, EvictionPolicy::Clock),
        )
        .unwrap();
    space.set_wait_limit(Duration::from_millis(500)).unwrap();
    faulty
        .set_plan(FaultPlan {
            read_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    let sums = DeviceBuffer::zeroed(strata.gpu(), 1 << 20).unwrap();
    let t0 = Instant::now();
    module
        .function("page_sweep")
        .unwrap()
        .launch(GRID, &Args::new().arg(space.handle()).arg(sums.ptr()))
        .unwrap();
    let err = space.check_errors().unwrap_err();
    let took = t0.elapsed();
    eprintln!("failing reads ended after {took:?}: {err}");
    assert!(took < Duration::from_secs(30), "bounded: {took:?}");
    match &err {
        SpaceError::StoreFailed { page, message, .. } => {
            assert!(*page < bytes / (64 << 10), "page {page}");
            assert!(!message.is_empty());
        }
        other => panic!("expected StoreFailed, got {other:?}"),
    }
    // Nothing was written, so the store still holds the initial data.
    let mut back = vec![0u64; initial.len()];
    inner
        .read_at(0, bytemuck::cast_slice_mut(&mut back))
        .unwrap();
    assert!(back == initial);
    // Healed (check_errors cleared the failed pages), the space works again.
    faulty.heal();
    space.set_wait_limit(Duration::from_secs(4)).unwrap();
    let expect = random_rw_matches_replay(&strata, &module, &space, &initial, s ^ 1);
    space.close().unwrap();
    inner
        .read_at(0, bytemuck::cast_slice_mut(&mut back))
        .unwrap();
    assert!(back == expect);
}

/// A store that fails every write: flush and close fail, and close hands back every dirty page
/// with its exact bytes; what was flushed before the failure is intact in the store.
#[test]
fn a_store_failing_writes_loses_no_dirty_page() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "store_kernels.cu").unwrap();
    let s = seed();
    let bytes = 16u64 << 20;
    let page = 64u64 << 10;
    let (initial, inner, faulty) = faulty_memory(bytes, s);
    let mut o = store_opts(page, bytes, EvictionPolicy::Clock);
    o.host_cache_bytes = Some(bytes); // every page fits: the failure shows at flush
    let space = strata.space_over_store(faulty.clone(), bytes, &o).unwrap();
    // One round, flushed: the store holds it.
    let add = module.function("add_one").unwrap();
    add.launch(GRID, &Args::new().arg(space.handle()).arg(1u64))
        .unwrap();
    space.flush().unwrap();
    let once: Vec<u64> = initial.iter().map(|w| w.wrapping_add(1)).collect();
    let mut back = vec![0u64; initial.len()];
    inner
        .read_at(0, bytemuck::cast_slice_mut(&mut back))
        .unwrap();
    assert!(back == once, "the first flush reached the store");
    // A second round, then the store refuses writes.
    add.launch(GRID, &Args::new().arg(space.handle()).arg(1u64))
        .unwrap();
    space.check_errors().unwrap();
    faulty
        .set_plan(FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    let e = space.flush().unwrap_err();
    eprintln!("flush with failing writes: {e}");
    let twice: Vec<u64> = initial.iter().map(|w| w.wrapping_add(2)).collect();
    // Write-back (the GPU's write-back warps and the host cache's) may have written pages of
    // the second round before the store began to refuse, also while the kernel was still
    // writing them: every word in the store is whole, either round's, never anything else.
    inner
        .read_at(0, bytemuck::cast_slice_mut(&mut back))
        .unwrap();
    for (i, w) in back.iter().enumerate() {
        assert!(
            *w == once[i] || *w == twice[i],
            "word {i} in the store is neither round's: {w:#x}"
        );
    }
    match space.close() {
        Err(SpaceError::Unflushed { pages, .. }) => {
            assert!(!pages.is_empty(), "the refused pages come back");
            // The store with the handed-back pages laid over it is exactly the second round.
            let mut view = back.clone();
            for (p, data) in pages {
                let words: &[u64] = bytemuck::cast_slice(&data);
                let at = (p * page / 8) as usize;
                view[at..at + words.len()].copy_from_slice(words);
            }
            let bad = view.iter().zip(&twice).filter(|(a, b)| a != b).count();
            assert_eq!(
                bad, 0,
                "{bad} words lost: neither in the store nor handed back"
            );
        }
        other => panic!("expected Unflushed, got {other:?}"),
    }
}

/// The ring's host threads are gone: kernels end within the wait limit with StoreFailed.
#[test]
fn a_dead_ring_server_is_an_error_not_a_hang() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "store_kernels.cu").unwrap();
    let bytes = 16u64 << 20;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::try_new(bytes).unwrap());
    let space = strata
        .space_over_store(
            store,
            bytes,
            &store_opts(64 << 10, bytes, EvictionPolicy::Clock),
        )
        .unwrap();
    space.set_wait_limit(Duration::from_millis(300)).unwrap();
    space.kill_ring_for_test();
    let sums = DeviceBuffer::zeroed(strata.gpu(), 1 << 20).unwrap();
    let t0 = Instant::now();
    module
        .function("page_sweep")
        .unwrap()
        .launch(GRID, &Args::new().arg(space.handle()).arg(sums.ptr()))
        .unwrap();
    let err = space.check_errors().unwrap_err();
    eprintln!("dead ring: {:?}: {err}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert!(matches!(err, SpaceError::StoreFailed { .. }), "{err:?}");
}

/// A memory node: the same replay over the network (UCX on loopback), then the node is killed
/// while a kernel runs: the kernel ends with StoreFailed, no hang.
#[test]
fn memory_node_replay_and_a_node_killed_mid_kernel() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    if strata_ucx::api().is_err() {
        eprintln!("skipped: UCX not found");
        return;
    }
    let module = strata.compile(KERNELS, "store_kernels.cu").unwrap();
    let s = seed();
    let bytes = 32u64 << 20;
    let token = format!("{:032x}", mix(s));
    let node = strata_net::MemoryNode::start(strata_net::ServeOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        4 * bytes,
        token.clone(),
    ))
    .expect("start a memory node on loopback");
    let options = strata_net::RemoteStoreOptions::new(
        vec![node.address().to_string()],
        token,
        Duration::from_secs(2),
    );
    let store: Arc<dyn Store> = Arc::new(strata_net::RemoteStore::connect(bytes, options).unwrap());
    let initial = random_words((bytes / 8) as usize, s);
    write_words(store.as_ref(), &initial);
    let space = strata
        .space_over_store(
            store.clone(),
            bytes,
            &store_opts(64 << 10, bytes, EvictionPolicy::Clock),
        )
        .unwrap();
    let expect = random_rw_matches_replay(&strata, &module, &space, &initial, s);
    let mut back = vec![0u64; expect.len()];
    store
        .read_at(0, bytemuck::cast_slice_mut(&mut back))
        .unwrap();
    assert!(back == expect, "the node holds the flushed result");
    // Kill the node while a long kernel runs (every page cold: evicted from both caches).
    space.evict(0..bytes).unwrap();
    space.set_wait_limit(Duration::from_secs(3)).unwrap();
    let add = module.function("add_one").unwrap();
    let t0 = Instant::now();
    add.launch(GRID, &Args::new().arg(space.handle()).arg(20u64))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    node.shutdown();
    let r = space.check_errors();
    eprintln!("node killed mid-kernel: {:?}: {r:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(120), "bounded");
    assert!(matches!(r, Err(SpaceError::StoreFailed { .. })), "{r:?}");
    // The space still closes: what could not go down comes back.
    match space.close() {
        Ok(()) | Err(SpaceError::Unflushed { .. }) => {}
        Err(e) => panic!("close after the node died: {e}"),
    }
}
