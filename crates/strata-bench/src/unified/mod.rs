//! `strata bench unified`: unified allocations (crate strata-unified) against CUDA managed
//! memory with the same hints on data that fits the GPU (never oversubscribed: managed memory
//! beyond GPU memory can hang a shared GPU), and, oversubscribed, against zero-copy and
//! explicit double-buffered copies.
//!
//! Cases (each round timed on the wall clock, CPU phases and syncs included; round 0 is a
//! warm-up; the median is reported):
//! * `handoff-full`: the CPU produces the whole input, a kernel consumes it into an output a
//!   sixteenth its size, the CPU reads the output.
//! * `handoff-partial`: the same, but the CPU rewrites one word in 1/32 of the input's pages
//!   per round (only those pages should move).
//! * `table`: a read-mostly table; per round a kernel does random lookups and the CPU reads a
//!   few entries (Strata reads its GPU replica of the table; the CPU writes none).
//! * `sweep`: eight in-place kernel sweeps over data that stays on the GPU, then the CPU reads.
//! * `layers-Nx`: weights N times the GPU cache swept in order (GMEM's training case), timed
//!   per sweep on the GPU: Strata paging vs zero-copy vs 64 MiB double-buffered copies.
//!
//! Outputs of every contestant are checksummed and must agree, so a contestant that skips work
//! fails the run rather than winning it.

mod sys;

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use strata_gpu::driver::{
    Args, DeviceBuffer, Function, Gpu, Grid, KernelParam, ManagedBuffer, MappedHostBuffer,
};
use strata_gpu::{KernelModule, Strata};
use strata_unified::{Advice, DirtyTracking, Location, Unified, UnifiedOptions};

use crate::gpu_micro::{ChunkedBaseline, Kernels, chunked_copies, random_fill, time_ms};
use sys::Side;

/// The benchmark's kernels (`cuda/unified_kernels.cu`).
pub const UNIFIED_KERNELS_CU: &str = include_str!("../../cuda/unified_kernels.cu");

/// What to run.
#[derive(Debug, Clone)]
pub struct UnifiedBenchOptions {
    /// Bytes of the fitting cases' data.
    pub size: u64,
    /// Timed rounds after one warm-up.
    pub rounds: usize,
    /// Unified allocations' page size.
    pub page_size: u64,
    /// GPU cache of the oversubscribed cases.
    pub cache: u64,
    /// Oversubscription ratios of the layer sweep.
    pub ratios: Vec<u64>,
    /// Only cases whose names start with these (empty: all).
    pub cases: Vec<String>,
    /// Seed of the produced data.
    pub seed: u64,
    /// Strata's allocations read missed pages in place ([`UnifiedOptions::reads_in_place`]).
    pub reads_in_place: bool,
}

/// One contestant's result in one case.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The case.
    pub case: String,
    /// `strata` (write-protect tracking), `strata-hash`, `strata+hints`, `strata-declared`,
    /// `strata-declared+hints` (hand-offs),
    /// `managed+hints`, `managed`, `zero-copy`, `explicit copies`.
    pub contestant: String,
    /// Bytes of the case's data.
    pub bytes: u64,
    /// Median ms per round.
    pub median_ms: f64,
    /// Every timed round, ms.
    pub all_ms: Vec<f64>,
    /// The output checksum (equal across contestants of a case).
    pub checksum: u64,
    /// How the contestant ran.
    pub note: String,
}

struct K {
    _module: KernelModule,
    u_consume: Function,
    r_consume: Function,
    u_gather: Function,
    r_gather: Function,
    u_sweep: Function,
    r_sweep: Function,
}

/// How an allocation found CPU writes, for the notes (write protection may have fallen back).
fn tracking_name(u: &Unified) -> String {
    match u.dirty_tracking() {
        (DirtyTracking::WriteProtect, hot) => format!("write-protect ({hot} pages hot now)"),
        (DirtyTracking::Hash, _) => "hash".into(),
        (DirtyTracking::Declared, _) => "declared".into(),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

fn words(b: &[u8]) -> &[u64] {
    bytemuck::cast_slice(b)
}

/// Sum of the words, in parallel.
fn sum_words(b: &[u8]) -> u64 {
    let w = words(b);
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    let chunk = w.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = w
            .chunks(chunk)
            .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0u64, u64::wrapping_add)
    })
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// The words the partial produce phase of round `round` changes: one word (index, amount
/// added) in 1/32 of the pages of `page` bytes, `pages` pages in all.
fn partial_writes(pages: usize, page: usize, round: u64, seed: u64) -> Vec<(usize, u64)> {
    (0..(pages / 32).max(1) as u64)
        .map(|k| {
            let p = usize::try_from(mix(k ^ (round << 32) ^ seed) % pages as u64).unwrap_or(0);
            let at = p * page / 8 + usize::try_from(mix(k ^ seed) % (page as u64 / 8)).unwrap_or(0);
            (at, mix(round ^ k))
        })
        .collect()
}

/// The CPU's produce phase of round `round`: everything, or one word in 1/32 of the pages.
fn produce(input: &mut [u8], page: usize, round: u64, seed: u64, partial: bool) {
    if !partial {
        random_fill(input, seed ^ round.wrapping_mul(0x9E37_79B9));
        return;
    }
    let writes = partial_writes(input.len() / page, page, round, seed);
    let w: &mut [u64] = bytemuck::cast_slice_mut(input);
    for (at, add) in writes {
        w[at] = w[at].wrapping_add(add);
    }
}

/// [`produce`] through a unified allocation with declared writes: the partial phase names
/// each word it writes (`cpu_mut`), the full phase takes the whole slice (all declared).
fn produce_declared(
    u: &mut Unified,
    in_bytes: usize,
    page: usize,
    round: u64,
    seed: u64,
    partial: bool,
) -> anyhow::Result<()> {
    if !partial {
        produce(&mut u.as_mut_slice()[..in_bytes], page, round, seed, false);
        return Ok(());
    }
    for (at, add) in partial_writes(in_bytes / page, page, round, seed) {
        let b = u.cpu_mut(at as u64 * 8..at as u64 * 8 + 8)?;
        let v = u64::from_ne_bytes(b.try_into()?).wrapping_add(add);
        b.copy_from_slice(&v.to_ne_bytes());
    }
    Ok(())
}

/// Runs `round` for rounds 0..=rounds on the wall clock; round 0 is a warm-up. Returns the
/// timed rounds' ms and the sum of their checksums.
fn timed_rounds(
    rounds: usize,
    mut round: impl FnMut(u64) -> anyhow::Result<u64>,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let (mut times, mut check) = (Vec::new(), 0u64);
    for r in 0..=rounds as u64 {
        let t = Instant::now();
        let s = round(r)?;
        if r > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            check = check.wrapping_add(s);
        }
    }
    Ok((times, check))
}

/// The table kernels' arguments after the data (a unified handle or a plain pointer): the
/// elements, the lookups, the round's seed and the sink.
fn table_args(
    data: impl KernelParam,
    n: u64,
    lookups: u64,
    seed: u64,
    sink: &DeviceBuffer,
) -> Args {
    Args::new()
        .arg(data)
        .arg(n)
        .arg(lookups)
        .arg(seed)
        .arg(sink.ptr())
}

/// Where a round's time goes: named parts, summed over the timed rounds.
struct RoundParts {
    names: &'static [&'static str],
    ms: Vec<f64>,
    rounds: u32,
}

impl RoundParts {
    fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            ms: vec![0.0; names.len()],
            rounds: 0,
        }
    }

    /// Adds the time between each pair of consecutive `marks` (one more than the parts) in a
    /// timed round (`round` > 0: the warm-up's parts, such as building a replica, would skew
    /// the means).
    fn add(&mut self, round: u64, marks: &[Instant]) {
        if round == 0 {
            return;
        }
        self.rounds += 1;
        for (p, w) in self.ms.iter_mut().zip(marks.windows(2)) {
            *p += (w[1] - w[0]).as_secs_f64() * 1e3;
        }
    }

    /// "per round 1.2 ms produce, 3.4 ms kernel": each part's mean, to `decimals` places.
    fn describe(&self, decimals: usize) -> String {
        let rounds = f64::from(self.rounds.max(1));
        let each: Vec<String> = self
            .names
            .iter()
            .zip(&self.ms)
            .map(|(name, ms)| format!("{:.decimals$} ms {name}", ms / rounds))
            .collect();
        format!("per round {}", each.join(", "))
    }
}

struct Ctx<'a> {
    strata: &'a Strata,
    k: K,
    opts: &'a UnifiedBenchOptions,
    rows: Vec<Row>,
}

impl Ctx<'_> {
    fn gpu(&self) -> &Arc<Gpu> {
        self.strata.gpu()
    }

    fn wants(&self, case: &str) -> bool {
        self.opts.cases.is_empty() || self.opts.cases.iter().any(|c| case.starts_with(c.as_str()))
    }

    fn grid(f: &Function) -> anyhow::Result<Grid> {
        Ok(f.full_grid(256)?)
    }

    fn managed(&self, bytes: u64) -> anyhow::Result<ManagedBuffer> {
        ManagedBuffer::new_if_fits(self.gpu(), usize::try_from(bytes)?, 4 << 30)?.ok_or_else(|| {
            anyhow::anyhow!(
                "{bytes} bytes of managed memory do not fit the GPU with 4 GiB to spare: managed memory is never oversubscribed here; give a smaller --size"
            )
        })
    }

    fn push(
        &mut self,
        case: &str,
        contestant: &str,
        bytes: u64,
        times: Vec<f64>,
        checksum: u64,
        note: &str,
    ) {
        let row = Row {
            case: case.into(),
            contestant: contestant.into(),
            bytes,
            median_ms: median(&times),
            all_ms: times,
            checksum,
            note: note.into(),
        };
        eprintln!(
            "{:<16} {:<16} {:>10.2} ms  (checksum {:#018x}) {}",
            row.case, row.contestant, row.median_ms, row.checksum, row.note
        );
        self.rows.push(row);
    }

    fn unified(&self, bytes: u64, cache: u64, tracking: DirtyTracking) -> anyhow::Result<Unified> {
        Ok(Unified::new(
            self.strata,
            bytes,
            &UnifiedOptions {
                page_size: self.opts.page_size,
                cache_bytes: cache,
                dirty_tracking: tracking,
                reads_in_place: self.opts.reads_in_place,
                ..UnifiedOptions::default()
            },
        )?)
    }

    /// CPU produce / GPU consume / CPU read.
    fn handoff(&mut self, partial: bool) -> anyhow::Result<()> {
        let case = if partial {
            "handoff-partial"
        } else {
            "handoff-full"
        };
        if !self.wants(case) {
            return Ok(());
        }
        let group = 16u64;
        let n_out = self.opts.size / 8 / (group + 1);
        let n_in = n_out * group;
        let total = (n_in + n_out) * 8;
        let in_bytes = usize::try_from(n_in * 8)?;
        let page = usize::try_from(self.opts.page_size)?;
        let (seed, rounds) = (self.opts.seed, self.opts.rounds);
        for (name, hints, tracking) in [
            ("strata", false, DirtyTracking::WriteProtect),
            ("strata-hash", false, DirtyTracking::Hash),
            ("strata+hints", true, DirtyTracking::WriteProtect),
            ("strata-declared", false, DirtyTracking::Declared),
            ("strata-declared+hints", true, DirtyTracking::Declared),
        ] {
            let mut u = self.unified(total, total + self.opts.page_size, tracking)?;
            if hints {
                u.advise(0..n_in * 8, Advice::PreferredLocation(Some(Location::Gpu)))?;
            }
            let f = &self.k.u_consume;
            let grid = Self::grid(f)?;
            // Where a round goes (ms): produce, then the launch helper's steps one by one
            // (sync to the GPU; kernel, wait and check; sync to the CPU: the same work, with
            // one more read of the device counters, a few microseconds), the CPU's reads.
            let mut parts = RoundParts::new(&[
                "produce",
                "sync to GPU",
                "kernel",
                "sync to CPU",
                "CPU reads",
            ]);
            let all = 0..total;
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                if tracking == DirtyTracking::Declared {
                    produce_declared(&mut u, in_bytes, page, r, seed, partial)?;
                } else {
                    produce(&mut u.as_mut_slice()[..in_bytes], page, r, seed, partial);
                }
                let t1 = Instant::now();
                u.sync_to_gpu(all.clone())?;
                let t2 = Instant::now();
                f.launch(
                    grid,
                    &Args::new().arg(u.handle()).arg(n_out).arg(group).arg(n_in),
                )?;
                u.space().gpu().synchronize_context()?;
                u.space().check_errors()?;
                let t3 = Instant::now();
                u.sync_to_cpu(all.clone())?;
                let t4 = Instant::now();
                let sum = sum_words(&u.as_slice()[in_bytes..]);
                parts.add(r, &[t, t1, t2, t3, t4, Instant::now()]);
                Ok(sum)
            })?;
            let st = u.stats().total;
            let note = format!(
                "{} tracking{}; {}; in all {} CPU pages synced, {} GPU copies dropped, {} pages written down, {} MiB hashed",
                tracking_name(&u),
                if hints {
                    ", input advised preferred on the GPU"
                } else {
                    ""
                },
                parts.describe(1),
                st.cpu_written,
                st.gpu_copies_dropped,
                st.written_down,
                st.hashed_bytes >> 20
            );
            self.push(case, name, total, times, check, &note);
        }
        for hints in [true, false] {
            let mut m = self.managed(total)?;
            // Managed memory is not zeroed; the unified allocation is.
            m.as_mut_slice().fill(0);
            let (base, gpu) = (m.ptr(), self.gpu().clone());
            let (f, grid) = (&self.k.r_consume, Self::grid(&self.k.r_consume)?);
            // Where a round goes (ms): produce (with its prefetch), the GPU phase (prefetches,
            // kernel, wait), the CPU's reads.
            let mut parts = RoundParts::new(&["produce", "GPU phase", "CPU reads"]);
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                if hints && !partial {
                    sys::prefetch(&gpu, base, in_bytes, Side::Host)?;
                }
                produce(&mut m.as_mut_slice()[..in_bytes], page, r, seed, partial);
                let t1 = Instant::now();
                if hints {
                    sys::prefetch(&gpu, base, in_bytes, Side::Device)?;
                }
                f.launch(
                    grid,
                    &Args::new()
                        .arg(base)
                        .arg(base + n_in * 8)
                        .arg(n_out)
                        .arg(group),
                )?;
                gpu.synchronize()?;
                if hints {
                    sys::prefetch(
                        &gpu,
                        base + n_in * 8,
                        usize::try_from(n_out * 8)?,
                        Side::Host,
                    )?;
                }
                let t2 = Instant::now();
                let sum = sum_words(&m.as_mut_slice()[in_bytes..]);
                parts.add(r, &[t, t1, t2, Instant::now()]);
                Ok(sum)
            })?;
            let note = format!(
                "{}; {}",
                if hints {
                    "cuMemPrefetchAsync: input to the host before producing (full case), to the GPU before the kernel; output to the host after"
                } else {
                    "faults only"
                },
                parts.describe(1)
            );
            self.push(
                case,
                if hints { "managed+hints" } else { "managed" },
                total,
                times,
                check,
                &note,
            );
        }
        self.handoff_explicit(case, partial)
    }

    /// The hand-off's floor: what a program that manages both copies itself pays. The CPU
    /// produces into pinned memory, copies to device memory what it wrote (the whole input, or
    /// in the partial case only the pages it wrote, which it knows), the kernel runs on device
    /// memory, and the output is copied back. Every system that keeps data coherent across
    /// the bus pays at least the produce phase and these copies.
    fn handoff_explicit(&mut self, case: &str, partial: bool) -> anyhow::Result<()> {
        let group = 16u64;
        let n_out = self.opts.size / 8 / (group + 1);
        let n_in = n_out * group;
        let total = (n_in + n_out) * 8;
        let (in_bytes, all) = (usize::try_from(n_in * 8)?, usize::try_from(total)?);
        let page = usize::try_from(self.opts.page_size)?;
        let (seed, rounds) = (self.opts.seed, self.opts.rounds);
        let mut host = MappedHostBuffer::new(self.gpu(), all)?;
        host.as_mut_slice().fill(0);
        let device = DeviceBuffer::zeroed(self.gpu(), all)?;
        let (f, grid) = (&self.k.r_consume, Self::grid(&self.k.r_consume)?);
        let mut parts =
            RoundParts::new(&["produce", "copy in", "kernel", "copy out and CPU reads"]);
        let (times, check) = timed_rounds(rounds, |r| {
            let t = Instant::now();
            produce(&mut host.as_mut_slice()[..in_bytes], page, r, seed, partial);
            let t1 = Instant::now();
            if partial {
                let mut pages: Vec<usize> = partial_writes(in_bytes / page, page, r, seed)
                    .into_iter()
                    .map(|(at, _)| at * 8 / page)
                    .collect();
                pages.sort_unstable();
                pages.dedup();
                for p in pages {
                    device.upload(p * page, &host.as_slice()[p * page..(p + 1) * page])?;
                }
            } else {
                device.upload(0, &host.as_slice()[..in_bytes])?;
            }
            let t2 = Instant::now();
            f.launch(
                grid,
                &Args::new()
                    .arg(device.ptr())
                    .arg(device.ptr() + n_in * 8)
                    .arg(n_out)
                    .arg(group),
            )?;
            self.gpu().synchronize()?;
            let t3 = Instant::now();
            device.download(in_bytes, &mut host.as_mut_slice()[in_bytes..])?;
            let sum = sum_words(&host.as_slice()[in_bytes..]);
            parts.add(r, &[t, t1, t2, t3, Instant::now()]);
            Ok(sum)
        })?;
        let note = format!(
            "pinned host memory and device memory, copied by the program ({}); {}",
            if partial {
                "only the pages written"
            } else {
                "the whole input"
            },
            parts.describe(1)
        );
        self.push(case, "explicit copies", total, times, check, &note);
        Ok(())
    }

    /// A read-mostly table: GPU lookups and a few CPU reads per round.
    fn table(&mut self) -> anyhow::Result<()> {
        if !self.wants("table") {
            return Ok(());
        }
        let bytes = self.opts.size;
        let n = bytes / 8;
        let lookups: u64 = 1 << 24;
        let (seed, rounds) = (self.opts.seed, self.opts.rounds);
        let sink = DeviceBuffer::zeroed(self.gpu(), 8)?;
        let cpu_reads = |b: &[u8], r: u64| {
            let w = words(b);
            (0..4096u64).fold(0u64, |a, i| {
                a.wrapping_add(w[usize::try_from(mix(i ^ r) % n).unwrap_or(0)])
            })
        };
        let read_sink = |sink: &DeviceBuffer| -> anyhow::Result<u64> {
            let mut s = [0u64];
            sink.download(0, &mut s)?;
            sink.upload(0, &[0u64])?;
            Ok(s[0])
        };
        {
            let mut u = self.unified(
                bytes,
                bytes + self.opts.page_size,
                DirtyTracking::WriteProtect,
            )?;
            random_fill(u.as_mut_slice(), seed);
            u.advise(0..bytes, Advice::ReadMostly(true))?;
            u.prefetch(0..bytes, Location::Gpu)?;
            let (f, grid) = (self.k.u_gather.clone(), Self::grid(&self.k.u_gather)?);
            let f = &f;
            // The launch helper (what a user calls: it reads the device counters once for the
            // error check and the sync), then the CPU's reads (ms).
            let mut helper_parts = RoundParts::new(&[
                "launch helper (sync to GPU, kernel, wait, check, sync to CPU)",
                "sink and CPU reads",
            ]);
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                u.launch(f, grid, |h| table_args(h, n, lookups, seed ^ r, &sink))?;
                let t1 = Instant::now();
                let out = read_sink(&sink)?.wrapping_add(cpu_reads(u.as_slice(), r));
                helper_parts.add(r, &[t, t1, Instant::now()]);
                Ok(out)
            })?;
            self.push(
                "table",
                "strata",
                bytes,
                times,
                check,
                &format!(
                    "read-mostly (GPU replica of pages {:?}, kernel reads through strata::ReadMostly), prefetched, {} tracking (the CPU only reads), the launch helper; {}",
                    u.replica(),
                    tracking_name(&u),
                    helper_parts.describe(3)
                ),
            );
            // The same round in an expert's steps, each timed: sync to the GPU, kernel (with
            // the wait and the error check), sync to the CPU, then the CPU's reads.
            let mut parts =
                RoundParts::new(&["sync to GPU", "kernel", "sync to CPU", "sink and CPU reads"]);
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                u.sync_to_gpu(0..bytes)?;
                let t1 = Instant::now();
                f.launch(grid, &table_args(u.handle(), n, lookups, seed ^ r, &sink))?;
                u.space().gpu().synchronize_context()?;
                u.space().check_errors()?;
                let t2 = Instant::now();
                u.sync_to_cpu(0..bytes)?;
                let t3 = Instant::now();
                let out = read_sink(&sink)?.wrapping_add(cpu_reads(u.as_slice(), r));
                parts.add(r, &[t, t1, t2, t3, Instant::now()]);
                Ok(out)
            })?;
            self.push(
                "table",
                "strata-steps",
                bytes,
                times,
                check,
                &format!(
                    "the strata row's round as an expert writes it (sync_to_gpu, launch, check_errors, sync_to_cpu: two reads of the device counters after the kernel); read-mostly (GPU replica of pages {:?}), {} tracking; {}",
                    u.replica(),
                    tracking_name(&u),
                    parts.describe(3)
                ),
            );
        }
        for hints in [true, false] {
            let mut m = self.managed(bytes)?;
            random_fill(m.as_mut_slice(), seed);
            let (base, gpu) = (m.ptr(), self.gpu().clone());
            let len = usize::try_from(bytes)?;
            if hints {
                sys::advise(
                    &gpu,
                    base,
                    len,
                    cudarc::driver::sys::CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY,
                    Side::Device,
                )?;
                sys::prefetch(&gpu, base, len, Side::Device)?;
            }
            let (f, grid) = (&self.k.r_gather, Self::grid(&self.k.r_gather)?);
            // The same parts as Strata's round: kernel (with the wait), then the sink and the
            // CPU's reads.
            let mut parts = RoundParts::new(&["kernel", "sink and CPU reads"]);
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                f.launch(grid, &table_args(base, n, lookups, seed ^ r, &sink))?;
                gpu.synchronize()?;
                let t1 = Instant::now();
                let out = read_sink(&sink)?.wrapping_add(cpu_reads(m.as_mut_slice(), r));
                parts.add(r, &[t, t1, Instant::now()]);
                Ok(out)
            })?;
            let note = format!(
                "{}; {}",
                if hints {
                    "cuMemAdvise read-mostly, prefetched to the GPU"
                } else {
                    "faults only"
                },
                parts.describe(3)
            );
            self.push(
                "table",
                if hints { "managed+hints" } else { "managed" },
                bytes,
                times,
                check,
                &note,
            );
        }
        Ok(())
    }

    /// Eight in-place sweeps on the GPU, then the CPU reads everything.
    fn sweep(&mut self) -> anyhow::Result<()> {
        if !self.wants("sweep") {
            return Ok(());
        }
        const STEPS: usize = 8;
        let bytes = self.opts.size;
        let n = bytes / 8;
        let (seed, rounds) = (self.opts.seed, self.opts.rounds);
        for (name, tracking) in [
            ("strata", DirtyTracking::WriteProtect),
            ("strata-hash", DirtyTracking::Hash),
            ("strata-declared", DirtyTracking::Declared),
        ] {
            let mut u = self.unified(bytes, bytes + self.opts.page_size, tracking)?;
            random_fill(u.as_mut_slice(), seed);
            let (f, grid) = (&self.k.u_sweep, Self::grid(&self.k.u_sweep)?);
            let mut parts = RoundParts::new(&["sync to GPU", "kernels", "sync to CPU"]);
            let (times, check) = timed_rounds(rounds, |r| {
                let t = Instant::now();
                u.sync_to_gpu(0..bytes)?;
                let t1 = Instant::now();
                for _ in 0..STEPS {
                    let h = u.handle();
                    f.launch(grid, &Args::new().arg(h).arg(n))?;
                }
                u.space().check_errors()?;
                let t2 = Instant::now();
                u.sync_to_cpu(0..bytes)?;
                parts.add(r, &[t, t1, t2, Instant::now()]);
                Ok(sum_words(u.as_slice()))
            })?;
            let note = format!(
                "one GPU phase of 8 kernels per round ({} tracking); {}",
                tracking_name(&u),
                parts.describe(1)
            );
            self.push("sweep", name, bytes, times, check, &note);
        }
        for hints in [true, false] {
            let mut m = self.managed(bytes)?;
            random_fill(m.as_mut_slice(), seed);
            let (base, gpu) = (m.ptr(), self.gpu().clone());
            let len = usize::try_from(bytes)?;
            let (f, grid) = (&self.k.r_sweep, Self::grid(&self.k.r_sweep)?);
            let (times, check) = timed_rounds(rounds, |_| {
                if hints {
                    sys::prefetch(&gpu, base, len, Side::Device)?;
                }
                for _ in 0..STEPS {
                    f.launch(grid, &Args::new().arg(base).arg(n))?;
                }
                gpu.synchronize()?;
                if hints {
                    sys::prefetch(&gpu, base, len, Side::Host)?;
                }
                Ok(sum_words(m.as_mut_slice()))
            })?;
            let note = if hints {
                "prefetched to the GPU before, to the host after"
            } else {
                "faults only"
            };
            self.push(
                "sweep",
                if hints { "managed+hints" } else { "managed" },
                bytes,
                times,
                check,
                note,
            );
        }
        Ok(())
    }

    /// Weights `ratio` times the GPU cache swept in order.
    fn layers(&mut self, bk: &Kernels, ratio: u64) -> anyhow::Result<()> {
        let case = format!("layers-{ratio}x");
        if !self.wants(&case) {
            return Ok(());
        }
        let bytes = self.opts.cache * ratio;
        let mut u = self.unified(bytes, self.opts.cache, DirtyTracking::Hash)?;
        random_fill(u.as_mut_slice(), self.opts.seed);
        // The stream kernels add the data as 32-bit words.
        let want = bytemuck::cast_slice::<u8, u32>(u.as_slice())
            .iter()
            .fold(0u64, |a, &x| a.wrapping_add(u64::from(x)));
        u.sync_to_gpu(0..bytes)?;
        let gpu = self.gpu().clone();
        let sink = DeviceBuffer::zeroed(&gpu, 8)?;
        let reps = self.opts.rounds;
        let check = |sink: &DeviceBuffer, runs: u64| -> anyhow::Result<u64> {
            let mut s = [0u64];
            sink.download(0, &mut s)?;
            sink.upload(0, &[0u64])?;
            if s[0] != want.wrapping_mul(runs) {
                anyhow::bail!(
                    "{case}: a sweep summed {:#x}, the CPU says {:#x} per sweep",
                    s[0],
                    want
                );
            }
            Ok(want)
        };
        let grid = bk.s_stream.full_grid(256)?;
        let space = u.space();
        let ms = time_ms(
            &gpu,
            reps,
            || Ok(()),
            || {
                bk.s_stream
                    .launch(grid, &Args::new().arg(space.handle()).arg(sink.ptr()))?;
                Ok(())
            },
        )?;
        let runs = reps as u64 + 1;
        let c = check(&sink, runs)?;
        let stats = space.stats()?;
        self.push(
            &case,
            "strata",
            bytes,
            vec![ms],
            c,
            &format!(
                "GPU paging, cache {} MiB; {} faults in all",
                self.opts.cache >> 20,
                stats.faults
            ),
        );
        let host = space.handle().host;
        let page = self.opts.page_size;
        let rgrid = bk.r_stream.full_grid(256)?;
        let ms = time_ms(
            &gpu,
            reps,
            || Ok(()),
            || {
                bk.r_stream.launch(
                    rgrid,
                    &Args::new().arg(host).arg(bytes).arg(page).arg(sink.ptr()),
                )?;
                Ok(())
            },
        )?;
        let c = check(&sink, runs)?;
        self.push(
            &case,
            "zero-copy",
            bytes,
            vec![ms],
            c,
            "kernel reads the pinned host copy over PCIe",
        );
        let base = ChunkedBaseline {
            gpu: &gpu,
            k: bk,
            grid: rgrid,
            sink: sink.ptr(),
            reps,
        };
        let ms = chunked_copies(&base, u.as_ptr(), usize::try_from(bytes)?, false)?;
        let c = check(&sink, runs)?;
        self.push(
            &case,
            "explicit copies",
            bytes,
            vec![ms],
            c,
            "64 MiB chunks, two device buffers, copy and kernel overlapped",
        );
        u.sync_to_cpu(0..bytes)?;
        Ok(())
    }
}

/// Runs the cases; every contestant's checksums must agree within a case.
pub fn run_unified(opts: &UnifiedBenchOptions) -> anyhow::Result<Vec<Row>> {
    if opts.rounds == 0 || opts.size < (1 << 20) || opts.ratios.contains(&0) {
        anyhow::bail!("--rounds must be at least 1, --size at least 1MiB, --ratios positive");
    }
    let strata = Strata::new(0)?;
    let module = strata_unified::compile(&strata, UNIFIED_KERNELS_CU, "unified_kernels.cu")?;
    let f = |n: &str| module.function(n);
    let k = K {
        u_consume: f("u_consume")?,
        r_consume: f("r_consume")?,
        u_gather: f("u_gather")?,
        r_gather: f("r_gather")?,
        u_sweep: f("u_sweep")?,
        r_sweep: f("r_sweep")?,
        _module: module,
    };
    let mut ctx = Ctx {
        strata: &strata,
        k,
        opts,
        rows: Vec::new(),
    };
    ctx.handoff(false)?;
    ctx.handoff(true)?;
    ctx.table()?;
    ctx.sweep()?;
    let bk = Kernels::load(&strata)?;
    for &r in &opts.ratios {
        ctx.layers(&bk, r)?;
    }
    let rows = ctx.rows;
    for r in &rows {
        if let Some(o) = rows
            .iter()
            .find(|o| o.case == r.case && o.checksum != r.checksum)
        {
            anyhow::bail!(
                "{}: {} and {} disagree on the output ({:#x} vs {:#x}): one of them is wrong",
                r.case,
                r.contestant,
                o.contestant,
                r.checksum,
                o.checksum
            );
        }
    }
    Ok(rows)
}

/// Strata's speed-up over each baseline, per case and Strata variant.
pub fn chart(rows: &[Row], record: &crate::record::Record) -> crate::plot::Chart {
    let baselines = ["managed+hints", "managed", "zero-copy", "explicit copies"];
    let mut groups = Vec::new();
    let mut cases: Vec<&str> = rows.iter().map(|r| r.case.as_str()).collect();
    cases.dedup();
    for case in cases {
        for variant in [
            "strata",
            "strata-hash",
            "strata+hints",
            "strata-declared",
            "strata-declared+hints",
        ] {
            let Some(s) = rows
                .iter()
                .find(|r| r.case == case && r.contestant == variant)
            else {
                continue;
            };
            let speedups = baselines
                .iter()
                .map(|b| {
                    rows.iter()
                        .find(|r| r.case == case && r.contestant == *b)
                        .map(|r| r.median_ms / s.median_ms)
                })
                .collect();
            groups.push(crate::plot::Group {
                label: format!("{case}\n{variant} {:.1} ms", s.median_ms),
                speedups,
                ceiling: None,
            });
        }
    }
    crate::plot::Chart {
        title: "Unified allocations: Strata's speed-up (baseline time / Strata time)".into(),
        subtitle: record.subtitle(),
        baselines: baselines.iter().map(|b| (*b).to_string()).collect(),
        groups,
        no_ceilings: Some("times include CPU phases and syncs; no machine ceiling applies".into()),
        mark_missing: false,
    }
}

/// The figures `strata bench compare` compares: each row's median time.
pub fn figures(rows: &[Row]) -> Vec<crate::record::Figure> {
    rows.iter()
        .map(|r| crate::record::Figure {
            name: format!("unified/{}/{} ms", r.case, r.contestant),
            value: r.median_ms,
            unit: "ms".into(),
            higher_is_better: false,
            spread: (r.all_ms.len() > 1).then(|| {
                let lo = r.all_ms.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = r.all_ms.iter().copied().fold(0.0, f64::max);
                (hi - lo) / r.median_ms
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_parts_average_the_timed_rounds_only() {
        use std::time::Duration;
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let mut parts = RoundParts::new(&["a", "b"]);
        parts.add(0, &[t, ms(500), ms(900)]); // the warm-up: not counted
        parts.add(1, &[t, ms(2), ms(6)]);
        parts.add(2, &[t, ms(4), ms(6)]);
        assert_eq!(parts.describe(1), "per round 3.0 ms a, 3.0 ms b");
        assert_eq!(RoundParts::new(&["x"]).describe(2), "per round 0.00 ms x");
    }

    #[test]
    fn kernels_compile_for_sm90() {
        if !strata_gpu::nvrtc::available() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but NVRTC could not be loaded"
            );
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let src = strata_unified::with_header(UNIFIED_KERNELS_CU);
        let cubin = strata_gpu::nvrtc::compile(&src, "unified_kernels.cu", "sm_90", &[]).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
    }

    #[test]
    fn partial_produce_touches_a_32nd_of_the_pages() {
        let page = 4096;
        let mut a = vec![0u8; page * 256];
        produce(&mut a, page, 1, 7, true);
        let touched = a.chunks(page).filter(|p| p.iter().any(|&b| b != 0)).count();
        assert!((1..=8).contains(&touched), "{touched} pages");
        let mut b = vec![0u8; page * 256];
        produce(&mut b, page, 1, 7, true);
        assert_eq!(
            a, b,
            "the same round produces the same bytes for every contestant"
        );
    }

    #[test]
    fn chart_and_figures_follow_the_rows() {
        let row = |case: &str, who: &str, ms: f64| Row {
            case: case.into(),
            contestant: who.into(),
            bytes: 1,
            median_ms: ms,
            all_ms: vec![ms, ms * 1.1],
            checksum: 0,
            note: String::new(),
        };
        let rows = vec![row("sweep", "strata", 10.0), row("sweep", "managed", 30.0)];
        let f = figures(&rows);
        assert_eq!(f[0].name, "unified/sweep/strata ms");
        let rec = crate::record::Record::new(
            "unified",
            None,
            crate::record::CeilingsUsed {
                source: "x".into(),
                values: None,
            },
            serde_json::json!({}),
        );
        let c = chart(&rows, &rec);
        assert_eq!(c.groups.len(), 1);
        assert_eq!(c.groups[0].speedups[1], Some(3.0));
        assert_eq!(c.groups[0].speedups[0], None);
    }
}
