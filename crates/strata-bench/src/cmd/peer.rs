//! `strata bench peer`: the peer tier against host-only eviction (see [`crate::peer`]).

use std::path::PathBuf;

use crate::peer::{Lenders, PeerOptions, PeerReport, Sections, preflight};
use crate::record::{CeilingsUsed, Device, Record};

/// Arguments of `strata bench peer`.
#[derive(Debug, clap::Args)]
pub struct PeerBenchArgs {
    /// Borrow SIZE of GPU N's memory for every space's peer tier, as N:SIZE (e.g. 1:16GiB);
    /// repeat for several lenders. Default: every space borrows what its working set needs
    /// from GPU 0's first neighbour.
    #[arg(long, value_parser = super::gpu_micro::parse_peer)]
    pub peer: Vec<strata_gpu::space::PeerBorrow>,
    /// GPU page-cache size of every micro-benchmark space, a power of two [default: 1GiB,
    /// --quick 256MiB]. The workloads size their caches from their data and the ratios.
    #[arg(long, value_parser = parse_size)]
    pub cache: Option<u64>,
    /// Working sets as multiples of the local cache (powers of two, at least 2).
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    pub ratios: Vec<u64>,
    /// Timed runs after one warm-up (the median is reported) [default: 3, --quick 2].
    #[arg(long)]
    pub reps: Option<usize>,
    /// Smaller spaces, graph and table: the whole run in about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Sections to run: ceilings, faults, micro, workloads or all (comma-separated).
    #[arg(long, default_value = "all")]
    pub sections: String,
    /// gpu-micro patterns (prefixes), comma-separated [default: stream-read, stream-rmw,
    /// touch-4k, touch-64k, gather-uniform, gather-zipf, rmw-random-4k].
    #[arg(long, value_delimiter = ',')]
    pub patterns: Vec<String>,
    /// log2 of the PageRank graph's vertices [default: 22, --quick 20].
    #[arg(long)]
    pub graph_scale: Option<u32>,
    /// Embedding table rows of 128 floats [default: 4194304, --quick 1048576].
    #[arg(long)]
    pub embed_rows: Option<u64>,
    /// Correctness only: `strata bench graph --check` and `strata bench embed --check` with
    /// every Strata space borrowing its peer tier; fails on any wrong result.
    #[arg(long)]
    pub check: bool,
    /// Where to write the JSON record.
    #[arg(long, default_value = "strata-bench-peer.json")]
    pub json: PathBuf,
    /// Where to write the chart (PATH.svg and PATH.png).
    #[arg(long, default_value = "strata-bench-peer")]
    pub plot: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_core::units::parse_size(s).map_err(|e| e.to_string())
}

/// The options `args` ask for, with `lenders` (from [`preflight`]).
///
/// # Errors
/// Bad sections or numbers.
pub fn options(args: &PeerBenchArgs, lenders: Lenders) -> anyhow::Result<PeerOptions> {
    let mut o = PeerOptions::defaults(args.quick, lenders);
    if let Some(c) = args.cache {
        o.cache_bytes = c;
    }
    o.ratios.clone_from(&args.ratios);
    if let Some(r) = args.reps {
        o.reps = r;
    }
    o.sections = Sections::parse(&args.sections).map_err(anyhow::Error::msg)?;
    if !args.patterns.is_empty() {
        o.patterns.clone_from(&args.patterns);
    }
    if let Some(s) = args.graph_scale {
        o.graph_scale = s;
    }
    if let Some(r) = args.embed_rows {
        o.embed_rows = r;
    }
    o.validate()?;
    Ok(o)
}

fn size(b: u64) -> String {
    strata_core::units::format_size(b)
}

fn print(report: &PeerReport) {
    println!(
        "strata bench peer on {}: cache {}, ratios {:?}, lenders {:?}, remote access {}, touch kernel {} block(s) of 256 threads per SM",
        report.gpu,
        size(report.options.cache_bytes),
        report.options.ratios,
        report.options.lenders,
        report.remote_access,
        report.touch_blocks_per_sm
    );
    if !report.ceilings.is_empty() {
        println!("\nNVLink ceilings measured now (plain kernels over borrowed memory):");
        for c in &report.ceilings {
            println!(
                "  {:<32} {:>8.2} Mpages/s {:>8.1} GB/s",
                c.name, c.mpages, c.gbps
            );
        }
    }
    if !report.faults.is_empty() {
        println!(
            "\nfaults: every page touched once per run, shuffled (same order each run)\n  mode           page ratio  from peer (M/s, GB/s) | all faults M/s | host-only M/s | x  | hits  faults  peer loads  stale | mean fault ns, in flight"
        );
        let rows = report.faults.iter().chain(&report.faults_half_grid);
        for r in rows {
            let host = report.faults.iter().find(|h| {
                h.mode == "host-only" && h.page_size == r.page_size && h.ratio == r.ratio
            });
            let (hrate, x) = match host {
                Some(h) if r.mode != "host-only" && h.fault_mpages > 0.0 => (
                    format!("{:>8.2}", h.fault_mpages),
                    format!("{:>5.2}x", r.fault_mpages / h.fault_mpages),
                ),
                _ => ("       -".into(), "     -".into()),
            };
            let p = r.stats.peer.as_ref();
            println!(
                "  {:<14} {:>6} x{}  {:>8.2} {:>7.1} | {:>8.2} | {hrate} | {x} | {} {} {} {} | {} ns, {:.0} of {} warps",
                r.mode,
                size(r.page_size),
                r.ratio,
                r.peer_mpages,
                r.peer_gbps,
                r.fault_mpages,
                r.stats.hits,
                r.stats.faults,
                p.map_or(0, |p| p.loads),
                p.map_or(0, |p| p.stale),
                r.mean_fault_ns,
                r.faults_in_flight,
                r.warps
            );
        }
    }
    if !report.micro.is_empty() {
        println!(
            "\ngpu-micro, host-only eviction vs the peer tier (zero-copy for reference)\n  pattern            page  ratio unit        host-only       peer      x  zero-copy | peer loads / faults / hits"
        );
        for p in &report.micro {
            println!(
                "  {:<18} {:>6} x{} {:<10} {:>10.2} {:>10.2} {:>6.2}x {:>10} | {} / {} / {}",
                p.pattern,
                size(p.page_size),
                p.ratio,
                p.unit,
                p.host_only.rate,
                p.peer.rate,
                p.speedup,
                p.zero_copy
                    .map_or_else(|| "-".into(), |z| format!("{:.2}", z.rate)),
                p.peer_loads,
                p.faults,
                p.hits
            );
        }
    }
    if !report.workloads.is_empty() {
        println!(
            "\nworkloads, host-only eviction vs the peer tier\n  workload  ratio  data      borrowed  host-only ms    peer ms      x  gpu-memory ms | peer loads / faults | checked"
        );
        for w in &report.workloads {
            println!(
                "  {:<9} {:>4}x {:>9} {:>9} {:>12.2} {:>10.2} {:>6.2}x {:>13} | {} / {} | {}",
                w.workload,
                w.oversubscription,
                size(w.data_bytes),
                size(w.borrowed_bytes),
                w.host_only_ms,
                w.peer_ms,
                w.speedup,
                w.gpu_memory_ms
                    .map_or_else(|| "-".into(), |m| format!("{m:.2}")),
                w.peer_loads,
                w.faults,
                w.validated
            );
        }
    }
    let verdicts = crate::peer::verdicts(report);
    if !verdicts.is_empty() {
        println!("\ntargets (issue 13):");
        for v in &verdicts {
            println!(
                "  {:<4} {:<48} {:>9.2} {} (target {} {})",
                if v.met { "ok" } else { "MISS" },
                v.what,
                v.value,
                v.unit,
                v.target,
                v.unit
            );
        }
    }
}

/// Runs `strata bench peer`: refuses at once without a second GPU, then runs, prints, and
/// writes the record and the chart.
///
/// # Errors
/// One GPU (or none), a bad `--peer` or option, GPU failures, wrong workload results,
/// unwritable files.
pub fn bench(args: &PeerBenchArgs) -> anyhow::Result<()> {
    let lenders = preflight(strata_gpu::probe::gpus(), crate::peer::BORROWER, &args.peer)?;
    let opts = options(args, lenders)?;
    if args.check {
        // Small data: borrow what it needs, or what --peer says.
        let graph =
            crate::peer::pagerank_config(&opts, opts.lenders.for_working_set(8 << 20), None);
        super::workloads::graph_check(&graph)?;
        let embed = crate::peer::embed_config(&opts, opts.lenders.for_working_set(32 << 20));
        super::workloads::embed_check(&embed)?;
        println!("CHECK PASSED: graph and embedding checks with the peer tier");
        return Ok(());
    }
    let report = crate::peer::run(&opts, &mut |line| eprintln!("{line}"))?;
    print(&report);
    let ceilings = crate::ceilings::Ceilings {
        key: format!(
            "measured in this run over GPU {}'s memory",
            opts.lenders.first_gpu()
        ),
        probes: report
            .ceilings
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    crate::ceilings::Probe {
                        value: Some(if c.mpages > 0.0 { c.mpages } else { c.gbps }),
                        unit: if c.mpages > 0.0 { "Mpages/s" } else { "GB/s" }.into(),
                        note: c.note.clone(),
                    },
                )
            })
            .collect(),
    };
    let used = CeilingsUsed {
        source: if report.ceilings.is_empty() {
            "none (--sections without ceilings)".into()
        } else {
            "NVLink probes in this run".into()
        },
        values: (!report.ceilings.is_empty()).then_some(ceilings),
    };
    let mut body = serde_json::to_value(&report)?;
    body["verdicts"] = serde_json::to_value(crate::peer::verdicts(&report))?;
    let mut record = Record::new("peer", Device::of(crate::peer::BORROWER), used, body);
    record.figures = crate::peer::figures(&report);
    super::write_record_and_chart(
        &record,
        &args.json,
        &crate::peer::chart(&report, &record),
        &args.plot,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: PeerBenchArgs,
    }

    fn parse(line: &[&str]) -> Result<PeerBenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("peer").chain(line.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_refused() {
        let a = parse(&[
            "--peer",
            "1:8GiB",
            "--peer",
            "2:4GiB",
            "--cache",
            "512MiB",
            "--ratios",
            "2,4,8",
            "--quick",
            "--json",
            "/tmp/x.json",
            "--plot",
            "/tmp/x",
        ])
        .unwrap();
        assert_eq!(a.peer.len(), 2);
        assert_eq!(a.peer[0].gpu, 1);
        assert_eq!(a.peer[0].bytes, 8 << 30);
        assert_eq!(a.cache, Some(512 << 20));
        assert_eq!(a.ratios, vec![2, 4, 8]);
        let o = options(&a, Lenders::Given(a.peer.clone())).unwrap();
        assert_eq!(o.cache_bytes, 512 << 20);
        assert_eq!(o.reps, 2, "--quick");
        assert!(parse(&["--peer", "1"]).is_err(), "no size");
        assert!(parse(&["--peer", "x:1GiB"]).is_err(), "no GPU number");
        assert!(parse(&["--peer", "1:lots"]).is_err(), "no size");
        assert!(parse(&["--ratios", "two"]).is_err());
        let lenders = || Lenders::Auto { gpu: 1 };
        for bad in [
            vec!["--ratios", "3"],
            vec!["--cache", "100MiB"],
            vec!["--sections", "nothing"],
            vec!["--reps", "0"],
        ] {
            let a = parse(&bad).unwrap();
            assert!(options(&a, lenders()).is_err(), "{bad:?}");
        }
        let d = options(&parse(&[]).unwrap(), lenders()).unwrap();
        assert_eq!(d.cache_bytes, 1 << 30);
        assert_eq!(d.patterns.len(), crate::peer::DEFAULT_PATTERNS.len());
    }
}
