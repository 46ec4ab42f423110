//! `strata bench embed`: batched embedding lookups with Zipf-distributed row ids and sum
//! pooling, the table paged by Strata, against zero-copy, UVM (where it fits) and GPU memory.
//! Every run's pooled output is compared bit for bit with the CPU reference (the table's
//! values make every sum exact; see [`strata_workloads::embed`]).

use std::time::Instant;

use serde::Serialize;
use strata_gpu::Strata;

use super::report::{self, Row, StrataStats};
use super::{Comparison, Mode, Outcome, place_or_skip, progress};
use strata_workloads::embed::{self, LookupSpec, TableSpec};
use strata_workloads::gpu::device::GpuWorkloadError;
use strata_workloads::gpu::embed::EmbedGpu;

/// Everything `strata bench embed` needs.
#[derive(Debug, Clone)]
pub struct EmbedBenchConfig {
    /// Table rows.
    pub rows: u64,
    /// Floats per row.
    pub dim: u32,
    /// Lookups per bag (summed into one output row).
    pub bag: u32,
    /// Lookups per run.
    pub lookups: u64,
    /// Zipf skew.
    pub skew: f64,
    /// Spread hot rows over the table (true) or keep rank order (false).
    pub scatter: bool,
    /// Seed.
    pub seed: u64,
    /// Modes, oversubscription, page size (a multiple of the row size), policy, repetitions.
    pub compare: Comparison,
}

/// What the benchmark produced.
#[derive(Debug, Clone, Serialize)]
pub struct EmbedBenchReport {
    /// Rows.
    pub table_rows: u64,
    /// Floats per row.
    pub dim: u32,
    /// Table bytes.
    pub table_bytes: u64,
    /// Lookups per bag.
    pub bag: u32,
    /// Lookups per run.
    pub lookups: u64,
    /// Zipf skew.
    pub skew: f64,
    /// Hot rows scattered.
    pub scatter: bool,
    /// Distinct rows touched by one run.
    pub distinct_rows: u64,
    /// Distinct pages (of `page_size`) touched by one run.
    pub distinct_pages: u64,
    /// Rows and setting.
    #[serde(flatten)]
    pub outcome: Outcome,
}

fn validate_config(config: &EmbedBenchConfig) -> Result<(), GpuWorkloadError> {
    let row_bytes = u64::from(config.dim) * 4;
    if config.compare.reps == 0 {
        return Err(GpuWorkloadError::Invalid(
            "--reps must be at least 1".into(),
        ));
    }
    if !config.compare.page_size.is_multiple_of(row_bytes) {
        return Err(GpuWorkloadError::Invalid(format!(
            "rows of {row_bytes} bytes do not tile {}-byte pages: choose a page size that is a multiple of the row size",
            config.compare.page_size
        )));
    }
    if config.bag == 0
        || config.lookups == 0
        || !config.lookups.is_multiple_of(u64::from(config.bag))
    {
        return Err(GpuWorkloadError::Invalid(format!(
            "{} lookups do not split into bags of {}: make --lookups a multiple of --bag",
            config.lookups, config.bag
        )));
    }
    if config.bag > embed::MAX_EXACT_BAG {
        return Err(GpuWorkloadError::Invalid(format!(
            "bags of more than {} lookups lose exactness",
            embed::MAX_EXACT_BAG
        )));
    }
    Ok(())
}

/// Runs `config` and returns the report (also printed as it goes).
///
/// # Errors
/// Bad parameters, GPU failures, or a pooled output that differs from the reference.
pub fn run(config: &EmbedBenchConfig) -> Result<EmbedBenchReport, GpuWorkloadError> {
    validate_config(config)?;
    let invalid = |e: embed::EmbedError| GpuWorkloadError::Invalid(e.to_string());
    let spec = TableSpec {
        rows: config.rows,
        dim: config.dim,
        seed: config.seed,
    };
    spec.validate().map_err(invalid)?;
    let started = Instant::now();
    let floats = usize::try_from(config.rows * u64::from(config.dim))
        .map_err(|_| GpuWorkloadError::Invalid("table too large for this machine".into()))?;
    let mut table = vec![0f32; floats];
    let bar = progress("table");
    spec.fill(&mut table, &bar).map_err(invalid)?;
    bar.finish_and_clear();
    let count = usize::try_from(config.lookups)
        .map_err(|_| GpuWorkloadError::Invalid("too many lookups".into()))?;
    let ids = embed::lookups(
        &LookupSpec {
            rows: config.rows,
            skew: config.skew,
            scatter: config.scatter,
            seed: config.seed,
        },
        count,
    )
    .map_err(invalid)?;
    let want = embed::sum_pool(&table, config.dim, &ids, config.bag).map_err(invalid)?;
    let rows_per_page = config.compare.page_size / (u64::from(config.dim) * 4);
    let mut distinct: Vec<u32> = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let distinct_rows = distinct.len() as u64;
    let mut pages: Vec<u64> = distinct
        .iter()
        .map(|r| u64::from(*r) / rows_per_page)
        .collect();
    pages.dedup();
    let table_bytes = spec.bytes();
    eprintln!(
        "table: {} rows x {} floats = {}; {} lookups in bags of {} (Zipf {}, {}); {} distinct rows, {} distinct {} pages ({:.1} s)",
        config.rows,
        config.dim,
        strata_core::format_size(table_bytes),
        config.lookups,
        config.bag,
        config.skew,
        if config.scatter {
            "hot rows scattered"
        } else {
            "hot rows first"
        },
        distinct_rows,
        pages.len(),
        strata_core::format_size(config.compare.page_size),
        started.elapsed().as_secs_f64()
    );

    let compare = &config.compare;
    let strata = Strata::new(compare.gpu)?;
    let runner = EmbedGpu::new(&strata, config.dim, &ids, config.bag)?;
    let mut outcome = Outcome::new(&strata, compare);
    for mode in Mode::list(compare.modes, &compare.oversubscription) {
        let label = mode.label();
        let Some(placed) = place_or_skip(&strata, &table, mode, compare, &mut outcome)? else {
            continue;
        };
        let mut times = Vec::new();
        let mut stats = Vec::new();
        for rep in 0..=compare.reps {
            compare.prepare(&placed, rep)?;
            runner.clear_output()?;
            let ms = runner.run(&placed)?;
            embed::check_pooled(&runner.output()?, &want, config.dim)
                .map_err(|e| GpuWorkloadError::Validation(format!("{label} embedding: {e}")))?;
            if rep > 0 {
                times.push(ms);
                stats.push(placed.stats()?.as_ref().map(StrataStats::from));
            }
        }
        let median_ms = report::median(&times);
        let closest = times
            .iter()
            .zip(&stats)
            .min_by(|a, b| (a.0 - median_ms).abs().total_cmp(&(b.0 - median_ms).abs()))
            .and_then(|(_, s)| s.clone());
        let seconds = median_ms / 1e3;
        let needed = config.lookups * u64::from(config.dim) * 4;
        #[allow(clippy::cast_precision_loss)]
        let row = Row {
            workload: "embed".into(),
            mode: label,
            oversubscription: match mode {
                Mode::Strata(f) => Some(f),
                _ => None,
            },
            times_ms: times,
            median_ms,
            work: config.lookups,
            unit: "lookups".into(),
            rate_per_s: config.lookups as f64 / seconds,
            needed_bytes: needed,
            effective_gbps: needed as f64 / seconds / 1e9,
            speedup_vs_zero_copy: None,
            speedup_vs_uvm: None,
            slowdown_vs_gpu_memory: None,
            pcie_fraction: closest
                .as_ref()
                .zip(config.compare.pcie_read_gbps)
                .map(|(s, pcie)| s.bytes_in as f64 / seconds / 1e9 / pcie),
            strata: closest,
            validated: "bit-exact vs cpu, every run".into(),
        };
        eprintln!(
            "embed     {:<11} median {:>9.2} ms  {:.3e} lookups/s",
            row.mode, row.median_ms, row.rate_per_s
        );
        outcome.rows.push(row);
    }
    report::fill_ratios(&mut outcome.rows);
    Ok(EmbedBenchReport {
        table_rows: config.rows,
        dim: config.dim,
        table_bytes,
        bag: config.bag,
        lookups: config.lookups,
        skew: config.skew,
        scatter: config.scatter,
        distinct_rows,
        distinct_pages: pages.len() as u64,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_shapes_are_rejected_before_any_gpu_work() {
        let ok = EmbedBenchConfig {
            rows: 1000,
            dim: 128,
            bag: 32,
            lookups: 3200,
            skew: 0.99,
            scatter: true,
            seed: 1,
            compare: Comparison {
                oversubscription: vec![4.0],
                modes: crate::workloads::Modes::all(),
                page_size: 4096,
                policy: strata_gpu::EvictionPolicy::Clock,
                reps: 1,
                cold: true,
                gpu: 0,
                pcie_read_gbps: None,
                store: None,
                peers: Vec::new(),
            },
        };
        validate_config(&ok).unwrap();
        let err = validate_config(&EmbedBenchConfig {
            dim: 96,
            ..ok.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("multiple of the row size"), "{err}");
        assert!(
            validate_config(&EmbedBenchConfig {
                lookups: 3201,
                ..ok.clone()
            })
            .is_err()
        );
        assert!(
            validate_config(&EmbedBenchConfig {
                compare: Comparison {
                    reps: 0,
                    ..ok.compare.clone()
                },
                ..ok.clone()
            })
            .is_err()
        );
        assert!(validate_config(&EmbedBenchConfig { bag: 0, ..ok }).is_err());
    }
}
