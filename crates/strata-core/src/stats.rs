//! Statistics: lock-free counters that pagers and GPU tiers bump on their hot paths, and a
//! plain snapshot type that prints as a table and serialises to JSON.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::units::format_size;

/// The tiers bytes move between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Local GPU memory (HBM).
    Gpu,
    /// A neighbour GPU's memory.
    PeerGpu,
    /// Host DRAM.
    Host,
    /// A remote memory node.
    Remote,
    /// A file.
    File,
}

impl Tier {
    /// Every tier, in hierarchy order.
    pub const ALL: [Tier; 5] = [
        Tier::Gpu,
        Tier::PeerGpu,
        Tier::Host,
        Tier::Remote,
        Tier::File,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Gpu => "gpu",
            Tier::PeerGpu => "peer-gpu",
            Tier::Host => "host",
            Tier::Remote => "remote",
            Tier::File => "file",
        })
    }
}

/// Number of histogram buckets: bucket `i` counts samples in `[2^i, 2^(i+1))` nanoseconds
/// (bucket 0 also holds 0 ns), so 40 buckets reach about 18 minutes.
pub const HISTOGRAM_BUCKETS: usize = 40;

/// A log2 histogram of durations, updated with relaxed atomics.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one sample.
    pub fn record(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.record_ns(ns);
    }

    /// Records one sample given in nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// A consistent-enough copy (each field is read once; concurrent updates may straddle it).
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot::from_buckets(
            std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            self.sum_ns.load(Relaxed),
            self.max_ns.load(Relaxed),
        )
    }
}

fn bucket_of(ns: u64) -> usize {
    let log = 63 - ns.max(1).leading_zeros() as usize;
    log.min(HISTOGRAM_BUCKETS - 1)
}

/// A histogram's contents at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HistogramSnapshot {
    /// Samples per log2 bucket (bucket `i`: `[2^i, 2^(i+1))` ns).
    pub buckets: Vec<u64>,
    /// Number of samples.
    pub count: u64,
    /// Sum of all samples in nanoseconds.
    pub sum_ns: u64,
    /// Largest sample in nanoseconds.
    pub max_ns: u64,
    /// Median estimate (upper edge of the median's bucket, capped at the maximum), ns.
    pub p50_ns: u64,
    /// 99th percentile estimate, ns, computed like `p50_ns`.
    pub p99_ns: u64,
}

impl HistogramSnapshot {
    /// Builds a snapshot from raw bucket counts (GPU tiers read theirs from device memory).
    pub fn from_buckets(buckets: [u64; HISTOGRAM_BUCKETS], sum_ns: u64, max_ns: u64) -> Self {
        let count: u64 = buckets.iter().sum();
        let quantile = |q_permille: u64| -> u64 {
            if count == 0 {
                return 0;
            }
            let rank = (count * q_permille).div_ceil(1000).max(1);
            let mut seen = 0;
            for (i, n) in buckets.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    let upper = if i + 1 >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << (i + 1)) - 1
                    };
                    return upper.min(max_ns);
                }
            }
            max_ns
        };
        Self {
            p50_ns: quantile(500),
            p99_ns: quantile(990),
            buckets: buckets.to_vec(),
            count,
            sum_ns,
            max_ns,
        }
    }

    /// Mean in nanoseconds (0 with no samples).
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }
}

/// Bytes moved into and out of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TierBytes {
    /// The tier.
    pub tier: Tier,
    /// Bytes read from this tier (pages brought up from it).
    pub bytes_read: u64,
    /// Bytes written to this tier (pages written back into it).
    pub bytes_written: u64,
}

/// Live counters shared by the threads of one space or region.
#[derive(Debug, Default)]
pub struct Stats {
    faults: AtomicU64,
    hits: AtomicU64,
    evictions: AtomicU64,
    writebacks: AtomicU64,
    prefetched_pages: AtomicU64,
    errors: AtomicU64,
    bytes_read: [AtomicU64; 5],
    bytes_written: [AtomicU64; 5],
    service_time: Histogram,
}

impl Stats {
    /// A page fault was served in `elapsed`.
    pub fn record_fault(&self, elapsed: Duration) {
        self.faults.fetch_add(1, Relaxed);
        self.service_time.record(elapsed);
    }
    /// `n` accesses found their page resident.
    pub fn add_hits(&self, n: u64) {
        self.hits.fetch_add(n, Relaxed);
    }
    /// `n` pages left the resident set.
    pub fn add_evictions(&self, n: u64) {
        self.evictions.fetch_add(n, Relaxed);
    }
    /// `n` dirty pages were written back.
    pub fn add_writebacks(&self, n: u64) {
        self.writebacks.fetch_add(n, Relaxed);
    }
    /// `n` pages were brought in ahead of a fault.
    pub fn add_prefetched(&self, n: u64) {
        self.prefetched_pages.fetch_add(n, Relaxed);
    }
    /// An operation failed (the error itself went to the caller).
    pub fn add_error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }
    /// `bytes` were read from `tier`.
    pub fn add_read(&self, tier: Tier, bytes: u64) {
        self.bytes_read[tier.index()].fetch_add(bytes, Relaxed);
    }
    /// `bytes` were written to `tier`.
    pub fn add_written(&self, tier: Tier, bytes: u64) {
        self.bytes_written[tier.index()].fetch_add(bytes, Relaxed);
    }

    /// Copies the counters out.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            faults: self.faults.load(Relaxed),
            hits: self.hits.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            writebacks: self.writebacks.load(Relaxed),
            prefetched_pages: self.prefetched_pages.load(Relaxed),
            errors: self.errors.load(Relaxed),
            tiers: Tier::ALL
                .iter()
                .map(|&tier| TierBytes {
                    tier,
                    bytes_read: self.bytes_read[tier.index()].load(Relaxed),
                    bytes_written: self.bytes_written[tier.index()].load(Relaxed),
                })
                .filter(|t| t.bytes_read + t.bytes_written > 0)
                .collect(),
            service_time: self.service_time.snapshot(),
        }
    }
}

/// A copy of a space's or region's counters at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Page faults served.
    pub faults: u64,
    /// Accesses that found their page resident (where the tier can count them).
    pub hits: u64,
    /// Pages dropped from the resident set.
    pub evictions: u64,
    /// Dirty pages written back.
    pub writebacks: u64,
    /// Pages brought in by prefetch or read-ahead.
    pub prefetched_pages: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Bytes per tier (tiers with no traffic are left out).
    pub tiers: Vec<TierBytes>,
    /// Fault service time.
    pub service_time: HistogramSnapshot,
}

impl StatsSnapshot {
    /// Hits over hits plus faults, or `None` before any access was counted.
    pub fn hit_rate(&self) -> Option<f64> {
        let total = self.hits + self.faults;
        #[allow(clippy::cast_precision_loss)] // a ratio for display
        (total > 0).then(|| self.hits as f64 / total as f64)
    }

    /// The snapshot as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a stats snapshot always serialises")
    }
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(f, "  {name:<22} {value:>16}")
        };
        row(f, "faults", self.faults.to_string())?;
        row(f, "hits", self.hits.to_string())?;
        if let Some(rate) = self.hit_rate() {
            row(f, "hit rate", format!("{:.2}%", rate * 100.0))?;
        }
        row(f, "evictions", self.evictions.to_string())?;
        row(f, "write-backs", self.writebacks.to_string())?;
        row(f, "prefetched pages", self.prefetched_pages.to_string())?;
        row(f, "errors", self.errors.to_string())?;
        for t in &self.tiers {
            row(
                f,
                &format!("read from {}", t.tier),
                format_size(t.bytes_read),
            )?;
            row(
                f,
                &format!("written to {}", t.tier),
                format_size(t.bytes_written),
            )?;
        }
        let s = &self.service_time;
        if s.count > 0 {
            row(f, "fault service mean", format_ns(s.mean_ns()))?;
            row(f, "fault service p50", format_ns(s.p50_ns))?;
            row(f, "fault service p99", format_ns(s.p99_ns))?;
            row(f, "fault service max", format_ns(s.max_ns))?;
        }
        Ok(())
    }
}

/// Formats nanoseconds as `850 ns`, `12.3 us`, `4.56 ms` or `1.23 s`.
pub fn format_ns(ns: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // display only
    let v = ns as f64;
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} us", v / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", v / 1e6),
        _ => format!("{:.2} s", v / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histogram() {
        let stats = Stats::default();
        for us in [1u64, 2, 3, 4, 100] {
            stats.record_fault(Duration::from_micros(us));
        }
        stats.add_hits(15);
        stats.add_read(Tier::File, 4096 * 5);
        stats.add_written(Tier::File, 4096);
        let s = stats.snapshot();
        assert_eq!(s.faults, 5);
        assert_eq!(s.hit_rate(), Some(0.75));
        assert_eq!(s.tiers.len(), 1);
        assert_eq!(s.tiers[0].bytes_read, 20480);
        assert_eq!(s.service_time.count, 5);
        assert_eq!(s.service_time.max_ns, 100_000);
        assert_eq!(s.service_time.mean_ns(), 22_000);
        // 3 us lies in [2048, 4096) ns: the median estimate is that bucket's upper edge.
        assert_eq!(s.service_time.p50_ns, 4095);
        assert_eq!(s.service_time.p99_ns, 100_000);
        let table = s.to_string();
        assert!(
            table.contains("hit rate") && table.contains("75.00%"),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(json["faults"], 5);
        assert_eq!(json["tiers"][0]["tier"], "file");
    }

    #[test]
    fn empty_histogram_and_extremes() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().p50_ns, 0);
        h.record_ns(0);
        h.record_ns(u64::MAX);
        let s = h.snapshot();
        assert_eq!(s.count, 2);
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[HISTOGRAM_BUCKETS - 1], 1);
        assert_eq!(Stats::default().snapshot().hit_rate(), None);
    }
}
