//! A space's options and its geometry ([`SpacePlan`]), validated without a GPU.

use super::SpaceError;
use crate::layout::{DeviceCounters, NO_PAGE};

fn fmt(bytes: u64) -> String {
    strata_core::units::format_size(bytes)
}

/// Element types a space may be declared with (4 or 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ElementType {
    /// `int`.
    I32,
    /// `unsigned`.
    U32,
    /// `long long`.
    I64,
    /// `unsigned long long`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl ElementType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            ElementType::I32 | ElementType::U32 | ElementType::F32 => 4,
            _ => 8,
        }
    }
}

/// Eviction policy of a space's page cache.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum EvictionPolicy {
    /// Clock with reference bits (second chance).
    Clock,
    /// Clock plus a protected segment: a page enters it only when referenced again after the
    /// clock hand passed it (or when it faults again after an earlier stay), and leaves it
    /// after 16 epochs (of as many faults as the cache has frames) without a reference. A loop
    /// larger than the cache keeps the protected part resident instead of thrashing it all.
    /// Probationary pages are evicted only once half the probationary segment's turnover (in
    /// faults) has passed since their last second chance, unless a whole sweep finds none so
    /// old; so leave the probationary part (1 - fraction) a few frames per concurrently
    /// faulting warp, or pages two warps need one after the other are loaded twice.
    ScanResistant {
        /// Fraction of frames the protected segment may hold (0 to 0.95).
        protected_fraction: f64,
    },
}

/// Background write-back of a space: while a kernel launched with the space's handle runs
/// (through [`crate::driver::Function::launch`] or `launch_on`, from Rust, C or Python),
/// Strata runs `warps` warps of its own beside it, on a high-priority stream, that write dirty
/// pages down the tier chain just ahead of the clock hand, so the fault that takes their frame
/// only loads. They keep between `low_water` and `high_water` (fractions of the frames) ahead of
/// the hand clean, skip frames the policy will pass over (referenced, protected) and pinned
/// ones, and stop when the kernel ends (a stop queued after it on its stream) or after `idle`
/// without a fault. Kernels launched by other means (nvcc code given the handle) get no
/// write-back warps: their faults write their victims as before.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BackgroundWriteBack {
    /// Write-back warps (1 to 256).
    pub warps: u32,
    /// Fraction of the frames ahead of the clock hand to keep clean (0 < high <= 0.5).
    pub high_water: f64,
    /// Cleaning starts again once fewer than this fraction are clean (0 <= low <= high).
    pub low_water: f64,
    /// The warps also stop after this long without a fault in the space.
    pub idle: std::time::Duration,
}

impl Default for BackgroundWriteBack {
    fn default() -> Self {
        BackgroundWriteBack {
            warps: 16,
            high_water: 0.125,
            low_water: 0.0625,
            idle: std::time::Duration::from_millis(20),
        }
    }
}

impl BackgroundWriteBack {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), SpaceError> {
        if !(1..=256).contains(&self.warps) {
            return Err(SpaceError::Invalid(format!(
                "{} background write-back warps: give 1 to 256 (16 is the default)",
                self.warps
            )));
        }
        if !(self.high_water > 0.0 && self.high_water <= 0.5) {
            return Err(SpaceError::Invalid(format!(
                "write-back high water mark {} is outside (0, 0.5]: give a fraction of the cache such as 0.125",
                self.high_water
            )));
        }
        if !(self.low_water >= 0.0 && self.low_water <= self.high_water) {
            return Err(SpaceError::Invalid(format!(
                "write-back low water mark {} is outside [0, high water mark {}]: give a smaller fraction such as half the high mark",
                self.low_water, self.high_water
            )));
        }
        if self.idle.is_zero() || self.idle > std::time::Duration::from_secs(10) {
            return Err(SpaceError::Invalid(format!(
                "write-back idle time {:?} is outside (0, 10 s]: give a few milliseconds",
                self.idle
            )));
        }
        Ok(())
    }
}

/// `STRATA_GPU_WRITE_BACK`: `off`, `on` (the defaults of [`BackgroundWriteBack`]) or a number
/// of warps; `None` if unset.
///
/// # Errors
/// Any other value, or a `STRATA_*` variable that is not UTF-8.
pub fn write_back_from_env() -> Result<Option<Option<BackgroundWriteBack>>, SpaceError> {
    let env = strata_core::config::process_env().map_err(|e| SpaceError::Invalid(e.to_string()))?;
    let Some((_, v)) = env.iter().find(|(k, _)| k == "STRATA_GPU_WRITE_BACK") else {
        return Ok(None);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "false" | "no" => Ok(Some(None)),
        "on" | "true" | "yes" => Ok(Some(Some(BackgroundWriteBack::default()))),
        n => {
            let warps: u32 = n.parse().map_err(|_| {
                SpaceError::Invalid(format!(
                    "STRATA_GPU_WRITE_BACK={v:?}: give off, on, or a number of write-back warps"
                ))
            })?;
            let wb = BackgroundWriteBack {
                warps,
                ..BackgroundWriteBack::default()
            };
            wb.validate()?;
            Ok(Some(Some(wb)))
        }
    }
}

/// What element accesses (`strata::Array` reads and writes) do on a page that is not in a GPU
/// frame. A fault moves a whole page in (and a dirty one out) for one element; over a space
/// many times its cache, where a page is touched a few times before it is evicted, that costs
/// far more than reading or writing the element in place over the bus as zero-copy does. With
/// remote access on, the element is read or written in place in the host copy until the page
/// has earned a frame: while the cache has free frames, on its second access (filling a frame
/// evicts nothing); then once its access count reaches the threshold, where counts halve as
/// the accesses served in place pile up (once per `pages * threshold / 4` of them), so only a
/// page at least about twice as hot as the average page not resident migrates, and uniform
/// random access leaves the resident set alone instead of churning it. Counts live in the
/// page's word while it is not resident and cost nothing on hits; reads count one access in
/// four. Page reads through `acquire_page(.., remote_ok = true)` go in place the same way
/// (the graph and embedding kernels ask for it); other page access and atomics always
/// migrate. A space over a store, whose host cache holds only some pages, always migrates; a
/// space with a peer tier reads in place but migrates on writes (a write in place would leave
/// a stale copy in a peer slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum RemoteAccess {
    /// Every miss migrates its page into a frame (the behaviour before remote access).
    Off,
    /// The default: [`RemoteAccess::default_migrate_after`] for the space's page size, on
    /// spaces backed by a full host copy; off over a store.
    #[default]
    Auto,
    /// Migrate a page once its (decaying) access count reaches `n` (2 to 65535); explicit, so
    /// a space over a store refuses it.
    MigrateAfter(u32),
    /// Reads as [`RemoteAccess::Auto`]; every write migrates its page. For data whose GPU
    /// writes must land in GPU frames (unified allocations find them there). Off over a store.
    ReadsOnly,
}

impl RemoteAccess {
    /// The threshold [`RemoteAccess::Auto`] uses for pages of `page_size` bytes:
    /// [`AUTO_MIGRATE_AFTER_PER_4K`] per 4 KiB (a migration moves the whole page over the bus,
    /// so its cost grows with the page), at most 65535. Chosen on an H100 with `strata bench
    /// gpu-micro --remote-access N` over 4 KiB and 64 KiB pages at 2x and 8x the cache
    /// (uniform and Zipf gathers, random in-place updates): the threshold with the best worst
    /// case and geometric mean against zero-copy (`crates/strata-gpu/results/issue12/`).
    pub fn default_migrate_after(page_size: u64) -> u32 {
        let units = (page_size / 4096).max(1);
        u32::try_from((units * AUTO_MIGRATE_AFTER_PER_4K).min(u64::from(u16::MAX)))
            .unwrap_or(u32::MAX)
    }

    /// The `migrate_after` the space handle carries (0: off), for a space backed by a full
    /// host copy (`host_copy`) or over a store.
    pub fn resolve(self, page_size: u64, host_copy: bool) -> Result<u32, SpaceError> {
        match self {
            RemoteAccess::Off => Ok(0),
            RemoteAccess::Auto | RemoteAccess::ReadsOnly if !host_copy => Ok(0),
            RemoteAccess::Auto => Ok(RemoteAccess::default_migrate_after(page_size)),
            RemoteAccess::ReadsOnly => {
                Ok(RemoteAccess::default_migrate_after(page_size)
                    | crate::layout::MIGRATE_READS_ONLY)
            }
            RemoteAccess::MigrateAfter(n) => {
                if !(2..=u32::from(u16::MAX)).contains(&n) {
                    return Err(SpaceError::Invalid(format!(
                        "remote access migrating after {n} accesses: give 2 to 65535, or RemoteAccess::Off to migrate on every miss"
                    )));
                }
                if !host_copy {
                    return Err(SpaceError::Invalid(
                        "remote access reads and writes a full host copy in place, which a space over a store does not have: use RemoteAccess::Auto or Off there".into(),
                    ));
                }
                Ok(n)
            }
        }
    }
}

/// [`RemoteAccess::Auto`]'s accesses per 4 KiB of page before a page migrates.
pub const AUTO_MIGRATE_AFTER_PER_4K: u64 = 256;

/// `STRATA_GPU_REMOTE_ACCESS`: `off`, `auto`, or a number of accesses after which a page
/// migrates; `None` if unset.
///
/// # Errors
/// Any other value, or a `STRATA_*` variable that is not UTF-8.
pub fn remote_access_from_env() -> Result<Option<RemoteAccess>, SpaceError> {
    let env = strata_core::config::process_env().map_err(|e| SpaceError::Invalid(e.to_string()))?;
    let Some((_, v)) = env.iter().find(|(k, _)| k == "STRATA_GPU_REMOTE_ACCESS") else {
        return Ok(None);
    };
    parse_remote_access(v).map(Some)
}

/// Parses `off`, `auto` or a number of accesses (as `STRATA_GPU_REMOTE_ACCESS` and the CLI's
/// `--remote-access` take them).
///
/// # Errors
/// Anything else, or a number outside 2..=65535.
pub fn parse_remote_access(v: &str) -> Result<RemoteAccess, SpaceError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "false" | "no" => Ok(RemoteAccess::Off),
        "auto" | "on" | "true" | "yes" => Ok(RemoteAccess::Auto),
        n => {
            let n: u32 = n.parse().map_err(|_| {
                SpaceError::Invalid(format!(
                    "remote access {v:?}: give off, auto, or the accesses after which a page migrates (2 to 65535)"
                ))
            })?;
            let r = RemoteAccess::MigrateAfter(n);
            r.resolve(4096, true)?;
            Ok(r)
        }
    }
}

/// Memory a space borrows from a neighbour GPU for its peer tier: a victim cache between the
/// GPU cache and the pinned host copy. Pages evicted from the cache are also copied into
/// borrowed slots (round robin over the borrowed memory, chunk by chunk across lenders), and
/// a fault on a page that has a slot copies it over NVLink instead of PCIe. A slot copy is
/// always clean (the host copy is written at the same eviction), so giving memory back never
/// needs a write. Access is granted per allocation (CUDA VMM, `cuMemSetAccess`), not for all
/// of the lender's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PeerBorrow {
    /// The lending GPU's ordinal (not the space's own GPU).
    pub gpu: usize,
    /// Bytes to borrow (rounded down to whole 2 MiB chunks, at least one).
    pub bytes: u64,
}

/// Granularity of borrowed peer memory.
pub const PEER_CHUNK_BYTES: u64 = 2 << 20;

/// Options of a new space.
#[derive(Debug, Clone)]
pub struct SpaceOptions {
    /// Page size in bytes (power of two, 4 KiB to 2 MiB).
    pub page_size: u64,
    /// GPU memory for the page cache, in bytes (rounded down to whole pages, at least 2).
    pub cache_bytes: u64,
    /// Element type (for the typed host calls).
    pub element: ElementType,
    /// Eviction policy.
    pub policy: EvictionPolicy,
    /// Read-through: a page read (`acquire_page` without write) that misses on a page with no
    /// history is served from the pinned host copy without taking a frame, and only a page
    /// referenced again migrates (`evict` forgets the history of its range). For read-only
    /// data read about once per kernel; kernels must not write pages they read this way.
    pub read_through: bool,
    /// Spaces over a store ([`Strata::space_over_store`]): bytes of pinned host memory for the
    /// host cache between the GPU cache and the store (whole pages, at least 2). `None`: a
    /// quarter of the host's available memory, at most the space's size. Spaces backed by a
    /// full pinned host copy ([`Strata::space`]) ignore it.
    pub host_cache_bytes: Option<u64>,
    /// Background write-back (`None`: off; faults write their dirty victims themselves).
    /// The default is [`BackgroundWriteBack::default`], or what `STRATA_GPU_WRITE_BACK` says.
    pub background_write_back: Option<BackgroundWriteBack>,
    /// Neighbour GPUs' memory to borrow for the peer tier (empty: none). Spaces backed by a
    /// full pinned host copy only; a space over a store refuses it.
    pub peers: Vec<PeerBorrow>,
    /// What element accesses do on a page not in a frame: in place over the bus until the page
    /// has earned a frame, or migrate at once. The default is [`RemoteAccess::Auto`], or what
    /// `STRATA_GPU_REMOTE_ACCESS` says.
    pub remote_access: RemoteAccess,
    /// Sub-page fetch: element accesses (`strata.cuh`'s `Array`) that migrate a missing page
    /// load only the sectors of this size that their warp touches, and load further sectors of
    /// a page already in a frame as accesses need them. For sparse misses over large pages
    /// where accesses cannot go over the bus in place: with [`RemoteAccess::Off`], writes
    /// under [`RemoteAccess::ReadsOnly`], and atomics. Where remote access is on, a page
    /// migrates because it has proved hot, so it comes whole (a page kept in part costs every
    /// hit a look at its sector word). Whole-page access (`acquire_page`, `view_page`, the
    /// prefetcher) always gets whole pages.
    ///
    /// A power of two of at least 512 bytes. A page has at most 32 sectors, so a smaller
    /// sector is raised to a 32nd of the page; a page that would hold fewer than 2 is loaded
    /// whole ([`SpaceOptions::sector_for`] says what a page size gets). Spaces backed by a full
    /// host copy without a peer tier only. `None` (the default; [`SpaceOptions::with_env`]
    /// applies `STRATA_GPU_SECTOR`): whole pages.
    pub sector_bytes: Option<u64>,
}

impl Default for SpaceOptions {
    fn default() -> Self {
        SpaceOptions {
            page_size: 64 << 10,
            cache_bytes: 1 << 30,
            element: ElementType::U64,
            policy: EvictionPolicy::Clock,
            read_through: false,
            host_cache_bytes: None,
            background_write_back: default_write_back(),
            peers: Vec::new(),
            remote_access: remote_access_from_env().ok().flatten().unwrap_or_default(),
            sector_bytes: None,
        }
    }
}

/// The background write-back new options start with: `STRATA_GPU_WRITE_BACK` if set and
/// valid (an invalid value is reported by [`SpaceOptions::with_env`] and ignored here), else
/// on with the defaults.
pub fn default_write_back() -> Option<BackgroundWriteBack> {
    match write_back_from_env() {
        Ok(Some(wb)) => wb,
        _ => Some(BackgroundWriteBack::default()),
    }
}

/// The geometry of a space, validated without touching a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpacePlan {
    /// Page size.
    pub page: strata_core::geometry::PageSize,
    /// Pages in the space.
    pub pages: u64,
    /// Frames in the cache (never more than the pages, at least 2).
    pub frames: u64,
    /// Most frames the protected segment may hold.
    pub protected_quota: u32,
    /// Sub-page fetch is on (a sector word per frame).
    pub sectors: bool,
}

impl SpacePlan {
    /// Validates `options` for a space of `size_bytes`.
    pub fn new(size_bytes: u64, options: &SpaceOptions) -> Result<Self, SpaceError> {
        let page = strata_core::geometry::PageSize::new(options.page_size)
            .map_err(|e| SpaceError::Invalid(e.to_string()))?;
        let ps = page.bytes();
        if size_bytes == 0 {
            return Err(SpaceError::Invalid(
                "a space needs at least one byte: give a positive size".into(),
            ));
        }
        if !size_bytes.is_multiple_of(options.element.size()) {
            return Err(SpaceError::Invalid(format!(
                "size {size_bytes} is not a whole number of {}-byte elements",
                options.element.size()
            )));
        }
        if let Some(wb) = &options.background_write_back {
            wb.validate()?;
        }
        options.remote_access.resolve(options.page_size, true)?;
        if let Some(sector) = options.sector_bytes {
            check_sector(sector, !options.peers.is_empty())?;
        }
        for p in &options.peers {
            if p.bytes < PEER_CHUNK_BYTES {
                return Err(SpaceError::Invalid(format!(
                    "borrowing {} from GPU {} is less than one {} chunk: borrow at least {}",
                    fmt(p.bytes),
                    p.gpu,
                    fmt(PEER_CHUNK_BYTES),
                    fmt(PEER_CHUNK_BYTES)
                )));
            }
            if p.bytes < options.page_size {
                return Err(SpaceError::Invalid(format!(
                    "borrowing {} from GPU {} holds no page of {}: borrow more or use smaller pages",
                    fmt(p.bytes),
                    p.gpu,
                    fmt(options.page_size)
                )));
            }
        }
        let pages = size_bytes.div_ceil(ps);
        if pages >= u64::from(NO_PAGE) {
            return Err(SpaceError::Invalid(format!(
                "{pages} pages is more than a space can index (2^32 - 1): use larger pages"
            )));
        }
        let frames = (options.cache_bytes / ps).min(pages.max(2));
        if frames < 2 {
            return Err(SpaceError::Invalid(format!(
                "a cache of {} holds fewer than 2 pages of {}: ask for at least {}",
                fmt(options.cache_bytes),
                fmt(ps),
                fmt(2 * ps)
            )));
        }
        let protected_quota = match options.policy {
            EvictionPolicy::Clock => 0,
            EvictionPolicy::ScanResistant { protected_fraction } => {
                if !(0.0..=0.95).contains(&protected_fraction) {
                    return Err(SpaceError::Invalid(format!(
                        "protected fraction {protected_fraction} is outside 0..=0.95: give a fraction of the cache such as 0.5"
                    )));
                }
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss
                )]
                let q = (frames as f64 * protected_fraction) as u32;
                q
            }
        };
        Ok(SpacePlan {
            page,
            pages,
            frames,
            protected_quota,
            sectors: options.sector_for(ps).is_some(),
        })
    }

    /// Bytes of GPU memory the space takes: frames, and the rest (page table, frame table,
    /// counters, the scratch page failed accesses get).
    pub fn gpu_bytes(&self) -> (u64, u64) {
        let frame_bytes = self.frames * self.page.bytes();
        let table_bytes = self.pages * 8
            + self.frames * if self.sectors { 16 } else { 8 }
            + std::mem::size_of::<DeviceCounters>() as u64
            + self.page.bytes();
        (frame_bytes, table_bytes)
    }

    /// Checks that the space fits in `free` bytes of GPU memory with 256 MiB to spare for
    /// kernels, modules and other users of the GPU.
    pub fn check_fits(&self, free: u64) -> Result<(), SpaceError> {
        let (frame_bytes, table_bytes) = self.gpu_bytes();
        if frame_bytes + table_bytes + (256 << 20) > free {
            return Err(SpaceError::CacheTooLarge {
                cache: fmt(frame_bytes),
                tables: fmt(table_bytes),
                free: fmt(free),
            });
        }
        Ok(())
    }
}

impl SpaceOptions {
    /// The sector a page of `page_bytes` is fetched in ([`SpaceOptions::sector_bytes`] raised
    /// to a 32nd of the page), or `None` when it is loaded whole (sub-page fetch off, or fewer
    /// than 2 sectors would fit).
    pub fn sector_for(&self, page_bytes: u64) -> Option<u64> {
        let sector = self.sector_bytes?.max(page_bytes / MAX_SECTORS_PER_PAGE);
        (sector * 2 <= page_bytes).then_some(sector)
    }

    /// Applies `STRATA_PAGE_SIZE` and `STRATA_CACHE_SIZE` from the environment (through the
    /// workspace's validated configuration).
    pub fn with_env(mut self) -> Result<Self, SpaceError> {
        let cfg = strata_core::config::SpaceConfig::builder()
            .page_size(self.page_size)
            .cache_bytes(self.cache_bytes)
            .with_env()
            .and_then(strata_core::config::SpaceConfigBuilder::build)
            .map_err(|e| SpaceError::Invalid(e.to_string()))?;
        self.page_size = cfg.page_size.bytes();
        self.cache_bytes = cfg.cache_bytes;
        if let Some(on) = read_through_from_env()? {
            self.read_through = on;
        }
        if let Some(wb) = write_back_from_env()? {
            self.background_write_back = wb;
        }
        if let Some(r) = remote_access_from_env()? {
            self.remote_access = r;
        }
        if let Some(sector) = sector_from_env()? {
            self.sector_bytes = sector;
        }
        Ok(self)
    }
}

/// Smallest sector of sub-page fetch: below it the per-sector bookkeeping costs more than
/// the bytes it saves (a PCIe read request moves at least 128 bytes, and a warp copies 512
/// bytes in one 16-byte load per lane).
pub const MIN_SECTOR_BYTES: u64 = 512;

/// Most sectors a page may have (one bit each in a frame's 32-bit sector mask).
pub const MAX_SECTORS_PER_PAGE: u64 = 32;

/// Checks a sub-page fetch sector size.
fn check_sector(sector: u64, peers: bool) -> Result<(), SpaceError> {
    if !sector.is_power_of_two() || sector < MIN_SECTOR_BYTES {
        return Err(SpaceError::Invalid(format!(
            "a sector of {}: give a power of two of at least {}, or turn sub-page fetch off (None, `off`) for whole pages",
            fmt(sector),
            fmt(MIN_SECTOR_BYTES)
        )));
    }
    if peers {
        return Err(SpaceError::Invalid(
            "sub-page fetch and a peer tier together are not supported (peer slots hold whole pages): leave SpaceOptions::sector_bytes None or SpaceOptions::peers empty".into(),
        ));
    }
    Ok(())
}

/// `STRATA_GPU_SECTOR` if set: `off` (whole pages, `Some(None)`) or a sector size such as
/// `4KiB` (`Some(Some(bytes))`); checked against the page size when a space is made.
///
/// # Errors
/// A value that is neither `off` nor a size, or a `STRATA_*` variable that is not UTF-8.
pub fn sector_from_env() -> Result<Option<Option<u64>>, SpaceError> {
    let env = strata_core::config::process_env().map_err(|e| SpaceError::Invalid(e.to_string()))?;
    let Some((_, v)) = env.iter().find(|(k, _)| k == "STRATA_GPU_SECTOR") else {
        return Ok(None);
    };
    parse_sector(v)
        .map(Some)
        .map_err(|e| SpaceError::Invalid(format!("STRATA_GPU_SECTOR: {e}")))
}

/// Parses a sector setting: `off`/`none` or a size (`4KiB`, `4096`).
pub fn parse_sector(v: &str) -> Result<Option<u64>, SpaceError> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("off") || t.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    strata_core::units::parse_size(t).map(Some).map_err(|e| {
        SpaceError::Invalid(format!(
            "sector {v:?}: {e}; give `off` or a sector size such as 4KiB"
        ))
    })
}

/// `STRATA_GPU_READ_THROUGH` (true/false) if set: whether new spaces read first touches
/// through from the host copy ([`SpaceOptions::read_through`]).
///
/// # Errors
/// The variable is set to something other than a boolean, or a `STRATA_*` variable is not
/// UTF-8.
pub fn read_through_from_env() -> Result<Option<bool>, SpaceError> {
    strata_core::config::process_env()
        .and_then(|env| strata_core::config::env_bool(&env, "STRATA_GPU_READ_THROUGH"))
        .map_err(|e| SpaceError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::GpuStats;

    fn o(page: u64, cache: u64, policy: EvictionPolicy) -> SpaceOptions {
        SpaceOptions {
            page_size: page,
            cache_bytes: cache,
            element: ElementType::F64,
            policy,
            read_through: false,
            host_cache_bytes: None,
            background_write_back: Some(BackgroundWriteBack::default()),
            peers: Vec::new(),
            remote_access: RemoteAccess::Auto,
            sector_bytes: None,
        }
    }

    #[test]
    fn plan_validates_sizes_and_policies() {
        let p = SpacePlan::new(10 << 20, &o(64 << 10, 1 << 20, EvictionPolicy::Clock)).unwrap();
        assert_eq!((p.pages, p.frames, p.protected_quota), (160, 16, 0));
        // The cache never exceeds the space.
        let p = SpacePlan::new(1 << 20, &o(4096, 1 << 30, EvictionPolicy::Clock)).unwrap();
        assert_eq!(p.frames, 256);
        // A partial last page still counts.
        let p = SpacePlan::new(4096 + 8, &o(4096, 1 << 20, EvictionPolicy::Clock)).unwrap();
        assert_eq!(p.pages, 2);
        let sr = EvictionPolicy::ScanResistant {
            protected_fraction: 0.5,
        };
        assert_eq!(
            SpacePlan::new(1 << 30, &o(1 << 20, 64 << 20, sr))
                .unwrap()
                .protected_quota,
            32
        );
        for (size, opts) in [
            (0, o(4096, 1 << 20, EvictionPolicy::Clock)),
            (12, o(4096, 1 << 20, EvictionPolicy::Clock)),
            (1 << 20, o(3000, 1 << 20, EvictionPolicy::Clock)),
            (1 << 20, o(4096, 4096, EvictionPolicy::Clock)),
            (
                1 << 20,
                o(
                    4096,
                    1 << 20,
                    EvictionPolicy::ScanResistant {
                        protected_fraction: 1.5,
                    },
                ),
            ),
            (1 << 50, o(4096, 1 << 20, EvictionPolicy::Clock)),
        ] {
            let e = SpacePlan::new(size, &opts).unwrap_err();
            assert!(matches!(e, SpaceError::Invalid(_)), "{size} {opts:?}: {e}");
        }
    }

    #[test]
    fn write_back_options_are_checked() {
        let ok = BackgroundWriteBack::default();
        assert!(ok.validate().is_ok());
        let bad = [
            BackgroundWriteBack { warps: 0, ..ok },
            BackgroundWriteBack { warps: 257, ..ok },
            BackgroundWriteBack {
                high_water: 0.0,
                ..ok
            },
            BackgroundWriteBack {
                high_water: 0.75,
                ..ok
            },
            BackgroundWriteBack {
                high_water: f64::NAN,
                ..ok
            },
            BackgroundWriteBack {
                low_water: 0.2,
                ..ok
            },
            BackgroundWriteBack {
                low_water: -0.1,
                ..ok
            },
            BackgroundWriteBack {
                idle: std::time::Duration::ZERO,
                ..ok
            },
        ];
        for wb in bad {
            let e = wb.validate().unwrap_err();
            assert!(matches!(e, SpaceError::Invalid(_)), "{wb:?}: {e}");
            let mut opts = o(4096, 1 << 20, EvictionPolicy::Clock);
            opts.background_write_back = Some(wb);
            assert!(SpacePlan::new(1 << 20, &opts).is_err(), "{wb:?} accepted");
        }
    }

    #[test]
    fn remote_access_resolves_and_refuses_bad_thresholds() {
        assert_eq!(RemoteAccess::Off.resolve(4096, true).unwrap(), 0);
        assert_eq!(
            RemoteAccess::Auto.resolve(4096, true).unwrap(),
            RemoteAccess::default_migrate_after(4096)
        );
        // Bigger pages need more accesses before a migration pays; capped at 16 bits.
        assert!(
            RemoteAccess::default_migrate_after(64 << 10)
                > RemoteAccess::default_migrate_after(4096)
        );
        assert!(RemoteAccess::default_migrate_after(2 << 20) <= 65535);
        // Auto is off over a store; an explicit threshold there is refused with the way out.
        assert_eq!(RemoteAccess::Auto.resolve(4096, false).unwrap(), 0);
        // Reads only: Auto's threshold with the flag the device reads; off over a store too.
        let r = RemoteAccess::ReadsOnly.resolve(64 << 10, true).unwrap();
        assert_eq!(
            r & crate::layout::MIGRATE_READS_ONLY,
            crate::layout::MIGRATE_READS_ONLY
        );
        assert_eq!(r & 0xFFFF, RemoteAccess::default_migrate_after(64 << 10));
        assert_eq!(RemoteAccess::ReadsOnly.resolve(4096, false).unwrap(), 0);
        let e = RemoteAccess::MigrateAfter(4)
            .resolve(4096, false)
            .unwrap_err();
        assert!(e.to_string().contains("Auto or Off"), "{e}");
        for bad in [0, 1, 65536, u32::MAX] {
            let e = RemoteAccess::MigrateAfter(bad)
                .resolve(4096, true)
                .unwrap_err();
            assert!(e.to_string().contains("2 to 65535"), "{bad}: {e}");
            let mut opts = o(4096, 1 << 20, EvictionPolicy::Clock);
            opts.remote_access = RemoteAccess::MigrateAfter(bad);
            assert!(SpacePlan::new(1 << 20, &opts).is_err());
        }
        assert_eq!(
            RemoteAccess::MigrateAfter(2).resolve(4096, true).unwrap(),
            2
        );
        assert_eq!(parse_remote_access(" Off ").unwrap(), RemoteAccess::Off);
        assert_eq!(parse_remote_access("auto").unwrap(), RemoteAccess::Auto);
        assert_eq!(
            parse_remote_access("16").unwrap(),
            RemoteAccess::MigrateAfter(16)
        );
        for bad in ["1", "70000", "sometimes", "-3", ""] {
            assert!(parse_remote_access(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plan_checks_free_gpu_memory() {
        let p = SpacePlan::new(8 << 30, &o(64 << 10, 1 << 30, EvictionPolicy::Clock)).unwrap();
        let (frames, tables) = p.gpu_bytes();
        assert_eq!(frames, 1 << 30);
        assert!(p.check_fits(frames + tables + (256 << 20)).is_ok());
        let e = p.check_fits(frames).unwrap_err();
        assert!(e.to_string().contains("smaller cache"), "{e}");
    }

    #[test]
    fn stats_convert_to_the_common_snapshot() {
        let st = GpuStats {
            hits: 30,
            faults: 10,
            evictions: 4,
            writebacks: 2,
            prefetched: 1,
            bytes_in: 40960,
            bytes_out: 8192,
            fault_ns_total: 10_000,
            fault_ns_max: 3_000,
            fault_hist: {
                let mut h = crate::space::FaultHistogram::default();
                // 9 faults near 600 ns, one near 3 us.
                h.0[crate::layout::fault_hist_bucket(600)] = 9;
                h.0[crate::layout::fault_hist_bucket(3_000)] = 1;
                h
            },
            ..GpuStats::default()
        };
        assert_eq!(st.mean_fault_ns(), 1000);
        // p50 is the upper edge of 600 ns's bucket; p99 that of 3 us's.
        assert_eq!(st.fault_hist.p50_ns(), 640);
        assert_eq!(st.fault_hist.p99_ns(), 3072);
        assert_eq!(
            crate::space::FaultHistogram::default().quantile_ns(0.5),
            None
        );
        let snap = st.to_snapshot();
        assert_eq!(snap.faults, 10);
        assert_eq!(snap.service_time.count, 10);
        assert_eq!(snap.hit_rate(), Some(0.75));
        assert_eq!(snap.tiers[0].bytes_read, 40960);
    }

    #[test]
    fn sector_sizes_are_checked_and_fitted_to_the_page() {
        let with = |sector: Option<u64>, page: u64| SpaceOptions {
            sector_bytes: sector,
            ..o(page, 64 * page, EvictionPolicy::Clock)
        };
        // Refused: not a power of two, or below 512 bytes; the message says what to give.
        for bad in [0u64, 1, 256, 511, 3000, 4097, 96 << 10] {
            let err = SpacePlan::new(1 << 24, &with(Some(bad), 64 << 10)).unwrap_err();
            assert!(err.to_string().contains("power of two"), "{bad}: {err}");
        }
        // A peer tier holds whole pages: refused together.
        let mut peered = with(Some(4 << 10), 64 << 10);
        peered.peers = vec![PeerBorrow {
            gpu: 1,
            bytes: PEER_CHUNK_BYTES,
        }];
        let err = SpacePlan::new(1 << 24, &peered).unwrap_err();
        assert!(err.to_string().contains("peer tier"), "{err}");
        // Raised to a 32nd of the page; whole pages where fewer than 2 fit.
        let cases = [
            (512u64, 64u64 << 10, Some(2u64 << 10)),
            (4 << 10, 64 << 10, Some(4 << 10)),
            (32 << 10, 64 << 10, Some(32 << 10)),
            (64 << 10, 64 << 10, None),
            (512, 4 << 10, Some(512)),
            (4 << 10, 4 << 10, None),
            (4 << 10, 2 << 20, Some(64 << 10)),
        ];
        for (sector, page, want) in cases {
            let opts = with(Some(sector), page);
            assert_eq!(opts.sector_for(page), want, "sector {sector}, page {page}");
            let plan = SpacePlan::new(1 << 24, &opts).unwrap();
            assert_eq!(plan.sectors, want.is_some());
            // A sector word per frame in the tables when on.
            let (_, with_words) = plan.gpu_bytes();
            let (_, without) = SpacePlan::new(1 << 24, &with(None, page))
                .unwrap()
                .gpu_bytes();
            assert_eq!(
                with_words - without,
                if want.is_some() { plan.frames * 8 } else { 0 }
            );
        }
        assert_eq!(with(None, 64 << 10).sector_for(64 << 10), None);
    }

    #[test]
    fn sector_settings_parse() {
        assert_eq!(parse_sector("off").unwrap(), None);
        assert_eq!(parse_sector(" None ").unwrap(), None);
        assert_eq!(parse_sector("4KiB").unwrap(), Some(4096));
        assert_eq!(parse_sector("512").unwrap(), Some(512));
        let err = parse_sector("small").unwrap_err().to_string();
        assert!(err.contains("small") && err.contains("4KiB"), "{err}");
    }
}
