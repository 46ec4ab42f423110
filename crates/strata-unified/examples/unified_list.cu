// unified_list.cu: a CUDA C++ program built with nvcc that shares one allocation between its
// CPU code and its own kernels through libstrata's unified allocations (strata_alloc). The CPU
// builds a linked list of N nodes in shuffled order, storing ordinary CPU pointers; a kernel
// walks it on the GPU (strata::unified_offset translates the pointers), another doubles every
// value in place; the CPU then reads the doubled values through the same pointer. The GPU
// cache is a quarter of the list, so kernels page it on demand.
//
// Build (crates/strata-unified/gpu-check.sh does this on the GPU machine):
//   nvcc -std=c++17 -O2 -arch=sm_90 -I<dir with strata.h, strata.cuh, strata/> unified_list.cu -lstrata
// Run:  ./unified_list [NODES]   (default 100000)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata.h"              // host API: libstrata.so
#include "strata/unified.cuh"    // device API: StrataUnified, strata::Unified, unified_offset

static_assert(sizeof(StrataUnified) == sizeof(strata_unified_handle_t), "strata.h and unified.cuh disagree");

struct Node {
    Node* next;                // a CPU pointer: the kernel translates it
    unsigned long long value;
};

extern "C" __global__ void walk(StrataUnified u, unsigned long long head, unsigned long long* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    strata::Unified<unsigned long long> a(u);
    unsigned long long sum = 0, count = 0;
    for (unsigned long long at = strata::unified_offset(u, head); at != STRATA_UNIFIED_NULL;
         at = strata::unified_offset(u, a.read(at / 8))) {
        sum += a.read(at / 8 + 1);
        ++count;
    }
    out[0] = sum;
    out[1] = count;
}

extern "C" __global__ void double_values(StrataUnified u, unsigned long long nodes) {
    strata::Unified<unsigned long long> a(u);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < nodes;
         i += (unsigned long long)gridDim.x * blockDim.x)
        a.write(2 * i + 1, a.read(2 * i + 1) * 2);
}

#define STRATA_CHECK(call)                                                               \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != STRATA_OK) {                                                          \
            std::fprintf(stderr, "%s failed: %s: %s\n", #call, strata_status_name(rc_), \
                         strata_last_error());                                           \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)
#define CUDA_CHECK(call)                                                            \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
            std::exit(1);                                                           \
        }                                                                           \
    } while (0)

int main(int argc, char** argv) {
    const unsigned long long nodes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100000;
    const uint64_t bytes = nodes * sizeof(Node);
    strata_gpu_t* gpu = nullptr;
    STRATA_CHECK(strata_gpu_open(0, &gpu));  // the primary context: the runtime below shares it
    strata_unified_options_t opts;
    STRATA_CHECK(strata_unified_options_default(&opts));
    opts.cache_bytes = bytes / 4 < (1u << 20) ? (1u << 20) : bytes / 4;
    strata_unified_t alloc = 0;
    Node* list = nullptr;
    STRATA_CHECK(strata_alloc(gpu, bytes, &opts, &alloc, (void**)&list));

    // CPU phase: a list through the nodes in shuffled order, built with plain pointers.
    std::vector<unsigned long long> order(nodes);
    for (unsigned long long i = 0; i < nodes; i++) order[i] = i;
    unsigned long long x = 88172645463325252ull;
    for (unsigned long long i = nodes - 1; i > 0; i--) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        std::swap(order[i], order[x % (i + 1)]);
    }
    unsigned long long want = 0;
    for (unsigned long long k = 0; k < nodes; k++) {
        Node& n = list[order[k]];
        n.next = k + 1 < nodes ? &list[order[k + 1]] : nullptr;
        n.value = k * 3 + 1;
        want += n.value;
    }
    Node* head = &list[order[0]];

    // GPU phase: hand over, walk, double, hand back.
    STRATA_CHECK(strata_sync(alloc, 0, bytes, STRATA_SYNC_TO_GPU));
    strata_unified_handle_t h;
    STRATA_CHECK(strata_unified_handle(alloc, &h));
    StrataUnified u;
    std::memcpy(&u, &h, sizeof u);
    unsigned long long* out = nullptr;
    CUDA_CHECK(cudaMalloc(&out, 16));
    walk<<<1, 32>>>(u, (unsigned long long)head, out);
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    double_values<<<sms * 4, 256>>>(u, nodes);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    STRATA_CHECK(strata_sync(alloc, 0, bytes, STRATA_SYNC_TO_CPU));
    unsigned long long got[2];
    CUDA_CHECK(cudaMemcpy(got, out, 16, cudaMemcpyDeviceToHost));

    // CPU phase: the doubled values, through the same pointers.
    unsigned long long doubled = 0, walked = 0;
    for (Node* n = head; n; n = n->next, walked++) doubled += n->value;
    int bad = got[0] != want || got[1] != nodes || doubled != 2 * want || walked != nodes;
    std::printf("%llu nodes (%llu MiB, GPU cache %llu MiB): GPU walk sum %llu count %llu (want %llu %llu); "
                "CPU sum after the GPU doubled them %llu (want %llu)\n",
                nodes, (unsigned long long)(bytes >> 20), (unsigned long long)(opts.cache_bytes >> 20),
                got[0], got[1], want, nodes, doubled, 2 * want);
    CUDA_CHECK(cudaFree(out));
    STRATA_CHECK(strata_free(alloc));
    strata_gpu_close(gpu);
    if (bad) {
        std::fprintf(stderr, "MISMATCH\n");
        return 1;
    }
    std::printf("ok\n");
    return 0;
}
