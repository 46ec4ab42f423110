//! The JSON every benchmark writes: what ran where (machine, device, driver, commit,
//! arguments), the ceilings its fractions refer to, the figures `strata bench compare`
//! reads, and the benchmark's own detailed results. A result file that does not say on which
//! machine and build it was taken cannot be compared honestly.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ceilings::Ceilings;

/// Version of the record layout (`strata bench compare` also reads the bare result files of
/// builds before records existed).
pub const RECORD_VERSION: u32 = 1;

/// The machine a benchmark ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// Host name.
    pub hostname: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Physical memory in bytes.
    pub memory_bytes: u64,
    /// Kernel release (`uname -r`).
    pub kernel_release: String,
}

/// The GPU a benchmark ran on, if any.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Device {
    /// Device name as the driver reports it.
    pub name: String,
    /// PCI address.
    pub pci_address: String,
    /// Driver version (`/proc/driver/nvidia/version`).
    pub driver: String,
}

/// One number `strata bench compare` compares.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Figure {
    /// What it measures, unique within a record (e.g. `pager/seq/4KiB/strata-file bytes/s`).
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Whether more is better (a rate) or worse (a time).
    pub higher_is_better: bool,
    /// Run-to-run spread of this figure as a fraction of it ((highest - lowest) / median over
    /// the repetitions), when the benchmark repeated it.
    pub spread: Option<f64>,
}

/// What every benchmark writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// [`RECORD_VERSION`].
    pub strata_bench_record: u32,
    /// Which benchmark (`pager`, `remote`, `stream`, `gpu-micro`, `graph`, `embed`).
    pub bench: String,
    /// Where it ran.
    pub machine: Machine,
    /// The GPU, for GPU benchmarks.
    pub device: Option<Device>,
    /// The commit the binary was built from (`-dirty` if the tree had changes).
    pub commit: String,
    /// The command line.
    pub arguments: Vec<String>,
    /// Seconds since the Unix epoch when it finished.
    pub finished_unix: u64,
    /// The ceilings fractions refer to, and where they came from.
    pub ceilings: CeilingsUsed,
    /// The figures to compare.
    pub figures: Vec<Figure>,
    /// The benchmark's own detailed results.
    pub results: serde_json::Value,
}

/// Which ceilings a run used.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CeilingsUsed {
    /// `cache FILE`, `measured now`, or why none were used.
    pub source: String,
    /// The values (absent when none were used).
    pub values: Option<Ceilings>,
}

/// Why a record could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// File I/O.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// JSON.
    #[error(
        "{path}: not a benchmark result ({source}); give a JSON file written by `strata bench ...`"
    )]
    Json {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

fn first_line_after(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_string())
}

impl Machine {
    /// This machine.
    pub fn this() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let memory_kib = first_line_after(&read("/proc/meminfo"), "MemTotal")
            .and_then(|v| {
                v.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .unwrap_or(0);
        Self {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            cpus: strata_core::config::available_cpus(),
            cpu_model: first_line_after(&read("/proc/cpuinfo"), "model name").unwrap_or_default(),
            memory_bytes: memory_kib * 1024,
            kernel_release: read("/proc/sys/kernel/osrelease").trim().to_string(),
        }
    }
}

/// The NVIDIA driver's version, or `None` without one.
pub fn driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_string)
}

impl Device {
    /// GPU `ordinal` as the driver shows it, or `None` without a CUDA driver.
    pub fn of(ordinal: usize) -> Option<Self> {
        let gpus = strata_gpu::probe::gpus().ok()?;
        let gpu = gpus.into_iter().find(|g| g.ordinal == ordinal)?;
        Some(Self {
            name: gpu.name,
            pci_address: gpu.pci_address,
            driver: driver_version().unwrap_or_else(|| "unknown".into()),
        })
    }
}

/// The commit this binary was built from.
pub fn commit() -> String {
    env!("STRATA_BENCH_COMMIT").to_string()
}

impl Record {
    /// A record of `bench`'s `results` taken now on this machine with this command line.
    pub fn new(
        bench: &str,
        device: Option<Device>,
        ceilings: CeilingsUsed,
        results: serde_json::Value,
    ) -> Self {
        let figures = crate::compare::figures(bench, &results);
        Self {
            strata_bench_record: RECORD_VERSION,
            bench: bench.to_string(),
            machine: Machine::this(),
            device,
            commit: commit(),
            arguments: std::env::args().collect(),
            finished_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ceilings,
            figures,
            results,
        }
    }

    /// One line for a plot: where and from what it was measured.
    pub fn subtitle(&self) -> String {
        let device = self.device.as_ref().map_or(String::new(), |d| {
            format!(", {} (driver {})", d.name, d.driver)
        });
        let commit: String = self.commit.chars().take(10).collect();
        format!(
            "{} ({} CPUs, Linux {}){device}, commit {commit}; ceilings: {}",
            self.machine.hostname,
            self.machine.cpus,
            self.machine.kernel_release,
            self.ceilings.source
        )
    }

    /// Writes the record as pretty JSON.
    pub fn write(&self, path: &Path) -> Result<(), RecordError> {
        let text = serde_json::to_string_pretty(self).map_err(|source| RecordError::Json {
            path: path.display().to_string(),
            source,
        })?;
        std::fs::write(path, text).map_err(|source| RecordError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

impl Record {
    /// A result file as a record: a record as written, or the bare result of an older build
    /// wrapped in one that says what it does not know (machine, commit, ceilings).
    pub fn from_json(json: serde_json::Value) -> Result<Self, String> {
        if json.get("strata_bench_record").is_some() {
            return serde_json::from_value(json).map_err(|e| format!("bad record: {e}"));
        }
        let bench = crate::compare::detect(&json)
            .ok_or("not a result of `strata bench pager|remote|stream|gpu-micro|graph|embed`")?;
        let gpu = json.get("gpu").and_then(serde_json::Value::as_str);
        Ok(Self {
            strata_bench_record: 0,
            bench: bench.to_string(),
            machine: Machine {
                hostname: "older result file".into(),
                cpus: 0,
                cpu_model: String::new(),
                memory_bytes: 0,
                kernel_release: "unknown".into(),
            },
            device: gpu.map(|name| Device {
                name: name.to_string(),
                pci_address: String::new(),
                driver: "unknown".into(),
            }),
            commit: "unknown".into(),
            arguments: Vec::new(),
            finished_unix: 0,
            ceilings: CeilingsUsed {
                source: json
                    .get("ceilings_from")
                    .and_then(serde_json::Value::as_str)
                    .map_or_else(
                        || "none recorded (older build)".into(),
                        |c| format!("{c}, constants of an older build"),
                    ),
                values: None,
            },
            figures: crate::compare::figures(bench, &json),
            results: json,
        })
    }
}

/// Reads any result file as JSON (a record, or a bare result file of an older build).
pub fn read_json(path: &Path) -> Result<serde_json::Value, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| RecordError::Json {
        path: path.display().to_string(),
        source,
    })
}
