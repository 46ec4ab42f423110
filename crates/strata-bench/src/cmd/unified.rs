//! `strata bench unified`: unified allocations against CUDA managed memory (same hints, data
//! that fits) and, oversubscribed, against zero-copy and explicit double-buffered copies.

use std::path::PathBuf;

use crate::record::{CeilingsUsed, Device, Record};
use crate::unified::{UnifiedBenchOptions, chart, figures, run_unified};

/// Arguments of `strata bench unified`.
#[derive(Debug, clap::Args)]
pub struct UnifiedBenchArgs {
    /// Data of the cases that fit the GPU (handoff, table, sweep), e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    /// Timed rounds after one warm-up (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Page size of the unified allocations (coherence and paging unit).
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub page_size: u64,
    /// GPU cache of the oversubscribed layer sweep.
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub cache: u64,
    /// Layer-sweep weights as multiples of the cache, comma-separated.
    #[arg(long, default_value = "2,4,8", value_delimiter = ',')]
    pub ratios: Vec<u64>,
    /// Only cases starting with these names (handoff-full, handoff-partial, table, sweep,
    /// layers), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// Seed of the produced data (default: from the clock, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Strata's allocations read pages not in the GPU cache in place until they earn a frame
    /// (the default); `false` brings every missed page in (the behaviour before).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub reads_in_place: bool,
    /// Write results to DIR/unified.json, .svg and .png.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_core::units::parse_size(s).map_err(|e| e.to_string())
}

/// Runs the benchmark, prints the table and writes the record and chart.
pub fn bench(args: &UnifiedBenchArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    eprintln!("seed {seed}");
    let opts = UnifiedBenchOptions {
        size: args.size,
        rounds: args.rounds,
        page_size: args.page_size,
        cache: args.cache,
        ratios: args.ratios.clone(),
        cases: args.cases.clone(),
        seed,
        reads_in_place: args.reads_in_place,
    };
    let rows = run_unified(&opts)?;
    println!(
        "{:<16} {:<16} {:>10} {:>12}  note",
        "case", "contestant", "MiB", "ms/round"
    );
    for r in &rows {
        println!(
            "{:<16} {:<16} {:>10} {:>12.2}  {}",
            r.case,
            r.contestant,
            r.bytes >> 20,
            r.median_ms,
            r.note
        );
    }
    let body = serde_json::json!({
        "size": args.size, "rounds": args.rounds, "page_size": args.page_size,
        "cache": args.cache, "seed": seed, "reads_in_place": args.reads_in_place, "rows": rows,
    });
    let ceilings = CeilingsUsed {
        source: "none (times include CPU phases and syncs)".into(),
        values: None,
    };
    let mut record = Record::new("unified", Device::of(0), ceilings, body);
    record.figures = figures(&rows);
    std::fs::create_dir_all(&args.out)?;
    let base = args.out.join("unified");
    super::write_record_and_chart(
        &record,
        &base.with_extension("json"),
        &chart(&rows, &record),
        &base,
    )
}
