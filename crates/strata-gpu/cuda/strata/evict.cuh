// strata/evict.cuh: the eviction sweep. A clock hand shared by all warps walks the frame table;
// each eviction policy (policy_clock.cuh, policy_scan_resistant.cuh) says whether the frame
// under the hand may go; the first that may, and that nobody pins, is marked EVICTING.
#pragma once

namespace strata {
namespace detail {

// Takes a frame for `page` by a clock sweep (leader lane only). Returns the frame, or
// STRATA_NO_PAGE when every frame stayed pinned for the whole sweep. `victim` is the page
// evicted from it (STRATA_NO_PAGE if the frame was free), `victim_dirty` whether it needs
// writing back, `victim_word` the EVICTING word installed (less any pins added since).
// The victim's page word is left EVICTING.
__device__ strata_u32 take_frame(const StrataSpace& s, strata_u32 page, strata_u32* victim,
                                 bool* victim_dirty, strata_u64* victim_word) {
    const strata_u32 n = s.frame_count;
    const bool scan_resistant = (s.policy & STRATA_POLICY_KIND_MASK) == STRATA_POLICY_SCAN_RESISTANT;
    const strata_u64 max_steps = (strata_u64)n * 3 + 64;
    ScanResistantSweep sr(s, scan_resistant);
    // The last lap (steps from 2n on) takes any unpinned frame, protected or young: a sweep
    // that finds every unpinned frame protected (warps whose pins fill the probationary
    // segment) must still return one, or those warps would wait for ageing that only faults
    // bring. So every fault makes progress while some frame is unpinned.
    const strata_u64 last_lap = (strata_u64)n * 2;
    for (strata_u64 step = 0; step < max_steps; ++step) {
        const bool last_resort = step >= last_lap;
        strata_u32 f = atomicAdd(&s.counters->clock_hand, 1u) % n;
        StrataFrame* fr = &s.frames[f];
        strata_u32 owner = load_volatile(&fr->page);
        if (owner == STRATA_NO_PAGE) {
            if (atomicCAS(&fr->page, STRATA_NO_PAGE, page) == STRATA_NO_PAGE) {
                atomicAdd(&s.counters->free_frames, ~0ull);  // minus one
                *victim = STRATA_NO_PAGE;
                *victim_dirty = false;
                return f;
            }
            continue;
        }
        const strata_u32 flags = load_volatile(&fr->flags);
        const bool may_go = scan_resistant ? (last_resort || sr.may_evict(s, fr, flags)) : clock_may_evict(fr, flags);
        if (!may_go) continue;
        strata_u64* vword = &s.page_table[owner];
        strata_u64 w = load_volatile(vword);
        if (state_of(w) != STRATA_RESIDENT || (w & STRATA_FRAME_MASK) != f || (w & STRATA_PIN_MASK))
            continue;
        strata_u64 evicting = (w & ~STRATA_STATE_MASK) | (STRATA_EVICTING << STRATA_STATE_SHIFT);
        if (atomicCAS(vword, w, evicting) != w) continue;
        // Optimistic readers re-read the word after reading the frame, so the EVICTING mark
        // must be visible before any byte of the frame is overwritten: serve_fault fences
        // after this and before the copy into the frame.
        *victim = owner;
        *victim_word = evicting;
        *victim_dirty = (w & STRATA_DIRTY) != 0;
        return f;
    }
    return STRATA_NO_PAGE;
}
}  // namespace detail
}  // namespace strata
