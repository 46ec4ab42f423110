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
use strata_broker::gpu::{GpuSink, GpuSource};
use strata_broker::message::FreeReason;
use strata_broker::{Borrower, Lender, LenderEvent, Sigkill};
use strata_gpu::driver::Gpu;

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
            let gpu = Gpu::open(0).unwrap();
            let sink = GpuSink::new(&gpu, 1024, 2 << 20, Some(seed)).unwrap();
            let mut b = Borrower::start(&path, 0, sink).unwrap();
            let got = b.borrow(bytes, &[1], WAIT).unwrap();
            assert_eq!(got.granted_bytes, bytes);
            let checked = b.sink().lock().unwrap().checked;
            assert_eq!(checked, bytes / (2 << 20));
            common::ready_and_hold(b, &format!("checked {checked}"));
        }
        "broker" => common::run_broker_child(&path),
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn gpu_lending_reclaim_and_deaths() {
    let Some((gpu0, gpu1)) = two_gpus() else {
        return;
    };
    drop(gpu0);
    let seed = seed();
    let b = start_broker(Box::new(Sigkill));
    let source = GpuSource::open(1, Some(seed)).unwrap();
    let baseline = free_bytes(&gpu1);
    let mut lender = Lender::start(&b.path, source, 4 * GIB).unwrap();

    // Reclaim latency: a borrower process on GPU 0 holds 1 GiB of GPU 1 (512 chunks, each
    // checked after import); the lender takes it all back with a 1 s deadline.
    let mut latencies = Vec::new();
    let mut free_after = Vec::new();
    for run in 0..3 {
        lender.offer(4 * GIB).unwrap();
        let child = spawn_child(&format!("gpu-borrower|{}|{seed}|{GIB}", b.path.display()));
        assert_eq!(lender.lent_bytes(), GIB);
        let lent_free = free_bytes(&gpu1);
        assert!(
            lent_free + GIB <= baseline + SLACK,
            "1 GiB is in use on GPU 1: {lent_free} vs {baseline}"
        );
        let (report, took) = lender.reclaim(GIB, Duration::from_secs(1)).unwrap();
        assert_eq!(report.freed_bytes, GIB, "{report:?}");
        assert!(report.killed_pids.is_empty());
        assert_eq!(lender.lent_bytes(), 0);
        let back =
            wait_free(&gpu1, baseline).expect("GPU 1's memory is free again after the reclaim");
        println!("reclaim run {run}: 1 GiB back in {took:?} (free memory back {back:?} later)");
        latencies.push(took.as_secs_f64() * 1e3);
        free_after.push(back.as_secs_f64() * 1e3);
        drop(child);
        // Wait for the child's exit to be seen before the next run.
        assert!(freed(&lender, FreeReason::Released, 512 * (run + 1)));
    }
    println!(
        "RESULT {{\"test\":\"reclaim_1gib\",\"chunks\":512,\"deadline_ms\":1000,\"latency_ms\":{:?},\"median_ms\":{:.3},\"free_visible_after_ms\":{:?},\"goal_ms\":10}}",
        latencies,
        median(latencies.clone()),
        free_after
    );

    // A borrower process killed while it holds 1 GiB: the chunks come back to the lender and
    // the memory is free again on GPU 1.
    lender.offer(4 * GIB).unwrap();
    let mut child = spawn_child(&format!("gpu-borrower|{}|{seed}|{GIB}", b.path.display()));
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
