//! `strata serve`: runs a memory node until SIGINT or SIGTERM. Thin: the node lives in
//! `strata_net::server`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use strata_core::config::StoreConfig;
use strata_core::{format_size, parse_size};
use strata_net::server::{install_shutdown_signals, shutdown_signalled};
use strata_net::{MemoryNode, ServeOptions};

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Arguments of `strata serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (use a routable address to serve other hosts).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Most memory lent to all clients together.
    #[arg(long, default_value = "1GiB", value_parser = size_arg)]
    capacity: u64,
    /// File holding the secret clients must prove they know (at least 16 bytes; a trailing
    /// newline is ignored). Default: STRATA_REMOTE_TOKEN, else a random one that is printed.
    /// There is no --token: a secret on the command line shows in `ps` to every user.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// UCX transports, such as `tcp` or `rc_x` (default: UCX's choice / UCX_TLS).
    #[arg(long)]
    transports: Option<String>,
    /// Offer one-sided access (UCX get/put). Only on InfiniBand/RoCE transports named with
    /// --transports, where the NIC enforces each region's registration; refused otherwise.
    #[arg(long)]
    one_sided: bool,
    /// Accept a --capacity larger than this host's memory.
    #[arg(long)]
    overcommit: bool,
    /// Lend clients on this host memory as files they read and write themselves (committed
    /// when lent; not with --overcommit). `false`: messages only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    lend_files: bool,
    /// Most clients (and handshakes under way) at once.
    #[arg(long, default_value_t = 256)]
    max_clients: usize,
    /// Seconds a connection may take to authenticate.
    #[arg(long, default_value_t = 5)]
    handshake_timeout: u64,
}

/// Reads the token from `path`, without its trailing newline.
fn token_from_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read the token file {}", path.display()))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").context("open /dev/urandom for a token")?,
        &mut bytes,
    )?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Runs `strata serve` until SIGINT or SIGTERM.
pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let (token, generated) = match &args.token_file {
        Some(path) => (token_from_file(path)?, false),
        // Strict: a bad STRATA_* value is an error here, never a silently ignored
        // STRATA_REMOTE_TOKEN replaced by a random one.
        None => match StoreConfig::builder().with_env()?.build()?.token {
            Some(t) => (t, false),
            None => (random_token()?, true),
        },
    };
    install_shutdown_signals();
    let mut options = ServeOptions::new(args.listen, args.capacity, token.clone());
    options.transports.clone_from(&args.transports);
    options.one_sided = args.one_sided;
    options.overcommit = args.overcommit;
    options.lend_files = args.lend_files;
    options.max_clients = args.max_clients;
    options.handshake_timeout = Duration::from_secs(args.handshake_timeout.max(1));
    let node = MemoryNode::start(options)?;
    println!(
        "memory node listening on {} lending up to {}",
        node.address(),
        format_size(args.capacity)
    );
    if generated {
        println!("token (give it to clients as STRATA_REMOTE_TOKEN): {token}");
    }
    println!("stop with Ctrl-C or SIGTERM");
    while !shutdown_signalled() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = node.counters();
    println!(
        "shutting down: {} clients, {} files lent, {} lent, {} read, {} written over messages, {} requests refused",
        c.clients.load(Ordering::Relaxed),
        c.files_lent.load(Ordering::Relaxed),
        format_size(c.lent_bytes.load(Ordering::Relaxed)),
        format_size(c.bytes_read.load(Ordering::Relaxed)),
        format_size(c.bytes_written.load(Ordering::Relaxed)),
        c.refused.load(Ordering::Relaxed)
    );
    node.shutdown();
    println!("memory node stopped");
    Ok(())
}
