// Graph kernels of `strata bench graph`: BFS (top-down and bottom-up steps of a
// direction-optimising BFS), connected components (hook + compress) and PageRank (pull).
//
// The CSR's neighbour array is the large structure. Every kernel is written once as a template
// over how that array is read, and instantiated twice:
//   *_space  the array lives in a Strata space: a warp pins the page under its rows once
//            (strata::acquire_page, all lanes on one page) and reads it from the frame;
//   *_ptr    a plain pointer: GPU memory (the upper bound), pinned host memory mapped into
//            the GPU (zero-copy, the EMOGI approach) or CUDA managed memory (UVM).
// Vertex arrays (offsets, levels, parents, labels, ranks) live in GPU memory.
//
// Work layout: a warp handles one vertex at a time (EMOGI's coalesced kernel), walking chunks
// of consecutive vertices (EMOGI's chunked variant); it reads each row in 128-byte aligned
// groups of 32 ids, so every load is one coalesced transaction. Launches must use whole warps
// (blockDim a multiple of 32); control flow around the row readers is warp-uniform, as
// strata::acquire_page requires.
#include "strata.cuh"

typedef unsigned long long u64;
typedef unsigned int u32;

#define UNREACHED 0xFFFFFFFFu
#define FULL_MASK 0xFFFFFFFFu

__device__ __forceinline__ u64 warp_index() { return (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ u64 warp_total() { return ((u64)gridDim.x * blockDim.x) >> 5; }
__device__ __forceinline__ unsigned lane() { return threadIdx.x & 31; }
__device__ __forceinline__ u64 thread_index() { return blockIdx.x * (u64)blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 thread_total() { return (u64)gridDim.x * blockDim.x; }

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Work is cut into chunks of consecutive vertices whose rows start in the same page-sized
// stretch of the neighbour array (bounds[c] .. bounds[c + 1], computed on the host), and each
// warp takes whole chunks: a page is then read by one warp, once per pass, instead of by the
// several warps whose rows share it, which would fault it back in after it was evicted. Each
// warp takes a contiguous run of chunks, so the last row of one chunk, which usually runs on
// into the next chunk's page, is read by the warp that reads that page next (its cursor still
// holds the pin); with chunks dealt round-robin that page had a second reader per pass, often
// after it had already been evicted.

// Neighbour array behind a plain pointer.
struct PtrEdges {
    const u32* ids;
    struct Cursor {};
    __device__ __forceinline__ Cursor begin() const { return Cursor{}; }
    __device__ __forceinline__ void finish(Cursor&) const {}
    __device__ __forceinline__ void read_in_place(Cursor&, bool) const {}
    // Calls visit(id) for every id of [start, end) (start < end), 32 at a time across the warp.
    // Stops after the group in which any lane's visit returned true; returns whether it did.
    template <class Visit>
    __device__ __forceinline__ bool row(Cursor&, u64 start, u64 end, Visit& visit) const {
        for (u64 base = start & ~31ull; base < end; base += 32) {
            const u64 i = base + lane();
            bool stop = false;
            if (i >= start && i < end) stop = visit(ids[i]);
            if (__any_sync(FULL_MASK, stop)) return true;
        }
        return false;
    }
};

// Neighbour array in a Strata space of 32-bit ids. The cursor keeps the warp's current page
// pinned from one row to the next (rows of consecutive vertices share pages), so a page costs
// one pin per warp rather than one per row. A warp holds at most one pin and drops it before
// it asks for another page, so warps waiting for frames never wait on each other.
struct SpaceEdges {
    StrataSpace s;
    struct Cursor {
        strata::PageRef ref;
        u64 page;
        bool held;
        unsigned read_mode;  // how pages not resident are read (strata::acquire_page)
    };
    __device__ __forceinline__ Cursor begin() const {
        Cursor c;
        c.held = false;
        c.page = ~0ull;
        c.read_mode = STRATA_READ_REMOTE_OK;
        return c;
    }
    // The caller knows how the next rows visit their pages: sparsely (true: pages not resident
    // are read where they lie) or densely (false: they move into frames, one bulk copy each).
    __device__ __forceinline__ void read_in_place(Cursor& c, bool yes) const {
        c.read_mode = yes ? STRATA_READ_IN_PLACE : STRATA_READ_MIGRATE;
    }
    __device__ __forceinline__ void finish(Cursor& c) const {
        if (c.held) strata::release_page(s, c.ref);
        c.held = false;
    }
    template <class Visit>
    __device__ __forceinline__ bool row(Cursor& c, u64 start, u64 end, Visit& visit) const {
        const u32 shift = s.page_shift - 2;  // ids per page = page bytes / 4
        if (end > (s.size_bytes >> 2)) {     // warp-uniform: a row outside the space
            if (lane() == 0) strata::detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, end - 1);
            return false;
        }
        const u64 last = (end - 1) >> shift;
        for (u64 page = start >> shift; page <= last; ++page) {
            if (!c.held || c.page != page) {
                finish(c);
                // Edge lists read once stay in the host copy until their page earns a frame.
                c.ref = strata::acquire_page(s, page, false, false, c.read_mode);
                c.page = page;
                c.held = true;
            }
            const u32* frame = (const u32*)c.ref.data;
            // A frame is read through L2 only (__ldcg): it holds other pages over time, and an
            // L1 line of an earlier page must not be read. The host copy of a page read in
            // place is read as zero-copy reads it, through L1: the page's acquire, just before,
            // invalidated this multiprocessor's L1, and rows of neighbouring vertices share
            // lines, so each line crosses the bus once rather than once per row.
            const bool host = c.ref.host;
            const u64 first = page << shift;
            const u64 lo = start > first ? start : first;
            const u64 hi = end < first + (1ull << shift) ? end : first + (1ull << shift);
            bool stop = false;
            for (u64 base = lo & ~31ull; base < hi && !stop; base += 32) {
                const u64 i = base + lane();
                bool mine = false;
                if (i >= lo && i < hi) mine = visit(host ? frame[i - first] : __ldcg(frame + (i - first)));
                stop = __any_sync(FULL_MASK, mine);
            }
            if (stop) return true;
        }
        return false;
    }
};

// Calls body(v, cursor) for every vertex of this warp's chunks, in order (warp-uniform).
template <class Edges, class Body>
__device__ __forceinline__ void for_each_vertex(const Edges& edges, const u32* bounds, u64 chunks,
                                                Body body) {
    typename Edges::Cursor cursor = edges.begin();
    const u64 per_warp = (chunks + warp_total() - 1) / warp_total();
    const u64 first = warp_index() * per_warp;
    const u64 last = first + per_warp < chunks ? first + per_warp : chunks;
    for (u64 c = first; c < last; ++c) {
        const u64 stop = bounds[c + 1];
        for (u64 v = bounds[c]; v < stop; ++v) body(v, cursor);
    }
    edges.finish(cursor);
}

// ---- BFS ---------------------------------------------------------------------------------
// counters[0]: vertices discovered by this step; counters[1]: the sum of their degrees.
__device__ __forceinline__ void report_found(u64 found, u64 found_degree, u64* counters) {
    found = warp_sum(found);
    found_degree = warp_sum(found_degree);
    if (lane() == 0 && found) {
        atomicAdd(&counters[0], found);
        atomicAdd(&counters[1], found_degree);
    }
}

// Top-down, page-ordered: a warp walks its chunks (each the vertices whose rows start in one
// page-sized stretch) and first sums the row lengths of the chunk's frontier vertices. A chunk
// with no frontier vertex costs one coalesced read of its levels. A chunk whose frontier rows
// fill less than `dense_ids` ids reads them where they lie (a few rows do not pay for moving
// the page, and in top-down BFS a row is read once per search); a denser chunk lets the page
// move, as one bulk copy beats many small reads over the bus. Then the frontier vertices are
// visited in order, 32 levels read at once.
template <class Edges>
__device__ void bfs_top_down(const Edges& edges, const u32* bounds, u64 chunks, const u64* offsets, u64 n,
                             u32* levels, u32* parents,
                             u32 level, u64* counters, u64 dense_ids) {
    u64 found = 0, found_degree = 0;
    typename Edges::Cursor cursor = edges.begin();
    const u64 per_warp = (chunks + warp_total() - 1) / warp_total();
    const u64 first_chunk = warp_index() * per_warp;
    const u64 last_chunk = first_chunk + per_warp < chunks ? first_chunk + per_warp : chunks;
    for (u64 c = first_chunk; c < last_chunk; ++c) {
        const u64 lo = bounds[c], hi = bounds[c + 1];
        u64 ids = 0;
        for (u64 base = lo; base < hi; base += 32) {
            const u64 v = base + lane();
            if (v < hi && levels[v] == level) ids += offsets[v + 1] - offsets[v];
        }
        ids = warp_sum(ids);
        if (ids == 0) continue;
        edges.read_in_place(cursor, ids < dense_ids);
        for (u64 base = lo; base < hi; base += 32) {
            const u64 mine = base + lane();
            unsigned frontier = __ballot_sync(FULL_MASK, mine < hi && levels[mine] == level);
            while (frontier) {
                const u64 v = base + (__ffs(frontier) - 1);
                frontier &= frontier - 1;
                const u64 start = offsets[v], end = offsets[v + 1];
                if (start == end) continue;
                auto visit = [&](u32 w) -> bool {
                    if (*(volatile u32*)&levels[w] == UNREACHED &&
                        atomicCAS(&parents[w], UNREACHED, (u32)v) == UNREACHED) {
                        levels[w] = level + 1;
                        found += 1;
                        found_degree += offsets[w + 1] - offsets[w];
                    }
                    return false;
                };
                edges.row(cursor, start, end, visit);
            }
        }
    }
    edges.finish(cursor);
    report_found(found, found_degree, counters);
}

// Bottom-up: every unreached vertex looks for a neighbour on `level` and stops at the first.
template <class Edges>
__device__ void bfs_bottom_up(const Edges& edges, const u32* bounds, u64 chunks, const u64* offsets, u64 n,
                              u32* levels, u32* parents,
                              u32 level, u64* counters) {
    u64 found = 0, found_degree = 0;
    for_each_vertex(edges, bounds, chunks, [&](u64 v, typename Edges::Cursor& cursor) {
        if (levels[v] != UNREACHED) return;
        const u64 start = offsets[v], end = offsets[v + 1];
        if (start == end) return;
        u32 parent = UNREACHED;
        auto visit = [&](u32 w) -> bool {
            // Vertices found in this step carry level + 1, never `level`: no confusion.
            if (*(volatile u32*)&levels[w] == level) {
                parent = w;
                return true;
            }
            return false;
        };
        if (edges.row(cursor, start, end, visit)) {
            const unsigned with = __ballot_sync(FULL_MASK, parent != UNREACHED);
            const u32 chosen = __shfl_sync(FULL_MASK, parent, __ffs(with) - 1);
            if (lane() == 0) {
                parents[v] = chosen;
                levels[v] = level + 1;
                found += 1;
                found_degree += end - start;
            }
        }
    });
    report_found(found, found_degree, counters);
}

// ---- connected components -------------------------------------------------------------------
// labels[v] always names a vertex of v's component and never grows. Hook: for an arc v->w with
// labels[w] < labels[v], lower the label of v's label (and of v). Compress: pointer jumping.
// At the fixed point every component carries its smallest vertex id.

template <class Edges>
__device__ void cc_hook(const Edges& edges, const u32* bounds, u64 chunks, const u64* offsets, u64 n,
                        u32* labels, u32* changed) {
    bool any = false;
    for_each_vertex(edges, bounds, chunks, [&](u64 v, typename Edges::Cursor& cursor) {
        // Every hook pass reads every edge: pages move whole, as in pr_pull.
        edges.read_in_place(cursor, false);
        const u64 start = offsets[v], end = offsets[v + 1];
        if (start == end) return;
        const u32 mine = *(volatile u32*)&labels[v];
        auto visit = [&](u32 w) -> bool {
            const u32 theirs = *(volatile u32*)&labels[w];
            if (theirs < mine) {
                atomicMin(&labels[mine], theirs);
                atomicMin(&labels[v], theirs);
                any = true;
            }
            return false;
        };
        edges.row(cursor, start, end, visit);
    });
    if (__any_sync(FULL_MASK, any) && lane() == 0) *changed = 1;
}

extern "C" __global__ void cc_init(u32* labels, u64 n) {
    for (u64 v = thread_index(); v < n; v += thread_total()) labels[v] = (u32)v;
}

extern "C" __global__ void cc_compress(u32* labels, u64 n) {
    for (u64 v = thread_index(); v < n; v += thread_total()) {
        u32 c = *(volatile u32*)&labels[v];
        u32 next = *(volatile u32*)&labels[c];
        while (c != next) {
            c = next;
            next = *(volatile u32*)&labels[c];
        }
        labels[v] = c;
    }
}

// ---- PageRank -------------------------------------------------------------------------------
// contribution[v] = rank[v] / degree(v); degree-0 ranks are summed into *dangling (double).
extern "C" __global__ void pr_contribution(const u64* offsets, u64 n, const float* rank, float* contribution,
                                           double* dangling) {
    double lost = 0.0;
    for (u64 v = thread_index(); v < n; v += thread_total()) {
        const u64 degree = offsets[v + 1] - offsets[v];
        if (degree == 0) {
            lost += rank[v];
            contribution[v] = 0.0f;
        } else {
            contribution[v] = rank[v] / (float)degree;
        }
    }
    lost = warp_sum(lost);
    if (lane() == 0 && lost != 0.0) atomicAdd(dangling, lost);
}

extern "C" __global__ void pr_init(float* rank, u64 n) {
    for (u64 v = thread_index(); v < n; v += thread_total()) rank[v] = 1.0f / (float)n;
}

template <class Edges>
__device__ void pr_pull(const Edges& edges, const u32* bounds, u64 chunks, const u64* offsets, u64 n,
                        const float* contribution,
                        const double* dangling, float damping, float* next) {
    const float base = (float)((1.0 - damping) / (double)n + damping * *dangling / (double)n);
    for_each_vertex(edges, bounds, chunks, [&](u64 v, typename Edges::Cursor& cursor) {
        // Every iteration reads every edge, so every page of the edge list is read whole:
        // pages not resident move into frames (one bulk copy each) rather than being read in
        // place. On an H100, Kronecker scale 25 at 2x: 1399 ms migrating against 1668 ms with
        // the default remote-access reads (zero-copy 2571-2759 ms).
        edges.read_in_place(cursor, false);
        const u64 start = offsets[v], end = offsets[v + 1];
        float sum = 0.0f;
        if (start != end) {
            auto visit = [&](u32 w) -> bool {
                sum += contribution[w];
                return false;
            };
            edges.row(cursor, start, end, visit);
        }
        sum = warp_sum(sum);
        if (lane() == 0) next[v] = base + damping * sum;
    });
}

// ---- entry points ---------------------------------------------------------------------------
// Every warp kernel takes the neighbour array first, then the chunk bounds.
#define GRAPH_ENTRY_POINTS(SUFFIX, BOUNDS, PARAM, MAKE)                                            \
    extern "C" __global__ void BOUNDS bfs_top_down_##SUFFIX(PARAM, const u32* bounds, u64 chunks,       \
                                                     const u64* offsets, u64 n, u32* levels,     \
                                                     u32* parents, u32 level, u64* counters,     \
                                                     u64 dense_ids) {                             \
        MAKE;                                                                                     \
        bfs_top_down(edges, bounds, chunks, offsets, n, levels, parents, level, counters,        \
                     dense_ids);                                                                  \
    }                                                                                             \
    extern "C" __global__ void BOUNDS bfs_bottom_up_##SUFFIX(PARAM, const u32* bounds, u64 chunks,      \
                                                      const u64* offsets, u64 n, u32* levels,    \
                                                      u32* parents, u32 level, u64* counters) {  \
        MAKE;                                                                                     \
        bfs_bottom_up(edges, bounds, chunks, offsets, n, levels, parents, level, counters);      \
    }                                                                                             \
    extern "C" __global__ void BOUNDS cc_hook_##SUFFIX(PARAM, const u32* bounds, u64 chunks,            \
                                                const u64* offsets, u64 n, u32* labels,          \
                                                u32* changed) {                                   \
        MAKE;                                                                                     \
        cc_hook(edges, bounds, chunks, offsets, n, labels, changed);                              \
    }                                                                                             \
    extern "C" __global__ void BOUNDS pr_pull_##SUFFIX(PARAM, const u32* bounds, u64 chunks,            \
                                                const u64* offsets, u64 n,                       \
                                                const float* contribution, const double* dangling,\
                                                float damping, float* next) {                     \
        MAKE;                                                                                     \
        pr_pull(edges, bounds, chunks, offsets, n, contribution, dangling, damping, next);       \
    }

// The space kernels bound their registers (four blocks of 256 per SM): Strata's inlined fault
// path would otherwise set the register count to one block per SM, and these kernels are bound
// by the loads each SM keeps in flight (rows read in place over the bus, resident rows); the
// rarely taken fault path spills instead (scripts/experiments/gather_anatomy.cu).
#define GRAPH_SPACE_BOUNDS __launch_bounds__(256, 4)
#define GRAPH_NO_BOUNDS
GRAPH_ENTRY_POINTS(space, GRAPH_SPACE_BOUNDS, StrataSpace space, SpaceEdges edges{space})
GRAPH_ENTRY_POINTS(ptr, GRAPH_NO_BOUNDS, const u32* ids, PtrEdges edges{ids})

// ---- small state kernels (ordered on Strata's stream, unlike driver memsets/copies) ---------
extern "C" __global__ void fill_u32(u32* p, u64 n, u32 value) {
    for (u64 i = thread_index(); i < n; i += thread_total()) p[i] = value;
}
extern "C" __global__ void fill_u64(u64* p, u64 n, u64 value) {
    for (u64 i = thread_index(); i < n; i += thread_total()) p[i] = value;
}
extern "C" __global__ void set_u32(u32* p, u64 i, u32 value) {
    if (thread_index() == 0) p[i] = value;
}
