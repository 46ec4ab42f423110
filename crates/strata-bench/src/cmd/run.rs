//! `strata bench run`: the same unmodified programs at the same memory limit three ways:
//! the kernel swapping to zram (LZ4), the kernel swapping to a swap file, and `strata run`
//! over an LZ4 memory store and a file store. Kernel runs sit in a memory cgroup of the
//! limit; `strata run` gets the limit as `--memory` (its in-process memory store is, like
//! zram's pool, outside that budget). Reports wall time, faults and bytes moved, as JSON and
//! an SVG of times relative to zram. Needs root (swapon, cgroups); every setup step that
//! fails is reported by name and its contestant is left out.
//!
//! Self-contained on purpose (the benchmark crate will take it over).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};
use strata_core::{format_size, parse_size};

/// `strata bench run`.
#[derive(Debug, clap::Args)]
pub struct RunBenchArgs {
    /// The memory limit every contestant gets.
    #[arg(long, default_value = "64MiB")]
    memory: String,
    /// Each program's data, as a multiple of the limit.
    #[arg(long, default_value_t = 4)]
    oversubscription: u64,
    /// Where scratch files and the swap file go.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Results (JSON); the SVG is written next to it.
    #[arg(long, default_value = "strata-bench-run.json")]
    out: PathBuf,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    program: String,
    contestant: String,
    wall_s: f64,
    /// Major faults (kernel: the program's, from getrusage; Strata: pager faults).
    faults: u64,
    /// Bytes read from the swap device or store.
    bytes_in: u64,
    /// Bytes written to the swap device or store.
    bytes_out: u64,
    ok: bool,
    note: String,
}

fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

fn sh(cmd: &str) -> anyhow::Result<()> {
    let out = Command::new("sh").args(["-c", cmd]).output()?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One swap backend enabled at a time (all others off), so the kernel has one place to go.
fn swap_only(dev: &str, setup: &str) -> anyhow::Result<()> {
    let _ = sh("swapoff -a");
    sh(setup)?;
    sh(&format!("swapon {dev}"))
}

struct Cgroup(PathBuf);

impl Cgroup {
    fn new(limit: u64) -> anyhow::Result<Self> {
        let v1 = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/strata-bench-run-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&v1).with_context(|| format!("creating {}", v1.display()))?;
        std::fs::write(v1.join("memory.limit_in_bytes"), limit.to_string())
            .context("setting memory.limit_in_bytes")?;
        let _ = std::fs::write(v1.join("memory.swappiness"), "100");
        Ok(Self(v1))
    }
    /// `sh -c` that joins the cgroup, then execs the program.
    fn wrap(&self, program: &[String]) -> Vec<String> {
        let mut v = vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {}/cgroup.procs && exec \"$@\"", self.0.display()),
            "sh".into(),
        ];
        v.extend(program.iter().cloned());
        v
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn child_major_faults() -> u64 {
    // SAFETY: getrusage with a valid out-pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut ru) };
    u64::try_from(ru.ru_majflt).unwrap_or(0)
}

/// Seconds a single run may take (`timeout` kills it; the row then says it failed).
const RUN_LIMIT_S: &str = "180";

/// Runs `argv` under `timeout`, returning (wall seconds, success, stdout).
fn timed(argv: &[String]) -> anyhow::Result<(f64, bool, String)> {
    let t = Instant::now();
    let out = Command::new("timeout")
        .arg(RUN_LIMIT_S)
        .args(argv)
        .output()
        .with_context(|| format!("running {argv:?}"))?;
    Ok((
        t.elapsed().as_secs_f64(),
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Runs the benchmark.
pub fn run(args: &RunBenchArgs) -> anyhow::Result<()> {
    let limit = parse_size(&args.memory)?;
    let data = limit * args.oversubscription;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("strata-bench-run"));
    std::fs::create_dir_all(&dir)?;
    let strata = std::env::current_exe()?;
    // Programs: sort of a file `data` bytes long with an in-memory buffer, and a NumPy sort.
    let input = dir.join("sort-input.txt");
    write_lines(&input, data)?;
    let mib = (data >> 20).to_string();
    let programs: Vec<(&str, Vec<String>)> = vec![
        (
            "sort -S",
            vec![
                "sort".into(),
                "-S".into(),
                format!("{}", data * 3),
                "--parallel=2".into(),
                input.to_string_lossy().into_owned(),
            ],
        ),
        (
            "numpy sort",
            vec![
                "python3".into(),
                "-c".into(),
                "import sys,numpy as np,hashlib;a=np.random.default_rng(1).random(int(sys.argv[1])*131072);a.sort();print(hashlib.sha256(a.tobytes()).hexdigest())".into(),
                mib.clone(),
            ],
        ),
    ];
    let mut rows = Vec::new();
    let mut setup_notes = Vec::new();
    let swapfile = dir.join("swapfile");
    let zram = "echo 1 > /sys/block/zram0/reset; echo lz4 > /sys/block/zram0/comp_algorithm && echo 4G > /sys/block/zram0/disksize && mkswap /dev/zram0 >/dev/null".to_string();
    let file = format!(
        "rm -f {f}; dd if=/dev/zero of={f} bs=1M count=4096 status=none && chmod 600 {f} && mkswap {f} >/dev/null",
        f = swapfile.display()
    );
    for (name, program) in &programs {
        let (_, ok, reference) = timed(program)?;
        if !ok {
            bail!(
                "{name} fails on its own; install it (sort: coreutils, numpy: pip install numpy)"
            );
        }
        for (contestant, dev, setup) in [
            ("kernel swap to zram (lz4)", "/dev/zram0", &zram),
            (
                "kernel swap to a swap file",
                swapfile.to_str().unwrap_or(""),
                &file,
            ),
        ] {
            if let Err(e) = swap_only(dev, setup) {
                let note = format!("{contestant}: {e}");
                eprintln!("left out: {note}");
                setup_notes.push(note);
                continue;
            }
            let cg = Cgroup::new(limit)?;
            let (fi, fo, mf) = (vmstat("pswpin"), vmstat("pswpout"), child_major_faults());
            let (wall, ok, out) = timed(&cg.wrap(program))?;
            rows.push(Row {
                program: (*name).into(),
                contestant: contestant.into(),
                wall_s: wall,
                faults: child_major_faults() - mf,
                bytes_in: (vmstat("pswpin") - fi) * 4096,
                bytes_out: (vmstat("pswpout") - fo) * 4096,
                ok: ok && out == reference,
                note: if ok && out == reference {
                    String::new()
                } else {
                    "failed: killed by the memory cgroup's OOM killer (see dmesg), the time limit, or wrong output".into()
                },
            });
            eprintln!("{:?}", rows.last());
        }
        let _ = sh("swapoff -a");
        for (contestant, store) in [
            ("strata run, lz4 memory store", vec!["--codec", "lz4"]),
            ("strata run, file store", vec!["--store", "file"]),
        ] {
            let stats = dir.join("stats.json");
            let mut argv: Vec<String> = vec![
                strata.to_string_lossy().into_owned(),
                "run".into(),
                "--memory".into(),
                args.memory.clone(),
                "--stats".into(),
                stats.to_string_lossy().into_owned(),
            ];
            argv.extend(store.iter().map(|s| (*s).to_string()));
            argv.push("--".into());
            argv.extend(program.iter().cloned());
            let (wall, ok, out) = timed(&argv)?;
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&stats).unwrap_or_default())
                    .unwrap_or_default();
            let t = &v["totals"];
            rows.push(Row {
                program: (*name).into(),
                contestant: contestant.into(),
                wall_s: wall,
                faults: t["faults"].as_u64().unwrap_or(0),
                bytes_in: t["bytes_read"].as_u64().unwrap_or(0),
                bytes_out: t["bytes_written"].as_u64().unwrap_or(0),
                ok: ok && out == reference,
                note: if ok && out == reference {
                    String::new()
                } else {
                    "failed: time limit or wrong output (see stderr)".into()
                },
            });
            eprintln!("{:?}", rows.last());
        }
    }
    let _ = sh("swapoff -a");
    let _ = std::fs::remove_file(&swapfile);
    let _ = std::fs::remove_file(&input);
    let doc = serde_json::json!({
        "limit_bytes": limit,
        "data_bytes": data,
        "cpus": strata_core::config::available_cpus(),
        "left_out": setup_notes,
        "rows": rows,
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&doc)?)?;
    let svg_path = args.out.with_extension("svg");
    std::fs::write(&svg_path, svg(&rows))?;
    println!(
        "limit {}, data {} per program",
        format_size(limit),
        format_size(data)
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.program == r.program && b.contestant.contains("zram"))
            .map_or(f64::NAN, |b| b.wall_s);
        println!(
            "{:<12} {:<30} {:>8.2} s  {:>5.2}x vs zram  faults {:>8}  in {:>10}  out {:>10}  {}",
            r.program,
            r.contestant,
            r.wall_s,
            base / r.wall_s,
            r.faults,
            format_size(r.bytes_in),
            format_size(r.bytes_out),
            if r.ok { "ok" } else { "WRONG OUTPUT OR FAILED" }
        );
    }
    println!("wrote {} and {}", args.out.display(), svg_path.display());
    Ok(())
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

/// Bars of speed relative to zram swap (higher is better), one group per program.
fn svg(rows: &[Row]) -> String {
    let mut s = String::from(
        "<svg xmlns='http://www.w3.org/2000/svg' width='760' height='60' font-family='sans-serif' font-size='12'>\n",
    );
    let mut y = 20.0;
    let mut body = String::new();
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.program == r.program && b.contestant.contains("zram"))
            .map_or(r.wall_s, |b| b.wall_s);
        let ratio = base / r.wall_s;
        let w = (ratio * 150.0).min(400.0);
        body.push_str(&format!(
            "<text x='5' y='{:.0}'>{} / {}</text><rect x='330' y='{:.0}' width='{w:.0}' height='14' fill='{}'/><text x='{:.0}' y='{:.0}'>{ratio:.2}x</text>\n",
            y + 11.0,
            r.program,
            r.contestant,
            y,
            if r.contestant.starts_with("strata") { "#2a7" } else { "#888" },
            335.0 + w,
            y + 11.0
        ));
        y += 20.0;
    }
    s = s.replace("height='60'", &format!("height='{:.0}'", y + 30.0));
    s.push_str(&body);
    s.push_str(&format!(
        "<line x1='480' y1='10' x2='480' y2='{:.0}' stroke='black' stroke-dasharray='3'/><text x='440' y='{:.0}'>1x = zram swap speed</text>\n</svg>\n",
        y,
        y + 20.0
    ));
    s
}
