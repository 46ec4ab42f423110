//! The graph file loader against hostile files: headers that claim huge counts over sparse
//! files, counts beyond the format's limits, and (as a bounded fuzz run) random damage to a
//! real file. The loader must answer with a clear error, never panic, and never allocate for
//! counts the file's contents have not confirmed.
//!
//! Allocation is measured by a counting global allocator; the tests in this binary take one
//! lock so that one test's allocations do not count against another's bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use indicatif::ProgressBar;
use proptest::prelude::*;
use strata_workloads::csr::Csr;
use strata_workloads::format::{self, FormatError, GraphOrigin, HEADER_BYTES, MAGIC, VERSION};
use strata_workloads::generate::{KroneckerParams, kronecker};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are only
// statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test at a time, so the peak belongs to the test that reads it.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` and returns its result with the peak of bytes allocated above the start.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    (r, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

fn temp_path(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "strata-hostile-{tag}-{}-{}.csr",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A header with a valid header checksum for these counts (and made-up array checksums).
fn header(vertices: u64, arcs: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&vertices.to_le_bytes());
    h.extend_from_slice(&arcs.to_le_bytes());
    for word in [1u32, 0, 16, 0] {
        h.extend_from_slice(&word.to_le_bytes());
    }
    for word in [7u64, 0x1234_5678, 0x9abc_def0] {
        h.extend_from_slice(&word.to_le_bytes());
    }
    let sum = format::checksum(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h
}

/// Writes `header` and extends the file, sparsely, to `len` bytes.
fn sparse_file(path: &Path, header: &[u8], len: u64) {
    std::fs::write(path, header).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_sparse_file_claiming_huge_counts_is_refused_before_allocating_for_them() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // 2^24 vertices and 2^24 arcs: 192 MiB of arrays the 4 KiB of real data never back.
    let (vertices, arcs) = (1u64 << 24, 1u64 << 24);
    let len = HEADER_BYTES as u64 + 8 * (vertices + 1) + 4 * arcs;
    let path = temp_path("sparse");
    sparse_file(&path, &header(vertices, arcs), len);
    let (result, peak) = peak_during(|| format::read(&path, &ProgressBar::hidden()));
    std::fs::remove_file(&path).unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, FormatError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("regenerate"), "{err}");
    assert!(
        peak < 40 << 20,
        "the loader allocated {} MiB for a file whose arrays are holes",
        peak >> 20
    );
}

#[test]
fn counts_beyond_the_format_are_clear_errors_from_the_header_alone() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (vertices, arcs, what) in [
        ((1u64 << 31) + 1, 0, "2^31"),
        (u64::MAX, 0, "2^31"),
        (4, 13, "more arcs than"),
        (1 << 20, u64::MAX, "more arcs than"),
    ] {
        let path = temp_path("limits");
        sparse_file(&path, &header(vertices, arcs), 4096);
        let (result, peak) = peak_during(|| format::read(&path, &ProgressBar::hidden()));
        std::fs::remove_file(&path).unwrap();
        let err = result.unwrap_err();
        assert!(err.to_string().contains(what), "{vertices} {arcs}: {err}");
        assert!(peak < 40 << 20, "{} MiB", peak >> 20);
    }
}

/// A real graph file (Kronecker, scale 8) and the graph it holds, made once per run.
fn fixture() -> &'static (Vec<u8>, Csr) {
    static FIXTURE: OnceLock<(Vec<u8>, Csr)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        eprintln!("fixture graph seed {seed}");
        let bar = ProgressBar::hidden();
        let list = kronecker(&KroneckerParams::graph500(8, 8, seed), &bar).unwrap();
        let graph = Csr::from_edges(&list, &bar).unwrap();
        let origin = GraphOrigin {
            generator: format::GENERATOR_KRONECKER,
            scale: 8,
            edge_factor: 8,
            seed,
        };
        let path = temp_path("fixture");
        format::write(&path, &graph, origin, &bar).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        (bytes, graph)
    })
}

/// One way to damage a graph file.
#[derive(Debug, Clone)]
enum Damage {
    /// Set the vertex count (header bytes 16..24).
    Vertices(u64),
    /// Set the arc count (header bytes 24..32).
    Arcs(u64),
    /// Flip one bit anywhere.
    Flip(usize, u8),
    /// Overwrite one offset entry.
    Offset(usize, u64),
    /// Overwrite one neighbour entry.
    Neighbour(usize, u32),
    /// Cut the file to this fraction (per mille) of its length.
    Truncate(u16),
    /// Extend the file with this many zero bytes.
    Extend(u32),
    /// Claim these vertex and arc counts and size the file to match (zeros after the
    /// original bytes): the header agrees with the length, the contents do not.
    Claim(u64, u64),
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..4096,
        Just(1u64 << 31),
        Just((1u64 << 31) + 1),
        Just(u64::MAX),
        Just(u64::MAX / 8),
        Just(u64::MAX / 4),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        count().prop_map(Damage::Vertices),
        count().prop_map(Damage::Arcs),
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip(at, bit)),
        (any::<usize>(), count()).prop_map(|(at, v)| Damage::Offset(at, v)),
        (any::<usize>(), any::<u32>()).prop_map(|(at, v)| Damage::Neighbour(at, v)),
        (0u16..1000).prop_map(Damage::Truncate),
        (1u32..(4 << 20)).prop_map(Damage::Extend),
        (0u64..(1 << 18), prop_oneof![Just(0u64), 0u64..(1 << 19)])
            .prop_map(|(n, m)| Damage::Claim(n, m)),
    ]
}

/// Recomputes the array checksums (so that damage reaches the structural checks) and the
/// header checksum, for files whose header still describes their arrays.
fn reseal(bytes: &mut [u8], arrays: bool) {
    let n = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let m = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
    let offsets_end = n
        .checked_add(1)
        .and_then(|v| v.checked_mul(8))
        .and_then(|o| o.checked_add(HEADER_BYTES as u64));
    let end = offsets_end.and_then(|o| m.checked_mul(4).and_then(|a| a.checked_add(o)));
    if arrays && end == Some(bytes.len() as u64) {
        let o = usize::try_from(offsets_end.unwrap()).unwrap();
        let offsets = format::checksum(&bytes[HEADER_BYTES..o]);
        let neighbours = format::checksum(&bytes[o..]);
        bytes[56..64].copy_from_slice(&offsets.to_le_bytes());
        bytes[64..72].copy_from_slice(&neighbours.to_le_bytes());
    }
    let header = format::checksum(&bytes[..72]);
    bytes[72..80].copy_from_slice(&header.to_le_bytes());
}

fn apply(damage: &Damage, pristine: &[u8]) -> Vec<u8> {
    let mut bytes = pristine.to_vec();
    let n = usize::try_from(u64::from_le_bytes(bytes[16..24].try_into().unwrap())).unwrap();
    let m = (bytes.len() - HEADER_BYTES - 8 * (n + 1)) / 4;
    match *damage {
        Damage::Vertices(v) => bytes[16..24].copy_from_slice(&v.to_le_bytes()),
        Damage::Arcs(v) => bytes[24..32].copy_from_slice(&v.to_le_bytes()),
        Damage::Flip(at, bit) => {
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
        }
        Damage::Offset(at, v) => {
            let at = HEADER_BYTES + 8 * (at % (n + 1));
            bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        Damage::Neighbour(at, v) => {
            let at = HEADER_BYTES + 8 * (n + 1) + 4 * (at % m.max(1));
            bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        Damage::Truncate(per_mille) => bytes.truncate(bytes.len() * usize::from(per_mille) / 1000),
        Damage::Extend(extra) => bytes.resize(bytes.len() + extra as usize, 0),
        Damage::Claim(n, m) => {
            bytes[16..24].copy_from_slice(&n.to_le_bytes());
            bytes[24..32].copy_from_slice(&m.to_le_bytes());
            let (n, m) = (usize::try_from(n).unwrap(), usize::try_from(m).unwrap());
            bytes.resize(HEADER_BYTES + 8 * (n + 1) + 4 * m, 0);
        }
    }
    bytes
}

proptest! {
    // 256 cases by default (a few seconds); PROPTEST_CASES asks for more. No regression
    // files: a failure prints its minimal input.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Any damage, with or without resealed checksums: a clear error or the original graph
    /// (or, resealed whole, a well-formed graph), never a panic, and never more memory than
    /// the file's own size (plus I/O buffers).
    #[test]
    fn damaged_graph_files_are_errors_with_bounded_allocation(
        damage in damage(),
        reseal_header in any::<bool>(),
        reseal_arrays in any::<bool>(),
    ) {
        let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (pristine, graph) = fixture();
        let mut bytes = apply(&damage, pristine);
        if reseal_header && bytes.len() >= HEADER_BYTES {
            reseal(&mut bytes, reseal_arrays);
        }
        let path = temp_path("fuzz");
        std::fs::write(&path, &bytes).unwrap();
        let (result, peak) = peak_during(|| format::read(&path, &ProgressBar::hidden()));
        std::fs::remove_file(&path).unwrap();
        let loaded = result.is_ok();
        match result {
            // A file resealed whole is a well-formed file of another graph, which may load.
            Ok((back, _)) if reseal_header && reseal_arrays => prop_assert!(back.check().is_ok()),
            Ok((back, _)) => prop_assert_eq!(&back, graph, "damaged file loaded as another graph"),
            Err(e) => prop_assert!(
                e.to_string().contains("regenerate"),
                "error without advice: {}", e
            ),
        }
        // What a file may cost: its own arrays once confirmed, never more than twice the
        // file, plus I/O buffers; a refused file no more than the real graph it came from.
        let buffers = 24 << 20;
        let bound = if loaded { 2 * bytes.len() } else { 2 * pristine.len().min(bytes.len()) };
        prop_assert!(
            peak <= bound + buffers,
            "peak {} bytes for a {}-byte file (loaded: {})", peak, bytes.len(), loaded
        );
    }
}
