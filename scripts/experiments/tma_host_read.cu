// Can a kernel read pinned host memory as fast as the copy engines? (issue 12: streaming is
// bound at about 0.93x chunked copies because Strata's fault path copies pages with SM loads,
// which top out below cuMemcpyHtoD.) Copies 1 GiB of pinned host memory into device memory,
// four ways, CUDA-event timed, median of 7 after a warm-up:
//   memcpy      cudaMemcpyAsync HtoD (the copy engines)
//   sm-loads    warps copy 64 KiB pages with 16-byte loads, 8 in flight per lane (copy.cuh)
//   bulk        one thread per block moves each 64 KiB page host -> shared -> device with the
//               bulk-copy engine of sm_90 (cp.async.bulk, mbarrier completion), STAGES
//               chunks in flight per block
//   bulk-read   the same, host -> shared only (what the bulk reads alone reach)
//
//   nvcc -O2 -arch=sm_90 -o tma_host_read scripts/experiments/tma_host_read.cu && ./tma_host_read
#include "host_link.cuh"

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// One thread per block drives the bulk copies: chunk c of the block's pages goes to stage
// c % STAGES; a stage is refilled only after its previous store has read it out.
template <int CHUNK, int STAGES, bool STORE>
__global__ void bulk(unsigned char* dst, const unsigned char* src, u64 pages) {
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) u64 bar[STAGES];
    if (threadIdx.x != 0) return;
    for (int s = 0; s < STAGES; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const u64 chunks_per_page = PAGE / CHUNK;
    const u64 total = pages * chunks_per_page;
    unsigned phase[STAGES] = {};
    // Chunks of this block: c = blockIdx.x * chunks_per_page + k*gridDim ... page-major.
    u64 mine[STAGES];
    int issued = 0;
    u64 next = (u64)blockIdx.x * chunks_per_page;
    auto advance = [&](u64 c) {
        // consecutive chunks of one page, then the page gridDim.x further on
        const u64 within = c % chunks_per_page;
        return within + 1 < chunks_per_page ? c + 1 : c + 1 + ((u64)gridDim.x - 1) * chunks_per_page;
    };
    auto issue = [&](int s, u64 c) {
        const unsigned b = smem_addr(&bar[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(CHUNK) : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr(buf + s * CHUNK)),
            "l"(src + c * CHUNK), "r"(CHUNK), "r"(b)
            : "memory");
        mine[s] = c;
    };
    for (int s = 0; s < STAGES && next < total; ++s) {
        issue(s, next);
        next = advance(next);
        ++issued;
    }
    int s = 0;
    u64 done = 0;
    while (done < (u64)issued) {
        const unsigned b = smem_addr(&bar[s]);
        unsigned ok = 0;
        while (!ok)
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                : "=r"(ok)
                : "r"(b), "r"(phase[s])
                : "memory");
        phase[s] ^= 1;
        if (STORE) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + mine[s] * CHUNK),
                         "r"(smem_addr(buf + s * CHUNK)), "r"(CHUNK)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            // The stage is reused below: wait until its store has read it (older groups first).
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        }
        ++done;
        if (next < total) {
            issue(s, next);
            next = advance(next);
            ++issued;
        }
        s = (s + 1) % STAGES;
    }
    if (STORE) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

template <int CHUNK, int STAGES, bool STORE>
void run_bulk(const char* name, unsigned char* dst, const unsigned char* src, u64 pages, int blocks_per_sm,
              int sms, u64 bytes, const unsigned char* check_host) {
    const size_t smem = (size_t)CHUNK * STAGES;
    CHECK(cudaFuncSetAttribute(bulk<CHUNK, STAGES, STORE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int grid = std::min<u64>((u64)sms * blocks_per_sm, pages);
    CHECK(cudaMemset(dst, 0, bytes));
    const float ms = median_ms([&] { bulk<CHUNK, STAGES, STORE><<<grid, 32, smem>>>(dst, src, pages); });
    CHECK(cudaGetLastError());
    bool ok = true;
    if (STORE) {
        std::vector<unsigned char> back(1 << 20);
        for (u64 at : {0ull, bytes / 2, bytes - (1ull << 20)}) {
            CHECK(cudaMemcpy(back.data(), dst + at, back.size(), cudaMemcpyDeviceToHost));
            ok = ok && std::equal(back.begin(), back.end(), check_host + at);
        }
    }
    printf("%-10s chunk %6d stages %d blocks/SM %2d  %8.2f ms  %6.2f GB/s  %s\n", name, CHUNK, STAGES,
           blocks_per_sm, ms, bytes / ms / 1e6, STORE ? (ok ? "copy exact" : "COPY WRONG") : "");
}

int main() {
    const u64 bytes = 1ull << 30, pages = bytes / PAGE;
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned char *host, *dev;
    CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
    for (u64 i = 0; i < bytes / 8; ++i) ((u64*)host)[i] = i * 0x9E3779B97F4A7C15ull;
    unsigned char* host_dev;
    CHECK(cudaHostGetDevicePointer((void**)&host_dev, host, 0));
    CHECK(cudaMalloc(&dev, bytes));
    float ms = median_ms([&] { CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice)); });
    printf("%-10s %41.2f ms  %6.2f GB/s\n", "memcpy", ms, bytes / ms / 1e6);
    for (int per_sm : {4, 8, 16}) {
        ms = median_ms([&] { sm_copy<<<sms * per_sm, 256>>>((uint4*)dev, (const uint4*)host_dev, pages); });
        printf("%-10s warps/SM %3d %28.2f ms  %6.2f GB/s\n", "sm-loads", per_sm * 8, ms, bytes / ms / 1e6);
    }
    for (int b : {2, 4, 8}) {
        run_bulk<16384, 4, true>("bulk", dev, host_dev, pages, b, sms, bytes, host);
        run_bulk<16384, 4, false>("bulk-read", dev, host_dev, pages, b, sms, bytes, host);
        run_bulk<32768, 2, true>("bulk", dev, host_dev, pages, b, sms, bytes, host);
        run_bulk<8192, 8, true>("bulk", dev, host_dev, pages, b, sms, bytes, host);
    }
    return 0;
}
