//! A space's statistics as the device keeps them.

use strata_core::stats::{HISTOGRAM_BUCKETS, HistogramSnapshot, StatsSnapshot, Tier, TierBytes};

/// A space's device statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuStats {
    /// Accesses that found the page resident, pinned or optimistic (one per group of lanes
    /// on one page, not per element).
    pub hits: u64,
    /// Faults served.
    pub faults: u64,
    /// Evictions.
    pub evictions: u64,
    /// Write-backs.
    pub writebacks: u64,
    /// Pages brought in by prefetch.
    pub prefetched: u64,
    /// Bytes host -> GPU.
    pub bytes_in: u64,
    /// Bytes GPU -> host.
    pub bytes_out: u64,
    /// Sum of fault service times, ns.
    pub fault_ns_total: u64,
    /// Longest fault, ns.
    pub fault_ns_max: u64,
    /// Sweeps that found every frame pinned.
    pub no_frame_retries: u64,
    /// Frames in the protected segment now.
    pub protected_frames: u32,
    /// Optimistic (pin-free) reads whose page moved while they read; each fell back to a
    /// pinned read.
    pub optimistic_retries: u64,
    /// Page reads served from the host copy by read-through (no frame taken).
    pub read_through: u64,
    /// Faults of a space over a store served from the host cache with no request to the host.
    pub host_cache_loads: u64,
    /// Dirty pages the background write-back warps wrote down (also counted in
    /// `writebacks`); the rest were written by faults that found their victim dirty.
    pub background_writebacks: u64,
    /// The peer tier's figures, for a space that borrows neighbour GPUs' memory.
    pub peer: Option<PeerStats>,
}

/// A space's peer tier (memory borrowed from neighbour GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PeerStats {
    /// Page slots the borrowed memory holds.
    pub slots: u64,
    /// Bytes borrowed.
    pub borrowed_bytes: u64,
    /// Faults served from a peer slot (over NVLink rather than from the host).
    pub loads: u64,
    /// Evicted pages copied to a peer slot.
    pub stores: u64,
    /// Peer copies rewritten while a fault loaded them (that fault loaded from the host).
    pub stale: u64,
}

impl GpuStats {
    /// Mean fault service time in ns.
    pub fn mean_fault_ns(&self) -> u64 {
        self.fault_ns_total.checked_div(self.faults).unwrap_or(0)
    }

    /// As the workspace's common statistics snapshot (fault times as a one-bucket histogram at
    /// the mean, since the device keeps only sum and max).
    pub fn to_snapshot(&self) -> StatsSnapshot {
        let mut buckets = [0u64; HISTOGRAM_BUCKETS];
        let mean = self.mean_fault_ns();
        let b = (64 - mean.leading_zeros()).saturating_sub(1) as usize;
        buckets[b.min(HISTOGRAM_BUCKETS - 1)] = self.faults;
        StatsSnapshot {
            faults: self.faults,
            hits: self.hits,
            evictions: self.evictions,
            writebacks: self.writebacks,
            prefetched_pages: self.prefetched,
            errors: 0,
            tiers: vec![TierBytes {
                tier: Tier::Host,
                bytes_read: self.bytes_in,
                bytes_written: self.bytes_out,
            }],
            service_time: HistogramSnapshot::from_buckets(
                buckets,
                self.fault_ns_total,
                self.fault_ns_max,
            ),
        }
    }
}
