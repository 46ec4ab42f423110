//! Helpers shared by the GPU test binaries: skipping without a driver, seeds, random data.
#![allow(dead_code)] // each test binary uses its own subset
#![allow(clippy::cast_possible_truncation)] // test code on 64-bit targets only

use strata_gpu::driver::{Args, DeviceBuffer, Function, Grid};
use strata_gpu::{ElementType, EvictionPolicy, GpuStats, Space, SpaceOptions, Strata};

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
/// `STRATA_GPU_WRITE_BACK` says and remote access as `STRATA_GPU_REMOTE_ACCESS` says: on unless
/// they say off, so the suite runs both ways; sub-page fetch as `STRATA_GPU_SECTOR` says, off
/// unless it names a size).
pub fn opts(page: u64, cache: u64, policy: EvictionPolicy) -> SpaceOptions {
    SpaceOptions {
        page_size: page,
        cache_bytes: cache,
        element: ElementType::U64,
        policy,
        read_through: false,
        host_cache_bytes: None,
        background_write_back: strata_gpu::space::default_write_back(),
        peers: Vec::new(),
        remote_access: SpaceOptions::default().remote_access,
        sector_bytes: strata_gpu::space::sector_from_env().unwrap().flatten(),
    }
}

/// The host replay of `rmw_owned` (gpu_kernels.cu): `ops` updates x -> 3x + i per thread of a
/// grid of `threads`, at the indices the kernel picks from `seed`.
pub fn replay_rmw_owned(reference: &mut [u64], threads: u64, ops: u64, seed: u64) {
    let per = reference.len() as u64 / threads;
    for t in 0..threads {
        for k in 0..ops {
            let i =
                (t + threads * (mix(seed ^ t.wrapping_mul(0x9E3779B97F4A7C15) ^ k) % per)) as usize;
            reference[i] = reference[i].wrapping_mul(3).wrapping_add(i as u64);
        }
    }
}

/// What `read_random` (gpu_kernels.cu) must leave in `sums[t]` for thread `t`.
pub fn read_random_sum(reference: &[u64], t: u64, ops: u64, seed: u64) -> u64 {
    (0..ops).fold(0u64, |acc, k| {
        acc.wrapping_add(reference[(mix(seed ^ (t << 20) ^ k) % reference.len() as u64) as usize])
    })
}

/// Runs `read_random` (gpu_kernels.cu) over `space` with `ops` reads per thread and checks
/// every thread's sum against `reference` (the space's expected contents).
pub fn check_read_random(
    read: &strata_gpu::driver::Function,
    space: &strata_gpu::Space,
    grid: strata_gpu::driver::Grid,
    reference: &[u64],
    ops: u64,
    seed: u64,
    what: &str,
) {
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    let sums = strata_gpu::driver::DeviceBuffer::zeroed(space.gpu(), threads as usize * 8).unwrap();
    read.launch(
        grid,
        &strata_gpu::driver::Args::new()
            .arg(space.handle())
            .arg(ops)
            .arg(seed)
            .arg(sums.ptr()),
    )
    .unwrap();
    space.check_errors().unwrap();
    let mut got = vec![0u64; threads as usize];
    sums.download(0, &mut got).unwrap();
    for t in 0..threads {
        assert_eq!(
            got[t as usize],
            read_random_sum(reference, t, ops, seed),
            "{what}: thread {t} read wrong sums"
        );
    }
}

/// What `mixed_lanes` (remote_kernels.cu) leaves in a space that held `start`.
pub fn replay(start: &[u64], threads: u64, ops: u64, seed: u64) -> Vec<u64> {
    replay_lanes(start, threads, ops, seed, |_| true)
}

/// One round of `mixed_lanes` (remote_kernels.cu), as the element-access suites run it:
/// fills `space` with `start`, launches `f` (`ops` operations per lane, seeded from `s`) and
/// checks that the kernel reported no error, that no read of a never-written element was
/// wrong (counted in `bad`) and that the space ends exactly as the host replay. `what` names
/// the case in failures; the statistics come back for the caller's own checks.
#[allow(clippy::too_many_arguments)] // one round's parameters, each named at the call
pub fn check_mixed_lanes(
    f: &Function,
    grid: Grid,
    space: &mut Space,
    start: &[u64],
    ops: u64,
    s: u64,
    bad: &DeviceBuffer,
    what: &str,
) -> GpuStats {
    space.fill_from_slice(0, start).unwrap();
    bad.upload(0, &[0u64]).unwrap();
    f.launch(
        grid,
        &Args::new()
            .arg(space.handle())
            .arg(ops)
            .arg(s ^ 0x5151)
            .arg(s.rotate_left(17))
            .arg(bad.ptr()),
    )
    .unwrap();
    space.check_errors().unwrap();
    let st = space.stats().unwrap();
    eprintln!(
        "{what}: faults {} sector fills {} bytes in {} out {} remote r/w {}/{} hits {} p50 {} ns p99 {} ns",
        st.faults,
        st.sector_fills,
        st.bytes_in,
        st.bytes_out,
        st.remote_reads,
        st.remote_writes,
        st.hits,
        st.fault_hist.p50_ns(),
        st.fault_hist.p99_ns()
    );
    let mut wrong = [0u64];
    bad.download(0, &mut wrong).unwrap();
    assert_eq!(
        wrong[0], 0,
        "{what}: reads of never-written elements were wrong"
    );
    let mut back = vec![0u64; start.len()];
    space.read_back(0, &mut back).unwrap();
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    let want = replay(start, threads, ops, s ^ 0x5151);
    let diff = back.iter().zip(&want).filter(|(a, b)| a != b).count();
    let first = back.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        diff, 0,
        "{what}: {diff} elements differ from the replay, first at {first:?}"
    );
    st
}

/// `replay` of the threads `works_here` picks (those of one space in
/// `mixed_lanes_two_spaces`).
pub fn replay_lanes(
    start: &[u64],
    threads: u64,
    ops: u64,
    seed: u64,
    works_here: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let mut out = start.to_vec();
    let per = out.len() as u64 / threads;
    for t in 0..threads {
        if t & 3 == 3 || !works_here(t) {
            continue;
        }
        for k in 0..ops {
            let r = mix(seed ^ t.wrapping_mul(0x9E3779B97F4A7C15) ^ k);
            let i = (t + threads * (r % per)) as usize;
            out[i] = if t & 3 == 2 {
                out[i].wrapping_add(i as u64 | 1)
            } else {
                out[i].wrapping_mul(3).wrapping_add(i as u64)
            };
        }
    }
    out
}

/// Runs `mixed_lanes_two_spaces` (`f`, remote_kernels.cu: thread t works in space (t >> 2) & 1)
/// over `spaces`, filled with `starts` from `random_words(_, s)` and `(_, s ^ 1)`, 16 ops per
/// thread, and checks each space against a host replay of its own lanes and that no read of a
/// never-written element was wrong. `what` names the case in messages.
pub fn check_two_spaces(
    f: &strata_gpu::driver::Function,
    grid: strata_gpu::driver::Grid,
    spaces: &[strata_gpu::Space],
    starts: &[Vec<u64>],
    s: u64,
    bad: &strata_gpu::driver::DeviceBuffer,
    what: &str,
) {
    let threads = u64::from(grid.blocks) * u64::from(grid.threads);
    bad.upload(0, &[0u64]).unwrap();
    let ops = 16u64;
    f.launch(
        grid,
        &strata_gpu::driver::Args::new()
            .arg(spaces[0].handle())
            .arg(spaces[1].handle())
            .arg(ops)
            .arg(s ^ 0x77)
            .arg(s.rotate_left(17))
            .arg((s ^ 1).rotate_left(17))
            .arg(bad.ptr()),
    )
    .unwrap();
    for (k, space) in spaces.iter().enumerate() {
        space.check_errors().unwrap();
        let st = space.stats().unwrap();
        eprintln!(
            "{what}: space {k}: faults {} remote reads {} writes {} sector fills {} bytes in {} hits {}",
            st.faults, st.remote_reads, st.remote_writes, st.sector_fills, st.bytes_in, st.hits
        );
        let mut back = vec![0u64; starts[k].len()];
        space.read_back(0, &mut back).unwrap();
        let want = replay_lanes(&starts[k], threads, ops, s ^ 0x77, |t| {
            (t >> 2) & 1 == k as u64
        });
        let diff = back.iter().zip(&want).filter(|(x, y)| x != y).count();
        let first = back.iter().zip(&want).position(|(x, y)| x != y);
        assert_eq!(
            diff, 0,
            "{what}: space {k}: {diff} elements differ from the replay, first at {first:?}"
        );
    }
    let mut wrong = [0u64];
    bad.download(0, &mut wrong).unwrap();
    assert_eq!(
        wrong[0], 0,
        "{what}: reads of never-written elements were wrong"
    );
}

/// The wrapping sum of the words of each page of `page` bytes.
pub fn page_sums(words: &[u64], page: u64) -> Vec<u64> {
    words
        .chunks((page / 8) as usize)
        .map(|c| c.iter().fold(0u64, |a, w| a.wrapping_add(*w)))
        .collect()
}
