//! `strata bench gpu-store`: GPU spaces over a store (memory, file, memory node; optionally
//! LZ4) against the baseline each of issue 11's targets names, measured in the same run:
//!
//! - `stream-store`: streaming a space 8x the GPU cache, whose host cache is smaller than the
//!   space (so pages come from the store), against the store's own `read_batch` rate (same
//!   page size; `--raw-threads` threads issuing batches of `--raw-depth` pages). Goal 0.8x.
//!   Every page is then checked on the GPU against the pattern written into the store.
//! - `stream-host-cache`: the same stream with the host cache holding the whole space, against
//!   a space over a pinned host copy (`Strata::space`). Goal 45 GB/s.
//! - `cold-4k`: every 4 KiB page once in random order from an empty GPU cache, served from a
//!   warm host cache, against the pinned host copy space. Goal 10 M pages/s.
//! - `stream-rmw`: streaming read-modify-write of a space 4x the GPU cache (over a pinned host
//!   copy, and over a memory store whose host cache holds it) against explicit chunked copies
//!   (copy in, kernel, copy out, two streams). Goal 0.95x. The written bytes are read back
//!   and checked.
//! - `big-file`: `stream-store` over a file only, sized by default as the issue's case (48 GiB
//!   space, 2 GiB GPU cache, 4 GiB host cache), next to the disk's own `O_DIRECT` rate.
//!
//! Timings are CUDA-event medians after one warm-up (host-side store reads: wall-clock
//! medians after one warm-up).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use strata_core::config::EnvVars;
use strata_core::format_size;
use strata_core::store::{ReadRequest, Store};
use strata_gpu::driver::{Args, DeviceBuffer, Event, Grid};
use strata_gpu::space::{ElementType, EvictionPolicy, GpuStats, Space, SpaceOptions, Strata};

use crate::gpu_micro::{
    ChunkedBaseline, Kernels, Measure, STORE_WAIT_LIMIT, chunked_copies, measure, time_ms,
};
use crate::store_spec::{AlignedBuf, StoreSpec, StoreSpecError, parse_size_arg};

/// One of issue 11's targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// Streaming from the store against its raw `read_batch` rate.
    StreamStore,
    /// Streaming from a host cache that holds the space.
    StreamHostCache,
    /// Cold random 4 KiB faults served from the host cache.
    Cold4k,
    /// Streaming read-modify-write against chunked copies.
    StreamRmw,
    /// The 48 GiB file case.
    BigFile,
}

impl Target {
    /// Its name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Target::StreamStore => "stream-store",
            Target::StreamHostCache => "stream-host-cache",
            Target::Cold4k => "cold-4k",
            Target::StreamRmw => "stream-rmw",
            Target::BigFile => "big-file",
        }
    }

    const ALL: [Target; 5] = [
        Target::StreamStore,
        Target::StreamHostCache,
        Target::Cold4k,
        Target::StreamRmw,
        Target::BigFile,
    ];
}

/// The pattern written into the stores and checked on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Data {
    /// Random words (LZ4 stores them raw).
    Random,
    /// Three words in four repeat their 4 KiB block's number (LZ4 shrinks pages ~3x).
    Compressible,
}

/// Why a plan was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A store, codec or size flag.
    #[error(transparent)]
    Spec(#[from] StoreSpecError),
    /// Anything else, with what to do.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> PlanError {
    PlanError::Invalid(msg.into())
}

/// What the command line asks for, before defaults (sizes as given).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Comma list of target names or `all`.
    pub targets: String,
    /// `--store` values.
    pub stores: Vec<String>,
    /// Start a memory node in this process and add it as a remote store.
    pub local_node: bool,
    /// `--codec`.
    pub codec: String,
    /// `--file-io`.
    pub file_io: String,
    /// `--gpu-cache`.
    pub gpu_cache: Option<String>,
    /// `--size`.
    pub size: Option<String>,
    /// `--host-cache`.
    pub host_cache: Option<String>,
    /// `--page-size`.
    pub page_size: String,
    /// `--cold-size`.
    pub cold_size: Option<String>,
    /// `--rmw-size`.
    pub rmw_size: Option<String>,
    /// `--raw-bytes`.
    pub raw_bytes: Option<String>,
    /// `--raw-threads`.
    pub raw_threads: usize,
    /// `--raw-depth`.
    pub raw_depth: usize,
    /// `--reps` (`None`: 3, or 1 for big-file).
    pub reps: Option<usize>,
    /// `--data`.
    pub data: String,
}

/// A validated run: every size resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Targets, in the order they run.
    pub targets: Vec<Target>,
    /// Stores of `stream-store` / `big-file` (a local node is added when it starts).
    pub stores: Vec<StoreSpec>,
    /// Start an in-process memory node.
    pub local_node: bool,
    /// `--codec` (for the local node's store).
    pub codec: String,
    /// `--file-io`.
    pub file_io: String,
    /// GPU cache of every space (cold-4k: at most half its space).
    pub gpu_cache: u64,
    /// Space of `stream-store`, `big-file` and `stream-host-cache`.
    pub size: u64,
    /// Host cache of `stream-store` / `big-file` (smaller than `size`).
    pub host_cache: u64,
    /// Page size of the streaming targets.
    pub page_size: u64,
    /// Space of `cold-4k` (a power-of-two count of 4 KiB pages).
    pub cold_size: u64,
    /// Space of `stream-rmw`.
    pub rmw_size: u64,
    /// Bytes the raw `read_batch` baseline reads.
    pub raw_bytes: u64,
    /// Threads of the raw baseline.
    pub raw_threads: usize,
    /// Pages per `read_batch` of the raw baseline.
    pub raw_depth: usize,
    /// Timed repetitions after one warm-up.
    pub reps: usize,
    /// The pattern.
    pub data: Data,
}

fn size_opt(flag: &str, v: Option<&String>) -> Result<Option<u64>, PlanError> {
    Ok(v.map(|s| parse_size_arg(flag, s)).transpose()?)
}

impl Plan {
    /// Resolves `req` (defaults, the issue's sizes for big-file) and checks it.
    ///
    /// # Errors
    /// A [`PlanError`] that says what to write instead.
    pub fn new(req: &Request, env: &EnvVars) -> Result<Self, PlanError> {
        let mut targets = Vec::new();
        for name in req
            .targets
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            if name == "all" {
                targets.extend(&Target::ALL[..4]);
                continue;
            }
            let t = Target::ALL.iter().find(|t| t.name() == name).ok_or_else(|| {
                invalid(format!(
                    "--targets: unknown target {name:?}; use stream-store, stream-host-cache, cold-4k, stream-rmw, big-file or all"
                ))
            })?;
            if !targets.contains(t) {
                targets.push(*t);
            }
        }
        if targets.is_empty() {
            return Err(invalid(
                "--targets is empty: name at least one target, or all",
            ));
        }
        let big = targets.contains(&Target::BigFile);
        if big && targets.len() > 1 {
            return Err(invalid(
                "--targets big-file runs alone (its sizes differ from the others'): run the other targets in a second command",
            ));
        }
        let stores = req
            .stores
            .iter()
            .map(|s| StoreSpec::parse(s, &req.codec, &req.file_io, env))
            .collect::<Result<Vec<_>, _>>()?;
        // Parsing the codec and file I/O once more catches a bad value with no --store given.
        StoreSpec::parse("memory", &req.codec, &req.file_io, env)?;
        if big && (stores.is_empty() || stores.iter().any(|s| s.file_path().is_none())) {
            return Err(invalid(
                "--targets big-file streams a file: give --store file:PATH (on the disk to measure, with room for --size) and no other store",
            ));
        }
        if big && req.local_node {
            return Err(invalid(
                "--local-node does not go with big-file (a file-only case)",
            ));
        }
        let page_size = parse_size_arg("--page-size", &req.page_size)?;
        if !(4096..=2 << 20).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(invalid(format!(
                "--page-size {}: use a power of two from 4KiB to 2MiB",
                req.page_size
            )));
        }
        let gpu_cache = size_opt("--gpu-cache", req.gpu_cache.as_ref())?.unwrap_or(if big {
            2 << 30
        } else {
            1 << 30
        });
        if gpu_cache < 2 * page_size {
            return Err(invalid(format!(
                "--gpu-cache {} holds fewer than 2 pages of {}",
                format_size(gpu_cache),
                format_size(page_size)
            )));
        }
        let size = size_opt("--size", req.size.as_ref())?.unwrap_or(if big {
            48 << 30
        } else {
            8 * gpu_cache
        });
        if !size.is_multiple_of(page_size) {
            return Err(invalid(format!(
                "--size {} is not a whole number of {} pages",
                format_size(size),
                format_size(page_size)
            )));
        }
        let streams = targets.iter().any(|t| {
            matches!(
                t,
                Target::StreamStore | Target::BigFile | Target::StreamHostCache
            )
        });
        if streams && size < 2 * gpu_cache {
            return Err(invalid(format!(
                "--size {} is less than twice the GPU cache ({}): the stream would mostly hit in the GPU cache; the targets ask for 8x (--size {})",
                format_size(size),
                format_size(gpu_cache),
                format_size(8 * gpu_cache)
            )));
        }
        let host_cache = size_opt("--host-cache", req.host_cache.as_ref())?.unwrap_or(if big {
            4 << 30
        } else {
            size / 2
        });
        let from_store = targets
            .iter()
            .any(|t| matches!(t, Target::StreamStore | Target::BigFile));
        if from_store && host_cache >= size {
            return Err(invalid(format!(
                "--host-cache {} holds the whole space of {}: the stream would be served from the host cache, not the store (that is target stream-host-cache); give less than --size",
                format_size(host_cache),
                format_size(size)
            )));
        }
        if host_cache < 2 * page_size {
            return Err(invalid(format!(
                "--host-cache {} holds fewer than 2 pages of {}",
                format_size(host_cache),
                format_size(page_size)
            )));
        }
        let cold_size = size_opt("--cold-size", req.cold_size.as_ref())?
            .unwrap_or_else(|| prev_power_of_two(size.min(4 << 30)).max(1 << 20));
        if cold_size < (64 << 10) || !cold_size.is_power_of_two() {
            return Err(invalid(format!(
                "--cold-size {}: the cold pass visits every 4 KiB page once in a shuffled order that needs a power-of-two page count; use a power of two of at least 64KiB (e.g. 4GiB)",
                format_size(cold_size)
            )));
        }
        let rmw_size = size_opt("--rmw-size", req.rmw_size.as_ref())?.unwrap_or(4 * gpu_cache);
        if !rmw_size.is_multiple_of(64 << 10) || rmw_size < 2 * gpu_cache {
            return Err(invalid(format!(
                "--rmw-size {}: use whole 64 KiB pages and at least twice the GPU cache (the target is 4x, {})",
                format_size(rmw_size),
                format_size(4 * gpu_cache)
            )));
        }
        let raw_bytes = size_opt("--raw-bytes", req.raw_bytes.as_ref())?
            .unwrap_or_else(|| size.min(8 << 30))
            .min(size)
            / page_size
            * page_size;
        if raw_bytes == 0 {
            return Err(invalid("--raw-bytes must hold at least one page"));
        }
        if req.raw_threads == 0 || req.raw_depth == 0 {
            return Err(invalid("--raw-threads and --raw-depth must be at least 1"));
        }
        let reps = req.reps.unwrap_or(if big { 1 } else { 3 });
        if reps == 0 {
            return Err(invalid("--reps must be at least 1"));
        }
        let data = match req.data.as_str() {
            "random" => Data::Random,
            "compressible" => Data::Compressible,
            other => {
                return Err(invalid(format!(
                    "--data {other:?}: use random or compressible"
                )));
            }
        };
        let mut stores = stores;
        if stores.is_empty() && !req.local_node && from_store {
            stores.push(StoreSpec::parse("memory", &req.codec, &req.file_io, env)?);
        }
        Ok(Plan {
            targets,
            stores,
            local_node: req.local_node,
            codec: req.codec.clone(),
            file_io: req.file_io.clone(),
            gpu_cache,
            size,
            host_cache,
            page_size,
            cold_size,
            rmw_size,
            raw_bytes,
            raw_threads: req.raw_threads,
            raw_depth: req.raw_depth,
            reps,
            data,
        })
    }

    /// Host memory the largest target holds at once (targets run one after another): store
    /// bytes of memory stores and an in-process node, pinned host caches, pinned copies.
    #[must_use]
    pub fn host_bytes_needed(&self) -> u64 {
        self.targets
            .iter()
            .map(|t| match t {
                Target::StreamStore | Target::BigFile => {
                    let in_memory = self.stores.iter().any(StoreSpec::is_memory) || self.local_node;
                    let store = if in_memory { self.size } else { 0 };
                    store + self.host_cache
                }
                // The pinned-copy space (the baseline, whose bytes fill the store), the memory
                // store, and a host cache holding the whole space.
                Target::StreamHostCache => 3 * self.size,
                Target::Cold4k => 3 * self.cold_size,
                Target::StreamRmw => 3 * self.rmw_size,
            })
            .max()
            .unwrap_or(0)
    }
}

impl Plan {
    /// For each file store: the bytes its file system must still take (the file grown to
    /// `size`, and the 1 GiB file of the disk-rate probe), and the directory.
    #[must_use]
    pub fn disk_bytes_needed(&self) -> Vec<(std::path::PathBuf, u64)> {
        self.stores
            .iter()
            .filter_map(StoreSpec::file_path)
            .map(|path| {
                let have = std::fs::metadata(path).map_or(0, |m| m.len());
                let dir = match path.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => std::path::PathBuf::from("."),
                };
                (dir, self.size.saturating_sub(have) + (1 << 30))
            })
            .collect()
    }
}

fn prev_power_of_two(v: u64) -> u64 {
    if v == 0 {
        0
    } else {
        1 << (63 - v.leading_zeros())
    }
}

/// Bytes of memory the host can still hand out (`MemAvailable`), if known.
#[must_use]
pub fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The murmur3 finaliser, as `mix64` in `bench_kernels.cu`.
#[must_use]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Word `w` of the pattern (as `pattern_word` in `bench_kernels.cu`).
#[must_use]
pub fn pattern_word(w: u64, seed: u64, data: Data) -> u64 {
    if data == Data::Compressible && w & 3 != 0 {
        (w >> 9) ^ seed
    } else {
        mix64(w ^ seed)
    }
}

/// Fills `bytes` (which start at byte `offset` of the space, a multiple of 8) with the
/// pattern.
pub fn fill_pattern(bytes: &mut [u8], offset: u64, seed: u64, data: Data) {
    let first = offset / 8;
    for (i, w) in bytes.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&pattern_word(first + i as u64, seed, data).to_le_bytes());
    }
}

/// Fills `bytes` with the pattern from several threads.
pub fn fill_pattern_parallel(bytes: &mut [u8], seed: u64, data: Data) {
    const PIECE: usize = 8 << 20;
    let next = AtomicUsize::new(0);
    let pieces: Vec<&mut [u8]> = bytes.chunks_mut(PIECE).collect();
    let slots: Vec<std::sync::Mutex<Option<&mut [u8]>>> = pieces
        .into_iter()
        .map(|p| std::sync::Mutex::new(Some(p)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slot) = slots.get(i) else { return };
                    let taken = slot.lock().map(|mut g| g.take()).unwrap_or(None);
                    if let Some(piece) = taken {
                        fill_pattern(piece, (i * PIECE) as u64, seed, data);
                    }
                }
            });
        }
    });
}

/// Writes the pattern into the first `size` bytes of `store` from several threads in 8 MiB
/// aligned pieces (a 48 GiB file never sits in memory whole), then flushes. Returns seconds.
///
/// # Errors
/// The store's first error.
pub fn write_pattern(
    store: &dyn Store,
    size: u64,
    seed: u64,
    data: Data,
) -> Result<f64, strata_core::StoreError> {
    const PIECE: u64 = 8 << 20;
    let started = Instant::now();
    let pieces = size.div_ceil(PIECE);
    let next = std::sync::atomic::AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = AlignedBuf::new(8 << 20);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= pieces {
                            return Ok(());
                        }
                        let at = i * PIECE;
                        let len = usize::try_from(PIECE.min(size - at)).unwrap_or(0);
                        let piece = &mut buf.as_mut()[..len];
                        fill_pattern(piece, at, seed, data);
                        store.write_at(at, piece)?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a pattern writer panicked"))
    })?;
    store.flush()?;
    Ok(started.elapsed().as_secs_f64())
}

/// Reads the first `bytes` of `store` once, in order, as a pager's fillers would: `threads`
/// threads each take the next `depth` pages and read them with one `read_batch` into an
/// aligned buffer of their own; the first word of every page is checked against the pattern.
/// Returns seconds.
///
/// # Errors
/// The store's error, or a page whose first word is not the pattern's.
pub fn raw_stream_once(
    store: &dyn Store,
    bytes: u64,
    page: u64,
    threads: usize,
    depth: usize,
    pattern: (u64, Data),
) -> Result<f64, String> {
    let pages = bytes / page;
    let batches = pages.div_ceil(depth as u64);
    let next = std::sync::atomic::AtomicU64::new(0);
    let page_len = usize::try_from(page).unwrap_or(usize::MAX);
    let started = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let mut buf = AlignedBuf::new(page_len * depth);
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= batches {
                            return Ok(());
                        }
                        let first = b * depth as u64;
                        let n = usize::try_from((pages - first).min(depth as u64)).unwrap_or(0);
                        let mut requests: Vec<ReadRequest<'_>> = buf
                            .as_mut()
                            .chunks_mut(page_len)
                            .take(n)
                            .enumerate()
                            .map(|(i, chunk)| ReadRequest {
                                offset: (first + i as u64) * page,
                                buf: chunk,
                            })
                            .collect();
                        store.read_batch(&mut requests).map_err(|e| e.to_string())?;
                        for r in &requests {
                            let got = u64::from_le_bytes(r.buf[..8].try_into().unwrap_or([0; 8]));
                            let want = pattern_word(r.offset / 8, pattern.0, pattern.1);
                            if got != want {
                                return Err(format!(
                                    "{} returned wrong bytes at offset {} (first word {got:#x}, the pattern has {want:#x})",
                                    store.describe(),
                                    r.offset
                                ));
                            }
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a store reader panicked"))
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// What a row is judged by.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    /// Strata over the baseline at least this.
    RatioAtLeast(f64),
    /// Strata's rate (in the row's unit) at least this.
    RateAtLeast(f64),
}

impl Goal {
    fn met(self, strata: f64, baseline: Option<f64>) -> Option<bool> {
        match self {
            Goal::RatioAtLeast(r) => baseline.filter(|b| *b > 0.0).map(|b| strata / b >= r),
            Goal::RateAtLeast(r) => Some(strata >= r),
        }
    }

    /// The goal in words (`>= 0.80x`, `>= 45 GB/s`).
    #[must_use]
    pub fn describe(self, unit: &str) -> String {
        match self {
            Goal::RatioAtLeast(r) => format!(">= {r:.2}x"),
            Goal::RateAtLeast(r) => format!(">= {r} {unit}"),
        }
    }
}

/// One row: a target over one store, with its baseline from the same run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// The target's name.
    pub target: String,
    /// The store (`memory`, `file(direct)+lz4`, `pinned host copy`, ...).
    pub store: String,
    /// Page size.
    pub page_size: u64,
    /// Space size.
    pub space_bytes: u64,
    /// GPU cache.
    pub gpu_cache_bytes: u64,
    /// Host cache (spaces over a store).
    pub host_cache_bytes: Option<u64>,
    /// `GB/s` or `Mpages/s`.
    pub unit: String,
    /// Through Strata.
    pub strata: Measure,
    /// What it is compared with.
    pub baseline_name: String,
    /// Its rate.
    pub baseline: Option<Measure>,
    /// Strata over the baseline.
    pub ratio: Option<f64>,
    /// The target.
    pub goal: Goal,
    /// Whether the goal was met.
    pub met: Option<bool>,
    /// Further figures of the row (name, value with unit in the name).
    pub extra: Vec<(String, f64)>,
    /// Pages checked against the pattern after the timed runs.
    pub pages_checked: u64,
    /// Strata's device statistics over the timed runs and the check.
    pub stats: GpuStats,
}

impl Row {
    /// Sets the baseline's measure, the ratio and whether the goal was met.
    pub fn set_baseline(&mut self, baseline: Measure) {
        self.baseline = Some(baseline);
        self.ratio = (baseline.rate > 0.0).then(|| self.strata.rate / baseline.rate);
        self.met = self.goal.met(self.strata.rate, Some(baseline.rate));
    }
}

/// What a run measured, and the targets (or stores) that failed, with why: a failure ends
/// its target, not the run, so the others' rows still reach the record.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The rows measured.
    pub rows: Vec<Row>,
    /// `(target or target/store, error)` of each failure.
    pub failures: Vec<(String, String)>,
}

/// Runs the plan on GPU 0, printing each row as it is measured.
///
/// # Errors
/// The GPU could not be opened or the kernels not loaded; failures inside a target are in
/// [`Outcome::failures`].
pub fn run(plan: &Plan, log: &mut dyn FnMut(String)) -> anyhow::Result<Outcome> {
    let strata = Strata::new(0)?;
    let k = Kernels::load(&strata)?;
    let grid = k.s_gather.full_grid(256)?;
    let gpu = strata.gpu().clone();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    log(format!(
        "gpu-store on {} ({} SMs), grid {}x{}, {} reps after 1 warm-up, pattern {:?}, seed {seed:#x}",
        gpu.name, gpu.multiprocessors, grid.blocks, grid.threads, plan.reps, plan.data
    ));
    let mut ctx = Run {
        strata: &strata,
        sink: DeviceBuffer::zeroed(&gpu, 8)?,
        bad: DeviceBuffer::zeroed(&gpu, 16)?,
        k,
        grid,
        plan,
        seed,
        rows: Vec::new(),
    };
    let mut failures = Vec::new();
    let mut failed = |what: String, e: anyhow::Error, log: &mut dyn FnMut(String)| {
        log(format!("{what}: FAILED: {e:#}"));
        failures.push((what, format!("{e:#}")));
    };
    for &t in &plan.targets {
        let outcome = match t {
            Target::StreamStore | Target::BigFile => {
                let mut stores = plan.stores.clone();
                let node = if plan.local_node {
                    match start_local_node(plan, seed) {
                        Ok((node, spec)) => {
                            stores.push(spec);
                            Some(node)
                        }
                        Err(e) => {
                            failed(format!("{}/local node", t.name()), e, log);
                            None
                        }
                    }
                } else {
                    None
                };
                for spec in &stores {
                    if let Err(e) = ctx.stream_store(t, spec, log) {
                        failed(format!("{}/{}", t.name(), spec.label()), e, log);
                    }
                }
                if let Some(node) = node {
                    node.shutdown();
                }
                Ok(())
            }
            Target::StreamHostCache => ctx.stream_host_cache(log),
            Target::Cold4k => ctx.cold_4k(log),
            Target::StreamRmw => ctx.stream_rmw(log),
        };
        if let Err(e) = outcome {
            failed(t.name().to_string(), e, log);
        }
    }
    Ok(Outcome {
        rows: ctx.rows,
        failures,
    })
}

/// A memory node in this process on 127.0.0.1 and the store spec that reaches it.
fn start_local_node(plan: &Plan, seed: u64) -> anyhow::Result<(strata_net::MemoryNode, StoreSpec)> {
    let token = format!("gpu-store-{:016x}", mix64(seed));
    let capacity = 2 * plan.size + (64 << 20);
    let node = strata_net::MemoryNode::start(strata_net::ServeOptions::new(
        "127.0.0.1:0".parse()?,
        capacity,
        token.clone(),
    ))?;
    let env = vec![("STRATA_REMOTE_TOKEN".to_string(), token)];
    let spec = StoreSpec::parse(
        &format!("remote:{}", node.address()),
        &plan.codec,
        &plan.file_io,
        &env,
    )?;
    Ok((node, spec))
}

struct Run<'a> {
    strata: &'a Strata,
    sink: DeviceBuffer,
    bad: DeviceBuffer,
    k: Kernels,
    grid: Grid,
    plan: &'a Plan,
    seed: u64,
    rows: Vec<Row>,
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / seconds / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Run<'_> {
    fn options(&self, page: u64, cache: u64, host_cache: Option<u64>) -> SpaceOptions {
        SpaceOptions {
            page_size: page,
            cache_bytes: cache,
            element: ElementType::U64,
            policy: EvictionPolicy::Clock,
            read_through: false,
            host_cache_bytes: host_cache,
            // STRATA_GPU_WRITE_BACK=off|on|N compares runs without and with it.
            background_write_back: strata_gpu::space::default_write_back(),
            peers: Vec::new(),
            remote_access: SpaceOptions::default().remote_access,
            sector_bytes: None,
        }
    }

    /// A space over `store` (already holding the pattern), with the wait limit of a store.
    fn over_store(
        &self,
        store: Arc<dyn Store>,
        size: u64,
        options: &SpaceOptions,
    ) -> anyhow::Result<Space> {
        let space = self.strata.space_over_store(store, size, options)?;
        space.set_wait_limit(STORE_WAIT_LIMIT)?;
        Ok(space)
    }

    /// A space of `size` over a pinned host copy holding the pattern (the baselines' space;
    /// its host bytes also fill the memory stores of the same target).
    fn pattern_space(&self, size: u64, options: &SpaceOptions) -> anyhow::Result<Space> {
        let mut space = self.strata.space(size, options)?;
        space.with_host_mut(|h| fill_pattern_parallel(h, self.seed, self.plan.data))?;
        Ok(space)
    }

    /// A memory store holding `bytes`.
    fn memory_store(&self, bytes: &[u8], page: u64) -> anyhow::Result<Arc<dyn Store>> {
        let spec = StoreSpec::parse("memory", &self.plan.codec, &self.plan.file_io, &Vec::new())?;
        let store = spec.open(bytes.len() as u64, page)?;
        crate::store_spec::write_all(store.as_ref(), bytes)?;
        Ok(store)
    }

    /// Median ms of streaming `space` (after one warm-up pass).
    fn time_stream(&self, space: &Space) -> anyhow::Result<f64> {
        let args = Args::new().arg(space.handle()).arg(self.sink.ptr());
        let ms = time_ms(
            self.strata.gpu(),
            self.plan.reps,
            || Ok(()),
            || Ok(self.k.s_stream.launch(self.grid, &args)?),
        )?;
        space.check_errors()?;
        Ok(ms)
    }

    /// [`check_pattern`] with this run's kernels and pattern.
    fn validate(&self, space: &Space) -> anyhow::Result<(u64, f64)> {
        check_pattern(
            &self.k,
            self.grid,
            &self.bad,
            space,
            (self.seed, self.plan.data),
        )
    }

    fn push(&mut self, row: Row, log: &mut dyn FnMut(String)) {
        log(format_row(&row));
        self.rows.push(row);
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        target: Target,
        store: String,
        space: &Space,
        host_cache: Option<u64>,
        unit: &str,
        strata: Measure,
        baseline_name: &str,
        goal: Goal,
    ) -> anyhow::Result<Row> {
        Ok(Row {
            target: target.name().into(),
            store,
            page_size: space.page_size(),
            space_bytes: space.size(),
            gpu_cache_bytes: space.cache_bytes(),
            host_cache_bytes: host_cache,
            unit: unit.into(),
            strata,
            baseline_name: baseline_name.into(),
            baseline: None,
            ratio: None,
            goal,
            met: goal.met(strata.rate, None),
            extra: Vec::new(),
            pages_checked: 0,
            stats: space.stats()?,
        })
    }

    /// Targets stream-store and big-file over one store.
    fn stream_store(
        &mut self,
        target: Target,
        spec: &StoreSpec,
        log: &mut dyn FnMut(String),
    ) -> anyhow::Result<()> {
        let p = self.plan;
        log(format!(
            "{}: {} over {}: writing the pattern",
            target.name(),
            format_size(p.size),
            spec.label()
        ));
        let store = spec.open(p.size, p.page_size)?;
        let write_s = write_pattern(store.as_ref(), p.size, self.seed, p.data)?;
        if let Some(path) = spec.file_path() {
            // Buffered files: the next reader pays for the pages (a no-op for O_DIRECT).
            crate::sys::drop_from_page_cache(&std::fs::File::open(path)?)?;
        }
        log(format!(
            "{}: {} written at {:.2} GB/s; the store's own read_batch over {}",
            spec.label(),
            format_size(p.size),
            rate(p.size, write_s),
            format_size(p.raw_bytes)
        ));
        let mut raw = Vec::new();
        for i in 0..=p.reps {
            let s = raw_stream_once(
                store.as_ref(),
                p.raw_bytes,
                p.page_size,
                p.raw_threads,
                p.raw_depth,
                (self.seed, p.data),
            )
            .map_err(anyhow::Error::msg)?;
            if i > 0 {
                raw.push(s);
            }
        }
        let raw_s = median(raw);
        let raw_measure = Measure {
            median_ms: raw_s * 1e3,
            rate: rate(p.raw_bytes, raw_s),
        };
        let options = self.options(p.page_size, p.gpu_cache, Some(p.host_cache));
        log(format!(
            "{}: raw read_batch {:.2} GB/s; streaming the space ({} passes) and checking it",
            spec.label(),
            raw_measure.rate,
            p.reps + 1
        ));
        let space = self.over_store(store.clone(), p.size, &options)?;
        space.reset_stats()?;
        let ms = self.time_stream(&space)?;
        let (pages, validate_gbs) = self.validate(&space)?;
        let mut row = self.row(
            target,
            spec.label(),
            &space,
            Some(p.host_cache),
            "GB/s",
            measure(ms, p.size, "GB/s"),
            &format!(
                "raw read_batch ({} threads x {} pages)",
                p.raw_threads, p.raw_depth
            ),
            Goal::RatioAtLeast(0.8),
        )?;
        row.set_baseline(raw_measure);
        row.pages_checked = pages;
        row.extra
            .push(("write pattern GB/s".into(), rate(p.size, write_s)));
        row.extra.push(("check pass GB/s".into(), validate_gbs));
        if let Some(path) = spec.file_path() {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or_else(|| std::path::Path::new("."));
            let disk = crate::ceilings::disk_direct_read(dir, 1 << 30);
            match disk.value {
                Some(v) => row.extra.push(("disk O_DIRECT 1MiB reads GB/s".into(), v)),
                None => log(format!("disk rate not measured: {}", disk.note)),
            }
        }
        drop(space);
        self.push(row, log);
        Ok(())
    }

    /// Target stream-host-cache: the pattern in a pinned-copy space (the baseline), copied
    /// into a memory store under a space whose host cache holds it all.
    fn stream_host_cache(&mut self, log: &mut dyn FnMut(String)) -> anyhow::Result<()> {
        let p = self.plan;
        log(format!(
            "stream-host-cache: {} with a host cache that holds it",
            format_size(p.size)
        ));
        let options = self.options(p.page_size, p.gpu_cache, Some(p.size));
        let host_copy = self.pattern_space(p.size, &options)?;
        let store = self.memory_store(host_copy.host_bytes(), p.page_size)?;
        let space = self.over_store(store, p.size, &options)?;
        // time_stream's warm-up pass brings every page into the host cache.
        space.reset_stats()?;
        let ms = self.time_stream(&space)?;
        let (pages, _) = self.validate(&space)?;
        let mut row = self.row(
            Target::StreamHostCache,
            "memory".into(),
            &space,
            Some(p.size),
            "GB/s",
            measure(ms, p.size, "GB/s"),
            "space over a pinned host copy",
            Goal::RateAtLeast(45.0),
        )?;
        drop(space);
        row.set_baseline(measure(self.time_stream(&host_copy)?, p.size, "GB/s"));
        let zargs = Args::new()
            .arg(host_copy.handle().host)
            .arg(p.size)
            .arg(p.page_size)
            .arg(self.sink.ptr());
        let zc = time_ms(
            self.strata.gpu(),
            p.reps,
            || Ok(()),
            || Ok(self.k.r_stream.launch(self.grid, &zargs)?),
        )?;
        row.extra.push((
            "zero-copy read GB/s".into(),
            measure(zc, p.size, "GB/s").rate,
        ));
        row.pages_checked = pages;
        self.push(row, log);
        Ok(())
    }

    /// Median ms of touching every 4 KiB page of `space` once, shuffled, each time from an
    /// empty GPU cache.
    fn time_cold(&self, space: &Space) -> anyhow::Result<f64> {
        let h = space.handle();
        let args = Args::new()
            .arg(h)
            .arg(h.pages)
            .arg(self.seed)
            .arg(1i32)
            .arg(self.sink.ptr());
        let ms = time_ms(
            self.strata.gpu(),
            self.plan.reps,
            || space.evict(0..space.size()),
            || Ok(self.k.s_touch.launch(self.grid, &args)?),
        )?;
        space.check_errors()?;
        Ok(ms)
    }

    /// Target cold-4k.
    fn cold_4k(&mut self, log: &mut dyn FnMut(String)) -> anyhow::Result<()> {
        let p = self.plan;
        let size = p.cold_size;
        let cache = p.gpu_cache.min(size / 2).max(2 << 12);
        log(format!(
            "cold-4k: {} of 4 KiB pages, GPU cache {}, from a warm host cache",
            format_size(size),
            format_size(cache)
        ));
        let options = self.options(4096, cache, Some(size));
        let host_copy = self.pattern_space(size, &options)?;
        let store = self.memory_store(host_copy.host_bytes(), 4096)?;
        let space = self.over_store(store, size, &options)?;
        // One pass brings every page into the host cache (checked on the way).
        let (pages, _) = self.validate(&space)?;
        space.reset_stats()?;
        let ms = self.time_cold(&space)?;
        let touched = size / 4096;
        let mut row = self.row(
            Target::Cold4k,
            "memory".into(),
            &space,
            Some(size),
            "Mpages/s",
            measure(ms, touched, "Mpages/s"),
            "space over a pinned host copy",
            Goal::RateAtLeast(10.0),
        )?;
        drop(space);
        row.set_baseline(measure(self.time_cold(&host_copy)?, touched, "Mpages/s"));
        row.pages_checked = pages;
        self.push(row, log);
        Ok(())
    }

    /// Target stream-rmw: over a pinned host copy and over a memory store, each against
    /// chunked copies (which run last, over the pinned copy's bytes, once both spaces are
    /// measured and checked).
    fn stream_rmw(&mut self, log: &mut dyn FnMut(String)) -> anyhow::Result<()> {
        let p = self.plan;
        let size = p.rmw_size;
        let page = 64u64 << 10;
        log(format!(
            "stream-rmw: {} (GPU cache {})",
            format_size(size),
            format_size(p.gpu_cache)
        ));
        let options = self.options(page, p.gpu_cache, Some(size));
        let host_copy = self.pattern_space(size, &options)?;
        let store = self.memory_store(host_copy.host_bytes(), page)?;
        let over_store = self.over_store(store, size, &options)?;
        let mut rows = Vec::new();
        for (label, space, host_cache) in [
            ("pinned host copy", &host_copy, None),
            ("memory", &over_store, Some(size)),
        ] {
            space.reset_stats()?;
            let args = Args::new().arg(space.handle());
            let ms = time_ms(
                self.strata.gpu(),
                p.reps,
                || Ok(()),
                || Ok(self.k.s_rmw.launch(self.grid, &args)?),
            )?;
            space.check_errors()?;
            let mut row = self.row(
                Target::StreamRmw,
                label.into(),
                space,
                host_cache,
                "GB/s",
                measure(ms, size, "GB/s"),
                "chunked copies (H2D, kernel, D2H)",
                Goal::RatioAtLeast(0.95),
            )?;
            row.pages_checked = check_bumped(space, self.seed, p.data, p.reps + 1)?;
            rows.push(row);
        }
        drop(over_store);
        // The pinned copy is current (the check flushed it); nothing may stay cached over it
        // while the baseline rewrites its bytes.
        host_copy.evict(0..size)?;
        let chunked = chunked_copies(
            &ChunkedBaseline {
                gpu: self.strata.gpu(),
                k: &self.k,
                grid: self.grid,
                sink: self.sink.ptr(),
                reps: p.reps,
            },
            host_copy.host_raw_ptr(),
            usize::try_from(size)?,
            true,
        )?;
        for mut row in rows {
            row.set_baseline(measure(chunked, size, "GB/s"));
            self.push(row, log);
        }
        Ok(())
    }
}

/// Checks every page of `space` against the pattern on the GPU (kernel `strata_validate`,
/// counting into `bad`, 16 bytes); returns the pages checked and the pass's rate in GB/s.
///
/// # Errors
/// A GPU failure, or words that differ from the pattern (how many, and the first page).
pub(crate) fn check_pattern(
    k: &Kernels,
    grid: Grid,
    bad: &DeviceBuffer,
    space: &Space,
    pattern: (u64, Data),
) -> anyhow::Result<(u64, f64)> {
    let gpu = space.gpu();
    bad.upload(0, &[0u64, u64::MAX])?;
    let args = Args::new()
        .arg(space.handle())
        .arg(pattern.0)
        .arg(i32::from(pattern.1 == Data::Compressible))
        .arg(bad.ptr());
    let (a, b) = (Event::new(gpu)?, Event::new(gpu)?);
    a.record(None)?;
    k.s_validate.launch(grid, &args)?;
    b.record(None)?;
    let ms = f64::from(a.elapsed_ms(&b)?);
    space.check_errors()?;
    let mut found = [0u64; 2];
    bad.download(0, &mut found)?;
    if found[0] != 0 {
        anyhow::bail!(
            "{} words of the space differ from the pattern written into it (first at page {} of {}-byte pages): the data path lost or mixed up pages",
            found[0],
            found[1],
            space.page_size()
        );
    }
    let pages = space.size() / space.page_size();
    Ok((pages, rate(space.size(), ms / 1e3)))
}

/// Reads the space back (after its flush) and checks that every 16-byte group had its first
/// 32-bit word bumped `times` times (`bump_page` in `bench_kernels.cu`) and nothing else
/// changed. Returns the pages checked.
///
/// # Errors
/// A word that is not what the passes should have left.
pub fn check_bumped(space: &Space, seed: u64, data: Data, times: usize) -> anyhow::Result<u64> {
    const PIECE: u64 = 64 << 20;
    let mut buf = vec![0u64; usize::try_from(PIECE / 8)?];
    let mut at = 0;
    while at < space.size() {
        let len = PIECE.min(space.size() - at);
        let words = &mut buf[..usize::try_from(len / 8)?];
        space.read_back(at, words)?;
        for (i, &got) in words.iter().enumerate() {
            let w = at / 8 + i as u64;
            let want = bumped(pattern_word(w, seed, data), w, times);
            if got != want {
                anyhow::bail!(
                    "after {times} read-modify-write passes, byte {} of the space holds {got:#x}, not {want:#x}: a dirty page was lost or written back wrong",
                    w * 8
                );
            }
        }
        at += len;
    }
    Ok(space.size() / space.page_size())
}

/// Word `w` after `times` passes of `bump_page` (which adds 1 to the first 32-bit word of each
/// 16 bytes, wrapping at 32 bits).
#[must_use]
pub fn bumped(original: u64, w: u64, times: usize) -> u64 {
    if !w.is_multiple_of(2) {
        return original;
    }
    let low = u32::try_from(original & 0xFFFF_FFFF).unwrap_or(0);
    let add = u32::try_from(times % (1 << 32)).unwrap_or(0);
    (original & !0xFFFF_FFFF) | u64::from(low.wrapping_add(add))
}

/// One row as a table line.
#[must_use]
pub fn format_row(r: &Row) -> String {
    let ratio = r.ratio.map_or_else(|| "-".into(), |v| format!("{v:.2}x"));
    let met = match r.met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "n/a",
    };
    let extra: Vec<String> = r.extra.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
    format!(
        "{:<17} {:<22} {:>6} {:>8} {:<8} {:>8.2} | {} {} = {ratio} | goal {} {met} | {}{}",
        r.target,
        r.store,
        format_size(r.page_size),
        format_size(r.space_bytes),
        r.unit,
        r.strata.rate,
        r.baseline_name,
        r.baseline
            .map_or_else(|| "-".into(), |b| format!("{:.2}", b.rate)),
        r.goal.describe(&r.unit),
        extra.join(", "),
        if r.pages_checked > 0 {
            format!(", {} pages checked", r.pages_checked)
        } else {
            String::new()
        }
    )
}

/// The chart: Strata over each row's own baseline.
#[must_use]
pub fn chart(rows: &[Row], record: &crate::record::Record) -> crate::plot::Chart {
    crate::plot::Chart {
        title: "strata bench gpu-store: GPU spaces over stores against their baselines".into(),
        subtitle: record.subtitle(),
        baselines: vec![
            "the row's baseline (raw read_batch, pinned-copy space, chunked copies)".into(),
        ],
        groups: rows
            .iter()
            .map(|r| crate::plot::Group {
                label: format!("{}\n{}", r.target, r.store),
                speedups: vec![r.ratio],
                ceiling: None,
            })
            .collect(),
        no_ceilings: Some("each row's goal is in the table and the JSON".into()),
        mark_missing: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(targets: &str) -> Request {
        Request {
            targets: targets.into(),
            codec: "none".into(),
            file_io: "direct".into(),
            page_size: "64KiB".into(),
            raw_threads: 4,
            raw_depth: 32,
            data: "random".into(),
            ..Default::default()
        }
    }

    fn plan(r: &Request) -> Result<Plan, PlanError> {
        Plan::new(r, &Vec::new())
    }

    #[test]
    fn defaults_follow_the_issue() {
        let p = plan(&req("all")).unwrap();
        assert_eq!(
            p.targets,
            [
                Target::StreamStore,
                Target::StreamHostCache,
                Target::Cold4k,
                Target::StreamRmw
            ]
        );
        assert_eq!(p.gpu_cache, 1 << 30);
        assert_eq!(p.size, 8 << 30, "8x the GPU cache");
        assert_eq!(
            p.host_cache,
            4 << 30,
            "half the space: pages come from the store"
        );
        assert_eq!(p.rmw_size, 4 << 30, "4x the GPU cache");
        assert_eq!(p.cold_size, 4 << 30);
        assert_eq!(p.raw_bytes, 8 << 30);
        assert_eq!(p.reps, 3);
        assert_eq!(p.stores.len(), 1);
        assert!(p.stores[0].is_memory(), "memory when no store is given");
        assert_eq!(
            p.host_bytes_needed(),
            24 << 30,
            "stream-host-cache holds 3x the space"
        );
    }

    #[test]
    fn big_file_takes_the_issue_sizes_and_needs_a_file() {
        let mut r = req("big-file");
        r.stores = vec!["file:/data/space.bin".into()];
        let p = plan(&r).unwrap();
        assert_eq!(
            (p.size, p.gpu_cache, p.host_cache),
            (48 << 30, 2 << 30, 4 << 30)
        );
        assert_eq!(p.reps, 1);
        assert_eq!(
            p.host_bytes_needed(),
            4 << 30,
            "a file store holds nothing in memory"
        );
        r.stores = vec![];
        assert!(plan(&r).unwrap_err().to_string().contains("file:PATH"));
        r.stores = vec!["memory".into()];
        assert!(plan(&r).is_err());
        r.stores = vec!["file:/x".into()];
        r.local_node = true;
        assert!(plan(&r).is_err());
        let mut both = req("big-file,cold-4k");
        both.stores = vec!["file:/x".into()];
        assert!(plan(&both).unwrap_err().to_string().contains("alone"));
    }

    #[test]
    fn bad_plans_say_what_to_write() {
        let e = plan(&req("stream-all")).unwrap_err().to_string();
        assert!(e.contains("unknown target"), "{e}");
        assert!(plan(&req("")).is_err());
        let mut r = req("stream-store");
        r.host_cache = Some("8GiB".into());
        let e = plan(&r).unwrap_err().to_string();
        assert!(e.contains("stream-host-cache"), "{e}");
        // The host cache may hold the space where no target streams from the store.
        let mut r = req("stream-host-cache");
        r.host_cache = Some("8GiB".into());
        plan(&r).unwrap();
        let mut r = req("all");
        r.size = Some("1GiB".into());
        assert!(
            plan(&r)
                .unwrap_err()
                .to_string()
                .contains("twice the GPU cache")
        );
        let mut r = req("all");
        r.size = Some("lots".into());
        let e = plan(&r).unwrap_err().to_string();
        assert!(e.contains("--size"), "{e}");
        let mut r = req("all");
        r.page_size = "48KiB".into();
        assert!(plan(&r).is_err());
        let mut r = req("cold-4k");
        r.cold_size = Some("3GiB".into());
        assert!(plan(&r).unwrap_err().to_string().contains("power of two"));
        let mut r = req("all");
        r.stores = vec!["tape:/dev/st0".into()];
        assert!(matches!(
            plan(&r),
            Err(PlanError::Spec(StoreSpecError::UnknownKind { .. }))
        ));
        let mut r = req("all");
        r.codec = "zfp:1e-3".into();
        assert!(
            plan(&r).is_err(),
            "a bad codec is refused even with no --store"
        );
        let mut r = req("all");
        r.reps = Some(0);
        assert!(plan(&r).is_err());
        let mut r = req("all");
        r.raw_threads = 0;
        assert!(plan(&r).is_err());
        let mut r = req("all");
        r.data = "zeros".into();
        assert!(plan(&r).is_err());
        let mut r = req("all");
        r.rmw_size = Some("1GiB".into());
        assert!(plan(&r).is_err(), "rmw space smaller than twice the cache");
    }

    #[test]
    fn pattern_matches_the_device_definition() {
        // murmur3's fmix64 of 1 (a published constant) pins mix64 to the kernel's.
        assert_eq!(mix64(1), 0xb456_bcfc_34c2_cb2c);
        let seed = crate::workloads::test_seed();
        let mut page = vec![0u8; 8192];
        fill_pattern(&mut page, 4096, seed, Data::Compressible);
        for (i, w) in page.chunks_exact(8).enumerate() {
            let word = 512 + i as u64;
            let v = u64::from_le_bytes(w.try_into().unwrap());
            if word.is_multiple_of(4) {
                assert_eq!(v, mix64(word ^ seed));
            } else {
                assert_eq!(v, (word >> 9) ^ seed);
            }
        }
        // Compressible data shrinks under LZ4; random data does not.
        for (data, shrinks) in [(Data::Compressible, true), (Data::Random, false)] {
            let mut p = vec![0u8; 65536];
            fill_pattern(&mut p, 0, seed, data);
            let packed = lz4_stored_len(&p);
            assert_eq!(packed * 2 < p.len(), shrinks, "{data:?}: {packed} bytes");
        }
    }

    /// Bytes one page takes in the workspace's LZ4 store (the codec's own counter), after
    /// checking it reads back intact.
    fn lz4_stored_len(page: &[u8]) -> usize {
        let len = page.len() as u64;
        let inner = Arc::new(strata_core::MemoryStore::new(
            strata_codec::CompressedStore::inner_size(len, len).unwrap(),
        ));
        let store = strata_codec::CompressedStore::new(
            inner,
            strata_core::config::CodecKind::Lz4,
            len,
            len,
        )
        .unwrap();
        store.write_at(0, page).unwrap();
        let mut back = vec![0u8; page.len()];
        store.read_at(0, &mut back).unwrap();
        assert!(back == page);
        usize::try_from(
            store
                .counters()
                .stored_bytes_written
                .load(Ordering::Relaxed),
        )
        .unwrap()
    }

    #[test]
    fn store_pattern_round_trip_and_raw_read_check() {
        let seed = crate::workloads::test_seed();
        let store = strata_core::MemoryStore::new(4 << 20);
        write_pattern(&store, 4 << 20, seed, Data::Random).unwrap();
        let s = raw_stream_once(&store, 4 << 20, 64 << 10, 3, 5, (seed, Data::Random)).unwrap();
        assert!(s > 0.0);
        // A wrong seed is caught as wrong bytes, naming the offset.
        let e =
            raw_stream_once(&store, 4 << 20, 64 << 10, 2, 4, (seed ^ 1, Data::Random)).unwrap_err();
        assert!(e.contains("wrong bytes"), "{e}");
        // A page corrupted in the store is caught.
        let page = 17u64 * (64 << 10);
        store.write_at(page, &[0xAB; 8]).unwrap();
        let e = raw_stream_once(&store, 4 << 20, 64 << 10, 4, 3, (seed, Data::Random)).unwrap_err();
        assert!(e.contains(&format!("offset {page}")), "{e}");
        let mut whole = vec![0u8; 1 << 20];
        fill_pattern_parallel(&mut whole, seed, Data::Compressible);
        let mut one = vec![0u8; 1 << 20];
        fill_pattern(&mut one, 0, seed, Data::Compressible);
        assert!(whole == one);
    }

    /// On a GPU (skipped without one): the check kernel passes the pattern and finds one
    /// changed word on the right page, and the read-modify-write check counts passes, over a
    /// space with a pinned host copy 4x its cache.
    #[test]
    fn gpu_checks_catch_a_wrong_word_and_a_missing_pass() {
        let strata = match Strata::new(0) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipped: no GPU here ({e})");
                return;
            }
        };
        let seed = crate::workloads::test_seed();
        let k = Kernels::load(&strata).unwrap();
        let grid = k.s_gather.full_grid(256).unwrap();
        let bad = DeviceBuffer::zeroed(strata.gpu(), 16).unwrap();
        for data in [Data::Random, Data::Compressible] {
            let options = SpaceOptions {
                page_size: 64 << 10,
                cache_bytes: 16 << 20,
                ..Default::default()
            };
            let mut space = strata.space(64 << 20, &options).unwrap();
            space
                .with_host_mut(|h| fill_pattern_parallel(h, seed, data))
                .unwrap();
            let (pages, _) = check_pattern(&k, grid, &bad, &space, (seed, data)).unwrap();
            assert_eq!(pages, 1024);
            let word = 77 * (64 << 10) / 8 + 5;
            space
                .fill_from_slice(word * 8, &[pattern_word(word, seed, data) ^ 1])
                .unwrap();
            let e = check_pattern(&k, grid, &bad, &space, (seed, data)).unwrap_err();
            assert!(
                e.to_string().contains("1 words") && e.to_string().contains("page 77"),
                "{e}"
            );
            space
                .fill_from_slice(word * 8, &[pattern_word(word, seed, data)])
                .unwrap();
            for _ in 0..3 {
                k.s_rmw
                    .launch(grid, &Args::new().arg(space.handle()))
                    .unwrap();
            }
            space.check_errors().unwrap();
            assert_eq!(check_bumped(&space, seed, data, 3).unwrap(), 1024);
            let e = check_bumped(&space, seed, data, 2).unwrap_err();
            assert!(e.to_string().contains("byte 0 "), "{e}");
        }
    }

    /// `--local-node`: a memory node in this process serves the pattern over loopback, raw
    /// and through LZ4, every page's first word checked.
    #[test]
    fn a_local_memory_node_serves_the_pattern() {
        let seed = crate::workloads::test_seed();
        for codec in ["none", "lz4"] {
            let mut r = req("stream-store");
            r.gpu_cache = Some("1MiB".into());
            r.size = Some("8MiB".into());
            r.local_node = true;
            r.codec = codec.into();
            let p = plan(&r).unwrap();
            assert!(p.stores.is_empty(), "the node is the only store");
            let (node, spec) = start_local_node(&p, seed).unwrap();
            assert!(spec.label().starts_with("remote"), "{}", spec.label());
            let store = spec.open(p.size, p.page_size).unwrap();
            write_pattern(store.as_ref(), p.size, seed, Data::Compressible).unwrap();
            let s = raw_stream_once(
                store.as_ref(),
                p.size,
                p.page_size,
                2,
                8,
                (seed, Data::Compressible),
            )
            .unwrap();
            assert!(s > 0.0);
            drop(store);
            node.shutdown();
        }
    }

    #[test]
    fn bumps_wrap_the_low_word_only() {
        assert_eq!(bumped(0x1234_5678_FFFF_FFFF, 0, 2), 0x1234_5678_0000_0001);
        assert_eq!(bumped(0x1234_5678_FFFF_FFFF, 1, 2), 0x1234_5678_FFFF_FFFF);
        assert_eq!(bumped(7, 4, 0), 7);
    }

    #[test]
    fn goals_and_rows_read_well() {
        assert_eq!(Goal::RatioAtLeast(0.8).met(8.0, Some(10.0)), Some(true));
        assert_eq!(Goal::RatioAtLeast(0.8).met(7.9, Some(10.0)), Some(false));
        assert_eq!(Goal::RatioAtLeast(0.8).met(7.9, None), None);
        assert_eq!(Goal::RateAtLeast(45.0).met(44.0, Some(1.0)), Some(false));
        assert_eq!(prev_power_of_two(3 << 30), 2 << 30);
        assert_eq!(prev_power_of_two(4096), 4096);
    }
}
