// strata/policy_clock.cuh: clock with reference bits (second chance). A frame referenced since
// the hand last passed loses its reference bit and stays; an unreferenced one may go.
#pragma once

namespace strata {
namespace detail {

// The clock policy's verdict on the frame under the hand (leader lane, during a sweep).
__device__ __forceinline__ bool clock_may_evict(StrataFrame* fr, strata_u32 flags) {
    if (flags & STRATA_FRAME_REF) {
        atomicAnd(&fr->flags, ~STRATA_FRAME_REF);  // second chance
        return false;
    }
    return true;
}

}  // namespace detail
}  // namespace strata
