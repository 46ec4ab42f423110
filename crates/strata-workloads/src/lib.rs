//! Workloads that GPU-oversubscription systems are judged on, built locally from seeds:
//! Graph500 Kronecker and uniform random graphs in CSR form ([`generate`], [`csr`], stored by
//! [`mod@format`]), CPU references for BFS, connected components and PageRank ([`mod@reference`]),
//! Graph500 BFS validation ([`validate`]), and Zipf-skewed embedding lookups with sum pooling
//! ([`zipf`], [`embed`]); the same workloads as GPU kernels written against `strata.cuh`, run
//! over a Strata space or the baselines' memories ([`gpu`]). The benchmarks behind
//! `strata bench graph` and `strata bench embed` live in the `strata-bench` crate; H200 results
//! and what bounds them: `results/RESULTS.md`.
//!
//! Everything here is deterministic from a seed and independent of the thread count, so a
//! graph generated on one host and checked on another is the same graph.

#![warn(missing_docs)]

pub mod csr;
pub mod embed;
pub mod format;
pub mod generate;
pub mod gpu;
pub mod par;
pub mod reference;
pub mod rng;
pub mod validate;
pub mod zipf;

/// A fresh seed for a test run (time-based), printed so a failure can be replayed with
/// `STRATA_TEST_SEED=<seed>`.
#[cfg(test)]
pub(crate) fn test_seed() -> u64 {
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = std::env::var("STRATA_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                u64::try_from(now.as_nanos() & u128::from(u64::MAX)).unwrap_or(1)
            });
        eprintln!("strata-workloads test seed: {seed} (replay with STRATA_TEST_SEED={seed})");
        seed
    })
}
