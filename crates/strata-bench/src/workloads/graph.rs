//! `strata bench graph`: BFS, connected components and PageRank on a generated graph whose
//! neighbour array is paged by Strata, against zero-copy, UVM (where it fits) and GPU memory.
//!
//! Validation, every run: BFS levels equal the CPU reference's (levels are unique); the first
//! run of each mode is also checked by the Graph500 rules (parents form a BFS tree); component
//! labels equal the CPU reference's; PageRank is checked against the CPU reference (double
//! precision) when the graph has at most [`PAGERANK_CPU_LIMIT`] arcs, and otherwise against the
//! first mode's validated-by-construction result within a tight tolerance.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use strata_gpu::Strata;

use super::report::{self, Row, StrataStats};
use super::{Comparison, Mode, Outcome, place_or_skip, progress};
use strata_workloads::csr::Csr;
use strata_workloads::format::{self, GENERATOR_KRONECKER, GENERATOR_UNIFORM, GraphOrigin};
use strata_workloads::generate::{self, KroneckerParams};
use strata_workloads::gpu::device::GpuWorkloadError;
use strata_workloads::gpu::graph::{BfsMode, Direction, GraphGpu};
use strata_workloads::reference;
use strata_workloads::rng::Rng;
use strata_workloads::validate;

/// Largest graph (in arcs) whose PageRank is checked against the CPU reference.
pub const PAGERANK_CPU_LIMIT: u64 = 1 << 28;

/// Which generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GraphKind {
    /// Graph500 Kronecker.
    Kronecker,
    /// Uniform random.
    Uniform,
}

/// The algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Algorithm {
    /// Breadth-first search.
    Bfs,
    /// Connected components.
    Cc,
    /// PageRank.
    PageRank,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Self::Bfs => "bfs",
            Self::Cc => "cc",
            Self::PageRank => "pagerank",
        }
    }

    /// Parses a comma list of `bfs`, `cc`, `pagerank` (or `all`).
    ///
    /// # Errors
    /// An unknown name.
    pub fn parse_list(list: &str) -> Result<Vec<Self>, String> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "all" => out.extend([Self::Bfs, Self::Cc, Self::PageRank]),
                "bfs" => out.push(Self::Bfs),
                "cc" => out.push(Self::Cc),
                "pagerank" | "pr" => out.push(Self::PageRank),
                other => {
                    return Err(format!(
                        "unknown algorithm {other:?}: use bfs, cc, pagerank or all"
                    ));
                }
            }
        }
        out.dedup();
        Ok(out)
    }
}

/// Everything `strata bench graph` needs.
#[derive(Debug, Clone)]
pub struct GraphBenchConfig {
    /// Generator.
    pub kind: GraphKind,
    /// log2 vertices.
    pub scale: u32,
    /// Edges per vertex.
    pub edge_factor: u32,
    /// Seed.
    pub seed: u64,
    /// Load the graph from here if it exists (and matches), else generate and save it here.
    pub graph_file: Option<PathBuf>,
    /// Algorithms to run.
    pub algorithms: Vec<Algorithm>,
    /// Modes, oversubscription, page size, policy, repetitions, GPU.
    pub compare: Comparison,
    /// BFS variant.
    pub bfs_mode: BfsMode,
    /// Top-down BFS reads a chunk's frontier rows in place below this fraction of a page's ids
    /// (`GraphGpu::set_bfs_dense_fraction`).
    pub bfs_dense_fraction: f64,
    /// PageRank iterations.
    pub iterations: u32,
    /// PageRank damping.
    pub damping: f32,
}

/// What the benchmark produced.
#[derive(Debug, Clone, Serialize)]
pub struct GraphBenchReport {
    /// Graph description.
    pub graph: GraphSummary,
    /// BFS variant.
    pub bfs_mode: BfsMode,
    /// Top-down BFS's in-place threshold (fraction of a page's ids).
    pub bfs_dense_fraction: f64,
    /// BFS source vertex.
    pub bfs_source: u32,
    /// Directions of the BFS steps (from the GPU-memory or first run).
    pub bfs_steps: Vec<Direction>,
    /// Rows and setting.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// The graph measured.
#[derive(Debug, Clone, Serialize)]
pub struct GraphSummary {
    /// Generator.
    pub kind: GraphKind,
    /// Scale.
    pub scale: u32,
    /// Edge factor.
    pub edge_factor: u32,
    /// Seed.
    pub seed: u64,
    /// Vertices.
    pub vertices: u64,
    /// Arcs (twice the undirected edges).
    pub arcs: u64,
    /// Bytes of the neighbour array (the paged data).
    pub neighbour_bytes: u64,
    /// Seconds spent generating or loading it.
    pub prepare_seconds: f64,
}

fn origin(config: &GraphBenchConfig) -> GraphOrigin {
    GraphOrigin {
        generator: match config.kind {
            GraphKind::Kronecker => GENERATOR_KRONECKER,
            GraphKind::Uniform => GENERATOR_UNIFORM,
        },
        scale: config.scale,
        edge_factor: config.edge_factor,
        seed: config.seed,
    }
}

/// Generates the configured graph (or loads it from `graph_file`, saving it there first if
/// the file does not exist yet).
///
/// # Errors
/// Bad parameters, a file holding another graph, I/O failures.
pub fn prepare_graph(config: &GraphBenchConfig) -> Result<Csr, GpuWorkloadError> {
    let invalid = |e: &dyn std::fmt::Display| GpuWorkloadError::Invalid(e.to_string());
    let wanted = origin(config);
    if let Some(path) = &config.graph_file
        && path.exists()
    {
        let (found, _, _) = format::read_header(path).map_err(|e| invalid(&e))?;
        if found != wanted {
            return Err(GpuWorkloadError::Invalid(format!(
                "{} holds another graph ({found:?}, asked for {wanted:?}): delete it or pass another --graph-file",
                path.display()
            )));
        }
        let bar = progress("reading");
        let (graph, _) = format::read(path, &bar).map_err(|e| invalid(&e))?;
        bar.finish_and_clear();
        return Ok(graph);
    }
    let bar = progress("generating");
    let t = Instant::now();
    let list = match config.kind {
        GraphKind::Kronecker => generate::kronecker(
            &KroneckerParams::graph500(config.scale, config.edge_factor, config.seed),
            &bar,
        ),
        GraphKind::Uniform => {
            if config.scale == 0 || config.scale > generate::MAX_SCALE {
                return Err(invalid(&generate::GenerateError::Scale(config.scale)));
            }
            let n = 1u64 << config.scale;
            generate::uniform(n, n * u64::from(config.edge_factor), config.seed, &bar)
        }
    }
    .map_err(|e| invalid(&e))?;
    bar.finish_and_clear();
    let generated = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let bar = progress("building CSR");
    let graph = Csr::from_edges(&list, &bar).map_err(|e| invalid(&e))?;
    bar.finish_and_clear();
    eprintln!(
        "generated {} edges in {generated:.1} s, built the CSR in {:.1} s ({} threads)",
        list.edges.len(),
        t.elapsed().as_secs_f64(),
        strata_workloads::par::threads()
    );
    drop(list);
    if let Some(path) = &config.graph_file {
        let bar = progress("saving");
        format::write(path, &graph, wanted, &bar).map_err(|e| invalid(&e))?;
        bar.finish_and_clear();
    }
    Ok(graph)
}

/// A random vertex with at least one neighbour (Graph500 picks sources this way).
#[must_use]
pub fn pick_source(graph: &Csr, seed: u64) -> u32 {
    let mut rng = Rng::for_chunk(seed, 0xbf5);
    let n = graph.vertices() as u64;
    for _ in 0..10_000 {
        let v = usize::try_from(rng.below(n)).expect("fits");
        if graph.degree(v) > 0 {
            return u32::try_from(v).expect("n <= 2^31");
        }
    }
    (0..graph.vertices())
        .find(|v| graph.degree(*v) > 0)
        .map_or(0, |v| u32::try_from(v).expect("n <= 2^31"))
}

/// CPU answers the GPU results are checked against.
struct References {
    source: u32,
    bfs: reference::BfsResult,
    component_arcs: u64,
    labels: Vec<u32>,
    pagerank: Option<Vec<f64>>,
}

/// One timed measurement.
struct Sample {
    ms: f64,
    stats: Option<StrataStats>,
    /// Passes over the edges (connected components; 1 otherwise).
    passes: u64,
}

/// Runs `config` and returns the report (also printed as it goes).
///
/// # Errors
/// Any GPU failure or a wrong result (a benchmark never reports numbers for wrong answers).
pub fn run(config: &GraphBenchConfig) -> Result<GraphBenchReport, GpuWorkloadError> {
    if config.compare.reps == 0 {
        return Err(GpuWorkloadError::Invalid(
            "--reps must be at least 1".into(),
        ));
    }
    let started = Instant::now();
    // Generated graphs come from the tested CSR builder; loaded ones are checked by the reader.
    let graph = prepare_graph(config)?;
    let summary = GraphSummary {
        kind: config.kind,
        scale: config.scale,
        edge_factor: config.edge_factor,
        seed: config.seed,
        vertices: graph.vertices() as u64,
        arcs: graph.arcs(),
        neighbour_bytes: graph.neighbour_bytes(),
        prepare_seconds: started.elapsed().as_secs_f64(),
    };
    eprintln!(
        "graph: {:?} scale {} edge factor {}: {} vertices, {} arcs, neighbour array {} ({:.1} s)",
        config.kind,
        config.scale,
        config.edge_factor,
        summary.vertices,
        summary.arcs,
        strata_core::format_size(summary.neighbour_bytes),
        summary.prepare_seconds
    );
    let t = Instant::now();
    let source = pick_source(&graph, config.seed);
    let bfs = reference::bfs(&graph, source);
    let component_arcs = bfs.component_arcs(&graph);
    let labels = reference::connected_components(&graph);
    let pagerank = (config.algorithms.contains(&Algorithm::PageRank)
        && graph.arcs() <= PAGERANK_CPU_LIMIT)
        .then(|| reference::pagerank(&graph, config.iterations, f64::from(config.damping)));
    let refs = References {
        source,
        bfs,
        component_arcs,
        labels,
        pagerank,
    };
    eprintln!(
        "CPU references: BFS from {source} reaches {} vertices; {:.1} s",
        refs.bfs.reached(),
        t.elapsed().as_secs_f64()
    );

    let compare = &config.compare;
    let strata = Strata::new(compare.gpu)?;
    let mut runner = GraphGpu::new(&strata, &graph, compare.page_size)?;
    runner.set_bfs_dense_fraction(config.bfs_dense_fraction)?;
    let mut outcome = Outcome::new(&strata, compare);
    let mut cross_check: Option<Vec<f32>> = None;
    let mut bfs_steps = Vec::new();
    for mode in Mode::list(compare.modes, &compare.oversubscription) {
        let label = mode.label();
        let Some(placed) = place_or_skip(&strata, &graph.neighbours, mode, compare, &mut outcome)?
        else {
            continue;
        };
        for &algorithm in &config.algorithms {
            let mut samples = Vec::new();
            let mut validated = String::new();
            for rep in 0..=compare.reps {
                compare.prepare(&placed, rep)?;
                let (ms, check, passes) = match algorithm {
                    Algorithm::Bfs => {
                        let r = runner.bfs(
                            &placed,
                            refs.source,
                            graph.degree(refs.source as usize),
                            config.bfs_mode,
                        )?;
                        if r.levels != refs.bfs.levels {
                            let v = r
                                .levels
                                .iter()
                                .zip(&refs.bfs.levels)
                                .position(|(a, b)| a != b)
                                .unwrap_or(0);
                            return Err(GpuWorkloadError::Validation(format!(
                                "{label} BFS: vertex {v} at level {} but the CPU reference says {}",
                                r.levels[v], refs.bfs.levels[v]
                            )));
                        }
                        if rep == 0 {
                            validate::bfs(&graph, refs.source, &r.parents, Some(&r.levels))
                                .map_err(|e| {
                                    GpuWorkloadError::Validation(format!("{label} BFS: {e}"))
                                })?;
                            if bfs_steps.is_empty() {
                                bfs_steps.clone_from(&r.steps);
                            }
                        }
                        (r.ms, "graph500 rules + levels = cpu".to_string(), 1)
                    }
                    Algorithm::Cc => {
                        let (got, passes, ms) = runner.connected_components(&placed)?;
                        validate::components(&got, &refs.labels).map_err(|e| {
                            GpuWorkloadError::Validation(format!("{label} CC: {e}"))
                        })?;
                        (
                            ms,
                            format!("labels = cpu, {passes} passes"),
                            u64::from(passes),
                        )
                    }
                    Algorithm::PageRank => {
                        let (ranks, ms) =
                            runner.pagerank(&placed, config.iterations, config.damping)?;
                        let check = if let Some(want) = &refs.pagerank {
                            validate::pagerank(&ranks, want, 1e-4, 2e-3).map_err(|e| {
                                GpuWorkloadError::Validation(format!("{label} PageRank: {e}"))
                            })?;
                            "vs cpu (f64)".to_string()
                        } else if let Some(first) = &cross_check {
                            let want: Vec<f64> = first.iter().map(|r| f64::from(*r)).collect();
                            validate::pagerank(&ranks, &want, 1e-5, 1e-4).map_err(|e| {
                                GpuWorkloadError::Validation(format!("{label} PageRank: {e}"))
                            })?;
                            "vs first mode (graph too large for the cpu check)".to_string()
                        } else {
                            let sum: f64 = ranks.iter().map(|r| f64::from(*r)).sum();
                            if (sum - 1.0).abs() > 1e-3
                                || ranks.iter().any(|r| !r.is_finite() || *r < 0.0)
                            {
                                return Err(GpuWorkloadError::Validation(format!(
                                    "{label} PageRank: ranks sum to {sum} (must be 1) or hold a bad value"
                                )));
                            }
                            "sum = 1 (reference for later modes)".to_string()
                        };
                        if cross_check.is_none() {
                            cross_check = Some(ranks);
                        }
                        (ms, check, 1)
                    }
                };
                validated = check;
                if rep > 0 {
                    let stats = placed.stats()?.as_ref().map(StrataStats::from);
                    samples.push(Sample { ms, stats, passes });
                }
            }
            let row = make_row(algorithm, mode, &samples, &graph, &refs, config, validated);
            eprintln!(
                "{:<9} {:<11} median {:>9.2} ms  {:.3e} {}/s",
                row.workload, row.mode, row.median_ms, row.rate_per_s, row.unit
            );
            outcome.rows.push(row);
        }
    }
    report::fill_ratios(&mut outcome.rows);
    Ok(GraphBenchReport {
        graph: summary,
        bfs_mode: config.bfs_mode,
        bfs_dense_fraction: config.bfs_dense_fraction,
        bfs_source: refs.source,
        bfs_steps,
        outcome,
    })
}

fn make_row(
    algorithm: Algorithm,
    mode: Mode,
    samples: &[Sample],
    graph: &Csr,
    refs: &References,
    config: &GraphBenchConfig,
    validated: String,
) -> Row {
    let times: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    let median_ms = report::median(&times);
    let median_sample = samples.iter().min_by(|a, b| {
        (a.ms - median_ms)
            .abs()
            .total_cmp(&(b.ms - median_ms).abs())
    });
    let closest = median_sample.and_then(|s| s.stats.clone());
    let passes = median_sample.map_or(1, |s| s.passes);
    let (work, unit, needed) = match algorithm {
        Algorithm::Bfs => (
            refs.component_arcs / 2,
            "edges (TEPS)",
            refs.component_arcs * 4,
        ),
        Algorithm::Cc => (
            graph.arcs() * passes,
            "arcs scanned",
            graph.arcs() * 4 * passes,
        ),
        Algorithm::PageRank => {
            let i = u64::from(config.iterations);
            (graph.arcs() * i, "arcs scanned", graph.arcs() * 4 * i)
        }
    };
    let seconds = median_ms / 1e3;
    #[allow(clippy::cast_precision_loss)]
    let (rate, gbps) = (work as f64 / seconds, needed as f64 / seconds / 1e9);
    #[allow(clippy::cast_precision_loss)]
    let pcie_fraction = closest
        .as_ref()
        .zip(config.compare.pcie_read_gbps)
        .map(|(s, pcie)| s.bytes_in as f64 / seconds / 1e9 / pcie);
    Row {
        workload: algorithm.name().to_string(),
        mode: mode.label(),
        oversubscription: match mode {
            Mode::Strata(f) => Some(f),
            _ => None,
        },
        times_ms: times,
        median_ms,
        work,
        unit: unit.to_string(),
        rate_per_s: rate,
        needed_bytes: needed,
        effective_gbps: gbps,
        speedup_vs_zero_copy: None,
        speedup_vs_uvm: None,
        slowdown_vs_gpu_memory: None,
        strata: closest,
        pcie_fraction,
        validated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_lists_sources_and_graph_files() {
        assert_eq!(
            Algorithm::parse_list("bfs,pr").unwrap(),
            vec![Algorithm::Bfs, Algorithm::PageRank]
        );
        assert_eq!(Algorithm::parse_list("all").unwrap().len(), 3);
        assert!(Algorithm::parse_list("sssp").is_err());
        let seed = crate::workloads::test_seed();
        let path = std::env::temp_dir().join(format!(
            "strata-bench-graph-{}-{seed}.csr",
            std::process::id()
        ));
        let config = GraphBenchConfig {
            kind: GraphKind::Kronecker,
            scale: 10,
            edge_factor: 8,
            seed,
            graph_file: Some(path.clone()),
            algorithms: vec![Algorithm::Bfs],
            compare: Comparison {
                oversubscription: vec![2.0],
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
            bfs_mode: BfsMode::TopDown,
            bfs_dense_fraction: strata_workloads::gpu::graph::DEFAULT_BFS_DENSE_FRACTION,
            iterations: 20,
            damping: 0.85,
        };
        let made = prepare_graph(&config).unwrap();
        assert!(path.exists());
        let loaded = prepare_graph(&config).unwrap();
        assert_eq!(made, loaded);
        let other = GraphBenchConfig {
            seed: seed ^ 1,
            ..config.clone()
        };
        let err = prepare_graph(&other).unwrap_err().to_string();
        assert!(err.contains("another graph"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let source = pick_source(&made, seed);
        assert!(made.degree(source as usize) > 0);
        let uniform = prepare_graph(&GraphBenchConfig {
            kind: GraphKind::Uniform,
            graph_file: None,
            ..config
        })
        .unwrap();
        assert_eq!(uniform.vertices(), 1024);
    }
}
