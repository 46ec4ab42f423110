//! `FileStore::write_batch` and `read_batch`: batches of scattered requests (through an `io_uring`
//! where the kernel allows) land every byte in the file, bad batches write nothing, and
//! overlapping or unaligned requests keep `write_at`'s meaning.

// Test arithmetic runs on 64-bit hosts only; the casts below index in-memory buffers.
#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use rand::{Rng, RngCore, SeedableRng, rngs::StdRng};
use strata_core::{FileStore, FileStoreOptions, Store, StoreError};

const PAGE: usize = 4096;

fn seed() -> u64 {
    let seed = rand::rng().next_u64();
    println!("seed {seed}");
    seed
}

/// `len` bytes starting on a page boundary (O_DIRECT needs aligned buffers), with the
/// allocation that holds them.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let storage = vec![0u8; len + PAGE];
    let start = storage.as_ptr().align_offset(PAGE);
    (storage, start)
}

fn open(path: &std::path::Path, size: u64, direct: bool) -> FileStore {
    let options = FileStoreOptions {
        create: true,
        direct,
        ..Default::default()
    };
    FileStore::open(path, size, &options).unwrap()
}

/// Random disjoint requests: page runs of 1-8 pages at page offsets (the pager's kind) and,
/// when `unaligned`, some runs at odd offsets and lengths. Returns (offset, len) of each, in
/// random order.
fn scattered(rng: &mut StdRng, pages: usize, count: usize, unaligned: bool) -> Vec<(u64, usize)> {
    let mut taken = vec![false; pages];
    let mut out = Vec::new();
    while out.len() < count {
        let n = rng.random_range(1..=8usize);
        let first = rng.random_range(0..pages - n);
        if taken[first..first + n].iter().any(|&t| t) {
            continue;
        }
        taken[first..first + n].fill(true);
        let mut offset = (first * PAGE) as u64;
        let mut len = n * PAGE;
        if unaligned && rng.random_bool(0.3) {
            // Start and end inside the run's first and last pages.
            let skip = rng.random_range(1..PAGE / 2);
            offset += skip as u64;
            len -= skip + rng.random_range(0..PAGE / 2);
        }
        out.push((offset, len));
    }
    out
}

/// Pages of the stores [`random_file`] opens.
const FILE_PAGES: usize = 1024;

/// A store over `dir/name` of [`FILE_PAGES`] pages holding random bytes: its path, the store
/// and the bytes.
fn random_file(
    rng: &mut StdRng,
    dir: &std::path::Path,
    name: &str,
    direct: bool,
) -> (std::path::PathBuf, FileStore, Vec<u8>) {
    let path = dir.join(name);
    let store = open(&path, (FILE_PAGES * PAGE) as u64, direct);
    let mut reference = vec![0u8; FILE_PAGES * PAGE];
    rng.fill_bytes(&mut reference);
    store.write_at(0, &reference).unwrap();
    (path, store, reference)
}

/// 150 scattered requests over [`FILE_PAGES`] pages (more than one ring's worth, 64, so a
/// batch goes in parts) and an aligned buffer where each request's bytes start on a page, as
/// a pager's pages do: the requests, the buffer, where its aligned part starts, and its length.
fn requests_with_room(
    rng: &mut StdRng,
    unaligned: bool,
) -> (Vec<(u64, usize)>, Vec<u8>, usize, usize) {
    let requests = scattered(rng, FILE_PAGES, 150, unaligned);
    let total: usize = requests.iter().map(|r| r.1.next_multiple_of(PAGE)).sum();
    let (storage, start) = aligned(total);
    (requests, storage, start, total)
}

#[test]
fn a_batch_of_scattered_requests_lands_every_byte() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    for direct in [true, false] {
        for unaligned in [false, true] {
            let name = format!("batch-{direct}-{unaligned}");
            let (path, store, mut reference) = random_file(&mut rng, dir.path(), &name, direct);
            let (requests, mut storage, start, total) = requests_with_room(&mut rng, unaligned);
            let data = &mut storage[start..start + total];
            rng.fill_bytes(data);
            let mut batch = Vec::new();
            let mut at = 0;
            for &(offset, len) in &requests {
                batch.push((offset, &data[at..at + len]));
                reference[offset as usize..offset as usize + len]
                    .copy_from_slice(&data[at..at + len]);
                at += len.next_multiple_of(PAGE);
            }
            store.write_batch(&batch).unwrap();
            store.flush().unwrap();
            // Where the kernel lends rings (a container's seccomp profile may not).
            // Every aligned request, and only those, goes through the ring (about 30 % of
            // the unaligned case's requests are not aligned, a random number).
            let aligned_requests = requests
                .iter()
                .filter(|&&(offset, len)| offset % PAGE as u64 == 0 && len % PAGE == 0)
                .count() as u64;
            if direct && !store.ring_refused() {
                assert_eq!(
                    store.queued_writes(),
                    aligned_requests,
                    "every aligned request, and only those, went through the ring"
                );
            }
            println!(
                "direct {direct} unaligned {unaligned}: {} of 150 requests queued (ring refused: {})",
                store.queued_writes(),
                store.ring_refused()
            );
            drop(store);
            // The file itself, read without the store, holds every byte.
            let file = std::fs::read(&path).unwrap();
            assert_eq!(file.len(), FILE_PAGES * PAGE, "the file keeps its size");
            if let Some(i) = (0..file.len()).find(|&i| file[i] != reference[i]) {
                panic!("direct {direct} unaligned {unaligned}: byte {i} differs (seed {seed})");
            }
        }
    }
}

#[test]
fn a_batch_with_a_bad_request_writes_nothing() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad");
    let size = 64 * PAGE as u64;
    let store = open(&path, size, true);
    let (mut storage, start) = aligned(4 * PAGE);
    let data = &mut storage[start..start + 4 * PAGE];
    rng.fill_bytes(data);
    // The last request reaches one byte past the end.
    let batch = [
        (0, &data[..PAGE]),
        (8 * PAGE as u64, &data[PAGE..2 * PAGE]),
        (size - PAGE as u64 + 1, &data[2 * PAGE..3 * PAGE]),
    ];
    let err = store.write_batch(&batch).unwrap_err();
    assert!(matches!(err, StoreError::OutOfRange { .. }), "{err}");
    drop(store);
    assert!(
        std::fs::read(&path).unwrap().iter().all(|&b| b == 0),
        "no request of a refused batch was written"
    );
    // A read-only store refuses the batch and leaves the file as it was.
    let ro = FileStoreOptions {
        read_only: true,
        direct: true,
        ..Default::default()
    };
    let store = FileStore::open(&path, size, &ro).unwrap();
    let err = store
        .write_batch(&[(0, &data[..PAGE]), (4 * PAGE as u64, &data[PAGE..2 * PAGE])])
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(store.queued_writes(), 0);
    drop(store);
    assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn overlapping_requests_in_a_batch_are_written_in_order() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("overlap"), 16 * PAGE as u64, true);
    let (mut storage, start) = aligned(3 * PAGE);
    let data = &mut storage[start..start + 3 * PAGE];
    rng.fill_bytes(data);
    // Page 1 is written twice: by a two-page request, then alone; the second must win.
    let batch = [
        (0, &data[..2 * PAGE]),
        (PAGE as u64, &data[2 * PAGE..]),
        (8 * PAGE as u64, &data[..PAGE]),
    ];
    store.write_batch(&batch).unwrap();
    let mut back = vec![0u8; 2 * PAGE];
    store.read_at(0, &mut back).unwrap();
    assert_eq!(&back[..PAGE], &data[..PAGE]);
    assert_eq!(
        &back[PAGE..],
        &data[2 * PAGE..],
        "the later request wins (seed {seed})"
    );
    store.read_at(8 * PAGE as u64, &mut back[..PAGE]).unwrap();
    assert_eq!(&back[..PAGE], &data[..PAGE]);
}

/// Several threads write batches at once (each takes its own ring) to disjoint pages.
#[test]
fn concurrent_batches_keep_every_page() {
    let seed = seed();
    let dir = tempfile::tempdir().unwrap();
    let pages = 2048;
    let threads = 4;
    let store = Arc::new(open(&dir.path().join("many"), (pages * PAGE) as u64, true));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t as u64) << 40);
                let mut reference = vec![None::<Vec<u8>>; pages];
                let (mut storage, start) = aligned(64 * PAGE);
                for _ in 0..20 {
                    // 64 random pages this thread owns (page % threads == t).
                    let mut mine: Vec<usize> = (0..64)
                        .map(|_| rng.random_range(0..pages / threads) * threads + t)
                        .collect();
                    mine.sort_unstable();
                    mine.dedup();
                    let data = &mut storage[start..start + mine.len() * PAGE];
                    rng.fill_bytes(data);
                    let batch: Vec<(u64, &[u8])> = mine
                        .iter()
                        .enumerate()
                        .map(|(i, &p)| ((p * PAGE) as u64, &data[i * PAGE..(i + 1) * PAGE]))
                        .collect();
                    store.write_batch(&batch).unwrap();
                    for (i, &p) in mine.iter().enumerate() {
                        reference[p] = Some(data[i * PAGE..(i + 1) * PAGE].to_vec());
                    }
                }
                reference
            })
        })
        .collect();
    let (mut back, start) = aligned(PAGE);
    for h in handles {
        for (page, want) in h.join().unwrap().into_iter().enumerate() {
            let Some(want) = want else { continue };
            store
                .read_at((page * PAGE) as u64, &mut back[start..start + PAGE])
                .unwrap();
            assert!(
                back[start..start + PAGE] == want[..],
                "page {page} (seed {seed})"
            );
        }
    }
}

/// `FileStore::read_batch` (through a ring where the requests fit one): every request gets
/// its own bytes, direct or buffered, aligned or not, over several ring loads; a request out
/// of range fails the batch with a range error.
#[test]
fn a_batch_of_scattered_reads_gets_every_byte() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let size = (FILE_PAGES * PAGE) as u64;
    for direct in [true, false] {
        for unaligned in [false, true] {
            let name = format!("read-{direct}-{unaligned}");
            let (_path, store, reference) = random_file(&mut rng, dir.path(), &name, direct);
            let (requests, mut storage, start, total) = requests_with_room(&mut rng, unaligned);
            let data = &mut storage[start..start + total];
            data.fill(0xA5);
            let mut batch = Vec::new();
            let mut rest = &mut data[..];
            for &(offset, len) in &requests {
                let (buf, tail) = rest.split_at_mut(len.next_multiple_of(PAGE));
                rest = tail;
                batch.push(strata_core::store::ReadRequest {
                    offset,
                    buf: &mut buf[..len],
                });
            }
            store.read_batch(&mut batch).unwrap();
            for (i, r) in batch.iter().enumerate() {
                let at = r.offset as usize;
                assert!(
                    r.buf[..] == reference[at..at + r.buf.len()],
                    "direct {direct} unaligned {unaligned}: request {i} at {at} read wrong bytes (seed {seed})"
                );
            }
            let mut past = [0u8; PAGE];
            let mut inside = [0u8; PAGE];
            let mut bad = [
                strata_core::store::ReadRequest {
                    offset: 0,
                    buf: &mut inside,
                },
                strata_core::store::ReadRequest {
                    offset: size,
                    buf: &mut past,
                },
            ];
            assert!(
                matches!(
                    store.read_batch(&mut bad),
                    Err(StoreError::OutOfRange { .. })
                ),
                "a request past the end fails the batch"
            );
        }
    }
}
