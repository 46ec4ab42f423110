// strata/tiers.cuh: the tier chain under the GPU cache. The fault path asks only these two
// calls; each space's `tier` says which chain serves them. A new tier is a header of its own
// with an exchange and a write-back, and one line in each switch below.
#pragma once

namespace strata {
namespace detail {

enum TierStatus { TIER_OK = 0, TIER_WRITE_FAILED = 1, TIER_LOAD_FAILED = 2 };

// Warp-collective (every lane of `mask`, with `leader`'s space): writes `victim`'s bytes from
// `frame` down (when victim != STRATA_NO_PAGE, i.e. it was dirty), then loads `page` into
// `frame`. TIER_WRITE_FAILED: nothing was written and `frame` still holds the victim.
// TIER_LOAD_FAILED: the victim is safely down, `frame` holds no page. Failures are recorded.
__device__ __forceinline__ int tier_exchange(const StrataSpace& s, strata_u64 victim, strata_u64 page,
                                             unsigned char* frame, unsigned lane, unsigned mask,
                                             unsigned leader) {
    switch (__shfl_sync(mask, s.tier, leader)) {
    case STRATA_TIER_RING: return ring_exchange(s, victim, page, frame, lane, mask, leader);
    default: return host_copy_exchange(s, victim, page, frame, lane, mask, leader);
    }
}

// Warp-collective: writes `frame`'s bytes down as `page`'s (flush, evict). False: failed and
// recorded; the caller keeps the page dirty where it is.
__device__ __forceinline__ bool tier_write_back(const StrataSpace& s, strata_u64 page, const unsigned char* frame,
                                                unsigned lane, unsigned mask, unsigned leader) {
    switch (__shfl_sync(mask, s.tier, leader)) {
    case STRATA_TIER_RING: return ring_write_back(s, page, frame, lane, mask, leader);
    default: return host_copy_write_back(s, page, frame, lane, mask, leader);
    }
}

}  // namespace detail
}  // namespace strata
