// strata/fault.cuh: the fault path. A group leader pins a resident page or claims a missing
// one (try_pin); the whole warp serves a claimed fault (serve_fault): a frame from the
// eviction sweep (evict.cuh), the victim written down the tier chain if dirty, the page loaded
// from the highest tier that has it (tiers.cuh), then published with a release.
#pragma once

namespace strata {
namespace detail {

// PIN_PARTIAL: pinned like PIN_HIT, but the page is held only in part (sub-page fetch,
// sectors.cuh), so the caller checks its sectors before use. PIN_LACKING: the caller's verdict
// on a PIN_PARTIAL page that lacks sectors it needs; it is served like a claimed fault
// (serve_fault with the held frame), so the hit path carries no sector code.
enum PinStatus { PIN_NONE = 0, PIN_HIT = 1, PIN_BUSY = 2, PIN_CLAIMED = 3, PIN_HOST = 4, PIN_PARTIAL = 5, PIN_LACKING = 6 };

// One attempt by a group leader: pin a resident page (PIN_PARTIAL if it is held in part), or
// claim a missing one for loading (the claim keeps the pin), or report that someone else is
// moving it. With `read_through`, a missing page with no history is only marked (PIN_HOST:
// read it from the host copy, no pin).
__device__ __forceinline__ int try_pin(const StrataSpace& s, strata_u64 page, bool write,
                                       strata_u32* frame, bool read_through = false) {
    strata_u64* word = &s.page_table[page];
    strata_u64 old = pin_acquire(word);
    strata_u64 st = state_of(old);
    if (st == STRATA_RESIDENT) {
        *frame = (strata_u32)(old & STRATA_FRAME_MASK);
        if (write && !(old & STRATA_DIRTY) && !(atomicOr(word, STRATA_DIRTY) & STRATA_DIRTY))
            atomicAdd(&s.counters->pages_dirtied, 1ull);
        touch_frame(s, *frame);
        return (old & STRATA_PARTIAL) ? PIN_PARTIAL : PIN_HIT;
    }
    if (st == STRATA_NOT_RESIDENT) {
        strata_u64 cur = old + STRATA_PIN_ONE;
        while (state_of(cur) == STRATA_NOT_RESIDENT) {
            if (read_through && !(cur & STRATA_HISTORY)) {
                // The CAS succeeds only while the page is not resident, so no publisher is
                // adding the history bit at the same time.
                const strata_u64 prev = atomicCAS(word, cur, cur | STRATA_HISTORY);
                if (prev == cur) {
                    atomicAdd(word, 0ull - STRATA_PIN_ONE);
                    return PIN_HOST;
                }
                cur = prev;
                continue;
            }
            // Remote writers still writing the host copy in place (remote.cuh) finish first,
            // or the copy-in could miss their bytes. The claim clears the remote record.
            if (cur & STRATA_REMOTE_WRITERS_MASK) break;
            strata_u64 claimed = (cur & ~(STRATA_STATE_MASK | STRATA_LOW_MASK)) | (STRATA_LOADING << STRATA_STATE_SHIFT);
            strata_u64 prev = atomicCAS(word, cur, claimed);
            if (prev == cur) return PIN_CLAIMED;
            cur = prev;
        }
    }
    atomicAdd(word, 0ull - STRATA_PIN_ONE);
    return PIN_BUSY;
}

// serve_fault's answer when the fault failed for good (a lower tier failed the page; the
// error is recorded): the access fails rather than retrying.
#define STRATA_FAULT_FAILED 0xFFFFFFFEu

// The whole warp serves the fault that lane `leader` claimed for `page` of the leader's space
// (lanes of the warp may be using other spaces: every lane copies with the leader's pointers).
// `write` and `prefetch` count on the leader. Returns the frame; STRATA_NO_PAGE (the claim is
// undone) when no frame could be taken; STRATA_FAULT_FAILED (the claim is undone, the error
// recorded) when the tier below failed to take the victim or to give the page. With sub-page
// fetch (sectors.cuh), the leader's `sectors` are the ones loaded (all of them if none of the
// page's); the frame's sector word says so from the publish on. With `held_frame` set, the
// leader already holds a pin on the page, resident in that frame in part (PIN_LACKING): the
// sectors it lacks are loaded and the frame returned.
__device__ strata_u32 serve_fault(const StrataSpace& s, strata_u64 page, unsigned leader,
                                  unsigned lane, unsigned mask, bool write, bool prefetch,
                                  strata_u32 sectors = 0xFFFFFFFFu, strata_u32 held_frame = STRATA_NO_PAGE) {
    if (held_frame != STRATA_NO_PAGE) {
        fill_held(s, page, held_frame, sectors, leader, lane, mask);
        return held_frame;
    }
    strata_u32 frame = 0, victim = STRATA_NO_PAGE;
    strata_u32 victim_sectors = 0xFFFFFFFFu, load_sectors = 0xFFFFFFFFu;
    strata_u64 victim_word = 0;
    bool dirty = false;
    strata_u64 t0 = 0;
    if (lane == leader) {
        t0 = now_ns();
        frame = take_frame(s, (strata_u32)page, &victim, &dirty, &victim_word);
        // Ordering point (acquire): this fence after the leader's claims (the page's LOADING
        // CAS in try_pin, the frame's NO_PAGE CAS or the victim's EVICTING CAS in take_frame)
        // makes them acquire operations. It pairs with the release of whoever touched those
        // bytes last: an evictor's fence before retiring this page (its written-back copy,
        // read below), and the victim's holders' unpin_release (the frame bytes written back
        // below). It also orders the EVICTING mark before any byte of the frame is overwritten
        // (optimistic readers re-read the word). The __syncwarp carries the order to the lanes.
        fence_acq_rel();
        if (sectors_on(s) && frame != STRATA_NO_PAGE) {
            const strata_u32 all = all_sectors(s);
            // The victim's held sectors (it is unpinned, so no load into it is under way).
            victim_sectors = victim != STRATA_NO_PAGE ? (strata_u32)load_volatile(sector_word(s, frame)) & all : 0u;
            load_sectors = (sectors & all) ? sectors & all : all;
        }
    }
    __syncwarp(mask);
    frame = __shfl_sync(mask, frame, leader);
    victim = __shfl_sync(mask, victim, leader);
    dirty = __shfl_sync(mask, (int)dirty, leader) != 0;
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    unsigned char* const frame_data = (unsigned char*)__shfl_sync(mask, (strata_u64)s.frame_data, leader);
    const strata_u64 ps = 1ull << shift;
    if (frame == STRATA_NO_PAGE) {
        if (lane == leader) {
            // Undo the claim: back to NOT_RESIDENT, drop the claim's pin.
            atomicAdd(&s.page_table[page], 0ull - (STRATA_LOADING << STRATA_STATE_SHIFT) - STRATA_PIN_ONE);
            atomicAdd(&s.counters->no_frame_retries, 1ull);
        }
        return STRATA_NO_PAGE;
    }
    unsigned char* fdata = frame_data + (strata_u64)frame * ps;
    const bool write_victim = victim != STRATA_NO_PAGE && dirty;
    const int moved = tier_exchange(s, victim, write_victim, page, fdata, lane, mask, leader, victim_sectors, load_sectors);
    __syncwarp(mask);
    if (moved == TIER_WRITE_FAILED) {
        if (lane == leader) {
            // The victim could not go down: it stays in its frame, resident and dirty (EVICTING
            // kept every other bit), and this fault fails.
            atomicAdd(&s.page_table[victim], 0ull - (1ull << STRATA_STATE_SHIFT));
            atomicAdd(&s.page_table[page], 0ull - (STRATA_LOADING << STRATA_STATE_SHIFT) - STRATA_PIN_ONE);
        }
        return STRATA_FAULT_FAILED;
    }
    if (lane == leader) {
        if (write_victim) {
            atomicAdd(&s.counters->writebacks, 1ull);
            atomicAdd(&s.counters->bytes_out, victim_sectors == 0xFFFFFFFFu ? ps : (strata_u64)__popc(victim_sectors) << sector_shift(s));
        }
        if (victim != STRATA_NO_PAGE) {
            // GPU scope is enough for the host-copy tier: only this GPU reads the host copy
            // while kernels run (a kernel's end makes it visible to the CPU), and a system-scope
            // fence would wait for every posted PCIe write of the page on each eviction. The
            // ring tier's write-back was acknowledged by the host already.
            s.frames[frame].page = (strata_u32)page;
            __threadfence();
            // Victim back to NOT_RESIDENT, frame and dirty cleared; transient pins and the
            // history bit stay.
            retire_evicting_word(&s.page_table[victim], victim_word);
            atomicAdd(&s.counters->evictions, 1ull);
        }
        const bool seen = (load_volatile(&s.page_table[page]) & STRATA_HISTORY) != 0;
        strata_u32 before = atomicExch(&s.frames[frame].flags, fresh_frame_flags(s, seen));
        if (before & STRATA_FRAME_PROTECTED) atomicSub(&s.counters->protected_now, 1u);
        if (moved == TIER_LOAD_FAILED) {
            // The frame goes back free and the page back to NOT_RESIDENT; the error is recorded.
            atomicExch(&s.frames[frame].flags, 0u);
            __threadfence();
            atomicExch(&s.frames[frame].page, STRATA_NO_PAGE);
            atomicAdd(&s.counters->free_frames, 1ull);
            atomicAdd(&s.page_table[page], 0ull - (STRATA_LOADING << STRATA_STATE_SHIFT) - STRATA_PIN_ONE);
        }
    }
    if (moved == TIER_LOAD_FAILED) return STRATA_FAULT_FAILED;
    if (lane == leader) {
        // The sectors now held, published with the page (sub-page fetch).
        if (sectors_on(s)) atomicExch(sector_word(s, frame), (strata_u64)load_sectors);
        // Ordering point (release): the copy-in (ordered to the leader by the __syncwarp above)
        // before the publishing add; pairs with pin_acquire and load_acquire of readers.
        __threadfence();
        // LOADING -> RESIDENT, the frame, and the history bit (set only by publishers, so
        // adding it when clear is the same as or-ing it).
        const strata_u64 w = load_volatile(&s.page_table[page]);
        const bool partial = sectors_on(s) && load_sectors != all_sectors(s);
        strata_u64 publish = (1ull << STRATA_STATE_SHIFT) + frame + (write ? STRATA_DIRTY : 0ull) +
                             ((w & STRATA_HISTORY) ? 0ull : STRATA_HISTORY) + (partial ? STRATA_PARTIAL : 0ull);
        atomicAdd(&s.page_table[page], publish);
        if (write) atomicAdd(&s.counters->pages_dirtied, 1ull);
        atomicAdd(&s.counters->faults, 1ull);
        atomicAdd(&s.counters->lifetime_faults, 1ull);
        atomicAdd(&s.counters->bytes_in, load_sectors == 0xFFFFFFFFu ? ps : (strata_u64)__popc(load_sectors) << sector_shift(s));
        if (prefetch) atomicAdd(&s.counters->prefetched, 1ull);
        strata_u64 dt = now_ns() - t0;
        atomicAdd(&s.counters->fault_ns_total, dt);
        atomicMax(&s.counters->fault_ns_max, dt);
        atomicAdd(&s.counters->fault_hist[fault_hist_bucket(dt)], 1ull);
    }
    return frame;
}

}  // namespace detail
}  // namespace strata
