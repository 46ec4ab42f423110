//! Both stores under concurrent readers and writers, checked against a reference; FileStore
//! persistence, sizing rules, O_DIRECT, and out-of-range errors.

// Test arithmetic runs on 64-bit hosts only; the casts below index in-memory buffers.
#![allow(clippy::cast_possible_truncation)]

use std::sync::{Arc, Mutex};

use rand::{Rng, RngCore, SeedableRng, rngs::StdRng};
use strata_core::store::ReadRequest;
use strata_core::{FileStore, FileStoreOptions, MemoryStore, Store, StoreError};

const PAGE: usize = 4096;

fn seed() -> u64 {
    let seed = rand::rng().next_u64();
    println!("seed {seed}");
    seed
}

/// Eight threads each own a disjoint set of pages (so the expected contents are exact) and
/// write random runs into them while also reading random runs anywhere; at the end every
/// byte must equal the reference.
fn hammer(store: Arc<dyn Store>, pages: usize, seed: u64) {
    const THREADS: usize = 8;
    let reference = Arc::new(Mutex::new(vec![0u8; pages * PAGE]));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            let reference = Arc::clone(&reference);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t as u64) << 32);
                let mut buf = vec![0u8; 8 * PAGE];
                for _ in 0..300 {
                    // A write inside one page this thread owns (page % THREADS == t), at a
                    // random unaligned offset and length.
                    let first = rng.random_range(0..pages / THREADS) * THREADS + t;
                    let len = PAGE - rng.random_range(0..PAGE / 2);
                    let offset = (first * PAGE + rng.random_range(0..PAGE / 4)) as u64;
                    let len = len
                        .min(pages * PAGE - offset as usize)
                        .min((first + 1) * PAGE - offset as usize);
                    rng.fill_bytes(&mut buf[..len]);
                    {
                        // Hold the reference lock across the store write so the reference and
                        // the store agree on the final value of every byte.
                        let mut r = reference.lock().unwrap();
                        store.write_at(offset, &buf[..len]).unwrap();
                        r[offset as usize..offset as usize + len].copy_from_slice(&buf[..len]);
                    }
                    // Read a random run of up to 8 pages anywhere (racing other writers): it
                    // must succeed and have the right length; content is checked at the end.
                    let rlen = rng.random_range(1..=8 * PAGE);
                    let roff = rng.random_range(0..(pages * PAGE - rlen) as u64);
                    store.read_at(roff, &mut buf[..rlen]).unwrap();
                    // Our own page, which nobody else writes, must read back exactly.
                    let mut own = vec![0u8; len];
                    store.read_at(offset, &mut own).unwrap();
                    assert_eq!(
                        own,
                        reference.lock().unwrap()[offset as usize..offset as usize + len]
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread panicked");
    }
    let mut all = vec![0u8; pages * PAGE];
    store.read_at(0, &mut all).unwrap();
    assert!(
        all == *reference.lock().unwrap(),
        "store contents differ from the reference"
    );
    // Batched reads agree with single reads.
    let (a, b) = all.split_at_mut(PAGE * 3);
    let mut reqs = [
        ReadRequest {
            offset: (PAGE * 5) as u64,
            buf: &mut a[..PAGE],
        },
        ReadRequest {
            offset: 7,
            buf: &mut b[..100],
        },
    ];
    store.read_batch(&mut reqs).unwrap();
    let r = reference.lock().unwrap();
    assert_eq!(&a[..PAGE], &r[PAGE * 5..PAGE * 6]);
    assert_eq!(&b[..100], &r[7..107]);
}

#[test]
fn memory_store_concurrent_readers_and_writers() {
    let pages = 640; // spans many 256 KiB chunks
    hammer(
        Arc::new(MemoryStore::new((pages * PAGE) as u64)),
        pages,
        seed(),
    );
}

#[test]
fn file_store_concurrent_readers_and_writers() {
    let dir = tempfile::tempdir().unwrap();
    let pages = 640;
    let store = FileStore::create(dir.path().join("s"), (pages * PAGE) as u64).unwrap();
    hammer(Arc::new(store), pages, seed());
}

#[test]
fn direct_file_store_concurrent_readers_and_writers() {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let path = dir.path().join("d");
    let pages = 256;
    let opts = FileStoreOptions {
        create: true,
        direct: true,
        ..Default::default()
    };
    match FileStore::open(&path, (pages * PAGE) as u64, &opts) {
        Ok(store) => hammer(Arc::new(store), pages, seed()),
        // tmpfs and some overlay file systems refuse O_DIRECT; say so rather than pass silently.
        Err(e) if e.to_string().contains("Invalid argument") => {
            println!("skipped: this file system refuses O_DIRECT: {e}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn file_store_persists_across_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let size = 10 * PAGE as u64 + 123; // partial last page
    let mut rng = StdRng::seed_from_u64(seed());
    let mut data = vec![0u8; size as usize];
    rng.fill_bytes(&mut data);
    {
        let store = FileStore::create(&path, size).unwrap();
        store.write_at(0, &data).unwrap();
        store.flush().unwrap();
    }
    let store = FileStore::open(&path, size, &FileStoreOptions::default()).unwrap();
    let mut back = vec![0u8; size as usize];
    store.read_at(0, &mut back).unwrap();
    assert!(back == data);
    // The file is exactly the requested size and was created sparse.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
}

#[test]
fn file_store_is_sparse_when_created() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let store = FileStore::create(&path, 1 << 30).unwrap();
    store.write_at(123 << 20, b"x").unwrap();
    let blocks = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks * 512 < 1 << 20,
        "a 1 GiB store with one byte written uses {} bytes",
        blocks * 512
    );
    let mut b = [1u8; 4];
    store.read_at(5 << 20, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
}

#[test]
fn short_file_is_refused_unless_growing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short");
    std::fs::write(&path, vec![7u8; 1000]).unwrap();
    let err = FileStore::open(&path, 8192, &FileStoreOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("holds 1000 bytes but the store needs 8192") && msg.contains("grow"),
        "{msg}"
    );
    // `create` does not silently grow an existing non-empty file either.
    let opts = FileStoreOptions {
        create: true,
        ..Default::default()
    };
    assert!(FileStore::open(&path, 8192, &opts).is_err());
    let opts = FileStoreOptions {
        grow: true,
        ..Default::default()
    };
    let store = FileStore::open(&path, 8192, &opts).unwrap();
    let mut b = [0u8; 2];
    store.read_at(999, &mut b).unwrap();
    assert_eq!(b, [7, 0], "old bytes kept, grown tail reads as zero");
    // A longer file is fine and only its prefix is used.
    assert_eq!(
        FileStore::open(&path, 100, &FileStoreOptions::default())
            .unwrap()
            .size(),
        100
    );
    // Missing file without create.
    let err =
        FileStore::open(dir.path().join("none"), 10, &FileStoreOptions::default()).unwrap_err();
    assert!(err.to_string().contains("cannot open"), "{err}");
    let opts = FileStoreOptions {
        read_only: true,
        grow: true,
        ..Default::default()
    };
    assert!(
        FileStore::open(&path, 8192, &opts)
            .unwrap_err()
            .to_string()
            .contains("read-only")
    );
}

#[test]
fn read_only_file_store_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro");
    std::fs::write(&path, vec![1u8; 4096]).unwrap();
    let opts = FileStoreOptions {
        read_only: true,
        ..Default::default()
    };
    let store = FileStore::open(&path, 4096, &opts).unwrap();
    let err = store.write_at(0, b"x").unwrap_err();
    assert!(matches!(err, StoreError::Io { op: "write", .. }), "{err}");
    assert!(err.to_string().contains("read-only"));
}

#[test]
fn out_of_range_requests_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<Box<dyn Store>> = vec![
        Box::new(MemoryStore::new(10_000)),
        Box::new(FileStore::create(dir.path().join("r"), 10_000).unwrap()),
    ];
    for store in &stores {
        let mut buf = [0u8; 16];
        for offset in [9_990, 10_000, u64::MAX - 4, u64::MAX] {
            let err = store.read_at(offset, &mut buf).unwrap_err();
            assert!(
                matches!(err, StoreError::OutOfRange { size: 10_000, .. }),
                "{err}"
            );
            assert!(store.write_at(offset, &buf).is_err());
        }
        assert!(err_text(store.as_ref()).contains("reaches past the store's end"));
        // Exactly up to the end is fine; zero-length at the end is fine.
        store.read_at(9_984, &mut buf).unwrap();
        store.write_at(10_000, &[]).unwrap();
    }
}

fn err_text(store: &dyn Store) -> String {
    store
        .read_at(10_000, &mut [0u8; 1])
        .unwrap_err()
        .to_string()
}

#[test]
fn memory_store_is_sparse_and_zero_filled() {
    let store = MemoryStore::new(64 << 30); // 64 GiB of address space
    assert_eq!(store.resident_bytes(), 0);
    let mut b = [9u8; 8];
    store.read_at(40 << 30, &mut b).unwrap();
    assert_eq!(b, [0; 8]);
    store.write_at((40 << 30) - 3, b"straddle").unwrap(); // crosses a chunk boundary
    assert_eq!(store.resident_bytes(), 2 * 256 * 1024);
    let mut back = [0u8; 8];
    store.read_at((40 << 30) - 3, &mut back).unwrap();
    assert_eq!(&back, b"straddle");
    assert!(store.describe().contains("64 GiB"));
    let copy = MemoryStore::from_bytes(b"hello");
    let mut h = [0u8; 5];
    copy.read_at(0, &mut h).unwrap();
    assert_eq!(&h, b"hello");
}
