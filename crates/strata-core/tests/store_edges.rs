//! Stores at their edges: a file shortened behind the store's back must read as an error,
//! never as zeros (the O_DIRECT bounce path used to treat the early end of file as zeros), and
//! a memory store too large for this machine is an error, not an abort.

// Test arithmetic runs on 64-bit hosts only; the casts below size in-memory buffers.
#![allow(clippy::cast_possible_truncation)]

use rand::{RngCore, SeedableRng, rngs::StdRng};
use strata_core::{FileStore, FileStoreOptions, MemoryStore, Store, StoreError};

const BLOCK: u64 = 4096;

fn random(len: usize) -> Vec<u8> {
    let seed = rand::rng().next_u64();
    println!("seed {seed}");
    let mut data = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

/// Opens a store over a file in a directory on the work tree's file system (tmpfs refuses
/// O_DIRECT); `None` where the file system refuses O_DIRECT anyway.
fn open(dir: &std::path::Path, size: u64, direct: bool) -> Option<FileStore> {
    let opts = FileStoreOptions {
        create: true,
        direct,
        ..Default::default()
    };
    match FileStore::open(dir.join("f"), size, &opts) {
        Ok(store) => Some(store),
        Err(e) if direct && e.to_string().contains("Invalid argument") => {
            println!("skipped O_DIRECT: this file system refuses it: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_file_truncated_behind_the_store_reads_as_an_error_not_zeros() {
    for direct in [false, true] {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let size = 3 * BLOCK;
        let Some(store) = open(dir.path(), size, direct) else {
            continue;
        };
        let data = random(size as usize);
        store.write_at(0, &data).unwrap();
        store.flush().unwrap();
        // Another program cuts the file to one block.
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("f"))
            .unwrap()
            .set_len(BLOCK)
            .unwrap();
        // Unaligned (the bounce path under O_DIRECT) and aligned reads past the cut.
        for (offset, len) in [(5000, 100), (BLOCK - 10, 20), (2 * BLOCK, BLOCK as usize)] {
            let mut out = vec![0xa5u8; len];
            let e = store.read_at(offset, &mut out).unwrap_err();
            assert!(
                matches!(e, StoreError::Io { .. }),
                "direct={direct} {offset}+{len}: {e}"
            );
            assert!(e.to_string().contains("shorter than the store"), "{e}");
        }
        // Under O_DIRECT an unaligned write there would rebuild the lost block from zeros
        // (read-modify-write): refused too. (A plain pwrite just writes, as files do.)
        if direct {
            let e = store.write_at(5000, b"x").unwrap_err();
            assert!(e.to_string().contains("shorter than the store"), "{e}");
        }
        // What is still there reads.
        let mut out = vec![0u8; 100];
        store.read_at(10, &mut out).unwrap();
        assert_eq!(out, data[10..110]);
    }
}

#[test]
fn the_unaligned_end_of_a_direct_store_reads_and_writes() {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let size = 2 * BLOCK + 100; // the last block is partly past the file's end
    let Some(store) = open(dir.path(), size, true) else {
        return;
    };
    let data = random(size as usize);
    store.write_at(0, &data).unwrap();
    let mut out = vec![0u8; 150];
    store.read_at(size - 150, &mut out).unwrap();
    assert_eq!(out, data[(size - 150) as usize..]);
    store.write_at(size - 1, b"z").unwrap();
    store.read_at(size - 1, &mut out[..1]).unwrap();
    assert_eq!(out[0], b'z');
    // The whole-block write of the tail did not leave the file longer than the store.
    let len = std::fs::metadata(dir.path().join("f")).unwrap().len();
    assert_eq!(len, size, "the file grew past the store");
}

#[test]
fn a_memory_store_too_large_for_this_machine_is_an_error() {
    for size in [u64::MAX, 1 << 62] {
        let e = MemoryStore::try_new(size).unwrap_err();
        assert!(e.to_string().contains("too large for this machine"), "{e}");
    }
    let store = MemoryStore::try_new(1 << 20).unwrap();
    assert_eq!(store.size(), 1 << 20);
}

/// Slots that are not block-aligned (a codec's: a page plus a 24-byte header each), written
/// from several threads at once under `O_DIRECT`: neighbouring slots share a block, and each
/// unaligned write rewrites its covering blocks. None may lose a neighbour's bytes. Each round
/// every thread rewrites its slots, all wait, and each checks its own.
#[test]
fn concurrent_unaligned_direct_writes_to_neighbouring_slots_keep_every_byte() {
    const SLOT: usize = 4096 + 24;
    const SLOTS: usize = 64;
    const THREADS: usize = 4;
    const ROUNDS: usize = 60;
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let Some(store) = open(dir.path(), (SLOT * SLOTS) as u64, true) else {
        return;
    };
    let seed = rand::rng().next_u64();
    println!("seed {seed}");
    let written = std::sync::Barrier::new(THREADS);
    let checked = std::sync::Barrier::new(THREADS);
    let lost = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (store, written, checked, lost) = (&store, &written, &checked, &lost);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t as u64);
                // Thread t owns the slots s with s % THREADS == t, so neighbours always belong
                // to different threads and every shared block is written by two of them.
                let mine: Vec<usize> = (0..SLOTS).filter(|s| s % THREADS == t).collect();
                let mut last = vec![Vec::new(); SLOTS];
                for round in 0..ROUNDS {
                    for &s in &mine {
                        let mut bytes = vec![0u8; SLOT];
                        rng.fill_bytes(&mut bytes);
                        store.write_at((s * SLOT) as u64, &bytes).unwrap();
                        last[s] = bytes;
                    }
                    written.wait();
                    for &s in &mine {
                        let mut got = vec![0u8; SLOT];
                        store.read_at((s * SLOT) as u64, &mut got).unwrap();
                        if got != last[s] {
                            // Noted, not panicked on here: the other threads wait at the
                            // barriers for this one.
                            lost.lock().unwrap().push((round, s));
                        }
                    }
                    checked.wait();
                }
            });
        }
    });
    let lost = lost.into_inner().unwrap();
    assert!(
        lost.is_empty(),
        "(round, slot) that lost bytes to a neighbour's write: {lost:?}"
    );
}
