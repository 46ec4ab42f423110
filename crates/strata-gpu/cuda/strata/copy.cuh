// strata/copy.cuh: warp-cooperative page copies.
#pragma once

namespace strata {
namespace detail {

// How a copy loads its source. Through L2 (ld.cg): memory only this GPU writes while kernels
// run. Fetched again (ld.cv): memory the host writes while kernels run (the host cache), so no
// L1/L2 line left from an earlier read of the same bytes is used.
struct LoadCached {
    __device__ __forceinline__ uint4 operator()(const uint4* p) const { return __ldcg(p); }
};
struct LoadFresh {
    __device__ __forceinline__ uint4 operator()(const uint4* p) const { return __ldcv(p); }
};

// Warp-cooperative copy of one page with 16-byte loads, eight in flight per lane.
template <typename Load = LoadCached>
__device__ __forceinline__ void warp_copy(unsigned char* dst, const unsigned char* src,
                                          strata_u64 bytes, unsigned lane, unsigned lanes_mask,
                                          Load load = Load()) {
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    const strata_u64 vecs = bytes / 16;
    const unsigned nl = __popc(lanes_mask);
    const unsigned rank = __popc(lanes_mask & ((1u << lane) - 1u));
    strata_u64 i = rank;
    for (; i + 7 * nl < vecs; i += 8 * nl) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = load(s + i + k * nl);
#pragma unroll
        for (int k = 0; k < 8; ++k) __stcg(d + i + k * nl, v[k]);
    }
    for (; i < vecs; i += nl) __stcg(d + i, load(s + i));
}

// Writes `frame`'s bytes out to `out` and reads `in`'s into `frame` in one pass, chunk by
// chunk (each chunk of the frame is read before it is overwritten), so a fault that evicts a
// dirty page keeps both directions of the link busy at once instead of one after the other.
__device__ __forceinline__ void warp_swap_copy(unsigned char* frame, unsigned char* out, const unsigned char* in,
                                               strata_u64 bytes, unsigned lane, unsigned lanes_mask) {
    uint4* f = (uint4*)frame;
    uint4* o = (uint4*)out;
    const uint4* n = (const uint4*)in;
    const strata_u64 vecs = bytes / 16;
    const unsigned nl = __popc(lanes_mask);
    const unsigned rank = __popc(lanes_mask & ((1u << lane) - 1u));
    strata_u64 i = rank;
    for (; i + 3 * nl < vecs; i += 4 * nl) {
        uint4 old[4], fresh[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) old[k] = __ldcg(f + i + k * nl);
#pragma unroll
        for (int k = 0; k < 4; ++k) fresh[k] = __ldcg(n + i + k * nl);
#pragma unroll
        for (int k = 0; k < 4; ++k) __stcg(o + i + k * nl, old[k]);
#pragma unroll
        for (int k = 0; k < 4; ++k) __stcg(f + i + k * nl, fresh[k]);
    }
    for (; i < vecs; i += nl) {
        const uint4 old = __ldcg(f + i);
        const uint4 fresh = __ldcg(n + i);
        __stcg(o + i, old);
        __stcg(f + i, fresh);
    }
}

}  // namespace detail
}  // namespace strata
