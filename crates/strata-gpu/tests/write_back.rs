//! GPU tests of background write-back: the write-back warps clean pages ahead of the clock
//! hand without losing a write (hot pages written while they are copied down, pages streamed
//! past), stop with the kernel whatever stream it ran on, and leave results identical to a run
//! without them. Without a CUDA driver each test prints `skipped: no CUDA driver` and passes.
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use std::time::{Duration, Instant};

use strata_gpu::driver::{Args, Grid, Stream};
use strata_gpu::space::BackgroundWriteBack;
use strata_gpu::{EvictionPolicy, SpaceOptions, Strata};

mod common;
use common::{opts, random_words, seed, strata_or_skip};

const KERNELS: &str = r#"
#include "strata.cuh"
// Every thread sweeps its stripe of the space but the last `hot` words `passes` times,
// x -> x * 3 + i, while the first `hot_threads` threads also add 1 to `hot_adds` of the last
// `hot` words at every 8th step: those pages are written all the time, also while the
// write-back warps copy them down.
extern "C" __global__ void stream_and_hot(StrataSpace s, unsigned long long passes,
                                          unsigned long long hot, unsigned long long hot_adds,
                                          unsigned long long hot_threads) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long n = a.size() - hot;  // the hot words sit at the end
    for (unsigned long long p = 0; p < passes; ++p) {
        for (unsigned long long i = t; i < n; i += threads) {
            a.write(i, a.read(i) * 3 + i);
            if (t < hot_threads && (i / threads) % 8 == 0)
                for (unsigned long long k = 0; k < hot_adds; ++k) a.atomic_add(n + (t + k) % hot, 1ull);
        }
    }
}
"#;

fn options(
    page: u64,
    cache: u64,
    policy: EvictionPolicy,
    wb: Option<BackgroundWriteBack>,
) -> SpaceOptions {
    SpaceOptions {
        background_write_back: wb,
        ..opts(page, cache, policy)
    }
}

/// Streaming read-modify-write passes over a space 4x its cache, with hot atomics on the side,
/// with and without write-back warps: both match a host replay exactly; with them most dirty
/// victims were cleaned before a fault took their frame.
#[test]
fn write_back_warps_clean_ahead_and_lose_nothing() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "write_back_kernels.cu").unwrap();
    let f = module.function("stream_and_hot").unwrap();
    let full = f.full_grid(256).unwrap();
    // A persistent grid (the write-back warps find no free multiprocessor until its blocks
    // finish) and one of four waves (they start when the first block ends).
    for (waves, page, cache) in [
        (1u32, 4u64 << 10, 16u64 << 20),
        (4, 4 << 10, 16 << 20),
        (1, 64 << 10, 32 << 20),
        (4, 64 << 10, 32 << 20),
    ] {
        let grid = Grid {
            blocks: full.blocks * waves,
            threads: full.threads,
        };
        let threads = u64::from(grid.blocks) * u64::from(grid.threads);
        let (passes, hot_adds, hot_threads) = (2u64, 4u64, 4096u64.min(threads));
        for policy in [
            EvictionPolicy::Clock,
            EvictionPolicy::ScanResistant {
                protected_fraction: 0.5,
            },
        ] {
            let bytes = 4 * cache;
            let n = (bytes / 8) as usize;
            // The hot words: the last `hot` pages (the atomics land on their first words).
            let words_per_page = (page / 8) as usize;
            let hot = 64usize.min(n / words_per_page / 8);
            let s = seed();
            let start = random_words(n, s);
            let mut results = Vec::new();
            for wb in [None, Some(BackgroundWriteBack::default())] {
                let mut space = strata
                    .space(bytes, &options(page, cache, policy, wb))
                    .unwrap();
                space.fill_from_slice(0, &start).unwrap();
                let t0 = Instant::now();
                f.launch(
                    grid,
                    &Args::new()
                        .arg(space.handle())
                        .arg(passes)
                        .arg(hot as u64 * words_per_page as u64)
                        .arg(hot_adds)
                        .arg(hot_threads),
                )
                .unwrap();
                space.check_errors().unwrap();
                let took = t0.elapsed();
                let st = space.stats().unwrap();
                let mut back = vec![0u64; n];
                space.read_back(0, &mut back).unwrap();
                eprintln!(
                    "page {page} {policy:?} waves {waves} write-back {}: {took:?}, faults {} writebacks {} (background {})",
                    wb.is_some(),
                    st.faults,
                    st.writebacks,
                    st.background_writebacks
                );
                if wb.is_some() {
                    assert!(
                        st.background_writebacks > 0,
                        "the write-back warps cleaned nothing: {st:?}"
                    );
                } else {
                    assert_eq!(st.background_writebacks, 0, "write-back off: {st:?}");
                }
                results.push(back);
            }
            // The host replay.
            let hot_len = hot * words_per_page;
            let cold = n - hot_len;
            let mut want = start.clone();
            for _ in 0..passes {
                for (i, w) in want.iter_mut().enumerate().take(cold) {
                    *w = w.wrapping_mul(3).wrapping_add(i as u64);
                }
            }
            for t in 0..hot_threads {
                let mut i = t;
                while i < cold as u64 {
                    if (i / threads) % 8 == 0 {
                        for k in 0..hot_adds {
                            let j = cold + ((t + k) % hot_len as u64) as usize;
                            want[j] = want[j].wrapping_add(passes);
                        }
                    }
                    i += threads;
                }
            }
            for (k, got) in results.iter().enumerate() {
                let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(
                    bad,
                    0,
                    "page {page} {policy:?} write-back {}: {bad} words differ from the replay",
                    k == 1
                );
            }
        }
    }
}

/// A kernel on a stream of the user's: its stop ends the write-back warps when it ends, long
/// before their idle time, so waiting for the whole context returns at once.
#[test]
fn write_back_warps_stop_with_a_kernel_on_any_stream() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let module = strata.compile(KERNELS, "write_back_kernels.cu").unwrap();
    let f = module.function("stream_and_hot").unwrap();
    let wb = BackgroundWriteBack {
        idle: Duration::from_secs(8),
        ..BackgroundWriteBack::default()
    };
    let cache = 8u64 << 20;
    let mut space = strata
        .space(
            4 * cache,
            &options(4 << 10, cache, EvictionPolicy::Clock, Some(wb)),
        )
        .unwrap();
    space.fill_zero().unwrap();
    let stream = Stream::new(strata.gpu()).unwrap();
    for round in 0..3 {
        let t0 = Instant::now();
        f.launch_on(
            Grid {
                blocks: 64,
                threads: 256,
            },
            &Args::new()
                .arg(space.handle())
                .arg(1u64)
                .arg(512u64)
                .arg(1u64)
                .arg(64u64),
            Some(&stream),
        )
        .unwrap();
        stream.synchronize().unwrap();
        strata.gpu().synchronize_context().unwrap();
        let took = t0.elapsed();
        eprintln!("round {round}: kernel and write-back ended after {took:?}");
        assert!(
            took < Duration::from_secs(4),
            "the write-back warps outlived their kernel by {took:?} (idle time 8 s)"
        );
    }
    space.check_errors().unwrap();
    assert!(space.stats().unwrap().faults > 0);
}

/// Several spaces at once, each with its own write-back warps, one kernel touching two of them:
/// both spaces' warps run and stop, and the data matches.
#[test]
fn two_spaces_in_one_kernel_each_get_their_warps() {
    let Some(strata) = strata_or_skip() else {
        return;
    };
    let src = r#"
#include "strata.cuh"
extern "C" __global__ void copy_twice(StrataSpace a, StrataSpace b, unsigned long long passes) {
    strata::Array<unsigned long long> x(a), y(b);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long p = 0; p < passes; ++p)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < x.size();
             i += threads)
            y.write(i, y.read(i) + x.read(i) * 2);
}
"#;
    let module = compile(&strata, src);
    let f = module.function("copy_twice").unwrap();
    let cache = 8u64 << 20;
    let bytes = 4 * cache;
    let n = (bytes / 8) as usize;
    let s = seed();
    let xs = random_words(n, s);
    let ys = random_words(n, s ^ 0xABCD);
    let o = options(
        4 << 10,
        cache,
        EvictionPolicy::Clock,
        Some(BackgroundWriteBack::default()),
    );
    let mut a = strata.space(bytes, &o).unwrap();
    let mut b = strata.space(bytes, &o).unwrap();
    a.fill_from_slice(0, &xs).unwrap();
    b.fill_from_slice(0, &ys).unwrap();
    f.launch(
        f.full_grid(256).unwrap(),
        &Args::new().arg(a.handle()).arg(b.handle()).arg(3u64),
    )
    .unwrap();
    a.check_errors().unwrap();
    b.check_errors().unwrap();
    let mut got = vec![0u64; n];
    b.read_back(0, &mut got).unwrap();
    for i in 0..n {
        let want = ys[i].wrapping_add(xs[i].wrapping_mul(6));
        assert_eq!(got[i], want, "word {i}");
    }
    let st = b.stats().unwrap();
    eprintln!("space b: {st:?}");
    assert!(st.background_writebacks > 0, "{st:?}");
}

fn compile(strata: &Strata, src: &str) -> strata_gpu::KernelModule {
    strata.compile(src, "write_back_two.cu").unwrap()
}
