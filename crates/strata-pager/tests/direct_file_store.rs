//! A region over an `O_DIRECT` file store under eviction pressure: eviction batches of
//! scattered dirty pages go to the file together (through an `io_uring` where the kernel
//! allows), and after a flush the file itself holds every page written, byte for byte.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::sync::Arc;

use common::{Rng, config, uffd_available};
use strata_core::{FileStore, FileStoreOptions, Store};
use strata_pager::Region;

#[test]
fn scattered_dirty_pages_reach_a_direct_file_through_eviction_and_flush() {
    if !uffd_available("scattered_dirty_pages_reach_a_direct_file_through_eviction_and_flush") {
        return;
    }
    let mut rng = Rng::from_time("scattered_dirty_pages_reach_a_direct_file");
    // On the disk that holds the temporary directory (tmpfs refuses O_DIRECT: then skip).
    let dir = std::env::temp_dir().join(format!("strata-pager-direct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("direct.store");
    let page = 4096usize;
    let pages = 4096usize; // 16 MiB
    let size = page * pages;
    let options = FileStoreOptions {
        create: true,
        direct: true,
        ..Default::default()
    };
    let store = match FileStore::open(&path, size as u64, &options) {
        Ok(store) => Arc::new(store),
        Err(e) => {
            println!("skipped: {e} (no O_DIRECT here)");
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
    };
    let mut expect = vec![0u8; size];
    {
        // A budget of 1/16 of the region: almost every write evicts a dirty page.
        let dyn_store: Arc<dyn Store> = store.clone();
        let mut region = Region::new(dyn_store, size as u64, config(4096, 1 << 20, 2, 2)).unwrap();
        let slice = region.as_mut_slice();
        let mut fresh = vec![0u8; page];
        for round in 0..3 {
            // Random pages, each overwritten whole or in part with fresh random bytes.
            for _ in 0..pages {
                let p = rng.below(pages as u64) as usize;
                let from = if round == 0 {
                    0
                } else {
                    rng.below(page as u64) as usize
                };
                rng.fill(&mut fresh[from..]);
                let at = p * page;
                slice[at + from..at + page].copy_from_slice(&fresh[from..]);
                expect[at + from..at + page].copy_from_slice(&fresh[from..]);
            }
            // Read back a random sample through the pager (pages come back from the file).
            for _ in 0..512 {
                let p = rng.below(pages as u64) as usize;
                assert!(
                    slice[p * page..(p + 1) * page] == expect[p * page..(p + 1) * page],
                    "round {round}: page {p} read back wrong through the pager"
                );
            }
        }
        let stats = region.stats();
        assert!(
            stats.evictions > 1000,
            "the budget forced evictions: {stats}"
        );
        region.flush().unwrap();
        region.unmap().unwrap();
    }
    let queued = store.queued_writes();
    println!(
        "{queued} page runs written through the ring (ring refused: {})",
        store.ring_refused()
    );
    // Where the kernel lends rings (a container's seccomp profile may not).
    if !store.ring_refused() {
        assert!(
            queued > 100,
            "eviction batches went through the ring ({queued} runs)"
        );
    }
    drop(store);
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len(), size);
    let wrong: Vec<usize> = (0..pages)
        .filter(|&p| file[p * page..(p + 1) * page] != expect[p * page..(p + 1) * page])
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        wrong.is_empty(),
        "pages not in the file after flush: {wrong:?}"
    );
}
