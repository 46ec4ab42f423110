// Kernels of the GPU tests (tests/gpu.rs).
#include "strata.cuh"

__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

// Thread t owns the elements i with i % threads == t; it updates `ops` of them, chosen at
// random, with x = x * 3 + i (one writer per element, so the host can replay it).
extern "C" __global__ void rmw_owned(StrataSpace s, unsigned long long ops, unsigned long long seed) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long per = a.size() / threads;
    if (per == 0) return;
    for (unsigned long long k = 0; k < ops; ++k) {
        const unsigned long long i = t + threads * (mix(seed ^ (t * 0x9E3779B97F4A7C15ull) ^ k) % per);
        a.write(i, a.read(i) * 3 + i);
    }
}

// Each thread sums `ops` elements read at random anywhere in the space.
extern "C" __global__ void read_random(StrataSpace s, unsigned long long ops, unsigned long long seed,
                                       unsigned long long* sums) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long acc = 0;
    for (unsigned long long k = 0; k < ops; ++k) acc += a.read(mix(seed ^ (t << 20) ^ k) % a.size());
    sums[t] = acc;
}

// Every thread of the grid adds 1 to element `i` and reads element `i + 1`.
extern "C" __global__ void hammer_one(StrataSpace s, unsigned long long i, unsigned long long* seen) {
    strata::Array<unsigned long long> a(s);
    a.atomic_add(i, 1ull);
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    seen[t] = a.read(i + 1);
}

// Float and 32-bit atomics through the element API.
extern "C" __global__ void atomics_mixed(StrataSpace sf, StrataSpace si) {
    strata::Array<float> f(sf);
    strata::Array<unsigned> u(si);
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    f.atomic_add(t % 64, 0.5f);
    u.atomic_add((t * 2654435761u) % u.size(), 1u);
}

// Reads and writes one element at `i` (which the test puts outside the space).
extern "C" __global__ void poke(StrataSpace s, unsigned long long i, unsigned long long* out) {
    strata::Array<unsigned long long> a(s);
    a.write(i, 7ull);
    out[0] = a.read(i);
}

// Repeats a sequential pass over the first `pages` pages `passes` times (a loop larger than
// the cache), touching each page once per pass with one warp.
extern "C" __global__ void loop_pages(StrataSpace s, unsigned long long pages, unsigned long long passes,
                                      unsigned long long* sink) {
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / 32);
    const unsigned long long w = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned long long acc = 0;
    for (unsigned long long p = 0; p < passes; ++p)
        for (unsigned long long q = w; q < pages; q += warps) {
            strata::PageRef r = strata::acquire(s, q, false);
            acc += ((const unsigned long long*)r.data)[threadIdx.x & 31];
            strata::release(s, r);
        }
    atomicAdd(sink, acc);
}
