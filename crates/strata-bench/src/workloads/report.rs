//! Benchmark results: one row per (workload, memory mode), printed as a table, written as JSON
//! and drawn as an SVG bar chart of throughput relative to zero-copy.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use strata_gpu::GpuStats;

/// Strata's statistics for one run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StrataStats {
    /// Page hits.
    pub hits: u64,
    /// Page faults served.
    pub faults: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Bytes copied host -> GPU frames.
    pub bytes_in: u64,
    /// Bytes written back.
    pub bytes_out: u64,
    /// hits / (hits + faults).
    pub hit_rate: f64,
    /// Mean fault service time, ns.
    pub mean_fault_ns: u64,
    /// Frames in the protected segment at the end (scan-resistant policy).
    pub protected_frames: u32,
    /// Page reads served from the host copy by read-through (`STRATA_GPU_READ_THROUGH`).
    pub read_through: u64,
    /// Optimistic (pin-free) reads that found their page moved and fell back to a pin.
    pub optimistic_retries: u64,
    /// Faults served from the peer tier (over NVLink); 0 without one (and in older files).
    #[serde(default)]
    pub peer_loads: u64,
}

impl From<&GpuStats> for StrataStats {
    fn from(s: &GpuStats) -> Self {
        let total = s.hits + s.faults;
        #[allow(clippy::cast_precision_loss)]
        let hit_rate = if total == 0 {
            0.0
        } else {
            s.hits as f64 / total as f64
        };
        Self {
            hits: s.hits,
            faults: s.faults,
            evictions: s.evictions,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            hit_rate,
            mean_fault_ns: s.mean_fault_ns(),
            protected_frames: s.protected_frames,
            read_through: s.read_through,
            optimistic_retries: s.optimistic_retries,
            peer_loads: s.peer.as_ref().map_or(0, |p| p.loads),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Row {
    /// `bfs`, `cc`, `pagerank` or `embed`.
    pub workload: String,
    /// `strata-2x`, `zero-copy`, `uvm`, `gpu-memory`, ...
    pub mode: String,
    /// Data size over cache size (Strata rows only).
    pub oversubscription: Option<f64>,
    /// Timed runs, milliseconds (each after making the data cold; see the bench docs).
    pub times_ms: Vec<f64>,
    /// Median of `times_ms`.
    pub median_ms: f64,
    /// Units of work per run (edges, arcs scanned or lookups; see `unit`).
    pub work: u64,
    /// What `work` counts.
    pub unit: String,
    /// work / median time.
    pub rate_per_s: f64,
    /// Bytes of the paged array the algorithm needs per run (its reads, at 4-byte ids or rows).
    pub needed_bytes: u64,
    /// needed_bytes / median time, GB/s.
    pub effective_gbps: f64,
    /// Zero-copy's median / this median (above 1: faster than zero-copy).
    pub speedup_vs_zero_copy: Option<f64>,
    /// UVM's median / this median.
    pub speedup_vs_uvm: Option<f64>,
    /// This median / GPU memory's median (how far from the all-in-GPU bound; 1 is equal).
    pub slowdown_vs_gpu_memory: Option<f64>,
    /// Strata's statistics for the median run.
    pub strata: Option<StrataStats>,
    /// Host-to-GPU bytes moved (Strata: bytes_in) per second, as a fraction of the PCIe ceiling.
    pub pcie_fraction: Option<f64>,
    /// How the result was checked.
    pub validated: String,
}

/// Median of a non-empty list.
#[must_use]
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.is_empty() {
        f64::NAN
    } else if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        f64::midpoint(sorted[mid - 1], sorted[mid])
    }
}

/// Fills the ratio columns of every row from the baselines of the same workload.
pub fn fill_ratios(rows: &mut [Row]) {
    let find = |rows: &[Row], workload: &str, mode: &str| {
        rows.iter()
            .find(|r| r.workload == workload && r.mode == mode)
            .map(|r| r.median_ms)
    };
    let baselines: Vec<(Option<f64>, Option<f64>, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                find(rows, &r.workload, "zero-copy"),
                find(rows, &r.workload, "uvm"),
                find(rows, &r.workload, "gpu-memory"),
            )
        })
        .collect();
    for (row, (zero_copy, uvm, gpu)) in rows.iter_mut().zip(baselines) {
        row.speedup_vs_zero_copy = zero_copy.map(|z| z / row.median_ms);
        row.speedup_vs_uvm = uvm.map(|u| u / row.median_ms);
        row.slowdown_vs_gpu_memory = gpu.map(|g| row.median_ms / g);
    }
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

/// The results as a text table.
#[must_use]
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<11} {:>10} {:>12} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>7}  validated",
        "workload",
        "mode",
        "median ms",
        "rate/s",
        "GB/s",
        "vs zc",
        "vs uvm",
        "gpu/x",
        "hit %",
        "moved",
        "pcie",
    );
    for r in rows {
        let (hit, moved) = r.strata.as_ref().map_or_else(
            || ("-".into(), "-".into()),
            |s| {
                (
                    format!("{:.1}", s.hit_rate * 100.0),
                    strata_core::format_size(s.bytes_in),
                )
            },
        );
        let _ = writeln!(
            out,
            "{:<9} {:<11} {:>10.2} {:>12.3e} {:>8.2} {:>8} {:>8} {:>8} {:>8} {:>10} {:>7}  {}",
            r.workload,
            r.mode,
            r.median_ms,
            r.rate_per_s,
            r.effective_gbps,
            opt(r.speedup_vs_zero_copy, 2),
            opt(r.speedup_vs_uvm, 2),
            opt(r.slowdown_vs_gpu_memory, 2),
            hit,
            moved,
            opt(r.pcie_fraction.map(|f| f * 100.0), 0),
            r.validated
        );
    }
    out.push_str(
        "rate/s: bfs = undirected edges of the reached component per second (Graph500 TEPS); cc, pagerank = arcs scanned per second; embed = lookups per second.\n\
         GB/s: bytes the algorithm needs from the paged array per second. vs zc / vs uvm: speedup over zero-copy / UVM (>1 is faster).\n\
         gpu/x: time over the all-in-GPU-memory time. hit %, moved: Strata's page hits and bytes copied in.\n",
    );
    let _ = writeln!(
        out,
        "pcie: Strata's bytes moved per second as % of this machine's PCIe read ceiling (`strata bench ceilings`; '-' without one)."
    );
    out
}

/// Errors writing reports.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// JSON encoding failed.
    #[error("encoding results as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `value` as pretty JSON to `path`.
///
/// # Errors
/// Encoding or I/O failures.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ReportError> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).map_err(|source| ReportError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The chart of `strata bench graph` and `strata bench embed`: per workload and
/// oversubscription factor, Strata's speed-up over zero-copy, UVM (where the data fits) and
/// all-in-GPU memory (where it fits: below 1 is the price of paging), and the bytes Strata
/// moved per second as a fraction of this machine's PCIe read ceiling.
pub fn chart(title: &str, rows: &[Row], record: &crate::record::Record) -> crate::plot::Chart {
    let groups = rows
        .iter()
        .filter(|r| r.mode.starts_with("strata"))
        .map(|r| crate::plot::Group {
            label: format!("{}\n{}", r.workload, r.mode),
            speedups: vec![
                r.speedup_vs_zero_copy,
                r.speedup_vs_uvm,
                r.slowdown_vs_gpu_memory
                    .filter(|s| *s > 0.0)
                    .map(|s| 1.0 / s),
            ],
            ceiling: r
                .pcie_fraction
                .map(|f| (f, "PCIe read (pcie-read-sm)".to_string())),
        })
        .collect();
    crate::plot::Chart {
        title: title.to_string(),
        subtitle: record.subtitle(),
        baselines: vec![
            "zero-copy".into(),
            "UVM (data fits)".into(),
            "all in GPU memory".into(),
        ],
        groups,
        no_ceilings: rows
            .iter()
            .all(|r| r.pcie_fraction.is_none())
            .then(|| record.ceilings.source.clone()),
        mark_missing: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &str, mode: &str, ms: f64) -> Row {
        Row {
            workload: workload.into(),
            mode: mode.into(),
            oversubscription: None,
            times_ms: vec![ms],
            median_ms: ms,
            work: 100,
            unit: "edges".into(),
            rate_per_s: 100.0 / ms * 1e3,
            needed_bytes: 400,
            effective_gbps: 0.0,
            speedup_vs_zero_copy: None,
            speedup_vs_uvm: None,
            slowdown_vs_gpu_memory: None,
            strata: None,
            pcie_fraction: None,
            validated: "test".into(),
        }
    }

    #[test]
    fn medians_ratios_table_and_chart() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(&[4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-12);
        assert!(median(&[]).is_nan());
        let mut rows = vec![
            row("bfs", "strata-2x", 50.0),
            row("bfs", "zero-copy", 100.0),
            row("bfs", "gpu-memory", 10.0),
        ];
        fill_ratios(&mut rows);
        assert!((rows[0].speedup_vs_zero_copy.unwrap() - 2.0).abs() < 1e-12);
        assert!((rows[0].slowdown_vs_gpu_memory.unwrap() - 5.0).abs() < 1e-12);
        assert!(rows[0].speedup_vs_uvm.is_none());
        let text = table(&rows);
        assert!(text.contains("strata-2x") && text.contains("2.00"));
        let record = crate::record::Record::new(
            "graph",
            None,
            crate::record::CeilingsUsed {
                source: "test".into(),
                values: None,
            },
            serde_json::json!({ "rows": &rows }),
        );
        let c = chart("t", &rows, &record);
        assert_eq!(c.groups.len(), 1, "one Strata row");
        let s = &c.groups[0].speedups;
        assert!(s[0].is_some_and(|v| (v - 2.0).abs() < 1e-12) && s[1].is_none());
        assert!(
            s[2].is_some_and(|v| (v - 0.2).abs() < 1e-12),
            "5x slower than GPU memory"
        );
        assert!(c.no_ceilings.is_some());
        assert_eq!(record.figures.len(), 3, "{:?}", record.figures);
    }
}
