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
// not hold their initial value (the fill's word, `init_seed`) in bad[0].
extern "C" __global__ void mixed_lanes(StrataSpace s, unsigned long long ops, unsigned long long seed,
                                       unsigned long long init_seed, unsigned long long* bad) {
    strata::Array<unsigned long long> a(s);
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long per = a.size() / threads;
    const unsigned long long n = a.size();
    if (per == 0) return;
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
    if (wrong) atomicAdd(bad, wrong);
}
