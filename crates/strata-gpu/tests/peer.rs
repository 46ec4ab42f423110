//! GPU tests of the peer tier (memory borrowed from a neighbour GPU as a victim cache). The
//! data tests need two GPUs that reach each other (the device tool's `nvidia-h200-x2`); with
//! fewer they print `skipped` and pass. Bad options are checked on any GPU.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use std::sync::Arc;

use strata_gpu::driver::Args;
use strata_gpu::space::PeerBorrow;
use strata_gpu::{EvictionPolicy, SpaceError, SpaceOptions, Strata};

mod common;
use common::{check_read_random, opts, random_words, replay_rmw_owned, seed, strata_or_skip};

const KERNELS: &str = include_str!("gpu_kernels.cu");

fn gpu_count() -> usize {
    strata_gpu::probe::gpus().map(|g| g.len()).unwrap_or(0)
}

fn two_gpus() -> Option<Strata> {
    let strata = strata_or_skip()?;
    if gpu_count() < 2 {
        eprintln!("skipped: needs two GPUs (this machine has {})", gpu_count());
        return None;
    }
    Some(strata)
}

fn with_peer(page: u64, cache: u64, policy: EvictionPolicy, borrow: u64) -> SpaceOptions {
    SpaceOptions {
        peers: vec![PeerBorrow {
            gpu: 1,
            bytes: borrow,
        }],
        ..opts(page, cache, policy)
    }
}

/// Random read-modify-writes from every SM, then random reads, then a read-back, against a
/// host replay, with GPU 1's memory borrowed as a victim cache: enough for the whole space,
/// and less than needed (slots reused while faults read them), 2x to 8x the local cache.
#[test]
fn peer_tier_matches_a_host_replay() {
    let Some(strata) = two_gpus() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let rmw = module.function("rmw_owned").unwrap();
    let read = module.function("read_random").unwrap();
    let grid = rmw.full_grid(256).unwrap();
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    let cache = 32u64 << 20;
    for (page, ratio, borrow_fraction, policy) in [
        (4u64 << 10, 2u64, 1.0f64, EvictionPolicy::Clock),
        (4 << 10, 8, 0.25, EvictionPolicy::Clock),
        (64 << 10, 4, 1.0, EvictionPolicy::Clock),
        (
            64 << 10,
            4,
            0.5,
            EvictionPolicy::ScanResistant {
                protected_fraction: 0.5,
            },
        ),
        (2 << 20, 4, 1.0, EvictionPolicy::Clock),
    ] {
        let s = seed();
        let bytes = cache * ratio;
        let n = (bytes / 8) as usize;
        #[allow(clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let borrow = ((bytes - cache) as f64 * borrow_fraction) as u64 / (2 << 20) * (2 << 20);
        let borrow = borrow.max(2 << 20);
        let mut space = strata
            .space(bytes, &with_peer(page, cache, policy, borrow))
            .unwrap();
        let mut reference = random_words(n, s);
        space.fill_from_slice(0, &reference).unwrap();
        let ops = if page >= 2 << 20 { 1 } else { 4 };
        // Two rounds: the second faults pages the first left in peer slots.
        for round in 0..2u64 {
            let rs = s ^ round;
            rmw.launch(grid, &Args::new().arg(space.handle()).arg(ops).arg(rs))
                .unwrap();
            space.check_errors().unwrap();
            replay_rmw_owned(&mut reference, threads, ops, rs);
        }
        let what = format!("page {page} ratio {ratio} borrow {borrow}");
        check_read_random(&read, &space, grid, &reference, 4, s ^ 0x5555, &what);
        let st = space.stats().unwrap();
        let mut back = vec![0u64; n];
        space.read_back(0, &mut back).unwrap();
        let bad = back.iter().zip(&reference).filter(|(a, b)| a != b).count();
        eprintln!(
            "page {page} ratio {ratio} borrow {borrow} {policy:?}: faults {} peer {:?}",
            st.faults, st.peer
        );
        assert_eq!(bad, 0, "page {page} ratio {ratio}: {bad} words differ");
        let peer = st.peer.expect("a space with a peer tier reports it");
        assert!(
            peer.stores > 0 && peer.loads > 0,
            "the peer tier was not used: {peer:?}"
        );
        assert_eq!(
            (peer.refused, peer.reclaims, peer.reclaimed_chunks),
            (0, 0, 0),
            "memory this process borrowed itself is never refused or reclaimed: {peer:?}"
        );
    }
}

/// Host writes into the space drop the peer copies of what they overwrite: a kernel reading
/// after a fill sees the new bytes, never a stale peer copy.
#[test]
fn fills_drop_stale_peer_copies() {
    let Some(strata) = two_gpus() else {
        return;
    };
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let rmw = module.function("rmw_owned").unwrap();
    let read = module.function("read_random").unwrap();
    let grid = rmw.full_grid(256).unwrap();
    let cache = 16u64 << 20;
    let bytes = 4 * cache;
    let n = (bytes / 8) as usize;
    let mut space = strata
        .space(
            bytes,
            &with_peer(4 << 10, cache, EvictionPolicy::Clock, bytes),
        )
        .unwrap();
    let s = seed();
    space.fill_from_slice(0, &random_words(n, s)).unwrap();
    rmw.launch(grid, &Args::new().arg(space.handle()).arg(4u64).arg(s))
        .unwrap();
    space.check_errors().unwrap();
    assert!(space.stats().unwrap().peer.unwrap().stores > 0);
    // New contents from the host, then random reads on the GPU.
    let fresh = random_words(n, s ^ 0xF00D);
    space.fill_from_slice(0, &fresh).unwrap();
    check_read_random(&read, &space, grid, &fresh, 8, s, "after a fill");
}

/// Borrowing from the space's own GPU, from a GPU that does not exist, too little, or for a
/// space over a store: refused with a reason, on any machine with a GPU.
#[test]
fn bad_peer_options_are_refused() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let cache = 4u64 << 20;
    let own = strata.gpu().ordinal();
    for (gpu, bytes, what) in [
        (own, 4u64 << 20, "own GPU"),
        (99, 4 << 20, "does not exist"),
        (1, 1 << 20, "less than one"),
    ] {
        let o = SpaceOptions {
            peers: vec![PeerBorrow { gpu, bytes }],
            ..opts(4 << 10, cache, EvictionPolicy::Clock)
        };
        let e = strata.space(4 * cache, &o).unwrap_err();
        eprintln!("{what}: {e}");
        assert!(
            e.to_string().contains(what),
            "borrowing {bytes} from GPU {gpu}: {e}"
        );
    }
    let store: Arc<dyn strata_core::store::Store> =
        Arc::new(strata_core::store::MemoryStore::try_new(4 * cache).unwrap());
    let o = SpaceOptions {
        peers: vec![PeerBorrow {
            gpu: 1,
            bytes: 4 << 20,
        }],
        ..opts(4 << 10, cache, EvictionPolicy::Clock)
    };
    let e = strata.space_over_store(store, 4 * cache, &o).unwrap_err();
    assert!(matches!(e, SpaceError::Invalid(_)), "{e}");
}
