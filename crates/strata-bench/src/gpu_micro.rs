//! `strata bench gpu-micro`: Strata's paging against the baselines a user would pick instead
//! (zero-copy reads of the pinned host copy, explicit chunked copies, UVM with data that fits),
//! over spaces 1x to 8x the cache. Timings are CUDA-event medians after one warm-up; rates are
//! compared with the ceilings measured on this machine ([`crate::ceilings`]).

use std::sync::Arc;

use strata_gpu::driver::{
    Args, DeviceBuffer, Event, Function, Gpu, Grid, ManagedBuffer, MappedHostBuffer, Stream,
};
use strata_gpu::space::{
    ElementType, EvictionPolicy, GpuStats, Space, SpaceError, SpaceOptions, Strata,
};

/// The kernels of `strata bench gpu-micro` (compiled at run time through NVRTC).
pub const BENCH_KERNELS_CU: &str = include_str!("../cuda/bench_kernels.cu");

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct MicroOptions {
    /// GPU page-cache size of every space.
    pub cache_bytes: u64,
    /// Space sizes as multiples of the cache.
    pub ratios: Vec<u64>,
    /// Timed repetitions (after one warm-up); the median is reported.
    pub reps: usize,
    /// Random 8-byte gathers per run.
    pub gathers: u64,
    /// Random page touches per run (4 KiB pages; 64 KiB pages get a sixteenth).
    pub touches: u64,
    /// Skip the UVM baseline.
    pub skip_uvm: bool,
    /// Patterns to run (empty = all).
    pub patterns: Vec<String>,
    /// The ceilings measured on this machine (`strata bench ceilings`); rows report no
    /// fraction without them.
    pub ceilings: Option<crate::ceilings::Ceilings>,
    /// Back every space with a store (`--store`) instead of a pinned host copy.
    pub backing: Option<crate::store_spec::SpaceBacking>,
    /// Neighbour GPUs' memory every space borrows for its peer tier (`--peer`).
    pub peers: Vec<strata_gpu::space::PeerBorrow>,
    /// What element accesses do on pages not resident (`--remote-access`; `None`: the
    /// default, or `STRATA_GPU_REMOTE_ACCESS`).
    pub remote_access: Option<strata_gpu::space::RemoteAccess>,
    /// Sub-page fetch sector of every space (`--sector`; `None`: whole pages).
    pub sector_bytes: Option<u64>,
    /// Page size of the gather patterns' spaces (`--gather-page`; 4 KiB by default).
    pub gather_page: u64,
}

impl Default for MicroOptions {
    fn default() -> Self {
        MicroOptions {
            cache_bytes: 512 << 20,
            ratios: vec![1, 2, 4, 8],
            reps: 3,
            gathers: 1 << 22,
            touches: 1 << 20,
            skip_uvm: false,
            patterns: Vec::new(),
            ceilings: None,
            backing: None,
            peers: Vec::new(),
            remote_access: None,
            sector_bytes: None,
            gather_page: 4 << 10,
        }
    }
}

/// One measurement: median time and rate.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Measure {
    /// Median milliseconds per run.
    pub median_ms: f64,
    /// Units per second (the row's unit).
    pub rate: f64,
}

/// One row of the results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Pattern name.
    pub pattern: String,
    /// Eviction policy.
    pub policy: String,
    /// Page size in bytes.
    pub page_size: u64,
    /// Space size over cache size.
    pub ratio: u64,
    /// Space size in bytes.
    pub space_bytes: u64,
    /// What `rate` counts: "GB/s", "Mpages/s" or "Mgathers/s".
    pub unit: String,
    /// Through Strata.
    pub strata: Measure,
    /// Zero-copy reads of the pinned host copy.
    pub zero_copy: Option<Measure>,
    /// Explicit chunked copies (streaming patterns only).
    pub chunked_copy: Option<Measure>,
    /// CUDA managed memory, first touch (data fits in GPU memory).
    pub uvm: Option<Measure>,
    /// The ceiling compared with, in `unit`, measured on this machine (0 when none was).
    pub ceiling: f64,
    /// Its name.
    pub ceiling_name: String,
    /// Strata's device statistics over the timed runs.
    pub stats: GpuStats,
}

/// The kernels of [`BENCH_KERNELS_CU`], loaded (`s_*` through a space, `r_*` over a plain
/// pointer).
pub(crate) struct Kernels {
    _module: strata_gpu::space::KernelModule,
    pub(crate) s_stream: Function,
    pub(crate) s_rmw: Function,
    pub(crate) s_touch: Function,
    pub(crate) s_gather: Function,
    pub(crate) s_validate: Function,
    pub(crate) s_random_rmw: Function,
    pub(crate) r_random_rmw: Function,
    pub(crate) r_stream: Function,
    pub(crate) r_rmw: Function,
    pub(crate) r_touch: Function,
    pub(crate) r_gather: Function,
}

impl Kernels {
    /// Compiles (or takes from the disk cache) and loads the benchmark kernels.
    pub(crate) fn load(strata: &Strata) -> Result<Self, SpaceError> {
        let module = strata.compile(BENCH_KERNELS_CU, "bench_kernels.cu")?;
        let f = |n: &str| module.function(n);
        Ok(Kernels {
            s_stream: f("strata_stream_read")?,
            s_rmw: f("strata_stream_rmw")?,
            s_touch: f("strata_page_touch")?,
            s_gather: f("strata_gather")?,
            s_validate: f("strata_validate")?,
            s_random_rmw: f("strata_random_rmw")?,
            r_random_rmw: f("raw_random_rmw")?,
            r_stream: f("raw_stream_read")?,
            r_rmw: f("raw_stream_rmw")?,
            r_touch: f("raw_page_touch")?,
            r_gather: f("raw_gather")?,
            _module: module,
        })
    }
}

/// A space under test and the pinned host bytes its baselines read: the space's own host
/// copy, or, for a space over a store (which has none), a pinned copy of the bytes written
/// into the store.
pub(crate) struct Subject {
    /// The space.
    pub(crate) space: Space,
    /// The baselines' pinned copy, for a space over a store.
    pub(crate) baseline: Option<MappedHostBuffer>,
}

impl Subject {
    /// The baselines' bytes as the GPU addresses them.
    pub(crate) fn host_device_ptr(&self) -> u64 {
        match &self.baseline {
            Some(b) => b.device_ptr(),
            None => self.space.handle().host,
        }
    }

    /// The baselines' bytes as the host addresses them (for copies queued by a baseline).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        match &self.baseline {
            Some(b) => b.host_mut_ptr(),
            None => self.space.host_raw_ptr(),
        }
    }

    /// The baselines' bytes.
    pub(crate) fn host_bytes(&self) -> &[u8] {
        match &self.baseline {
            Some(b) => b.as_slice(),
            None => self.space.host_bytes(),
        }
    }
}

/// How long a warp may wait on a page of a space over a store: a disk or a memory node
/// serves thousands of concurrent faults far slower than pinned memory does.
pub(crate) const STORE_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A space of `size` bytes over a fresh store of `backing` holding `bytes` (written into the
/// store first, then the space is made over it).
pub(crate) fn space_over_store(
    strata: &Strata,
    backing: &crate::store_spec::SpaceBacking,
    bytes: &[u8],
    options: &SpaceOptions,
) -> Result<Space, SpaceError> {
    let size = bytes.len() as u64;
    let store = backing
        .spec
        .open(size, options.page_size)
        .map_err(|e| SpaceError::Invalid(e.to_string()))?;
    crate::store_spec::write_all(store.as_ref(), bytes).map_err(|source| SpaceError::Store {
        store: store.describe(),
        source,
    })?;
    let options = SpaceOptions {
        host_cache_bytes: backing.host_cache,
        ..options.clone()
    };
    let space = strata.space_over_store(store, size, &options)?;
    space.set_wait_limit(STORE_WAIT_LIMIT)?;
    Ok(space)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `run` (which queues work on Strata's stream) `reps` times after one warm-up, calling
/// `before` outside the timed region each time. Returns the median in ms.
pub(crate) fn time_ms(
    gpu: &Arc<Gpu>,
    reps: usize,
    before: impl FnMut() -> Result<(), SpaceError>,
    run: impl FnMut() -> Result<(), SpaceError>,
) -> Result<f64, SpaceError> {
    let runs = timed_runs(gpu, reps, before, run, || Ok(()))?;
    Ok(median(runs.into_iter().map(|(ms, ())| ms).collect()))
}

/// Times `run` `reps` times after one warm-up, calling `before` first each time (outside the
/// timed region) and `after` once each run has finished; returns (ms, what `after` said) per
/// timed run.
pub(crate) fn timed_runs<T>(
    gpu: &Arc<Gpu>,
    reps: usize,
    mut before: impl FnMut() -> Result<(), SpaceError>,
    mut run: impl FnMut() -> Result<(), SpaceError>,
    mut after: impl FnMut() -> Result<T, SpaceError>,
) -> Result<Vec<(f64, T)>, SpaceError> {
    let (a, b) = (Event::new(gpu)?, Event::new(gpu)?);
    let mut out = Vec::with_capacity(reps);
    for i in 0..=reps {
        before()?;
        gpu.synchronize()?;
        a.record(None)?;
        run()?;
        b.record(None)?;
        let ms = f64::from(a.elapsed_ms(&b)?);
        let t = after()?;
        if i > 0 {
            out.push((ms, t));
        }
    }
    Ok(out)
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `bytes` with random words, in parallel.
pub(crate) fn random_fill(bytes: &mut [u8], seed: u64) {
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    let chunk = bytes.len().div_ceil(threads).next_multiple_of(8);
    std::thread::scope(|s| {
        for (t, part) in bytes.chunks_mut(chunk.max(8)).enumerate() {
            s.spawn(move || {
                let mut st = seed ^ (t as u64).wrapping_mul(0xA076_1D64_78BD_642F);
                for w in part.chunks_mut(8) {
                    let v = splitmix(&mut st).to_le_bytes();
                    w.copy_from_slice(&v[..w.len()]);
                }
            });
        }
    });
}

/// Zipf(theta) ranks over `n` items by Gray et al.'s method, scrambled by a hash so that hot
/// items spread over the space (as embedding rows do).
pub fn zipf_indices(n: u64, count: usize, theta: f64, seed: u64) -> Vec<u64> {
    #[allow(clippy::cast_precision_loss)]
    let nf = n as f64;
    // zeta(n, theta): first million terms exactly, the rest by the integral.
    let exact = n.min(1_000_000);
    #[allow(clippy::cast_precision_loss)]
    let mut zetan: f64 = (1..=exact).map(|i| (i as f64).powf(-theta)).sum();
    if n > exact {
        #[allow(clippy::cast_precision_loss)]
        let m = exact as f64;
        zetan += (nf.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta);
    }
    let zeta2 = 1.0 + 0.5f64.powf(theta);
    let alpha = 1.0 / (1.0 - theta);
    let eta = (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
    let mut st = seed;
    (0..count)
        .map(|_| {
            #[allow(clippy::cast_precision_loss)]
            let u = (splitmix(&mut st) >> 11) as f64 / (1u64 << 53) as f64;
            let uz = u * zetan;
            let rank = if uz < 1.0 {
                0
            } else if uz < zeta2 {
                1
            } else {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let r = (nf * (eta * u - eta + 1.0).powf(alpha)) as u64;
                r.min(n - 1)
            };
            let mut h = rank ^ 0x5bd1_e995;
            splitmix(&mut h) % n
        })
        .collect()
}

struct Ctx<'a> {
    strata: &'a Strata,
    k: Kernels,
    grid: Grid,
    opts: &'a MicroOptions,
    sink: DeviceBuffer,
    rows: Vec<Row>,
    seed: u64,
}

fn gbs(bytes: u64, ms: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / ms / 1e6
}
fn mps(units: u64, ms: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let u = units as f64;
    u / ms / 1e3
}

pub(crate) fn measure(ms: f64, units: u64, unit: &str) -> Measure {
    Measure {
        median_ms: ms,
        rate: if unit == "GB/s" {
            gbs(units, ms)
        } else {
            mps(units, ms)
        },
    }
}

impl Ctx<'_> {
    fn wants(&self, pattern: &str) -> bool {
        self.opts.patterns.is_empty()
            || self
                .opts
                .patterns
                .iter()
                .any(|p| pattern.starts_with(p.as_str()))
    }

    fn gpu(&self) -> &Arc<Gpu> {
        self.strata.gpu()
    }

    fn new_space(
        &self,
        ratio: u64,
        page: u64,
        policy: EvictionPolicy,
    ) -> Result<Subject, SpaceError> {
        let o = SpaceOptions {
            page_size: page,
            cache_bytes: self.opts.cache_bytes,
            element: ElementType::U64,
            policy,
            read_through: false,
            host_cache_bytes: None,
            // STRATA_GPU_WRITE_BACK=off|on|N compares runs without and with it.
            background_write_back: strata_gpu::space::default_write_back(),
            peers: self.opts.peers.clone(),
            remote_access: self
                .opts
                .remote_access
                .unwrap_or_else(|| SpaceOptions::default().remote_access),
            sector_bytes: self.opts.sector_bytes,
        };
        let size = self.opts.cache_bytes * ratio;
        let seed = self.seed ^ ratio ^ page;
        let Some(backing) = &self.opts.backing else {
            let mut space = self.strata.space(size, &o)?;
            space.with_host_mut(|h| random_fill(h, seed))?;
            return Ok(Subject {
                space,
                baseline: None,
            });
        };
        // The store gets the bytes first; the baselines read a pinned copy of the same bytes.
        let len = usize::try_from(size)
            .map_err(|_| SpaceError::Invalid(format!("{size} bytes is too large")))?;
        let mut pinned = MappedHostBuffer::new(self.gpu(), len)?;
        random_fill(pinned.as_mut_slice(), seed);
        let space = space_over_store(self.strata, backing, pinned.as_slice(), &o)?;
        Ok(Subject {
            space,
            baseline: Some(pinned),
        })
    }

    fn managed_copy(&self, subject: &Subject) -> Result<Option<ManagedBuffer>, SpaceError> {
        if self.opts.skip_uvm {
            return Ok(None);
        }
        let space = &subject.space;
        let bytes = usize::try_from(space.size()).unwrap_or(usize::MAX);
        // Never oversubscribe managed memory: demand the data plus 2 GiB to be free.
        let Some(mut m) = ManagedBuffer::new_if_fits(self.gpu(), bytes, 2 << 30)? else {
            return Ok(None);
        };
        let host = subject.host_bytes();
        m.as_mut_slice().copy_from_slice(&host[..bytes]);
        Ok(Some(m))
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        pattern: &str,
        space: &Space,
        ratio: u64,
        unit: &str,
        strata: Measure,
        zero_copy: Option<Measure>,
        chunked_copy: Option<Measure>,
        uvm: Option<Measure>,
        ceiling: (f64, String),
    ) -> Result<(), SpaceError> {
        let policy = match space.options().policy {
            EvictionPolicy::Clock => "clock".to_string(),
            EvictionPolicy::ScanResistant { protected_fraction } => {
                format!("scan-resistant({protected_fraction})")
            }
        };
        let row = Row {
            pattern: pattern.into(),
            policy,
            page_size: space.page_size(),
            ratio,
            space_bytes: space.size(),
            unit: unit.into(),
            strata,
            zero_copy,
            chunked_copy,
            uvm,
            ceiling: ceiling.0,
            ceiling_name: ceiling.1,
            stats: space.stats()?,
        };
        eprintln!("{}", format_row(&row));
        self.rows.push(row);
        Ok(())
    }

    /// Ceiling `probe` of this machine times `scale`, named; zero when it was not measured.
    fn ceiling(&self, probe: &str, scale: f64, what: &str) -> (f64, String) {
        match self.opts.ceilings.as_ref().and_then(|c| c.get(probe)) {
            Some(v) => (v * scale, format!("{what} ({probe})")),
            None => (0.0, format!("{what}: not measured")),
        }
    }

    fn sink_args(&self) -> u64 {
        self.sink.ptr()
    }

    /// Streaming read and read-modify-write over 64 KiB pages.
    fn streaming(&mut self, ratio: u64, policy: EvictionPolicy) -> Result<(), SpaceError> {
        let subject = self.new_space(ratio, 64 << 10, policy)?;
        let space = &subject.space;
        let size = space.size();
        let gpu = self.gpu().clone();
        let reps = self.opts.reps;
        let h = space.handle();
        let in_cache = ratio <= 1;
        let ceiling = if in_cache {
            self.ceiling("hbm-read", 1.0, "HBM read")
        } else {
            self.ceiling("pcie-read-sm", 1.0, "PCIe SM read")
        };
        let clock = matches!(policy, EvictionPolicy::Clock);
        let name = if clock {
            "stream-read"
        } else {
            "stream-read/loop"
        };
        if self.wants(name) {
            space.reset_stats()?;
            let args = Args::new().arg(h).arg(self.sink_args());
            let ms = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.s_stream.launch(self.grid, &args)?),
            )?;
            space.check_errors()?;
            let (zc, cc, uvm) = if clock {
                let zargs = Args::new()
                    .arg(subject.host_device_ptr())
                    .arg(size)
                    .arg(64u64 << 10)
                    .arg(self.sink_args());
                let zc = time_ms(
                    &gpu,
                    reps,
                    || Ok(()),
                    || Ok(self.k.r_stream.launch(self.grid, &zargs)?),
                )?;
                let cc = self.chunked(&subject, false)?;
                let uvm = match self.managed_copy(&subject)? {
                    Some(m) => {
                        let uargs = Args::new()
                            .arg(m.ptr())
                            .arg(size)
                            .arg(64u64 << 10)
                            .arg(self.sink_args());
                        Some(measure(
                            time_ms(
                                &gpu,
                                reps.min(2),
                                || Ok(m.prefetch_to_host()?),
                                || Ok(self.k.r_stream.launch(self.grid, &uargs)?),
                            )?,
                            size,
                            "GB/s",
                        ))
                    }
                    None => None,
                };
                (
                    Some(measure(zc, size, "GB/s")),
                    Some(measure(cc, size, "GB/s")),
                    uvm,
                )
            } else {
                (None, None, None)
            };
            self.push(
                name,
                space,
                ratio,
                "GB/s",
                measure(ms, size, "GB/s"),
                zc,
                cc,
                uvm,
                ceiling,
            )?;
        }
        if clock && self.wants("stream-rmw") {
            space.reset_stats()?;
            let args = Args::new().arg(h);
            let ms = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.s_rmw.launch(self.grid, &args)?),
            )?;
            space.check_errors()?;
            let zargs = Args::new()
                .arg(subject.host_device_ptr())
                .arg(size)
                .arg(64u64 << 10);
            let zc = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.r_rmw.launch(self.grid, &zargs)?),
            )?;
            let cc = self.chunked(&subject, true)?;
            let ceiling = if in_cache {
                self.ceiling("hbm-read", 0.5, "HBM read+write")
            } else {
                self.ceiling("pcie-read-sm", 1.0, "PCIe each way")
            };
            self.push(
                "stream-rmw",
                space,
                ratio,
                "GB/s",
                measure(ms, size, "GB/s"),
                Some(measure(zc, size, "GB/s")),
                Some(measure(cc, size, "GB/s")),
                None,
                ceiling,
            )?;
        }
        if clock && self.wants("touch-64k") {
            self.touches(&subject, ratio, 64 << 10, false)?;
        }
        Ok(())
    }

    /// Explicit chunked copies of the subject's baseline bytes ([`chunked_copies`]).
    fn chunked(&self, subject: &Subject, rmw: bool) -> Result<f64, SpaceError> {
        let size = usize::try_from(subject.space.size()).unwrap_or(usize::MAX);
        chunked_copies(
            &ChunkedBaseline {
                gpu: self.gpu(),
                k: &self.k,
                grid: self.grid,
                sink: self.sink_args(),
                reps: self.opts.reps,
            },
            subject.host_ptr(),
            size,
            rmw,
        )
    }

    /// Random page touches (a warp reads a whole page), and for 4 KiB pages also cold faults:
    /// every page once, in shuffled order, from an empty cache.
    fn touches(
        &mut self,
        subject: &Subject,
        ratio: u64,
        page: u64,
        cold: bool,
    ) -> Result<(), SpaceError> {
        let space = &subject.space;
        let gpu = self.gpu().clone();
        let reps = self.opts.reps;
        let h = space.handle();
        let pages = h.pages;
        let shift = u64::from(h.page_shift);
        let big = page > 4096;
        let touches = if cold {
            pages
        } else if big {
            self.opts.touches / 16
        } else {
            self.opts.touches
        };
        let seed = self.seed;
        let name = match (cold, big) {
            (true, _) => "cold-4k",
            (false, false) => "touch-4k",
            (false, true) => "touch-64k",
        };
        space.reset_stats()?;
        let args = Args::new()
            .arg(h)
            .arg(touches)
            .arg(seed)
            .arg(i32::from(cold))
            .arg(self.sink_args());
        let ms = time_ms(
            &gpu,
            reps,
            || {
                if cold {
                    space.evict(0..space.size())
                } else {
                    Ok(())
                }
            },
            || Ok(self.k.s_touch.launch(self.grid, &args)?),
        )?;
        space.check_errors()?;
        let zargs = Args::new()
            .arg(subject.host_device_ptr())
            .arg(shift)
            .arg(pages)
            .arg(touches)
            .arg(seed)
            .arg(i32::from(cold))
            .arg(self.sink_args());
        let zc = time_ms(
            &gpu,
            reps,
            || Ok(()),
            || Ok(self.k.r_touch.launch(self.grid, &zargs)?),
        )?;
        let uvm = match self.managed_copy(subject)? {
            Some(m) => {
                // UVM faults ~0.3 M pages/s: fewer touches keep the run short; rates compare.
                let ut = if cold {
                    pages.min(1 << 16)
                } else {
                    touches.min(1 << 15)
                };
                let uargs = Args::new()
                    .arg(m.ptr())
                    .arg(shift)
                    .arg(pages)
                    .arg(ut)
                    .arg(seed)
                    .arg(i32::from(cold))
                    .arg(self.sink_args());
                let ums = time_ms(
                    &gpu,
                    reps.min(2),
                    || Ok(m.prefetch_to_host()?),
                    || Ok(self.k.r_touch.launch(self.grid, &uargs)?),
                )?;
                Some(measure(ums, ut, "Mpages/s"))
            }
            None => None,
        };
        let ceiling = match (ratio <= 1 && !cold, big) {
            #[allow(clippy::cast_precision_loss)]
            (true, _) => self.ceiling("hbm-read", 1e3 / page as f64, "HBM read"),
            (false, false) => self.ceiling("page-gather-4k", 1.0, "PCIe warp-per-page 4K"),
            (false, true) => self.ceiling("page-gather-64k", 1.0, "PCIe warp-per-page 64K"),
        };
        self.push(
            name,
            space,
            ratio,
            "Mpages/s",
            measure(ms, touches, "Mpages/s"),
            Some(measure(zc, touches, "Mpages/s")),
            None,
            uvm,
            ceiling,
        )
    }

    /// 4 KiB-page space: page touches, cold faults, and 8-byte gathers (uniform and Zipf 0.99).
    fn small_pages(&mut self, ratio: u64) -> Result<(), SpaceError> {
        let small = self.new_space(ratio, 4 << 10, EvictionPolicy::Clock)?;
        if self.wants("touch-4k") {
            self.touches(&small, ratio, 4 << 10, false)?;
        }
        if self.wants("cold-4k") {
            self.touches(&small, ratio, 4 << 10, true)?;
        }
        // The gathers run over pages of --gather-page (a space of their own if not 4 KiB).
        let subject = if self.opts.gather_page == 4 << 10 {
            small
        } else {
            drop(small);
            self.new_space(ratio, self.opts.gather_page, EvictionPolicy::Clock)?
        };
        let space = &subject.space;
        let n = space.size() / 8;
        let count = self.opts.gathers;
        let zipf = zipf_indices(n, usize::try_from(count).unwrap_or(0), 0.99, self.seed);
        let idx = DeviceBuffer::zeroed(self.gpu(), zipf.len() * 8)?;
        idx.upload(0, &zipf)?;
        let m = if self.wants("gather") {
            self.managed_copy(&subject)?
        } else {
            None
        };
        for (name, ip) in [("gather-uniform", 0u64), ("gather-zipf", idx.ptr())] {
            if !self.wants(name) {
                continue;
            }
            let gpu = self.gpu().clone();
            let reps = self.opts.reps;
            let h = space.handle();
            space.reset_stats()?;
            let args = Args::new()
                .arg(h)
                .arg(ip)
                .arg(count)
                .arg(self.seed)
                .arg(self.sink_args());
            let ms = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.s_gather.launch(self.grid, &args)?),
            )?;
            space.check_errors()?;
            let zargs = Args::new()
                .arg(subject.host_device_ptr())
                .arg(n)
                .arg(ip)
                .arg(count)
                .arg(self.seed)
                .arg(self.sink_args());
            let zc = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.r_gather.launch(self.grid, &zargs)?),
            )?;
            let uvm = match &m {
                Some(m) => {
                    let uc = count.min(1 << 18);
                    let uargs = Args::new()
                        .arg(m.ptr())
                        .arg(n)
                        .arg(ip)
                        .arg(uc)
                        .arg(self.seed)
                        .arg(self.sink_args());
                    Some(self.uvm_run(m, &self.k.r_gather, &uargs, uc, "Mgathers/s")?)
                }
                None => None,
            };
            let ceiling = self.random_access_ceiling(ratio);
            self.push(
                name,
                space,
                ratio,
                "Mgathers/s",
                measure(ms, count, "Mgathers/s"),
                Some(measure(zc, count, "Mgathers/s")),
                None,
                uvm,
                ceiling,
            )?;
        }
        Ok(())
    }
}

impl Ctx<'_> {
    /// A baseline kernel over managed memory `m` that fits: prefetched to the host before
    /// each run (so each run pays its first-touch faults), at most two timed runs.
    fn uvm_run(
        &self,
        m: &ManagedBuffer,
        kernel: &Function,
        args: &Args,
        units: u64,
        unit: &str,
    ) -> Result<Measure, SpaceError> {
        let ms = time_ms(
            self.gpu(),
            self.opts.reps.min(2),
            || Ok(m.prefetch_to_host()?),
            || Ok(kernel.launch(self.grid, args)?),
        )?;
        Ok(measure(ms, units, unit))
    }

    /// The ceiling of random element access: HBM when the space fits the cache, else
    /// zero-copy gathers.
    fn random_access_ceiling(&self, ratio: u64) -> (f64, String) {
        if ratio <= 1 {
            self.ceiling("hbm-random-gather", 1.0, "HBM gather")
        } else {
            self.ceiling("zero-copy-random-gather", 1.0, "zero-copy gather")
        }
    }

    /// Random read-modify-write of 4-byte elements in place (`x += 1` at uniformly random
    /// indices), against the same kernel over zero-copy memory and over managed memory that
    /// fits.
    fn random_updates(&mut self, ratio: u64, page: u64) -> Result<(), SpaceError> {
        let name = if page > 4096 {
            "rmw-random-64k"
        } else {
            "rmw-random-4k"
        };
        if !self.wants(name) {
            return Ok(());
        }
        let subject = self.new_space(ratio, page, EvictionPolicy::Clock)?;
        let space = &subject.space;
        let gpu = self.gpu().clone();
        let reps = self.opts.reps;
        let n = space.size() / 4;
        let count = self.opts.gathers;
        let h = space.handle();
        space.reset_stats()?;
        let args = Args::new().arg(h).arg(count).arg(self.seed);
        let ms = time_ms(
            &gpu,
            reps,
            || Ok(()),
            || Ok(self.k.s_random_rmw.launch(self.grid, &args)?),
        )?;
        space.check_errors()?;
        let zargs = Args::new()
            .arg(subject.host_device_ptr())
            .arg(n)
            .arg(count)
            .arg(self.seed);
        let zc = time_ms(
            &gpu,
            reps,
            || Ok(()),
            || Ok(self.k.r_random_rmw.launch(self.grid, &zargs)?),
        )?;
        let uvm = match self.managed_copy(&subject)? {
            Some(m) => {
                let uc = count.min(1 << 18);
                let uargs = Args::new().arg(m.ptr()).arg(n).arg(uc).arg(self.seed);
                Some(self.uvm_run(&m, &self.k.r_random_rmw, &uargs, uc, "Mupdates/s")?)
            }
            None => None,
        };
        let ceiling = self.random_access_ceiling(ratio);
        self.push(
            name,
            space,
            ratio,
            "Mupdates/s",
            measure(ms, count, "Mupdates/s"),
            Some(measure(zc, count, "Mupdates/s")),
            None,
            uvm,
            ceiling,
        )
    }
}

/// What the chunked-copy baseline runs with.
pub(crate) struct ChunkedBaseline<'a> {
    pub(crate) gpu: &'a Arc<Gpu>,
    pub(crate) k: &'a Kernels,
    pub(crate) grid: Grid,
    pub(crate) sink: u64,
    pub(crate) reps: usize,
}

/// Explicit chunked copies of `size` pinned bytes at `host_ptr`: 64 MiB chunks on two
/// streams, copy then kernel (then copy back for read-modify-write), so copies of one chunk
/// overlap the kernel of the other. Returns the median ms.
pub(crate) fn chunked_copies(
    b: &ChunkedBaseline<'_>,
    host_ptr: *mut u8,
    size: usize,
    rmw: bool,
) -> Result<f64, SpaceError> {
    const CHUNK: usize = 64 << 20;
    let gpu = b.gpu.clone();
    let bufs = [
        DeviceBuffer::zeroed(&gpu, CHUNK)?,
        DeviceBuffer::zeroed(&gpu, CHUNK)?,
    ];
    let streams = [Stream::new(&gpu)?, Stream::new(&gpu)?];
    let start_evt = Event::new(&gpu)?;
    let done = [Event::new(&gpu)?, Event::new(&gpu)?];
    time_ms(
        &gpu,
        b.reps,
        || Ok(()),
        || {
            start_evt.record(None)?;
            for s in &streams {
                start_evt.wait_on(Some(s))?;
            }
            for (i, off) in (0..size).step_by(CHUNK).enumerate() {
                let len = CHUNK.min(size - off);
                let (buf, st) = (&bufs[i % 2], &streams[i % 2]);
                // SAFETY: `host_ptr + off .. + len` lies inside the caller's pinned buffer of
                // `size` bytes, alive for this call; `buf` holds CHUNK >= len bytes; both stay
                // alive until the streams are joined below.
                unsafe { st.copy_htod(buf.ptr(), host_ptr.add(off), len)? };
                if rmw {
                    b.k.r_rmw.launch_on(
                        Grid {
                            blocks: b.grid.blocks,
                            threads: 256,
                        },
                        &Args::new().arg(buf.ptr()).arg(len as u64).arg(64u64 << 10),
                        Some(st),
                    )?;
                    // SAFETY: as above, device to host.
                    unsafe { st.copy_dtoh(host_ptr.add(off), buf.ptr(), len)? };
                } else {
                    b.k.r_stream.launch_on(
                        b.grid,
                        &Args::new()
                            .arg(buf.ptr())
                            .arg(len as u64)
                            .arg(64u64 << 10)
                            .arg(b.sink),
                        Some(st),
                    )?;
                }
            }
            for (e, s) in done.iter().zip(&streams) {
                e.record(Some(s))?;
                e.wait_on(None)?;
            }
            Ok(())
        },
    )
}

/// How a run's spaces are backed, for its log line.
fn backing_label(backing: Option<&crate::store_spec::SpaceBacking>) -> String {
    match backing {
        None => "over pinned host copies".into(),
        Some(b) => format!(
            "over {} stores (host cache {})",
            b.spec.label(),
            b.host_cache
                .map_or_else(|| "default".into(), strata_core::units::format_size)
        ),
    }
}

fn fmt_opt(m: Option<Measure>, strata: f64) -> String {
    match m {
        Some(m) => format!("{:>9.2} {:>6.2}x", m.rate, strata / m.rate),
        None => format!("{:>9} {:>7}", "-", ""),
    }
}

/// One row as a table line.
pub fn format_row(r: &Row) -> String {
    let hit = {
        let t = r.stats.hits + r.stats.faults;
        #[allow(clippy::cast_precision_loss)]
        if t == 0 {
            0.0
        } else {
            r.stats.hits as f64 * 100.0 / t as f64
        }
    };
    format!(
        "{:<18} {:>5} {:>2}x {:<10} {:>9.2} | zc {} | copy {} | uvm {} | {} | hit {:>5.1}% faults {} remote {}/{} p50/p99 {}/{} us",
        r.pattern,
        strata_core::units::format_size(r.page_size),
        r.ratio,
        r.unit,
        r.strata.rate,
        fmt_opt(r.zero_copy, r.strata.rate),
        fmt_opt(r.chunked_copy, r.strata.rate),
        fmt_opt(r.uvm, r.strata.rate),
        if r.ceiling > 0.0 {
            format!(
                "{:>5.1}% of {:.1} {}",
                r.strata.rate / r.ceiling * 100.0,
                r.ceiling,
                r.ceiling_name
            )
        } else {
            format!("no ceiling ({})", r.ceiling_name)
        },
        hit,
        r.stats.faults,
        r.stats.remote_reads,
        r.stats.remote_writes,
        r.stats.fault_hist.p50_ns() / 1000,
        r.stats.fault_hist.p99_ns() / 1000,
    )
}

/// Runs the benchmark on GPU 0.
pub fn run_micro(opts: &MicroOptions) -> Result<Vec<Row>, SpaceError> {
    let strata = Strata::new(0)?;
    let k = Kernels::load(&strata)?;
    let grid = k.s_gather.full_grid(256)?;
    let gpu = strata.gpu().clone();
    eprintln!(
        "gpu-micro on {} ({} SMs), cache {}, grid {}x{}, {} reps after 1 warm-up, spaces {}",
        gpu.name,
        gpu.multiprocessors,
        strata_core::units::format_size(opts.cache_bytes),
        grid.blocks,
        grid.threads,
        opts.reps,
        backing_label(opts.backing.as_ref())
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    eprintln!("seed {seed:#x}");
    let mut ctx = Ctx {
        sink: DeviceBuffer::zeroed(&gpu, 8)?,
        strata: &strata,
        k,
        grid,
        opts,
        rows: Vec::new(),
        seed,
    };
    for &ratio in &opts.ratios {
        ctx.streaming(ratio, EvictionPolicy::Clock)?;
        if ratio > 1 && ctx.wants("stream-read/loop") {
            ctx.streaming(
                ratio,
                EvictionPolicy::ScanResistant {
                    protected_fraction: 0.75,
                },
            )?;
        }
        ctx.small_pages(ratio)?;
        for page in [4 << 10, 64 << 10] {
            ctx.random_updates(ratio, page)?;
        }
    }
    let rows = ctx.rows;
    Ok(rows)
}

/// The part of a [`Row`] the chart shows, read from a result file's `rows` (this build's or
/// an older one's), so `strata bench plot` can redraw any gpu-micro result.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ChartRow {
    /// Pattern name.
    pub pattern: String,
    /// Page size in bytes.
    pub page_size: u64,
    /// Space size over cache size.
    pub ratio: u64,
    /// Unit of the rates.
    pub unit: String,
    /// Through Strata.
    pub strata: Measure,
    /// Zero-copy.
    pub zero_copy: Option<Measure>,
    /// Chunked copies.
    pub chunked_copy: Option<Measure>,
    /// UVM.
    pub uvm: Option<Measure>,
    /// The ceiling, in `unit` (0: none).
    pub ceiling: f64,
    /// Its name.
    pub ceiling_name: String,
}

/// The chart of `strata bench gpu-micro`: per pattern and oversubscription ratio, Strata's
/// rate over zero-copy's, chunked copies' and UVM's, and as a fraction of this machine's
/// ceiling for the pattern.
pub fn chart(rows: &[ChartRow], record: &crate::record::Record) -> crate::plot::Chart {
    let over = |m: Option<Measure>, r: &ChartRow| {
        m.filter(|m| m.rate > 0.0).map(|m| r.strata.rate / m.rate)
    };
    let groups = rows
        .iter()
        .map(|r| crate::plot::Group {
            label: format!(
                "{}\n{} x{}",
                r.pattern,
                strata_core::units::format_size(r.page_size).replace(' ', ""),
                r.ratio
            ),
            speedups: vec![
                over(r.zero_copy, r),
                over(r.chunked_copy, r),
                over(r.uvm, r),
            ],
            ceiling: (r.ceiling > 0.0).then(|| {
                (
                    r.strata.rate / r.ceiling,
                    format!("{:.1} {} {}", r.ceiling, r.unit, r.ceiling_name),
                )
            }),
        })
        .collect();
    crate::plot::Chart {
        title: "strata bench gpu-micro: Strata's GPU paging against the alternatives".into(),
        subtitle: record.subtitle(),
        baselines: vec![
            "zero-copy".into(),
            "chunked copies".into(),
            "UVM (data fits, first touch)".into(),
        ],
        groups,
        no_ceilings: rows
            .iter()
            .all(|r| r.ceiling <= 0.0)
            .then(|| record.ceilings.source.clone()),
        mark_missing: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let n = 1 << 20;
        let v = zipf_indices(n, 200_000, 0.99, 42);
        assert!(v.iter().all(|&i| i < n));
        let mut counts = std::collections::HashMap::new();
        for &i in &v {
            *counts.entry(i).or_insert(0u32) += 1;
        }
        let mut c: Vec<u32> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let top: u32 = c.iter().take(100).sum();
        // Under Zipf 0.99 over 1M items the top 100 draw about a third of all samples; uniform
        // would give 100 * 200000 / 1M = 20.
        assert!(top > 40_000, "top-100 items drew only {top} of 200000");
    }

    #[test]
    fn median_takes_the_middle() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn chart_shows_a_slower_strata_as_a_slowdown_with_its_value() {
        let r = Row {
            pattern: "p".into(),
            policy: "clock".into(),
            page_size: 4096,
            ratio: 2,
            space_bytes: 1,
            unit: "GB/s".into(),
            strata: Measure {
                median_ms: 1.0,
                rate: 10.0,
            },
            zero_copy: Some(Measure {
                median_ms: 0.24,
                rate: 10.0 / 0.24,
            }),
            chunked_copy: None,
            uvm: None,
            ceiling: 50.0,
            ceiling_name: "x".into(),
            stats: GpuStats::default(),
        };
        let record = crate::record::Record::new(
            "gpu-micro",
            None,
            crate::record::CeilingsUsed {
                source: "test".into(),
                values: None,
            },
            serde_json::json!({ "rows": [&r] }),
        );
        let view: Vec<ChartRow> = serde_json::from_value(record.results["rows"].clone()).unwrap();
        let c = chart(&view, &record);
        let g = &c.groups[0];
        assert!(
            g.speedups[0].is_some_and(|v| (v - 0.24).abs() < 1e-9),
            "{:?}",
            g.speedups
        );
        assert_eq!(g.speedups[1], None);
        assert!(
            g.ceiling
                .as_ref()
                .is_some_and(|(f, _)| (f - 0.2).abs() < 1e-9)
        );
        assert_eq!(
            record.figures.len(),
            2,
            "strata and zero-copy rates: {:?}",
            record.figures
        );
        let base =
            std::env::temp_dir().join(format!("strata-gpu-micro-chart-{}", std::process::id()));
        let (svg, png) = crate::plot::write(&c, &base).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("0.24x"));
        std::fs::remove_file(svg).unwrap();
        std::fs::remove_file(png).unwrap();
    }
}
