//! Shared helpers for the pager's integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use strata_core::store::ReadRequest;
use strata_core::{MemoryStore, PagerConfig, Store, StoreError};

#[path = "../../src/watchdog.rs"]
pub mod watchdog;

/// Whether userfaultfd works here. Under CI (`CI` set) its absence fails the test loudly;
/// elsewhere the test prints why it skipped.
pub fn uffd_available(test: &str) -> bool {
    match strata_pager::probe::probe() {
        Ok(s) if s.write_protect() => true,
        other => {
            let why = match other {
                Ok(_) => "userfaultfd has no write-protect support".to_string(),
                Err(e) => e.to_string(),
            };
            if std::env::var_os("CI").is_some() {
                panic!("{test}: userfaultfd is required in CI but unavailable: {why}");
            }
            eprintln!("SKIPPED {test}: userfaultfd unavailable ({why}); CI fails instead");
            false
        }
    }
}

/// A splitmix64 generator: fresh seeds per run, printed so failures can be replayed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock (or `STRATA_TEST_SEED`... not a STRATA_ var: `PAGER_TEST_SEED`).
    pub fn from_time(test: &str) -> Self {
        let seed = std::env::var("PAGER_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(42)
            });
        eprintln!("{test}: seed {seed} (replay with PAGER_TEST_SEED={seed})");
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A pager configuration for tests.
pub fn config(page: u64, buffer: u64, fillers: usize, evictors: usize) -> PagerConfig {
    PagerConfig::builder()
        .page_bytes(page)
        .buffer_bytes(buffer)
        .fillers(fillers)
        .evictors(evictors)
        .build()
        .expect("test configuration is valid")
}

/// A memory store filled with random bytes; returns it and a copy of its contents.
pub fn random_store(size: usize, rng: &mut Rng) -> (Arc<MemoryStore>, Vec<u8>) {
    let mut data = vec![0u8; size];
    rng.fill(&mut data);
    (Arc::new(MemoryStore::from_bytes(&data)), data)
}

/// Reads a whole store.
pub fn read_all(store: &dyn Store) -> Vec<u8> {
    let mut out = vec![0u8; usize::try_from(store.size()).unwrap()];
    store.read_at(0, &mut out).unwrap();
    out
}

/// A store that fails reads and/or writes while told to (for error-path tests only).
#[derive(Debug)]
pub struct FlakyStore {
    pub inner: MemoryStore,
    pub fail_reads: AtomicBool,
    pub fail_writes: AtomicBool,
}

impl FlakyStore {
    pub fn new(size: u64) -> Self {
        Self {
            inner: MemoryStore::new(size),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
        }
    }
    fn broken(&self, op: &str) -> StoreError {
        StoreError::Unavailable {
            store: self.describe(),
            reason: format!("injected {op} failure"),
        }
    }
}

impl Store for FlakyStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(self.broken("read"));
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(self.broken("write"));
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "flaky-memory".into()
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for r in requests.iter_mut() {
            self.read_at(r.offset, r.buf)?;
        }
        Ok(())
    }
}

/// How a child test process ended.
#[derive(Debug)]
pub struct ChildOutcome {
    /// Exit status, or None if it ran past its deadline (it was killed).
    pub status: Option<std::process::ExitStatus>,
    /// Its standard output and error, together.
    pub output: String,
    /// Wall time until it ended or was killed.
    pub elapsed: std::time::Duration,
}

impl ChildOutcome {
    /// The signal that ended the child, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }
    /// Whether it exited with status 0 in time.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs test `test` of this test binary again in a child process with `var=value` set (the
/// test checks `var` to know it is the child), killing it after `deadline`.
pub fn run_child(
    test: &str,
    var: &str,
    value: &str,
    deadline: std::time::Duration,
) -> ChildOutcome {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        // The panic message, not a backtrace, must be among the lines a failure report keeps.
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the child test");
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let elapsed = started.elapsed();
    let output = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    ChildOutcome {
        status,
        output,
        elapsed,
    }
}
