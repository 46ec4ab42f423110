// Kernels of `strata bench gpu-micro` and `gpu-store`: each pattern once through a Strata space
// and once over a plain pointer (pinned host memory for zero-copy, device memory for chunked
// copies, managed memory for UVM). Sums go to `sink` so that no load is optimised away.
#include "strata.cuh"

__device__ __forceinline__ strata_u64 mix64(strata_u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
__device__ __forceinline__ strata_u64 warp_global() {
    return (blockIdx.x * (strata_u64)blockDim.x + threadIdx.x) / 32;
}
__device__ __forceinline__ strata_u64 warp_count() { return (strata_u64)gridDim.x * (blockDim.x / 32); }
__device__ __forceinline__ void sink_add(strata_u64* sink, strata_u64 v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sink, v);
}
__device__ __forceinline__ strata_u64 sum_page(const unsigned char* p, strata_u64 bytes) {
    const uint4* v = (const uint4*)p;
    strata_u64 acc = 0;
    const unsigned lane = threadIdx.x & 31;
    for (strata_u64 i = lane; i < bytes / 16; i += 32) {
        uint4 x = __ldcg(v + i);
        acc += (strata_u64)x.x + x.y + x.z + x.w;
    }
    return acc;
}
__device__ __forceinline__ void bump_page(unsigned char* p, strata_u64 bytes) {
    // Four 16-byte loads in flight per lane before the stores (zero-copy needs the parallelism).
    uint4* v = (uint4*)p;
    const unsigned lane = threadIdx.x & 31;
    const strata_u64 n = bytes / 16;
    strata_u64 i = lane;
    for (; i + 96 < n; i += 128) {
        uint4 a = __ldcg(v + i), b = __ldcg(v + i + 32), c = __ldcg(v + i + 64), d = __ldcg(v + i + 96);
        a.x += 1; b.x += 1; c.x += 1; d.x += 1;
        __stcg(v + i, a); __stcg(v + i + 32, b); __stcg(v + i + 64, c); __stcg(v + i + 96, d);
    }
    for (; i < n; i += 32) {
        uint4 a = __ldcg(v + i);
        a.x += 1;
        __stcg(v + i, a);
    }
}
// Page order for the random-touch patterns: a bijection of [0, pages) when `cold` (every page
// once, shuffled), else uniform with replacement. `pages` is a power of two.
__device__ __forceinline__ strata_u64 touch_page(strata_u64 t, strata_u64 pages, strata_u64 seed, int cold) {
    if (cold) return ((t ^ (seed & (pages - 1))) * 0x9E3779B97F4A7C15ull + seed) & (pages - 1);
    return mix64(t ^ seed) & (pages - 1);
}
__device__ __forceinline__ strata_u64 gather_index(const strata_u64* idx, strata_u64 i, strata_u64 n,
                                                   strata_u64 seed) {
    return idx ? idx[i] : mix64(i ^ seed) % n;
}

// ---- through Strata -----------------------------------------------------------------------------
extern "C" __global__ void strata_stream_read(StrataSpace s, strata_u64* sink) {
    strata_u64 acc = 0;
    for (strata_u64 p = warp_global(); p < s.pages; p += warp_count()) {
        strata::PageRef r = strata::acquire(s, p, false);
        acc += sum_page(r.data, strata::page_bytes(s));
        strata::release(s, r);
    }
    sink_add(sink, acc);
}
extern "C" __global__ void strata_stream_rmw(StrataSpace s) {
    for (strata_u64 p = warp_global(); p < s.pages; p += warp_count()) {
        strata::PageRef r = strata::acquire(s, p, true);
        bump_page(r.data, strata::page_bytes(s));
        strata::release(s, r);
    }
}
extern "C" __global__ void strata_page_touch(StrataSpace s, strata_u64 touches, strata_u64 seed, int cold,
                                             strata_u64* sink) {
    strata_u64 acc = 0;
    for (strata_u64 t = warp_global(); t < touches; t += warp_count()) {
        strata::PageRef r = strata::acquire(s, touch_page(t, s.pages, seed, cold), false);
        acc += sum_page(r.data, strata::page_bytes(s));
        strata::release(s, r);
    }
    sink_add(sink, acc);
}
// Registers bounded (four blocks of 256 per SM), as a kernel that mostly hits should be: the
// fault path inlined into Array::read otherwise takes 168 registers, one block per SM, and a
// random gather is bound by the loads each SM keeps in flight; with the bound the rarely used
// fault path spills instead (scripts/experiments/gather_anatomy.cu: 45 % -> 61 % of the plain
// gather's rate on an H100).
extern "C" __global__ void __launch_bounds__(256, 4) strata_gather(StrataSpace s, const strata_u64* idx, strata_u64 count,
                                         strata_u64 seed, strata_u64* sink) {
    strata::Array<strata_u64> a(s);
    const strata_u64 n = a.size();
    strata_u64 acc = 0;
    const strata_u64 threads = (strata_u64)gridDim.x * blockDim.x;
    for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < count; i += threads)
        acc += a.read(gather_index(idx, i, n, seed));
    sink_add(sink, acc);
}
// Random in-place updates of 4-byte elements: x += 1 at uniformly random indices.
extern "C" __global__ void strata_random_rmw(StrataSpace s, strata_u64 count, strata_u64 seed) {
    strata::Array<unsigned> a(s);
    const strata_u64 n = a.size();
    const strata_u64 threads = (strata_u64)gridDim.x * blockDim.x;
    for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < count; i += threads) {
        const strata_u64 j = mix64(i ^ seed) % n;
        a.write(j, a.read(j) + 1u);
    }
}

// The pattern `strata bench gpu-store` writes into its stores (`crate::gpu_store::pattern_word`
// on the host computes the same): word `w` (bytes 8w..8w+8 of the space). Random words, or with
// `compressible` only every fourth word random and the others the word's 4 KiB block number
// (LZ4 then shrinks pages about threefold).
__device__ __forceinline__ strata_u64 pattern_word(strata_u64 w, strata_u64 seed, int compressible) {
    if (compressible && (w & 3) != 0) return (w >> 9) ^ seed;
    return mix64(w ^ seed);
}
// Checks every word of every page against the pattern: bad[0] counts wrong words, bad[1] keeps
// the lowest page holding one (start it at ~0).
extern "C" __global__ void strata_validate(StrataSpace s, strata_u64 seed, int compressible, strata_u64* bad) {
    const strata_u64 words = strata::page_bytes(s) / 8;
    const unsigned lane = threadIdx.x & 31;
    for (strata_u64 p = warp_global(); p < strata::page_count(s); p += warp_count()) {
        strata::PageRef r = strata::acquire(s, p, false);
        const strata_u64* v = (const strata_u64*)r.data;
        strata_u64 wrong = 0;
        for (strata_u64 i = lane; i < words; i += 32)
            wrong += __ldcg(v + i) != pattern_word(p * words + i, seed, compressible);
        strata::release(s, r);
        for (int o = 16; o > 0; o /= 2) wrong += __shfl_xor_sync(0xFFFFFFFFu, wrong, o);
        if (lane == 0 && wrong != 0) {
            atomicAdd(&bad[0], wrong);
            atomicMin(&bad[1], p);
        }
    }
}

// ---- over a plain pointer (zero-copy host, device chunk, managed) ------------------------------
extern "C" __global__ void raw_stream_read(const unsigned char* p, strata_u64 bytes, strata_u64 page_bytes,
                                           strata_u64* sink) {
    strata_u64 acc = 0;
    for (strata_u64 q = warp_global(); q < bytes / page_bytes; q += warp_count())
        acc += sum_page(p + q * page_bytes, page_bytes);
    sink_add(sink, acc);
}
extern "C" __global__ void raw_stream_rmw(unsigned char* p, strata_u64 bytes, strata_u64 page_bytes) {
    for (strata_u64 q = warp_global(); q < bytes / page_bytes; q += warp_count())
        bump_page(p + q * page_bytes, page_bytes);
}
extern "C" __global__ void raw_page_touch(const unsigned char* p, strata_u64 page_shift, strata_u64 pages,
                                          strata_u64 touches, strata_u64 seed, int cold, strata_u64* sink) {
    strata_u64 acc = 0;
    for (strata_u64 t = warp_global(); t < touches; t += warp_count())
        acc += sum_page(p + (touch_page(t, pages, seed, cold) << page_shift), 1ull << page_shift);
    sink_add(sink, acc);
}
extern "C" __global__ void raw_random_rmw(unsigned* p, strata_u64 n, strata_u64 count, strata_u64 seed) {
    const strata_u64 threads = (strata_u64)gridDim.x * blockDim.x;
    for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < count; i += threads) {
        const strata_u64 j = mix64(i ^ seed) % n;
        __stcg(p + j, __ldcg(p + j) + 1u);
    }
}
extern "C" __global__ void raw_gather(const strata_u64* p, strata_u64 n, const strata_u64* idx,
                                      strata_u64 count, strata_u64 seed, strata_u64* sink) {
    strata_u64 acc = 0;
    const strata_u64 threads = (strata_u64)gridDim.x * blockDim.x;
    for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < count; i += threads)
        acc += __ldcg(p + gather_index(idx, i, n, seed));
    sink_add(sink, acc);
}
