//! The CPU half of [`UnifiedOverStore`]'s protocol, without a GPU: a real pager region over a
//! logging store, with the GPU side's store writes made through the GPU log as a space's
//! ring and flush make them (whole pages). Fresh random data each run (the seed is printed).
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::MemoryStore;
use strata_core::store::{FaultPlan, FaultyStore};

use super::*;

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

/// A CPU side of `size` bytes over `inner` with a buffer of `buffer` bytes.
fn cpu_side(inner: Arc<dyn Store>, size: u64, page: u64, buffer: u64) -> CpuSide {
    let cpu_log = Arc::new(LoggingStore::new(inner.clone(), page));
    let gpu_log = Arc::new(LoggingStore::new(inner, page));
    CpuSide::new(cpu_log, gpu_log, size, page, buffer).expect("userfaultfd works here (root)")
}

/// The GPU side writes whole pages `pages` (new random bytes) to the store through its log
/// `gpu_log`, as a space's flush does, and the replay follows.
fn gpu_writes(
    gpu_log: &LoggingStore,
    page: u64,
    replay: &mut [u8],
    pages: &[u64],
    rng: &mut StdRng,
) {
    let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
    for &p in pages {
        let at = (p * page) as usize;
        rng.fill(&mut replay[at..at + page as usize]);
        batch.push((p * page, replay[at..at + page as usize].to_vec()));
    }
    let requests: Vec<(u64, &[u8])> = batch.iter().map(|(o, b)| (*o, &b[..])).collect();
    gpu_log.write_batch(&requests).unwrap();
}

/// The CPU writes `writes` random bytes at random places of the region; returns the pages.
/// Each byte written differs from `synced` (the bytes the store held for it when the phase
/// began), so every page written is still changed at the hand-over: random bytes could put a
/// page back to the store's bytes (one byte written twice: about once in 256), and the pager
/// rightly writes no such page back (`a_page_put_back_to_its_stored_bytes_is_not_handed_over`).
fn cpu_writes(
    side: &mut CpuSide,
    replay: &mut [u8],
    synced: &[u8],
    writes: u64,
    rng: &mut StdRng,
) -> Vec<u64> {
    let size = side.size();
    let mut pages = BTreeSet::new();
    for _ in 0..writes {
        let at = rng.random_range(0..size) as usize;
        let v = synced[at].wrapping_add(rng.random_range(1..=255));
        replay[at] = v;
        side.region.as_mut_slice()[at] = v;
        pages.insert(at as u64 / side.page);
    }
    pages.into_iter().collect()
}

fn store_bytes(store: &dyn Store, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    store.read_at(0, &mut b).unwrap();
    b
}

fn random_pages(rng: &mut StdRng, pages: u64, most: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..rng.random_range(1..=most))
        .map(|_| rng.random_range(0..pages))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn the_log_records_written_pages_and_forwards_everything() {
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(64 << 10));
    let s = LoggingStore::new(inner.clone(), 4096);
    s.write_at(4096 * 3 + 10, &[7; 5000]).unwrap(); // pages 3 and 4
    s.write_batch(&[(0, &[1; 10][..]), (4096 * 9, &[2; 4096][..])])
        .unwrap();
    let mut b = [0u8; 5];
    s.read_at(4096 * 3 + 10, &mut b).unwrap();
    assert_eq!(b, [7; 5]);
    inner.read_at(4096 * 9, &mut b).unwrap();
    assert_eq!(b, [2; 5], "writes reach the store");
    assert_eq!(s.peek(), vec![0, 3, 4, 9], "peeking keeps the log");
    assert_eq!(s.take(), vec![0, 3, 4, 9]);
    assert!(s.take().is_empty(), "taking empties the log");
    s.restore(&[5, 2]);
    assert_eq!(s.take(), vec![2, 5], "restored pages come back sorted");
    assert!(
        s.write_at(64 << 10, &[1]).is_err(),
        "bad writes fail as the store's do"
    );
    assert_eq!(s.size(), 64 << 10);
}

/// Alternating phases, sizes that are and are not a multiple of the page (down to one byte),
/// CPU caches smaller than the data and as large: each sync to the GPU names exactly the
/// pages the CPU wrote and leaves the store (what kernels read) equal to the CPU's bytes;
/// each sync to the CPU drops exactly the GPU's pages, and the CPU reads both sides' bytes.
#[test]
fn phases_hand_over_exactly_the_pages_each_side_wrote() {
    let mut rng = rng();
    for (page, pages, short, buffer_div) in [
        (64u64 << 10, 96u64, 1234u64, 4u64),
        (64 << 10, 96, 0, 1),
        (4096, 200, 4095, 8),
        (4096, 1, 4095, 1), // one byte
        (4096, 2, 4095, 1), // one page and a byte
    ] {
        let rounded = page * pages;
        let size = rounded - short;
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(rounded));
        let mut side = cpu_side(
            inner.clone(),
            size,
            page,
            (rounded / buffer_div).max(2 * page),
        );
        let mut replay = vec![0u8; rounded as usize];
        for round in 0..6 {
            let what = format!("page {page}, size {size}, round {round}");
            let synced = replay.clone();
            let mine = cpu_writes(
                &mut side,
                &mut replay,
                &synced,
                rng.random_range(1..4 * pages),
                &mut rng,
            );
            assert_eq!(side.hand_to_gpu().unwrap(), mine, "{what}");
            assert!(
                store_bytes(inner.as_ref(), size as usize) == replay[..size as usize],
                "{what}: the store holds the CPU's bytes for kernels"
            );
            let theirs = random_pages(&mut rng, pages, pages.div_ceil(2));
            gpu_writes(&side.gpu_log, page, &mut replay, &theirs, &mut rng);
            side.refuse_cpu_writes().unwrap();
            assert_eq!(side.take_from_gpu().unwrap(), theirs, "{what}");
            assert_eq!(side.region.counters().dirty_pages, 0, "{what}");
            assert!(
                side.region.as_slice() == &replay[..size as usize],
                "{what}: the CPU sees both sides' bytes"
            );
            assert!(
                side.cpu_log.peek().is_empty(),
                "{what}: reads and drops write nothing"
            );
        }
    }
}

/// Syncs out of order are refused with a message naming the call to make, and move nothing;
/// when both sides wrote, the merging sync keeps each side's pages and lists the shared ones.
#[test]
fn syncs_out_of_order_are_refused_and_move_nothing() {
    let mut rng = rng();
    let page: u64 = 64 << 10;
    let pages: u64 = 32;
    let size = page * pages - 100;
    let rounded = page * pages;
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(rounded));
    let mut side = cpu_side(inner.clone(), size, page, rounded);
    let mut replay = vec![0u8; rounded as usize];
    let synced = replay.clone();
    cpu_writes(&mut side, &mut replay, &synced, 50, &mut rng);
    side.hand_to_gpu().unwrap();

    // The GPU wrote (kernels), and the CPU wrote during the GPU phase too.
    let mut replay_gpu = replay.clone();
    gpu_writes(&side.gpu_log, page, &mut replay_gpu, &[3, 4], &mut rng);
    let before = store_bytes(inner.as_ref(), rounded as usize);
    for (i, &p) in [4u64, 9, 20].iter().enumerate() {
        let at = (p * page + 17) as usize;
        side.region.as_mut_slice()[at] = i as u8 + 1;
    }
    // A second sync to the GPU: refused, nothing written (the pager's own eviction may have
    // written some of the CPU's three pages meanwhile: they are logged, not lost).
    let e = side.hand_to_gpu().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    assert!(e.to_string().contains("call sync_to_cpu"), "{e}");
    assert!(e.to_string().contains("nothing was moved"), "{e}");
    let logged = side.cpu_log.peek();
    assert!(logged.iter().all(|p| [4, 9, 20].contains(p)), "{logged:?}");
    // At least 3: a page a write-back is storing right now is already logged and still
    // counted dirty (seen once in 8 runs under load), so the sum may briefly be 4.
    let dirty = side.region.counters().dirty_pages;
    assert!(
        dirty + logged.len() as u64 >= 3 && dirty <= 3,
        "the CPU's writes kept (dirty, or logged by an eviction): {dirty} dirty, logged {logged:?}"
    );
    let store = store_bytes(inner.as_ref(), rounded as usize);
    let outside = |p: usize| ![4, 9, 20].contains(&(p as u64 / page));
    assert!(
        (0..rounded as usize)
            .filter(|&b| outside(b))
            .all(|b| store[b] == before[b]),
        "the refused sync wrote nothing"
    );
    // A plain sync to the CPU: refused, naming the way out.
    let e = side.refuse_cpu_writes().unwrap_err();
    assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{e}");
    assert!(e.to_string().contains("sync_to_cpu_merging"), "{e}");

    // Merging: pages 3 and 4 were written down during the kernels (above), 9 and 30 at the
    // GPU's flush, which comes after the CPU's writes reach the store.
    let gpu_log = side.gpu_log.clone();
    let (gpu, both) = side
        .merge_from_gpu(|| {
            gpu_writes(&gpu_log, page, &mut replay_gpu, &[9, 30], &mut rng);
            Ok(())
        })
        .unwrap();
    assert_eq!(gpu, vec![3, 4, 9, 30]);
    assert_eq!(both, vec![4, 9], "pages both sides wrote are listed");
    // Page 20 only the CPU wrote: its byte on both sides; 3 and 30 only the GPU: the GPU's
    // bytes; 4 and 9 both: one side's whole page (here 4 the CPU's, 9 the GPU's, by order).
    let seen = side.region.as_slice();
    let store = store_bytes(inner.as_ref(), rounded as usize);
    assert_eq!(seen[(20 * page + 17) as usize], 3);
    for p in [3u64, 30] {
        let r = (p * page) as usize..((p + 1) * page) as usize;
        assert!(
            seen[r.clone()] == replay_gpu[r],
            "page {p}: the GPU's bytes"
        );
    }
    assert!(
        seen == &store[..size as usize],
        "both sides agree on every page"
    );
    // The CPU's pages stay listed for the next sync to the GPU, which drops their GPU copies.
    side.refuse_cpu_writes().unwrap_err();
    assert_eq!(side.hand_to_gpu().unwrap(), vec![4, 9, 20]);
    side.refuse_cpu_writes().unwrap();
}

/// A store that refuses writes: the sync to the GPU fails saying what to do, the CPU's bytes
/// stay in the region (dirty) and nothing half-done is forgotten: once the store works again,
/// the repeated sync writes every page and names every page the CPU wrote. Torn writes too.
#[test]
fn a_store_that_fails_writes_loses_nothing() {
    let mut rng = rng();
    let page: u64 = 4096;
    let pages: u64 = 64;
    let size = page * pages - 7;
    let rounded = page * pages;
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(rounded));
    let faulty = Arc::new(FaultyStore::new(memory.clone(), rng.random()));
    let mut side = cpu_side(faulty.clone(), size, page, rounded / 2);
    let mut replay = vec![0u8; rounded as usize];
    for plan in [
        FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        },
        FaultPlan {
            short_write: 0.5,
            write_error: 0.3,
            ..FaultPlan::default()
        },
    ] {
        let synced = replay.clone();
        let mine = cpu_writes(&mut side, &mut replay, &synced, 300, &mut rng);
        faulty.set_plan(plan.clone()).unwrap();
        // (The pager's eviction may have written some pages already: they are logged too.)
        let before = store_bytes(memory.as_ref(), rounded as usize);
        let e = side.hand_to_gpu().unwrap_err();
        assert!(matches!(e, UnifiedError::Region { .. }), "{e}");
        assert!(e.to_string().contains("fix the store and repeat"), "{e}");
        if plan.short_write == 0.0 {
            assert!(store_bytes(memory.as_ref(), rounded as usize) == before);
        }
        // The region is not read while the store refuses writes: a page that is not resident
        // needs a frame, and with every frame dirty and no write possible the pager answers
        // that fault with SIGBUS (a failing store's documented outcome). Whether some frame
        // happens to be clean depends on the background write-back's timing, which made this
        // test fail about once in 8 runs under load. The bytes are checked once it is healed.
        if plan.write_error >= 1.0 {
            // Nothing can be written, by the flush or by an evictor: the pages stay dirty (an
            // evictor retrying one holds it in transition for a moment). (With a store that
            // fails only some writes, an evictor may store and evict them meanwhile.)
            let c = side.region.counters();
            assert!(c.dirty_pages + c.pages_in_transition > 0, "{c:?}");
        }
        faulty.heal();
        assert_eq!(
            side.hand_to_gpu().unwrap(),
            mine,
            "every page named once repeated"
        );
        assert!(
            store_bytes(memory.as_ref(), size as usize) == replay[..size as usize],
            "the store holds every page after the repeat"
        );
        assert!(
            side.region.as_slice() == &replay[..size as usize],
            "the CPU's bytes are kept"
        );
    }
}

#[test]
fn bad_stores_and_caches_are_refused_saying_what_to_do() {
    let store = MemoryStore::new(100 << 10);
    let e = check_store_and_cache(&store, 128 << 10, 64 << 10, 1 << 20).unwrap_err();
    assert!(e.to_string().contains("use a larger store"), "{e}");
    let store = MemoryStore::new(1 << 20);
    let e = check_store_and_cache(&store, 128 << 10, 64 << 10, 192 << 10).unwrap_err();
    assert!(e.to_string().contains("at least 262144 bytes"), "{e}");
    check_store_and_cache(&store, 128 << 10, 64 << 10, 256 << 10).unwrap();
}

/// Random sequences of every step, right and wrong, against a replay: CPU writes, GPU-side
/// store writes, syncs both ways, syncs out of order (refused with nothing lost), CPU writes
/// during a GPU phase to pages the GPU leaves alone and the merging sync; small buffers so the
/// pager evicts (and writes) on its own throughout. After each sync to the GPU the store holds
/// the CPU's bytes; after each sync to the CPU the CPU sees every write of both sides.
#[test]
fn random_step_sequences_keep_both_sides_coherent() {
    let mut rng = rng();
    for _ in 0..6 {
        let page: u64 = if rng.random_bool(0.5) { 4096 } else { 64 << 10 };
        let pages: u64 = rng.random_range(1..40);
        let rounded = page * pages;
        let size = rounded - rng.random_range(0..page);
        let buffer = page * rng.random_range(4..=pages.max(4));
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(rounded));
        let mut side = cpu_side(inner.clone(), size, page, buffer);
        let what = format!("page {page}, size {size}, buffer {buffer}");
        let mut replay = vec![0u8; rounded as usize];
        // What the store holds for each byte as far as the CPU knows (last hand-over, GPU writes).
        let mut synced = replay.clone();
        let mut in_gpu_phase = false;
        let mut cpu_pages: BTreeSet<u64> = BTreeSet::new(); // written since the last hand-over
        let mut gpu_pages: BTreeSet<u64> = BTreeSet::new(); // written in this GPU phase
        for step in 0..60 {
            let at = format!("{what}, step {step}");
            match (in_gpu_phase, rng.random_range(0..4)) {
                (false, 0 | 1) => {
                    let n = rng.random_range(1..3 * pages + 2);
                    cpu_pages.extend(cpu_writes(&mut side, &mut replay, &synced, n, &mut rng));
                }
                (false, 2) => {
                    // A sync to the CPU in a CPU phase after CPU writes: refused.
                    if !cpu_pages.is_empty() {
                        let e = side.refuse_cpu_writes().unwrap_err();
                        assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{at}: {e}");
                    }
                }
                (false, _) => {
                    let got = side.hand_to_gpu().unwrap();
                    assert_eq!(got, cpu_pages.iter().copied().collect::<Vec<_>>(), "{at}");
                    assert!(
                        store_bytes(inner.as_ref(), size as usize) == replay[..size as usize],
                        "{at}: the store holds the CPU's bytes"
                    );
                    synced.copy_from_slice(&replay);
                    cpu_pages.clear();
                    in_gpu_phase = true;
                }
                (true, 0 | 1) => {
                    let theirs = random_pages(&mut rng, pages, pages.div_ceil(3));
                    let theirs: Vec<u64> = theirs
                        .into_iter()
                        .filter(|p| !cpu_pages.contains(p))
                        .collect();
                    gpu_writes(&side.gpu_log, page, &mut replay, &theirs, &mut rng);
                    for &p in &theirs {
                        let span = (p * page) as usize..((p + 1) * page) as usize;
                        synced[span.clone()].copy_from_slice(&replay[span]);
                    }
                    gpu_pages.extend(theirs);
                }
                (true, 2) => {
                    // Out of order: a second sync to the GPU, refused if the GPU wrote.
                    if gpu_pages.is_empty() {
                        // Allowed: it hands over what the CPU wrote in this phase (if any).
                        let got = side.hand_to_gpu().unwrap();
                        assert_eq!(got, cpu_pages.iter().copied().collect::<Vec<_>>(), "{at}");
                        synced.copy_from_slice(&replay);
                        cpu_pages.clear();
                    } else {
                        let e = side.hand_to_gpu().unwrap_err();
                        assert!(matches!(e, UnifiedError::PhaseOrder(_)), "{at}: {e}");
                    }
                    // The CPU (wrongly) writes a page the GPU has not written in this phase.
                    if let Some(p) = (0..pages).find(|p| !gpu_pages.contains(p)) {
                        let b = (p * page) as usize
                            + rng.random_range(0..(size - p * page).min(page)) as usize;
                        // Never the store's byte (see `cpu_writes`).
                        let v = synced[b].wrapping_add(rng.random_range(1..=255));
                        replay[b] = v;
                        side.region.as_mut_slice()[b] = v;
                        cpu_pages.insert(p);
                    }
                }
                (true, _) => {
                    if cpu_pages.is_empty() {
                        side.refuse_cpu_writes().unwrap();
                        let got = side.take_from_gpu().unwrap();
                        assert_eq!(got, gpu_pages.iter().copied().collect::<Vec<_>>(), "{at}");
                    } else {
                        assert!(side.refuse_cpu_writes().is_err(), "{at}");
                        let (got, both) = side.merge_from_gpu(|| Ok(())).unwrap();
                        assert_eq!(got, gpu_pages.iter().copied().collect::<Vec<_>>(), "{at}");
                        assert!(both.is_empty(), "{at}: {both:?}");
                    }
                    assert!(
                        side.region.as_slice() == &replay[..size as usize],
                        "{at}: the CPU sees both sides' writes"
                    );
                    gpu_pages.clear();
                    in_gpu_phase = false;
                }
            }
        }
    }
}

/// A page the CPU wrote and put back to the store's bytes is not handed over (the pager
/// skips writing it back), while a page left changed is: the case behind the exact
/// expectation in `phases_hand_over_exactly_the_pages_each_side_wrote`.
#[test]
fn a_page_put_back_to_its_stored_bytes_is_not_handed_over() {
    let mut rng = rng();
    let page = 4096u64;
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(2 * page));
    let mut side = cpu_side(inner.clone(), 2 * page, page, 2 * page);
    let v: u8 = rng.random_range(1..=255);
    let at = rng.random_range(0..page) as usize;
    let s = side.region.as_mut_slice();
    let byte = std::ptr::from_mut(&mut s[at]);
    // SAFETY: `byte` points into the region borrowed just above; volatile so that both
    // stores happen (page 0 is written, then holds the store's bytes again).
    unsafe {
        let old = std::ptr::read_volatile(byte);
        std::ptr::write_volatile(byte, old.wrapping_add(v));
        std::ptr::write_volatile(byte, old);
    }
    s[page as usize + at] ^= v; // page 1: changed
    assert_eq!(side.hand_to_gpu().unwrap(), vec![1]);
    assert_eq!(
        store_bytes(inner.as_ref(), 2 * page as usize)[page as usize + at],
        v
    );
}
