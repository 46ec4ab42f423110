// strata/primitives.cuh: the small operations everything else is built from: lane and clock
// reads, ordered loads and fences, page-word arithmetic (pins, retire), error reports, bounded
// waits, hit counting.
#pragma once

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
                        : flag == STRATA_ERR_STORE             ? &s.counters->store_error_page
                        : flag == STRATA_ERR_READ_ONLY         ? &s.counters->read_only_write_page
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

// The leader-only form of wait_expired, for waits one lane does alone (no warp vote).
__device__ __forceinline__ bool wait_expired_alone(const StrataSpace& s, strata_u64* since) {
    const strata_u64 t = now_ns();
    if (*since == 0) *since = t;
    return t - *since > load_volatile(&s.counters->wait_limit_ns);
}

// Loads and stores of words in pinned host memory that the host writes (or reads) while
// kernels run: system scope, so no stale L2 line is read and the host sees them in order.
__device__ __forceinline__ strata_u64 load_acquire_sys(const strata_u64* p) {
    strata_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ strata_u64 load_relaxed_sys(const strata_u64* p) {
    strata_u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_release_sys(strata_u64* p, strata_u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" : : : "memory"); }

__device__ __forceinline__ void add_hits(const StrataSpace& s, strata_u64 n) {
    atomicAdd(&s.counters->hits[(sm_id() % STRATA_HIT_SHARDS) * STRATA_SHARD_STRIDE], n);
}

__device__ __forceinline__ void touch_frame(const StrataSpace& s, strata_u32 frame) {
    // A space with a frame for every page never evicts for room, so its reference bits choose
    // no victim: skip the flags load (about a fifth of a resident random gather's time on an
    // H100, scripts/experiments/gather_anatomy.cu).
    if (s.frame_count >= s.pages) return;
    strata_u32* flags = &s.frames[frame].flags;
    if (!(load_volatile(flags) & STRATA_FRAME_REF)) atomicOr(flags, STRATA_FRAME_REF);
}

// Bucket of a fault service time in StrataCounters::fault_hist.
__device__ __forceinline__ unsigned fault_hist_bucket(strata_u64 ns) {
    if (ns < (1ull << STRATA_FAULT_HIST_MIN_LOG2)) return 0;
    const unsigned lg = 63u - __clzll(ns);
    const unsigned b = (lg - STRATA_FAULT_HIST_MIN_LOG2) * 4u + (unsigned)((ns >> (lg - 2)) & 3ull);
    return b < STRATA_FAULT_HIST_BUCKETS ? b : STRATA_FAULT_HIST_BUCKETS - 1;
}

}  // namespace detail
}  // namespace strata
