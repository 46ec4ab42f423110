//! `strata bench run`: unmodified programs at the same memory limit, each way in a cgroup v1
//! memory group of the limit: the kernel swapping to zram (LZ4) and to a swap file
//! ([`crate::kernel_swap`] says why its OOM kill is replaced by retries), and `strata run`
//! over an LZ4 memory store, a file store, a memory node on loopback and an LZ4 memory node
//! (nodes started in this process, outside the group). A Strata row's group holds everything
//! its process charges, with swap off and the OOM kill on; its `--memory` budget is the limit
//! less a margin measured first in a group without a limit ([`crate::strata_cgroup`]); a row
//! whose margin leaves no budget, or that the group OOM-kills, is a failed row that says so.
//! `--strata-cgroup false` runs the Strata rows as before, `--memory LIMIT` and no group.
//! Each program first runs without a limit: its output is the
//! reference every other run must print, and its time the "no limit" row. Reports wall time,
//! faults, bytes moved and the machine's load, as a JSON record and a chart of Strata's
//! speed-up over each kernel baseline. The kernel baselines need root; they are set up and
//! torn down here (swap off, zram reset, swap file removed, also on Ctrl-C or a panic).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use strata_core::{format_size, parse_size};

use crate::kernel_swap::{SwapCgroup, SwapOn};
use crate::plot::{Chart, Group};
use crate::record::{CeilingsUsed, Record};
use crate::strata_cgroup::{Charge, GroupRun, StrataCgroup, next_budget};

/// `strata bench run`.
#[derive(Debug, clap::Args)]
pub struct RunBenchArgs {
    /// The memory limit every contestant gets: the memory group's limit (`strata run
    /// --memory` is the limit less what the pager does not page, measured).
    #[arg(long, default_value = "64MiB")]
    memory: String,
    /// Each program's data, as a multiple of the limit.
    #[arg(long, default_value_t = 4)]
    oversubscription: u64,
    /// Programs, comma-separated: sort (`sort -S` of a generated file), numpy (NumPy sorts
    /// and checks an array), stress-ng (`--vm-method incdec --verify`, sequential sweeps).
    #[arg(long, default_value = "sort,numpy,stress-ng")]
    programs: String,
    /// Contestants, comma-separated: zram, swapfile, strata-lz4 (LZ4 memory store in the
    /// process), strata-file, strata-remote (memory node on loopback), strata-lz4-node (LZ4
    /// pages held by a memory node on loopback, outside the group as zram's pool is).
    #[arg(
        long,
        default_value = "zram,swapfile,strata-lz4,strata-file,strata-remote,strata-lz4-node"
    )]
    contestants: String,
    /// Run the Strata rows in a memory group of the limit (true), or as before: `--memory`
    /// of the limit and no group (false), to compare.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    strata_cgroup: bool,
    /// Runs of each program by each contestant (the median is charted).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Extra `strata run` options for the Strata contestants (e.g. "--page-size 16KiB").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    strata_options: String,
    /// Seconds one run may take before it is killed (the row then says so).
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
    /// Where the input file, the file store and the swap file go (a disk, not tmpfs).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Results (JSON record); the chart is written next to it (.svg and .png).
    #[arg(long, default_value = "strata-bench-run.json")]
    out: PathBuf,
}

/// One run of one program by one contestant.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    program: String,
    contestant: String,
    repeat: usize,
    wall_s: f64,
    /// Kernel: major faults in the memory group. Strata: pager faults.
    faults: u64,
    /// Bytes read from the swap device or store.
    bytes_in: u64,
    /// Bytes written to the swap device or store.
    bytes_out: u64,
    /// Kernel: times the group waited in OOM and was woken to retry reclaim.
    oom_retries: u64,
    /// Kernel: seconds its limit stood one page higher after a wake-up.
    over_limit_s: f64,
    /// Strata: seconds the program's threads waited on faults (summed over threads).
    fault_wait_s: f64,
    /// Strata: the program's peak resident memory (summed over its paged processes; the
    /// budget, the rest of the program, and a memory store's contents). Kernel rows: 0, as
    /// their memory group holds them to the limit.
    peak_rss_bytes: u64,
    /// The memory group's limit; none for a row outside any group (`--strata-cgroup false`).
    cgroup_limit_bytes: Option<u64>,
    /// Strata: the `--memory` budget it ran with.
    budget_bytes: Option<u64>,
    /// In a group: its peak of everything charged, page cache included
    /// (`memory.max_usage_in_bytes`).
    max_usage_bytes: u64,
    /// Strata in a group: the charge when its unreclaimable part peaked (sampled every 5 ms).
    peak_charge: Option<Charge>,
    /// The program's own figure, where it prints one (stress-ng: bogo ops/s, real time).
    program_figure: Option<f64>,
    /// 1-minute load average when the run started (2 cores shared with others).
    load_before: f64,
    /// Exited 0 and printed the reference output.
    ok: bool,
    note: String,
}

const CONTESTANTS: [&str; 6] = [
    "zram",
    "swapfile",
    "strata-lz4",
    "strata-file",
    "strata-remote",
    "strata-lz4-node",
];

/// The Strata contestants, in chart order.
const STRATA: [&str; 4] = [
    "strata-lz4",
    "strata-file",
    "strata-remote",
    "strata-lz4-node",
];

/// Whether a contestant pages over a memory node (the benchmark starts one for them).
fn over_node(contestant: &str) -> bool {
    matches!(contestant, "strata-remote" | "strata-lz4-node")
}

fn label(contestant: &str) -> &'static str {
    match contestant {
        "zram" => "kernel, zram lz4 swap",
        "swapfile" => "kernel, swap file",
        "strata-lz4" => "strata run, lz4 memory store",
        "strata-file" => "strata run, file store (O_DIRECT)",
        "strata-remote" => "strata run, memory node (loopback)",
        "strata-lz4-node" => "strata run, lz4 on a memory node",
        _ => "no limit",
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Programs by name with their command lines.
type Programs = Vec<(String, Vec<String>)>;

/// Where a program writes its own figure: stress-ng's YAML report (`--yaml`), read after each
/// run and removed before the next.
fn figure_file(dir: &Path, program: &str) -> Option<PathBuf> {
    (program == "stress-ng").then(|| dir.join("run-stress-ng-metrics.yaml"))
}

/// The program's own figure from its report file (removed once read): stress-ng's
/// `bogo-ops-per-second-real-time`.
fn own_figure(file: Option<&Path>) -> Option<f64> {
    let file = file?;
    let text = std::fs::read_to_string(file).ok();
    let _ = std::fs::remove_file(file);
    text?.lines().find_map(|l| {
        l.trim()
            .strip_prefix("bogo-ops-per-second-real-time:")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The programs, with data of `data` bytes. Sort's input file is written into `dir` (and
/// removed when the returned guards drop).
fn programs(
    names: &str,
    data: u64,
    dir: &Path,
) -> anyhow::Result<(Programs, Vec<crate::cleanup::Temporary>)> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    let mib = (data >> 20).max(1).to_string();
    for name in names.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let argv: Vec<String> = match name {
            "sort" => {
                let input = crate::cleanup::temporary_name(dir, "run-sort-input", "txt");
                let guard = crate::cleanup::Temporary::register(input.clone());
                write_lines(&input, data)?;
                files.push(guard);
                // -S of three times the input: sort keeps lines and their index in memory.
                // (A bare number would mean KiB to sort: say bytes.)
                vec![
                    "sort".into(),
                    "-S".into(),
                    format!("{}b", data * 3),
                    "--parallel=1".into(),
                    input.to_string_lossy().into_owned(),
                ]
            }
            "numpy" => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../strata-run/tests/programs/numpy_sort.py");
                vec![
                    "python3".into(),
                    script.to_string_lossy().into_owned(),
                    "1".into(),
                    mib.clone(),
                ]
            }
            "stress-ng" => vec![
                "stress-ng".into(),
                "--vm".into(),
                "1".into(),
                "--vm-bytes".into(),
                data.to_string(),
                "--vm-method".into(),
                "incdec".into(),
                "--verify".into(),
                "--vm-ops".into(),
                "4".into(),
                "--vm-keep".into(),
                "--metrics-brief".into(),
                "--yaml".into(),
                figure_file(dir, "stress-ng")
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ],
            other => bail!("unknown program {other:?}; choose from sort, numpy, stress-ng"),
        };
        out.push((name.to_string(), argv));
    }
    Ok((out, files))
}

/// Reads the programs' input files (sort's) into the page cache from this process, outside
/// any group, before each measured run: every contestant then starts with its input cached
/// and charged elsewhere, as a program reading a data set others have read does. Otherwise
/// whatever a previous row's group left cached decides how much of the input a run reads
/// from the disk and charges to its own group (by hand, sort over a memory node at a
/// 27.25 MiB budget: 4.2-4.5 s warm, 5.5-8.4 s with 2.5 MiB of its input gone; session 13).
fn warm_inputs(inputs: &[crate::cleanup::Temporary]) {
    for input in inputs {
        // Best effort: a file that cannot be read fails the program itself, with its reason.
        if let Ok(mut f) = std::fs::File::open(input.path()) {
            let _ = std::io::copy(&mut f, &mut std::io::sink());
        }
    }
}

/// Runs `argv` under `timeout -s KILL`; returns (seconds, exited 0, stdout).
fn timed(
    argv: &[String],
    limit: Duration,
    env: &[(&str, &str)],
) -> anyhow::Result<(f64, bool, String)> {
    let t = Instant::now();
    let out = Command::new("timeout")
        .args(["-s", "KILL", &limit.as_secs().to_string()])
        .args(argv)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {argv:?}"))?;
    Ok((
        t.elapsed().as_secs_f64(),
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// The memory node on loopback the remote contestant uses (started on first need).
struct Node {
    node: strata_net::MemoryNode,
    token: String,
}

fn start_node(capacity: u64) -> anyhow::Result<Node> {
    let token = format!(
        "strata-bench-run-{}-{:x}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ 0x5eed_5eed
    );
    // Within the host's memory, without overcommit: the node then lends each process its
    // chunks as files it commits at once (`strata_net::lent_file_store`), whose pages are
    // charged to this process, outside the program's group, as zram's pool is.
    let opts = strata_net::ServeOptions::new("127.0.0.1:0".parse()?, capacity, token.clone());
    let node = strata_net::MemoryNode::start(opts).context("starting a memory node on loopback")?;
    Ok(Node { node, token })
}

/// What the benchmark's memory node lends: half the host's memory (each process borrows
/// chunks as its arena grows, twice its first large request at first), at most 16 GiB.
fn node_capacity() -> u64 {
    let host = crate::record::Machine::this().memory_bytes;
    let host = if host == 0 { 4 << 30 } else { host };
    (host / 2).min(16 << 30)
}

/// What the Strata rows need besides the contestant and the program.
struct StrataSetup<'a> {
    strata: &'a Path,
    args: &'a RunBenchArgs,
    node: Option<&'a Node>,
    dir: &'a Path,
    time_limit: Duration,
}

/// How often the charge of a timed row's group is sampled (a measuring run: every 1 ms).
const TIMED_SAMPLE: Duration = Duration::from_millis(5);
const MEASURE_SAMPLE: Duration = Duration::from_millis(1);
/// Measurements of a program's margin before it is given up as not settling.
const MAX_MEASUREMENTS: usize = 5;

/// One measuring run of the budget search: the program under `strata run --memory
/// budget_bytes` in a group without a limit.
#[derive(Debug, Clone, serde::Serialize)]
struct Measurement {
    budget_bytes: u64,
    seconds: f64,
    ok: bool,
    /// The charge when its unreclaimable part peaked.
    peak: Charge,
    max_usage_bytes: u64,
}

/// The `--memory` budget a Strata contestant gets for a program in a group of the limit.
#[derive(Debug, Clone, serde::Serialize)]
struct BudgetSearch {
    program: String,
    contestant: String,
    limit_bytes: u64,
    measurements: Vec<Measurement>,
    /// The budget (none: the program cannot run in the limit this way; `outcome` says why).
    budget_bytes: Option<u64>,
    /// What rose above the budget in the last measurement: what the pager does not page.
    margin_bytes: Option<u64>,
    outcome: String,
}

/// The granule of a budget: the page size given in `--strata-options`, at least 64 KiB.
fn budget_granule(strata_options: &str) -> u64 {
    let mut words = strata_options.split_whitespace();
    let mut page = None;
    while let Some(w) = words.next() {
        if let Some(v) = w.strip_prefix("--page-size=") {
            page = parse_size(v).ok();
        } else if w == "--page-size" {
            page = words.next().and_then(|v| parse_size(v).ok());
        }
    }
    page.unwrap_or(0).max(64 << 10)
}

/// Finds the largest budget whose run, measured in a group without a limit, leaves what
/// it charges beside the budget (and [`crate::strata_cgroup::SLACK_BYTES`]) inside `limit`.
fn find_budget(
    setup: &StrataSetup<'_>,
    contestant: &str,
    name: &str,
    program: &[String],
    reference: &str,
    limit: u64,
) -> anyhow::Result<BudgetSearch> {
    let page = budget_granule(&setup.args.strata_options);
    let ask = BudgetAsk {
        program: name,
        contestant,
        limit,
        page,
        slack: crate::strata_cgroup::SLACK_BYTES,
        reference,
        time_limit: setup.time_limit,
    };
    search_budget(&ask, |budget| {
        let group = StrataCgroup::new(None)?;
        Ok(run_strata(setup, contestant, program, budget, Some(&group))?.0)
    })
}

/// What a budget search is for.
struct BudgetAsk<'a> {
    program: &'a str,
    contestant: &'a str,
    limit: u64,
    /// Budgets are whole multiples of this.
    page: u64,
    /// Room the measured peak must leave below the limit.
    slack: u64,
    /// The output a good run prints.
    reference: &'a str,
    time_limit: Duration,
}

/// The budget search, with `measure` running the program at a budget in a group without a
/// limit.
fn search_budget(
    ask: &BudgetAsk<'_>,
    mut measure: impl FnMut(u64) -> anyhow::Result<GroupRun>,
) -> anyhow::Result<BudgetSearch> {
    let (limit, page) = (ask.limit, ask.page);
    let mut search = BudgetSearch {
        program: ask.program.into(),
        contestant: ask.contestant.into(),
        limit_bytes: limit,
        measurements: Vec::new(),
        budget_bytes: None,
        margin_bytes: None,
        outcome: String::new(),
    };
    let mut budget = limit / page * page;
    for _ in 0..MAX_MEASUREMENTS {
        let r = measure(budget)?;
        let ok = r.success && r.stdout == ask.reference && r.oom_kills == 0;
        let peak = r.peak.unreclaimable_bytes;
        search.measurements.push(Measurement {
            budget_bytes: budget,
            seconds: r.seconds,
            ok,
            peak: r.peak,
            max_usage_bytes: r.max_usage_bytes,
        });
        search.margin_bytes = Some(peak.saturating_sub(budget));
        if !ok {
            search.outcome = format!(
                "{} while measuring its margin at a budget of {}",
                row_note(&r, false, ask.time_limit),
                format_size(budget)
            );
            return Ok(search);
        }
        match next_budget(limit, budget, peak, page, ask.slack) {
            Ok(None) => {
                search.budget_bytes = Some(budget);
                search.outcome = format!(
                    "fits: {} charged beside a budget of {}",
                    format_size(peak.saturating_sub(budget)),
                    format_size(budget)
                );
                return Ok(search);
            }
            Ok(Some(next)) => budget = next,
            Err(margin) => {
                search.outcome = format!(
                    "does not fit: {} charged beside a budget of {} ({} that the pager does not page) leaves no budget in {}",
                    format_size(peak.saturating_sub(budget)),
                    format_size(budget),
                    format_size(margin),
                    format_size(limit)
                );
                return Ok(search);
            }
        }
    }
    search.outcome = format!(
        "does not fit: the margin still grew after {MAX_MEASUREMENTS} measurements (last budget {})",
        format_size(budget)
    );
    Ok(search)
}

/// Runs the benchmark.
pub fn run(args: &RunBenchArgs) -> anyhow::Result<()> {
    crate::cleanup::install();
    let limit = parse_size(&args.memory)?;
    let data = limit * args.oversubscription;
    let time_limit = Duration::from_secs(args.time_limit);
    let contestants: Vec<&str> = args
        .contestants
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = contestants.iter().find(|c| !CONTESTANTS.contains(c)) {
        bail!(
            "unknown contestant {bad:?}; choose from {}",
            CONTESTANTS.join(", ")
        );
    }
    let kernel = contestants
        .iter()
        .any(|c| matches!(*c, "zram" | "swapfile"));
    let strata_grouped = args.strata_cgroup && contestants.iter().any(|c| STRATA.contains(c));
    if kernel || strata_grouped {
        crate::kernel_swap::check()?;
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("strata-bench-run"));
    std::fs::create_dir_all(&dir)?;
    crate::cleanup::remove_stale(&dir);
    let strata = std::env::current_exe()?;
    let (programs, inputs) = programs(&args.programs, data, &dir)?;
    let node = if contestants.iter().any(|c| over_node(c)) {
        Some(start_node(node_capacity())?)
    } else {
        None
    };
    let setup = StrataSetup {
        strata: &strata,
        args,
        node: node.as_ref(),
        dir: &dir,
        time_limit,
    };
    // Swap capacity: room for every program's data several times over.
    let swap_bytes = (data * 6).max(1 << 30);
    let mut rows: Vec<Row> = Vec::new();
    let mut budgets: Vec<BudgetSearch> = Vec::new();
    let mut swappiness = None;
    for (name, program) in &programs {
        let load = load_average();
        let figure = figure_file(&dir, name);
        let (wall, ok, reference) = timed(program, time_limit, &[])?;
        if !ok {
            bail!(
                "{name} fails on its own ({program:?}); install it (sort: coreutils, numpy: pip install numpy, stress-ng: apt-get install stress-ng)"
            );
        }
        let mut free = Row::new(name, "no limit");
        free.wall_s = wall;
        free.program_figure = own_figure(figure.as_deref());
        free.load_before = load;
        free.ok = true;
        rows.push(free);
        print_row(rows.last());
        for &contestant in &contestants {
            // One swap device at a time, on only while its contestant runs.
            let swap = match contestant {
                "zram" => Some(SwapOn::zram(swap_bytes)?),
                "swapfile" => Some(SwapOn::file(&dir, swap_bytes)?),
                _ => None,
            };
            // Strata in a group: its budget is measured first (swap is off: `swap` is None).
            let search = if swap.is_none() && args.strata_cgroup {
                let s = find_budget(&setup, contestant, name, program, &reference, limit)?;
                eprintln!(
                    "{name:<10} {:<36} budget search: {}",
                    label(contestant),
                    s.outcome
                );
                Some(s)
            } else {
                None
            };
            for repeat in 0..args.repeats {
                warm_inputs(&inputs);
                let load_before = load_average();
                let mut row = if let Some(swap) = &swap {
                    let group = SwapCgroup::new(limit)?;
                    swappiness.get_or_insert_with(|| group.swappiness());
                    let r = group.run(program, time_limit)?;
                    let good = r.success && r.stdout == reference;
                    let mut row = Row::new(name, contestant);
                    row.wall_s = r.seconds;
                    row.faults = r.major_faults;
                    row.bytes_in = r.swap_in_bytes;
                    row.bytes_out = r.swap_out_bytes;
                    row.oom_retries = r.oom_retries;
                    row.over_limit_s = r.over_limit_seconds;
                    row.cgroup_limit_bytes = Some(limit);
                    row.max_usage_bytes = r.max_usage_bytes;
                    row.ok = good && swap.is_on();
                    row.note = if r.oom_kills > 0 {
                        format!("{} OOM kills in the group", r.oom_kills)
                    } else if !good {
                        "failed: the time limit or wrong output".into()
                    } else {
                        String::new()
                    };
                    row
                } else {
                    match &search {
                        Some(BudgetSearch {
                            budget_bytes: Some(budget),
                            ..
                        }) => {
                            let group = StrataCgroup::new(Some(limit))?;
                            strata_row(
                                &setup,
                                contestant,
                                program,
                                &reference,
                                *budget,
                                Some(&group),
                            )?
                        }
                        Some(s) => {
                            let mut row = Row::new(name, contestant);
                            row.cgroup_limit_bytes = Some(limit);
                            row.note = if s.outcome.starts_with("failed") {
                                s.outcome.clone()
                            } else {
                                format!("failed: {}", s.outcome)
                            };
                            row
                        }
                        None => strata_row(&setup, contestant, program, &reference, limit, None)?,
                    }
                };
                row.name_run(name, repeat, load_before);
                row.program_figure = own_figure(figure.as_deref());
                rows.push(row);
                print_row(rows.last());
            }
            drop(swap);
            budgets.extend(search);
        }
    }
    if let Some(n) = node {
        n.node.shutdown();
    }
    let results = serde_json::json!({
        "limit_bytes": limit,
        "data_bytes": data,
        "oversubscription": args.oversubscription,
        "strata_options": args.strata_options,
        "kernel_memcg": "cgroup v1, OOM kill disabled, woken to retry (see oom_retries); zram's compressed pool is kernel memory outside the group",
        "strata_memcg": if args.strata_cgroup {
            "cgroup v1 of the limit: memory.limit_in_bytes and memory.memsw.limit_in_bytes = limit, swappiness 0, swap off, OOM kill on (a kill fails the row). Charged in the group: the program and `strata run` (arena pages up to the budget, small allocations, stacks, the pager's tables, the LZ4 memory store's compressed pages, kernel memory, page cache read). Outside it: the memory node's pages (strata-remote, strata-lz4-node: a node in the benchmark's process). Budget = the limit less the margin measured in a group without a limit (see budgets)"
        } else {
            "none: strata run --memory LIMIT outside any memory group"
        },
        "strata_slack_bytes": crate::strata_cgroup::SLACK_BYTES,
        "inputs": "read into the page cache by the bench, outside the groups, before each measured run",
        "kernel_swappiness": swappiness,
        "page_cluster": std::fs::read_to_string("/proc/sys/vm/page-cluster").unwrap_or_default().trim(),
        "programs": programs.iter().map(|(n, a)| serde_json::json!({"name": n, "argv": a})).collect::<Vec<_>>(),
        "budgets": budgets,
        "rows": rows,
    });
    let record = Record::new(
        "run",
        None,
        CeilingsUsed {
            source: "none: whole-program times against the kernel's swap in the same run".into(),
            values: None,
        },
        results,
    );
    record.write(&args.out)?;
    let (svg, png) = crate::plot::write(&chart(&rows, &record), &args.out.with_extension(""))?;
    println!();
    summary(&rows);
    println!(
        "limit {}, data {} per program; wrote {}, {} and {}",
        format_size(limit),
        format_size(data),
        args.out.display(),
        svg.display(),
        png.display()
    );
    Ok(())
}

impl Row {
    /// A row of `program` by `contestant` that has not run (failed, zeros).
    fn new(program: &str, contestant: &str) -> Self {
        Self {
            program: program.into(),
            contestant: contestant.into(),
            repeat: 0,
            wall_s: 0.0,
            faults: 0,
            bytes_in: 0,
            bytes_out: 0,
            oom_retries: 0,
            over_limit_s: 0.0,
            fault_wait_s: 0.0,
            peak_rss_bytes: 0,
            cgroup_limit_bytes: None,
            budget_bytes: None,
            max_usage_bytes: 0,
            peak_charge: None,
            program_figure: None,
            load_before: 0.0,
            ok: false,
            note: String::new(),
        }
    }

    fn name_run(&mut self, program: &str, repeat: usize, load_before: f64) {
        program.clone_into(&mut self.program);
        self.repeat = repeat;
        self.load_before = load_before;
    }
}

/// Runs `program` under `strata run --memory budget` for `contestant`, in `group` or (none)
/// outside any group; returns the run and the `--stats` report.
fn run_strata(
    setup: &StrataSetup<'_>,
    contestant: &str,
    program: &[String],
    budget: u64,
    group: Option<&StrataCgroup>,
) -> anyhow::Result<(GroupRun, serde_json::Value)> {
    let stats = crate::cleanup::temporary_name(setup.dir, "run-stats", "json");
    let stats_guard = crate::cleanup::Temporary::register(stats.clone());
    let _ = std::fs::remove_file(&stats);
    let mut argv: Vec<String> = vec![
        setup.strata.to_string_lossy().into_owned(),
        "run".into(),
        "--memory".into(),
        format!("{budget}b"),
        "--stats".into(),
        stats.to_string_lossy().into_owned(),
    ];
    let mut env: Vec<(&str, &str)> = Vec::new();
    let node = || setup.node.context("no memory node");
    match contestant {
        "strata-lz4" => argv.extend([
            "--store".into(),
            "memory".into(),
            "--codec".into(),
            "lz4".into(),
        ]),
        "strata-file" => {
            // O_DIRECT, like the kernel's swap file I/O: no page cache outside the budget.
            argv.extend(["--store".into(), format!("file:{}", setup.dir.display())]);
            env.push(("STRATA_FILE_DIRECT", "true"));
        }
        "strata-remote" => {
            argv.extend([
                "--store".into(),
                format!("remote:{}", node()?.node.address()),
            ]);
            env.push(("STRATA_REMOTE_TOKEN", &node()?.token));
        }
        "strata-lz4-node" => {
            // Pages compressed in the program, held by the node outside its group.
            argv.extend([
                "--store".into(),
                format!("remote:{}", node()?.node.address()),
                "--codec".into(),
                "lz4".into(),
            ]);
            env.push(("STRATA_REMOTE_TOKEN", &node()?.token));
        }
        other => bail!("not a strata contestant: {other}"),
    }
    argv.extend(
        setup
            .args
            .strata_options
            .split_whitespace()
            .map(String::from),
    );
    argv.push("--".into());
    argv.extend(program.iter().cloned());
    let run = match group {
        Some(group) => {
            let every = if group.limit().is_some() {
                TIMED_SAMPLE
            } else {
                MEASURE_SAMPLE
            };
            group.run(&argv, &env, setup.time_limit, every)?
        }
        None => {
            let (seconds, success, stdout) = timed(&argv, setup.time_limit, &env)?;
            GroupRun {
                seconds,
                success,
                stdout,
                peak: Charge::default(),
                max_usage_bytes: 0,
                oom_kills: 0,
                swap_seen: Vec::new(),
            }
        }
    };
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stats).unwrap_or_default()).unwrap_or_default();
    drop(stats_guard);
    Ok((run, v))
}

/// A timed Strata row: in `group` (a group of the limit) or outside any.
fn strata_row(
    setup: &StrataSetup<'_>,
    contestant: &str,
    program: &[String],
    reference: &str,
    budget: u64,
    group: Option<&StrataCgroup>,
) -> anyhow::Result<Row> {
    let (r, v) = run_strata(setup, contestant, program, budget, group)?;
    let t = &v["totals"];
    let mut row = Row::new("", contestant);
    row.wall_s = r.seconds;
    row.faults = t["faults"].as_u64().unwrap_or(0);
    row.bytes_in = t["bytes_read"].as_u64().unwrap_or(0);
    row.bytes_out = t["bytes_written"].as_u64().unwrap_or(0);
    row.fault_wait_s = t["fault_wait_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
    row.peak_rss_bytes = v["processes"].as_array().map_or(0, |ps| {
        ps.iter().filter_map(|p| p["peak_rss_bytes"].as_u64()).sum()
    });
    row.budget_bytes = Some(budget);
    if let Some(group) = group {
        row.cgroup_limit_bytes = group.limit();
        row.max_usage_bytes = r.max_usage_bytes;
        row.peak_charge = Some(r.peak);
    }
    row.ok = r.success && r.stdout == reference && r.oom_kills == 0 && r.swap_seen.is_empty();
    row.note = row_note(&r, row.ok, setup.time_limit);
    Ok(row)
}

/// Why a Strata row failed (empty when it did not).
fn row_note(r: &GroupRun, ok: bool, time_limit: Duration) -> String {
    if ok {
        String::new()
    } else if !r.swap_seen.is_empty() {
        format!(
            "void: swap was on during the row ({})",
            r.swap_seen.join(", ")
        )
    } else if r.oom_kills > 0 {
        format!(
            "failed: OOM-killed in its memory group ({} kills; peak charge {}, {} unreclaimable)",
            r.oom_kills,
            format_size(r.max_usage_bytes),
            format_size(r.peak.unreclaimable_bytes)
        )
    } else if r.seconds >= time_limit.as_secs_f64() {
        format!(
            "failed: killed at the time limit ({} s)",
            time_limit.as_secs()
        )
    } else if r.success {
        "failed: wrong output".into()
    } else {
        "failed: exited with an error (see stderr)".into()
    }
}

fn print_row(r: Option<&Row>) {
    if let Some(r) = r {
        eprintln!(
            "{:<10} {:<36} {:>8.2} s  faults {:>9}  in {:>10}  out {:>10}  oom retries {:>4} ({:.2} s over)  peak RSS {:>10}{}{}  load {:.1}  {}",
            r.program,
            label(&r.contestant),
            r.wall_s,
            r.faults,
            format_size(r.bytes_in),
            format_size(r.bytes_out),
            r.oom_retries,
            r.over_limit_s,
            if r.peak_rss_bytes > 0 {
                format_size(r.peak_rss_bytes)
            } else {
                "-".into()
            },
            r.budget_bytes
                .filter(|_| r.cgroup_limit_bytes.is_some())
                .map(|b| format!(
                    "  budget {} peak charge {} ({} unreclaimable)",
                    format_size(b),
                    format_size(r.max_usage_bytes),
                    format_size(r.peak_charge.unwrap_or_default().unreclaimable_bytes)
                ))
                .unwrap_or_default(),
            r.program_figure
                .map(|f| format!("  own figure {f:.1}"))
                .unwrap_or_default(),
            r.load_before,
            if r.ok { "ok" } else { &r.note }
        );
    }
}

/// Median wall time of a program's successful runs by a contestant.
fn median_time(rows: &[Row], program: &str, contestant: &str) -> Option<f64> {
    let mut t: Vec<f64> = rows
        .iter()
        .filter(|r| r.program == program && r.contestant == contestant && r.ok)
        .map(|r| r.wall_s)
        .collect();
    if t.is_empty() {
        return None;
    }
    Some(crate::net::median(&mut t))
}

fn program_names(rows: &[Row]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !names.contains(&r.program) {
            names.push(r.program.clone());
        }
    }
    names
}

fn summary(rows: &[Row]) {
    println!(
        "{:<10} {:<36} {:>9} {:>9} {:>9}",
        "program", "contestant", "median s", "vs zram", "vs file"
    );
    for p in program_names(rows) {
        let zram = median_time(rows, &p, "zram");
        let file = median_time(rows, &p, "swapfile");
        for c in std::iter::once("no limit").chain(CONTESTANTS) {
            let Some(t) = median_time(rows, &p, c) else {
                if rows.iter().any(|r| r.program == p && r.contestant == c) {
                    println!("{p:<10} {:<36} {:>9}", label(c), "FAILED");
                }
                continue;
            };
            let ratio =
                |b: Option<f64>| b.map_or_else(|| "-".to_string(), |b| format!("{:.2}x", b / t));
            println!(
                "{p:<10} {:<36} {t:>9.2} {:>9} {:>9}",
                label(c),
                ratio(zram),
                ratio(file)
            );
        }
    }
}

/// Strata's speed-up (kernel seconds / Strata seconds) over zram and the swap file, one group
/// per program and Strata store.
fn chart(rows: &[Row], record: &Record) -> Chart {
    let mut groups = Vec::new();
    for p in program_names(rows) {
        for c in STRATA {
            if !rows.iter().any(|r| r.program == p && r.contestant == c) {
                continue;
            }
            let mine = median_time(rows, &p, c);
            let over = |base: &str| Some(median_time(rows, &p, base)? / mine?);
            groups.push(Group {
                label: format!("{p}\n{}", c.trim_start_matches("strata-")),
                speedups: vec![over("zram"), over("swapfile")],
                ceiling: None,
            });
        }
    }
    Chart {
        title: "strata run vs the kernel's swap: speed-up at the same memory limit".into(),
        subtitle: record.subtitle(),
        baselines: vec!["kernel, zram lz4 swap".into(), "kernel, swap file".into()],
        groups,
        no_ceilings: Some("whole-program times; no machine ceiling applies".into()),
        mark_missing: true,
    }
}

fn write_lines(path: &Path, bytes: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x1234_5678;
    let mut n = 0;
    while n < bytes {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        writeln!(f, "{x:016x}")?;
        n += 17;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_run() -> GroupRun {
        GroupRun {
            seconds: 1.0,
            success: true,
            stdout: String::new(),
            peak: Charge::default(),
            max_usage_bytes: 32 << 20,
            oom_kills: 0,
            swap_seen: Vec::new(),
        }
    }

    #[test]
    fn a_failed_row_says_why() {
        let limit = Duration::from_secs(300);
        assert_eq!(row_note(&group_run(), true, limit), "");
        let mut r = group_run();
        r.success = false;
        r.oom_kills = 2;
        let note = row_note(&r, false, limit);
        assert!(note.starts_with("failed: OOM-killed"), "{note}");
        assert!(
            note.contains("2 kills") && note.contains("32 MiB"),
            "{note}"
        );
        // Swap on during a row voids it, whatever else happened.
        r.swap_seen = vec!["/dev/zram0".into()];
        let note = row_note(&r, false, limit);
        assert!(
            note.starts_with("void") && note.contains("/dev/zram0"),
            "{note}"
        );
        let mut r = group_run();
        r.success = false;
        r.seconds = 300.0;
        assert!(row_note(&r, false, limit).contains("time limit"));
        r.seconds = 3.0;
        assert!(row_note(&r, false, limit).contains("exited with an error"));
        // Exit 0 but not the reference output.
        assert!(row_note(&group_run(), false, limit).contains("wrong output"));
    }

    #[test]
    fn a_budget_is_whole_pages_of_the_given_size() {
        assert_eq!(budget_granule(""), 64 << 10);
        assert_eq!(budget_granule("--page-size 4KiB"), 64 << 10);
        assert_eq!(budget_granule("--page-size 2MiB --threshold 1MiB"), 2 << 20);
        assert_eq!(
            budget_granule("--threshold 1MiB --page-size=256KiB"),
            256 << 10
        );
        // A bad size is `strata run`'s to refuse; the granule stays the default.
        assert_eq!(budget_granule("--page-size lots"), 64 << 10);
        assert_eq!(budget_granule("--page-size"), 64 << 10);
    }

    const MIB: u64 = 1 << 20;

    fn ask(limit: u64) -> BudgetAsk<'static> {
        BudgetAsk {
            program: "sort",
            contestant: "strata-file",
            limit,
            page: 64 << 10,
            slack: crate::strata_cgroup::SLACK_BYTES,
            reference: "sorted\n",
            time_limit: Duration::from_secs(300),
        }
    }

    /// A measurement that printed the reference and peaked at `peak` bytes.
    fn measured(peak: u64) -> GroupRun {
        let mut r = group_run();
        r.stdout = "sorted\n".into();
        r.peak.unreclaimable_bytes = peak;
        r.max_usage_bytes = peak;
        r
    }

    #[test]
    fn a_budget_search_takes_off_a_fixed_margin_once() {
        let mut budgets = Vec::new();
        let s = search_budget(&ask(32 * MIB), |b| {
            budgets.push(b);
            Ok(measured(b + 4 * MIB))
        })
        .unwrap();
        let budget = s.budget_bytes.unwrap();
        assert_eq!(
            budgets,
            [32 * MIB, budget],
            "measured at the limit, then once more"
        );
        assert_eq!(
            budget,
            32 * MIB
                - 4 * MIB
                - crate::strata_cgroup::SLACK_BYTES
                - crate::strata_cgroup::AIM_BELOW_BYTES,
            "32 less 4 of margin, the slack, 1 aimed below"
        );
        assert_eq!(s.margin_bytes, Some(4 * MIB));
        assert!(s.outcome.starts_with("fits"), "{}", s.outcome);
        assert_eq!(s.measurements.len(), 2);
    }

    #[test]
    fn the_node_rows_are_the_contestants_over_a_node() {
        let over: Vec<&str> = CONTESTANTS.into_iter().filter(|c| over_node(c)).collect();
        assert_eq!(over, ["strata-remote", "strata-lz4-node"]);
    }

    #[test]
    fn a_budget_search_follows_a_store_that_grows_as_the_budget_shrinks() {
        // An in-process compressed store: 3 MiB of program, and a quarter of every byte of
        // 40 MiB that the budget does not hold.
        let peak = |b: u64| b + 3 * MIB + (40 * MIB).saturating_sub(b) / 4;
        let s = search_budget(&ask(32 * MIB), |b| Ok(measured(peak(b)))).unwrap();
        let budget = s.budget_bytes.expect(&s.outcome);
        assert!(peak(budget) + crate::strata_cgroup::SLACK_BYTES <= 32 * MIB);
        assert!(s.measurements.len() <= MAX_MEASUREMENTS);
        // Every measurement but the last did not fit, and budgets only shrank.
        let b: Vec<u64> = s.measurements.iter().map(|m| m.budget_bytes).collect();
        assert!(b.windows(2).all(|w| w[1] < w[0]), "{b:?}");
    }

    #[test]
    fn a_budget_search_says_what_does_not_fit_and_why() {
        // An incompressible in-process store: far more than the limit beside the budget.
        let s = search_budget(&ask(32 * MIB), |b| Ok(measured(b + 150 * MIB))).unwrap();
        assert_eq!(s.budget_bytes, None);
        assert_eq!(s.measurements.len(), 1);
        assert!(
            s.outcome.starts_with("does not fit: 150 MiB"),
            "{}",
            s.outcome
        );
        // A margin that keeps growing as the budget shrinks, never fitting.
        let mut n = 0;
        let s = search_budget(&ask(64 * MIB), |b| {
            n += 1;
            Ok(measured(b + n * 3 * MIB + 60 * MIB - b / 2))
        })
        .unwrap();
        assert_eq!(s.budget_bytes, None, "{}", s.outcome);
        assert!(s.outcome.starts_with("does not fit"), "{}", s.outcome);
    }

    #[test]
    fn a_budget_search_stops_at_a_failed_measurement() {
        let mut calls = 0;
        let s = search_budget(&ask(32 * MIB), |_| {
            calls += 1;
            let mut r = measured(10 * MIB);
            r.stdout = "unsorted\n".into();
            Ok(r)
        })
        .unwrap();
        assert_eq!((calls, s.budget_bytes), (1, None));
        assert!(
            s.outcome.contains("wrong output while measuring"),
            "{}",
            s.outcome
        );
        let s = search_budget(&ask(32 * MIB), |_| {
            let mut r = measured(40 * MIB);
            r.success = false;
            r.oom_kills = 1;
            Ok(r)
        })
        .unwrap();
        assert!(s.outcome.starts_with("failed: OOM-killed"), "{}", s.outcome);
        // A run that cannot start is an error, not a row.
        assert!(search_budget(&ask(32 * MIB), |_| anyhow::bail!("no cgroup")).is_err());
    }

    #[test]
    fn a_row_that_did_not_run_is_a_failure() {
        let row = Row::new("sort", "strata-lz4");
        assert!(!row.ok);
        assert_eq!(median_time(&[row], "sort", "strata-lz4"), None);
    }
}
