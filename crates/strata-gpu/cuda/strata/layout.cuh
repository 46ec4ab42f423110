// strata/layout.cuh: the words and structures a kernel shares with the host (page table, frame
// table, counters, the space handle, the request ring of store-backed spaces). Their layout is
// checked on both sides: static_asserts here, const asserts and a layout-probe kernel in Rust
// (`strata_gpu::layout`, `strata_gpu::ring::layout`).
#pragma once


typedef unsigned long long strata_u64;
typedef unsigned int strata_u32;

// ---- page-table word (one per page, 64 bits) ---------------------------------------------------
// bits  0..30  frame number (valid while RESIDENT, LOADING keeps 0 until publish)
// bit   31     partial (RESIDENT, sub-page fetch): the frame holds only some of the page's
//              sectors (its sector word says which; sectors.cuh). Clear means the whole page,
//              so a hit on a whole page reads no sector word.
//              While the page is NOT_RESIDENT, bits 0..31 are its remote-access record instead
//              (remote.cuh): an access count (bits 0..15), the epoch it was last counted in
//              (16..23) and the remote writers now writing the host copy in place (24..31).
//              A claim clears them.
// bits 32..33  state
// bit  34      dirty
// bit  35      history: the page was resident before (kept across eviction); the scan-resistant
//              policy admits a page that faults again as referenced, so a loop larger than the
//              cache gets its re-used pages into the protected segment
// bits 36..43  version: bumped each time the page leaves its frame (eviction), so a word read
//              twice during an optimistic read proves the frame held this page throughout
//              (a page evicted and reloaded into the same frame has a new version)
// bits 44..63  pin count: pins live in the page word itself, so a pinned access is one atomic
//              that both pins the page and reads its state, and an evictor's single
//              compare-and-swap can never race with a pin (it fails if any pin appears).
//              20 bits hold a million pins, more than a GPU has threads.
#define STRATA_FRAME_MASK 0x7FFFFFFFull
#define STRATA_PARTIAL (1ull << 31)
#define STRATA_LOW_MASK 0xFFFFFFFFull  // frame and partial bit, or the remote record
#define STRATA_STATE_SHIFT 32
#define STRATA_STATE_MASK (3ull << STRATA_STATE_SHIFT)
#define STRATA_NOT_RESIDENT 0ull
#define STRATA_LOADING 1ull
#define STRATA_RESIDENT 2ull
#define STRATA_EVICTING 3ull
#define STRATA_DIRTY (1ull << 34)
#define STRATA_HISTORY (1ull << 35)
#define STRATA_VERSION_SHIFT 36
#define STRATA_VERSION_MASK (0xFFull << STRATA_VERSION_SHIFT)
#define STRATA_PIN_SHIFT 44
#define STRATA_PIN_ONE (1ull << STRATA_PIN_SHIFT)
#define STRATA_PIN_MASK (0xFFFFFull << STRATA_PIN_SHIFT)
#define STRATA_REMOTE_COUNT_MASK 0xFFFFull
#define STRATA_REMOTE_EPOCH_SHIFT 16
#define STRATA_REMOTE_EPOCH_MASK (0xFFull << STRATA_REMOTE_EPOCH_SHIFT)
#define STRATA_REMOTE_WRITER_SHIFT 24
#define STRATA_REMOTE_WRITER_ONE (1ull << STRATA_REMOTE_WRITER_SHIFT)
#define STRATA_REMOTE_WRITERS_MASK (0xFFull << STRATA_REMOTE_WRITER_SHIFT)
// In StrataSpace::migrate_after: reads go in place, writes always migrate; the threshold is
// the low 16 bits.
#define STRATA_MIGRATE_READS_ONLY 0x80000000u
#define STRATA_MIGRATE_AFTER_MASK 0xFFFFu

// ---- frame table (one entry per frame of the page cache) --------------------------------------
#define STRATA_NO_PAGE 0xFFFFFFFFu
#define STRATA_FRAME_REF 1u        // referenced since the clock hand last passed
#define STRATA_FRAME_PROTECTED 2u  // in the protected segment (scan-resistant policy)
#define STRATA_STAMP_SHIFT 16
#define STRATA_STAMP_MASK (0xFFFFu << STRATA_STAMP_SHIFT)
// A protected frame is demoted once this many epochs (an epoch = as many faults as the cache
// has frames) pass without a reference. Counting faults rather than clock-hand passes keeps
// the age independent of how often sweeps skip busy frames.
#define STRATA_AGE_EPOCHS 16u
// A probationary frame's stamp counts faults in units of this many (16 bits span a million
// faults): a probationary page stays at least half the probationary segment's turnover,
// measured in faults, after its last second chance. Sweeps that skip pinned frames spin the
// clock hand many laps while few faults complete; without this floor they would strip the
// second chance of a page loaded a moment ago, and a page that two warps need one after the
// other in the same pass (a row straddling two pages) would be loaded twice.
#define STRATA_TICK_SHIFT 4u

// ---- policies and error flags ----------------------------------------------------------------
#define STRATA_POLICY_CLOCK 0u
#define STRATA_POLICY_SCAN_RESISTANT 1u
#define STRATA_POLICY_KIND_MASK 0xFFu
// Flag on top of either policy: a page-granular read (acquire_page without write) that misses
// on a page with no history is served straight from the pinned host copy (zero-copy, no frame
// taken) and only marks the page; a page referenced again after that migrates as usual. For
// read-only data that is mostly read once (a BFS's edge lists), so only re-used pages take
// frames. The host copy is current for any page not resident, so this needs no write-back;
// a kernel must not write a page it reads this way while it runs.
#define STRATA_POLICY_READ_THROUGH 0x100u
// Flag on top of either policy: no kernel writes this space (SpaceOptions::read_only). Kernel
// writes are refused (STRATA_ERR_READ_ONLY, nothing written), so no page is ever dirty and the
// host copy never changes while a kernel runs. Reads in place from the host copy then need no
// acquire on the page word, whose L1 invalidation (CCTL.IVALL on sm_90) would throw out the
// lines the SM's other warps are reading (scripts/experiments/acquire_in_place.sh).
#define STRATA_POLICY_READ_ONLY 0x200u
// Sub-page fetch (sectors.cuh): log2 of the sector size in bits 16..23, 0 for whole pages.
// The frames' sector words follow the frame table.
#define STRATA_POLICY_SECTOR_SHIFT 16u
#define STRATA_POLICY_SECTOR_MASK (0xFFu << STRATA_POLICY_SECTOR_SHIFT)
// How acquire_page reads a page that is not resident (access.cuh).
#define STRATA_READ_MIGRATE 0u
#define STRATA_READ_REMOTE_OK 1u
#define STRATA_READ_IN_PLACE 2u
#define STRATA_ERR_OUT_OF_RANGE 1ull       // an element index past the end (first_bad_index)
#define STRATA_ERR_NO_FRAME 2ull           // a wait passed wait_limit_ns (no_frame_page)
#define STRATA_ERR_PAGE_OUT_OF_RANGE 4ull  // a page index past the end (first_bad_page)
#define STRATA_ERR_STORE 8ull              // a lower tier failed a page (store_error_page)
#define STRATA_ERR_READ_ONLY 16ull         // a kernel wrote a read-only space (read_only_write_page)

// ---- tiers under the GPU cache --------------------------------------------------------------
// Where a page not in a GPU frame lives (StrataSpace::tier says which chain the space has):
//   HOST_COPY: a full copy of the space in pinned host memory (`host`), loaded directly.
//   RING:      a bounded pinned host cache (slot words say which pages it holds), filled from
//              a store by host threads through a request ring (`ring`; tier_ring.cuh).
#define STRATA_TIER_HOST_COPY 0u
#define STRATA_TIER_RING 1u

// Fault service times are kept as a histogram: 4 buckets per power of two from 256 ns (bucket 0
// also takes anything faster) to 16.8 ms (the last bucket also takes anything slower).
#define STRATA_FAULT_HIST_BUCKETS 64
#define STRATA_FAULT_HIST_MIN_LOG2 8

#define STRATA_HIT_SHARDS 32
#define STRATA_SHARD_STRIDE 16  // u64s between shards: one 128-byte line each

struct StrataFrame {
    strata_u32 page;   // page held, or STRATA_NO_PAGE
    strata_u32 flags;  // STRATA_FRAME_* bits and the age
};

struct StrataCounters {
    strata_u64 hits[STRATA_HIT_SHARDS * STRATA_SHARD_STRIDE];  // sharded by SM
    strata_u64 faults;
    strata_u64 evictions;
    strata_u64 writebacks;
    strata_u64 bytes_in;       // host -> GPU frames
    strata_u64 bytes_out;      // GPU frames -> host
    strata_u64 fault_ns_total; // sum of fault service times (claim to publish)
    strata_u64 fault_ns_max;
    strata_u64 prefetched;
    strata_u64 error_flags;    // STRATA_ERR_* bits
    strata_u64 first_bad_index;// first out-of-range element index seen (~0 if none)
    strata_u64 no_frame_retries;
    strata_u32 clock_hand;
    strata_u32 protected_now;  // frames in the protected segment
    strata_u64 lifetime_faults;// never reset: the clock of protected-segment ageing
    strata_u64 optimistic_retries; // optimistic reads whose page moved under them (then pinned)
    strata_u64 read_through;   // page reads served from the host copy (STRATA_POLICY_READ_THROUGH)
    strata_u64 wait_limit_ns;  // longest a warp waits for a page or frame before STRATA_ERR_NO_FRAME
    strata_u64 first_bad_page; // first out-of-range page index seen (~0 if none)
    strata_u64 no_frame_page;  // first page a warp gave up waiting for (~0 if none)
    strata_u64 store_error_page; // first page a lower tier failed (~0 if none)
    strata_u64 host_cache_loads; // faults served from the host cache without a request
    strata_u64 background_writebacks; // dirty pages written down by the write-back warps
    strata_u64 remote_reads;   // element reads served in place from the host copy (remote.cuh)
    strata_u64 remote_writes;  // element writes made in place in the host copy
    strata_u64 free_frames;    // frames holding no page (never reset by reset_stats)
    strata_u64 fault_hist[STRATA_FAULT_HIST_BUCKETS]; // fault service times (see above)
    strata_u64 read_only_write_page; // first page a kernel tried to write in a read-only space (~0 if none)
    strata_u64 pages_dirtied;  // times a page word gained its dirty bit (never reset): a host
                               // that saw no change since its last look knows no page is dirty
    strata_u64 sector_fills;   // loads of missing sectors into resident pages (sectors.cuh)
};

// The space handle a kernel receives (by value). Pointers are device addresses.
struct StrataSpace {
    strata_u64* page_table;      // [pages]
    StrataFrame* frames;         // [frame_count], then (sub-page fetch) a sector word per frame
    unsigned char* frame_data;   // (frame_count + 1) * page_size bytes, in GPU memory; the last
                                 // page is scratch that failed accesses point at
    unsigned char* host;         // the backing copy: pinned host memory mapped into the GPU
    StrataCounters* counters;    // in GPU memory
    strata_u64 size_bytes;       // bytes addressable by kernels
    strata_u64 pages;
    strata_u32 frame_count;
    strata_u32 page_shift;
    strata_u32 policy;           // STRATA_POLICY_*
    strata_u32 protected_quota;  // most frames the protected segment may hold
    struct StrataRing* ring;     // RING tier: the request ring's descriptor (GPU memory)
    strata_u32 tier;             // STRATA_TIER_*
    strata_u32 migrate_after;    // access count (decaying) at which a page not resident
                                 // migrates into a frame; until then element accesses go
                                 // over the bus in place (remote.cuh). 0: every miss migrates;
                                 // | STRATA_MIGRATE_READS_ONLY: only reads go in place
    struct StrataPeer* peer;     // the peer tier above the host copy (GPU memory), or null
};

// ---- the request ring of store-backed spaces (protocol: strata_gpu::ring::layout) --------------
#define STRATA_REQ_READ 1u
#define STRATA_REQ_WRITE 2u
#define STRATA_REQ_READ_AHEAD 3u
#define STRATA_SLOT_INDEX_MASK 0xFFFFFFFFull
#define STRATA_SLOT_PRESENT (1ull << 32)
#define STRATA_SLOT_ERROR (1ull << 33)
#define STRATA_SLOT_GEN_SHIFT 40

struct StrataRequest {     // in pinned host memory; one warp writes it, seq last
    strata_u64 seq;        // ticket + 1 once published
    strata_u64 page;
    strata_u32 kind;       // STRATA_REQ_*
    strata_u32 reserved;
    strata_u64 reserved2;
};

struct StrataRing {                // in GPU memory
    strata_u64 tail;               // tickets claimed (device atomics)
    StrataRequest* entries;        // [capacity], pinned host
    strata_u64* head;              // tickets the host consumed, pinned host
    strata_u64* done;              // [capacity] write completions (ticket + 1), pinned host
    strata_u64* slot_words;        // [pages] where each page sits in the host cache, pinned host
    unsigned char* slot_refs;      // [slot_count] reference bytes the device sets, pinned host
    unsigned char* slots;          // [slot_count << page_shift] the host cache, pinned host
    unsigned char* staging;        // [capacity << page_shift] pages on their way down
    strata_u64 slot_count;
    strata_u32 capacity;           // a power of two
    strata_u32 flags;
};

// ---- the peer tier: a victim cache in borrowed memory of neighbour GPUs (tier_peer.cuh) ---------
// Slot words (one per slot, in this GPU's memory): which page a slot holds and whether it is
// being rewritten. A reader validates the word before and after copying (a seqlock).
#define STRATA_PEER_PAGE_MASK 0xFFFFFFFFull
#define STRATA_PEER_VALID (1ull << 32)
#define STRATA_PEER_BUSY (1ull << 33)
#define STRATA_PEER_GEN_SHIFT 40

struct StrataPeer {                // in GPU memory
    unsigned char* slots;          // [slot_count << page_shift] borrowed memory, mapped here
    strata_u64* slot_words;        // [slot_count]
    strata_u32* page_slots;        // [pages] slot + 1 holding the page's copy (0: none)
    strata_u64 slot_count;
    strata_u64 next;               // round-robin cursor over the slots
    strata_u64 loads;              // faults served from a peer slot
    strata_u64 stores;             // victims copied to a peer slot
    strata_u64 stale;              // peer copies found rewritten while loaded (loaded from below)
};

static_assert(sizeof(StrataPeer) == 64, "StrataPeer layout changed: update strata_gpu::layout");

// ---- background write-back (write_back.cuh; strata_gpu::space::write_back) ---------------------
struct StrataWriteBack {           // in GPU memory, one per space
    strata_u64 stop;               // launches whose kernel has ended (the cleaners of a launch
                                   // with a smaller or equal number stop)
    strata_u64 idle_ns;            // cleaners also stop after this long without a fault
    strata_u32 cursor;             // next frame to look at, in clock-hand units (free-running)
    strata_u32 high_water;         // frames ahead of the hand to keep clean
    strata_u32 low_water;          // start cleaning again below this many
    strata_u32 reserved;
};

static_assert(sizeof(StrataWriteBack) == 32, "StrataWriteBack layout changed: update strata_gpu::layout");
static_assert(sizeof(StrataRequest) == 32, "StrataRequest layout changed: update strata_gpu::ring::layout");
static_assert(sizeof(StrataRing) == 80, "StrataRing layout changed: update strata_gpu::ring::layout");

static_assert(sizeof(StrataFrame) == 8, "StrataFrame layout changed: update strata_gpu::layout");
static_assert(sizeof(StrataCounters) == 8 * (STRATA_HIT_SHARDS * STRATA_SHARD_STRIDE + 11) + 8 + 96 +
                                            8 * STRATA_FAULT_HIST_BUCKETS + 24,
              "StrataCounters layout changed: update strata_gpu::layout");
static_assert(sizeof(StrataSpace) == 96, "StrataSpace layout changed: update strata_gpu::layout");
