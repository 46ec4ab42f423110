//! `strata bench gpu-micro`: GPU-driven paging against zero-copy, chunked copies and UVM.

use std::path::PathBuf;

use crate::gpu_micro::{ChartRow, MicroOptions, chart, format_row, run_micro};
use crate::record::{Device, Record};

/// Arguments of `strata bench gpu-micro`.
#[derive(Debug, clap::Args)]
pub struct GpuMicroArgs {
    /// GPU page-cache size of every space (e.g. 512MiB).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub cache: u64,
    /// Space sizes as multiples of the cache, comma-separated.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    pub ratios: Vec<u64>,
    /// Timed repetitions after one warm-up (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Random 8-byte gathers per run.
    #[arg(long, default_value_t = 1 << 22)]
    pub gathers: u64,
    /// Random 4 KiB page touches per run (64 KiB pages get a sixteenth).
    #[arg(long, default_value_t = 1 << 20)]
    pub touches: u64,
    /// Skip the UVM baseline.
    #[arg(long)]
    pub skip_uvm: bool,
    /// Only patterns starting with these names (stream-read, stream-rmw, touch-4k, touch-64k,
    /// cold-4k, gather-uniform, gather-zipf, rmw-random-4k, rmw-random-64k, stream-read/loop),
    /// comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub patterns: Vec<String>,
    /// Skip the ceilings (otherwise read from the cache, or probed first when there is none).
    #[arg(long)]
    pub no_ceilings: bool,
    /// Write results to PATH.json, PATH.svg and PATH.png.
    #[arg(long, default_value = "gpu-micro")]
    pub out: PathBuf,
    /// Spaces over a store (`--store`, `--codec`, `--file-io`, `--host-cache`).
    #[command(flatten)]
    pub store: crate::store_spec::SpaceStoreArgs,
    /// Borrow SIZE of GPU N's memory as every space's peer tier (a victim cache over NVLink),
    /// as N:SIZE, e.g. 1:8GiB; repeat for several lenders. Compare with a run without it.
    #[arg(long, value_parser = parse_peer)]
    pub peer: Vec<strata_gpu::space::PeerBorrow>,
    /// What element accesses do on pages not resident: off (always migrate), auto (the
    /// default), or the accesses after which a page migrates (2-65535). Compare runs.
    #[arg(long, value_parser = parse_remote)]
    pub remote_access: Option<strata_gpu::space::RemoteAccess>,
    /// Sub-page fetch: element accesses load sectors of SIZE (e.g. 4KiB; raised to a 32nd of
    /// the page, whole pages where fewer than 2 fit) instead of whole pages; `off` (the
    /// default) loads whole pages. Compare runs.
    #[arg(long, default_value = "off", value_parser = parse_sector)]
    pub sector: SectorArg,
    /// Page size of the gather patterns' spaces (4KiB by default; e.g. 64KiB with --sector).
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub gather_page: u64,
}

/// `--sector`: a sub-page fetch sector size, or `None` for whole pages.
#[derive(Debug, Clone, Copy)]
pub struct SectorArg(pub Option<u64>);

fn parse_sector(s: &str) -> Result<SectorArg, String> {
    strata_gpu::space::parse_sector(s)
        .map(SectorArg)
        .map_err(|e| e.to_string())
}

fn parse_remote(s: &str) -> Result<strata_gpu::space::RemoteAccess, String> {
    strata_gpu::space::parse_remote_access(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_peer(s: &str) -> Result<strata_gpu::space::PeerBorrow, String> {
    let (gpu, size) = s
        .split_once(':')
        .ok_or_else(|| format!("--peer {s:?}: give GPU:SIZE, e.g. 1:8GiB"))?;
    let gpu = gpu
        .parse()
        .map_err(|_| format!("--peer {s:?}: {gpu:?} is not a GPU number"))?;
    Ok(strata_gpu::space::PeerBorrow {
        gpu,
        bytes: parse_size(size)?,
    })
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_core::units::parse_size(s).map_err(|e| e.to_string())
}

/// Runs the benchmark and prints the table.
pub fn micro(args: &GpuMicroArgs) -> anyhow::Result<()> {
    if args.ratios.is_empty() || args.ratios.contains(&0) || args.reps == 0 {
        anyhow::bail!("--ratios needs positive multiples of the cache and --reps at least 1");
    }
    let backing = args.store.backing(&strata_core::config::process_env()?)?;
    let ceilings = if args.no_ceilings {
        crate::record::CeilingsUsed {
            source: "none (--no-ceilings)".into(),
            values: None,
        }
    } else {
        crate::ceilings::for_run(true, &std::env::temp_dir(), &mut |line| eprintln!("{line}"))
    };
    let opts = MicroOptions {
        cache_bytes: args.cache,
        ratios: args.ratios.clone(),
        reps: args.reps,
        gathers: args.gathers,
        touches: args.touches,
        skip_uvm: args.skip_uvm,
        patterns: args.patterns.clone(),
        ceilings: ceilings.values.clone(),
        backing: backing.clone(),
        peers: args.peer.clone(),
        remote_access: args.remote_access,
        sector_bytes: args.sector.0,
        gather_page: args.gather_page,
    };
    if let Some(sector) = opts.sector_bytes {
        let probe = strata_gpu::SpaceOptions {
            sector_bytes: Some(sector),
            ..Default::default()
        };
        strata_gpu::SpacePlan::new(1 << 20, &probe)?;
    }
    if !opts.gather_page.is_power_of_two() || !(4096..=2 << 20).contains(&opts.gather_page) {
        anyhow::bail!("--gather-page: give a power of two from 4KiB to 2MiB");
    }
    if !opts.peers.is_empty() && backing.is_some() {
        anyhow::bail!("--peer works over the pinned host copy only: leave out --store");
    }
    let rows = run_micro(&opts)?;
    println!(
        "pattern            page  ratio unit          Strata | zero-copy (Strata/x) | chunked copy | UVM (fits, first touch) | of ceiling | hit rate, faults, remote reads/writes, fault p50/p99"
    );
    for r in &rows {
        println!("{}", format_row(r));
    }
    let body = serde_json::json!({
        "cache_bytes": args.cache,
        "reps": args.reps,
        "store": backing.as_ref().map(|b| b.spec.label()),
        "host_cache_bytes": backing.as_ref().and_then(|b| b.host_cache),
        "peers": args.peer,
        "remote_access": args.remote_access,
        "sector_bytes": opts.sector_bytes,
        "gather_page": opts.gather_page,
        "rows": rows,
    });
    let record = Record::new("gpu-micro", Device::of(0), ceilings, body);
    let view: Vec<ChartRow> = serde_json::from_value(record.results["rows"].clone())?;
    super::write_record_and_chart(
        &record,
        &args.out.with_extension("json"),
        &chart(&view, &record),
        &args.out,
    )
}
