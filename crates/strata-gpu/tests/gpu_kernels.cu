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

// The space holds element i = i ^ key. Warps read elements (half of them on a few hot pages,
// half anywhere), through Array::read (optimistic first, pinned on a miss) and through
// view_page/view_valid with an element read as the fallback, and count every value that is not
// i ^ key; one warp in four rewrites the same values, so pages turn dirty and evictions write
// back while optimistic readers of those frames are in flight.
extern "C" __global__ void verify_reads(StrataSpace s, unsigned long long ops, unsigned long long seed,
                                        unsigned long long key, unsigned long long hot_elems,
                                        unsigned long long* bad) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long n = a.size();
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const bool writer = ((t / 32) & 3) == 3;
    const unsigned long long per_page = strata::page_bytes(s) / 8;
    unsigned long long wrong = 0, view_hits = 0;
    for (unsigned long long k = 0; k < ops; ++k) {
        const unsigned long long r = mix(seed ^ (t << 20) ^ k);
        const unsigned long long i = (r & 1) ? (r >> 1) % (hot_elems < n ? hot_elems : n) : (r >> 1) % n;
        if (writer) {
            a.write(i, i ^ key);
        } else if ((r >> 62) & 1) {
            const strata::PageView v = strata::view_page(s, i / per_page);
            unsigned long long x = 0;
            if (v.resident) x = __ldcg((const unsigned long long*)v.data + i % per_page);
            // Fallback by element read: acquire() from divergent lanes would hold up to 32 pins
            // per warp, more than a small cache has frames for a full grid.
            if (strata::view_valid(s, v)) ++view_hits;
            else x = a.read(i);
            if (x != (i ^ key)) ++wrong;
        } else if (a.read(i) != (i ^ key)) {
            ++wrong;
        }
    }
    strata::count_hits(s, view_hits);
    if (wrong) atomicAdd(bad, wrong);
}

// A warp per page: acquires it for reading and counts elements that are not i ^ key.
extern "C" __global__ void check_pages(StrataSpace s, unsigned long long key, unsigned long long* bad) {
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / 32);
    const unsigned long long w = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    const unsigned long long per_page = strata::page_bytes(s) / 8;
    unsigned long long wrong = 0;
    for (unsigned long long q = w; q < strata::page_count(s); q += warps) {
        const strata::PageRef r = strata::acquire(s, q, false);
        for (unsigned long long j = threadIdx.x & 31; j < per_page; j += 32)
            if (__ldcg((const unsigned long long*)r.data + j) != ((q * per_page + j) ^ key)) ++wrong;
        strata::release(s, r);
    }
    if (wrong) atomicAdd(bad, wrong);
}
