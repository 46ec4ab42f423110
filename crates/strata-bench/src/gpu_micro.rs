//! `strata bench gpu-micro`: Strata's paging against the baselines a user would pick instead
//! (zero-copy reads of the pinned host copy, explicit chunked copies, UVM with data that fits),
//! over spaces 1x to 8x the cache. Timings are CUDA-event medians after one warm-up; rates are
//! compared with the ceilings measured on this machine ([`crate::ceilings`]).

use std::sync::Arc;

use strata_gpu::driver::{Args, DeviceBuffer, Event, Function, Gpu, Grid, ManagedBuffer, Stream};
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

struct Kernels {
    _module: strata_gpu::space::KernelModule,
    s_stream: Function,
    s_rmw: Function,
    s_touch: Function,
    s_gather: Function,
    r_stream: Function,
    r_rmw: Function,
    r_touch: Function,
    r_gather: Function,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `run` (which queues work on Strata's stream) `reps` times after one warm-up, calling
/// `before` outside the timed region each time. Returns the median in ms.
fn time_ms(
    gpu: &Arc<Gpu>,
    reps: usize,
    mut before: impl FnMut() -> Result<(), SpaceError>,
    mut run: impl FnMut() -> Result<(), SpaceError>,
) -> Result<f64, SpaceError> {
    let (a, b) = (Event::new(gpu)?, Event::new(gpu)?);
    let mut times = Vec::with_capacity(reps);
    for i in 0..=reps {
        before()?;
        gpu.synchronize()?;
        a.record(None)?;
        run()?;
        b.record(None)?;
        let ms = f64::from(a.elapsed_ms(&b)?);
        if i > 0 {
            times.push(ms);
        }
    }
    Ok(median(times))
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `bytes` with random words, in parallel.
fn random_fill(bytes: &mut [u8], seed: u64) {
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

fn measure(ms: f64, units: u64, unit: &str) -> Measure {
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
    ) -> Result<Space, SpaceError> {
        let o = SpaceOptions {
            page_size: page,
            cache_bytes: self.opts.cache_bytes,
            element: ElementType::U64,
            policy,
            read_through: false,
            host_cache_bytes: None,
        };
        let mut space = self.strata.space(self.opts.cache_bytes * ratio, &o)?;
        let seed = self.seed ^ ratio ^ page;
        space.with_host_mut(|h| random_fill(h, seed))?;
        Ok(space)
    }

    fn managed_copy(&self, space: &Space) -> Result<Option<ManagedBuffer>, SpaceError> {
        if self.opts.skip_uvm {
            return Ok(None);
        }
        let bytes = usize::try_from(space.size()).unwrap_or(usize::MAX);
        // Never oversubscribe managed memory: demand the data plus 2 GiB to be free.
        let Some(mut m) = ManagedBuffer::new_if_fits(self.gpu(), bytes, 2 << 30)? else {
            return Ok(None);
        };
        let host = space.host_bytes();
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
        let space = self.new_space(ratio, 64 << 10, policy)?;
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
                    .arg(h.host)
                    .arg(size)
                    .arg(64u64 << 10)
                    .arg(self.sink_args());
                let zc = time_ms(
                    &gpu,
                    reps,
                    || Ok(()),
                    || Ok(self.k.r_stream.launch(self.grid, &zargs)?),
                )?;
                let cc = self.chunked(&space, false)?;
                let uvm = match self.managed_copy(&space)? {
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
                &space,
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
            let zargs = Args::new().arg(h.host).arg(size).arg(64u64 << 10);
            let zc = time_ms(
                &gpu,
                reps,
                || Ok(()),
                || Ok(self.k.r_rmw.launch(self.grid, &zargs)?),
            )?;
            let cc = self.chunked(&space, true)?;
            let ceiling = if in_cache {
                self.ceiling("hbm-read", 0.5, "HBM read+write")
            } else {
                self.ceiling("pcie-read-sm", 1.0, "PCIe each way")
            };
            self.push(
                "stream-rmw",
                &space,
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
            self.touches(&space, ratio, 64 << 10, false)?;
        }
        Ok(())
    }

    /// Explicit chunked copies: 64 MiB chunks on two streams, copy then kernel (then copy back
    /// for read-modify-write), so copies of one chunk overlap the kernel of the other.
    fn chunked(&self, space: &Space, rmw: bool) -> Result<f64, SpaceError> {
        const CHUNK: usize = 64 << 20;
        let gpu = self.gpu().clone();
        let bufs = [
            DeviceBuffer::zeroed(&gpu, CHUNK)?,
            DeviceBuffer::zeroed(&gpu, CHUNK)?,
        ];
        let streams = [Stream::new(&gpu)?, Stream::new(&gpu)?];
        let size = usize::try_from(space.size()).unwrap_or(usize::MAX);
        let host_ptr = space.host_raw_ptr();
        let start_evt = Event::new(&gpu)?;
        let done = [Event::new(&gpu)?, Event::new(&gpu)?];
        time_ms(
            &gpu,
            self.opts.reps,
            || Ok(()),
            || {
                start_evt.record(None)?;
                for s in &streams {
                    start_evt.wait_on(Some(s))?;
                }
                for (i, off) in (0..size).step_by(CHUNK).enumerate() {
                    let len = CHUNK.min(size - off);
                    let (buf, st) = (&bufs[i % 2], &streams[i % 2]);
                    // SAFETY: `host_ptr + off .. + len` lies inside the pinned host copy, alive for
                    // this call; `buf` holds CHUNK >= len bytes; both stay alive until the streams
                    // are joined below.
                    unsafe { st.copy_htod(buf.ptr(), host_ptr.add(off), len)? };
                    if rmw {
                        self.k.r_rmw.launch_on(
                            Grid {
                                blocks: self.grid.blocks,
                                threads: 256,
                            },
                            &Args::new().arg(buf.ptr()).arg(len as u64).arg(64u64 << 10),
                            Some(st),
                        )?;
                        // SAFETY: as above, device to host.
                        unsafe { st.copy_dtoh(host_ptr.add(off), buf.ptr(), len)? };
                    } else {
                        self.k.r_stream.launch_on(
                            self.grid,
                            &Args::new()
                                .arg(buf.ptr())
                                .arg(len as u64)
                                .arg(64u64 << 10)
                                .arg(self.sink_args()),
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

    /// Random page touches (a warp reads a whole page), and for 4 KiB pages also cold faults:
    /// every page once, in shuffled order, from an empty cache.
    fn touches(
        &mut self,
        space: &Space,
        ratio: u64,
        page: u64,
        cold: bool,
    ) -> Result<(), SpaceError> {
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
            .arg(h.host)
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
        let uvm = match self.managed_copy(space)? {
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
        let space = self.new_space(ratio, 4 << 10, EvictionPolicy::Clock)?;
        if self.wants("touch-4k") {
            self.touches(&space, ratio, 4 << 10, false)?;
        }
        if self.wants("cold-4k") {
            self.touches(&space, ratio, 4 << 10, true)?;
        }
        let n = space.size() / 8;
        let count = self.opts.gathers;
        let zipf = zipf_indices(n, usize::try_from(count).unwrap_or(0), 0.99, self.seed);
        let idx = DeviceBuffer::zeroed(self.gpu(), zipf.len() * 8)?;
        idx.upload(0, &zipf)?;
        let m = if self.wants("gather") {
            self.managed_copy(&space)?
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
                .arg(h.host)
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
                    let ums = time_ms(
                        &gpu,
                        reps.min(2),
                        || Ok(m.prefetch_to_host()?),
                        || Ok(self.k.r_gather.launch(self.grid, &uargs)?),
                    )?;
                    Some(measure(ums, uc, "Mgathers/s"))
                }
                None => None,
            };
            let ceiling = if ratio <= 1 {
                self.ceiling("hbm-random-gather", 1.0, "HBM gather")
            } else {
                self.ceiling("zero-copy-random-gather", 1.0, "zero-copy gather")
            };
            self.push(
                name,
                &space,
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
        "{:<18} {:>5} {:>2}x {:<10} {:>9.2} | zc {} | copy {} | uvm {} | {} | hit {:>5.1}% faults {}",
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
    )
}

/// Runs the benchmark on GPU 0.
pub fn run_micro(opts: &MicroOptions) -> Result<Vec<Row>, SpaceError> {
    let strata = Strata::new(0)?;
    let module = strata.compile(BENCH_KERNELS_CU, "bench_kernels.cu")?;
    let f = |n: &str| module.function(n);
    let k = Kernels {
        s_stream: f("strata_stream_read")?,
        s_rmw: f("strata_stream_rmw")?,
        s_touch: f("strata_page_touch")?,
        s_gather: f("strata_gather")?,
        r_stream: f("raw_stream_read")?,
        r_rmw: f("raw_stream_rmw")?,
        r_touch: f("raw_page_touch")?,
        r_gather: f("raw_gather")?,
        _module: module,
    };
    let grid = k.s_gather.full_grid(256)?;
    let gpu = strata.gpu().clone();
    eprintln!(
        "gpu-micro on {} ({} SMs), cache {}, grid {}x{}, {} reps after 1 warm-up",
        gpu.name,
        gpu.multiprocessors,
        strata_core::units::format_size(opts.cache_bytes),
        grid.blocks,
        grid.threads,
        opts.reps
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
            stats: GpuStats {
                hits: 0,
                faults: 0,
                evictions: 0,
                writebacks: 0,
                prefetched: 0,
                bytes_in: 0,
                bytes_out: 0,
                fault_ns_total: 0,
                fault_ns_max: 0,
                no_frame_retries: 0,
                protected_frames: 0,
                optimistic_retries: 0,
                read_through: 0,
                host_cache_loads: 0,
            },
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
