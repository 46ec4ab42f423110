//! `strata bench peer`: the peer tier (neighbour GPUs' memory as a victim cache, issue 13)
//! against the same spaces with host-only eviction, in one run:
//! - **ceilings** of the NVLink path measured now with plain kernels over memory borrowed the
//!   same way the tier borrows it: streaming pull, warp-per-page gathers of 4 KiB and 64 KiB
//!   pages, and the exchange a peer-served fault makes (a page in, a victim out), without and
//!   with a per-page fence;
//! - **peer faults**: every page of a space 2x/4x its cache touched once per run in a shuffled
//!   order that repeats, so after the warm-up run the pages not in the cache sit in borrowed
//!   slots; rates count only the faults the peer served (`GpuStats::peer` loads), hits and host
//!   faults are reported beside them, and the same space without a peer tier is the baseline;
//! - **gpu-micro patterns** ([`crate::gpu_micro::run_micro`], run twice: without and with
//!   borrowed memory), paired row by row;
//! - **workloads**: PageRank ([`crate::workloads::graph`]) and embedding gathers
//!   ([`crate::workloads::embed`]) with and without a peer tier, every run validated.
//!
//! The working set of every space fits in its cache plus the borrowed memory (with no
//! `--peer`, each space borrows what its working set needs from the first neighbour GPU).

use std::sync::Arc;

use serde::Serialize;
use strata_gpu::driver::{Args, BorrowedMemory, DeviceBuffer, Function, Gpu, Grid};
use strata_gpu::probe::GpuInfo;
use strata_gpu::space::{
    ElementType, EvictionPolicy, GpuStats, PEER_CHUNK_BYTES, PeerBorrow, SpaceError, SpaceOptions,
    Strata,
};
use strata_workloads::gpu::device::GpuWorkloadError;

use crate::gpu_micro::{
    Kernels, Measure, MicroOptions, Row as MicroRow, random_fill, run_micro, timed_runs,
};

/// Issue 13's target for 4 KiB pages faulted from the peer, M pages/s.
pub const TARGET_4K_MPAGES: f64 = 60.0;
/// Issue 13's target for 64 KiB pages faulted from the peer, GB/s.
pub const TARGET_64K_GBPS: f64 = 300.0;
/// Issue 13's target speed-up over host-only eviction (HUVM reported 2.71x).
pub const TARGET_SPEEDUP: f64 = 3.0;

/// The GPU whose spaces borrow (gpu-micro and the workloads run on GPU 0).
pub const BORROWER: usize = 0;

/// Why `strata bench peer` could not run.
#[derive(Debug, thiserror::Error)]
pub enum PeerBenchError {
    /// Fewer than two GPUs, or none this GPU can reach.
    #[error(
        "strata bench peer needs a second GPU to borrow memory from: {why}. Run it on a machine with two or more GPUs joined by NVLink (or a PCIe peer path), with both visible (CUDA_VISIBLE_DEVICES)"
    )]
    NeedsSecondGpu {
        /// What this machine shows.
        why: String,
    },
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// A GPU space failed.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] strata_gpu::driver::DriverError),
    /// A workload failed or gave a wrong result.
    #[error(transparent)]
    Workload(#[from] GpuWorkloadError),
}

/// Where the borrowed memory comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Lenders {
    /// `--peer GPU:SIZE` as given: every space borrows exactly these.
    Given(Vec<PeerBorrow>),
    /// No `--peer`: every space borrows from this GPU what its working set needs.
    Auto {
        /// The lending GPU.
        gpu: usize,
    },
}

impl Lenders {
    /// What a space whose working set is `bytes` borrows: the given lenders, or `bytes` in
    /// whole chunks from the automatic lender.
    #[must_use]
    pub fn for_working_set(&self, bytes: u64) -> Vec<PeerBorrow> {
        match self {
            Lenders::Given(v) => v.clone(),
            Lenders::Auto { gpu } => vec![PeerBorrow {
                gpu: *gpu,
                bytes: bytes.max(1).next_multiple_of(PEER_CHUNK_BYTES),
            }],
        }
    }

    /// The GPU the ceilings are probed on (the first lender).
    #[must_use]
    pub fn first_gpu(&self) -> usize {
        match self {
            Lenders::Given(v) => v.first().map_or(1, |b| b.gpu),
            Lenders::Auto { gpu } => *gpu,
        }
    }

    /// Bytes borrowed for a working set of `bytes` (whole chunks).
    #[must_use]
    pub fn borrowed(&self, bytes: u64) -> u64 {
        self.for_working_set(bytes)
            .iter()
            .map(|b| b.bytes / PEER_CHUNK_BYTES * PEER_CHUNK_BYTES)
            .sum()
    }
}

/// Checks that this machine can run the benchmark before any GPU work: GPU `own` and at
/// least one neighbour it reaches; every `--peer` names such a neighbour, once, with at least
/// one chunk and no more than it has free. `gpus` is what [`strata_gpu::probe::gpus`] says.
///
/// # Errors
/// [`PeerBenchError::NeedsSecondGpu`] with one GPU (or none, or no driver), or none reachable;
/// [`PeerBenchError::Invalid`] for a bad `--peer`.
pub fn preflight(
    gpus: Result<Vec<GpuInfo>, String>,
    own: usize,
    given: &[PeerBorrow],
) -> Result<Lenders, PeerBenchError> {
    let gpus = gpus.map_err(|e| PeerBenchError::NeedsSecondGpu {
        why: format!("no GPU could be listed ({e})"),
    })?;
    if gpus.len() < 2 {
        return Err(PeerBenchError::NeedsSecondGpu {
            why: format!("this machine shows {} GPU(s)", gpus.len()),
        });
    }
    let me = gpus.iter().find(|g| g.ordinal == own).ok_or_else(|| {
        PeerBenchError::Invalid(format!(
            "GPU {own} does not exist (this machine shows {})",
            gpus.len()
        ))
    })?;
    if given.is_empty() {
        let Some(&gpu) = me.peers.first() else {
            return Err(PeerBenchError::NeedsSecondGpu {
                why: format!(
                    "GPU {own} reaches none of the other {} GPU(s)' memory (no peer path)",
                    gpus.len() - 1
                ),
            });
        };
        return Ok(Lenders::Auto { gpu });
    }
    for (i, b) in given.iter().enumerate() {
        let size = strata_core::units::format_size(b.bytes);
        if b.gpu == own {
            return Err(PeerBenchError::Invalid(format!(
                "--peer {}:{size}: GPU {own} is the borrowing GPU itself: name a neighbour ({:?})",
                b.gpu, me.peers
            )));
        }
        let Some(lender) = gpus.iter().find(|g| g.ordinal == b.gpu) else {
            return Err(PeerBenchError::Invalid(format!(
                "--peer {}:{size}: GPU {} does not exist (this machine shows {} GPUs)",
                b.gpu,
                b.gpu,
                gpus.len()
            )));
        };
        if !me.peers.contains(&b.gpu) {
            return Err(PeerBenchError::Invalid(format!(
                "--peer {}:{size}: GPU {own} cannot reach GPU {}'s memory (no peer path): name one of {:?}",
                b.gpu, b.gpu, me.peers
            )));
        }
        if given[..i].iter().any(|o| o.gpu == b.gpu) {
            return Err(PeerBenchError::Invalid(format!(
                "--peer names GPU {} twice: give one --peer per lender",
                b.gpu
            )));
        }
        if b.bytes < PEER_CHUNK_BYTES {
            return Err(PeerBenchError::Invalid(format!(
                "--peer {}:{size} is less than one {} chunk: borrow at least 2MiB",
                b.gpu,
                strata_core::units::format_size(PEER_CHUNK_BYTES)
            )));
        }
        if b.bytes > lender.free_bytes {
            return Err(PeerBenchError::Invalid(format!(
                "--peer {}:{size}: GPU {} has only {} free: borrow less",
                b.gpu,
                b.gpu,
                strata_core::units::format_size(lender.free_bytes)
            )));
        }
    }
    Ok(Lenders::Given(given.to_vec()))
}

/// Which parts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[allow(clippy::struct_excessive_bools)] // four independent switches
pub struct Sections {
    /// NVLink ceilings.
    pub ceilings: bool,
    /// Peer fault rates.
    pub faults: bool,
    /// gpu-micro patterns.
    pub micro: bool,
    /// PageRank and embeddings.
    pub workloads: bool,
}

impl Sections {
    /// Every section.
    #[must_use]
    pub fn all() -> Self {
        Sections {
            ceilings: true,
            faults: true,
            micro: true,
            workloads: true,
        }
    }

    /// Parses a comma list of `ceilings`, `faults`, `micro`, `workloads` (or `all`).
    ///
    /// # Errors
    /// An unknown name, or an empty list.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut s = Sections {
            ceilings: false,
            faults: false,
            micro: false,
            workloads: false,
        };
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "all" => s = Sections::all(),
                "ceilings" => s.ceilings = true,
                "faults" => s.faults = true,
                "micro" | "gpu-micro" => s.micro = true,
                "workloads" => s.workloads = true,
                other => {
                    return Err(format!(
                        "unknown section {other:?}: use ceilings, faults, micro, workloads or all"
                    ));
                }
            }
        }
        if s == (Sections {
            ceilings: false,
            faults: false,
            micro: false,
            workloads: false,
        }) {
            return Err("--sections is empty: name at least one section".into());
        }
        Ok(s)
    }
}

/// Benchmark settings.
#[derive(Debug, Clone, Serialize)]
pub struct PeerOptions {
    /// GPU page-cache size of every micro-benchmark space (a power of two).
    pub cache_bytes: u64,
    /// Working sets as multiples of the cache (powers of two, at least 2).
    pub ratios: Vec<u64>,
    /// Timed runs after one warm-up (the median is reported).
    pub reps: usize,
    /// Where the borrowed memory comes from.
    pub lenders: Lenders,
    /// Which parts run.
    pub sections: Sections,
    /// gpu-micro patterns (prefixes, as `strata bench gpu-micro --patterns` takes them).
    pub patterns: Vec<String>,
    /// Random page touches per gpu-micro run.
    pub touches: u64,
    /// Random gathers per gpu-micro run.
    pub gathers: u64,
    /// log2 of the PageRank graph's vertices (Kronecker, edge factor 16).
    pub graph_scale: u32,
    /// Embedding table rows (128 floats each).
    pub embed_rows: u64,
    /// Embedding lookups per run.
    pub embed_lookups: u64,
}

impl PeerOptions {
    /// The defaults, or the `--quick` ones (seconds per section instead of tens).
    #[must_use]
    pub fn defaults(quick: bool, lenders: Lenders) -> Self {
        PeerOptions {
            cache_bytes: if quick { 256 << 20 } else { 1 << 30 },
            ratios: vec![2, 4],
            reps: if quick { 2 } else { 3 },
            lenders,
            sections: Sections::all(),
            patterns: DEFAULT_PATTERNS.iter().map(|s| (*s).to_string()).collect(),
            touches: if quick { 1 << 19 } else { 1 << 20 },
            gathers: if quick { 1 << 21 } else { 1 << 22 },
            graph_scale: if quick { 20 } else { 22 },
            embed_rows: if quick { 1 << 20 } else { 1 << 22 },
            embed_lookups: if quick { 1 << 22 } else { 1 << 24 },
        }
    }

    /// Checks the numbers.
    ///
    /// # Errors
    /// A cache or ratio that is not a power of two (the touch order is a bijection over a
    /// power-of-two page count), a ratio below 2, no repetitions.
    pub fn validate(&self) -> Result<(), PeerBenchError> {
        if !self.cache_bytes.is_power_of_two() || self.cache_bytes < (4 << 20) {
            return Err(PeerBenchError::Invalid(format!(
                "--cache {}: give a power of two of at least 4MiB, e.g. 1GiB",
                strata_core::units::format_size(self.cache_bytes)
            )));
        }
        if self.ratios.is_empty() || self.ratios.iter().any(|r| *r < 2 || !r.is_power_of_two()) {
            return Err(PeerBenchError::Invalid(format!(
                "--ratios {:?}: give powers of two of at least 2 (the working set over the cache), e.g. 2,4",
                self.ratios
            )));
        }
        if self.reps == 0 {
            return Err(PeerBenchError::Invalid("--reps must be at least 1".into()));
        }
        if self.graph_scale < 10 || self.graph_scale > 26 {
            return Err(PeerBenchError::Invalid(format!(
                "--graph-scale {}: give 10 to 26",
                self.graph_scale
            )));
        }
        if self.embed_rows < 1024
            || self.embed_lookups < 1024
            || !self.embed_lookups.is_multiple_of(32)
        {
            return Err(PeerBenchError::Invalid(
                "--embed-rows and --embed-lookups: give at least 1024 each, lookups a multiple of 32"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The gpu-micro patterns compared by default (cold-4k empties the cache, and with it the
/// point of a victim cache, before every run).
pub const DEFAULT_PATTERNS: &[&str] = &[
    "stream-read",
    "stream-rmw",
    "touch-4k",
    "touch-64k",
    "gather-uniform",
    "gather-zipf",
    "rmw-random-4k",
];

/// A ceiling measured in this run.
#[derive(Debug, Clone, Serialize)]
pub struct PeerCeiling {
    /// Name (`peer-page-gather-4k`, ...).
    pub name: String,
    /// Page size moved per unit (0 for streaming).
    pub page_size: u64,
    /// Pages per second, millions (0 for streaming).
    pub mpages: f64,
    /// GB/s over the link (the pull; an exchange moves as much again the other way).
    pub gbps: f64,
    /// How it was measured.
    pub note: String,
}

/// One space's peer-fault measurement.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRow {
    /// `peer` or `host-only`.
    pub mode: String,
    /// Page size.
    pub page_size: u64,
    /// Working set over the cache.
    pub ratio: u64,
    /// Space bytes.
    pub space_bytes: u64,
    /// Bytes borrowed (0 host-only).
    pub borrowed_bytes: u64,
    /// Warps of the touching grid.
    pub warps: u64,
    /// Page touches per run.
    pub touches: u64,
    /// Median run, ms.
    pub median_ms: f64,
    /// Faults served from borrowed memory per second, millions (the median run's).
    pub peer_mpages: f64,
    /// The same in GB/s.
    pub peer_gbps: f64,
    /// Every fault per second (peer and host), millions.
    pub fault_mpages: f64,
    /// Every fault's bytes per second, GB/s.
    pub fault_gbps: f64,
    /// Touches per second (hits included), millions.
    pub touch_mpages: f64,
    /// The median run's statistics.
    pub stats: GpuStats,
    /// Mean fault service, ns.
    pub mean_fault_ns: u64,
    /// Faults in flight on average (fault rate x mean service time: Little's law).
    pub faults_in_flight: f64,
}

/// A gpu-micro pattern without and with the peer tier.
#[derive(Debug, Clone, Serialize)]
pub struct MicroPair {
    /// Pattern.
    pub pattern: String,
    /// Policy.
    pub policy: String,
    /// Page size.
    pub page_size: u64,
    /// Working set over the cache.
    pub ratio: u64,
    /// Unit of the rates.
    pub unit: String,
    /// Host-only eviction.
    pub host_only: Measure,
    /// With the peer tier.
    pub peer: Measure,
    /// Zero-copy (from the peer run).
    pub zero_copy: Option<Measure>,
    /// peer / host-only.
    pub speedup: f64,
    /// Faults the peer served in the peer run.
    pub peer_loads: u64,
    /// Faults in the peer run.
    pub faults: u64,
    /// Hits in the peer run.
    pub hits: u64,
}

/// A workload without and with the peer tier.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadPair {
    /// `pagerank` or `embed`.
    pub workload: String,
    /// Data over cache.
    pub oversubscription: f64,
    /// Bytes of the paged array.
    pub data_bytes: u64,
    /// Bytes borrowed.
    pub borrowed_bytes: u64,
    /// Host-only median, ms.
    pub host_only_ms: f64,
    /// With the peer tier, median ms.
    pub peer_ms: f64,
    /// host-only / peer.
    pub speedup: f64,
    /// All in GPU memory, ms (the bound), when measured.
    pub gpu_memory_ms: Option<f64>,
    /// Faults the peer served in the peer run's median run.
    pub peer_loads: u64,
    /// Faults in that run.
    pub faults: u64,
    /// Host-only timed runs, ms.
    pub host_only_times_ms: Vec<f64>,
    /// Peer timed runs, ms.
    pub peer_times_ms: Vec<f64>,
    /// Host-only statistics (median run).
    pub host_only_stats: Option<crate::workloads::report::StrataStats>,
    /// Peer statistics (median run).
    pub peer_stats: Option<crate::workloads::report::StrataStats>,
    /// How the results were checked.
    pub validated: String,
}

/// Everything the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct PeerReport {
    /// GPU name.
    pub gpu: String,
    /// The settings.
    pub options: PeerOptions,
    /// NVLink ceilings measured now.
    pub ceilings: Vec<PeerCeiling>,
    /// Peer fault rates.
    pub faults: Vec<FaultRow>,
    /// Peer fault rates with half the warps (4 KiB, largest ratio): how the rate scales with
    /// concurrency.
    pub faults_half_grid: Option<FaultRow>,
    /// gpu-micro pairs.
    pub micro: Vec<MicroPair>,
    /// Workload pairs.
    pub workloads: Vec<WorkloadPair>,
    /// Seed of the data and touch orders.
    pub seed: u64,
    /// Blocks of 256 threads of the touch kernel resident per SM (its grid has as many per
    /// SM): with a fault served by one warp, the faults in flight are at most its warps.
    pub touch_blocks_per_sm: u32,
    /// `STRATA_GPU_REMOTE_ACCESS` as set for this run (`auto` when unset): element and page
    /// reads served in place from the host copy never reach the peer tier.
    pub remote_access: String,
}

/// The entry of `runs` with the median time.
fn median_run<T>(mut runs: Vec<(f64, T)>) -> (f64, T) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs.swap_remove(runs.len() / 2)
}

#[allow(clippy::cast_precision_loss)]
fn per_s_millions(units: u64, ms: f64) -> f64 {
    units as f64 / ms / 1e3
}

#[allow(clippy::cast_precision_loss)]
fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / ms / 1e6
}

struct Bench<'a> {
    strata: Strata,
    k: Kernels,
    grid: Grid,
    sink: DeviceBuffer,
    opts: &'a PeerOptions,
    seed: u64,
    log: &'a mut dyn FnMut(String),
}

impl Bench<'_> {
    fn gpu(&self) -> &Arc<Gpu> {
        self.strata.gpu()
    }

    /// NVLink ceilings over `bytes` borrowed from the first lender the way the tier borrows.
    fn ceilings(&mut self) -> Result<Vec<PeerCeiling>, PeerBenchError> {
        let gpu = self.gpu().clone();
        let lender = self.opts.lenders.first_gpu();
        let bytes: usize = if self.opts.cache_bytes >= (1 << 30) {
            1 << 30
        } else {
            256 << 20
        };
        let chunk = usize::try_from(PEER_CHUNK_BYTES).unwrap_or(usize::MAX);
        let borrowed = BorrowedMemory::new(&gpu, &[(lender, bytes / chunk)], chunk)?;
        let frames_bytes: usize = 256 << 20;
        let frames = DeviceBuffer::zeroed(&gpu, frames_bytes)?;
        let ceil = self
            .strata
            .compile(crate::ceilings::CEILING_KERNELS_CU, "ceiling_kernels.cu")?;
        let stream = ceil.function("ceiling_stream_read")?;
        let gather = ceil.function("ceiling_page_gather")?;
        let exchange = ceil.function("peer_page_exchange")?;
        gpu.synchronize()?;
        let reps = self.opts.reps.max(3);
        let mut out = Vec::new();
        let time = |f: &Function, args: &Args| -> Result<f64, SpaceError> {
            let grid = f.full_grid(256)?;
            crate::gpu_micro::time_ms(&gpu, reps, || Ok(()), || Ok(f.launch(grid, args)?))
        };
        let ms = time(
            &stream,
            &Args::new()
                .arg(borrowed.ptr())
                .arg(bytes as u64)
                .arg(self.sink.ptr()),
        )?;
        out.push(PeerCeiling {
            name: "peer-read-sm".into(),
            page_size: 0,
            mpages: 0.0,
            gbps: gbps(bytes as u64, ms),
            note: format!(
                "SMs stream {} of GPU {lender}'s memory",
                strata_core::units::format_size(bytes as u64)
            ),
        });
        for page in [4096u64, 64 << 10] {
            let count: u64 = if page == 4096 { 1 << 21 } else { 1 << 17 };
            let src_pages = bytes as u64 / page;
            let frame_count = frames_bytes as u64 / page;
            let args = || {
                Args::new()
                    .arg(borrowed.ptr())
                    .arg(src_pages)
                    .arg(frames.ptr())
                    .arg(frame_count)
                    .arg(page)
                    .arg(count)
                    .arg(self.seed)
            };
            let ms = time(&gather, &args())?;
            let kib = page >> 10;
            out.push(PeerCeiling {
                name: format!("peer-page-gather-{kib}k"),
                page_size: page,
                mpages: per_s_millions(count, ms),
                gbps: gbps(count * page, ms),
                note: "a warp per random page pulls it into local frames (no bookkeeping)".into(),
            });
            // The fault kernels' grid (fewer resident warps than these plain kernels get):
            // the same copies at the concurrency a fault path has.
            let fault_grid = self.grid;
            for (f, what) in [(&gather, "gather"), (&exchange, "exchange")] {
                let ms = crate::gpu_micro::time_ms(
                    &gpu,
                    reps,
                    || Ok(()),
                    || Ok(f.launch(fault_grid, &args().arg(2i32))?),
                )?;
                out.push(PeerCeiling {
                    name: format!("peer-{what}-{kib}k-fault-grid"),
                    page_size: page,
                    mpages: per_s_millions(count, ms),
                    gbps: gbps(count * page, ms),
                    note: format!(
                        "{what} on the fault kernels' grid ({} blocks of {} threads){}",
                        fault_grid.blocks,
                        fault_grid.threads,
                        if what == "exchange" {
                            ", system fence per page"
                        } else {
                            ""
                        }
                    ),
                });
            }
            for (fence, what) in [(0i32, "no fence"), (1, "gpu fence"), (2, "system fence")] {
                let ms = time(&exchange, &args().arg(fence))?;
                out.push(PeerCeiling {
                    name: format!("peer-exchange-{kib}k-{}", what.replace(' ', "-")),
                    page_size: page,
                    mpages: per_s_millions(count, ms),
                    gbps: gbps(count * page, ms),
                    note: format!(
                        "a warp per page pulls a random page in and pushes a local page out to a round-robin slot, 4 vectors per lane in flight, {what} per page"
                    ),
                });
            }
        }
        for c in &out {
            (self.log)(format!(
                "ceiling {:<30} {:>8.2} Mpages/s {:>8.1} GB/s",
                c.name, c.mpages, c.gbps
            ));
        }
        Ok(out)
    }

    /// A 64-bit space of `ratio` x cache with `page`-byte pages, filled with random words,
    /// borrowing `peers`.
    fn space(
        &self,
        ratio: u64,
        page: u64,
        peers: Vec<PeerBorrow>,
    ) -> Result<strata_gpu::Space, SpaceError> {
        let o = SpaceOptions {
            page_size: page,
            cache_bytes: self.opts.cache_bytes,
            element: ElementType::U64,
            policy: EvictionPolicy::Clock,
            read_through: false,
            host_cache_bytes: None,
            background_write_back: strata_gpu::space::default_write_back(),
            peers,
            remote_access: SpaceOptions::default().remote_access,
            sector_bytes: None,
        };
        let mut space = self.strata.space(self.opts.cache_bytes * ratio, &o)?;
        space.with_host_mut(|h| random_fill(h, self.seed ^ ratio ^ page))?;
        Ok(space)
    }

    /// Every page of the space touched once per run in one shuffled order (the same each
    /// run), on `grid`.
    fn touch_rate(
        &self,
        space: &strata_gpu::Space,
        mode: &str,
        ratio: u64,
        grid: Grid,
    ) -> Result<FaultRow, SpaceError> {
        let h = space.handle();
        let touches = h.pages;
        let page = space.page_size();
        let args = Args::new()
            .arg(h)
            .arg(touches)
            .arg(self.seed)
            .arg(1i32)
            .arg(self.sink.ptr());
        let runs = timed_runs(
            self.gpu(),
            self.opts.reps,
            || space.reset_stats(),
            || Ok(self.k.s_touch.launch(grid, &args)?),
            || space.stats(),
        )?;
        space.check_errors()?;
        let (ms, stats) = median_run(runs);
        let loads = stats.peer.as_ref().map_or(0, |p| p.loads);
        let mean = stats.mean_fault_ns();
        let fault_rate = per_s_millions(stats.faults, ms);
        #[allow(clippy::cast_precision_loss)]
        let in_flight = fault_rate * 1e6 * mean as f64 / 1e9;
        Ok(FaultRow {
            mode: mode.into(),
            page_size: page,
            ratio,
            space_bytes: space.size(),
            borrowed_bytes: stats.peer.as_ref().map_or(0, |p| p.borrowed_bytes),
            warps: u64::from(grid.blocks) * u64::from(grid.threads / 32),
            touches,
            median_ms: ms,
            peer_mpages: per_s_millions(loads, ms),
            peer_gbps: gbps(loads * page, ms),
            fault_mpages: fault_rate,
            fault_gbps: gbps(stats.faults * page, ms),
            touch_mpages: per_s_millions(touches, ms),
            mean_fault_ns: mean,
            faults_in_flight: in_flight,
            stats,
        })
    }

    fn log_fault_row(&mut self, r: &FaultRow) {
        let hits = r.stats.hits;
        (self.log)(format!(
            "faults {:<9} {:>6} x{} warps {:>5}: {:>7.2} Mpages/s {:>6.1} GB/s from the peer | all faults {:>7.2} Mpages/s | touches {:>7.2} M/s | hits {hits} faults {} peer loads {} stale {} | fault mean {} ns p50/p99 {}/{} us, {:.0} in flight",
            r.mode,
            strata_core::units::format_size(r.page_size),
            r.ratio,
            r.warps,
            r.peer_mpages,
            r.peer_gbps,
            r.fault_mpages,
            r.touch_mpages,
            r.stats.faults,
            r.stats.peer.as_ref().map_or(0, |p| p.loads),
            r.stats.peer.as_ref().map_or(0, |p| p.stale),
            r.mean_fault_ns,
            r.stats.fault_hist.p50_ns() / 1000,
            r.stats.fault_hist.p99_ns() / 1000,
            r.faults_in_flight
        ));
    }

    /// Peer fault rates, host-only beside them; and the 4 KiB peer case on half the warps.
    fn faults(&mut self) -> Result<(Vec<FaultRow>, Option<FaultRow>), PeerBenchError> {
        let mut rows = Vec::new();
        let mut half = None;
        let top = self.opts.ratios.iter().copied().max().unwrap_or(2);
        for page in [4096u64, 64 << 10] {
            for &ratio in &self.opts.ratios {
                let bytes = self.opts.cache_bytes * ratio;
                for peer in [false, true] {
                    let peers = if peer {
                        self.opts.lenders.for_working_set(bytes)
                    } else {
                        Vec::new()
                    };
                    let space = self.space(ratio, page, peers)?;
                    let mode = if peer { "peer" } else { "host-only" };
                    let row = self.touch_rate(&space, mode, ratio, self.grid)?;
                    self.log_fault_row(&row);
                    rows.push(row);
                    if peer && page == 4096 && ratio == top {
                        let grid = Grid {
                            blocks: (self.grid.blocks / 2).max(1),
                            threads: self.grid.threads,
                        };
                        let row = self.touch_rate(&space, "peer-half-grid", ratio, grid)?;
                        self.log_fault_row(&row);
                        half = Some(row);
                    }
                }
            }
        }
        Ok((rows, half))
    }
}

/// Pairs gpu-micro rows of the same pattern, policy, page size and ratio: host-only and peer.
#[must_use]
pub fn pair_micro(host_only: &[MicroRow], peer: &[MicroRow]) -> Vec<MicroPair> {
    host_only
        .iter()
        .filter_map(|h| {
            let p = peer.iter().find(|p| {
                p.pattern == h.pattern
                    && p.policy == h.policy
                    && p.page_size == h.page_size
                    && p.ratio == h.ratio
            })?;
            Some(MicroPair {
                pattern: h.pattern.clone(),
                policy: h.policy.clone(),
                page_size: h.page_size,
                ratio: h.ratio,
                unit: h.unit.clone(),
                host_only: h.strata,
                peer: p.strata,
                zero_copy: p.zero_copy,
                speedup: if h.strata.rate > 0.0 {
                    p.strata.rate / h.strata.rate
                } else {
                    0.0
                },
                peer_loads: p.stats.peer.as_ref().map_or(0, |s| s.loads),
                faults: p.stats.faults,
                hits: p.stats.hits,
            })
        })
        .collect()
}

/// Pairs workload rows of the same workload and oversubscription: host-only and peer.
#[must_use]
pub fn pair_workloads(
    host_only: &[crate::workloads::report::Row],
    peer: &[crate::workloads::report::Row],
    data_bytes: u64,
    borrowed_bytes: u64,
) -> Vec<WorkloadPair> {
    let gpu_memory = |w: &str| {
        host_only
            .iter()
            .find(|r| r.workload == w && r.mode == "gpu-memory")
            .map(|r| r.median_ms)
    };
    host_only
        .iter()
        .filter_map(|h| {
            let f = h.oversubscription?;
            let p = peer
                .iter()
                .find(|p| p.workload == h.workload && p.oversubscription == Some(f))?;
            Some(WorkloadPair {
                workload: h.workload.clone(),
                oversubscription: f,
                data_bytes,
                borrowed_bytes,
                host_only_ms: h.median_ms,
                peer_ms: p.median_ms,
                speedup: if p.median_ms > 0.0 {
                    h.median_ms / p.median_ms
                } else {
                    0.0
                },
                gpu_memory_ms: gpu_memory(&h.workload),
                peer_loads: p.strata.as_ref().map_or(0, |s| s.peer_loads),
                faults: p.strata.as_ref().map_or(0, |s| s.faults),
                host_only_times_ms: h.times_ms.clone(),
                peer_times_ms: p.times_ms.clone(),
                host_only_stats: h.strata.clone(),
                peer_stats: p.strata.clone(),
                validated: p.validated.clone(),
            })
        })
        .collect()
}

/// The workloads' comparison: Strata at the ratios (and GPU memory, the bound, host-only
/// runs only), `peers` borrowed by every space.
fn comparison(
    opts: &PeerOptions,
    page_size: u64,
    cold: bool,
    peers: Vec<PeerBorrow>,
) -> crate::workloads::Comparison {
    #[allow(clippy::cast_precision_loss)]
    let oversubscription = opts.ratios.iter().map(|r| *r as f64).collect();
    crate::workloads::Comparison {
        oversubscription,
        modes: crate::workloads::Modes {
            strata: true,
            zero_copy: false,
            uvm: false,
            gpu_memory: peers.is_empty(),
        },
        page_size,
        policy: EvictionPolicy::ScanResistant {
            protected_fraction: 0.9,
        },
        reps: u32::try_from(opts.reps).unwrap_or(3),
        cold,
        gpu: BORROWER,
        pcie_read_gbps: None,
        store: None,
        peers,
    }
}

/// The PageRank configuration of `strata bench graph` (Kronecker, edge factor 16, 20
/// iterations, cold starts, 64 KiB pages) with `peers`.
#[must_use]
pub fn pagerank_config(
    opts: &PeerOptions,
    peers: Vec<PeerBorrow>,
    graph_file: Option<std::path::PathBuf>,
) -> crate::workloads::graph::GraphBenchConfig {
    crate::workloads::graph::GraphBenchConfig {
        kind: crate::workloads::graph::GraphKind::Kronecker,
        scale: opts.graph_scale,
        edge_factor: 16,
        seed: 1,
        graph_file,
        algorithms: vec![crate::workloads::graph::Algorithm::PageRank],
        compare: comparison(opts, 64 << 10, true, peers),
        bfs_mode: strata_workloads::gpu::graph::BfsMode::TopDown,
        bfs_dense_fraction: strata_workloads::gpu::graph::DEFAULT_BFS_DENSE_FRACTION,
        iterations: 20,
        damping: 0.85,
    }
}

/// The embedding configuration of `strata bench embed` (128 floats per row, bags of 32,
/// Zipf 0.99 scattered, warm starts, 4 KiB pages) with `peers`.
#[must_use]
pub fn embed_config(
    opts: &PeerOptions,
    peers: Vec<PeerBorrow>,
) -> crate::workloads::embed::EmbedBenchConfig {
    crate::workloads::embed::EmbedBenchConfig {
        rows: opts.embed_rows,
        dim: 128,
        bag: 32,
        lookups: opts.embed_lookups,
        skew: 0.99,
        scatter: true,
        seed: 1,
        compare: comparison(opts, 4096, false, peers),
    }
}

/// PageRank and embeddings without and with the peer tier.
fn workloads(
    opts: &PeerOptions,
    log: &mut dyn FnMut(String),
) -> Result<Vec<WorkloadPair>, PeerBenchError> {
    let mut out = Vec::new();
    // Kronecker with edge factor 16 has at most 2 * 16 arcs per vertex of 4 bytes each.
    let graph_bytes = (1u64 << opts.graph_scale) * 16 * 2 * 4;
    let file = std::env::temp_dir().join(format!(
        "strata-bench-peer-graph-{}-{}.csr",
        std::process::id(),
        opts.graph_scale
    ));
    let result = (|| -> Result<(), PeerBenchError> {
        let host =
            crate::workloads::graph::run(&pagerank_config(opts, Vec::new(), Some(file.clone())))?;
        let peers = opts.lenders.for_working_set(graph_bytes);
        let with = crate::workloads::graph::run(&pagerank_config(opts, peers, Some(file.clone())))?;
        let data = host.graph.neighbour_bytes;
        out.extend(pair_workloads(
            &host.outcome.rows,
            &with.outcome.rows,
            data,
            opts.lenders.borrowed(graph_bytes),
        ));
        Ok(())
    })();
    let _ = std::fs::remove_file(&file);
    result?;
    let table_bytes = opts.embed_rows * 128 * 4;
    let host = crate::workloads::embed::run(&embed_config(opts, Vec::new()))?;
    let with = crate::workloads::embed::run(&embed_config(
        opts,
        opts.lenders.for_working_set(table_bytes),
    ))?;
    out.extend(pair_workloads(
        &host.outcome.rows,
        &with.outcome.rows,
        table_bytes,
        opts.lenders.borrowed(table_bytes),
    ));
    for p in &out {
        let hit = |s: &Option<crate::workloads::report::StrataStats>| {
            s.as_ref().map_or_else(
                || "-".into(),
                |s| format!("hits {:.1}% in {}", s.hit_rate * 100.0, s.bytes_in),
            )
        };
        log(format!(
            "workload {:<9} {}x: host-only {:>9.2} ms {:?} ({}), peer {:>9.2} ms {:?} ({}): {:.2}x (peer loads {} of {} faults; {})",
            p.workload,
            p.oversubscription,
            p.host_only_ms,
            p.host_only_times_ms,
            hit(&p.host_only_stats),
            p.peer_ms,
            p.peer_times_ms,
            hit(&p.peer_stats),
            p.speedup,
            p.peer_loads,
            p.faults,
            p.validated
        ));
    }
    Ok(out)
}

/// Runs the sections `opts` asks for on GPU [`BORROWER`]; progress lines go to `log`.
///
/// # Errors
/// Bad options, GPU failures, wrong workload results.
pub fn run(opts: &PeerOptions, log: &mut dyn FnMut(String)) -> Result<PeerReport, PeerBenchError> {
    opts.validate()?;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    log(format!("seed {seed:#x}, lenders {:?}", opts.lenders));
    let strata = Strata::new(BORROWER)?;
    let k = Kernels::load(&strata)?;
    let grid = k.s_touch.full_grid(256)?;
    let sink = DeviceBuffer::zeroed(strata.gpu(), 8)?;
    let gpu_name = strata.gpu().name.clone();
    let mut report = PeerReport {
        gpu: gpu_name,
        options: opts.clone(),
        ceilings: Vec::new(),
        faults: Vec::new(),
        faults_half_grid: None,
        micro: Vec::new(),
        workloads: Vec::new(),
        seed,
        touch_blocks_per_sm: grid.blocks / strata.gpu().multiprocessors.max(1),
        remote_access: std::env::var("STRATA_GPU_REMOTE_ACCESS").unwrap_or_else(|_| "auto".into()),
    };
    {
        let mut bench = Bench {
            strata,
            k,
            grid,
            sink,
            opts,
            seed,
            log: &mut *log,
        };
        if opts.sections.ceilings {
            report.ceilings = bench.ceilings()?;
        }
        if opts.sections.faults {
            (report.faults, report.faults_half_grid) = bench.faults()?;
        }
    }
    if opts.sections.micro {
        let top = opts.ratios.iter().copied().max().unwrap_or(2);
        let base = MicroOptions {
            cache_bytes: opts.cache_bytes,
            ratios: opts.ratios.clone(),
            reps: opts.reps,
            gathers: opts.gathers,
            touches: opts.touches,
            skip_uvm: true,
            patterns: opts.patterns.clone(),
            ceilings: None,
            backing: None,
            peers: Vec::new(),
            remote_access: None,
            sector_bytes: None,
            gather_page: 4 << 10,
        };
        log("gpu-micro, host-only eviction".into());
        let host = run_micro(&base)?;
        log("gpu-micro, with the peer tier".into());
        let with = run_micro(&MicroOptions {
            peers: opts.lenders.for_working_set(opts.cache_bytes * top),
            ..base
        })?;
        report.micro = pair_micro(&host, &with);
        for p in &report.micro {
            log(format!(
                "micro {:<18} {:>6} x{}: host-only {:>9.2} peer {:>9.2} {}: {:.2}x (peer loads {} of {} faults, {} hits)",
                p.pattern,
                strata_core::units::format_size(p.page_size),
                p.ratio,
                p.host_only.rate,
                p.peer.rate,
                p.unit,
                p.speedup,
                p.peer_loads,
                p.faults,
                p.hits
            ));
        }
    }
    if opts.sections.workloads {
        report.workloads = workloads(opts, log)?;
    }
    Ok(report)
}

/// A target's verdict for one figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// What was measured.
    pub what: String,
    /// The value.
    pub value: f64,
    /// The target.
    pub target: f64,
    /// Its unit.
    pub unit: String,
    /// Met.
    pub met: bool,
}

/// Every figure with a target in `report`: peer fault rates (4 KiB: M pages/s, 64 KiB: GB/s),
/// speed-ups over host-only (>= 3x), and never slower than host-only (>= 1x).
#[must_use]
pub fn verdicts(report: &PeerReport) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut push = |what: String, value: f64, target: f64, unit: &str| {
        out.push(Verdict {
            what,
            value,
            target,
            unit: unit.into(),
            met: value >= target,
        });
    };
    for r in report.faults.iter().filter(|r| r.mode == "peer") {
        if r.page_size == 4096 {
            push(
                format!("4 KiB pages from the peer, x{}", r.ratio),
                r.peer_mpages,
                TARGET_4K_MPAGES,
                "Mpages/s",
            );
        } else if r.page_size == 64 << 10 {
            push(
                format!("64 KiB pages from the peer, x{}", r.ratio),
                r.peer_gbps,
                TARGET_64K_GBPS,
                "GB/s",
            );
        }
    }
    for p in &report.micro {
        let name = format!(
            "{} {} x{} over host-only",
            p.pattern,
            strata_core::units::format_size(p.page_size),
            p.ratio
        );
        push(name.clone(), p.speedup, TARGET_SPEEDUP, "x");
        push(format!("{name}: not slower"), p.speedup, 1.0, "x");
    }
    for w in &report.workloads {
        let name = format!("{} {}x over host-only", w.workload, w.oversubscription);
        push(name.clone(), w.speedup, TARGET_SPEEDUP, "x");
        push(format!("{name}: not slower"), w.speedup, 1.0, "x");
    }
    out
}

/// The figures `strata bench compare` reads from a peer record.
#[must_use]
pub fn figures(report: &PeerReport) -> Vec<crate::record::Figure> {
    let fig = |name: String, value: f64, unit: &str| crate::record::Figure {
        name,
        value,
        unit: unit.into(),
        higher_is_better: true,
        spread: None,
    };
    let mut out = Vec::new();
    for c in &report.ceilings {
        out.push(fig(format!("ceiling {}", c.name), c.gbps, "GB/s"));
    }
    for r in &report.faults {
        let name = format!(
            "faults {} {} x{}",
            r.mode,
            strata_core::units::format_size(r.page_size),
            r.ratio
        );
        out.push(fig(format!("{name} from peer"), r.peer_mpages, "Mpages/s"));
        out.push(fig(format!("{name} all"), r.fault_mpages, "Mpages/s"));
    }
    for p in &report.micro {
        let name = format!(
            "{} {} {} x{}",
            p.pattern,
            strata_core::units::format_size(p.page_size),
            p.policy,
            p.ratio
        );
        out.push(fig(format!("{name} host-only"), p.host_only.rate, &p.unit));
        out.push(fig(format!("{name} peer"), p.peer.rate, &p.unit));
    }
    for w in &report.workloads {
        let name = format!("{} {}x", w.workload, w.oversubscription);
        out.push(fig(format!("{name} speed-up"), w.speedup, "x"));
    }
    out
}

/// The chart: the peer tier's speed-up over host-only eviction per fault case, gpu-micro
/// pattern and workload, and the peer fault rates as a fraction of this run's NVLink gathers.
#[must_use]
pub fn chart(report: &PeerReport, record: &crate::record::Record) -> crate::plot::Chart {
    let ceiling = |page: u64| {
        report
            .ceilings
            .iter()
            .find(|c| c.page_size == page && c.name.starts_with("peer-page-gather"))
    };
    let mut groups = Vec::new();
    for r in report.faults.iter().filter(|r| r.mode == "peer") {
        let host = report
            .faults
            .iter()
            .find(|h| h.mode == "host-only" && h.page_size == r.page_size && h.ratio == r.ratio);
        let size = strata_core::units::format_size(r.page_size).replace(' ', "");
        groups.push(crate::plot::Group {
            label: format!("faults\n{size} x{}", r.ratio),
            speedups: vec![
                host.and_then(|h| (h.fault_mpages > 0.0).then(|| r.fault_mpages / h.fault_mpages)),
            ],
            ceiling: ceiling(r.page_size).filter(|c| c.mpages > 0.0).map(|c| {
                (
                    r.peer_mpages / c.mpages,
                    format!("{:.1} Mpages/s {}", c.mpages, c.name),
                )
            }),
        });
    }
    for p in &report.micro {
        let size = strata_core::units::format_size(p.page_size).replace(' ', "");
        groups.push(crate::plot::Group {
            label: format!("{}\n{size} x{}", p.pattern, p.ratio),
            speedups: vec![(p.speedup > 0.0).then_some(p.speedup)],
            ceiling: None,
        });
    }
    for w in &report.workloads {
        groups.push(crate::plot::Group {
            label: format!("{}\nx{}", w.workload, w.oversubscription),
            speedups: vec![(w.speedup > 0.0).then_some(w.speedup)],
            ceiling: None,
        });
    }
    crate::plot::Chart {
        title: "strata bench peer: the peer tier (borrowed GPU memory) against host-only eviction"
            .into(),
        subtitle: record.subtitle(),
        baselines: vec!["host-only eviction".into()],
        no_ceilings: report
            .ceilings
            .is_empty()
            .then(|| "no NVLink ceilings measured (--sections without ceilings)".into()),
        groups,
        mark_missing: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(ordinal: usize, peers: Vec<usize>) -> GpuInfo {
        GpuInfo {
            ordinal,
            name: "test".into(),
            total_bytes: 80 << 30,
            free_bytes: 70 << 30,
            compute_capability: (9, 0),
            multiprocessors: 132,
            pci_address: String::new(),
            pcie_link: None,
            peers,
        }
    }

    fn borrow(gpu: usize, bytes: u64) -> PeerBorrow {
        PeerBorrow { gpu, bytes }
    }

    #[test]
    fn one_gpu_or_none_is_refused_with_the_need_for_a_second() {
        for gpus in [
            Err("no CUDA driver found".to_string()),
            Ok(Vec::new()),
            Ok(vec![gpu(0, Vec::new())]),
        ] {
            let err = preflight(gpus, 0, &[]).unwrap_err();
            assert!(
                matches!(err, PeerBenchError::NeedsSecondGpu { .. }),
                "{err}"
            );
            assert!(err.to_string().contains("second GPU"), "{err}");
        }
        let err = preflight(Ok(vec![gpu(0, Vec::new()), gpu(1, Vec::new())]), 0, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no peer path") && err.contains("second GPU"),
            "{err}"
        );
    }

    #[test]
    fn bad_peers_are_refused_with_what_to_do() {
        let two = || Ok(vec![gpu(0, vec![1]), gpu(1, vec![0])]);
        let cases = [
            (vec![borrow(0, 1 << 30)], "borrowing GPU itself"),
            (vec![borrow(5, 1 << 30)], "does not exist"),
            (vec![borrow(1, 1 << 20)], "less than one"),
            (vec![borrow(1, 71 << 30)], "free"),
            (vec![borrow(1, 1 << 30), borrow(1, 1 << 30)], "twice"),
        ];
        for (given, want) in cases {
            let err = preflight(two(), 0, &given).unwrap_err();
            assert!(matches!(err, PeerBenchError::Invalid(_)), "{err}");
            assert!(err.to_string().contains(want), "{given:?}: {err}");
        }
        let three = Ok(vec![gpu(0, vec![1]), gpu(1, vec![0]), gpu(2, Vec::new())]);
        let err = preflight(three, 0, &[borrow(2, 1 << 30)]).unwrap_err();
        assert!(err.to_string().contains("cannot reach"), "{err}");
        assert_eq!(
            preflight(two(), 0, &[]).unwrap(),
            Lenders::Auto { gpu: 1 },
            "no --peer: the first neighbour lends"
        );
        let given = vec![borrow(1, 3 << 30)];
        assert_eq!(
            preflight(two(), 0, &given).unwrap(),
            Lenders::Given(given.clone())
        );
    }

    #[test]
    fn automatic_lenders_borrow_the_working_set_in_whole_chunks() {
        let auto = Lenders::Auto { gpu: 1 };
        assert_eq!(
            auto.for_working_set((3 << 20) + 1),
            vec![borrow(1, 4 << 20)]
        );
        assert_eq!(auto.borrowed(1), 2 << 20);
        let given = Lenders::Given(vec![borrow(1, (5 << 20) + 7), borrow(2, 2 << 20)]);
        assert_eq!(given.for_working_set(1 << 40).len(), 2);
        assert_eq!(given.borrowed(0), 6 << 20, "rounded down to whole chunks");
        assert_eq!(given.first_gpu(), 1);
    }

    #[test]
    fn options_are_checked() {
        let ok = PeerOptions::defaults(true, Lenders::Auto { gpu: 1 });
        ok.validate().unwrap();
        PeerOptions::defaults(false, Lenders::Auto { gpu: 1 })
            .validate()
            .unwrap();
        let bad = [
            PeerOptions {
                cache_bytes: 3 << 20,
                ..ok.clone()
            },
            PeerOptions {
                ratios: vec![3],
                ..ok.clone()
            },
            PeerOptions {
                ratios: vec![1, 2],
                ..ok.clone()
            },
            PeerOptions {
                ratios: Vec::new(),
                ..ok.clone()
            },
            PeerOptions {
                reps: 0,
                ..ok.clone()
            },
            PeerOptions {
                embed_lookups: 1025,
                ..ok.clone()
            },
            PeerOptions {
                graph_scale: 40,
                ..ok.clone()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
        assert_eq!(Sections::parse("all").unwrap(), Sections::all());
        let s = Sections::parse("faults, micro").unwrap();
        assert!(s.faults && s.micro && !s.ceilings && !s.workloads);
        assert!(Sections::parse("swap").is_err());
        assert!(Sections::parse(",").is_err());
    }

    fn micro_row(pattern: &str, ratio: u64, rate: f64, loads: Option<u64>) -> MicroRow {
        let stats = zero_stats(loads);
        MicroRow {
            pattern: pattern.into(),
            policy: "clock".into(),
            page_size: 4096,
            ratio,
            space_bytes: 1,
            unit: "Mpages/s".into(),
            strata: Measure {
                median_ms: 1.0,
                rate,
            },
            zero_copy: None,
            chunked_copy: None,
            uvm: None,
            ceiling: 0.0,
            ceiling_name: String::new(),
            stats,
        }
    }

    fn zero_stats(loads: Option<u64>) -> GpuStats {
        GpuStats {
            hits: 5,
            faults: 10,
            peer: loads.map(|loads| strata_gpu::space::PeerStats {
                slots: 1,
                borrowed_bytes: 2 << 20,
                loads,
                ..Default::default()
            }),
            ..GpuStats::default()
        }
    }

    fn report_with(micro: Vec<MicroPair>, faults: Vec<FaultRow>) -> PeerReport {
        PeerReport {
            gpu: "test".into(),
            options: PeerOptions::defaults(true, Lenders::Auto { gpu: 1 }),
            ceilings: vec![PeerCeiling {
                name: "peer-page-gather-4k".into(),
                page_size: 4096,
                mpages: 90.0,
                gbps: 369.0,
                note: String::new(),
            }],
            faults,
            faults_half_grid: None,
            micro,
            workloads: Vec::new(),
            seed: 1,
            touch_blocks_per_sm: 1,
            remote_access: "auto".into(),
        }
    }

    fn fault_row(mode: &str, page_size: u64, peer: f64, all: f64) -> FaultRow {
        FaultRow {
            mode: mode.into(),
            page_size,
            ratio: 4,
            space_bytes: 1,
            borrowed_bytes: 0,
            warps: 1,
            touches: 1,
            median_ms: 1.0,
            peer_mpages: peer,
            #[allow(clippy::cast_precision_loss)]
            peer_gbps: peer * page_size as f64 / 1e3,
            fault_mpages: all,
            fault_gbps: 0.0,
            touch_mpages: all,
            stats: zero_stats(None),
            mean_fault_ns: 0,
            faults_in_flight: 0.0,
        }
    }

    #[test]
    fn rows_pair_by_pattern_and_ratio_and_verdicts_flag_misses() {
        let host = [
            micro_row("touch-4k", 2, 20.0, None),
            micro_row("touch-4k", 4, 15.0, None),
            micro_row("gather-uniform", 2, 10.0, None),
        ];
        let peer = [
            micro_row("touch-4k", 4, 45.0, Some(7)),
            micro_row("touch-4k", 2, 80.0, Some(9)),
        ];
        let pairs = pair_micro(&host, &peer);
        assert_eq!(pairs.len(), 2, "gather-uniform has no peer row");
        assert!((pairs[0].speedup - 4.0).abs() < 1e-12);
        assert_eq!(pairs[0].peer_loads, 9);
        assert!((pairs[1].speedup - 3.0).abs() < 1e-12);
        let slower = MicroPair {
            speedup: 0.9,
            ..pairs[1].clone()
        };
        let report = report_with(
            vec![pairs[0].clone(), slower],
            vec![
                fault_row("peer", 4096, 55.0, 60.0),
                fault_row("host-only", 4096, 0.0, 12.0),
                fault_row("peer", 64 << 10, 5.0, 5.0),
            ],
        );
        let v = verdicts(&report);
        let find = |s: &str| v.iter().find(|x| x.what.starts_with(s)).unwrap().clone();
        assert!(!find("4 KiB pages from the peer").met, "55 < 60");
        assert!(
            find("64 KiB pages from the peer").met,
            "5 M x 64 KiB = 327 GB/s"
        );
        let misses: Vec<_> = v
            .iter()
            .filter(|x| !x.met)
            .map(|x| x.what.clone())
            .collect();
        assert_eq!(misses.len(), 3, "{misses:?}");
        assert!(misses.iter().any(|m| m.ends_with("not slower")));
        let record = crate::record::Record::new(
            "peer",
            None,
            crate::record::CeilingsUsed {
                source: "test".into(),
                values: None,
            },
            serde_json::to_value(&report).unwrap(),
        );
        let c = chart(&report, &record);
        assert_eq!(
            c.groups.len(),
            4,
            "two peer fault cases and two micro pairs"
        );
        let g = &c.groups[0];
        assert!(g.speedups[0].is_some_and(|s| (s - 5.0).abs() < 1e-12));
        assert!(
            g.ceiling
                .as_ref()
                .is_some_and(|(f, _)| (f - 55.0 / 90.0).abs() < 1e-12)
        );
        assert_eq!(c.groups[1].speedups[0], None, "no host-only 64 KiB row");
        assert!(
            figures(&report)
                .iter()
                .any(|f| f.name.contains("from peer"))
        );
        let base = std::env::temp_dir().join(format!("strata-peer-chart-{}", std::process::id()));
        let (svg, png) = crate::plot::write(&c, &base).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("0.90x"));
        std::fs::remove_file(svg).unwrap();
        std::fs::remove_file(png).unwrap();
    }

    #[test]
    fn workload_rows_pair_with_the_gpu_memory_bound() {
        let row = |mode: &str, f: Option<f64>, ms: f64, loads: u64| {
            let mut r: crate::workloads::report::Row = serde_json::from_value(serde_json::json!({
                "workload": "pagerank", "mode": mode, "oversubscription": f, "times_ms": [ms],
                "median_ms": ms, "work": 1, "unit": "arcs", "rate_per_s": 1.0,
                "needed_bytes": 1, "effective_gbps": 1.0, "speedup_vs_zero_copy": null,
                "speedup_vs_uvm": null, "slowdown_vs_gpu_memory": null, "strata": null,
                "pcie_fraction": null, "validated": "vs cpu"
            }))
            .unwrap();
            if f.is_some() {
                r.strata = Some(crate::workloads::report::StrataStats::from(&zero_stats(
                    Some(loads),
                )));
            }
            r
        };
        let host = [
            row("gpu-memory", None, 1.0, 0),
            row("strata-2x", Some(2.0), 30.0, 0),
            row("strata-4x", Some(4.0), 40.0, 0),
        ];
        let peer = [row("strata-4x", Some(4.0), 10.0, 123)];
        let pairs = pair_workloads(&host, &peer, 100, 64);
        assert_eq!(pairs.len(), 1);
        assert!((pairs[0].speedup - 4.0).abs() < 1e-12);
        assert_eq!(pairs[0].gpu_memory_ms, Some(1.0));
        assert_eq!(pairs[0].peer_loads, 123);
    }
}
