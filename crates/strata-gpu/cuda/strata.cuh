// strata.cuh: the device side of Strata's GPU-driven demand paging.
//
// A kernel that includes this header reads and writes a *space* (a byte range larger than the
// GPU's memory) through a page cache in GPU memory. Every page fault is served by the warp that
// takes it: no CPU, driver or OS is on the path.
//
//   #include "strata.cuh"
//   extern "C" __global__ void sum(StrataSpace space, unsigned long long n, double* out) {
//       strata::Array<double> a(space);
//       for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
//            i += gridDim.x * blockDim.x)
//           atomicAdd(out, a.read(i));
//   }
//
// Element access: `read(i)`, `write(i, v)`, `atomic_add(i, v)`. Bulk loops over whole pages:
// `strata::acquire(space, page, write)` returns a pointer to the page's frame, valid until
// `strata::release(space, ref)`; both are warp-collective over the calling lanes (lanes that pass
// the same space and page share one pin). A warp's lanes may differ in everything: space, page,
// read or write, trip count, whether they call at all. What a kernel may hold at once, and what
// happens beyond that (a bounded wait, then an error), is said above acquire_page.
//
// Self-contained on purpose: it includes no toolkit header, so NVRTC compiles it with no CUDA
// toolkit installed (CI does exactly that). Needs sm_70 or newer (__match_any_sync, __nanosleep).
//
// The layout of every struct below is shared with Rust (`strata_gpu::layout`); both sides check
// it (static_asserts here, const asserts and a layout-probe kernel there).
#pragma once

typedef unsigned long long strata_u64;
typedef unsigned int strata_u32;

// ---- page-table word (one per page, 64 bits) ---------------------------------------------------
// bits  0..31  frame number (valid while RESIDENT, LOADING keeps 0 until publish)
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
#define STRATA_FRAME_MASK 0xFFFFFFFFull
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
#define STRATA_ERR_OUT_OF_RANGE 1ull       // an element index past the end (first_bad_index)
#define STRATA_ERR_NO_FRAME 2ull           // a wait passed wait_limit_ns (no_frame_page)
#define STRATA_ERR_PAGE_OUT_OF_RANGE 4ull  // a page index past the end (first_bad_page)

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
    strata_u64 reserved[2];
};

// The space handle a kernel receives (by value). Pointers are device addresses.
struct StrataSpace {
    strata_u64* page_table;      // [pages]
    StrataFrame* frames;         // [frame_count]
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
};

static_assert(sizeof(StrataFrame) == 8, "StrataFrame layout changed: update strata_gpu::layout");
static_assert(sizeof(StrataCounters) == 8 * (STRATA_HIT_SHARDS * STRATA_SHARD_STRIDE + 11) + 8 + 64,
              "StrataCounters layout changed: update strata_gpu::layout");
static_assert(sizeof(StrataSpace) == 72, "StrataSpace layout changed: update strata_gpu::layout");

namespace strata {

namespace detail {

__device__ __forceinline__ unsigned lane_id() {
    unsigned l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}
__device__ __forceinline__ unsigned sm_id() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
__device__ __forceinline__ strata_u64 now_ns() {
    strata_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ strata_u64 load_volatile(const strata_u64* p) {
    return *(const volatile strata_u64*)p;
}
__device__ __forceinline__ strata_u32 load_volatile(const strata_u32* p) {
    return *(const volatile strata_u32*)p;
}
// Unpin with release semantics: the group's loads and stores of the frame are ordered before
// the pin drops, so an evictor that sees zero pins also sees the final bytes.
__device__ __forceinline__ void unpin_release(strata_u64* word) {
    strata_u64 minus_one = 0ull - STRATA_PIN_ONE;
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" : : "l"(word), "l"(minus_one) : "memory");
}
__device__ __forceinline__ strata_u64 state_of(strata_u64 w) {
    return (w & STRATA_STATE_MASK) >> STRATA_STATE_SHIFT;
}
// Loads of page-table words for the optimistic read: the first with acquire semantics (pairs
// with the publisher's fence, so frame bytes read after it are the published ones), the second
// relaxed, after the frame bytes were read (ordered by an acquire load or a fence).
__device__ __forceinline__ strata_u64 load_acquire(const strata_u64* p) {
    strata_u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ strata_u64 load_relaxed(const strata_u64* p) {
    strata_u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" : : : "memory"); }
// True if two reads of a page's word show it resident in the same frame throughout: same
// state, frame and version (pins and the dirty bit may change under a reader).
__device__ __forceinline__ bool same_residency(strata_u64 before, strata_u64 after) {
    return state_of(before) == STRATA_RESIDENT && ((before ^ after) & ~(STRATA_PIN_MASK | STRATA_DIRTY)) == 0;
}
// Marks a page gone from its frame: NOT_RESIDENT, frame and dirty cleared, version bumped;
// pins (transient ones of warps that found it busy) and the history bit kept. A CAS loop, as
// the version must wrap inside its 8 bits rather than carry into the pins.
__device__ __forceinline__ strata_u64 retired_low_bits(strata_u64 w) {
    return (w & STRATA_HISTORY) | ((w + (1ull << STRATA_VERSION_SHIFT)) & STRATA_VERSION_MASK);
}
// The evictor's form: while a page is EVICTING only its pins change, so from the word its
// EVICTING compare-and-swap installed the new low bits are known, and one add (exact, as
// the pins above them are untouched) retires it.
__device__ __forceinline__ void retire_evicting_word(strata_u64* word, strata_u64 evicting) {
    const strata_u64 low = evicting & ~STRATA_PIN_MASK;
    atomicAdd(word, retired_low_bits(evicting) - low);
}
__device__ __forceinline__ void retire_page_word(strata_u64* word) {
    strata_u64 cur = load_volatile(word);
    for (;;) {
        const strata_u64 version = (cur + (1ull << STRATA_VERSION_SHIFT)) & STRATA_VERSION_MASK;
        const strata_u64 next = (cur & (STRATA_PIN_MASK | STRATA_HISTORY)) | version;
        const strata_u64 prev = atomicCAS(word, cur, next);
        if (prev == cur) return;
        cur = prev;
    }
}

// Error reports: a flag the host's check_errors() turns into an error, and the first index.
__device__ __forceinline__ void report_error(const StrataSpace& s, strata_u64 flag, strata_u64 index) {
    atomicOr(&s.counters->error_flags, flag);
    strata_u64* first = flag == STRATA_ERR_OUT_OF_RANGE        ? &s.counters->first_bad_index
                        : flag == STRATA_ERR_PAGE_OUT_OF_RANGE ? &s.counters->first_bad_page
                                                               : &s.counters->no_frame_page;
    atomicMin(first, index);
}
// The scratch page after the last frame: what a failed access gets instead of a page, so a
// kernel that ignores the error still touches only memory of its own space.
__device__ __forceinline__ unsigned char* scratch_page(const StrataSpace& s) {
    return s.frame_data + ((strata_u64)s.frame_count << s.page_shift);
}
// Pin with acquire semantics: pairs with the publisher's release (serve_fault's fence before
// its publishing add) and with unpin_release of earlier holders, so the frame bytes read after a
// pin that saw RESIDENT are the published ones.
__device__ __forceinline__ strata_u64 pin_acquire(strata_u64* word) {
    strata_u64 old;
    asm volatile("atom.acquire.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(word), "l"(STRATA_PIN_ONE) : "memory");
    return old;
}
// The lanes of `mask` whose space is the calling lane's (all of them, nearly always: checked
// with a broadcast and a vote before paying for a match).
__device__ __forceinline__ unsigned space_peers(unsigned mask, const StrataSpace& s) {
    const strata_u64 key = (strata_u64)s.page_table;
    const strata_u64 first = __shfl_sync(mask, key, __ffs(mask) - 1);
    if (__all_sync(mask, key == first)) return mask;
    return __match_any_sync(mask, key);
}
// True (on every lane of `mask`) once this warp has waited longer than the space's wait limit
// since `*since` (0: the wait starts now). Lanes of other spaces read their own limits; any
// lane's expiry ends the wait for all, so the decision is warp-uniform.
__device__ __forceinline__ bool wait_expired(const StrataSpace& s, unsigned mask, strata_u64* since) {
    const strata_u64 t = now_ns();
    if (*since == 0) *since = t;
    return __any_sync(mask, t - *since > load_volatile(&s.counters->wait_limit_ns));
}

__device__ __forceinline__ void add_hits(const StrataSpace& s, strata_u64 n) {
    atomicAdd(&s.counters->hits[(sm_id() % STRATA_HIT_SHARDS) * STRATA_SHARD_STRIDE], n);
}

__device__ __forceinline__ void touch_frame(const StrataSpace& s, strata_u32 frame) {
    strata_u32* flags = &s.frames[frame].flags;
    if (!(load_volatile(flags) & STRATA_FRAME_REF)) atomicOr(flags, STRATA_FRAME_REF);
}

enum PinStatus { PIN_NONE = 0, PIN_HIT = 1, PIN_BUSY = 2, PIN_CLAIMED = 3, PIN_HOST = 4 };

// One attempt by a group leader: pin a resident page, or claim a missing one for loading (the
// claim keeps the pin), or report that someone else is moving it. With `read_through`, a
// missing page with no history is only marked (PIN_HOST: read it from the host copy, no pin).
__device__ __forceinline__ int try_pin(const StrataSpace& s, strata_u64 page, bool write,
                                       strata_u32* frame, bool read_through = false) {
    strata_u64* word = &s.page_table[page];
    strata_u64 old = pin_acquire(word);
    strata_u64 st = state_of(old);
    if (st == STRATA_RESIDENT) {
        *frame = (strata_u32)(old & STRATA_FRAME_MASK);
        if (write && !(old & STRATA_DIRTY)) atomicOr(word, STRATA_DIRTY);
        touch_frame(s, *frame);
        return PIN_HIT;
    }
    if (st == STRATA_NOT_RESIDENT) {
        strata_u64 cur = old + STRATA_PIN_ONE;
        while (state_of(cur) == STRATA_NOT_RESIDENT) {
            if (read_through && !(cur & STRATA_HISTORY)) {
                // The CAS succeeds only while the page is not resident, so no publisher is
                // adding the history bit at the same time.
                const strata_u64 prev = atomicCAS(word, cur, cur | STRATA_HISTORY);
                if (prev == cur) {
                    atomicAdd(word, 0ull - STRATA_PIN_ONE);
                    return PIN_HOST;
                }
                cur = prev;
                continue;
            }
            strata_u64 claimed = (cur & ~STRATA_STATE_MASK) | (STRATA_LOADING << STRATA_STATE_SHIFT);
            strata_u64 prev = atomicCAS(word, cur, claimed);
            if (prev == cur) return PIN_CLAIMED;
            cur = prev;
        }
    }
    atomicAdd(word, 0ull - STRATA_PIN_ONE);
    return PIN_BUSY;
}

// Takes a frame for `page` by a clock sweep (leader lane only). Returns the frame, or
// STRATA_NO_PAGE when every frame stayed pinned for the whole sweep. `victim` is the page
// evicted from it (STRATA_NO_PAGE if the frame was free), `victim_dirty` whether it needs
// writing back, `victim_word` the EVICTING word installed (less any pins added since).
// writing back. The victim's page word is left EVICTING.
__device__ strata_u32 take_frame(const StrataSpace& s, strata_u32 page, strata_u32* victim,
                                 bool* victim_dirty, strata_u64* victim_word) {
    const strata_u32 n = s.frame_count;
    const bool scan_resistant = (s.policy & STRATA_POLICY_KIND_MASK) == STRATA_POLICY_SCAN_RESISTANT;
    const strata_u64 max_steps = (strata_u64)n * 3 + 64;
    // Scan-resistant clocks: protected ageing counts epochs of n faults; probationary second
    // chances count ticks of 2^STRATA_TICK_SHIFT faults and last half the probationary
    // segment's turnover. Both are read once per sweep.
    const strata_u64 faults_now = scan_resistant ? load_volatile(&s.counters->lifetime_faults) : 0;
    const strata_u32 epoch = (strata_u32)(faults_now / n) & 0xFFFFu;
    const strata_u32 tick = (strata_u32)(faults_now >> STRATA_TICK_SHIFT) & 0xFFFFu;
    const strata_u32 probation = n - (s.protected_quota < n ? s.protected_quota : n - 1);
    const strata_u32 min_age_ticks = (probation / 2) >> STRATA_TICK_SHIFT;
    // Young probationary frames are passed over at most this many times per sweep: with many
    // warps faulting at once most of the segment is young or pinned, and a long search costs
    // more (every step is an atomic on the hand) than an early eviction.
    unsigned young_skips = 0;
    // The last lap (steps from 2n on) takes any unpinned frame, protected or young: a sweep
    // that finds every unpinned frame protected (warps whose pins fill the probationary
    // segment) must still return one, or those warps would wait for ageing that only faults
    // bring. So every fault makes progress while some frame is unpinned.
    const strata_u64 last_lap = (strata_u64)n * 2;
    for (strata_u64 step = 0; step < max_steps; ++step) {
        const bool last_resort = step >= last_lap;
        strata_u32 f = atomicAdd(&s.counters->clock_hand, 1u) % n;
        StrataFrame* fr = &s.frames[f];
        strata_u32 owner = load_volatile(&fr->page);
        if (owner == STRATA_NO_PAGE) {
            if (atomicCAS(&fr->page, STRATA_NO_PAGE, page) == STRATA_NO_PAGE) {
                *victim = STRATA_NO_PAGE;
                *victim_dirty = false;
                return f;
            }
            continue;
        }
        strata_u32 flags = load_volatile(&fr->flags);
        if (scan_resistant && !last_resort) {
            const strata_u32 stamp = (flags & STRATA_STAMP_MASK) >> STRATA_STAMP_SHIFT;
            if (flags & STRATA_FRAME_PROTECTED) {
                if (flags & STRATA_FRAME_REF) {
                    // Referenced: refresh its stamp.
                    atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) | (epoch << STRATA_STAMP_SHIFT));
                } else if (((epoch - stamp) & 0xFFFFu) > STRATA_AGE_EPOCHS) {
                    // Unused for too long: back to the probationary part, with a fresh second
                    // chance there.
                    if (atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_PROTECTED | STRATA_STAMP_MASK)) |
                                                         (tick << STRATA_STAMP_SHIFT)) == flags)
                        atomicSub(&s.counters->protected_now, 1u);
                }
                continue;
            }
            if (flags & STRATA_FRAME_REF) {
                // Re-referenced (or faulted again after an earlier stay): protect it if there is
                // room, else give it a second chance.
                const strata_u32 promoted = (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) |
                                            STRATA_FRAME_PROTECTED | (epoch << STRATA_STAMP_SHIFT);
                if (atomicAdd(&s.counters->protected_now, 1u) < s.protected_quota) {
                    if (atomicCAS(&fr->flags, flags, promoted) != flags) atomicSub(&s.counters->protected_now, 1u);
                } else {
                    // Segment full: a second chance that lasts min_age_ticks of faults.
                    atomicSub(&s.counters->protected_now, 1u);
                    atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) | (tick << STRATA_STAMP_SHIFT));
                }
                continue;
            }
            // Too young to evict, unless a whole lap found nothing older (progress first).
            if (young_skips < 8 && ((tick - stamp) & 0xFFFFu) < min_age_ticks) {
                ++young_skips;
                continue;
            }
        } else if (!scan_resistant && (flags & STRATA_FRAME_REF)) {
            atomicAnd(&fr->flags, ~STRATA_FRAME_REF);  // second chance
            continue;
        }
        strata_u64* vword = &s.page_table[owner];
        strata_u64 w = load_volatile(vword);
        if (state_of(w) != STRATA_RESIDENT || (w & STRATA_FRAME_MASK) != f || (w & STRATA_PIN_MASK))
            continue;
        strata_u64 evicting = (w & ~STRATA_STATE_MASK) | (STRATA_EVICTING << STRATA_STATE_SHIFT);
        if (atomicCAS(vword, w, evicting) != w) continue;
        // Optimistic readers re-read the word after reading the frame, so the EVICTING mark
        // must be visible before any byte of the frame is overwritten: serve_fault fences
        // after this and before the copy into the frame.
        *victim = owner;
        *victim_word = evicting;
        *victim_dirty = (w & STRATA_DIRTY) != 0;
        return f;
    }
    return STRATA_NO_PAGE;
}

// Warp-cooperative copy of one page with 16-byte loads, eight in flight per lane.
__device__ __forceinline__ void warp_copy(unsigned char* dst, const unsigned char* src,
                                          strata_u64 bytes, unsigned lane, unsigned lanes_mask) {
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    const strata_u64 vecs = bytes / 16;
    const unsigned nl = __popc(lanes_mask);
    const unsigned rank = __popc(lanes_mask & ((1u << lane) - 1u));
    strata_u64 i = rank;
    for (; i + 7 * nl < vecs; i += 8 * nl) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __ldcg(s + i + k * nl);
#pragma unroll
        for (int k = 0; k < 8; ++k) __stcg(d + i + k * nl, v[k]);
    }
    for (; i < vecs; i += nl) __stcg(d + i, __ldcg(s + i));
}

// The whole warp serves the fault that lane `leader` claimed for `page` of the leader's space
// (lanes of the warp may be using other spaces: every lane copies with the leader's pointers).
// `write` and `prefetch` count on the leader. Returns the frame, or STRATA_NO_PAGE (the claim is
// undone) when no frame could be taken.
__device__ strata_u32 serve_fault(const StrataSpace& s, strata_u64 page, unsigned leader,
                                  unsigned lane, unsigned mask, bool write, bool prefetch) {
    strata_u32 frame = 0, victim = STRATA_NO_PAGE;
    strata_u64 victim_word = 0;
    bool dirty = false;
    strata_u64 t0 = 0;
    if (lane == leader) {
        t0 = now_ns();
        frame = take_frame(s, (strata_u32)page, &victim, &dirty, &victim_word);
        // Ordering point (acquire): this fence after the leader's claims (the page's LOADING
        // CAS in try_pin, the frame's NO_PAGE CAS or the victim's EVICTING CAS in take_frame)
        // makes them acquire operations. It pairs with the release of whoever touched those
        // bytes last: an evictor's fence before retiring this page (its written-back host copy,
        // read below), and the victim's holders' unpin_release (the frame bytes written back
        // below). The __syncwarp after it carries the order to the lanes that copy.
        fence_acq_rel();
    }
    __syncwarp(mask);
    frame = __shfl_sync(mask, frame, leader);
    victim = __shfl_sync(mask, victim, leader);
    dirty = __shfl_sync(mask, (int)dirty, leader) != 0;
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    unsigned char* const frame_data = (unsigned char*)__shfl_sync(mask, (strata_u64)s.frame_data, leader);
    const strata_u64 ps = 1ull << shift;
    if (frame == STRATA_NO_PAGE) {
        if (lane == leader) {
            // Undo the claim: back to NOT_RESIDENT, drop the claim's pin.
            atomicAdd(&s.page_table[page], 0ull - (STRATA_LOADING << STRATA_STATE_SHIFT) - STRATA_PIN_ONE);
            atomicAdd(&s.counters->no_frame_retries, 1ull);
        }
        return STRATA_NO_PAGE;
    }
    unsigned char* fdata = frame_data + (strata_u64)frame * ps;
    if (victim != STRATA_NO_PAGE && dirty) {
        warp_copy(host + ((strata_u64)victim << shift), fdata, ps, lane, mask);
        __syncwarp(mask);
        if (lane == leader) {
            // GPU scope is enough: only this GPU reads the host copy while kernels run (a kernel's
            // end makes it visible to the CPU), and a system-scope fence would wait for every
            // posted PCIe write of the page on each eviction.
            __threadfence();
            atomicAdd(&s.counters->writebacks, 1ull);
            atomicAdd(&s.counters->bytes_out, ps);
        }
    }
    if (lane == leader) {
        if (victim != STRATA_NO_PAGE) {
            s.frames[frame].page = (strata_u32)page;
            __threadfence();
            // Victim back to NOT_RESIDENT, frame and dirty cleared; transient pins and the
            // history bit stay.
            retire_evicting_word(&s.page_table[victim], victim_word);
            atomicAdd(&s.counters->evictions, 1ull);
        }
        // Clock: a new page starts referenced. Scan-resistant: only a page seen before does,
        // and every new page is stamped with the fault tick (its probationary age starts now).
        const bool seen = (load_volatile(&s.page_table[page]) & STRATA_HISTORY) != 0;
        const strata_u32 tick =
            (strata_u32)(load_volatile(&s.counters->lifetime_faults) >> STRATA_TICK_SHIFT) & 0xFFFFu;
        const strata_u32 fresh = (s.policy & STRATA_POLICY_KIND_MASK) == STRATA_POLICY_CLOCK
                                     ? STRATA_FRAME_REF
                                     : (seen ? STRATA_FRAME_REF : 0u) | (tick << STRATA_STAMP_SHIFT);
        strata_u32 before = atomicExch(&s.frames[frame].flags, fresh);
        if (before & STRATA_FRAME_PROTECTED) atomicSub(&s.counters->protected_now, 1u);
    }
    __syncwarp(mask);
    warp_copy(fdata, host + (page << shift), ps, lane, mask);
    __syncwarp(mask);
    if (lane == leader) {
        // Ordering point (release): the copy-in (ordered to the leader by the __syncwarp above)
        // before the publishing add; pairs with pin_acquire and load_acquire of readers.
        __threadfence();
        // LOADING -> RESIDENT, the frame, and the history bit (set only by publishers, so
        // adding it when clear is the same as or-ing it).
        const strata_u64 w = load_volatile(&s.page_table[page]);
        strata_u64 publish = (1ull << STRATA_STATE_SHIFT) + frame + (write ? STRATA_DIRTY : 0ull) +
                             ((w & STRATA_HISTORY) ? 0ull : STRATA_HISTORY);
        atomicAdd(&s.page_table[page], publish);
        atomicAdd(&s.counters->faults, 1ull);
        atomicAdd(&s.counters->lifetime_faults, 1ull);
        atomicAdd(&s.counters->bytes_in, ps);
        if (prefetch) atomicAdd(&s.counters->prefetched, 1ull);
        strata_u64 dt = now_ns() - t0;
        atomicAdd(&s.counters->fault_ns_total, dt);
        atomicMax(&s.counters->fault_ns_max, dt);
    }
    return frame;
}

}  // namespace detail

// A pinned page: what acquire() returns. `data` points at the page's frame in GPU memory, or
// (read-through, `host`) at its bytes in the pinned host copy, with no pin held. When `ok` is
// false the access failed (page out of range, or no frame within the wait limit): the error is
// recorded for the host's check_errors(), nothing is pinned, and `data` points at a scratch page
// of the space whose bytes mean nothing (writes there are lost, reads return garbage).
struct PageRef {
    unsigned char* data;
    strata_u64 page;
    unsigned peers;   // lanes sharing this pin
    unsigned leader;  // the lane that holds it
    bool host;        // nothing to unpin: served from the host copy, or failed
    bool ok;          // false: failed, see above
};

// What a kernel may hold at once (the rules that guarantee forward progress):
//  - A warp holds the pages of at most one acquire()/acquire_page() call at a time: release
//    them before acquiring again. One call pins at most 32 pages (one per distinct
//    (space, page) of its lanes).
//  - In each space, the pins that all warps running at once hold together must be fewer than
//    the cache's frames. The scan-resistant policy needs no extra room (a sweep that finds only
//    protected frames unpinned evicts one of them).
//  - Element access (Array) holds no pin while it waits and needs only a cache of 2 frames.
// Within these rules every access completes. Beyond them (more pins than frames, a warp that
// keeps pages while acquiring more), a warp that waits longer than the space's wait limit
// (Space::set_wait_limit, 4 s by default) gives up: STRATA_ERR_NO_FRAME is recorded with the
// page, the access fails (PageRef::ok false; element reads return 0, writes are dropped), and
// the host's check_errors() returns the error. No GPU wait is unbounded.

// Warp-collective over the calling lanes: every calling lane gets its page pinned. Lanes with
// the same (space, page) share one pin, which is a writing one if any of them writes. Lanes
// may differ in space, page and write. Faults are served by this warp. `prefetch` only labels
// the statistics. A page index past the end records STRATA_ERR_PAGE_OUT_OF_RANGE and fails.
__device__ __forceinline__ PageRef acquire_page(const StrataSpace& s, strata_u64 page, bool write,
                                                bool prefetch = false) {
    const unsigned mask = __activemask();
    const unsigned lane = detail::lane_id();
    const bool in_range = page < s.pages;
    if (!in_range) detail::report_error(s, STRATA_ERR_PAGE_OUT_OF_RANGE, page);
    // Groups are (space, page): lanes of different spaces never share a pin or a frame.
    const unsigned peers = __match_any_sync(mask, in_range ? page : ~0ull) & detail::space_peers(mask, s);
    const unsigned leader = __ffs(peers) - 1;
    const bool is_leader = in_range && lane == leader;
    // A group pins for writing if any of its lanes writes (else the page is never marked dirty
    // and the other lanes' writes are dropped on eviction).
    const bool group_write = (__ballot_sync(mask, write) & peers) != 0;
    strata_u32 frame = 0;
    unsigned pending = __ballot_sync(mask, is_leader);
    unsigned sleep_ns = 64;
    unsigned idle_rounds = 0;
    unsigned hits_here = 0;
    unsigned via_host = 0;  // leaders served from the host copy (they hold no pin)
    unsigned failed = 0;    // leaders that gave up (wait limit)
    strata_u64 waiting_since = 0;
    const bool read_through = !group_write && !prefetch && (s.policy & STRATA_POLICY_READ_THROUGH);
    while (pending) {
        int status = detail::PIN_NONE;
        if (is_leader && ((pending >> lane) & 1u))
            status = detail::try_pin(s, page, group_write, &frame, read_through);
        const unsigned hit = __ballot_sync(mask, status == detail::PIN_HIT);
        unsigned claimed = __ballot_sync(mask, status == detail::PIN_CLAIMED);
        const unsigned hosted = __ballot_sync(mask, status == detail::PIN_HOST);
        via_host |= hosted;
        hits_here += __popc(hit);
        pending &= ~(hit | hosted);
        bool starved = false;
        unsigned served = hosted;
        while (claimed) {
            const unsigned l = __ffs(claimed) - 1;
            claimed &= claimed - 1;
            const strata_u64 p = __shfl_sync(mask, page, l);
            const strata_u32 f = detail::serve_fault(s, p, l, lane, mask, group_write, prefetch);
            if (f == STRATA_NO_PAGE) {
                starved = true;
            } else {
                if (lane == l) frame = f;
                pending &= ~(1u << l);
                served |= 1u << l;
            }
        }
        idle_rounds = (hit | served) ? 0 : idle_rounds + 1;
        if (starved || idle_rounds > 64) {
            // Every frame stayed pinned for a whole sweep, or we waited long on pages others
            // are moving. Drop this warp's pins so that warps needing frames we hold can
            // finish (no deadlock however small the cache), then try again after a pause.
            idle_rounds = 0;
            const unsigned held = __ballot_sync(mask, is_leader) & ~pending & ~via_host;
            if (is_leader && ((held >> lane) & 1u)) detail::unpin_release(&s.page_table[page]);
            pending |= held;
            hits_here = 0;
        }
        if (pending && (starved || !(hit | served))) {
            if (detail::wait_expired(s, mask, &waiting_since)) {
                // Bounded wait: the pending leaders give up and say why.
                if (is_leader && ((pending >> lane) & 1u)) detail::report_error(s, STRATA_ERR_NO_FRAME, page);
                failed = pending;
                break;
            }
            __nanosleep(sleep_ns);
            if (sleep_ns < 4096) sleep_ns *= 2;
        }
    }
    if (lane == __ffs(mask) - 1 && hits_here)
        detail::add_hits(s, hits_here);
    if (lane == __ffs(mask) - 1 && via_host) atomicAdd(&s.counters->read_through, (strata_u64)__popc(via_host));
    frame = __shfl_sync(mask, frame, leader);
    // Ordering point: the leader's pin_acquire (or its serve_fault, whose copy ends in a
    // __syncwarp) is ordered before every lane's loads of the frame by this barrier.
    __syncwarp(mask);
    PageRef r;
    r.ok = in_range && !((failed >> leader) & 1u);
    r.host = !r.ok || ((via_host >> leader) & 1u);
    r.data = !r.ok     ? detail::scratch_page(s)
             : r.host ? s.host + (page << s.page_shift)
                      : s.frame_data + ((strata_u64)frame << s.page_shift);
    r.page = page;
    r.peers = peers;
    r.leader = leader;
    return r;
}

// Drops the pin acquire_page() took. Call with the same lanes.
__device__ __forceinline__ void release_page(const StrataSpace& s, const PageRef& r) {
    __syncwarp(r.peers);
    if (detail::lane_id() == r.leader && !r.host) detail::unpin_release(&s.page_table[r.page]);
}

// Bulk access: acquire makes the page's bytes visible to this thread's ordinary loads (it
// fences, so no stale L1 line of an earlier page in the same frame is read).
__device__ __forceinline__ PageRef acquire(const StrataSpace& s, strata_u64 page, bool write) {
    PageRef r = acquire_page(s, page, write);
    __threadfence();
    return r;
}
__device__ __forceinline__ void release(const StrataSpace& s, const PageRef& r) { release_page(s, r); }

namespace detail {
// Element access: pins `page` for the calling lane's group, runs `op(frame_bytes)` on it and
// unpins, group by group as pages become resident. Unlike acquire_page, no pin is held while
// this warp waits for another page, so any cache of two or more frames makes progress however
// many distinct pages a warp touches. Lanes with `want` false ask for nothing but still help
// copy the pages the others fault on (a page copy is as fast as the lanes doing it). Groups are
// (space, page), writing if any lane writes. Returns false if this lane's access gave up (the
// wait limit passed; STRATA_ERR_NO_FRAME recorded) and `op` did not run.
template <typename Op>
__device__ __forceinline__ bool with_page(const StrataSpace& s, strata_u64 page, bool write, Op op,
                                          bool want = true) {
    const unsigned mask = __activemask();
    const unsigned lane = lane_id();
    const unsigned peers = __match_any_sync(mask, want ? page : ~0ull) & space_peers(mask, s);
    const unsigned leader = __ffs(peers) - 1;
    const bool is_leader = want && lane == leader;
    const bool group_write = (__ballot_sync(mask, want && write) & peers) != 0;
    unsigned pending = __ballot_sync(mask, is_leader);
    unsigned sleep_ns = 64;
    unsigned hits_here = 0;
    strata_u64 waiting_since = 0;
    while (pending) {
        strata_u32 frame = 0;
        int status = PIN_NONE;
        if (is_leader && ((pending >> lane) & 1u)) status = try_pin(s, page, group_write, &frame);
        const unsigned hit = __ballot_sync(mask, status == PIN_HIT);
        unsigned claimed = __ballot_sync(mask, status == PIN_CLAIMED);
        hits_here += __popc(hit);
        // Hits first: access and unpin before this warp serves any fault, so while it sweeps
        // for a frame it holds no pin at all.
        frame = __shfl_sync(mask, frame, leader);
        const bool mine = (hit >> leader) & 1u;
        // Ordering point: the leader's pin_acquire before the group's loads of the frame.
        __syncwarp(mask);
        if (mine) op(s.frame_data + ((strata_u64)frame << s.page_shift));
        __syncwarp(mask);
        if (mine && is_leader) unpin_release(&s.page_table[page]);
        unsigned ready = hit;
        // Then each claimed page: serve, access, unpin, one at a time (at most one frame held).
        while (claimed) {
            const unsigned l = __ffs(claimed) - 1;
            claimed &= claimed - 1;
            const strata_u64 p = __shfl_sync(mask, page, l);
            const strata_u32 f = serve_fault(s, p, l, lane, mask, group_write, false);
            if (f != STRATA_NO_PAGE) {
                ready |= 1u << l;
                if (leader == l) op(s.frame_data + ((strata_u64)f << s.page_shift));
                __syncwarp(mask);
                if (lane == l) unpin_release(&s.page_table[p]);
            }
        }
        pending &= ~ready;
        if (pending && !ready) {
            if (wait_expired(s, mask, &waiting_since)) {
                if (is_leader && ((pending >> lane) & 1u)) report_error(s, STRATA_ERR_NO_FRAME, page);
                if (lane == __ffs(mask) - 1 && hits_here) add_hits(s, hits_here);
                return !((pending >> leader) & 1u) || !want;
            }
            __nanosleep(sleep_ns);
            if (sleep_ns < 4096) sleep_ns *= 2;
        }
    }
    if (lane == __ffs(mask) - 1 && hits_here)
        add_hits(s, hits_here);
    return true;
}
}  // namespace detail

__device__ __forceinline__ strata_u64 page_bytes(const StrataSpace& s) { return 1ull << s.page_shift; }
__device__ __forceinline__ strata_u64 page_count(const StrataSpace& s) { return s.pages; }

// ---- optimistic reads: no atomic on a hit ------------------------------------------------------
// A pin costs two atomics on the page's word, and under skew every SM's warps aim them at the
// same few hot words, which serialise in L2. A reader that only reads can skip the pin: read
// the word (acquire), read the bytes from its frame, then check that the word still shows the
// page resident in that frame with the same version. An evictor marks the word EVICTING (and
// fences) before any byte of the frame is overwritten, and a page evicted and reloaded into the
// same frame comes back with a new version, so a reader that passes the check read this page's
// bytes; one that fails discards them and takes the pinned path. (The version has 8 bits: a
// reader would have to stall across 256 evict-and-reload cycles of its own page to be fooled.)
//
//   strata::PageView v = strata::view_page(s, page);
//   if (v.resident) { x = __ldcg(v.data + off); ... }     // ordinary L2 loads
//   if (strata::view_valid(s, v)) { use x; ++hits; } else { acquire_page(...) as usual }
//   ...
//   strata::count_hits(s, hits);                          // once per warp at the end
//
// Writes and atomics keep pinning: a write must not land in a frame being written back.
struct PageView {
    const unsigned char* data;  // the page's frame (meaningful when resident)
    strata_u64 page;
    strata_u64 word;            // the page-table word as first read
    bool resident;
};

// A page index past the end records STRATA_ERR_PAGE_OUT_OF_RANGE and gives a view that is not
// resident (pointing at the scratch page), whose view_valid is false.
__device__ __forceinline__ PageView view_page(const StrataSpace& s, strata_u64 page) {
    PageView v;
    v.page = page;
    if (page >= s.pages) {
        detail::report_error(s, STRATA_ERR_PAGE_OUT_OF_RANGE, page);
        v.word = 0;
        v.resident = false;
        v.data = detail::scratch_page(s);
        return v;
    }
    // Ordering point: an acquire load, paired with the publisher's release (serve_fault's fence
    // before its publishing add), so the frame bytes read after it are the published ones.
    v.word = detail::load_acquire(&s.page_table[page]);
    v.resident = detail::state_of(v.word) == STRATA_RESIDENT;
    v.data = s.frame_data + ((v.word & STRATA_FRAME_MASK) << s.page_shift);
    return v;
}

// True if every byte this thread read from `v.data` since view_page belongs to the page (it
// stayed in its frame throughout); sets the frame's reference bit then. False: discard them.
__device__ __forceinline__ bool view_valid(const StrataSpace& s, const PageView& v) {
    if (!v.resident) return false;
    detail::fence_acq_rel();  // the frame loads complete before the word is read again
    if (!detail::same_residency(v.word, detail::load_relaxed(&s.page_table[v.page]))) {
        atomicAdd(&s.counters->optimistic_retries, 1ull);
        return false;
    }
    detail::touch_frame(s, (strata_u32)(v.word & STRATA_FRAME_MASK));
    return true;
}

// Adds hits the caller served through view_page/view_valid to the statistics (call rarely,
// e.g. once per warp: it is an atomic).
__device__ __forceinline__ void count_hits(const StrataSpace& s, strata_u64 n) {
    if (n) detail::add_hits(s, n);
}

namespace detail {
template <typename T, int N = sizeof(T)> struct Bits;
template <typename T> struct Bits<T, 4> { typedef unsigned int type; };
template <typename T> struct Bits<T, 8> { typedef strata_u64 type; };

// Loads through L2 only: frames are reused by other pages, and L1 is not coherent.
template <typename T> __device__ __forceinline__ T load_cg(const T* p) {
    typedef typename Bits<T>::type B;
    B b = __ldcg((const B*)p);
    union { B b; T t; } u;
    u.b = b;
    return u.t;
}
// An acquire load of one element: the page word's re-read after it cannot pass it.
template <typename T> __device__ __forceinline__ T load_acquire_elem(const T* p) {
    typedef typename Bits<T>::type B;
    B b;
    if (sizeof(B) == 8) {
        strata_u64 x;
        asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(p) : "memory");
        b = (B)x;
    } else {
        unsigned x;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
        b = (B)x;
    }
    union { B b; T t; } u;
    u.b = b;
    return u.t;
}
template <typename T> __device__ __forceinline__ T atomic_add_elem(T* p, T v) { return atomicAdd(p, v); }
template <> __device__ __forceinline__ long long atomic_add_elem<long long>(long long* p, long long v) {
    return (long long)atomicAdd((strata_u64*)p, (strata_u64)v);
}
}  // namespace detail

// A typed view of a space. Elements must be 4 or 8 bytes (pages are powers of two, so an
// element never straddles two pages).
template <typename T> struct Array {
    StrataSpace s;
    __device__ explicit Array(const StrataSpace& space) : s(space) {}

    __device__ __forceinline__ strata_u64 size() const { return s.size_bytes / sizeof(T); }

    __device__ __forceinline__ T read(strata_u64 i) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return T(0);
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        const strata_u64 page = byte >> s.page_shift;
        // Optimistic hit first (no atomic; see view_page), the pinned path if the page is not
        // resident or moved while we read.
        T v = T(0);
        bool done = false;
        const strata_u64 w = detail::load_acquire(&s.page_table[page]);
        if (detail::state_of(w) == STRATA_RESIDENT) {
            const strata_u32 frame = (strata_u32)(w & STRATA_FRAME_MASK);
            v = detail::load_acquire_elem((const T*)(s.frame_data + ((strata_u64)frame << s.page_shift) + off));
            done = detail::same_residency(w, detail::load_relaxed(&s.page_table[page]));
            if (done) detail::touch_frame(s, frame);
            else atomicAdd(&s.counters->optimistic_retries, 1ull);
        }
        // Statistics as the pinned path counts them: one hit per group of lanes on one page.
        const unsigned mask = __activemask();
        const unsigned lane = detail::lane_id();
        const unsigned ok = __ballot_sync(mask, done);
        const unsigned same_space = detail::space_peers(mask, s);
        const unsigned group = __match_any_sync(mask, page) & same_space & ok;
        const unsigned leaders = __ballot_sync(mask, done && lane == __ffs(group) - 1) & same_space;
        if (leaders && lane == __ffs(same_space) - 1) detail::add_hits(s, __popc(leaders));
        // The whole warp enters the pinned path if any lane needs it, so faults are copied by
        // every lane rather than by the few that missed.
        if (ok != mask)
            detail::with_page(
                s, page, false, [&](unsigned char* f) { v = detail::load_cg((const T*)(f + off)); }, !done);
        return v;
    }

    __device__ __forceinline__ void write(strata_u64 i, T v) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return;
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        typedef typename detail::Bits<T>::type B;
        detail::with_page(s, byte >> s.page_shift, true,
                          [&](unsigned char* f) { __stcg((B*)(f + off), *(const B*)&v); });
    }

    // Atomic add (int, unsigned, long long, unsigned long long, float, double); returns the old
    // value. Atomics act in L2, so concurrent adders on other SMs see each other.
    __device__ __forceinline__ T atomic_add(strata_u64 i, T v) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return T(0);
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        T old = T(0);
        detail::with_page(s, byte >> s.page_shift, true,
                          [&](unsigned char* f) { old = detail::atomic_add_elem((T*)(f + off), v); });
        return old;
    }
};

}  // namespace strata
