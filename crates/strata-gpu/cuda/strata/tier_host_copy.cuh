// strata/tier_host_copy.cuh: the host-copy tier. The whole space sits in pinned host memory
// mapped into the GPU (`StrataSpace::host`); a fault copies the page straight from it, and a
// dirty victim is written straight back, in the same pass (both directions of the link busy).
// Nothing on the host runs while kernels do: only this GPU reads the copy until a kernel ends.
#pragma once

namespace strata {
namespace detail {

// Warp-collective (every lane of `mask`, with `leader`'s space). Writes `victim`'s bytes from
// `frame` back (if victim != STRATA_NO_PAGE) and loads `page` into `frame`. Cannot fail.
__device__ __forceinline__ int host_copy_exchange(const StrataSpace& s, strata_u64 victim, strata_u64 page,
                                                  unsigned char* frame, unsigned lane, unsigned mask,
                                                  unsigned leader) {
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    const strata_u64 ps = 1ull << shift;
    if (victim != STRATA_NO_PAGE)
        warp_swap_copy(frame, host + (victim << shift), host + (page << shift), ps, lane, mask);
    else
        warp_copy(frame, host + (page << shift), ps, lane, mask);
    return 0;
}

// Warp-collective: writes `frame`'s bytes back as `page`'s. Cannot fail.
__device__ __forceinline__ bool host_copy_write_back(const StrataSpace& s, strata_u64 page,
                                                     const unsigned char* frame, unsigned lane,
                                                     unsigned mask, unsigned leader) {
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    warp_copy(host + (page << shift), frame, 1ull << shift, lane, mask);
    return true;
}

}  // namespace detail
}  // namespace strata
