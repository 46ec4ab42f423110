// scripts/experiments/acquire_sass.cu: what an acquire load of a page word compiles to on the
// device's GPU (is the SM's L1 invalidated?). Build and disassemble there:
//   nvcc -arch=sm_90 -cubin -o /tmp/a.cubin scripts/experiments/acquire_sass.cu &&
//   cuobjdump -sass /tmp/a.cubin | grep -E 'Function|CCTL|LDG|LD\.|MEMBAR|FENCE'
// Each kernel reads one word the way Strata's fault path can, then one data element.
typedef unsigned long long u64;

__device__ __forceinline__ u64 ld_acquire_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 ld_relaxed_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

extern "C" __global__ void word_acquire(const u64* word, const int* data, int* out) {
    u64 w = ld_acquire_gpu(word + threadIdx.x);
    out[threadIdx.x] = data[(w & 1023) + threadIdx.x];
}
extern "C" __global__ void word_relaxed(const u64* word, const int* data, int* out) {
    u64 w = ld_relaxed_gpu(word + threadIdx.x);
    out[threadIdx.x] = data[(w & 1023) + threadIdx.x];
}
extern "C" __global__ void word_atomic_pin(u64* word, const int* data, int* out) {
    u64 w = atomicAdd(word + threadIdx.x, 1ull << 44);
    __threadfence();
    out[threadIdx.x] = data[(w & 1023) + threadIdx.x];
}
extern "C" __global__ void word_atomic_acquire(u64* word, const int* data, int* out) {
    u64 w;
    asm volatile("atom.acquire.gpu.global.add.u64 %0, [%1], %2;" : "=l"(w) : "l"(word + threadIdx.x), "l"(1ull << 44) : "memory");
    out[threadIdx.x] = data[(w & 1023) + threadIdx.x];
}
