//! A space's statistics as the device keeps them.

use strata_core::stats::{HISTOGRAM_BUCKETS, HistogramSnapshot, StatsSnapshot, Tier, TierBytes};

use crate::layout::{FAULT_HIST_BUCKETS, fault_hist_bucket_range};

/// Fault service times as the device counts them: four buckets per power of two from 256 ns
/// ([`crate::layout::fault_hist_bucket_range`] gives each bucket's range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultHistogram(pub [u64; FAULT_HIST_BUCKETS]);

impl Default for FaultHistogram {
    fn default() -> Self {
        FaultHistogram([0; FAULT_HIST_BUCKETS])
    }
}

impl serde::Serialize for FaultHistogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl FaultHistogram {
    /// Faults counted.
    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The fault time below which a fraction `q` (0..=1) of faults fell, in ns: the upper edge
    /// of the bucket where that fraction is reached (so within a quarter octave above the true
    /// value). `None` without faults.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(fault_hist_bucket_range(b).1);
            }
        }
        Some(fault_hist_bucket_range(FAULT_HIST_BUCKETS - 1).1)
    }

    /// Median fault time, ns (0 without faults).
    pub fn p50_ns(&self) -> u64 {
        self.quantile_ns(0.5).unwrap_or(0)
    }

    /// 99th percentile fault time, ns (0 without faults).
    pub fn p99_ns(&self) -> u64 {
        self.quantile_ns(0.99).unwrap_or(0)
    }
}

/// A space's device statistics (`Default`: every counter zero, no peer tier).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Element reads served in place from the host copy ([`crate::space::RemoteAccess`]).
    pub remote_reads: u64,
    /// Element writes made in place in the host copy.
    pub remote_writes: u64,
    /// Times a page in a GPU frame became dirty, since the space was made (never reset): a
    /// host that finds it unchanged since a moment when no page was dirty knows none is.
    pub pages_dirtied: u64,
    /// Sub-page fetch ([`crate::SpaceOptions::sector_bytes`]): loads of missing sectors into
    /// pages already in a frame (a page's first sectors come with its fault, in `faults`).
    pub sector_fills: u64,
    /// Fault service times (p50/p99 through [`FaultHistogram::p50_ns`] and `p99_ns`).
    pub fault_hist: FaultHistogram,
    /// The peer tier's figures, for a space that borrows neighbour GPUs' memory.
    pub peer: Option<PeerStats>,
}

/// A space's peer tier (memory borrowed from neighbour GPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Slot uses refused because their chunk was not (or no longer) lent: faults that loaded
    /// from the host copy and evictions that kept no peer copy (leased chunks only).
    pub refused: u64,
    /// Reclaims this space answered (`Space::revoke_peer_chunks` calls that gave chunks back).
    pub reclaims: u64,
    /// Chunks those reclaims gave back.
    pub reclaimed_chunks: u64,
}

impl GpuStats {
    /// Mean fault service time in ns.
    pub fn mean_fault_ns(&self) -> u64 {
        self.fault_ns_total.checked_div(self.faults).unwrap_or(0)
    }

    /// As the workspace's common statistics snapshot (fault times regrouped into its log2
    /// buckets).
    pub fn to_snapshot(&self) -> StatsSnapshot {
        let mut buckets = [0u64; HISTOGRAM_BUCKETS];
        for (b, &n) in self.fault_hist.0.iter().enumerate() {
            let lo = fault_hist_bucket_range(b).0;
            let log = (63 - lo.leading_zeros()) as usize;
            buckets[log.min(HISTOGRAM_BUCKETS - 1)] += n;
        }
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
