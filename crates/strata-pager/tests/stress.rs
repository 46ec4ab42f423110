//! Stress over the read-ahead grid: fillers x read-ahead x buffer sizes x page sizes.
//!
//! Each case runs in a child process (a `SIGBUS` would otherwise kill the whole test binary)
//! under a deadline. A case fails on any signal, any error, any wrong byte, or a stall (a case
//! taking longer than [`STALL`]). The stores never fail here, so a `SIGBUS` can only be a pager
//! bug: the pager answers a fault with `SIGBUS` only when the store failed.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Rng, random_store, read_all, run_child, uffd_available};
use strata_core::{MemoryStore, PagerConfig};
use strata_pager::Region;

/// A case that takes longer than this is a stall (each takes well under a second normally).
const STALL: Duration = Duration::from_secs(20);

/// One point of the grid.
#[derive(Debug, Clone, Copy)]
struct Case {
    fillers: usize,
    read_ahead: u64,
    buffer: u64,
    page: u64,
    /// Run only the read-only scan (the reduced case of the original bug).
    scan_only: bool,
}

impl Case {
    fn encode(&self) -> String {
        format!(
            "{},{},{},{},{}",
            self.fillers,
            self.read_ahead,
            self.buffer,
            self.page,
            u8::from(self.scan_only)
        )
    }
    fn decode(s: &str) -> Self {
        let v: Vec<u64> = s
            .split(',')
            .map(|x| x.parse().expect("case field"))
            .collect();
        Case {
            fillers: v[0] as usize,
            read_ahead: v[1],
            buffer: v[2],
            page: v[3],
            scan_only: v[4] != 0,
        }
    }
}

/// What a child runs: scans, random reads from two threads, a write pass, flush, check.
fn exercise(case: Case) {
    let mut rng = Rng::from_time(&case.encode());
    let size = (3 * case.buffer) as usize;
    let page = case.page as usize;
    let (store, data) = random_store(size, &mut rng);
    let config = PagerConfig::builder()
        .page_bytes(case.page)
        .buffer_bytes(case.buffer)
        .fillers(case.fillers)
        .evictors(1)
        .read_ahead(case.read_ahead)
        .build()
        .expect("valid configuration");
    let mut region = Region::new(store.clone(), size as u64, config).expect("region maps");
    // Four threads scan at once, each its own quarter from its start, one word per 4 KiB (as
    // `strata bench pager` does): both runs are sequential, so both trigger read-ahead and
    // their windows compete for frames.
    let rounds = if case.scan_only { 3 } else { 1 };
    for _ in 0..rounds {
        let s = region.as_slice();
        std::thread::scope(|scope| {
            for quarter in 0..4 {
                let part = (quarter * size / 4) & !4095..((quarter + 1) * size / 4) & !4095;
                let data = &data;
                scope.spawn(move || {
                    for i in part.step_by(4096) {
                        assert!(
                            s[i..i + 8] == data[i..i + 8],
                            "bytes at {i} differ from the store"
                        );
                    }
                });
            }
        });
    }
    if case.scan_only {
        return;
    }
    // Random single-byte reads from two threads (faults that are not sequential).
    let s = region.as_slice();
    std::thread::scope(|scope| {
        for t in 0..2u64 {
            let data = &data;
            let mut rng = Rng(rng.0 ^ t);
            scope.spawn(move || {
                for _ in 0..500 {
                    let i = rng.below(size as u64) as usize;
                    assert_eq!(s[i], data[i], "byte {i}");
                }
            });
        }
    });
    // A write to every page in order (write faults with read-ahead), then flush and compare.
    let mut expect = data.clone();
    let slice = region.as_mut_slice();
    for p in 0..size / page {
        let i = p * page + rng.below(page as u64) as usize;
        let v = rng.next() as u8;
        slice[i] = v;
        expect[i] = v;
    }
    region.flush().expect("flush");
    let stored = read_all(&*store);
    if stored != expect {
        // Say which pages lost what, and whether the region itself still shows the write (a
        // lost write-back) or not (a lost write): the two point at different code.
        let resident = region.as_slice();
        let wrong: Vec<String> = (0..size)
            .filter(|&i| stored[i] != expect[i])
            .take(8)
            .map(|i| {
                format!(
                    "byte {i} (page {}): store {:#04x}, expected {:#04x}, original {:#04x}, region {:#04x}",
                    i / page,
                    stored[i],
                    expect[i],
                    data[i],
                    resident[i]
                )
            })
            .collect();
        panic!(
            "store after flush differs:\n{}\n{}",
            wrong.join("\n"),
            region.stats()
        );
    }
    let stats = region.stats();
    assert_eq!(stats.errors, 0, "{stats}");
    drop(region);
    let _: &Arc<MemoryStore> = &store;
}

fn child_case(var: &str) -> Option<Case> {
    std::env::var(var).ok().map(|s| Case::decode(&s))
}

/// Runs `cases` each in a child; returns the failures, described.
fn run_cases(test: &str, var: &str, cases: &[Case]) -> Vec<String> {
    let mut failures = Vec::new();
    let started = Instant::now();
    for case in cases {
        let out = run_child(test, var, &case.encode(), STALL);
        let verdict = match (out.status, out.signal()) {
            (None, _) => Some(format!("stalled (killed after {:?})", out.elapsed)),
            (_, Some(sig)) => Some(format!("died of signal {sig} after {:?}", out.elapsed)),
            (Some(_), None) if !out.success() => Some("failed".to_string()),
            _ => None,
        };
        if out.elapsed > Duration::from_secs(3) {
            eprintln!("{case:?}: slow, {:?}", out.elapsed);
        }
        if let Some(v) = verdict {
            let tail: String = out
                .output
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .join("\n");
            failures.push(format!(
                "{case:?}: {v}\n--- last lines (newest first) ---\n{tail}"
            ));
        }
    }
    eprintln!(
        "{test}: {} cases in {:?}, {} failed",
        cases.len(),
        started.elapsed(),
        failures.len()
    );
    failures
}

/// The case from issue 10: a memory store, an 8 MiB buffer of 64 KiB pages, read-ahead of
/// half the buffer, two fillers and a read-only scan. Fillers used to deadlock on frames
/// (each held half the buffer for its read-ahead window while waiting for one more), stall
/// for 30 s, report a buffer "full of dirty pages" that were all clean, and SIGBUS the scan.
#[test]
fn read_ahead_of_half_the_buffer_scan_neither_stalls_nor_sigbuses() {
    const VAR: &str = "PAGER_REDUCED_CASE";
    if let Some(case) = child_case(VAR) {
        return exercise(case);
    }
    if !uffd_available("read_ahead_of_half_the_buffer_scan") {
        return;
    }
    let case = Case {
        fillers: 2,
        read_ahead: (8 << 20) / (64 << 10) / 2,
        buffer: 8 << 20,
        page: 64 << 10,
        scan_only: true,
    };
    // Several runs: the deadlock needs two windows in flight at once, which most runs hit.
    let failures = run_cases(
        "read_ahead_of_half_the_buffer_scan_neither_stalls_nor_sigbuses",
        VAR,
        &[case; 10],
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every combination of fillers x read-ahead x buffer size x page size.
#[test]
fn read_ahead_grid_never_sigbuses_or_stalls() {
    const VAR: &str = "PAGER_GRID_CASE";
    if let Some(case) = child_case(VAR) {
        return exercise(case);
    }
    if !uffd_available("read_ahead_grid_never_sigbuses_or_stalls") {
        return;
    }
    let mut cases = Vec::new();
    for page in [4u64 << 10, 64 << 10, 2 << 20] {
        let mut buffers: Vec<u64> = [256u64 << 10, 1 << 20, 4 << 20]
            .iter()
            .map(|&b| b.max(4 * page))
            .collect();
        buffers.dedup();
        for buffer in buffers {
            let frames = buffer / page;
            let mut aheads = vec![0, 1, frames / 2, frames]
                .into_iter()
                .map(|r| r.min(1024))
                .collect::<Vec<_>>();
            aheads.dedup();
            for read_ahead in aheads {
                for fillers in [1, 2, 4] {
                    cases.push(Case {
                        fillers,
                        read_ahead,
                        buffer,
                        page,
                        scan_only: false,
                    });
                }
            }
        }
    }
    let failures = run_cases("read_ahead_grid_never_sigbuses_or_stalls", VAR, &cases);
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
