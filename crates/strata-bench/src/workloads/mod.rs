//! `strata bench graph` and `strata bench embed`: each workload through Strata at several
//! oversubscription factors and through the memories a user would pick instead (zero-copy
//! pinned host memory, UVM where the data fits, all-in-GPU memory where it fits), validated,
//! timed (median of several runs after a warm-up run, each started cold, with Strata's cache
//! emptied and UVM's pages migrated back to the host, or warm, as configured), with ratios,
//! Strata's statistics, JSON and SVG. Graphs default to cold starts (each run moves its data
//! from the host, like UVM's first touch); embeddings default to warm (a serving table's cache
//! stays populated between batches).

pub mod embed;
pub mod graph;
pub mod report;

/// A fresh seed for a test run (time-based), printed so a failure can be replayed with
/// `STRATA_TEST_SEED=<seed>`.
#[cfg(test)]
pub(crate) fn test_seed() -> u64 {
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = std::env::var("STRATA_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                u64::try_from(now.as_nanos() & u128::from(u64::MAX)).unwrap_or(1)
            });
        eprintln!("strata-bench test seed: {seed} (replay with STRATA_TEST_SEED={seed})");
        seed
    })
}

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use strata_gpu::{EvictionPolicy, Strata};

use report::Row;
use strata_workloads::gpu::device::GpuWorkloadError;
use strata_workloads::gpu::placed::{Element, Placed};

/// What every workload benchmark compares, and how.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Strata oversubscription factors (data size over cache size).
    pub oversubscription: Vec<f64>,
    /// Modes to compare.
    pub modes: Modes,
    /// Strata page size.
    pub page_size: u64,
    /// Strata eviction policy.
    pub policy: EvictionPolicy,
    /// Timed runs per configuration (after one validated warm-up run).
    pub reps: u32,
    /// Start every timed run cold (Strata's cache emptied, UVM's pages migrated back to the
    /// host) rather than warm (whatever the previous run left resident).
    pub cold: bool,
    /// GPU ordinal.
    pub gpu: usize,
    /// PCIe read rate by SMs measured on this machine (`strata bench ceilings`), GB/s; rows
    /// report no PCIe fraction without it.
    pub pcie_read_gbps: Option<f64>,
    /// Strata's spaces over a store (`--store`), or `None` for a pinned host copy.
    pub store: Option<crate::store_spec::SpaceBacking>,
    /// Neighbour GPUs' memory Strata's spaces borrow as their peer tier (`strata bench
    /// peer`; empty: host only). Spaces over a pinned host copy only.
    pub peers: Vec<strata_gpu::space::PeerBorrow>,
}

impl Comparison {
    /// Prepares `placed` for run `rep` (0 is the warm-up): always cold before the warm-up;
    /// before timed runs cold or warm as configured, with Strata's statistics zeroed.
    ///
    /// # Errors
    /// Eviction, migration or counter access failed.
    pub fn prepare(&self, placed: &Placed, rep: u32) -> Result<(), GpuWorkloadError> {
        if rep == 0 || self.cold {
            placed.make_cold()
        } else {
            placed.reset_stats()
        }
    }
}

/// The measured rows and the setting they were taken in.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// GPU name.
    pub gpu: String,
    /// Strata page size.
    pub page_size: u64,
    /// Strata policy.
    pub policy: String,
    /// Timed runs started cold (true) or warm.
    pub cold: bool,
    /// One row per (workload, mode).
    pub rows: Vec<Row>,
    /// Modes that could not run here, with why.
    pub skipped: Vec<String>,
    /// What Strata's spaces were backed by: `pinned host copy`, or the store and host cache.
    pub backing: String,
}

impl Outcome {
    /// An empty outcome for `compare` on `strata`'s GPU.
    #[must_use]
    pub fn new(strata: &Strata, compare: &Comparison) -> Self {
        Self {
            gpu: strata.gpu().name.clone(),
            page_size: compare.page_size,
            policy: format!("{:?}", compare.policy),
            cold: compare.cold,
            rows: Vec::new(),
            skipped: Vec::new(),
            backing: match &compare.store {
                None => "pinned host copy".into(),
                Some(b) => format!(
                    "{} store, host cache {}",
                    b.spec.label(),
                    b.host_cache
                        .map_or_else(|| "default".into(), strata_core::format_size)
                ),
            },
        }
    }
}

/// Places `data` as `mode` asks. A baseline whose data does not fit on this GPU is recorded
/// in `outcome.skipped` and yields `None`.
///
/// # Errors
/// Any other failure.
pub fn place_or_skip<T: Element>(
    strata: &Strata,
    data: &[T],
    mode: Mode,
    compare: &Comparison,
    outcome: &mut Outcome,
) -> Result<Option<Placed>, GpuWorkloadError> {
    let gpu = strata.gpu();
    let placed = match mode {
        Mode::Strata(factor) => {
            let cache = cache_for(data.len() as u64 * 4, factor, compare.page_size);
            match &compare.store {
                None => Placed::space_with_peers(
                    strata,
                    data,
                    cache,
                    compare.page_size,
                    compare.policy,
                    &compare.peers,
                ),
                Some(_) if !compare.peers.is_empty() => Err(GpuWorkloadError::Invalid(
                    "a peer tier needs spaces over a pinned host copy: leave out --store".into(),
                )),
                Some(backing) => space_over_store(strata, backing, data, cache, compare),
            }
        }
        Mode::ZeroCopy => Placed::zero_copy(gpu, data),
        Mode::Uvm => Placed::managed(gpu, data),
        Mode::GpuMemory => Placed::device(gpu, data),
    };
    match placed {
        Ok(p) => Ok(Some(p)),
        Err(e) if is_does_not_fit(&e) => {
            eprintln!("{}: skipped: {e}", mode.label());
            outcome.skipped.push(format!("{}: {e}", mode.label()));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `data` in a Strata space over a fresh store of `backing`: the bytes go into the store
/// first, then the space is made over it (as `Placed::space` does for a pinned host copy).
fn space_over_store<T: Element>(
    strata: &Strata,
    backing: &crate::store_spec::SpaceBacking,
    data: &[T],
    cache_bytes: u64,
    compare: &Comparison,
) -> Result<Placed, GpuWorkloadError> {
    let options = strata_gpu::SpaceOptions {
        page_size: compare.page_size,
        cache_bytes,
        element: T::TYPE,
        policy: compare.policy,
        read_through: strata_gpu::space::read_through_from_env()?.unwrap_or(false),
        host_cache_bytes: backing.host_cache,
        // STRATA_GPU_WRITE_BACK=off|on|N compares runs without and with it.
        background_write_back: strata_gpu::space::default_write_back(),
        peers: Vec::new(),
        // Over a store, remote access is off (auto); STRATA_GPU_REMOTE_ACCESS=N is refused.
        remote_access: strata_gpu::space::remote_access_from_env()?.unwrap_or_default(),
        sector_bytes: strata_gpu::space::sector_from_env()?.flatten(),
    };
    // Whole pages: the store and the space cover the last partial page too.
    let bytes = (data.len() as u64 * 4)
        .max(4)
        .next_multiple_of(compare.page_size);
    // Aligned, so that an O_DIRECT file store takes the bytes without bouncing them.
    let mut image =
        crate::store_spec::AlignedBuf::new(usize::try_from(bytes).unwrap_or(usize::MAX));
    strata_workloads::gpu::placed::copy_into(image.as_mut(), data);
    let mut space = crate::gpu_micro::space_over_store(strata, backing, image.as_mut(), &options)?;
    // Only read by the workloads' kernels, as over a host copy (`Placed::space`).
    space.set_read_only(true)?;
    Ok(Placed::Space(space))
}

/// A progress bar on stderr (hidden automatically when stderr is not a terminal).
#[must_use]
pub fn progress(message: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_string());
    bar
}

/// The memories compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    /// Strata spaces at each oversubscription factor.
    pub strata: bool,
    /// Zero-copy pinned host memory.
    pub zero_copy: bool,
    /// CUDA managed memory (only where the data fits in free GPU memory).
    pub uvm: bool,
    /// All in GPU memory (only where it fits).
    pub gpu_memory: bool,
}

impl Modes {
    /// Every mode.
    #[must_use]
    pub fn all() -> Self {
        Self {
            strata: true,
            zero_copy: true,
            uvm: true,
            gpu_memory: true,
        }
    }

    /// Parses a comma list of `strata`, `zero-copy`, `uvm`, `gpu-memory` (or `all`).
    ///
    /// # Errors
    /// An unknown name.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut modes = Self {
            strata: false,
            zero_copy: false,
            uvm: false,
            gpu_memory: false,
        };
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "all" => modes = Self::all(),
                "strata" => modes.strata = true,
                "zero-copy" | "zc" => modes.zero_copy = true,
                "uvm" => modes.uvm = true,
                "gpu-memory" | "gpu" => modes.gpu_memory = true,
                other => {
                    return Err(format!(
                        "unknown mode {other:?}: use strata, zero-copy, uvm, gpu-memory or all"
                    ));
                }
            }
        }
        Ok(modes)
    }
}

/// A mode with the label it is reported under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Strata with cache = data / factor.
    Strata(f64),
    /// Zero-copy.
    ZeroCopy,
    /// UVM.
    Uvm,
    /// GPU memory.
    GpuMemory,
}

impl Mode {
    /// Report label.
    #[must_use]
    pub fn label(self) -> String {
        match self {
            Self::Strata(f) => format!("strata-{f}x"),
            Self::ZeroCopy => "zero-copy".into(),
            Self::Uvm => "uvm".into(),
            Self::GpuMemory => "gpu-memory".into(),
        }
    }

    /// The modes to run, in order: the upper bound first (its result is the cross-check for
    /// large graphs), then the baselines, then Strata from least to most oversubscribed.
    #[must_use]
    pub fn list(modes: Modes, factors: &[f64]) -> Vec<Self> {
        let mut list = Vec::new();
        if modes.gpu_memory {
            list.push(Self::GpuMemory);
        }
        if modes.zero_copy {
            list.push(Self::ZeroCopy);
        }
        if modes.uvm {
            list.push(Self::Uvm);
        }
        if modes.strata {
            list.extend(factors.iter().map(|f| Self::Strata(*f)));
        }
        list
    }
}

/// Parses a comma list of oversubscription factors (each at least 1).
///
/// # Errors
/// A factor that is not a number or is below 1.
pub fn parse_factors(list: &str) -> Result<Vec<f64>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.trim_end_matches('x').parse::<f64>() {
            Ok(f) if f >= 1.0 && f.is_finite() => Ok(f),
            _ => Err(format!(
                "oversubscription {s:?}: give factors of 1 or more, e.g. 1,2,4"
            )),
        })
        .collect()
}

/// Cache bytes for data of `bytes` at oversubscription `factor`, rounded up to whole pages.
#[must_use]
pub fn cache_for(bytes: u64, factor: f64, page_size: u64) -> u64 {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let raw = (bytes as f64 / factor).ceil() as u64;
    raw.div_ceil(page_size).max(2) * page_size
}

/// Whether an error means "this baseline cannot run here" (reported and skipped) rather
/// than a failure.
#[must_use]
pub fn is_does_not_fit(error: &GpuWorkloadError) -> bool {
    matches!(error, GpuWorkloadError::DoesNotFit { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_and_cache_sizes() {
        assert_eq!(parse_factors("1, 2,4x").unwrap(), vec![1.0, 2.0, 4.0]);
        assert!(parse_factors("0.5").is_err());
        assert!(parse_factors("two").is_err());
        assert_eq!(Modes::parse("all").unwrap(), Modes::all());
        let m = Modes::parse("strata,zc").unwrap();
        assert!(m.strata && m.zero_copy && !m.uvm && !m.gpu_memory);
        assert!(Modes::parse("swap").is_err());
        assert_eq!(cache_for(1 << 20, 2.0, 4096), 1 << 19);
        assert_eq!(cache_for(10_000, 4.0, 4096), 4096 * 2);
        assert_eq!(cache_for(100 << 20, 3.0, 65536) % 65536, 0);
        let labels: Vec<String> = Mode::list(Modes::all(), &[1.0, 2.0])
            .into_iter()
            .map(Mode::label)
            .collect();
        assert_eq!(
            labels,
            ["gpu-memory", "zero-copy", "uvm", "strata-1x", "strata-2x"]
        );
    }
}
