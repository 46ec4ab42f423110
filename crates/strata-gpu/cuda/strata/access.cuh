// strata/access.cuh: what kernels call: acquire/release of whole pages, element access
// (Array), optimistic reads (view_page/view_valid).
#pragma once

namespace strata {


// A pinned page: what acquire() returns. `data` points at the page's frame in GPU memory, or
// (read-through, `host`) at its bytes in the pinned host copy, with no pin held. When `ok` is
// false the access failed (page out of range, or no frame within the wait limit): the error is
// recorded for the host's check_errors(), nothing is pinned, and `data` points at a scratch page
// of the space whose bytes mean nothing (writes there are lost, reads return garbage).
struct PageRef {
    unsigned char* data;
    strata_u64 page;
    unsigned peers;   // lanes sharing this pin
    unsigned leader;  // the lane that holds it
    bool host;        // nothing to unpin: served from the host copy, or failed
    bool ok;          // false: failed, see above
};

// What a kernel may hold at once (the rules that guarantee forward progress):
//  - A warp holds the pages of at most one acquire()/acquire_page() call at a time: release
//    them before acquiring again. One call pins at most 32 pages (one per distinct
//    (space, page) of its lanes).
//  - In each space, the pins that all warps running at once hold together must be fewer than
//    the cache's frames. The scan-resistant policy needs no extra room (a sweep that finds only
//    protected frames unpinned evicts one of them).
//  - Element access (Array) holds no pin while it waits and needs only a cache of 2 frames.
// Within these rules every access completes. Beyond them (more pins than frames, a warp that
// keeps pages while acquiring more), a warp that waits longer than the space's wait limit
// (Space::set_wait_limit, 4 s by default) gives up: STRATA_ERR_NO_FRAME is recorded with the
// page, the access fails (PageRef::ok false; element reads return 0, writes are dropped), and
// the host's check_errors() returns the error. No GPU wait is unbounded.

// Warp-collective over the calling lanes: every calling lane gets its page pinned. Lanes with
// the same (space, page) share one pin, which is a writing one if any of them writes. Lanes
// may differ in space, page and write. Faults are served by this warp. `prefetch` only labels
// the statistics. A page index past the end records STRATA_ERR_PAGE_OUT_OF_RANGE and fails; so
// does a write to a read-only space (Space::set_read_only), with STRATA_ERR_READ_ONLY.
// `read_mode` (reads only; ignored when any lane of the group writes or `prefetch` is set):
//  - STRATA_READ_MIGRATE (0, `false`): a missing page is moved into a frame.
//  - STRATA_READ_REMOTE_OK (1, `true`): a page not resident and not yet worth a frame may be
//    served in place from the host copy by remote access (remote.cuh), as element reads are:
//    the space's remote-access policy decides, counting the access.
//  - STRATA_READ_IN_PLACE (2): the caller knows this visit does not pay for a migration (it
//    reads a few rows of the page and will not be back soon): a page not resident is read in
//    place from the host copy whatever its count, and left where it is. A resident page is
//    still pinned and read from its frame.
// Served in place means PageRef::host set, `data` pointing into the host copy, nothing pinned;
// for kernels that read a page's bytes through `data` and can take host memory's latency. Only
// a space whose lower tier is a full host copy serves pages in place (over a store, or with
// remote access off for STRATA_READ_REMOTE_OK, the page migrates).
__device__ __forceinline__ PageRef acquire_page(const StrataSpace& s, strata_u64 page, bool write,
                                                bool prefetch = false, unsigned read_mode = STRATA_READ_MIGRATE) {
    const unsigned mask = __activemask();
    const unsigned lane = detail::lane_id();
    const bool read_only = (s.policy & STRATA_POLICY_READ_ONLY) != 0;
    const bool in_range = page < s.pages;
    if (!in_range) detail::report_error(s, STRATA_ERR_PAGE_OUT_OF_RANGE, page);
    // A write to a read-only space is refused: that lane fails alone, its readers go on.
    const bool refused = in_range && write && read_only;
    if (refused) detail::report_error(s, STRATA_ERR_READ_ONLY, page);
    const bool usable = in_range && !refused;
    // Groups are (space, page): lanes of different spaces never share a pin or a frame.
    const unsigned peers = __match_any_sync(mask, usable ? page : ~0ull) & detail::space_peers(mask, s);
    const unsigned leader = __ffs(peers) - 1;
    const bool is_leader = usable && lane == leader;
    // A group pins for writing if any of its lanes writes (else the page is never marked dirty
    // and the other lanes' writes are dropped on eviction).
    const bool group_write = (__ballot_sync(mask, write && usable) & peers) != 0;
    strata_u32 frame = 0;
    unsigned pending = __ballot_sync(mask, is_leader);
    unsigned sleep_ns = 64;
    unsigned idle_rounds = 0;
    unsigned hits_here = 0;
    unsigned via_host = 0;  // leaders served from the host copy (they hold no pin)
    unsigned failed = 0;    // leaders that gave up (wait limit)
    strata_u64 waiting_since = 0;
    const bool read_through = !group_write && !prefetch && (s.policy & STRATA_POLICY_READ_THROUGH);
    const bool plain_read = !group_write && !prefetch;
    const bool in_place = plain_read && read_mode == STRATA_READ_IN_PLACE && s.tier == STRATA_TIER_HOST_COPY;
    const bool remote_read = plain_read && read_mode == STRATA_READ_REMOTE_OK && detail::remote_reads_on(s);
    unsigned via_remote = 0;  // leaders served in place by remote access (they hold no pin)
    bool partial = false;     // the leader's pin is on a page held in part (sectors.cuh)
    while (pending) {
        int status = detail::PIN_NONE;
        bool served_remote = false;
        if (is_leader && ((pending >> lane) & 1u)) {
            if (remote_read || in_place) {
                // The acquire load that sees the page not resident orders these reads of the
                // host copy after its last write-back (remote.cuh's argument for reads). A
                // read-only space has no write-back and its host copy does not change while
                // kernels run, so a relaxed load does, without the acquire's L1 invalidation.
                const strata_u64 w = read_only ? detail::load_relaxed(&s.page_table[page])
                                               : detail::load_acquire(&s.page_table[page]);
                if (detail::state_of(w) == STRATA_NOT_RESIDENT &&
                    (in_place || detail::try_remote(s, page, w, false) == detail::REMOTE_SERVED)) {
                    status = detail::PIN_HOST;
                    served_remote = true;
                }
            }
            if (status == detail::PIN_NONE) status = detail::try_pin(s, page, group_write, &frame, read_through);
        }
        via_remote |= __ballot_sync(mask, served_remote);
        if (status != detail::PIN_NONE) partial = status == detail::PIN_PARTIAL;
        const unsigned hit = __ballot_sync(mask, status == detail::PIN_HIT || status == detail::PIN_PARTIAL);
        unsigned claimed = __ballot_sync(mask, status == detail::PIN_CLAIMED);
        const unsigned hosted = __ballot_sync(mask, status == detail::PIN_HOST);
        via_host |= hosted;
        hits_here += __popc(hit);
        pending &= ~(hit | hosted);
        bool starved = false;
        unsigned served = hosted;
        while (claimed) {
            const unsigned l = __ffs(claimed) - 1;
            claimed &= claimed - 1;
            const strata_u64 p = __shfl_sync(mask, page, l);
            const strata_u32 f = detail::serve_fault(s, p, l, lane, mask, group_write, prefetch);
            if (f == STRATA_NO_PAGE) {
                starved = true;
            } else if (f == STRATA_FAULT_FAILED) {
                // The tier below failed the page (recorded): this group's access fails.
                pending &= ~(1u << l);
                failed |= 1u << l;
                served |= 1u << l;
            } else {
                if (lane == l) frame = f;
                pending &= ~(1u << l);
                served |= 1u << l;
            }
        }
        idle_rounds = (hit | served) ? 0 : idle_rounds + 1;
        if (starved || idle_rounds > 64) {
            // Every frame stayed pinned for a whole sweep, or we waited long on pages others
            // are moving. Drop this warp's pins so that warps needing frames we hold can
            // finish (no deadlock however small the cache), then try again after a pause.
            idle_rounds = 0;
            const unsigned held = __ballot_sync(mask, is_leader) & ~pending & ~via_host & ~failed;
            if (is_leader && ((held >> lane) & 1u)) detail::unpin_release(&s.page_table[page]);
            pending |= held;
            hits_here = 0;
        }
        if (pending && (starved || !(hit | served))) {
            if (detail::wait_expired(s, mask, &waiting_since)) {
                // Bounded wait: the pending leaders give up and say why.
                if (is_leader && ((pending >> lane) & 1u)) detail::report_error(s, STRATA_ERR_NO_FRAME, page);
                failed |= pending;
                break;
            }
            __nanosleep(sleep_ns);
            if (sleep_ns < 4096) sleep_ns *= 2;
        }
    }
    if (lane == __ffs(mask) - 1 && hits_here)
        detail::add_hits(s, hits_here);
    if (lane == __ffs(mask) - 1 && (via_host & ~via_remote))
        atomicAdd(&s.counters->read_through, (strata_u64)__popc(via_host & ~via_remote));
    if (lane == __ffs(mask) - 1 && via_remote) atomicAdd(&s.counters->remote_reads, (strata_u64)__popc(via_remote));
    // Sub-page fetch (sectors.cuh): a page taken whole must hold every sector. A fault here
    // loaded them all, but a hit may find a page that element accesses loaded in part (whose
    // missing sectors the warp loads now, if nobody has meanwhile).
    unsigned lacking = __ballot_sync(mask, partial && is_leader && !(((failed | via_host) >> lane) & 1u));
    while (lacking) {
        const unsigned l = __ffs(lacking) - 1;
        lacking &= lacking - 1;
        detail::fill_held(s, page, frame, detail::all_sectors(s), l, lane, mask);
    }
    frame = __shfl_sync(mask, frame, leader);
    // Ordering point: the leader's pin_acquire (or its serve_fault, whose copy ends in a
    // __syncwarp) is ordered before every lane's loads of the frame by this barrier.
    __syncwarp(mask);
    PageRef r;
    r.ok = usable && !((failed >> leader) & 1u);
    r.host = !r.ok || ((via_host >> leader) & 1u);
    r.data = !r.ok     ? detail::scratch_page(s)
             : r.host ? s.host + (page << s.page_shift)
                      : s.frame_data + ((strata_u64)frame << s.page_shift);
    r.page = page;
    r.peers = peers;
    r.leader = leader;
    return r;
}

// Drops the pin acquire_page() took. Call with the same lanes.
__device__ __forceinline__ void release_page(const StrataSpace& s, const PageRef& r) {
    __syncwarp(r.peers);
    if (detail::lane_id() == r.leader && !r.host) detail::unpin_release(&s.page_table[r.page]);
}

// Bulk access: acquire makes the page's bytes visible to this thread's ordinary loads (it
// fences, so no stale L1 line of an earlier page in the same frame is read).
__device__ __forceinline__ PageRef acquire(const StrataSpace& s, strata_u64 page, bool write) {
    PageRef r = acquire_page(s, page, write);
    __threadfence();
    return r;
}
__device__ __forceinline__ void release(const StrataSpace& s, const PageRef& r) { release_page(s, r); }

namespace detail {
// Element access: pins `page` for the calling lane's group, runs `op(frame_bytes)` on it and
// unpins, group by group as pages become resident. Unlike acquire_page, no pin is held while
// this warp waits for another page, so any cache of two or more frames makes progress however
// many distinct pages a warp touches. Lanes with `want` false ask for nothing but still help
// copy the pages the others fault on (a page copy is as fast as the lanes doing it). Groups are
// (space, page), writing if any lane writes. Returns false if this lane's access gave up (the
// wait limit passed; STRATA_ERR_NO_FRAME recorded) and `op` did not run. With sub-page fetch
// (sectors.cuh), `sectors` are those the lane needs (sectors_wanted; 0 when its space has no
// sectors): the union of its group's is loaded rather than the whole page.
template <typename Op>
__device__ __forceinline__ bool with_page(const StrataSpace& s, strata_u64 page, bool write, Op op,
                                          bool want, strata_u32 sectors) {
    const unsigned mask = __activemask();
    const unsigned lane = lane_id();
    const unsigned peers = __match_any_sync(mask, want ? page : ~0ull) & space_peers(mask, s);
    const unsigned leader = __ffs(peers) - 1;
    const bool is_leader = want && lane == leader;
    const bool group_write = (__ballot_sync(mask, want && write) & peers) != 0;
    // The sectors each group needs (0: whole pages).
    const bool any_sectors = __any_sync(mask, want && sectors != 0u);
    const strata_u32 need = any_sectors ? group_sectors(mask, peers, want ? sectors : 0u) : 0u;
    unsigned pending = __ballot_sync(mask, is_leader);
    unsigned failed = 0;  // leaders whose page the tier below failed
    unsigned sleep_ns = 64;
    unsigned hits_here = 0;
    strata_u64 waiting_since = 0;
    while (pending) {
        strata_u32 frame = 0;
        int status = PIN_NONE;
        if (is_leader && ((pending >> lane) & 1u)) {
            status = try_pin(s, page, group_write, &frame);
            // A page held in part is a hit if it holds the group's sectors; if not, its pin is
            // kept and the load of what it lacks is served with the faults below.
            if (status == PIN_PARTIAL) status = holds_sectors(s, frame, need) ? PIN_HIT : PIN_LACKING;
        }
        const unsigned hit = __ballot_sync(mask, status == PIN_HIT);
        unsigned claimed = __ballot_sync(mask, status == PIN_CLAIMED || status == PIN_LACKING);
        const unsigned lacking = __ballot_sync(mask, status == PIN_LACKING);
        hits_here += __popc(hit);
        // Hits first: access and unpin before this warp serves any fault, so while it sweeps
        // for a frame it holds no pin at all.
        const strata_u32 held = frame;  // a lacking leader's frame, for the loop below
        frame = __shfl_sync(mask, frame, leader);
        const bool mine = (hit >> leader) & 1u;
        // Ordering point: the leader's pin_acquire before the group's loads of the frame.
        __syncwarp(mask);
        if (mine) op(s.frame_data + ((strata_u64)frame << s.page_shift));
        __syncwarp(mask);
        if (mine && is_leader) unpin_release(&s.page_table[page]);
        unsigned ready = hit;
        // Then each claimed page: serve, access, unpin, one at a time (at most one frame held).
        while (claimed) {
            const unsigned l = __ffs(claimed) - 1;
            claimed &= claimed - 1;
            const strata_u64 p = __shfl_sync(mask, page, l);
            const strata_u32 in = __shfl_sync(mask, held, l);
            const strata_u32 f = serve_fault(s, p, l, lane, mask, group_write, false, need ? need : 0xFFFFFFFFu,
                                             ((lacking >> l) & 1u) ? in : STRATA_NO_PAGE);
            if (f == STRATA_FAULT_FAILED) {
                // The tier below failed the page (recorded): this group's access fails.
                ready |= 1u << l;
                failed |= 1u << l;
            } else if (f != STRATA_NO_PAGE) {
                ready |= 1u << l;
                if (leader == l) op(s.frame_data + ((strata_u64)f << s.page_shift));
                __syncwarp(mask);
                if (lane == l) unpin_release(&s.page_table[p]);
            }
        }
        pending &= ~ready;
        if (pending && !ready) {
            if (wait_expired(s, mask, &waiting_since)) {
                if (is_leader && ((pending >> lane) & 1u)) report_error(s, STRATA_ERR_NO_FRAME, page);
                if (lane == __ffs(mask) - 1 && hits_here) add_hits(s, hits_here);
                return !(((pending | failed) >> leader) & 1u) || !want;
            }
            __nanosleep(sleep_ns);
            if (sleep_ns < 4096) sleep_ns *= 2;
        }
    }
    if (lane == __ffs(mask) - 1 && hits_here)
        add_hits(s, hits_here);
    return !((failed >> leader) & 1u) || !want;
}
// with_page for an element access at byte `off` of its page (`sparse`: the miss may be
// sparse, see sectors_wanted).
template <typename Op>
__device__ __forceinline__ bool element_access(const StrataSpace& s, strata_u64 page, bool write, Op op, bool want,
                                               strata_u64 off, bool sparse) {
    return with_page(s, page, write, op, want, sectors_wanted(s, off, sparse));
}
}  // namespace detail

__device__ __forceinline__ strata_u64 page_bytes(const StrataSpace& s) { return 1ull << s.page_shift; }
__device__ __forceinline__ strata_u64 page_count(const StrataSpace& s) { return s.pages; }

// ---- optimistic reads: no atomic on a hit ------------------------------------------------------
// A pin costs two atomics on the page's word, and under skew every SM's warps aim them at the
// same few hot words, which serialise in L2. A reader that only reads can skip the pin: read
// the word (acquire), read the bytes from its frame, then check that the word still shows the
// page resident in that frame with the same version. An evictor marks the word EVICTING (and
// fences) before any byte of the frame is overwritten, and a page evicted and reloaded into the
// same frame comes back with a new version, so a reader that passes the check read this page's
// bytes; one that fails discards them and takes the pinned path. (The version has 8 bits: a
// reader would have to stall across 256 evict-and-reload cycles of its own page to be fooled.)
//
//   strata::PageView v = strata::view_page(s, page);
//   if (v.resident) { x = __ldcg(v.data + off); ... }     // ordinary L2 loads
//   if (strata::view_valid(s, v)) { use x; ++hits; } else { acquire_page(...) as usual }
//   ...
//   strata::count_hits(s, hits);                          // once per warp at the end
//
// Writes and atomics keep pinning: a write must not land in a frame being written back.
struct PageView {
    const unsigned char* data;  // the page's frame (meaningful when resident)
    strata_u64 page;
    strata_u64 word;            // the page-table word as first read
    bool resident;
};

// A page index past the end records STRATA_ERR_PAGE_OUT_OF_RANGE and gives a view that is not
// resident (pointing at the scratch page), whose view_valid is false.
__device__ __forceinline__ PageView view_page(const StrataSpace& s, strata_u64 page) {
    PageView v;
    v.page = page;
    if (page >= s.pages) {
        detail::report_error(s, STRATA_ERR_PAGE_OUT_OF_RANGE, page);
        v.word = 0;
        v.resident = false;
        v.data = detail::scratch_page(s);
        return v;
    }
    // Ordering point: an acquire load, paired with the publisher's release (serve_fault's fence
    // before its publishing add), so the frame bytes read after it are the published ones.
    v.word = detail::load_acquire(&s.page_table[page]);
    // With sub-page fetch a view is of whole pages only: a page held in part takes the pinned
    // path (acquire_page loads the rest).
    v.resident = detail::state_of(v.word) == STRATA_RESIDENT && !(v.word & STRATA_PARTIAL);
    v.data = s.frame_data + ((v.word & STRATA_FRAME_MASK) << s.page_shift);
    return v;
}

// True if every byte this thread read from `v.data` since view_page belongs to the page (it
// stayed in its frame throughout); sets the frame's reference bit then. False: discard them.
__device__ __forceinline__ bool view_valid(const StrataSpace& s, const PageView& v) {
    if (!v.resident) return false;
    detail::fence_acq_rel();  // the frame loads complete before the word is read again
    if (!detail::same_residency(v.word, detail::load_relaxed(&s.page_table[v.page]))) {
        atomicAdd(&s.counters->optimistic_retries, 1ull);
        return false;
    }
    detail::touch_frame(s, (strata_u32)(v.word & STRATA_FRAME_MASK));
    return true;
}

// Adds hits the caller served through view_page/view_valid to the statistics (call rarely,
// e.g. once per warp: it is an atomic).
__device__ __forceinline__ void count_hits(const StrataSpace& s, strata_u64 n) {
    if (n) detail::add_hits(s, n);
}

namespace detail {
template <typename T, int N = sizeof(T)> struct Bits;
template <typename T> struct Bits<T, 4> { typedef unsigned int type; };
template <typename T> struct Bits<T, 8> { typedef strata_u64 type; };

// Loads through L2 only: frames are reused by other pages, and L1 is not coherent.
template <typename T> __device__ __forceinline__ T load_cg(const T* p) {
    typedef typename Bits<T>::type B;
    B b = __ldcg((const B*)p);
    union { B b; T t; } u;
    u.b = b;
    return u.t;
}
// An acquire load of one element: the page word's re-read after it cannot pass it.
template <typename T> __device__ __forceinline__ T load_acquire_elem(const T* p) {
    typedef typename Bits<T>::type B;
    B b;
    if (sizeof(B) == 8) {
        strata_u64 x;
        asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(p) : "memory");
        b = (B)x;
    } else {
        unsigned x;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
        b = (B)x;
    }
    union { B b; T t; } u;
    u.b = b;
    return u.t;
}
template <typename T> __device__ __forceinline__ T atomic_add_elem(T* p, T v) { return atomicAdd(p, v); }
template <> __device__ __forceinline__ long long atomic_add_elem<long long>(long long* p, long long v) {
    return (long long)atomicAdd((strata_u64*)p, (strata_u64)v);
}
}  // namespace detail

// A typed view of a space. Elements must be 4 or 8 bytes (pages are powers of two, so an
// element never straddles two pages).
//
// Occupancy: each access inlines the fault path, so a kernel using Array takes about 170
// registers (one block of 256 threads per SM). A kernel whose accesses mostly hit, such as a
// gather over a space that fits the cache, should bound its registers, for example with
// `__launch_bounds__(256, 4)`; the rarely used fault path then spills instead. On an H100,
// resident random gathers go from 45 % to 61 % of a plain load's rate
// (scripts/experiments/gather_anatomy.cu).
template <typename T> struct Array {
    StrataSpace s;
    __device__ explicit Array(const StrataSpace& space) : s(space) {}

    __device__ __forceinline__ strata_u64 size() const { return s.size_bytes / sizeof(T); }

    __device__ __forceinline__ T read(strata_u64 i) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return T(0);
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        const strata_u64 page = byte >> s.page_shift;
        // Optimistic hit first (no atomic; see view_page), the pinned path if the page is not
        // resident or moved while we read.
        T v = T(0);
        bool done = false;
        bool remote = false;
        const strata_u64 w = detail::load_acquire(&s.page_table[page]);
        if (detail::state_of(w) == STRATA_RESIDENT) {
            const strata_u32 frame = (strata_u32)(w & STRATA_FRAME_MASK);
            // A page held in part (sub-page fetch): a sector the frame lacks takes the pinned
            // path, which loads it. A whole page needs no look at its sector word.
            if (!(w & STRATA_PARTIAL) || detail::holds_sectors(s, frame, detail::sector_bit(s, off))) {
                v = detail::load_acquire_elem((const T*)(s.frame_data + ((strata_u64)frame << s.page_shift) + off));
                done = detail::same_residency(w, detail::load_relaxed(&s.page_table[page]));
                if (done) detail::touch_frame(s, frame);
                else atomicAdd(&s.counters->optimistic_retries, 1ull);
            }
        } else if (detail::remote_reads_on(s) &&
                   detail::try_remote(s, page, w, false) == detail::REMOTE_SERVED) {
            // Not resident and not yet worth a frame: read in place over the bus (remote.cuh).
            v = detail::load_cg((const T*)(s.host + (page << s.page_shift) + off));
            done = remote = true;
        }
        // Statistics as the pinned path counts them: one hit per group of lanes on one page.
        const unsigned mask = __activemask();
        const unsigned lane = detail::lane_id();
        const unsigned ok = __ballot_sync(mask, done);
        const unsigned same_space = detail::space_peers(mask, s);
        const unsigned group = __match_any_sync(mask, page) & same_space & ok;
        const unsigned leaders = __ballot_sync(mask, done && !remote && lane == __ffs(group) - 1) & same_space;
        const unsigned remotes = __ballot_sync(mask, remote) & same_space;
        if (lane == __ffs(same_space) - 1) {
            if (leaders) detail::add_hits(s, __popc(leaders));
            if (remotes) atomicAdd(&s.counters->remote_reads, (strata_u64)__popc(remotes));
        }
        // The whole warp enters the pinned path if any lane needs it, so faults are copied by
        // every lane rather than by the few that missed.
        if (ok != mask)
            detail::element_access(
                s, page, false, [&](unsigned char* f) { v = detail::load_cg((const T*)(f + off)); }, !done, off,
                !detail::remote_reads_on(s));
        return v;
    }

    __device__ __forceinline__ void write(strata_u64 i, T v) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return;
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        const strata_u64 page = byte >> s.page_shift;
        if (s.policy & STRATA_POLICY_READ_ONLY) {
            detail::report_error(s, STRATA_ERR_READ_ONLY, page);
            return;
        }
        typedef typename detail::Bits<T>::type B;
        bool remote = false;
        if (detail::remote_writes_on(s)) {
            // Not resident and not yet worth a frame: write in place over the bus (remote.cuh).
            const strata_u64 w = detail::load_relaxed(&s.page_table[page]);
            if (detail::state_of(w) == STRATA_NOT_RESIDENT &&
                detail::try_remote(s, page, w, true) == detail::REMOTE_SERVED) {
                __stcg((B*)(s.host + (page << s.page_shift) + off), *(const B*)&v);
                detail::remote_write_done(s, page);
                remote = true;
            }
        }
        const unsigned mask = __activemask();
        const unsigned same_space = detail::space_peers(mask, s);
        const unsigned remotes = __ballot_sync(mask, remote);
        if ((remotes & same_space) && detail::lane_id() == __ffs(same_space) - 1)
            atomicAdd(&s.counters->remote_writes, (strata_u64)__popc(remotes & same_space));
        if (remotes != mask)
            detail::element_access(
                s, page, true, [&](unsigned char* f) { __stcg((B*)(f + off), *(const B*)&v); }, !remote, off,
                !detail::remote_writes_on(s));
    }

    // Atomic add (int, unsigned, long long, unsigned long long, float, double); returns the old
    // value. Atomics act in L2, so concurrent adders on other SMs see each other.
    __device__ __forceinline__ T atomic_add(strata_u64 i, T v) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return T(0);
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 off = byte & ((1ull << s.page_shift) - 1);
        if (s.policy & STRATA_POLICY_READ_ONLY) {
            detail::report_error(s, STRATA_ERR_READ_ONLY, byte >> s.page_shift);
            return T(0);
        }
        T old = T(0);
        detail::element_access(s, byte >> s.page_shift, true,
                               [&](unsigned char* f) { old = detail::atomic_add_elem((T*)(f + off), v); }, true, off,
                               true);
        return old;
    }
};

}  // namespace strata
