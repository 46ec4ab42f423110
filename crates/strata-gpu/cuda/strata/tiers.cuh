// strata/tiers.cuh: the tier chain under the GPU cache. The fault path asks only these two
// calls; each space's `tier` says which chain serves them. A new tier is a header of its own
// with an exchange and a write-back, and one line in each switch below.
#pragma once

namespace strata {
namespace detail {

enum TierStatus { TIER_OK = 0, TIER_WRITE_FAILED = 1, TIER_LOAD_FAILED = 2 };

// Warp-collective (every lane of `mask`, with `leader`'s space): `victim` (STRATA_NO_PAGE if
// the frame was free) leaves `frame` (written down if `victim_dirty`), then `page` is loaded
// into `frame`. A space with a peer tier asks it first (it sits above the host copy).
// TIER_WRITE_FAILED: nothing was written and `frame` still holds the victim.
// TIER_LOAD_FAILED: the victim is safely down, `frame` holds no page. Failures are recorded.
// `victim_sectors` and `load_sectors` (sub-page fetch, sectors.cuh) are the sectors the victim
// holds and those to load; only the host-copy tier has sectors (SpaceOptions refuses others).
__device__ __forceinline__ int tier_exchange(const StrataSpace& s, strata_u64 victim, bool victim_dirty,
                                             strata_u64 page, unsigned char* frame, unsigned lane,
                                             unsigned mask, unsigned leader,
                                             strata_u32 victim_sectors = 0xFFFFFFFFu,
                                             strata_u32 load_sectors = 0xFFFFFFFFu) {
    if (__shfl_sync(mask, (strata_u64)s.peer, leader) != 0)
        return peer_exchange(s, victim, victim_dirty, page, frame, lane, mask, leader);
    const strata_u64 down = victim_dirty ? victim : STRATA_NO_PAGE;
    switch (__shfl_sync(mask, s.tier, leader)) {
    case STRATA_TIER_RING: return ring_exchange(s, down, page, frame, lane, mask, leader);
    default: return host_copy_exchange(s, down, page, frame, lane, mask, leader, victim_sectors, load_sectors);
    }
}

// Warp-collective: writes `frame`'s bytes down as `page`'s (flush, evict; with sub-page fetch
// the held `sectors`). False: failed and recorded; the caller keeps the page dirty where it is.
__device__ __forceinline__ bool tier_write_back(const StrataSpace& s, strata_u64 page, const unsigned char* frame,
                                                unsigned lane, unsigned mask, unsigned leader,
                                                strata_u32 sectors = 0xFFFFFFFFu) {
    switch (__shfl_sync(mask, s.tier, leader)) {
    case STRATA_TIER_RING: return ring_write_back(s, page, frame, lane, mask, leader);
    default: return host_copy_write_back(s, page, frame, lane, mask, leader, sectors);
    }
}

}  // namespace detail
}  // namespace strata
