// Kernels of strata.torch.EmbeddingBag: pooled lookups (forward) and sparse updates applied in
// place with atomic adds (backward with a fused SGD or row-wise Adagrad step).
//
// One warp per bag (forward, SGD, gradient accumulation) or per distinct row (Adagrad): the warp
// holds a whole row in registers, PER floats per lane in vectors of VEC floats; vector k of lane
// l is vector k * 32 + l of the row, so each load instruction of the warp reads one contiguous
// stretch (coalesced, which matters most when rows come over PCIe).
//
// Compile with -DDIM=<floats per row> -DSTRIDE=<floats between row starts in the table>. In a
// Strata space STRIDE * 4 is a power of two no larger than the page size, so a row never
// straddles two pages. Each kernel exists twice: *_space (the table in a Strata space) and *_ptr
// (a plain pointer: GPU memory or zero-copy pinned host memory; the benchmark's baselines and
// the Adagrad gradient buffer).
//
// Ids are int64 (as PyTorch gives them). Bag b is ids [offsets[b], offsets[b + 1]), the last
// bag running to the end of the ids when offsets has no entry after it (n_offsets == bags, as
// torch's default; include_last_offset gives bags + 1 entries); without offsets (2-D input) bag
// b is ids [b * fixed_len, (b + 1) * fixed_len). padding_idx < 0 means none. An id outside
// [0, rows) is never read or written: it is skipped and counted in err[0], the first one seen
// stored in err[1] (initially ~0), for the host to raise.
#include "strata.cuh"

typedef unsigned long long u64;
typedef long long i64;

#ifndef DIM
#error "compile with -DDIM=<floats per row>"
#endif
#ifndef STRIDE
#define STRIDE DIM
#endif
#if DIM % 128 == 0
#define VEC 4
typedef float4 vec_t;
#elif DIM % 64 == 0
#define VEC 2
typedef float2 vec_t;
#else
#define VEC 1
typedef float vec_t;
#endif
#define NV ((DIM + 32 * VEC - 1) / (32 * VEC))  // vectors per lane
#define PER (NV * VEC)                           // floats per lane
#define FULL_MASK 0xFFFFFFFFu

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31; }
// Whether vector k of this lane lies inside the row (always, unless DIM % 32 != 0).
__device__ __forceinline__ bool vec_in_row(int k) { return (k * 32 + lane_id()) * VEC < DIM; }

__device__ __forceinline__ void to_floats(const float4& v, float* f) {
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
}
__device__ __forceinline__ void to_floats(const float2& v, float* f) { f[0] = v.x; f[1] = v.y; }
__device__ __forceinline__ void to_floats(const float& v, float* f) { f[0] = v; }
__device__ __forceinline__ void from_floats(const float* f, float4* v) { *v = make_float4(f[0], f[1], f[2], f[3]); }
__device__ __forceinline__ void from_floats(const float* f, float2* v) { *v = make_float2(f[0], f[1]); }
__device__ __forceinline__ void from_floats(const float* f, float* v) { *v = f[0]; }

// vals = this lane's floats of `row` (through L2: frames are reused by other pages).
__device__ __forceinline__ void load_row(const float* row, float* vals) {
    const vec_t* v = (const vec_t*)row;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        if (vec_in_row(k)) to_floats(__ldcg(v + k * 32 + lane_id()), vals + k * VEC);
        else for (int j = 0; j < VEC; ++j) vals[k * VEC + j] = 0.0f;
    }
}
// vals = this lane's floats of a plain GPU-memory row (grad_output, the gradient buffer).
__device__ __forceinline__ void load_row_plain(const float* row, float* vals) {
    const vec_t* v = (const vec_t*)row;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        if (vec_in_row(k)) to_floats(v[k * 32 + lane_id()], vals + k * VEC);
        else for (int j = 0; j < VEC; ++j) vals[k * VEC + j] = 0.0f;
    }
}
__device__ __forceinline__ void store_row(float* row, const float* vals) {
    vec_t* v = (vec_t*)row;
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (vec_in_row(k)) from_floats(vals + k * VEC, v + k * 32 + lane_id());
}
// row += a * g, element by element with atomic adds (other warps update the same rows).
__device__ __forceinline__ void atomic_axpy(float* row, float a, const float* g) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        if (!vec_in_row(k)) continue;
        float* p = row + (k * 32 + lane_id()) * VEC;
        float d[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) d[j] = a * g[k * VEC + j];
#if VEC > 1 && __CUDA_ARCH__ >= 900
        // One vector atomic (sm_90 and later) instead of VEC scalar ones.
        vec_t v;
        from_floats(d, &v);
        atomicAdd((vec_t*)p, v);
#else
#pragma unroll
        for (int j = 0; j < VEC; ++j) atomicAdd(p + j, d[j]);
#endif
    }
}

// The table in a Strata space: row r at byte r * STRIDE * 4.
struct SpaceTable {
    StrataSpace s;
    // acc += a * row. Rows up to 1 KiB on a resident page are read without a pin (view_page:
    // no atomic, checked afterwards); a miss, a page that moved meanwhile, or a longer row
    // takes the pinned path (whose two atomics a long row amortises).
    __device__ __forceinline__ void axpy(i64 row, float a, float* acc, u64& hits) const {
        const u64 byte = (u64)row * (STRIDE * 4ull);
        const u64 page = byte >> s.page_shift;
        const u64 off = byte & ((1ull << s.page_shift) - 1);
        float vals[PER];
#if PER <= 8
        const strata::PageView v = strata::view_page(s, page);
        if (__all_sync(FULL_MASK, v.resident)) {
            load_row((const float*)(v.data + off), vals);
            if (__all_sync(FULL_MASK, strata::view_valid(s, v))) {
#pragma unroll
                for (int k = 0; k < PER; ++k) acc[k] += a * vals[k];
                ++hits;
                return;
            }
        }
#endif
        const strata::PageRef r = strata::acquire_page(s, page, false);
        load_row((const float*)(r.data + off), vals);
        strata::release_page(s, r);
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] += a * vals[k];
    }
    // row += a * g in place (the page pinned for writing, so it is marked dirty and written
    // back when evicted).
    __device__ __forceinline__ void add(i64 row, float a, const float* g) const {
        const u64 byte = (u64)row * (STRIDE * 4ull);
        const strata::PageRef r = strata::acquire_page(s, byte >> s.page_shift, true);
        atomic_axpy((float*)(r.data + (byte & ((1ull << s.page_shift) - 1))), a, g);
        strata::release_page(s, r);
    }
    __device__ __forceinline__ void done(u64 hits) const {
        if (lane_id() == 0) strata::count_hits(s, hits);
    }
};

// A plain table: row r at base + r * stride floats.
struct PtrTable {
    float* base;
    u64 stride;
    __device__ __forceinline__ void axpy(i64 row, float a, float* acc, u64&) const {
        float vals[PER];
        load_row(base + (u64)row * stride, vals);
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] += a * vals[k];
    }
    __device__ __forceinline__ void add(i64 row, float a, const float* g) const {
        atomic_axpy(base + (u64)row * stride, a, g);
    }
    __device__ __forceinline__ void done(u64) const {}
};

// Whether `id` names a row to use: not the padding row, and in range (else counted in err).
__device__ __forceinline__ bool usable(i64 id, i64 rows, i64 padding_idx, u64* err) {
    if (padding_idx >= 0 && id == padding_idx) return false;
    if (id < 0 || id >= rows) {
        if (lane_id() == 0) {
            atomicAdd(err, 1ull);
            atomicCAS(err + 1, ~0ull, (u64)id);
        }
        return false;
    }
    return true;
}

// Every bag kernel takes the bags as (ids, n_ids, offsets, n_offsets, fixed_len), see above.
#define BAG_PARAMS const i64 *ids, i64 n_ids, const i64 *offsets, i64 n_offsets, i64 fixed_len
#define BAG_ARGS ids, n_ids, offsets, n_offsets, fixed_len

// The ids of bag b: [*begin, *end), clamped to [0, n_ids] so a bad offset never reads past ids.
__device__ __forceinline__ void bag_range(const i64* offsets, i64 n_offsets, i64 fixed_len, u64 b, i64 n_ids,
                                          i64* begin, i64* end) {
    i64 s0, s1;
    if (offsets) {
        s0 = offsets[b];
        s1 = (i64)b + 1 < n_offsets ? offsets[b + 1] : n_ids;
    } else {
        s0 = (i64)b * fixed_len;
        s1 = s0 + fixed_len;
    }
    s0 = s0 < 0 ? 0 : (s0 > n_ids ? n_ids : s0);
    s1 = s1 < s0 ? s0 : (s1 > n_ids ? n_ids : s1);
    *begin = s0;
    *end = s1;
}

// Usable ids in [begin, end) (the divisor of mean mode).
__device__ __forceinline__ i64 bag_count(const i64* ids, i64 begin, i64 end, i64 rows, i64 padding_idx) {
    i64 n = 0;
    for (i64 j = begin + lane_id(); j < end; j += 32) {
        const i64 id = ids[j];
        n += (!(padding_idx >= 0 && id == padding_idx) && id >= 0 && id < rows) ? 1 : 0;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(FULL_MASK, n, o);
    return n;
}

// out[b] = sum (or mean) over bag b of weight_j * row(ids[j]).
template <class Table>
__device__ void forward(const Table& t, BAG_PARAMS, const float* weights, u64 bags, i64 rows, int mean,
                        i64 padding_idx, float* out, u64* err) {
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    u64 hits = 0;
    for (u64 b = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; b < bags; b += warps) {
        float acc[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] = 0.0f;
        i64 begin, end, used = 0;
        bag_range(offsets, n_offsets, fixed_len, b, n_ids, &begin, &end);
        for (i64 j0 = begin; j0 < end; j0 += 32) {
            // Each lane loads one id (and weight) of the next 32; the warp walks them by shuffles.
            const int count = end - j0 < 32 ? (int)(end - j0) : 32;
            const i64 id = (int)lane_id() < count ? ids[j0 + lane_id()] : 0;
            const float w = weights && (int)lane_id() < count ? weights[j0 + lane_id()] : 1.0f;
            for (int j = 0; j < count; ++j) {
                const i64 row = __shfl_sync(FULL_MASK, id, j);
                const float a = __shfl_sync(FULL_MASK, w, j);
                if (!usable(row, rows, padding_idx, err)) continue;
                t.axpy(row, a, acc, hits);
                ++used;
            }
        }
        const float scale = mean && used ? 1.0f / (float)used : 1.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] *= scale;
        store_row(out + b * (u64)DIM, acc);
    }
    t.done(hits);
}

// For every id j of bag b: table[target[j]] += -lr * weight_j * scale_b * grad[b], where scale_b
// is 1/count in mean mode. With target = ids and the table, an SGD step applied in place; with
// target = the ids' distinct-row numbers, a plain gradient buffer and lr = -1, the per-row
// gradient sums Adagrad needs.
template <class Table>
__device__ void scatter(const Table& t, BAG_PARAMS, const i64* target, const float* weights, u64 bags, i64 rows,
                        int mean, i64 padding_idx, const float* grad, float lr, u64* err) {
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 b = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; b < bags; b += warps) {
        i64 begin, end;
        bag_range(offsets, n_offsets, fixed_len, b, n_ids, &begin, &end);
        if (begin == end) continue;
        float g[PER];
        load_row_plain(grad + b * (u64)DIM, g);
        const i64 n = mean ? bag_count(ids, begin, end, rows, padding_idx) : 1;
        const float scale = -lr / (float)(n ? n : 1);
        for (i64 j0 = begin; j0 < end; j0 += 32) {
            const int count = end - j0 < 32 ? (int)(end - j0) : 32;
            const i64 id = (int)lane_id() < count ? ids[j0 + lane_id()] : 0;
            const i64 to = (int)lane_id() < count ? target[j0 + lane_id()] : 0;
            const float w = weights && (int)lane_id() < count ? weights[j0 + lane_id()] : 1.0f;
            for (int j = 0; j < count; ++j) {
                const i64 row = __shfl_sync(FULL_MASK, id, j);
                const i64 dst = __shfl_sync(FULL_MASK, to, j);
                const float a = __shfl_sync(FULL_MASK, w, j) * scale;
                if (!usable(row, rows, padding_idx, err)) continue;
                t.add(dst, a, g);
            }
        }
    }
}

// Row-wise Adagrad over distinct rows: for u with rows_of[u] = r a usable row,
//   state[r] += mean(gsum[u]^2);  table[r] -= lr * gsum[u] / (sqrt(state[r]) + eps).
// One warp per distinct row, so state needs no atomic; the row update is atomic like SGD's.
template <class Table>
__device__ void adagrad(const Table& t, const i64* rows_of, u64 n, const float* gsum, float* state, i64 rows,
                        i64 padding_idx, float lr, float eps) {
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 u = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; u < n; u += warps) {
        const i64 r = rows_of[u];
        if (r < 0 || r >= rows || r == padding_idx) continue;  // unused slot, or skipped id
        float g[PER];
        load_row_plain(gsum + u * (u64)DIM, g);
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) sq += g[k] * g[k];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(FULL_MASK, sq, o);
        const float s = state[r] + sq / (float)DIM;
        if (lane_id() == 0) state[r] = s;
        t.add(r, -lr / (sqrtf(s) + eps), g);
    }
}

extern "C" __global__ void eb_forward_space(StrataSpace s, BAG_PARAMS, const float* weights, u64 bags, i64 rows,
                                            int mean, i64 padding_idx, float* out, u64* err) {
    forward(SpaceTable{s}, BAG_ARGS, weights, bags, rows, mean, padding_idx, out, err);
}
extern "C" __global__ void eb_forward_ptr(float* table, BAG_PARAMS, const float* weights, u64 bags, i64 rows,
                                          int mean, i64 padding_idx, float* out, u64* err) {
    forward(PtrTable{table, STRIDE}, BAG_ARGS, weights, bags, rows, mean, padding_idx, out, err);
}
extern "C" __global__ void eb_sgd_space(StrataSpace s, BAG_PARAMS, const float* weights, u64 bags, i64 rows,
                                        int mean, i64 padding_idx, const float* grad, float lr, u64* err) {
    scatter(SpaceTable{s}, BAG_ARGS, ids, weights, bags, rows, mean, padding_idx, grad, lr, err);
}
extern "C" __global__ void eb_sgd_ptr(float* table, BAG_PARAMS, const float* weights, u64 bags, i64 rows,
                                      int mean, i64 padding_idx, const float* grad, float lr, u64* err) {
    scatter(PtrTable{table, STRIDE}, BAG_ARGS, ids, weights, bags, rows, mean, padding_idx, grad, lr, err);
}
// gsum[slot[j]] += weight_j * scale_b * grad[b] (gsum: n_ids x DIM floats, zeroed by the host).
extern "C" __global__ void eb_grad_sum(float* gsum, BAG_PARAMS, const i64* slot, const float* weights, u64 bags,
                                       i64 rows, int mean, i64 padding_idx, const float* grad, u64* err) {
    scatter(PtrTable{gsum, DIM}, BAG_ARGS, slot, weights, bags, rows, mean, padding_idx, grad, -1.0f, err);
}
extern "C" __global__ void eb_adagrad_space(StrataSpace s, const i64* rows_of, u64 n, const float* gsum,
                                            float* state, i64 rows, i64 padding_idx, float lr, float eps) {
    adagrad(SpaceTable{s}, rows_of, n, gsum, state, rows, padding_idx, lr, eps);
}
extern "C" __global__ void eb_adagrad_ptr(float* table, const i64* rows_of, u64 n, const float* gsum, float* state,
                                          i64 rows, i64 padding_idx, float lr, float eps) {
    adagrad(PtrTable{table, STRIDE}, rows_of, n, gsum, state, rows, padding_idx, lr, eps);
}
