// strata/write_back.cuh: background write-back. While a kernel launched with a space's handle
// runs, a few warps of Strata's `strata_write_back` kernel (launched beside it on a stream of
// its own) walk the frames just ahead of the clock hand and write dirty pages down the tier
// chain before the hand reaches them, so the fault that takes such a frame finds its victim
// clean and only loads. A page is cleaned under a pin (no evictor can take its frame while its
// bytes are copied down) and its dirty bit is cleared before the copy, not after: a writer
// pins to write, and an unpinned page was cleaned with no writer inside it, so a write that
// lands during the copy finds the bit clear and sets it again (the page goes down once more
// later). A write can therefore never be lost, only written twice.
//
// Water marks, in frames ahead of the hand: the cleaners work while fewer than `low` frames
// ahead of the hand are known clean and stop (sleep) once `high` are; frames the policy will
// pass over on this lap (referenced, protected) and pinned ones are skipped, not cleaned.
#pragma once

namespace strata {
namespace detail {

// Leader lane: claims frame `f` for cleaning if it holds a dirty, unpinned page that the
// policy would give up when the hand reaches it. Returns the page (pinned, its dirty bit
// cleared) or STRATA_NO_PAGE.
__device__ __forceinline__ strata_u32 claim_for_cleaning(const StrataSpace& s, strata_u32 f) {
    StrataFrame* const fr = &s.frames[f];
    const strata_u32 owner = load_volatile(&fr->page);
    if (owner == STRATA_NO_PAGE) return STRATA_NO_PAGE;
    // The hand gives a referenced frame a second chance and passes protected ones: cleaning
    // them now would write pages that are still in use (and likely dirtied again).
    if (load_volatile(&fr->flags) & (STRATA_FRAME_REF | STRATA_FRAME_PROTECTED)) return STRATA_NO_PAGE;
    strata_u64* const word = &s.page_table[owner];
    const strata_u64 w = load_volatile(word);
    if (state_of(w) != STRATA_RESIDENT || (w & STRATA_FRAME_MASK) != f || !(w & STRATA_DIRTY) ||
        (w & STRATA_PIN_MASK))
        return STRATA_NO_PAGE;
    // One atomic: no pin (so no writer inside the page), still this frame's, still dirty.
    if (atomicCAS(word, w, (w & ~STRATA_DIRTY) + STRATA_PIN_ONE) != w) return STRATA_NO_PAGE;
    // Ordering point (acquire): the last writers' unpin_release ordered their bytes before
    // the pin count they left at zero; the copy below reads after this.
    fence_acq_rel();
    return owner;
}

// Warp-collective (all 32 lanes, lane 0 leads): writes frame `f` (holding `page`) down the
// space's tier chain and counts it, with a system fence after the copy (the CPU may read the
// host copy next). False: the tier below failed (STRATA_ERR_STORE recorded); the caller keeps
// the page dirty. Host maintenance (strata_flush, strata_evict) and the cleaners share it.
__device__ __forceinline__ bool write_frame_down(const StrataSpace& s, strata_u32 page, strata_u64 f, unsigned lane) {
    const strata_u64 ps = 1ull << s.page_shift;
    // With sub-page fetch, the sectors the frame holds (the page is pinned or no kernel runs,
    // so none is being loaded; the caller's acquire orders this read after the last load).
    const strata_u32 sectors =
        sectors_on(s) ? (strata_u32)load_volatile(sector_word(s, (strata_u32)f)) & all_sectors(s) : 0xFFFFFFFFu;
    const bool ok = tier_write_back(s, page, s.frame_data + f * ps, lane, 0xFFFFFFFFu, 0, sectors);
    __syncwarp();
    if (lane == 0 && ok) {
        __threadfence_system();
        atomicAdd(&s.counters->writebacks, 1ull);
        atomicAdd(&s.counters->bytes_out, sectors == 0xFFFFFFFFu ? ps : (strata_u64)__popc(sectors) << sector_shift(s));
    }
    return ok;
}

// Warp-collective: writes page `page` (claimed, pinned) from frame `f` down and unpins it. A
// failed write puts the dirty bit back.
__device__ __forceinline__ void clean_claimed(const StrataSpace& s, strata_u32 page, strata_u32 f, unsigned lane) {
    const bool ok = write_frame_down(s, page, f, lane);
    if (lane == 0) {
        strata_u64* const word = &s.page_table[page];
        if (ok) atomicAdd(&s.counters->background_writebacks, 1ull);
        else {
            atomicOr(word, STRATA_DIRTY);
            atomicAdd(&s.counters->pages_dirtied, 1ull);
        }
        // Ordering point (release): the copy down (fenced in write_frame_down) before the pin
        // drops; an evictor that then takes the frame without writing finds the page's bytes
        // in the tier below.
        unpin_release(word);
    }
}

// The cleaners' loop (each warp of the write-back kernel). Ends when the launch's stop word
// arrives (`wb->stop >= launch`, written after the user's kernel on its stream) or when the
// space has served no fault for `wb->idle_ns` (a stop that never comes cannot keep it alive).
__device__ void write_back_loop(const StrataSpace& s, StrataWriteBack* wb, strata_u64 launch) {
    const unsigned lane = threadIdx.x & 31;
    const strata_u32 n = s.frame_count;
    const strata_u32 high = wb->high_water < n ? wb->high_water : n;
    const strata_u32 low = wb->low_water < high ? wb->low_water : high;
    strata_u64 last_faults = load_volatile(&s.counters->lifetime_faults);
    strata_u64 quiet_since = now_ns();
    bool filling = true;  // between the marks: keep cleaning until `high`
    unsigned sleep_ns = 512;
    for (;;) {
        int stop = 0;
        strata_u32 frame = STRATA_NO_PAGE, page = STRATA_NO_PAGE;
        if (lane == 0) {
            const strata_u64 faults = load_volatile(&s.counters->lifetime_faults);
            const strata_u64 t = now_ns();
            if (faults != last_faults) {
                last_faults = faults;
                quiet_since = t;
            }
            stop = load_volatile(&wb->stop) >= launch || t - quiet_since > wb->idle_ns;
            if (!stop) {
                const strata_u32 hand = load_volatile(&s.counters->clock_hand);
                const strata_u32 cursor = load_volatile(&wb->cursor);
                const strata_u32 ahead = cursor - hand;  // frames ahead of the hand looked at
                if ((int)ahead < 0) {
                    atomicCAS(&wb->cursor, cursor, hand);  // the hand overtook us: catch up
                    frame = STRATA_NO_PAGE - 1;            // look again at once
                } else if (ahead >= high || (!filling && ahead >= low)) {
                    filling = false;
                } else {
                    filling = true;
                    if (atomicCAS(&wb->cursor, cursor, cursor + 1) == cursor) {
                        frame = cursor % n;
                        page = claim_for_cleaning(s, frame);
                    } else {
                        frame = STRATA_NO_PAGE - 1;  // another cleaner moved the cursor
                    }
                }
            }
        }
        stop = __shfl_sync(0xFFFFFFFFu, stop, 0);
        if (stop) return;
        frame = __shfl_sync(0xFFFFFFFFu, frame, 0);
        page = __shfl_sync(0xFFFFFFFFu, page, 0);
        if (page != STRATA_NO_PAGE) {
            clean_claimed(s, page, frame, lane);
            sleep_ns = 512;
        } else if (frame == STRATA_NO_PAGE) {
            // Enough is clean ahead of the hand (or nothing to do): wait for faults to use it.
            __nanosleep(sleep_ns);
            if (sleep_ns < 16384) sleep_ns *= 2;
        } else {
            sleep_ns = 512;
        }
    }
}

}  // namespace detail
}  // namespace strata
