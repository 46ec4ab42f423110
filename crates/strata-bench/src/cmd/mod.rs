//! The `strata bench ...` commands: each owns its arguments (parsed by the `strata` binary)
//! and its printing, and calls the measuring modules of this crate.

pub mod copy;
pub mod gpu_micro;
pub mod gpu_store;
pub mod measure;
pub mod pager;
pub mod peer;
pub mod remote;
pub mod run;
pub mod unified;
pub mod workloads;

/// `strata bench <what>`.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// STREAM (copy, scale, add, triad) through a pager region larger than its buffer.
    Stream(pager::StreamArgs),
    /// Pager fault service rate and bandwidth against the kernel's mmap paging.
    Pager(pager::PagerBenchArgs),
    /// STREAM through a pager region backed by a memory node, sweeping workers and codecs.
    Remote(remote::RemoteBenchArgs),
    /// GPU paging micro-benchmarks against zero-copy, chunked copies and UVM.
    GpuMicro(gpu_micro::GpuMicroArgs),
    /// GPU spaces over stores (memory, file, memory node, LZ4) against issue 11's targets:
    /// streaming vs the store's raw read_batch, host-cache streaming, cold 4 KiB faults,
    /// read-modify-write vs chunked copies, and the 48 GiB file case.
    GpuStore(gpu_store::GpuStoreArgs),
    /// BFS, connected components and PageRank on GPU paging against the alternatives.
    Graph(workloads::GraphArgs),
    /// Zipf-skewed embedding lookups on GPU paging against the alternatives.
    Embed(workloads::EmbedArgs),
    /// The peer tier (memory borrowed from a neighbour GPU over NVLink) against host-only
    /// eviction: peer fault rates against NVLink ceilings measured now, gpu-micro patterns,
    /// PageRank and embeddings at 2-4x the local cache (needs two GPUs).
    Peer(peer::PeerBenchArgs),
    /// Small CPU<->GPU copies (copylat, copybw, pplat, apiperf) against cudaMemcpy.
    Copy(copy::CopyBenchArgs),
    /// Unmodified programs under `strata run` against the kernel swapping to zram and to a
    /// swap file, at the same memory limit (root).
    Run(run::RunBenchArgs),
    /// Unified allocations (one copy for CPU and GPU) against CUDA managed memory with the same
    /// hints, and oversubscribed against zero-copy and explicit copies.
    Unified(unified::UnifiedBenchArgs),
    /// Measure this machine's ceilings (host memory, disk O_DIRECT, PCIe, page gathers, HBM)
    /// and cache them per host, device and driver.
    Ceilings(measure::CeilingsArgs),
    /// Compare two result files figure by figure (also reads older builds' result files).
    Compare(measure::CompareArgs),
    /// Redraw the chart of a gpu-micro, graph or embed result (also older builds' files).
    Plot(measure::PlotArgs),
}

/// Writes a benchmark's record as JSON to `json` and its chart as SVG and PNG beside
/// `plot_base`, and says where.
///
/// # Errors
/// An unwritable file.
pub fn write_record_and_chart(
    record: &crate::record::Record,
    json: &std::path::Path,
    chart: &crate::plot::Chart,
    plot_base: &std::path::Path,
) -> anyhow::Result<()> {
    record.write(json)?;
    let (svg, png) = crate::plot::write(chart, plot_base)?;
    println!(
        "wrote {}, {} and {}",
        json.display(),
        svg.display(),
        png.display()
    );
    Ok(())
}

/// Runs one `strata bench` command.
pub fn run(command: &BenchCommand) -> anyhow::Result<()> {
    crate::cleanup::install();
    match command {
        BenchCommand::Stream(args) => pager::stream(args),
        BenchCommand::Pager(args) => pager::bench(args),
        BenchCommand::Remote(args) => remote::bench(args),
        BenchCommand::GpuMicro(args) => gpu_micro::micro(args),
        BenchCommand::GpuStore(args) => gpu_store::gpu_store(args),
        BenchCommand::Graph(args) => workloads::graph(args),
        BenchCommand::Embed(args) => workloads::embed(args),
        BenchCommand::Peer(args) => peer::bench(args),
        BenchCommand::Copy(args) => copy::bench(args),
        BenchCommand::Run(args) => run::run(args),
        BenchCommand::Unified(args) => unified::bench(args),
        BenchCommand::Ceilings(args) => measure::ceilings(args),
        BenchCommand::Compare(args) => measure::compare(args),
        BenchCommand::Plot(args) => measure::plot(args),
    }
}
