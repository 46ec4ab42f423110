//! Crash consistency: once `Region::flush` has returned, killing the process with `SIGKILL`
//! (no destructor, no drop-time flush) loses nothing that was written before the flush.
//!
//! A child process maps a file store, writes, flushes twice, reports the flush on stdout,
//! then keeps dirtying other pages until the parent kills it. The parent then checks the file
//! against what the child had written before its flush.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::Duration;

use common::{Rng, uffd_available};
use strata_core::{FileStore, FileStoreOptions, PagerConfig, Store};
use strata_pager::Region;

const SIZE: usize = 4 << 20;
const VAR: &str = "PAGER_CRASH_CHILD";

/// What the child has written by its flush: the first half of the region, written twice.
fn model(seed: u64) -> (Vec<u8>, Vec<(usize, u8)>) {
    let mut rng = Rng(seed);
    let mut first = vec![0u8; SIZE / 2];
    rng.fill(&mut first);
    let rewrites = (0..20_000)
        .map(|_| (rng.below(SIZE as u64 / 2) as usize, rng.next() as u8))
        .collect();
    (first, rewrites)
}

fn child(arg: &str) {
    let mut parts = arg.split(',');
    let path = parts.next().unwrap();
    let seed: u64 = parts.next().unwrap().parse().unwrap();
    let page: u64 = parts.next().unwrap().parse().unwrap();
    let store = Arc::new(FileStore::create(path, SIZE as u64).unwrap());
    let config = PagerConfig::builder()
        .page_bytes(page)
        .buffer_bytes(512 << 10)
        .fillers(2)
        .evictors(1)
        .build()
        .unwrap();
    let mut region = Region::new(store, SIZE as u64, config).unwrap();
    let (first, rewrites) = model(seed);
    region.as_mut_slice()[..SIZE / 2].copy_from_slice(&first);
    region.flush().unwrap();
    for (i, v) in rewrites {
        region.as_mut_slice()[i] = v;
    }
    region.flush().unwrap();
    println!("FLUSHED");
    // Keep dirtying the second half (never flushed) until killed.
    let mut rng = Rng(seed ^ 0xDEAD);
    loop {
        let i = SIZE / 2 + rng.below(SIZE as u64 / 2) as usize;
        region.as_mut_slice()[i] = rng.next() as u8;
    }
}

#[test]
fn sigkill_after_flush_loses_nothing_in_a_file_store() {
    if let Ok(arg) = std::env::var(VAR) {
        child(&arg);
        return;
    }
    if !uffd_available("sigkill_after_flush_loses_nothing") {
        return;
    }
    let mut rng = Rng::from_time("sigkill_after_flush_loses_nothing");
    let dir = std::env::temp_dir().join(format!("strata-pager-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (n, page) in [4096u64, 64 << 10, 12 << 10].into_iter().enumerate() {
        let path = dir.join(format!("crash-{n}.bin"));
        let seed = rng.next();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sigkill_after_flush_loses_nothing_in_a_file_store",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(VAR, format!("{},{seed},{page}", path.display()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait for the flush report (on a thread, so a stuck child cannot hang the test).
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("FLUSHED") {
                    let _ = tx.send(());
                    break;
                }
            }
        });
        let flushed = rx.recv_timeout(Duration::from_secs(60));
        // Let the child dirty (and evict) more pages for a moment, then kill it hard.
        std::thread::sleep(Duration::from_millis(rng.below(200)));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(
            flushed.is_ok(),
            "page {page}: the child never flushed ({status:?})"
        );
        let store = FileStore::open(&path, SIZE as u64, &FileStoreOptions::default()).unwrap();
        let mut got = vec![0u8; SIZE / 2];
        store.read_at(0, &mut got).unwrap();
        let (mut expect, rewrites) = model(seed);
        for (i, v) in rewrites {
            expect[i] = v;
        }
        let bad = got.iter().zip(&expect).position(|(a, b)| a != b);
        assert_eq!(
            bad, None,
            "page {page}, seed {seed}: flushed bytes lost after SIGKILL (first at offset {bad:?})"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
