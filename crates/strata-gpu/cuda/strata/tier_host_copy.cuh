// strata/tier_host_copy.cuh: the host-copy tier. The whole space sits in pinned host memory
// mapped into the GPU (`StrataSpace::host`); a fault copies the page straight from it, and a
// dirty victim is written straight back, in the same pass (both directions of the link busy).
// Nothing on the host runs while kernels do: only this GPU reads the copy until a kernel ends.
#pragma once

namespace strata {
namespace detail {

// Warp-collective (every lane of `mask`, with `leader`'s space). Writes `victim`'s bytes from
// `frame` back (if victim != STRATA_NO_PAGE) and loads `page` into `frame`. With sub-page fetch
// (sectors.cuh) only the victim's held sectors go back and only `load_sectors` come in (the
// leader's masks). Cannot fail.
__device__ __forceinline__ int host_copy_exchange(const StrataSpace& s, strata_u64 victim, strata_u64 page,
                                                  unsigned char* frame, unsigned lane, unsigned mask,
                                                  unsigned leader, strata_u32 victim_sectors = 0xFFFFFFFFu,
                                                  strata_u32 load_sectors = 0xFFFFFFFFu) {
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    const strata_u32 sshift = __shfl_sync(mask, sector_shift(s), leader);
    const strata_u64 ps = 1ull << shift;
    const strata_u32 all = sshift ? all_sectors(shift, sshift) : 0xFFFFFFFFu;
    victim_sectors = __shfl_sync(mask, victim_sectors, leader) & all;
    load_sectors = __shfl_sync(mask, load_sectors, leader) & all;
    if (victim_sectors == all && load_sectors == all) {
        if (victim != STRATA_NO_PAGE)
            warp_swap_copy(frame, host + (victim << shift), host + (page << shift), ps, lane, mask);
        else
            warp_copy(frame, host + (page << shift), ps, lane, mask);
        return 0;
    }
    exchange_sectors(frame, host + (victim << shift), host + (page << shift),
                     victim != STRATA_NO_PAGE ? victim_sectors : 0u, load_sectors, sshift, lane, mask);
    return 0;
}

// Warp-collective: writes `frame`'s bytes back as `page`'s (with sub-page fetch, the sectors
// in `sectors` only: the others are current in the host copy already). Cannot fail.
__device__ __forceinline__ bool host_copy_write_back(const StrataSpace& s, strata_u64 page,
                                                     const unsigned char* frame, unsigned lane,
                                                     unsigned mask, unsigned leader,
                                                     strata_u32 sectors = 0xFFFFFFFFu) {
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    const strata_u32 sshift = __shfl_sync(mask, sector_shift(s), leader);
    const strata_u32 all = sshift ? all_sectors(shift, sshift) : 0xFFFFFFFFu;
    sectors = __shfl_sync(mask, sectors, leader) & all;
    if (sectors == all)
        warp_copy(host + (page << shift), frame, 1ull << shift, lane, mask);
    else
        exchange_sectors((unsigned char*)frame, host + (page << shift), nullptr, sectors, 0u, sshift, lane, mask);
    return true;
}

}  // namespace detail
}  // namespace strata
