//! The structures Rust and `strata.cuh` share, with one layout checked on both sides: const
//! asserts here, `static_assert`s in the header, a CI test that compiles the header with
//! these sizes through NVRTC, and a GPU test that runs `strata_layout_probe`.

use std::mem::{offset_of, size_of};

/// Page-table word: frame number bits (while resident).
pub const FRAME_MASK: u64 = 0x7FFF_FFFF;
/// Page-table word: the frame holds only some of the page's sectors (sub-page fetch).
pub const PARTIAL: u64 = 1 << 31;
/// Page-table word: state shift.
pub const STATE_SHIFT: u32 = 32;
/// State: not resident.
pub const NOT_RESIDENT: u64 = 0;
/// State: a warp is copying the page in.
pub const LOADING: u64 = 1;
/// State: resident in the frame named by the low bits.
pub const RESIDENT: u64 = 2;
/// State: being evicted.
pub const EVICTING: u64 = 3;
/// Page-table word: dirty bit.
pub const DIRTY: u64 = 1 << 34;
/// Page-table word: the page was resident before (kept across eviction).
pub const HISTORY: u64 = 1 << 35;
/// Page-table word: version shift (8 bits, bumped when the page leaves its frame).
pub const VERSION_SHIFT: u32 = 36;
/// Page-table word: version bits.
pub const VERSION_MASK: u64 = 0xFF << VERSION_SHIFT;
/// Page-table word: pin count shift (20 bits).
pub const PIN_SHIFT: u32 = 44;
/// Page-table word: one pin.
pub const PIN_ONE: u64 = 1 << PIN_SHIFT;
/// Page-table word of a page not resident: its remote-access count (low 16 bits).
pub const REMOTE_COUNT_MASK: u64 = 0xFFFF;
/// Page-table word of a page not resident: remote writers in flight (bits 24..31).
pub const REMOTE_WRITERS_MASK: u64 = 0xFF << 24;
/// Fault service time histogram: buckets (4 per power of two).
pub const FAULT_HIST_BUCKETS: usize = 64;
/// Fault service time histogram: log2 of the first bucket's upper edge in ns.
pub const FAULT_HIST_MIN_LOG2: u32 = 8;
/// Space handle `policy` flag: read first touches through from the host copy.
pub const POLICY_READ_THROUGH: u32 = 0x100;
/// Space handle `policy` flag: no kernel writes the space ([`crate::Space::set_read_only`]).
pub const POLICY_READ_ONLY: u32 = 0x200;
/// Space handle `policy`: where log2 of the sub-page fetch sector size sits (0: whole pages).
pub const POLICY_SECTOR_SHIFT: u32 = 16;
/// Space handle `policy`: the bits of the sector size's log2.
pub const POLICY_SECTOR_MASK: u32 = 0xFF << POLICY_SECTOR_SHIFT;
/// Frame table: no page.
pub const NO_PAGE: u32 = 0xFFFF_FFFF;
/// Error flag: an index outside the space.
pub const ERR_OUT_OF_RANGE: u64 = 1;
/// Error flag: a warp waited past the wait limit for a page or frame and gave up.
pub const ERR_NO_FRAME: u64 = 2;
/// Error flag: a kernel named a page index past the end (acquire, acquire_page, view_page).
pub const ERR_PAGE_OUT_OF_RANGE: u64 = 4;
/// Error flag: a lower tier failed a page (the store, or a host that did not answer).
pub const ERR_STORE: u64 = 8;
/// Error flag: a kernel tried to write a read-only space (nothing was written).
pub const ERR_READ_ONLY: u64 = 16;
/// Tier chain: the whole space in pinned host memory.
pub const TIER_HOST_COPY: u32 = 0;
/// Tier chain: a pinned host cache over a store, through the request ring.
pub const TIER_RING: u32 = 1;
/// In a handle's `migrate_after`: element reads go in place, writes always migrate (the count
/// is in the low 16 bits).
pub const MIGRATE_READS_ONLY: u32 = 1 << 31;
/// Hit counter shards.
pub const HIT_SHARDS: usize = 32;
/// u64s between hit shards.
pub const SHARD_STRIDE: usize = 16;

/// Decoded page-table word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageWord {
    /// State (one of the four constants).
    pub state: u64,
    /// Frame (meaningful when resident).
    pub frame: u32,
    /// The frame holds only some of the page's sectors (sub-page fetch; when resident).
    pub partial: bool,
    /// Dirty bit.
    pub dirty: bool,
    /// Version (bumped each time the page leaves its frame).
    pub version: u8,
    /// Pins held.
    pub pins: u32,
}

impl PageWord {
    /// Decodes a raw word.
    pub fn decode(w: u64) -> Self {
        PageWord {
            state: (w >> STATE_SHIFT) & 3,
            frame: u32::try_from(w & FRAME_MASK).unwrap_or(u32::MAX),
            partial: w & PARTIAL != 0,
            dirty: w & DIRTY != 0,
            version: u8::try_from((w & VERSION_MASK) >> VERSION_SHIFT).unwrap_or(u8::MAX),
            pins: u32::try_from(w >> PIN_SHIFT).unwrap_or(u32::MAX),
        }
    }
    /// Encodes.
    pub fn encode(self) -> u64 {
        (u64::from(self.frame) & FRAME_MASK)
            | if self.partial { PARTIAL } else { 0 }
            | (self.state << STATE_SHIFT)
            | if self.dirty { DIRTY } else { 0 }
            | (u64::from(self.version) << VERSION_SHIFT)
            | (u64::from(self.pins) << PIN_SHIFT)
    }
}

/// One frame-table entry (`StrataFrame`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEntry {
    /// Page held, or [`NO_PAGE`].
    pub page: u32,
    /// Reference, protected and age bits.
    pub flags: u32,
}

/// Device-side statistics (`StrataCounters`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceCounters {
    /// Page pins that found their page resident, sharded by SM.
    pub hits: [u64; HIT_SHARDS * SHARD_STRIDE],
    /// Faults served.
    pub faults: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Dirty pages written back.
    pub writebacks: u64,
    /// Bytes copied host -> frames.
    pub bytes_in: u64,
    /// Bytes copied frames -> host.
    pub bytes_out: u64,
    /// Sum of fault service times, ns.
    pub fault_ns_total: u64,
    /// Longest fault service time, ns.
    pub fault_ns_max: u64,
    /// Pages brought in by prefetch.
    pub prefetched: u64,
    /// Error flags.
    pub error_flags: u64,
    /// First out-of-range index (`u64::MAX` if none).
    pub first_bad_index: u64,
    /// Sweeps that found every frame pinned (the warp backed off and retried).
    pub no_frame_retries: u64,
    /// Clock hand.
    pub clock_hand: u32,
    /// Frames in the protected segment.
    pub protected_now: u32,
    /// Faults since the space was made (never reset): ages the protected segment.
    pub lifetime_faults: u64,
    /// Optimistic reads whose page moved under them (they fell back to pinning).
    pub optimistic_retries: u64,
    /// Page reads served from the host copy by read-through.
    pub read_through: u64,
    /// Longest a warp waits for a page or a frame before it gives up with `ERR_NO_FRAME`, ns.
    pub wait_limit_ns: u64,
    /// First out-of-range page index seen (`u64::MAX` if none).
    pub first_bad_page: u64,
    /// First page a warp gave up waiting for (`u64::MAX` if none).
    pub no_frame_page: u64,
    /// First page a lower tier failed (`u64::MAX` if none).
    pub store_error_page: u64,
    /// Faults served from the host cache without a request (ring tier).
    pub host_cache_loads: u64,
    /// Dirty pages written down by the background write-back warps.
    pub background_writebacks: u64,
    /// Element reads served in place from the host copy (remote access).
    pub remote_reads: u64,
    /// Element writes made in place in the host copy (remote access).
    pub remote_writes: u64,
    /// Frames holding no page (kept across `reset_stats`).
    pub free_frames: u64,
    /// Fault service times: see [`fault_hist_bucket_range`].
    pub fault_hist: [u64; FAULT_HIST_BUCKETS],
    /// First page a kernel tried to write in a read-only space (`u64::MAX` if none).
    pub read_only_write_page: u64,
    /// Times a page word gained its dirty bit (never reset).
    pub pages_dirtied: u64,
    /// Loads of missing sectors into resident pages (sub-page fetch).
    pub sector_fills: u64,
}

/// The histogram bucket the device counts a fault of `ns` in (`fault_hist_bucket` in
/// `primitives.cuh`, written again here for the host's tests and tools).
pub fn fault_hist_bucket(ns: u64) -> usize {
    if ns < 1 << FAULT_HIST_MIN_LOG2 {
        return 0;
    }
    let lg = 63 - ns.leading_zeros();
    let b = (lg - FAULT_HIST_MIN_LOG2) as usize * 4 + ((ns >> (lg - 2)) & 3) as usize;
    b.min(FAULT_HIST_BUCKETS - 1)
}

/// The range of fault service times, in ns, that histogram bucket `b` counts (`[lo, hi)`; the
/// first bucket also counts faster faults and the last slower ones). Four buckets per power of
/// two from 256 ns.
pub fn fault_hist_bucket_range(b: usize) -> (u64, u64) {
    let b = u32::try_from(b.min(FAULT_HIST_BUCKETS - 1)).unwrap_or(0);
    let octave = 1u64 << (FAULT_HIST_MIN_LOG2 + b / 4);
    let quarter = octave / 4;
    let lo = octave + u64::from(b % 4) * quarter;
    (lo, lo + quarter)
}

/// The wait limit new spaces start with (see `Space::set_wait_limit`).
pub const DEFAULT_WAIT_LIMIT_NS: u64 = 4_000_000_000;

impl DeviceCounters {
    /// Counters at rest: zero, with no bad index recorded.
    pub fn initial() -> Self {
        DeviceCounters {
            hits: [0; HIT_SHARDS * SHARD_STRIDE],
            faults: 0,
            evictions: 0,
            writebacks: 0,
            bytes_in: 0,
            bytes_out: 0,
            fault_ns_total: 0,
            fault_ns_max: 0,
            prefetched: 0,
            error_flags: 0,
            first_bad_index: u64::MAX,
            no_frame_retries: 0,
            clock_hand: 0,
            protected_now: 0,
            lifetime_faults: 0,
            optimistic_retries: 0,
            read_through: 0,
            wait_limit_ns: DEFAULT_WAIT_LIMIT_NS,
            first_bad_page: u64::MAX,
            no_frame_page: u64::MAX,
            store_error_page: u64::MAX,
            host_cache_loads: 0,
            background_writebacks: 0,
            remote_reads: 0,
            remote_writes: 0,
            free_frames: 0,
            fault_hist: [0; FAULT_HIST_BUCKETS],
            read_only_write_page: u64::MAX,
            pages_dirtied: 0,
            sector_fills: 0,
        }
    }
}

/// The space handle kernels receive (`StrataSpace`), passed by value.
///
/// It borrows its space: the space's memory outlives every handle (and dropping a space waits
/// for every kernel queued on its GPU, so a kernel launched with a handle finishes first).
/// Only a [`crate::Space`] makes one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceHandle<'space> {
    /// Page table (device).
    pub page_table: u64,
    /// Frame table (device).
    pub frames: u64,
    /// Frame data (device).
    pub frame_data: u64,
    /// Host copy (device address of mapped pinned memory).
    pub host: u64,
    /// Counters (device).
    pub counters: u64,
    /// Bytes addressable.
    pub size_bytes: u64,
    /// Pages.
    pub pages: u64,
    /// Frames.
    pub frame_count: u32,
    /// log2(page size).
    pub page_shift: u32,
    /// Eviction policy (0 clock, 1 scan-resistant).
    pub policy: u32,
    /// Most frames the protected segment holds.
    pub protected_quota: u32,
    /// Ring tier: the device address of the ring's descriptor (0 otherwise).
    pub ring: u64,
    /// `TIER_*`.
    pub tier: u32,
    /// The access count (decaying) at which a page not resident migrates into a frame (element
    /// accesses go over the bus in place until then); 0: every miss migrates.
    pub migrate_after: u32,
    /// The peer tier's descriptor (device address; 0 without one).
    pub peer: u64,
    /// The borrow of the space (zero-sized; also keeps handles from being made outside).
    pub(crate) space: std::marker::PhantomData<&'space ()>,
}

// SAFETY: SpaceHandle is #[repr(C)], Copy, all plain integers laid out as StrataSpace.
unsafe impl crate::driver::KernelParam for SpaceHandle<'_> {
    fn companion_key(&self) -> Option<u64> {
        Some(self.counters)
    }
}

/// The peer tier's descriptor (`StrataPeer`, in GPU memory).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerDescriptor {
    /// Borrowed memory for the slots (device address, mapped for this GPU).
    pub slots: u64,
    /// Slot words (device address).
    pub slot_words: u64,
    /// Per page: slot + 1 holding its copy, 0 for none (device address).
    pub page_slots: u64,
    /// Slots.
    pub slot_count: u64,
    /// Round-robin cursor.
    pub next: u64,
    /// Faults served from a peer slot.
    pub loads: u64,
    /// Victims copied to a peer slot.
    pub stores: u64,
    /// Peer copies rewritten while a fault loaded them (that fault loaded from below).
    pub stale: u64,
}

/// The background write-back's control block (`StrataWriteBack`, in GPU memory).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteBackControl {
    /// Launches whose kernel has ended (their write-back warps stop).
    pub stop: u64,
    /// Write-back warps also stop after this long without a fault, ns.
    pub idle_ns: u64,
    /// Next frame to look at, in clock-hand units.
    pub cursor: u32,
    /// Frames ahead of the clock hand to keep clean.
    pub high_water: u32,
    /// Cleaning starts again below this many.
    pub low_water: u32,
    /// Unused (zero).
    pub reserved: u32,
}

const _: () = assert!(size_of::<FrameEntry>() == 8);
const _: () = assert!(size_of::<SpaceHandle<'static>>() == 96);
const _: () = assert!(offset_of!(SpaceHandle<'static>, peer) == 88);
const _: () = assert!(size_of::<PeerDescriptor>() == 64);
const _: () = assert!(offset_of!(SpaceHandle<'static>, ring) == 72);
const _: () = assert!(offset_of!(SpaceHandle<'static>, size_bytes) == 40);
const _: () = assert!(offset_of!(SpaceHandle<'static>, frame_count) == 56);
const _: () = assert!(offset_of!(SpaceHandle<'static>, protected_quota) == 68);
const _: () = assert!(
    size_of::<DeviceCounters>()
        == 8 * (HIT_SHARDS * SHARD_STRIDE + 11) + 8 + 96 + 8 * FAULT_HIST_BUCKETS + 24
);
const _: () = assert!(size_of::<WriteBackControl>() == 32);

/// The layout as Rust sees it, in the order `strata_layout_probe` writes it.
pub fn host_layout() -> Vec<u64> {
    let v = [
        size_of::<SpaceHandle<'static>>(),
        offset_of!(SpaceHandle<'static>, page_table),
        offset_of!(SpaceHandle<'static>, frames),
        offset_of!(SpaceHandle<'static>, frame_data),
        offset_of!(SpaceHandle<'static>, host),
        offset_of!(SpaceHandle<'static>, counters),
        offset_of!(SpaceHandle<'static>, size_bytes),
        offset_of!(SpaceHandle<'static>, pages),
        offset_of!(SpaceHandle<'static>, frame_count),
        offset_of!(SpaceHandle<'static>, page_shift),
        offset_of!(SpaceHandle<'static>, policy),
        offset_of!(SpaceHandle<'static>, protected_quota),
        offset_of!(SpaceHandle<'static>, ring),
        offset_of!(SpaceHandle<'static>, tier),
        offset_of!(SpaceHandle<'static>, peer),
        size_of::<PeerDescriptor>(),
        size_of::<DeviceCounters>(),
        offset_of!(DeviceCounters, faults),
        offset_of!(DeviceCounters, error_flags),
        offset_of!(DeviceCounters, first_bad_index),
        offset_of!(DeviceCounters, clock_hand),
        offset_of!(DeviceCounters, protected_now),
        offset_of!(DeviceCounters, wait_limit_ns),
        offset_of!(DeviceCounters, first_bad_page),
        offset_of!(DeviceCounters, no_frame_page),
        offset_of!(DeviceCounters, store_error_page),
        offset_of!(DeviceCounters, host_cache_loads),
        offset_of!(DeviceCounters, background_writebacks),
        offset_of!(DeviceCounters, remote_reads),
        offset_of!(DeviceCounters, fault_hist),
        offset_of!(SpaceHandle<'static>, migrate_after),
        size_of::<WriteBackControl>(),
        offset_of!(WriteBackControl, cursor),
        size_of::<FrameEntry>(),
        size_of::<crate::ring::layout::RingDescriptor>(),
        offset_of!(crate::ring::layout::RingDescriptor, slot_count),
        size_of::<crate::ring::layout::RingRequest>(),
    ];
    let mut out: Vec<u64> = v.iter().map(|&x| x as u64).collect();
    out.push(PIN_ONE);
    out.push(DIRTY);
    out
}

/// A translation unit that includes `strata.cuh` and asserts, at compile time, the sizes and
/// constants Rust uses. NVRTC compiling it proves the header agrees with this crate.
pub fn static_check_source() -> String {
    format!(
        "#include \"strata.cuh\"\n\
         static_assert(sizeof(StrataSpace) == {}, \"StrataSpace size\");\n\
         static_assert(sizeof(StrataCounters) == {}, \"StrataCounters size\");\n\
         static_assert(sizeof(StrataFrame) == {}, \"StrataFrame size\");\n\
         static_assert(STRATA_PIN_ONE == {}ull, \"pin unit\");\n\
         static_assert(STRATA_VERSION_MASK == {}ull, \"version bits\");\n\
         static_assert(STRATA_POLICY_READ_THROUGH == {}u && STRATA_POLICY_READ_ONLY == {}u, \"policy flags\");\n\
         static_assert(STRATA_POLICY_SECTOR_SHIFT == {}u && STRATA_POLICY_SECTOR_MASK == {}u, \"sector size bits\");\n\
         static_assert(STRATA_FRAME_MASK == {}ull && STRATA_PARTIAL == {}ull, \"frame bits\");\n\
         static_assert(STRATA_DIRTY == {}ull, \"dirty bit\");\n\
         static_assert(STRATA_HISTORY == {}ull, \"history bit\");\n\
         static_assert(STRATA_NO_PAGE == {}u, \"no page\");\n\
         static_assert(STRATA_RESIDENT == {}ull && STRATA_LOADING == {}ull && STRATA_EVICTING == {}ull, \"states\");\n\
         static_assert(STRATA_HIT_SHARDS == {} && STRATA_SHARD_STRIDE == {}, \"shards\");\n\
         static_assert(STRATA_ERR_OUT_OF_RANGE == {}ull && STRATA_ERR_NO_FRAME == {}ull && STRATA_ERR_PAGE_OUT_OF_RANGE == {}ull && STRATA_ERR_STORE == {}ull && STRATA_ERR_READ_ONLY == {}ull, \"error flags\");\n\
         static_assert(STRATA_TIER_HOST_COPY == {}u && STRATA_TIER_RING == {}u, \"tiers\");\n\
         static_assert(sizeof(StrataRing) == {} && sizeof(StrataRequest) == {}, \"ring structs\");\n\
         static_assert(STRATA_REQ_READ == {}u && STRATA_REQ_WRITE == {}u && STRATA_REQ_READ_AHEAD == {}u, \"request kinds\");\n\
         static_assert(STRATA_SLOT_PRESENT == {}ull && STRATA_SLOT_ERROR == {}ull && STRATA_SLOT_GEN_SHIFT == {}, \"slot words\");\n\
         static_assert(sizeof(StrataWriteBack) == {}, \"write-back control\");\n\
         static_assert(STRATA_REMOTE_COUNT_MASK == {}ull && STRATA_REMOTE_WRITERS_MASK == {}ull, \"remote record\");\n\
         static_assert(STRATA_MIGRATE_READS_ONLY == {}u, \"reads-only remote access\");\n\
         static_assert(STRATA_FAULT_HIST_BUCKETS == {} && STRATA_FAULT_HIST_MIN_LOG2 == {}, \"fault histogram\");\n\
         extern \"C\" __global__ void strata_static_layout_check() {{}}\n",
        size_of::<SpaceHandle<'static>>(),
        size_of::<DeviceCounters>(),
        size_of::<FrameEntry>(),
        PIN_ONE,
        VERSION_MASK,
        POLICY_READ_THROUGH,
        POLICY_READ_ONLY,
        POLICY_SECTOR_SHIFT,
        POLICY_SECTOR_MASK,
        FRAME_MASK,
        PARTIAL,
        DIRTY,
        HISTORY,
        NO_PAGE,
        RESIDENT,
        LOADING,
        EVICTING,
        HIT_SHARDS,
        SHARD_STRIDE,
        ERR_OUT_OF_RANGE,
        ERR_NO_FRAME,
        ERR_PAGE_OUT_OF_RANGE,
        ERR_STORE,
        ERR_READ_ONLY,
        TIER_HOST_COPY,
        TIER_RING,
        size_of::<crate::ring::layout::RingDescriptor>(),
        size_of::<crate::ring::layout::RingRequest>(),
        crate::ring::layout::REQ_READ,
        crate::ring::layout::REQ_WRITE,
        crate::ring::layout::REQ_READ_AHEAD,
        crate::ring::layout::SLOT_PRESENT,
        crate::ring::layout::SLOT_ERROR,
        crate::ring::layout::SLOT_GEN_SHIFT,
        size_of::<WriteBackControl>(),
        REMOTE_COUNT_MASK,
        REMOTE_WRITERS_MASK,
        MIGRATE_READS_ONLY,
        FAULT_HIST_BUCKETS,
        FAULT_HIST_MIN_LOG2,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_histogram_buckets_tile_the_time_axis() {
        // Each bucket's range holds exactly the times counted in it, and the ranges follow on.
        for b in 0..FAULT_HIST_BUCKETS {
            let (lo, hi) = fault_hist_bucket_range(b);
            assert!(lo < hi);
            assert_eq!(fault_hist_bucket(lo), b, "bucket {b} lower edge {lo}");
            assert_eq!(fault_hist_bucket(hi - 1), b, "bucket {b} upper edge {hi}");
            if b + 1 < FAULT_HIST_BUCKETS {
                assert_eq!(fault_hist_bucket_range(b + 1).0, hi);
            }
        }
        assert_eq!(fault_hist_bucket(0), 0);
        assert_eq!(fault_hist_bucket(255), 0);
        assert_eq!(fault_hist_bucket(u64::MAX), FAULT_HIST_BUCKETS - 1);
        // 16.8 ms is past the last edge.
        assert_eq!(fault_hist_bucket_range(FAULT_HIST_BUCKETS - 1).1, 1 << 24);
    }

    #[test]
    fn page_word_round_trips() {
        for (state, frame, partial, dirty, version, pins) in [
            (RESIDENT, 7, true, true, 1, 3),
            (LOADING, 0, false, false, 0, 1),
            (EVICTING, 0x7FFF_FFFF, false, true, 255, 0xF_FFFF),
            (NOT_RESIDENT, 0, false, false, 17, 0),
        ] {
            let w = PageWord {
                state,
                frame,
                partial,
                dirty,
                version,
                pins,
            };
            assert_eq!(PageWord::decode(w.encode()), w);
        }
        // Pin arithmetic as the device does it: pins never spill into the state bits.
        let w = PageWord {
            state: RESIDENT,
            frame: 5,
            partial: false,
            dirty: false,
            version: 255,
            pins: 0,
        }
        .encode();
        let pinned = w + 3 * PIN_ONE;
        assert_eq!(PageWord::decode(pinned).pins, 3);
        assert_eq!(PageWord::decode(pinned).state, RESIDENT);
        assert_eq!(PageWord::decode(pinned).version, 255);
        // Publish from LOADING adds one state step and the frame.
        let loading = (LOADING << STATE_SHIFT) + PIN_ONE;
        let published = loading + (1 << STATE_SHIFT) + 9;
        assert_eq!(
            PageWord::decode(published),
            PageWord {
                state: RESIDENT,
                frame: 9,
                partial: false,
                dirty: false,
                version: 0,
                pins: 1
            }
        );
    }

    #[test]
    fn host_layout_lists_every_probe_field() {
        assert_eq!(host_layout().len(), 39);
        assert_eq!(host_layout()[0], 96);
    }
}
