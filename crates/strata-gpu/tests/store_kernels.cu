// Kernels of the store-backed space tests (tests/store.rs).
#include "strata.cuh"

__device__ __forceinline__ unsigned long long smix(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

// Thread t of T does `ops` random operations on a space of n u64s: writes to the even elements
// it owns (2 * (t + T * k)), reads of odd elements (nobody writes those, so a read's value is
// known: the space's initial contents). Each thread's sum of what it read lands in sums[t]. A
// CPU replay of the same loop knows the final contents exactly (writers never share an
// element, and each applies its writes in program order).
extern "C" __global__ void random_rw(StrataSpace s, unsigned long long ops, unsigned long long seed,
                                     unsigned long long* sums) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long n = a.size();
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long T = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long halves = n / 2;
    const unsigned long long owned = t < halves ? (halves - t + T - 1) / T : 0;
    unsigned long long sum = 0;
    for (unsigned long long j = 0; j < ops; ++j) {
        const unsigned long long r = smix(seed ^ (t << 24) ^ j);
        if ((r & 1) && owned) {
            const unsigned long long idx = 2 * (t + T * ((r >> 1) % owned));
            a.write(idx, smix(seed ^ (idx << 8) ^ (j << 40)));
        } else {
            const unsigned long long idx = 2 * ((r >> 1) % halves) + 1;
            sum += a.read(idx);
        }
    }
    sums[t] = sum;
}

// Every warp streams over pages (grid-strided), summing the first word of each into sums[warp]
// through acquire/release (page API). `sums` starts zeroed.
extern "C" __global__ void page_sweep(StrataSpace s, unsigned long long* sums) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long w = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    const unsigned long long W = (unsigned long long)gridDim.x * (blockDim.x / 32);
    unsigned long long sum = 0;
    for (unsigned long long p = w; p < s.pages; p += W) {
        strata::PageRef r = strata::acquire(s, p, false);
        if (r.ok) sum += ((const unsigned long long*)r.data)[lane];
        strata::release(s, r);
    }
    atomicAdd(&sums[w], sum);
}

// Every thread adds 1 to every element it strides over (grid-strided), `rounds` times.
extern "C" __global__ void add_one(StrataSpace s, unsigned long long rounds) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long n = a.size();
    for (unsigned long long r = 0; r < rounds; ++r)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
             i += (unsigned long long)gridDim.x * blockDim.x)
            a.write(i, a.read(i) + 1);
}
