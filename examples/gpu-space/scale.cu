// scale.cu: a CUDA program built with nvcc that pages a space larger than its GPU cache through
// libstrata. It creates a space of N doubles with a cache of an eighth of that, fills it from
// the host, runs a kernel that includes strata.cuh (a[i] = a[i] * k + 1, faults served by the
// GPU), reads the space back, checks every element and prints the paging statistics.
//
// Build: make (Makefile) or cmake (CMakeLists.txt); see README.md in this directory.
// Run:   ./scale [MEGA_ELEMENTS]   (default 64: 512 MiB of doubles through a 64 MiB cache)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata.h"    // host API: libstrata.so
#include "strata.cuh"  // device API: StrataSpace, strata::Array

static_assert(sizeof(StrataSpace) == sizeof(strata_space_handle_t),
              "strata.h and strata.cuh disagree on the handle's size");

extern "C" __global__ void scale_add(StrataSpace space, unsigned long long n, double k) {
    strata::Array<double> a(space);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += stride)
        a.write(i, a.read(i) * k + 1.0);
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

#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));         \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

int main(int argc, char** argv) {
    const unsigned long long n = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64) << 20;
    const double k = 3.0;
    const uint64_t bytes = n * sizeof(double);

    strata_gpu_t* gpu = nullptr;
    STRATA_CHECK(strata_gpu_open(0, &gpu));  // the primary context: the runtime below shares it

    strata_space_options_t opts;
    strata_space_options_default(&opts);
    opts.page_size = 64 << 10;
    opts.cache_bytes = bytes / 8 < (4u << 20) ? (4u << 20) : bytes / 8;
    opts.element = STRATA_ELEM_F64;
    strata_space_t* space = nullptr;
    STRATA_CHECK(strata_space_create(gpu, bytes, &opts, &space));

    // Fill in chunks so the host never holds the whole space twice.
    const unsigned long long chunk = 1 << 20;
    std::vector<double> buf(chunk);
    for (unsigned long long base = 0; base < n; base += chunk) {
        const unsigned long long m = n - base < chunk ? n - base : chunk;
        for (unsigned long long j = 0; j < m; j++) buf[j] = (double)(base + j);
        STRATA_CHECK(strata_space_fill(space, base * sizeof(double), buf.data(), m * sizeof(double)));
    }

    // The handle is the same 72 bytes as StrataSpace: copy it across and pass it by value.
    strata_space_handle_t h;
    STRATA_CHECK(strata_space_handle(space, &h));
    StrataSpace s;
    std::memcpy(&s, &h, sizeof s);

    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    scale_add<<<sms * 8, 256>>>(s, n, k);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());  // before any host call that touches the space
    STRATA_CHECK(strata_space_check_errors(space));

    unsigned long long bad = 0;
    for (unsigned long long base = 0; base < n; base += chunk) {
        const unsigned long long m = n - base < chunk ? n - base : chunk;
        STRATA_CHECK(strata_space_read(space, base * sizeof(double), buf.data(), m * sizeof(double)));
        for (unsigned long long j = 0; j < m; j++)
            if (buf[j] != (double)(base + j) * k + 1.0 && bad++ < 5)
                std::fprintf(stderr, "a[%llu] = %g, want %g\n", base + j, buf[j],
                             (double)(base + j) * k + 1.0);
    }

    strata_space_stats_t st;
    STRATA_CHECK(strata_space_stats(space, &st));
    std::printf("%llu doubles (%llu MiB) through a %llu MiB cache: faults %llu, hits %llu, "
                "evictions %llu, writebacks %llu, mean fault %.1f us\n",
                n, (unsigned long long)(bytes >> 20), (unsigned long long)(opts.cache_bytes >> 20),
                (unsigned long long)st.faults, (unsigned long long)st.hits,
                (unsigned long long)st.evictions, (unsigned long long)st.writebacks,
                st.faults ? (double)st.fault_ns_total / (double)st.faults / 1000.0 : 0.0);
    strata_space_destroy(space);
    strata_gpu_close(gpu);
    if (bad) {
        std::fprintf(stderr, "%llu elements wrong\n", bad);
        return 1;
    }
    std::printf("all %llu elements correct\n", n);
    return 0;
}
