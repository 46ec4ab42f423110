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
/// at up to about 4x the budget and for sequential sweeps (a 16 KiB page takes 2x as long
/// on `sort` at 3x before streams were followed downwards, 1.2x after; 2.6x on `stress-ng`
/// sequential). Far beyond the budget smaller pages win: see [`page_for`].
pub const DEFAULT_PAGE: u64 = 64 << 10;
/// Page size chosen instead of [`DEFAULT_PAGE`] when the first large request is more than
/// [`DEEP_OVERSUBSCRIPTION`] times the budget (and no page size is given), for a store in
/// this process or on a local disk. Far beyond the budget most faults are random (a sort
/// comparing lines all over its buffer) and each moves a whole page, while streams keep
/// their speed through read-ahead windows. Measured on `sort` at 6x the budget (16 MiB of
/// lines in 8 MiB, stream read-ahead both ways), interleaved runs: lz4 memory store 4 KiB
/// 9.7-11.3 s (1.6 GB read), 16 KiB 17.6-23.3 s (5.5 GB), 64 KiB 41.7 s (22.5 GB), all about
/// 340 k faults; file store 4 KiB 19.3 s, 16 KiB 25.3 s.
pub const DEEP_PAGE: u64 = 4 << 10;
/// [`DEEP_PAGE`] for memory nodes across a network: each page is a request whose round trip
/// outweighs its bytes, so fewer, larger pages win: `sort` at 6x over a node reached by TCP
/// (loopback, before nodes on this host used shared memory) took 60 s with 16 KiB pages and
/// 99 s with 4 KiB (single runs). A node on this host, over shared memory, gets
/// [`DEEP_PAGE`]: 143 s at 4 KiB against 195 s at 16 KiB (single runs, load 2-4).
pub const DEEP_PAGE_REMOTE: u64 = 16 << 10;

/// Whether `store` reaches a memory node on another host (any node whose address is not a
/// loopback one): pages then cross a network, where [`DEEP_PAGE_REMOTE`] pays.
pub fn across_a_network(store: &StoreKind) -> bool {
    let StoreKind::Remote { nodes } = store else {
        return false;
    };
    nodes.iter().any(|node| {
        let host = node.rsplit_once(':').map_or(node.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        !(host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()))
    })
}
/// See [`DEEP_PAGE`]: at 3x (`sort` of 32 MiB in 32 MiB: 64 KiB 2.98 s, 16 KiB 3.47 s) and
/// 4x (`stress-ng` sequential sweeps) the default page is as fast or faster.
pub const DEEP_OVERSUBSCRIPTION: u64 = 4;
/// Page size between [`MIDDLE_OVERSUBSCRIPTION`] and [`DEEP_OVERSUBSCRIPTION`] times the
/// budget (stores on this host): where the random part of the working set only just fits, a
/// 64 KiB page carries too much that is not needed. Measured (results, session 13), `sort -S
/// 96MiB` of 32 MiB (3.5x) at a 27.06 MiB budget in a 32 MiB group, warm input, 3 runs each:
/// memory node 64 KiB 4.5-4.9 s, 32 KiB 3.5-3.7 s, 16 KiB 4.2-4.3 s, 128 KiB 5.4-5.8 s;
/// file store (26.81 MiB) 64 KiB 7.0-7.6 s, 32 KiB 5.7-6.7 s. At 3x (a 32 MiB budget)
/// 64 KiB stays better: 2.69-2.83 s against 3.17-3.25 s.
pub const MIDDLE_PAGE: u64 = 32 << 10;
/// See [`MIDDLE_PAGE`].
pub const MIDDLE_OVERSUBSCRIPTION: u64 = 3;

/// The arena's page size: `configured` when the user gave one (`page_size_given`), else
/// [`DEEP_PAGE`] ([`DEEP_PAGE_REMOTE`] over memory nodes on other hosts) when the first large request (a
/// program's main buffer, usually: `sort -S`, an array, a mapping) is more than
/// [`DEEP_OVERSUBSCRIPTION`] times the budget, [`MIDDLE_PAGE`] when it is more than
/// [`MIDDLE_OVERSUBSCRIPTION`] times (not across a network, where it was not measured), else
/// `configured` (the default).
pub fn page_for(
    page_size_given: bool,
    configured: u64,
    budget: u64,
    first_request: u64,
    remote: bool,
) -> u64 {
    let deep = if remote { DEEP_PAGE_REMOTE } else { DEEP_PAGE };
    if page_size_given || configured <= deep {
        return configured;
    }
    if first_request > budget.saturating_mul(DEEP_OVERSUBSCRIPTION) {
        deep
    } else if !remote
        && configured > MIDDLE_PAGE
        && first_request > budget.saturating_mul(MIDDLE_OVERSUBSCRIPTION)
    {
        MIDDLE_PAGE
    } else {
        configured
    }
}

/// Default water marks of the arena (evict when the free frames run out, down to `LOW` % of
/// the budget; evictors always make room for one read-ahead window, and read-ahead threads
/// evict for the windows after it): the whole budget is the program's working set, and a
/// frame kept free is a page the program could have held. Measured (`results/RESULTS.md`,
/// session 10): `sort` of 32 MiB at a 24.8 MiB budget (64 KiB pages, `O_DIRECT` file store)
/// 25-30 s at 90/98 (which kept 8-40 frames, up to 2.5 MiB, free), 11.2-11.6 s at 99/100,
/// 12.9-13.1 s at 98/99; NumPy and `stress-ng` unchanged (1.83 / 1.88 s, 0.23 / 0.25 s).
/// Earlier, 90/98 gave 18-22 % fewer faults than the pager's 70/90 on `sort` at 6x.
pub const DEFAULT_WATER_MARKS: (u8, u8) = (99, 100);
/// Default read-ahead window of the arena, in pages, for faults that continue a sequential
/// stream (a fault right at the end of a recent fill; random faults do not read ahead).
/// Measured (`results/RESULTS.md`): `stress-ng` incdec at 4x the budget, 64 KiB pages, 0 / 8
/// / 16 pages: lz4 memory store 0.93 / 0.69 / 0.83 s, file store 1.69 / 1.48 / 1.57 s,
/// memory node 3.25 / 1.98 / 2.10 s (single runs, before the other stream changes).
/// While most faults are random the pager halves it by itself and queues no window ahead
/// (`strata-pager` `streams.rs`): a fixed 4 made `sort` faster (its slow merge streams took
/// frames from its line text) and NumPy slower (session 15, `results/RESULTS.md`).
pub const DEFAULT_READ_AHEAD: u64 = 8;
/// Whether the arena installs pages written during their last stay writable on a read fault
/// (saving the write-protect fault of programs that read, then write each page).
pub const PREDICT_WRITES: bool = true;
/// Whether the arena installs every page writable and finds written pages by digest at
/// eviction ([`strata_pager::WriteTracking::Digest`]) instead of trapping first writes.
/// Measured (`results/RESULTS.md`, session 14): `sort` of 32 MiB in a 32 MiB memory group,
/// medians of 3, trapping / by digest: memory node 3.83 / 3.54 s, file 6.57 / 5.67 s, LZ4 on
/// a node 5.21 / 4.57 s; NumPy over a file 1.87 / 1.71 s, the rest unchanged.
/// `STRATA_SKIP_UNCHANGED=false` turns the digests off, and with them this (writes trap).
pub const WRITES_BY_DIGEST: bool = true;
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
    /// Room kept free in the process's memory cgroup, in bytes (`STRATA_RUN_KEEP_ROOM`: a
    /// size, `on` for [`crate::group_room::DEFAULT_HEADROOM`], `off`); None: not kept.
    pub keep_room: Option<u64>,
    /// Virtual size of the arena: `STRATA_RUN_ARENA`, else the default ([`default_arena`]).
    pub arena_bytes: u64,
    /// Whether `STRATA_RUN_ARENA` gave the arena's size: over memory nodes, the whole arena
    /// is then borrowed at once; else the store grows with the arena
    /// ([`crate::node_backing`]).
    pub arena_given: bool,
    /// Descriptor to append a JSON report line to at exit (set by `strata run`).
    pub report_fd: Option<i32>,
    /// File to append a JSON report line to at exit (for standalone use).
    pub stats_path: Option<PathBuf>,
    /// Whether the page size was given (`STRATA_PAGE_SIZE`, `--page-size`); if not, the
    /// runtime chooses it from the first large request ([`page_for`]).
    pub page_size_given: bool,
    /// Install pages written during their last stay writable on a read fault
    /// ([`strata_pager::RegionBuilder::predict_writes`]); on, see [`PREDICT_WRITES`].
    pub predict_writes: bool,
    /// Find written pages by digest rather than by trapping writes; on, see
    /// [`WRITES_BY_DIGEST`].
    pub writes_by_digest: bool,
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
        .unwrap_or_else(|| {
            default_threshold(size_var("STRATA_PAGE_SIZE").ok().flatten().unwrap_or(0))
        })
}

/// The threshold when none is given: [`DEFAULT_THRESHOLD`], or the page size when a larger
/// one is chosen (`--page-size 2MiB`), since every arena block takes whole pages.
pub fn default_threshold(page_bytes: u64) -> u64 {
    DEFAULT_THRESHOLD.max(page_bytes)
}

/// The arena's virtual size when none is given: [`DEFAULT_ARENA`], or half the address space
/// an `RLIMIT_AS` (`ulimit -v`) leaves, so that the program keeps the other half for its own
/// mappings; refused when that half cannot hold the budget.
pub fn default_arena(address_space_left: Option<u64>, budget: u64) -> Result<u64, OptionsError> {
    let Some(left) = address_space_left else {
        return Ok(DEFAULT_ARENA);
    };
    let arena = DEFAULT_ARENA.min(left / 2);
    if arena < budget {
        return Err(OptionsError::Bad(format!(
            "the address-space limit (ulimit -v) leaves {} of address space, and the arena needs at least the memory budget ({}) in half of it; raise the limit or lower the budget",
            strata_core::format_size(left),
            strata_core::format_size(budget)
        )));
    }
    Ok(arena)
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
        strata_core::config::check_run_codec(
            store.codec,
            std::env::var("STRATA_RUN_LOSSY").ok().as_deref(),
        )?;
        let threshold = size_var("STRATA_RUN_THRESHOLD")?
            .unwrap_or_else(|| default_threshold(pager.page_bytes));
        if threshold < pager.page_bytes {
            return Err(OptionsError::Bad(format!(
                "STRATA_RUN_THRESHOLD ({threshold} bytes) is below the page size ({} bytes): every arena block takes whole pages; use a threshold of at least one page",
                pager.page_bytes
            )));
        }
        let arena_var = size_var("STRATA_RUN_ARENA")?;
        let arena_given = arena_var.is_some();
        let arena_bytes = match arena_var {
            Some(given) => {
                if given < pager.buffer_bytes {
                    return Err(OptionsError::Bad(format!(
                        "STRATA_RUN_ARENA ({given} bytes) is smaller than the memory budget ({} bytes); give the arena at least the budget",
                        pager.buffer_bytes
                    )));
                }
                given
            }
            None => default_arena(crate::sys::address_space_left(), pager.buffer_bytes)?,
        };
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
        let keep_room = keep_room(std::env::var("STRATA_RUN_KEEP_ROOM").ok().as_deref())?;
        Ok(Self {
            pager,
            store,
            threshold,
            keep_room,
            arena_bytes,
            arena_given,
            report_fd,
            stats_path: std::env::var_os("STRATA_RUN_STATS").map(PathBuf::from),
            predict_writes: PREDICT_WRITES,
            writes_by_digest: WRITES_BY_DIGEST,
            page_size_given: std::env::var_os("STRATA_PAGE_SIZE").is_some(),
        })
    }
}

/// The room to keep in the memory cgroup from `STRATA_RUN_KEEP_ROOM` (unset: the default).
pub fn keep_room(value: Option<&str>) -> Result<Option<u64>, OptionsError> {
    let default = crate::group_room::DEFAULT_HEADROOM;
    let Some(v) = value.map(str::trim) else {
        return Ok(Some(default));
    };
    match v {
        "on" | "true" | "1" | "" => Ok(Some(default)),
        "off" | "false" | "0" => Ok(None),
        _ => match parse_size(v) {
            Ok(bytes) => Ok((bytes > 0).then_some(bytes)),
            Err(_) => Err(OptionsError::Bad(format!(
                "STRATA_RUN_KEEP_ROOM={v:?} is neither a size (e.g. 2MiB), on nor off; write one of those"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_room_is_on_by_default_and_takes_sizes_and_off() {
        let d = crate::group_room::DEFAULT_HEADROOM;
        assert_eq!(keep_room(None).unwrap(), Some(d));
        assert_eq!(keep_room(Some("on")).unwrap(), Some(d));
        assert_eq!(keep_room(Some("off")).unwrap(), None);
        assert_eq!(keep_room(Some("0")).unwrap(), None);
        assert_eq!(keep_room(Some("3MiB")).unwrap(), Some(3 << 20));
        let e = keep_room(Some("lots")).unwrap_err().to_string();
        assert!(
            e.contains("STRATA_RUN_KEEP_ROOM") && e.contains("off"),
            "{e}"
        );
    }

    #[test]
    fn only_nodes_on_other_hosts_count_as_across_a_network() {
        let remote = |nodes: &[&str]| StoreKind::Remote {
            nodes: nodes.iter().map(ToString::to_string).collect(),
        };
        assert!(!across_a_network(&StoreKind::Memory));
        assert!(!across_a_network(&remote(&["127.0.0.1:7400"])));
        assert!(!across_a_network(&remote(&[
            "127.0.0.2:7400",
            "[::1]:7400"
        ])));
        assert!(!across_a_network(&remote(&["localhost:7400"])));
        assert!(across_a_network(&remote(&["10.0.0.5:7400"])));
        assert!(across_a_network(&remote(&["127.0.0.1:7400", "node1:7400"])));
    }

    #[test]
    fn the_default_arena_fits_an_address_space_limit() {
        let (mib, gib) = (1u64 << 20, 1u64 << 30);
        assert_eq!(default_arena(None, 8 * mib).unwrap(), DEFAULT_ARENA);
        assert_eq!(
            default_arena(Some(1 << 50), 8 * mib).unwrap(),
            DEFAULT_ARENA
        );
        assert_eq!(default_arena(Some(6 * gib), 8 * mib).unwrap(), 3 * gib);
        let e = default_arena(Some(12 * mib), 8 * mib)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ulimit -v") && e.contains("budget"), "{e}");
    }

    #[test]
    fn the_page_shrinks_only_far_beyond_the_budget_and_never_when_given() {
        let mib = 1u64 << 20;
        // sort -S of 6x the budget: deep thrashing ahead.
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 8 * mib, 48 * mib, false),
            DEEP_PAGE
        );
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 32 * mib, 192 * mib, false),
            DEEP_PAGE
        );
        // Over a memory node, per-request latency favours larger pages.
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 8 * mib, 48 * mib, true),
            DEEP_PAGE_REMOTE
        );
        // Exactly 3x keeps the default; beyond it, up to 4x, the middle page (on this
        // host), and the default across a network.
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 32 * mib, 96 * mib, false),
            DEFAULT_PAGE
        );
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 27 * mib, 96 * mib, false),
            MIDDLE_PAGE
        );
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 32 * mib, 128 * mib, false),
            MIDDLE_PAGE
        );
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 32 * mib, 128 * mib, true),
            DEFAULT_PAGE
        );
        // A configured page at or below the middle one is kept.
        assert_eq!(
            page_for(false, 16 << 10, 27 * mib, 96 * mib, false),
            16 << 10
        );
        assert_eq!(
            page_for(false, DEFAULT_PAGE, 32 * mib, 128 * mib + 1, false),
            DEEP_PAGE
        );
        // A page the user gave is kept, however far beyond the budget.
        assert_eq!(
            page_for(true, DEFAULT_PAGE, 8 * mib, 480 * mib, false),
            DEFAULT_PAGE
        );
        assert_eq!(
            page_for(true, 256 << 10, 8 * mib, 480 * mib, true),
            256 << 10
        );
        // Never larger than configured, and no overflow.
        assert_eq!(page_for(false, 8192, 8 * mib, 480 * mib, true), 8192);
        assert_eq!(
            page_for(false, DEFAULT_PAGE, u64::MAX, u64::MAX, false),
            DEFAULT_PAGE
        );
    }
}
