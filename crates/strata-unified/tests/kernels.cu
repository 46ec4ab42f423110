// Kernels of strata-unified's GPU tests (compiled through NVRTC with strata/unified.cuh in front).
#include "strata/unified.cuh"

__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// Every word i with mix(i ^ salt) % every == 0 becomes mix(word ^ salt): reads what the CPU
// left, writes what the CPU must see.
extern "C" __global__ void update(StrataUnified u, unsigned long long n, unsigned long long salt,
                                  unsigned long long every) {
    strata::Unified<unsigned long long> a(u);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        if (mix(i ^ salt) % every == 0) a.write(i, mix(a.read(i) ^ salt));
}

// Sum of words [first, last) into out[0] (a reader that writes nothing).
extern "C" __global__ void sum(StrataUnified u, unsigned long long first, unsigned long long last,
                               unsigned long long* out) {
    strata::Unified<unsigned long long> a(u);
    unsigned long long s = 0;
    for (unsigned long long i = first + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < last;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += a.read(i);
    atomicAdd(out, s);
}

// The same sum through the lean read-mostly reader (replica, else the host copy).
extern "C" __global__ void sum_read_mostly(StrataUnified u, unsigned long long first, unsigned long long last,
                                           unsigned long long* out) {
    strata::ReadMostly<unsigned long long> a(u);
    unsigned long long s = 0;
    for (unsigned long long i = first + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < last;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += a.read(i);
    atomicAdd(out, s);
}

// Walks a list the CPU built (node: next as a CPU address, value), one thread: out = {sum, count}.
extern "C" __global__ void walk(StrataUnified u, unsigned long long head, unsigned long long limit,
                                unsigned long long* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    strata::Unified<unsigned long long> a(u);
    unsigned long long s = 0, count = 0;
    for (unsigned long long at = strata::unified_offset(u, head); at != STRATA_UNIFIED_NULL && count < limit;
         at = strata::unified_offset(u, a.read(at / 8))) {
        s += a.read(at / 8 + 1);
        ++count;
    }
    out[0] = s;
    out[1] = count;
}

// Fills words [first, last) with value (a writer over a range).
extern "C" __global__ void fill(StrataUnified u, unsigned long long first, unsigned long long last,
                                unsigned long long value) {
    strata::Unified<unsigned long long> a(u);
    for (unsigned long long i = first + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < last;
         i += (unsigned long long)gridDim.x * blockDim.x)
        a.write(i, value);
}
