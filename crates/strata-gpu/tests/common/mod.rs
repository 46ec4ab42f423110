//! Helpers shared by the GPU test binaries: skipping without a driver, seeds, random data.
#![allow(dead_code)] // each test binary uses its own subset
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use strata_gpu::{ElementType, EvictionPolicy, SpaceOptions, Strata};

/// Strata on GPU 0, or `None` (after saying so) without a CUDA driver.
pub fn strata_or_skip() -> Option<Strata> {
    if !strata_gpu::probe::driver_present() {
        eprintln!("skipped: no CUDA driver");
        return None;
    }
    Some(Strata::new(0).expect("a CUDA driver is present but Strata could not start on GPU 0"))
}

/// A fresh seed, printed.
pub fn seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {s:#x}");
    s
}

/// The kernels' mixing function (`mix` / `tmix` in the .cu files).
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    x
}

/// `n` random words from `seed`.
pub fn random_words(n: usize, seed: u64) -> Vec<u64> {
    (0..n as u64)
        .map(|i| mix(i ^ seed.rotate_left(17)))
        .collect()
}

/// Options of a u64 space without read-through (background write-back as
/// `STRATA_GPU_WRITE_BACK` says: on unless it says off, so the suite runs both ways).
pub fn opts(page: u64, cache: u64, policy: EvictionPolicy) -> SpaceOptions {
    SpaceOptions {
        page_size: page,
        cache_bytes: cache,
        element: ElementType::U64,
        policy,
        read_through: false,
        host_cache_bytes: None,
        background_write_back: strata_gpu::space::default_write_back(),
    }
}
