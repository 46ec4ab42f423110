// strata/policy_scan_resistant.cuh: clock plus a protected segment. A page enters the protected
// segment only when referenced again after the hand passed it (or when it faults again after an
// earlier stay: the history bit), and leaves it after STRATA_AGE_EPOCHS epochs of faults without
// a reference. Probationary pages keep a second chance for half the probationary segment's
// turnover, counted in faults, so a loop larger than the cache keeps its re-used part resident.
#pragma once

namespace strata {
namespace detail {

// The policy's clocks, read once per sweep: protected ageing counts epochs of n faults;
// probationary second chances count ticks of 2^STRATA_TICK_SHIFT faults and last half the
// probationary segment's turnover.
struct ScanResistantSweep {
    strata_u32 epoch;
    strata_u32 tick;
    strata_u32 min_age_ticks;
    // Young probationary frames are passed over at most this many times per sweep: with many
    // warps faulting at once most of the segment is young or pinned, and a long search costs
    // more (every step is an atomic on the hand) than an early eviction.
    unsigned young_skips;

    // `active` false (another policy): nothing is read.
    __device__ __forceinline__ ScanResistantSweep(const StrataSpace& s, bool active) {
        const strata_u32 n = s.frame_count;
        const strata_u64 faults_now = active ? load_volatile(&s.counters->lifetime_faults) : 0;
        epoch = (strata_u32)(faults_now / n) & 0xFFFFu;
        tick = (strata_u32)(faults_now >> STRATA_TICK_SHIFT) & 0xFFFFu;
        const strata_u32 probation = n - (s.protected_quota < n ? s.protected_quota : n - 1);
        min_age_ticks = (probation / 2) >> STRATA_TICK_SHIFT;
        young_skips = 0;
    }

    // The verdict on the frame under the hand (leader lane, during a sweep).
    __device__ __forceinline__ bool may_evict(const StrataSpace& s, StrataFrame* fr, strata_u32 flags) {
        const strata_u32 stamp = (flags & STRATA_STAMP_MASK) >> STRATA_STAMP_SHIFT;
        if (flags & STRATA_FRAME_PROTECTED) {
            if (flags & STRATA_FRAME_REF) {
                // Referenced: refresh its stamp.
                atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) | (epoch << STRATA_STAMP_SHIFT));
            } else if (((epoch - stamp) & 0xFFFFu) > STRATA_AGE_EPOCHS) {
                // Unused for too long: back to the probationary part, with a fresh second
                // chance there.
                if (atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_PROTECTED | STRATA_STAMP_MASK)) |
                                                     (tick << STRATA_STAMP_SHIFT)) == flags)
                    atomicSub(&s.counters->protected_now, 1u);
            }
            return false;
        }
        if (flags & STRATA_FRAME_REF) {
            // Re-referenced (or faulted again after an earlier stay): protect it if there is
            // room, else give it a second chance.
            const strata_u32 promoted = (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) |
                                        STRATA_FRAME_PROTECTED | (epoch << STRATA_STAMP_SHIFT);
            if (atomicAdd(&s.counters->protected_now, 1u) < s.protected_quota) {
                if (atomicCAS(&fr->flags, flags, promoted) != flags) atomicSub(&s.counters->protected_now, 1u);
            } else {
                // Segment full: a second chance that lasts min_age_ticks of faults.
                atomicSub(&s.counters->protected_now, 1u);
                atomicCAS(&fr->flags, flags, (flags & ~(STRATA_FRAME_REF | STRATA_STAMP_MASK)) | (tick << STRATA_STAMP_SHIFT));
            }
            return false;
        }
        // Too young to evict, unless a whole lap found nothing older (progress first).
        if (young_skips < 8 && ((tick - stamp) & 0xFFFFu) < min_age_ticks) {
            ++young_skips;
            return false;
        }
        return true;
    }
};

// The fresh flags of a frame a page was just loaded into. Clock: a new page starts referenced.
// Scan-resistant: only a page seen before does, and every new page is stamped with the fault
// tick (its probationary age starts now).
__device__ __forceinline__ strata_u32 fresh_frame_flags(const StrataSpace& s, bool seen_before) {
    if ((s.policy & STRATA_POLICY_KIND_MASK) == STRATA_POLICY_CLOCK) return STRATA_FRAME_REF;
    const strata_u32 tick = (strata_u32)(load_volatile(&s.counters->lifetime_faults) >> STRATA_TICK_SHIFT) & 0xFFFFu;
    return (seen_before ? STRATA_FRAME_REF : 0u) | (tick << STRATA_STAMP_SHIFT);
}

}  // namespace detail
}  // namespace strata
