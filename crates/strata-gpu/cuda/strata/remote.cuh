// strata/remote.cuh: the per-page access mode of element accesses (strata::Array). A page that
// is not in a GPU frame is read and written in place in the host copy, over the bus, one
// element at a time, until it has earned a frame: then the next access migrates it as a fault
// always did. A page touched a few times between evictions so costs a few bus round trips
// instead of a whole page in and a dirty page out, and a page that is reused pays its
// migration once.
//
// The record lives in the page word itself while the page is not resident (the frame bits are
// free then; layout.cuh): an access count, the epoch it was last counted in, and the remote
// writers in flight. Hits never touch it. Counting is one compare-and-swap on the word, which
// also proves the page was not resident at that instant, so the host copy was current then
// (reads sample it; see try_remote).
//
// Coherence with migration:
//  - A remote writer raises the writers field in that same compare-and-swap, writes the host
//    copy, and drops the field with a release. A fault claims a page only when no writer is in
//    flight (try_pin), and its copy-in runs after an acquire that sees the field drop, so the
//    frame holds every remote write made before the claim.
//  - The compare-and-swap is an acquire: it orders the remote access after the write-back of
//    the page's last eviction (the evictor fences before retiring the page), so a remote write
//    is never overwritten by an older write-back, and a remote read sees the newest bytes.
//  - Reads need no writers count and no atomic: a read whose acquire load of the word saw the
//    page not resident reads bytes that were current at that instant (the last eviction's
//    write-back was ordered before the page was retired), so it is ordered before any later
//    write through a frame.
// A count halves for each epoch it was not touched in (remote_epoch: epochs follow the accesses
// served in place, so what counts is a page's share of them). While the cache has free frames
// a page migrates on its second access: filling a frame evicts nothing.
//
// Only spaces whose lower tier is a full host copy serve accesses remotely (STRATA_TIER_RING's
// host cache holds some pages only). With a peer tier, reads go remote but writes migrate: a
// write in place would leave a stale clean copy in a peer slot. Unified allocations do the same
// (STRATA_MIGRATE_READS_ONLY): a pointer chase by one thread reads each hop over the bus
// instead of copying a whole page with one lane (about 0.5 ms per 64 KiB page).
#pragma once

namespace strata {
namespace detail {

enum RemoteAnswer { REMOTE_NO = 0, REMOTE_SERVED = 1 };

// Remote reads count one access in this many (adding this many), to spare atomics.
#define STRATA_REMOTE_READ_SAMPLE 4u

__device__ __forceinline__ strata_u32 migrate_after(const StrataSpace& s) {
    return s.migrate_after & STRATA_MIGRATE_AFTER_MASK;
}
__device__ __forceinline__ bool remote_reads_on(const StrataSpace& s) {
    return migrate_after(s) != 0 && s.tier == STRATA_TIER_HOST_COPY;
}
// Unified allocations read in place but migrate on writes (STRATA_MIGRATE_READS_ONLY): their
// CPU-write tracker must see every GPU write as a write to a GPU frame.
__device__ __forceinline__ bool remote_writes_on(const StrataSpace& s) {
    return remote_reads_on(s) && s.peer == nullptr && !(s.migrate_after & STRATA_MIGRATE_READS_ONLY);
}

// The current epoch (8 bits). It advances with the accesses served in place: once per
// pages * migrate_after / 4 of them, so a page of average share gets about a quarter of the
// threshold per epoch and its count (halved each epoch) settles near half of it. Only a page
// at least twice as hot as the average page not resident reaches the threshold: when every
// page is about equally hot (uniform random access), none does, and the resident set stays
// put instead of churning for no gain.
__device__ __forceinline__ strata_u64 remote_epoch(const StrataSpace& s) {
    const unsigned shift = (63u - __clzll(s.pages | 1ull)) + (31u - __clz(migrate_after(s) | 1u)) - 2u;
    const strata_u64 served = load_relaxed(&s.counters->remote_reads) + load_relaxed(&s.counters->remote_writes);
    return (served >> shift) & 0xFFull;
}

// The threshold now: while frames are free, a page migrates on its second access (filling
// the cache costs no eviction), else after migrate_after.
__device__ __forceinline__ strata_u64 remote_threshold(const StrataSpace& s) {
    if (load_relaxed(&s.counters->free_frames) != 0) return 2;
    return migrate_after(s);
}

__device__ __forceinline__ strata_u64 cas_acquire(strata_u64* p, strata_u64 expected, strata_u64 desired) {
    strata_u64 old;
    asm volatile("atom.acquire.gpu.global.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(old)
                 : "l"(p), "l"(expected), "l"(desired)
                 : "memory");
    return old;
}

// Counts one element access to `page`, whose word was read as `w` (a read must have read it
// with acquire semantics), and says whether the caller may serve it in place in the host copy
// (REMOTE_SERVED; a writer then holds a writers count it drops with remote_write_done) or must
// take the frame path (REMOTE_NO: the page is resident or moving, its count reached
// migrate_after, or its word stayed too contended to count on).
//
// A writer counts with the compare-and-swap that registers it. A reader needs no atomic to be
// correct (its acquire load saw the page not resident, so the host copy was current then), so
// it counts only one access in STRATA_REMOTE_READ_SAMPLE, adding that many, once: remote reads
// cost one atomic in four on the page word instead of one each.
__device__ __forceinline__ int try_remote(const StrataSpace& s, strata_u64 page, strata_u64 w, bool write) {
    strata_u64* word = &s.page_table[page];
    const strata_u64 epoch = remote_epoch(s);
    const strata_u64 threshold = remote_threshold(s);
    const bool count_this = write || ((clock() >> 3) + lane_id()) % STRATA_REMOTE_READ_SAMPLE == 0;
    const strata_u64 add = write ? 1 : STRATA_REMOTE_READ_SAMPLE;
    // A failed compare-and-swap means another access to the page was counted (big pages see
    // many at once): try again with the word it saw. Only a word that keeps changing under
    // this many attempts sends the access to the frame path.
    for (int attempt = 0; attempt < 64; ++attempt) {
        if (state_of(w) != STRATA_NOT_RESIDENT) return REMOTE_NO;
        const strata_u64 stamp = (w & STRATA_REMOTE_EPOCH_MASK) >> STRATA_REMOTE_EPOCH_SHIFT;
        const strata_u64 idle = (epoch - stamp) & 0xFFull;
        strata_u64 count = w & STRATA_REMOTE_COUNT_MASK;
        count = idle >= 16 ? 0 : count >> idle;
        if (count + 1 >= threshold) return REMOTE_NO;
        if (!count_this) return REMOTE_SERVED;
        strata_u64 writers = w & STRATA_REMOTE_WRITERS_MASK;
        if (write) {
            if (writers == STRATA_REMOTE_WRITERS_MASK) return REMOTE_NO;
            writers += STRATA_REMOTE_WRITER_ONE;
        }
        const strata_u64 next_count = count + add < STRATA_REMOTE_COUNT_MASK ? count + add : STRATA_REMOTE_COUNT_MASK;
        const strata_u64 next = (w & ~STRATA_LOW_MASK) | writers | (epoch << STRATA_REMOTE_EPOCH_SHIFT) | next_count;
        const strata_u64 prev = write ? cas_acquire(word, w, next) : atomicCAS(word, w, next);
        if (prev == w || !write) return REMOTE_SERVED;  // a lost sampled count is only a count
        w = prev;
    }
    return REMOTE_NO;
}

// A remote writer is done: its store to the host copy is ordered before the writers count
// drops (a claim waits for zero).
__device__ __forceinline__ void remote_write_done(const StrataSpace& s, strata_u64 page) {
    const strata_u64 minus_one = 0ull - STRATA_REMOTE_WRITER_ONE;
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" : : "l"(&s.page_table[page]), "l"(minus_one) : "memory");
}

}  // namespace detail
}  // namespace strata
