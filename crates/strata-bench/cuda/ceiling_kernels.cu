// Kernels of `strata bench ceilings` (and the NVLink probes of `strata bench peer`): the rates
// the hardware gives plain code, against which every benchmark reports its fraction. Sums go to `sink` so no load is optimised away.
typedef unsigned long long u64;

__device__ __forceinline__ u64 mix(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

__device__ __forceinline__ void sink_add(u64* sink, u64 v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sink, v);
}

// Streams `bytes` from `src` (pinned host memory mapped into the GPU: PCIe read by SMs; or
// device memory: HBM read), 16 bytes per thread per step, grid-stride.
extern "C" __global__ void ceiling_stream_read(const uint4* src, u64 bytes, u64* sink) {
    const u64 n = bytes / 16;
    u64 acc = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        uint4 v = __ldcg(src + i);
        acc += (u64)v.x + v.y + v.z + v.w;
    }
    sink_add(sink, acc);
}

// Each warp copies `count` random whole pages of `page` bytes from `src` (a mapped host copy)
// into `dst` (device memory of `frames` pages): the warp-per-page fault service path without
// any bookkeeping.
extern "C" __global__ void ceiling_page_gather(const uint4* src, u64 src_pages, uint4* dst,
                                                u64 frames, u64 page, u64 count, u64 seed) {
    const u64 warp = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    const unsigned lane = threadIdx.x & 31;
    const u64 words = page / 16;
    for (u64 k = warp; k < count; k += warps) {
        const u64 p = mix(seed ^ k) % src_pages;
        const u64 f = k % frames;
        const uint4* s = src + p * words;
        uint4* d = dst + f * words;
        for (u64 i = lane; i < words; i += 32) d[i] = __ldcg(s + i);
    }
}

// `count` random 8-byte reads from `src` of `elements` words (HBM random gather, or
// zero-copy gather when `src` is mapped host memory).
extern "C" __global__ void ceiling_random_gather(const u64* src, u64 elements, u64 count,
                                                  u64 seed, u64* sink) {
    u64 acc = 0;
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < count; k += (u64)gridDim.x * blockDim.x) {
        acc += __ldcg(src + mix(seed ^ k) % elements);
    }
    sink_add(sink, acc);
}

// Each warp serves `count` page exchanges the way a fault with a peer tier does: a random page
// of `peer` (borrowed memory of `peer_pages` pages) comes into local frame k % frames while the
// frame's old bytes go out to peer slot k % peer_pages (round robin, as victims do), four
// 16-byte vectors per lane in flight each way. `fence`: 0 none; 1 a GPU-scope fence by lane 0
// after each page; 2 a system-scope fence by lane 0 after each page (the fault path's
// ordering points over another GPU's memory). The spread between the three shows what a
// per-fault fence costs.
extern "C" __global__ void peer_page_exchange(uint4* peer, u64 peer_pages, uint4* frames, u64 frame_count,
                                              u64 page, u64 count, u64 seed, int fence) {
    const u64 warp = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32;
    const u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    const unsigned lane = threadIdx.x & 31;
    const u64 vecs = page / 16;
    for (u64 k = warp; k < count; k += warps) {
        const uint4* in = peer + (mix(seed ^ k) % peer_pages) * vecs;
        uint4* out = peer + (k % peer_pages) * vecs;
        uint4* f = frames + (k % frame_count) * vecs;
        for (u64 i = lane; i < vecs; i += 4 * 32) {
            uint4 old[4], fresh[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i + j * 32 < vecs) {
                    old[j] = __ldcg(f + i + j * 32);
                    fresh[j] = __ldcg(in + i + j * 32);
                }
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i + j * 32 < vecs) {
                    __stcg(out + i + j * 32, old[j]);
                    __stcg(f + i + j * 32, fresh[j]);
                }
        }
        __syncwarp();
        if (lane == 0) {
            if (fence == 1) __threadfence();
            if (fence == 2) __threadfence_system();
        }
        __syncwarp();
    }
}
