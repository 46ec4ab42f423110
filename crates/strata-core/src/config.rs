//! Configuration: one builder per concern (GPU space, CPU pager region, store), each validated
//! with errors that say what is wrong and what to do, and `STRATA_*` environment overrides.
//!
//! Precedence is the order of calls: `PagerConfig::builder().with_env()?.fillers(4).build()?`
//! lets the environment override the defaults and the explicit `fillers(4)` override both.
//! Every `STRATA_*` variable in the environment must be one this crate knows
//! ([`KNOWN_VARIABLES`]); a misspelt one is an error rather than a silently ignored setting.

use std::path::PathBuf;

use crate::geometry::{GeometryError, MAX_PAGE_SIZE, MIN_PAGE_SIZE, PageSize};
use crate::units::{SizeParseError, format_size, parse_size};

/// Every `STRATA_*` environment variable Strata reads, with its meaning.
pub const KNOWN_VARIABLES: &[(&str, &str)] = &[
    (
        "STRATA_PAGE_SIZE",
        "page size of new spaces and regions (4KiB..2MiB)",
    ),
    ("STRATA_CACHE_SIZE", "GPU page-cache size of new spaces"),
    (
        "STRATA_BUFFER_SIZE",
        "resident-set budget of a pager region",
    ),
    ("STRATA_FILLERS", "filler threads per pager region"),
    ("STRATA_EVICTORS", "evictor threads per pager region"),
    (
        "STRATA_READ_AHEAD",
        "pages read ahead after a sequential fault",
    ),
    (
        "STRATA_EVICT_LOW_WATER",
        "percent of the buffer eviction stops at",
    ),
    (
        "STRATA_EVICT_HIGH_WATER",
        "percent of the buffer eviction starts at",
    ),
    (
        "STRATA_FAULT_SPIN_US",
        "microseconds a filler polls for the next fault before sleeping (0: never)",
    ),
    (
        "STRATA_READ_BACK",
        "pages evicted next to a faulting page that are read back with it (0: none)",
    ),
    (
        "STRATA_SKIP_UNCHANGED",
        "evict dirty pages that hold their stored bytes again without writing them (true/false)",
    ),
    (
        "STRATA_PAGER_TRACE",
        "pager regions: file prefix for a record of evictions and fills (for offline studies)",
    ),
    (
        "STRATA_STORE",
        "backing store: memory, file:PATH or remote:HOST:PORT[,HOST:PORT...]",
    ),
    (
        "STRATA_FILE_DIRECT",
        "open file stores with O_DIRECT (true/false)",
    ),
    (
        "STRATA_FILE_GROW",
        "allow growing a file store that is too short (true/false)",
    ),
    ("STRATA_CODEC", "page codec: none, lz4, or zfp:TOLERANCE"),
    (
        "STRATA_REMOTE_TOKEN",
        "secret token presented to memory nodes",
    ),
    (
        "STRATA_REMOTE_TIMEOUT",
        "seconds before an unanswered remote request is an error",
    ),
    (
        "STRATA_UCX_FOOTPRINT",
        "memory-node clients: `lean` (small UCX queues; strata run's default) or `standard`",
    ),
    (
        "STRATA_REMOTE_FILES",
        "memory nodes on this host lend their memory as files the program reads itself (true, the default) or serve it over messages (false)",
    ),
    ("STRATA_KERNEL_CACHE", "directory for compiled GPU kernels"),
    (
        "STRATA_CUDA_HOME",
        "CUDA toolkit root for NVRTC include paths",
    ),
    (
        "STRATA_GPU_READ_THROUGH",
        "GPU spaces serve first-touch page reads from the host copy (true/false)",
    ),
    (
        "STRATA_GPU_RING_THREADS",
        "GPU spaces over a store: store I/O threads serving the request ring",
    ),
    (
        "STRATA_GPU_READ_AHEAD",
        "GPU spaces over a store: pages read ahead of a sequential run",
    ),
    (
        "STRATA_GPU_WRITE_BACK",
        "GPU spaces: background write-back warps beside kernels (off, on, or a number of warps)",
    ),
    (
        "STRATA_GPU_REMOTE_ACCESS",
        "GPU spaces: element accesses to pages not resident go over the bus in place until a page has this many (off, auto, or a number)",
    ),
    (
        "STRATA_GPU_SECTOR",
        "GPU spaces: sub-page fetch, element accesses load sectors of this size instead of whole pages (off or a size)",
    ),
    (
        "STRATA_RUN_MEMORY",
        "strata run: resident budget of the whole program",
    ),
    (
        "STRATA_RUN_THRESHOLD",
        "strata run: smallest allocation paged by Strata",
    ),
    (
        "STRATA_RUN_ARENA",
        "strata run: virtual size of the paged arena",
    ),
    (
        "STRATA_RUN_STATS",
        "strata run: file to append a JSON report to at exit",
    ),
    (
        "STRATA_RUN_REPORT_FD",
        "strata run: report descriptor (set by strata run)",
    ),
    ("STRATA_RUN_LIBRARY", "strata run: path of libstrata_run.so"),
    (
        "STRATA_RUN_KEEP_ROOM",
        "strata run: free room kept in the program's memory cgroup by giving paged memory back (a size, on, or off)",
    ),
    (
        "STRATA_RUN_LOSSY",
        "strata run: `floats` allows a lossy codec (zfp): every paged allocation holds only f64 values",
    ),
];

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A bad page size for a GPU space.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// A bad pager page size.
    #[error(
        "pager page size {0} is not a multiple of 4 KiB between 4 KiB and 2 MiB; use for example 4KiB, 12KiB, 64KiB or 2MiB"
    )]
    PagerPageSize(u64),
    /// The resident budget cannot hold enough pages.
    #[error("{what} of {size} holds fewer than {min} pages of {page}; make it at least {needed}")]
    TooSmall {
        /// `buffer` or `cache`.
        what: &'static str,
        /// The size given.
        size: String,
        /// Minimum page count.
        min: u64,
        /// The page size.
        page: String,
        /// The smallest acceptable size.
        needed: String,
    },
    /// A thread count of zero or beyond reason.
    #[error("{what} = {value} is not allowed; use 1 to {max}")]
    ThreadCount {
        /// `fillers` or `evictors`.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The largest accepted value.
        max: usize,
    },
    /// Water marks out of order or range.
    #[error(
        "eviction water marks low={low}% high={high}% are invalid; need 0 <= low < high <= 100"
    )]
    WaterMarks {
        /// Low mark.
        low: u8,
        /// High mark.
        high: u8,
    },
    /// Read-ahead beyond reason.
    #[error("read-ahead of {0} pages is too large; use 0 to 1024 pages")]
    ReadAhead(u64),
    /// Read-back beyond reason.
    #[error("read-back of {0} pages is too large; use 0 to {MAX_READ_BACK} pages")]
    ReadBack(u64),
    /// A fault poll beyond reason.
    #[error(
        "a fault poll of {0} us is too long; use 0 (fillers sleep at once) to {MAX_FAULT_SPIN_US} us"
    )]
    FaultSpin(u32),
    /// An environment variable holds a value that does not parse.
    #[error("{name}={value:?}: {reason}")]
    BadEnv {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// A `STRATA_*` variable whose name or value is not UTF-8.
    #[error(
        "environment variable {name} has a {part} that is not UTF-8; Strata settings are text: set it again in UTF-8, or unset it"
    )]
    NonUtf8Env {
        /// The variable (lossily decoded for display).
        name: String,
        /// `name` or `value`.
        part: &'static str,
    },
    /// A `STRATA_*` variable nobody reads: almost always a typo.
    #[error("unknown environment variable {name}; {hint}")]
    UnknownEnv {
        /// The variable.
        name: String,
        /// A suggestion, or the list of known names.
        hint: String,
    },
    /// A store description that does not parse.
    #[error(
        "store {0:?} not understood; write memory, file:PATH or remote:HOST:PORT[,HOST:PORT...]"
    )]
    StoreSpec(String),
    /// A codec description that does not parse.
    #[error(
        "codec {0:?} not understood; write none, lz4 or zfp:TOLERANCE (an absolute error bound > 0, e.g. zfp:1e-6)"
    )]
    CodecSpec(String),
    /// A required setting is missing.
    #[error("{0} is not set; set it on the builder or through its STRATA_ variable")]
    Missing(&'static str),
    /// A lossy codec for a whole unmodified program, without its user's word that the paged
    /// memory holds only floating-point values.
    #[error(
        "codec zfp:{tolerance} is lossy: it keeps each 8-byte word of a page only within {tolerance} of its value as a double, but an unmodified program's large allocations also hold pointers, integers and text, which it would change (GNU sort crashes); use --codec lz4 (lossless), or pass --lossy-floats (STRATA_RUN_LOSSY=floats) if every allocation of at least the threshold holds only f64 values"
    )]
    LossyUnconfirmed {
        /// The codec's absolute error bound.
        tolerance: f64,
    },
}

/// Refuses a lossy codec for `strata run` unless `lossy` (`STRATA_RUN_LOSSY`) is `floats`:
/// the interposer pages every large allocation of a program it knows nothing about, and ZFP
/// changes any word that reads as a normal double by up to its tolerance. (The codec keeps
/// words that read as subnormals, such as pointers and small integers, exact either way.)
pub fn check_run_codec(codec: CodecKind, lossy: Option<&str>) -> Result<(), ConfigError> {
    match lossy.map(str::trim) {
        None => {}
        Some("floats") => return Ok(()),
        Some(other) => {
            return Err(ConfigError::BadEnv {
                name: "STRATA_RUN_LOSSY".into(),
                value: other.into(),
                reason:
                    "write floats (every allocation Strata pages holds only f64 values) or unset it"
                        .into(),
            });
        }
    }
    match codec {
        CodecKind::Zfp { tolerance } => Err(ConfigError::LossyUnconfirmed { tolerance }),
        CodecKind::None | CodecKind::Lz4 => Ok(()),
    }
}

/// Longest `STRATA_REMOTE_TIMEOUT` accepted, in seconds (one day).
pub const MAX_REMOTE_TIMEOUT_SECS: u64 = 86_400;

/// The environment as name/value pairs; a parameter so tests need not touch the process
/// environment (which is shared by all test threads).
pub type EnvVars = Vec<(String, String)>;

/// The process's `STRATA_*` variables.
///
/// Variables whose name or value is not UTF-8 are common in the wild (file names in another
/// encoding) and none of Strata's business unless they are `STRATA_*` ones; those are an error,
/// since a setting read lossily would be applied wrongly.
///
/// # Errors
/// [`ConfigError::NonUtf8Env`] for a `STRATA_*` variable that is not UTF-8.
pub fn process_env() -> Result<EnvVars, ConfigError> {
    strata_vars(std::env::vars_os())
}

/// The `STRATA_*` variables of `vars` (see [`process_env`]).
///
/// # Errors
/// [`ConfigError::NonUtf8Env`] for a `STRATA_*` variable that is not UTF-8.
pub fn strata_vars(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<EnvVars, ConfigError> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (name, value) in vars {
        if !name.as_bytes().starts_with(b"STRATA_") {
            continue;
        }
        let lossy = name.to_string_lossy().into_owned();
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => out.push((name, value)),
            (Ok(name), Err(_)) => {
                return Err(ConfigError::NonUtf8Env {
                    name,
                    part: "value",
                });
            }
            (Err(_), _) => {
                return Err(ConfigError::NonUtf8Env {
                    name: lossy,
                    part: "name",
                });
            }
        }
    }
    Ok(out)
}

/// Checks that every `STRATA_*` name in `env` is known.
pub fn check_env_names(env: &EnvVars) -> Result<(), ConfigError> {
    for (name, _) in env {
        if name.starts_with("STRATA_") && !KNOWN_VARIABLES.iter().any(|(k, _)| k == name) {
            let hint = match closest_known(name) {
                Some(k) => format!("did you mean {k}? (unset it, or see `strata info --env`)"),
                None => format!(
                    "known names are {}",
                    KNOWN_VARIABLES
                        .iter()
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            return Err(ConfigError::UnknownEnv {
                name: name.clone(),
                hint,
            });
        }
    }
    Ok(())
}

fn closest_known(name: &str) -> Option<&'static str> {
    KNOWN_VARIABLES
        .iter()
        .map(|(k, _)| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn lookup<'e>(env: &'e EnvVars, name: &str) -> Option<&'e str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn env_size(env: &EnvVars, name: &str) -> Result<Option<u64>, ConfigError> {
    lookup(env, name)
        .map(|v| {
            parse_size(v).map_err(|e: SizeParseError| ConfigError::BadEnv {
                name: name.into(),
                value: v.into(),
                reason: e.to_string(),
            })
        })
        .transpose()
}

/// Parses a whole-number environment value (`None` when unset).
///
/// # Errors
/// [`ConfigError::BadEnv`] when the value is not a whole number the type can hold.
pub fn env_number<T: std::str::FromStr>(
    env: &EnvVars,
    name: &str,
) -> Result<Option<T>, ConfigError> {
    lookup(env, name)
        .map(|v| {
            v.trim().parse::<T>().map_err(|_| ConfigError::BadEnv {
                name: name.into(),
                value: v.into(),
                // A whole number the setting's type cannot hold is not a typo: say so.
                reason: if v.trim().parse::<u128>().is_ok() {
                    "too large for this setting; use a smaller value (see `strata info --env`)"
                        .into()
                } else {
                    "not a whole number; write digits only, such as 4".into()
                },
            })
        })
        .transpose()
}

/// Parses a boolean environment value (`1/0`, `true/false`, `yes/no`, `on/off`).
pub fn env_bool(env: &EnvVars, name: &str) -> Result<Option<bool>, ConfigError> {
    lookup(env, name)
        .map(|v| match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(ConfigError::BadEnv {
                name: name.into(),
                value: v.into(),
                reason: "not a boolean; write true or false".into(),
            }),
        })
        .transpose()
}

/// The number of CPUs this process may use (1 if unknown).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}

const MAX_THREADS: usize = 1024;

// ---------------------------------------------------------------------------------------------
// GPU space

/// A validated GPU space configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SpaceConfig {
    /// Page size.
    pub page_size: PageSize,
    /// Bytes of GPU memory for the page cache (a whole number of pages).
    pub cache_bytes: u64,
}

impl SpaceConfig {
    /// A builder with defaults: 64 KiB pages, 1 GiB cache.
    pub fn builder() -> SpaceConfigBuilder {
        SpaceConfigBuilder {
            page_size: 64 << 10,
            cache_bytes: 1 << 30,
        }
    }

    /// Frames in the cache.
    pub fn frames(&self) -> u64 {
        self.cache_bytes / self.page_size.bytes()
    }
}

/// Builds a [`SpaceConfig`].
#[derive(Debug, Clone)]
pub struct SpaceConfigBuilder {
    page_size: u64,
    cache_bytes: u64,
}

impl SpaceConfigBuilder {
    /// Page size in bytes.
    pub fn page_size(mut self, bytes: u64) -> Self {
        self.page_size = bytes;
        self
    }
    /// GPU cache size in bytes.
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }
    /// Applies `STRATA_PAGE_SIZE` and `STRATA_CACHE_SIZE` from the process environment.
    pub fn with_env(self) -> Result<Self, ConfigError> {
        self.with_env_vars(&process_env()?)
    }
    /// Applies overrides from `env`.
    pub fn with_env_vars(mut self, env: &EnvVars) -> Result<Self, ConfigError> {
        check_env_names(env)?;
        if let Some(v) = env_size(env, "STRATA_PAGE_SIZE")? {
            self.page_size = v;
        }
        if let Some(v) = env_size(env, "STRATA_CACHE_SIZE")? {
            self.cache_bytes = v;
        }
        Ok(self)
    }
    /// Validates. The cache is rounded down to whole pages and must hold at least 2.
    pub fn build(self) -> Result<SpaceConfig, ConfigError> {
        let page_size = PageSize::new(self.page_size)?;
        let frames = self.cache_bytes / page_size.bytes();
        if frames < 2 {
            return Err(too_small("cache", self.cache_bytes, 2, page_size.bytes()));
        }
        Ok(SpaceConfig {
            page_size,
            cache_bytes: frames * page_size.bytes(),
        })
    }
}

fn too_small(what: &'static str, size: u64, min: u64, page: u64) -> ConfigError {
    ConfigError::TooSmall {
        what,
        size: format_size(size),
        min,
        page: format_size(page),
        needed: format_size(min * page),
    }
}

// ---------------------------------------------------------------------------------------------
// CPU pager region

/// A validated pager-region configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PagerConfig {
    /// Page size: a multiple of 4 KiB up to 2 MiB (need not be a power of two).
    pub page_bytes: u64,
    /// Resident-set budget in bytes (a whole number of pages).
    pub buffer_bytes: u64,
    /// Filler threads.
    pub fillers: usize,
    /// Evictor threads.
    pub evictors: usize,
    /// Pages read ahead after a fault that continues a sequential run.
    pub read_ahead: u64,
    /// Pages evicted next to a faulting page (in eviction order) that are read back with it
    /// in one batched store read, where they are still in the store only. 0: none.
    pub read_back: u64,
    /// Eviction stops once the resident set falls to this percent of the buffer.
    pub low_water_percent: u8,
    /// Eviction starts once the resident set reaches this percent of the buffer.
    pub high_water_percent: u8,
    /// How long (microseconds) one filler keeps polling for the next fault after serving
    /// one, before it sleeps. 0: fillers sleep at once.
    pub fault_spin_us: u32,
    /// Evict a dirty page without writing it back when its bytes are again those read from
    /// the store (told by a keyed 128-bit digest kept per page read; see `strata-pager`).
    pub skip_unchanged: bool,
}

impl PagerConfig {
    /// A builder with defaults: 64 KiB pages, 1 GiB buffer, one filler and one evictor per
    /// two CPUs (at least one each), no read-ahead, water marks 70 % / 90 %, fillers polling
    /// [`DEFAULT_FAULT_SPIN_US`] for the next fault where there is more than one CPU.
    pub fn builder() -> PagerConfigBuilder {
        let cpus = available_cpus();
        let half = (cpus / 2).max(1);
        PagerConfigBuilder {
            page_bytes: 64 << 10,
            buffer_bytes: 1 << 30,
            fillers: half,
            evictors: half,
            read_ahead: 0,
            read_back: DEFAULT_READ_BACK,
            low_water: 70,
            high_water: 90,
            fault_spin_us: if cpus > 1 { DEFAULT_FAULT_SPIN_US } else { 0 },
            skip_unchanged: true,
        }
    }

    /// Pages the buffer holds.
    pub fn buffer_pages(&self) -> u64 {
        self.buffer_bytes / self.page_bytes
    }
}

/// Builds a [`PagerConfig`].
#[derive(Debug, Clone)]
pub struct PagerConfigBuilder {
    page_bytes: u64,
    buffer_bytes: u64,
    fillers: usize,
    evictors: usize,
    read_ahead: u64,
    read_back: u64,
    low_water: u8,
    high_water: u8,
    fault_spin_us: u32,
    skip_unchanged: bool,
}

/// Default of [`PagerConfig::fault_spin_us`] on machines with more than one CPU. A faulting
/// thread that must wake a sleeping filler on another CPU, and be woken back from there, waits
/// for two cross-CPU wake-ups per fault; in a virtual machine each costs tens of
/// microseconds (an inter-processor interrupt and a halted virtual CPU to resume). A filler
/// that keeps polling while faults keep coming takes the next fault at once. Sort at 6x its
/// budget on a 2-CPU VM: see `crates/strata-run/results/RESULTS.md` (session 7).
pub const DEFAULT_FAULT_SPIN_US: u32 = 50;

/// Default of [`PagerConfig::read_back`]: pages evicted next to a faulting page that are
/// read back with it. Sort at 6x its budget: see `crates/strata-run/results/RESULTS.md`
/// (read-back).
pub const DEFAULT_READ_BACK: u64 = 0;

/// The most pages read back with one fault (one store batch; an evictor's batch is 64).
pub const MAX_READ_BACK: u64 = 63;

/// The longest fault poll accepted (a filler that polls longer only burns a CPU).
pub const MAX_FAULT_SPIN_US: u32 = 10_000;

impl PagerConfigBuilder {
    /// Page size in bytes.
    pub fn page_bytes(mut self, bytes: u64) -> Self {
        self.page_bytes = bytes;
        self
    }
    /// Resident budget in bytes.
    pub fn buffer_bytes(mut self, bytes: u64) -> Self {
        self.buffer_bytes = bytes;
        self
    }
    /// Filler threads.
    pub fn fillers(mut self, n: usize) -> Self {
        self.fillers = n;
        self
    }
    /// Evictor threads.
    pub fn evictors(mut self, n: usize) -> Self {
        self.evictors = n;
        self
    }
    /// Read-ahead in pages.
    pub fn read_ahead(mut self, pages: u64) -> Self {
        self.read_ahead = pages;
        self
    }
    /// Pages evicted next to a faulting page read back with it (0: none).
    pub fn read_back(mut self, pages: u64) -> Self {
        self.read_back = pages;
        self
    }
    /// Water marks in percent of the buffer.
    pub fn water_marks(mut self, low: u8, high: u8) -> Self {
        self.low_water = low;
        self.high_water = high;
        self
    }
    /// Whether a dirty page holding its stored bytes again is evicted without a write
    /// (default on).
    pub fn skip_unchanged(mut self, on: bool) -> Self {
        self.skip_unchanged = on;
        self
    }
    /// Microseconds a filler polls for the next fault before sleeping (0: never polls).
    pub fn fault_spin_us(mut self, us: u32) -> Self {
        self.fault_spin_us = us;
        self
    }
    /// Applies `STRATA_*` overrides from the process environment.
    pub fn with_env(self) -> Result<Self, ConfigError> {
        self.with_env_vars(&process_env()?)
    }
    /// Applies overrides from `env`.
    pub fn with_env_vars(mut self, env: &EnvVars) -> Result<Self, ConfigError> {
        check_env_names(env)?;
        if let Some(v) = env_size(env, "STRATA_PAGE_SIZE")? {
            self.page_bytes = v;
        }
        if let Some(v) = env_size(env, "STRATA_BUFFER_SIZE")? {
            self.buffer_bytes = v;
        }
        if let Some(v) = env_number(env, "STRATA_FILLERS")? {
            self.fillers = v;
        }
        if let Some(v) = env_number(env, "STRATA_EVICTORS")? {
            self.evictors = v;
        }
        if let Some(v) = env_number(env, "STRATA_READ_AHEAD")? {
            self.read_ahead = v;
        }
        if let Some(v) = env_number(env, "STRATA_READ_BACK")? {
            self.read_back = v;
        }
        if let Some(v) = env_number(env, "STRATA_EVICT_LOW_WATER")? {
            self.low_water = v;
        }
        if let Some(v) = env_number(env, "STRATA_EVICT_HIGH_WATER")? {
            self.high_water = v;
        }
        if let Some(v) = env_number(env, "STRATA_FAULT_SPIN_US")? {
            self.fault_spin_us = v;
        }
        if let Some(v) = env_bool(env, "STRATA_SKIP_UNCHANGED")? {
            self.skip_unchanged = v;
        }
        Ok(self)
    }
    /// Validates. The buffer is rounded down to whole pages and must hold at least 4, so that
    /// eviction always has a victim while fillers work.
    pub fn build(self) -> Result<PagerConfig, ConfigError> {
        let p = self.page_bytes;
        if !p.is_multiple_of(MIN_PAGE_SIZE) || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&p) {
            return Err(ConfigError::PagerPageSize(p));
        }
        let pages = self.buffer_bytes / p;
        if pages < 4 {
            return Err(too_small("buffer", self.buffer_bytes, 4, p));
        }
        for (what, value) in [("fillers", self.fillers), ("evictors", self.evictors)] {
            if value == 0 || value > MAX_THREADS {
                return Err(ConfigError::ThreadCount {
                    what,
                    value,
                    max: MAX_THREADS,
                });
            }
        }
        if self.low_water >= self.high_water || self.high_water > 100 {
            return Err(ConfigError::WaterMarks {
                low: self.low_water,
                high: self.high_water,
            });
        }
        if self.read_ahead > 1024 {
            return Err(ConfigError::ReadAhead(self.read_ahead));
        }
        if self.read_back > MAX_READ_BACK {
            return Err(ConfigError::ReadBack(self.read_back));
        }
        if self.fault_spin_us > MAX_FAULT_SPIN_US {
            return Err(ConfigError::FaultSpin(self.fault_spin_us));
        }
        Ok(PagerConfig {
            page_bytes: p,
            buffer_bytes: pages * p,
            fillers: self.fillers,
            evictors: self.evictors,
            read_ahead: self.read_ahead,
            read_back: self.read_back,
            low_water_percent: self.low_water,
            high_water_percent: self.high_water,
            fault_spin_us: self.fault_spin_us,
            skip_unchanged: self.skip_unchanged,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Stores

/// Where a store's bytes live.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StoreKind {
    /// Host memory ([`crate::store::MemoryStore`]).
    Memory,
    /// A file ([`crate::store::FileStore`]).
    File {
        /// The file's path.
        path: PathBuf,
    },
    /// Memory nodes (`strata serve`), pages striped across them in order.
    Remote {
        /// `HOST:PORT` of each node.
        nodes: Vec<String>,
    },
}

/// How pages are encoded on their way into the store.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "codec", rename_all = "kebab-case")]
pub enum CodecKind {
    /// Pages stored as they are.
    None,
    /// LZ4, lossless.
    Lz4,
    /// ZFP, lossy, for pages of `f64`/`f32` only, within an absolute error bound.
    Zfp {
        /// Largest absolute error allowed per value.
        tolerance: f64,
    },
}

impl std::str::FromStr for StoreKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::StoreSpec(s.into());
        match s.split_once(':') {
            None if s == "memory" => Ok(StoreKind::Memory),
            Some(("file", path)) if !path.is_empty() => Ok(StoreKind::File { path: path.into() }),
            Some(("remote", nodes)) => {
                let nodes: Vec<String> = nodes.split(',').map(|n| n.trim().to_string()).collect();
                let valid = |n: &String| {
                    n.rsplit_once(':')
                        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                };
                if nodes.iter().all(valid) {
                    Ok(StoreKind::Remote { nodes })
                } else {
                    Err(bad())
                }
            }
            _ => Err(bad()),
        }
    }
}

impl std::str::FromStr for CodecKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "none" => Ok(CodecKind::None),
            None if s == "lz4" => Ok(CodecKind::Lz4),
            Some(("zfp", tol)) => match tol.parse::<f64>() {
                Ok(t) if t.is_finite() && t > 0.0 => Ok(CodecKind::Zfp { tolerance: t }),
                _ => Err(ConfigError::CodecSpec(s.into())),
            },
            _ => Err(ConfigError::CodecSpec(s.into())),
        }
    }
}

/// A validated store configuration. Opening it is the job of the crate that owns the store
/// kind: `strata-core` opens memory and file stores, `strata-net` remote ones, and
/// `strata-codec` wraps any of them in a codec.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoreConfig {
    /// Where the bytes live.
    pub kind: StoreKind,
    /// Page encoding.
    pub codec: CodecKind,
    /// File stores: open with `O_DIRECT`.
    pub direct: bool,
    /// File stores: extend a file that is too short.
    pub grow: bool,
    /// Remote stores: the server's token.
    pub token: Option<String>,
    /// Remote stores: seconds before an unanswered request is an error.
    pub timeout_secs: u64,
}

impl StoreConfig {
    /// A builder with defaults: memory, no codec, 10 s remote timeout.
    pub fn builder() -> StoreConfigBuilder {
        StoreConfigBuilder {
            config: StoreConfig {
                kind: StoreKind::Memory,
                codec: CodecKind::None,
                direct: false,
                grow: false,
                token: None,
                timeout_secs: 10,
            },
        }
    }
}

/// Builds a [`StoreConfig`].
#[derive(Debug, Clone)]
pub struct StoreConfigBuilder {
    config: StoreConfig,
}

impl StoreConfigBuilder {
    /// Where the bytes live.
    pub fn kind(mut self, kind: StoreKind) -> Self {
        self.config.kind = kind;
        self
    }
    /// Page codec.
    pub fn codec(mut self, codec: CodecKind) -> Self {
        self.config.codec = codec;
        self
    }
    /// `O_DIRECT` for file stores.
    pub fn direct(mut self, on: bool) -> Self {
        self.config.direct = on;
        self
    }
    /// Allow growing a short file.
    pub fn grow(mut self, on: bool) -> Self {
        self.config.grow = on;
        self
    }
    /// Token for memory nodes.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.config.token = Some(token.into());
        self
    }
    /// Remote request timeout in seconds.
    pub fn timeout_secs(mut self, secs: u64) -> Self {
        self.config.timeout_secs = secs;
        self
    }
    /// Applies `STRATA_STORE`, `STRATA_CODEC`, `STRATA_FILE_*` and `STRATA_REMOTE_*` from the
    /// process environment.
    pub fn with_env(self) -> Result<Self, ConfigError> {
        self.with_env_vars(&process_env()?)
    }
    /// Applies overrides from `env`.
    pub fn with_env_vars(mut self, env: &EnvVars) -> Result<Self, ConfigError> {
        check_env_names(env)?;
        let c = &mut self.config;
        if let Some(v) = lookup(env, "STRATA_STORE") {
            c.kind = v
                .parse()
                .map_err(|e: ConfigError| bad_env("STRATA_STORE", v, &e))?;
        }
        if let Some(v) = lookup(env, "STRATA_CODEC") {
            c.codec = v
                .parse()
                .map_err(|e: ConfigError| bad_env("STRATA_CODEC", v, &e))?;
        }
        if let Some(v) = env_bool(env, "STRATA_FILE_DIRECT")? {
            c.direct = v;
        }
        if let Some(v) = env_bool(env, "STRATA_FILE_GROW")? {
            c.grow = v;
        }
        if let Some(v) = lookup(env, "STRATA_REMOTE_TOKEN") {
            c.token = Some(v.to_string());
        }
        if let Some(v) = env_number(env, "STRATA_REMOTE_TIMEOUT")? {
            c.timeout_secs = v;
        }
        Ok(self)
    }
    /// Validates.
    pub fn build(self) -> Result<StoreConfig, ConfigError> {
        let c = self.config;
        if matches!(c.kind, StoreKind::Remote { .. }) && c.token.is_none() {
            return Err(ConfigError::Missing(
                "the memory node token (STRATA_REMOTE_TOKEN)",
            ));
        }
        if c.timeout_secs == 0 {
            return Err(ConfigError::BadEnv {
                name: "STRATA_REMOTE_TIMEOUT".into(),
                value: "0".into(),
                reason: "a zero timeout fails every request; use at least 1 second".into(),
            });
        }
        // A deadline is `now + timeout`; past a day it stops meaning anything (and near
        // u64::MAX seconds it overflows `Instant`).
        if c.timeout_secs > MAX_REMOTE_TIMEOUT_SECS {
            return Err(ConfigError::BadEnv {
                name: "STRATA_REMOTE_TIMEOUT".into(),
                value: c.timeout_secs.to_string(),
                reason: format!("use at most {MAX_REMOTE_TIMEOUT_SECS} seconds (one day)"),
            });
        }
        Ok(c)
    }
}

fn bad_env(name: &str, value: &str, error: &ConfigError) -> ConfigError {
    ConfigError::BadEnv {
        name: name.into(),
        value: value.into(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> EnvVars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn space_defaults_and_env() {
        let c = SpaceConfig::builder().build().unwrap();
        assert_eq!(c.page_size, PageSize::KIB64);
        let c = SpaceConfig::builder()
            .with_env_vars(&env(&[
                ("STRATA_PAGE_SIZE", "4KiB"),
                ("STRATA_CACHE_SIZE", "1MiB"),
            ]))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(
            (c.page_size.bytes(), c.cache_bytes, c.frames()),
            (4096, 1 << 20, 256)
        );
        // Explicit setters after with_env win.
        let c = SpaceConfig::builder()
            .with_env_vars(&env(&[("STRATA_PAGE_SIZE", "4KiB")]))
            .unwrap()
            .page_size(2 << 20)
            .cache_bytes(5 << 20)
            .build()
            .unwrap();
        assert_eq!((c.page_size, c.cache_bytes), (PageSize::MIB2, 4 << 20));
    }

    #[test]
    fn space_validation_errors() {
        let e = SpaceConfig::builder().page_size(3000).build().unwrap_err();
        assert_eq!(e, ConfigError::Geometry(GeometryError::BadPageSize(3000)));
        assert!(
            e.to_string()
                .contains("page size 3000 is not a power of two between 4 KiB and 2 MiB")
        );
        let e = SpaceConfig::builder()
            .page_size(2 << 20)
            .cache_bytes(3 << 20)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::TooSmall { what: "cache", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("make it at least 4 MiB"), "{e}");
    }

    #[test]
    fn pager_validation_errors() {
        let ok = PagerConfig::builder()
            .page_bytes(12 << 10)
            .buffer_bytes(1 << 20)
            .build()
            .unwrap();
        assert_eq!(ok.buffer_bytes, (1 << 20) / (12 << 10) * (12 << 10));
        for bad in [0, 4095, 6000, 4 << 20] {
            assert_eq!(
                PagerConfig::builder().page_bytes(bad).build().unwrap_err(),
                ConfigError::PagerPageSize(bad)
            );
        }
        let e = PagerConfig::builder()
            .page_bytes(4096)
            .buffer_bytes(12288)
            .build()
            .unwrap_err();
        assert!(matches!(
            e,
            ConfigError::TooSmall {
                what: "buffer",
                min: 4,
                ..
            }
        ));
        let e = PagerConfig::builder().fillers(0).build().unwrap_err();
        assert_eq!(
            e,
            ConfigError::ThreadCount {
                what: "fillers",
                value: 0,
                max: 1024
            }
        );
        let e = PagerConfig::builder().evictors(5000).build().unwrap_err();
        assert!(matches!(
            e,
            ConfigError::ThreadCount {
                what: "evictors",
                ..
            }
        ));
        let e = PagerConfig::builder()
            .fault_spin_us(MAX_FAULT_SPIN_US + 1)
            .build()
            .unwrap_err();
        assert_eq!(e, ConfigError::FaultSpin(MAX_FAULT_SPIN_US + 1));
        assert!(e.to_string().contains("use 0"), "{e}");
        let env: EnvVars = vec![("STRATA_FAULT_SPIN_US".into(), "0".into())];
        let c = PagerConfig::builder()
            .fault_spin_us(7)
            .with_env_vars(&env)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(c.fault_spin_us, 0, "the variable overrides the builder");
        for (low, high) in [(90, 70), (50, 50), (10, 101)] {
            assert_eq!(
                PagerConfig::builder()
                    .water_marks(low, high)
                    .build()
                    .unwrap_err(),
                ConfigError::WaterMarks { low, high }
            );
        }
        assert_eq!(
            PagerConfig::builder().read_ahead(5000).build().unwrap_err(),
            ConfigError::ReadAhead(5000)
        );
        assert_eq!(
            PagerConfig::builder()
                .read_back(MAX_READ_BACK + 1)
                .build()
                .unwrap_err(),
            ConfigError::ReadBack(MAX_READ_BACK + 1)
        );
    }

    #[test]
    fn pager_env_overrides_and_bad_values() {
        let c = PagerConfig::builder()
            .with_env_vars(&env(&[
                ("STRATA_PAGE_SIZE", "8KiB"),
                ("STRATA_BUFFER_SIZE", "64MiB"),
                ("STRATA_FILLERS", "3"),
                ("STRATA_EVICTORS", "2"),
                ("STRATA_READ_AHEAD", "8"),
                ("STRATA_READ_BACK", "7"),
                ("STRATA_EVICT_LOW_WATER", "50"),
                ("STRATA_EVICT_HIGH_WATER", "80"),
            ]))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(
            (
                c.page_bytes,
                c.buffer_bytes,
                c.fillers,
                c.evictors,
                c.read_ahead
            ),
            (8192, 64 << 20, 3, 2, 8)
        );
        assert_eq!((c.low_water_percent, c.high_water_percent), (50, 80));
        assert_eq!(c.read_back, 7);

        let e = PagerConfig::builder()
            .with_env_vars(&env(&[("STRATA_FILLERS", "four")]))
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::BadEnv { name, .. } if name == "STRATA_FILLERS"),
            "{e}"
        );
        let e = PagerConfig::builder()
            .with_env_vars(&env(&[("STRATA_EVICT_LOW_WATER", "300")]))
            .unwrap_err();
        assert!(e.to_string().contains("too large for this setting"), "{e}");
        let e = PagerConfig::builder()
            .with_env_vars(&env(&[("STRATA_BUFFER_SIZE", "8 furlongs")]))
            .unwrap_err();
        assert!(e.to_string().contains("STRATA_BUFFER_SIZE"), "{e}");
        let e = PagerConfig::builder()
            .with_env_vars(&env(&[("STRATA_PAGESIZE", "4096")]))
            .unwrap_err();
        assert!(
            e.to_string().contains("did you mean STRATA_PAGE_SIZE"),
            "{e}"
        );
        let e = PagerConfig::builder()
            .with_env_vars(&env(&[("STRATA_ZZZZZZZZZZZZ", "1")]))
            .unwrap_err();
        assert!(
            e.to_string().contains("known names are STRATA_PAGE_SIZE"),
            "{e}"
        );
    }

    #[test]
    fn store_specs() {
        assert_eq!("memory".parse::<StoreKind>(), Ok(StoreKind::Memory));
        assert_eq!(
            "file:/tmp/x".parse::<StoreKind>(),
            Ok(StoreKind::File {
                path: "/tmp/x".into()
            })
        );
        assert_eq!(
            "remote:127.0.0.1:7000,node2:7001".parse::<StoreKind>(),
            Ok(StoreKind::Remote {
                nodes: vec!["127.0.0.1:7000".into(), "node2:7001".into()]
            })
        );
        for bad in [
            "",
            "file:",
            "disk:/x",
            "remote:host",
            "remote:host:99999",
            "Memory",
        ] {
            assert_eq!(
                bad.parse::<StoreKind>(),
                Err(ConfigError::StoreSpec(bad.into())),
                "{bad}"
            );
        }
        assert_eq!("lz4".parse::<CodecKind>(), Ok(CodecKind::Lz4));
        assert_eq!(
            "zfp:1e-3".parse::<CodecKind>(),
            Ok(CodecKind::Zfp { tolerance: 1e-3 })
        );
        for bad in ["zfp", "zfp:0", "zfp:-1", "zfp:nan", "gzip"] {
            assert!(bad.parse::<CodecKind>().is_err(), "{bad}");
        }
        let c = StoreConfig::builder()
            .with_env_vars(&env(&[
                ("STRATA_STORE", "remote:127.0.0.1:9000"),
                ("STRATA_REMOTE_TOKEN", "s3cret"),
                ("STRATA_CODEC", "lz4"),
            ]))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(c.codec, CodecKind::Lz4);
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        let e = StoreConfig::builder()
            .kind(StoreKind::Remote {
                nodes: vec!["a:1".into()],
            })
            .build()
            .unwrap_err();
        assert!(matches!(e, ConfigError::Missing(_)));
        let e = StoreConfig::builder()
            .with_env_vars(&env(&[("STRATA_FILE_DIRECT", "maybe")]))
            .unwrap_err();
        assert!(e.to_string().contains("write true or false"));
        let e = StoreConfig::builder()
            .timeout_secs(u64::MAX)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("at most 86400"), "{e}");
        let e = StoreConfig::builder().timeout_secs(0).build().unwrap_err();
        assert!(e.to_string().contains("at least 1 second"));
    }

    #[test]
    fn a_lossy_codec_for_a_whole_program_needs_the_users_word() {
        let zfp = CodecKind::Zfp { tolerance: 1e-6 };
        let e = check_run_codec(zfp, None).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("lossy") && m.contains("--lossy-floats") && m.contains("lz4"),
            "{m}"
        );
        assert!(check_run_codec(zfp, Some("floats")).is_ok());
        assert!(check_run_codec(zfp, Some(" floats ")).is_ok());
        let e = check_run_codec(zfp, Some("yes")).unwrap_err();
        assert!(e.to_string().contains("STRATA_RUN_LOSSY"), "{e}");
        // The bad value is refused whatever the codec, so a typo never goes unnoticed.
        assert!(check_run_codec(CodecKind::Lz4, Some("1")).is_err());
        for codec in [CodecKind::None, CodecKind::Lz4] {
            assert!(check_run_codec(codec, None).is_ok());
            assert!(check_run_codec(codec, Some("floats")).is_ok());
        }
    }
}
