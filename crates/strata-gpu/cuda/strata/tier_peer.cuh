// strata/tier_peer.cuh: the peer tier, a victim cache in memory borrowed from neighbour GPUs
// (StrataSpace::peer; host side strata_gpu::tier::peer), above the pinned host copy.
//  - Every page leaving a GPU frame is also copied into a borrowed slot (round robin), in the
//    same pass that writes it to the host copy if it is dirty, so a slot copy is always clean:
//    the host copy is current for every page not in a frame, and a slot can be dropped or
//    overwritten at any time without a write.
//  - A fault on a page whose slot still holds it copies the page over NVLink instead of PCIe.
//    The slot word is read before and after the copy (a seqlock); a slot rewritten meanwhile
//    makes the fault load the page from the host copy instead. A page loaded from its slot
//    gives the slot up (exclusive caching: local frames and slots hold different pages).
//  - A page's slot entry is set only while the page is being evicted (EVICTING) and cleared
//    only while it is being loaded (LOADING) or by host maintenance, so it never changes under
//    a fault of the same page.
//  - Leased chunks (memory lent by other processes through the broker): the slots are grouped
//    in chunks that may be absent, or revoked while a kernel runs. A warp that is about to copy
//    from or to a slot first enters its chunk (in-flight count + 1, system fence, then reads the
//    chunk's revoked word; revoked: it leaves again and treats the slot as missing, so the page
//    comes from the host copy and the victim just gets no peer copy). It leaves after its copy.
//    The host revokes by setting the revoked word, then waiting for the in-flight count to
//    reach zero, then unmapping (host side strata_gpu::tier::peer). Each side writes its word,
//    fences, then reads the other's, so a warp either sees the revocation or is waited for.
#pragma once

// Per-chunk lease state, in GPU memory right after the StrataPeer it belongs to (same buffer).
struct StrataPeerLeases {
    strata_u32* revoked;      // [chunks] nonzero: absent or revoked (written by the host)
    strata_u32* inflight;     // [chunks] warps copying from or to the chunk now
    strata_u32 chunk_shift;   // log2(slots per chunk)
    strata_u32 chunks;        // 0: not leased (this process's own memory, never revoked)
    strata_u64 reserved;      // zero
    strata_u64 refused;       // entries refused because the chunk was absent or revoked
};

static_assert(sizeof(StrataPeerLeases) == 40, "StrataPeerLeases layout changed: update strata_gpu::tier::peer");

namespace strata {
namespace detail {

__device__ __forceinline__ StrataPeerLeases* peer_leases(StrataPeer* p) { return (StrataPeerLeases*)(p + 1); }

// Leader lane: enters the chunk holding `slot`; false (not entered) when it is absent or revoked.
__device__ __forceinline__ bool peer_enter(StrataPeer* p, strata_u64 slot) {
    StrataPeerLeases* const l = peer_leases(p);
    if (load_volatile(&l->chunks) == 0) return true;
    const strata_u64 c = slot >> l->chunk_shift;
    atomicAdd(&l->inflight[c], 1u);
    // Ordering point (sequentially consistent, system scope): our count is visible before we
    // read the host's revoked word (the host writes that word before it reads the count).
    __threadfence_system();
    if (load_volatile(&l->revoked[c]) != 0) {
        atomicSub(&l->inflight[c], 1u);
        atomicAdd(&l->refused, 1ull);
        return false;
    }
    return true;
}

// Leader lane: leaves the chunk holding `slot` (after every copy from or to it completed and
// was fenced).
__device__ __forceinline__ void peer_leave(StrataPeer* p, strata_u64 slot) {
    StrataPeerLeases* const l = peer_leases(p);
    if (load_volatile(&l->chunks) == 0) return;
    atomicSub(&l->inflight[slot >> l->chunk_shift], 1u);
}

// Leader lane: a slot for `victim`'s copy, taken from the round-robin cursor, entered (leased
// chunks) and marked BUSY (the page it held loses its entry), never `avoid`. STRATA_NO_PAGE when every slot tried is
// busy (the victim then just has no peer copy).
__device__ __forceinline__ strata_u32 peer_claim_slot(StrataPeer* p, strata_u64 avoid) {
    for (int tries = 0; tries < 8; ++tries) {
        const strata_u64 slot = atomicAdd(&p->next, 1ull) % p->slot_count;
        if (slot == avoid) continue;
        const strata_u64 w = load_volatile(&p->slot_words[slot]);
        if (w & STRATA_PEER_BUSY) continue;
        if (!peer_enter(p, slot)) continue;
        if (atomicCAS(&p->slot_words[slot], w, w | STRATA_PEER_BUSY) != w) {
            peer_leave(p, slot);
            continue;
        }
        if (w & STRATA_PEER_VALID)
            atomicCAS(&p->page_slots[w & STRATA_PEER_PAGE_MASK], (strata_u32)slot + 1u, 0u);
        return (strata_u32)slot;
    }
    return STRATA_NO_PAGE;
}

// Leader lane: the slot holding `page`'s copy (its chunk entered) and the slot word seen, or
// STRATA_NO_PAGE.
__device__ __forceinline__ strata_u32 peer_find(StrataPeer* p, strata_u64 page, strata_u64* word) {
    const strata_u32 entry = load_volatile(&p->page_slots[page]);
    if (entry == 0) return STRATA_NO_PAGE;
    const strata_u64 w = load_volatile(&p->slot_words[entry - 1]);
    if ((w & (STRATA_PEER_VALID | STRATA_PEER_BUSY)) != STRATA_PEER_VALID || (w & STRATA_PEER_PAGE_MASK) != page)
        return STRATA_NO_PAGE;
    if (!peer_enter(p, entry - 1)) return STRATA_NO_PAGE;
    // Ordering point (acquire): the slot's bytes are read after its word.
    fence_acq_rel_sys();
    *word = w;
    return entry - 1;
}

// Warp-collective: writes the frame's old bytes to `out_host` (if not null) and `out_peer` (if
// not null) and reads `in` into the frame, chunk by chunk (each chunk of the frame is read
// before it is overwritten).
__device__ __forceinline__ void warp_evict_load_copy(unsigned char* frame, unsigned char* out_host,
                                                     unsigned char* out_peer, const unsigned char* in,
                                                     strata_u64 bytes, unsigned lane, unsigned lanes_mask) {
    uint4* f = (uint4*)frame;
    uint4* oh = (uint4*)out_host;
    uint4* op = (uint4*)out_peer;
    const uint4* n = (const uint4*)in;
    const strata_u64 vecs = bytes / 16;
    const unsigned nl = __popc(lanes_mask);
    const unsigned rank = __popc(lanes_mask & ((1u << lane) - 1u));
    const bool keep = oh != 0 || op != 0;
    for (strata_u64 i = rank; i < vecs; i += 4 * nl) {
        uint4 old[4], fresh[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (i + k * nl < vecs) {
                if (keep) old[k] = __ldcg(f + i + k * nl);
                fresh[k] = __ldcg(n + i + k * nl);
            }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (i + k * nl < vecs) {
                if (oh) __stcg(oh + i + k * nl, old[k]);
                if (op) __stcg(op + i + k * nl, old[k]);
                __stcg(f + i + k * nl, fresh[k]);
            }
    }
}

// Warp-collective (every lane of `mask`, with `leader`'s space), for a space with a peer tier
// over its host copy: `victim` (STRATA_NO_PAGE if the frame was free) goes to a peer slot and,
// if `victim_dirty`, to the host copy; `page` comes from its peer slot if it has one, else from
// the host copy. Cannot fail (the host copy always has the page).
__device__ int peer_exchange(const StrataSpace& s, strata_u64 victim, bool victim_dirty, strata_u64 page,
                             unsigned char* frame, unsigned lane, unsigned mask, unsigned leader) {
    StrataPeer* const p = (StrataPeer*)__shfl_sync(mask, (strata_u64)s.peer, leader);
    unsigned char* const host = (unsigned char*)__shfl_sync(mask, (strata_u64)s.host, leader);
    const strata_u32 shift = __shfl_sync(mask, s.page_shift, leader);
    const strata_u64 ps = 1ull << shift;
    strata_u32 from = STRATA_NO_PAGE, to = STRATA_NO_PAGE;
    strata_u64 seen = 0;
    if (lane == leader) {
        from = peer_find(p, page, &seen);
        if (victim != STRATA_NO_PAGE) to = peer_claim_slot(p, from);
    }
    from = __shfl_sync(mask, from, leader);
    to = __shfl_sync(mask, to, leader);
    unsigned char* const slots = (unsigned char*)__shfl_sync(mask, (strata_u64)p->slots, leader);
    unsigned char* const out_host = (victim != STRATA_NO_PAGE && victim_dirty) ? host + (victim << shift) : 0;
    unsigned char* const out_peer = to != STRATA_NO_PAGE ? slots + ((strata_u64)to << shift) : 0;
    const unsigned char* const in = from != STRATA_NO_PAGE ? slots + ((strata_u64)from << shift) : host + (page << shift);
    warp_evict_load_copy(frame, out_host, out_peer, in, ps, lane, mask);
    __syncwarp(mask);
    int fresh = 1;
    if (lane == leader) {
        // Ordering point: the copies above complete before the words below are read or written
        // (system scope: the slots are another GPU's memory).
        fence_acq_rel_sys();
        if (from != STRATA_NO_PAGE) {
            fresh = load_volatile(&p->slot_words[from]) == seen;
            if (fresh) {
                atomicCAS(&p->page_slots[page], from + 1u, 0u);  // exclusive: the slot is free to go
                atomicAdd(&p->loads, 1ull);
            } else {
                atomicAdd(&p->stale, 1ull);
            }
        }
        if (to != STRATA_NO_PAGE) {
            const strata_u64 w = load_volatile(&p->slot_words[to]);
            const strata_u64 gen = (w >> STRATA_PEER_GEN_SHIFT) + 1;
            atomicExch(&p->slot_words[to], (gen << STRATA_PEER_GEN_SHIFT) | STRATA_PEER_VALID | victim);
            atomicExch(&p->page_slots[victim], to + 1u);
            atomicAdd(&p->stores, 1ull);
        }
        // Our copies from and to the slots are complete and fenced (above): leave their chunks.
        if (from != STRATA_NO_PAGE) peer_leave(p, from);
        if (to != STRATA_NO_PAGE) peer_leave(p, to);
    }
    // A slot rewritten while we copied it: the host copy has the page.
    if (!__shfl_sync(mask, fresh, leader)) warp_copy(frame, host + (page << shift), ps, lane, mask);
    return 0;
}

}  // namespace detail
}  // namespace strata
