//! CPU-side cost of finding the CPU's writes at a sync (no GPU needed): a shared anonymous
//! mapping (shmem, like the CUDA driver's pinned host memory) tracked by a `CpuTracker` in
//! write-protect mode, timed over rounds of "CPU phase, then the tracker's part of a sync"
//! (`written` + `record`), for phases that write nothing, a few pages, and everything.
//!
//! `cargo run --release -p strata-unified --example sync_cost -- [MiB] [page KiB] [rounds]
//! [notified|scanned]` (defaults 1024, 64, 50, both modes). Prints one line per mode and case:
//! the median and first sync in us and the CPU phase (with the first-write faults) in ms.

use std::time::Instant;

use strata_unified::DirtyTracking;
use strata_unified::cpu_tracker::CpuTracker;
use strata_unified::write_watch::WatchMode;

/// A populated shared anonymous mapping, unmapped on drop.
struct Shared {
    ptr: *mut u8,
    len: usize,
}

impl Shared {
    fn new(len: usize) -> Self {
        // SAFETY: a fresh anonymous shared mapping, no address hint; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of {len} bytes failed");
        Shared {
            ptr: ptr.cast(),
            len,
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, alive until drop; the program holds one slice of
        // it at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// A cheap deterministic mix (splitmix64) for page choices.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Writes one byte in each of `writes` places of `bytes` from `threads` threads: every
/// `stride` bytes when `stride` > 0, else at pseudo-random places drawn from `round`.
fn write(bytes: &mut [u8], writes: usize, stride: usize, round: usize, threads: usize) {
    let len = bytes.len();
    let per = len.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in bytes.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for i in (t * writes / threads)..((t + 1) * writes / threads) {
                    let at = if stride > 0 {
                        i * stride
                    } else {
                        usize::try_from(mix((round * writes + i) as u64) % len as u64).unwrap_or(0)
                    };
                    if let Some(b) = at.checked_sub(t * per).and_then(|o| chunk.get_mut(o)) {
                        *b = b.wrapping_add(1);
                    }
                }
            });
        }
    });
}

fn main() {
    let (mib, page_kib, rounds) = (arg(1, 1024), arg(2, 64), arg(3, 50).max(1));
    let modes: Vec<WatchMode> = match std::env::args().nth(4).as_deref() {
        Some("scanned") => vec![WatchMode::Scanned],
        Some("notified") => vec![WatchMode::Notified],
        _ => vec![WatchMode::Notified, WatchMode::Scanned],
    };
    let (len, page) = (mib << 20, page_kib << 10);
    let pages = len / page;
    let mem = Shared::new(len);
    // Writes per CPU phase (and from how many threads): none, a few pages, one word in 1/32
    // of the pages (bench unified's handoff-partial), every 4 KiB (the first round takes
    // every fault, then the pages are hot: hashed, not protected).
    let cases = [
        ("none", 0, 0, 1),
        ("16 pages", 16, 0, 1),
        ("1/32 of pages", pages / 32, 0, 1),
        ("every 4 KiB", len / 4096, 4096, 1),
        ("every 4 KiB x2", len / 4096, 4096, 2),
    ];
    for &mode in &modes {
        for (name, writes, stride, threads) in cases {
            let t = Instant::now();
            let mut tracker =
                CpuTracker::with_watch(DirtyTracking::WriteProtect, page, mem.bytes(), &[mode]);
            let setup = t.elapsed().as_secs_f64() * 1e3;
            if tracker.watch_mode() != Some(mode) {
                println!(
                    "{mode:?}: unavailable here (tracker fell back to {:?})",
                    tracker.mode()
                );
                break;
            }
            let (mut sync_us, mut phase_ms, mut found) = (Vec::new(), Vec::new(), 0);
            let n = if writes > pages {
                rounds.min(5)
            } else {
                rounds
            };
            for r in 0..n {
                let t = Instant::now();
                write(mem.bytes(), writes, stride, r, threads);
                phase_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                let w = tracker.written(mem.bytes(), 0..pages);
                tracker.record(mem.bytes(), 0..pages, &w);
                sync_us.push(t.elapsed().as_secs_f64() * 1e6);
                found = w.len();
            }
            let (first_sync, first_phase) = (sync_us[0], phase_ms[0]);
            println!(
                "{mib} MiB/{page_kib} KiB {mode:?} {name:>15}: sync median {:8.1} us (first {:8.1}), CPU phase median {:7.2} ms (first {:7.2}), found {found} pages at the last sync, {} hot; set-up {setup:.1} ms",
                median(&mut sync_us),
                first_sync,
                median(&mut phase_ms),
                first_phase,
                tracker.hot_pages(),
            );
        }
    }
}
