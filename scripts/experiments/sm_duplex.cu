// What bounds streaming read-modify-write (issue 12: `gpu-micro`'s stream-rmw runs at
// 0.88-0.96x chunked copies)? Every page comes in and goes out dirty, so the link carries
// both directions at once. Chunked copies drive the two directions with the copy engines;
// Strata's fault path swaps a dirty frame out and the new page in with SM loads and stores
// (copy.cuh's warp_swap_copy). This measures, for 1 GiB each way (CUDA events, median of 7
// after a warm-up):
//   ce-h2d, ce-d2h     one direction on the copy engines (cudaMemcpyAsync)
//   ce-duplex          both at once, on two streams
//   sm-read, sm-write  one direction with SM loads / stores (16 bytes, 8 in flight per lane)
//   sm-duplex          both at once in one pass per 64 KiB page (the swap copy's pattern:
//                      read a chunk of the frame and of the incoming page, write both out)
//
//   nvcc -O2 -arch=sm_90 -o sm_duplex scripts/experiments/sm_duplex.cu && ./sm_duplex
#include "host_link.cuh"

// For every page: out[p] = frame[p] and frame[p] = in[p], chunk by chunk (the swap copy).
__global__ void sm_swap(uint4* frame, uint4* out, const uint4* in, u64 pages) {
    const u64 warp = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    const unsigned lane = threadIdx.x & 31;
    for (u64 p = warp; p < pages; p += warps) {
        uint4* f = frame + p * VECS;
        uint4* o = out + p * VECS;
        const uint4* n = in + p * VECS;
        for (u64 i = lane; i < VECS; i += 4 * 32) {
            uint4 old[4], fresh[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) old[k] = __ldcg(f + i + k * 32);
#pragma unroll
            for (int k = 0; k < 4; ++k) fresh[k] = __ldcg(n + i + k * 32);
#pragma unroll
            for (int k = 0; k < 4; ++k) __stcg(o + i + k * 32, old[k]);
#pragma unroll
            for (int k = 0; k < 4; ++k) __stcg(f + i + k * 32, fresh[k]);
        }
    }
}

int main() {
    const u64 bytes = 1ull << 30, pages = bytes / PAGE;
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned char *in, *out, *in_d, *out_d, *frames, *other;
    CHECK(cudaHostAlloc(&in, bytes, cudaHostAllocMapped));
    CHECK(cudaHostAlloc(&out, bytes, cudaHostAllocMapped));
    for (u64 i = 0; i < bytes / 8; ++i) ((u64*)in)[i] = i * 0x9E3779B97F4A7C15ull;
    CHECK(cudaHostGetDevicePointer((void**)&in_d, in, 0));
    CHECK(cudaHostGetDevicePointer((void**)&out_d, out, 0));
    CHECK(cudaMalloc(&frames, bytes));
    CHECK(cudaMalloc(&other, bytes));
    CHECK(cudaMemset(frames, 7, bytes));
    cudaStream_t up, down;
    CHECK(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking));
    auto report = [&](const char* name, float ms, double moved) {
        printf("%-10s %8.2f ms  %6.2f GB/s moved (%.0f MiB)\n", name, ms, moved / ms / 1e6, moved / (1 << 20));
    };
    report("ce-h2d", median_ms([&] { CHECK(cudaMemcpyAsync(other, in, bytes, cudaMemcpyHostToDevice, 0)); }), bytes);
    report("ce-d2h", median_ms([&] { CHECK(cudaMemcpyAsync(out, frames, bytes, cudaMemcpyDeviceToHost, 0)); }), bytes);
    // Both directions at once: the default stream waits for both (legacy stream semantics).
    report("ce-duplex",
           median_ms([&] {
               CHECK(cudaMemcpyAsync(other, in, bytes, cudaMemcpyHostToDevice, up));
               CHECK(cudaMemcpyAsync(out, frames, bytes, cudaMemcpyDeviceToHost, down));
               CHECK(cudaStreamSynchronize(up));
               CHECK(cudaStreamSynchronize(down));
           }),
           2.0 * bytes);
    for (int per_sm : {4, 8}) {
        const int grid = sms * per_sm;
        printf("-- %d warps per SM\n", per_sm * 8);
        report("sm-read", median_ms([&] { sm_copy<<<grid, 256>>>((uint4*)other, (const uint4*)in_d, pages); }), bytes);
        report("sm-write", median_ms([&] { sm_copy<<<grid, 256>>>((uint4*)out_d, (const uint4*)frames, pages); }),
               bytes);
        report("sm-duplex",
               median_ms([&] { sm_swap<<<grid, 256>>>((uint4*)frames, (uint4*)out_d, (const uint4*)in_d, pages); }),
               2.0 * bytes);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    // The swap's last pass left `in` in the frames and the previous frames in `out`: check one MiB.
    std::vector<unsigned char> back(1 << 20);
    CHECK(cudaMemcpy(back.data(), frames + bytes / 2, back.size(), cudaMemcpyDeviceToHost));
    printf("swap copy %s\n", std::equal(back.begin(), back.end(), in + bytes / 2) ? "exact" : "WRONG");
    return 0;
}
