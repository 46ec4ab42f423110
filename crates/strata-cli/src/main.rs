//! The `strata` binary: parses the command line, sets up logging, and hands off to the
//! per-area command modules, which in turn call the libraries.

use clap::{Parser, Subcommand};

mod cmd;

/// Strata: use far more memory than your processor has.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what this machine offers Strata: CPUs, memory, userfaultfd, GPUs, NVRTC, UCX.
    Info(cmd::info::InfoArgs),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(Box<Bench>),
    /// Run a memory node that lends this machine's memory to Strata clients over UCX.
    Serve(cmd::remote::ServeArgs),
    /// Run an unmodified program with its large allocations paged by Strata within one
    /// memory budget: `strata run --memory 4GiB --store file -- PROGRAM ARGS...`.
    Run(Box<cmd::run::RunArgs>),
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// STREAM (copy, scale, add, triad) through a pager region larger than its buffer.
    Stream(cmd::pager::StreamArgs),
    /// Pager fault service rate and bandwidth against the kernel's mmap paging.
    Pager(cmd::pager::PagerBenchArgs),
    /// STREAM through a pager region backed by a memory node, sweeping workers and codecs.
    Remote(cmd::remote::RemoteBenchArgs),
    /// GPU paging micro-benchmarks against zero-copy, chunked copies and UVM.
    GpuMicro(cmd::gpu::GpuMicroArgs),
    /// BFS, connected components and PageRank on GPU paging against the alternatives.
    Graph(cmd::workloads::GraphArgs),
    /// Zipf-skewed embedding lookups on GPU paging against the alternatives.
    Embed(cmd::workloads::EmbedArgs),
    /// Unmodified programs under `strata run` against the kernel swapping to zram and to a
    /// swap file, at the same memory limit (root).
    Run(cmd::run_bench::RunBenchArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Info(args) => cmd::info::run(&args),
        Command::Serve(args) => cmd::remote::serve(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Bench(bench) => match *bench {
            Bench::Stream(args) => cmd::pager::stream(&args),
            Bench::Pager(args) => cmd::pager::bench(&args),
            Bench::Remote(args) => cmd::remote::bench(&args),
            Bench::GpuMicro(args) => cmd::gpu::micro(&args),
            Bench::Graph(args) => cmd::workloads::graph(&args),
            Bench::Embed(args) => cmd::workloads::embed(&args),
            Bench::Run(args) => cmd::run_bench::run(&args),
        },
    }
}
