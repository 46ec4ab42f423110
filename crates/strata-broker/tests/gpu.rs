//! The broker with real GPUs (feature `gpu`; needs two peer-capable GPUs, skips otherwise):
//! CUDA VMM chunks of GPU 1 lent through a real broker to a borrower process on GPU 0,
//! contents checked after import; reclaim latency of 1 GiB of chunks; a killed borrower's
//! memory coming back to the lender (measured with cuMemGetInfo); a killed broker.
//! Results are printed as `RESULT {json}` lines.
#![cfg(feature = "gpu")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{WAIT, freed, seed, socket_path, spawn_child, start_broker, wait_exit};
use gpu_common::replay_rmw_owned;
use strata_broker::gpu::{GpuSink, GpuSource, SpaceSink};
use strata_broker::message::FreeReason;
use strata_broker::{Borrower, Lender, LenderEvent, Sigkill};
use strata_gpu::driver::{Args, Gpu};
use strata_gpu::{EvictionPolicy, Strata};

#[path = "../../strata-gpu/tests/common/mod.rs"]
mod gpu_common;

const KERNELS: &str = include_str!("../../strata-gpu/tests/gpu_kernels.cu");

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Slack when comparing free memory (other allocations of the driver come and go).
const SLACK: u64 = 64 * MIB;

fn two_gpus() -> Option<(Arc<Gpu>, Arc<Gpu>)> {
    match (Gpu::open(0), Gpu::open(1)) {
        (Ok(a), Ok(b)) => Some((a, b)),
        _ => {
            println!("skipped: needs two GPUs");
            None
        }
    }
}

fn free_bytes(gpu: &Gpu) -> u64 {
    gpu.mem_info().unwrap().0
}

/// Waits until `gpu`'s free memory is within SLACK of `target`; returns how long it took.
fn wait_free(gpu: &Gpu, target: u64) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if free_bytes(gpu) + SLACK >= target {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs only in a child started by `spawn_child`.
#[test]
fn child_entry() {
    let Some((role, path, args)) = common::child_spec() else {
        return;
    };
    match role.as_str() {
        "gpu-borrower" => {
            let seed: u64 = args[0].parse().unwrap();
            let bytes: u64 = args[1].parse().unwrap();
            let chunk: u64 = args[2].parse().unwrap();
            let gpu = Gpu::open(0).unwrap();
            let slots = usize::try_from(bytes / chunk).unwrap();
            let sink =
                GpuSink::new(&gpu, slots, usize::try_from(chunk).unwrap(), Some(seed)).unwrap();
            let mut b = Borrower::start(&path, 0, sink).unwrap();
            let got = b.borrow(bytes, &[1], WAIT).unwrap();
            assert_eq!(got.granted_bytes, bytes);
            let checked = b.sink().lock().unwrap().checked;
            assert_eq!(checked, bytes / chunk);
            common::ready_and_hold(b, &format!("checked {checked}"));
        }
        "gpu-lender" => {
            let max: u64 = args[0].parse().unwrap();
            let mut lender = Lender::start(&path, GpuSource::open(1, None).unwrap(), max).unwrap();
            println!("{}", common::READY);
            // Commands on stdin: `reclaim BYTES DEADLINE_MS`.
            for line in std::io::stdin().lines() {
                let line = line.unwrap();
                let words: Vec<&str> = line.split_whitespace().collect();
                if let ["reclaim", bytes, ms] = words[..] {
                    let deadline = Duration::from_millis(ms.parse().unwrap());
                    let (r, took) = lender.reclaim(bytes.parse().unwrap(), deadline).unwrap();
                    println!(
                        "RECLAIMED {} {} {} {:?}",
                        r.freed_bytes,
                        took.as_micros(),
                        r.outstanding_bytes,
                        r.killed_pids
                    );
                }
            }
            std::process::exit(0);
        }
        "broker" => common::run_broker_child(&path),
        other => panic!("unknown child role {other}"),
    }
}

/// Three reclaims of 1 GiB held by a borrower process on GPU 0 (chunks of `chunk` bytes,
/// each checked after import), the lender taking it all back with a 1 s deadline; prints the
/// latencies and where the time went. Returns the lender (still connected) for more.
fn reclaim_runs(
    path: &std::path::Path,
    gpu1: &Gpu,
    baseline: u64,
    chunk: u64,
    seed: u64,
) -> Lender {
    let source = GpuSource::open(1, Some(seed))
        .unwrap()
        .with_chunk_bytes(usize::try_from(chunk).unwrap())
        .unwrap();
    let releases = source.release_log();
    let mut lender = Lender::start(path, source, 4 * GIB).unwrap();
    let chunks = GIB / chunk;
    let mut latencies = Vec::new();
    let mut free_after = Vec::new();
    let mut phases = Vec::new();
    for run in 0..3 {
        lender.offer(4 * GIB).unwrap();
        let child = spawn_child(&format!(
            "gpu-borrower|{}|{seed}|{GIB}|{chunk}",
            path.display()
        ));
        assert_eq!(lender.lent_bytes(), GIB);
        let lent_free = free_bytes(gpu1);
        assert!(
            lent_free + GIB <= baseline + SLACK,
            "1 GiB is in use on GPU 1: {lent_free} vs {baseline}"
        );
        releases.lock().unwrap().clear();
        let asked = Instant::now();
        let (report, took) = lender.reclaim(GIB, Duration::from_secs(1)).unwrap();
        {
            // Where the time went: until the lender heard the chunks were free (borrower
            // unmapped and released them, broker passed it on), then the lender's releases.
            let log = releases.lock().unwrap();
            let heard = log
                .first()
                .map_or(0.0, |(t, _, _)| t.duration_since(asked).as_secs_f64() * 1e3);
            let releasing: Duration = log.iter().map(|(_, d, _)| *d).sum();
            phases.push(format!(
                "{{\"heard_free_ms\":{heard:.3},\"lender_release_ms\":{:.3}}}",
                releasing.as_secs_f64() * 1e3
            ));
        }
        assert_eq!(report.freed_bytes, GIB, "{report:?}");
        assert!(report.killed_pids.is_empty());
        assert_eq!(lender.lent_bytes(), 0);
        let back =
            wait_free(gpu1, baseline).expect("GPU 1's memory is free again after the reclaim");
        println!(
            "reclaim run {run} ({chunk}-byte chunks): 1 GiB back in {took:?} (free memory back {back:?} later)"
        );
        latencies.push(took.as_secs_f64() * 1e3);
        free_after.push(back.as_secs_f64() * 1e3);
        drop(child);
        // Wait for the child's exit to be seen before the next run.
        assert!(freed(
            &lender,
            FreeReason::Released,
            usize::try_from(chunks * (run + 1)).unwrap()
        ));
    }
    println!(
        "RESULT {{\"test\":\"reclaim_1gib\",\"chunk_bytes\":{chunk},\"chunks\":{chunks},\"deadline_ms\":1000,\"latency_ms\":{:?},\"median_ms\":{:.3},\"free_visible_after_ms\":{:?},\"phases\":[{}],\"goal_ms\":10}}",
        latencies,
        median(latencies.clone()),
        free_after,
        phases.join(",")
    );
    lender
}

#[test]
fn gpu_lending_reclaim_and_deaths() {
    let Some((gpu0, gpu1)) = two_gpus() else {
        return;
    };
    drop(gpu0);
    let seed = seed();
    let b = start_broker(Box::new(Sigkill));
    let baseline = free_bytes(&gpu1);
    // Reclaim latency with 2 MiB chunks (the granularity) and with 32 MiB chunks (fewer
    // driver calls per GiB).
    drop(reclaim_runs(&b.path, &gpu1, baseline, 32 * MIB, seed));
    assert!(wait_free(&gpu1, baseline).is_some());
    let lender = reclaim_runs(&b.path, &gpu1, baseline, 2 * MIB, seed);

    // A borrower process killed while it holds 1 GiB: the chunks come back to the lender and
    // the memory is free again on GPU 1.
    lender.offer(4 * GIB).unwrap();
    let mut child = spawn_child(&format!(
        "gpu-borrower|{}|{seed}|{GIB}|{}",
        b.path.display(),
        2 * MIB
    ));
    assert_eq!(lender.lent_bytes(), GIB);
    let killed_at = Instant::now();
    child.0.kill().unwrap();
    wait_exit(&mut child);
    assert!(freed(&lender, FreeReason::BorrowerGone, 512));
    let told = killed_at.elapsed();
    let back = wait_free(&gpu1, baseline).expect("a killed borrower's memory is free again");
    println!(
        "RESULT {{\"test\":\"borrower_killed\",\"bytes\":{GIB},\"lender_told_ms\":{:.3},\"memory_free_ms\":{:.3}}}",
        told.as_secs_f64() * 1e3,
        (told + back).as_secs_f64() * 1e3
    );
    drop(lender);
    assert!(wait_free(&gpu1, baseline).is_some());
}

#[test]
fn gpu_broker_killed_borrower_and_lender_carry_on() {
    let Some((gpu0, gpu1)) = two_gpus() else {
        return;
    };
    let seed = seed();
    let path = socket_path("gpu-broker");
    let mut broker = spawn_child(&format!("broker|{}", path.display()));
    let baseline = free_bytes(&gpu1);
    let lender = Lender::start(&path, GpuSource::open(1, Some(seed)).unwrap(), GIB).unwrap();
    let sink = GpuSink::new(&gpu0, 256, 2 << 20, Some(seed)).unwrap();
    let mut borrower = Borrower::start(&path, 0, sink).unwrap();
    let got = borrower.borrow(256 * MIB, &[1], WAIT).unwrap();
    assert_eq!(got.granted_bytes, 256 * MIB);
    assert_eq!(borrower.sink().lock().unwrap().window().mapped(), 128);
    broker.0.kill().unwrap();
    wait_exit(&mut broker);
    assert!(borrower.wait_broker_lost(WAIT));
    assert_eq!(
        borrower.sink().lock().unwrap().window().mapped(),
        0,
        "borrowed chunks unmapped"
    );
    assert!(
        lender
            .wait_event(WAIT, |e| (*e == LenderEvent::BrokerLost).then_some(()))
            .is_some()
    );
    let back = wait_free(&gpu1, baseline).expect("GPU 1's memory is free once the broker died");
    println!(
        "RESULT {{\"test\":\"broker_killed\",\"bytes\":{},\"memory_free_ms\":{:.3}}}",
        256 * MIB,
        back.as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A space on GPU 0 whose peer tier is memory of GPU 1 lent by a lender process through a real
/// broker: random read-modify-writes from every SM against a host replay, 2x and 4x the local
/// cache, with the lender taking a quarter of the chunks back in the middle of each of two
/// kernels (no wrong value, no hang), then random reads and a full read-back.
#[test]
fn space_with_leased_chunks_survives_reclaims_mid_kernel() {
    let Some((gpu0, _gpu1)) = two_gpus() else {
        return;
    };
    drop(gpu0);
    let strata = Strata::new(0).unwrap();
    let module = strata.compile(KERNELS, "gpu_kernels.cu").unwrap();
    let rmw = module.function("rmw_owned").unwrap();
    let read = module.function("read_random").unwrap();
    let grid = rmw.full_grid(256).unwrap();
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    let b = start_broker(Box::new(Sigkill));
    let mut lender = spawn_child(&format!("gpu-lender|{}|{}", b.path.display(), 4 * GIB));
    // (page, cache, ratio, read-modify-writes per thread, quarters of the borrowed memory
    // reclaimed in rounds 0 and 1): the last reclaims 1 GiB at once in the middle of a kernel.
    for (page, cache, ratio, ops, quarters) in [
        (64u64 << 10, 32 * MIB, 4u64, 24u64, [1u64, 1]),
        (4 << 10, 32 * MIB, 2, 24, [1, 1]),
        (64 << 10, 512 * MIB, 3, 8, [4, 0]),
    ] {
        let s = seed();
        let bytes = cache * ratio;
        let n = usize::try_from(bytes / 8).unwrap();
        let mut space = strata
            .space(bytes, &gpu_common::opts(page, cache, EvictionPolicy::Clock))
            .unwrap();
        let mut reference = gpu_common::random_words(n, s);
        space.fill_from_slice(0, &reference).unwrap();
        space
            .enable_peer_leases(usize::try_from(bytes / (2 << 20)).unwrap())
            .unwrap();
        let space = Arc::new(space);
        let mut borrower = Borrower::start(&b.path, 0, SpaceSink::new(space.clone())).unwrap();
        let borrowed = bytes - cache;
        assert_eq!(
            borrower.borrow(borrowed, &[1], WAIT).unwrap().granted_bytes,
            borrowed
        );
        let mut timings = Vec::new();
        for round in 0..3u64 {
            let rs = s ^ round;
            let launched = Instant::now();
            rmw.launch(grid, &Args::new().arg(space.handle()).arg(ops).arg(rs))
                .unwrap();
            let mut reclaim = None;
            let q = quarters
                .get(usize::from(round == 1))
                .copied()
                .filter(|_| round < 2)
                .unwrap_or(0);
            if q > 0 {
                let take = borrowed / 4 * q;
                lender.send(&format!("reclaim {take} 2000"));
                reclaim = Some((lender.expect_line("RECLAIMED"), launched.elapsed()));
            }
            space.check_errors().unwrap();
            let kernel = launched.elapsed();
            replay_rmw_owned(&mut reference, threads, ops, rs);
            println!(
                "page {page} ratio {ratio} round {round}: kernel done after {kernel:?}, reclaim {reclaim:?}"
            );
            if let Some((line, at)) = reclaim {
                timings.push(format!(
                    "{{\"reclaim\":\"{line}\",\"reclaimed_at_ms\":{:.3},\"kernel_ms\":{:.3}}}",
                    at.as_secs_f64() * 1e3,
                    kernel.as_secs_f64() * 1e3
                ));
            }
        }
        let what = format!("page {page} ratio {ratio}");
        gpu_common::check_read_random(&read, &space, grid, &reference, 4, s ^ 0x5555, &what);
        let mut back = vec![0u64; n];
        space.read_back(0, &mut back).unwrap();
        let bad = back.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "{what}: {bad} words differ from the host replay");
        let st = space.stats().unwrap();
        let peer = st.peer.expect("a leased peer tier reports itself");
        let refused = space.peer_refused().unwrap();
        let revokes = borrower.sink().lock().unwrap().revokes.clone();
        assert_eq!(peer.refused, refused, "stats() reports the refusals");
        assert_eq!(
            peer.reclaims,
            revokes.len() as u64,
            "stats() counts every reclaim answered"
        );
        for (phases, total) in &revokes {
            println!("revoke: {total:?} in all, {phases:?}");
        }
        assert_eq!(
            peer.borrowed_bytes,
            borrowed - borrowed / 4 * quarters.iter().sum::<u64>(),
            "what was reclaimed is gone"
        );
        assert!(
            peer.stores > 0 && peer.loads > 0,
            "the peer tier was not used: {peer:?}"
        );
        let max_wait = revokes
            .iter()
            .map(|(p, _)| p.waited)
            .max()
            .unwrap_or_default();
        let max_total = revokes.iter().map(|(_, t)| *t).max().unwrap_or_default();
        println!(
            "RESULT {{\"test\":\"space_reclaim_mid_kernel\",\"page\":{page},\"ratio\":{ratio},\"faults\":{},\"peer_loads\":{},\"peer_stores\":{},\"refused_entries\":{refused},\"revokes\":{},\"max_revoke_wait_us\":{},\"max_revoke_total_us\":{},\"rounds\":[{}]}}",
            st.faults,
            peer.loads,
            peer.stores,
            revokes.len(),
            max_wait.as_micros(),
            max_total.as_micros(),
            timings.join(",")
        );
        drop(borrower);
    }

    // The lender process dies in the middle of a kernel: the broker revokes its chunks, the
    // space stops using them (its kernel goes on from the host copy) and unmaps them.
    let s = seed();
    let (page, cache) = (64u64 << 10, 32 * MIB);
    let bytes = 4 * cache;
    let n = usize::try_from(bytes / 8).unwrap();
    let mut space = strata
        .space(bytes, &gpu_common::opts(page, cache, EvictionPolicy::Clock))
        .unwrap();
    let mut reference = gpu_common::random_words(n, s);
    space.fill_from_slice(0, &reference).unwrap();
    space.enable_peer_leases(64).unwrap();
    let space = Arc::new(space);
    let mut borrower = Borrower::start(&b.path, 0, SpaceSink::new(space.clone())).unwrap();
    assert_eq!(
        borrower
            .borrow(bytes - cache, &[1], WAIT)
            .unwrap()
            .granted_bytes,
        bytes - cache
    );
    let launched = Instant::now();
    rmw.launch(grid, &Args::new().arg(space.handle()).arg(24u64).arg(s))
        .unwrap();
    lender.0.kill().unwrap();
    wait_exit(&mut lender);
    let killed = launched.elapsed();
    let end = Instant::now() + WAIT;
    while !borrower.held().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    let unmapped = launched.elapsed();
    assert!(
        borrower.held().is_empty(),
        "the dead lender's chunks were revoked"
    );
    space.check_errors().unwrap();
    let kernel = launched.elapsed();
    replay_rmw_owned(&mut reference, threads, 24, s);
    let mut back = vec![0u64; n];
    space.read_back(0, &mut back).unwrap();
    let bad = back.iter().zip(&reference).filter(|(a, b)| a != b).count();
    assert_eq!(
        bad, 0,
        "lender killed mid-kernel: {bad} words differ from the host replay"
    );
    assert_eq!(space.stats().unwrap().peer.unwrap().borrowed_bytes, 0);
    println!(
        "RESULT {{\"test\":\"lender_killed_mid_kernel\",\"killed_at_ms\":{:.3},\"chunks_unmapped_at_ms\":{:.3},\"kernel_ms\":{:.3}}}",
        killed.as_secs_f64() * 1e3,
        unmapped.as_secs_f64() * 1e3,
        kernel.as_secs_f64() * 1e3
    );
}
