//! Options of a unified allocation and the hints (advice) that can be given on its ranges.

use strata_gpu::{ElementType, EvictionPolicy, SpaceOptions, SpacePlan};

use crate::cpu_tracker::DirtyTracking;
use crate::error::UnifiedError;

/// Where a range should live, or who accesses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Host memory, the CPU.
    Cpu,
    /// The GPU's page cache, kernels.
    Gpu,
}

/// Advice on a byte range (a superset of `cudaMemAdvise` and GMEM's `hmadvise`; prefetch and
/// discard are calls of their own). Advice applies to every page the range touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `true`: kernels only read the range. Its GPU copies are replicas, never written back;
    /// a kernel write to it is an error ([`UnifiedError::ReadMostlyWritten`]). CPU writes are
    /// allowed (the replicas are dropped at the next sync).
    ReadMostly(bool),
    /// Where the pages should sit between phases: `Some(Gpu)` loads the CPU's new pages into
    /// the GPU cache at each sync to the GPU (instead of at the first kernel access);
    /// `Some(Cpu)` frees the range's GPU frames at each sync to the CPU (keeping the cache
    /// for other data); `None` clears the advice (pages move on demand).
    PreferredLocation(Option<Location>),
    /// `cudaMemAdviseSetAccessedBy`: keep the range mapped for that processor. Both always
    /// reach every page here (the CPU through its pointer, kernels through the page table),
    /// so this is accepted for code written against CUDA and recorded, and changes nothing.
    AccessedBy(Location),
}

/// Options of a new unified allocation.
#[derive(Debug, Clone)]
pub struct UnifiedOptions {
    /// Page size in bytes: the unit of coherence (dirty tracking, hand-off) and of GPU paging.
    /// A power of two from 4 KiB to 2 MiB; default 64 KiB.
    pub page_size: u64,
    /// GPU memory for the allocation's page cache in bytes (at least two pages; clamped to the
    /// allocation). Data beyond the cache is paged by the GPU on demand. Default 1 GiB.
    pub cache_bytes: u64,
    /// How CPU writes are found at a sync.
    pub dirty_tracking: DirtyTracking,
    /// Eviction policy of the GPU cache.
    pub policy: EvictionPolicy,
    /// Kernels read pages that are not in the GPU cache in place over the bus until a page
    /// has been read often enough to earn a frame (writes always bring their page in). Pays
    /// off where a page is touched a few times before it would be evicted (pointer chasing,
    /// sparse gathers, data larger than the cache); `false` brings every missed page in.
    /// Default `true`.
    pub reads_in_place: bool,
    /// With [`DirtyTracking::WriteProtect`], while at least half the allocation's pages are
    /// advised read-mostly: CPU writes are recorded as they happen by a handler thread
    /// (notified write protection, [`crate::write_log`]), so a sync after CPU phases that
    /// wrote nothing costs microseconds instead of a page-table walk of the whole allocation
    /// (about 0.3 ms per GiB). The first write to each page then costs a round trip through
    /// that thread (measured 12-30 us on a loaded 2-core machine) instead of about 1 us per
    /// 4 KiB, so data the CPU keeps writing keeps the asynchronous mode. Needs the privilege
    /// to open a full userfaultfd (root, CAP_SYS_PTRACE or `vm.unprivileged_userfaultfd=1`);
    /// where refused, the asynchronous mode stays. Default `true`, or `false` when the
    /// environment variable `STRATA_UNIFIED_NOTIFIED_WRITES` is `0` (to compare both modes
    /// without rebuilding).
    pub notified_writes: bool,
}

impl Default for UnifiedOptions {
    fn default() -> Self {
        UnifiedOptions {
            page_size: 64 << 10,
            cache_bytes: 1 << 30,
            dirty_tracking: DirtyTracking::Hash,
            policy: EvictionPolicy::Clock,
            reads_in_place: true,
            notified_writes: std::env::var_os("STRATA_UNIFIED_NOTIFIED_WRITES")
                .is_none_or(|v| v != "0"),
        }
    }
}

/// Bytes of host memory available now (`MemAvailable` of /proc/meminfo), if known.
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl UnifiedOptions {
    /// Checks the options for an allocation of `size` bytes (no GPU needed) and returns the
    /// space options the allocation will use.
    pub fn validate(&self, size: u64) -> Result<SpaceOptions, UnifiedError> {
        // Host memory first: for a huge size it is the error that says what to do.
        if let Some(rounded) = size.checked_next_multiple_of(self.page_size.max(1))
            && let Some(available) = host_available()
            && rounded > available
        {
            return Err(UnifiedError::BeyondHostMemory { size, available });
        }
        self.validate_geometry(size)
    }

    /// [`UnifiedOptions::validate`] without the host-memory check, for allocations over a
    /// store ([`crate::UnifiedOverStore`]), whose data need not fit in host memory.
    pub fn validate_geometry(&self, size: u64) -> Result<SpaceOptions, UnifiedError> {
        if size == 0 {
            return Err(UnifiedError::Invalid(
                "a unified allocation needs at least one byte: ask for size > 0".into(),
            ));
        }
        if !self.page_size.is_power_of_two() || !(4096..=2 << 20).contains(&self.page_size) {
            return Err(UnifiedError::Invalid(format!(
                "page size {} is not a power of two from 4 KiB to 2 MiB: use e.g. 65536",
                self.page_size
            )));
        }
        let rounded = size
            .checked_next_multiple_of(self.page_size)
            .ok_or_else(|| {
                UnifiedError::Invalid(format!("{size} bytes is too large to address"))
            })?;
        if self.cache_bytes < 2 * self.page_size {
            return Err(UnifiedError::Invalid(format!(
                "a GPU cache of {} bytes holds fewer than 2 pages of {}: ask for at least {} bytes",
                self.cache_bytes,
                self.page_size,
                2 * self.page_size
            )));
        }
        let space = SpaceOptions {
            page_size: self.page_size,
            cache_bytes: self.cache_bytes.min(rounded.max(2 * self.page_size)),
            element: ElementType::U64,
            policy: self.policy,
            read_through: false,
            host_cache_bytes: None,
            // Background write-back cleans frames ahead of eviction; when the cache holds the
            // whole allocation nothing is ever evicted, and it would only copy every page a
            // kernel dirties down over PCIe during the kernel (again after each later write).
            background_write_back: if self.cache_bytes >= rounded {
                None
            } else {
                strata_gpu::space::default_write_back()
            },
            peers: Vec::new(),
            // Reads of pages not resident go in place over the bus (a pointer chase by one
            // thread reads a hop instead of copying a whole page with one lane). Writes always
            // migrate: a write in place would land in the host copy behind the CPU-write
            // tracker's hashes (the page would look written by the CPU, and by the GPU too if
            // it later migrated and was dirtied in the same kernel: a false conflict).
            remote_access: if self.reads_in_place {
                strata_gpu::space::RemoteAccess::ReadsOnly
            } else {
                strata_gpu::space::RemoteAccess::Off
            },
            // Whole pages: the coherence code moves, compares and drops whole pages.
            sector_bytes: None,
        };
        SpacePlan::new(rounded, &space)?;
        Ok(space)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_place_is_the_default_and_writes_always_migrate() {
        use strata_gpu::space::RemoteAccess;
        let on = UnifiedOptions::default().validate(1 << 20).unwrap();
        assert_eq!(on.remote_access, RemoteAccess::ReadsOnly);
        let off = UnifiedOptions {
            reads_in_place: false,
            ..UnifiedOptions::default()
        };
        assert_eq!(
            off.validate(1 << 20).unwrap().remote_access,
            RemoteAccess::Off
        );
    }

    #[test]
    fn good_options_pass_and_bad_ones_say_what_to_do() {
        let o = UnifiedOptions::default();
        let s = o.validate(12345).unwrap();
        assert_eq!(s.page_size, 64 << 10);
        assert!(
            s.background_write_back.is_none(),
            "a cache holding everything needs no write-back"
        );
        let small = UnifiedOptions {
            cache_bytes: 1 << 20,
            ..UnifiedOptions::default()
        };
        assert_eq!(
            small.validate(64 << 20).unwrap().background_write_back,
            strata_gpu::space::default_write_back()
        );
        assert_eq!(
            s.cache_bytes,
            64 << 10 << 1,
            "cache clamped to the allocation (2 pages)"
        );
        let msg = |r: Result<SpaceOptions, UnifiedError>| r.unwrap_err().to_string();
        assert!(msg(o.validate(0)).contains("size > 0"));
        for bad in [0, 1000, 3 << 12, 4 << 20, 2048] {
            let o = UnifiedOptions {
                page_size: bad,
                ..UnifiedOptions::default()
            };
            assert!(
                msg(o.validate(1 << 20)).contains("power of two"),
                "page size {bad}"
            );
        }
        let o = UnifiedOptions {
            cache_bytes: 4096,
            ..UnifiedOptions::default()
        };
        assert!(msg(o.validate(1 << 20)).contains("fewer than 2 pages"));
        let huge = msg(UnifiedOptions::default().validate(u64::MAX - 5));
        assert!(huge.contains("too large"), "{huge}");
        let beyond = msg(UnifiedOptions::default().validate(1 << 60));
        assert!(beyond.contains("larger than host memory"), "{beyond}");
        assert!(beyond.contains("UnifiedOverStore"), "{beyond}");
        // Over a store a size beyond host memory passes the geometry checks (the store holds
        // the data); 1 TiB in 64 KiB pages.
        assert!(matches!(
            UnifiedOptions::default().validate(1 << 40),
            Err(UnifiedError::BeyondHostMemory { .. })
        ));
        let geometry = UnifiedOptions::default()
            .validate_geometry(1 << 40)
            .unwrap();
        assert_eq!(geometry.page_size, 64 << 10);
        assert!(msg(UnifiedOptions::default().validate_geometry(0)).contains("size > 0"));
        let sr = UnifiedOptions {
            policy: EvictionPolicy::ScanResistant {
                protected_fraction: 2.0,
            },
            ..UnifiedOptions::default()
        };
        assert!(msg(sr.validate(1 << 20)).contains("protected fraction"));
    }
}
