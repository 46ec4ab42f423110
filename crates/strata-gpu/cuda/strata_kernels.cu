// Strata's own kernels: host-driven maintenance of a space's page cache (flush, evict,
// prefetch) and the layout probe. The host waits for the whole context (every stream, so user
// kernels on their own streams and through other Strata handles too) before and after each, so
// no user access races with them; prefetch reuses the fault path and is safe under any
// concurrency.
#include "strata.cuh"

// Frames handled by this warp: a warp per frame, grid-strided.
#define STRATA_FOR_EACH_FRAME(f)                                                                    \
    for (strata_u64 f = (blockIdx.x * (strata_u64)blockDim.x + threadIdx.x) / 32; f < s.frame_count; \
         f += (strata_u64)gridDim.x * (blockDim.x / 32))

// Writes every dirty resident page back to the host copy and marks it clean. A warp per frame.
extern "C" __global__ void strata_flush(StrataSpace s) {
    const unsigned lane = threadIdx.x & 31;
    STRATA_FOR_EACH_FRAME(f) {
        const strata_u32 page = s.frames[f].page;
        if (page == STRATA_NO_PAGE) continue;
        const strata_u64 w = s.page_table[page];
        if (strata::detail::state_of(w) != STRATA_RESIDENT || (w & STRATA_FRAME_MASK) != f ||
            !(w & STRATA_DIRTY))
            continue;
        if (strata::detail::write_frame_down(s, page, f, lane) && lane == 0) atomicAnd(&s.page_table[page], ~STRATA_DIRTY);
    }
}

// Evicts resident pages in [first, last): dirty ones are written back first, their frames
// become free. A warp per frame. With read-through, the pages' history is forgotten too, so
// their next touch is a first touch again (a cold start).
extern "C" __global__ void strata_evict(StrataSpace s, strata_u64 first, strata_u64 last) {
    const unsigned lane = threadIdx.x & 31;
    if (s.policy & STRATA_POLICY_READ_THROUGH) {
        for (strata_u64 p = first + blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; p < last;
             p += (strata_u64)gridDim.x * blockDim.x)
            atomicAnd(&s.page_table[p], ~STRATA_HISTORY);
    }
    // Remote-access counts of the range are forgotten as well (host maintenance runs alone, so
    // a page not resident now stays so during this kernel and its low bits are only the record).
    if (s.migrate_after) {
        for (strata_u64 p = first + blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; p < last;
             p += (strata_u64)gridDim.x * blockDim.x) {
            const strata_u64 w = s.page_table[p];
            if (strata::detail::state_of(w) == STRATA_NOT_RESIDENT && (w & STRATA_LOW_MASK))
                atomicAnd(&s.page_table[p], ~STRATA_LOW_MASK);
        }
    }
    // Peer copies of the range are dropped too: the host copy is about to be written (fills).
    if (s.peer) {
        for (strata_u64 p = first + blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; p < last;
             p += (strata_u64)gridDim.x * blockDim.x)
            s.peer->page_slots[p] = 0u;
    }
    STRATA_FOR_EACH_FRAME(f) {
        const strata_u32 page = s.frames[f].page;
        if (page == STRATA_NO_PAGE || page < first || page >= last) continue;
        const strata_u64 w = s.page_table[page];
        const bool owns = strata::detail::state_of(w) == STRATA_RESIDENT && (w & STRATA_FRAME_MASK) == f;
        // A dirty page the tier below refused stays resident and dirty (nothing is dropped).
        if (owns && (w & STRATA_DIRTY) && !strata::detail::write_frame_down(s, page, f, lane)) continue;
        if (lane == 0) {
            if (owns) {
                strata::detail::retire_page_word(&s.page_table[page]);
                atomicAdd(&s.counters->evictions, 1ull);
            }
            const strata_u32 before = atomicExch(&s.frames[f].flags, 0u);
            if (before & STRATA_FRAME_PROTECTED) atomicSub(&s.counters->protected_now, 1u);
            s.frames[f].page = STRATA_NO_PAGE;
            atomicAdd(&s.counters->free_frames, 1ull);
        }
    }
}

// Background write-back beside a kernel launched with the space's handle (write_back.cuh): every
// warp cleans frames ahead of the clock hand until launch `launch` has ended.
extern "C" __global__ void strata_write_back(StrataSpace s, StrataWriteBack* wb, strata_u64 launch) {
    strata::detail::write_back_loop(s, wb, launch);
}

// Queued on the user's stream right after the user's kernel: the write-back warps of launches
// up to `launch` stop.
extern "C" __global__ void strata_write_back_stop(StrataWriteBack* wb, strata_u64 launch) {
    if (threadIdx.x == 0) atomicMax(&wb->stop, launch);
}

// Brings pages [first, last) in through the ordinary fault path. A warp per page.
extern "C" __global__ void strata_prefetch(StrataSpace s, strata_u64 first, strata_u64 last) {
    const strata_u64 warps = (strata_u64)gridDim.x * (blockDim.x / 32);
    for (strata_u64 p = first + (blockIdx.x * (strata_u64)blockDim.x + threadIdx.x) / 32; p < last;
         p += warps) {
        strata::PageRef r = strata::acquire_page(s, p, false, true);
        strata::release_page(s, r);
    }
}

// Writes sizes and field offsets as the device compiler lays them out; the host compares
// them with its own (strata_gpu::layout).
extern "C" __global__ void strata_layout_probe(strata_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    StrataSpace s;
    StrataCounters c;
    const char* sb = (const char*)&s;
    const char* cb = (const char*)&c;
    int i = 0;
    out[i++] = sizeof(StrataSpace);
    out[i++] = (const char*)&s.page_table - sb;
    out[i++] = (const char*)&s.frames - sb;
    out[i++] = (const char*)&s.frame_data - sb;
    out[i++] = (const char*)&s.host - sb;
    out[i++] = (const char*)&s.counters - sb;
    out[i++] = (const char*)&s.size_bytes - sb;
    out[i++] = (const char*)&s.pages - sb;
    out[i++] = (const char*)&s.frame_count - sb;
    out[i++] = (const char*)&s.page_shift - sb;
    out[i++] = (const char*)&s.policy - sb;
    out[i++] = (const char*)&s.protected_quota - sb;
    out[i++] = (const char*)&s.ring - sb;
    out[i++] = (const char*)&s.tier - sb;
    out[i++] = (const char*)&s.peer - sb;
    out[i++] = sizeof(StrataPeer);
    out[i++] = sizeof(StrataCounters);
    out[i++] = (const char*)&c.faults - cb;
    out[i++] = (const char*)&c.error_flags - cb;
    out[i++] = (const char*)&c.first_bad_index - cb;
    out[i++] = (const char*)&c.clock_hand - cb;
    out[i++] = (const char*)&c.protected_now - cb;
    out[i++] = (const char*)&c.wait_limit_ns - cb;
    out[i++] = (const char*)&c.first_bad_page - cb;
    out[i++] = (const char*)&c.no_frame_page - cb;
    out[i++] = (const char*)&c.store_error_page - cb;
    out[i++] = (const char*)&c.host_cache_loads - cb;
    out[i++] = (const char*)&c.background_writebacks - cb;
    out[i++] = (const char*)&c.remote_reads - cb;
    out[i++] = (const char*)&c.fault_hist - cb;
    out[i++] = (const char*)&s.migrate_after - sb;
    StrataWriteBack wb;
    out[i++] = sizeof(StrataWriteBack);
    out[i++] = (const char*)&wb.cursor - (const char*)&wb;
    out[i++] = sizeof(StrataFrame);
    out[i++] = sizeof(StrataRing);
    StrataRing rg;
    out[i++] = (const char*)&rg.slot_count - (const char*)&rg;
    out[i++] = sizeof(StrataRequest);
    out[i++] = STRATA_PIN_ONE;
    out[i++] = STRATA_DIRTY;
}
