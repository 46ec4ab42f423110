//! `strata bench ceilings` (probe this machine's limits and cache them) and `strata bench
//! compare OLD.json NEW.json` (per-figure ratios, drops beyond the run-to-run spread).

use anyhow::Context as _;
use std::path::PathBuf;

use crate::ceilings::{self, ProbeOptions};
use crate::compare;
use crate::record;

fn size_arg(s: &str) -> Result<u64, String> {
    strata_core::parse_size(s).map_err(|e| e.to_string())
}

/// Arguments of `strata bench ceilings`.
#[derive(Debug, clap::Args)]
pub struct CeilingsArgs {
    /// Directory whose disk the O_DIRECT probe reads (the disk benchmarks page from).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Bytes of the disk probe's file.
    #[arg(long, default_value = "256MiB", value_parser = size_arg)]
    disk_size: u64,
    /// Bytes the host-memory probe reads.
    #[arg(long, default_value = "512MiB", value_parser = size_arg)]
    host_size: u64,
    /// GPU whose ceilings to probe (its peers are probed from it).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Skip the GPU probes.
    #[arg(long)]
    no_gpu: bool,
    /// Print the cached ceilings without probing (an error if there are none).
    #[arg(long)]
    show: bool,
}

/// Runs `strata bench ceilings`.
pub fn ceilings(args: &CeilingsArgs) -> anyhow::Result<()> {
    let device = if args.no_gpu {
        None
    } else {
        record::Device::of(args.gpu)
    };
    let key = ceilings::key(device.as_ref());
    if args.show {
        let (c, path) = ceilings::cached(&key)?.ok_or_else(|| {
            anyhow::anyhow!("no ceilings cached for {key}; run `strata bench ceilings` first")
        })?;
        print!("{}", c.table());
        println!("(cached in {})", path.display());
        return Ok(());
    }
    anyhow::ensure!(
        args.disk_size >= 1 << 20 && args.host_size >= 1 << 20,
        "--disk-size and --host-size must be at least 1MiB"
    );
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create --dir {}", dir.display()))?;
    }
    let opts = ProbeOptions {
        host_bytes: usize::try_from(args.host_size)?,
        disk_bytes: args.disk_size,
        disk_dir: args.dir.clone().unwrap_or_else(std::env::temp_dir),
        gpu: (!args.no_gpu).then_some(args.gpu),
    };
    let c = ceilings::measure(&opts, &mut |line| eprintln!("{line}"));
    print!("{}", c.table());
    let path = ceilings::store(&c)?;
    println!(
        "cached in {}; every benchmark on this host and device now reports its fraction of these",
        path.display()
    );
    Ok(())
}

/// Arguments of `strata bench plot`.
#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// A gpu-micro, graph or embed result (this build's record or an older build's JSON).
    result: PathBuf,
    /// Write BASE.svg and BASE.png (default: beside the result).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `strata bench plot`: redraws a result's chart without running anything.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    let record = record::Record::from_json(record::read_json(&args.result)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.result.display()))?;
    let rows = record.results.get("rows").cloned().unwrap_or_default();
    let chart = match record.bench.as_str() {
        "gpu-micro" => {
            let rows: Vec<crate::gpu_micro::ChartRow> = serde_json::from_value(rows)?;
            crate::gpu_micro::chart(&rows, &record)
        }
        "graph" | "embed" => {
            let rows: Vec<crate::workloads::report::Row> = serde_json::from_value(rows)?;
            let gpu = record.device.as_ref().map_or("?", |d| d.name.as_str());
            let title = format!(
                "strata bench {} on {gpu} ({})",
                record.bench,
                args.result.display()
            );
            crate::workloads::report::chart(&title, &rows, &record)
        }
        other => anyhow::bail!(
            "`strata bench plot` redraws gpu-micro, graph and embed results; {other} results are drawn when the benchmark runs"
        ),
    };
    let base = args
        .out
        .clone()
        .unwrap_or_else(|| args.result.with_extension(""));
    let (svg, png) = crate::plot::write(&chart, &base)?;
    println!("wrote {} and {}", svg.display(), png.display());
    Ok(())
}

/// Arguments of `strata bench compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The earlier result (a JSON written by `strata bench ...`, this build's or an older one's).
    old: PathBuf,
    /// The later result.
    new: PathBuf,
    /// Exit with status 1 when a figure dropped beyond its run-to-run spread.
    #[arg(long)]
    fail_on_drop: bool,
}

/// Runs `strata bench compare`.
pub fn compare(args: &CompareArgs) -> anyhow::Result<()> {
    let (old_bench, old) = compare::figures_of(&record::read_json(&args.old)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.old.display()))?;
    let (new_bench, new) = compare::figures_of(&record::read_json(&args.new)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.new.display()))?;
    anyhow::ensure!(
        old_bench == new_bench,
        "{} is a {old_bench} result and {} a {new_bench} result; compare results of the same benchmark",
        args.old.display(),
        args.new.display()
    );
    let rows = compare::compare(&old, &new);
    let only_old = old
        .iter()
        .filter(|o| !new.iter().any(|n| n.name == o.name))
        .count();
    let only_new = new
        .iter()
        .filter(|n| !old.iter().any(|o| o.name == n.name))
        .count();
    println!(
        "strata bench compare: {old_bench}, {} -> {}",
        args.old.display(),
        args.new.display()
    );
    print!(
        "{}",
        compare::table("old", "new", &rows, only_old, only_new)
    );
    if args.fail_on_drop && rows.iter().any(|r| r.dropped) {
        anyhow::bail!("figures dropped beyond their run-to-run spread");
    }
    Ok(())
}
