// What the host-link experiments (tma_host_read.cu, sm_duplex.cu) share: error checks, a
// CUDA-event median, and the warp-per-page copy with 16-byte loads, eight in flight per lane,
// that Strata's fault path uses (copy.cuh).
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

typedef unsigned long long u64;

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

// The page the copies move: Strata's default GPU page.
constexpr u64 PAGE = 64 << 10;
constexpr u64 VECS = PAGE / 16;

// dst[p] = src[p] for every page, a warp per page (either side may be pinned host memory).
__global__ void sm_copy(uint4* dst, const uint4* src, u64 pages) {
    const u64 warp = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    const unsigned lane = threadIdx.x & 31;
    for (u64 p = warp; p < pages; p += warps) {
        const uint4* s = src + p * VECS;
        uint4* d = dst + p * VECS;
        for (u64 i = lane; i < VECS; i += 8 * 32) {
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = __ldcg(s + i + k * 32);
#pragma unroll
            for (int k = 0; k < 8; ++k) __stcg(d + i + k * 32, v[k]);
        }
    }
}

// Median over 7 timed runs of `run` (CUDA events on the default stream), after one warm-up.
template <typename F> float median_ms(F run) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    run();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < 7; ++i) {
        CHECK(cudaEventRecord(a));
        run();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return t[t.size() / 2];
}
