//! The interposer's settings, read from `STRATA_*` variables (set by `strata run`, or by hand
//! when the library is preloaded on its own).

use std::path::PathBuf;

use strata_core::config::{StoreKind, check_env_names, process_env};
use strata_core::{ConfigError, PagerConfig, StoreConfig, parse_size};

/// Default smallest allocation placed in the arena. Below this, the C library's allocator
/// is used: its per-block overhead is lower and small objects are rarely the bulk of a
/// large footprint. Measured: 64 KiB, 256 KiB and 4 MiB give the same faults and times
/// (within 8 %) on `sort` and NumPy, whose bulk is in blocks of many MiB.
pub const DEFAULT_THRESHOLD: u64 = 256 << 10;
/// Default page size of the arena region. Measured (`results/RESULTS.md`, 2026-11-23): best
/// at up to about 3x the budget and for sequential sweeps (a 16 KiB page takes 2x as long
/// on `sort` at 3x, 2.6x on `stress-ng` sequential); 16 KiB wins only in deep thrashing
/// (`sort` at 6x: 35-52 s against 60-76 s), where `--page-size 16KiB` is the advice.
pub const DEFAULT_PAGE: u64 = 64 << 10;
/// Default water marks of the arena (evict from `HIGH` % of the budget down to `LOW` %): the
/// whole budget is the program's working set, so evicting in small batches keeps more of it
/// resident. Measured: 18-22 % fewer faults than the pager's 70/90 at 4, 16 and 64 KiB pages
/// on `sort` at 6x the budget, 40 % fewer bytes moved at 3x.
pub const DEFAULT_WATER_MARKS: (u8, u8) = (90, 98);
/// Default read-ahead window of the arena, in pages, for faults that continue a sequential
/// stream (a fault right at the end of a recent fill; random faults do not read ahead).
/// Measured (`results/RESULTS.md`): `stress-ng` incdec at 4x the budget, 64 KiB pages, 0 / 8
/// / 16 pages: lz4 memory store 0.93 / 0.69 / 0.83 s, file store 1.69 / 1.48 / 1.57 s,
/// memory node 3.25 / 1.98 / 2.10 s (single runs, before the other stream changes).
pub const DEFAULT_READ_AHEAD: u64 = 8;
/// Whether the arena installs pages written during their last stay writable on a read fault
/// (saving the write-protect fault of programs that read, then write each page).
pub const PREDICT_WRITES: bool = true;
/// Default resident budget when none is given.
pub const DEFAULT_MEMORY: u64 = 1 << 30;
/// Default virtual size of the arena (address space and store size, not memory).
pub const DEFAULT_ARENA: u64 = 64 << 30;

/// Why the settings were refused.
#[derive(Debug)]
pub enum OptionsError {
    /// A `STRATA_*` value or combination the core configuration refused.
    Config(ConfigError),
    /// A value this crate checks itself.
    Bad(String),
}

impl std::fmt::Display for OptionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(e) => write!(f, "{e}"),
            Self::Bad(s) => f.write_str(s),
        }
    }
}

impl From<ConfigError> for OptionsError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

/// Everything the runtime needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The arena region's pager configuration (its buffer is the process's budget).
    pub pager: PagerConfig,
    /// The store (for `file:DIR`, the directory each process creates its store file in).
    pub store: StoreConfig,
    /// Smallest allocation placed in the arena.
    pub threshold: u64,
    /// Virtual size of the arena.
    pub arena_bytes: u64,
    /// Descriptor to append a JSON report line to at exit (set by `strata run`).
    pub report_fd: Option<i32>,
    /// File to append a JSON report line to at exit (for standalone use).
    pub stats_path: Option<PathBuf>,
    /// Install pages written during their last stay writable on a read fault
    /// ([`strata_pager::RegionBuilder::predict_writes`]); on, see [`PREDICT_WRITES`].
    pub predict_writes: bool,
}

fn size_var(name: &str) -> Result<Option<u64>, OptionsError> {
    match std::env::var(name) {
        Ok(v) => parse_size(&v).map(Some).map_err(|e| {
            OptionsError::Bad(format!("{name}={v:?} is not a size: {e}; write e.g. 4GiB"))
        }),
        Err(_) => Ok(None),
    }
}

/// The threshold alone, read cheaply at the first allocation (before anything else is set
/// up); a bad value falls back to the default here and is reported by [`Options::from_env`].
pub fn threshold_from_env() -> u64 {
    size_var("STRATA_RUN_THRESHOLD")
        .ok()
        .flatten()
        .unwrap_or(DEFAULT_THRESHOLD)
}

impl Options {
    /// Reads and validates every setting.
    pub fn from_env() -> Result<Self, OptionsError> {
        check_env_names(&process_env()?)?;
        let mut pager = PagerConfig::builder()
            .page_bytes(DEFAULT_PAGE)
            .buffer_bytes(DEFAULT_MEMORY)
            .water_marks(DEFAULT_WATER_MARKS.0, DEFAULT_WATER_MARKS.1)
            .read_ahead(DEFAULT_READ_AHEAD)
            .with_env()?;
        if let Some(m) = size_var("STRATA_RUN_MEMORY")? {
            pager = pager.buffer_bytes(m);
        }
        let pager = pager.build()?;
        let store = StoreConfig::builder().with_env()?.build()?;
        let threshold = size_var("STRATA_RUN_THRESHOLD")?.unwrap_or(DEFAULT_THRESHOLD);
        if threshold < pager.page_bytes {
            return Err(OptionsError::Bad(format!(
                "STRATA_RUN_THRESHOLD ({threshold} bytes) is below the page size ({} bytes): every arena block takes whole pages; use a threshold of at least one page",
                pager.page_bytes
            )));
        }
        let arena_bytes = size_var("STRATA_RUN_ARENA")?.unwrap_or(DEFAULT_ARENA);
        if arena_bytes < pager.buffer_bytes {
            return Err(OptionsError::Bad(format!(
                "STRATA_RUN_ARENA ({arena_bytes} bytes) is smaller than the memory budget ({} bytes); give the arena at least the budget",
                pager.buffer_bytes
            )));
        }
        let report_fd = match std::env::var("STRATA_RUN_REPORT_FD") {
            Ok(v) => Some(v.trim().parse::<i32>().map_err(|_| {
                OptionsError::Bad(format!(
                    "STRATA_RUN_REPORT_FD={v:?} is not a descriptor number (it is set by `strata run`; unset it)"
                ))
            })?),
            Err(_) => None,
        };
        if let StoreKind::File { path } = &store.kind
            && !path.is_dir()
        {
            return Err(OptionsError::Bad(format!(
                "STRATA_STORE=file:{} must name a directory (each process creates its own store file there and removes it at once); create it or pick another",
                path.display()
            )));
        }
        Ok(Self {
            pager,
            store,
            threshold,
            arena_bytes,
            report_fd,
            stats_path: std::env::var_os("STRATA_RUN_STATS").map(PathBuf::from),
            predict_writes: PREDICT_WRITES,
        })
    }
}
