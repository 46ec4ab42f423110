//! The host side of the GPU-to-host request ring against a device emulated by threads
//! (`ring_host/device.rs`), checked against a replay (`ring_host/model.rs`). Every device wait
//! is bounded, so a broken server fails a test instead of hanging it.
#![allow(clippy::cast_possible_truncation)] // page indices and sizes in tests are small

#[path = "ring_host/device.rs"]
mod device;
#[path = "ring_host/model.rs"]
mod model;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::store::{
    FaultPlan, FaultyStore, FileStore, FileStoreOptions, ReadRequest, StoreError,
};
use strata_core::{MemoryStore, Store};
use strata_gpu::ring::layout::{REQ_WRITE, SlotWord};
use strata_gpu::ring::{PageOp, RingError, RingServer, RingServerOptions, SharedRing};

use device::{Device, DeviceError};
use model::Model;

const LIMIT: Duration = Duration::from_secs(15);

fn seed() -> u64 {
    let s: u64 = rand::random();
    eprintln!("seed {s}");
    s
}

fn start(
    store: Arc<dyn Store>,
    model: &Model,
    slots: u64,
    capacity: u32,
    options: RingServerOptions,
) -> (RingServer, Arc<Device>) {
    let shared = SharedRing::in_heap(
        capacity,
        model.pages(),
        slots,
        model.page_size as u64,
        model.space_size,
    )
    .unwrap();
    let server = RingServer::start(shared, store, options).unwrap();
    let device = Arc::new(Device::new(Arc::clone(server.shared()), LIMIT));
    (server, device)
}

/// `threads` device threads doing `ops` random accesses each: writes to pages they own
/// (page % threads == thread), often read back at once (read-after-write must see the write),
/// and reads of any page (a whole version no newer than the model's).
fn random_workload(device: &Device, model: &Model, threads: usize, ops: usize, seed: u64) {
    std::thread::scope(|s| {
        for tid in 0..threads {
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (tid as u64).wrapping_mul(0x51_7CC1));
                let pages = model.pages();
                let own: Vec<u64> = (0..pages)
                    .filter(|p| *p as usize % threads == tid)
                    .collect();
                let mut buf = vec![0u8; model.page_size];
                for _ in 0..ops {
                    let roll = rng.random_range(0..10);
                    if roll < 4 && !own.is_empty() {
                        let p = own[rng.random_range(0..own.len())];
                        if roll < 3 {
                            let data = model.next(p);
                            device.write(p, &data).unwrap();
                        }
                        if roll >= 1 {
                            device.read(p, &mut buf).unwrap();
                            model.check(p, &buf, Some(model.version(p)));
                        }
                    } else {
                        let p = rng.random_range(0..pages);
                        device.read(p, &mut buf).unwrap();
                        model.check(p, &buf, None);
                    }
                }
            });
        }
    });
}

/// A store that sleeps before each call (once per batch) and can panic on one offset.
#[derive(Debug)]
struct OddStore {
    inner: Arc<dyn Store>,
    delay: Duration,
    panic_at: Option<u64>,
}

impl OddStore {
    fn check(&self, offset: u64) {
        if self.panic_at == Some(offset) {
            panic!("test store breaks at offset {offset}");
        }
    }
}

impl Store for OddStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.check(offset);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        format!("odd({})", self.inner.describe())
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        for r in requests.iter_mut() {
            self.check(r.offset);
            self.inner.read_at(r.offset, r.buf)?;
        }
        Ok(())
    }
    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.inner.write_batch(requests)
    }
}

fn memory(model: &Model) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new(model.space_size));
    model.fill(&*store);
    store
}

#[test]
fn random_reads_and_writes_over_a_memory_store_with_4k_pages() {
    let seed = seed();
    let model = Model::new(seed, 4096, 96 * 4096);
    let store = memory(&model);
    let (server, device) = start(store.clone(), &model, 12, 16, RingServerOptions::default());
    random_workload(&device, &model, 8, 400, seed);
    server.flush().unwrap();
    model.check_store(&*store);
    let st = server.stats();
    eprintln!("{st:?}");
    assert!(st.write_requests > 0 && st.read_requests > 0);
    assert!(
        st.evictions > 0,
        "a cache of 12 slots over 96 pages must evict"
    );
    assert_eq!(st.dirty_slots, 0, "flush leaves nothing dirty");
    assert!(server.take_errors().is_empty());
    server.shutdown().unwrap();
}

#[test]
fn random_reads_and_writes_over_a_file_store_with_64k_pages_and_a_partial_last_page() {
    let seed = seed();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("space");
    let model = Model::new(seed, 64 << 10, 20 * (64 << 10) - 1000);
    let store: Arc<dyn Store> = Arc::new(FileStore::create(&path, model.space_size).unwrap());
    model.fill(&*store);
    let (server, device) = start(
        Arc::clone(&store),
        &model,
        5,
        8,
        RingServerOptions {
            threads: 2,
            ..RingServerOptions::default()
        },
    );
    random_workload(&device, &model, 6, 120, seed);
    // The last page again: its tail past the space's end reads as zeros (checked in `check`).
    let last = model.pages() - 1;
    let data = model.next(last);
    device.write(last, &data).unwrap();
    let mut buf = vec![1u8; model.page_size];
    device.read(last, &mut buf).unwrap();
    model.check(last, &buf, Some(model.version(last)));
    server.shutdown().unwrap();
    drop(device);
    drop(store);
    let reopened = FileStore::open(&path, model.space_size, &FileStoreOptions::default()).unwrap();
    model.check_store(&reopened);
}

#[test]
fn batches_form_under_load_with_a_slow_store() {
    let seed = seed();
    let model = Model::new(seed, 4096, 256 * 4096);
    let store = Arc::new(OddStore {
        inner: memory(&model),
        delay: Duration::from_millis(3),
        panic_at: None,
    });
    let (server, device) = start(
        store,
        &model,
        256,
        64,
        RingServerOptions {
            threads: 2,
            read_ahead_pages: 0,
            ..RingServerOptions::default()
        },
    );
    std::thread::scope(|s| {
        for tid in 0..16u64 {
            let (device, model) = (&device, &model);
            s.spawn(move || {
                let mut buf = vec![0u8; 4096];
                for i in 0..16 {
                    let p = i * 16 + tid;
                    device.read(p, &mut buf).unwrap();
                    model.check(p, &buf, Some(0));
                }
            });
        }
    });
    let st = server.stats();
    eprintln!("{st:?}");
    assert_eq!(st.read_requests, 256, "every page missed once");
    assert!(
        st.mean_batch > 1.5,
        "mean batch {} under load",
        st.mean_batch
    );
    assert!(
        st.store_read_batches < 200,
        "{} batches for 256 pages",
        st.store_read_batches
    );
    server.shutdown().unwrap();
}

#[test]
fn back_pressure_with_tiny_rings_and_many_threads() {
    for capacity in [2u32, 4] {
        let seed = seed();
        let model = Model::new(seed, 4096, 40 * 4096 + 512);
        let store = memory(&model);
        let (server, device) = start(
            store.clone(),
            &model,
            3,
            capacity,
            RingServerOptions {
                threads: 2,
                max_batch: 4,
                ..RingServerOptions::default()
            },
        );
        random_workload(&device, &model, 16, 60, seed);
        server.flush().unwrap();
        model.check_store(&*store);
        eprintln!("capacity {capacity}: {:?}", server.stats());
        server.shutdown().unwrap();
    }
}

#[test]
fn a_slow_store_still_completes() {
    let seed = seed();
    let model = Model::new(seed, 4096, 48 * 4096);
    let inner = memory(&model);
    let store = Arc::new(OddStore {
        inner: inner.clone(),
        delay: Duration::from_millis(2),
        panic_at: None,
    });
    let (server, device) = start(
        store,
        &model,
        6,
        8,
        RingServerOptions {
            threads: 2,
            dirty_high_water: 0.3,
            ..RingServerOptions::default()
        },
    );
    let t = Instant::now();
    random_workload(&device, &model, 6, 60, seed);
    server.shutdown().unwrap();
    eprintln!("slow store workload took {:?}", t.elapsed());
    model.check_store(&*inner);
}

#[test]
fn a_store_failing_reads_gives_error_words_and_messages_and_no_hang() {
    let seed = seed();
    let model = Model::new(seed, 4096, 32 * 4096);
    let faulty = Arc::new(FaultyStore::new(memory(&model), seed));
    let (server, device) = start(faulty.clone(), &model, 8, 8, RingServerOptions::default());
    let mut buf = vec![0u8; 4096];
    device.read(20, &mut buf).unwrap();
    faulty
        .set_plan(FaultPlan {
            read_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    let t = Instant::now();
    // Pages 2, 4, 6, 8: not a sequential run, so no read-ahead of the server's own.
    for p in (2..10).step_by(2) {
        assert_eq!(device.read(p, &mut buf), Err(DeviceError::Error(p)));
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "errors come fast: {:?}",
        t.elapsed()
    );
    // A failed read-ahead nobody waits for is forgotten, not an error: the word moves on
    // without ERROR and the next access retries.
    let before = SlotWord::decode(server.shared().slot_word(12).load(Ordering::Acquire));
    device.read_ahead(12).unwrap();
    let t = Instant::now();
    loop {
        let w = SlotWord::decode(server.shared().slot_word(12).load(Ordering::Acquire));
        if w.generation != before.generation {
            assert!(!w.error && !w.present, "{w:?}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "read-ahead never ended"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // A page already cached still reads.
    device.read(20, &mut buf).unwrap();
    model.check(20, &buf, Some(0));
    let errors = server.take_errors();
    let pages: Vec<u64> = errors.iter().map(|e| e.page).collect();
    assert_eq!(pages, vec![2, 4, 6, 8]);
    for e in &errors {
        assert_eq!(e.op, PageOp::Read);
        assert!(e.message.contains("injected read fault"), "{}", e.message);
    }
    assert!(server.take_errors().is_empty(), "taken once");
    // take_errors withdrew the ERROR words: after healing, the pages read fine.
    faulty.heal();
    for p in [2, 4, 6, 8, 12] {
        let w = SlotWord::decode(server.shared().slot_word(p).load(Ordering::Acquire));
        assert!(!w.error);
        device.read(p, &mut buf).unwrap();
        model.check(p, &buf, Some(0));
    }
    assert!(server.is_alive());
    server.shutdown().unwrap();
}

#[test]
fn a_store_failing_writes_keeps_pages_dirty_and_loses_nothing() {
    let seed = seed();
    let model = Model::new(seed, 4096, 32 * 4096);
    let inner = memory(&model);
    let faulty = Arc::new(FaultyStore::new(inner.clone(), seed));
    let (server, device) = start(faulty.clone(), &model, 4, 8, RingServerOptions::default());
    // Pages 0..4 reach the store while it works.
    for p in 0..4 {
        device.write(p, &model.next(p)).unwrap();
    }
    server.flush().unwrap();
    model.check_store(&*inner);
    let flushed: Vec<Vec<u8>> = (0..4).map(|p| model.content(p, 1)).collect();
    faulty
        .set_plan(FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    // Twelve pages written while the store refuses writes: more than the 4 slots hold.
    let t = Instant::now();
    for p in 2..14 {
        device.write(p, &model.next(p)).unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let err = server.flush().unwrap_err();
    let RingError::Flush { failures } = &err else {
        panic!("{err}")
    };
    let failed: Vec<u64> = failures.iter().map(|f| f.page).collect();
    assert_eq!(failed, (2..14).collect::<Vec<_>>(), "{err}");
    assert!(err.to_string().contains("stay dirty"), "{err}");
    let dirty = server.dirty_pages();
    assert_eq!(dirty.len(), 12);
    for (p, bytes) in &dirty {
        assert_eq!(bytes, &model.content(*p, model.version(*p)), "page {p}");
    }
    // What was flushed before is intact; the failed pages never reached the store.
    for p in 0..4u64 {
        let mut got = vec![0u8; 4096];
        inner.read_at(p * 4096, &mut got).unwrap();
        assert_eq!(got, flushed[p as usize], "page {p}");
    }
    let errors = server.take_errors();
    assert!(errors.iter().all(|e| e.op == PageOp::Write));
    // The store comes back: everything reaches it.
    faulty.heal();
    server.flush().unwrap();
    model.check_store(&*inner);
    assert!(server.dirty_pages().is_empty());
    // Shutting down over a failing store hands the pages back.
    faulty
        .set_plan(FaultPlan {
            write_error: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
    device.write(20, &model.next(20)).unwrap();
    match server.shutdown() {
        Err(RingError::Unflushed { dirty, failures }) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(dirty.0, vec![(20, model.content(20, 1))]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_killed_server_cannot_hang_the_device() {
    let seed = seed();
    let model = Model::new(seed, 4096, 16 * 4096);
    let (server, _) = start(memory(&model), &model, 4, 4, RingServerOptions::default());
    let device = Device::new(Arc::clone(server.shared()), Duration::from_millis(300));
    let mut buf = vec![0u8; 4096];
    device.read(0, &mut buf).unwrap();
    server.kill_for_test();
    let t = Instant::now();
    while server.is_alive() {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    assert!(matches!(
        device.read(5, &mut buf),
        Err(DeviceError::Timeout(..))
    ));
    assert!(matches!(
        device.write(6, &model.next(6)),
        Err(DeviceError::Timeout(..))
    ));
    // The ring fills up; posting then times out waiting for room.
    let mut results = Vec::new();
    for p in 0..6 {
        results.push(device.read_ahead(p));
    }
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(DeviceError::Timeout("room in the ring", _))))
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A cached page still reads: hits need no host.
    device.read(0, &mut buf).unwrap();
    model.check(0, &buf, Some(0));
    server.shutdown().unwrap();
}

#[test]
fn a_panicking_store_gives_an_error_not_a_dead_server() {
    let seed = seed();
    let model = Model::new(seed, 4096, 16 * 4096);
    let store = Arc::new(OddStore {
        inner: memory(&model),
        delay: Duration::ZERO,
        panic_at: Some(3 * 4096),
    });
    let (server, device) = start(store, &model, 4, 4, RingServerOptions::default());
    let mut buf = vec![0u8; 4096];
    assert_eq!(device.read(3, &mut buf), Err(DeviceError::Error(3)));
    let errors = server.take_errors();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].message.contains("panicked"),
        "{}",
        errors[0].message
    );
    for p in [0, 4, 9] {
        device.read(p, &mut buf).unwrap();
        model.check(p, &buf, Some(0));
    }
    assert!(server.is_alive());
    server.shutdown().unwrap();
}

#[test]
fn sequential_reads_are_read_ahead_and_read_ahead_requests_fill() {
    let seed = seed();
    let model = Model::new(seed, 4096, 64 * 4096);
    let (server, device) = start(
        memory(&model),
        &model,
        24,
        8,
        RingServerOptions {
            read_ahead_pages: 8,
            ..RingServerOptions::default()
        },
    );
    let mut buf = vec![0u8; 4096];
    for p in 0..32 {
        device.read(p, &mut buf).unwrap();
        model.check(p, &buf, Some(0));
    }
    let st = server.stats();
    eprintln!(
        "{st:?}, reads posted {}",
        device.reads_posted.load(Ordering::Relaxed)
    );
    assert!(st.read_ahead_pages >= 8, "{st:?}");
    assert!(
        device.reads_posted.load(Ordering::Relaxed) < 32,
        "read-ahead saved some READs: {st:?}"
    );
    // An explicit read-ahead fills a page nobody waits for.
    device.read_ahead(50).unwrap();
    let t = Instant::now();
    while !SlotWord::decode(server.shared().slot_word(50).load(Ordering::Acquire)).present {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "read-ahead never landed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(server.stats().read_ahead_requests, 1);
    server.shutdown().unwrap();
}

#[test]
fn invalidate_writes_back_then_drops_the_range() {
    let seed = seed();
    let model = Model::new(seed, 4096, 16 * 4096);
    let store = memory(&model);
    let (server, device) = start(store.clone(), &model, 8, 8, RingServerOptions::default());
    for p in 0..6 {
        device.write(p, &model.next(p)).unwrap();
    }
    server.invalidate(0..4).unwrap();
    for p in 0..6 {
        let w = SlotWord::decode(server.shared().slot_word(p).load(Ordering::Acquire));
        assert_eq!(w.present, p >= 4, "page {p}");
    }
    let mut got = vec![0u8; 4096];
    for p in 0..4 {
        store.read_at(p * 4096, &mut got).unwrap();
        assert_eq!(got, model.content(p, 1), "page {p} reached the store");
        device.read(p, &mut got).unwrap();
        model.check(p, &got, Some(1));
    }
    assert!(matches!(
        server.invalidate(10..17),
        Err(RingError::PageRange { .. })
    ));
    server.shutdown().unwrap();
    model.check_store(&*store);
}

#[test]
fn bad_setups_are_refused_with_advice() {
    let model = Model::new(1, 4096, 8 * 4096);
    let shared = || SharedRing::in_heap(4, 8, 2, 4096, 8 * 4096).unwrap();
    let small: Arc<dyn Store> = Arc::new(MemoryStore::new(4096));
    let e = RingServer::start(shared(), small, RingServerOptions::default()).unwrap_err();
    assert!(e.to_string().contains("at least as large"), "{e}");
    let e = RingServer::start(
        shared(),
        memory(&model),
        RingServerOptions {
            threads: 0,
            ..RingServerOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("threads"), "{e}");
    let e = SharedRing::in_heap(3, 8, 2, 4096, 8 * 4096).unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
}

#[test]
fn dirty_slots_above_the_high_water_mark_are_written_back_in_the_background() {
    let seed = seed();
    let model = Model::new(seed, 4096, 32 * 4096);
    let store = memory(&model);
    let (server, device) = start(
        store.clone(),
        &model,
        16,
        8,
        RingServerOptions {
            dirty_high_water: 0.25,
            ..RingServerOptions::default()
        },
    );
    for p in 0..3 {
        device.write(p, &model.next(p)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        server.stats().dirty_slots,
        3,
        "below the mark nothing is written"
    );
    assert_eq!(server.stats().store_write_batches, 0);
    for p in 3..12 {
        device.write(p, &model.next(p)).unwrap();
    }
    let t = Instant::now();
    while server.stats().dirty_slots > 4 {
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(server.stats().store_write_batches > 0);
    // The store has what was written back, without a flush.
    let mut got = vec![0u8; 4096];
    let written = (0..12)
        .filter(|&p| {
            store.read_at(p * 4096, &mut got).unwrap();
            got == model.content(p, 1)
        })
        .count();
    assert!(written >= 8, "{written} of 12 pages reached the store");
    // Written-back pages stay cached and readable.
    for p in 0..12 {
        device.read(p, &mut got).unwrap();
        model.check(p, &got, Some(1));
    }
    server.shutdown().unwrap();
    model.check_store(&*store);
}

#[test]
fn a_hanging_store_ends_in_an_error_within_its_bound() {
    let seed = seed();
    let model = Model::new(seed, 4096, 16 * 4096);
    let faulty = Arc::new(FaultyStore::new(memory(&model), seed));
    let (server, device) = start(faulty.clone(), &model, 4, 4, RingServerOptions::default());
    faulty
        .set_plan(FaultPlan {
            read_hang: 1.0,
            hang_for: Duration::from_millis(200),
            ..FaultPlan::default()
        })
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    assert_eq!(device.read(7, &mut buf), Err(DeviceError::Error(7)));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let errors = server.take_errors();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].message.contains("hung"), "{}", errors[0].message);
    faulty.heal();
    device.read(7, &mut buf).unwrap();
    model.check(7, &buf, Some(0));
    server.shutdown().unwrap();
}

#[test]
fn a_write_to_a_page_being_written_back_moves_on_and_the_newest_bytes_win() {
    let seed = seed();
    let model = Model::new(seed, 4096, 8 * 4096);
    let inner = memory(&model);
    let store = Arc::new(OddStore {
        inner: inner.clone(),
        delay: Duration::from_millis(40),
        panic_at: None,
    });
    let (server, device) = start(
        store,
        &model,
        4,
        4,
        RingServerOptions {
            dirty_high_water: 0.0,
            read_ahead_pages: 0,
            ..RingServerOptions::default()
        },
    );
    let mut buf = vec![0u8; 4096];
    for _ in 0..5 {
        let before = server.stats().store_write_batches;
        device.write(1, &model.next(1)).unwrap();
        // The background write-back of this version starts at once (high water 0).
        let t = Instant::now();
        while server.stats().store_write_batches == before {
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", server.stats());
            std::thread::sleep(Duration::from_millis(1));
        }
        device.write(1, &model.next(1)).unwrap();
        device.read(1, &mut buf).unwrap();
        model.check(1, &buf, Some(model.version(1)));
        server.flush().unwrap();
        model.check_store(&*inner);
    }
    let st = server.stats();
    eprintln!("{st:?}");
    assert!(st.write_redirects >= 3, "{st:?}");
    server.shutdown().unwrap();
}

/// A store whose `describe` panics on demand: the one call the workers make outside their
/// guarded store calls, so the panic kills the worker thread itself.
#[derive(Debug)]
struct WorkerKiller {
    inner: Arc<dyn Store>,
    armed: std::sync::atomic::AtomicBool,
}

impl Store for WorkerKiller {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        assert!(!self.armed.load(Ordering::Acquire), "worker killer armed");
        "worker-killer".into()
    }
}

#[test]
fn dead_workers_fail_their_pages_instead_of_hanging_them() {
    let seed = seed();
    let model = Model::new(seed, 4096, 64 * 4096);
    let store = Arc::new(WorkerKiller {
        inner: memory(&model),
        armed: false.into(),
    });
    let (server, device) = start(
        store.clone(),
        &model,
        8,
        8,
        RingServerOptions {
            threads: 2,
            read_ahead_pages: 0,
            ..RingServerOptions::default()
        },
    );
    let mut buf = vec![0u8; 4096];
    device.read(0, &mut buf).unwrap();
    device.write(1, &model.next(1)).unwrap();
    store.armed.store(true, Ordering::Release);
    let t = Instant::now();
    let mut messages = Vec::new();
    for p in (10..40).step_by(3) {
        assert_eq!(device.read(p, &mut buf), Err(DeviceError::Error(p)));
        messages.extend(server.take_errors().into_iter().map(|e| e.message));
        if messages
            .iter()
            .any(|m| m.contains("no store worker thread is alive"))
        {
            break;
        }
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(messages.iter().any(|m| m.contains("died")), "{messages:?}");
    assert!(
        messages
            .iter()
            .any(|m| m.contains("no store worker thread is alive")),
        "{messages:?}"
    );
    assert!(server.is_alive(), "the dispatcher lives on");
    // Cached pages still serve, and flushing runs on the caller's thread.
    store.armed.store(false, Ordering::Release);
    device.read(0, &mut buf).unwrap();
    model.check(0, &buf, Some(0));
    server.shutdown().unwrap();
    model.check_store(&*store.inner);
}

#[test]
fn host_cache_hits_during_rewrites_never_see_torn_pages() {
    let seed = seed();
    let model = Model::new(seed, 256 << 10, 4 * (256 << 10));
    let (server, device) = start(memory(&model), &model, 4, 8, RingServerOptions::default());
    // Every version precomputed, so that readers spend their time copying, not generating.
    const REWRITES: u64 = 150;
    let versions: Vec<Vec<u8>> = (0..=REWRITES).map(|v| model.content(0, v)).collect();
    let latest = std::sync::atomic::AtomicU64::new(0);
    let reads = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut buf = vec![0u8; model.page_size];
                while latest.load(Ordering::Acquire) < REWRITES {
                    device.read(0, &mut buf).unwrap();
                    let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
                    assert!(
                        v <= latest.load(Ordering::Acquire),
                        "version {v} from the future"
                    );
                    assert!(
                        buf == versions[v as usize],
                        "a torn copy of version {v} was accepted (seed {seed})"
                    );
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for v in 1..=REWRITES {
            latest.store(v, Ordering::Release);
            device.write(0, &versions[v as usize]).unwrap();
        }
    });
    eprintln!(
        "{} reads during {REWRITES} rewrites",
        reads.load(Ordering::Relaxed)
    );
    server.shutdown().unwrap();
}

#[test]
fn random_store_faults_lose_nothing() {
    let seed = seed();
    let model = Model::new(seed, 4096, 48 * 4096 - 300);
    let inner = memory(&model);
    let faulty = Arc::new(FaultyStore::new(inner.clone(), seed));
    faulty
        .set_plan(FaultPlan {
            read_error: 0.05,
            write_error: 0.05,
            short_read: 0.05,
            short_write: 0.05,
            die_mid_batch: 0.02,
            ..FaultPlan::default()
        })
        .unwrap();
    let (server, device) = start(
        faulty.clone(),
        &model,
        8,
        8,
        RingServerOptions {
            threads: 2,
            max_batch: 8,
            dirty_high_water: 0.25,
            ..RingServerOptions::default()
        },
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        // A dead store comes back after a moment, as a restarted node would.
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(2));
                faulty.revive();
            }
        });
        let threads = 6;
        let workers: Vec<_> = (0..threads)
            .map(|tid| {
                let (device, model, server, errors) = (&device, &model, &server, &errors);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ (tid as u64 + 1));
                    let own: Vec<u64> = (0..model.pages())
                        .filter(|p| *p as usize % threads == tid)
                        .collect();
                    let mut buf = vec![0u8; model.page_size];
                    for _ in 0..80 {
                        let write = rng.random_bool(0.4);
                        let p = if write {
                            own[rng.random_range(0..own.len())]
                        } else {
                            rng.random_range(0..model.pages())
                        };
                        if write {
                            device.write(p, &model.next(p)).unwrap();
                        }
                        // Reads may fail while the store fails; taking the errors retries them.
                        let mut tries = 0;
                        loop {
                            match device.read(p, &mut buf) {
                                Ok(()) => break,
                                Err(DeviceError::Error(_)) if tries < 200 => {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                    server.take_errors();
                                    tries += 1;
                                }
                                Err(e) => panic!("page {p}: {e:?} (seed {seed})"),
                            }
                        }
                        let exact = (p as usize % threads == tid).then(|| model.version(p));
                        model.check(p, &buf, exact);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Release);
    });
    eprintln!(
        "{} read errors retried; {:?}; {:?}",
        errors.load(Ordering::Relaxed),
        faulty.injected(),
        server.stats()
    );
    faulty.heal();
    server.flush().unwrap();
    model.check_store(&*inner);
    server.shutdown().unwrap();
}

#[test]
fn write_copies_overlap_and_head_never_passes_an_unfinished_copy() {
    let seed = seed();
    // Large pages (long copies), a small ring (staging pages reused often), 16 writers.
    let model = Model::new(seed, 256 << 10, 32 * (256 << 10) - 1000);
    let store = memory(&model);
    let (server, device) = start(
        store.clone(),
        &model,
        32,
        8,
        RingServerOptions {
            threads: 8,
            dirty_high_water: 1.0,
            ..RingServerOptions::default()
        },
    );
    let threads = 16;
    let contents: Vec<Vec<Vec<u8>>> = (0..model.pages())
        .map(|p| (1..=6).map(|v| model.content(p, v)).collect())
        .collect();
    std::thread::scope(|s| {
        for tid in 0..threads {
            let (device, model, contents) = (&device, &model, &contents);
            s.spawn(move || {
                let mut buf = vec![0u8; model.page_size];
                for version in 1..=6u64 {
                    for p in (tid..model.pages()).step_by(threads as usize) {
                        model.next(p);
                        let data = &contents[p as usize][version as usize - 1];
                        device.write(p, data).unwrap();
                        device.read(p, &mut buf).unwrap();
                        model.check(p, &buf, Some(version));
                    }
                }
            });
        }
    });
    let st = server.stats();
    eprintln!("{st:?}");
    assert_eq!(
        device.staging_overtaken.load(Ordering::Relaxed),
        0,
        "head passed a WRITE whose staging page was not copied yet"
    );
    assert!(
        st.max_writes_in_flight > 1,
        "WRITE copies never overlapped: {st:?}"
    );
    assert_eq!(st.write_requests, 6 * model.pages());
    server.flush().unwrap();
    model.check_store(&*store);
    server.shutdown().unwrap();
}

#[test]
fn reads_posted_after_writes_of_their_page_see_the_writes_under_heavy_interleaving() {
    let seed = seed();
    let model = Model::new(seed, 16 << 10, 48 * (16 << 10));
    let store = memory(&model);
    // Fewer slots than pages: writes evict, write back and redirect while reads interleave.
    // No read-ahead: this test reads a page right after posting its WRITE, without waiting
    // for `done`, and a read-ahead fill posted before the WRITE may publish the store's older
    // bytes for a moment before the WRITE replaces them. The device never reads a page whose
    // WRITE is in flight (the page stays EVICTING until `done`), so that moment is harmless
    // there; here it would be read.
    let (server, device) = start(
        store.clone(),
        &model,
        24,
        4,
        RingServerOptions {
            threads: 3,
            dirty_high_water: 0.25,
            read_ahead_pages: 0,
            ..RingServerOptions::default()
        },
    );
    let writers = 6u64;
    for round in 0..8u64 {
        std::thread::scope(|s| {
            for tid in 0..writers {
                let (device, model) = (&device, &model);
                s.spawn(move || {
                    let mut buf = vec![0u8; model.page_size];
                    let own = (tid..32).step_by(writers as usize);
                    for p in own.clone() {
                        // The page is absent (invalidated before the round): the READ posted
                        // right after the WRITE must show the written bytes, never the
                        // store's older ones.
                        let data = model.next(p);
                        let t = device.post(REQ_WRITE, p, Some(&data)).unwrap();
                        device.read(p, &mut buf).unwrap();
                        model.check(p, &buf, Some(model.version(p)));
                        device.wait_done(t, p).unwrap();
                    }
                    for p in own {
                        // Two WRITEs of one page back to back: the second lands last.
                        let first = model.next(p);
                        let t1 = device.post(REQ_WRITE, p, Some(&first)).unwrap();
                        let second = model.next(p);
                        let t2 = device.post(REQ_WRITE, p, Some(&second)).unwrap();
                        device.wait_done(t1, p).unwrap();
                        device.wait_done(t2, p).unwrap();
                        device.read(p, &mut buf).unwrap();
                        model.check(p, &buf, Some(model.version(p)));
                    }
                });
            }
            for tid in 0..4u64 {
                let (device, model) = (&device, &model);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ round ^ (tid << 32));
                    let mut buf = vec![0u8; model.page_size];
                    for _ in 0..60 {
                        // Not the writers' pages: a hit there before their WRITE is handled
                        // would be stale, which the real device's EVICTING state rules out.
                        let p = rng.random_range(32..model.pages());
                        device.read(p, &mut buf).unwrap();
                        model.check(p, &buf, None);
                    }
                });
            }
        });
        server.invalidate(0..model.pages()).unwrap();
        model.check_store(&*store);
    }
    assert_eq!(device.staging_overtaken.load(Ordering::Relaxed), 0);
    eprintln!("{:?}", server.stats());
    assert!(server.take_errors().is_empty());
    server.shutdown().unwrap();
}

#[test]
fn a_server_killed_during_write_traffic_ends_every_device_wait_and_keeps_acknowledged_writes() {
    let seed = seed();
    let model = Model::new(seed, 64 << 10, 32 * (64 << 10));
    let store = memory(&model);
    let (server, _) = start(store.clone(), &model, 16, 8, RingServerOptions::default());
    let device = Device::new(Arc::clone(server.shared()), Duration::from_millis(300));
    let threads = 8u64;
    let acknowledged: Vec<std::sync::atomic::AtomicU64> = (0..model.pages())
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for tid in 0..threads {
            let (device, model, acknowledged) = (&device, &model, &acknowledged);
            s.spawn(move || {
                let mut buf = vec![0u8; model.page_size];
                for i in 0.. {
                    let p = tid + threads * (i % (model.pages() / threads));
                    let data = model.next(p);
                    match device.write(p, &data) {
                        Ok(()) => {
                            acknowledged[p as usize].store(model.version(p), Ordering::Relaxed)
                        }
                        Err(DeviceError::Timeout(..)) => return,
                        Err(e) => panic!("{e:?}"),
                    }
                    match device.read(p, &mut buf) {
                        Ok(()) => {
                            model.check(p, &buf, Some(model.version(p)));
                        }
                        Err(DeviceError::Timeout(..)) => return,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        server.kill_for_test();
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(device.staging_overtaken.load(Ordering::Relaxed), 0);
    server.shutdown().unwrap();
    // Every acknowledged write reached the store; a write that timed out may have landed.
    for p in 0..model.pages() {
        let len = model.len(p);
        let mut got = vec![0u8; model.page_size];
        store
            .read_at(p * model.page_size as u64, &mut got[..len])
            .unwrap();
        let v = model.check(p, &got, None);
        assert!(
            v >= acknowledged[p as usize].load(Ordering::Relaxed),
            "page {p}: an acknowledged write was lost (seed {seed})"
        );
    }
}
