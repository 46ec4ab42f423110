// Kernels of tests/remote_access.rs.
#include "strata.cuh"
__device__ __forceinline__ unsigned long long tmix(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}
// Thread t owns the elements i with i % threads == t (threads is a multiple of 4, so
// i % 4 == t % 4). Lanes with t % 4 == 0 or 1 update their own elements x -> 3x + i (read then
// write: order-sensitive), lanes with t % 4 == 2 add i | 1 to theirs with atomics, and lanes with
// t % 4 == 3 read random elements i % 4 == 3 anywhere (never written) and count those that do
// not hold their initial value (the fill's word, `init_seed`). Returns that count.
__device__ unsigned long long mixed_lane_ops(strata::Array<unsigned long long>& a, unsigned long long t,
                                             unsigned long long threads, unsigned long long ops,
                                             unsigned long long seed, unsigned long long init_seed) {
    const unsigned long long n = a.size();
    const unsigned long long per = n / threads;
    if (per == 0) return 0;
    unsigned long long wrong = 0;
    for (unsigned long long k = 0; k < ops; ++k) {
        const unsigned long long r = tmix(seed ^ (t * 0x9E3779B97F4A7C15ull) ^ k);
        if ((t & 3) == 3) {
            const unsigned long long i = (r % (n / 4)) * 4 + 3;
            wrong += a.read(i) != tmix(i ^ init_seed);
        } else {
            const unsigned long long i = t + threads * (r % per);
            if ((t & 3) == 2) a.atomic_add(i, i | 1ull);
            else a.write(i, a.read(i) * 3 + i);
        }
    }
    return wrong;
}

// mixed_lane_ops in one space; the wrong reads are counted in bad[0].
extern "C" __global__ void mixed_lanes(StrataSpace s, unsigned long long ops, unsigned long long seed,
                                       unsigned long long init_seed, unsigned long long* bad) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long wrong = mixed_lane_ops(a, t, threads, ops, seed, init_seed);
    if (wrong) atomicAdd(bad, wrong);
}

// mixed_lanes over two spaces at once: thread t works in space (t >> 2) & 1, with the roles and
// element ownership of mixed_lanes, so every warp has lanes of both spaces in every role (and
// the two spaces may differ in remote-access mode, page size and cache).
extern "C" __global__ void mixed_lanes_two_spaces(StrataSpace s0, StrataSpace s1, unsigned long long ops,
                                                  unsigned long long seed, unsigned long long init0,
                                                  unsigned long long init1, unsigned long long* bad) {
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const bool second = (t >> 2) & 1;
    strata::Array<unsigned long long> a(second ? s1 : s0);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long wrong = mixed_lane_ops(a, t, threads, ops, seed, second ? init1 : init0);
    if (wrong) atomicAdd(bad, wrong);
}

// One warp per page (grid-stride): sums[p] = the wrapping sum of page p's words, read through
// strata::acquire_page with `read_mode` (STRATA_READ_*).
extern "C" __global__ void page_sums(StrataSpace s, unsigned read_mode, unsigned long long* sums) {
    const unsigned long long warps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long words = (1ull << s.page_shift) / 8;
    for (unsigned long long p = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) >> 5; p < s.pages;
         p += warps) {
        strata::PageRef r = strata::acquire_page(s, p, false, false, read_mode);
        const unsigned long long* w = (const unsigned long long*)r.data;
        unsigned long long sum = 0;
        for (unsigned long long i = threadIdx.x & 31; i < words; i += 32) sum += __ldcg(w + i);
        strata::release_page(s, r);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        if ((threadIdx.x & 31) == 0) sums[p] = sum;
    }
}

// One warp per page (grid-stride), lanes split: odd lanes acquire the page for writing and, if
// that succeeds, add 1 to its word `lane`; even lanes read the page (in place where not
// resident) and the warp's readers store their wrapping sum of the page in sums[p]. In a
// read-only space the writers' acquire fails (nothing written) while the readers go on.
extern "C" __global__ void page_readers_and_writers(StrataSpace s, unsigned long long* sums,
                                                    unsigned long long* writes_done) {
    const unsigned long long warps = ((unsigned long long)gridDim.x * blockDim.x) >> 5;
    const unsigned long long words = (1ull << s.page_shift) / 8;
    const unsigned lane = threadIdx.x & 31;
    const bool writer = (lane & 1) != 0;
    for (unsigned long long p = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) >> 5; p < s.pages;
         p += warps) {
        strata::PageRef r = strata::acquire_page(s, p, writer, false, STRATA_READ_IN_PLACE);
        unsigned long long* w = (unsigned long long*)r.data;
        unsigned long long sum = 0;
        if (writer) {
            if (r.ok) {
                atomicAdd(w + lane, 1ull);
                atomicAdd(writes_done, 1ull);
            }
        }
        __syncwarp();
        if (!writer) {
            for (unsigned long long i = lane / 2; i < words; i += 16) sum += __ldcg(w + i);
        }
        strata::release_page(s, r);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        if (lane == 0) sums[p] = sum;
    }
}
