//! `strata bench stream` and `strata bench pager`: the CPU pager's benchmarks. Thin: the
//! measuring lives in `strata_pager::stream` and `crate::pager`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::pager::{self as pbench, Access, BenchPlan, ExtraStore, LimitMethod};
use crate::record::Record;
use crate::stream::{StreamConfig, StreamReport, run_stream, run_stream_raw};
use anyhow::Context;
use strata_core::config::{CodecKind, StoreConfig, StoreKind};
use strata_core::{PagerConfig, Store, format_size, parse_size};
use strata_pager::{EvictionPolicy, Region};

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Arguments of `strata bench stream`.
#[derive(Debug, clap::Args)]
pub struct StreamArgs {
    /// Bytes of the region holding STREAM's three arrays.
    #[arg(long, default_value = "768MiB", value_parser = size_arg)]
    size: u64,
    /// Resident-set budget of the region (default: a quarter of --size).
    #[arg(long, value_parser = size_arg)]
    buffer: Option<u64>,
    /// Pager page size (a multiple of 4 KiB up to 2 MiB; default STRATA_PAGE_SIZE or 1 MiB,
    /// the best of 16 KiB..2 MiB measured for STREAM on the development machine).
    #[arg(long, value_parser = size_arg)]
    page_size: Option<u64>,
    /// Filler threads (default STRATA_FILLERS or one per CPU).
    #[arg(long)]
    fillers: Option<usize>,
    /// Evictor threads (default STRATA_EVICTORS or 1).
    #[arg(long)]
    evictors: Option<usize>,
    /// Pages read ahead after a sequential fault (default STRATA_READ_AHEAD or 2).
    #[arg(long)]
    read_ahead: Option<u64>,
    /// Timed iterations of the four kernels (the first is reported but not counted).
    #[arg(long, default_value_t = 4)]
    iterations: usize,
    /// STREAM worker threads (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Backing store: `file` (a temporary file, removed afterwards, unless --file is given),
    /// `file:PATH` (kept), `memory`, or `remote:HOST:PORT[,HOST:PORT...]` (memory nodes
    /// started with `strata serve`; needs --token or STRATA_REMOTE_TOKEN).
    #[arg(long, default_value = "file")]
    store: String,
    /// Page codec between the pager and the store: none, lz4, or zfp:TOLERANCE (lossy, for
    /// floating-point pages; STREAM's arrays are f64).
    #[arg(long, default_value = "none")]
    codec: CodecKind,
    /// Token of the memory nodes for a remote store (default STRATA_REMOTE_TOKEN).
    #[arg(long)]
    token: Option<String>,
    /// Back the region with this file (created or grown to --size; kept afterwards); the
    /// same as `--store file:PATH`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Eviction policy: clock or fifo.
    #[arg(long, default_value = "clock")]
    policy: EvictionPolicy,
    /// Skip the DRAM baseline (the same STREAM code over ordinary memory of the same size).
    #[arg(long)]
    no_baseline: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plot here (SVG, and a PNG beside it).
    #[arg(long, default_value = "strata-bench-stream.svg")]
    plot: PathBuf,
}

fn pager_config(
    page_size: Option<u64>,
    buffer: u64,
    fillers: Option<usize>,
    evictors: Option<usize>,
    read_ahead: Option<u64>,
    default_read_ahead: u64,
    default_page: u64,
) -> anyhow::Result<PagerConfig> {
    let cpus = strata_core::config::available_cpus();
    let env = strata_core::config::process_env()?;
    let has = |name: &str| env.iter().any(|(k, _)| k == name);
    let mut b = PagerConfig::builder();
    // Benchmark defaults, then the environment, then flags.
    b = b
        .fillers(cpus.max(1))
        .evictors(1)
        .read_ahead(default_read_ahead)
        .page_bytes(default_page);
    b = b.with_env_vars(&env)?;
    if !has("STRATA_BUFFER_SIZE") {
        b = b.buffer_bytes(buffer);
    }
    if let Some(p) = page_size {
        b = b.page_bytes(p);
    }
    if let Some(n) = fillers {
        b = b.fillers(n);
    }
    if let Some(n) = evictors {
        b = b.evictors(n);
    }
    if let Some(n) = read_ahead {
        b = b.read_ahead(n);
    }
    Ok(b.build()?)
}

/// Turns `--store`, `--codec` and `--token` into a store configuration. `file` alone means a
/// temporary file, returned so the caller removes it when done.
fn store_config(
    store: &str,
    codec: CodecKind,
    token: Option<&String>,
) -> anyhow::Result<(StoreConfig, Option<crate::cleanup::Temporary>)> {
    let (kind, temp) = if store == "file" {
        let dir = std::env::temp_dir();
        crate::cleanup::remove_stale(&dir);
        let p = crate::cleanup::temporary_name(&dir, "stream", "bin");
        (
            StoreKind::File { path: p.clone() },
            Some(crate::cleanup::Temporary::register(p)),
        )
    } else {
        let kind: StoreKind = store.parse().with_context(|| {
            format!(
                "--store {store:?} not understood; write memory, file, file:PATH or remote:HOST:PORT[,HOST:PORT...]"
            )
        })?;
        (kind, None)
    };
    let mut b = StoreConfig::builder().with_env()?;
    b = b.kind(kind.clone()).codec(codec).grow(true);
    if let Some(t) = token {
        b = b.token(t.clone());
    }
    let built = b.build();
    if matches!(kind, StoreKind::Remote { .. })
        && matches!(built, Err(strata_core::ConfigError::Missing(_)))
    {
        anyhow::bail!(
            "--store {store} is a remote store, which needs the memory nodes' token: pass --token TOKEN or set STRATA_REMOTE_TOKEN (`strata serve` prints the token when it starts)"
        );
    }
    Ok((built?, temp))
}

/// Opens the store of `config` with codec pages of `page_bytes`.
fn open_store(config: &StoreConfig, size: u64, page_bytes: u64) -> anyhow::Result<Arc<dyn Store>> {
    strata_net::open_store_with_page(config, size, page_bytes)
        .with_context(|| format!("cannot open the {} store", store_label(config)))
}

/// A short name of a store configuration for tables: `file`, `remote+lz4`, ...
fn store_label(config: &StoreConfig) -> String {
    let kind = match &config.kind {
        StoreKind::Memory => "memory",
        StoreKind::File { .. } => "file",
        StoreKind::Remote { .. } => "remote",
    };
    match config.codec {
        CodecKind::None => kind.into(),
        CodecKind::Lz4 => format!("{kind}+lz4"),
        CodecKind::Zfp { tolerance } => format!("{kind}+zfp:{tolerance}"),
    }
}

fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

fn print_stream(label: &str, r: &StreamReport) {
    println!("{label}");
    println!(
        "  {:<8} {:>12} {:>12} {:>10}",
        "kernel", "best MB/s", "median MB/s", "best s"
    );
    for k in &r.kernels {
        let best_s = k.seconds.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "  {:<8} {:>12.1} {:>12.1} {:>10.4}",
            k.kernel.name(),
            k.best_bytes_per_sec / 1e6,
            k.median_bytes_per_sec / 1e6,
            best_s
        );
    }
}

/// The chart of `strata bench stream`: per kernel, the pager region's bandwidth over the same
/// code's on ordinary memory, and as a fraction of this machine's host memory read rate.
fn stream_chart(
    report: &StreamReport,
    dram: Option<&StreamReport>,
    record: &Record,
    store: &str,
) -> crate::plot::Chart {
    let host = record
        .ceilings
        .values
        .as_ref()
        .and_then(|c| c.get("host-memory-read"));
    let groups = report
        .kernels
        .iter()
        .map(|k| {
            let base = dram.and_then(|d| d.kernels.iter().find(|b| b.kernel == k.kernel));
            crate::plot::Group {
                label: format!("{:?}", k.kernel).to_lowercase(),
                speedups: vec![base.map(|b| k.median_bytes_per_sec / b.median_bytes_per_sec)],
                ceiling: host.map(|h| {
                    (
                        k.median_bytes_per_sec / (h * 1e9),
                        format!("{h:.1} GB/s host memory read"),
                    )
                }),
            }
        })
        .collect();
    crate::plot::Chart {
        title: format!(
            "strata bench stream: {} elements per array through a pager region over {store}",
            report.config.elements
        ),
        subtitle: record.subtitle(),
        baselines: vec!["the same code on ordinary memory (DRAM)".into()],
        groups,
        no_ceilings: host.is_none().then(|| record.ceilings.source.clone()),
        mark_missing: true,
    }
}

/// Runs `strata bench stream`.
pub fn stream(args: &StreamArgs) -> anyhow::Result<()> {
    let cpus = strata_core::config::available_cpus();
    let threads = args.threads.unwrap_or(cpus);
    let buffer = args.buffer.unwrap_or(args.size / 4);
    let config = pager_config(
        args.page_size,
        buffer,
        args.fillers,
        args.evictors,
        args.read_ahead,
        2,
        1 << 20,
    )?;
    let cfg = StreamConfig::for_bytes(args.size, args.iterations, threads);
    anyhow::ensure!(
        cfg.elements > 0,
        "--size {} is too small for STREAM; use at least 24 bytes (realistically 64MiB or more)",
        args.size
    );
    let store_spec = match (&args.file, args.store.as_str()) {
        (Some(path), "file") => format!("file:{}", path.display()),
        (Some(_), other) => {
            anyhow::bail!("--file goes with a file store, not --store {other}; drop one of them")
        }
        (None, spec) => spec.to_string(),
    };
    let (store_config, _temp) = store_config(&store_spec, args.codec, args.token.as_ref())?;
    let store = open_store(&store_config, args.size, config.page_bytes)?;
    println!(
        "STREAM over a pager region: {} region ({} per array), buffer {} ({:.0}% of the region), page {}, {} fillers, {} evictors, read-ahead {}, {:?} eviction, {} threads",
        format_size(cfg.bytes()),
        format_size(cfg.elements as u64 * 8),
        format_size(config.buffer_bytes),
        config.buffer_bytes as f64 * 100.0 / cfg.bytes() as f64,
        format_size(config.page_bytes),
        config.fillers,
        config.evictors,
        config.read_ahead,
        args.policy,
        threads,
    );
    let store_described = store.describe();
    println!("store: {store_described}");
    let region = Region::builder(store, args.size)
        .config(config)
        .policy(args.policy)
        .build()
        .context("cannot create the pager region")?;
    let bar = progress_bar(2 + 4 * args.iterations as u64, "stream");
    let started = Instant::now();
    let report = run_stream(&region, &cfg, &mut |p| {
        bar.set_position(p.done);
        bar.set_message(p.step);
    });
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let report = report?;
    let flush_started = Instant::now();
    region.flush().context("flushing the region")?;
    let flush_s = flush_started.elapsed().as_secs_f64();
    print_stream(
        &format!(
            "Strata pager ({} s in total, validated {} elements)",
            format_args!("{wall:.1}"),
            report.checked_elements
        ),
        &report,
    );
    let mut stats = region.stats();
    // The pager sees faults, not accesses: count as hits the page touches STREAM made that
    // did not fault (init 3 arrays, 10 array passes per iteration, validation 3 arrays).
    let pages_per_array = (cfg.elements as u64 * 8).div_ceil(region.config().page_bytes);
    let touches = pages_per_array * (6 + 10 * args.iterations as u64);
    stats.hits = touches.saturating_sub(stats.faults);
    let counters = region.counters();
    println!("pager statistics (hits estimated as page touches without a fault):\n{stats}");
    println!(
        "  write faults {}  re-faults {}  read-ahead pages {}  direct reclaims {}  flush {:.2} s",
        counters.write_faults,
        counters.refaults,
        counters.read_ahead_pages,
        counters.direct_reclaims,
        flush_s
    );
    let baseline = if args.no_baseline {
        None
    } else {
        let mut mem = vec![0f64; 3 * cfg.elements];
        let bar = progress_bar(2 + 4 * args.iterations as u64, "dram  ");
        // SAFETY: `mem` holds 3 * elements doubles and is exclusively ours for the call.
        let r = unsafe {
            run_stream_raw(mem.as_mut_ptr().cast(), cfg.bytes(), &cfg, &mut |p| {
                bar.set_position(p.done)
            })
        };
        bar.finish_and_clear();
        let r = r?;
        print_stream("DRAM baseline (same code, ordinary memory, no paging)", &r);
        println!("  ratio pager/DRAM (best triad): {:.3}", ratio(&report, &r));
        Some(r)
    };
    let json = serde_json::json!({
        "pager": report,
        "dram_baseline": baseline,
        "stats": stats,
        "counters": counters,
        "config": region.config(),
        "wall_seconds": wall,
    });
    let ceilings = crate::ceilings::for_run(false, &std::env::temp_dir(), &mut |line| {
        eprintln!("{line}")
    });
    let record = Record::new("stream", None, ceilings, json);
    if let Some(path) = &args.json {
        record
            .write(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let chart = stream_chart(&report, baseline.as_ref(), &record, &store_described);
    let (svg, png) = crate::plot::write(&chart, &args.plot)?;
    println!("wrote {} and {}", svg.display(), png.display());
    region.unmap().map_err(|e| anyhow::anyhow!("{}", e.error))?;
    Ok(())
}

fn ratio(a: &StreamReport, b: &StreamReport) -> f64 {
    let triad = |r: &StreamReport| r.kernels.last().map_or(0.0, |k| k.best_bytes_per_sec);
    triad(a) / triad(b).max(1e-9)
}

/// Arguments of `strata bench pager`.
#[derive(Debug, clap::Args)]
pub struct PagerBenchArgs {
    /// Bytes of the file (and of each region) the runs page through.
    #[arg(long, default_value = "256MiB", value_parser = size_arg)]
    size: u64,
    /// Memory limit for both contestants: the pager's buffer, and the kernel's memory cgroup.
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    limit: u64,
    /// Page sizes to sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,2MiB", value_parser = size_arg)]
    page_sizes: Vec<u64>,
    /// Filler counts to sweep (comma-separated; default 1 and the CPU count).
    #[arg(long, value_delimiter = ',')]
    fillers: Vec<usize>,
    /// Threads touching the memory.
    #[arg(long)]
    threads: Option<usize>,
    /// Access patterns to run (comma-separated: seq, random, skewed).
    #[arg(long, value_delimiter = ',', default_value = "seq,random")]
    access: Vec<Access>,
    /// Eviction policies to compare (comma-separated: clock, fifo).
    #[arg(long, value_delimiter = ',', default_value = "clock")]
    policy: Vec<EvictionPolicy>,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// How the kernel's mmap is held to --limit: auto, cgroup2, cgroup1, none.
    #[arg(long, default_value = "auto")]
    limit_method: LimitMethod,
    /// Small sizes and one repetition: a smoke run in seconds.
    #[arg(long)]
    quick: bool,
    /// Directory for the data file (default: the system temp directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write results as JSON here (default strata-bench-pager.json).
    #[arg(long, default_value = "strata-bench-pager.json")]
    json: PathBuf,
    /// Write the plot here (SVG, and a PNG beside it).
    #[arg(long, default_value = "strata-bench-pager.svg")]
    svg: PathBuf,
    /// A further store to measure beside the memory and file stores: memory, file:PATH or
    /// remote:HOST:PORT[,HOST:PORT...] (needs --token or STRATA_REMOTE_TOKEN). Opened afresh
    /// for each page size (codec pages follow the pager's page) and filled with the test data.
    #[arg(long)]
    store: Option<String>,
    /// Codec of the --store store: none, lz4 or zfp:TOLERANCE (alone, it applies to a memory
    /// store).
    #[arg(long)]
    codec: Option<CodecKind>,
    /// Token of the memory nodes for a remote --store (default STRATA_REMOTE_TOKEN).
    #[arg(long)]
    token: Option<String>,
    /// Internal: run as the kernel-mmap child (used by the benchmark itself).
    #[arg(long, hide = true)]
    mmap_child: Option<String>,
}

/// Runs `strata bench pager`.
pub fn bench(args: &PagerBenchArgs) -> anyhow::Result<()> {
    if let Some(spec) = &args.mmap_child {
        return pbench::mmap_child_main(spec).map_err(Into::into);
    }
    let cpus = strata_core::config::available_cpus();
    let mut fillers = args.fillers.clone();
    if fillers.is_empty() {
        fillers = vec![1];
        if cpus > 1 {
            fillers.push(cpus);
        }
    }
    let mut plan = BenchPlan {
        size: args.size,
        limit: args.limit,
        page_sizes: args.page_sizes.clone(),
        fillers,
        threads: args.threads.unwrap_or(cpus),
        access: args.access.clone(),
        policies: args.policy.clone(),
        repeat: args.repeat.max(1),
        limit_method: args.limit_method,
        dir: args.dir.clone().unwrap_or_else(std::env::temp_dir),
        self_exe: std::env::current_exe().context("locating the strata binary")?,
        extra_store: None,
    };
    if args.store.is_some() || args.codec.is_some() {
        let spec = args.store.as_deref().unwrap_or("memory");
        anyhow::ensure!(
            spec != "file",
            "--store file needs a path here: write --store file:PATH (the plain file store is measured anyway)"
        );
        let codec = args.codec.unwrap_or(CodecKind::None);
        let (config, _) = store_config(spec, codec, args.token.as_ref())?;
        let label = store_label(&config);
        plan.extra_store = Some(ExtraStore {
            label,
            open: Arc::new(move |page, size| {
                strata_net::open_store_with_page(&config, size, page).map_err(|e| e.to_string())
            }),
        });
    }
    if args.quick {
        plan.size = plan.size.min(32 << 20);
        plan.limit = plan.limit.min(8 << 20);
        plan.repeat = 1;
    }
    let results = pbench::run(&plan, &mut |line| eprintln!("{line}"))?;
    println!("{}", pbench::table(&results));
    let ceilings = crate::ceilings::for_run(false, &plan.dir, &mut |line| eprintln!("{line}"));
    let record = Record::new("pager", None, ceilings, serde_json::to_value(&results)?);
    record
        .write(&args.json)
        .with_context(|| format!("writing {}", args.json.display()))?;
    let (svg, png) = crate::plot::write(&pbench::chart(&results, &record), &args.svg)?;
    println!(
        "wrote {}, {} and {}",
        args.json.display(),
        svg.display(),
        png.display()
    );
    Ok(())
}
