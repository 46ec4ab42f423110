// Where a resident random gather through Strata spends its time (issue 12: resident gathers at
// 43 % of the HBM gather ceiling). A standalone experiment, built with nvcc on the device:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I crates/strata-gpu/cuda -o /tmp/gather_anatomy \
//        scripts/experiments/gather_anatomy.cu && /tmp/gather_anatomy
//
// It builds one space by hand: every page resident in a frame (frames shuffled against pages,
// reference bits set as after a first pass), no host copy. Then it times the same 8-byte random
// gathers built up step by step, from a plain load out to Array::read. Each kernel runs with
// its own full grid and with the one-block-per-SM grid gpu-micro uses. Medians of 7 CUDA-event
// timings after a warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strata.cuh"

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t err_ = (x);                                                                  \
        if (err_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

__device__ __forceinline__ strata_u64 mix(strata_u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// The steps, each adding to the one before: 0 the element at its frame address computed
// without the page table (the HBM ceiling's load); 1 + the page word (relaxed); 2 + acquire
// loads of the word and the element; 3 + the recheck of the word; 4 + the frame's reference
// bit; 5 + read()'s hit statistics (a __match_any_sync group per page); 6 the same count by
// runs of adjacent lanes (a shuffle); 7 Array::read itself.
template <int STEP>
__device__ __forceinline__ void gathers(const StrataSpace& s, strata_u64 count, strata_u64 seed, strata_u64* sink,
                                        const strata_u32* frame_of) {
    strata::Array<strata_u64> a(s);
    strata_u64 acc = 0;
    const strata_u64 n = s.size_bytes / 8;
    const strata_u64 threads = (strata_u64)gridDim.x * blockDim.x;
    for (strata_u64 k = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; k < count; k += threads) {
        const strata_u64 i = mix(k ^ seed) % n;
        const strata_u64 byte = i * 8, page = byte >> s.page_shift, off = byte & ((1ull << s.page_shift) - 1);
        if constexpr (STEP == 0) {
            acc += __ldcg((const strata_u64*)(s.frame_data + ((strata_u64)frame_of[page] << s.page_shift) + off));
        } else if constexpr (STEP == 1) {
            const strata_u64 w = strata::detail::load_relaxed(&s.page_table[page]);
            acc += __ldcg((const strata_u64*)(s.frame_data + ((w & STRATA_FRAME_MASK) << s.page_shift) + off));
        } else if constexpr (STEP == 7) {
            acc += a.read(i);
        } else {
            const strata_u64 w = strata::detail::load_acquire(&s.page_table[page]);
            const strata_u64 v = strata::detail::load_acquire_elem(
                (const strata_u64*)(s.frame_data + ((w & STRATA_FRAME_MASK) << s.page_shift) + off));
            const bool done =
                STEP == 2 || strata::detail::same_residency(w, strata::detail::load_relaxed(&s.page_table[page]));
            if (done) {
                if (STEP >= 4) strata::detail::touch_frame(s, (strata_u32)(w & STRATA_FRAME_MASK));
                acc += v;
            }
            if constexpr (STEP >= 5) {
                const unsigned mask = __activemask();
                const unsigned lane = strata::detail::lane_id();
                unsigned leaders;
                if constexpr (STEP == 5) {
                    const unsigned ok = __ballot_sync(mask, done);
                    const unsigned same_space = strata::detail::space_peers(mask, s);
                    const unsigned group = __match_any_sync(mask, page) & same_space & ok;
                    leaders = __ballot_sync(mask, done && lane == __ffs(group) - 1) & same_space;
                } else {
                    const strata_u64 prev = __shfl_up_sync(mask, page, 1);
                    leaders = __ballot_sync(mask, done && (lane == 0 || prev != page));
                }
                if (lane == __ffs(mask) - 1 && leaders) strata::detail::add_hits(s, __popc(leaders));
            }
        }
    }
    if (acc == 42) sink[0] = acc;
}

#define GATHER_KERNEL(NAME, BOUNDS, STEP)                                                              \
    extern "C" __global__ void BOUNDS NAME(StrataSpace s, strata_u64 count, strata_u64 seed, strata_u64* sink, \
                                           const strata_u32* frame_of) {                               \
        gathers<STEP>(s, count, seed, sink, frame_of);                                                 \
    }
#define NO_BOUNDS
GATHER_KERNEL(k_plain, NO_BOUNDS, 0)
GATHER_KERNEL(k_translate, NO_BOUNDS, 1)
GATHER_KERNEL(k_acquire, NO_BOUNDS, 2)
GATHER_KERNEL(k_recheck, NO_BOUNDS, 3)
GATHER_KERNEL(k_touch, NO_BOUNDS, 4)
GATHER_KERNEL(k_stats_match, NO_BOUNDS, 5)
GATHER_KERNEL(k_stats_adjacent, NO_BOUNDS, 6)
GATHER_KERNEL(k_read, NO_BOUNDS, 7)
// Array::read with the registers bounded (four, six and eight blocks of 256 per SM).
GATHER_KERNEL(k_read_bounded, __launch_bounds__(256, 4), 7)
GATHER_KERNEL(k_read_bounded6, __launch_bounds__(256, 6), 7)
GATHER_KERNEL(k_read_bounded8, __launch_bounds__(256, 8), 7)

typedef void (*Kernel)(StrataSpace, strata_u64, strata_u64, strata_u64*, const strata_u32*);

int main() {
    const strata_u64 page_shift = 12, pages = 131072, page = 1ull << page_shift;  // 512 MiB
    const strata_u64 count = 64ull << 20;
    strata_u64 *table, *sink;
    StrataFrame* frames;
    unsigned char* data;
    StrataCounters* counters;
    strata_u32* frame_of;
    CK(cudaMalloc(&table, pages * 8));
    CK(cudaMalloc(&frames, pages * sizeof(StrataFrame)));
    CK(cudaMalloc(&data, (pages + 1) * page));
    CK(cudaMalloc(&counters, sizeof(StrataCounters)));
    CK(cudaMalloc(&sink, 8));
    CK(cudaMalloc(&frame_of, pages * 4));
    CK(cudaMemset(counters, 0, sizeof(StrataCounters)));
    CK(cudaMemset(data, 1, (pages + 1) * page));
    std::vector<strata_u32> perm(pages);
    for (strata_u64 p = 0; p < pages; ++p) perm[p] = (strata_u32)p;
    srand(7);
    for (strata_u64 p = pages - 1; p > 0; --p) std::swap(perm[p], perm[rand() % (p + 1)]);
    std::vector<strata_u64> words(pages);
    std::vector<StrataFrame> fr(pages);
    for (strata_u64 p = 0; p < pages; ++p) {
        words[p] = (STRATA_RESIDENT << STRATA_STATE_SHIFT) | perm[p];
        fr[perm[p]].page = (strata_u32)p;
        fr[perm[p]].flags = STRATA_FRAME_REF;
    }
    CK(cudaMemcpy(table, words.data(), pages * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(frames, fr.data(), pages * sizeof(StrataFrame), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(frame_of, perm.data(), pages * 4, cudaMemcpyHostToDevice));
    StrataSpace s = {};
    s.page_table = table;
    s.frames = frames;
    s.frame_data = data;
    s.host = nullptr;
    s.counters = counters;
    s.size_bytes = pages * page;
    s.pages = pages;
    s.frame_count = (strata_u32)pages;
    s.page_shift = (strata_u32)page_shift;
    s.policy = STRATA_POLICY_CLOCK;
    s.tier = STRATA_TIER_HOST_COPY;
    s.migrate_after = 0;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    struct Entry {
        const char* name;
        Kernel k;
    } entries[] = {{"plain load (no table)", k_plain}, {"+ page word", k_translate},
                   {"+ acquire loads", k_acquire},     {"+ recheck", k_recheck},
                   {"+ reference bit", k_touch},       {"+ stats (match_any)", k_stats_match},
                   {"+ stats (adjacent)", k_stats_adjacent}, {"Array::read", k_read},
                   {"Array::read, bounded 4", k_read_bounded}, {"Array::read, bounded 6", k_read_bounded6},
                   {"Array::read, bounded 8", k_read_bounded8}};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::printf("%-24s %5s %8s | %18s | %18s\n", "kernel", "regs", "blk/SM", "full grid Mg/s", "1 blk/SM Mg/s");
    for (const Entry& e : entries) {
        cudaFuncAttributes attr;
        CK(cudaFuncGetAttributes(&attr, e.k));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.k, 256, 0));
        double rate[2];
        for (int g = 0; g < 2; ++g) {
            const int blocks = (g == 0 ? per_sm : 1) * sms;
            std::vector<float> ms;
            for (int r = 0; r < 8; ++r) {
                CK(cudaEventRecord(a));
                e.k<<<blocks, 256>>>(s, count, 0x9e3779b97f4a7c15ull + r, sink, frame_of);
                CK(cudaEventRecord(b));
                CK(cudaEventSynchronize(b));
                CK(cudaGetLastError());
                float t = 0;
                CK(cudaEventElapsedTime(&t, a, b));
                if (r > 0) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            rate[g] = count / (ms[ms.size() / 2] * 1e3);
        }
        std::printf("%-24s %5d %8d | %18.0f | %18.0f\n", e.name, attr.numRegs, per_sm, rate[0], rate[1]);
    }
    return 0;
}
