//! Fillers that poll for the next fault (`PagerConfig::fault_spin_us`): faults are served with
//! the same bytes as by sleeping fillers, and a filler stops polling soon after the last fault
//! instead of burning a CPU while the program computes or idles.
#![allow(clippy::cast_possible_truncation)] // test data sizes are small; truncation cannot happen

mod common;

use std::time::Duration;

use common::{Rng, random_store, uffd_available};
use strata_core::PagerConfig;
use strata_pager::Region;

const PAGE: u64 = 4096;

/// The CPU-time test measures the whole process: the tests of this file take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat has a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Clock ticks are 100 per second on Linux (USER_HZ).
    Duration::from_millis(ticks * 10)
}

fn region(spin_us: u32, store_pages: u64, buffer_pages: u64, rng: &mut Rng) -> (Region, Vec<u8>) {
    let size = store_pages * PAGE;
    let (store, data) = random_store(size as usize, rng);
    let config = PagerConfig::builder()
        .page_bytes(PAGE)
        .buffer_bytes(buffer_pages * PAGE)
        .fillers(1)
        .evictors(1)
        .fault_spin_us(spin_us)
        .build()
        .unwrap();
    (Region::new(store, size, config).unwrap(), data)
}

#[test]
fn polling_fillers_serve_the_same_bytes_under_churn() {
    if !uffd_available("polling_fillers_serve_the_same_bytes_under_churn") {
        return;
    }
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut rng = Rng::from_time("polling_fillers_serve_the_same_bytes_under_churn");
    for spin in [0, 50, 2000] {
        // 4x the buffer, two threads reading and rewriting their own halves at random.
        let (region, data) = region(spin, 256, 64, &mut rng);
        let base = region.as_ptr() as usize;
        let half = (128 * PAGE) as usize;
        let seeds = [rng.next(), rng.next()];
        let mut model = data.clone();
        std::thread::scope(|scope| {
            for (t, (seed, part)) in seeds.iter().zip(model.chunks_mut(half)).enumerate() {
                scope.spawn(move || {
                    let mut rng = Rng(*seed);
                    for _ in 0..4000 {
                        let i = rng.below(half as u64) as usize;
                        let p = (base + t * half + i) as *mut u8;
                        // SAFETY: the byte is inside the mapped region (which outlives the
                        // scope) and in this thread's half, which no other thread touches.
                        let got = unsafe { p.read_volatile() };
                        assert_eq!(
                            got,
                            part[i],
                            "spin {spin}: byte {} read wrong",
                            t * half + i
                        );
                        let v = rng.next() as u8;
                        // SAFETY: as above.
                        unsafe { p.write_volatile(v) };
                        part[i] = v;
                    }
                });
            }
        });
        region.flush().unwrap();
        let mut back = vec![0u8; model.len()];
        // SAFETY: the region maps `model.len()` bytes and lives until the end of this loop.
        unsafe { std::ptr::copy_nonoverlapping(region.as_ptr(), back.as_mut_ptr(), back.len()) };
        assert!(
            back == model,
            "spin {spin}: the region differs from the model"
        );
        assert!(region.stats().faults > 0, "spin {spin}: no fault taken");
    }
}

#[test]
fn a_polling_filler_goes_to_sleep_after_the_last_fault() {
    if !uffd_available("a_polling_filler_goes_to_sleep_after_the_last_fault") {
        return;
    }
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut rng = Rng::from_time("a_polling_filler_goes_to_sleep_after_the_last_fault");
    // The longest poll allowed: 10 ms after the last fault.
    let (region, data) = region(strata_core::config::MAX_FAULT_SPIN_US, 64, 16, &mut rng);
    for page in 0..64 {
        // SAFETY: inside the mapped region.
        let got = unsafe { region.as_ptr().add(page * PAGE as usize).read_volatile() };
        assert_eq!(got, data[page * PAGE as usize]);
    }
    let before = process_cpu();
    std::thread::sleep(Duration::from_millis(500));
    let used = process_cpu().saturating_sub(before);
    // A filler that kept polling would use about 500 ms of CPU here.
    assert!(
        used < Duration::from_millis(150),
        "the process used {used:?} of CPU in 500 ms of sleep after its last fault: a filler kept polling"
    );
}
