// Strata's kernel-free small-copy service: one block that polls a doorbell ring in
// write-combined pinned host memory and moves payloads between host memory and device memory.
// Layout and protocol: crates/strata-copy/src/ring.rs (the host side; keep the two in step).
//
// Where the microseconds go, and what this kernel does about each:
// - Detecting a request costs a PCIe read round trip (R, about 1 us) plus the wait for the next
//   poll to start. Several polling warps ("pollers"), each with its own outstanding read, cut
//   that wait from R/2 to about R/(2 * pollers); each may poll its own mirror of the ring, so
//   their reads are distinct lines and never merged.
// - Every 8-byte ring word carries 4 data bytes and the request's tag, so one parallel read of a
//   slot both detects a request and fetches its inline payload: one round trip, not two.
// - The warp that finds a request serves it itself when it is small (no block barrier, no
//   hand-off); only large requests call the helper warps, through shared memory.
// - A small device-to-host copy answers with tagged words too: the host takes the data as soon
//   as every word carries the tag, without waiting for a system-scope fence. The fence (needed
//   before `done`, which frees the slot for reuse) runs after the data left, off the host's path.

#define SLOT_WORDS 64
#define HEADER_WORDS 4
#define INLINE_MAX 240

#define OP_H2D_INLINE 1
#define OP_H2D_STAGED 2
#define OP_D2H 3
#define OP_STOP 4
#define OP_D2H_TAGGED 5

#define STATUS_DONE 0
#define STATUS_EXITED 8
#define STATUS_FAULT 16

#define FULL_MASK 0xffffffffu
// Loads in flight per lane in the bulk copy loops (16 bytes each).
#define UNROLL 8

// The kernel's one parameter; ring.rs / service.rs build the same layout (96 bytes).
struct StrataServiceParams {
    const unsigned long long* ring;  // nslots * mirrors slots
    const unsigned char* h2d;        // nslots * stage_stride bytes
    unsigned char* d2h;              // nslots * stage_stride bytes
    unsigned long long* status;      // STATUS words
    unsigned long long stage_stride; // bytes between two slots' staging areas
    unsigned long long stage_max;    // largest staged request
    unsigned long long start_seq;    // first request this instance serves
    unsigned long long epoch;        // written to `exited` when it stops
    unsigned long long hot_ns;       // after a request, poll with no sleep for this long
    unsigned nslots;
    unsigned mirrors;                // copies of the ring the host writes (1 or pollers)
    unsigned pollers;                // polling warps
    unsigned poll_stagger_ns;        // start offset between pollers
    unsigned max_backoff_ns;         // cold polling back-off cap
    unsigned flags;                  // FLAG_*
    unsigned warp_max;               // requests up to this size are served by one warp
    unsigned hot_poll_lanes;         // lanes (16 bytes each) read per hot poll: 2..32
    unsigned rephase_ns;             // after serving, sleep a random 0..rephase_ns (0: never)
    unsigned reserved;
};
static_assert(sizeof(StrataServiceParams) == 112, "layout shared with service.rs");

#define FLAG_SYS_FENCE_H2D 1
#define FLAG_POLL_CV 2
#define FLAG_ACQ_REL 4

// Block-wide state, in shared memory.
struct StrataShared {
    unsigned long long claimed;   // last request claimed by a poller
    unsigned long long served;    // last request served (its writes fenced)
    unsigned long long active_ns; // when the last request was served
    const unsigned char* job_src; // a large request shared with the helper warps
    unsigned char* job_dst;
    unsigned job_len;
    unsigned job_from_host;
    unsigned job_gen;             // bumped for each job
    unsigned job_done;            // helpers finished with the current job
    unsigned stop;                // a STOP or a fault was served: every warp leaves
    unsigned live_warps;          // the last warp to leave reports the exit
};

__device__ __forceinline__ unsigned long long strata_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The tag of request `seq`: never 0, so zeroed memory never looks like a request.
__device__ __forceinline__ unsigned strata_tag(unsigned long long seq) {
    return (unsigned)((seq - 1) % 0xffffffffull) + 1u;
}

// A 16-byte load that always goes to memory (the host rewrites the ring behind the GPU's back):
// a volatile load, or (FLAG_POLL_CV) a weak "fetch again" load, which other warps' loads need
// not wait for.
__device__ __forceinline__ void strata_load2(const unsigned long long* p, unsigned long long& a,
                                             unsigned long long& b, bool cv) {
    if (cv) {
        asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
    } else {
        asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                     : "=l"(a), "=l"(b)
                     : "l"(p)
                     : "memory");
    }
}

// The fence before `done`: sequentially consistent (__threadfence*), or (FLAG_ACQ_REL) the
// release-acquire fence, which is all publishing needs.
__device__ __forceinline__ void strata_publish_fence(bool sys, bool acq_rel) {
    if (acq_rel) {
        if (sys) asm volatile("fence.acq_rel.sys;" ::: "memory");
        else asm volatile("fence.acq_rel.gpu;" ::: "memory");
    } else if (sys) {
        __threadfence_system();
    } else {
        __threadfence();
    }
}

__device__ __forceinline__ void strata_store_sys(unsigned long long* p, unsigned long long v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool strata_tagged(unsigned long long w, unsigned tag) {
    return (unsigned)(w >> 32) == tag;
}

__device__ __forceinline__ uint4 strata_load16(const uint4* p, bool from_host) {
    return from_host ? __ldcv(p) : __ldcg(p);
}

__device__ __forceinline__ unsigned char strata_load1(const unsigned char* p, bool from_host) {
    return from_host ? __ldcv(p) : __ldcg(p);
}

// Part `part` of `parts` of a copy between buffers that share their alignment modulo 16 (the
// host places staged bytes at the device address's offset within 16). One warp per part.
// Copies through whole aligned 16-byte blocks: the block holding the first byte, the one
// holding the last, and every one between, each read with one 16-byte load (an aligned block
// never crosses a page, so reading its bytes outside the range is safe). Blocks inside the range
// are written whole by the lane that read them; a block at either end is shuffled to the whole
// warp and written one byte per lane, so its bytes leave as one coalesced write. (Separate byte
// loads for the ends would share 32-byte sectors with the neighbouring block's load, and strong
// loads of one sector wait for each other: a whole PCIe round trip more for any length off 16
// bytes; byte stores from one lane would each be a transaction of their own.)
__device__ __forceinline__ unsigned char strata_byte_of(uint4 v, unsigned k) {
    const unsigned w = k < 8 ? (k < 4 ? v.x : v.y) : (k < 12 ? v.z : v.w);
    return (unsigned char)(w >> (8 * (k & 3)));
}

__device__ void strata_copy_part(unsigned char* dst, const unsigned char* src, unsigned len,
                                 bool from_host, unsigned part, unsigned parts, unsigned lane) {
    if (len == 0) return;
    const unsigned skew = (unsigned)((unsigned long long)dst & 15u);
    const uint4* s = reinterpret_cast<const uint4*>((unsigned long long)src & ~15ull);
    uint4* d = reinterpret_cast<uint4*>((unsigned long long)dst & ~15ull);
    const unsigned end = skew + len;  // range end, in bytes from the first block
    const unsigned blocks = (end + 15) / 16;
    const unsigned last = blocks - 1;
    const unsigned stride = parts * 32;
    // g: the warp's first block of the round (the same in every lane, so shuffles are safe).
    for (unsigned g = part * 32; g < blocks; g += stride * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned i = g + u * stride + lane;
            if (i < blocks) v[u] = strata_load16(s + i, from_host);
            else v[u] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned first = g + u * stride;
            if (first >= blocks) break;
            const unsigned i = first + lane;
            if (i < blocks && i * 16 >= skew && i * 16 + 16 <= end) d[i] = v[u];
#pragma unroll
            for (unsigned e = 0; e < 2; ++e) {
                const unsigned edge = e == 0 ? 0u : last;
                if (e == 1 && last == 0) break;
                if (edge < first || edge >= first + 32) continue;
                if (edge * 16 >= skew && edge * 16 + 16 <= end) continue;  // written whole
                const unsigned owner = edge - first;
                uint4 b;
                b.x = __shfl_sync(FULL_MASK, v[u].x, owner);
                b.y = __shfl_sync(FULL_MASK, v[u].y, owner);
                b.z = __shfl_sync(FULL_MASK, v[u].z, owner);
                b.w = __shfl_sync(FULL_MASK, v[u].w, owner);
                const unsigned pos = edge * 16 + lane;
                if (lane < 16 && pos >= skew && pos < end) {
                    reinterpret_cast<unsigned char*>(d + edge)[lane] = strata_byte_of(b, lane);
                }
            }
        }
    }
}

// Device to host as tagged words: word i = tag << 32 | bytes [4i, 4i + 4) of the source. Reads
// only aligned 4-byte words that hold at least one byte of the source.
__device__ void strata_d2h_tagged(unsigned long long* resp, const unsigned char* dev,
                                  unsigned len, unsigned tag, unsigned lane) {
    const unsigned words = (len + 3) / 4;
    const unsigned shift = ((unsigned)(unsigned long long)dev & 3u) * 8;
    const unsigned* base = reinterpret_cast<const unsigned*>((unsigned long long)dev & ~3ull);
    const unsigned long long end = (unsigned long long)dev + len;
    const unsigned long long high = (unsigned long long)tag << 32;
    for (unsigned w0 = lane; w0 < words; w0 += 32 * UNROLL) {
        unsigned v[UNROLL];
#pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned i = w0 + 32 * u;
            if (i < words) {
                const unsigned lo = __ldcg(base + i);
                unsigned hi = 0;
                if (shift != 0 && (unsigned long long)(base + i + 1) < end) hi = __ldcg(base + i + 1);
                v[u] = shift != 0 ? __funnelshift_r(lo, hi, shift) : lo;
            }
        }
#pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned i = w0 + 32 * u;
            if (i < words) strata_store_sys(resp + i, high | v[u]);
        }
    }
}

// Inline payload to the device: lane L >= 2 holds payload bytes [8(L-2), 8(L-2) + 8) in the
// low halves of its two words.
__device__ void strata_h2d_inline(unsigned char* dev, unsigned len, unsigned long long a,
                                  unsigned long long b, unsigned lane) {
    if (lane < 2) return;
    const unsigned off = 8 * (lane - 2);
    if (off >= len) return;
    const unsigned n = min(8u, len - off);
    const unsigned long long v = (a & 0xffffffffull) | (b << 32);
    unsigned char* d = dev + off;
    const unsigned long long addr = (unsigned long long)d;
    if (n == 8 && (addr & 7) == 0) {
        *reinterpret_cast<unsigned long long*>(d) = v;
    } else if (n >= 4 && (addr & 3) == 0) {
        *reinterpret_cast<unsigned*>(d) = (unsigned)v;
        for (unsigned k = 4; k < n; ++k) d[k] = (unsigned char)(v >> (8 * k));
    } else {
        for (unsigned k = 0; k < n; ++k) d[k] = (unsigned char)(v >> (8 * k));
    }
}

// A large staged copy: the serving warp takes part 0, each helper warp one more part.
__device__ void strata_big_copy(volatile StrataShared* sh, unsigned char* dst,
                                const unsigned char* src, unsigned len, bool from_host,
                                unsigned helpers, unsigned lane) {
    if (helpers == 0) {
        strata_copy_part(dst, src, len, from_host, 0, 1, lane);
        return;
    }
    if (lane == 0) {
        sh->job_src = src;
        sh->job_dst = dst;
        sh->job_len = len;
        sh->job_from_host = from_host ? 1u : 0u;
        sh->job_done = 0;
        __threadfence_block();
        atomicAdd(const_cast<unsigned*>(&sh->job_gen), 1u);
    }
    __syncwarp();
    strata_copy_part(dst, src, len, from_host, 0, helpers + 1, lane);
    while (sh->job_done != helpers) {
    }
    __threadfence_block();
}

__device__ void strata_helper(const StrataServiceParams& p, volatile StrataShared* sh,
                              unsigned part, unsigned parts) {
    const unsigned lane = threadIdx.x & 31;
    unsigned seen = 0;
    for (;;) {
        // Shared state is read by lane 0 and broadcast, so the warp decides as one.
        if (__shfl_sync(FULL_MASK, sh->stop, 0)) return;
        const unsigned gen = __shfl_sync(FULL_MASK, sh->job_gen, 0);
        if (gen == seen) {
            const bool hot = strata_now_ns() - sh->active_ns < p.hot_ns;
            __nanosleep(hot ? 32 : p.max_backoff_ns);
            continue;
        }
        seen = gen;
        __threadfence_block();
        const bool from_host = sh->job_from_host != 0;
        strata_copy_part(const_cast<unsigned char*>(sh->job_dst), sh->job_src, sh->job_len,
                         from_host, part, parts, lane);
        // Release to the serving warp (same block); its fence before `done` (GPU or system
        // scope, sequentially consistent) then orders these writes too, as the block barrier
        // did in the first version: one fence per request on the critical path, not two.
        __threadfence_block();
        __syncwarp();
        if (lane == 0) atomicAdd(const_cast<unsigned*>(&sh->job_done), 1u);
    }
}

__device__ void strata_poller(const StrataServiceParams& p, volatile StrataShared* sh,
                              unsigned warp, unsigned helpers) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned hot_lanes = min(max(p.hot_poll_lanes, 2u), 32u);
    const unsigned mirror = warp % max(p.mirrors, 1u);
    const bool cv = (p.flags & FLAG_POLL_CV) != 0;
    if (warp > 0) __nanosleep(warp * p.poll_stagger_ns);
    unsigned backoff = 0;
    unsigned long long rng = strata_now_ns() ^ (0x9e3779b97f4a7c15ull * (warp + 1));
    for (;;) {
        // Shared state is read by lane 0 and broadcast, so the warp decides as one.
        if (__shfl_sync(FULL_MASK, sh->stop, 0)) return;
        const unsigned long long seq = __shfl_sync(FULL_MASK, sh->claimed, 0) + 1;
        const bool hot =
            __shfl_sync(FULL_MASK, strata_now_ns() - sh->active_ns < p.hot_ns ? 1 : 0, 0) != 0;
        if (!hot && warp > 0) {
            // Cold: warp 0 alone polls, with back-off.
            __nanosleep(p.max_backoff_ns);
            continue;
        }
        const unsigned slot_index = (unsigned)((seq - 1) % p.nslots);
        const unsigned long long* slot =
            p.ring + ((unsigned long long)mirror * p.nslots + slot_index) * SLOT_WORDS;
        const unsigned tag = strata_tag(seq);
        const unsigned loaded = hot ? hot_lanes : 2u;
        unsigned long long a = 0, b = 0;
        if (lane < loaded) strata_load2(slot + 2 * lane, a, b, cv);
        const bool head_ok =
            __all_sync(FULL_MASK, lane >= 2 || (strata_tagged(a, tag) && strata_tagged(b, tag)));
        if (!head_ok) {
            if (!hot) {
                backoff = backoff == 0 ? 64 : min(backoff * 2, p.max_backoff_ns);
                __nanosleep(backoff);
            }
            continue;
        }
        backoff = 0;
        const unsigned long long w0 = __shfl_sync(FULL_MASK, a, 0);
        const unsigned long long w1 = __shfl_sync(FULL_MASK, b, 0);
        const unsigned long long w2 = __shfl_sync(FULL_MASK, a, 1);
        const unsigned op = (unsigned)(w0 >> 24) & 0xff;
        const unsigned len = (unsigned)w0 & 0xffffff;
        unsigned char* dev =
            reinterpret_cast<unsigned char*>((w1 & 0xffffffffull) | ((w2 & 0xffffffffull) << 32));
        if (op == OP_H2D_INLINE && len <= INLINE_MAX) {
            const unsigned need = HEADER_WORDS + (len + 3) / 4;
            if (lane >= loaded && 2 * lane < need) strata_load2(slot + 2 * lane, a, b, cv);
            // Words still in flight from the host's WC buffers: read them again.
            // Give up if another poller claimed it meanwhile (the slot may even be reused).
            bool complete = false;
            for (;;) {
                const bool ok = (2 * lane >= need || strata_tagged(a, tag)) &&
                                (2 * lane + 1 >= need || strata_tagged(b, tag));
                complete = __all_sync(FULL_MASK, ok);
                if (complete) break;
                const int taken = sh->claimed >= seq ? 1 : 0;
                if (__shfl_sync(FULL_MASK, taken, 0)) break;
                if (!ok) strata_load2(slot + 2 * lane, a, b, cv);
            }
            if (!complete) continue;
        }
        // Claim the request; the loser goes on to the next one.
        int won = 0;
        if (lane == 0) {
            won = atomicCAS(const_cast<unsigned long long*>(&sh->claimed), seq - 1, seq) == seq - 1;
        }
        if (!__shfl_sync(FULL_MASK, won, 0)) continue;
        // Serve in order: the previous request's writes are done and fenced.
        while (sh->served != seq - 1) {
        }
        __threadfence_block();
        bool fault = false;
        bool to_host = false;
        const unsigned long long stage_off = (unsigned long long)slot_index * p.stage_stride;
        const unsigned skew = (unsigned)((unsigned long long)dev & 15);
        if (op == OP_H2D_INLINE) {
            if (len > INLINE_MAX) fault = true;
            else strata_h2d_inline(dev, len, a, b, lane);
        } else if (op == OP_H2D_STAGED) {
            if (len > p.stage_max) {
                fault = true;
            } else if (len <= p.warp_max) {
                strata_copy_part(dev, p.h2d + stage_off + skew, len, true, 0, 1, lane);
            } else {
                strata_big_copy(sh, dev, p.h2d + stage_off + skew, len, true, helpers, lane);
            }
        } else if (op == OP_D2H) {
            to_host = true;
            if (len > p.stage_max) {
                fault = true;
            } else if (len <= p.warp_max) {
                strata_copy_part(p.d2h + stage_off + skew, dev, len, false, 0, 1, lane);
            } else {
                strata_big_copy(sh, p.d2h + stage_off + skew, dev, len, false, helpers, lane);
            }
        } else if (op == OP_D2H_TAGGED) {
            to_host = true;
            if (8ull * ((len + 3) / 4) > p.stage_stride || len > p.warp_max) {
                fault = true;
            } else {
                strata_d2h_tagged(reinterpret_cast<unsigned long long*>(p.d2h + stage_off), dev,
                                  len, tag, lane);
            }
        } else if (op != OP_STOP) {
            fault = true;
        }
        // Device-memory writes (H2D) need only reach the GPU's L2 before `done`: anything the
        // host starts after seeing `done` reads them there. Host-memory writes must reach the
        // host first: a system-scope fence.
        strata_publish_fence(to_host || (p.flags & FLAG_SYS_FENCE_H2D),
                             (p.flags & FLAG_ACQ_REL) != 0);
        __syncwarp();
        if (lane == 0) {
            if (fault) {
                strata_store_sys(p.status + STATUS_FAULT, seq);
                sh->stop = 1;
            } else {
                strata_store_sys(p.status + STATUS_DONE, seq);
                if (op == OP_STOP) sh->stop = 1;
            }
            sh->active_ns = strata_now_ns();
            __threadfence_block();
            sh->served = seq;
        }
        __syncwarp();
        // The warp that served is in step with the host's loop (it resumes polling a fixed time
        // after the host saw `done`), and would stay the one that finds the next request, at
        // the same unlucky delay every time. A random pause puts it back at a random phase, so
        // the pollers keep independent phases and the first poll after a request lands comes
        // sooner on average.
        if (p.rephase_ns != 0) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            __nanosleep((unsigned)(rng >> 33) % p.rephase_ns);
        }
    }
}

// Serves requests start_seq, start_seq + 1, ... in order until a STOP request (or a malformed
// one, reported in `fault`). Warps below `pollers` poll and serve; the others help with large
// requests. The last warp to leave writes the epoch into `exited`: after that no warp touches
// host memory, so the host may free it.
extern "C" __global__ void __launch_bounds__(1024) strata_copy_service(const StrataServiceParams p) {
    __shared__ StrataShared shared;
    volatile StrataShared* sh = &shared;
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned nwarps = blockDim.x >> 5;
    const unsigned pollers = min(max(p.pollers, 1u), nwarps);
    if (threadIdx.x == 0) {
        sh->claimed = p.start_seq - 1;
        sh->served = p.start_seq - 1;
        sh->active_ns = strata_now_ns();
        sh->job_gen = 0;
        sh->job_done = 0;
        sh->stop = 0;
        sh->live_warps = nwarps;
    }
    __syncthreads();
    if (warp < pollers) strata_poller(p, sh, warp, nwarps - pollers);
    else strata_helper(p, sh, warp - pollers + 1, nwarps - pollers + 1);
    __syncwarp();
    if (lane == 0 && atomicSub(const_cast<unsigned*>(&sh->live_warps), 1u) == 1u) {
        __threadfence_system();
        strata_store_sys(p.status + STATUS_EXITED, p.epoch);
    }
}
