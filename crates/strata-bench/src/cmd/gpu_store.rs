//! `strata bench gpu-store`: GPU spaces over stores against issue 11's targets.

use std::path::PathBuf;

use crate::gpu_store::{Plan, Request, available_host_memory, chart, format_row, run};
use crate::record::{Device, Record};
use strata_core::format_size;

/// Arguments of `strata bench gpu-store`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Targets (each row prints Strata, its baseline from the same run, the ratio and the goal):
  stream-store       stream a space 8x the GPU cache whose host cache is smaller than the space
                     (default half), so pages come from the store; baseline: the store's own
                     read_batch rate (same page size, --raw-threads x --raw-depth); goal 0.8x.
                     Every page is then checked on the GPU against the pattern written.
  stream-host-cache  the same stream with a host cache holding the whole space (memory store);
                     baseline: a space over a pinned host copy; goal 45 GB/s.
  cold-4k            every 4 KiB page once, shuffled, from an empty GPU cache and a warm host
                     cache (memory store); baseline: the pinned-copy space; goal 10 Mpages/s.
  stream-rmw         streaming read-modify-write of a space 4x the GPU cache, over a pinned
                     copy and over a memory store; baseline: chunked copies (H2D, kernel, D2H
                     on two streams); goal 0.95x. The bytes are read back and checked.
  big-file           stream-store over --store file:PATH only, by default with the issue's
                     sizes (--size 48GiB --gpu-cache 2GiB --host-cache 4GiB, 1 rep), next to
                     the disk's own O_DIRECT rate. Runs alone.

Examples:
  strata bench gpu-store                                   # all but big-file, memory store
  strata bench gpu-store --targets stream-store --store memory --store file:/data/s.bin --local-node
  strata bench gpu-store --targets big-file --store file:/data/big.bin

A remote store (--store remote:HOST:PORT) takes its token from STRATA_REMOTE_TOKEN.")]
pub struct GpuStoreArgs {
    /// Targets to run: stream-store, stream-host-cache, cold-4k, stream-rmw, big-file, or all
    /// (the first four), comma-separated.
    #[arg(long, default_value = "all")]
    targets: String,
    /// Stores for stream-store and big-file, repeatable: memory, file:PATH (created or grown
    /// to --size and overwritten; the disk needs that much room) or remote:HOST:PORT[,...]
    /// (a `strata serve` memory node; token from STRATA_REMOTE_TOKEN) [default: memory].
    #[arg(long)]
    store: Vec<String>,
    /// Also start a memory node in this process on 127.0.0.1 and stream from it (stream-store).
    #[arg(long)]
    local_node: bool,
    /// Page codec between the host cache and every store: none or lz4.
    #[arg(long, default_value = "none")]
    codec: String,
    /// File stores: direct (O_DIRECT, the disk's own rate) or buffered (the OS page cache may
    /// serve repeated passes).
    #[arg(long, default_value = "direct")]
    file_io: String,
    /// GPU cache of every space [default: 1GiB; big-file 2GiB].
    #[arg(long)]
    gpu_cache: Option<String>,
    /// Space of stream-store, stream-host-cache and big-file [default: 8x --gpu-cache;
    /// big-file 48GiB].
    #[arg(long)]
    size: Option<String>,
    /// Host cache of stream-store and big-file, less than --size [default: half of --size;
    /// big-file 4GiB]. stream-host-cache, cold-4k and stream-rmw give theirs the whole space.
    #[arg(long)]
    host_cache: Option<String>,
    /// Page size of the streaming targets (cold-4k uses 4 KiB, stream-rmw 64 KiB).
    #[arg(long, default_value = "64KiB")]
    page_size: String,
    /// Space of cold-4k, a power of two [default: the largest power of two up to --size and
    /// 4GiB].
    #[arg(long)]
    cold_size: Option<String>,
    /// Space of stream-rmw [default: 4x --gpu-cache].
    #[arg(long)]
    rmw_size: Option<String>,
    /// Bytes the raw read_batch baseline reads from the store's start [default: --size, at
    /// most 8GiB].
    #[arg(long)]
    raw_bytes: Option<String>,
    /// Threads of the raw read_batch baseline (the ring server's store threads,
    /// RingServerOptions::threads, are 4 by default).
    #[arg(long, default_value_t = 4)]
    raw_threads: usize,
    /// Pages per read_batch of the raw baseline (the ring server's largest batch,
    /// RingServerOptions::max_batch, is 64 by default).
    #[arg(long, default_value_t = 64)]
    raw_depth: usize,
    /// Timed repetitions after one warm-up (median reported) [default: 3; big-file 1].
    #[arg(long)]
    reps: Option<usize>,
    /// Pattern written into the stores: random, or compressible (LZ4 shrinks it ~3x).
    #[arg(long, default_value = "random")]
    data: String,
    /// Skip the checks that the host has the memory the largest target holds and that each
    /// file store's file system has room for its file.
    #[arg(long)]
    no_room_check: bool,
    /// Write results to PATH.json, PATH.svg and PATH.png.
    #[arg(long, default_value = "gpu-store")]
    out: PathBuf,
}

impl GpuStoreArgs {
    fn request(&self) -> Request {
        Request {
            targets: self.targets.clone(),
            stores: self.store.clone(),
            local_node: self.local_node,
            codec: self.codec.clone(),
            file_io: self.file_io.clone(),
            gpu_cache: self.gpu_cache.clone(),
            size: self.size.clone(),
            host_cache: self.host_cache.clone(),
            page_size: self.page_size.clone(),
            cold_size: self.cold_size.clone(),
            rmw_size: self.rmw_size.clone(),
            raw_bytes: self.raw_bytes.clone(),
            raw_threads: self.raw_threads,
            raw_depth: self.raw_depth,
            reps: self.reps,
            data: self.data.clone(),
        }
    }
}

/// Checks the arguments and resolves the plan (no GPU needed).
///
/// # Errors
/// Bad arguments, or more host memory than there is.
pub fn plan(args: &GpuStoreArgs) -> anyhow::Result<Plan> {
    plan_with(args, &strata_core::config::process_env()?)
}

/// [`plan`] with the `STRATA_*` variables given.
fn plan_with(args: &GpuStoreArgs, env: &strata_core::config::EnvVars) -> anyhow::Result<Plan> {
    let plan = Plan::new(&args.request(), env)?;
    if args.no_room_check {
        return Ok(plan);
    }
    let need = plan.host_bytes_needed();
    if let Some(free) = available_host_memory()
        && need > free
    {
        anyhow::bail!(
            "the largest target holds {} of host memory at once but {} is available: lower --gpu-cache/--size/--cold-size/--rmw-size, run fewer --targets, or pass --no-room-check",
            format_size(need),
            format_size(free)
        );
    }
    for (dir, need) in plan.disk_bytes_needed() {
        if let Ok(free) = crate::sys::free_bytes(&dir)
            && need > free
        {
            anyhow::bail!(
                "the file store in {} needs {} more on its file system (the file at --size and a 1 GiB disk-rate probe) but {} is free: lower --size, choose another disk, or pass --no-room-check",
                dir.display(),
                format_size(need),
                format_size(free)
            );
        }
    }
    Ok(plan)
}

/// Runs the benchmark and prints the table.
///
/// # Errors
/// Bad arguments, GPU, store or validation failures, unwritable output.
pub fn gpu_store(args: &GpuStoreArgs) -> anyhow::Result<()> {
    let plan = plan(args)?;
    // Every row's reference is a baseline measured in the same run (and the disk's own rate
    // for file stores), so no cached ceilings are read or probed.
    let ceilings = crate::record::CeilingsUsed {
        source: "none: gpu-store measures each row's baseline in the same run".into(),
        values: None,
    };
    let outcome = run(&plan, &mut |line| eprintln!("{line}"))?;
    let rows = &outcome.rows;
    println!(
        "target            store                    page    space unit       Strata | baseline = ratio | goal | more"
    );
    for r in rows {
        println!("{}", format_row(r));
    }
    for r in rows.iter().filter(|r| r.met == Some(false)) {
        println!(
            "MISSED: {} over {}: {:.2} {}{}, goal {}",
            r.target,
            r.store,
            r.strata.rate,
            r.unit,
            r.ratio
                .map_or_else(String::new, |x| format!(" ({x:.2}x {})", r.baseline_name)),
            r.goal.describe(&r.unit)
        );
    }
    let body = serde_json::json!({
        "targets": plan.targets,
        "data": plan.data,
        "reps": plan.reps,
        "raw_threads": plan.raw_threads,
        "raw_depth": plan.raw_depth,
        "rows": rows,
        "failures": outcome.failures,
    });
    let record = Record::new("gpu-store", Device::of(0), ceilings, body);
    super::write_record_and_chart(
        &record,
        &args.out.with_extension("json"),
        &chart(rows, &record),
        &args.out,
    )?;
    if !outcome.failures.is_empty() {
        let list: Vec<String> = outcome
            .failures
            .iter()
            .map(|(what, why)| format!("{what}: {why}"))
            .collect();
        anyhow::bail!(
            "{} of the runs failed (the others are in the record):\n{}",
            list.len(),
            list.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: GpuStoreArgs,
    }

    fn plan_of(argv: &[&str]) -> anyhow::Result<Plan> {
        let cli = Cli::try_parse_from(std::iter::once("gpu-store").chain(argv.iter().copied()))?;
        // Not the process's: `cargo test` sets STRATA_BENCH_COMMIT (this crate's build
        // stamp), which the environment check would refuse as unknown.
        plan_with(&cli.args, &Vec::new())
    }

    #[test]
    fn command_lines_resolve() {
        let p = plan_of(&["--no-room-check"]).unwrap();
        assert_eq!(p.targets.len(), 4);
        let p = plan_of(&[
            "--targets",
            "stream-store",
            "--store",
            "memory",
            "--store",
            "file:/tmp/x.bin",
            "--codec",
            "lz4",
            "--gpu-cache",
            "512MiB",
            "--no-room-check",
        ])
        .unwrap();
        assert_eq!(p.stores.len(), 2);
        assert_eq!(p.size, 4 << 30);
        assert_eq!(p.stores[1].label(), "file(direct)+lz4");
        let p = plan_of(&["--targets", "big-file", "--store", "file:/data/big.bin"]).unwrap();
        assert_eq!(p.size, 48 << 30);
        // The token comes from the environment; without it the message says where.
        let e = plan_of(&["--targets", "stream-store", "--store", "remote:127.0.0.1:9"]);
        assert!(e.unwrap_err().to_string().contains("STRATA_REMOTE_TOKEN"));
        let e = plan_of(&["--gpu-cache", "1TB", "--size", "8TB"]).unwrap_err();
        assert!(e.to_string().contains("host memory"), "{e}");
        let dir = std::env::temp_dir();
        let file = format!("file:{}", dir.join("strata-gpu-store-huge.bin").display());
        let e = plan_of(&[
            "--targets",
            "big-file",
            "--store",
            &file,
            "--size",
            "1000TiB",
            "--gpu-cache",
            "64MiB",
            "--host-cache",
            "64MiB",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("the file store in"), "{e}");
        let e = plan_of(&["--host-cache", "12XB"]).unwrap_err();
        assert!(e.to_string().contains("--host-cache"), "{e}");
    }
}
