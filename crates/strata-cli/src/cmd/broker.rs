//! `strata broker` and `strata lend`: the lending broker for neighbour GPUs' idle memory and a
//! lender process. Thin: the protocol, books and GPU side live in `strata_broker`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use strata_broker::gpu::GpuSource;
use strata_broker::{Broker, BrokerConfig, Lender, LenderEvent, Sigkill};
use strata_core::{format_size, units::parse_size};
use strata_net::server::{install_shutdown_signals, shutdown_signalled};

/// Arguments of `strata broker`.
#[derive(Debug, clap::Args)]
pub struct BrokerArgs {
    /// Unix socket to listen on (default: $STRATA_BROKER_SOCKET, else
    /// $XDG_RUNTIME_DIR/strata/broker.sock, else /run/strata/broker.sock for root and
    /// /tmp/strata-$UID/broker.sock for others).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// Arguments of `strata lend`.
#[derive(Debug, clap::Args)]
pub struct LendArgs {
    /// GPU to lend memory of.
    #[arg(long)]
    gpu: usize,
    /// Most memory lent at once, e.g. 40GiB (whole 2 MiB chunks).
    #[arg(long, value_parser = parse_size)]
    max: u64,
    /// Chunk size, a multiple of 2 MiB (larger chunks are returned faster, 2 MiB is what a
    /// space's peer tier takes).
    #[arg(long, value_parser = parse_size, default_value = "2MiB")]
    chunk: u64,
    /// Milliseconds borrowers get to give memory back when this lender exits.
    #[arg(long, default_value_t = 1000)]
    deadline_ms: u64,
    /// The broker's socket (default as for `strata broker`).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// Runs the broker until SIGINT or SIGTERM.
pub fn broker(args: &BrokerArgs) -> anyhow::Result<()> {
    let path = args
        .socket
        .clone()
        .unwrap_or_else(strata_broker::default_socket_path);
    let mut broker = Broker::bind(&path, BrokerConfig::default(), Box::new(Sigkill))
        .with_context(|| format!("cannot listen at {}", path.display()))?;
    install_shutdown_signals();
    eprintln!("strata broker listening at {}", path.display());
    while !shutdown_signalled() {
        broker.turn(Duration::from_millis(100))?;
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// Lends GPU memory until SIGINT or SIGTERM, then takes all of it back and exits.
pub fn lend(args: &LendArgs) -> anyhow::Result<()> {
    let path = args
        .socket
        .clone()
        .unwrap_or_else(strata_broker::default_socket_path);
    let source =
        GpuSource::open(args.gpu, None).with_context(|| format!("cannot open GPU {}", args.gpu))?;
    let mut lender = Lender::start(&path, source, args.max).with_context(|| {
        format!(
            "cannot reach the broker at {}: start `strata broker` first",
            path.display()
        )
    })?;
    install_shutdown_signals();
    eprintln!(
        "lending up to {} of GPU {} through {}",
        format_size(args.max),
        args.gpu,
        path.display()
    );
    let mut seen = 0;
    while !shutdown_signalled() && !lender.broker_lost() {
        std::thread::sleep(Duration::from_millis(100));
        let events = lender.events();
        for e in &events[seen..] {
            match e {
                LenderEvent::Lent(c) => eprintln!(
                    "lent {} chunks, {} lent now",
                    c.len(),
                    format_size(lender.lent_bytes())
                ),
                LenderEvent::Freed { chunks, reason } => {
                    eprintln!(
                        "{} chunks back ({reason:?}), {} lent now",
                        chunks.len(),
                        format_size(lender.lent_bytes())
                    );
                }
                LenderEvent::Error(m) => eprintln!("broker: {m}"),
                LenderEvent::ReclaimDone(_) | LenderEvent::BrokerLost => {}
            }
        }
        seen = events.len();
    }
    if lender.broker_lost() {
        eprintln!("the broker went away; every chunk was released");
        return Ok(());
    }
    let (report, took) = lender.reclaim(u64::MAX, Duration::from_millis(args.deadline_ms))?;
    eprintln!(
        "took back {} in {took:?}; killed {:?}; {} still mapped",
        format_size(report.freed_bytes),
        report.killed_pids,
        format_size(report.outstanding_bytes)
    );
    Ok(())
}
