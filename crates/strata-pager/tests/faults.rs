//! The pager over a [`FaultyStore`]: churn at 8x oversubscription while the store fails
//! writes, tears them, slows down and hangs. Every write the program made must end up in the
//! store or be reported by `flush`, and nothing may hang past the documented bound (a store
//! operation hangs at most `hang_for`; each flush writes each dirty page once).
//!
//! Reads are only slowed, never failed: a failed read is answered with `SIGBUS` by design
//! (see `failing_store_fault_delivers_sigbus_not_a_hang` and the child-process test below).
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Rng, read_all, run_child, uffd_available};
use strata_core::store::{FaultPlan, FaultyStore};
use strata_core::{MemoryStore, PagerConfig};
use strata_pager::{Region, RegionError};

const PAGE: u64 = 4096;
const FRAMES: u64 = 64;
const SIZE: u64 = 8 * FRAMES * PAGE;
const WRITERS: u64 = 4;
const HANG_FOR: Duration = Duration::from_millis(40);
const SLOW_FOR: Duration = Duration::from_millis(2);

fn churn(seed: u64) {
    let mut rng = Rng(seed);
    let memory = Arc::new(MemoryStore::new(SIZE));
    let store = Arc::new(FaultyStore::new(memory.clone(), rng.next()));
    let config = PagerConfig::builder()
        .page_bytes(PAGE)
        .buffer_bytes(FRAMES * PAGE)
        .fillers(2)
        .evictors(1)
        .read_ahead(4)
        .build()
        .unwrap();
    let region = Region::new(store.clone(), SIZE, config).unwrap();
    let faults = FaultPlan {
        write_error: 0.03,
        short_write: 0.03,
        flush_error: 0.2,
        slow: 0.01,
        slow_for: SLOW_FOR,
        write_hang: 0.005,
        flush_hang: 0.05,
        hang_for: HANG_FOR,
        ..FaultPlan::default()
    };
    store.set_plan(faults.clone()).unwrap();
    // What the program wrote: byte i belongs to writer i % WRITERS, so writers never race.
    let mut model = vec![0u8; SIZE as usize];
    let base = region.as_ptr() as usize;
    let flush_bound =
        HANG_FOR.saturating_add(SLOW_FOR) * (2 * FRAMES as u32) + Duration::from_secs(3);
    let (mut flushed_ok, mut flush_errors) = (0, 0);
    for phase in 0..10 {
        let seeds: Vec<u64> = (0..WRITERS).map(|_| rng.next()).collect();
        let chunks: Vec<Vec<(usize, u8)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = seeds
                .iter()
                .enumerate()
                .map(|(t, &seed)| {
                    let model = &model;
                    scope.spawn(move || {
                        let mut rng = Rng(seed);
                        let mut wrote = Vec::new();
                        for _ in 0..2000 {
                            let i = (rng.below(SIZE / WRITERS) * WRITERS) as usize + t;
                            let p = (base + i) as *mut u8;
                            // SAFETY: `i < SIZE`, the region is mapped while `region` lives, and
                            // only this thread touches bytes `== t (mod WRITERS)`.
                            let got = unsafe { p.read_volatile() };
                            let expect = wrote
                                .iter()
                                .rev()
                                .find(|&&(j, _)| j == i)
                                .map_or(model[i], |&(_, v)| v);
                            assert_eq!(got, expect, "byte {i} lost its last write");
                            let v = rng.next() as u8;
                            // SAFETY: as above.
                            unsafe { p.write_volatile(v) };
                            wrote.push((i, v));
                        }
                        wrote
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, v) in chunks.into_iter().flatten() {
            model[i] = v;
        }
        // Every other flush runs with the store well, so acknowledged flushes happen too.
        if phase % 2 == 1 {
            store.set_plan(FaultPlan::default()).unwrap();
        }
        let t = Instant::now();
        let mut result = region.flush();
        if phase % 2 == 1 {
            // The first may report a write-back that failed during the churn (a later one
            // succeeded); with the store well, the next must be clean.
            if let Err(e) = &result {
                eprintln!("phase {phase}: reported {e}");
                flush_errors += 1;
                result = region.flush();
            }
            assert!(
                result.is_ok(),
                "phase {phase}: a well store, yet {result:?}"
            );
        }
        store.set_plan(faults.clone()).unwrap();
        let took = t.elapsed();
        assert!(
            took < flush_bound,
            "phase {phase}: flush took {took:?} > {flush_bound:?}"
        );
        match result {
            Ok(()) => {
                // Acknowledged: every write so far must be in the store itself.
                assert!(
                    read_all(&*memory) == model,
                    "phase {phase}: flush said Ok, store differs"
                );
                flushed_ok += 1;
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        RegionError::WriteBack { .. }
                            | RegionError::StoreFlush(_)
                            | RegionError::BufferExhausted { .. }
                    ),
                    "phase {phase}: unexpected error {e}"
                );
                flush_errors += 1;
            }
        }
    }
    let injected = store.injected();
    store.heal();
    // Errors recorded by the evictors may still be pending: flush until the report is clean.
    let mut last = region.flush();
    for _ in 0..3 {
        if last.is_ok() {
            break;
        }
        last = region.flush();
    }
    last.expect("a healed store takes every dirty page");
    assert!(
        read_all(&*memory) == model,
        "after healing, the store holds every write"
    );
    assert!(injected.errors > 0 && injected.short > 0, "{injected:?}");
    region.unmap().expect("unmap");
    println!(
        "churn: {flushed_ok} clean flushes, {flush_errors} reported failures, injected {injected:?}"
    );
}

#[test]
fn churn_with_failing_writes_loses_nothing_and_hangs_nowhere() {
    const VAR: &str = "PAGER_FAULT_CHURN";
    if let Ok(seed) = std::env::var(VAR) {
        return churn(seed.parse().unwrap());
    }
    if !uffd_available("churn_with_failing_writes") {
        return;
    }
    let seed = Rng::from_time("churn_with_failing_writes").next();
    let out = run_child(
        "churn_with_failing_writes_loses_nothing_and_hangs_nowhere",
        VAR,
        &seed.to_string(),
        Duration::from_secs(90),
    );
    assert!(out.success(), "seed {seed}: {out:?}\n{}", out.output);
    eprintln!(
        "{}",
        out.output
            .lines()
            .filter(|l| l.contains("churn:"))
            .collect::<String>()
    );
}

/// A fill the store cannot serve (a read error, a torn read, a hang that times out) answers
/// the faulting thread with `SIGBUS` within the hang bound: the only reason the pager raises
/// `SIGBUS` is a store failure.
#[test]
fn failed_reads_of_every_kind_end_in_sigbus_within_the_bound() {
    const VAR: &str = "PAGER_FAULT_READ";
    if let Ok(kind) = std::env::var(VAR) {
        let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new(1 << 20)), 1));
        let plan = match kind.as_str() {
            "error" => FaultPlan {
                read_error: 1.0,
                ..FaultPlan::default()
            },
            "short" => FaultPlan {
                short_read: 1.0,
                ..FaultPlan::default()
            },
            _ => FaultPlan {
                read_hang: 1.0,
                hang_for: HANG_FOR,
                ..FaultPlan::default()
            },
        };
        let config = PagerConfig::builder()
            .page_bytes(PAGE)
            .buffer_bytes(16 * PAGE)
            .build()
            .unwrap();
        let region = Region::new(store.clone(), 1 << 20, config).unwrap();
        store.set_plan(plan).unwrap();
        let v = region.as_slice()[3 * PAGE as usize + 5];
        println!("CHILD READ {v}");
        std::process::exit(3);
    }
    if !uffd_available("failed_reads_of_every_kind_end_in_sigbus") {
        return;
    }
    for kind in ["error", "short", "hang"] {
        let out = run_child(
            "failed_reads_of_every_kind_end_in_sigbus_within_the_bound",
            VAR,
            kind,
            Duration::from_secs(20),
        );
        assert_eq!(
            out.signal(),
            Some(libc::SIGBUS),
            "{kind}: {out:?}\n{}",
            out.output
        );
        assert!(
            out.elapsed < Duration::from_secs(10),
            "{kind}: took {:?}",
            out.elapsed
        );
    }
}

/// The smallest buffer (4 frames), every frame holding a page the program wrote, and a store
/// that refuses every write: a fault on a fifth page can get no frame, and its thread gets
/// `SIGBUS` within the bound, not after the 30 s wait for busy frames. (A fault gives up only
/// once every frame holds a page whose write-back failed; `write_tracking.rs` has the case
/// where some frames can still be dropped and the fault must be served.)
#[test]
fn a_buffer_of_unwritable_pages_ends_the_next_fault_in_sigbus_within_the_bound() {
    const VAR: &str = "PAGER_FAULT_EXHAUSTED";
    if std::env::var(VAR).is_ok() {
        let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new(1 << 20)), 1));
        let config = PagerConfig::builder()
            .page_bytes(PAGE)
            .buffer_bytes(4 * PAGE)
            .read_ahead(0)
            .build()
            .unwrap();
        let mut region = Region::new(store.clone(), 1 << 20, config).unwrap();
        store
            .set_plan(FaultPlan {
                write_error: 1.0,
                ..FaultPlan::default()
            })
            .unwrap();
        for p in 0..4 {
            region.as_mut_slice()[p * PAGE as usize + 7] = 0x5a;
        }
        println!("CHILD WROTE");
        let v = region.as_slice()[9 * PAGE as usize];
        println!("CHILD READ {v}");
        std::process::exit(3);
    }
    if !uffd_available("a_buffer_of_unwritable_pages") {
        return;
    }
    let out = run_child(
        "a_buffer_of_unwritable_pages_ends_the_next_fault_in_sigbus_within_the_bound",
        VAR,
        "1",
        Duration::from_secs(45),
    );
    assert_eq!(out.signal(), Some(libc::SIGBUS), "{out:?}\n{}", out.output);
    assert!(
        out.output.contains("CHILD WROTE") && !out.output.contains("CHILD READ"),
        "the writes to the four frames are served, the fifth page is not:\n{}",
        out.output
    );
    assert!(
        out.elapsed < Duration::from_secs(10),
        "took {:?}: the fault waited for frames that could never come free",
        out.elapsed
    );
    println!("unwritable buffer: SIGBUS after {:?}", out.elapsed);
}
