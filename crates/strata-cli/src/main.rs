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
    Bench(Box<strata_bench::cmd::BenchCommand>),
    /// Run a memory node that lends this machine's memory to Strata clients over UCX.
    Serve(cmd::serve::ServeArgs),
    /// Run an unmodified program with its large allocations paged by Strata within one
    /// memory budget: `strata run --memory 4GiB --store file -- PROGRAM ARGS...`.
    Run(Box<cmd::run::RunArgs>),
    /// Run the host's lending broker for neighbour GPUs' idle memory (one per host).
    Broker(cmd::broker::BrokerArgs),
    /// Lend part of a GPU's memory through the broker until Ctrl-C (then take it all back):
    /// `strata lend --gpu 1 --max 40GiB`.
    Lend(cmd::broker::LendArgs),
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
        Command::Serve(args) => cmd::serve::serve(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Broker(args) => cmd::broker::broker(&args),
        Command::Lend(args) => cmd::broker::lend(&args),
        Command::Bench(bench) => strata_bench::cmd::run(&bench),
    }
}
