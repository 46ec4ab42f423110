//! `strata info`: what this machine offers Strata.

use strata_core::format_size;

/// Arguments of `strata info`.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also list every STRATA_* environment variable and its meaning.
    #[arg(long)]
    env: bool,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    cpus: usize,
    memory_total_bytes: Option<u64>,
    memory_available_bytes: Option<u64>,
    userfaultfd: Result<String, String>,
    gpus: Result<Vec<strata_gpu::probe::GpuInfo>, String>,
    nvrtc: bool,
    ucx: Result<String, String>,
    small_copies: Option<Result<strata_copy::BackendReport, String>>,
    /// The lending broker, when one answers at the default socket.
    broker: Result<BrokerReport, String>,
}

#[derive(Debug, serde::Serialize)]
struct BrokerReport {
    socket: String,
    lending: Vec<strata_broker::message::GpuLending>,
    leases: usize,
}

fn broker_report() -> Result<BrokerReport, String> {
    let path = strata_broker::default_socket_path();
    let (lending, leases) = strata_broker::status(&path, std::time::Duration::from_secs(2))
        .map_err(|e| format!("none reachable at {} ({e})", path.display()))?;
    Ok(BrokerReport {
        socket: path.display().to_string(),
        lending,
        leases: leases.len(),
    })
}

/// Runs `strata info`.
pub fn run(args: &InfoArgs) -> anyhow::Result<()> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let report = Report {
        cpus: strata_core::config::available_cpus(),
        memory_total_bytes: meminfo_kib(&meminfo, "MemTotal").map(|k| k * 1024),
        memory_available_bytes: meminfo_kib(&meminfo, "MemAvailable").map(|k| k * 1024),
        userfaultfd: strata_pager::probe::probe()
            .map(|s| {
                format!(
                    "works (API {:#x}, write-protect {}, {})",
                    s.api,
                    if s.write_protect() { "yes" } else { "no" },
                    if s.kernel_faults {
                        "kernel and user faults"
                    } else {
                        "user-mode faults only"
                    }
                )
            })
            .map_err(|e| e.to_string()),
        gpus: strata_gpu::probe::gpus(),
        nvrtc: strata_gpu::probe::nvrtc_present(),
        ucx: strata_ucx::probe::probe().map(str::to_string),
        small_copies: None,
        broker: broker_report(),
    };
    let mut report = report;
    if report.gpus.as_ref().is_ok_and(|g| !g.is_empty()) {
        report.small_copies = Some(strata_copy::probe(0));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if args.env {
        println!("\nEnvironment variables:");
        for (name, meaning) in strata_core::config::KNOWN_VARIABLES {
            let value = std::env::var(name)
                .map(|v| format!(" = {v:?}"))
                .unwrap_or_default();
            println!("  {name:<26} {meaning}{value}");
        }
        strata_core::config::check_env_names(&strata_core::config::process_env()?)?;
    }
    Ok(())
}

fn print_table(r: &Report) {
    let size = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), format_size);
    println!("{:<14} {}", "cpus", r.cpus);
    println!(
        "{:<14} {} total, {} available",
        "memory",
        size(r.memory_total_bytes),
        size(r.memory_available_bytes)
    );
    match &r.userfaultfd {
        Ok(s) => println!("{:<14} {s}", "userfaultfd"),
        Err(e) => println!("{:<14} not usable: {e}", "userfaultfd"),
    }
    match &r.gpus {
        Err(e) => println!("{:<14} {e}", "gpus"),
        Ok(gpus) if gpus.is_empty() => println!("{:<14} CUDA driver found, but no GPU", "gpus"),
        Ok(gpus) => {
            for g in gpus {
                println!(
                    "{:<14} {} (sm_{}{}, {} SMs), {} total / {} free, PCI {} link {}, peers {:?}",
                    format!("gpu {}", g.ordinal),
                    g.name,
                    g.compute_capability.0,
                    g.compute_capability.1,
                    g.multiprocessors,
                    format_size(g.total_bytes),
                    format_size(g.free_bytes),
                    g.pci_address,
                    g.pcie_link.as_deref().unwrap_or("unknown"),
                    g.peers
                );
            }
        }
    }
    println!(
        "{:<14} {}",
        "nvrtc",
        if r.nvrtc {
            "found"
        } else {
            "not found (GPU kernels cannot be compiled)"
        }
    );
    match &r.small_copies {
        Some(Ok(c)) => println!(
            "{:<14} {} (gpu 0; dma-buf mmap: {}; {})",
            "small copies", c.backend, c.dmabuf, c.gdrdrv
        ),
        Some(Err(e)) => println!("{:<14} unavailable: {e}", "small copies"),
        None => {}
    }
    match &r.broker {
        Ok(b) => {
            println!("{:<14} at {} ({} leases)", "broker", b.socket, b.leases);
            for g in &b.lending {
                println!(
                    "{:<14} {} lenders offer {}, {} lent, {} lendable now ({} chunks)",
                    format!("lend gpu {}", g.gpu),
                    g.lenders,
                    format_size(g.offered_bytes),
                    format_size(g.lent_bytes),
                    format_size(g.available_bytes),
                    format_size(g.chunk_bytes)
                );
            }
        }
        Err(e) => println!("{:<14} {e}; start one with `strata broker`", "broker"),
    }
    match &r.ucx {
        Ok(lib) => println!("{:<14} found ({lib})", "ucx"),
        Err(e) => println!("{:<14} not found ({e}); remote memory needs libucx0", "ucx"),
    }
}

fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}
