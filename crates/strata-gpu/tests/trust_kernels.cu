// Kernels of the trust tests (tests/trust.rs): lanes of a warp that differ in read/write and in
// space, more pins than frames, page indices past the end, long writers for the ordering tests.
#include "strata.cuh"

__device__ __forceinline__ unsigned long long tmix(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}
__device__ __forceinline__ unsigned long long gwarp() { return (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ unsigned long long nwarps() { return (unsigned long long)gridDim.x * (blockDim.x / 32); }

// Warp w owns pages w, w + W, ...; each round it picks one of them at random and acquires it
// with every lane on the same page, but only the lanes in `writers` (never lane 0, the group's
// leader) ask to write; each writer sets word `lane` of the page to a value of (page, round).
extern "C" __global__ void mixed_rw(StrataSpace s, unsigned long long rounds, unsigned long long seed,
                                    unsigned writers) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long w = gwarp(), W = nwarps();
    const unsigned long long mine = (s.pages - w + W - 1) / W;
    if (w >= s.pages) return;
    for (unsigned long long r = 0; r < rounds; ++r) {
        const unsigned long long page = w + W * (tmix(seed ^ (w << 24) ^ r) % mine);
        const bool write = (writers >> lane) & 1u;
        strata::PageRef ref = strata::acquire(s, page, write);
        if (write) ((unsigned long long*)ref.data)[lane] = tmix(seed ^ (page << 20) ^ (r << 8) ^ lane);
        strata::release(s, ref);
    }
}

// Every thread updates element i (grid-strided) of one of two spaces, chosen per element:
// x = x * 3 + i, through the element API (both spaces hold the same number of elements, so
// lanes of one warp use the same page number in different spaces).
extern "C" __global__ void two_spaces_elements(StrataSpace a, StrataSpace b, unsigned long long seed) {
    strata::Array<unsigned long long> xa(a), xb(b);
    const unsigned long long n = xa.size();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (tmix(seed ^ i) & 1) xa.write(i, xa.read(i) * 3 + i);
        else xb.write(i, xb.read(i) * 3 + i);
    }
}

// Page-granular: warp w takes page p = w, w + W, ... of both spaces; each lane picks its space
// at random and adds (lane + 1) to word `lane` of page p there.
extern "C" __global__ void two_spaces_pages(StrataSpace a, StrataSpace b, unsigned long long seed) {
    const unsigned lane = threadIdx.x & 31;
    for (unsigned long long p = gwarp(); p < a.pages; p += nwarps()) {
        const bool in_a = tmix(seed ^ (p << 5) ^ lane) & 1;
        const StrataSpace& s = in_a ? a : b;
        strata::PageRef r = strata::acquire(s, p, true);
        ((unsigned long long*)r.data)[lane] += lane + 1;
        strata::release(s, r);
    }
}

// One warp pins `distinct` different pages at once (lane l takes page base + l % distinct)
// and writes its lane's word; `rounds` times with a fresh base. Records per lane whether the
// access succeeded (ok[lane] counts successes).
extern "C" __global__ void many_pins(StrataSpace s, unsigned distinct, unsigned long long rounds,
                                     unsigned long long seed, unsigned long long* ok) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long w = gwarp();
    for (unsigned long long r = 0; r < rounds; ++r) {
        const unsigned long long base = tmix(seed ^ (w << 32) ^ r) % (s.pages - distinct + 1);
        const unsigned long long page = base + lane % distinct;
        strata::PageRef ref = strata::acquire(s, page, true);
        if (ref.ok) {
            // Lanes of one page group write disjoint words: word index = lane.
            ((unsigned long long*)ref.data)[lane] = page * 1000 + lane;
            atomicAdd(&ok[w * 32 + lane], 1ull);
        }
        strata::release(s, ref);
    }
}

// Reads pages [0, pages) in order `passes` times (warps strided), so pages get re-referenced
// and the scan-resistant policy fills its protected segment.
extern "C" __global__ void warm_pages(StrataSpace s, unsigned long long pages, unsigned long long passes,
                                      unsigned long long* sink) {
    unsigned long long acc = 0;
    for (unsigned long long k = 0; k < passes; ++k)
        for (unsigned long long p = gwarp(); p < pages; p += nwarps()) {
            strata::PageRef r = strata::acquire(s, p, false);
            acc += __ldcg((const unsigned long long*)r.data + (threadIdx.x & 31));
            strata::release(s, r);
        }
    if (acc == 0x5EED) sink[0] = acc;
}

// Lane l asks for page `first + l` (the test puts some past the end) through acquire (mode 0),
// acquire_page (1) or view_page (2); lanes whose access succeeds write/read their word.
// out[l] = 1 if the lane's access succeeded, 2 if it failed (out holds 64 words).
extern "C" __global__ void page_oob(StrataSpace s, unsigned long long first, int mode, unsigned long long* out) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long page = first + lane;
    if (mode == 2) {
        strata::PageView v = strata::view_page(s, page);
        unsigned long long x = v.resident ? __ldcg((const unsigned long long*)v.data + lane) : 0;
        out[lane] = strata::view_valid(s, v) ? 1 : 2;
        out[32 + lane] = x;  // keeps the load
        return;
    }
    strata::PageRef r = mode == 0 ? strata::acquire(s, page, true) : strata::acquire_page(s, page, true);
    if (r.ok) ((unsigned long long*)r.data)[lane] ^= 0xFFull;
    out[lane] = r.ok ? 1 : 2;
    strata::release(s, r);
}

// Writes every element `passes` times, value (i, pass), the last pass's value staying: a long
// writer for the ordering tests. Bulk path (acquire with write).
extern "C" __global__ void slow_writer(StrataSpace s, unsigned long long passes, unsigned long long seed) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long words = 1ull << (s.page_shift - 3);
    for (unsigned long long k = 0; k < passes; ++k)
        for (unsigned long long p = gwarp(); p < s.pages; p += nwarps()) {
            strata::PageRef r = strata::acquire(s, p, true);
            unsigned long long* d = (unsigned long long*)r.data;
            for (unsigned long long i = lane; i < words; i += 32) __stcg(d + i, tmix(seed ^ (p * words + i)) + k);
            strata::release(s, r);
        }
}
