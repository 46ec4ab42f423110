//! `strata bench graph` and `strata bench embed`: parse arguments, run the workload benchmarks
//! from `strata-workloads`, print the table and write JSON and SVG.

use std::path::PathBuf;

use crate::workloads::embed::{EmbedBenchConfig, EmbedBenchReport};
use crate::workloads::graph::{Algorithm, GraphBenchConfig, GraphBenchReport, GraphKind};
use crate::workloads::{Comparison, Modes, parse_factors, report};
use anyhow::Context as _;
use strata_gpu::EvictionPolicy;
use strata_workloads::gpu::graph::BfsMode;

/// Eviction policy arguments shared by both benchmarks.
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// Strata's eviction policy: `scan-resistant` (a protected segment keeps part of a loop
    /// larger than the cache resident) or `clock` (clock with reference bits).
    #[arg(long, default_value = "scan-resistant")]
    policy: String,
    /// Fraction of the cache the scan-resistant policy may protect (0 to 0.95).
    #[arg(long, default_value_t = 0.9)]
    protected_fraction: f64,
}

impl PolicyArgs {
    fn policy(&self) -> anyhow::Result<EvictionPolicy> {
        match self.policy.as_str() {
            "clock" => Ok(EvictionPolicy::Clock),
            "scan-resistant" | "scan" => Ok(EvictionPolicy::ScanResistant {
                protected_fraction: self.protected_fraction,
            }),
            other => anyhow::bail!("unknown policy {other:?}: use scan-resistant or clock"),
        }
    }
}

/// What both benchmarks compare, and how.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Strata oversubscription factors (data size over cache size).
    #[arg(long, default_value = "1,2,4")]
    oversubscription: String,
    /// Memories to compare: strata, zero-copy, uvm, gpu-memory or all.
    #[arg(long, default_value = "all")]
    modes: String,
    /// Strata page size [default: 64KiB for graphs, 4KiB for embeddings (a multiple of the
    /// row size)].
    #[arg(long)]
    page_size: Option<String>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Timed runs per configuration (after one validated warm-up run); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// How timed runs start: `cold` (Strata's cache emptied, UVM migrated back to the host
    /// before each run) or `warm` (left as the previous run left it) [default: cold for
    /// graphs, warm for embeddings].
    #[arg(long)]
    start: Option<String>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Strata's spaces over a store (`--store`, `--codec`, `--file-io`, `--host-cache`).
    #[command(flatten)]
    store: crate::store_spec::SpaceStoreArgs,
}

impl CompareArgs {
    fn comparison(
        &self,
        default_page_size: &str,
        default_start: &str,
    ) -> anyhow::Result<Comparison> {
        let page_size = self.page_size.as_deref().unwrap_or(default_page_size);
        let cold = match self.start.as_deref().unwrap_or(default_start) {
            "cold" => true,
            "warm" => false,
            other => anyhow::bail!("--start {other:?}: use cold or warm"),
        };
        Ok(Comparison {
            oversubscription: parse_factors(&self.oversubscription).map_err(anyhow::Error::msg)?,
            modes: Modes::parse(&self.modes).map_err(anyhow::Error::msg)?,
            page_size: strata_core::parse_size(page_size)
                .with_context(|| format!("--page-size {page_size:?}"))?,
            policy: self.policy.policy()?,
            reps: self.reps,
            cold,
            gpu: self.gpu,
            pcie_read_gbps: None,
            store: self.store.backing(&strata_core::config::process_env()?)?,
            peers: Vec::new(),
        })
    }
}

/// Arguments of `strata bench graph`.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// Graph generator: `kron` (Graph500 Kronecker, A=0.57 B=0.19 C=0.19) or `uniform`.
    #[arg(long, default_value = "kron")]
    graph: String,
    /// log2 of the vertex count (25 is the target size; 24 finishes in a few minutes).
    #[arg(long, default_value_t = 24)]
    scale: u32,
    /// Generated edges per vertex.
    #[arg(long, default_value_t = 16)]
    edge_factor: u32,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Load the graph from this file if it exists, else generate it and save it here.
    #[arg(long)]
    graph_file: Option<PathBuf>,
    /// Algorithms: bfs, cc, pagerank or all (comma-separated).
    #[arg(long, default_value = "all")]
    algorithms: String,
    #[command(flatten)]
    compare: Box<CompareArgs>,
    /// BFS variant: `top-down` or `direction-optimising`.
    #[arg(long, default_value = "top-down")]
    bfs: String,
    /// Top-down BFS reads a work chunk's frontier rows in place, without moving their page,
    /// when they hold less than this fraction of a page (0: the page of every chunk with a
    /// frontier moves; above 1: every chunk is read in place).
    #[arg(long, default_value_t = strata_workloads::gpu::graph::DEFAULT_BFS_DENSE_FRACTION)]
    bfs_dense_fraction: f64,
    /// PageRank iterations.
    #[arg(long, default_value_t = 20)]
    iterations: u32,
    /// PageRank damping factor.
    #[arg(long, default_value_t = 0.85)]
    damping: f32,
    /// Where to write the JSON results.
    #[arg(long, default_value = "strata-bench-graph.json")]
    json: PathBuf,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "strata-bench-graph.svg")]
    svg: PathBuf,
    /// Correctness check only: small Kronecker and uniform graphs, every algorithm and both BFS
    /// variants, Strata at 4x oversubscription with 4 KiB pages and every baseline, all
    /// validated against the CPU references; fails on any wrong result.
    #[arg(long)]
    check: bool,
}

fn graph_config(args: &GraphArgs) -> anyhow::Result<GraphBenchConfig> {
    if args.bfs_dense_fraction.is_nan() || args.bfs_dense_fraction < 0.0 {
        anyhow::bail!(
            "--bfs-dense-fraction {}: give a number >= 0 (0: the page of every chunk with a frontier moves; above 1: every chunk is read in place)",
            args.bfs_dense_fraction
        );
    }
    Ok(GraphBenchConfig {
        kind: match args.graph.as_str() {
            "kron" | "kronecker" => GraphKind::Kronecker,
            "uniform" | "urand" => GraphKind::Uniform,
            other => anyhow::bail!("unknown graph {other:?}: use kron or uniform"),
        },
        scale: args.scale,
        edge_factor: args.edge_factor,
        seed: args.seed,
        graph_file: args.graph_file.clone(),
        algorithms: Algorithm::parse_list(&args.algorithms).map_err(anyhow::Error::msg)?,
        compare: args.compare.comparison("64KiB", "cold")?,
        bfs_mode: match args.bfs.as_str() {
            "top-down" | "td" => BfsMode::TopDown,
            "direction-optimising" | "direction-optimizing" | "do" => BfsMode::DirectionOptimising,
            other => {
                anyhow::bail!("unknown BFS variant {other:?}: use top-down or direction-optimising")
            }
        },
        bfs_dense_fraction: args.bfs_dense_fraction,
        iterations: args.iterations,
        damping: args.damping,
    })
}

fn print_graph(report: &GraphBenchReport) {
    println!(
        "graph {:?} scale {} ({} vertices, {} arcs, neighbour array {}), GPU {}, pages {}, policy {}, BFS {:?} from {} ({} steps: {:?})",
        report.graph.kind,
        report.graph.scale,
        report.graph.vertices,
        report.graph.arcs,
        strata_core::format_size(report.graph.neighbour_bytes),
        report.outcome.gpu,
        strata_core::format_size(report.outcome.page_size),
        report.outcome.policy,
        report.bfs_mode,
        report.bfs_source,
        report.bfs_steps.len(),
        report.bfs_steps
    );
    print_outcome(&report.outcome);
}

/// Prints what graph and embedding runs share: how the timed runs start, the results table
/// and the modes that were skipped.
fn print_outcome(outcome: &crate::workloads::Outcome) {
    println!(
        "timed runs start {}",
        if outcome.cold { "cold" } else { "warm" }
    );
    println!("Strata's spaces over: {}", outcome.backing);
    print!("{}", report::table(&outcome.rows));
    for s in &outcome.skipped {
        println!("skipped: {s}");
    }
}

/// Reads (or probes) this machine's ceilings and puts its PCIe read rate into the config.
fn with_ceilings<C>(
    mut config: C,
    compare: impl FnOnce(&mut C) -> &mut Comparison,
) -> (crate::record::CeilingsUsed, C) {
    let ceilings =
        crate::ceilings::for_run(true, &std::env::temp_dir(), &mut |line| eprintln!("{line}"));
    compare(&mut config).pcie_read_gbps =
        ceilings.values.as_ref().and_then(|c| c.get("pcie-read-sm"));
    (ceilings, config)
}

/// Writes the record (JSON) and the chart (SVG and PNG) of a workload benchmark.
#[allow(clippy::too_many_arguments)]
fn write_outputs<T: serde::Serialize>(
    bench: &str,
    json: &std::path::Path,
    plot: &std::path::Path,
    title: &str,
    report: &T,
    rows: &[report::Row],
    ceilings: crate::record::CeilingsUsed,
    gpu: usize,
) -> anyhow::Result<()> {
    let record = crate::record::Record::new(
        bench,
        crate::record::Device::of(gpu),
        ceilings,
        serde_json::to_value(report)?,
    );
    super::write_record_and_chart(&record, json, &report::chart(title, rows, &record), plot)
}

/// Runs `strata bench graph`.
///
/// # Errors
/// Bad arguments, GPU failures, wrong results, unwritable output files.
pub fn graph(args: &GraphArgs) -> anyhow::Result<()> {
    let config = graph_config(args)?;
    if args.check {
        return graph_check(&config);
    }
    let (ceilings, config) = with_ceilings(config, |c| &mut c.compare);
    let report = crate::workloads::graph::run(&config)?;
    print_graph(&report);
    let title = format!(
        "strata bench graph: {:?} scale {} on {}",
        report.graph.kind, report.graph.scale, report.outcome.gpu
    );
    write_outputs(
        "graph",
        &args.json,
        &args.svg,
        &title,
        &report,
        &report.outcome.rows,
        ceilings,
        config.compare.gpu,
    )?;
    Ok(())
}

/// `strata bench graph --check`: small Kronecker and uniform graphs, every algorithm and both
/// BFS variants, Strata at 4x oversubscription with 4 KiB pages and every baseline, all
/// validated against the CPU references, with `config`'s other settings (its GPU, policy,
/// store or peer tier).
///
/// # Errors
/// GPU failures, or any wrong result.
pub fn graph_check(config: &GraphBenchConfig) -> anyhow::Result<()> {
    for (kind, scale) in [(GraphKind::Kronecker, 15), (GraphKind::Uniform, 14)] {
        // Top-down twice: with the configured in-place threshold (dense chunks move, sparse
        // ones are read in place) and with every chunk read in place.
        for (bfs_mode, bfs_dense_fraction) in [
            (BfsMode::TopDown, config.bfs_dense_fraction),
            (BfsMode::TopDown, 2.0),
            (BfsMode::DirectionOptimising, config.bfs_dense_fraction),
        ] {
            let small = GraphBenchConfig {
                kind,
                scale,
                edge_factor: 16,
                graph_file: None,
                algorithms: vec![Algorithm::Bfs, Algorithm::Cc, Algorithm::PageRank],
                compare: Comparison {
                    oversubscription: vec![4.0],
                    modes: Modes::all(),
                    page_size: 4096,
                    reps: 1,
                    ..config.compare.clone()
                },
                bfs_mode,
                bfs_dense_fraction,
                ..config.clone()
            };
            let report = crate::workloads::graph::run(&small)?;
            print_graph(&report);
            println!(
                "CHECK PASSED: graph {kind:?} scale {scale}, BFS {bfs_mode:?} (dense fraction {bfs_dense_fraction}): every mode validated"
            );
        }
    }
    Ok(())
}

/// Arguments of `strata bench embed`.
#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// Table rows.
    #[arg(long, default_value_t = 1 << 24)]
    rows: u64,
    /// Floats per row (a multiple of 32, at most 1024).
    #[arg(long, default_value_t = 128)]
    dim: u32,
    /// Lookups summed into each output row.
    #[arg(long, default_value_t = 32)]
    bag: u32,
    /// Lookups per run (a multiple of --bag).
    #[arg(long, default_value_t = 1 << 25)]
    lookups: u64,
    /// Zipf skew of the row ids (0.8 to 1.2 typical).
    #[arg(long, default_value_t = 0.99)]
    skew: f64,
    /// Keep hot rows at the start of the table instead of scattering them (real tables
    /// scatter them; this flag shows the best case for page caching).
    #[arg(long)]
    no_scatter: bool,
    /// Seed of the table values and the lookups.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    compare: Box<CompareArgs>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "strata-bench-embed.json")]
    json: PathBuf,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "strata-bench-embed.svg")]
    svg: PathBuf,
    /// Correctness check only: a small table at skews 0.8, 0.99 and 1.2, Strata at 4x
    /// oversubscription and every baseline, every output compared bit for bit with the CPU.
    #[arg(long)]
    check: bool,
}

fn print_embed(report: &EmbedBenchReport) {
    println!(
        "embedding table {} rows x {} floats ({}), {} lookups in bags of {}, Zipf {} ({}), {} distinct rows / {} distinct pages per run, GPU {}, pages {}, policy {}",
        report.table_rows,
        report.dim,
        strata_core::format_size(report.table_bytes),
        report.lookups,
        report.bag,
        report.skew,
        if report.scatter {
            "hot rows scattered"
        } else {
            "hot rows first"
        },
        report.distinct_rows,
        report.distinct_pages,
        report.outcome.gpu,
        strata_core::format_size(report.outcome.page_size),
        report.outcome.policy
    );
    print_outcome(&report.outcome);
}

/// Runs `strata bench embed`.
///
/// # Errors
/// Bad arguments, GPU failures, wrong results, unwritable output files.
pub fn embed(args: &EmbedArgs) -> anyhow::Result<()> {
    let config = EmbedBenchConfig {
        rows: args.rows,
        dim: args.dim,
        bag: args.bag,
        lookups: args.lookups,
        skew: args.skew,
        scatter: !args.no_scatter,
        seed: args.seed,
        compare: args.compare.comparison("4KiB", "warm")?,
    };
    if args.check {
        return embed_check(&config);
    }
    let (ceilings, config) = with_ceilings(config, |c| &mut c.compare);
    let report = crate::workloads::embed::run(&config)?;
    print_embed(&report);
    let title = format!(
        "strata bench embed: Zipf {} gathers over a {} table on {}",
        report.skew,
        strata_core::format_size(report.table_bytes),
        report.outcome.gpu
    );
    write_outputs(
        "embed",
        &args.json,
        &args.svg,
        &title,
        &report,
        &report.outcome.rows,
        ceilings,
        config.compare.gpu,
    )?;
    Ok(())
}

/// `strata bench embed --check`: a small table at skews 0.8, 0.99 and 1.2, Strata at 4x
/// oversubscription and every baseline, every output compared bit for bit with the CPU, with
/// `config`'s other settings (its GPU, page size, policy, store or peer tier).
///
/// # Errors
/// GPU failures, or any output that differs.
pub fn embed_check(config: &EmbedBenchConfig) -> anyhow::Result<()> {
    for skew in [0.8, 0.99, 1.2] {
        let small = EmbedBenchConfig {
            rows: 1 << 16,
            lookups: 1 << 18,
            skew,
            compare: Comparison {
                oversubscription: vec![4.0],
                modes: Modes::all(),
                reps: 1,
                ..config.compare.clone()
            },
            ..config.clone()
        };
        let report = crate::workloads::embed::run(&small)?;
        print_embed(&report);
        println!("CHECK PASSED: embedding Zipf {skew}: every mode bit-exact");
    }
    Ok(())
}
