// Kernels of `strata bench unified` (compiled through NVRTC with strata/unified.cuh in front):
// u_* over a unified allocation, r_* over a plain pointer (CUDA managed memory), the same work.
#include "strata/unified.cuh"

typedef unsigned long long u64;

__device__ __forceinline__ u64 umix(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

// GPU consume: out[j] = sum over k < group of in[k * n_out + j] (coalesced across threads).
// Strata's reads mostly hit (pages loaded by the sync's prefetch or kept from the last round),
// so its registers are bounded as strata.cuh advises for such kernels: four blocks per SM
// instead of one hide the latency of each element's page-word check; the fault path spills.
extern "C" __global__ void __launch_bounds__(256, 4) u_consume(StrataUnified u, u64 n_out, u64 group, u64 out_at) {
    strata::Unified<u64> a(u);
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n_out; j += (u64)gridDim.x * blockDim.x) {
        u64 s = 0;
        for (u64 k = 0; k < group; ++k) s += a.read(k * n_out + j);
        a.write(out_at + j, s);
    }
}
extern "C" __global__ void r_consume(const u64* in, u64* out, u64 n_out, u64 group) {
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n_out; j += (u64)gridDim.x * blockDim.x) {
        u64 s = 0;
        for (u64 k = 0; k < group; ++k) s += in[k * n_out + j];
        out[j] = s;
    }
}

// Random lookups into a table of n words: `count` lookups, their sum into *sink.
// (Strata's reads go through the read-mostly reader: the replica, else the host copy.)
extern "C" __global__ void u_gather(StrataUnified u, u64 n, u64 count, u64 seed, u64* sink) {
    strata::ReadMostly<u64> a(u);
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        s += a.read(umix(i ^ seed) % n);
    atomicAdd(sink, s);
}
extern "C" __global__ void r_gather(const u64* t, u64 n, u64 count, u64 seed, u64* sink) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        s += t[umix(i ^ seed) % n];
    atomicAdd(sink, s);
}

// One step of an iterative sweep: a[i] = a[i] * 3 + 1. Strata's version goes a page per warp
// (acquire for writing, the lanes over its words, release): the bulk-loop style strata.cuh
// offers for whole pages, one pin per page instead of one per element.
extern "C" __global__ void u_sweep(StrataUnified u, u64 n) {
    const u64 warp = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    const unsigned lane = threadIdx.x & 31;
    const u64 per = strata::page_bytes(u.space) / 8;
    for (u64 p = warp; p * per < n; p += warps) {
        strata::PageRef r = strata::acquire(u.space, p, true);
        u64* w = (u64*)r.data;
        const u64 m = n - p * per < per ? n - p * per : per;
        for (u64 i = lane; i < m; i += 32) w[i] = w[i] * 3 + 1;
        strata::release(u.space, r);
    }
}
extern "C" __global__ void r_sweep(u64* a, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        a[i] = a[i] * 3 + 1;
}
