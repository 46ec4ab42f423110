// strata/sectors.cuh: sub-page fetch. With a sector size set (SpaceOptions::sector_bytes; the
// log2 rides in StrataSpace::policy), a page's frame may hold only some of its sectors: a fault
// from an element access that could not go in place (remote access off, a write that must
// migrate, an atomic) loads the sectors its warp's lanes touch, and a later access that needs
// another sector loads that sector into the resident page. Sparse misses over large pages then
// move a sector each instead of a whole page, while a page read all over ends up whole. A page
// held in part carries STRATA_PARTIAL in its page word, so hits on whole pages never read a
// sector word. Whole-page access (acquire_page, view_page, the prefetcher) always sees whole
// pages.
//
// One 64-bit word per frame, after the frame table: bits 0..31 say which sectors the frame
// holds, bits 32..63 which are being loaded. A sector not held is current in the host copy
// (a space with sectors is backed by a full host copy and no peer tier: SpaceOptions refuses
// the rest). Only a warp that pins the page loads into it, so the frame cannot change page
// meanwhile; the load is claimed by setting the sector's loading bit, so two warps never copy
// the same sector (a late copy could overwrite a write made after the first). Write-backs copy
// the held sectors only.
#pragma once

namespace strata {
namespace detail {

__device__ __forceinline__ strata_u32 sector_shift(const StrataSpace& s) {
    return (s.policy & STRATA_POLICY_SECTOR_MASK) >> STRATA_POLICY_SECTOR_SHIFT;
}
__device__ __forceinline__ bool sectors_on(const StrataSpace& s) { return sector_shift(s) != 0; }

// The sector word of `frame` (meaningful only when sectors are on).
__device__ __forceinline__ strata_u64* sector_word(const StrataSpace& s, strata_u32 frame) {
    return (strata_u64*)(s.frames + s.frame_count) + frame;
}

// Every sector of a page of 2^page_shift bytes in sectors of 2^sector_shift (at most 32).
__device__ __forceinline__ strata_u32 all_sectors(strata_u32 page_shift, strata_u32 sector_shift) {
    const strata_u32 n = 1u << (page_shift - sector_shift);
    return n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u;
}
__device__ __forceinline__ strata_u32 all_sectors(const StrataSpace& s) {
    return sectors_on(s) ? all_sectors(s.page_shift, sector_shift(s)) : 0xFFFFFFFFu;
}

// The sector bit of byte `off` of a page (0 when sectors are off: nothing to check).
__device__ __forceinline__ strata_u32 sector_bit(const StrataSpace& s, strata_u64 off) {
    return sectors_on(s) ? 1u << (strata_u32)(off >> sector_shift(s)) : 0u;
}

// The sectors an element access at byte `off` needs loaded: its own sector where the miss may
// be sparse (`sparse`), else every sector (0 when sectors are off: whole pages, nothing to
// check). An access that could have gone over the bus in place (remote.cuh) but migrates does
// so because its page has proved hot, so it takes the whole page: a hot page kept in part
// would make every hit read its sector word (an acquire, which on sm_90 also invalidates the
// multiprocessor's L1), and on an H100 that halved a Zipf gather's rate.
__device__ __forceinline__ strata_u32 sectors_wanted(const StrataSpace& s, strata_u64 off, bool sparse) {
    if (!sectors_on(s)) return 0u;
    return sparse ? 1u << (strata_u32)(off >> sector_shift(s)) : all_sectors(s);
}

// True if the frame holds every sector in `need` (an acquire load: pairs with the loader's
// release, so the sectors' bytes read after it are the loaded ones).
__device__ __forceinline__ bool holds_sectors(const StrataSpace& s, strata_u32 frame, strata_u32 need) {
    return ((strata_u32)load_acquire(sector_word(s, frame)) & need) == need;
}

// The union of `bit` over each lane's group (`peers`, lanes of one space and page), on every
// lane of `mask`: one vote per sector, all 32 so the loop is warp-uniform whatever the spaces.
// Out of line, like the fill below: the fault path is inlined into every element access, and
// registers it holds are registers the hit path loses.
__device__ __noinline__ strata_u32 group_sectors(unsigned mask, unsigned peers, strata_u32 bit) {
    strata_u32 m = 0;
    for (unsigned k = 0; k < 32; ++k)
        if (__ballot_sync(mask, (bit >> k) & 1u) & peers) m |= 1u << k;
    return m;
}

// Warp-collective: copies the sectors `sectors` of a page from `src` to `dst` (each run of
// consecutive sectors as one copy).
template <typename Load = LoadCached>
__device__ __forceinline__ void copy_sectors(unsigned char* dst, const unsigned char* src, strata_u32 sectors,
                                             strata_u32 shift, unsigned lane, unsigned mask) {
    strata_u64 m = sectors;
    while (m) {
        const unsigned first = __ffsll((long long)m) - 1;
        const unsigned run = __ffsll((long long)~(m >> first)) - 1;  // consecutive ones from `first`
        const strata_u64 at = (strata_u64)first << shift;
        warp_copy<Load>(dst + at, src + at, (strata_u64)run << shift, lane, mask);
        m &= ~(((1ull << run) - 1ull) << first);
    }
}

// Warp-collective: writes the sectors `out_sectors` of `frame` to `out`, then loads the sectors
// `in_sectors` of `in` into `frame` (the fault path's exchange and write-back for pages held
// in part). Out of line, so the element accesses that inline the fault path do not carry it.
__device__ __noinline__ void exchange_sectors(unsigned char* frame, unsigned char* out, const unsigned char* in,
                                              strata_u32 out_sectors, strata_u32 in_sectors, strata_u32 shift,
                                              unsigned lane, unsigned mask) {
    if (out_sectors) copy_sectors(out, frame, out_sectors, shift, lane, mask);
    // The old bytes are read out before any lane overwrites them (the two masks split the
    // page differently, so a byte may pass from one lane's read to another's write).
    __syncwarp(mask);
    if (in_sectors) copy_sectors(frame, in, in_sectors, shift, lane, mask);
}

// Warp-collective over `mask`, led by `leader`, which holds a pin on the page whose words and
// bytes every lane passes (the leader's): makes the frame hold every sector in `need`, claiming
// and loading those nobody is loading, then waiting for the others' loads; ends with the lanes'
// later loads ordered after the sectors'. Out of line, with scalars only (a reference to the
// space would put a copy of it on every caller's stack).
__device__ __noinline__ void fill_sectors_at(strata_u64* page_word, strata_u64* word, unsigned char* frame_bytes,
                                             const unsigned char* host_page, strata_u32 page_shift,
                                             strata_u32 shift, strata_u32 need, StrataCounters* counters,
                                             unsigned leader, unsigned lane, unsigned mask) {
    const strata_u32 all = all_sectors(page_shift, shift);
    unsigned sleep_ns = 32;
    for (;;) {
        strata_u32 claimed = 0;
        int held = 0;
        if (lane == leader) {
            strata_u64 w = load_acquire(word);
            for (;;) {
                const strata_u32 missing = need & ~(strata_u32)w;
                if (!missing) {
                    held = 1;
                    break;
                }
                const strata_u32 free_to_claim = missing & ~(strata_u32)(w >> 32);
                if (!free_to_claim) break;  // the rest are being loaded by others
                const strata_u64 prev = atomicCAS(word, w, w | ((strata_u64)free_to_claim << 32));
                if (prev == w) {
                    claimed = free_to_claim;
                    break;
                }
                w = prev;
            }
        }
        claimed = __shfl_sync(mask, claimed, leader);
        held = __shfl_sync(mask, held, leader);
        if (held) break;
        if (claimed) {
            copy_sectors(frame_bytes, host_page, claimed, shift, lane, mask);
            __syncwarp(mask);
            if (lane == leader) {
                // Ordering point (release): the copy (ordered to the leader by the __syncwarp)
                // before the sectors are marked held; pairs with holds_sectors' acquire.
                __threadfence();
                const strata_u64 before = atomicAdd(word, (strata_u64)claimed - ((strata_u64)claimed << 32));
                atomicAdd(&counters->sector_fills, 1ull);
                atomicAdd(&counters->bytes_in, (strata_u64)__popc(claimed) << shift);
                if ((((strata_u32)before | claimed) & all) == all) {
                    // The page is whole now: clear its partial bit, so hits stop reading the
                    // sector word. Ordering point: this fence makes the other loaders' sectors
                    // (whose releases our add read) and ours visible before the bit clears; an
                    // optimistic reader that sees it clear reads after its acquire of the word.
                    // (Readers that read the word before see it change and retry once.)
                    __threadfence();
                    atomicAnd(page_word, ~STRATA_PARTIAL);
                }
            }
        } else {
            // Another warp is copying the rest (it holds a pin and waits on nothing): soon.
            __nanosleep(sleep_ns);
            if (sleep_ns < 1024) sleep_ns *= 2;
        }
    }
    // Ordering point: the leader's acquire load that saw every sector held, before the lanes'
    // loads of them.
    __syncwarp(mask);
}

// Warp-collective over `mask`: lane `leader` holds a pin on its `page`, resident in `frame` in
// part, and the warp loads the sectors of `need` the frame lacks. Each lane passes its own
// space, page and frame (lanes may be of different spaces): the leader's count. Inline, with
// the out-of-line fill_sectors_at as the only call: a loop over groups kept out of line (a
// second level of call) cost the update kernel of `gpu-micro` 24 registers on sm_90.
__device__ __forceinline__ void fill_held(const StrataSpace& s, strata_u64 page, strata_u32 frame, strata_u32 need,
                                          unsigned leader, unsigned lane, unsigned mask) {
    fill_sectors_at((strata_u64*)__shfl_sync(mask, (strata_u64)&s.page_table[page], leader),
                    (strata_u64*)__shfl_sync(mask, (strata_u64)sector_word(s, frame), leader),
                    (unsigned char*)__shfl_sync(mask, (strata_u64)(s.frame_data + ((strata_u64)frame << s.page_shift)),
                                                leader),
                    (const unsigned char*)__shfl_sync(mask, (strata_u64)(s.host + (page << s.page_shift)), leader),
                    __shfl_sync(mask, s.page_shift, leader), __shfl_sync(mask, sector_shift(s), leader),
                    __shfl_sync(mask, need, leader),
                    (StrataCounters*)__shfl_sync(mask, (strata_u64)s.counters, leader), leader, lane, mask);
}

}  // namespace detail
}  // namespace strata
