//! `strata bench remote`: raw store throughput against a memory node started in-process,
//! codecs over a rate-limited link, and STREAM through a pager region over the node.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::net::{PageData, Throughput, loopback_tcp_ceiling, median, page_throughput};
use crate::stream::{Kernel, StreamConfig, run_stream, run_stream_raw};
use anyhow::Context as _;
use strata_codec::CompressedStore;
use strata_core::config::{CodecKind, StoreConfig};
use strata_core::{MemoryStore, PagerConfig, Store, format_size, parse_size};
use strata_net::{AccessPath, MemoryNode, RemoteStore, RemoteStoreOptions, ServeOptions};
use strata_pager::Region;

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Arguments of `strata bench remote`.
#[derive(Debug, clap::Args)]
pub struct RemoteBenchArgs {
    /// Bytes of the pager region holding STREAM's arrays.
    #[arg(long, default_value = "192MiB", value_parser = size_arg)]
    size: u64,
    /// Resident-set budget of the region (default: a quarter of --size).
    #[arg(long, value_parser = size_arg)]
    buffer: Option<u64>,
    /// Page size of the region, the codec and the raw measurements.
    #[arg(long, default_value = "64KiB", value_parser = size_arg)]
    page_size: u64,
    /// Filler counts to sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    fillers: Vec<usize>,
    /// Evictor counts to sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    evictors: Vec<usize>,
    /// Codecs to sweep (none, lz4, zfp:TOLERANCE).
    #[arg(long, value_delimiter = ',', default_value = "none,lz4,zfp:1e-6")]
    codecs: Vec<String>,
    /// Timed STREAM iterations (the first is warm-up).
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// STREAM threads (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Store size for the raw page measurements.
    #[arg(long, default_value = "128MiB", value_parser = size_arg)]
    raw_size: u64,
    /// Pages per batch for the raw measurements.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Threads issuing batches at once in the raw measurements (like a pager's fillers).
    #[arg(long, default_value_t = 2)]
    submitters: usize,
    /// Repeats of each raw measurement (median reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Emulated link rate per direction, bytes per second, for the codec comparison.
    #[arg(long, default_value = "100MiB", value_parser = size_arg)]
    link_rate: u64,
    /// UCX transports for the in-process node and the clients.
    #[arg(long, default_value = "tcp")]
    transports: String,
    /// Use this running memory node (`strata serve`) instead of one started in-process; its
    /// token comes from --token or STRATA_REMOTE_TOKEN.
    #[arg(long)]
    node: Option<String>,
    /// Token of the --node memory node.
    #[arg(long)]
    token: Option<String>,
    /// Skip the pager STREAM and scan sweeps (raw measurements only).
    #[arg(long)]
    raw_only: bool,
    /// Skip the raw measurements.
    #[arg(long)]
    skip_raw: bool,
    /// Write the results as JSON here.
    #[arg(long, default_value = "remote-bench.json")]
    json: PathBuf,
    /// Write an SVG plot here.
    #[arg(long, default_value = "remote-bench.svg")]
    svg: PathBuf,
}

#[derive(Debug, serde::Serialize)]
struct RawRow {
    store: String,
    access: String,
    codec: String,
    data: PageData,
    depth: usize,
    /// Threads issuing batches at once.
    submitters: usize,
    link_bytes_per_sec: Option<u64>,
    #[serde(flatten)]
    throughput: Throughput,
    /// Network payload bytes per logical byte read (1.0 without a codec).
    network_bytes_per_byte_read: f64,
}

#[derive(Debug, serde::Serialize)]
struct PagerRow {
    workload: &'static str,
    codec: String,
    data: &'static str,
    fillers: usize,
    evictors: usize,
    /// STREAM: median bytes/s per kernel (copy, scale, add, triad); scan: one value.
    bytes_per_sec: Vec<(String, f64)>,
    network_bytes_received: u64,
    network_bytes_sent: u64,
    logical_bytes: u64,
    seconds: f64,
    error: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    host_cpus: usize,
    transports: String,
    page_bytes: u64,
    loopback_tcp_bytes_per_sec: f64,
    raw: Vec<RawRow>,
    dram_stream_bytes_per_sec: Vec<(String, f64)>,
    pager: Vec<PagerRow>,
    notes: Vec<String>,
}

const TOKEN: &str = "strata-bench-remote";

/// The memory node the benchmark talks to: its address and token.
#[derive(Debug, Clone)]
struct Target {
    address: String,
    token: String,
}

fn remote_options(node: &Target, args: &RemoteBenchArgs, stripe: u64) -> RemoteStoreOptions {
    let mut o = RemoteStoreOptions::new(
        vec![node.address.clone()],
        node.token.clone(),
        Duration::from_secs(30),
    );
    o.transports = Some(args.transports.clone());
    o.stripe_bytes = stripe;
    o.max_in_flight = (args.depth * args.submitters).max(1);
    o
}

/// A remote store (kept for its counters) and the store to use (possibly compressed).
fn open(
    node: &Target,
    args: &RemoteBenchArgs,
    codec: CodecKind,
    size: u64,
    access: AccessPath,
    link: Option<u64>,
) -> anyhow::Result<(Arc<RemoteStore>, Arc<dyn Store>)> {
    let page = args.page_size;
    let (inner_size, stripe) = match codec {
        CodecKind::None => (size, page),
        _ => (
            CompressedStore::inner_size(size, page)?,
            CompressedStore::slot_bytes(page),
        ),
    };
    let mut o = remote_options(node, args, stripe);
    o.access = access;
    o.link_bytes_per_sec = link;
    let remote = Arc::new(RemoteStore::connect(inner_size, o)?);
    let store: Arc<dyn Store> = match codec {
        CodecKind::None => remote.clone(),
        codec => Arc::new(CompressedStore::new(remote.clone(), codec, page, size)?),
    };
    Ok((remote, store))
}

fn codec_name(codec: CodecKind) -> String {
    match codec {
        CodecKind::None => "none".into(),
        CodecKind::Lz4 => "lz4".into(),
        CodecKind::Zfp { tolerance } => format!("zfp:{tolerance:e}"),
    }
}

fn mbs(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1e6
}

impl RemoteBenchArgs {
    /// Refuses arguments the measurements cannot use, with what to write instead.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.page_size >= 4096 && self.page_size.is_power_of_two() && self.page_size <= 2 << 20,
            "--page-size {} is not a pager page size; use a power of two from 4KiB to 2MiB (e.g. 64KiB)",
            self.page_size
        );
        anyhow::ensure!(
            self.depth >= 1,
            "--depth must be at least 1 (pages per batch)"
        );
        anyhow::ensure!(
            self.submitters >= 1 && self.repeats >= 1 && self.iterations >= 1,
            "--submitters, --repeats and --iterations must be at least 1"
        );
        anyhow::ensure!(
            self.fillers.iter().all(|&f| f >= 1) && self.evictors.iter().all(|&e| e >= 1),
            "--fillers and --evictors need counts of at least 1"
        );
        anyhow::ensure!(
            self.raw_size >= self.page_size && self.size >= self.page_size,
            "--size and --raw-size must hold at least one page of --page-size"
        );
        Ok(())
    }
}

/// Runs `strata bench remote`.
pub fn bench(args: &RemoteBenchArgs) -> anyhow::Result<()> {
    args.check()?;
    let page = usize::try_from(args.page_size)?;
    let codecs: Vec<CodecKind> = args
        .codecs
        .iter()
        .map(|c| c.parse::<CodecKind>())
        .collect::<Result<_, _>>()?;
    // The low 64 bits of the clock in nanoseconds vary per run, which is all a seed needs.
    let seed = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
            & u128::from(u64::MAX),
    )?;
    let capacity = 4 * (args.size.max(args.raw_size) + (64 << 20));
    let (local, target) = match &args.node {
        None => {
            let mut opts = ServeOptions::new("127.0.0.1:0".parse()?, capacity, TOKEN);
            opts.transports = Some(args.transports.clone());
            let node = MemoryNode::start(opts)?;
            let target = Target {
                address: node.address().to_string(),
                token: TOKEN.into(),
            };
            (Some(node), target)
        }
        Some(address) => {
            let token = match &args.token {
                Some(t) => t.clone(),
                None => StoreConfig::builder()
                    .with_env()?
                    .build()
                    .ok()
                    .and_then(|c| c.token)
                    .context(
                        "--node needs the node's token: pass --token or set STRATA_REMOTE_TOKEN",
                    )?,
            };
            let target = Target {
                address: address.clone(),
                token,
            };
            (None, target)
        }
    };
    let cpus = strata_core::config::available_cpus();
    println!(
        "remote memory benchmark: memory node on {} (UCX transports {}), {} CPUs, pages of {}, seed {seed}",
        target.address,
        args.transports,
        cpus,
        format_size(args.page_size)
    );
    let ceiling = loopback_tcp_ceiling(Duration::from_secs(1))?;
    println!(
        "ceiling: one TCP connection over 127.0.0.1 moves {:.0} MB/s on this host",
        mbs(ceiling)
    );
    let mut report = Report {
        host_cpus: cpus,
        transports: args.transports.clone(),
        page_bytes: args.page_size,
        loopback_tcp_bytes_per_sec: ceiling,
        raw: Vec::new(),
        dram_stream_bytes_per_sec: Vec::new(),
        pager: Vec::new(),
        notes: Vec::new(),
    };
    if !args.skip_raw {
        raw_measurements(args, &target, page, seed, ceiling, &mut report)?;
    }
    if !args.raw_only {
        pager_measurements(args, &target, &codecs, seed, &mut report)?;
    }
    let ceilings = crate::ceilings::for_run(false, &std::env::temp_dir(), &mut |line| {
        eprintln!("{line}")
    });
    let record =
        crate::record::Record::new("remote", None, ceilings, serde_json::to_value(&report)?);
    record
        .write(&args.json)
        .with_context(|| format!("write {}", args.json.display()))?;
    let (svg, png) = crate::plot::write(&chart(&report, &record), &args.svg)?;
    println!(
        "wrote {}, {} and {}",
        args.json.display(),
        svg.display(),
        png.display()
    );
    if let Some(node) = local {
        node.shutdown();
    }
    Ok(())
}

fn raw_measurements(
    args: &RemoteBenchArgs,
    node: &Target,
    page: usize,
    seed: u64,
    ceiling: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    println!(
        "\nraw page throughput of the store ({} pages, random read order, every page verified)",
        format_size(args.page_size)
    );
    println!(
        "  {:<44} {:>7} {:>10} {:>10} {:>9} {:>7} {:>8}",
        "store [data]", "depth", "read MB/s", "write MB/s", "us/page", "of TCP", "net B/B"
    );
    println!("  (depth = pages per batch x threads issuing batches; us/page = batch time / pages)");
    let print = |r: &RawRow| {
        println!(
            "  {:<44} {:>7} {:>10.0} {:>10.0} {:>9.1} {:>6.0}% {:>8.2}",
            format!("{} [{:?}]", r.store, r.data),
            format!("{}x{}", r.depth, r.submitters),
            mbs(r.throughput.read_bytes_per_sec),
            mbs(r.throughput.write_bytes_per_sec),
            r.throughput.read_us_per_page,
            100.0 * r.throughput.read_bytes_per_sec / ceiling,
            r.network_bytes_per_byte_read
        );
    };
    let baseline = MemoryStore::new(args.raw_size);
    let t = page_throughput(
        &baseline,
        page,
        args.depth,
        args.submitters,
        args.repeats,
        PageData::Random,
        seed,
    )?;
    let row = RawRow {
        store: "memory store (baseline, no network)".into(),
        access: "-".into(),
        codec: "none".into(),
        data: PageData::Random,
        depth: args.depth,
        submitters: args.submitters,
        link_bytes_per_sec: None,
        throughput: t,
        network_bytes_per_byte_read: 0.0,
    };
    print(&row);
    report.raw.push(row);
    // Messages only: a node offers one-sided access only on InfiniBand/RoCE transports and
    // when started with --one-sided (software RMA over TCP/shm would trust client addresses).
    for access in [AccessPath::Messages] {
        for depth in [1, args.depth] {
            // Depth-1 runs are latency-bound: a smaller store keeps them short.
            let size = if depth == 1 {
                args.raw_size.min(16 << 20)
            } else {
                args.raw_size
            };
            let (_remote, store) = open(node, args, CodecKind::None, size, access, None)?;
            // Depth 1 from one thread is the pure round-trip latency.
            let submitters = if depth == 1 { 1 } else { args.submitters };
            let t = page_throughput(
                store.as_ref(),
                page,
                depth,
                submitters,
                args.repeats,
                PageData::Random,
                seed,
            )?;
            let (store_name, access_name) = match access {
                AccessPath::Messages => ("remote, active messages", "messages"),
                AccessPath::OneSided => ("remote, one-sided get/put", "one-sided"),
            };
            let row = RawRow {
                store: store_name.into(),
                access: access_name.into(),
                codec: "none".into(),
                data: PageData::Random,
                depth,
                submitters,
                link_bytes_per_sec: None,
                throughput: t,
                network_bytes_per_byte_read: 1.0,
            };
            print(&row);
            report.raw.push(row);
        }
    }
    // Codecs when the link is the bottleneck (emulated rate in each direction).
    let link = Some(args.link_rate);
    for (codec, data) in [
        (CodecKind::None, PageData::Text),
        (CodecKind::Lz4, PageData::Text),
        (CodecKind::None, PageData::Random),
        (CodecKind::Lz4, PageData::Random),
        (CodecKind::None, PageData::Floats),
        (CodecKind::Zfp { tolerance: 1e-6 }, PageData::Floats),
    ] {
        let size = args.raw_size.min(64 << 20);
        let (remote, store) = open(node, args, codec, size, AccessPath::Messages, link)?;
        let before = remote.counters().bytes_received.load(Ordering::Relaxed);
        let t = if matches!(codec, CodecKind::Zfp { .. }) {
            // Lossy pages do not read back bit for bit: measure without the check (the
            // error bound itself is tested in strata-codec).
            lossy_throughput(store.as_ref(), page, args.depth, args.repeats, data, seed)?
        } else {
            page_throughput(
                store.as_ref(),
                page,
                args.depth,
                args.submitters,
                args.repeats,
                data,
                seed,
            )?
        };
        let moved = remote.counters().bytes_received.load(Ordering::Relaxed) - before;
        let logical = (size / args.page_size * args.page_size) * args.repeats.max(1) as u64;
        let row = RawRow {
            store: format!(
                "remote, {}/s link, {}",
                format_size(args.link_rate),
                codec_name(codec)
            ),
            access: "messages".into(),
            codec: codec_name(codec),
            data,
            depth: args.depth,
            submitters: if matches!(codec, CodecKind::Zfp { .. }) {
                1
            } else {
                args.submitters
            },
            link_bytes_per_sec: link,
            throughput: t,
            network_bytes_per_byte_read: moved as f64 / logical as f64,
        };
        print(&row);
        report.raw.push(row);
    }
    let find = |codec: &str, data: PageData| {
        report
            .raw
            .iter()
            .find(|r| r.link_bytes_per_sec.is_some() && r.codec == codec && r.data == data)
            .map(|r| r.throughput.read_bytes_per_sec)
    };
    for (codec, data) in [("lz4", PageData::Text), ("lz4", PageData::Random)] {
        if let (Some(with), Some(without)) = (find(codec, data), find("none", data)) {
            let line = format!(
                "{codec} on {data:?} pages over an emulated {}/s link: {:.0} vs {:.0} MB/s uncompressed = {:.2}x",
                format_size(args.link_rate),
                mbs(with),
                mbs(without),
                with / without
            );
            println!("{line}");
            report.notes.push(line);
        }
    }
    Ok(())
}

/// Writes every whole page of `store` with `data`'s pattern, `depth` pages per batch.
fn write_pattern(
    store: &dyn Store,
    page: usize,
    depth: usize,
    data: PageData,
    seed: u64,
) -> anyhow::Result<()> {
    let pages = store.size() / page as u64;
    let mut image = vec![0u8; page];
    for chunk in (0..pages).collect::<Vec<_>>().chunks(depth) {
        let images: Vec<Vec<u8>> = chunk
            .iter()
            .map(|i| {
                data.fill(&mut image, *i, seed);
                image.clone()
            })
            .collect();
        let requests: Vec<(u64, &[u8])> = chunk
            .iter()
            .zip(&images)
            .map(|(i, b)| (i * page as u64, b.as_slice()))
            .collect();
        store.write_batch(&requests)?;
    }
    Ok(())
}

/// Read throughput without bit-for-bit verification (for lossy codecs).
fn lossy_throughput(
    store: &dyn Store,
    page: usize,
    depth: usize,
    repeats: usize,
    data: PageData,
    seed: u64,
) -> anyhow::Result<Throughput> {
    let pages = store.size() / page as u64;
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    let mut per_page = Vec::new();
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        write_pattern(store, page, depth, data, seed)?;
        writes.push((pages * page as u64) as f64 / started.elapsed().as_secs_f64());
        let mut bufs: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; page]).collect();
        let started = Instant::now();
        for chunk in (0..pages).collect::<Vec<_>>().chunks(depth) {
            let t = Instant::now();
            let mut requests: Vec<strata_core::store::ReadRequest<'_>> = chunk
                .iter()
                .zip(bufs.iter_mut())
                .map(|(i, b)| strata_core::store::ReadRequest {
                    offset: i * page as u64,
                    buf: b.as_mut_slice(),
                })
                .collect();
            store.read_batch(&mut requests)?;
            per_page.push(t.elapsed().as_secs_f64() * 1e6 / chunk.len() as f64);
        }
        reads.push((pages * page as u64) as f64 / started.elapsed().as_secs_f64());
    }
    Ok(Throughput {
        write_samples: writes.clone(),
        read_samples: reads.clone(),
        write_bytes_per_sec: median(&mut writes),
        read_bytes_per_sec: median(&mut reads),
        read_us_per_page: median(&mut per_page),
    })
}

fn pager_config(
    args: &RemoteBenchArgs,
    fillers: usize,
    evictors: usize,
) -> anyhow::Result<PagerConfig> {
    Ok(PagerConfig::builder()
        .page_bytes(args.page_size)
        .buffer_bytes(args.buffer.unwrap_or(args.size / 4))
        .fillers(fillers)
        .evictors(evictors)
        .read_ahead(4)
        .build()?)
}

fn pager_measurements(
    args: &RemoteBenchArgs,
    node: &Target,
    codecs: &[CodecKind],
    seed: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(strata_core::config::available_cpus);
    let cfg = StreamConfig::for_bytes(args.size, args.iterations, threads);
    // Baseline: the same STREAM code over plain DRAM of the same size.
    let mut dram = vec![0u64; usize::try_from(args.size / 8)?];
    // SAFETY: `dram` is a live, 8-byte aligned buffer of args.size bytes used only here.
    let base =
        unsafe { run_stream_raw(dram.as_mut_ptr().cast::<u8>(), args.size, &cfg, &mut |_| {}) }?;
    drop(dram);
    report.dram_stream_bytes_per_sec = base
        .kernels
        .iter()
        .map(|k| (k.kernel.name().to_string(), k.median_bytes_per_sec))
        .collect();
    let dram_triad = base
        .kernels
        .iter()
        .find(|k| k.kernel == Kernel::Triad)
        .map_or(0.0, |k| k.median_bytes_per_sec);
    println!(
        "\nSTREAM through a pager region on the memory node: region {}, buffer {}, page {}, {} threads; DRAM triad {:.0} MB/s",
        format_size(cfg.bytes()),
        format_size(args.buffer.unwrap_or(args.size / 4)),
        format_size(args.page_size),
        threads,
        mbs(dram_triad)
    );
    println!(
        "  {:<12} {:>7} {:>8} {:>10} {:>10} {:>9} {:>12} {:>12}",
        "codec", "fillers", "evictors", "copy MB/s", "triad MB/s", "of DRAM", "net in", "net out"
    );
    // Baseline: the same pager over a local memory store (what the region costs without the
    // network), at the largest filler count and one evictor.
    let most = args.fillers.iter().max().copied().unwrap_or(1);
    let row = stream_row(args, None, CodecKind::None, most, 1, &cfg)?;
    print_pager_row(&row, dram_triad);
    report.pager.push(row);
    for codec in codecs {
        for &fillers in &args.fillers {
            for &evictors in &args.evictors {
                let row = stream_row(args, Some(node), *codec, fillers, evictors, &cfg)?;
                print_pager_row(&row, dram_triad);
                report.pager.push(row);
            }
        }
    }
    println!(
        "\nsequential scan through the pager (compressible vs incompressible pages), fillers {}, 1 evictor, median of {}",
        args.fillers.iter().max().copied().unwrap_or(1),
        args.repeats.max(1)
    );
    for codec in codecs {
        for data in [PageData::Text, PageData::Random, PageData::Floats] {
            let fillers = args.fillers.iter().max().copied().unwrap_or(1);
            let row = scan_row(args, node, *codec, data, fillers, seed)?;
            print_pager_row(&row, 0.0);
            report.pager.push(row);
        }
    }
    Ok(())
}

fn print_pager_row(row: &PagerRow, dram_triad: f64) {
    let get = |name: &str| {
        row.bytes_per_sec
            .iter()
            .find(|(k, _)| k == name)
            .map_or(0.0, |(_, v)| *v)
    };
    if let Some(e) = &row.error {
        println!(
            "  {:<12} {:>7} {:>8}  failed: {e}",
            row.codec, row.fillers, row.evictors
        );
        return;
    }
    if row.workload == "stream" {
        println!(
            "  {:<12} {:>7} {:>8} {:>10.0} {:>10.0} {:>8.1}% {:>12} {:>12}",
            row.codec,
            row.fillers,
            row.evictors,
            mbs(get("copy")),
            mbs(get("triad")),
            100.0 * get("triad") / dram_triad.max(1.0),
            format_size(row.network_bytes_received),
            format_size(row.network_bytes_sent)
        );
    } else {
        println!(
            "  {:<12} {:<8} {:>10.0} MB/s, {} over the network for {} of pages ({:.2} B/B)",
            row.codec,
            row.data,
            mbs(get("scan")),
            format_size(row.network_bytes_received),
            format_size(row.logical_bytes),
            row.network_bytes_received as f64 / row.logical_bytes.max(1) as f64
        );
    }
}

/// One STREAM run through a pager region over the memory node, or (`node` None, the
/// baseline) over a local memory store with the same pager settings.
fn stream_row(
    args: &RemoteBenchArgs,
    node: Option<&Target>,
    codec: CodecKind,
    fillers: usize,
    evictors: usize,
    cfg: &StreamConfig,
) -> anyhow::Result<PagerRow> {
    let (remote, store) = match node {
        Some(node) => {
            let (remote, store) = open(node, args, codec, args.size, AccessPath::Messages, None)?;
            (Some(remote), store)
        }
        None => (
            None,
            Arc::new(MemoryStore::new(args.size)) as Arc<dyn Store>,
        ),
    };
    let config = pager_config(args, fillers, evictors)?;
    let started = Instant::now();
    let region = Region::new(store, args.size, config)?;
    let outcome = run_stream(&region, cfg, &mut |_| {});
    let flushed = region.unmap().map_err(|e| anyhow::anyhow!("{e}"));
    let counter = |pick: fn(&strata_net::NetworkCounters) -> u64| {
        remote.as_ref().map_or(0, |r| pick(r.counters()))
    };
    let mut row = PagerRow {
        workload: "stream",
        codec: if node.is_some() {
            codec_name(codec)
        } else {
            "local memory".into()
        },
        data: "stream-arrays",
        fillers,
        evictors,
        bytes_per_sec: Vec::new(),
        network_bytes_received: counter(|c| c.bytes_received.load(Ordering::Relaxed)),
        network_bytes_sent: counter(|c| c.bytes_sent.load(Ordering::Relaxed)),
        logical_bytes: 0,
        seconds: started.elapsed().as_secs_f64(),
        error: None,
    };
    match (outcome, flushed) {
        (Ok(r), Ok(())) => {
            row.logical_bytes = r
                .kernels
                .iter()
                .map(|k| k.bytes * k.seconds.len() as u64)
                .sum();
            row.bytes_per_sec = r
                .kernels
                .iter()
                .map(|k| (k.kernel.name().to_string(), k.median_bytes_per_sec))
                .collect();
        }
        (Err(e), _) => row.error = Some(e.to_string()),
        (_, Err(e)) => row.error = Some(e.to_string()),
    }
    Ok(row)
}

fn scan_row(
    args: &RemoteBenchArgs,
    node: &Target,
    codec: CodecKind,
    data: PageData,
    fillers: usize,
    seed: u64,
) -> anyhow::Result<PagerRow> {
    let size = args.size;
    let page = usize::try_from(args.page_size)?;
    let (remote, store) = open(node, args, codec, size, AccessPath::Messages, None)?;
    // Fill the store directly (not through the pager) so the scan only reads.
    write_pattern(store.as_ref(), page, 32, data, seed)?;
    let before = remote.counters().bytes_received.load(Ordering::Relaxed);
    let region = Region::new(store, size, pager_config(args, fillers, 1)?)?;
    let mut times = Vec::new();
    for _ in 0..args.repeats.max(1) {
        region.evict_all()?;
        let started = Instant::now();
        let mut sum = 0u64;
        for chunk in region.as_slice().chunks(4096) {
            sum = sum.wrapping_add(u64::from(chunk[0]));
        }
        times.push(started.elapsed().as_secs_f64());
        std::hint::black_box(sum);
    }
    let seconds = median(&mut times);
    let error = region.take_error().map(|e| e.to_string());
    drop(region);
    let moved = remote.counters().bytes_received.load(Ordering::Relaxed) - before;
    Ok(PagerRow {
        workload: "scan",
        codec: codec_name(codec),
        data: match data {
            PageData::Text => "text",
            PageData::Random => "random",
            PageData::Floats => "floats",
        },
        fillers,
        evictors: 1,
        bytes_per_sec: vec![("scan".into(), size as f64 / seconds)],
        network_bytes_received: moved,
        network_bytes_sent: 0,
        logical_bytes: size * args.repeats.max(1) as u64,
        seconds,
        error,
    })
}

/// The chart of `strata bench remote`: raw reads of each remote store over the local memory
/// store's (and, with a codec, over no codec on the same link and data), STREAM triad through
/// a pager over the node against the same pager over local memory; the second panel is each
/// rate as a fraction of one loopback TCP connection measured in the same run (the network
/// ceiling of this host), since the memory node is reached over it.
fn chart(report: &Report, record: &crate::record::Record) -> crate::plot::Chart {
    let tcp = report.loopback_tcp_bytes_per_sec;
    let of_tcp =
        |v: f64| (tcp > 0.0).then(|| (v / tcp, format!("{:.0} MB/s loopback TCP", tcp / 1e6)));
    let local = report
        .raw
        .iter()
        .find(|r| r.access == "-")
        .map(|r| r.throughput.read_bytes_per_sec);
    let mut groups = Vec::new();
    for r in report.raw.iter().filter(|r| r.access != "-") {
        let uncompressed = report
            .raw
            .iter()
            .find(|o| {
                o.codec == "none"
                    && r.codec != "none"
                    && o.data == r.data
                    && o.link_bytes_per_sec == r.link_bytes_per_sec
            })
            .map(|o| o.throughput.read_bytes_per_sec);
        let read = r.throughput.read_bytes_per_sec;
        let link = r
            .link_bytes_per_sec
            .map_or(String::new(), |l| format!(" {}/s link", format_size(l)));
        groups.push(crate::plot::Group {
            label: format!(
                "read {} {:?}\n{}x{}{link}",
                if r.codec == "none" {
                    r.access.clone()
                } else {
                    r.codec.clone()
                },
                r.data,
                r.depth,
                r.submitters
            ),
            speedups: vec![
                local.map(|l| read / l),
                uncompressed.map(|u| read / u),
                None,
            ],
            ceiling: of_tcp(read),
        });
    }
    let triad = |p: &PagerRow| {
        p.bytes_per_sec
            .iter()
            .find(|(k, _)| k == "triad")
            .map(|(_, v)| *v)
    };
    let local_triad = report
        .pager
        .iter()
        .find(|p| p.codec == "local memory")
        .and_then(triad);
    for p in report
        .pager
        .iter()
        .filter(|p| p.workload == "stream" && p.codec != "local memory")
    {
        let Some(t) = triad(p) else { continue };
        groups.push(crate::plot::Group {
            label: format!("STREAM triad {}\nf{} e{}", p.codec, p.fillers, p.evictors),
            speedups: vec![None, None, local_triad.map(|l| t / l)],
            ceiling: of_tcp(t),
        });
    }
    crate::plot::Chart {
        title: format!(
            "strata bench remote: {} pages over UCX {} to a memory node",
            format_size(report.page_bytes),
            report.transports
        ),
        subtitle: record.subtitle(),
        baselines: vec![
            "local memory store (no network)".into(),
            "no codec, same link and data".into(),
            "the same pager over local memory".into(),
        ],
        groups,
        no_ceilings: (tcp <= 0.0).then(|| "loopback TCP not measured".to_string()),
        mark_missing: false,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RemoteBenchArgs,
    }

    fn bench_with(extra: &[&str]) -> anyhow::Result<()> {
        let cli = Cli::try_parse_from([&["remote"], extra].concat()).expect("parses");
        bench(&cli.args)
    }

    #[test]
    fn zero_page_size_and_depth_are_clear_errors() {
        for (args, says) in [
            (&["--page-size", "0"][..], "--page-size"),
            (&["--page-size", "3000"][..], "--page-size"),
            (&["--depth", "0"][..], "--depth"),
            (&["--submitters", "0"][..], "--submitters"),
            (&["--fillers", "0"][..], "--fillers"),
        ] {
            let err = bench_with(args).expect_err("refused");
            assert!(err.to_string().contains(says), "{args:?}: {err}");
        }
    }
}
