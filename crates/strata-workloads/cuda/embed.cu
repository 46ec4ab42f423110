// Embedding lookups with sum pooling for `strata bench embed`.
//
// One warp per bag: for each of the bag's row ids the warp reads the whole row (EMBED_DIM
// floats, EMBED_DIM / 32 per lane, in coalesced vector loads) and accumulates it in
// registers; the pooled row is written once at the end.
//
// Compile with -DEMBED_DIM=<floats per row> (a multiple of 32, at most 1024). Rows never
// straddle pages: the host checks that the row size divides the page size.
//   gather_space  the table lives in a Strata space: a row on a resident page is read
//                 optimistically (strata::view_page, no atomic), a miss or a page that moved
//                 while it was read takes the pinned path (one page pin per row)
//   gather_ptr    a plain pointer: GPU memory, zero-copy pinned host memory, or UVM
#include "strata.cuh"

typedef unsigned long long u64;
typedef unsigned int u32;

#ifndef EMBED_DIM
#error "compile with -DEMBED_DIM=<floats per row>"
#endif
#if EMBED_DIM % 32 != 0 || EMBED_DIM > 1024
#error "EMBED_DIM must be a multiple of 32 and at most 1024"
#endif
#define PER_LANE (EMBED_DIM / 32)
#define FULL_MASK 0xFFFFFFFFu

// Adds this lane's PER_LANE floats of a row to acc, with the widest vector loads that keep
// every load instruction of the warp on one contiguous stretch of the row: vector k of lane l
// is vector k * 32 + l of the row (coalesced 128/256/512-byte reads, which matter most for
// zero-copy reads over PCIe).
#if PER_LANE % 4 == 0
#define VEC 4
typedef float4 vec_t;
#elif PER_LANE % 2 == 0
#define VEC 2
typedef float2 vec_t;
#else
#define VEC 1
typedef float vec_t;
#endif
#define VECS_PER_LANE (PER_LANE / VEC)

__device__ __forceinline__ void add_vec(float* acc, const float4& v) {
    acc[0] += v.x;
    acc[1] += v.y;
    acc[2] += v.z;
    acc[3] += v.w;
}
__device__ __forceinline__ void add_vec(float* acc, const float2& v) {
    acc[0] += v.x;
    acc[1] += v.y;
}
__device__ __forceinline__ void add_vec(float* acc, const float& v) { acc[0] += v; }

__device__ __forceinline__ void add_row(const float* row, float* acc) {
    const unsigned lane = threadIdx.x & 31;
    const vec_t* vecs = (const vec_t*)row;
#pragma unroll
    for (int k = 0; k < VECS_PER_LANE; ++k) add_vec(acc + VEC * k, __ldcg(vecs + k * 32 + lane));
}

// Writes acc to the output row in the same interleaved order.
__device__ __forceinline__ void store_row(float* row, const float* acc) {
    const unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < VECS_PER_LANE; ++k) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) row[(k * 32 + lane) * VEC + j] = acc[VEC * k + j];
    }
}

struct PtrTable {
    const float* base;
    __device__ __forceinline__ void add(u32 row, float* acc, u64&) const { add_row(base + (u64)row * EMBED_DIM, acc); }
    __device__ __forceinline__ void done(u64) const {}
};

struct SpaceTable {
    StrataSpace s;
    __device__ __forceinline__ void add(u32 row, float* acc, u64& hits) const {
        const u64 byte = (u64)row * (EMBED_DIM * 4);
        if (byte + EMBED_DIM * 4 > s.size_bytes) {  // warp-uniform: one row per warp
            if ((threadIdx.x & 31) == 0) strata::detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, byte / 4);
            return;
        }
        const u64 page = byte >> s.page_shift;
        const u64 off = byte & ((1ull << s.page_shift) - 1);
        // Optimistic: read the row into registers without a pin, keep it if every lane's page
        // word shows the page stayed in its frame meanwhile (most rows of a skewed serving load).
        // Rows of every size: on an H100 a pin's acquire also invalidates the SM's L1, and 4 KiB
        // rows ran 34 % faster resident this way (8.9 -> 5.9 ms), where an H200 once measured
        // them 27 % slower (crates/strata-workloads/results/session11-embed/).
        const strata::PageView v = strata::view_page(s, page);
        if (__all_sync(FULL_MASK, v.resident)) {
            float row_vals[PER_LANE];
#pragma unroll
            for (int k = 0; k < PER_LANE; ++k) row_vals[k] = 0.0f;
            add_row((const float*)(v.data + off), row_vals);
            if (__all_sync(FULL_MASK, strata::view_valid(s, v))) {
#pragma unroll
                for (int k = 0; k < PER_LANE; ++k) acc[k] += row_vals[k];
                ++hits;
                return;
            }
        }
        // A row smaller than its page is read in place from the host copy until the page earns
        // a frame (a miss then moves the row's bytes, not the page's). A row that fills its
        // page moves the same bytes either way, so it migrates at once and is a hit next time
        // (in place, a row looked up once per pass was read over the bus in every pass, even
        // with the whole table cached: 8.5x zero-copy at 1x on an H100).
        const unsigned mode = EMBED_DIM * 4 >= (1u << s.page_shift) ? STRATA_READ_MIGRATE : STRATA_READ_REMOTE_OK;
        const strata::PageRef r = strata::acquire_page(s, page, false, false, mode);
        add_row((const float*)(r.data + off), acc);
        strata::release_page(s, r);
    }
    __device__ __forceinline__ void done(u64 hits) const {
        if ((threadIdx.x & 31) == 0) strata::count_hits(s, hits);
    }
};

template <class Table>
__device__ void gather(const Table& table, const u32* ids, u64 bags, u32 bag, float* out) {
    const unsigned lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    u64 hits = 0;  // rows served optimistically (counted once per warp at the end)
    for (u64 b = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; b < bags; b += warps) {
        float acc[PER_LANE];
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) acc[k] = 0.0f;
        const u32* mine = ids + b * bag;
        for (u32 j0 = 0; j0 < bag; j0 += 32) {
            // Each lane loads one id of the next 32; the warp walks them via shuffles.
            const u32 count = bag - j0 < 32 ? bag - j0 : 32;
            const u32 id = lane < count ? mine[j0 + lane] : 0u;
            for (u32 j = 0; j < count; ++j) table.add(__shfl_sync(FULL_MASK, id, j), acc, hits);
        }
        store_row(out + b * EMBED_DIM, acc);
    }
    table.done(hits);
}

// As the graph's space kernels do, the gather over a space bounds its registers to four blocks
// of 256 per SM where rows are at most 1 KiB: Strata's inlined fault path would otherwise set
// the register count to one block per SM, and the rarely taken fault path spills instead.
// Longer rows keep their PER_LANE accumulators (32 for 4 KiB) in registers unbounded.
#if PER_LANE <= 8
#define EMBED_SPACE_BOUNDS __launch_bounds__(256, 4)
#else
#define EMBED_SPACE_BOUNDS
#endif
extern "C" __global__ void EMBED_SPACE_BOUNDS gather_space(StrataSpace s, const u32* ids, u64 bags, u32 bag,
                                                           float* out) {
    gather(SpaceTable{s}, ids, bags, bag, out);
}

extern "C" __global__ void gather_ptr(const float* table, const u32* ids, u64 bags, u32 bag, float* out) {
    gather(PtrTable{table}, ids, bags, bag, out);
}
