// strata/tier_ring.cuh: the ring tier of store-backed spaces. Below the GPU cache sits a bounded
// host cache in pinned memory; below that, any store, reached through a request ring that host
// threads serve (strata_gpu::ring). No kernel launch or driver call is on the path:
//  - a page in the host cache is copied straight from its slot, validated like a seqlock (the
//    slot word read before and after the copy must match; the host changes it before it reuses
//    a slot);
//  - a page not there is asked for with a READ request; the warp then waits, with back-off, on
//    the page's slot word (its completion word), re-asking if the page came and went;
//  - a dirty page on its way down is copied to the ticket's staging page and posted as a WRITE;
//    the warp waits for the ticket's done word, so the page is in the host cache before anyone
//    can fault it again, and a read posted later is served after it (tickets are handled in
//    order).
// Every wait is bounded by the space's wait limit; a store failure or a silent host becomes
// STRATA_ERR_STORE with the page, and the access fails instead of hanging.
#pragma once

namespace strata {
namespace detail {

// Claims a ticket and waits for its entry to be free (leader lane only). False: the host did
// not make room within the wait limit (the ticket is lost with the host).
__device__ __forceinline__ bool ring_claim(const StrataSpace& s, StrataRing* r, strata_u64* ticket) {
    const strata_u64 t = atomicAdd(&r->tail, 1ull);
    strata_u64 since = 0;
    unsigned sleep_ns = 128;
    while (t - load_relaxed_sys(r->head) >= r->capacity) {
        if (wait_expired_alone(s, &since)) return false;
        __nanosleep(sleep_ns);
        if (sleep_ns < 8192) sleep_ns *= 2;
    }
    // Ordering point: the host's consumption of the old entry (and its staging page) happens
    // before this warp overwrites them.
    fence_acq_rel_sys();
    *ticket = t;
    return true;
}

// Publishes ticket `t` (leader lane only): the fields, a system fence, then seq last.
__device__ __forceinline__ void ring_publish(StrataRing* r, strata_u64 t, strata_u64 page, strata_u32 kind) {
    StrataRequest* e = &r->entries[t & (r->capacity - 1)];
    *(volatile strata_u64*)&e->page = page;
    *(volatile strata_u32*)&e->kind = kind;
    __threadfence_system();
    store_release_sys(&e->seq, t + 1);
}

// Warp-collective: brings `page` from the host cache (asking the host for it first if it is not
// there) into `frame`. False: the store failed the page or the host did not answer in time
// (STRATA_ERR_STORE recorded).
__device__ bool ring_load(const StrataSpace& s, strata_u64 page, unsigned char* frame, unsigned lane,
                          unsigned mask, unsigned leader) {
    StrataRing* const r = (StrataRing*)__shfl_sync(mask, (strata_u64)s.ring, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    strata_u64* const word = &r->slot_words[page];
    strata_u32 asked_gen = 0xFFFFFFFFu;  // the generation seen when we last asked (none yet)
    strata_u64 since = 0;
    unsigned sleep_ns = 256;
    for (;;) {
        strata_u64 w = 0;
        if (lane == leader) w = load_acquire_sys(word);
        w = __shfl_sync(mask, w, leader);
        if (w & STRATA_SLOT_PRESENT) {
            const strata_u64 slot = w & STRATA_SLOT_INDEX_MASK;
            warp_copy(frame, r->slots + (slot << shift), 1ull << shift, lane, mask, LoadFresh());
            __syncwarp(mask);
            int same = 0;
            if (lane == leader) {
                // The copy's loads complete before the word is read again: equal words mean the
                // host did not start reusing the slot while we copied.
                fence_acq_rel_sys();
                same = load_relaxed_sys(word) == w;
                if (same) {
                    *(volatile unsigned char*)&r->slot_refs[slot] = 1;
                    atomicAdd(&s.counters->host_cache_loads, 1ull);
                }
            }
            if (__shfl_sync(mask, same, leader)) return true;
            continue;  // the slot moved under us: look again
        }
        if (w & STRATA_SLOT_ERROR) {
            if (lane == leader) report_error(s, STRATA_ERR_STORE, page);
            return false;
        }
        const strata_u32 gen = (strata_u32)(w >> STRATA_SLOT_GEN_SHIFT);
        if (gen != asked_gen) {
            // Not in the host cache, and not asked for since the word last changed: ask.
            int posted = 0;
            if (lane == leader) {
                strata_u64 t;
                posted = ring_claim(s, r, &t);
                if (posted) ring_publish(r, t, page, STRATA_REQ_READ);
                else report_error(s, STRATA_ERR_STORE, page);
            }
            if (!__shfl_sync(mask, posted, leader)) return false;
            asked_gen = gen;
            continue;
        }
        if (wait_expired(s, mask, &since)) {
            if (lane == leader) report_error(s, STRATA_ERR_STORE, page);
            return false;
        }
        __nanosleep(sleep_ns);
        if (sleep_ns < 8192) sleep_ns *= 2;
    }
}

// Warp-collective: sends `frame`'s bytes down as `page`'s new contents and waits until the host
// cache holds them. False: the host did not answer in time (STRATA_ERR_STORE recorded; the
// caller keeps the page where it is, dirty).
__device__ bool ring_write_back(const StrataSpace& s, strata_u64 page, const unsigned char* frame,
                                unsigned lane, unsigned mask, unsigned leader) {
    StrataRing* const r = (StrataRing*)__shfl_sync(mask, (strata_u64)s.ring, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    strata_u64 t = 0;
    int claimed = 0;
    if (lane == leader) {
        claimed = ring_claim(s, r, &t);
        if (!claimed) report_error(s, STRATA_ERR_STORE, page);
    }
    if (!__shfl_sync(mask, claimed, leader)) return false;
    t = __shfl_sync(mask, t, leader);
    const strata_u64 entry = t & (r->capacity - 1);
    warp_copy(r->staging + (entry << shift), frame, 1ull << shift, lane, mask);
    __syncwarp(mask);
    if (lane == leader) ring_publish(r, t, page, STRATA_REQ_WRITE);
    strata_u64 since = 0;
    unsigned sleep_ns = 256;
    for (;;) {
        int done = 0;
        if (lane == leader) done = load_acquire_sys(&r->done[entry]) >= t + 1;
        if (__shfl_sync(mask, done, leader)) return true;
        if (wait_expired(s, mask, &since)) {
            if (lane == leader) report_error(s, STRATA_ERR_STORE, page);
            return false;
        }
        __nanosleep(sleep_ns);
        if (sleep_ns < 8192) sleep_ns *= 2;
    }
}

// Warp-collective: `victim` (if not STRATA_NO_PAGE) down first, then `page` in.
__device__ __forceinline__ int ring_exchange(const StrataSpace& s, strata_u64 victim, strata_u64 page,
                                             unsigned char* frame, unsigned lane, unsigned mask,
                                             unsigned leader) {
    if (victim != STRATA_NO_PAGE && !ring_write_back(s, victim, frame, lane, mask, leader)) return 1;
    return ring_load(s, page, frame, lane, mask, leader) ? 0 : 2;
}

}  // namespace detail
}  // namespace strata
